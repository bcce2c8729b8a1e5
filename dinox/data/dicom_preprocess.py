"""DICOM CT series -> lossless 16-bit PNG slices (HU + 32768) and one index.csv over all of them.

Layout of the output root:

    <out_root>/<relative dir of the series in the DICOM tree>/<SeriesInstanceUID>/00000.png ...
                                                                              /series.json
    <out_root>/_index/index.csv
    <out_root>/_index/preprocess_report.json

A series is written into the out-root's own temporary area (``<out_root>/.dinox-tmp/<pid>/``) and renamed
into place when complete, with its ``series.json`` written last; only a folder holding ``series.json``
counts as done. So an interrupted run never leaves a half series that the next run mistakes for finished,
and a re-run (incremental by default) re-indexes finished series from their ``series.json`` without
decoding anything again. Folder names that come from DICOM tags or the tree are made safe single path
components, and nothing is ever deleted outside that temporary area.

Input is not trusted: a file with a malformed tag (a DS that is not a number, a PixelSpacing with one value),
a non-regular file (a FIFO would block a read forever) or an unreadable folder is skipped and reported, and
the run goes on.

Torch-free on purpose: pydicom, numpy and Pillow only, so it runs on a data box without a GPU stack.
"""

from __future__ import annotations

import csv
import errno
import hashlib
import json
import os
import re
import shutil
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from dinox.data.dicom_read import Slice, TagError, Walk, header, number, numbers, pixels_hu, slice_of
from dinox.errors import DinoxError

ENCODING = "hu+32768_uint16"
HU_OFFSET = 32768
INDEX_COLUMNS = [
    "png_path",
    "series_dir",
    "slice_index",
    "series_slices",
    "encoding",
    "rows",
    "cols",
    "pixel_spacing_row_mm",
    "pixel_spacing_col_mm",
    "slice_thickness_mm",
    "series_uid",
]
SERIES_FILE = "series.json"
TMP_AREA = ".dinox-tmp"
NAME_LIMIT = 64  # characters of a folder name taken from a tag (a UID is at most 64 by the standard)
# A full or read-only disk ends the run: every later series would fail the same way.
_FATAL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}


class PreprocessError(DinoxError):
    """The run cannot go on (the output disk is full or read-only): one line for the user."""


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
    folders_unreadable: dict[str, str] = field(default_factory=dict)  # folder -> why
    index_path: str = ""
    slices_indexed: int = 0

    def count(self, status: str) -> int:
        return sum(1 for s in self.series if s.status == status)


# --- names and the temporary area ----------------------------------------------------------------------


def safe_component(name: str, limit: int = NAME_LIMIT) -> str:
    """`name` as one path component: unchanged when it is already plain (letters, digits, ``._-``, not
    starting with a dot, at most `limit` long), else its plain characters plus a hash of the original, so
    two different names never share a folder and the same name always gets the same one."""
    clean = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    if clean == name and name and not name.startswith(".") and len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    stem = clean.lstrip(".")[: limit - len(digest) - 1] or "x"
    return f"{stem}-{digest}"


def _safe_rmtree(path: Path, area: Path) -> None:
    """Remove `path` only if it resolves strictly inside the temporary area."""
    target, root = path.resolve(), area.resolve()
    if target == root or not target.is_relative_to(root):
        raise RuntimeError(f"refusing to remove {path}: outside {area}")
    shutil.rmtree(target, ignore_errors=True)


def _clear_stale_tmp(area: Path) -> None:
    """Folders of earlier runs that were interrupted: never finished, never trusted, removed. A folder of a
    run still alive (another preprocess at work on the same out-root) is left alone."""
    if not area.is_dir():
        return
    for child in area.iterdir():
        pid = int(child.name) if child.name.isdigit() else None
        if pid is not None and pid != os.getpid() and _alive(pid):
            continue
        _safe_rmtree(child, area)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _hu_to_png_array(hu: np.ndarray) -> np.ndarray:
    return (np.clip(np.rint(hu), -HU_OFFSET, HU_OFFSET - 1) + HU_OFFSET).astype(np.uint16)


def _series_out_dir(out_root: Path, source_dir: str, uid: str) -> Path:
    parts = [safe_component(p) for p in source_dir.split("/") if p]
    return out_root.joinpath(*parts, safe_component(uid))


