"""Merging the results of a trial's ranks: global throughput, the slowest rank's pace, status rules."""

from __future__ import annotations

import pytest

from dinox.contract import TrialResult
from dinox.isolate import ranks


def rank(ips: float, window: float, peak: float, status: str = "ok", error: str = "", unstable: bool = False):
    metrics = {
        "images_per_s": ips,
        "window_s": window,
        "peak_mem_allocated_gb": peak,
        "step_s_p50": window / 10,
        "step_s_p90": window / 8,
        "data_s": 0.01,
        "images_per_s_min": ips * 0.9,
        "images_per_s_max": ips,
    }
    tags = {"dinox.device": "cpu", "dinox.unstable": str(unstable).lower()}
    return TrialResult(
        status,
        error=error,
        bound="compute_bound" if status == "ok" else "",
        metrics=metrics,
        tags=tags,
        step_s=[window / 10] * 10,
    )


def test_global_throughput_is_all_images_over_the_slowest_window():
    merged = ranks.merge({0: rank(100.0, 1.0, 2.0), 1: rank(80.0, 1.25, 3.0, unstable=True)}, 2, "crashed", "")
    m = merged.metrics
    assert merged.status == "ok"
    assert m["images_per_s"] == pytest.approx((100 * 1.0 + 80 * 1.25) / 1.25)  # 200 images in 1.25 s
    assert m["window_s"] == 1.25 and m["step_s_p50"] == 0.125  # the slowest rank's pace
    assert m["peak_mem_allocated_gb"] == 3.0  # the largest rank
    assert (m["rank0_images_per_s"], m["rank1_images_per_s"]) == (100.0, 80.0)
    assert (m["rank0_peak_mem_allocated_gb"], m["rank1_peak_mem_allocated_gb"]) == (2.0, 3.0)
    assert merged.tags["dinox.world_size"] == "2" and merged.tags["dinox.unstable"] == "true"


def test_every_rate_is_summed_over_the_ranks_and_the_costs_are_the_slowest_rank_s():
    """The loader alone and the ablation rates, like images_per_s, are each rank's own part of the trial."""
    a, b = rank(100.0, 1.0, 2.0), rank(80.0, 1.25, 3.0)
    for r, (alone, no_loader) in ((a, (300.0, 120.0)), (b, (280.0, 110.0))):
        r.metrics.update(loader_images_per_s=alone, images_per_s_no_loader=no_loader, loader_cost=1 - 80 / no_loader)
    m = ranks.merge({0: a, 1: b}, 2, "crashed", "").metrics
    assert m["loader_images_per_s"] == 580.0 and m["images_per_s_no_loader"] == 230.0
    assert m["loader_cost"] == pytest.approx(1 - 80 / 110)  # the slowest rank's, as its bound


def test_each_rank_gets_its_share_of_the_cores_not_torchrun_s_one_thread():
    from dinox.isolate.slots import rank_threads

    assert rank_threads(2, {"DINOX_CORES": "0-7"}, {}) == {"OMP_NUM_THREADS": "4"}
    assert rank_threads(4, {"DINOX_CORES": "0-1"}, {}) == {"OMP_NUM_THREADS": "1"}
    assert rank_threads(2, {}, {"OMP_NUM_THREADS": "3"}) == {}  # the user's own setting stands
    assert rank_threads(1, {}, {}) == {}


def test_one_rank_oom_makes_the_trial_oom_even_when_another_left_nothing():
    merged = ranks.merge({0: None, 1: rank(0, 1, 1, "oom", "CUDA out of memory")}, 2, "crashed", "exit 1")
    assert merged.status == "oom"
    assert merged.error == "rank 1: CUDA out of memory; rank(s) 0 stopped by torchrun"


def test_an_error_outranks_nothing_but_an_oom():
    merged = ranks.merge({0: rank(1, 1, 1, "error", "ValueError: x"), 1: rank(1, 1, 1, "oom", "oom")}, 2, "crashed", "")
    assert merged.status == "oom"
    merged = ranks.merge({0: rank(1, 1, 1), 1: rank(1, 1, 1, "error", "ValueError: x")}, 2, "crashed", "")
    assert (merged.status, merged.error) == ("error", "rank 1: ValueError: x")


@pytest.mark.parametrize("status", ["crashed", "timeout"])
def test_a_rank_without_a_result_is_the_runner_s_status(status):
    merged = ranks.merge({0: rank(1, 1, 1), 1: None}, 2, status, "rank 1 killed by SIGKILL")
    assert merged.status == status
    assert merged.error == "rank(s) 1 left no result: rank 1 killed by SIGKILL"


