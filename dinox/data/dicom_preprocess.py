"""DICOM CT series -> lossless 16-bit PNG slices (HU + 32768) and one index.csv over all of them.

Layout of the output root:

    <out_root>/<relative dir of the series in the DICOM tree>/<SeriesInstanceUID>/00000.png ...
                                                                              /series.json
    <out_root>/_index/index.csv
    <out_root>/_index/preprocess_report.json

A series is written into a ``.tmp-*`` folder beside its final place and renamed when complete, with its
``series.json`` written last; only a folder holding ``series.json`` counts as done. So an interrupted run
never leaves a half series that the next run mistakes for finished, and a re-run (incremental by default)
re-indexes finished series from their ``series.json`` without decoding anything again.

Torch-free on purpose: pydicom, numpy and Pillow only, so it runs on a data box without a GPU stack.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

ENCODING = "hu+32768_uint16"
HU_OFFSET = 32768
INDEX_COLUMNS = [
    "png_path", "series_dir", "slice_index", "series_slices", "encoding", "rows", "cols",
    "pixel_spacing_row_mm", "pixel_spacing_col_mm", "slice_thickness_mm", "series_uid",
]  # fmt: skip
SERIES_FILE = "series.json"
TMP_PREFIX = ".tmp-"


@dataclass
class SeriesOutcome:
    series_uid: str
    source_dir: str  # relative to the DICOM root
    status: str  # converted | reused | skipped
    slices: int = 0
    reason: str = ""  # why skipped
    files_skipped: dict[str, int] = field(default_factory=dict)  # reason -> count, inside a kept series


@dataclass
class Summary:
    series: list[SeriesOutcome] = field(default_factory=list)
    files_not_dicom: dict[str, int] = field(default_factory=dict)  # reason -> count, outside any series
    index_path: str = ""
    slices_indexed: int = 0

    def count(self, status: str) -> int:
        return sum(1 for s in self.series if s.status == status)


@dataclass
class _Slice:
    path: Path
    position: float
    instance: int


# --- reading ---------------------------------------------------------------------------------------


def _header(path: Path):
    import pydicom
    from pydicom.errors import InvalidDicomError

    try:
        return pydicom.dcmread(path, stop_before_pixels=True), ""
    except InvalidDicomError:
        return None, "not a DICOM file"
    except Exception as e:  # noqa: BLE001 - truncated or garbled headers raise many kinds of errors
        return None, f"unreadable DICOM header ({type(e).__name__})"


def _position(ds) -> float | None:
    """Where the slice sits along the series' normal: the projection of ImagePositionPatient on the cross
    product of the ImageOrientationPatient row and column vectors (correct also for tilted gantries)."""
    ipp = getattr(ds, "ImagePositionPatient", None)
    iop = getattr(ds, "ImageOrientationPatient", None)
    if ipp is not None and iop is not None and len(ipp) == 3 and len(iop) == 6:
        normal = np.cross(np.array(iop[:3], float), np.array(iop[3:], float))
        return float(np.dot(normal, np.array(ipp, float)))
    if getattr(ds, "SliceLocation", None) is not None:
        return float(ds.SliceLocation)
    return None


def _pixels_hu(path: Path, rows: int, cols: int) -> tuple[np.ndarray | None, str]:
    """The slice in Hounsfield units (float32), or None with the reason it cannot be had."""
    import pydicom

    try:
        ds = pydicom.dcmread(path)
    except Exception as e:  # noqa: BLE001
        return None, f"unreadable DICOM ({type(e).__name__})"
    if "PixelData" not in ds:
        return None, "no pixel data"
    if (ds.Rows, ds.Columns) != (rows, cols):
        return None, f"size {ds.Rows}x{ds.Columns} differs from the series' {rows}x{cols}"
    syntax = ds.file_meta.get("TransferSyntaxUID") if hasattr(ds, "file_meta") else None
    try:
        pixels = ds.pixel_array
    except Exception as e:  # noqa: BLE001 - pydicom raises several types for missing handlers
        text = str(e)
        if syntax is not None and syntax.is_compressed:
            if "missing dependencies" in text or "no plugins" in text.lower() or "plugin" in text.lower():
                # pydicom names the plugins that would work, e.g. "pylibjpeg - requires pylibjpeg>=2.0 ...".
                plugins = [ln.strip().split(" - ")[0] for ln in text.splitlines()[1:] if " - " in ln]
                hint = f"; pip install one of: {', '.join(plugins)}" if plugins else ""
                return None, f"compressed ({syntax.name}) and no decoder installed{hint}"
            return None, f"compressed ({syntax.name}) pixel data cannot be decoded ({type(e).__name__})"
        if "less than expected" in text or "shorter" in text:
            return None, "pixel data shorter than Rows x Columns (truncated file?)"
        return None, f"pixel data cannot be decoded ({type(e).__name__}: {text.splitlines()[0][:120]})"
    if pixels.ndim != 2:
        return None, f"pixel array of shape {pixels.shape} (multi-frame or colour) is not a CT slice"
    slope = float(getattr(ds, "RescaleSlope", 1) or 1)
    intercept = float(getattr(ds, "RescaleIntercept", 0) or 0)
    return pixels.astype(np.float32) * slope + intercept, ""


def _hu_to_png_array(hu: np.ndarray) -> np.ndarray:
    return (np.clip(np.rint(hu), -HU_OFFSET, HU_OFFSET - 1) + HU_OFFSET).astype(np.uint16)


# --- the walk ---------------------------------------------------------------------------------------


def _walk(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if not name.startswith("."):
                yield Path(dirpath) / name


def _series_out_dir(out_root: Path, source_dir: str, uid: str) -> Path:
    # UIDs are digits and dots; anything else (a malformed one) is replaced so it cannot escape the root.
    safe = "".join(c if c.isalnum() or c in ".-_" else "_" for c in uid) or "unknown"
    return out_root / source_dir / safe


def preprocess(
    dicom_root: str | Path,
    out_root: str | Path,
    *,
    force: bool = False,
    min_slices: int = 3,
    progress: bool | None = None,
) -> Summary:
    """Convert every CT series under dicom_root; see the module docstring. Never raises for bad input files."""
    from tqdm import tqdm

    dicom_root, out_root = Path(dicom_root), Path(out_root)
    summary = Summary()
    not_dicom: Counter[str] = Counter()
    # series uid -> [(file, header)]
    groups: dict[str, list[tuple[Path, object]]] = defaultdict(list)
    files = list(_walk(dicom_root))
    # progress=None: a bar only when stderr is a terminal (tqdm's disable=None).
    disable = None if progress is None else not progress
    for path in tqdm(files, desc="reading headers", unit="file", disable=disable, leave=False):
        ds, why = _header(path)
        if ds is None:
            not_dicom[why] += 1
            continue
        uid = str(getattr(ds, "SeriesInstanceUID", "") or "")
        if not uid:
            not_dicom["DICOM without SeriesInstanceUID"] += 1
            continue
        groups[uid].append((path, ds))
    summary.files_not_dicom = dict(not_dicom)

    _remove_stale_tmp(out_root)
    rows_out: list[dict[str, object]] = []
    for uid in tqdm(sorted(groups), desc="series", unit="series", disable=disable):
        members = groups[uid]
        source_dir = _common_dir(dicom_root, [p for p, _ in members])
        outcome, rows = _one_series(uid, members, source_dir, out_root, force, min_slices)
        summary.series.append(outcome)
        rows_out.extend(rows)

    rows_out.sort(key=lambda r: (str(r["series_dir"]), int(r["slice_index"])))  # type: ignore[call-overload]
    index_dir = out_root / "_index"
    index_dir.mkdir(parents=True, exist_ok=True)
    index_path = index_dir / "index.csv"
    tmp = index_dir / f"{TMP_PREFIX}index.csv"
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=INDEX_COLUMNS)
        writer.writeheader()
        writer.writerows(rows_out)
    os.replace(tmp, index_path)
    summary.index_path = str(index_path)
    summary.slices_indexed = len(rows_out)
    report = {"series": [asdict(s) for s in summary.series], "files_not_dicom": summary.files_not_dicom}
    (index_dir / "preprocess_report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return summary


def _common_dir(root: Path, paths: list[Path]) -> str:
    common = Path(os.path.commonpath([str(p.parent) for p in paths]))
    rel = common.relative_to(root)
    return "" if str(rel) == "." else rel.as_posix()


def _remove_stale_tmp(out_root: Path) -> None:
    """Folders of an interrupted earlier run: never finished, never trusted, removed."""
    if not out_root.exists():
        return
    for dirpath, dirnames, _files in os.walk(out_root):
        for d in list(dirnames):
            if d.startswith(TMP_PREFIX):
                shutil.rmtree(Path(dirpath) / d, ignore_errors=True)
                dirnames.remove(d)


def _one_series(uid: str, members: list[tuple[Path, object]], source_dir: str, out_root: Path, force: bool,
                min_slices: int) -> tuple[SeriesOutcome, list[dict[str, object]]]:  # fmt: skip
    final = _series_out_dir(out_root, source_dir, uid)
    done = final / SERIES_FILE
    if done.exists() and not force:
        try:
            meta = json.loads(done.read_text())
            return SeriesOutcome(uid, source_dir, "reused", len(meta["slices"])), _rows(out_root, final, meta)
        except (OSError, ValueError, KeyError):
            pass  # a damaged series.json: convert again
    first = members[0][1]
    modality = str(getattr(first, "Modality", "") or "")
    if modality != "CT":
        return SeriesOutcome(uid, source_dir, "skipped", reason=f"modality {modality or 'missing'} is not CT"), []
    if "PixelData" not in first and not hasattr(first, "Rows"):
        return SeriesOutcome(uid, source_dir, "skipped", reason="no image data (not an image series)"), []
    rows_n, cols_n = int(getattr(first, "Rows", 0)), int(getattr(first, "Columns", 0))
    skipped: Counter[str] = Counter()
    slices: list[_Slice] = []
    for path, ds in members:
        position = _position(ds)
        instance = int(getattr(ds, "InstanceNumber", 0) or 0)
        slices.append(_Slice(path, position if position is not None else float(instance), instance))
    slices.sort(key=lambda s: (s.position, s.instance, s.path.name))

    tmp = final.parent / f"{TMP_PREFIX}{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    written: list[dict[str, object]] = []
    for s in slices:
        hu, why = _pixels_hu(s.path, rows_n, cols_n)
        if hu is None:
            skipped[why] += 1
            continue
        name = f"{len(written):05d}.png"
        Image.fromarray(_hu_to_png_array(hu)).save(tmp / name, optimize=False, compress_level=1)
        written.append({"file": name, "source": s.path.name, "position": s.position})
    if len(written) < min_slices:
        shutil.rmtree(tmp, ignore_errors=True)
        reason = f"too few readable slices ({len(written)} < {min_slices})"
        return SeriesOutcome(uid, source_dir, "skipped", len(written), reason, dict(skipped)), []
    spacing = [float(x) for x in getattr(first, "PixelSpacing", [0.0, 0.0])]
    meta = {
        "series_uid": uid, "source_dir": source_dir, "rows": rows_n, "cols": cols_n,
        "pixel_spacing_mm": spacing, "slice_thickness_mm": float(getattr(first, "SliceThickness", 0) or 0),
        "encoding": ENCODING, "slices": written,
    }  # fmt: skip
    (tmp / SERIES_FILE).write_text(json.dumps(meta, indent=1))
    if final.exists():  # --force, or a damaged earlier attempt
        shutil.rmtree(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    os.rename(tmp, final)
    return SeriesOutcome(uid, source_dir, "converted", len(written), files_skipped=dict(skipped)), _rows(
        out_root, final, meta
    )


def _rows(out_root: Path, series_dir: Path, meta: dict) -> list[dict[str, object]]:
    rel = series_dir.relative_to(out_root).as_posix()
    spacing = meta["pixel_spacing_mm"]
    n = len(meta["slices"])
    return [
        {
            "png_path": f"{rel}/{s['file']}",
            "series_dir": rel,
            "slice_index": i,
            "series_slices": n,
            "encoding": meta["encoding"],
            "rows": meta["rows"],
            "cols": meta["cols"],
            "pixel_spacing_row_mm": spacing[0],
            "pixel_spacing_col_mm": spacing[1],
            "slice_thickness_mm": meta["slice_thickness_mm"],
            "series_uid": meta["series_uid"],
        }  # fmt: skip
        for i, s in enumerate(meta["slices"])
    ]


def render_summary(summary: Summary) -> str:
    lines = []
    for s in summary.series:
        if s.status == "skipped":
            lines.append(f"skipped series {s.source_dir or '.'} ({s.series_uid}): {s.reason}")
        for reason, n in sorted(s.files_skipped.items()):
            lines.append(f"series {s.source_dir or '.'} ({s.series_uid}): {n} file(s) skipped: {reason}")
    for reason, n in sorted(summary.files_not_dicom.items()):
        lines.append(f"{n} file(s) skipped: {reason}")
    lines.append(
        f"preprocess: {summary.count('converted')} series converted, {summary.count('reused')} reused, "
        f"{summary.count('skipped')} skipped; {summary.slices_indexed} slices in {summary.index_path}"
    )
    return "\n".join(lines)
