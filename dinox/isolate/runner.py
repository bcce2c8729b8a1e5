"""Run each trial in its own child process, with a hard timeout, and always come back with a status.

The child is started in a new session (its own process group), so a timeout or an interrupt can end it
together with its DataLoader workers, and a Ctrl-C at the terminal reaches only the parent, which then
ends the child deliberately. The parent samples the memory of the whole process tree while it waits.
MLflow is never imported here: this module returns TrialResults; tracking records them.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from dinox import record as rec
from dinox.contract import GIB, PHASE_FILE, PROFILE_CUT, PROVISIONAL_FILE, TrialResult, one_line
from dinox.errors import WorkdirError
from dinox.isolate import lifeline, ranks
from dinox.isolate.contention import omp_env
from dinox.isolate.forkserver import ForkedChild, ForkServer, pidfd
from dinox.isolate.process_tree import TreeMemory, kill_group
from dinox.isolate.slots import rank_threads
from dinox.plan.grid import Trial

# After the child has written its result it gets this long to exit before its group is killed: a hang in
# interpreter teardown (a stuck loader worker, a driver) must not turn a measured trial into a timeout.
EXIT_GRACE_S = 15.0
STDERR_TAIL_LINES = 8
# How often the parent looks at a running trial (its memory, phase, result file) where it can sleep on the
# trial's exit: 4 times a second, where the 20 Hz poll before took 5 ms of CPU a second from the trial.
WATCH_TICK_S = 0.25


@dataclass
class ChildOutcome:
    result: TrialResult
    log_path: Path


def _tail(path: Path, lines: int = STDERR_TAIL_LINES) -> str:
    """What the child said last, or, after a fatal signal, faulthandler's headline and innermost frames."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    kept = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for i, line in enumerate(kept):
        if line.startswith("Fatal Python error"):
            frames = [ln for ln in kept[i + 1 :] if ln.startswith("File ")][:3]
            return " | ".join([line, *frames])
    return " | ".join(kept[-lines:])


