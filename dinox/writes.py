"""How dinox writes a file another process or person reads: whole or not at all, and never through a link.

``write_whole(path, data)`` writes to a fresh name beside `path` (created exclusively, so a link planted under a
predictable temporary name is never followed) and renames it over `path` (a link planted at `path` itself is
replaced, not written through). A reader sees the old file or the new one, never half of one. Every room that
leaves a file for someone else (reports, results, journals' companions, job scripts) writes it this way.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

# The mode a plain open() would give (0o666 less the umask): mkstemp's own 0o600 would hide a shared report.
_UMASK = os.umask(0)
os.umask(_UMASK)


def cache_dir() -> Path:
    """Where dinox keeps what it can make again (an empty store, timm's names, models' costs):
    $XDG_CACHE_HOME/dinox, else ~/.cache/dinox. Deleting it costs only the time to make them again."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dinox"


def write_whole(path: str | Path, data: str | bytes, mode: int | None = None) -> None:
    """`data` (text as UTF-8) in `path`, whole or not at all. Raises OSError as open() would."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode if mode is not None else 0o666 & ~_UMASK)
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
