"""measure.profile: the idle split on a hand-built CUDA timeline, the summary read back from a hostile store, and
a profiled trial through `dinox run --profile` as a user runs it, and the decision read from its store."""

from __future__ import annotations

import gzip
import json

import pytest
from mlflow import MlflowClient

from dinox.decide import budget
from dinox.decide import verdict as decide
from dinox.measure.profile import idle_split
from dinox.report import decision_json
from dinox.report.text import render_markdown
from dinox.store.profile_table import ProfileSummary, markdown
from dinox.store.readback import fetch_trials
from tests.conftest import TINY, run_dinox, trial_process


def _kernel(ts: float, dur: float, corr: int, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": f"k{corr}", "ts": ts, "dur": dur, "args": {"correlation": corr}}


def _launch(ts: float, corr: int, cat: str = "cuda_runtime") -> dict:
    return {
        "ph": "X",
        "cat": cat,
        "name": "cudaLaunchKernel" if cat == "cuda_runtime" else "cuLaunchKernel",
        "ts": ts,
        "dur": 1,
        "args": {"correlation": corr},
    }


def test_idle_split_tells_a_late_host_from_launch_overhead_and_from_a_queued_wait():
    """A fake Kineto timeline (µs): k2 follows k1 by 10 ns, launched long before (kernel wait); k3 was launched
    only after the device ran dry (host wait, 9.99 µs); a copy on another stream overlaps k3 and keeps the
    device busy to 35; k4, launched at 22 yet started at 40, waited 5 µs for something else (other)."""
    events = [
        _launch(-1, 1), _kernel(0, 10, 1),
        _launch(2, 2), _kernel(10.01, 5, 2),
        _launch(20, 3), _kernel(25, 5, 3),
        _launch(21, 5), _kernel(26, 9, 5, cat="gpu_memcpy"),
        _launch(22, 4), _kernel(40, 10, 4),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 60},  # host work: not the device's
    ]  # fmt: skip
    split = idle_split(events)
    assert split == {
        "host_wait": pytest.approx(9.99 / 50, abs=1e-4),
        "kernel_wait": pytest.approx(0.01 / 50, abs=1e-4),
        "other": pytest.approx(5 / 50, abs=1e-4),
        "busy": pytest.approx(1 - 15 / 50, abs=1e-4),
    }
    assert idle_split([e for e in events if e["cat"] == "cpu_op"]) is None  # the CPU: no device timeline


def test_a_kernel_launched_through_the_driver_api_counts_as_launched():
    """Triton (inductor) and cuDNN's runtime-compiled kernels launch with cuLaunchKernel (cat cuda_driver): k2,
    launched by the driver only after k1 ended, left the device waiting on the host, not on something else."""
    events = [_launch(-1, 1), _kernel(0, 10, 1), _launch(14, 2, cat="cuda_driver"), _kernel(15, 5, 2)]
    split = idle_split(events)
    assert split["host_wait"] == pytest.approx(5 / 20) and split["other"] == 0.0


def test_a_summary_from_the_store_is_data_and_anything_else_is_no_summary():
    hostile = {
        "steps": 3,
        "span_s": 0.3,
        "images_per_s": 40.0,
        "host": [["aten::mm|<script>[x](http://e)", 2, 10.0, 0.1]],
        "device": [],
    }
    p = ProfileSummary.parse(json.dumps(hostile))
    assert p is not None
    text = "\n".join(markdown(p, "get-artifact?path=profile%2Ftrace.json.gz&run_uuid=abc"))
    row = next(line for line in text.splitlines() if "aten::mm" in line)
    # One row of four cells, the name inert: no tag, the link's brackets escaped.
    assert row.count("|") == 5 and "<script>" not in row and "\\[x\\](http://e)" in row, row
    assert "[profile/trace.json.gz](get-artifact?path=profile%2Ftrace.json.gz&run_uuid=abc)" in text
    for bad in ("", "{", "[]", '{"steps": 3}', json.dumps({**hostile, "span_s": float("nan")}), '{"host": 1}'):
        assert ProfileSummary.parse(bad) is None, bad
    failed = ProfileSummary.parse(json.dumps({"error": "RuntimeError: profiler\nbusy"}))
    assert failed is not None and markdown(failed) == [
        "measure.profile: the profiler failed (RuntimeError: profiler busy); the measured figures stand."
    ]


