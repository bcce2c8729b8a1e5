"""DICOM -> 16-bit PNG preprocessing on real DICOM files written with pydicom, plus pydicom's own CT slice."""

from __future__ import annotations

import csv
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pydicom
import pytest
from PIL import Image
from pydicom.data import get_testdata_file
from pydicom.encaps import encapsulate
from pydicom.uid import JPEGLSLossless, generate_uid

from dinox.data import dicom_preprocess as pp
from tests.conftest import ROOT, run_dinox

_spec = importlib.util.spec_from_file_location("make_demo_ct", ROOT / "scripts" / "make_demo_ct.py")
demo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(demo)


def ct_small_series(out: Path, n: int = 4, thickness: float = 5.0) -> str:
    """pydicom's bundled CT slice as an n-slice series: same pixels, real header, positions n steps apart,
    written in reverse order so that sorting by position matters."""
    out.mkdir(parents=True)
    series_uid = generate_uid()
    for i in range(n):
        ds = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
        ds.SeriesInstanceUID = series_uid
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        ds.ImagePositionPatient = [ds.ImagePositionPatient[0], ds.ImagePositionPatient[1], -75.7 + i * thickness]
        ds.InstanceNumber = i + 1
        # Each slice a little different so the order can be checked from the pixels.
        ds.PixelData = (ds.pixel_array + np.int16(10 * i)).astype(ds.pixel_array.dtype).tobytes()
        ds.save_as(out / f"slice{n - 1 - i:03d}.dcm", enforce_file_format=True)
    return str(series_uid)


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "dicom"
    uids = {
        "demo": demo.write_series(root / "P1" / "CT", slices=6, rows=48, cols=40, seed=1),
        "small": ct_small_series(root / "P2" / "CT"),
        "dx": demo.write_series(root / "P3" / "DX", slices=3, rows=16, cols=16, modality="DX"),
        "short": demo.write_series(root / "P4" / "scout", slices=2, rows=16, cols=16),
    }
    # A series with one JPEG-LS slice (no decoder here) and one truncated slice among good ones.
    uids["damaged"] = demo.write_series(root / "P5" / "CT", slices=5, rows=32, cols=32, seed=5)
    files = sorted((root / "P5" / "CT").glob("*.dcm"))
    ds = pydicom.dcmread(files[0])
    ds.file_meta.TransferSyntaxUID = JPEGLSLossless
    ds.PixelData = encapsulate([b"\xff\xd8\xff\xf7 not really jpeg-ls \xff\xd9"])
    ds["PixelData"].VR = "OB"
    ds.save_as(files[0], enforce_file_format=True)
    raw = files[1].read_bytes()
    files[1].write_bytes(raw[:-300])
    (root / "P1" / "CT" / "notes.txt").write_text("reader notes, not DICOM")
    (root / "P1" / "annotations.xml").write_text("<LidcReadMessage/>")
    return root, uids


def read_index(out: Path) -> list[dict[str, str]]:
    return list(csv.DictReader((out / "_index" / "index.csv").open()))