def preprocess(
    dicom_root: str | Path,
    out_root: str | Path,
    *,
    force: bool = False,
    min_slices: int = 3,
    progress: bool | None = None,
) -> Summary:
    """Convert every CT series under dicom_root; see the module docstring. Never raises for bad input files;
    raises PreprocessError when the output disk is full or read-only."""
    import pydicom
    from tqdm import tqdm

    # dinox reports malformed values itself, once per file, with the reason; pydicom's per-value warnings
    # would bury that report.
    pydicom.config.settings.reading_validation_mode = pydicom.config.IGNORE
    dicom_root, out_root = Path(dicom_root), Path(out_root)
    summary = Summary()
    disable = None if progress is None else not progress  # None: a bar only when stderr is a terminal
    groups, not_dicom, walk = _read_headers(dicom_root, tqdm, disable)
    summary.files_not_dicom = dict(not_dicom + walk.not_regular)
    summary.folders_unreadable = walk.unreadable

    area = out_root / TMP_AREA
    _clear_stale_tmp(area)
    work = area / str(os.getpid())
    rows_out: list[dict[str, object]] = []
    try:
        for uid in tqdm(sorted(groups), desc="series", unit="series", disable=disable):
            members = groups[uid]
            source_dir = _common_dir(dicom_root, [p for p, _ in members])
            outcome, rows = _guarded_series(uid, members, source_dir, out_root, work, force, min_slices)
            summary.series.append(outcome)
            rows_out.extend(rows)
        _write_index(out_root, rows_out, summary)
    except OSError as e:
        if e.errno in _FATAL_ERRNOS:
            raise PreprocessError(
                f"--out-root {out_root}: {e.strerror} ({e.filename or out_root}); "
                f"{summary.count('converted')} series were converted before it; free space "
                f"and run again, finished series are kept"
            ) from None
        raise
    finally:
        if work.exists():
            _safe_rmtree(work, area)
    return summary


def _read_headers(dicom_root: Path, tqdm, disable) -> tuple[dict[str, list[tuple[Path, object]]], Counter[str], Walk]:
    """Every DICOM header under the root, grouped by SeriesInstanceUID; why the other files were not read."""
    not_dicom: Counter[str] = Counter()
    groups: dict[str, list[tuple[Path, object]]] = defaultdict(list)
    walk = Walk(dicom_root)
    for path in tqdm(list(walk.files()), desc="reading headers", unit="file", disable=disable, leave=False):
        ds, why = header(path)
        if ds is None:
            not_dicom[why] += 1
            continue
        uid = str(getattr(ds, "SeriesInstanceUID", "") or "").strip()
        if not uid:
            not_dicom["DICOM without SeriesInstanceUID"] += 1
            continue
        groups[uid].append((path, ds))
    return groups, not_dicom, walk


def _write_index(out_root: Path, rows_out: list[dict[str, object]], summary: Summary) -> None:
    rows_out.sort(key=lambda r: (str(r["series_dir"]), int(r["slice_index"])))  # type: ignore[call-overload]
    index_dir = out_root / "_index"
    index_dir.mkdir(parents=True, exist_ok=True)
    index_path = index_dir / "index.csv"
    tmp = index_dir / f".index.csv.{os.getpid()}"
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=INDEX_COLUMNS)
        writer.writeheader()
        writer.writerows(rows_out)
    os.replace(tmp, index_path)
    summary.index_path = str(index_path)
    summary.slices_indexed = len(rows_out)
    report = {
        "series": [asdict(s) for s in summary.series],
        "files_not_dicom": summary.files_not_dicom,
        "folders_unreadable": summary.folders_unreadable,
    }
    (index_dir / "preprocess_report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")


def _common_dir(root: Path, paths: list[Path]) -> str:
    common = Path(os.path.commonpath([str(p.parent) for p in paths]))
    rel = common.relative_to(root)
    return "" if str(rel) == "." else rel.as_posix()


def _guarded_series(
    uid: str,
    members: list[tuple[Path, object]],
    source_dir: str,
    out_root: Path,
    work: Path,
    force: bool,
    min_slices: int,
) -> tuple[SeriesOutcome, list[dict[str, object]]]:
    """One series; a problem that belongs to it (a malformed series-level tag, a name the file system refuses)
    skips it with the reason. A full disk is not its problem: that propagates."""
    try:
        return _one_series(uid, members, source_dir, out_root, work, force, min_slices)
    except TagError as e:
        return SeriesOutcome(uid, source_dir, "skipped", reason=str(e)), []
    except OSError as e:
        if e.errno in _FATAL_ERRNOS:
            raise
        return SeriesOutcome(uid, source_dir, "skipped", reason=f"cannot write it: {e.strerror or e}"), []


