"""Checks that need more than the spec itself, made before anything runs or is recorded: the timm model
exists, and the data files a trial reads are there and readable. The model names come from a cached list
of timm's architectures (dinox.model_names), so this imports neither timm nor torch once that list exists."""

from __future__ import annotations

import csv
from pathlib import Path

from dinox.grid import Trial, line_for
from dinox.spec import CtPngData, WebDatasetData
from dinox.spec_file import Problem, SpecDocument


def check(doc: SpecDocument, trials: list[Trial]) -> list[Problem]:
    problems: dict[tuple[str, str], Problem] = {}

    def add(trial: Trial, path: str, message: str) -> None:
        key = (path, message)
        if key not in problems:
            problems[key] = Problem(path, message, line_for(doc, tuple(path.split(".")), trial.locations))

    names = {t.spec.model.name for t in trials}
    unknown = _unknown_models(names)
    for t in trials:
        if t.spec.model.name in unknown:
            add(t, "model.name", unknown[t.spec.model.name])
        data = t.spec.data
        if isinstance(data, CtPngData):
            for message in _index_problems(data.index_csv):
                add(t, "data.index_csv", message)
            if data.root is not None and not Path(data.root).is_dir():
                add(t, "data.root", f"{data.root}: no such directory")
        elif isinstance(data, WebDatasetData):
            from dinox.data.ct_png import DataError
            from dinox.data.webdataset_source import shard_urls

            try:
                shard_urls(data.shards)
            except DataError as e:
                add(t, "data.shards", str(e).removeprefix("data.shards: ").removeprefix("data.shards "))
    return list(problems.values())


def _unknown_models(names: set[str]) -> dict[str, str]:
    from dinox.model_names import architectures, unknown_model

    known = architectures()  # a cached list: timm (and torch) are imported only to make it
    return {name: problem for name in sorted(names) if (problem := unknown_model(name, known))}


def _index_problems(index_csv: str) -> list[str]:
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
    from dinox.data.ct_png import REQUIRED_COLUMNS

    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        return [f"{index_csv}: not a dinox index.csv (missing columns {', '.join(missing)})"]
    return []
