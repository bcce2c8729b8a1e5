"""The tracking store as a sweep uses it: every call best effort (the journal holds the result already), an
outage reported once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dinox.errors import interrupted, shell_word
from dinox.store.backend import shown_uri
from dinox.store.journal import Journal
from dinox.store.recorder import SweepRecorder
from dinox.sweep.interrupts import Interrupted
from dinox.sweep.outputs import SweepReport

# MLflow's answers that refuse what was written (a param name it does not take, a value too long): the store
# is there, so they are never reported as an outage.
REFUSALS = ("INVALID_PARAMETER_VALUE", "RESOURCE_LIMIT_EXCEEDED", "BAD_REQUEST")


class BestEffortStore:
    """MLflow, best effort: a failed call is reported once per outage and the sweep goes on."""

    def __init__(
        self, recorder: SweepRecorder, journal: Journal | None, echo: Callable[[str], None], report: SweepReport
    ):
        self.recorder, self.journal, self.echo, self.report = recorder, journal, echo, report
        self.down = False

    def call(self, fn: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
        try:
            value = fn(*args)
        except Exception as e:  # noqa: BLE001 - any failure of the store: the result is in the journal
            if stop := interrupted(e, (KeyboardInterrupt, Interrupted)):  # a Ctrl-C a library wrapped: still one
                raise stop from None
            self.report.store_failures += 1
            if getattr(e, "error_code", "") in REFUSALS:  # the store is up and said no: not an outage
                self.echo(
                    f"warning: tracking store {shown_uri(self.recorder.uri)} refused a write "
                    f"({self.recorder.explain(e)}); "
                    "a sync cannot change that: the record itself is at fault, please report it"
                )
                return False, None
            if not self.down:
                kept = (
                    (
                        f"results stay in {self.journal.path}; "
                        f"run `dinox sync {shell_word(self.journal.path.parent)}` once it is back"
                    )
                    if self.journal is not None
                    else "nothing was measured yet"
                )
                why = self.recorder.explain(e)
                self.echo(f"warning: tracking store {shown_uri(self.recorder.uri)} failed ({why}); {kept}")
            self.down = True
            return False, None
        if self.down:
            self.echo(f"note: tracking store {shown_uri(self.recorder.uri)} answers again")
        self.down = False
        return True, value
