"""Where a `kind: python` objective's code is, and what it is, found without importing it.

The parent never runs the team's code (`decide`, `sync` and the UI read the store; `run` only expands the
spec): the module is found on disk by Python's own path finder (the objective's `path`, then this Python's
own path) and its source is hashed: a package's every ``.py`` file (a change in a helper module is a
change in the step), a lone module's own file. The hash and the file go into the trial's spec, so they are
params and part of the trial's id. Importing, building and checking the protocol happen in a child
(``python -m dinox.measure.entry_check``, at validate, plan and run) and in the trial's own process.
"""

from __future__ import annotations

import hashlib
import os
import sys
from importlib.machinery import PathFinder
from pathlib import Path

MAX_FILES = 5000  # a package larger than this is hashed by its first files (sorted) and says so
MAX_BYTES = 64 * 1024 * 1024


class EntryNotFound(ValueError):
    pass


def search_path(path: str) -> list[Path]:
    """The folders the entry's module is looked for in: its `path` (relative to the working folder), then
    this Python's path (installed packages, PYTHONPATH)."""
    return [Path(path).resolve(), *(Path(p).resolve() for p in sys.path if p)]


def locate(entry: str, path: str, section: str = "objective") -> tuple[Path, Path]:
    """(the module's file: a package's __init__.py or a module's .py, the folder it is imported from). Raises
    EntryNotFound.

    Python's own path finder (importlib.machinery.PathFinder) looks, one dotted part at a time, in the folders
    given: it knows packages, namespace packages and the suffixes this Python imports, and executes nothing.
    importlib.util.find_spec would run each parent package's __init__, the team's code, in this process."""
    module = entry.split(":", 1)[0]
    parts = module.split(".")
    PathFinder.invalidate_caches()  # its folder listings are cached: a module written since must be seen
    for folder in search_path(path):
        spec = PathFinder.find_spec(parts[0], [str(folder)])
        for part in parts[1:]:
            inside = list(spec.submodule_search_locations or []) if spec is not None else []
            # By its last part: under its dotted name a namespace package's path would ask sys.modules for
            # its parent, which only an import puts there. The finder matches the last part anyway.
            spec = PathFinder.find_spec(part, inside) if inside else None
        if spec is not None and spec.origin and Path(spec.origin).is_file():
            return Path(spec.origin), folder
    raise EntryNotFound(
        f"module {module!r} is not in {Path(path).resolve()} ({section}.path) nor on this Python's path: no "
        f"{'/'.join(parts)}.py or {'/'.join(parts)}/__init__.py"
    )


def source_hash(entry: str, path: str, section: str = "objective") -> tuple[str, Path, Path]:
    """(sha256 of the source, the module's file, the folder it is imported from). Raises EntryNotFound, and
    OSError where it cannot be read."""
    file, root = locate(entry, path, section)
    top = _top_package(file, len(entry.split(":", 1)[0].split(".")))
    files = sorted(top.rglob("*.py"))[:MAX_FILES] if top is not None else [file]
    digest, total = hashlib.sha256(), 0
    for f in files:
        if not f.is_file():  # a planted link to a device (/dev/zero) or a FIFO is no source, and never read
            continue
        with open(f, "rb") as handle:
            data = handle.read(MAX_BYTES - total + 1)
        total += len(data)
        if total > MAX_BYTES:  # a package this large is hashed by its first MAX_BYTES
            break
        rel = os.path.relpath(f, top.parent if top is not None else f.parent)
        digest.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest(), file, root


def _top_package(file: Path, depth: int) -> Path | None:
    """The folder of the entry's top-level package (None for a lone module file)."""
    folder = file.parent
    steps = depth - (0 if file.name == "__init__.py" else 1)
    if steps <= 0:
        return None
    for _ in range(steps - 1):
        folder = folder.parent
    return folder
