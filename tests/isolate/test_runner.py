"""Trials in real child processes: ok, error, abort, hang. Faults are real signals, not mocks."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from dinox.isolate import process_tree, runner
from dinox.plan import grid
from dinox.spec import file as spec_file
from tests.conftest import TINY


def one_trial(write_spec, extra: str = "", name: str = "r"):
    (trial,) = grid.expand(spec_file.load(write_spec(TINY.format(name=name) + extra)))
    return trial


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def later(delay: float, fn):
    """on_spawn callback that acts on the child after `delay` seconds, from another thread."""
    pids: list[int] = []

    def on_spawn(pid: int) -> None:
        pids.append(pid)
        threading.Timer(delay, fn, args=(pid,)).start()

    return on_spawn, pids


def test_ok_trial_with_workers_measures_and_leaves_no_process(write_spec, tmp_path):
    trial = one_trial(write_spec, "loader: {num_workers: 2, persistent_workers: true}\n")
    pids: list[int] = []
    outcome = runner.run_trial(trial, tmp_path / "t", on_spawn=pids.append)
    r, m = outcome.result, outcome.result.metrics
    assert r.status == "ok", r.error
    assert r.bound in ("compute_bound", "io_bound") and r.tags["dinox.step_clock"] == "host"
    assert r.tags["dinox.bound_rule"] == "host_timers"  # TINY turns the ablation windows off
    assert "dinox.window_clocks" not in r.tags  # a CPU has no SM clock: nothing said of one
    assert len(r.step_s) == 2  # the intervals between the 3 timed steps' ends
    assert m["images_per_s"] == pytest.approx(3 * 4 / m["window_s"])
    assert m["step_s_p50"] <= m["step_s_p90"]
    # On the CPU the device is the host: a step's period holds its fetch (data_s), copy and compute spans, and
    # the gap where the loop ran its own few lines. Only that they fit is promised on a real clock: on a loaded
    # box a preemption can fall in the gap. (That nothing else is in a period: tests/measure, on a fake clock.)
    assert m["data_s"] + m["h2d_s"] + m["compute_s"] <= sum(r.step_s) / 2 * (1 + 1e-6)
    assert m["h2d_s"] + m["compute_s"] < sum(r.step_s) / 2
    # The child's phases, each timed by its own clock, fit inside the measurement. What is not a phase (the
    # untimed wait for idle workers before the epoch start, the loop's bookkeeping) is no promise on a loaded
    # box, whose workers may wait out others' time slices; that no phase is left out: tests/measure, on a fake
    # clock. (Starting the loader's workers is its own figure: under load it can take longer than the steps.)
    parts = m["loader_start_s"] + m["warmup_s"] + m["settle_s"] + m["window_s"] + m["epoch_start_s"]
    assert m["settle_s"] > 0 and m["epoch_start_s"] > 0
    assert parts <= m["measure_s"] + 0.002  # wall-clock marks against perf_counter spans: a clock's grain
    assert r.tags["dinox.unstable"] == "false"  # one window cannot disagree with itself
    assert m["startup_s"] + m["setup_s"] + m["measure_s"] < m["trial_wall_s"]
    assert 0 < m["params_m"] < 10
    assert m["host_peak_rss_gb"] >= m["child_peak_rss_gb"] > 0.1
    assert r.tags["dinox.device"] == "cpu" and r.tags["dinox.torch_version"]
    assert group_gone(pids[0]) and not psutil.pid_exists(pids[0])


def test_exception_in_trial_is_error_with_message(write_spec, tmp_path, fork_server):
    t = one_trial(write_spec, "")
    bad = t.spec.model_copy(update={"model": t.spec.model.model_copy(update={"name": "vit_tinny_patch16_224"})})
    trial = grid.Trial(0, 1, {}, bad, "x")
    r = runner.run_trial(trial, tmp_path / "t", server=fork_server).result
    assert r.status == "error"
    assert "unknown timm model 'vit_tinny_patch16_224'" in r.error and "vit_tiny_patch16_224" in r.error


@pytest.mark.parametrize(
    ("sig", "report"), [(signal.SIGABRT, "Fatal Python error: Aborted"), (signal.SIGSEGV, "Segmentation fault")]
)
def test_dying_child_is_crashed_with_its_stderr_tail(write_spec, tmp_path, sig, report):
    trial = one_trial(write_spec)
    on_spawn, pids = later(1.0, lambda pid: os.kill(pid, sig))
    outcome = runner.run_trial(trial, tmp_path / "t", on_spawn=on_spawn)
    r = outcome.result
    assert r.status == "crashed"
    assert f"child killed by {sig.name}" in r.error
    assert report in r.error  # faulthandler's report, from the child's log
    assert r.metrics["trial_wall_s"] < trial.spec.measure.timeout_s  # seen as it died, not at the timeout
    assert group_gone(pids[0])


def test_hung_child_is_timeout_and_killed(write_spec, tmp_path):
    trial = one_trial(write_spec, "").spec
    trial = trial.model_copy(update={"measure": trial.measure.model_copy(update={"timeout_s": 3.0})})
    # SIGSTOP freezes the child for real: it can neither finish nor answer SIGTERM.
    on_spawn, pids = later(0.5, lambda pid: os.kill(pid, signal.SIGSTOP))
    t0 = time.time()
    r = runner.run_trial(grid.Trial(0, 1, {}, trial, "x"), tmp_path / "t", on_spawn=on_spawn).result
    assert r.status == "timeout"
    assert "no result after measure.timeout_s=3s" in r.error
    assert 3.0 <= time.time() - t0 < 3.0 + process_tree.TERM_GRACE_S + 5
    assert group_gone(pids[0])


def test_mixed_precision_channels_last_and_checkpointing_run(write_spec, tmp_path, fork_server):
    extra = (
        "precision: fp16-mixed\nsweep:\n  cases:\n    - {model.channels_last: true, model.grad_checkpointing: true}\n"
        "    - {precision: bf16-mixed, optimizer.name: sgd, optimizer.momentum: 0.8}\n"
    )
    for trial in grid.expand(spec_file.load(write_spec(TINY.format(name="prec") + extra))):
        r = runner.run_trial(trial, tmp_path / str(trial.index), server=fork_server).result
        assert r.status == "ok", r.error
        assert r.metrics["loss"] == pytest.approx(r.metrics["loss"])  # finite, not NaN


def test_compile_time_is_measured_apart_from_the_timed_steps(write_spec, tmp_path, fork_server):
    # One transformer block: inductor compiles it (C++ on this CPU) in about 20 s cold, ResNet-18 in 40.
    text = TINY.format(name="comp").replace("kwargs: {patch_size: 8}", "kwargs: {patch_size: 8, depth: 1}")
    (trial,) = grid.expand(spec_file.load(write_spec(text + "sweep: {cases: [{model.compile: true}]}\n")))
    r = runner.run_trial(trial, tmp_path / "t", server=fork_server).result
    assert r.status == "ok", r.error
    m = r.metrics
    # Compilation lands in warm-up, never in the timed windows: dynamo's own graph count says so, where a
    # time would not (a warm inductor cache compiles in about a step on a loaded box: CI's 1.4 s vs 0.63 s).
    assert m["compile_graphs"] >= 1 and m["recompiles_in_windows"] == 0
    # compile_s is the first step less its waits for batches (workers starting) and less an ordinary step.
    assert m["compile_s"] == pytest.approx(max(0.0, m["first_step_s"] - m["first_fetch_s"] - m["step_s_p50"]))
    assert len(r.step_s) == 2  # the intervals between the 3 timed steps' ends: the warm-up steps are not among them


def test_corrupt_png_at_run_time_fails_that_trial_naming_the_file(write_spec, tmp_path, fork_server):
    from dinox.data.dicom_preprocess import preprocess
    from tests.data.test_dicom_preprocess import demo

    demo.write_series(tmp_path / "dicom" / "P1", slices=3, rows=32, cols=32)
    preprocess(tmp_path / "dicom", tmp_path / "png", progress=False)
    victim = sorted((tmp_path / "png").rglob("00001.png"))[0]
    victim.write_bytes(victim.read_bytes()[:50])
    extra = (
        f"data: {{source: ct_png, index_csv: {tmp_path / 'png' / '_index' / 'index.csv'}}}\n"
        "loader: {num_workers: 1}\nsweep: {cases: [{batch.size: 3}]}\n"
    )
    (trial,) = grid.expand(spec_file.load(write_spec(TINY.format(name="corrupt") + extra)))
    r = runner.run_trial(trial, tmp_path / "t", server=fork_server).result
    assert r.status == "error"
    assert f"cannot decode {victim}" in r.error  # raised in the loader worker, named in the trial's status


def _png_header(width: int, height: int) -> bytes:
    """A PNG that declares width x height 16-bit grey pixels and holds almost none."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 16, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def test_a_decompression_bomb_is_an_error_naming_the_file_with_every_decoder(write_spec, tmp_path, fork_server):
    """A PNG declaring 50000x50000: PIL refuses it, torchvision.io allocated what it said (7.8 GB, recorded as
    an OOM that pruned the larger batches). The same limit for both: an error naming the file, at once."""
    from dinox.data.dicom_preprocess import preprocess
    from tests.data.test_dicom_preprocess import demo

    demo.write_series(tmp_path / "dicom" / "P1", slices=3, rows=32, cols=32)
    preprocess(tmp_path / "dicom", tmp_path / "png", progress=False)
    victim = sorted((tmp_path / "png").rglob("00001.png"))[0]
    victim.write_bytes(_png_header(50000, 50000))
    for decoder in ("torchvision", "pil"):
        extra = (
            f"data: {{source: ct_png, index_csv: {tmp_path / 'png' / '_index' / 'index.csv'}, decoder: {decoder}}}\n"
            "sweep: {cases: [{batch.size: 3}]}\n"
        )
        (trial,) = grid.expand(
            spec_file.load(write_spec(TINY.format(name=f"bomb{decoder}") + extra, f"{decoder}.yaml"))
        )
        r = runner.run_trial(trial, tmp_path / decoder, server=fork_server).result
        assert r.status == "error", (decoder, r.status, r.error)
        assert f"cannot decode {victim}" in r.error and ("50000x50000" in r.error or "bomb" in r.error), r.error
        assert r.metrics.get("peak_mem_reserved_gb", 0) < 2  # never allocated


