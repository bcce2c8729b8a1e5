"""Every plot copes with what a sweep can leave: one point, nothing but OOMs, pruned batches, a target far off."""

import matplotlib.colors
import pytest
from PIL import Image

from dinox.decide import budget
from dinox.decide import verdict as decide
from dinox.decide.budget import fmt_days
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


def test_a_plot_reads_without_the_readme(tmp_path, monkeypatch):
    """Log-axis ticks are numbers (they printed `$\\mathdefault{10^{2}}$` once mathtext was off), the legend
    says what a dot and a bar are, and two trials at one batch size say what else they varied."""
    from dinox.report import plots

    figures = {}
    real_save = plots._save

    def keep(fig, path):
        fig.canvas.draw()
        ax = fig.axes[0]
        figures[path.name] = (
            ax.get_yscale(),
            [t.get_text() for t in ax.get_yticklabels()],
            ax.get_legend_handles_labels()[1],
            [t.get_text() for t in ax.texts],
        )
        return real_save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    # Models decades apart (a log axis), and two trials at batch 48 that differ in their accumulation.
    rows = study.study() + study.loader_study() + [study.trial(study.VIT_L, 48, 8, 30.0)]
    _plots(rows, tmp_path)
    scale, ticks, legend, texts = figures["throughput_vs_batch.png"]
    assert scale == "log" and ticks and not any("$" in t for t in ticks), ticks
    assert "a trial: img/s (windows) (what decide plans with)" in legend
    assert "its timed windows, slowest to fastest (img/s (windows))" in legend
    assert {"accumulation=4", "accumulation=8"} <= set(texts), texts


def test_days_vs_budget_draws_each_range_and_says_an_unsettled_verdict(tmp_path, monkeypatch):
    """No clean bar where the windows disagree: each model is a bar from its fastest to its slowest window, a
    tick at the forecast, amber where the range straddles the budget, and the title says it is not settled."""
    from dinox.report import plots

    seen = {}
    real_save = plots._save

    def keep(fig, path):
        ax = fig.axes[0]
        bars = [(p.get_x(), p.get_x() + p.get_width(), p.get_facecolor()) for p in ax.patches]
        seen[path.name] = (ax.get_title(), bars, [t.get_text() for t in ax.texts])
        return real_save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    rows = study.study()
    for row in rows:  # ViT-L's windows 20 % apart: 11.0-13.2 days around a 12-day budget
        if row["params"]["model.name"].startswith("vit_large") and row["tags"]["dinox.status"] == "ok":
            ips = row["metrics"]["images_per_s"]
            row["metrics"].update(images_per_s_min=ips * 0.91, images_per_s_max=ips * 1.09)
    tight = budget.Budget(days=12, dataset_size=study.DATASET, epochs=study.EPOCHS)
    d = decide.decide(study.records(rows), tight)
    assert d.verdict == "UNSETTLED"
    plots.write_plots(d, study.records(rows), tmp_path)
    title, bars, texts = seen["days_vs_budget.png"]
    assert title.startswith("UNSETTLED (not settled): ")
    large = next(m for m in d.models if m.name == "vit_large_patch14_dinov2")
    low, high, colour = bars[[m.name for m in d.models].index("vit_large_patch14_dinov2")]
    assert (low, high) == (pytest.approx(large.span.days_fast), pytest.approx(large.span.days_slow))
    assert low < 12 < high and matplotlib.colors.to_hex(colour) == matplotlib.colors.to_hex("tab:orange")
    assert any("(UNSETTLED)" in t and f"forecast {fmt_days(large.days)}" in t for t in texts), texts


def _drawn(rows, tmp_path, monkeypatch, name: str, prefix: str):
    """What plot `name` drew for these rows: its texts that start with `prefix`, each (text, box on the canvas,
    colour); the axes' box; each line's colour by its label."""
    from dinox.report import plots

    seen = {}
    real_save = plots._save

    def keep(fig, path):
        fig.canvas.draw()
        ax = fig.axes[0]
        renderer = fig.canvas.get_renderer()
        texts = [t for t in ax.texts if t.get_text().startswith(prefix)]
        seen[path.name] = (
            [(t.get_text(), t.get_window_extent(renderer), t.get_color()) for t in texts],
            ax.get_window_extent(renderer),
            {line.get_label(): line.get_color() for line in ax.get_lines()},
        )
        return real_save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    _plots(rows, tmp_path)
    return seen[name]


