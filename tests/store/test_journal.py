"""The sweep's journal: what `dinox sync` rebuilds a trial from when the store missed its result."""

from __future__ import annotations

import dataclasses

from dinox.contract import TrialResult
from dinox.plan import grid
from dinox.spec import file as spec_file
from dinox.store.journal import Journal
from tests.conftest import TINY


def test_a_journaled_trial_comes_back_with_its_set_overrides(tmp_path):
    """sync opens the run of a result the store missed from the journal alone: the `--set`s the trial was
    measured with come back too (its run's dinox.sets, which decide's commands are built from)."""
    (tmp_path / "s.yaml").write_text(TINY.format(name="j"))
    (trial,) = grid.expand(spec_file.load(tmp_path / "s.yaml"))
    trial = dataclasses.replace(trial, sets=("measure.bench_steps=2",))
    journal = Journal(tmp_path)
    journal.result("r1", trial, TrialResult("ok"), None, "")
    journal.result("r2", dataclasses.replace(trial, sets=()), TrialResult("ok"), None, "")
    state = journal.read()
    assert not state.bad_lines
    assert [p.trial.sets for p in state.pending] == [("measure.bench_steps=2",), ()]
    assert state.pending[0].trial.trial_id == trial.trial_id
