"""Sweep expansion: order, crossing of cases with the grid, and stable trial ids."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dinox.plan import grid
from dinox.spec import file as spec_file
from tests.conftest import ROOT

SWEEP = """\
name: g
model: {name: resnet18}
batch: {size: 8, accumulation: 1}
sweep:
  grid:
    loader.num_workers: [0, 2, 4]
    loader.pin_memory: [true, false]
  cases:
    - {batch.size: 48, batch.accumulation: 4}
    - {batch.size: 64, batch.accumulation: 4}
"""


def test_cases_cross_the_grid_in_file_order(write_spec):
    trials = grid.expand(spec_file.load(write_spec(SWEEP)))
    assert len(trials) == 2 * 3 * 2
    assert [t.index for t in trials] == list(range(12))
    assert all(t.total == 12 for t in trials)
    first, last = trials[0], trials[-1]
    assert first.overrides == {
        "batch.size": 48,
        "batch.accumulation": 4,
        "loader.num_workers": 0,
        "loader.pin_memory": True,
    }
    assert last.overrides == {
        "batch.size": 64,
        "batch.accumulation": 4,
        "loader.num_workers": 4,
        "loader.pin_memory": False,
    }
    assert [t.spec.loader.num_workers for t in trials[:6]] == [0, 0, 2, 2, 4, 4]
    assert first.spec.batch.size == 48 and first.spec.effective_batch == 192
    assert first.label == "size=48 accumulation=4 num_workers=0 pin_memory=True"


def test_no_sweep_is_one_trial(write_spec):
    (t,) = grid.expand(spec_file.load(write_spec("name: g\nmodel: {name: resnet18}\n")))
    assert t.overrides == {} and t.label == "base"


def test_trial_ids_are_unique_and_stable(write_spec):
    path = write_spec(SWEEP)
    ids = [t.trial_id for t in grid.expand(spec_file.load(path))]
    assert len(set(ids)) == len(ids)
    # Same ids in a fresh interpreter: nothing process-specific (hash seeds, dict order) leaks in.
    ids_of = f"grid.expand(spec_file.load({str(path)!r}))"
    imports = "from dinox.plan import grid; from dinox.spec import file as spec_file"
    code = f"{imports}; print(' '.join(t.trial_id for t in {ids_of}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ids


def test_same_configuration_same_id_however_written(write_spec):
    a = write_spec("name: a\nmodel: {name: resnet18}\nbatch: {size: 64, accumulation: 4}\n", "a.yaml")
    b = write_spec(
        "name: b\nmodel: {name: resnet18}\nbatch: {size: 64, effective: 256}\n"
        "measure: {timeout_s: 60, bound_threshold: 0.2}\nhardware: {peak_tflops: 989}\n"
        "budget: {days: 3, target_images: 100}\n",
        "b.yaml",
    )
    c = write_spec("name: a\nmodel: {name: resnet18}\nbatch: {size: 64, accumulation: 2}\n", "c.yaml")
    (ta,), (tb,), (tc,) = (grid.expand(spec_file.load(p)) for p in (a, b, c))
    assert ta.trial_id == tb.trial_id  # none of name, timeout, threshold, peak, budget changes what is measured
    assert ta.trial_id != tc.trial_id


def test_set_path_creates_nested_mappings():
    raw: dict = {"model": {"name": "x"}}
    grid.set_path(raw, "model.kwargs.depth", 4)
    grid.set_path(raw, "loader.num_workers", 2)
    assert raw == {"model": {"name": "x", "kwargs": {"depth": 4}}, "loader": {"num_workers": 2}}


def test_shipped_specs_keep_their_trial_ids_and_params():
    """Frozen before the layout moved (issue 25): a trial id names the same measurement across releases."""
    import json

    root = ROOT
    frozen = json.loads((root / "tests/plan/shipped_trials.json").read_text())
    assert sorted(frozen) == sorted(p.name for p in (root / "specs").glob("*.yaml"))
    for name, expected in frozen.items():
        trials = grid.expand(spec_file.load(root / "specs" / name))
        got = [{"id": t.trial_id, "params": t.spec.flat_params()} for t in trials]
        assert got == expected, name


def test_run_names_keep_the_varied_values_short(write_spec):
    trials = grid.expand(spec_file.load(write_spec(SWEEP)))
    assert trials[0].label == "size=48 accumulation=4 num_workers=0 pin_memory=True"
    assert trials[0].run_name == "1 bs=48 acc=4 w=0 pin=True"
    assert trials[11].run_name == "12 bs=64 acc=4 w=4 pin=False"


def test_a_swept_value_holding_a_newline_stays_on_its_line_in_labels_and_run_names(write_spec):
    # A path may hold one (YAML's quoted strings do): the trial's line and its MLflow run name show it escaped.
    spec = (
        "name: p\nmodel: {name: resnet18}\ndata: {source: ct_png}\n"
        'sweep: {grid: {data.index_csv: ["a\\nb.csv", "c.csv"]}}\n'
    )
    first, second = grid.expand(spec_file.load(write_spec(spec)))
    assert first.spec.data.index_csv == "a\nb.csv"  # the value itself is kept as written
    assert (first.label, first.run_name) == ("index_csv=a\\nb.csv", "1 index_csv=a\\nb.csv")
    assert second.label == "index_csv=c.csv"


LADDER = """\
name: l
model: {name: resnet18}
sweep:
  ladder:
    - {model.channels_last: true}
    - {precision: bf16-mixed, batch.size: 16}
    - {batch.size: 32}
