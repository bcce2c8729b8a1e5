"""The commands around a sweep: DICOM to PNG, PNG to shards, syncing a sweep's journal, the MLflow UI."""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import click

from dinox.cli.common import TRACKING_URI, BadInput
from dinox.errors import EXIT_BAD_INPUT
from dinox.isolate import lifeline
from dinox.store.backend import shown_uri


@click.command()
@click.option("--dicom-root", required=True, type=click.Path(file_okay=False), help="Tree of DICOM series.")
@click.option(
    "--out-root", required=True, type=click.Path(file_okay=False), help="Where the PNG series and _index/index.csv go."
)
@click.option("--force", is_flag=True, help="Convert every series again, even those already done.")
@click.option(
    "--min-slices",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Skip series with fewer readable slices (scouts, localizers).",
)
def preprocess(dicom_root: str, out_root: str, force: bool, min_slices: int) -> None:
    """Convert DICOM CT series to lossless 16-bit PNG slices (HU + 32768) and one index.csv.

    \b
    Slices are converted to Hounsfield units (RescaleSlope / RescaleIntercept) and ordered by position.
    Incremental: a series already converted is re-indexed, not converted again (--force rebuilds).
    Unreadable, non-DICOM, non-CT, truncated or compressed-without-decoder input is skipped and reported.
    """
    from dinox.data.dicom_preprocess import preprocess as run_preprocess
    from dinox.data.dicom_preprocess import render_summary

    if not Path(dicom_root).is_dir():
        raise BadInput(f"--dicom-root {dicom_root}: no such directory")
    summary = run_preprocess(dicom_root, out_root, force=force, min_slices=min_slices)
    click.echo(render_summary(summary))
    if not summary.slices_indexed:
        raise BadInput(f"no CT series with at least {min_slices} readable slices under {dicom_root}")


@click.command()
@click.option("--index-csv", default=None, type=click.Path(dir_okay=False), help="CT: index.csv from dinox preprocess.")
@click.option(
    "--image-folder", default=None, type=click.Path(file_okay=False), help="Images: a root/<class>/<image> tree."
)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder for the .tar shards.")
@click.option(
    "--root",
    default=None,
    type=click.Path(file_okay=False),
    help="CT: folder png_path is relative to; default: the folder above _index/.",
)
@click.option("--shard-size", type=click.IntRange(min=1), default=1000, show_default=True, help="Samples per shard.")
@click.option(
    "--encoding",
    type=click.Choice(["png16", "raw16"]),
    default="png16",
    show_default=True,
    help="CT: the slices as their 16-bit PNGs, or raw16: uncompressed (larger shards, nothing to inflate).",
)
@click.option("--replace", is_flag=True, help="Write over the shards --out already holds (refused otherwise).")
@click.option("--follow-links", is_flag=True, help="Images: read links that lead out of the image folder.")
def shards(
    index_csv: str | None,
    image_folder: str | None,
    out_dir: str,
    root: str | None,
    shard_size: int,
    encoding: str,
    replace: bool,
    follow_links: bool,
) -> None:
    """Write webdataset tar shards for `data: {source: webdataset, shards: DIR}`.

    \b
    --index-csv: each CT sample keeps its three slices (z-1, z, z+1) as the lossless 16-bit PNGs, or with
    --encoding raw16 as one uncompressed uint16 array (slices.npy): no PNG inflate in the workers.
    --image-folder: each image as it is on disk, under the standard keys jpg (or png) and cls (the class
    index, classes in sorted folder order), so shards other tools wrote read the same way.
    """
    from dinox.data.files import write_image_shards, write_shards

    if (index_csv is None) == (image_folder is None):
        raise BadInput("give --index-csv (CT slices) or --image-folder (images), one of them")
    try:
        if image_folder is not None:
            paths = write_image_shards(
                image_folder, out_dir, shard_size=shard_size, replace=replace, follow_links=follow_links
            )
        else:
            paths = write_shards(
                index_csv, out_dir, root=root, shard_size=shard_size, encoding=encoding, replace=replace
            )
    except OSError as e:  # not dinox's own (a WorkdirError is): one line all the same
        raise BadInput(str(e)) from None
    click.echo(f"wrote {len(paths)} shard{'s' if len(paths) != 1 else ''} to {out_dir}")


