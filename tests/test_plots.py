"""Every plot copes with what a sweep can leave: one point, nothing but OOMs, pruned batches, a target far off."""

import pytest
from PIL import Image

from dinox.decide import budget
from dinox.decide import verdict as decide
from dinox.report.plots import write_plots
from tests import study

BUDGET = budget.Budget(days=15, dataset_size=1_000_000, epochs=100)


def _plots(rows, tmp_path, budget=BUDGET):
    records = study.records(rows)
    paths = write_plots(decide.decide(records, budget), records, tmp_path)
    for p in paths:
        with Image.open(p) as im:
            assert im.size[0] > 400 and im.size[1] > 200
    return {p.name for p in paths}


@pytest.mark.parametrize(
    "rows",
    [
        [study.trial(study.VIT_L, 48, 4, 23.5)],  # a single point
        [study.trial(study.VIT_G, 8, 1, None, "oom"), study.trial(study.VIT_G, 16, 1, None, "skipped")],  # all OOM
        [study.trial(study.VIT_G, 8, 1, None, "oom")],  # one OOM, nothing else
        study.study() + [study.trial(study.VIT_L, 256, 1, None, "skipped")],  # the study, a pruned batch
    ],
    ids=["single", "all_oom", "one_oom", "study_pruned"],
)
def test_each_plot_is_written(rows, tmp_path):
    assert {"throughput_vs_batch.png", "days_vs_budget.png"} <= _plots(rows, tmp_path)


def test_a_target_far_above_the_data_and_a_one_day_budget(tmp_path):
    b = budget.Budget(days=1, dataset_size=100_000_000, epochs=100)
    assert "throughput_vs_batch.png" in _plots(study.study(), tmp_path, b)


def test_no_record_at_all_is_refused_before_any_plot():
    with pytest.raises(budget.DecisionError, match="no trial runs"):
        decide.decide([], BUDGET)
