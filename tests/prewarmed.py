"""`python -m dinox ARGS` for the suite's `run_dinox`, forked from an interpreter that has already imported what
the command imports (MLflow, click, pydantic, dinox's parent side) instead of importing it again.

A fresh `dinox` parent spends 1.5-1.8 CPU-s starting Python and importing MLflow and its own modules; the suite
runs some two hundred of them on two cores. The forked command is a real process all the same: its own pid, the test's
argv, working directory, environment and pipes, `python -m dinox` run from its top (`runpy`, the Ctrl-C handling
of `dinox.cli.entry` included), its atexit work done and its exit status the one `subprocess.run` reports (a
negative signal number where a signal ended it). What it does not run is Python's own start-up and the first
import of those modules, so a command whose environment changes how Python starts or how MLflow configures
itself on import (`FRESH_KEYS`) runs fresh, as do the tests of the start-up itself (a Ctrl-C while importing, a
Python without dinox's dependencies, the parent never importing torch, every documented block): they start
`python -m dinox` with subprocess.

Not dinox's own ForkServer (dinox/isolate/forkserver.py): its children run a trial module's `run_child` with their
output in a log file, and must import torch; a command needs its argv, a directory and the test's own pipes, and
the parent side must never find torch loaded.

One prewarmed interpreter per pytest process, started on first use, listening on a Unix socket of its own; each
command is one connection: the request (argv, cwd, environment) with the three standard descriptors, the pid
back, then the exit status. The server is single-threaded (it forks) and ends when the pytest process does.
"""

from __future__ import annotations

import atexit
import json
import locale
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# Read by Python or MLflow as they start, not afterwards: a command whose environment sets one differently from
# the prewarmed interpreter's runs fresh.
FRESH_KEYS = ("PYTHON", "LANG", "LC_", "MLFLOW_CONFIGURE_LOGGING", "MLFLOW_LOGGING_LEVEL", "MPL", "HOME", "XDG_")
# What `python -m dinox` imports before and while its commands run, parent side only (never torch: the parent's
# promise, which tests/test_packaging.py holds on a fresh interpreter).
PRELOAD = (
    "dinox.cli.main",
    "dinox.cli.run",
    "dinox.cli.decide",
    "dinox.cli.tools",
    "mlflow",
    "mlflow.tracking",
    "dinox.store.recorder",
    "dinox.store.backend",
    "dinox.sweep.run",
    "dinox.decide",
    "dinox.report",
    "dinox.report.plots",  # matplotlib, set to Agg as dinox sets it
    "dinox.report.html",
    "mlflow.store.tracking.sqlalchemy_store",
)


def _startup_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(FRESH_KEYS)}


