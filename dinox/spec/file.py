"""A spec file: read safely (size, encoding, nesting and alias limits, SafeLoader only), every key's line
indexed, the sweep section checked; problems rendered as ``file:line: field.path: message``.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dinox.errors import DinoxError, escaped
from dinox.spec.fields import field_problems, path_problem
from dinox.spec.sections import SweepSpec, TrialSpec

# --- errors ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    path: str
    message: str
    line: int | None = None
    context: str | None = None  # which trials, when the problem comes from sweep values

    def render(self, file: str) -> str:
        """One line: a newline or carriage return from a value inside it (a name, a path, a swept value) is
        shown escaped, or it would start a line of its own that reads as dinox's."""
        where = f"{file}:{self.line}" if self.line else file
        ctx = f" [{self.context}]" if self.context else ""
        path = f"{self.path}: " if self.path else ""
        return escaped(f"{where}: {path}{self.message}{ctx}")


class SpecError(DinoxError):
    """Bad input. Rendered as one line per problem: ``file:line: field.path: message``."""

    def __init__(self, file: str, problems: list[Problem]):
        self.file = file
        self.problems = problems
        super().__init__(file)

    def __str__(self) -> str:  # the problems as they are now (the CLI names the --set a problem came from)
        return self.render()

    def render(self, limit: int = 20) -> str:
        lines = [p.render(self.file) for p in self.problems[:limit]]
        if len(self.problems) > limit:
            lines.append(f"{self.file}: ... and {len(self.problems) - limit} more problems")
        return "\n".join(lines)


# --- loading ---------------------------------------------------------------------------------------


@dataclass
class SpecDocument:
    """A parsed spec file before expansion: the base mapping, the sweep, and where each key sits."""

    path: str
    text: str
    base: dict[str, Any]
    sweep: SweepSpec
    lines: dict[tuple[str, ...], int] = field(default_factory=dict)

    def line_of(self, path: tuple[str, ...]) -> int | None:
        # The deepest key that exists in the file: an unknown nested value still points at its parent.
        for n in range(len(path), 0, -1):
            if path[:n] in self.lines:
                return self.lines[path[:n]]
        return None


MAX_SPEC_BYTES = 1_000_000
MAX_YAML_NODES = 100_000
MAX_YAML_DEPTH = 32


def read_limited(path: str | Path, what: str = "spec", limit: int = MAX_SPEC_BYTES) -> str:
    """A regular file's text, at most `limit` bytes of it read. Raises SpecError. Opened without blocking and
    checked on the open descriptor: a FIFO would block the read forever, /dev/zero would fill the memory."""
    name = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise SpecError(name, [Problem("", f"cannot read {what}: {e.strerror or e}")]) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
            raise SpecError(name, [Problem("", f"{what} is {kind}, not a regular file")])
        with os.fdopen(os.dup(fd), "rb") as f:
            raw_bytes = f.read(limit + 1)
    except OSError as e:
        raise SpecError(name, [Problem("", f"cannot read {what}: {e.strerror or e}")]) from None
    finally:
        os.close(fd)
    if len(raw_bytes) > limit:
        raise SpecError(name, [Problem("", f"{what} is more than {limit} bytes; the limit is {limit}")])
    try:
        return raw_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(name, [Problem("", f"{what} is not UTF-8 text ({e.reason} at byte {e.start})")]) from None


def safe_yaml(text: str, depth: int = 0) -> tuple[Any, yaml.Node | None, Problem | None]:
    """(data, its node tree, None), or (None, None, what is wrong): YAML read with a spec file's limits, the
    same for a file and for a --set value (placed `depth` levels down). SafeLoader only: a spec can never
    construct python objects (no !!python tags); nesting and alias expansion are bounded before anything
    large is built."""
    if len(text.encode()) > MAX_SPEC_BYTES:
        return None, None, Problem("", f"more than {MAX_SPEC_BYTES} bytes; the limit is {MAX_SPEC_BYTES}")
    depth_problem = _nesting_problem(text, depth)
    if depth_problem is not None:
        return None, None, depth_problem
    try:
        # Composed once: the node tree gives the line numbers, and the same tree is constructed into the data.
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is not None and _expanded_size(node, MAX_YAML_NODES) > MAX_YAML_NODES:
                why = f"the YAML expands to more than {MAX_YAML_NODES} values through anchors and aliases"
                return None, None, Problem("", f"{why}; a spec needs far fewer")
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        return None, None, Problem("", f"not valid YAML: {problem}", mark.line + 1 if mark else None)
    return data, node, None


