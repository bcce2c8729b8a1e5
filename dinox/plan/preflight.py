"""Checks that need more than the spec itself, made before anything runs or is recorded: the timm model
exists, and the data files a trial reads are there and readable. The model names come from a cached list
of timm's architectures (dinox.plan.model_names), so this imports neither timm nor torch once that list exists."""

from __future__ import annotations

import csv
from pathlib import Path

from dinox.data.files import (
    REQUIRED_COLUMNS,
    DataError,
    count_images,
    count_rows,
    default_root,
    first_sample,
    read_index,
    shard_urls,
)
from dinox.plan.grid import Trial
from dinox.spec.data_sources import CtPngData, ImageFolderData, SyntheticData, WebDatasetData


def check(trials: list[Trial]) -> list[tuple[Trial, str, str]]:
    """(trial, field path, message) for each problem, the first trial it occurs in; `grid.locate` finds
    their lines in the spec file."""
    problems: dict[tuple[str, str], tuple[Trial, str, str]] = {}

    def add(trial: Trial, path: str, message: str) -> None:
        problems.setdefault((path, message), (trial, path, message))

    # A user's own step (objective kind python) names its model as it likes: the entry builds it.
    timm_built = {t.index for t in trials if t.spec.objective.kind != "python"}
    unknown = _unknown_models({t.spec.model.name for t in trials if t.index in timm_built})
    for t in trials:
        if t.index in timm_built and t.spec.model.name in unknown:
            add(t, "model.name", unknown[t.spec.model.name])
        data = t.spec.data
        if isinstance(data, CtPngData):
            for message in _index_problems(data.index_csv, data.root):
                add(t, "data.index_csv", message)
            if data.root is not None and not Path(data.root).is_dir():
                add(t, "data.root", f"{data.root}: no such directory")
        elif isinstance(data, ImageFolderData):
            for message in _image_folder_problems(data.root):
                add(t, "data.root", message)
        policy = (
            data.augment.auto_augment if isinstance(data, (ImageFolderData, WebDatasetData)) and data.augment else None
        )
        if policy and (why := _auto_augment_problem(policy)):
            add(t, "data.augment.auto_augment", why)
        elif isinstance(data, WebDatasetData):
            try:
                shard_urls(data.shards)
            except DataError as e:
                add(t, e.field or "data.shards", e.message)
    if not problems:  # the files are readable: is each trial's set big enough for one batch?
        short = [(t, found) for t in trials if (found := _no_batch(t))]
        if short:
            trial, (path, message) = short[0]
            add(trial, path, _no_batch_message(short, len(trials)) if message == SHORT else message)
    return list(problems.values())


SHORT = "short"  # _no_batch's word for a set smaller than one batch: check() words it for every such trial


