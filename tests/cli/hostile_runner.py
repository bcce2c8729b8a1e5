"""The hostile-input test's runner: every case is `dinox ARGS` through dinox's own entry point (the same
process setup, stream wrappers and exit codes as the installed `dinox` command), each in a child forked from
one interpreter that has paid the imports once: sixty-odd commands in seconds rather than minutes.

    python -m tests.cli.hostile_runner CASES.json OUT_DIR    # prints the results as JSON
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import mlflow  # noqa: F401  (imported before the forks: each case pays none of it)
import torch  # noqa: F401

from dinox.cli import main as cli


def run_case(case: dict, out: str, err: str) -> dict:
    pid = os.fork()
    if pid == 0:  # the child: a fresh session, its streams in files, `dinox ARGS`
        os.setsid()
        os.chdir(case["cwd"])
        for fd, name in ((1, out), (2, err)):
            os.dup2(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
        sys.argv = ["dinox", *case["argv"]]
        try:
            cli.entry()  # ends with os._exit(its code)
        finally:
            os._exit(99)  # entry() returned or raised: a crash
    deadline, status = time.time() + case.get("timeout", 60), None
    while status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(st)
        elif time.time() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = "timeout"
        else:
            time.sleep(0.02)
    read = lambda name: open(name, encoding="utf-8", errors="replace").read()  # noqa: E731
    return {"rc": status, "out": read(out), "err": read(err)}


def main() -> None:
    cases = json.loads(open(sys.argv[1]).read())
    results = [run_case(c, f"{sys.argv[2]}/{i}.out", f"{sys.argv[2]}/{i}.err") for i, c in enumerate(cases)]
    print(json.dumps(results))


if __name__ == "__main__":
    main()