def _death(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = " (the kernel OOM killer sends this)" if name == "SIGKILL" else ""
        return f"child killed by {name}{hint}"
    return f"child exited with code {returncode}"


class _PhaseReader:
    """Passes the trial's phase file on to `on_phase` when it changes, looking at most 5 times a second."""

    def __init__(self, path: Path, on_phase: Callable[[str], None] | None):
        self.path, self.on_phase = path, on_phase
        self.seen, self.next_look = "", 0.0

    def poll(self, now: float) -> None:
        if self.on_phase is None or now < self.next_look:
            return
        self.next_look = now + 0.2
        try:
            text = self.path.read_text()[:80]
        except OSError:
            return
        if text and text != self.seen:
            self.seen = text
            self.on_phase(text)


def _watch(
    proc: Any, memory: TreeMemory, phase: _PhaseReader, results: list[Path], deadline: float, poll_s: float
) -> bool:
    """Wait for the child to exit, or EXIT_GRACE_S after its result(s) appeared, or past `deadline` without
    one (then True: timed out), sampling its memory and passing its phase on meanwhile."""
    result_seen_at: float | None = None
    exit_fd = pidfd(proc.pid)  # a forked trial is the fork server's child, not ours, and still has one
    # Asleep on the child's pidfd between looks, so its exit is seen at once (the teardown figure stays
    # exact) and the looks can be rare: every wakeup of this process takes a core from the trial it watches.
    tick = max(poll_s, WATCH_TICK_S) if exit_fd is not None else poll_s
    try:
        while proc.poll() is None:
            now = time.time()
            memory.maybe_sample(now)
            phase.poll(now)
            if result_seen_at is None and all(p.exists() for p in results):
                result_seen_at = now
                # Once more while every process of the trial still holds its memory: a short trial may have
                # ended between two samples of the adaptive interval.
                memory.maybe_sample(now, force=True)
            if result_seen_at is not None and now - result_seen_at > EXIT_GRACE_S:
                return False
            if result_seen_at is None and now > deadline:
                return True
            if _ended(exit_fd, tick):
                # A forked trial's exit status comes from the fork server a moment after the exit itself.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5.0)
                return False
    finally:
        if exit_fd is not None:
            os.close(exit_fd)
    return False


def _ended(exit_fd: int | None, timeout: float) -> bool:
    """Wait up to `timeout`; True when the process behind `exit_fd` ended meanwhile (without one: sleep)."""
    if exit_fd is None:
        time.sleep(timeout)
        return False
    waiting = select.poll()  # not select(): a parent holding many files may number this fd past 1024
    waiting.register(exit_fd, select.POLLIN)
    return bool(waiting.poll(timeout * 1000))


def _result(
    trial_dir: Path,
    result_path: Path,
    rank_paths: list[Path],
    log_path: Path,
    timed_out: bool,
    timeout: float,
    returncode: int,
) -> TrialResult:
    """The child's result (all ranks' merged), or what its death says: timeout or crashed."""
    if rank_paths:
        missing = "timeout" if timed_out else "crashed"
        why = f"no result after measure.timeout_s={timeout:g}s" if timed_out else _death(returncode)
        by_rank = {r: _read_result(p) for r, p in enumerate(rank_paths)}
        exits = ranks.exit_codes(log_path.read_text(errors="replace")[-65536:])
        result = ranks.merge(by_rank, len(rank_paths), missing, one_line(f"{why}; {_tail(log_path)}"), exits)
    else:
        result = _read_result(result_path)
    if result is not None:
        return result
    if not rank_paths and (kept := _read_result(trial_dir / PROVISIONAL_FILE)) is not None:
        why = f"measure.timeout_s={timeout:g}s came first" if timed_out else f"the child ended: {_death(returncode)}"
        kept.tags[rec.PROFILE] = json.dumps({"error": f"{PROFILE_CUT} ({why}); the measurement stands"})
        return kept
    _check_writable(trial_dir)  # a child that could not write its result on a full disk did not crash
    tail = _tail(log_path)
    if timed_out:
        return TrialResult("timeout", error=one_line(f"no result after measure.timeout_s={timeout:g}s; {tail}"))
    return TrialResult("crashed", error=one_line(f"{_death(returncode)}; {tail}"))


def run_trial(
    trial: Trial,
    trial_dir: Path,
    on_spawn: Callable[[int], None] | None = None,
    poll_s: float = 0.05,
    server: ForkServer | None = None,
    on_phase: Callable[[str], None] | None = None,
    env: Mapping[str, str] | None = None,
    module: str = "dinox.measure.trial",
    timeout_s: float | None = None,
) -> ChildOutcome:
    """Run one trial in a child process and return what happened to it. Never raises for a bad trial.

    With a fork server the child is forked from a process that has imported torch and timm already;
    without, it is a fresh interpreter (`python -m dinox.measure.trial`). Either way it is a process of its own,
    with `env` (its devices and cores under --devices) added to this process's environment. `module` and
    `timeout_s`: another child on the same trial (`dinox verify`'s, which trains for a slice of its own)."""
    spec_path = trial_dir / "trial.json"
    result_path = trial_dir / "result.json"
    log_path = trial_dir / "child.log"
    phase = _PhaseReader(trial_dir / PHASE_FILE, on_phase)
    timeout = timeout_s if timeout_s is not None else trial.spec.measure.timeout_s
    world = trial.spec.hardware.gpus
    rank_paths = [Path(ranks.result_name(str(result_path), r)) for r in range(world)] if world > 1 else []
    with _workdir(trial_dir):
        trial_dir.mkdir(parents=True, exist_ok=True)
        spec_path.write_text(trial.spec.model_dump_json(indent=2))
        for path in [result_path, *rank_paths, phase.path, trial_dir / PROVISIONAL_FILE]:
            path.unlink(missing_ok=True)
        log = open(log_path, "wb")  # closed below, once the child is gone

    with log:
        spawned_at = time.time()
        if world > 1:
            proc, isolation = _launch_ranks(world, spec_path, result_path, log, env or {}, module), "torchrun"
        else:
            proc, isolation = _launch(module, spec_path, result_path, log, log_path, server, env or {})
        memory = TreeMemory(proc.pid)
        try:
            if on_spawn is not None:
                on_spawn(proc.pid)
            timed_out = _watch(proc, memory, phase, rank_paths or [result_path], spawned_at + timeout, poll_s)
        finally:
            # Also on KeyboardInterrupt: the child and every loader worker go down with us.
            kill_group(proc)
            proc.wait()
        ended_at = time.time()

    result = _result(trial_dir, result_path, rank_paths, log_path, timed_out, timeout, proc.returncode or 0)
    result.tags[rec.ISOLATION] = isolation
    sampled = memory.peak_bytes / GIB
    result.metrics[rec.HOST_PEAK_RSS_GB] = max(sampled, result.metrics.get(rec.CHILD_PEAK_RSS_GB, 0.0))
    _add_timeline(result, spawned_at, ended_at)
    return ChildOutcome(result, log_path)


@contextlib.contextmanager
def _workdir(folder: Path):
    """A trial writes its spec, log and result in the sweep's folder: if that cannot be written (a full
    disk), no trial can run, and the sweep must stop rather than record every trial as crashed."""
    try:
        yield
    except OSError as e:
        raise WorkdirError(e.errno, f"cannot write {folder}: {e.strerror or e}") from e


def _check_writable(folder: Path, size: int = 1 << 18) -> None:
    """Raise WorkdirError when `folder` cannot take a result-sized file (256 KiB) any more."""
    probe = folder / f".space-{os.getpid()}"
    with _workdir(folder):
        try:
            with open(probe, "wb") as f:
                f.write(b"\0" * size)
                f.flush()
                os.fsync(f.fileno())
        finally:
            probe.unlink(missing_ok=True)


def _launch(
    module: str,
    in_path: Path,
    out_path: Path,
    log: BinaryIO,
    log_path: Path,
    server: ForkServer | None,
    env: Mapping[str, str],
) -> tuple[subprocess.Popen | ForkedChild, str]:
    """A child running `module` on in_path -> out_path: forked from the server, else a fresh interpreter."""
    if server is not None:
        try:
            return server.spawn(str(in_path), str(out_path), str(log_path), module=module, env=env), "fork"
        except RuntimeError as e:
            # The server is gone (a broken environment, a kill): this child gets a fresh interpreter
            # instead, and the next one a new server.
            log.write(f"dinox: {e}; running this child in a fresh interpreter\n".encode())
            log.flush()
    proc = subprocess.Popen(
        [sys.executable, "-m", module, str(in_path), str(out_path)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=lifeline.child_env(dict(os.environ, PYTHONUNBUFFERED="1", **omp_env(os.environ), **env)),
    )
    return proc, "spawn"


def _launch_ranks(
    world: int, in_path: Path, out_path: Path, log: BinaryIO, env: Mapping[str, str], module: str
) -> subprocess.Popen:
    """torchrun with `world` ranks of `python -m MODULE` (dinox.measure.trial, or verify's child) on this host; no
    restarts: a failed rank is a result, not something to retry."""
    # torchrun is not dinox code: the lifeline wrapper asks for its death with this process, then execs it;
    # each rank asks for its own with torchrun.
    command = [
        sys.executable,
        "-m",
        "dinox.isolate.lifeline",
        "--",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={world}",
        "--max-restarts=0",
        # Its per-rank folders beside the trial's own files: by default torchrun makes a folder in the temporary
        # directory per launch and never removes it (a shared GPU node collected one per distributed trial).
        f"--log-dir={in_path.parent / 'torchrun'}",
        "-m",
        module,
        str(in_path),
        str(out_path),
    ]
    return subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=lifeline.child_env(
            dict(os.environ, PYTHONUNBUFFERED="1", **omp_env(os.environ), **env, **rank_threads(world, env, os.environ))
        ),
    )


def run_estimate(
    request: dict[str, Any], work_dir: Path, server: ForkServer | None = None, timeout: float = 600.0
) -> tuple[dict[str, Any] | None, str]:
    """Run the meta-device estimate child on `request`; (its result, "") or (None, why not). Never raises."""
    in_path, out_path, log_path = work_dir / "request.json", work_dir / "estimate.json", work_dir / "estimate.log"
    with _workdir(work_dir):
        work_dir.mkdir(parents=True, exist_ok=True)
        in_path.write_text(json.dumps(request))
        out_path.unlink(missing_ok=True)
        log = open(log_path, "wb")  # closed below, once the child is gone
    with log:
        proc = _run_to_end("dinox.measure.estimate", in_path, out_path, log, log_path, server, timeout)
    try:
        return json.loads(out_path.read_text()), ""
    except (OSError, ValueError):
        return None, one_line(f"{_death(proc.returncode) if proc.returncode else 'no result'}; {_tail(log_path)}")


def _run_to_end(
    module: str, in_path: Path, out_path: Path, log: BinaryIO, log_path: Path, server: ForkServer | None, timeout: float
) -> subprocess.Popen | ForkedChild:
    """A helper child (`module` on in_path -> out_path) run until it ends or `timeout`; killed with its group
    either way, and reaped."""
    proc, _isolation = _launch(module, in_path, out_path, log, log_path, server, {})
    deadline = time.time() + timeout
    try:
        while proc.poll() is None and time.time() < deadline:
            time.sleep(0.02)
    finally:
        kill_group(proc)
        proc.wait()
    return proc


def run_entry_check(
    specs: list[dict[str, Any]], groups: list[int] | None = None, timeout: float = 600.0
) -> tuple[list[tuple[int, str, str]], str]:
    """`python -m dinox.measure.entry_check` on these trial specs (`groups`: how many, in order, each spec file
    gave): ([(index, field, what is wrong)], "") or ([], why it gave no answer). Never raises. A spawned child,
    never the fork server: a user's module imported there would be inherited by every trial forked after it."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="dinox-entry-") as tmp:
        work = Path(tmp)
        in_path, out_path, log_path = work / "request.json", work / "result.json", work / "entry.log"
        in_path.write_text(json.dumps({"specs": specs, "groups": groups}))
        with open(log_path, "wb") as log:
            proc = _run_to_end("dinox.measure.entry_check", in_path, out_path, log, log_path, None, timeout)
        try:
            return [(int(i), str(f), str(m)) for i, f, m in json.loads(out_path.read_text())["problems"]], ""
        except (OSError, ValueError, KeyError, TypeError):
            return [], one_line(f"{_death(proc.returncode) if proc.returncode else 'no result'}; {_tail(log_path)}")


def _read_result(path: Path) -> TrialResult | None:
    try:
        return TrialResult.from_json(path.read_text())
    except (OSError, ValueError, TypeError):
        return None


def _add_timeline(result: TrialResult, spawned_at: float, ended_at: float) -> None:
    """Split the child's life: start-up (interpreter + imports), setup, measurement, teardown."""
    m, marks = result.metrics, result.marks
    m[rec.TRIAL_WALL_S] = ended_at - spawned_at
    if "imports_done" in marks:
        m[rec.STARTUP_S] = marks["imports_done"] - spawned_at
    if "setup_done" in marks and "imports_done" in marks:
        m[rec.SETUP_S] = marks["setup_done"] - marks["imports_done"]
    if "measured" in marks and "setup_done" in marks:
        m[rec.MEASURE_S] = marks["measured"] - marks["setup_done"]
    if "result_written" in marks:
        m[rec.TEARDOWN_S] = ended_at - marks["result_written"]
