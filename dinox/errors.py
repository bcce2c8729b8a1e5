"""The one error base: what dinox raises for the user, a one-line message and the exit code it ends with.

Every error a user can cause or meet (a bad spec, an unusable store, a missing device, nothing to decide on)
is a ``DinoxError``; ``dinox.cli`` catches the base once, prints ``error: <message>`` (a multi-line message,
one problem per line, as it is) and exits with ``exit_code``, never with a traceback. Exit code 1 is kept for
a NO-GO decision, so no error uses it. Interrupts are not errors: ``dinox.sweep.interrupts`` (exit 130).
"""

from __future__ import annotations

import shlex

EXIT_BAD_INPUT = 2


def escaped(text: str, keep: frozenset[str] = frozenset()) -> str:
    """`text` with each character that is not printable, but those in `keep`, as its escape (``\\x1b``,
    ``\\n``): a value shown inside a message stays on its line and cannot steer the terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else c.encode("unicode_escape").decode() for c in text)


def shell_word(text: object) -> str:
    """A value (a path, a URI) as one inert shell word inside a command dinox prints for a user to paste: quoted
    where it holds a space, `;`, `$(...)` or a quote, and on one line (a newline shows as ``\\n``)."""
    return shlex.quote(escaped(str(text)))


class DinoxError(Exception):
    """An error for the user: ``str(e)`` is the message, ``exit_code`` the command's exit code."""

    exit_code: int = EXIT_BAD_INPUT
    store_unusable: bool = False  # the tracking store itself is the trouble: nothing more is written to it


class WorkdirError(DinoxError, OSError):
    """The sweep's folder cannot be written (a full or read-only disk): results cannot be kept locally, and
    trials, which write theirs there, cannot run."""


def interrupted(
    exc: BaseException, kinds: tuple[type[BaseException], ...] = (KeyboardInterrupt,)
) -> BaseException | None:
    """The interrupt (a Ctrl-C; or any of `kinds`) that `exc` is or was caused by, else None: a library may turn
    it into an error of its own (a C extension whose module init met the KeyboardInterrupt fails to import:
    "ImportError: initialization failed", matplotlib's Agg backend when decide plots). Such an error is an
    interrupt, not a crash."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kinds):
            return current
        seen.add(id(current))
        # As Python prints the chain: the cause, else the context unless `raise ... from None` suppressed it.
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return None


# The top-level modules of dinox's dependencies (pyproject's), by import name.
DEPENDENCIES = frozenset(
    {"torch", "torchvision", "timm", "mlflow", "pydantic", "yaml", "click", "psutil", "matplotlib", "pydicom",
     "webdataset", "tqdm", "PIL", "numpy", "markdown", "pynvml"}
)  # fmt: skip


class MissingDependency(DinoxError):
    """This Python lacks one of dinox's dependencies: most often `mlflow run --env-manager local` (or a job
    script) started from an interpreter other than the one dinox was installed into."""

    def __init__(self, module: str, executable: str) -> None:
        super().__init__(
            f"this Python ({executable}) has no module {module!r}, which dinox needs: run dinox from the "
            f"environment it was installed into, or install it here (pip install dinox's package, with its "
            f"dependencies)"
        )