def test_dinox_run_profile_traces_a_recorded_trial_again_and_decide_shows_its_table(tmp_path):
    """A trial measured, then traced with `--profile 1`: measured again although recorded, its gzipped trace an
    artifact that loads as Chrome-trace JSON with the profiled steps in it, its description the table and a
    link, the same steps timed as unprofiled; `decide` shows the winner's table."""
    spec = TINY.format(name="profiled").replace("repeats: 1", "repeats: 2")
    (tmp_path / "p.yaml").write_text(spec)
    assert run_dinox(["run", "p.yaml", "--no-system-metrics"], cwd=tmp_path).returncode == 0
    refused = run_dinox(["run", "p.yaml", "--profile", "2"], cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.strip() == (
        "error: --profile 2: no such trial; give its number (1-1, as its run's name starts), its trial id, or all"
    )
    proc = run_dinox(["run", "p.yaml", "--no-system-metrics", "--profile", "1"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    plain, traced = sorted(client.search_runs(["1"], "tags.`dinox.role` = 'trial'"), key=lambda r: r.info.start_time)
    assert plain.data.tags["dinox.trial_id"] == traced.data.tags["dinox.trial_id"]  # one trial, measured again
    assert "dinox.profile" not in plain.data.tags and "measure.profile" not in plain.data.params

    path = client.download_artifacts(traced.info.run_id, "profile/trace.json.gz", str(tmp_path))
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    steps = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
    assert len(steps) == 3, steps  # measure.profile_steps' default, the profiler's warm-up step left out
    assert any(e.get("name") == "aten::mm" for e in events)

    note = traced.data.tags["mlflow.note.content"]
    run_id = traced.info.run_id
    assert f"Trace: [profile/trace.json.gz](get-artifact?path=profile%2Ftrace.json.gz&run_uuid={run_id})" in note
    assert "| top ops by self host time | calls/step | ms/step | share of step |" in note
    summary = ProfileSummary.parse(traced.data.tags["dinox.profile"])
    assert summary is not None and summary.host and summary.device == [] and summary.idle is None  # the CPU
    assert 0 < sum(r.share for r in summary.host) <= 1.0 + 1e-6

    # The profile runs after the windows: the traced run timed the same steps. (That the figures agree is a
    # benchmark's job: scripts/bench_profile.py alternates the two and prints the ratio.)
    timed = [len(client.get_metric_history(r.info.run_id, "step_s")) for r in (plain, traced)]
    assert timed[0] == timed[1] > 0, timed

    # decide, in this process (its CLI has tests of its own): the report and decision.json carry the table.
    records = fetch_trials(f"sqlite:///{tmp_path / 'mlflow.db'}", ["profiled"], []).records
    decision = decide.decide(records, budget.Budget(days=1, target_images=1000))
    report = render_markdown(decision, [])
    assert "## Where the recommended step's time goes" in report and "| aten::mm |" in report
    # One window a trial (a quick look): UNSETTLED, and the table is its leading trial's.
    assert decision.verdict == "UNSETTLED"
    (model,) = decision_json.to_json(decision)["models"]
    best = model["best"]
    assert best["run_id"] == run_id and best["profile"]["host"][0]["name"] == summary.host[0].name


def test_the_profiled_rate_counts_every_rank_as_images_per_s_does(tmp_path):
    """Under DDP each rank profiles its own steps: the summary's images/s is over the world, like the trial's."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from dinox.measure.loop import Loop
    from dinox.measure.profile import profile_steps

    data = DataLoader(TensorDataset(torch.zeros(64, 4), torch.zeros(64)), batch_size=4)
    import time

    loop = Loop(data, lambda b: b, lambda b: time.sleep(0.05), lambda: None, torch.device("cpu"), 1, 4)
    loop.run(1, 1)
    summary = profile_steps(loop, 2, torch.device("cpu"), tmp_path, world=4)
    assert summary["images_per_s"] == pytest.approx(2 * 4 * 4 / summary["span_s"], rel=1e-2)


def test_a_profile_cut_short_costs_its_trace_never_the_measurement(tmp_path):
    """The profile runs after the measurement, inside the trial's time limit: a slow profile once turned a
    finished measurement into `timeout`. The trial's process is SIGKILLed once it is profiling (as a time
    limit or a full disk ends it): the trial is recorded ok, with its figures, and the profile says why it
    is missing; no partial trace is left."""
    import signal
    import subprocess
    import sys
    import time

    spec = TINY.format(name="cut").replace("timeout_s: 120", "timeout_s: 120, profile: true, profile_steps: 100")
    (tmp_path / "p.yaml").write_text(spec + "data: {source: synthetic, sample_delay_ms: 30}\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dinox", "run", "p.yaml", "--no-system-metrics"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not any(p.read_text() == "profile" for p in tmp_path.glob(".dinox/sweeps/*/*/trials/*/phase")):
        assert time.time() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    (trial_dir,) = {p.parent for p in tmp_path.glob(".dinox/sweeps/*/*/trials/*/phase")}
    assert (trial_dir / "result.provisional.json").exists()
    trial_process(proc.pid, 0).send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs(["1"], "tags.`dinox.role` = 'trial'")
    assert run.data.tags["dinox.status"] == "ok" and run.data.metrics["images_per_s"] > 0
    why = json.loads(run.data.tags["dinox.profile"])["error"]
    assert why.startswith("the profile did not finish (the child ended: ") and why.endswith("the measurement stands")
    assert not list(trial_dir.glob("*trace*")) and not list(trial_dir.glob(".*.tmp"))
