"""`dinox verify`: the forecast held against real training. One trial (the decision's recommendation, or a named
trial run) trained for a bounded slice in a child of its own (dinox.measure.verify), through the same loader,
data, epoch boundaries and step as the trial; the slice's wall time against decide's forecast for the same
images, recorded as a run (dinox.role = verify) that `dinox decide` then reads.

`dinox head-to-head` (``head_to_head``): tied leaders measured again in rounds, each trial once a round in an
order that reverses every round, each measurement a run (dinox.role = head_to_head) that decide orders them by.

Offers: ``verify`` (the whole recipe, ``run``), ``Forecast`` (what decide forecast for the trial),
``slice_forecast`` and ``VerifyOutcome`` (the verdict's rules, ``outcome``), the step the slice trains (its
batch, device, cores, threads and OpenMP policy as the forecast measured them, ``step``);
``head_to_head.head_to_head`` and ``head_to_head.Leader``.
"""

from dinox.verify.outcome import Forecast, VerifyOutcome, slice_forecast
from dinox.verify.run import verify

__all__ = ["Forecast", "VerifyOutcome", "slice_forecast", "verify"]
