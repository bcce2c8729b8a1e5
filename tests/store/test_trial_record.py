"""The store's reading rules, in-process: a password never shown, a damaged record never trusted, store text
made one inert line."""

from __future__ import annotations

import math

import pytest

from dinox.store.backend import shown_uri
from dinox.store.trial_record import TrialRecord, code_span, inert, measured_spread, record_problem, store_text


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("http://team:s3cret@mlflow:5000", "http://team:***@mlflow:5000"),
        ("postgresql://u:p%40ss@db/mlflow", "postgresql://u:***@db/mlflow"),
        ("http://mlflow:5000", "http://mlflow:5000"),
        ("sqlite:///mlflow.db", "sqlite:///mlflow.db"),
        ("http://h:notaport", "http://h:notaport"),
    ],
)
def test_a_password_in_a_tracking_uri_is_masked_and_nothing_else_changes(uri, shown):
    assert shown_uri(uri) == shown


def _ok(**metrics: float) -> TrialRecord:
    return TrialRecord(
        "r", "0", "1 bs=2", {"batch.size": "2"}, {"images_per_s": 10.0, **metrics}, {"dinox.status": "ok"}
    )


def test_a_record_another_tool_or_an_edit_damaged_is_never_trusted():
    assert record_problem(_ok()) is None
    assert record_problem(_ok(images_per_s=math.nan)) == "images_per_s nan is not a finite positive number"
    assert record_problem(_ok(step_s_p50=1e-9)) == "step_s_p50 1e-09 s is shorter than a microsecond"
    assert record_problem(_ok(images_per_s=1e12)) == "images_per_s 1e+12 is more than 10^7 per device"
    negative = TrialRecord("r", "0", "", {"batch.size": "-4"}, {"images_per_s": 1.0}, {"dinox.status": "ok"})
    assert record_problem(negative) == "batch.size '-4' is not a positive integer"


def test_a_single_window_measured_no_spread_and_store_text_is_one_inert_line():
    assert measured_spread({"window_spread": 0.0, "windows": 1.0}) is None
    assert measured_spread({"window_spread": 0.12, "windows": 3.0}) == 0.12
    assert store_text("a\nb|c\x1b[2J") == "a b¦c [2J"


@pytest.mark.parametrize(
    ("text", "span"),
    [
        ("5 bs=32 w=0", "`5 bs=32 w=0`"),
        ("a`b", "``a`b``"),
        ("x=``y`` `z", "```x=``y`` `z```"),
        ("`edge`", "`` `edge` ``"),
    ],
)
def test_a_code_span_holds_its_text_whole_and_inert_text_styles_nothing(text, span):
    """A run name or a `--set` with a backtick ended report.md's code span early (the rest of the command then
    read as text); store text outside one may hold `*`, `_`, `[` or `<` without restyling the page."""
    import html

    import markdown

    assert code_span(text) == span
    rendered = markdown.markdown(f"run {code_span(text)} now")
    assert rendered.count("<code>") == 1 and rendered.endswith("</code> now</p>"), rendered
    assert html.unescape(rendered.split("<code>")[1].split("</code>")[0]) == text.strip()
    plain = markdown.markdown(inert(f"**{text}** _x_ [l](javascript:y) <b>"))
    assert "<strong>" not in plain and "<em>" not in plain and "<a" not in plain and "<b>" not in plain, plain
    assert "->" in inert("a -> b") and code_span("") == ""
    name = "vit_large_patch14_dinov2 (embed_dim=1024) _em_ __init__"  # readable as typed where nothing opens
    assert inert(name) == r"vit_large_patch14_dinov2 (embed_dim=1024) \_em\_ \_\_init\_\_"
    assert markdown.markdown(inert(name)) == f"<p>{name}</p>"
    # `~~` strikes through in the MLflow UI's GitHub flavour: an entity each renderer shows as the character
    struck = inert("a ~~b~~ c~d")
    assert "~~" not in struck and "c~d" in struck and html.unescape(markdown.markdown(struck)) == "<p>a ~~b~~ c~d</p>"