@click.command()
@click.argument("sweep_dirs", nargs=-1, type=click.Path(file_okay=False), metavar="[SWEEP_DIR]...")
@click.option(
    "--workdir",
    default=".dinox",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Without SWEEP_DIRs: every sweep under here with results not yet in the store.",
)
@click.option("--tracking-uri", default=None, metavar="URI", help="Override the store the sweep was run against.")
@click.option(
    "--new-sweep",
    is_flag=True,
    help="Where the store is not the one the sweep ran against (a new mlflow.db): log every result of the sweep "
    "as a new sweep run of its experiment there.",
)
def sync(sweep_dirs: tuple[str, ...], workdir: str, tracking_uri: str | None, new_sweep: bool) -> None:
    """Log the results a sweep kept locally while the tracking store was unreachable.

    Each result is logged once: one already in the store (found by its dinox.result_id tag) is not
    written again. Exit code 0 when everything is in the store, 2 when the store is still unreachable.
    """
    from dinox.store.backend import TrackingError
    from dinox.store.sync import SyncError, pending_sweeps, sync_sweep

    given = click.get_current_context().get_parameter_source("workdir") == click.core.ParameterSource.COMMANDLINE
    if not sweep_dirs and given and not Path(workdir).is_dir():  # a mistyped --workdir is not "all synced"
        raise BadInput(f"--workdir {workdir}: no such folder")
    dirs = [Path(d) for d in sweep_dirs] or pending_sweeps(Path(workdir))
    if not dirs:
        click.echo(f"nothing to sync under {workdir}")
        return
    failed = 0
    for d in dirs:  # one sweep's problem never keeps the others from syncing
        try:
            sync_sweep(d, tracking_uri, click.echo, new_sweep)
        except SyncError as e:
            failed += 1
            click.echo(f"error: sync {e}", err=True)
        except TrackingError as e:
            failed += 1
            click.echo(
                f"error: sync {d}: tracking store unreachable or failing ({e}); nothing lost, try again later", err=True
            )
    if failed:
        sys.exit(EXIT_BAD_INPUT)


