"""The sweep's journal: what `dinox sync` rebuilds a trial from when the store missed its result."""

from __future__ import annotations

import dataclasses

from dinox.contract import TrialResult
from dinox.plan import grid
from dinox.spec import file as spec_file
from dinox.store.journal import Journal, new_result_id
from tests.conftest import TINY


def test_a_journaled_trial_comes_back_with_its_set_overrides(tmp_path):
    """sync opens the run of a result the store missed from the journal alone: the `--set`s the trial was
    measured with come back too (its run's dinox.sets, which decide's commands are built from)."""
    (tmp_path / "s.yaml").write_text(TINY.format(name="j"))
    (trial,) = grid.expand(spec_file.load(tmp_path / "s.yaml"))
    trial = dataclasses.replace(trial, sets=("measure.bench_steps=2",))
    journal = Journal(tmp_path)
    journal.result(new_result_id(), trial, TrialResult("ok"), None, "")
    journal.result(new_result_id(), dataclasses.replace(trial, sets=()), TrialResult("ok"), None, "")
    state = journal.read()
    assert not state.bad_lines
    assert [p.trial.sets for p in state.pending] == [("measure.bench_steps=2",), ()]
    assert state.pending[0].trial.trial_id == trial.trial_id


def test_an_id_in_a_journal_line_is_read_only_in_the_form_dinox_writes(tmp_path):
    """The journal's result and run ids go into the store's search filters and the terminal: a quote (which would
    end the filter it is put in), a newline or another type makes that line a bad line, named; the rest is read."""
    import json

    (tmp_path / "s.yaml").write_text(TINY.format(name="j"))
    (trial,) = grid.expand(spec_file.load(tmp_path / "s.yaml"))
    journal = Journal(tmp_path)
    good, other = new_result_id(), new_result_id()
    journal.result(good, trial, TrialResult("ok"), None, "")
    journal.opened(good, "0123456789abcdef0123456789abcdef")
    hostile = [
        {"event": "logged", "result_id": "x' OR tags.a = 'b", "run_id": "r"},
        {"event": "logged", "result_id": good, "run_id": "abc\n"},
        {"event": "opened", "result_id": other, "run_id": ["a"]},
        {"event": "opened", "result_id": good.upper(), "run_id": "abc"},
    ]
    with open(tmp_path / "results.jsonl", "a") as f:
        f.writelines(json.dumps(e) + "\n" for e in hostile)
    state = journal.read()
    assert state.bad_lines == [
        "line 3: logged event that cannot be read (ValueError: result_id \"x' OR tags.a = 'b\" is not an id dinox "
        "writes)",
        "line 4: logged event that cannot be read (ValueError: run_id 'abc\\n' is not an id dinox writes)",
        "line 5: opened event that cannot be read (ValueError: run_id \"['a']\" is not an id dinox writes)",
        f"line 6: opened event that cannot be read (ValueError: result_id '{good.upper()}' is not an id dinox writes)",
    ], state.bad_lines
    (pending,) = state.pending
    assert pending.result_id == good and pending.run_id == "0123456789abcdef0123456789abcdef"


def test_a_drift_check_is_pending_until_logged_and_only_a_check_dinox_writes_is_read(tmp_path):
    """The drift check goes to the store as its trial's tag: a line with rates that are no range, a string for a
    number or a quote in its id is a bad line, named; a check of a result the journal lacks is not pending."""
    import json

    from dinox.contract import DriftCheck

    (tmp_path / "s.yaml").write_text(TINY.format(name="j"))
    (trial,) = grid.expand(spec_file.load(tmp_path / "s.yaml"))
    journal = Journal(tmp_path)
    first, stray = new_result_id(), new_result_id()
    check = DriftCheck(101.0, 99.5, 103.2, 3, 42.0)
    journal.result(first, trial, TrialResult("ok"), None, "")
    journal.drift_check(first, check)
    journal.drift_check(stray, check)  # no result of that id in this journal: nothing to put it on
    hostile = [
        {"event": "drift_check", "result_id": first, "check": {**json.loads(check.to_json()), "slow_ips": 120.0}},
        {"event": "drift_check", "result_id": first, "check": {**json.loads(check.to_json()), "windows": "3"}},
        {"event": "drift_check", "result_id": "x' OR '1", "check": json.loads(check.to_json())},
        {"event": "drift_logged", "result_id": first.upper()},
    ]
    with open(tmp_path / "results.jsonl", "a") as f:
        f.writelines(json.dumps(e) + "\n" for e in hostile)
    state = journal.read()
    assert [line.split(" (")[0] for line in state.bad_lines] == [
        "line 4: drift_check event that cannot be read",
        "line 5: drift_check event that cannot be read",
        "line 6: drift_check event that cannot be read",
        "line 7: drift_logged event that cannot be read",
    ], state.bad_lines
    assert "is not a drift check dinox writes" in state.bad_lines[0], state.bad_lines
    assert state.pending_drift == {first: check}
    journal.drift_logged(first)
    assert journal.read().pending_drift == {}


def test_a_sweep_end_keeps_the_parent_s_close_and_only_what_dinox_writes_is_read(tmp_path):
    """sync closes a parent the store missed from the sweep_end line: its status goes to MLflow's run status,
    its note to the Description, its metrics to the run: a status MLflow has no such word for, a metric the
    record does not declare for a sweep, a value that is not a finite number or a note that is not text is a
    bad line, named; an older line with the status alone is read as before."""
    import json

    journal = Journal(tmp_path)
    note = "**s**: 2 trials measured (2 ok)."
    journal.sweep_end("FINISHED", note=note, metrics={"trials_ok": 2, "best_images_per_s": 9.5})
    state = journal.read()
    assert (state.end_status, state.end_note, state.end_error) == ("FINISHED", note, "")
    assert state.end_metrics == {"trials_ok": 2.0, "best_images_per_s": 9.5}
    hostile = [
        {"event": "sweep_end", "status": "SCHEDULED"},
        {"event": "sweep_end", "status": "FINISHED", "metrics": {"images_per_s": 3.0}},
        {"event": "sweep_end", "status": "FINISHED", "metrics": {"trials_ok": float("nan")}},
        {"event": "sweep_end", "status": "FINISHED", "metrics": {"trials_ok": True}},
        {"event": "sweep_end", "status": "KILLED", "note": ["x"]},
        {"event": "sweep_end", "status": "KILLED"},
    ]
    with open(tmp_path / "results.jsonl", "a") as f:
        f.writelines(json.dumps(e) + "\n" for e in hostile)
    state = journal.read()
    assert [line.split(" (")[0] for line in state.bad_lines] == [
        f"line {n}: sweep_end event that cannot be read" for n in (2, 3, 4, 5, 6)
    ], state.bad_lines
    assert "'SCHEDULED' is not one a sweep ends with" in state.bad_lines[0]
    assert "'images_per_s': '3.0' is not a summary metric dinox writes" in state.bad_lines[1]
    assert (state.end_status, state.end_note, state.end_metrics) == ("KILLED", "", {})
