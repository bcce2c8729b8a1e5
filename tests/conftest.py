"""Shared helpers: tiny specs on disk, and the CLI run as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A trial small enough that a 2-core CPU measures it in about a second once torch is imported.
TINY = """\
name: {name}
model: {{name: vit_tiny_patch16_224, img_size: 32, kwargs: {{patch_size: 8}}}}
objective: {{num_classes: 10}}
batch: {{size: 4}}
measure: {{warmup_steps: 1, bench_steps: 3, timeout_s: 120}}
"""


@pytest.fixture
def write_spec(tmp_path: Path):
    def write(text: str, name: str = "spec.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


def run_dinox(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300):
    """`python -m dinox ARGS` in a fresh process, as a user would run it."""
    full_env = dict(os.environ, **(env or {}))
    full_env.pop("MLFLOW_RUN_ID", None)
    return subprocess.run(
        [sys.executable, "-m", "dinox", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
