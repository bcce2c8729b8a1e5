"""Spec loading and validation: every refusal names file, line and field path."""

from __future__ import annotations

import pytest

from dinox.plan import grid
from dinox.spec import file as spec_file


def load_trials(path):
    return grid.expand(spec_file.load(path))


def problems(path) -> str:
    with pytest.raises(spec_file.SpecError) as info:
        load_trials(path)
    return info.value.render()


def test_minimal_spec_gets_defaults(write_spec):
    trials = load_trials(write_spec("name: m\nmodel: {name: resnet18}\n"))
    assert len(trials) == 1
    t = trials[0].spec
    assert (t.precision, t.batch.size, t.accumulation, t.effective_batch) == ("fp32", 32, 1, 32)
    assert t.loader.num_workers == 0 and t.loader.prefetch_factor is None
    assert t.measure.warmup_steps == 5 and t.measure.bench_steps == 20


def test_unknown_key_names_line_path_and_suggestion(write_spec):
    path = write_spec("name: m\nmodel: {name: resnet18}\nloader:\n  num_wrkers: 4\n")
    msg = problems(path)
    assert f"{path}:4: loader.num_wrkers: unknown field (did you mean 'num_workers'?)" in msg


def test_unknown_top_level_section(write_spec):
    msg = problems(write_spec("name: m\nmodel: {name: resnet18}\nprecison: bf16-mixed\n"))
    assert ":3: precison: unknown field (did you mean 'precision'?)" in msg


@pytest.mark.parametrize(
    ("body", "path", "fragment"),
    [
        ("batch: {size: four}", "batch.size", "valid integer"),
        ("batch: {size: 0}", "batch.size", "greater than 0"),
        ("loader: {num_workers: -1}", "loader.num_workers", "greater than or equal to 0"),
        ("precision: fp8", "precision", "'fp32', 'fp32-strict', 'tf32', 'bf16-mixed' or 'fp16-mixed'"),
        ("model: {name: resnet18, compile: fast}", "model.compile", "max-autotune"),
        ("hardware: {device: tpu}", "hardware.device", "'auto', 'cuda', 'cpu' or 'mps'"),
        ("measure: {timeout_s: -5}", "measure.timeout_s", "greater than 0"),
    ],
)
def test_wrong_values_name_their_field(write_spec, body, path, fragment):
    base = "name: m\n" if body.startswith("model:") else "name: m\nmodel: {name: resnet18}\n"
    text = base + body + "\n"
    msg = problems(write_spec(text))
    assert f"{path}:" in msg and fragment in msg


def test_prefetch_with_zero_workers_is_refused_for_the_trials_it_hits(write_spec):
    path = write_spec(
        """\
        name: m
        model: {name: resnet18}
        loader: {prefetch_factor: 4}
        sweep:
          grid:
            loader.num_workers: [0, 4]
        """
    )
    msg = problems(path)
    assert "loader.prefetch_factor: 4 needs loader.num_workers > 0" in msg
    assert "in 1 of 2 trials, e.g. loader.num_workers=0" in msg


def test_persistent_workers_need_workers(write_spec):
    msg = problems(write_spec("name: m\nmodel: {name: resnet18}\nloader: {persistent_workers: true}\n"))
    assert "loader.persistent_workers: true needs loader.num_workers > 0" in msg


def test_accumulation_must_match_effective(write_spec):
    msg = problems(write_spec("name: m\nmodel: {name: resnet18}\nbatch: {size: 64, accumulation: 2, effective: 256}\n"))
    assert "batch.accumulation: 2 does not match batch.effective 256" in msg and "= 4" in msg


def test_effective_must_be_a_multiple_of_size(write_spec):
    msg = problems(write_spec("name: m\nmodel: {name: resnet18}\nbatch: {size: 48, effective: 100}\n"))
    assert "batch.effective: 100 is not a multiple of batch.size 48" in msg


def test_effective_derives_accumulation(write_spec):
    (t,) = load_trials(write_spec("name: m\nmodel: {name: resnet18}\nbatch: {size: 64, effective: 256}\n"))
    assert (t.spec.accumulation, t.spec.effective_batch) == (4, 256)
    assert t.spec.flat_params()["batch.accumulation"] == "4"


def test_compile_needs_a_warmup_step(write_spec):
    msg = problems(write_spec("name: m\nmodel: {name: resnet18, compile: true}\nmeasure: {warmup_steps: 0}\n"))
    assert "measure.warmup_steps: 0 with model.compile on" in msg


def test_kwargs_cannot_shadow_dinox_knobs(write_spec):
    msg = problems(write_spec("name: m\nmodel: {name: resnet18, kwargs: {img_size: 96, pretrained: true}}\n"))
    assert "model.kwargs.img_size: set model.img_size instead" in msg
    assert "model.kwargs.pretrained:" in msg


def test_budget_needs_one_complete_form(write_spec):
    msg = problems(write_spec("name: m\nmodel: {name: resnet18}\nbudget: {days: 15, dataset_size: 1000}\n"))
    assert "budget: needs target_images, or dataset_size together with epochs" in msg
    both = "budget: {days: 1, target_images: 5, epochs: 2, dataset_size: 3}\n"
    msg = problems(write_spec("name: m\nmodel: {name: r}\n" + both))
    assert "not both" in msg


