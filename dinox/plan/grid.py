"""Expand a spec document into trials: a pure function with stable trial ids.

Order is deterministic: cases (outer, in file order) crossed with the grid (inner, keys in file order,
values in file order), so `plan` shows exactly what `run` will do, in the order it will do it.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from dataclasses import dataclass, field, replace
from typing import Any

from dinox.errors import escaped
from dinox.plan import shrink as shrinking
from dinox.plan import user_entry
from dinox.spec.data_sources import PythonData
from dinox.spec.fields import FieldProblem
from dinox.spec.file import Problem, SpecDocument, SpecError
from dinox.spec.objectives import PythonObjective
from dinox.spec.rules import check_trial
from dinox.spec.sections import ROLES, TrialSpec


@dataclass(frozen=True)
class Trial:
    index: int  # 0-based position in the sweep
    total: int
    overrides: dict[str, Any]  # the sweep values of this point, by dotted path
    spec: TrialSpec
    trial_id: str
    # Where each override is written in the spec file, so later checks can point at its line.
    locations: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # The `--set` overrides (KEY=VALUE) the spec was loaded with: recorded, so later commands can name them.
    sets: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        if not self.overrides:
            return "base"
        return " ".join(f"{_short(k)}={_fmt(v)}" for k, v in self.overrides.items())

    @property
    def run_name(self) -> str:
        """The name of its MLflow run: the index and the values it varies, short enough that the UI's runs
        table shows them whole (`5 bs=32 w=2`, where the label is `size=32 num_workers=2`)."""
        values = " ".join(f"{_ABBREV.get(k, _short(k))}={_fmt(v)}" for k, v in self.overrides.items()) or "base"
        return f"{self.index + 1} {values}{' shrunk' if self.spec.shrunk else ''}"

    def windows_only(self) -> Trial:
        """The trial as a measurement again takes it (a head-to-head's round, a sweep's drift check): its timed
        windows only, as real training runs them: no ablation window between them, no profile, no routine."""
        measure = self.spec.measure.model_copy(update={"ablation": False, "profile": None})
        return replace(self, spec=self.spec.model_copy(update={"measure": measure, "routine": None}))


# Run names: the fields sweeps vary most, abbreviated as people write them; any other field by its last part.
_ABBREV = {
    "batch.size": "bs",
    "batch.accumulation": "acc",
    "loader.num_workers": "w",
    "loader.pin_memory": "pin",
    "loader.prefetch_factor": "pf",
    "loader.persistent_workers": "pw",
    "model.name": "model",
    "model.img_size": "px",
    "model.compile": "compile",
    "model.channels_last": "cl",
    "model.grad_checkpointing": "ckpt",
    "precision": "prec",
}


def _short(path: str) -> str:
    return path.rsplit(".", 1)[-1]


def _fmt(value: Any) -> str:
    """A swept value in a label or run name, on one line (a path may hold a newline: shown escaped)."""
    return json.dumps(value, separators=(",", ":")) if isinstance(value, (dict, list)) else escaped(str(value))


def trial_id(spec: TrialSpec) -> str:
    """A hash of the params that identify a trial (dinox.spec.roles): a sweep resumed after raising its timeout or
    editing its budget or thresholds still recognises the trials already measured."""
    params = {k: v for k, v in spec.flat_params().items() if ROLES.identifies(k, v)}
    blob = json.dumps(params, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def points(doc: SpecDocument) -> list[tuple[dict[str, Any], dict[str, tuple[str, ...]]]]:
    """Every sweep point as (overrides, where each override is written in the file). A ladder's rungs take the
    place of cases: rung k holds the base with the first k changes applied, later ones winning."""
    grid = doc.sweep.grid
    keys = list(grid)
    cases = (
        rungs(doc)
        if doc.sweep.ladder
        else [
            (case, {k: ("sweep", "cases", str(ci), k) for k in case}) for ci, case in enumerate(doc.sweep.cases or [{}])
        ]
    )
    out = []
    for case, case_where in cases:
        for combo in itertools.product(*(grid[k] for k in keys)):
            overrides, where = dict(case), dict(case_where)
            for k, v in zip(keys, combo, strict=True):
                overrides[k] = v
                where[k] = ("sweep", "grid", k)
            out.append((overrides, where))
    return out


def rungs(doc: SpecDocument) -> list[tuple[dict[str, Any], dict[str, tuple[str, ...]]]]:
    """The ladder's rungs, the base first, each with where its values are written."""
    out: list[tuple[dict[str, Any], dict[str, tuple[str, ...]]]] = [({}, {})]
    for i, change in enumerate(doc.sweep.ladder):
        values, where = dict(out[-1][0]), dict(out[-1][1])
        for k, v in change.items():
            values[k], where[k] = v, ("sweep", "ladder", str(i), k)
        out.append((values, where))
    return out