class _CountingMemory(process_tree.TreeMemory):
    looks = 0

    def maybe_sample(self, now: float, force: bool = False) -> None:
        self.looks += 1


@pytest.mark.parametrize("forked", [False, True], ids=["spawned", "forked"])
def test_the_watch_sleeps_until_the_child_exits_not_a_poll_interval(tmp_path, forked, monkeypatch):
    """The parent looks at a running trial four times a second, not twenty (each look takes a core from the
    trial), and still sees its exit at once: with a tick of 60 s, a child living half a second is seen to end
    long before the first tick (a watch that slept its tick would take a minute)."""
    import subprocess
    import sys

    from dinox.isolate.forkserver import ForkServer

    code = "import time; time.sleep(0.5)"
    (tmp_path / "child.py").write_text(f"def run_child(trial, result, forked):\n    {code}\n    return 0\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    server = ForkServer(preload=()) if forked else None
    try:
        if server is not None:
            proc = server.spawn("t.json", "r.json", str(tmp_path / "log"), module="child")
        else:
            proc = subprocess.Popen([sys.executable, "-c", code])
        memory = _CountingMemory(proc.pid)
        phase = runner._PhaseReader(tmp_path / "phase", None)
        started = time.time()
        timed_out = runner._watch(proc, memory, phase, [tmp_path / "none"], started + 600, poll_s=60.0)
        assert not timed_out and proc.poll() == 0
        assert time.time() - started < 30, "the watch slept its tick instead of waking on the exit"
        assert memory.looks <= 2
    finally:
        if server is not None:
            server.close()


@pytest.mark.parametrize("forked", [False, True], ids=["spawned", "forked"])
def test_the_watch_waits_on_a_pidfd_numbered_past_select_s_limit(tmp_path, forked, monkeypatch):
    """A parent holding many files (a store's connections, a long sweep's logs) may number a pidfd or the fork
    server's pipe past 1024, where select() refuses it (ValueError): the watch and the fork server's replies
    are still waited on, and the exit is seen."""
    import resource
    import subprocess
    import sys

    from dinox.isolate.forkserver import ForkServer

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this process may open {hard} files, too few to reach past 1024")
    (tmp_path / "child.py").write_text("def run_child(trial, result, forked):\n    return 0\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100 - len(os.listdir("/proc/self/fd")))]
    server = ForkServer(preload=()) if forked else None
    try:
        if server is not None:
            proc = server.spawn("t.json", "r.json", str(tmp_path / "log"), module="child")
        else:
            proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
        memory = _CountingMemory(proc.pid)
        phase = runner._PhaseReader(tmp_path / "phase", None)
        assert not runner._watch(proc, memory, phase, [tmp_path / "none"], time.time() + 600, poll_s=60.0)
        assert proc.poll() == 0 and memory.looks <= 2
    finally:
        if server is not None:
            server.close()
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
