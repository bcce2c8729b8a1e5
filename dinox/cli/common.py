"""What the dinox commands share: bad input as exit code 2 with no traceback, loading a spec into trials, and
the options several commands take."""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import click

from dinox.errors import DinoxError, escaped

if typing.TYPE_CHECKING:  # imported when a command runs: `dinox --help` stays quick
    from dinox.plan.grid import Trial
    from dinox.spec.file import Problem, SpecDocument


class BadInput(DinoxError):
    """Bad input the command line itself finds (an option, a combination of options)."""


def show_error(e: DinoxError) -> None:
    """One line, ``error: ...``; a message of several lines (one problem each, ``file:line: ...``) as it is.
    click's own errors print "Error: ..." and exit 1 by default; dinox keeps exit code 1 for a NO-GO."""
    message = str(e)
    click.echo(message if "\n" in message else f"error: {message}", err=True)


def load_trials(
    path: str,
    max_trials: int | None = 1000,
    preflight: bool = False,
    sets: tuple[str, ...] = (),
    shrink: bool = False,
    entries: bool = True,
    say: Callable[[str], None] = click.echo,
) -> tuple[SpecDocument, list[Trial]]:
    """The spec (with any --set overrides, then shrunk where asked, which `say` tells) and its trials; raises
    SpecError (one line per problem, a problem from a --set naming it), which the command group prints with exit
    2. With preflight, also the model names and data files (this imports timm, so it is kept to the commands
    that need it), and the team's own entries unless `entries` is False (a caller that checks several specs'
    entries at once, with `entry_problems` and `spec_problems`)."""
    from dinox.plan import grid
    from dinox.spec import file as spec_file
    from dinox.spec import overrides

    items = overrides.parse(sets)
    try:
        doc = overrides.apply(spec_file.load(path), items)
        given = tuple(k if v is None else f"{k}={v}" for k, v in items)
        trials = [dataclasses.replace(t, sets=given) for t in grid.expand(doc, max_trials, shrink=shrink)]
        if shrink:
            from dinox.plan import shrink as shrinking

            doc = dataclasses.replace(doc, text=f"{doc.text.rstrip()}\n# --shrink\n")
            say(shrinking.summary(doc.base, [o for o, _ in grid.points(doc)], trials[0].spec))
        if preflight:
            from dinox.plan.preflight import check

            spec_problems(doc, check(trials) or (entry_problems([trials])[0] if entries else []), sets)
        return doc, trials
    except spec_file.SpecError as e:
        e.problems = [_named_override(p, items) for p in e.problems]
        raise


def spec_problems(doc: SpecDocument, found: list[tuple[Trial, str, str]], sets: tuple[str, ...] = ()) -> None:
    """Raise the SpecError of problems found in a spec's trials, at their lines (or naming the --set that gave
    the value); nothing where none were found."""
    from dinox.plan import grid
    from dinox.spec import file as spec_file
    from dinox.spec import overrides

    if problems := grid.locate(doc, found):
        items = overrides.parse(sets)
        raise spec_file.SpecError(doc.path, [_named_override(p, items) for p in problems])


def entry_problems(groups: list[list[Trial]]) -> list[list[tuple[Trial, str, str]]]:
    """For each group of trials (a spec file's), what is wrong with each of the team's own entries (objective
    kind python, data source python), imported and built in a child (dinox.measure.entry_check), as preflight
    problems. Groups that import from the same folders (`dinox validate` of several specs of one project) share
    one child, so N specs cost one start of torch, not N; groups from other folders get a child of their own,
    since a module imported once is never imported again from another folder. This process never imports the
    team's code."""
    from dinox.isolate.runner import run_entry_check

    out: list[list[tuple[Trial, str, str]]] = [[] for _ in groups]
    users = [[t for t in trials if _imports_users(t)] for trials in groups]
    by_folders: dict[tuple[str, ...], list[int]] = {}
    for g, mine in enumerate(users):
        if mine:
            by_folders.setdefault(_folders(mine), []).append(g)
    for members in by_folders.values():
        checked = [(g, t) for g in members for t in users[g]]
        specs = [t.spec.model_dump(mode="json") for _, t in checked]
        found, failure = run_entry_check(specs, [len(users[g]) for g in members])
        if failure:
            for g in members:
                out[g].append((users[g][0], "objective.entry", f"the check of the entries gave no answer: {failure}"))
        for i, field, message in found:
            g, trial = checked[i]
            out[g].append((trial, field, message))
    return out


