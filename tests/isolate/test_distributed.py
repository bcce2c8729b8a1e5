"""Multi-device trials under torchrun (2 gloo ranks on the CPU) and sweeps shared by shard processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
from mlflow import MlflowClient

from dinox.decide import budget
from dinox.decide import verdict as decide
from dinox.isolate import runner
from dinox.plan import grid
from dinox.report import text as report
from dinox.spec import file as spec_file
from dinox.store.readback import fetch_trials
from tests.conftest import SIDE_BY_SIDE, TINY, run_dinox

TWO_RANKS = (
    TINY.format(name="ddp")
    .replace("batch: {size: 4}", "batch: {size: 4, accumulation: 2}")
    # Adaptive windows: the ranks must agree when to stop, or one waits in a collective the other never joins.
    .replace("repeats: 1", "min_repeats: 1, max_repeats: 3, unstable_threshold: 0.02")
    + """\
hardware: {device: cpu}
sweep:
  grid:
    hardware.gpus: [1, 2]
"""
)


def _decided(uri: str, experiment: str) -> str:
    """decide's report on an experiment, in this process (the decide CLI has tests of its own)."""
    records = fetch_trials(uri, [experiment], []).records
    return report.render_markdown(decide.decide(records, budget.Budget(days=1, target_images=1000)), [])


