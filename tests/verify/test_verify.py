"""`dinox verify`: the forecast held against real training, through the command a user types."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os

import pytest
from mlflow import MlflowClient

from dinox.decide import budget
from dinox.decide import verdict as decide
from dinox.report import text as report
from dinox.store.trial_record import TrialRecord
from dinox.verify import Forecast, slice_forecast
from tests import study
from tests.conftest import TINY, measure_one, run_dinox

SPEC = TINY.format(name="verified").replace("repeats: 1", "repeats: 3")


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """One tiny trial measured for real (three windows), as `dinox run` records it."""
    work = tmp_path_factory.mktemp("verify")
    return measure_one(work, SPEC)


def test_verify_trains_the_trial_through_epochs_and_records_the_forecast_error(measured):
    work, trial = measured
    # The decision's forecast was measured with the threads asleep (its head-to-head rounds, on a busy box), the
    # trial's sweep with torch's own policy (a quiet box): the slice trains the forecast's step, whatever this box
    # reads now, and its run says so. Without a policy of the user's, as the trial's own command ran.
    quiet, passive = (
        "unset (the box was quiet: 0.1 cores busy when read)",
        "PASSIVE (set by dinox: 9.9 cores busy when read)",
    )
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    client.set_tag(trial.info.run_id, "dinox.omp_wait_policy", quiet)
    # Its sweep's shell set OMP_NUM_THREADS=1 (torch's default here is 2): the slice trains with one thread too.
    client.set_tag(trial.info.run_id, "dinox.torch_threads", "1")
    t = trial.data.metrics
    span = {"forecast_ips": t["images_per_s"], "slow_ips": t["images_per_s_min"], "fast_ips": t["images_per_s_max"]}
    best = {"run_id": trial.info.run_id, "span": span, "epoch_boundary_s": t["epoch_boundary_s"]}
    (work / "decided").mkdir(exist_ok=True)
    (work / "decided" / "decision.json").write_text(json.dumps({"recommended": best | {"omp_wait_policy": passive}}))
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    try:
        proc = run_dinox(
            ["verify", "spec.yaml", "--decision", "decided", "--minutes", "0.05", "--epoch-images", "16"],
            cwd=work,
            env=env,
            inherit=False,
        )
    finally:
        client.set_tag(trial.info.run_id, "dinox.torch_threads", trial.data.tags["dinox.torch_threads"])
    assert proc.returncode in (0, 1, 3), proc.stdout + proc.stderr  # held, off, or undecided: each an answer
    first = proc.stdout.splitlines()[0]
    assert first.startswith("dinox: verifying ") and "for 0.05 minutes" in first, proc.stdout
    assert "its forecast was measured with OMP_WAIT_POLICY=PASSIVE (the head-to-head rounds decide plans" in proc.stdout
    assert "the trial's own windows with unset: the slice trains the forecast's step" in proc.stdout
    assert (
        "its threads sleep when they wait (OMP_WAIT_POLICY=PASSIVE), as the forecast's measurement did" in proc.stdout
    )
    said = next(ln for ln in proc.stdout.splitlines() if ln.startswith(("HELD: ", "OFF: ", "UNDECIDED: ")))
    assert said.startswith("HELD: ") == (proc.returncode == 0), said
    (run,) = client.search_runs(["1"], "tags.`dinox.role` = 'verify'")
    m, tags = run.data.metrics, run.data.tags
    # The check windows after the slice, held against the forecast's range (here the trial's own windows' figures,
    # measured with the other policy): the exit code says which it was.
    before, after = m["verify_check_images_per_s"], m["verify_check_after_images_per_s"]
    low, high = t["images_per_s_min"], t["images_per_s_max"]
    # Moved: outside them by more than 5 %, or the forecast at their rate on the other side of 5 % than the
    # trial's forecast (a tie's plan added back): the box's move decided the verdict.
    at_after = m["verify_images"] / after + m["verify_epochs_ended"] * t["epoch_boundary_s"]
    assert m["check_after_error"] == pytest.approx((at_after - m["verify_wall_s"]) / m["verify_wall_s"])
    boxless = m["check_after_error"] + m["forecast_error"] - m["own_windows_error"]
    straddles = (abs(boxless) <= 0.05) != (abs(m["forecast_error"]) <= 0.05)
    # Or the slice's own quarters, each at its steps' pace, put the forecast on either side of 5 % (or both).
    slow, fast, steady = (
        m[f"verify_{k}"] for k in ("quarter_slow_images_per_s", "quarter_fast_images_per_s", "steady_s")
    )
    assert slow <= m["verify_images"] / steady * (1 + 1e-9) and m["verify_images"] / steady <= fast * (1 + 1e-9)
    walls = [m["verify_wall_s"] - steady + m["verify_images"] / ips for ips in (slow, fast)]
    at_slow, at_fast = ((m["forecast_s"] - w) / w for w in walls)
    paced = not (max(abs(at_slow), abs(at_fast)) <= 0.05 or at_slow > 0.05 or at_fast < -0.05)
    moved = not low * 0.95 <= after <= high * 1.05 or straddles or paced
    assert tags["dinox.verify_moved"] == str(moved).lower(), (after, low, high, boxless, m["forecast_error"], paced)
    # Moved: undecided whether the forecast held or not (a match then as open as a miss).
    assert proc.returncode == (3 if moved else 0 if "held within" in said else 1), said
    assert tags["dinox.verify_verdict"] == said.split(":")[0] and run.data.tags["mlflow.note.content"].startswith(
        f"**{said.split(':')[0]}: forecast "
    ), (said, run.data.tags["mlflow.note.content"][:200])
    # The same slice at the check windows' rate (before and after pooled, as many windows each): the method's own
    # error, the box's moves set aside.
    check = 2 / (1 / before + 1 / after)
    # Each check window's rate is kept (as many each side as the trial timed at least: 3), and each side's pooled
    # rate is theirs: windows of one size, so images over time is their harmonic mean.
    each = json.loads(tags["dinox.verify_check_windows"])
    assert sorted(each) == ["after", "before"] and len(each["before"]) == len(each["after"]) == 3, each
    for side, pooled in (("before", before), ("after", after)):
        assert 3 / sum(1 / r for r in each[side]) == pytest.approx(pooled, rel=1e-3), (side, each)
    at_check = m["verify_images"] / check + m["verify_epochs_ended"] * t["epoch_boundary_s"]
    assert m["check_windows_error"] == pytest.approx((at_check - m["verify_wall_s"]) / m["verify_wall_s"])
    assert said.startswith("UNDECIDED: ") == (proc.returncode == 3), said
    assert tags["dinox.verifies"] == trial.info.run_id and tags["dinox.trial_id"] == trial.data.tags["dinox.trial_id"]
    assert (
        tags["dinox.omp_wait_policy"]
        == "PASSIVE (as its forecast was measured: set by dinox: 9.9 cores busy when read)"
    )
    assert tags["dinox.torch_threads"] == "1" and "OMP_NUM_THREADS" not in proc.stdout  # the trial's, said nothing
    # 16-image epochs of batch 4: the slice crossed epoch boundaries, each epoch of whole steps.
    epochs = json.loads(tags["dinox.verify_epochs"])
    assert m["verify_epochs_ended"] >= 1 and len(epochs) == m["verify_epochs_ended"] + 1
    assert all(e["images"] == 16 for e in epochs[1:-1]) and epochs[-1]["partial"] == 1.0
    # Before the slice, its first epoch's first steps: the warm-up's and the check windows' (whole steps; a window
    # that crossed an epoch boundary was taken again, so how many ran is the loader's business).
    assert epochs[0]["images"] in (4, 8, 12, 16) and epochs[0]["partial"] == 1.0
    assert m["verify_images"] == m["verify_steps"] * 4 and m["verify_wall_s"] >= 0.05 * 60
    # The forecast for the same slice is the trial's own figure plus the epoch boundaries it crossed.
    forecast = m["verify_images"] / t["images_per_s"] + m["verify_epochs_ended"] * t["epoch_boundary_s"]
    assert m["forecast_s"] == pytest.approx(forecast)
    assert m["forecast_error"] == pytest.approx((forecast - m["verify_wall_s"]) / m["verify_wall_s"])
    assert m["forecast_slow_s"] >= m["forecast_s"] >= m["forecast_fast_s"]
    assert m["own_windows_error"] == pytest.approx(m["forecast_error"])  # the sweep's windows: another step
    # decide reads it back beside the trial.
    gate = run_dinox(["decide", "--spec", "spec.yaml", "--days", "1", "--target-images", "100", "--no-log"], cwd=work)
    assert gate.returncode in (0, 3), gate.stdout + gate.stderr
    line = next(ln for ln in gate.stdout.splitlines() if ln.startswith("verified: "))
    assert f"verify run {run.info.run_id}" in line and ("held within" in line or "off by" in line), line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--minutes", "-1"], "error: --minutes -1.0: must be a positive number"),
        (["--minutes", "nan"], "error: --minutes nan: must be a positive number"),
        (["--epoch-images", "3"], "error: --epoch-images 3: fewer than one step's 4 images (batch x accumulation x"),
        (["--decision", "nowhere"], "error: nowhere/decision.json: No such file or directory: run `dinox decide`"),
        (["--run-id", "0123456789abcdef"], "error: run '0123456789abcdef' not found in sqlite:///"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(measured, args, message):
    work, trial = measured
    if "--decision" not in args and "--run-id" not in args:
        args = [*args, "--run-id", trial.info.run_id]
    proc = run_dinox(["verify", "spec.yaml", *args], cwd=work)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(message), proc.stderr


def test_a_spec_that_changed_since_is_refused_naming_the_trial(measured):
    work, trial = measured
    (work / "other.yaml").write_text(SPEC.replace("size: 4", "size: 2"))
    proc = run_dinox(["verify", "other.yaml", "--run-id", trial.info.run_id], cwd=work)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: other.yaml has no trial with id {trial.data.tags['dinox.trial_id']}")
    assert "the spec changed since the trial was measured" in proc.stderr


def test_a_trial_measured_on_another_device_is_refused_before_training(measured):
    """The forecast is of the trial's device: on a machine whose device differs (another GPU model, a GPU box
    for a CPU trial) the child stops before data or model, exit 2 naming both, nothing recorded; the store's
    name reaches the terminal as one printable line."""
    work, trial = measured
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    own = trial.data.tags["dinox.device_name"]
    verifies = f"tags.`dinox.role` = 'verify' and tags.`dinox.verifies` = '{trial.info.run_id}'"
    before = len(client.search_runs([trial.info.experiment_id], verifies))
    client.set_tag(trial.info.run_id, "dinox.device_name", "NVIDIA H100 80GB HBM3\x1b[2J")
    try:
        proc = run_dinox(["verify", "spec.yaml", "--run-id", trial.info.run_id, "--minutes", "5"], cwd=work)
    finally:
        client.set_tag(trial.info.run_id, "dinox.device_name", own)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(
        f"error: this machine trains on {own}, the trial was measured on NVIDIA H100 80GB HBM3 [2J: its forecast is "
        "that device's step"
    ), proc.stderr
    assert "\x1b" not in proc.stderr + proc.stdout and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert len(client.search_runs([trial.info.experiment_id], verifies)) == before  # nothing trained, nothing logged


def test_a_trial_held_to_a_share_of_the_cores_is_trained_on_as_many():
    """`dinox run --devices cpu:N` measured the trial's step on its share of the cores (one torch thread a core,
    beside the other trials): the slice trains that step, on the same cores where it may, else as many; a trial
    measured on the whole machine trains on it, as does a forecast of head-to-head rounds; a damaged record is
    said, its text never printed."""
    from dinox.verify.step import held_cores

    def trial(cores: str | None, beside: str = "") -> TrialRecord:
        tags = {k: v for k, v in (("dinox.cores", cores), ("dinox.concurrent_trials", beside)) if v is not None}
        return TrialRecord("t1", "0", "1", {}, {}, tags)

    own = Forecast(100.0, 95.0, 105.0)  # the trial's own windows
    assert held_cores(trial(None), own, [0, 1]) == ([], "")  # measured one at a time, on every core
    assert held_cores(trial("0-1"), own, [0, 1]) == ([], "")  # every core this process has: nothing to hold
    cores, said = held_cores(trial("1", "2"), own, [0, 1])
    assert cores == [1] and said.startswith("its trial ran held to 1 of the cores (dinox run --devices: 1)"), said
    assert "beside 1 other trial it no longer has: the slice trains on 1, at most one torch thread a core" in said
    cores, said = held_cores(trial("6-7", "x"), own, [0, 1, 2, 3])  # another box, or a narrower allowance now
    assert cores == [0, 1] and "(dinox run --devices: 6-7): the slice trains on 0-1" in said and "beside" not in said
    cores, said = held_cores(trial("0-3"), own, [0, 1])  # held to 4, this process may use 2 (a cgroup)
    assert cores == [0, 1] and said.endswith(
        "the slice trains on 0-1, only 2 here (this process's cores): another step than the trial measured"
    )
    for damaged in ("0-4000000000", "1\x1b[2J"):
        cores, said = held_cores(trial(damaged), own, [0, 1])
        assert cores == [] and "cannot be read" in said and "\x1b" not in said and "4000000000" not in said
    # A forecast of head-to-head rounds: they ran on every core (never held), and the slice trains their step.
    cores, said = held_cores(trial("1", "2"), dataclasses.replace(own, rounds=5), [0, 1])
    assert cores == [] and said.endswith(
        "rounds on every core: the slice trains on every core, the step the rounds measured"
    )


def test_the_slice_trains_with_the_trial_s_torch_threads_unless_the_user_sets_them_now():
    """dinox.torch_threads: what the sweep's shell gave the trial (its OMP_NUM_THREADS, or torch's default). A
    shell without it now gets the trial's; one that sets it keeps its own and is told, where it differs; ranks and
    a forecast of rounds (which record none) are left to their own rules; a damaged tag holds nothing."""
    from dinox.verify.step import held_threads

    def trial(threads: str, world: str = "1") -> TrialRecord:
        return TrialRecord("t1", "0", "1", {}, {}, {"dinox.torch_threads": threads, "dinox.world_size": world})

    own = Forecast(100.0, 95.0, 105.0)
    assert held_threads(trial("1"), own, {}) == ({"OMP_NUM_THREADS": "1"}, "")
    assert held_threads(trial("1"), own, {"OMP_NUM_THREADS": "1"}) == ({}, "")  # theirs, the same
    env, said = held_threads(trial("2"), own, {"OMP_NUM_THREADS": "8\x1b[2J"})
    assert env == {} and said.startswith("OMP_NUM_THREADS=8\\x1b[2J here, its trial ran 2 torch threads: the slice")
    for record, forecast in ((trial("1", "2"), own), (trial("1"), dataclasses.replace(own, rounds=5))):
        assert held_threads(record, forecast, {}) == ({}, "")
    for damaged in ("", "0", "-1", "1e9", "4000000000", "²", "١"):  # unicode digits: isdigit, but not int's
        assert held_threads(trial(damaged), own, {}) == ({}, "")


def test_the_slice_forecast_charges_each_boundary_at_each_end():
    f = Forecast(100.0, 80.0, 125.0, epoch_boundary_s=2.0)
    assert slice_forecast(f, 1000, 3) == pytest.approx((16.0, 18.5, 14.0))


def test_what_a_boundary_adds_is_read_from_the_decision_or_record_and_an_older_one_charges_the_restart_whole(
    tmp_path,
):
    """epoch_boundary_s (the restart less a steady fetch's wait) where the decision or the trial has it; a
    decision.json or a trial record from before it: epoch_start_s, the restart's whole first batch."""
    from dinox.cli.common import BadInput
    from dinox.cli.verify import _recommended

    best = {"run_id": "r1", "span": {"forecast_ips": 100.0, "slow_ips": 80.0, "fast_ips": 125.0}, "epoch_start_s": 2.0}
    for given, charged in (({}, 2.0), ({"epoch_boundary_s": 0.5}, 0.5)):
        (tmp_path / "decision.json").write_text(json.dumps({"verdict": "GO", "recommended": best | given}))
        source = f"decision {tmp_path / 'decision.json'}"
        assert _recommended(str(tmp_path)) == ("r1", Forecast(100.0, 80.0, 125.0, charged, source))
        older = TrialRecord("r1", "1", metrics={"images_per_s": 100.0, "epoch_start_s": 2.0} | given)
        assert Forecast.of_record(older).epoch_boundary_s == charged
    for forged in (
        {"epoch_boundary_s": -1.0},
        {"epoch_boundary_s": float("nan")},
        {"span": best["span"] | {"slow_ips": 0}},
    ):
        (tmp_path / "decision.json").write_text(json.dumps({"verdict": "GO", "recommended": best | forged}))
        with pytest.raises(BadInput, match="not a dinox decision .its forecast holds a rate or cost that is not a fi"):
            _recommended(str(tmp_path))
    from dinox.verify.outcome import VerifyOutcome

    crossed = VerifyOutcome("t", "v", 11.2, 1000.0, 3, 0, 11.5, 12.0, 11.0, 90.0, Forecast(100.0, 95.0, 105.0, 0.5))
    assert "for 1,000 images (3 epoch boundaries, charged 0.5 s each); the real time is" in crossed.verdict()
    none = dataclasses.replace(crossed, epochs_ended=0)
    assert "for 1,000 images (0 epoch boundaries); the real time" in none.verdict()


def test_a_miss_where_the_check_windows_left_the_trial_s_windows_is_undecided():
    """The check windows after the slice, timed as the trial timed its, against the trial's own windows: outside
    them by more than 5 %, the box (or the process) was not as the trial found it, and a miss cannot say which
    of the two is wrong; inside, a miss is the forecast's. Those before the slice alone outside are the process's
    first seconds (an H200 ran them 10-18 % under the slice three times of three), said but not a moved box; a
    result with none after the slice (an older child's) is read by those before."""
    from dinox.verify.outcome import VerifyOutcome

    def outcome(wall: float, check: float | None, after: float | None = None) -> VerifyOutcome:
        f = Forecast(100.0, 95.0, 105.0)
        return VerifyOutcome(
            "t", "v", wall, 1000.0, 0, 0, 10.0, 1000 / 95, 1000 / 105, 1000 / wall, f, check_ips=check, after_ips=after
        )

    held, off = outcome(10.2, 98.0, 99.0), outcome(12.0, 99.0, 97.0)
    assert held.held and not held.moved and "windows timed" not in held.verdict()
    assert not off.held and not off.moved  # short windows as the trial's, the slice slower: the forecast's miss
    moved = outcome(12.0, 82.0, 83.0)  # windows around the slice 13-14 % under the slowest of the trial's
    assert moved.moved and not moved.held
    said = "ran 82.0 img/s before the slice and 83.0 after it, outside the trial's windows (95.0-105.0) by more than 5%"
    assert said in moved.verdict()
    assert moved.verdict().endswith("so the miss is not the forecast's alone")
    rounds = dataclasses.replace(moved, reference="rounds")  # a forecast pooling a head-to-head's rounds: theirs
    said = "outside the head-to-head rounds' windows (95.0-105.0) by more than 5%: this box (or process) is not as the"
    assert f"{said} rounds found it" in rounds.verdict(), rounds.verdict()
    assert moved.check_rate == pytest.approx(2 / (1 / 82 + 1 / 83))  # the two pooled, as many windows each
    started_slow = outcome(12.0, 82.0, 99.0)  # only before: the young process, not the box
    assert not started_slow.moved and started_slow.verdict().endswith(
        "ran 82.0 img/s before the slice and 99.0 after it: only those before it, in the process's first seconds, "
        "outside the trial's windows (95.0-105.0): the box had not moved by the slice's end"
    )
    assert outcome(12.0, 99.0, 82.0).moved  # the box moved while the slice ran
    for old in (None, 0.0):  # a child's result without the windows after: those before decide, as before
        assert outcome(12.0, 90.3, old).moved is False and outcome(12.0, 110.2, old).moved is False
        assert outcome(12.0, 110.3, old).moved and outcome(12.0, 82.0, old).moved
    assert outcome(12.0, None).moved is False  # a result without either: not moved
    lucky = outcome(10.0, 130.0, 128.0)
    assert lucky.held and lucky.moved and lucky.verdict().endswith("so the match may be luck")
    assert lucky.word == "UNDECIDED" and moved.word == "UNDECIDED"  # a match on a moved box is as open as a miss
    assert held.word == "HELD" and off.word == "OFF" and started_slow.word == "OFF"


def test_a_verdict_the_box_s_move_decides_is_undecided_whichever_way_it_falls():
    """The slice's error measured twice: by the sweep's windows (the forecast) and by windows timed as the trial's
    right after the slice. On either side of 5 %, the box's move between them (under the 5 % that calls a box
    moved on its own) is what makes the slice held or off: UNDECIDED, a match then as open as a miss. Issue 33's
    JPEG case (2026-11-29 19:29, round 4): the trial 100.3 img/s, the slice 105.3, the check windows 103.9
    before and 103.4 after; OFF by 5.1 % before this rule, +1.8 % at the check windows' rate."""
    from dinox.verify.outcome import VerifyOutcome

    def outcome(real: float, before: float, after: float | None, plan: float = 100.0) -> VerifyOutcome:
        own = Forecast(100.0, 99.5, 100.5)
        f = own if plan == 100.0 else Forecast(plan, plan, plan)  # a tie's plan: the slower trial's figure
        forecast_s, slow_s, fast_s = slice_forecast(f, 10_000.0, 0)
        o = VerifyOutcome(
            "t", "v", 10_000 / real, 10_000.0, 0, 0, forecast_s, slow_s, fast_s, real, f,
            check_ips=before, after_ips=after, own=own,
        )  # fmt: skip
        o.own_error = o.error_at(own, (0.0, 0.0))
        o.check_error = o.error_at_rate(o.check_rate, (0.0, 0.0))
        o.after_error = o.error_at_rate(after, (0.0, 0.0))
        return o

    jpeg = outcome(105.3, 103.9, 103.4)
    assert not jpeg.held and jpeg.error == pytest.approx(0.053, abs=1e-3)
    assert jpeg.after_error == pytest.approx(0.0184, abs=1e-3)
    assert not jpeg.outside(103.4) and jpeg.straddles and jpeg.moved and jpeg.word == "UNDECIDED"
    assert jpeg.verdict().endswith(
        "; but windows timed as the trial timed its ran 103.9 img/s before the slice and 103.4 after it, over the "
        "trial's windows (99.5-100.5), and at their rate the forecast is within 1.8%: the box's move since the "
        "sweep, under 5% on its own, decides whether the slice held, not the forecast"
    )
    lucky = outcome(104.5, 99.5, 99.0)  # held within 4.5 %; at the rate of the windows after it, off by 5.6 %
    assert lucky.held and lucky.straddles and lucky.word == "UNDECIDED"
    assert "99.0 after it, under the trial's windows (99.5-100.5), and at their rate the forecast is off by 5.6%" in (
        lucky.verdict()
    )
    # Off by 6.0 %, and by 5.1 % at the rate of the windows after the slice: OFF. Pooled with the young process's
    # slow windows before it (86.0), the rate would say +2.1 % and make the box's move decide.
    young = outcome(94.0, 86.0, 99.0)
    assert not young.straddles and young.word == "OFF" and "only those before it" in young.verdict()
    assert outcome(100.5, 100.0, 99.8).word == "HELD" and outcome(110.0, 99.0, 100.2).word == "OFF"
    assert outcome(100.0, 99.0, None).word == "HELD"  # an older child's result: those before decide
    # A tie planned at the slower trial's 90.0 img/s: that part of the miss is the plan's, not the box's.
    tie = outcome(100.0, 100.0, 100.0, plan=90.0)
    assert tie.error == pytest.approx(0.111, abs=1e-3) and not tie.straddles and tie.word == "OFF"


def test_a_slice_whose_own_pace_moved_across_the_tolerance_is_undecided():
    """The slice's quarters, each at its steps' own pace: where the forecast at the slowest quarter's pace and at
    the fastest fall on either side of 5 % (or both sides), the box's change of speed during the slice decides
    the verdict, whatever the check windows at its two ends say: UNDECIDED. This project's 2-core VM, quiet,
    2026-11-30 21:40: a verify slice ran 218 img/s for its first 15 s and 180 for the rest, and a plain PyTorch
    loop switches between the two paces in one process (scripts/bench_box.py). Here: a trial of 178.0-185.6
    img/s (182.6 pooled), check windows at both ends of the slice at the slow pace, its middle half at the fast."""
    from dinox.verify.outcome import VerifyOutcome

    own = Forecast(182.6, 178.0, 185.6)

    def outcome(quarters: list[float], plan: Forecast = own) -> VerifyOutcome:
        images = 2_700.0 * len(quarters)  # each quarter's images, at its own pace
        wall = sum(2_700.0 / q for q in quarters)
        forecast_s, slow_s, fast_s = slice_forecast(plan, images, 0)
        o = VerifyOutcome(
            "t", "v", wall, images, 0, 0, forecast_s, slow_s, fast_s, images / wall, plan,
            check_ips=181.0, after_ips=180.0, own=own, steady_s=wall, quarters=(min(quarters), max(quarters)),
        )  # fmt: skip
        o.own_error = o.error_at(own, (0.0, 0.0))
        o.check_error = o.error_at_rate(o.check_rate, (0.0, 0.0))
        o.after_error = o.error_at_rate(o.after_ips, (0.0, 0.0))
        return o

    sped_up = outcome([180.0, 219.0, 219.0, 180.0])
    # Before the rule: OFF, +8.2 % pessimistic, the check windows (180-181) inside the trial's and forecasting
    # the slice off too: the forecast blamed for the box's fast middle.
    assert sped_up.error == pytest.approx(0.0821, abs=1e-3) and not sped_up.left_trial_windows
    assert not sped_up.straddles and sped_up.quarter_errors == pytest.approx((-0.014, 0.199), abs=1e-3)
    assert sped_up.slice_moved and sped_up.moved and sped_up.word == "UNDECIDED"
    assert sped_up.verdict().endswith(
        "; but the slice's own steps ran 180.0-219.0 img/s over its quarters, and at its slowest quarter's pace the "
        "forecast is within 1.4% (optimistic), at its fastest off by 19.9% (pessimistic): its pace moving inside "
        "the slice decides whether it held, not the forecast"
    ), sped_up.verdict()
    steady = outcome([179.0, 181.0, 182.0, 180.0])  # the same pace throughout: the verdict is the slice's
    assert not steady.slice_moved and steady.word == "HELD"
    # Off at either pace, the same side: the forecast's miss, whatever the box did (a plan of 150 img/s).
    wrong = outcome([180.0, 219.0, 219.0, 180.0], Forecast(150.0, 148.0, 152.0))
    assert not wrong.slice_moved and wrong.word == "OFF"
    # Quarters wider than the tolerance on both sides of the forecast: within it at neither end, decided by none.
    wide = outcome([160.0, 219.0, 219.0, 160.0], Forecast(185.0, 184.0, 186.0))
    assert wide.quarter_errors[0] < -0.05 < 0.05 < wide.quarter_errors[1] and wide.slice_moved
    short = dataclasses.replace(sped_up, quarters=(None, None))  # too short a slice, or one of epochs only
    assert short.quarter_errors is None and not short.slice_moved and short.word == "OFF"


def test_the_gpu_s_clock_at_each_check_window_and_epoch_is_kept_and_said(tmp_path, monkeypatch):
    """On a GPU NVML reads, the verify child keeps the SM clock at each check window's end and each epoch's (a GPU
    still ramping up in the process's first seconds, or throttling by the slice's end, shows there), and the
    verdict names it beside the check windows it explains. Here the child's own code on this CPU, with the clock
    read as a GPU's would be (the CPU has none: nothing is kept, the record as before)."""
    from dinox.contract import SM_CLOCK_KEY
    from dinox.measure import device
    from dinox.measure.verify import VerifyRun
    from dinox.plan import grid
    from dinox.spec import file as spec_file
    from dinox.verify.outcome import VerifyOutcome, check_clocks

    (tmp_path / "spec.yaml").write_text(SPEC)
    (trial,) = grid.expand(spec_file.load(tmp_path / "spec.yaml"))

    def verified(out: str) -> dict[str, str]:
        run = VerifyRun(trial.spec, 0.3, None, 24, marks={}, metrics={}, tags={}, out_dir=tmp_path / out)
        return run.measure().tags

    tags = verified("cpu")
    assert SM_CLOCK_KEY not in tags["dinox.verify_check_windows"] and SM_CLOCK_KEY not in tags["dinox.verify_epochs"]
    readings = iter(range(1410, 10**6, 15))
    monkeypatch.setattr(device, "sm_clock_mhz", lambda dev: float(next(readings)))
    tags = verified("gpu")
    windows, epochs = json.loads(tags["dinox.verify_check_windows"]), json.loads(tags["dinox.verify_epochs"])
    clocks = windows[SM_CLOCK_KEY]
    assert len(clocks["before"]) == len(windows["before"]) == 3 and len(clocks["after"]) == len(windows["after"]) == 3
    assert clocks["before"] == [1410.0, 1425.0, 1440.0] and all(SM_CLOCK_KEY in e for e in epochs), (clocks, epochs)
    assert clocks["after"][0] == epochs[-1][SM_CLOCK_KEY] + 15  # read in order: the slice's end, then the windows
    assert check_clocks(tags["dinox.verify_check_windows"]) == clocks
    for bad in (
        "",
        "[]",
        "{",
        '{"sm_clock_mhz": [1]}',
        '{"sm_clock_mhz": {"before": [NaN]}}',
        '{"sm_clock_mhz": {"before": [true], "after": ["1"]}}',
        '{"sm_clock_mhz": {"during": [1]}}',
    ):
        assert check_clocks(bad) == {}, bad
    slow_start = VerifyOutcome(
        "t", "v", 12.0, 1000.0, 0, 0, 10.0, 1000 / 95, 1000 / 105, 1000 / 12, Forecast(100.0, 95.0, 105.0),
        check_ips=82.0, after_ips=99.0, clocks={"before": [1410.0, 1755.0, 1980.0], "after": [1980.0, 1980.0]},
    )  # fmt: skip
    said = "ran 82.0 img/s before the slice and 99.0 after it (the GPU's SM clock 1,410-1,980 MHz before and 1,980 MHz"
    assert f"{said} after): only those before it" in slow_start.verdict(), slow_start.verdict()


def test_a_box_that_moved_since_the_trial_makes_verify_exit_3_saying_so(measured, tmp_path):
    """Through the command: a store whose trial's windows all read ten times what this box ran (measured on a faster
    box, or before a neighbour arrived). The slice misses by ~90 %, the check windows run ~10x under the trial's
    windows: `UNDECIDED`, exit 3, the command that measures again, and decide shows the verification so."""
    import shlex
    import shutil

    work, trial = measured
    spec = "the spec; $(touch PWNED).yaml"  # the command it prints for pasting keeps the path one word
    shutil.copy(work / "spec.yaml", tmp_path / spec)
    shutil.copy(work / "mlflow.db", tmp_path / "mlflow.db")
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    fastest = trial.data.metrics["images_per_s_max"]  # ten times the fastest window this box ran, and more
    for key, times in (("images_per_s", 11), ("images_per_s_min", 10), ("images_per_s_max", 12)):
        client.log_metric(trial.info.run_id, key, fastest * times, step=1)
    proc = run_dinox(["verify", spec, "--run-id", trial.info.run_id, "--minutes", "0.05"], cwd=tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    said = next(ln for ln in lines if ln.startswith("UNDECIDED: forecast off by "))
    assert "(optimistic)" in said and "outside the trial's windows" in said, said
    command = next(ln for ln in lines if ln.startswith("       undecided: `")).split("`")[1]
    assert shlex.split(command) == ["dinox", "run", spec, "--force"], command
    assert "       against the check windows (" in proc.stdout, proc.stdout
    run = client.search_runs(["1"], "tags.`dinox.role` = 'verify'", order_by=["attributes.start_time DESC"])[0]
    assert run.data.tags["dinox.verify_moved"] == "true"
    gate = run_dinox(["decide", "--spec", spec, "--days", "1", "--target-images", "100", "--no-log"], tmp_path)
    line = next(ln for ln in gate.stdout.splitlines() if ln.startswith("verified: "))
    assert "; the box moved, by its check windows or the slice's own quarters)" in line, line
    assert ": undecided: forecast off by " in line and run.data.tags["dinox.verify_verdict"] == "UNDECIDED", line


def _verify_run(trial: str, ips: float, error: float) -> TrialRecord:
    metrics = {"verify_images_per_s": ips, "forecast_error": error}
    return TrialRecord("v1", "0", "verify", {}, metrics, {"dinox.role": "verify", "dinox.verifies": trial})


def test_a_verification_on_a_moved_box_widens_the_range_but_is_not_planned_with():
    """verify's UNDECIDED (its check windows outside the trial's: the slice ran on another box than the windows):
    real training's rate, outside the windows' range, widens the range the verdict is read over, and the forecast
    stays the windows' own; every place that prints it says so."""
    rows = study.study()
    b = budget.Budget(days=15, dataset_size=study.DATASET, epochs=study.EPOCHS)
    best = rows[0]["run_id"]  # ViT-L 48x4: windows 23.42-23.66 img/s
    moved = _verify_run(best, 19.0, 0.24)
    moved.tags["dinox.verify_moved"] = "true"
    d = decide.decide(study.records(rows), b, verified={best: moved})
    c = next(c for m in d.models for c in m.candidates if c.run_id == best)
    assert c.measured_ips == pytest.approx(23.54, abs=0.01) and c.windows_ips is None
    assert c.forecast_unit == "img/s (windows)"
    assert c.slow_ips == 19.0 and c.fast_ips == pytest.approx(23.66, abs=0.01) and c.widened
    assert c.range_ends == "rate measured in windows or real training"
    assert c.days_slow == pytest.approx(b.days_for(19.0, c.epoch_boundary_s, c.routine.seconds))
    assert c.verified.describe().startswith("undecided: forecast off by 24.0% (verify run v1")
    md = report.render_markdown(d, [])
    assert "(not planned with, the box having moved: its rate only widens the range)" in md
    # Its real rate stands at the slow end of columns headed as windows: each says it is not a window's.
    large = next(m for m in d.models if c in m.candidates)
    assert large.real_ends() == (True, False)
    row = next(ln for ln in report.render_terminal(d).splitlines() if ln.startswith(large.name[:20]))
    assert row.endswith("(slowest: real training's rate, outside its windows)"), row
    assert f"| 19.0 (real training)-{large.span.fast_ips:.1f} |" in report.render_note(d)
    assert f": 19.00 (real training)-{c.fast_ips:.2f} |" in md  # the trial's row: its windows' count, then the range
    # The tied trial's real rate is the span's slow end, though the plan is another's: every margin says so.
    assert large.best.run_id != best and large.range_ends == "rate measured in windows or real training"
    assert "even at the slowest rate measured in windows or real training (19.0 img/s" in d.reason, d.reason
    assert "- Margin: at the slowest rate measured in windows or real training, 19.0 img/s" in md
    others = [m for m in d.models if m is not large and m.span is not None]
    assert others and all(m.real_ends() == (False, False) for m in others)


def test_decide_plans_with_the_real_rate_only_outside_the_windows_range():
    rows = study.study()
    b = budget.Budget(days=15, dataset_size=study.DATASET, epochs=study.EPOCHS)
    best = rows[0]["run_id"]  # ViT-L 48x4, the leader: windows 23.42-23.66 img/s
    inside = decide.decide(study.records(rows), b, verified={best: _verify_run(best, 23.5, 0.02)})
    large = next(m for m in inside.models if m.name.startswith("vit_large"))
    assert large.lead.run_id == best and large.lead in large.tied  # tied with 64x4, the plan's
    assert large.lead.verified.describe().startswith("forecast held within 2.0% (verify run v1")
    assert large.lead.measured_ips == pytest.approx(23.54) and large.lead.windows_ips is None
    slower = decide.decide(study.records(rows), b, verified={best: _verify_run(best, 19.0, 0.24)})
    large = next(m for m in slower.models if m.name.startswith("vit_large"))
    assert large.lead.run_id != best  # 19 img/s real: now behind the 64x4 trial, which leads
    # Its range (19-23.66) still overlaps 64x4's: tied, and the tie's slowest, planned at what real training
    # ran, is the one recommended (its forecast is the one held against training).
    assert large.best.run_id == best and large.days == large.best.days
    planned = next(c for c in large.candidates if c.run_id == best)
    assert planned.measured_ips == 19.0 and planned.windows_ips == pytest.approx(23.54)
    assert planned.slow_ips == 19.0 and "off by 24.0%" in planned.verified.describe()
    assert "off by 24.0%" in report.render_markdown(slower, [])
    # Wherever the figure is printed, it says it is real training's, and the range's ends what they are of.
    slower_md = report.render_markdown(slower, [])
    assert "Forecast: 19.0 img/s (real training) -> **" in slower_md and "19.0 img/s (windows)" not in slower_md
    assert "at the slowest rate measured in windows or real training" in slower_md
    held = decide.decide(study.records(rows), b, verified={best: _verify_run(best, 23.0, 0.02)})
    said = "forecast 23.0 img/s (real training) -> 12.3 days; even at the slowest rate measured in windows or real "
    assert held.recommended.best.run_id == best and said in held.reason, held.reason
    md = report.render_markdown(held, [])
    assert "- Forecast: 23.0 img/s (real training) -> **12.3 days**" in md
    assert "- Margin: at the slowest rate measured in windows or real training, 23.0 img/s" in md
    assert "23.0 img/s (windows)" not in md  # real training's figure, never printed as a window's
    said = "(tied with 1: planned at the slowest) (forecast and slowest: real training's rate, outside its windows)"
    assert said in report.render_terminal(held)
    assert "| 23.0 (real training) | 23.0 (real training)-23.6 |" in report.render_note(held)
    assert "forecast 23.5 img/s (windows)" in decide.decide(study.records(rows), b).reason  # unverified: windows
    giant = "vit_giant-32x8-w4-True-ok"  # NO-GO at 5.37-5.43 img/s; trained at 4.0: its needs row says whose
    trained = decide.decide(study.records(rows), b, verified={giant: _verify_run(giant, 4.0, 0.3)})
    md = report.render_markdown(trained, [])
    assert "| an unnamed device | 4.0 (real training) | 18.9 | 4.72x |" in md


def _is_verify_child(p) -> bool:
    import psutil

    try:
        return "dinox.measure.verify" in p.cmdline()
    except psutil.Error:
        return False


def test_ctrl_c_while_training_ends_the_child_and_records_nothing(measured):
    """A Ctrl-C at the terminal mid-slice: exit 130, the training child and its process group gone, no verify
    run half-written into the store."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    work, trial = measured
    proc = subprocess.Popen(
        [sys.executable, "-m", "dinox", "verify", "spec.yaml", "--run-id", trial.info.run_id, "--minutes", "5"],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as from a terminal
    )
    deadline, child = time.time() + 120, None
    while child is None and time.time() < deadline:  # the training child, in a session of its own
        # Among this command's own descendants: another test's verify may run beside it (pytest-xdist), and
        # a CI run once found that one, still running, here.
        with contextlib.suppress(psutil.Error):
            child = next((p for p in psutil.Process(proc.pid).children(recursive=True) if _is_verify_child(p)), None)
        time.sleep(0.1)
    assert child is not None
    time.sleep(3)  # inside the slice
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted by SIGINT" in err and "Traceback" not in err, out + err
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    before = {r.info.run_id for r in client.search_runs(["1"], "tags.`dinox.role` = 'verify'")}
    assert all(client.get_run(r).info.start_time < child.create_time() * 1000 for r in before)


def test_a_hostile_decision_folder_reaches_the_terminal_inert(measured):
    work, _trial = measured
    proc = run_dinox(["verify", "spec.yaml", "--decision", "no\x1b[2Jwhere"], cwd=work)
    assert proc.returncode == 2 and "\x1b" not in proc.stderr, proc.stderr
    # Refused before verify runs, the value shown with its escape (every command's rule: tests/cli/test_hostile.py).
    assert "Invalid value for '--decision': 'no\\x1b[2Jwhere' holds the control character" in proc.stderr


def test_a_decision_json_s_verdict_reaches_the_terminal_on_one_line(tmp_path):
    """A decision folder is a file anyone may have written (a shared out/): its verdict, shown when it recommends
    nothing, is one inert line, never a line of its own that reads as dinox's."""
    (tmp_path / "s.yaml").write_text(TINY.format(name="v"))
    (tmp_path / "d").mkdir()
    forged = {"verdict": "GO\nerror: forged\r\x1b[2J", "recommended": None}
    (tmp_path / "d" / "decision.json").write_text(json.dumps(forged))
    proc = run_dinox(["verify", "s.yaml", "--decision", "d"], cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "\x1b" not in proc.stderr and "\r" not in proc.stderr, proc.stderr
    said = "error: d/decision.json: the decision recommends nothing (verdict GO error: forged"
    assert proc.stderr.startswith(said), proc.stderr


def test_a_sweep_measured_with_set_is_named_with_it_in_every_command_that_follows(tmp_path):
    """A trial of `dinox run SPEC --set K=V` is SPEC's with the override: its id is not SPEC's own. The trial
    records the --set, decide's commands carry it, and verify (like head-to-head) takes it; without it,
    verify said "the spec changed since" and decide's `dinox run SPEC` would have measured other trials."""
    (tmp_path / "spec.yaml").write_text(SPEC + "budget: {days: 1, target_images: 100}\n")
    sweep = run_dinox(["run", "spec.yaml", "--set", "measure.bench_steps=2", "--no-system-metrics"], cwd=tmp_path)
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    (trial,) = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_runs(["1"], "tags.`dinox.role` = 'trial'")
    assert trial.data.tags["dinox.sets"] == "measure.bench_steps=2" and trial.data.params["measure.bench_steps"] == "2"
    gate = run_dinox(["decide", "--spec", "spec.yaml", "--no-log"], cwd=tmp_path)
    assert gate.returncode in (0, 3), gate.stdout + gate.stderr
    report_md = (tmp_path / "decision" / "report.md").read_text()
    assert "`dinox verify spec.yaml --set measure.bench_steps=2`" in report_md, report_md
    slice_ = ["--run-id", trial.info.run_id, "--minutes", "0.02", "--epoch-images", "16"]
    bare = run_dinox(["verify", "spec.yaml", *slice_], cwd=tmp_path)
    assert bare.returncode == 2 and "Traceback" not in bare.stderr, bare.stderr
    assert "it was measured with --set measure.bench_steps=2: give the same here" in bare.stderr, bare.stderr
    given = run_dinox(["verify", "spec.yaml", *slice_, "--set", "measure.bench_steps=2"], cwd=tmp_path)
    assert given.returncode in (0, 1, 3), given.stdout + given.stderr  # trained: held, off or undecided, answers all
    assert given.stdout.startswith("dinox: verifying "), given.stdout
