"""What the UI shows of a sweep: the trial line, the parent's ranked description and summary metrics."""

from dinox.store.descriptions import (
    head_to_head_line,
    sweep_metrics,
    sweep_note,
    trial_body,
    trial_note,
    with_line,
)

OK = {
    "label": "size=8",
    "status": "ok",
    "bound": "compute_bound",
    "images_per_s": 120.0,
    "step_s_p90": 0.05,
    "batch.effective": "8",
    "peak_mem_reserved_gb": 0.5,
}
# Faster over the windows, slower at its p90 step (8 / 0.05 = 160 img/s against 16 / 0.2 = 80): decide,
# which plans with the windows' figure (the p90 step is shown only), ranks it first, and so does the parent.
FAST = dict(OK, label="size=16", images_per_s=200.0, step_s_p90=0.2, **{"batch.effective": "16"})
OOM = {"label": "size=1024", "status": "oom", "error": "CUDA out of memory. Tried to allocate 2.00 GiB"}


def test_the_parent_ranks_as_decide_does_with_failures_last():
    note = sweep_note("q", [OK, OOM, FAST], resumed=2)
    assert note.splitlines()[0] == "**q**: 3 trials measured (2 ok, 1 oom), 2 already recorded."
    shaky = sweep_note("q", [OK, dict(FAST, unstable="true", window_spread=0.93, bound_evidence="loader ≤1%")])
    assert shaky.splitlines()[0] == "**q**: 2 trials measured (2 ok), 1 of the ok ones unsettled."
    assert shaky.splitlines()[-1].startswith("Unsettled: their timed windows disagreed beyond")
    # The winner first, in a line MLflow's collapsed Description shows: who, how fast, how sure.
    assert note.splitlines()[2] == (
        "Best by its forecast: **size=16**, 200.0 img/s (windows), compute_bound, its timed windows agreed. "
        "`dinox decide` reads the verdict over the windows' range."
    )
    assert "| 200.0 (unsettled: 93% apart) | - | 80.0 | compute_bound | 0.50 |" in shaky
    assert note.splitlines()[4] == (
        "| # | trial | img/s (windows) | slowest-fastest window | img/s (p90 step) | bound | peak GiB |"
    )
    table = [ln for ln in note.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert [ln.split(" | ")[1] for ln in table] == ["size=16", "size=8", "size=1024"]
    assert table[1] == "| 2 | size=8 | 120.0 | - | 160.0 | compute_bound | 0.50 |"
    ranged = sweep_note("q", [dict(OK, images_per_s_min=110.0, images_per_s_max=130.0)])
    assert "| 1 | size=8 | 120.0 | windows 110.0-130.0 img/s | 160.0 | compute_bound | 0.50 |" in ranged
    assert table[2] == "| 3 | size=1024 | oom: CUDA out of memory. Tried to allocate 2.00 GiB | - | - | - | - |"


def test_the_parent_s_best_says_which_trials_its_range_ties_it_with_as_decide_reads_them():
    """`dinox run specs/resnet50_ladder.yaml --shrink` (2026-12-01, the sweep moved 12.2 % while it ran): the
    parent named its best rung, 110.2 img/s, "its timed windows agreed", where decide tied it with two others
    by their ranges and planned at 93.5. The note names the trials its range ties it with, the move counted."""
    model = {"model.name": "resnet50", "windows": 2}
    best = dict(OK, **model, label="bf16", images_per_s=110.2, images_per_s_min=109.7, images_per_s_max=110.7)
    compiled = dict(OK, **model, label="compile", images_per_s=98.4, images_per_s_min=92.8, images_per_s_max=104.6)
    base = dict(OK, **model, label="base", images_per_s=78.4, images_per_s_min=78.3, images_per_s_max=78.5)
    other = dict(compiled, **{"model.name": "vit_small_patch16_224"}, label="vit")  # another model: never tied
    held = sweep_note("ladder", [base, compiled, best, other]).splitlines()[2]
    assert held.endswith("`dinox decide` reads the verdict over the windows' range."), held  # 104.6 < 109.7
    moved = sweep_note("ladder", [base, compiled, best, other], moved=0.122).splitlines()[2]
    assert moved.endswith(
        "Tied by their ranges with **compile**, each fast end raised by the 12.2% the sweep moved while it ran: "
        "`dinox decide` plans at the slowest of them, and `dinox head-to-head` measures them again, interleaved, "
        "until their order settles."
    ), moved
    overlapping = dict(base, images_per_s_max=111.0)  # its windows reach the best's: tied with no move at all
    assert "Tied by their ranges with **base**: `dinox decide`" in sweep_note("l", [overlapping, best]).splitlines()[2]


def test_summary_metrics_and_the_one_line_result():
    assert sweep_metrics([OK, OOM, dict(FAST, unstable="true")]) == {
        "trials_ok": 2.0,
        "trials_oom": 1.0,
        "best_images_per_s": 200.0,
        "best_peak_mem_gb": 0.5,  # the best trial's, beside its figure (FAST has no step_s_p50: none shown)
        "unsettled_trials": 1.0,
    }
    assert sweep_metrics([OOM]) == {"trials_oom": 1.0}
    metrics = {"images_per_s": 1.5, "step_s_p50": 0.1, "step_s_p90": 0.2, "images_per_s_min": 0.9}
    tags = {"dinox.bound_evidence": "loader 45-55%, copies ~0%", "dinox.unstable": "false"}
    assert trial_body("ok", "io_bound", metrics, "", tags).startswith(
        "1.5 img/s (windows), step p50 0.100s p90 0.200s, io_bound (loader 45-55%, copies ~0%)"
    )
    shaky = trial_body("ok", "io_bound", {**metrics, "images_per_s_max": 2.4}, "", {**tags, "dinox.unstable": "true"})
    assert shaky.startswith("1.5 img/s (windows) (unsettled: windows 0.9-2.4 img/s), step p50")
    assert trial_body("error", "", {}, "boom") == "boom"
    # What the trial cost against what it timed (issue 33: per trial, how much of its time was timed windows).
    timed = trial_body("ok", "io_bound", {**metrics, "trial_wall_s": 3.04, "window_s": 1.28}, "", tags)
    assert timed.endswith(", trial 3.0s (timed windows 1.3s of it)"), timed


def test_names_and_errors_are_data_in_the_descriptions_mlflow_renders():
    """A label, a sweep name, a bound or an error from a spec, a trial or the store reached the Description as
    Markdown: bold, a struck-through run, a link, a tag, a `|` that split a table row. Now each is inert."""
    import markdown

    hostile = "**b** ~~s~~ [l](javascript:x) <i>|"
    rows = [dict(OK, label=hostile, bound=hostile), dict(OOM, label=hostile, error=hostile)]
    note = sweep_note(hostile, rows)
    line = trial_note(hostile, "ok", hostile, {"images_per_s": 1.0, "step_s_p50": 1.0, "step_s_p90": 1.0}, "")
    for text in (note, line):
        html = markdown.markdown(text, extensions=["tables"])
        assert "~~" not in text and "<b>" not in html and "<i>" not in html and "<a" not in html, html
        assert "<strong>b</strong>" not in html and "**b**" in html, html  # shown as typed, styling nothing
    rows_of_table = [ln for ln in note.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert [ln.count(" | ") for ln in rows_of_table] == [6, 6]  # no `|` from the data splits a cell


def test_a_description_of_many_trials_fits_what_mlflow_keeps_of_a_tag():
    """MLflow cuts a tag over MAX_TAG_VAL_LENGTH off wherever the limit falls (a 72-trial GPU sweep's table runs
    past it): the note keeps its head, its best rows, a row counting the rest, and the drift check's line, with
    room left for the lines a head-to-head adds later."""
    from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

    rows = [
        dict(OK, label=f"model.name=vit_small_patch14_dinov2 size={n} num_workers=8", images_per_s=1000.0 - n)
        for n in range(150)
    ]
    drift = "drift check: 1 bs=0 ran 990.0-1001.0 img/s 600 s later, within its own 995.0-1003.0: the box held"
    note = sweep_note("many", rows, drift=drift)
    lines = note.splitlines()
    assert len(note) <= MAX_TAG_VAL_LENGTH - 1000 and len(sweep_note("many", rows[:1]) * 150) > MAX_TAG_VAL_LENGTH
    assert lines[0] == "**many**: 150 trials measured (150 ok)." and lines[-1].startswith("Drift check: 1 bs")
    table = [ln for ln in lines if ln.startswith("| ") and ln[2].isdigit()]
    (more,) = [ln for ln in lines if " more trials: results.csv" in ln]
    assert table[0].startswith("| 1 | model.name") and "size=0 " in table[0]  # the best first
    assert int(more.split()[2]) == 150 - len(table) > 0, (more, len(table))
    # A sweep within the limit: every row, no count row.
    few = sweep_note("few", rows[:5], drift=drift)
    assert " more trial" not in few
    assert len([ln for ln in few.splitlines() if ln.startswith("| ") and ln[2].isdigit()]) == 5


def test_head_to_head_lines_past_the_room_left_give_way_oldest_first_never_the_table_or_the_newest():
    """Each `dinox head-to-head` adds a line to the parent's Description; past the room the sweep's note left,
    the oldest lines become a count, so MLflow never cuts the newest line or the table's end."""
    from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

    rows = [dict(OK, label=f"model.name=vit_small_patch14_dinov2 size={n} num_workers=8") for n in range(150)]
    note = sweep_note("many", rows, drift="drift check: 1 bs=0 held")
    names = ", ".join(f"{n} model.name=vit_small_patch14_dinov2 size={n} num_workers=8" for n in range(1, 4))
    for n in range(1, 31):
        note = with_line(note, head_to_head_line(f"h2h-{n:02d}", 9, names, n % 2 == 0, 100.0 + n))
        assert len(note) <= MAX_TAG_VAL_LENGTH, (n, len(note))
        assert note.startswith("**many**: 150 trials measured") and " more trials: results.csv" in note
        assert "Drift check: 1 bs=0 held" in note and f"Head-to-head h2h-{n:02d}: 9 interleaved rounds" in note
    kept = [p for p in note.split("\n\n") if p.startswith("Head-to-head ")]
    assert 1 < len(kept) < 30 and kept[-1].endswith(
        "best_images_per_s is now 130.0 img/s, pooled over the rounds (`dinox decide` plans with it)."
    )
    assert f"Earlier head-to-heads: {30 - len(kept)}, " in note.splitlines()[-1]
    assert [p.split()[1] for p in kept] == [f"h2h-{n:02d}:" for n in range(31 - len(kept), 31)]  # newest kept
    # A few lines fit whole: nothing counted.
    short = with_line(with_line(sweep_note("few", rows[:3]), "Head-to-head a: x."), "Head-to-head b: y.")
    assert short.endswith("\n\nHead-to-head a: x.\n\nHead-to-head b: y.") and "Earlier" not in short


def test_the_parent_runs_plot_names_what_else_two_dots_at_one_batch_varied(tmp_path, monkeypatch):
    """The quickstart's grid (batch x loader workers) drew two unnamed dots per batch on the parent run's plot,
    which read as repeats: each is named as decide's plot names it, the best per batch joined, one series."""
    import matplotlib.figure

    from dinox import record as rec
    from dinox.contract import TrialResult
    from dinox.plan import grid
    from dinox.spec import file as spec_file
    from dinox.store.descriptions import throughput_plot
    from dinox.sweep.outputs import row
    from tests.conftest import ROOT

    trials = grid.expand(spec_file.load(ROOT / "specs" / "quickstart.yaml"))
    ips = {(8, 0): 107.2, (8, 2): 107.1, (16, 0): 143.0, (16, 2): 156.2, (32, 0): 209.0, (32, 2): 171.5}
    rows = []
    for t in trials:
        figure = ips[(t.spec.batch.size, t.spec.loader.num_workers)]
        spread = {rec.IMAGES_PER_S_MIN: figure - 3, rec.IMAGES_PER_S_MAX: figure + 3}
        rows.append(row(t, "r", TrialResult("ok", bound="compute_bound", metrics={rec.IMAGES_PER_S: figure, **spread})))
    drawn = {}
    real_save = matplotlib.figure.Figure.savefig

    def keep(fig, path, **kw):
        fig.canvas.draw()
        ax = fig.axes[0]
        lines = [(line.get_label(), list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()]
        drawn.update(texts=sorted(t.get_text() for t in ax.texts), lines=lines, ylabel=ax.get_ylabel())
        return real_save(fig, path, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    keys = {k for t in trials for k in t.spec.flat_params()}
    assert throughput_plot(rows, tmp_path / "p.png", keys) == tmp_path / "p.png"
    assert drawn["texts"] == 3 * ["num_workers=0"] + 3 * ["num_workers=2"], drawn["texts"]
    named = [line for line in drawn["lines"] if not line[0].startswith("_")]
    assert named == [("vit_tiny_patch16_224", [8, 16, 32], [107.2, 156.2, 209.0])], drawn["lines"]
    assert drawn["ylabel"] == "img/s (windows) (bar: timed windows' min-max)"
    # One window a trial (its slowest and fastest the same window): no bar, and the axis does not promise one.
    one = [{**r, rec.IMAGES_PER_S_MIN: r[rec.IMAGES_PER_S], rec.IMAGES_PER_S_MAX: r[rec.IMAGES_PER_S]} for r in rows]
    throughput_plot(one, tmp_path / "q.png", keys)
    assert drawn["ylabel"] == "img/s (windows)"
