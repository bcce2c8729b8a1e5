"""A GPU node with no package index: the wheelhouse scripts/make_wheelhouse.py makes, installed offline into a
fresh venv that has only a torch stack of its own (as a cluster image has), and `dinox validate` and a tiny
`dinox run` from there."""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY


def _registry_reachable() -> bool:
    try:
        index = subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.index-url"], capture_output=True, text=True
        ).stdout.strip()
        urllib.request.urlopen(index or "https://pypi.org/simple/", timeout=10).close()
        return True
    except Exception:  # noqa: BLE001 - any failure: no registry here
        return False


def _torch_stack(folder: Path) -> list[str]:
    """torch, torchvision and timm with what they themselves require, linked from this environment into
    `folder`: what a cluster image's Python has before dinox arrives."""
    seen: set[str] = set()
    todo = ["torch", "torchvision", "timm"]
    while todo:
        name = re.split(r"[<>=!~;\[ ]", todo.pop())[0].lower().replace("_", "-")
        if name in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen.add(name)
        todo += [r for r in dist.requires or [] if "extra ==" not in r]
        base = Path(str(dist.locate_file("")))
        for top in {f.parts[0] for f in dist.files or [] if not f.parts[0].startswith("..")}:
            if (base / top).exists() and not (folder / top).exists():
                os.symlink(base / top, folder / top)
    return sorted(seen)


@pytest.mark.skipif(not _registry_reachable(), reason="the package registry is not reachable to make the wheelhouse")
def test_the_wheelhouse_installs_offline_beside_the_node_s_own_torch(tmp_path):
    wheelhouse = tmp_path / "wheelhouse"
    made = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_wheelhouse.py"), str(wheelhouse)], capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr[-2000:]
    wheels = [p.name for p in wheelhouse.glob("*.whl")]
    size = sum(p.stat().st_size for p in wheelhouse.glob("*.whl")) / 2**20
    assert size < 80, size  # tens of MB: no torch, no CUDA libraries, no MLflow server stack
    assert any(w.startswith("dinox-") for w in wheels) and any(w.startswith("mlflow_skinny-") for w in wheels)
    assert not [w for w in wheels if w.split("-")[0].lower() in ("torch", "torchvision", "timm", "mlflow", "numpy")]
    stack = tmp_path / "stack"
    stack.mkdir()
    assert {"torch", "torchvision", "timm"} <= set(_torch_stack(stack))
    node = tmp_path / "node"
    subprocess.run([sys.executable, "-m", "venv", str(node)], check=True)
    (next((node / "lib").glob("python3*/site-packages")) / "node_stack.pth").write_text(f"{stack}\n")
    # No index at all: an unreachable one named, and --no-index.
    env = dict(os.environ, PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_EXTRA_INDEX_URL="", PIP_FIND_LINKS="")
    pip = [str(node / "bin" / "pip"), "install", "--quiet", "--no-compile", "--no-index", "-f", str(wheelhouse)]
    for extra in (["-r", str(wheelhouse / "requirements.txt")], ["--no-deps", "dinox"]):
        done = subprocess.run([*pip, *extra], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    env.pop("PYTHONPATH", None)
    dinox = str(node / "bin" / "dinox")
    quickstart = str(ROOT / "specs" / "quickstart.yaml")
    valid = subprocess.run([dinox, "validate", quickstart], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert valid.returncode == 0 and valid.stdout.startswith("OK "), valid.stdout + valid.stderr
    (tmp_path / "spec.yaml").write_text(TINY.format(name="node"))
    ran = subprocess.run(
        [dinox, "run", "spec.yaml", "--no-system-metrics"], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert ran.returncode == 0 and "1 ok" in ran.stdout, ran.stdout + ran.stderr
    # The installed dinox is the wheel's, not this checkout's.
    probe = [str(node / "bin" / "python"), "-c", "import dinox; print(dinox.__file__)"]
    where = subprocess.run(probe, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert str(node) in where.stdout, where.stdout
