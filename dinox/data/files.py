"""The files a CT trial reads, found and checked without torch: the index.csv that ``dinox preprocess``
writes, the webdataset shards that ``dinox shards`` writes from it, and DataError, which names the spec field
a problem is about. ``dinox validate`` and ``dinox shards`` run on a data box without a GPU stack.
"""

from __future__ import annotations

import csv
import glob
import itertools
import json
import os
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

from dinox.errors import DinoxError
from dinox.writes import write_whole

REQUIRED_COLUMNS = ("png_path", "series_dir", "slice_index")
HU_OFFSET = 32768
# A shard sample's three slices (z-1, z, z+1) under keys without dots: webdataset reads a dot as the start of
# a file extension, and series UIDs are full of them.
PARTS = ("prev.png", "cur.png", "next.png")
RAW_KEY = "slices.npy"  # raw16 shards: the three slices, uint16, in one array
# An image sample's keys, as webdataset's own writers and most tools name them: the encoded image and its class.
IMAGE_KEYS = ("jpg", "jpeg", "png", "webp")


class DataError(DinoxError, ValueError):
    """A data input that cannot be used: names the file, and the spec field it came from when there is one."""

    def __init__(self, message: str, field: str = ""):
        super().__init__(f"{field}: {message}" if field else message)
        self.field, self.message = field, message


def read_index(index_csv: str | Path, root: Path | None = None) -> list[dict[str, str]]:
    """The index's rows, checked; with `root`, each png_path must name a file under it: an index (shared,
    downloaded) that names /etc/shadow or ../../secrets would read it into a batch, or store it in shards."""
    path = Path(index_csv)
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise DataError(f"{path}: not a dinox index.csv (missing columns {', '.join(missing)})")
            rows = list(reader)
    except OSError as e:
        raise DataError(f"{path}: cannot read index ({e.strerror or e})") from None
    except (csv.Error, UnicodeDecodeError) as e:
        raise DataError(f"{path}: not a readable CSV ({type(e).__name__}: {e})") from None
    if not rows:
        raise DataError(f"{path}: the index lists no slices")
    for line, r in enumerate(rows, start=2):  # line 1 is the header
        if any(not r.get(c) for c in REQUIRED_COLUMNS):
            raise DataError(f"{path}:{line}: a row without {', '.join(c for c in REQUIRED_COLUMNS if not r.get(c))}")
        if not r["slice_index"].strip().lstrip("-").isdigit():
            raise DataError(f"{path}:{line}: slice_index {r['slice_index']!r} is not a whole number")
        png = r["png_path"]
        if root is not None and (os.path.isabs(png) or os.path.normpath(png).split(os.sep)[0] == ".."):
            raise DataError(
                f"{path}:{line}: png_path {png!r} lies outside the index's root {str(root)!r}: an index names files "
                "under its root only (relative, no ..); give the folder that holds them as the root "
                "(dinox shards --root, data.root)"
            )
    return rows


def default_root(index_csv: str | Path) -> Path:
    parent = Path(index_csv).parent
    return parent.parent if parent.name == "_index" else parent


def neighbours(rows: list[dict[str, str]]) -> tuple[list[list[str]], list[tuple[int, int]]]:
    """Slices per series in order, and every slice as (series number, position in its series)."""
    by_series: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for r in rows:
        by_series[r["series_dir"]].append((int(r["slice_index"]), r["png_path"]))
    series = [[p for _, p in sorted(v)] for _k, v in sorted(by_series.items())]
    slices = [(s, z) for s, paths in enumerate(series) for z in range(len(paths))]
    return series, slices


def write_shards(
    index_csv: str | Path,
    out_dir: str | Path,
    *,
    root: str | Path | None = None,
    shard_size: int = 1000,
    prefix: str = "ct",
    encoding: str = "png16",
    replace: bool = False,
) -> list[Path]:
    """Write every slice of the index as a sample; return the shard paths. png16: the three slices as the PNG
    bytes preprocess wrote; raw16: as one uint16 [3, H, W] array (``slices.npy``), nothing to inflate."""
    root = Path(root) if root else default_root(index_csv)
    series, slices = neighbours(read_index(index_csv, root))
    with ShardSet(Path(out_dir), prefix, shard_size, replace) as sink:
        for s, z in slices:
            paths = series[s]
            picks = (paths[max(z - 1, 0)], paths[z], paths[min(z + 1, len(paths) - 1)])
            sample = {"__key__": f"s{s:06d}_z{z:05d}"}
            if encoding == "raw16":
                sample[RAW_KEY] = _raw16([root / p for p in picks])
            else:
                for part, p in zip(PARTS, picks, strict=True):
                    sample[part] = (root / p).read_bytes()
            meta = {"png_path": paths[z], "series": s, "slice": z, "encoding": encoding}
            sample["json"] = json.dumps(meta).encode()
            sink.write(sample)
    return sink.written


