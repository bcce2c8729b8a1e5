"""Trials side by side: the scheduler on fake work (threads, no processes), then `dinox run --devices cpu:2`
for real on this 2-core machine: two trials at once, each pinned to its own core, recorded once; a Ctrl-C
kills both and marks them KILLED; a resume measures only what is missing."""

from __future__ import annotations

import json
import signal
import threading
import time
from types import SimpleNamespace

import psutil
import pytest

from dinox.isolate.slots import Slot
from dinox.sweep.lanes import Lanes, SlotPool, side_by_side
from tests.conftest import TINY, run_dinox
from tests.sweep.test_reliability import dinox_popen, runs_of, trial_child

SLOTS = [Slot("cpu:0", None, (0,)), Slot("cpu:1", None, (1,))]


def _fake(name: str, need: int, seconds: float = 0.2) -> SimpleNamespace:
    return SimpleNamespace(label=name, need=need, seconds=seconds)


def _schedule(trials, fail: str = ""):
    """Run fake trials through the scheduler; what each held, and when."""
    held: dict[str, tuple[float, float, tuple[str, ...]]] = {}
    stopped = threading.Event()

    def work(trial, lane):
        start = time.time()
        if trial.label == fail:
            raise OSError("the workdir filled up")
        stopped.wait(trial.seconds)
        held[trial.label] = (start, time.time(), tuple(s.label for s in lane.slots) if lane else ())

    lanes = Lanes(SLOTS, None)
    side_by_side(trials, lanes, lambda t: t.need, work, stopped.set)
    return held, stopped


def test_trials_run_side_by_side_on_free_slots_in_grid_order():
    held, stopped = _schedule([_fake("a", 1), _fake("b", 1), _fake("recorded", 0), _fake("wide", 2), _fake("c", 1)])
    (a0, a1, a_slots), (b0, b1, b_slots) = held["a"], held["b"]
    assert max(a0, b0) < min(a1, b1) and {a_slots, b_slots} == {("cpu:0",), ("cpu:1",)}  # at once
    assert held["recorded"][2] == ()  # a trial already recorded takes no slot
    w0, w1, w_slots = held["wide"]
    assert w_slots == ("cpu:0", "cpu:1") and w0 >= max(a1, b1)  # a 2-rank trial waits for both slots
    assert held["c"][0] >= w1 and not stopped.is_set()


def test_a_lane_that_fails_stops_the_others_and_the_sweep_sees_its_error():
    with pytest.raises(OSError, match="workdir"):
        _schedule([_fake("slow", 1, seconds=30), _fake("broken", 1), _fake("never", 1)], fail="broken")


def test_an_interrupt_in_the_scheduler_stops_the_lanes_and_waits_for_them():
    started = time.time()

    def slots_for(trial):
        if trial.label == "interrupted":
            raise KeyboardInterrupt
        return 1

    stopped = threading.Event()
    lanes = Lanes(SLOTS, None)
    trials = [_fake("a", 1, 30), _fake("interrupted", 1)]
    with pytest.raises(KeyboardInterrupt):
        side_by_side(trials, lanes, slots_for, lambda t, lane: stopped.wait(30), stopped.set)
    assert stopped.is_set() and time.time() - started < 10


def test_slots_come_back_in_their_order():
    pool = SlotPool(SLOTS)
    first, second = pool.take(1), pool.take(1)
    assert pool.take(1) is None
    pool.give(second)
    pool.give(first)
    assert pool.take(2) == SLOTS


# Trial 0 is quick; 1 and 2 would run for hours: with two slots, 0 and 1 start together, 2 once 0 is recorded.
LONG = 100000


def cases(steps: int) -> str:
    return TINY.format(name="lanes") + (
        "sweep:\n  cases:\n"
        "    - {batch.size: 2, measure.bench_steps: 3}\n"
        f"    - {{batch.size: 3, measure.bench_steps: {steps}}}\n"
        f"    - {{batch.size: 4, measure.bench_steps: {steps}}}\n"
    )


def _windows(sweep_dir) -> dict[int, tuple[float, float]]:
    """Each measured trial's timed span (setup done .. measured), from the sweep's journal."""
    spans = {}
    for line in (sweep_dir / "results.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "result":
            marks = event["result"]["marks"]
            spans[event["trial"]["index"]] = (marks["setup_done"], marks["measured"])
    return spans


def test_two_cpu_slots_measure_two_trials_at_once_and_a_ctrl_c_kills_both(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (tmp_path / "s.yaml").write_text(cases(LONG))
    proc = dinox_popen(["run", "s.yaml", "--devices", "cpu:2"], tmp_path)
    first_long = trial_child(proc, 1)
    second_long = trial_child(proc, 2)  # starts once trial 0 is recorded, beside trial 1
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert "the 2 trials in flight and the sweep are marked KILLED" in err, err  # it said "the trial"
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in (first_long, second_long))
    runs = {r.data.params["batch.size"]: r for r in runs_of(uri, "lanes") if r.data.tags["dinox.role"] == "trial"}
    assert runs["2"].data.tags["dinox.status"] == "ok" and runs["2"].data.tags["dinox.concurrent_trials"] == "2"
    assert runs["3"].info.status == runs["4"].info.status == "KILLED", out + err

    # The same trials, short now (measure.* does not identify a trial): only the two KILLED ones run again.
    (tmp_path / "s.yaml").write_text(cases(20))
    proc = run_dinox(["run", "s.yaml", "--devices", "cpu:2"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 trials at a time: cpu:0 on cores 0, cpu:1 on cores 1" in proc.stdout
    assert proc.stdout.count("recorded size=2 ") == 1, proc.stdout
    done = [r for r in runs_of(uri, "lanes") if r.data.tags["dinox.role"] == "trial" and r.info.status == "FINISHED"]
    assert sorted(r.data.params["batch.size"] for r in done) == ["2", "3", "4"]  # each recorded once
    again = {r.data.params["batch.size"]: r.data.tags for r in done if r.data.params["batch.size"] != "2"}
    assert {t["dinox.cores"] for t in again.values()} == {"0", "1"}  # each child held to its own core
    assert {t["dinox.slot"] for t in again.values()} == {"cpu:0", "cpu:1"}
    assert all(t["dinox.torch_threads"] == "1" for t in again.values())
    sweep_dir = sorted((tmp_path / ".dinox" / "sweeps" / "lanes").iterdir())[-1]
    (s1, e1), (s2, e2) = _windows(sweep_dir).values()
    assert max(s1, s2) < min(e1, e2)  # their timed windows overlapped

    # `dinox verify` of the one on core 1 trains the step it measured: on that core, one torch thread.
    (on_1,) = [r for r in done if r.data.tags.get("dinox.cores") == "1"]
    slice_ = ["--minutes", "0.05", "--epoch-images", "12"]
    trained = run_dinox(["verify", "s.yaml", "--run-id", on_1.info.run_id, *slice_], tmp_path)
    assert trained.returncode in (0, 1, 3), trained.stdout + trained.stderr  # held, off, undecided: each an answer
    assert "its trial ran held to 1 of the cores (dinox run --devices: 1), beside 1 other trial" in trained.stdout
    (run,) = [r for r in runs_of(uri, "lanes") if r.data.tags["dinox.role"] == "verify"]
    assert (run.data.tags["dinox.cores"], run.data.tags["dinox.torch_threads"]) == ("1", "1"), run.data.tags