@click.command()
@TRACKING_URI
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. The default keeps the UI on this machine; 0.0.0.0 exposes it to "
    "every network the machine is on, without authentication.",
)
@click.option("--port", type=click.IntRange(1, 65535), default=5000, show_default=True)
@click.option(
    "--experiment",
    metavar="NAME",
    default=None,
    help="The experiment whose page to print (a spec's name); default: the one with the newest dinox sweep.",
)
def ui(tracking_uri: str | None, host: str, port: int, experiment: str | None) -> None:
    """Open the MLflow UI on the sweeps' store (`mlflow ui`), listening on 127.0.0.1 unless told otherwise, and
    print the address of the sweep's experiment in MLflow's training view (MLflow 3 opens its GenAI view
    otherwise). Exit code 0 when stopped (Ctrl-C), 2 for bad input (a port it cannot listen on), 1 when the
    server ends on its own."""
    from dinox.store.backend import resolve_tracking_uri, store_problem

    uri = resolve_tracking_uri(tracking_uri)
    if uri.startswith(("http://", "https://")):
        raise BadInput(f"{shown_uri(uri)} is a tracking server: open it in a browser, it serves its own UI")
    # What `mlflow ui` is handed must be a store it opens: anything else ends in its traceback.
    scheme = uri.partition(":")[0].lower().split("+")[0]
    if scheme not in ("sqlite", "postgresql", "postgres", "mysql", "mssql") or (problem := store_problem(uri)):
        why = problem if scheme in ("sqlite", "postgresql", "postgres", "mysql", "mssql") else "not a database store"
        raise BadInput(f"tracking store {shown_uri(uri)}: {why} (sqlite:///mlflow.db, postgresql://HOST/DB)")
    try:
        address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise BadInput(f"--host {host}: not an address to listen on ({e})") from None
    if taken := _cannot_listen(address):
        # Else the address printed below would be another server's (another store's UI), and the UI's own
        # failure one line in MLflow's log, after an exit 0.
        raise BadInput(f"--port {port}: cannot listen on {host}:{port} ({taken}); choose another --port")
    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"warning: the UI listens on {host}, reachable by others, with no authentication", err=True)
    base = f"http://{_url_host(host)}:{port}"
    page = _experiment_page(uri, experiment)
    click.echo(f"MLflow UI on {base} for {shown_uri(uri)} (Ctrl-C to stop)")
    click.echo(f"  {page[0]}: {base}/{page[1]}" if page[1] else f"  {page[0]}")
    # One user's UI: one worker starts in a fraction of the time of MLflow's default four, and the job
    # runner MLflow 3 starts beside it (for its GenAI features) has nothing to do for dinox's runs.
    env = dict(os.environ)
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    command = [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        uri,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    sys.exit(_serve(command, env))


def _serve(command: list[str], env: dict[str, str]) -> int:
    """Run `mlflow ui` in a session of its own until Ctrl-C or SIGTERM, which stop its whole process group (0),
    or until it ends on its own, which is a failure (its exit code, at least 1).

    Not exec'd into: `mlflow ui` starts the uvicorn server as a child and forwards signals to it only once
    its handler is installed, seconds of imports later. A Ctrl-C before that printed a traceback from
    MLflow's imports; one between its starting the server and installing the handler killed `mlflow ui` and
    left the server running, orphaned, holding the port, as a SIGKILL of it always did (the README's test,
    beside a loaded suite, once waited 60 s for a UI a Ctrl-C had not ended). Here the terminal's Ctrl-C
    reaches dinox alone, which ends the group (SIGTERM, then SIGKILL for whatever is left). The server's
    leader gets SIGTERM if dinox itself is killed."""
    from dinox.isolate.process_tree import kill_group

    stops = {signal.SIGINT, signal.SIGTERM}
    said: list[str] = []

    def stop(signum: int, _frame: object) -> None:
        if not said:  # the first one stops the server; a second Ctrl-C finds it stopping
            said.append(signal.Signals(signum).name)
            raise _Stopped

    # Held from before the handlers go in until the child is known, then taken: a Ctrl-C between installing
    # `stop` and entering the block below raised _Stopped where nothing caught it (a traceback, seen in CI).
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    old = {s: signal.signal(s, stop) for s in stops}
    proc = None
    try:
        try:
            proc = subprocess.Popen(
                command,
                env=env,
                start_new_session=True,
                preexec_fn=functools.partial(_server_child, stops),  # noqa: PLW1509 - one thread here
            )
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
        code = proc.wait()
        # A UI runs until it is stopped: one that ends on its own failed, whatever `mlflow ui` returns (it
        # returns 0 when its server could not bind).
        click.echo(f"error: the UI's server ended on its own (exit {code}); its output is above", err=True)
    except _Stopped:
        if proc is not None:
            kill_group(proc)
        click.echo(f"dinox: the UI stopped ({said[0]})", err=True)
        return 0
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    return code if code > 0 else 128 - code if code < 0 else 1  # a death by signal, as a shell reports it


def _cannot_listen(address: tuple) -> str | None:
    """Why the server could not listen at a getaddrinfo address (in use, a privileged port), or None. As uvicorn
    binds it: SO_REUSEADDR, which a listening socket still refuses."""
    family, kind, proto, _name, sockaddr = address
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(sockaddr)
        except OSError as e:
            return e.strerror or str(e)
    return None


class _Stopped(Exception):
    """Ctrl-C or SIGTERM reached `dinox ui`."""


def _server_child(held: set[signal.Signals]) -> None:
    """In the server's process before it execs: the signals this process held, unheld (a mask outlives exec),
    and SIGTERM (a graceful stop) when this process dies."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
    lifeline.die_with_parent(signum=signal.SIGTERM)


# MLflow 3's experiment page opens in its GenAI view (traces) unless the address asks for the training one.
TRAINING_VIEW = "runs?workflowType=machine_learning"


def _url_host(host: str) -> str:
    """The host part of the UI's address: the machine itself for a wildcard, an IPv6 literal in brackets."""
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _experiment_page(uri: str, name: str | None) -> tuple[str, str]:
    """(what the page is, its path after the UI's address; "" where there is none): the named experiment, else
    the one holding the newest dinox sweep. A name the store lacks is bad input, naming the ones it has."""
    from dinox.store.backend import TrackingError
    from dinox.store.readback import sweep_experiment

    try:
        found = sweep_experiment(uri, name)
    except TrackingError as e:
        raise BadInput(str(e)) from None
    if found is None:
        return "no dinox sweep in this store yet: `dinox run SPEC` records one", ""
    what = f"experiment {found[0]!r}" if name is not None else f"the newest sweep, experiment {found[0]!r}"
    return what, f"#/experiments/{found[1]}/{TRAINING_VIEW}"