def test_converts_orders_skips_and_reports(tree, tmp_path):
    root, uids = tree
    out = tmp_path / "png"
    proc = run_dinox(["preprocess", "--dicom-root", str(root), "--out-root", str(out)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert f"skipped series P3/DX ({uids['dx']}): modality DX is not CT" in text
    assert f"skipped series P4/scout ({uids['short']}): too few readable slices (2 < 3)" in text
    assert (
        "1 file(s) skipped: compressed (JPEG-LS Lossless Image Compression) and no decoder installed; "
        "pip install one of: gdcm, pylibjpeg, pyjpegls" in text
    )
    assert "1 file(s) skipped: pixel data shorter than Rows x Columns (truncated file?)" in text
    assert "2 file(s) skipped: not a DICOM file" in text
    assert "preprocess: 3 series converted, 0 reused, 2 skipped; 13 slices" in text
    rows = read_index(out)
    assert list(rows[0]) == pp.INDEX_COLUMNS
    by_series: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        by_series.setdefault(r["series_uid"], []).append(r)
    assert {uid: len(rs) for uid, rs in by_series.items()} == {uids["demo"]: 6, uids["small"]: 4, uids["damaged"]: 3}
    small = by_series[uids["small"]]
    assert [int(r["slice_index"]) for r in small] == [0, 1, 2, 3]
    assert small[0]["encoding"] == "hu+32768_uint16" and (small[0]["rows"], small[0]["cols"]) == ("128", "128")
    assert float(small[0]["pixel_spacing_row_mm"]) == pytest.approx(0.661468)
    assert float(small[0]["slice_thickness_mm"]) == pytest.approx(5.0)


def test_png_pixels_are_hu_plus_32768_in_position_order(tree, tmp_path):
    root, uids = tree
    out = tmp_path / "png"
    pp.preprocess(root, out, progress=False)
    rows = [r for r in read_index(out) if r["series_uid"] == uids["small"]]
    original = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    base_hu = original.pixel_array.astype(np.int32) * int(original.RescaleSlope) + int(original.RescaleIntercept)
    for i, r in enumerate(rows):
        png = Image.open(out / r["png_path"])
        assert png.mode == "I;16"
        stored = np.array(png).astype(np.int32)
        # Slice i of the series sits i steps up and carries +10*i in its stored values (see ct_small_series).
        np.testing.assert_array_equal(stored - 32768, base_hu + 10 * i)
    # Hand-checked pixel: the bundled slice's top-left value and its HU.
    assert int(np.array(Image.open(out / rows[0]["png_path"]))[0, 0]) == int(original.pixel_array[0, 0]) - 1024 + 32768


def test_rerun_is_incremental_and_index_identical(tree, tmp_path):
    root, _ = tree
    out = tmp_path / "png"
    pp.preprocess(root, out, progress=False)
    index_before = (out / "_index" / "index.csv").read_bytes()
    pngs = sorted(out.rglob("*.png"))
    stamps = {p: p.stat().st_mtime_ns for p in pngs}
    time.sleep(0.05)
    summary = pp.preprocess(root, out, progress=False)
    assert (summary.count("converted"), summary.count("reused")) == (0, 3)
    assert (out / "_index" / "index.csv").read_bytes() == index_before
    assert {p: p.stat().st_mtime_ns for p in sorted(out.rglob("*.png"))} == stamps  # nothing rewritten
    forced = pp.preprocess(root, out, force=True, progress=False)
    assert forced.count("converted") == 3
    assert all(p.stat().st_mtime_ns > stamps[p] for p in pngs)
    assert (out / "_index" / "index.csv").read_bytes() == index_before


def test_a_folder_without_series_json_is_not_taken_as_finished(tree, tmp_path):
    root, uids = tree
    out = tmp_path / "png"
    pp.preprocess(root, out, progress=False)
    series_dir = next(out.rglob(uids["demo"]))
    (series_dir / "series.json").unlink()  # what a copy or a crash between files would leave
    (series_dir / "00003.png").unlink()
    summary = pp.preprocess(root, out, progress=False)
    assert {s.series_uid: s.status for s in summary.series}[uids["demo"]] == "converted"
    assert (series_dir / "00003.png").exists() and (series_dir / "series.json").exists()


def test_interrupted_run_leaves_nothing_taken_as_finished(tmp_path):
    root = tmp_path / "dicom"
    uid = demo.write_series(root / "BIG" / "CT", slices=150, rows=256, cols=256, seed=3)
    out = tmp_path / "png"
    code = (
        f"from dinox.data.dicom_preprocess import preprocess; preprocess({str(root)!r}, {str(out)!r}, progress=False)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    deadline = time.time() + 60
    area = out / pp.TMP_AREA / str(proc.pid)
    while time.time() < deadline:  # kill it while the series is half written
        tmp_dirs = [d for d in area.iterdir()] if area.exists() else []
        if tmp_dirs and len(list(tmp_dirs[0].glob("*.png"))) >= 5:
            break
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert tmp_dirs and not (out / "BIG" / "CT" / uid).exists(), "the half series must not sit in its final place"
    summary = pp.preprocess(root, out, progress=False)
    assert [(s.status, s.slices) for s in summary.series] == [("converted", 150)]
    assert not list((out / pp.TMP_AREA).iterdir())  # the dead run's folder is gone, and this run's own
    assert len(read_index(out)) == 150


def test_missing_root_and_empty_tree_exit_2(tmp_path):
    proc = run_dinox(["preprocess", "--dicom-root", str(tmp_path / "nope"), "--out-root", "o"], cwd=tmp_path)
    assert proc.returncode == 2 and "no such directory" in proc.stderr
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.txt").write_text("nothing here")
    proc = run_dinox(["preprocess", "--dicom-root", "empty", "--out-root", "o"], cwd=tmp_path)
    assert proc.returncode == 2 and "no CT series with at least 3 readable slices" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_single_bundled_slice_converts_with_min_slices_1(tmp_path):
    root = tmp_path / "one"
    root.mkdir()
    shutil.copy(get_testdata_file("CT_small.dcm"), root / "CT_small.dcm")
    summary = pp.preprocess(root, tmp_path / "png", min_slices=1, progress=False)
    assert [(s.status, s.slices) for s in summary.series] == [("converted", 1)]


# --- hostile trees: names from tags, malformed tags, files that are not files, folders that cannot be read


def set_raw(path: Path, keyword: str, vr: str, value: str) -> None:
    """Write `value` into a tag as raw bytes, as a broken exporter would: pydicom refuses to set it otherwise."""
    from pydicom.datadict import tag_for_keyword
    from pydicom.dataelem import RawDataElement
    from pydicom.tag import Tag

    ds = pydicom.dcmread(path)
    data = value.encode()
    data += b" " * (len(data) % 2)
    tag = Tag(tag_for_keyword(keyword))
    ds[tag] = RawDataElement(tag, vr, len(data), data, 0, False, True)
    ds.save_as(path)


def test_series_uid_dot_dot_stays_inside_the_out_root(tmp_path):
    """A SeriesInstanceUID of '..' or '.' once made preprocess rmtree the out-root's parent (input, earlier
    output, unrelated files) on --force."""
    root = tmp_path / "in" / "dicom"
    for name, uid in (("A", ".."), ("B", ".")):
        demo.write_series(root / name, slices=3, rows=16, cols=16, seed=2)
        for f in (root / name).glob("*.dcm"):
            set_raw(f, "SeriesInstanceUID", "UI", uid)
    out = tmp_path / "in" / "out"
    (tmp_path / "in" / "unrelated.txt").write_text("keep me")
    for force in (False, True, True):
        summary = pp.preprocess(root, out, force=force, progress=False)
        assert summary.count("converted") == 2, pp.render_summary(summary)
        assert (tmp_path / "in" / "unrelated.txt").read_text() == "keep me"
        assert len(list(root.rglob("*.dcm"))) == 6
    dirs = sorted({r["series_dir"] for r in read_index(out)})
    assert dirs[0].startswith("A/x-") and dirs[1].startswith("B/x-") and dirs[0] != dirs[1]
    for d in dirs:
        assert (out / d).resolve().is_relative_to(out.resolve()) and len(list((out / d).glob("*.png"))) == 3


def test_safe_component_is_plain_deterministic_and_collision_free():
    assert pp.safe_component("1.2.840.113619.2.55") == "1.2.840.113619.2.55"
    names = ["..", ".", "", "a/b", "a_b", "a\\b", "x" * 302, "x" * 301 + "y", ".hidden", "a\nb"]
    safe = [pp.safe_component(n) for n in names]
    assert len(set(safe)) == len(names)  # "a/b" and "a_b" do not share a folder
    assert safe == [pp.safe_component(n) for n in names]
    for s in safe:
        assert s not in (".", "..") and "/" not in s and "\\" not in s and not s.startswith(".") and len(s) <= 64


def test_malformed_tags_skip_the_file_or_the_series_and_the_run_goes_on(tmp_path):
    root = tmp_path / "dicom"
    good = demo.write_series(root / "GOOD", slices=8, rows=16, cols=16, seed=1)
    files = sorted((root / "GOOD").glob("*.dcm"))
    per_file = [
        ("RescaleSlope", "DS", "abc"),
        ("InstanceNumber", "IS", "xyz"),
        ("ImagePositionPatient", "DS", "a\\b\\c"),
        ("RescaleIntercept", "DS", "nan"),
    ]
    for f, (keyword, vr, value) in zip(files, per_file, strict=False):
        set_raw(f, keyword, vr, value)
    series_level = {"SPACING": ("PixelSpacing", "DS", "0.7"), "THICK": ("SliceThickness", "DS", "thick")}
    uids = {}
    for name, (keyword, vr, value) in series_level.items():
        uids[name] = demo.write_series(root / name, slices=3, rows=16, cols=16, seed=3)
        for f in (root / name).glob("*.dcm"):
            set_raw(f, keyword, vr, value)
    long_uid = "1." + "2" * 300  # 302 characters: once a file name too long for the file system
    demo.write_series(root / "LONG", slices=3, rows=16, cols=16, seed=4)
    for f in (root / "LONG").glob("*.dcm"):
        set_raw(f, "SeriesInstanceUID", "UI", long_uid)

    for _ in range(2):  # the same tree twice: a re-run neither crashes nor loses the index
        summary = pp.preprocess(root, tmp_path / "png", progress=False)
        text = pp.render_summary(summary)
        outcomes = {s.series_uid: s for s in summary.series}
        assert outcomes[uids["SPACING"]].status == "skipped"
        assert outcomes[uids["SPACING"]].reason == "malformed PixelSpacing '0.7' (needs 2 numbers)"
        assert outcomes[uids["THICK"]].reason == "malformed SliceThickness 'thick'"
        assert outcomes[long_uid].status in ("converted", "reused") and outcomes[long_uid].slices == 3
        assert outcomes[good].slices == 4, text
        rows = read_index(tmp_path / "png")
        assert len(rows) == 7 and {r["series_uid"] for r in rows} == {good, long_uid}
    first = pp.preprocess(root, tmp_path / "fresh", progress=False)
    skipped = {s.series_uid: s for s in first.series}[good].files_skipped
    assert skipped == {
        "malformed RescaleSlope 'abc'": 1,
        "malformed InstanceNumber 'xyz'": 1,
        "malformed ImagePositionPatient 'a\\b\\c' (needs 3 numbers)": 1,
        "malformed RescaleIntercept 'nan'": 1,
    }, skipped


def test_an_unreadable_folder_is_reported(tmp_path, monkeypatch):
    root = tmp_path / "dicom"
    demo.write_series(root / "P1", slices=3, rows=16, cols=16)
    (root / "LOCKED").mkdir()
    # Root reads any folder whatever its mode bits (these tests run as root in CI), so the kernel's refusal is
    # raised where it arises: os.walk's listing of that folder.
    real_scandir = os.scandir

    def scandir(path="."):
        if isinstance(path, (str, os.PathLike)) and Path(path) == root / "LOCKED":
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    summary = pp.preprocess(root, tmp_path / "png", progress=False)
    assert "folder LOCKED skipped: unreadable (Permission denied)" in pp.render_summary(summary)
    assert summary.slices_indexed == 3


def test_a_fifo_is_skipped_and_never_hangs_the_command(tmp_path):
    root = tmp_path / "dicom"
    demo.write_series(root / "P1", slices=3, rows=16, cols=16)
    os.mkfifo(root / "P1" / "pipe.dcm")  # reading it would block forever: a process of its own, with a timeout
    proc = run_dinox(["preprocess", "--dicom-root", str(root), "--out-root", "png"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 file(s) skipped: not a regular file (FIFO, socket or device)" in proc.stdout


def test_a_full_out_disk_ends_the_run_in_one_line_and_keeps_what_was_finished(tmp_path):
    """ENOSPC, raised by the kernel on a 1 MB tmpfs where this machine allows mounting one."""
    root = tmp_path / "dicom"
    for p in range(3):
        demo.write_series(root / f"P{p}", slices=8, rows=256, cols=256, seed=p)
    out = tmp_path / "small"
    out.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(out)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        proc = run_dinox(["preprocess", "--dicom-root", str(root), "--out-root", str(out)], cwd=tmp_path)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "No space left on device" in proc.stderr and "Traceback" not in proc.stderr
        assert proc.stderr.count("\n") == 1 and "--out-root" in proc.stderr, proc.stderr
        assert not any((out / pp.TMP_AREA).iterdir())  # the half series went with the run
    finally:
        subprocess.run(["umount", str(out)], check=False)
