"""The MLflow record as one contract: every name defined once in dinox.record, documented in docs/record.md."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from dinox import record

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- record:begin (python -m dinox.record) -->", "<!-- record:end -->"


def test_docs_record_md_holds_the_record_as_the_module_defines_it():
    text = (ROOT / "docs" / "record.md").read_text()
    block = text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip()
    assert block == record.markdown().strip(), "regenerate the block with `python -m dinox.record`"
    for name in record.NAMES:
        assert f"`{name}`" in text


def test_every_name_has_a_meaning_and_one_kind():
    assert len(record.NAMES) > 90
    for entry in record.NAMES.values():
        assert len(entry.meaning) > 8, entry.name
        # dinox's own tags, and the one of MLflow's that decide reads (the sweep a trial ran in), said so.
        assert entry.kind != "tag" or entry.name.startswith("dinox.") or entry.meaning.startswith("MLflow's own")
    assert record.known("dinox.status", "tag") and not record.known("dinox.status", "metric")
    assert record.known("trials_ok", "metric") and record.known("budget.days", "param")
    assert not record.known("dinox.made_up", "tag") and not record.known("images_per_sec", "metric")


def _string_literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_outside_the_record_a_dinox_dotted_string_is_a_module_or_a_file():
    """`grep '"dinox.' dinox/` finds record names only in dinox/record.py: the rest name modules to run."""
    found = []
    for path in sorted((ROOT / "dinox").rglob("*.py")):
        if path.name == "record.py":
            continue
        for line, value in _string_literals(path):
            if value.startswith("dinox.") and " " not in value:
                if value != "dinox.schema.json" and importlib.util.find_spec(value) is None:
                    found.append(f"{path.relative_to(ROOT)}:{line}: {value}")
    assert not found, found


def test_a_default_trial_measures_the_windows_a_go_needs():
    """measure.min_repeats defaults to the fewest windows decide lets a GO rest on: a default trial can be GO."""
    from dinox.spec.sections import MeasureSpec
    from dinox.store.trial_record import SETTLED_WINDOWS

    assert MeasureSpec().min_repeats == SETTLED_WINDOWS == 3
