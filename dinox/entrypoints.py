"""A team's own code named in a spec (``module:callable``): imported in a trial's process, a validate child or the
estimate child only, never by the parent, decide, sync or the UI. One way to import it and one way to say
what went wrong, for the objective's entry (dinox.measure.user_step) and the data's (dinox.data.user_data).
Plain Python, like the record: no room below it, no torch."""

from __future__ import annotations

import importlib
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dinox.contract import one_line
from dinox.errors import DinoxError


class EntryError(DinoxError, ValueError):
    """An entry that cannot give what it names: one line, at validate (exit 2) or as the trial's error."""


def load(entry: str, path: str, field: str) -> tuple[Callable[..., Any], str]:
    """(the entry's callable, the folder it was imported from), its module imported from `path`. Raises
    EntryError naming `field` (objective.entry, data.entry)."""
    module_name, _, name = entry.partition(":")
    root = str(Path(path).resolve())
    if root not in sys.path:
        sys.path.insert(0, root)
    try:
        module = importlib.import_module(module_name)
    except BaseException as e:  # noqa: BLE001 - a SystemExit in its import is its failure too
        if isinstance(e, KeyboardInterrupt):
            raise
        raise EntryError(f"{field} {entry}: importing {module_name} failed: {where(e, root)}") from None
    target = getattr(module, name, None)
    if target is None:
        raise EntryError(f"{field} {entry}: {getattr(module, '__file__', module_name)} has no {name!r}")
    if not callable(target):
        raise EntryError(f"{field} {entry}: {name} is {a(type(target).__name__)}, not a callable")
    return target, root


def call(target: Callable[..., Any], argument: Any, entry: str, root: str, field: str) -> Any:
    """`target(argument)`; what it raises becomes one EntryError line with the user's own file:line."""
    try:
        return target(argument)
    except Exception as e:  # noqa: BLE001 - the team's code: its failure, said in one line with its place
        raise EntryError(f"{field} {entry}: the call raised {where(e, root)}") from None


def a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def where(e: BaseException, root: str) -> str:
    """`TypeError: message (recipe.py:12)`: the exception and the innermost frame of the user's own code (in
    the folder the entry is imported from), where there is one."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename.startswith(root + "/")]
    place = f" ({frames[-1].filename[len(root) + 1 :]}:{frames[-1].lineno})" if frames else ""
    message = str(e)
    if isinstance(e, SyntaxError) and e.filename:  # its own text already says where, less plainly
        place, message = f" ({e.filename.removeprefix(root + '/')}:{e.lineno})", str(e.msg)
    return one_line(f"{type(e).__name__}: {message}{place}", 400)