"""


def test_a_ladder_applies_its_changes_cumulatively_one_trial_per_rung(write_spec):
    trials = grid.expand(spec_file.load(write_spec(LADDER)))
    assert [t.overrides for t in trials] == [
        {},
        {"model.channels_last": True},
        {"model.channels_last": True, "precision": "bf16-mixed", "batch.size": 16},
        {"model.channels_last": True, "precision": "bf16-mixed", "batch.size": 32},
    ]
    assert trials[0].spec.model.channels_last is False and trials[3].spec.batch.size == 32
    assert grid.count(spec_file.load(write_spec(LADDER))) == 4


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("  cases:\n    - {batch.size: 8}\n", "spec.yaml:4: sweep.ladder: a ladder is its own sweep form"),
        ("  grid:\n    batch.size: [8, 16]\n", "spec.yaml:6: sweep.ladder[1]: batch.size is also swept by sweep.grid"),
    ],
)
def test_a_ladder_is_refused_beside_cases_and_where_the_grid_sweeps_its_field(write_spec, extra, message):
    from dinox.spec.file import SpecError

    with pytest.raises(SpecError) as e:
        spec_file.load(write_spec(LADDER + extra))
    assert message in str(e.value), str(e.value)


def test_a_bad_rung_is_named_at_its_line(write_spec):
    from dinox.spec.file import SpecError

    with pytest.raises(SpecError) as e:
        grid.expand(spec_file.load(write_spec(LADDER.replace("{batch.size: 32}", "{loader.num_wrkers: 2}"))))
    assert "spec.yaml:7: sweep.ladder[2]['loader.num_wrkers']" in str(e.value), str(e.value)


def test_a_ladder_rung_that_changes_nothing_or_changes_back_is_refused_at_its_line(tmp_path):
    """A rung equal to the one before it (channels_last: false is the default already) or to an earlier one
    (fp32 again: the base) measures the same trial twice and reads noise as a knob's effect; a --set on a
    field the ladder changes was accepted, then silently lost after rung 0. All refused, naming the line."""
    from tests.conftest import run_dinox

    (tmp_path / "lad.yaml").write_text(
        "name: lad\nmodel: {name: resnet18, img_size: 32}\nbatch: {size: 4}\nprecision: fp32\n"
        "sweep:\n  ladder:\n    - {precision: bf16-mixed}\n    - {model.channels_last: false}\n"
        "    - {precision: fp32}\n    - {model.compile: true}\n"
    )
    proc = run_dinox(["validate", "lad.yaml"], tmp_path)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        "lad.yaml:8: sweep.ladder[1]: this rung changes nothing: each value it sets is the one the trial had",
        "lad.yaml:9: sweep.ladder[2]: this rung repeats the base: the same trial",
    ], proc.stderr
    text = (tmp_path / "lad.yaml").read_text()
    (tmp_path / "ok.yaml").write_text(text.replace("    - {model.channels_last: false}\n    - {precision: fp32}\n", ""))
    proc = run_dinox(["validate", "ok.yaml", "--set", "precision=tf32"], tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "error: ok.yaml: precision: is swept by the spec's sweep section, which would replace this value in every "
        "trial (--set precision=tf32)"
    ), proc.stderr
    assert run_dinox(["validate", "ok.yaml"], tmp_path).returncode == 0
