#!/usr/bin/env python3
"""A wheelhouse for a GPU node with no package index: dinox and what it adds to a node that already has its own
CUDA torch, torchvision and timm (cluster images do: their torch matches the node's driver, so a wheelhouse
must not carry another). Made where the registry is reachable, carried over, installed with ``--no-index``.

    python scripts/make_wheelhouse.py wheelhouse                       # for this machine's Python and platform
    python scripts/make_wheelhouse.py wheelhouse --python-version 3.12 --platform manylinux2014_x86_64

On the node (its torch, torchvision and timm already installed, in the environment dinox is to use):

    pip install --no-index --find-links wheelhouse -r wheelhouse/requirements.txt
    pip install --no-index --find-links wheelhouse --no-deps dinox
    dinox validate specs/quickstart.yaml

What it carries: dinox's own wheel, and its dependencies but torch, torchvision and timm, with MLflow as
``mlflow-skinny`` plus SQLAlchemy and alembic (the tracking client and the SQLite / PostgreSQL store: all a
sweep and a decision use; the full ``mlflow`` package adds the UI server and its pandas / pyarrow /
scikit-learn stack, tens of MB more; ``mlflow ui`` runs anywhere the store is reachable). dinox itself is
installed ``--no-deps`` because its metadata names ``mlflow``; ``pip check`` then reports that one, and
nothing else. numpy and pillow are left out too: torchvision requires both, so the node has them.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What a GPU node brings itself: its CUDA build of torch and what is built against it; and what torchvision
# itself requires (numpy, pillow), so pip keeps the node's own.
NODE_HAS = {"torch", "torchvision", "timm"}
TORCHVISION_NEEDS = {"numpy", "pillow"}
# MLflow's tracking client without the server's stack, and what its SQL stores need.
MLFLOW = ["mlflow-skinny{spec}", "sqlalchemy>=2", "alembic>=1.13"]


def requirements() -> list[str]:
    """dinox's dependencies as pyproject.toml declares them, less what the node has, mlflow made skinny."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    out: list[str] = []
    for dep in deps:
        name = dep.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip()
        if name in NODE_HAS | TORCHVISION_NEEDS:
            continue
        if name == "mlflow":
            out += [m.format(spec=dep[len(name) :]) for m in MLFLOW]
        else:
            out.append(dep)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--python-version", help="the node's Python (3.12); default: this one's")
    parser.add_argument("--platform", help="the node's platform tag (manylinux2014_x86_64); default: this machine's")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    reqs = requirements()
    (args.out / "requirements.txt").write_text("\n".join(reqs) + "\n")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--quiet", "-w", str(args.out), str(ROOT)], check=True)
    target = []
    if args.python_version or args.platform:  # another interpreter: wheels only, for its tags
        target = ["--only-binary=:all:"]
        target += ["--python-version", args.python_version] if args.python_version else []
        target += ["--platform", args.platform] if args.platform else []
    subprocess.run([*pip, "download", "--quiet", "-d", str(args.out), *target, *reqs], check=True)
    for wheel in args.out.glob("*.whl"):  # matplotlib's own numpy and pillow: the node's torchvision has them
        if wheel.name.split("-")[0].lower() in TORCHVISION_NEEDS:
            wheel.unlink()
    wheels = sorted(args.out.glob("*"))
    size = sum(p.stat().st_size for p in wheels if p.is_file())
    print(f"{args.out}: {len(wheels)} files, {size / 2**20:.1f} MiB (requirements.txt lists what to install)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
