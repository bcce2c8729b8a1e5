"""The tracking store itself: where it is, reaching it, creating an embedded one, noticing it vanish, and
saying in one line what went wrong. ``tracking`` writes a sweep into it, ``readback`` reads trials out.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import socket
import sqlite3
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dinox.contract import one_line
from dinox.errors import DinoxError
from dinox.writes import cache_dir

if TYPE_CHECKING:  # imported where a client is made: `dinox --help` and `validate` never load MLflow
    from mlflow import MlflowClient

# MLflow's defaults (7 retries, backoff factor 2, 120 s timeout) stall a sweep for minutes per call when a
# tracking server is down. dinox keeps every result locally and syncs later, so it fails fast instead,
# unless the user set these themselves.
# Against a tracking server MLflow prints a "View run at ..." link at every run end: a sweep prints its own.
_QUIET_AND_QUICK = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}
# The loggers of the store's libraries: schema migrations log at INFO, and a failing store logs whole
# tracebacks (60 KB for a deleted mlflow.db). dinox reports a store failure in one line of its own.
_STORE_LOGGERS = ("mlflow", "alembic", "sqlalchemy", "urllib3")


def configure_client(log_file: Path | None = None) -> None:
    """Fail fast against a dead server, and keep the store libraries' own logging off the terminal: in
    `log_file` when given (the sweep's store.log), else only warnings and worse."""
    import mlflow  # noqa: F401  (first: its import sets up its own loggers, which the lines below then override)

    for var, value in _QUIET_AND_QUICK.items():
        os.environ.setdefault(var, value)
    for name in _STORE_LOGGERS:
        log = logging.getLogger(name)
        if log_file is None:
            log.setLevel(max(log.level, logging.WARNING))
            continue
        for old in list(log.handlers):  # MLflow's own stderr handler among them
            log.removeHandler(old)
            if isinstance(old, logging.FileHandler):
                old.close()
        handler = logging.FileHandler(log_file, delay=True)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.propagate = False


def client(uri: str) -> MlflowClient:
    """A client of the store at `uri`, configured as every dinox client is (configure_client): quick to fail,
    quiet, and printing no "View run at" link (which would show the URI's password)."""
    from mlflow import MlflowClient

    configure_client()
    return MlflowClient(tracking_uri=uri)


@contextlib.contextmanager
def _dir_lock(folder: Path) -> Iterator[None]:
    """An exclusive flock on a folder (no lock file left behind), held while the block runs."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def sqlite_path(uri: str) -> Path | None:
    """The database file of a sqlite:/// URI, or None for any other store."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0])


def store_problem(uri: str) -> str:
    """Why `uri` cannot hold a sweep, found before anything opens it ("" when nothing is known to be wrong): a
    store that keeps nothing (in-memory SQLite), a file that is not one, a URL that is not one, a database
    whose driver is not installed."""
    scheme, _, _rest = uri.partition(":")
    scheme = scheme.lower()
    if scheme == "sqlite":
        path = sqlite_path(uri)
        if path is None or str(path) in ("", ".", ":memory:"):
            return "an in-memory SQLite store keeps nothing once dinox exits; name a file, e.g. sqlite:///mlflow.db"
        if path.exists() and not path.is_file():
            return f"{path} is not a regular file"
        if path.exists() and (damage := _sqlite_damage(path)):
            return f"{path} is not a readable SQLite database ({damage}); move it aside to start a new one"
        return ""
    if scheme in ("http", "https"):
        try:
            parts = urllib.parse.urlsplit(uri)
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError as e:
            return f"not a URL ({e})"
        return "" if parts.hostname else "not a URL (no host)"
    if scheme.split("+")[0] in ("postgresql", "postgres", "mysql", "mssql"):
        try:
            from sqlalchemy.engine import make_url

            make_url(uri).get_dialect().import_dbapi()
        except ImportError as e:
            name = getattr(e, "name", None) or str(e)
            wheel = {"psycopg": "'psycopg[binary]'", "psycopg2": "psycopg2-binary"}.get(name.split(".")[0], name)
            return f"its database driver is not installed: pip install {wheel}"
        except Exception as e:  # noqa: BLE001 - SQLAlchemy's own errors for a URL it cannot read
            return f"not a database URL ({one_line(str(e), 200)})"
    return ""


def prepare_store(uri: str) -> None:
    """Create and migrate an embedded (SQLite) store once, under a lock on its folder: two first `dinox run`s
    on a new mlflow.db otherwise race in MLflow's schema migration and can leave it half-migrated. A new one
    starts as a copy of an empty store this MLflow migrated once (kept in the user's cache): MLflow's ~60
    migrations cost seconds on every new file."""
    from mlflow import MlflowClient

    path = sqlite_path(uri)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with _dir_lock(path.parent):
        seeded = not path.exists() and _copy_empty_store(path)
        client = MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)
        if seeded:
            _adopt_default_experiment(client, path)


