"""`--set KEY=VALUE`: change a spec's fixed fields from the command line without editing the file.

KEY is a dotted path as in `sweep` (`batch.size`, `data.index_csv`); VALUE is read as YAML (`32`, `true`,
`[1, 2]`, `{a: 1}`, a string otherwise). Several may be given, or several in one value separated by `;`
(the form an MLproject parameter takes). The result is validated like the file itself; a problem in a
value set here names the override.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dinox.spec.file import MAX_YAML_DEPTH, Problem, SpecDocument, SpecError, safe_yaml


def parse(items: tuple[str, ...] | list[str]) -> list[tuple[str, str | None]]:
    """[(dotted key, raw value, None when there was no "=")] from `--set` arguments; empty items are ignored."""
    out: list[tuple[str, str | None]] = []
    for part in (p.strip() for item in items for p in item.split(";")):
        if part:
            key, eq, value = part.partition("=")
            out.append((key.strip(), value.strip() if eq else None))
    return out


def apply(doc: SpecDocument, items: list[tuple[str, str | None]]) -> SpecDocument:
    """A copy of `doc` with each override in its base mapping. Raises SpecError naming every bad override."""
    if not items:
        return doc
    base = _deep_copy(doc.base)
    swept = set(doc.sweep.grid) | {k for entry in (*doc.sweep.cases, *doc.sweep.ladder) for k in entry}
    problems: list[Problem] = []
    lines = dict(doc.lines)
    for key, raw in items:
        problem = _set(base, key, raw, swept)
        if problem:
            problems.append(Problem(key, f"{problem} (--set {key}{'' if raw is None else '=' + raw})"))
        else:  # its line in the file no longer holds its value
            lines = {p: n for p, n in lines.items() if p[: len(key.split("."))] != tuple(key.split("."))}
    if problems:
        raise SpecError(doc.path, problems)
    note = "\n".join(f"# --set {k}={v}" for k, v in items)
    return dataclasses.replace(doc, base=base, lines=lines, text=f"{doc.text.rstrip()}\n{note}\n")


def _set(base: dict[str, Any], key: str, raw: str | None, swept: set[str]) -> str:
    """Put the value in place; "" on success, else what is wrong."""
    parts = key.split(".")
    if raw is None or not key or "" in parts:
        return "needs KEY=VALUE with a dotted KEY such as batch.size"
    if len(parts) > MAX_YAML_DEPTH:  # the file's own limit: a key is a path of mappings as deep as its parts
        return f"a key {len(parts)} parts deep; a spec nests at most {MAX_YAML_DEPTH} levels"
    if parts[0] == "sweep":
        return "sets a fixed field; a sweep is edited in the file"
    if key in swept:
        return "is swept by the spec's sweep section, which would replace this value in every trial"
    inside = sorted(s for s in swept if s.startswith(key + ".") or key.startswith(s + "."))
    if inside:
        return (
            f"the sweep varies {', '.join(inside)}: setting {key} would replace it in every trial; "
            "set the fields beside it one by one"
        )
    value, _node, problem = safe_yaml(raw, len(parts) - 1) if raw else ("", None, None)
    if problem is not None:  # the same reader and limits as a spec file
        return f"the value: {problem.message}"
    node = base
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            return f"{'.'.join(parts[: i + 1])} is {child!r}, not a section"
        node = child
    node[parts[-1]] = value
    return ""


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value
