"""The store's reading rules, in-process: a password never shown, a damaged record never trusted, store text
made one inert line."""

from __future__ import annotations

import math

import pytest

from dinox.store.backend import shown_uri
from dinox.store.trial_record import TrialRecord, measured_spread, record_problem, store_text


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
