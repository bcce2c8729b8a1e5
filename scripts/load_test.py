#!/usr/bin/env python3
"""Several hosts' worth of shards writing into one tracking server at once: N concurrent `dinox run --shard
I/N` processes, each measuring tiny trials, into one `mlflow server` on a SQLite and on a PostgreSQL backend.
For each (backend, N) it prints the trials recorded, the duplicated ones (a trial with more than one ok run),
the lost ones (in the sweep, not recorded), the shard processes that failed or warned of a store failure,
and the wall time.

The servers are the tests' own (tests/services.py and tests/conftest.py: Debian's PostgreSQL under a temporary
data dir, `mlflow server` on loopback), started and stopped here. Run from the repository's root:

    python scripts/load_test.py                      # N = 4 and 8, 4 trials a shard, both backends
    python scripts/load_test.py --shards 8 --per-shard 6 --backends postgresql
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SPEC = """\
name: load_{tag}
model: {{name: vit_tiny_patch16_224, img_size: 32, kwargs: {{patch_size: 8}}}}
objective: {{num_classes: 10}}
batch: {{size: 2}}
measure: {{warmup_steps: 1, bench_steps: 2, repeats: 1, timeout_s: 600, ablation: false}}
sweep:
  grid:
    batch.size: [2, 3]
    objective.num_classes: {classes}
"""


def one(url: str, tag: str, shards: int, per_shard: int, root: Path) -> dict[str, float]:
    """N shard processes at once into `url`; what the store then holds."""
    from mlflow import MlflowClient

    from dinox.plan import grid
    from dinox.spec import file as spec_file
    from tests.conftest import SIDE_BY_SIDE

    work = root / tag
    work.mkdir()
    classes = list(range(2, 2 + (shards * per_shard + 1) // 2))
    (work / "s.yaml").write_text(SPEC.format(tag=tag, classes=classes))
    expected = {t.trial_id for t in grid.expand(spec_file.load(str(work / "s.yaml")))}
    # N shards on this box's cores: one torch thread each, OpenMP threads that sleep when idle (SIDE_BY_SIDE).
    env = dict(os.environ, MLFLOW_TRACKING_URI=url, **SIDE_BY_SIDE)
    env.pop("MLFLOW_RUN_ID", None)
    t = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "dinox", "run", "s.yaml", "--shard", f"{i}/{shards}", "--no-system-metrics"]
            + ["--workdir", f".dinox-{i}"],
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(1, shards + 1)
    ]
    outs = [p.communicate()[0] for p in procs]
    wall = time.perf_counter() - t
    failed = sum(1 for p in procs if p.returncode != 0)
    warned = sum(1 for out in outs if "warning: tracking store" in out)
    client = MlflowClient(url)
    exp = client.get_experiment_by_name(f"load_{tag}")
    runs = client.search_runs([exp.experiment_id], "tags.`dinox.role` = 'trial'", max_results=5000)
    ok = Counter(r.data.tags["dinox.trial_id"] for r in runs if r.data.tags.get("dinox.status") == "ok")
    return {
        "trials": len(expected),
        "recorded": len(set(ok) & expected),
        "duplicated": sum(1 for n in ok.values() if n > 1),
        "lost": len(expected - set(ok)),
        "failed": failed,
        "warned": warned,
        "wall_s": wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--per-shard", type=int, default=4, help="trials each shard measures")
    ap.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"])
    a = ap.parse_args()
    from tests.conftest import MlflowServer
    from tests.services import Postgres

    print("backend     shards trials recorded duplicated lost failed warned  wall s")
    with tempfile.TemporaryDirectory(prefix="dinox-load-") as tmp:
        root = Path(tmp)
        pg = Postgres() if "postgresql" in a.backends else None
        if pg is not None:
            if why := pg.missing():
                sys.exit(f"postgresql: {why}")
            pg.start()
        try:
            for backend in a.backends:
                for n in a.shards:
                    tag = f"{backend}_{n}"
                    (root / f"server-{tag}").mkdir()
                    uri = pg.database(f"load_{n}") if backend == "postgresql" and pg is not None else ""
                    server = MlflowServer(root / f"server-{tag}", uri)
                    server.start()
                    try:
                        r = one(server.url, tag, n, a.per_shard, root)
                    finally:
                        server.stop()
                    print(
                        f"{backend:<11} {n:>6} {r['trials']:>6.0f} {r['recorded']:>8.0f} {r['duplicated']:>10.0f} "
                        f"{r['lost']:>4.0f} {r['failed']:>6.0f} {r['warned']:>6.0f} {r['wall_s']:>7.1f}",
                        flush=True,
                    )
        finally:
            if pg is not None:
                pg.stop()


if __name__ == "__main__":
    main()