# Left in a shard folder while a set is moved into place, removed once it is whole: a process killed halfway
# through a --replace leaves old and new shards side by side, and this says the folder is not one set.
INCOMPLETE = ".dinox-shards-incomplete"


class ShardSet:
    """Shards written whole or not at all: into a staging folder inside `out`, moved into place once every
    sample is in (a failure halfway leaves no complete-looking shard). `out` holding shards of this prefix
    already is refused, or with `replace` the old ones go once the new ones are there (a 2-image set over a
    40-image one kept 32 of the old samples). The moves happen under the INCOMPLETE marker, so a kill during
    them leaves a folder every reader refuses. `out` holding shards of another prefix is refused: a folder
    is read as one set, and would mix them."""

    def __init__(self, out: Path, prefix: str, shard_size: int, replace: bool):
        self.out, self.prefix, self.shard_size, self.replace = out, prefix, shard_size, replace
        self.written: list[Path] = []

    def __enter__(self) -> ShardSet:
        import webdataset as wds

        self.old = sorted(self.out.glob(f"{self.prefix}-*.tar")) if self.out.is_dir() else []
        others = sorted(p.name for p in self.out.glob("*.tar") if p not in self.old) if self.out.is_dir() else []
        if others:
            raise DataError(
                f"{self.out} holds other shards ({others[0]}{' and more' if len(others) > 1 else ''}): a shard folder "
                f"is read as one set, and {self.prefix}-*.tar beside them would mix two; give another --out"
            )
        if self.old and not self.replace:
            raise DataError(
                f"{self.out} already holds {len(self.old)} shard(s) ({self.prefix}-*.tar); --replace writes the new "
                "set in their place, or give another --out"
            )
        self.out.mkdir(parents=True, exist_ok=True)
        self.staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.out))
        pattern = str(self.staging / f"{self.prefix}-%06d.tar")
        self.writer = wds.ShardWriter(pattern, maxcount=self.shard_size, verbose=0)
        return self

    def write(self, sample: dict) -> None:
        self.writer.write(sample)

    def __exit__(self, kind, value, tb) -> None:  # noqa: ANN001
        try:
            self.writer.close()
            if kind is None:
                new = sorted(self.staging.glob(f"{self.prefix}-*.tar"))
                marker = self.out / INCOMPLETE
                write_whole(marker, f"dinox shards was moving {len(new)} {self.prefix}-*.tar into place\n")
                for path in new:
                    os.replace(path, self.out / path.name)
                self.written = [self.out / p.name for p in new]
                for stale in set(self.old) - set(self.written):
                    stale.unlink(missing_ok=True)
                marker.unlink()  # the set is whole
        finally:
            shutil.rmtree(self.staging, ignore_errors=True)


def _raw16(paths: list[Path]) -> bytes:
    """Three 16-bit PNG slices as one .npy array of their stored values (HU + 32768), uncompressed."""
    import io

    import numpy as np
    from PIL import Image

    arrays = []
    for path in paths:
        try:
            with Image.open(path) as im:
                arrays.append(np.asarray(im, dtype=np.uint16))
        except (OSError, ValueError) as e:
            raise DataError(f"cannot decode {path}: {type(e).__name__}: {e}") from e
    buf = io.BytesIO()
    np.save(buf, np.stack(arrays), allow_pickle=False)
    return buf.getvalue()


def shard_urls(shards: str) -> list[str]:
    """A folder (all its .tar files), a glob, a brace pattern, or http(s) URLs (see dinox.spec.shard_urls)."""
    from dinox.spec import shard_urls as urls_policy

    why = urls_policy.problem(shards)  # the spec checked it; a hand-written trial.json is checked here too
    if why:
        raise DataError(why, "data.shards")
    path = Path(shards)
    folder = path if path.is_dir() else Path(shards).parent
    if (folder / INCOMPLETE).exists():
        raise DataError(
            f"{folder} holds an incomplete shard set (a dinox shards run was stopped while moving it into place): "
            "run dinox shards again with --replace",
            "data.shards",
        )
    if path.is_dir():
        urls = sorted(str(p) for p in path.glob("*.tar"))
    elif any(c in shards for c in "*?[") and "{" not in shards:
        urls = sorted(glob.glob(shards))
    else:
        urls = urls_policy.expand(shards)
    if not urls:
        raise DataError(f"{shards}: no .tar shards found", "data.shards")
    missing = [u for u in urls if not urls_policy.scheme(u) and not Path(u).exists()]
    if missing:
        raise DataError(f"{missing[0]} does not exist ({len(missing)} of {len(urls)} shards missing)", "data.shards")
    return urls