def load(path: str | Path) -> SpecDocument:
    """Read and safely parse a spec file; validate the sweep section's shape. Raises SpecError."""
    name = str(path)
    text = read_limited(path)
    data, node, problem = safe_yaml(text)
    if problem is not None:
        raise SpecError(name, [problem])
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise SpecError(name, [Problem("", f"a spec is a YAML mapping of sections; this is {got}")])
    lines: dict[tuple[str, ...], int] = {}
    duplicates: list[Problem] = []
    if node is not None:
        _index_lines(node, (), lines, duplicates)
    if duplicates:
        # PyYAML keeps the last of two equal keys; a section written twice would silently lose the first.
        raise SpecError(name, duplicates)
    sweep_raw = data.pop("sweep", None) or {}
    try:
        sweep = SweepSpec.model_validate(sweep_raw)
    except ValidationError as e:
        doc = SpecDocument(name, text, data, SweepSpec(), lines)
        raise SpecError(name, problems_from_validation(e, doc, ("sweep",), SweepSpec)) from None
    doc = SpecDocument(name, text, data, sweep, lines)
    _check_sweep_paths(doc)
    return doc


def _nesting_problem(text: str, depth: int = 0) -> Problem | None:
    """Mappings and lists nested deeper than MAX_YAML_DEPTH. PyYAML composes a document recursively, so a
    2 KB file nested 500 deep ends in a RecursionError; its event stream is flat, so it is read first."""
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    line = event.start_mark.line + 1 if event.start_mark else None
                    return Problem(
                        "", f"YAML nested more than {MAX_YAML_DEPTH} levels deep; a spec needs far fewer", line
                    )
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    except yaml.YAMLError:
        return None  # the loader reports it, with its line
    return None


def _expanded_size(node: yaml.Node, limit: int) -> int:
    """Nodes visited with every alias expanded, stopping past `limit`: PyYAML shares aliased nodes, so a
    "billion laughs" document is small in memory, but anything that walks it (validation) would not be."""
    seen, stack = 0, [node]
    while stack and seen <= limit:
        n = stack.pop()
        seen += 1
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                stack += (k, v)
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
    return seen


def _index_lines(
    node: yaml.Node, path: tuple[str, ...], out: dict[tuple[str, ...], int], duplicates: list[Problem]
) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            if (*path, key) in out:
                first = out[(*path, key)]
                duplicates.append(Problem(".".join((*path, key)), f"duplicate key (first given on line {first})", line))
            out[(*path, key)] = line
            _index_lines(value_node, (*path, key), out, duplicates)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[(*path, str(i))] = item.start_mark.line + 1
            _index_lines(item, (*path, str(i)), out, duplicates)


def _check_sweep_paths(doc: SpecDocument) -> None:
    problems: list[Problem] = []
    grid_keys = set(doc.sweep.grid)
    located: list[tuple[str, tuple[str, ...]]] = [(k, ("sweep", "grid", k)) for k in doc.sweep.grid]
    if doc.sweep.ladder and doc.sweep.cases:
        problems.append(
            Problem(
                "sweep.ladder",
                "a ladder is its own sweep form: give sweep.cases or sweep.ladder, not both",
                doc.line_of(("sweep", "ladder")),
            )
        )
    for form, entries in (("cases", doc.sweep.cases), ("ladder", doc.sweep.ladder)):
        for i, entry in enumerate(entries):
            located += [(k, ("sweep", form, str(i), k)) for k in entry]
            if both := sorted(grid_keys & set(entry)):
                message = f"{', '.join(both)} is also swept by sweep.grid; sweep it in one place"
                problems.append(Problem(f"sweep.{form}[{i}]", message, doc.line_of(("sweep", form, str(i)))))
    for dotted, where in located:
        head = dotted.split(".")[0]
        message = f"{head} cannot be swept" if head in ("sweep", "name") else path_problem(TrialSpec, dotted)
        if message:
            section = "sweep.grid" if where[1] == "grid" else f"sweep.{where[1]}[{where[2]}]"
            problems.append(Problem(f"{section}[{dotted!r}]", message, doc.line_of(where)))
    if problems:
        raise SpecError(doc.path, problems)


def problems_from_validation(
    err: ValidationError, doc: SpecDocument, prefix: tuple[str, ...] = (), root: Any = TrialSpec
) -> list[Problem]:
    return [
        Problem(".".join((*prefix, *fp.loc)), fp.message, doc.line_of((*prefix, *fp.loc)))
        for fp in field_problems(err, root)
    ]
