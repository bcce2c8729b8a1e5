"""The `dinox` command's first module: nothing heavy, so a Ctrl-C while the command's modules (click, MLflow,
pydantic) are still importing is the one line dinox says for any Ctrl-C (exit 130), not an import traceback.
A user who presses it a second after typing the command meets exactly that window."""

from __future__ import annotations

import os
import sys


def entry() -> None:
    try:
        from dinox.cli.main import entry as run
    except KeyboardInterrupt:
        sys.stderr.write("dinox: interrupted by SIGINT; nothing was recorded\n")
        sys.stderr.flush()
        os._exit(130)
    run()