class Prewarmed:
    """The client: one per pytest process."""

    def __init__(self) -> None:
        self.dir: Path | None = None  # its socket's folder, once started
        self.address = ""
        self.proc: subprocess.Popen | None = None
        self.env: dict[str, str] = {}
        self.lock = threading.Lock()
        atexit.register(self.close)

    def _server(self) -> None:
        with self.lock:
            if self.proc is not None and self.proc.poll() is None:
                return
            self.close()
            self.dir = Path(tempfile.mkdtemp(prefix="dinox-prewarmed-"))
            if len(str(self.dir)) > 90:  # a Unix socket's path holds 107 bytes: a deep TMPDIR (a test's own) is /tmp's
                self.dir.rmdir()
                self.dir = Path(tempfile.mkdtemp(prefix="dinox-prewarmed-", dir="/tmp"))
            self.address = str(self.dir / "s")
            self.env = dict(os.environ)
            self.env.pop("MLFLOW_RUN_ID", None)
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.prewarmed", self.address],
                cwd=Path(__file__).resolve().parents[1],
                env=self.env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            deadline = time.time() + 120
            while not os.path.exists(self.address):
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"the prewarmed dinox did not start (exit {self.proc.poll()})")
                time.sleep(0.05)

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def fits(self, env: dict[str, str]) -> bool:
        """Whether a command with this whole environment may run forked (else fresh)."""
        self._server()
        return _startup_env(env) == _startup_env(self.env)

    def run(self, args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
        self._server()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        stdin = os.open(os.devnull, os.O_RDONLY)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.connect(self.address)
            request = json.dumps({"argv": args, "cwd": str(cwd), "env": env}).encode()
            socket.send_fds(conn, [request], [stdin, out_w, err_w])
            pid = json.loads(conn.recv(1 << 16))["pid"]
        except BaseException:
            for fd in (out_r, err_r):
                os.close(fd)
            conn.close()
            raise
        finally:
            for fd in (stdin, out_w, err_w):
                os.close(fd)
        chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
        deadline = time.monotonic() + timeout
        open_fds, code = {out_r, err_r}, None
        try:
            while open_fds or code is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    os.kill(pid, signal.SIGKILL)
                    raise subprocess.TimeoutExpired(["dinox", *args], timeout)
                ready, _, _ = select.select([*open_fds, *([conn] if code is None else [])], [], [], left)
                for fd in ready:
                    if fd is conn:
                        code = json.loads(conn.recv(1 << 16))["code"]
                        continue
                    data = os.read(fd, 1 << 16)
                    if data:
                        chunks[fd].append(data)
                    else:
                        open_fds.discard(fd)
        finally:
            conn.close()
            os.close(out_r)
            os.close(err_r)
        # As `subprocess.run(..., text=True)` reads them: the locale's encoding, strict, universal newlines.
        encoding = locale.getpreferredencoding(False)
        text = {
            fd: b"".join(parts).decode(encoding).replace("\r\n", "\n").replace("\r", "\n")
            for fd, parts in chunks.items()
        }
        return subprocess.CompletedProcess(["dinox", *args], code, text[out_r], text[err_r])


# --- the server --------------------------------------------------------------------------------------------


def _command(request: dict, fds: list[int]) -> None:
    """In the forked child: become `python -m dinox ARGV` in the request's directory, environment and pipes."""
    import runpy
    import traceback

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # read again from this environment's TMPDIR, as a fresh process reads it
    sys.argv = [str(Path(sys.modules["dinox"].__file__).with_name("__main__.py")), *request["argv"]]
    code: int = 0
    try:
        runpy.run_module("dinox", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:  # as Python's own top level: the traceback, then dead by SIGINT
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001 - as Python's own top level: the traceback, exit 1
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code & 0xFF)


def serve(address: str) -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    # The parent's promise (tests/test_packaging.py): a command forked from here must not find torch loaded.
    assert not {"torch", "timm", "torchvision"} & set(sys.modules), "the prewarmed parent imported torch"
    # It forks: no Python thread may hold a lock then. The imports leave two native ones (OpenBLAS's pool,
    # pyarrow's jemalloc), which both re-initialise in a child by their own fork handlers, as in dinox's zygote.
    import threading

    assert threading.active_count() == 1, threading.enumerate()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(address + ".tmp")
    listener.listen(16)
    os.rename(address + ".tmp", address)  # the client waits for this name: bound and listening
    waiting: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, its connection)
    parent = os.getppid()
    while os.getppid() == parent:  # ends with the pytest process that started it
        ready, _, _ = select.select([listener, *waiting], [], [], 1.0)
        for item in ready:
            if item is listener:
                conn, _ = listener.accept()
                msg, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 3)
                request = json.loads(msg)
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    conn.close()
                    for pidfd, (_pid, other) in waiting.items():
                        os.close(pidfd)
                        other.close()
                    _command(request, fds)
                for fd in fds:
                    os.close(fd)
                conn.send(json.dumps({"pid": pid}).encode())
                waiting[os.pidfd_open(pid)] = (pid, conn)
            else:
                pid, conn = waiting.pop(item)
                os.close(item)
                _, status = os.waitpid(pid, 0)
                try:
                    conn.send(json.dumps({"code": os.waitstatus_to_exitcode(status)}).encode())
                except OSError:
                    pass  # the client gave up on it (a timeout)
                conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
