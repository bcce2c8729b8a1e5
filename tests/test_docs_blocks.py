"""docs/data.md's "fresh clone to the headline command" block, run line by line as a user pastes it, as far as
a CPU box can: the demo study is made, preprocessed and sharded, `mlflow run` of the ViT-L study stops at the
device line the docs promise (not at a data error), and `dinox decide` then says there is nothing to decide.
On the way, the study runs small here (`--shrink`) and decide on it says it was shrunk, exit 3.
It once stopped at `data.index_csv: the loader can yield no batch` on every machine."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def _first_bash_block(text: str, after: str) -> list[str]:
    """The command lines of the first ```bash block after the line containing `after` (comments cut)."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if after in ln)
    opened = next(i for i in range(start, len(lines)) if lines[i].startswith("```bash"))
    closed = next(i for i in range(opened + 1, len(lines)) if lines[i].startswith("```"))
    return [ln.split("  #", 1)[0].strip() for ln in lines[opened + 1 : closed] if ln.strip()]


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="on a GPU box the block runs the whole study")
def test_the_data_docs_headline_block_runs_to_the_device_line_on_a_cpu_box(tmp_path):
    block = _first_bash_block((ROOT / "docs" / "data.md").read_text(), "From a fresh clone to the headline command")
    assert block[0].startswith("python3 -m venv .venv") and len(block) == 8, block
    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")
    for name in ("MLproject", "conda.yaml"):  # the project `mlflow run .` reads (a clone of it: the repository)
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "dinox").symlink_to(ROOT / "dinox")  # `mlflow run .` runs `python -m dinox` in the project
    bin_dir = Path(sys.executable).parent  # the environment the first line makes: this one, already installed
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env.pop("MLFLOW_RUN_ID", None)
    for line in block[1:]:
        words = shlex.split(line)
        words[0] = str(bin_dir / "python") if words[0] == "python" else words[0]
        proc = subprocess.run(words, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        if "--shrink" in line:  # the study small, end to end on this box
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            assert proc.stdout.startswith("shrunk (--shrink): vit_large_patch14_dinov2 at embed_dim 96"), proc.stdout
            assert proc.stdout.count("] ok ") == 5 and "vit_large_sweep_shrunk" in proc.stdout, proc.stdout
        elif "--shrunk" in line:
            assert proc.returncode == 3, proc.stdout + proc.stderr
            assert proc.stdout.split(" on SHRUNK trials ")[0] in ("GO", "NO-GO", "UNSETTLED"), proc.stdout
        elif line.startswith("mlflow run"):
            # The study targets CUDA: here it is refused by its device, after its data passed every check.
            assert proc.returncode != 0
            out = proc.stdout + proc.stderr
            assert "hardware.device: cuda is not on this machine" in out, out[-3000:]
            assert "no batch" not in out and "Traceback" not in out, out[-3000:]
        elif line.startswith("dinox decide"):
            assert proc.returncode == 2 and "no dinox trial runs" in proc.stderr, proc.stderr
        else:
            assert proc.returncode == 0, f"{line}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    index = tmp_path / "data" / "processed" / "_index" / "index.csv"
    assert index.read_text().count("\n") == 1 + 192  # the header, then every demo slice: a batch of 160 fits
    assert any((tmp_path / "data" / "demo_shards").glob("*.tar"))


def test_the_readme_first_block_runs_the_quickstart_opens_the_ui_and_decides(tmp_path):
    """README.md's first screen as a new user pastes it: the quickstart's six trials measured, `dinox ui` serving
    the store (stopped with Ctrl-C, as the comment says), `dinox decide` answering with its files. The venv
    line's install is this environment's (the suite runs inside it)."""
    import signal
    import socket

    block = _first_bash_block((ROOT / "README.md").read_text(), "## On a fresh machine")
    steps = [part.strip() for line in block for part in line.split("&&")]
    assert steps[:3] == ["python3 -m venv .venv", ". .venv/bin/activate", "pip install -e ."], steps
    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    for line in steps[3:]:
        words = shlex.split(line)
        assert words[0] == "dinox", line
        if words[1] == "ui":
            with socket.socket() as s:  # 5000 taken here (another service): the same command on a free port
                busy = s.connect_ex(("127.0.0.1", 5000)) == 0
            if busy:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    words += ["--port", str(s.getsockname()[1])]
            pipe = subprocess.PIPE
            ui = subprocess.Popen(
                words,
                cwd=tmp_path,
                env=env,
                stdout=pipe,
                stderr=pipe,
                text=True,
                start_new_session=True,
                # As from a terminal: a suite started with `&` passes SIGINT on ignored, and then the Ctrl-C
                # below, sent before dinox installs its own handler, would be lost.
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509 - one thread
            )
            try:
                said = ui.stdout.readline() + ui.stdout.readline()  # type: ignore[union-attr]
                assert said.startswith("MLflow UI on http://127.0.0.1:"), said
                assert "the newest sweep, experiment 'quickstart': http://127.0.0.1:" in said, said
            finally:
                os.killpg(ui.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground group
                try:
                    _out, err = ui.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(ui.pid, signal.SIGKILL)
                    raise AssertionError("dinox ui did not stop at Ctrl-C") from None
            assert "Traceback" not in err, err[-2000:]
            continue
        proc = subprocess.run(words, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        if words[1] == "run":
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            assert proc.stdout.count("] ok ") == 6, proc.stdout  # three batches x two worker counts
        else:  # decide: GO (0), NO-GO (1) or UNSETTLED (3) on this box; never an error
            assert words[1] == "decide" and proc.returncode in (0, 1, 3), proc.stdout + proc.stderr
            verdict = proc.stdout.split()[0].rstrip(":")  # "GO: ...", the exit code's word first
            assert verdict == {0: "GO", 1: "NO-GO", 3: "UNSETTLED"}[proc.returncode], proc.stdout
            for name in ("report.md", "report.html", "decision.json", "days_vs_budget.png"):
                assert (tmp_path / "decision" / name).is_file(), name


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="on a GPU box the block runs the whole study")
def test_the_three_host_block_runs_against_a_postgresql_server_to_the_device_line(tmp_path, postgres):
    """docs/clusters.md's setup for 3 hosts, line by line, with what a team fills in made local: its database
    (`db-host`) a PostgreSQL on loopback, its artifact bucket a folder, its server's host and port loopback and a
    free one. The server starts from the block's own line; each host's shard reaches the device line (the study
    is CUDA's) after its data passed every check, opening nothing; decide then reads the server and finds no trial."""
    import time
    import urllib.request

    from tests.services import free_port
    from tests.test_docs_commands import documented_blocks

    (block,) = [b for b in documented_blocks() if b.file == "docs/clusters.md" and b.key.startswith("mlflow server")]
    serve, export, run, decide = block.commands
    server_args = shlex.split(serve)[2:]
    assert server_args[:2] == ["--backend-store-uri", "postgresql://mlflow:PASSWORD@db-host:5432/mlflow"], serve
    port = free_port()
    site = {
        "postgresql://mlflow:PASSWORD@db-host:5432/mlflow": postgres.database("three_hosts"),
        "s3://team-bucket/mlflow": str(tmp_path / "bucket"),
        "0.0.0.0": "127.0.0.1",
        "5000": str(port),
    }
    server_args = [site.get(w, w) for w in server_args]
    for name in ("specs", "scripts"):
        (tmp_path / name).symlink_to(ROOT / name)
    py = sys.executable
    subprocess.run([py, "scripts/make_demo_ct.py", "data/demo_dicom"], cwd=tmp_path, check=True, capture_output=True)
    subprocess.run(
        [py, "-m", "dinox", "preprocess", "--dicom-root", "data/demo_dicom", "--out-root", "data/processed"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    server = subprocess.Popen(
        [str(Path(py).parent / "mlflow"), "server", *server_args],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "server.log", "wb"),
        start_new_session=True,
        env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),  # its job runner: no use to dinox
    )
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert time.time() < deadline and server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
                time.sleep(0.5)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        env["PATH"] = f"{Path(py).parent}{os.pathsep}{env['PATH']}"
        assert export == "export MLFLOW_TRACKING_URI=http://mlflow-host:5000", export
        env["MLFLOW_TRACKING_URI"] = f"http://127.0.0.1:{port}"
        for host in (1, 2, 3):
            proc = subprocess.run(
                shlex.split(run.replace("$i", str(host))), cwd=tmp_path, env=env, capture_output=True, text=True
            )
            out = proc.stdout + proc.stderr
            assert proc.returncode == 2 and "hardware.device: cuda is not on this machine" in out, out[-3000:]
            assert "no batch" not in out and "Traceback" not in out, out[-3000:]
        proc = subprocess.run(shlex.split(decide), cwd=tmp_path, env=env, capture_output=True, text=True)
        # The refused shards left nothing behind: the server holds no experiment of the study.
        said = f"error: experiment 'vit_large_sweep' not found in http://127.0.0.1:{port}: "
        assert proc.returncode == 2 and proc.stderr.startswith(said), proc.stdout + proc.stderr
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)