def list_image_folder(root: str | Path) -> tuple[list[str], list[tuple[str, int]]]:
    """The class names (sorted folder names) and every (file, class index) under them; a class folder with
    no file is an error that names it."""
    base = Path(root)
    if not base.is_dir():
        raise DataError(f"{root}: no such directory", "data.root")
    classes = sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DataError(f"{root}: no class folders (an image folder is root/<class>/<image>)", "data.root")
    items: list[tuple[str, int]] = []
    for index, name in enumerate(classes):
        files = sorted(p for p in (base / name).iterdir() if p.is_file() and not p.name.startswith("."))
        if not files:
            raise DataError(f"{base / name}: an empty class folder", "data.root")
        items += [(str(p), index) for p in files]
    return classes, items


def write_image_shards(
    root: str | Path,
    out_dir: str | Path,
    *,
    shard_size: int = 1000,
    prefix: str = "images",
    replace: bool = False,
    follow_links: bool = False,
) -> list[Path]:
    """Every image of an image folder as a sample of standard keys (``jpg`` or ``png`` with ``cls``, the
    class index), its bytes as they are on disk; return the shard paths. A link that leads out of the folder
    is refused unless `follow_links` (a link to /etc/shadow was stored in a shard)."""
    _classes, items = list_image_folder(root)
    inside = Path(root).resolve()
    for path, _label in items:
        if not follow_links and not Path(path).resolve().is_relative_to(inside):
            raise DataError(f"{path}: a link out of {root} (to {Path(path).resolve()}); --follow-links reads it")
    with ShardSet(Path(out_dir), prefix, shard_size, replace) as sink:
        for i, (path, label) in enumerate(items):
            ext = Path(path).suffix.lower().lstrip(".")
            key = "jpg" if ext == "jpeg" else ext
            if key not in IMAGE_KEYS:
                raise DataError(f"{path}: not a .jpg, .jpeg, .png or .webp file")
            sink.write({"__key__": f"i{i:08d}", key: Path(path).read_bytes(), "cls": str(label).encode()})
    return sink.written


def shard_layout(url: str) -> str:
    """What a local shard holds, from its first sample's member names: png16 or raw16 CT slices, or images;
    "" for a remote shard (not opened twice) or one that cannot be read."""
    import tarfile

    if "://" in url:
        return ""
    try:
        with tarfile.open(url) as tar:
            names = [m.name for m in itertools.islice(tar, 8)]
    except (OSError, tarfile.TarError):
        return ""
    suffixes = {name.split(".", 1)[-1] for name in names}
    if RAW_KEY in suffixes:
        return "raw16"
    if "cur.png" in suffixes:
        return "png16"
    return "images" if suffixes & set(IMAGE_KEYS) else ""


def count_rows(index_csv: str | Path) -> int:
    """Data rows of an index.csv (its lines less the header), without parsing them."""
    with open(index_csv, "rb") as f:
        return max(0, sum(1 for _ in f) - 1)


def count_images(root: str | Path, at_least: int) -> int:
    """Image files under root/<class>/, counted until `at_least` are seen (an ImageNet need not be listed)."""
    n = 0
    for cls in sorted(Path(root).iterdir()):
        if not cls.is_dir() or cls.name.startswith("."):
            continue
        for entry in os.scandir(cls):
            n += entry.is_file() and not entry.name.startswith(".")
            if n >= at_least:
                return n
    return n


def first_sample(urls: list[str]) -> bool:
    """Whether any local shard of `urls` holds a sample (a member with a key): reads tar headers until one.
    Remote shards are not opened here: True."""
    import tarfile

    for url in urls:
        if "://" in url:
            return True
        try:
            with tarfile.open(url) as tar:
                if any(m.isfile() for m in tar):
                    return True
        except (OSError, tarfile.TarError):
            continue  # the trial reports an unreadable shard with its name
    return False


def check_pixels(data: bytes, name: str) -> None:
    """Raise DataError when an encoded image declares more pixels than PIL's decompression-bomb limit
    (Image.MAX_IMAGE_PIXELS, about 89 M), read from its header before any decoder allocates the image. PIL
    refuses such a file itself; torchvision.io and nvJPEG allocate what the header says (a 7 MB PNG declaring
    50000x50000 grew a trial to 7.8 GB, recorded as an OOM): the same limit for every decoder, an error that
    names the file."""
    import io
    import warnings

    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                width, height = im.size
    except Image.DecompressionBombError as e:
        raise DataError(f"cannot decode {name}: a decompression bomb? {e}") from None
    except Exception:  # noqa: BLE001 - a header PIL cannot read: the decoder says what is wrong
        return
    if width * height > (Image.MAX_IMAGE_PIXELS or 0) > 0:
        raise DataError(
            f"cannot decode {name}: it declares {width}x{height} pixels, more than the {Image.MAX_IMAGE_PIXELS} "
            "PIL takes as an image rather than a decompression bomb"
        )