def _apart(texts) -> None:
    for i, (text, box, _) in enumerate(texts):
        for other, obox, _ in texts[i + 1 :]:
            assert not box.overlaps(obox), f"{text!r} drawn over {other!r}"


def test_loader_alone_figures_off_the_scale_never_overlap(tmp_path, monkeypatch):
    """The quickstart's case: three batch sizes whose loader alone ran 30-50x their steps at 0 and 2 workers.
    Each figure is drawn at the top edge with an arrow; at one worker count they stack (they were drawn one on
    top of another, unreadable), each in its line's colour, none cut off by the frame."""
    rows = []
    for size, ips in ((8, 107.0), (16, 150.0), (32, 205.0)):
        for workers in (0, 2):
            row = study.trial({"model.name": "vit_tiny_patch16_224"}, size, 2, ips, workers=workers, params_m=5.5)
            row["metrics"]["loader_images_per_s"] = ips * (30 + size)
            rows.append(row)
    arrows, frame, lines = _drawn(rows, tmp_path, monkeypatch, "throughput_vs_workers.png", "\u2191")
    assert len(arrows) == 6, [a[0] for a in arrows]
    for text, box, _ in arrows:
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1, f"{text} cut off by the frame"
    _apart(arrows)
    colours = {colour for _, _, colour in arrows}
    assert len(colours) == 3 and colours <= set(lines.values()), (colours, lines)


def test_two_trials_at_one_batch_and_one_rate_have_names_that_do_not_overlap(tmp_path, monkeypatch):
    """The quickstart's batch 8: 0 and 2 workers at 107.2 and 107.1 img/s printed one name over the other."""
    model = {"model.name": "vit_tiny_patch16_224"}
    rows = [
        study.trial(model, size, 2, ips, workers=workers, params_m=5.5)
        for size, workers, ips in ((8, 0, 107.2), (8, 2, 107.1), (16, 0, 143.0), (16, 2, 156.2), (32, 0, 209.0))
    ]
    named, _frame, _lines = _drawn(rows, tmp_path, monkeypatch, "throughput_vs_batch.png", "num_workers=")
    assert sorted(text for text, _, _ in named) == 2 * ["num_workers=0"] + 2 * ["num_workers=2"]
    _apart(named)


def test_days_vs_budget_says_a_forecast_is_real_training_s_where_verify_replaced_it(tmp_path, monkeypatch):
    """A trial verified outside its windows is planned at real training's rate: its bar's text, the tick's
    legend and the axis say so, never "all windows" alone."""
    from dinox.report import plots
    from tests.verify.test_verify import _verify_run

    seen = {}
    real_save = plots._save

    def keep(fig, path):
        ax = fig.axes[0]
        seen[path.name] = (ax.get_legend_handles_labels()[1], ax.get_xlabel(), [t.get_text() for t in ax.texts])
        return real_save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    rows = study.study()
    plots.write_plots(decide.decide(study.records(rows), BUDGET), study.records(rows), tmp_path)
    legend, axis, _texts = seen["days_vs_budget.png"]
    assert "forecast (all windows)" in legend and axis.endswith("slowest timed window of the plan's trials")
    best = rows[0]["run_id"]  # ViT-L 48x4, windows 23.42-23.66 img/s; trained at 23.0 (NO-GO on this budget)
    d = decide.decide(study.records(rows), BUDGET, verified={best: _verify_run(best, 23.0, 0.02)})
    plots.write_plots(d, study.records(rows), tmp_path)
    legend, axis, texts = seen["days_vs_budget.png"]
    assert "forecast: all windows, or real training's rate (dinox verify)" in legend, legend
    assert axis.endswith("slowest rate in windows or real training of the plan's trials"), axis
    assert any(t.endswith("forecast 50.3 at real training's rate (NO-GO)") for t in texts), texts
    # An UNDECIDED verification (its box had moved) is not planned with, but its rate widens the range: the axis
    # and the batch plot's bar say their ends are not all windows'.
    moved = _verify_run(best, 19.0, 0.24)
    moved.tags["dinox.verify_moved"] = "true"
    d = decide.decide(study.records(rows), BUDGET, verified={best: moved})
    plots.write_plots(d, study.records(rows), tmp_path)
    legend, axis, texts = seen["days_vs_budget.png"]
    assert "forecast (all windows)" in legend and axis.endswith("rate in windows or real training of the plan's trials")
    widened = "slowest to fastest (img/s (windows)); widened to real training's rate where dinox verify fell outside"
    assert any(widened in x for x in seen["throughput_vs_batch.png"][0]), seen["throughput_vs_batch.png"][0]
