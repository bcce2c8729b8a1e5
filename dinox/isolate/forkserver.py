"""Cheap isolation: a fork server ("zygote") with torch, timm and the trial code imported once.

Each trial is still its own process: the zygote forks a fresh child per trial, which starts its own
session (so a timeout or an interrupt kills it with its loader workers), sends its output to the trial's
log and runs the trial exactly as ``python -m dinox.measure.trial`` would. The child pays for a fork, not for
importing torch and timm (about 2 s here). The zygote itself runs no trial, never touches a device and never
initialises CUDA (a child initialises its own after the fork), so a trial that crashes, hangs or poisons its
GPU context takes nothing with it. If the zygote dies, the next trial starts a new one. Several children
may run at once (`dinox run --devices`: one zygote serves every slot, each request carrying the child's own
CUDA_VISIBLE_DEVICES and cores); the zygote reaps each as it exits.

Protocol, one JSON object per line: the parent writes ``{"module": ..., "trial": ..., "result": ..., "log":
..., "env": {...}}`` (module: dinox.measure.trial, or dinox.measure.estimate for the meta-device estimates);
the zygote answers ``{"pid": N}`` once the child exists and ``{"exit": N, "pid": N}`` once it is reaped (requests
are answered in order; exits come whenever they happen).
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping

from dinox.isolate import contention, lifeline


class ForkedChild:
    """A trial process forked by the zygote, with Popen's pid / poll / wait."""

    def __init__(self, server: ForkServer, pid: int):
        self.server, self.pid = server, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_status(self.pid, timeout=0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.time() + timeout
        while self.poll() is None:
            if deadline is not None and time.time() > deadline:
                raise subprocess.TimeoutExpired(f"trial {self.pid}", timeout or 0)
            self.server.exit_status(self.pid, timeout=0.05)
        return self.returncode  # type: ignore[return-value]


# What a trial's child imports, named by its room (the caller may name others): the zygote imports them once,
# before it forks, so a forked trial finds them loaded. Names, not imports: isolate sits below measure.
TRIAL_MODULES = ("dinox.measure.estimate", "dinox.measure.trial")


class ForkServer:
    def __init__(self, preload: tuple[str, ...] = TRIAL_MODULES) -> None:
        self.preload = preload
        self.proc: subprocess.Popen | None = None
        self._exits: dict[int, int] = {}
        self._buffer = b""
        # Lanes share the zygote: a request and its pid reply must not interleave with another's.
        self._lock = threading.RLock()

    def start(self) -> None:
        """Start the zygote now (its imports then overlap with whatever the caller does next)."""
        with self._lock:
            self._start()

    def _start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dinox.isolate.forkserver", *self.preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,  # the zygote's own failures (an import error) reach the terminal
            env=lifeline.child_env(dict(os.environ, PYTHONUNBUFFERED="1", **contention.omp_env(os.environ))),
            start_new_session=True,  # a Ctrl-C at the terminal is the parent's to handle, not the zygote's
        )
        self._buffer = b""

    def spawn(
        self,
        trial_json: str,
        result_json: str,
        log_path: str,
        module: str = "dinox.measure.trial",
        env: Mapping[str, str] | None = None,
    ) -> ForkedChild:
        with self._lock:
            return self._spawn(module, trial_json, result_json, log_path, env)

    def _spawn(
        self, module: str, trial_json: str, result_json: str, log_path: str, env: Mapping[str, str] | None
    ) -> ForkedChild:
        self._start()
        assert self.proc is not None and self.proc.stdin is not None
        request = {
            "module": module,
            "trial": trial_json,
            "result": result_json,
            "log": log_path,
            "env": dict(env or {}),
        }
        msg = json.dumps(request) + "\n"
        try:
            self.proc.stdin.write(msg.encode())
            self.proc.stdin.flush()
            reply = self._read(timeout=120.0, want="pid")  # the first spawn waits for the imports
        except (BrokenPipeError, EOFError, TimeoutError):
            self.close()
            raise RuntimeError("the dinox fork server died or hung; see the output above") from None
        return ForkedChild(self, int(reply["pid"]))

    def exit_status(self, pid: int, timeout: float) -> int | None:
        """The child's exit code once the zygote reaped it; None while it runs (waiting up to `timeout`)."""
        with self._lock:
            if pid in self._exits:
                return self._exits[pid]
            try:
                if self.proc is None:
                    raise EOFError
                self._read(timeout=timeout, want="exit")
            except TimeoutError:
                return None
            except EOFError:
                # The zygote died with the child unreported: the child's session is killed by the runner.
                self._exits.setdefault(pid, -signal.SIGKILL)
            return self._exits.get(pid)

    def _read(self, timeout: float, want: str) -> dict:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.time() + timeout
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                msg = json.loads(line)
                if "exit" in msg:
                    self._exits[int(msg["pid"])] = int(msg["exit"])
                    if want == "exit":
                        return msg
                elif want in msg:
                    return msg
            # A zero timeout still polls once: that is how the runner asks "has it exited yet?". poll(), not
            # select(): a parent holding many files may number this pipe past select's 1024.
            waiting = select.poll()
            waiting.register(fd, select.POLLIN)
            if not waiting.poll(max(0.0, deadline - time.time()) * 1000):
                raise TimeoutError
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError
            self._buffer += chunk

    def follow_the_box(self, before: str) -> str:
        """Between trials only: the box read again before `before` (contention.follow), and a new zygote in place
        of this one where the children's OpenMP policy changed (OpenMP reads it once, when torch loads). The
        line for the terminal where it changed, else ""."""
        line = contention.follow(os.environ, before)
        if line:
            with self._lock:
                self.close()
                self._start()
        return line

    def close(self) -> None:
        with self._lock:
            if self.proc is None:
                return
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            self.proc = None


