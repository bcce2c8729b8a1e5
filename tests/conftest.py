"""Shared helpers: tiny specs on disk, and the CLI run as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.prewarmed import Prewarmed

ROOT = Path(__file__).resolve().parents[1]
PREWARMED = Prewarmed()  # this pytest process's, started by its first run_dinox

# The tiers (pyproject's markers): `service` for a test that starts PostgreSQL, an MLflow server or Slurm (by
# its fixtures), `slow` for those and for every test listed in tests/slow.txt (measured over a second on the
# 2-core box: they start dinox processes or train), `gpu` for the CUDA ones. The fast loop is
# `pytest -m "not slow"`; the full suite, the CI gate, runs them all.
SERVICE_FIXTURES = frozenset({"postgres", "pg_mlflow_server", "mlflow_server", "slurm"})
# Module fixtures that run dinox for real (a sweep, a busy box, the estimate child): every test that uses one
# is slow, whatever its own call costs.
SLOW_FIXTURES = frozenset({"busy", "oom_sweep", "estimates", "measured", "results"})
SLOW_LIST = Path(__file__).with_name("slow.txt")


def slow_tests() -> dict[str, float]:
    """Node ids of tests/slow.txt and the seconds each took when the list was written (its comment, `# 12.3 s`;
    0 where it gives none)."""
    out = {}
    for line in SLOW_LIST.read_text().splitlines():
        node, _, comment = line.partition("#")
        if node.strip():
            seconds = comment.strip().removesuffix("s").strip()
            out[node.strip()] = float(seconds) if seconds.replace(".", "", 1).isdigit() else 0.0
    return out


def pytest_configure(config: pytest.Config) -> None:
    # Torch inside pytest's own process (a trial's code called in-process) on one thread. On two cores with two
    # workers each thread's partner shares a core with the other worker, and libgomp's threads spin while they
    # wait: an in-process verify took 31 s in the suite (alone 6 s, its process 13.2 CPU-s on two threads and 10.0
    # on one). The call leaves the environment alone: every dinox command a test starts has a user's threads.
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return  # xdist's controller, which runs no test
    import torch

    torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = slow_tests()
    for item in items:
        if SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.service)
            item.add_marker(pytest.mark.slow)
        elif item.nodeid in slow or item.nodeid.split("[")[0] in slow or SLOW_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.slow)
    # The modules holding the longest tests first, each module whole (its module fixtures set up once): xdist's
    # worksteal hands each worker a contiguous share and steals from the end of a queue, so a test of minutes
    # collected last (the docs blocks, the scripts) would start when the other worker has little left to do.
    longest: dict[str, float] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        seconds = slow.get(item.nodeid, slow.get(item.nodeid.split("[")[0], 0.0))
        longest[module] = max(longest.get(module, 0.0), seconds)
    items.sort(key=lambda item: -longest[item.nodeid.split("::")[0]])  # stable: a module's own order kept


# A trial small enough that a 2-core CPU measures it in about a second once torch is imported. Without the
# ablation windows (tests that are about them turn them on).
TINY = """\
name: {name}
model: {{name: vit_tiny_patch16_224, img_size: 32, kwargs: {{patch_size: 8}}}}
objective: {{num_classes: 10}}
batch: {{size: 4}}
measure: {{warmup_steps: 1, bench_steps: 3, repeats: 1, timeout_s: 120, ablation: false}}
"""


@pytest.fixture
def write_spec(tmp_path: Path):
    def write(text: str, name: str = "spec.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


# Two `dinox run`s at once on this 2-core box: one torch thread each and OpenMP threads that sleep when idle,
# or libgomp's spinning threads of one trial starve the other's (a tiny trial took 9 s in one run, 34 s in
# the next). `--devices cpu:N` gives trials side by side the same; here they are separate commands.
SIDE_BY_SIDE = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}


def run_dinox(
    args: list[str],
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    inherit: bool = True,
    fresh: bool = False,
):
    """`python -m dinox ARGS` in a process of its own, as a user would run it (with `env` as the whole environment
    where not `inherit`): forked from a prewarmed interpreter (tests/prewarmed.py) unless `fresh` or the
    environment changes how Python starts, then a new interpreter."""
    full_env = dict(os.environ if inherit else {}, **(env or {}))
    full_env.pop("MLFLOW_RUN_ID", None)
    if not fresh and PREWARMED.fits(full_env):
        return PREWARMED.run(args, cwd, full_env, timeout)
    return subprocess.run(
        [sys.executable, "-m", "dinox", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def measure_one(work: Path, spec_text: str):
    """`dinox run` of a one-trial spec in `work` as a user runs it; (work, the trial's MLflow run)."""
    from mlflow import MlflowClient

    (work / "spec.yaml").write_text(spec_text)
    proc = run_dinox(["run", "spec.yaml", "--no-system-metrics"], cwd=work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (trial,) = MlflowClient(f"sqlite:///{work / 'mlflow.db'}").search_runs(["1"], "tags.`dinox.role` = 'trial'")
    return work, trial


class MlflowServer:
    """A real `mlflow server` on loopback (a SQLite backend in `root`, or `backend`: a PostgreSQL database;
    proxied artifacts) that tests can stop and start again on the same port and store."""

    def __init__(self, root: Path, backend: str = ""):
        import socket

        self.root = root
        self.backend = backend or f"sqlite:///{root / 'm.db'}"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 90) -> None:
        import time
        import urllib.request

        log = open(self.root / "server.log", "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--backend-store-uri",
                self.backend,
                "--artifacts-destination",
                str(self.root / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
            # MLflow 3's server starts a job runner with a handful of huey workers by default; dinox uses none,
            # and on 2 cores their start-up slows every test that starts a server.
            env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),
        )
        deadline = time.time() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/health", timeout=2)
                return
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    self.stop()
                    pytest.fail(f"mlflow server did not start: {(self.root / 'server.log').read_text()[-2000:]}")
                time.sleep(0.3)

    def stop(self) -> None:
        import signal

        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)
            self.proc = None


