#!/usr/bin/env python3
"""Where the test suite's CPU time goes, by kind of process. A benchmark, not a test: it prints figures.

Every Python process the suite starts (pytest's workers, each `dinox` command, each trial the fork server
forks and the loader workers a trial forks in turn, each script, each `mlflow` command) writes its own CPU
time (user + system) and the heavy libraries it had loaded as it ends, through a `sitecustomize` module this
script puts first on PYTHONPATH; the table sums them by kind, next to the suite's whole CPU time (every
process it waited for, from the kernel's own count).

    python scripts/suite_cpu.py                                # the README's test command: -n 2 --dist worksteal
    python scripts/suite_cpu.py -- -m "not slow" -n 2          # the fast tier
    python scripts/suite_cpu.py --top 10 -- tests/store -q     # any pytest arguments after --

Not logged, so counted only in the whole: a process ended by a signal (each `dinox run` ends its fork server
so: its imports are most of the gap), one started with an environment of its own (no PYTHONPATH), and
anything not Python (a PostgreSQL, Slurm); the hook shadows any other `sitecustomize` while it runs.
Columns: CPU seconds, processes, and what they loaded: T torch, V torchvision, D torch._dynamo, M mlflow.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Runs in every Python process the suite starts (it is that process's `sitecustomize`).
HOOK = """\
import atexit, json, os, sys

_pid, _log = os.getpid(), os.environ.get("DINOX_SUITE_CPU_LOG", "")


def _write(*_args):
    if not _log:
        return
    loaded = "".join(k for k, name in (("T", "torch"), ("V", "torchvision"), ("D", "torch._dynamo"),
                                        ("M", "mlflow")) if name in sys.modules)
    times = os.times()
    line = {"cpu": times.user + times.system, "loaded": loaded, "forked": os.getpid() != _pid,
            "argv": sys.argv[:4], "test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]}
    try:
        with open(_log, "a") as f:
            f.write(json.dumps(line) + "\\n")
    except OSError:
        pass


atexit.register(_write)
_exit = os._exit


def _logged_exit(code):  # dinox's commands and its trials end with os._exit, which skips atexit
    _write()
    _exit(code)


os._exit = _logged_exit
"""

KINDS = (  # (a part of argv, the kind): the first that matches names it
    ("dinox/isolate/forkserver.py", "fork server (not ended by a signal)"),
    ("dinox/measure/trial.py", "trial child, started (not forked)"),
    ("dinox/measure/verify.py", "verify child"),
    ("dinox/measure/estimate.py", "estimate child, started"),
    ("dinox/measure/entry_check.py", "entry check child"),
    ("torch/distributed/run.py", "torchrun"),
    ("pytest", "pytest"),
)


def kind(line: dict) -> str:
    argv = [str(a) for a in line["argv"]]
    joined = " ".join(argv)
    first = argv[0] if argv else "?"
    if first.endswith(("dinox/__main__.py", "/bin/dinox")):
        words = [a for a in argv[1:] if not a.startswith("-")]
        name = f"dinox {words[0] if words else ''}".strip()
        return f"{name}, forked (tests/prewarmed.py)" if line["forked"] else name
    if line["forked"]:
        return "forked: trials and estimates (by the fork server), loader workers (by their trial)"
    if first.endswith(("mlflow/__main__.py", "/bin/mlflow")):
        words = [a for a in argv[1:] if not a.startswith("-")]
        return f"mlflow {words[0] if words else ''}".strip()
    for part, name in KINDS:
        if part in joined:
            return name
    if "/scripts/" in first or first.startswith("scripts/"):
        return f"script {Path(first).name}"
    if first == "-c":
        return "python -c (pytest's workers among them)" if line["loaded"] else "python -c"
    return Path(first).name


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--top", type=int, default=25, help="rows of the table (kinds, then tests)")
    p.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (default: -n 2 --dist worksteal)")
    a = p.parse_args()
    args = a.pytest_args or ["-n", "2", "--dist", "worksteal"]
    with tempfile.TemporaryDirectory(prefix="suite-cpu-") as tmp:
        (Path(tmp) / "sitecustomize.py").write_text(HOOK)
        log = Path(tmp) / "log.jsonl"
        env = dict(os.environ, DINOX_SUITE_CPU_LOG=str(log))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [tmp, env.get("PYTHONPATH", "")]))
        before, t = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=ROOT, env=env
        )
        wall, after = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN)
        lines = [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []
    whole = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    logged = sum(ln["cpu"] for ln in lines)
    print(
        f"\nsuite: pytest exit {proc.returncode}, {wall:.0f} s wall, {whole:.0f} CPU-s in all ({whole / wall:.0%} "
        f"of one core); {len(lines)} processes logged {logged:.0f} CPU-s, {whole - logged:.0f} not logged"
    )
    print(f"\n{'CPU-s':>7} {'procs':>5} {'loaded':>6}  kind")
    by_kind: dict[str, list] = collections.defaultdict(lambda: [0.0, 0, set()])
    for ln in lines:
        row = by_kind[kind(ln)]
        row[0], row[1] = row[0] + ln["cpu"], row[1] + 1
        row[2].update(ln["loaded"])
    for name, (cpu, n, loaded) in sorted(by_kind.items(), key=lambda kv: -kv[1][0])[: a.top]:
        print(f"{cpu:7.1f} {n:5d} {''.join(sorted(loaded)):>6}  {name}")
    by_test: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for ln in lines:
        if ln["test"]:
            by_test[ln["test"]][0] += ln["cpu"]
            by_test[ln["test"]][1] += 1
    print(f"\n{'CPU-s':>7} {'procs':>5}  test (the processes it started; a shared fixture's under its first test)")
    for name, (cpu, n) in sorted(by_test.items(), key=lambda kv: -kv[1][0])[: a.top]:
        print(f"{cpu:7.1f} {n:5d}  {name}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
