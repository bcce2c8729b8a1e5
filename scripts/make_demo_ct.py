#!/usr/bin/env python3
"""Write a small synthetic CT study as DICOM, so `dinox preprocess` -> `dinox run` can be tried without
downloading anything.

    python scripts/make_demo_ct.py data/demo_dicom            # 3 patients x 1 series x 64 slices, 256 px
    dinox preprocess --dicom-root data/demo_dicom --out-root data/processed
    # the study specs read data/processed/_index/index.csv

Each series is a chest-like phantom in Hounsfield units (air -1000, lungs about -800, soft tissue about 40,
spine about 700, with noise), stored as signed 16-bit with RescaleIntercept -1024 and real geometry tags
(ImagePositionPatient, ImageOrientationPatient, PixelSpacing, SliceThickness, SliceLocation). Files are
named in a shuffled order, so a reader must sort slices by position, as with real exports.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import numpy as np
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

INTERCEPT = -1024.0


def phantom(rows: int, cols: int, t: float, rng: np.random.Generator) -> np.ndarray:
    """One axial slice in HU; t in [0, 1] runs along the series (the lungs grow, then shrink)."""
    y, x = np.mgrid[-1 : 1 : rows * 1j, -1 : 1 : cols * 1j]
    hu = np.full((rows, cols), -1000.0)
    body = (x / 0.85) ** 2 + (y / 0.65) ** 2 <= 1
    hu[body] = 40.0
    lung_r = 0.2 + 0.15 * np.sin(np.pi * t)
    for cx in (-0.38, 0.38):
        hu[((x - cx) / lung_r) ** 2 + ((y + 0.05) / (lung_r * 1.4)) ** 2 <= 1] = -800.0
    hu[(x / 0.09) ** 2 + ((y - 0.45) / 0.09) ** 2 <= 1] = 700.0
    return hu + rng.normal(0, 15, size=hu.shape)


def write_series(
    out_dir: Path,
    slices: int = 32,
    rows: int = 256,
    cols: int = 256,
    *,
    seed: int = 0,
    patient: str = "DEMO-0001",
    spacing: float = 0.7,
    thickness: float = 2.5,
    modality: str = "CT",
) -> str:
    """Write one series into out_dir; return its SeriesInstanceUID."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    study_uid, series_uid = generate_uid(), generate_uid()
    order = list(range(slices))
    random.Random(seed).shuffle(order)  # file names do not follow anatomy
    for name_index, z_index in enumerate(order):
        hu = phantom(rows, cols, z_index / max(1, slices - 1), rng)
        stored = np.clip(np.rint(hu - INTERCEPT), -32768, 32767).astype(np.int16)
        sop_uid = generate_uid()
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = CTImageStorage
        meta.MediaStorageSOPInstanceUID = sop_uid
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds = Dataset()
        ds.file_meta = meta
        ds.SOPClassUID, ds.SOPInstanceUID = CTImageStorage, sop_uid
        ds.StudyInstanceUID, ds.SeriesInstanceUID = study_uid, series_uid
        ds.PatientID, ds.Modality = patient, modality
        ds.Rows, ds.Columns = rows, cols
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.RescaleIntercept, ds.RescaleSlope = INTERCEPT, 1.0
        z = -300.0 + z_index * thickness
        ds.ImagePositionPatient = [-cols * spacing / 2, -rows * spacing / 2, z]
        ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        ds.PixelSpacing = [spacing, spacing]
        ds.SliceThickness, ds.SliceLocation = thickness, z
        ds.InstanceNumber = z_index + 1
        ds.PixelData = stored.tobytes()
        ds.save_as(out_dir / f"IM{name_index:05d}.dcm", enforce_file_format=True)
    return str(series_uid)


def make_demo(root: Path, patients: int = 3, slices: int = 32, size: int = 256) -> list[str]:
    return [
        write_series(root / f"DEMO-{p:04d}" / "CT", slices, size, size, seed=p, patient=f"DEMO-{p:04d}")
        for p in range(1, patients + 1)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--patients", type=int, default=3)
    # 192 slices: a batch of every shipped CT spec (the largest, 160) fits without --set data.inflation.
    parser.add_argument("--slices", type=int, default=64)
    parser.add_argument("--size", type=int, default=256)
    args = parser.parse_args()
    uids = make_demo(args.out, args.patients, args.slices, args.size)
    print(f"wrote {len(uids)} series x {args.slices} slices of {args.size}x{args.size} under {args.out}")


if __name__ == "__main__":
    main()
