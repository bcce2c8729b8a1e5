"""Screenshots of what a newcomer sees in the MLflow UI after the quickstart, taken with headless Chromium.

    python scripts/ui_screenshots.py --out shots               # a fresh quickstart store in shots/quickstart
    python scripts/ui_screenshots.py --store /path/to/mlflow.db --experiment quickstart --out shots

Without --store it runs the README's first screen in OUT/quickstart (`dinox run specs/quickstart.yaml`,
then `dinox decide --spec specs/quickstart.yaml`; the store stays there to open again), starts `mlflow
server` on a free loopback port, and writes runs_table.png, parent_run.png, trial_run.png, compare.png and
decision_run.png: the pages the README sends a newcomer to. It prints each page's URL and seconds.
Needs `chromium` (or CHROMIUM=/path/to/binary).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quickstart(work: Path) -> Path:
    """The README's first screen, in `work`: run, then decide. The store it leaves."""
    shutil.copytree(ROOT / "specs", work / "specs")
    for args in (["run", "specs/quickstart.yaml"], ["decide", "--spec", "specs/quickstart.yaml"]):
        t = time.time()
        proc = subprocess.run([sys.executable, "-m", "dinox", *args], cwd=work, capture_output=True, text=True)
        print(f"dinox {' '.join(args)}: exit {proc.returncode} in {time.time() - t:.1f} s")
        if proc.returncode not in (0, 1):
            sys.exit(proc.stdout + proc.stderr)
    return work / "mlflow.db"


def serve(store: Path, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{store}"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc
        except OSError:
            time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    sys.exit("mlflow server did not answer in 120 s")


def pages(store: Path, experiment: str, base: str) -> dict[str, str]:
    """The URLs of the pages a newcomer opens, from the store's own runs."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{store}")
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        sys.exit(f"no experiment {experiment!r} in {store}")
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])
    role = {r.info.run_id: r.data.tags.get("dinox.role", "") for r in runs}
    trials = [r.info.run_id for r in runs if role[r.info.run_id] == "trial"]
    # The newest sweep and decision: in a store swept more than once, what the user has just made.
    parent = next(r for r, v in reversed(role.items()) if v == "sweep")
    decision = next((r for r, v in reversed(role.items()) if v == "decision"), None)
    e = exp.experiment_id
    out = {
        "runs_table": f"{base}/#/experiments/{e}/runs",
        "parent_run": f"{base}/#/experiments/{e}/runs/{parent}",
        "trial_run": f"{base}/#/experiments/{e}/runs/{trials[0]}",
        "compare": f"{base}/#/compare-runs?runs={urllib.parse.quote(json.dumps(trials))}"
        f"&experiments={urllib.parse.quote(json.dumps([e]))}",
    }
    if decision:
        out["decision_run"] = f"{base}/#/experiments/{e}/runs/{decision}"
    return out


def shoot(chromium: str, url: str, path: Path, size: str) -> None:
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={size}"]
    cmd += ["--virtual-time-budget=15000", f"--screenshot={path}", url]
    subprocess.run(cmd, capture_output=True, timeout=120, check=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", type=Path, help="an mlflow.db to show (default: a fresh quickstart)")
    p.add_argument("--experiment", default="quickstart")
    p.add_argument("--out", type=Path, default=Path("ui_screenshots"))
    p.add_argument("--size", default="1440,1800", help="browser window, WIDTH,HEIGHT (tall: the Descriptions)")
    a = p.parse_args()
    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        sys.exit("needs chromium (apt-get install chromium), or CHROMIUM=/path/to/it")
    a.out.mkdir(parents=True, exist_ok=True)
    if a.store is None:
        work = a.out / "quickstart"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
    store = a.store.resolve() if a.store else quickstart(work.resolve())
    port = free_port()
    server = serve(store, port)
    try:
        for name, url in pages(store, a.experiment, f"http://127.0.0.1:{port}").items():
            t = time.time()
            shoot(chromium, url, a.out / f"{name}.png", a.size)
            print(f"{name}.png  {time.time() - t:.1f} s  {url}")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