def _imports_users(trial: Trial) -> bool:
    return "python" in (trial.spec.objective.kind, trial.spec.data.source)


def _folders(trials: list[Trial]) -> tuple[str, ...]:
    """The folders these trials import the team's modules from, as the child resolves them."""
    paths = {s.objective.path for s in (t.spec for t in trials) if s.objective.kind == "python"}
    paths |= {s.data.path for s in (t.spec for t in trials) if s.data.source == "python"}
    return tuple(sorted(str(Path(p).resolve()) for p in paths))


def machine_problems(doc: SpecDocument, trials: list[Trial], sets: tuple[str, ...] = ()) -> list[Problem]:
    """The device kinds the trials ask for and this machine certainly lacks (asked without torch), as problems
    at the line that asked, or naming the --set that did."""
    from dinox.plan import grid
    from dinox.plan.machine import missing_problem, without_torch
    from dinox.spec import overrides

    found, seen = [], set()
    for t in trials:
        kind = t.spec.hardware.device
        if kind not in seen and (has := without_torch(kind)):
            seen.add(kind)
            found.append((t, "hardware.device", missing_problem(kind, has, doc.path)))
    items = overrides.parse(sets)
    return [_named_override(p, items) for p in grid.locate(doc, found)]


def _named_override(problem: Problem, items: list[tuple[str, str | None]]) -> Problem:
    """A problem in a value set on the command line says so."""
    import dataclasses

    key, raw = next(((k, v) for k, v in items if problem.path == k or problem.path.startswith(k + ".")), ("", None))
    if not key or "--set" in problem.message:
        return problem
    # Its line in the file no longer holds the value that is wrong (a parent key's line would blame the file).
    # Shown as typed: Problem.render keeps a newline or carriage return in it from starting a line of its own.
    return dataclasses.replace(problem, message=f"{problem.message} (from --set {key}={raw})", line=None)


TRACKING_URI = click.option(
    "--tracking-uri",
    default=None,
    metavar="URI",
    help="MLflow store; default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in this directory.",
)


def decision_option(what: str):  # noqa: ANN201 - a click decorator
    """--decision DIR: a `dinox decide --out` folder whose decision.json says `what` to work on."""
    return click.option(
        "--decision",
        "decision_dir",
        default="decision",
        show_default=True,
        type=click.Path(file_okay=False),
        help=f"A `dinox decide --out` folder: {what} (decision.json).",
    )


def read_decision(folder: str, instead: str) -> tuple[dict, str]:
    """decision.json in `folder` and its path as shown; BadInput naming it (with `instead`, the other way to
    say what to work on) when it is missing, unreadable or not a decision."""
    import json
    from pathlib import Path

    from dinox.store.trial_record import store_text

    path = Path(folder) / "decision.json"
    shown = store_text(str(path))  # a path typed at the prompt may still hold what a terminal acts on
    try:
        payload = json.loads(path.read_text())
    except OSError as e:
        raise BadInput(f"{shown}: {e.strerror or e}: run `dinox decide` first, or {instead}") from None
    except ValueError as e:
        raise BadInput(f"{shown}: not a dinox decision ({type(e).__name__}: {e})") from None
    if not isinstance(payload, dict):
        raise BadInput(f"{shown}: not a dinox decision (a JSON {type(payload).__name__}, not an object)")
    return payload, shown