def test_budget_prices_are_positive_per_device_name(write_spec):
    ok = 'budget: {days: 15, target_images: 1000, prices: {"NVIDIA H100 80GB HBM3": 2.5}, max_cost: 900}\n'
    (trial,) = grid.expand(spec_file.load(write_spec("name: m\nmodel: {name: resnet18}\n" + ok)))
    assert trial.spec.budget.prices == {"NVIDIA H100 80GB HBM3": 2.5} and trial.spec.budget.max_cost == 900
    bad = "budget: {days: 15, target_images: 1000, prices: {A10G: -1}, price_per_device_hour: 0}\n"
    msg = problems(write_spec("name: m\nmodel: {name: resnet18}\n" + bad))
    assert "budget.prices.A10G:" in msg and "budget.price_per_device_hour:" in msg


def test_python_tags_are_refused(write_spec):
    path = write_spec('name: m\nmodel: !!python/object/apply:os.system ["echo pwned"]\n')
    msg = problems(path)
    assert f"{path}:2: not valid YAML" in msg and "constructor" in msg


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("", "this is an empty file"), ("- a\n- b\n", "this is a list"), ("name: [unclosed\n", "not valid YAML")],
)
def test_documents_that_are_not_specs(write_spec, text, fragment):
    assert fragment in problems(write_spec(text))


def test_missing_file(tmp_path):
    msg = problems(tmp_path / "nope.yaml")
    assert "nope.yaml: cannot read spec" in msg


def test_sweep_path_that_does_not_exist(write_spec):
    path = write_spec(
        """\
        name: m
        model: {name: resnet18}
        sweep:
          grid:
            loader.num_wrkers: [0, 2]
          cases:
            - {batch.siz: 8}
        """
    )
    msg = problems(path)
    expected = "sweep.grid['loader.num_wrkers']: no field 'num_wrkers' in loader (did you mean 'num_workers'?)"
    assert f"{path}:5: {expected}" in msg
    assert f"{path}:7: sweep.cases[0]['batch.siz']: no field 'siz' in batch (did you mean 'size'?)" in msg


def test_sweep_cannot_sweep_a_path_twice(write_spec):
    path = write_spec("name: m\nmodel: {name: r}\nsweep:\n  grid: {batch.size: [1, 2]}\n  cases: [{batch.size: 3}]\n")
    assert "batch.size is also swept by sweep.grid" in problems(path)


def test_sweep_values_are_validated_like_the_base(write_spec):
    path = write_spec("name: m\nmodel: {name: r}\nsweep:\n  grid:\n    batch.size: [8, -8]\n")
    msg = problems(path)
    assert f"{path}:5: batch.size: Input should be greater than 0 (got -8)" in msg
    assert "in 1 of 2 trials" in msg


def test_empty_grid_list_is_refused(write_spec):
    msg = problems(write_spec("name: m\nmodel: {name: r}\nsweep:\n  grid:\n    batch.size: []\n"))
    assert "sweep.grid.batch.size" in msg and "at least 1 item" in msg


def test_kwargs_are_free_form_and_sweepable(write_spec):
    path = write_spec("name: m\nmodel: {name: vit_base_patch16_224}\nsweep:\n  grid:\n    model.kwargs.depth: [2, 4]\n")
    trials = load_trials(path)
    assert [t.spec.model.kwargs["depth"] for t in trials] == [2, 4]
    assert trials[0].spec.flat_params()["model.kwargs.depth"] == "2"


def test_duplicate_keys_are_refused_with_both_lines(write_spec):
    path = write_spec("name: m\nmodel: {name: resnet18}\nbatch: {size: 8}\nmodel: {name: resnet50}\n")
    assert f"{path}:4: model: duplicate key (first given on line 2)" in problems(path)


def test_a_fixed_repeats_overrides_the_window_bounds():
    from dinox.spec.sections import MeasureSpec

    assert MeasureSpec().window_bounds == (3, 5)  # 3: the fewest windows a GO may rest on
    assert MeasureSpec(min_repeats=3, max_repeats=8).window_bounds == (3, 8)
    assert MeasureSpec(min_repeats=3, max_repeats=8, repeats=1).window_bounds == (1, 1)  # --set measure.repeats=1


@pytest.mark.parametrize(
    "name",
    ["model.kwargs.depth", "model.kwargs.bad!key", "a/b", "a/../b", "/abs", "..", ".", "x:y", "k" * 251, "sp ace", "é"],
)
def test_dinox_and_mlflow_agree_on_which_param_names_mlflow_takes(name):
    """dinox's copy of MLflow's param rules (dinox validate does not import MLflow) against MLflow's own."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.validation import _validate_param

    from dinox.record import param_problem

    try:
        _validate_param(name, "v")
        mlflow_takes = True
    except MlflowException:
        mlflow_takes = False
    assert (param_problem(name, "v") == "") == mlflow_takes, name


def test_a_key_that_looks_like_a_union_tag_is_named_not_a_traceback(write_spec):
    """Found by the fuzz corpus: a top-level key with brackets (`"x[0]  cases": ...`) left no field path, and
    the unknown-field message indexed into it: IndexError, exit 1."""
    from dinox.plan import grid

    with pytest.raises(spec_file.SpecError) as e:
        grid.expand(spec_file.load(write_spec('name: s\nmodel: {name: resnet18}\n"x[0]  cases": [1]\n')))
    assert "x[0]  cases: unknown field" in str(e.value), str(e.value)