def set_path(mapping: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = mapping
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = copy.deepcopy(value)


_ABSENT = object()


def get_path(mapping: dict[str, Any], dotted: str, default: Any = None) -> Any:
    node: Any = mapping
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def count(doc: SpecDocument) -> int:
    """How many trials the sweep expands to, without expanding it."""
    n = len(doc.sweep.ladder) + 1 if doc.sweep.ladder else max(1, len(doc.sweep.cases))
    for values in doc.sweep.grid.values():
        n *= len(values)
    return n


def expand(doc: SpecDocument, max_trials: int | None = None, shrink: bool = False) -> list[Trial]:
    """All trials of a spec, each validated as a full single-valued spec; with shrink, each made small first
    (dinox.plan.shrink: the overrides then hold the values the trial runs with). Raises SpecError."""
    n = count(doc)
    if max_trials is not None and n > max_trials:
        message = f"expands to {n} trials, more than the limit of {max_trials} (raise it with --max-trials)"
        raise SpecError(doc.path, [Problem("sweep", message, doc.line_of(("sweep",)))])
    pts = points(doc)
    small = shrinking.of(doc.base, [overrides for overrides, _ in pts]) if shrink else None
    codes: dict[
        tuple[str, ...], tuple[str, ...] | str
    ] = {}  # (section, entry, path) -> (hash, file, root), or what is wrong
    trials: list[Trial] = []
    # (path, message) -> (line, indices of trials it occurs in, overrides of the first)
    seen: dict[tuple[str, str], tuple[int | None, list[int], dict[str, Any]]] = {}
    for index, (overrides, where) in enumerate(pts):
        raw = copy.deepcopy(doc.base)
        for dotted, value in overrides.items():
            set_path(raw, dotted, value)
        if small is not None:
            shrinking.apply(raw, small)
            overrides = {k: v for k in overrides if (v := get_path(raw, k, _ABSENT)) is not _ABSENT}
        checked = check_trial(raw)
        if isinstance(checked, TrialSpec):
            checked = _with_code(checked, codes)
        if isinstance(checked, TrialSpec):
            trials.append(Trial(index, len(pts), overrides, checked, trial_id(checked), where))
            continue
        for fp in checked:
            key = (".".join(fp.loc), fp.message)
            if key not in seen:
                seen[key] = (_line_for(doc, fp.loc, where), [], overrides)
            seen[key][1].append(index)
    if seen:
        problems = []
        for (path, message), (line, indices, first) in seen.items():
            context = None
            if len(indices) < len(pts):
                shown = ", ".join(f"{k}={_fmt(v)}" for k, v in first.items())
                context = f"in {len(indices)} of {len(pts)} trials, e.g. {shown}"
            problems.append(Problem(path, message, line, context))
        raise SpecError(doc.path, problems)
    if doc.sweep.ladder and (idle := _idle_rungs(doc, trials)):
        raise SpecError(doc.path, idle)
    return trials


def _with_code(spec: TrialSpec, codes: dict[tuple[str, ...], tuple[str, ...] | str]) -> TrialSpec | list[FieldProblem]:
    """A trial whose objective or data is the team's own code (source: python, kind: python), each with its
    entry's source hash and file (dinox.plan.user_entry) and its path made the absolute folder the module was
    found in (a child imports it from there, whatever its working folder); or the problems."""
    updates, problems = {}, []
    for part in ("objective", "data"):
        section = getattr(spec, part)
        if not isinstance(section, (PythonObjective, PythonData)):
            continue
        key = (part, section.entry, section.path)
        if key not in codes:
            try:
                sha, file, root = user_entry.source_hash(section.entry, section.path, part)
                codes[key] = (sha, str(file), str(root))
            except (user_entry.EntryNotFound, OSError) as e:
                codes[key] = str(e) if isinstance(e, user_entry.EntryNotFound) else f"cannot read its source: {e}"
        found = codes[key]
        if isinstance(found, str):
            problems.append(FieldProblem((part, "entry"), found))
        else:
            updates[part] = section.model_copy(update={"code": found[0], "file": found[1], "path": found[2]})
    return problems or (spec.model_copy(update=updates) if updates else spec)


def _idle_rungs(doc: SpecDocument, trials: list[Trial]) -> list[Problem]:
    """A ladder rung whose trials are the ones before it (it changes nothing: each value, defaults included,
    the one it had) or an earlier rung's (it changes back): the same trial measured twice, its "effect" noise."""
    per_rung = len(trials) // (len(doc.sweep.ladder) + 1)
    blocks = [tuple(t.trial_id for t in trials[i : i + per_rung]) for i in range(0, len(trials), per_rung)]
    problems = []
    for r in range(1, len(blocks)):
        if blocks[r] == blocks[r - 1]:
            why = "this rung changes nothing: each value it sets is the one the trial had"
        elif blocks[r] in blocks[: r - 1]:
            j = blocks.index(blocks[r])
            why = f"this rung repeats {'the base' if j == 0 else f'rung {j} (sweep.ladder[{j - 1}])'}: the same trial"
        else:
            continue
        problems.append(Problem(f"sweep.ladder[{r - 1}]", why, doc.line_of(("sweep", "ladder", str(r - 1)))))
    return problems


def shard(trials: list[Trial], spec: str) -> list[Trial]:
    """The i-th of N disjoint slices of a sweep ("i/N", 1 <= i <= N): every N-th trial from the i-th, so heavy
    and light grid points spread over the hosts. Trials keep their index and total. Raises ValueError."""
    try:
        i, n = (int(part) for part in spec.split("/"))
    except ValueError:
        raise ValueError(f"{spec!r} is not i/N (e.g. 1/4)") from None
    if not 1 <= i <= n:
        raise ValueError(f"{spec!r}: i must be 1..N, the shards of N hosts are 1/N ... N/N")
    return [t for t in trials if t.index % n == i - 1]


def locate(doc: SpecDocument, found: list[tuple[Trial, str, str]]) -> list[Problem]:
    """Problems found in trials, as (trial, field path, message), at their lines in the spec file."""
    return [Problem(path, message, _line_for(doc, tuple(path.split(".")), t.locations)) for t, path, message in found]


def _line_for(doc: SpecDocument, loc: tuple[str, ...], where: dict[str, tuple[str, ...]]) -> int | None:
    """The line a problem at `loc` points at: a swept path's sweep entry, else the key in the base."""
    path = ".".join(loc)
    for dotted, location in where.items():
        if path == dotted or path.startswith(dotted + ".") or dotted.startswith(path + "."):
            return doc.line_of(location)
    return doc.line_of(loc)