@pytest.fixture(scope="session")
def postgres():
    """One PostgreSQL for the session (each server its own database); skipped where it is not installed."""
    from tests.services import Postgres

    pg = Postgres()
    if why := pg.missing():
        pytest.skip(why)
    pg.start()
    yield pg
    pg.stop()


# The backend behind the tracking server whose outage test_reliability stages: a team's PostgreSQL where this
# machine has one (.ci/run installs it), else the server's own SQLite file. dinox sees only the server's URL go
# away and come back, whichever database keeps it; run on each, the outage cost the suite two 30-s tests for
# that one path. The Slurm test's shards, resume and decide run on PostgreSQL, test_distributed's on SQLite.
def outage_backend() -> str:
    from tests.services import Postgres

    return "sqlite" if Postgres().missing() else "postgresql"


def backend_uri(request, name: str) -> str:
    """ "" for SQLite (the server's own file), else a new PostgreSQL database named `name`."""
    return request.getfixturevalue("postgres").database(name) if request.param == "postgresql" else ""


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("server"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def pg_mlflow_server(tmp_path_factory, postgres):
    """A team's server: `mlflow server` on PostgreSQL (the Slurm test records into it)."""
    server = MlflowServer(tmp_path_factory.mktemp("pgserver"), postgres.database("team"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def fork_server():
    """One fork server for the tests that measure a trial without testing how it is started: each trial then
    costs a fork, not an interpreter that imports torch and timm again (dinox run forks them the same way)."""
    from dinox.isolate.forkserver import ForkServer

    server = ForkServer()
    server.start()
    yield server
    server.close()


def trial_process(root_pid: int, index: int, need_worker: bool = False):
    """The process running trial `index` of the sweep under root_pid, whichever the isolation: the one
    holding that trial's log open (a forked trial shows the fork server's command line)."""
    import psutil

    for p in psutil.Process(root_pid).children(recursive=True):
        try:
            if any(f"/trials/{index:03d}-" in f.path and f.path.endswith("child.log") for f in p.open_files()):
                if not need_worker or p.children():
                    return p
        except psutil.Error:
            continue
    return None