def _no_batch_message(short: list[tuple[Trial, tuple[str, str]]], total: int) -> str:
    """One line for every trial whose set is smaller than its batch: how many, their batch sizes, and what a
    user can change from the command line (a swept batch.size cannot be --set)."""
    trials = [t for t, (_path, message) in short if message == SHORT]
    t0, data = trials[0], trials[0].spec.data
    sizes = sorted({_smallest_batch(t) for t in trials})
    ranks = max(t.spec.hardware.gpus for t in trials)
    n, what, source = _set_size(t0)
    which = f" in {len(trials)} of {total} trials" if total > 1 else ""
    per = f" for {ranks} ranks is {n // ranks} each" if ranks > 1 else ""
    batches = "batch.size " + ", ".join(map(str, sizes))
    if isinstance(data, CtPngData):
        base = n // data.inflation
        need = -(-sizes[-1] * ranks // base)  # the inflation at which the largest batch fits every rank
        fix = (
            f"raise data.inflation to {need} (--set data.inflation={need}: the slices are repeated, not copied) "
            f"or point data.index_csv at more slices"
        )
    elif isinstance(data, ImageFolderData):
        fix = "point data.root at more images"
    else:
        fix = f"raise data.num_samples to {sizes[-1] * ranks} or more"
    swept = any("batch.size" in t.overrides for t in trials)
    fix += "; or lower batch.size" + (" in the spec's sweep (a swept field cannot be --set)" if swept else "")
    return (
        f"the loader can yield no batch{which}: {n} {what} ({source}){per}, fewer than {batches}, and every batch "
        f"is a full one; {fix}"
    )


def _smallest_batch(t: Trial) -> int:
    return t.spec.batch.auto_min if t.spec.batch.auto else t.spec.size  # auto: the smallest it may choose


def _set_size(t: Trial) -> tuple[int, str, str]:
    """(samples, their word, where the count comes from) of a map-style set; (0, "", "") for a stream or an
    endless synthetic set."""
    data = t.spec.data
    if isinstance(data, CtPngData):
        rows = count_rows(data.index_csv)
        source = f"index rows {rows}" + (f", subset_size {data.subset_size}" if data.subset_size else "")
        return min(rows, data.subset_size or rows) * data.inflation, "slices", f"{source} x inflation {data.inflation}"
    if isinstance(data, ImageFolderData):
        return count_images(data.root, _smallest_batch(t) * t.spec.hardware.gpus), "images", data.root
    if isinstance(data, SyntheticData) and data.num_samples is not None:
        return data.num_samples, "samples", "data.num_samples"
    return 0, "", ""


def _no_batch(t: Trial) -> tuple[str, str] | None:
    """(field, why) when the trial's loader could yield no batch: every batch is full (drop_last), and each
    rank reads its own part of the set; a stream needs a shard per rank and a sample in its shards. A map-style
    set smaller than a batch per rank is (field, SHORT): check() words it once for all such trials."""
    data, ranks = t.spec.data, t.spec.hardware.gpus
    if isinstance(data, WebDatasetData):
        urls = shard_urls(data.shards)
        if len(urls) < ranks:
            return "data.shards", f"{len(urls)} shard(s) for {ranks} ranks: a rank without a shard yields no batch"
        return None if first_sample(urls) else ("data.shards", f"{data.shards}: the shards hold no sample")
    n, what, _source = _set_size(t)
    if not what or n // ranks >= _smallest_batch(t):
        return None
    field = {CtPngData: "data.index_csv", ImageFolderData: "data.root"}.get(type(data), "data.num_samples")
    return field, SHORT


def _unknown_models(names: set[str]) -> dict[str, str]:
    from dinox.plan.model_names import architectures, unknown_model

    known = architectures()  # a cached list: timm (and torch) are imported only to make it
    return {name: problem for name in sorted(names) if (problem := unknown_model(name, known))}


def _auto_augment_problem(policy: str) -> str:
    """A policy this machine's timm and Pillow cannot run: timm 1.0's increasing posterize (the ``inc1`` of
    rand-m9-mstd0.5-inc1) keeps 0 bits at full magnitude, which Pillow 13 refuses, so a run crashes in a
    loader worker now and then (whenever a sampled magnitude reaches 10). Imports timm: asked only for such a
    policy."""
    if "inc1" not in policy.split("-"):
        return ""
    from importlib.metadata import version

    from PIL import Image
    from timm.data.auto_augment import AugmentOp

    try:  # timm clamps a sampled magnitude to 10: the op at 10 is what a run meets now and then
        AugmentOp("PosterizeIncreasing", prob=1.0, magnitude=10)(Image.new("RGB", (1, 1)))
    except ValueError as e:
        return (
            f"{policy}: timm {version('timm')}'s increasing posterize at full magnitude fails with Pillow "
            f"{version('pillow')} ({e}): a run with this policy crashes in a loader worker now and then. Use it "
            "without -inc1 (rand-m9-mstd0.5), or a Pillow before 13"
        )
    return ""


def _image_folder_problems(root: str) -> list[str]:
    """A look at the top of the tree only: listing every file of an ImageNet on a network file system takes
    minutes, and the trial lists it anyway (an empty class folder fails the trial, naming it)."""
    path = Path(root)
    if not path.is_dir():
        return [f"{root}: no such directory (python scripts/make_demo_images.py {root} writes a small one)"]
    if not any(p.is_dir() for p in path.iterdir()):
        return [f"{root}: no class folders (an image folder is root/<class>/<image>)"]
    return []


def _index_problems(index_csv: str, root: str | None) -> list[str]:
    path = Path(index_csv)
    if not path.exists():
        return [f"{index_csv}: no such file (write it with dinox preprocess)"]
    if not path.is_file():
        return [f"{index_csv}: not a file"]
    try:
        with open(path, newline="") as f:
            header = next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        return [f"{index_csv}: unreadable ({getattr(e, 'strerror', None) or type(e).__name__})"]
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        return [f"{index_csv}: not a dinox index.csv (missing columns {', '.join(missing)})"]
    try:
        # every row, as the trial will read them: a bad one named by its line here
        read_index(index_csv, Path(root) if root else default_root(index_csv))
    except DataError as e:
        return [e.message]
    return []