REAP_S = 0.02


def _zygote(preload: list[str]) -> None:
    lifeline.die_with_parent(lifeline.env_parent())  # a SIGKILLed sweep takes its zygote and trials with it
    # Everything a trial imports, imported once, here, so a forked child finds it loaded. Nothing touches a device.
    for module in preload:
        importlib.import_module(module)

    out = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_RDWR)
    children: dict[int, int | None] = {}  # forked, not yet reaped (several at once under --devices): pidfds
    pending = b""
    while True:
        # Asleep until a request comes or a child exits (its pidfd turns readable). Where pidfds are missing
        # (not Linux, Linux < 5.3), every 20 ms while children run: the trial beside it pays for each wakeup.
        fds = [fd for fd in children.values() if fd is not None]
        polling = len(fds) < len(children)
        ready, _, _ = select.select([0, *fds], [], [], REAP_S if polling else None)
        _reap(children, out)
        if 0 not in ready:
            continue
        chunk = os.read(0, 65536)
        if not chunk:  # the parent closed us, or is gone
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            pid = _fork(json.loads(line), devnull, [fd for fd in children.values() if fd is not None])
            children[pid] = pidfd(pid)
            out.write(json.dumps({"pid": pid}) + "\n")


def pidfd(pid: int) -> int | None:
    """A descriptor that turns readable when process `pid` ends (Linux 5.3+), or None where there is none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _reap(children: dict[int, int | None], out) -> None:
    for pid, fd in list(children.items()):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            del children[pid]
            if fd is not None:
                os.close(fd)
            out.write(json.dumps({"pid": pid, "exit": os.waitstatus_to_exitcode(status)}) + "\n")


def _fork(request: dict, devnull: int, siblings: list[int]) -> int:
    """Fork the child a request asks for; its pid. The child runs its module and never returns; it closes its
    siblings' pidfds (the zygote's to wait on, not its own)."""
    zygote = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    try:
        lifeline.die_with_parent(zygote)
        os.setsid()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for fd in siblings:
            os.close(fd)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        # Its devices and cores: set before anything in the child initialises CUDA or a thread pool.
        os.environ.update(request.get("env", {}))
        # The module a request names is the one `python -m MODULE` runs under spawn isolation.
        run_child = importlib.import_module(request["module"]).run_child
        code = run_child(request["trial"], request["result"], forked=True)
    except BaseException:  # noqa: BLE001 - whatever happens, this process ends here, never returns
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _zygote(sys.argv[1:])
