"""Real services the multi-host tests run against, each started by its fixture on loopback and stopped by PID:
PostgreSQL (Debian's binaries, a data dir of its own) and a one-node Slurm (slurmctld and slurmd from Debian's
packages, auth/none on loopback, no accounting). Each says why it cannot start, so its tests skip with that
reason where the binaries are missing; `.ci/run` installs them so CI runs them."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(check, timeout: float, what: str, log: Path) -> None:
    deadline = time.time() + timeout
    while not check():
        if time.time() > deadline:
            raise RuntimeError(f"{what} did not start in {timeout:.0f} s: {log.read_text(errors='replace')[-1500:]}")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen | None, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def _find(name: str, *patterns: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for pattern in patterns:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


class Postgres:
    """A PostgreSQL server of its own: initdb into a temporary dir, `postgres` on a loopback port (trust auth for
    the one user `dinox`), one database per `database()`. As root it runs as the `postgres` user (initdb
    refuses root), in a directory that user owns."""

    def __init__(self) -> None:
        found = _find("postgres", "/usr/lib/postgresql/*/bin/postgres")
        self.bin = Path(found).resolve().parent if found else None  # the real dir: it holds pg_isready too
        self.proc: subprocess.Popen | None = None
        self.port = free_port()
        self.root: Path | None = None

    def missing(self) -> str:
        if self.bin is None or not (self.bin / "initdb").exists():
            return "PostgreSQL's binaries (initdb, postgres) are not installed: apt-get install postgresql"
        if os.geteuid() == 0:
            try:
                import pwd

                pwd.getpwnam("postgres")
            except KeyError:
                return "running as root and there is no postgres user to run PostgreSQL as"
        return ""

    def _user(self) -> dict:
        return {"user": "postgres", "group": "postgres"} if os.geteuid() == 0 else {}

    def start(self) -> None:
        assert self.bin is not None
        # Not under pytest's tmp dir: that one is private to root, and postgres must reach its data dir.
        self.root = Path(tempfile.mkdtemp(prefix="dinox-pg-"))
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        log = self.root / "postgres.log"
        data = self.root / "data"
        subprocess.run(
            [str(self.bin / "initdb"), "-D", str(data), "-U", "dinox", "--auth=trust", "-E", "UTF8", "--no-sync"],
            check=True,
            capture_output=True,
            **self._user(),
        )
        self.proc = subprocess.Popen(
            [str(self.bin / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(self.port)]
            + ["-k", str(self.root), "-c", "fsync=off", "-c", "max_connections=200"],
            stdout=subprocess.DEVNULL,
            stderr=open(log, "ab"),
            start_new_session=True,
            **self._user(),
        )
        try:
            _wait(self._ready, 60, "PostgreSQL", log)
        except BaseException:
            self.stop()  # a server that never answered is still stopped by its PID
            raise

    def _ready(self) -> bool:
        args = [str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-q"]
        return subprocess.run(args, check=False).returncode == 0

    def database(self, name: str) -> str:
        """A new, empty database: its SQLAlchemy URI (MLflow's backend store)."""
        args = [str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "dinox", name]
        subprocess.run(args, check=True, capture_output=True)
        return f"postgresql://dinox@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        _stop(self.proc, signal.SIGINT)  # PostgreSQL's fast shutdown
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


SLURM_CONF = """\
ClusterName=dinoxtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/none
CredType=cred/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
SlurmUser={user}
SlurmdUser={user}
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
KillWait=5
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class Slurm:
    """A one-node Slurm: this machine is controller and compute node. Clients find it through `env`
    (SLURM_CONF)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ctld = _find("slurmctld", "/usr/sbin/slurmctld")
        self.slurmd = _find("slurmd", "/usr/sbin/slurmd")
        self.procs: list[subprocess.Popen] = []
        self.env = dict(os.environ, SLURM_CONF=str(root / "slurm.conf"))

    def missing(self) -> str:
        absent = [n for n, p in (("slurmctld", self.ctld), ("slurmd", self.slurmd)) if p is None]
        absent += [n for n in ("sbatch", "scontrol", "scancel", "sinfo") if shutil.which(n) is None]
        if absent:
            return f"Slurm is not installed ({', '.join(absent)}): apt-get install slurmctld slurmd slurm-client"
        if os.geteuid() != 0:
            return "a local Slurm needs root here (slurmd starts each task as its user)"
        return ""

    def start(self) -> None:
        import psutil

        for d in ("state", "spool"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        host = socket.gethostname().split(".")[0]
        conf = SLURM_CONF.format(
            host=host,
            ctld_port=free_port(),
            d_port=free_port(),
            root=self.root,
            user="root",
            cpus=os.cpu_count() or 1,
            mem_mb=int(psutil.virtual_memory().total / 2**20 * 0.9),
        )
        (self.root / "slurm.conf").write_text(conf)
        out = open(self.root / "daemons.log", "ab")
        conf_arg = ["-f", str(self.root / "slurm.conf")]
        for args in ([self.ctld, "-D", "-i", *conf_arg], [self.slurmd, "-D", "-N", host, *conf_arg]):
            self.procs.append(
                subprocess.Popen(args, stdout=out, stderr=out, env=self.env, start_new_session=True)  # type: ignore[arg-type]
            )
        try:
            _wait(self._idle, 60, "Slurm", self.root / "daemons.log")
        except BaseException:
            self.stop()
            raise

    def _idle(self) -> bool:
        proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=self.env, check=False)
        return proc.returncode == 0 and "idle" in proc.stdout

    def run(self, *args: str, **kw) -> subprocess.CompletedProcess:
        kw.setdefault("env", self.env)
        return subprocess.run(list(args), capture_output=True, text=True, check=False, **kw)

    def stop(self) -> None:
        self.run("scancel", "--full", "--user=root")  # any job a failed test left
        for proc in reversed(self.procs):
            _stop(proc)
