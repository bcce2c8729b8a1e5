"""The `dinox` command's first module: nothing heavy, so a Ctrl-C while the command's modules (click, MLflow,
pydantic) are still importing is the one line dinox says for any Ctrl-C (exit 130), not an import traceback.
A user who presses it a second after typing the command meets exactly that window. So is a Python that lacks
one of those modules (`mlflow run --env-manager local` from another interpreter): one line, exit 2."""

from __future__ import annotations

import os
import sys

from dinox.errors import DEPENDENCIES, EXIT_BAD_INPUT, MissingDependency


def entry() -> None:
    try:
        from dinox.cli.main import entry as run
    except KeyboardInterrupt:
        _leave("dinox: interrupted by SIGINT; nothing was recorded", 130)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in DEPENDENCIES:
            raise  # dinox's own module: a bug, and its traceback is what finds it
        _leave(f"error: {MissingDependency(e.name or '?', sys.executable)}", EXIT_BAD_INPUT)
    run()


def _leave(line: str, code: int) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    os._exit(code)
