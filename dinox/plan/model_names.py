"""Which timm architectures exist, without importing timm (and so torch) where a cached list will do.

Checking a spec's model names is the only reason `dinox validate` and the parent of `dinox run` would import
timm, and with it torch (seconds on a cold machine, most of a validate). timm's registry is fixed for an
installed timm, so its list of architectures is kept in the user's cache, keyed by timm's version and
install time, and written the first time it is needed. Torch-free.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.metadata
import importlib.util
from pathlib import Path

from dinox.writes import cache_dir, write_whole


def _cache_file() -> Path | None:
    spec = importlib.util.find_spec("timm")
    if spec is None or spec.origin is None:
        return None
    stamp = Path(spec.origin).stat().st_mtime_ns
    return cache_dir() / f"timm-{importlib.metadata.version('timm')}-{stamp}-models.txt"


def architectures() -> list[str]:
    """timm.list_models(): every registered architecture name (without pretrained tags)."""
    cache = _cache_file()
    if cache is not None:
        with contextlib.suppress(OSError):
            names = cache.read_text().split()
            if names:
                return names
    import timm

    names = list(timm.list_models())
    if cache is not None:
        with contextlib.suppress(OSError):  # a read-only home only costs the import next time
            cache.parent.mkdir(parents=True, exist_ok=True)
            write_whole(cache, "\n".join(names) + "\n")
    return names


def unknown_model(name: str, known: list[str] | None = None) -> str | None:
    """Why `name` is not a timm model, with the closest names, or None when it is one. As timm.is_model: the
    architecture is the part before a pretrained tag (vit_base_patch16_224.augreg_in21k)."""
    names = known if known is not None else architectures()
    if name.split(".", 1)[0] in set(names):
        return None
    close = difflib.get_close_matches(name, names, n=3)
    hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
    return f"unknown timm model {name!r}{hint}"