TORCHRUN_REPORT = """\
Failures:
[1]:
  time      : 2026-11-21_16:55:36
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 5147)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 5147
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-21_16:55:36
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 5146)
"""


def test_a_rank_killed_by_a_signal_is_the_cause_not_its_peer_s_connection_error():
    # torchrun's own report, as it printed it when rank 1 was SIGKILLed mid-step: it names rank 0 the root
    # cause, because rank 0's collective failed first as seen from the agent.
    exits = ranks.exit_codes(TORCHRUN_REPORT)
    assert exits == {1: -9, 0: 1}
    peer = rank(0, 1, 1, "error", "RuntimeError: [gloo] Read error: Connection reset by peer")
    merged = ranks.merge({0: peer, 1: None}, 2, "crashed", "exit 1", exits)
    assert merged.status == "crashed"
    assert merged.error == "rank 1 killed by SIGKILL; rank 0: RuntimeError: [gloo] Read error: Connection reset by peer"
    # Ranks torchrun itself stopped (SIGTERM) after a real error are not a cause.
    merged = ranks.merge({0: rank(1, 1, 1, "error", "ValueError: x"), 1: None}, 2, "crashed", "", {0: 1, 1: -15})
    assert merged.status == "error"


def test_every_trial_metric_merges_by_the_rule_the_record_declares():
    """Each trial metric of the record, on two ranks (rank 1 the slower): summed, the larger, their mean, the
    slower rank's, or the images over the slower window, as rec.RANKS says; and rank{r}_ figures for PER_RANK."""
    from dinox import record as rec

    trial_metrics = [n.name for n in rec.NAMES.values() if n.kind == "metric" and n.run == "trial"]
    assert sorted(rec.RANKS) == sorted(trial_metrics)
    # rank 0: every metric 1.0 but a 2 s window; rank 1: every metric 3.0 (a larger value) but a 4 s window
    # (the slower rank) and a smaller peak memory than rank 0 on one figure, to tell "max" from "slowest".
    low = {name: 1.0 for name in trial_metrics} | {rec.WINDOW_S: 2.0, rec.PEAK_MEM_RESERVED_GB: 9.0}
    high = {name: 3.0 for name in trial_metrics} | {rec.WINDOW_S: 4.0}
    merged = ranks.merge({0: TrialResult("ok", metrics=low), 1: TrialResult("ok", metrics=high)}, 2, "crashed", "")
    m = merged.metrics
    for name, rule in rec.RANKS.items():
        expected = {
            "pace": (1.0 * 2.0 + 3.0 * 4.0) / 4.0,
            "sum": low[name] + high[name],
            "max": max(low[name], high[name]),
            "mean": (low[name] + high[name]) / 2,
            "slowest": high[name],
        }[rule]
        assert m[name] == pytest.approx(expected), (name, rule)
    for r, source in ((0, low), (1, high)):
        for name in rec.PER_RANK:
            assert m[rec.per_rank(r, name)] == source[name] and rec.known(rec.per_rank(r, name), "metric")


def test_every_verify_metric_merges_by_the_rule_the_record_declares():
    """`dinox verify` of a 2-rank trial: the slower rank's slice (the longer verify_wall_s), its counts already
    global; the check windows' rates, each rank's own part, summed; memory the larger. Every figure the verify
    child writes has a rule (rec.VERIFY_RANKS). A rank on another device than the trial's: nothing trained."""
    from dinox import record as rec
    from dinox.verify.run import _KEPT

    assert set(_KEPT) == set(rec.VERIFY_RANKS)  # what the verify run keeps is what a merge combines
    low = {name: 1.0 for name in rec.VERIFY_RANKS} | {rec.VERIFY_WALL_S: 2.0, rec.PEAK_MEM_RESERVED_GB: 9.0}
    high = {name: 3.0 for name in rec.VERIFY_RANKS} | {rec.VERIFY_WALL_S: 4.0}
    tags = {rec.VERIFY_EPOCHS: "[]"}
    merged = ranks.merge(
        {0: TrialResult("ok", metrics=low, tags=tags), 1: TrialResult("ok", metrics=high, tags=tags)}, 2, "crashed", ""
    )
    assert merged.status == "ok" and merged.tags[rec.WORLD_SIZE] == "2"
    for name, rule in rec.VERIFY_RANKS.items():
        expected = {"sum": low[name] + high[name], "max": max(low[name], high[name]), "slowest": high[name]}[rule]
        assert merged.metrics[name] == pytest.approx(expected), (name, rule)
    assert not any(name.startswith("rank") for name in merged.metrics)  # no trial figures invented
    other = TrialResult("skipped", error="this machine trains on A, the trial was measured on B: ...")
    assert ranks.merge({0: other, 1: other}, 2, "crashed", "").error == other.error