def _series_meta(uid: str, first, source_dir: str) -> dict:
    """What series.json records about the series, from its first header. Raises TagError."""
    spacing = numbers(first, "PixelSpacing", 2) or [0.0, 0.0]
    return {
        "series_uid": uid,
        "source_dir": source_dir,
        "rows": int(getattr(first, "Rows", 0) or 0),
        "cols": int(getattr(first, "Columns", 0) or 0),
        "pixel_spacing_mm": spacing,
        "slice_thickness_mm": number(first, "SliceThickness", 0.0),
        "encoding": ENCODING,
    }


def _reuse(uid: str, source_dir: str, out_root: Path, final: Path) -> tuple[SeriesOutcome, list] | None:
    try:
        meta = json.loads((final / SERIES_FILE).read_text())
        return SeriesOutcome(uid, source_dir, "reused", len(meta["slices"])), _rows(out_root, final, meta)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a damaged series.json: convert again


def _one_series(
    uid: str,
    members: list[tuple[Path, object]],
    source_dir: str,
    out_root: Path,
    work: Path,
    force: bool,
    min_slices: int,
) -> tuple[SeriesOutcome, list[dict[str, object]]]:
    final = _series_out_dir(out_root, source_dir, uid)
    if (final / SERIES_FILE).exists() and not force and (reused := _reuse(uid, source_dir, out_root, final)):
        return reused
    first = members[0][1]
    modality = str(getattr(first, "Modality", "") or "")
    if modality != "CT":
        return SeriesOutcome(uid, source_dir, "skipped", reason=f"modality {modality or 'missing'} is not CT"), []
    if "PixelData" not in first and not hasattr(first, "Rows"):
        return SeriesOutcome(uid, source_dir, "skipped", reason="no image data (not an image series)"), []
    meta = _series_meta(uid, first, source_dir)
    skipped: Counter[str] = Counter()
    slices: list[Slice] = []
    for path, ds in members:
        try:
            slices.append(slice_of(path, ds))
        except TagError as e:
            skipped[str(e)] += 1
    slices.sort(key=lambda s: (s.position, s.instance, s.path.name))

    tmp = work / safe_component(f"{source_dir}/{uid}")
    tmp.mkdir(parents=True, exist_ok=True)
    written: list[dict[str, object]] = []
    for s in slices:
        hu, why = pixels_hu(s.path, meta["rows"], meta["cols"])
        if hu is None:
            skipped[why] += 1
            continue
        name = f"{len(written):05d}.png"
        Image.fromarray(_hu_to_png_array(hu)).save(tmp / name, optimize=False, compress_level=1)
        written.append({"file": name, "source": s.path.name, "position": s.position})
    if len(written) < min_slices:
        _safe_rmtree(tmp, work.parent)
        reason = f"too few readable slices ({len(written)} < {min_slices})"
        return SeriesOutcome(uid, source_dir, "skipped", len(written), reason, dict(skipped)), []
    meta["slices"] = written
    (tmp / SERIES_FILE).write_text(json.dumps(meta, indent=1))
    _move_into_place(tmp, final, work)
    outcome = SeriesOutcome(uid, source_dir, "converted", len(written), files_skipped=dict(skipped))
    return outcome, _rows(out_root, final, meta)


def _move_into_place(tmp: Path, final: Path, work: Path) -> None:
    """Rename the finished series into its place; an earlier version there (--force, or a damaged attempt)
    is first moved into the temporary area and removed from there, never in place."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists() or final.is_symlink():
        old = work / f"replaced-{tmp.name}"
        os.rename(final, old)
        if old.is_symlink():  # a link someone put there: the link goes, never what it points at
            old.unlink()
        else:
            _safe_rmtree(old, work.parent)
    os.rename(tmp, final)


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
        }
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
    for folder, why in sorted(summary.folders_unreadable.items()):
        lines.append(f"folder {folder} skipped: unreadable ({why})")
    lines.append(
        f"preprocess: {summary.count('converted')} series converted, {summary.count('reused')} reused, "
        f"{summary.count('skipped')} skipped; {summary.slices_indexed} slices in {summary.index_path}"
    )
    return "\n".join(lines)