SET = click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a fixed field of the spec (dotted path as in sweep, value read as YAML); repeatable, or "
    "several separated by ';'. Example: --set batch.size=32 --set data.index_csv=/data/idx.csv",
)
SHRINK = click.option(
    "--shrink",
    is_flag=True,
    help="Try the spec small on this machine: the same grid and pipeline with a small model (vit, resnet, "
    "convnext families), 64 px images, batches of at most ~8, a few steps; recorded as shrunk in the "
    "experiment NAME_shrunk, which `dinox decide` plans from only with --shrunk.",
)
# MLproject's `-P shrink=true`: `mlflow run` substitutes a parameter's value into the command, never an optional
# flag (an empty value reaches the command as a quoted '' argument), so its entry point passes --shrink-if {shrink}.
SHRINK_IF = click.option(
    "--shrink-if",
    type=click.BOOL,
    default=False,
    hidden=True,
    metavar="true|false",
    help="--shrink when true (the MLproject's shrink parameter).",
)
MAX_TRIALS = click.option(
    "--max-trials",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Refuse sweeps that expand to more trials than this.",
)


# A --set value is YAML, read by the spec's own reader (which refuses control characters but newlines in a
# flow value); every other text or path a command takes is one line of printable characters.
_YAML_VALUED = frozenset({"--set"})


def refuse_control_characters(group: click.Group) -> None:
    """Every text and path parameter of every command refuses a control character (a newline, an escape),
    before the command runs: such a value would become a line of a job script, a second line of a log or
    journal, or a sequence the terminal obeys. One rule, applied here to all, present and future."""

    def check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        for v in value if isinstance(value, tuple) else (value,):
            text = os.fsdecode(v) if isinstance(v, bytes | os.PathLike) else v
            if isinstance(text, str) and not text.isprintable():
                bad = next(c for c in text if not c.isprintable())
                raise click.BadParameter(
                    f"{text!r} holds the control character {bad!r}: a value is one line of printable characters"
                )
        return value

    for command in group.commands.values():
        for param in command.params:
            texty = isinstance(param.type, click.types.StringParamType | click.Path)
            if texty and not _YAML_VALUED & set(param.opts) and param.callback is None:
                param.callback = check


class Inert:
    """sys.stdout and sys.stderr for every command: a control character reaches the terminal as its escape
    (`\\x1b`), never as itself. Values from a spec, an option, a path or the store are printed in many lines
    (errors name them); an escape sequence among them would rewrite the screen, set the window's title or
    hide what follows. Newlines, tabs and the carriage return the progress line uses pass as they are."""

    _KEEP = frozenset("\n\r\t")

    def __init__(self, stream: TextIO):
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(escaped(text, self._KEEP))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class ReaderGone:
    """sys.stdout for a command whose reader may leave (`dinox decide | head -1`, a CI log that closes): once a
    write finds the pipe closed, one line says so on stderr and the rest of the output goes to /dev/null,
    while the command goes on to its end and its exit code (a sweep's trials, a decision or a verification is
    still recorded; the terminal output is only a view of them). Python's own advice for SIGPIPE-less
    programs (the signal module's docs), applied once for every command instead of at each echo."""

    def __init__(self, stream: TextIO, notice: bool = True):
        # notice: say on stderr that the reader left. stderr's own wrapper says nothing: where stdout and
        # stderr share the closed pipe (`dinox decide 2>&1 | head -1`) there is nowhere left to say it, and
        # a write that raised there would turn the command's exit code into 1.
        self._stream, self.gone, self._notice = stream, False, notice

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_left()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_left()

    def _reader_left(self) -> None:
        if self.gone:
            return
        self.gone = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())  # what is still buffered drains there
        os.close(devnull)
        if self._notice:
            sys.stderr.write("dinox: standard output was closed; going on (the results are recorded as usual)\n")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