def test_two_gloo_ranks_record_global_throughput_and_per_rank_figures(tmp_path):
    (tmp_path / "s.yaml").write_text(TWO_RANKS)
    # The temporary directory of a shared node: torchrun's per-rank folders go beside the trial's files instead,
    # where they once stayed behind in it, one per launch.
    temp = tmp_path / "node-tmp"
    temp.mkdir()
    proc = run_dinox(["run", "s.yaml"], cwd=tmp_path, env={"TMPDIR": str(temp)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_runs(["1"], "tags.`dinox.role` = 'trial'")
    by_gpus = {r.data.params["hardware.gpus"]: r for r in runs}
    one, two = by_gpus["1"], by_gpus["2"]
    assert one.data.tags["dinox.status"] == two.data.tags["dinox.status"] == "ok", two.data.tags.get("dinox.error")
    t, m = two.data.tags, two.data.metrics
    assert t["dinox.isolation"] == "torchrun" and t["dinox.world_size"] == "2" and t["dinox.dist_backend"] == "gloo"
    assert two.data.params["batch.effective"] == "16"  # 4 x 2 micro-batches x 2 ranks
    assert 1 <= m["windows"] <= 3 and two.data.params["measure.max_repeats"] == "3"
    # Global: every rank's images over the slowest rank's window, and each rank's own figure beside it.
    assert m["rank0_images_per_s"] > 0 and m["rank1_images_per_s"] > 0
    slowest = max(m["rank0_images_per_s"], m["rank1_images_per_s"])
    assert slowest < m["images_per_s"] <= m["rank0_images_per_s"] + m["rank1_images_per_s"] + 1e-6
    assert m["peak_mem_allocated_gb"] == max(m["rank0_peak_mem_allocated_gb"], m["rank1_peak_mem_allocated_gb"])
    # The node (both ranks and torchrun, by PSS) never reads below one rank's own RSS; PSS splits the pages
    # the ranks share, so it need not read above it either.
    assert m["host_peak_rss_gb"] >= m["rank0_child_peak_rss_gb"]
    # decide sets the 2-rank trial against the 1-rank one: scaling efficiency.
    text = _decided(f"sqlite:///{tmp_path / 'mlflow.db'}", "ddp")
    efficiency = m["images_per_s"] / (2 * one.data.metrics["images_per_s"])
    assert "## Scaling" in text and f"| {efficiency:.0%} |" in text
    # `dinox verify` trains the 2-rank trial as it ran: two ranks under torchrun, every rank the same steps
    # (agreed before the slice, or the one whose clock ran out first would leave the other in its all-reduce),
    # each epoch of 64 images every rank's together; its figures global, as the trial's.
    slice_ = ["--minutes", "0.05", "--epoch-images", "64"]
    trained = run_dinox(
        ["verify", "s.yaml", "--run-id", two.info.run_id, *slice_], cwd=tmp_path, env={"TMPDIR": str(temp)}, timeout=600
    )
    assert trained.returncode in (0, 1, 3), trained.stdout + trained.stderr  # held, off, undecided: each an answer
    assert [p.name for p in temp.iterdir() if p.name.startswith("torchelastic_")] == []
    assert len(list(tmp_path.glob(".dinox/**/torchrun"))) == 2  # the trial's launch and verify's
    (run,) = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_runs(["1"], "tags.`dinox.role` = 'verify'")
    v = run.data.metrics
    assert run.data.tags["dinox.world_size"] == "2" and run.data.tags["dinox.verifies"] == two.info.run_id
    assert v["verify_images"] == v["verify_steps"] * 16 and v["verify_steps"] >= 1  # 16: the effective batch
    assert v["verify_images_per_s"] == pytest.approx(v["verify_images"] / v["verify_wall_s"], rel=1e-6)
    assert v["verify_epochs_ended"] >= 1 and v["verify_check_images_per_s"] > 0
    assert f"against a forecast of {m['images_per_s']:.1f} (measured range " in trained.stdout, trained.stdout


def ranks_of(root: int) -> dict[int, psutil.Process]:
    """The ranks under `root` by their RANK. A process torchrun has forked but not yet exec'd carries torchrun's
    command line (naming dinox.measure.trial) without a RANK: not a rank yet."""
    found = {}
    for p in psutil.Process(root).children(recursive=True):
        try:
            if "dinox.measure.trial" in p.cmdline() and "RANK" in (env := p.environ()):
                found[int(env["RANK"])] = p
        except psutil.Error:
            continue
    return found


def test_one_rank_killed_is_a_crashed_trial_with_no_rank_left(write_spec, tmp_path):
    text = TINY.format(name="ddp_kill").replace("bench_steps: 3", "bench_steps: 100000")
    (trial,) = grid.expand(spec_file.load(write_spec(text + "hardware: {device: cpu, gpus: 2}\n")))
    seen: dict[int, psutil.Process] = {}

    def kill_rank_one(root: int) -> None:
        deadline = time.time() + 60
        while time.time() < deadline and not {0, 1} <= seen.keys():
            seen.update(ranks_of(root))
            time.sleep(0.2)
        time.sleep(4)  # both ranks in their steps: the process group is up, the loop is running
        os.kill(seen[1].pid, signal.SIGKILL)

    root: list[int] = []

    def on_spawn(pid: int) -> None:
        root.append(pid)
        threading.Thread(target=kill_rank_one, args=(pid,), daemon=True).start()

    r = runner.run_trial(trial, tmp_path / "t", on_spawn=on_spawn).result
    assert r.status == "crashed", r.error
    assert r.error.startswith("rank 1 killed by SIGKILL"), r.error
    assert len(seen) == 2
    for p in [*seen.values()]:
        assert not psutil.pid_exists(p.pid) or p.status() == psutil.STATUS_ZOMBIE
    assert not psutil.pid_exists(root[0])


SHARDED = (
    TINY.format(name="sharded")
    + """\
sweep:
  grid:
    batch.size: [2, 4, 8]
"""
)


def test_two_shards_against_one_server_cover_the_grid_exactly_once(tmp_path, mlflow_server):
    # 3 trials: shard 1/2 holds two of them, 2/2 one. The first is task 1 of a Slurm array 1-2, the second
    # pod 1 of a Kubernetes Indexed Job of 2 completions: `--shard auto` reads which slice from each.
    (tmp_path / "s.yaml").write_text(SHARDED)
    env = dict(os.environ, MLFLOW_TRACKING_URI=mlflow_server.url, **SIDE_BY_SIDE)
    env.pop("MLFLOW_RUN_ID", None)
    slurm = {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "2"}
    launches = [("auto", slurm), ("auto/2", {"JOB_COMPLETION_INDEX": "1"})]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "dinox", "run", "s.yaml", "--shard", shard],
            cwd=tmp_path,
            env={**env, **scheduler},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for shard, scheduler in launches
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "dinox: shard 1/2 (SLURM_ARRAY_TASK_ID=1, array from 1 step 1)" in outs[0]
    assert "dinox: shard 2/2 (JOB_COMPLETION_INDEX=1)" in outs[1]
    client = MlflowClient(mlflow_server.url)
    exp = client.get_experiment_by_name("sharded")
    runs = client.search_runs([exp.experiment_id])
    trials = [r for r in runs if r.data.tags.get("dinox.role") == "trial"]
    expected = {t.trial_id for t in grid.expand(spec_file.load(str(tmp_path / "s.yaml")))}
    assert sorted(r.data.tags["dinox.trial_id"] for r in trials) == sorted(expected)  # each once, all of them
    assert {r.data.tags["dinox.status"] for r in trials} == {"ok"}
    parents = {r.data.tags.get("dinox.shard") for r in runs if r.data.tags.get("dinox.role") == "sweep"}
    assert parents == {"1/2", "2/2"}
    # Shard 1 again: resume finds its trials recorded, measures nothing and opens no (empty) parent run.
    again = run_dinox(["run", "s.yaml", "--shard", "1/2"], cwd=tmp_path, env={"MLFLOW_TRACKING_URI": mlflow_server.url})
    assert again.returncode == 0 and "nothing left to measure: all 2 trials of 'sharded'" in again.stdout, (
        again.stdout + again.stderr
    )
    assert "[1/3] recorded" in again.stdout and "[3/3] recorded" in again.stdout  # its own slice: 1st and 3rd
    assert len(client.search_runs([exp.experiment_id], "tags.`dinox.role` = 'sweep'")) == 2
    # decide reads the three parents as one sweep of three trials.
    assert "3 trials (3 ok)" in _decided(mlflow_server.url, "sharded")


@pytest.mark.parametrize("bad", ["0/2", "3/2", "1", "a/b", "auto", "auto/x"])
def test_a_bad_shard_is_refused(tmp_path, bad):
    (tmp_path / "s.yaml").write_text(SHARDED)
    proc = run_dinox(["run", "s.yaml", "--shard", bad], cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("error: --shard ") and "Traceback" not in proc.stderr
    assert not (tmp_path / "mlflow.db").exists()
