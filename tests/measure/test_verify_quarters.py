"""`dinox verify`'s child splits its slice into quarters of its time, each closed with the device synchronised, and
takes each quarter's pace at its steps' own: the routine's seconds and each epoch start's excess over a typical
step left out (the forecast charges those apart). A fake clock: no torch step."""

from __future__ import annotations

import math

import pytest

from dinox.measure.verify import Quarters


def test_quarters_close_on_time_and_leave_the_routine_and_epoch_starts_out_of_their_pace():
    q = Quarters(start=100.0, length=40.0)
    now, closed_at = 100.0, []
    for i in range(80):  # 0.5 s steps of 10 images: 20 img/s, 40 s
        took = 0.5
        now += took
        first = 2.5 if i == 30 else None  # an epoch start in the second quarter: 2.5 s, a typical step's 0.5 and 2 more
        routine = 3.0 if i == 50 else 0.0  # a checkpoint in the third
        now += (first or took) - took + routine
        q.step(10.0, first, routine)
        if q.due(now):
            closed_at.append(now)
            q.close(now)
    q.close(now)
    assert len(q.closed) == 4 and len(closed_at) == 3  # three edges inside the slice, the fourth at its end
    assert closed_at == [110.0, 120.0, 130.5]  # the first step ending at or after each quarter of the 40 s
    rates = q.rates(typical=0.5)
    assert rates == pytest.approx([20.0] * 4)  # every quarter at the steps' own pace, whatever it held
    assert q.steady_s(0.5) == pytest.approx(40.0) and now - 100.0 == pytest.approx(45.0)  # 2 + 3 s set aside


def test_a_box_that_changed_speed_inside_the_slice_shows_in_its_quarters():
    q = Quarters(start=0.0, length=60.0)
    now = 0.0
    while now < 60.0:
        took = 64 / 218 if 15.0 <= now < 45.0 else 64 / 180  # the 2-core VM's two paces, the middle half fast
        now += took
        q.step(64.0, None, 0.0)
        if q.due(now):
            q.close(now)
    q.close(now)
    rates = q.rates(0.0)
    assert (
        len(rates) == 4
        and min(rates) == pytest.approx(180.0, rel=0.01)
        and max(rates) == pytest.approx(218.0, rel=0.01)
    )


def test_a_slice_without_a_time_bound_has_one_part_and_no_quarters():
    q = Quarters(start=0.0, length=math.inf)
    for t in range(1, 100):
        q.step(8.0, None, 0.0)
        assert not q.due(float(t))
    q.close(100.0)
    assert len(q.rates(0.0)) == 1  # the child records quarters only from two parts on