def _sqlite_damage(path: Path, tables: tuple[str, ...] = ()) -> str:
    """Why the SQLite file at `path` cannot be read ("" when it can), opened read-only; with `tables`, also
    any of them it lacks. Reads the schema only: a large store costs no more than a small one."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{urllib.parse.quote(str(path))}?mode=ro", uri=True)) as db:
            names = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as e:
        return str(e)
    missing = [t for t in tables if t not in names]
    return f"no table {', '.join(missing)}" if missing else ""


def _empty_store() -> Path | None:
    """An empty store migrated by this MLflow, made once per MLflow version; None if it cannot be kept."""
    import mlflow
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    cache = cache_dir()
    template = cache / f"mlflow-{mlflow.__version__}-empty.db"
    if template.exists() and not _sqlite_damage(template, ("experiments", "alembic_version")):
        return template
    with contextlib.suppress(OSError):  # a damaged copy would seed every new store with its damage: made again
        template.unlink()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with _dir_lock(cache):
            if not template.exists():
                tmp = cache / f".mlflow-{os.getpid()}.db"
                try:
                    MlflowClient(tracking_uri=f"sqlite:///{tmp}").search_experiments(max_results=1)
                    os.replace(tmp, template)
                finally:
                    tmp.unlink(missing_ok=True)
    except (OSError, MlflowException):
        return None
    return template


def _copy_empty_store(path: Path) -> bool:
    template = _empty_store()
    if template is None:
        return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        shutil.copyfile(template, tmp)
        os.replace(tmp, path)
    except OSError as e:
        # Where the copy cannot be written, neither can MLflow's own database (it would retry for minutes on
        # /proc, or fill the disk half-way): one line now.
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise TrackingError(f"cannot create the store {path}: {e.strerror or e}") from None
    return True


def _adopt_default_experiment(client: MlflowClient, path: Path) -> None:
    """The copied store's one experiment, MLflow's Default, takes the location and time MLflow would have
    given it here (its artifact root follows the working directory)."""
    from mlflow.store.tracking import DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH
    from mlflow.utils.uri import append_to_uri_path, resolve_uri_if_local

    location = append_to_uri_path(resolve_uri_if_local(DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH), "0")
    now = now_ms()
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute(
            "UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ? "
            "WHERE experiment_id = 0",
            (str(location), now, now),
        )


@dataclass(frozen=True)
class StoreFile:
    """Which file an embedded store is: a store deleted or replaced mid-sweep takes writes into a file that
    no longer has a name (an open connection) or into a new empty one. Neither is "logged"."""

    path: Path
    device: int
    inode: int

    @classmethod
    def of(cls, uri: str) -> StoreFile | None:
        path = sqlite_path(uri)
        if path is None:
            return None
        st = path.stat()
        return cls(path, st.st_dev, st.st_ino)

    def problem(self) -> str | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return f"the store file {self.path} was deleted during the sweep"
        if (st.st_dev, st.st_ino) != (self.device, self.inode):
            return f"the store file {self.path} was replaced during the sweep"
        return None


class TrackingError(DinoxError):
    """The tracking store cannot be used (unreachable, deleted experiment, ...): one line for the user."""

    store_unusable = True


def resolve_tracking_uri(explicit: str | None = None) -> str:
    """--tracking-uri, else MLFLOW_TRACKING_URI, else the embedded store: mlflow.db in the working dir."""
    if explicit:
        return explicit
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def shown_uri(uri: str) -> str:
    """A tracking URI as it may be shown (terminal, logs, tags, reports): its password masked, the rest as
    given; the one rule for every line that names a store."""
    try:
        parts = urllib.parse.urlsplit(uri)
        password = parts.password
    except ValueError:  # not a URL urllib can read (a bad port): nothing in it is taken for a password
        return uri
    if not password:
        return uri
    user, _, host = parts.netloc.rpartition("@")
    name = user.split(":", 1)[0]
    return parts._replace(netloc=f"{name}:***@{host}").geturl()


def describe_store_error(e: BaseException) -> str:
    """One line for a store failure; for a server that cannot be reached, why, before MLflow's long tail of
    retry details cuts it off."""
    text = getattr(e, "message", None) or str(e) or type(e).__name__
    why = _unreachable(text)
    return f"cannot reach the server ({why})" if why else one_line(text, 300)


def store_error(uri: str, e: BaseException) -> str:
    why = _unreachable(getattr(e, "message", None) or str(e))
    return (
        f"cannot reach the tracking server at {shown_uri(uri)} ({why})"
        if why
        else f"tracking store {shown_uri(uri)}: " + (describe_store_error(e))
    )


_UNREACHABLE = (
    ("Connection refused", "connection refused"),
    ("Name or service not known", "host name not known"),
    ("Temporary failure in name resolution", "host name not known"),
    ("No route to host", "no route to host"),
    ("timed out", "no answer in time"),
    ("Max retries exceeded", "no connection"),
)


def _unreachable(text: str) -> str:
    return next((why for pattern, why in _UNREACHABLE if pattern in text), "")


def check_reachable(uri: str, timeout: float = 10.0) -> None:
    """One plain request to an HTTP tracking server before MLflow's client, which retries a refused connection
    with backoff for minutes before it says anything. Any HTTP answer will do: something is listening."""
    if uri.partition(":")[0].lower().split("+")[0] in ("postgresql", "postgres", "mysql"):
        _check_database(uri, timeout)
        return
    if not uri.startswith(("http://", "https://")):
        return
    # http://user:password@host, as MLflow reads it (its basic auth): urllib would take "user:password@host"
    # for the host. /health answers without the credentials, and any answer will do.
    parts = urllib.parse.urlsplit(uri)
    bare = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
    try:
        urllib.request.urlopen(bare.rstrip("/") + "/health", timeout=timeout).close()
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, TimeoutError | socket.timeout):
            why = f"no answer within {timeout:g} s"
        elif isinstance(reason, ConnectionRefusedError):
            why = "connection refused"
        else:
            # Only what certainly means "nobody there": a TLS setup MLflow is told about (a CA bundle,
            # MLFLOW_TRACKING_INSECURE_TLS) may fail here and work there, so MLflow gets to try.
            why = _unreachable(str(reason)) if isinstance(reason, socket.gaierror | OSError) else ""
        if why:
            raise TrackingError(f"cannot reach the tracking server at {shown_uri(uri)} ({why})") from None


def _check_database(uri: str, timeout: float) -> None:
    """One connection to a database store before MLflow's, which retries a refused one 15 times with
    backoff (104 s here) and then raises its traceback. Only a database that is certainly not there stops
    dinox here; any other trouble is MLflow's to meet and report."""
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(uri, connect_args={"connect_timeout": max(1, int(timeout))})
        with engine.connect():
            pass
        engine.dispose()
    except sqlalchemy.exc.OperationalError as e:
        if why := _unreachable(str(e.orig) if e.orig is not None else str(e)):
            raise TrackingError(f"cannot reach the database at {shown_uri(uri)} ({why})") from None
    except Exception:  # noqa: BLE001 - a driver's own trouble (an unknown option): MLflow reports it
        return


def search_all(client: MlflowClient, experiment_ids: list[str], filter_string: str = "") -> list:
    runs, token = [], None
    while True:
        page = client.search_runs(experiment_ids, filter_string, max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def now_ms() -> int:
    return int(time.time() * 1000)
