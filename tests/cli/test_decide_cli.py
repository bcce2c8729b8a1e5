"""`dinox decide` as a user runs it, on stores built through MLflow's public API: a SQLite file, and a real
`mlflow server` process on loopback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest
from mlflow import MlflowClient

from tests import study
from tests.conftest import ROOT, run_dinox

BUDGET = ["--days", "15", "--dataset-size", str(study.DATASET), "--epochs", str(study.EPOCHS)]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sqlite_store(tmp_path_factory):
    work = tmp_path_factory.mktemp("decide")
    uri = f"sqlite:///{work / 'mlflow.db'}"
    client = MlflowClient(uri)
    parent, _ids = study.log(client, "study", study.study())
    study.log(client, "loader", study.loader_study())
    study.log(client, "two_devices", study.two_devices())
    client.create_experiment("empty")
    errors = [study.trial(study.VIT_L, b, 1, None, "error") for b in (8, 16)]
    for row in errors:
        row["tags"]["dinox.error"] = "hardware.device: cuda was asked for but torch.cuda.is_available() is False"
    study.log(client, "all_error", errors)
    study.log(
        client,
        "all_oom",
        [study.trial(study.VIT_G, 8, 1, None, "oom"), study.trial(study.VIT_G, 16, 1, None, "skipped")],
    )
    return work, uri, parent


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


def decide(work, uri, *args):
    """`dinox decide` in this process: the same click command a user's `dinox decide` runs, without paying a
    fresh interpreter's imports each time (the tests about the process itself, its exit code on a crash or a
    store it cannot read, call run_dinox)."""
    from click.testing import CliRunner

    from dinox.cli.main import main

    here = os.getcwd()
    os.chdir(work)
    try:
        r = CliRunner().invoke(main, ["decide", "--tracking-uri", uri, *args])
    finally:
        os.chdir(here)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception  # a traceback: what the command must never end with
    return Done(r.exit_code, r.stdout, r.stderr)


def test_go_writes_report_json_plots_and_a_decision_run(sqlite_store):
    work, uri, _ = sqlite_store
    proc = decide(work, uri, "--experiment", "study", *BUDGET, "--out", "go")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("GO: vit_large_patch14_dinov2 ")
    payload = json.loads((work / "go" / "decision.json").read_text())
    assert payload["verdict"] == "GO" and payload["settled"] is True and payload["exit_code"] == 0
    assert payload["recommended"]["model"] == "vit_large_patch14_dinov2"
    # 48x4 leads, tied with 64x4 (their windows overlap): the forecast is the slower one's, 23.51 img/s, and
    # that one is recommended.
    assert payload["recommended"]["configuration"]["batch.size"] == "64"
    assert payload["recommended"]["days"] == pytest.approx(12.04, abs=0.01)
    assert payload["recommended"]["span"]["days_slow"] == pytest.approx(12.10, abs=0.01)
    giant = next(m for m in payload["models"] if m["model"] == "vit_giant_patch14_dinov2")
    assert giant["verdict"] == "NO-GO" and giant["epochs_in_budget"] == pytest.approx(28.62, abs=0.01)
    assert giant["oom_boundary"][0]["largest_ok"] == 4 and giant["oom_boundary"][0]["smallest_oom"] == 8
    report = (work / "go" / "report.md").read_text()
    assert report.startswith("# Throughput decision: GO") and "Proceed with **vit_large_patch14_dinov2" in report
    for png in ("throughput_vs_batch.png", "days_vs_budget.png"):
        assert (work / "go" / png).read_bytes()[:8] == PNG
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("study")
    (run,) = client.search_runs([exp.experiment_id], "tags.`dinox.role` = 'decision'")
    assert run.data.tags["dinox.verdict"] == "GO" and run.info.status == "FINISHED"
    assert run.data.tags["dinox.settled"] == "true"
    assert run.data.params["budget.days"] == "15.0"
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {
        "report.md",
        "report.html",
        "decision.json",
        "throughput_vs_batch.png",
        "days_vs_budget.png",
        "knobs.png",  # the study varies batch, accumulation and checkpointing: what each bought
    }
    # The run's Description in the UI: a sentence and a Markdown table the UI wraps (a monospace block of the
    # terminal summary was cut at the right edge), names inert.
    note = run.data.tags["mlflow.note.content"]
    assert (
        note.startswith("**GO**: vit_large_patch14_dinov2 (depth=24, embed_dim=1024) is the largest")
        and "```" not in note
    )
    assert "| model | forecast img/s | slowest-fastest window | days | days range | verdict |" in note.splitlines()
    assert any(ln.startswith("| vit_large_patch14_dinov2") and ln.endswith("| GO |") for ln in note.splitlines())
    page = (work / "go" / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count('src="data:image/png;base64,') == 3  # with knobs.png
    assert "<table>" in page and "Proceed with <strong>vit_large_patch14_dinov2" in page


def test_no_go_exits_1(sqlite_store):
    work, uri, _ = sqlite_store
    proc = decide(
        work, uri, "--experiment", "study", "--days", "10", "--target-images", "24452700", "--no-log", "--out", "nogo"
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith(
        "NO-GO: no model finishes 24,452,700 images in 10 days, even at the fastest window measured; it needs 28.3"
    )


def test_run_id_reads_one_sweep(sqlite_store):
    work, uri, parent = sqlite_store
    proc = decide(work, uri, "--run-id", parent, *BUDGET, "--effective-batch", "256", "--no-log", "--out", "rid")
    assert proc.returncode == 0, proc.stderr
    payload = json.loads((work / "rid" / "decision.json").read_text())
    assert payload["recommended"]["configuration"]["batch.size"] == "64"
    assert payload["sources"] == [f"sweep run {parent}"]


def test_loader_sweep_knee_plot_and_several_experiments(sqlite_store):
    work, uri, _ = sqlite_store
    proc = decide(work, uri, "--experiment", "study", "--experiment", "loader", *BUDGET, "--no-log", "--out", "ld")
    assert proc.returncode == 0, proc.stderr
    payload = json.loads((work / "ld" / "decision.json").read_text())
    assert len(payload["models"]) == 3
    knee = next(k for k in payload["loader"]["knees"] if k["settings"].get("loader.pin_memory") == "True")
    assert (knee["knee_workers"], knee["best_workers"]) == (8, 24)
    assert (work / "ld" / "throughput_vs_workers.png").read_bytes()[:8] == PNG
    assert "Worker knee" in (work / "ld" / "report.md").read_text()


def test_budget_and_experiment_from_the_spec(sqlite_store):
    work, uri, _ = sqlite_store
    (work / "s.yaml").write_text(
        f"name: study\nmodel: {{name: resnet18}}\nbudget: {{days: 15, dataset_size: "
        f"{study.DATASET}, epochs: {study.EPOCHS}}}\n"
    )
    proc = decide(work, uri, "--spec", "s.yaml", "--no-log", "--out", "sp")
    assert proc.returncode == 0, proc.stderr
    # An option overrides the spec's budget field by field.
    # 12 days: the forecast (12.04) misses, the fastest windows (11.98) fit: the evidence cannot decide.
    proc = decide(work, uri, "--spec", "s.yaml", "--days", "12", "--no-log", "--out", "sp2")
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.startswith("UNSETTLED (exit 3: the measurement cannot decide): ")
    payload = json.loads((work / "sp2" / "decision.json").read_text())
    assert payload["verdict"] == "UNSETTLED" and payload["settled"] is False and payload["exit_code"] == 3


def test_two_devices_get_a_verdict_each_a_cost_and_the_cheapest_go(sqlite_store):
    work, uri, _ = sqlite_store
    prices = ["--price", f"{study.H100}=2.5", "--price", "0.5"]  # a bare number: every other device
    proc = decide(work, uri, "--experiment", "two_devices", *BUDGET, *prices, "--no-log", "--out", "dev")
    assert proc.returncode == 0, proc.stderr
    # ViT-G is GO on the H100 only (52 days on the APU): the largest GO model anywhere, and where.
    assert proc.stdout.startswith(
        f"GO: vit_giant_patch14_dinov2 (depth=40, embed_dim=1536) is the largest model that finishes 100 epochs "
        f"of 244,527 images in 15 days, on {study.H100}: forecast 21.6 img/s (windows) -> 13.1 days"
    ), proc.stdout
    assert "costing 786" in proc.stdout.splitlines()[0]
    assert (
        f"cheapest in time: vit_large_patch14_dinov2 (depth=24, embed_dim=1024) on {study.APU}, 12.0 days for 144"
        in proc.stdout
    )
    payload = json.loads((work / "dev" / "decision.json").read_text())
    by_device = {d["device"]: d for d in payload["devices"]}
    assert by_device[study.APU]["verdict"] == "GO" and by_device[study.APU]["recommended"]["model"].startswith(
        "vit_large"
    )
    assert by_device[study.H100]["recommended"]["model"].startswith("vit_giant")
    assert by_device[f"2 x {study.H100}"]["recommended"]["cost"] == pytest.approx(1.67 * 2 * 24 * 2.5, rel=0.01)
    assert payload["recommended"]["device"] == study.H100 and payload["recommended"]["cost"] == pytest.approx(
        786, rel=0.01
    )
    assert payload["cheapest"]["device"] == study.APU and payload["cheapest"]["cost"] == pytest.approx(144.2, rel=0.01)
    assert [w["factor"] for w in payload["what_if"]] == [0.5, 1.0, 2.0]
    assert payload["what_if"][2]["days"] == pytest.approx(26.2, rel=0.01)  # 2x the dataset: NO-GO
    giant_apu = next(n for n in payload["needs"] if n["device"] == study.APU)
    assert giant_apu["needs_images_per_s"] == pytest.approx(18.9, rel=0.01) and giant_apu["factor"] > 3.4
    # Two H100s scaled ViT-L at 90 %: every model measured on one H100 is projected onto two at 90 %.
    giant_two = next(p for p in payload["projections"] if p["model"].startswith("vit_giant"))
    assert giant_two["efficiency"] == pytest.approx(0.9) and giant_two["days"] == pytest.approx(13.1 / 1.8, rel=0.01)
    report = (work / "dev" / "report.md").read_text()
    for section in ("## Per device", "## Cost", "## What if", "## Scaling projection"):
        assert section in report
    assert f"| {study.APU} | GO | vit_large_patch14_dinov2 (depth=24, embed_dim=1024) |" in report

    # A cost cap the giant breaks: the largest model within both the days and the money, on its cheapest device.
    proc = decide(work, uri, "--experiment", "two_devices", *BUDGET, *prices, "--max-cost", "500", "--no-log")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("GO: vit_large_patch14_dinov2 (depth=24, embed_dim=1024) is the largest model"), (
        proc.stdout
    )
    assert f"for at most 500, on {study.APU}" in proc.stdout.splitlines()[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--experiment", "nope", *BUDGET], "error: experiment 'nope' not found in sqlite:///"),
        (["--experiment", "empty", *BUDGET], "error: no dinox trial runs (tag dinox.status) in experiment empty"),
        (["--experiment", "study"], "error: no budget: give --days"),
        (["--experiment", "study", "--days", "3"], "error: budget needs --target-images, or --dataset-size"),
        ([*BUDGET], "error: give --experiment NAME, --run-id ID or --spec SPEC"),
        (["--run-id", "0123abc", *BUDGET], "error: run '0123abc' not found"),
        (["--experiment", "study", *BUDGET, "--price", "H100=cheap"], "error: --price 'H100=cheap': expected NAME="),
        (["--experiment", "study", *BUDGET, "--max-cost", "-5"], "error: --max-cost: "),
    ],
)
def test_errors_exit_2_with_one_line(sqlite_store, args, message):
    work, uri, _ = sqlite_store
    proc = decide(work, uri, *args, "--no-log")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(message), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_decide_against_a_real_tracking_server(mlflow_server, tmp_path):
    url = mlflow_server.url
    client = MlflowClient(url)
    study.log(client, "served", study.study())
    proc = run_dinox(
        ["decide", "--experiment", "served", *BUDGET, "--out", "out"], cwd=tmp_path, env={"MLFLOW_TRACKING_URI": url}
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "out" / "decision.json").read_text())["verdict"] == "GO"
    exp = client.get_experiment_by_name("served")
    (run,) = client.search_runs([exp.experiment_id], "tags.`dinox.role` = 'decision'")
    # The artifacts went through the server's artifact proxy and come back the same way.
    assert "decision.json" in {a.path for a in client.list_artifacts(run.info.run_id)}
    local = client.download_artifacts(run.info.run_id, "decision.json", str(tmp_path))
    assert json.loads(open(local).read())["verdict"] == "GO"
    proc = run_dinox(
        [
            "decide",
            "--experiment",
            "served",
            "--days",
            "10",
            "--dataset-size",
            str(study.DATASET),
            "--epochs",
            "100",
            "--no-log",
            "--out",
            "out2",
        ],
        cwd=tmp_path,
        env={"MLFLOW_TRACKING_URI": url},
    )
    assert proc.returncode == 1


def test_mlproject_decide_entry_point(sqlite_store, tmp_path):
    from pathlib import Path

    from tests.conftest import ROOT

    work, uri, _ = sqlite_store
    spec = tmp_path / "s.yaml"
    spec.write_text("name: study\nmodel: {name: resnet18}\nbudget: {days: 10, target_images: 24452700}\n")
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri)
    env.pop("MLFLOW_RUN_ID", None)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlflow",
            "run",
            str(ROOT),
            "-e",
            "decide",
            "--env-manager",
            "local",
            "--experiment-name",
            "study",
            "-P",
            f"spec={spec}",
            "-P",
            f"out={tmp_path / 'out'}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr  # NO-GO is a decision, not a failed run
    assert "NO-GO" in proc.stdout
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("study")
    runs = client.search_runs([exp.experiment_id], "tags.`mlflow.project.entryPoint` = 'decide'")
    (run,) = runs
    assert run.data.tags["dinox.role"] == "decision" and run.data.tags["dinox.verdict"] == "NO-GO"
    assert run.info.status == "FINISHED"
    assert "report.md" in {a.path for a in client.list_artifacts(run.info.run_id)}


def test_records_other_tools_logged_with_impossible_figures_are_left_out(sqlite_store):
    """NaN and infinite metrics, batches of 0, inf or -32 through a real store: never a traceback, never a
    GO built on them (MLflow itself stores an infinite metric as the largest float)."""
    from tests.decide.test_verdict import HOSTILE

    work, uri, _ = sqlite_store
    study.log(MlflowClient(uri), "hostile", study.study() + [row for row, _why in HOSTILE])
    proc = decide(work, uri, "--experiment", "hostile", *BUDGET, "--out", "hostile", "--no-log")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert proc.stdout.startswith("GO: vit_large_patch14_dinov2 ")
    assert f"left out {len(HOSTILE)} record(s) that cannot be trusted" in proc.stdout
    payload = json.loads((work / "hostile" / "decision.json").read_text())
    assert len(payload["left_out"]) == len(HOSTILE) == 15 and payload["recommended"]["days"] == pytest.approx(
        12.04, abs=0.01
    )
    bad = decide(work, uri, "--experiment", "hostile", "--days", "15", "--epochs", "nan", "--dataset-size", "5")
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --epochs: Input should be a finite number (got nan)"


def test_a_sweep_that_measured_nothing_is_one_line_and_exit_2(sqlite_store):
    """Once a 65-line traceback from the plots (log scale of nothing) and exit 1, the NO-GO code."""
    work, uri, _ = sqlite_store
    proc = decide(work, uri, "--experiment", "all_error", *BUDGET, "--no-log", "--out", "err")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == (
        "error: nothing was measured (2 trials: error 2); the commonest error (2x): hardware.device: cuda was "
        "asked for but torch.cuda.is_available() is False"
    )


def test_every_configuration_out_of_memory_is_no_go_with_plots(sqlite_store):
    work, uri, _ = sqlite_store
    proc = decide(work, uri, "--experiment", "all_oom", *BUDGET, "--no-log", "--out", "oom")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.startswith("NO-GO: nothing fits: every configuration ran out of memory")
    assert (work / "oom" / "throughput_vs_batch.png").read_bytes()[:8] == PNG


def test_reading_never_creates_a_store_and_a_dead_server_is_named(tmp_path):
    proc = run_dinox(["decide", "--experiment", "x", "--days", "1", "--target-images", "9"], cwd=tmp_path)
    assert proc.returncode == 2 and "`dinox run SPEC` records the trials there first" in proc.stderr, proc.stderr
    assert not (tmp_path / "mlflow.db").exists()
    url = "http://127.0.0.1:9"  # the discard port: nothing listens there
    proc = run_dinox(
        ["decide", "--experiment", "x", "--days", "1", "--target-images", "9", "--tracking-uri", url], cwd=tmp_path
    )
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"error: cannot reach the tracking server at {url} (connection refused)"
    ), proc.stderr


def test_the_same_spec_measured_on_two_devices_keeps_both(sqlite_store):
    """One spec run on the APU into one experiment and on an H100 into another: each configuration carries the
    same dinox.trial_id on both, and decide once kept only the latest device (its cheapest and what-if gone)."""
    work, uri, _ = sqlite_store
    client = MlflowClient(uri)
    rows = study.two_devices()
    apu = [r for r in rows if r["tags"]["dinox.device_name"] == study.APU]
    h100 = [r for r in rows if r["tags"]["dinox.device_name"] == study.H100 and "hardware.gpus" not in r["params"]]
    for a, h in zip(apu, h100, strict=True):  # the same configuration, so the same trial id
        a["tags"]["dinox.trial_id"] = h["tags"]["dinox.trial_id"] = f"id-{a['run_id']}"
    study.log(client, "same_spec_apu", apu)
    study.log(client, "same_spec_h100", h100)
    proc = decide(
        work,
        uri,
        "--experiment",
        "same_spec_apu",
        "--experiment",
        "same_spec_h100",
        *BUDGET,
        "--no-log",
        "--out",
        "same",
        "--price",
        "1.0",
    )
    assert proc.returncode == 0, proc.stderr
    payload = json.loads((work / "same" / "decision.json").read_text())
    assert {d["device"] for d in payload["devices"]} == {study.APU, study.H100}
    assert payload["cheapest"]["device"] in (study.APU, study.H100) and payload["what_if"]


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("sqlite:////dev/null", "/dev/null is not a regular file"),
        ("http://[::1", "not a URL (Invalid IPv6 URL)"),
        ("postgresql+pg8000://u@localhost/db", "its database driver is not installed: pip install pg8000"),
        ("sqlite:///:memory:", "an in-memory SQLite store keeps nothing"),
    ],
)
def test_decide_on_a_store_it_cannot_read_is_one_line_and_exit_2_not_no_go(tmp_path, uri, expected):
    """Each was a traceback with exit 1, which reads as NO-GO (and the MLproject's decide entry records it)."""
    from click.testing import CliRunner

    from dinox.cli.main import main

    result = CliRunner().invoke(main, ["decide", "--tracking-uri", uri, "--experiment", "x", *BUDGET, "--no-log"])
    assert result.exit_code == 2 and expected in result.stderr and "Traceback" not in result.output, result.output


HOSTILE = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(2)>",
    "m\n# Pwned\n| x | y |",
    "evil\u202etxt.exe",
    "m$^{$",
    "[click](javascript:alert(3))",
    "**bold** `tick",
]


def test_names_from_the_store_are_data_in_every_output(tmp_path):
    """Any tool can write a run: a model, device, bound or run name with HTML, a newline, a control character,
    mathtext or a link went into report.md unescaped, ran in report.html, broke the tables, reached the
    terminal, and crashed the plots (exit 1, read as NO-GO); a backtick or emphasis in one restyled the report
    and ended a command's code span early."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    rows = []
    for i, name in enumerate(HOSTILE):
        row = study.trial({"model.name": name}, 8 * (i + 1), 1, 500.0, run_id=name, bound=name)
        row["tags"]["dinox.device_name"] = HOSTILE[(i + 1) % len(HOSTILE)]
        row["tags"]["dinox.bound_evidence"] = name
        row["tags"]["dinox.sets"] = "x=$(touch PWNED); m\n# Pwned\x1b[2J`q`"  # printed in decide's commands
        row["tags"]["dinox.device"] = name  # named in the note on short windows (not a CPU's)
        row["metrics"]["window_s"], row["params"]["measure.bench_steps"] = 0.3, "5"
        rows.append(row)
    study.log(MlflowClient(uri), "hostile", rows)
    proc = decide(tmp_path, uri, "--experiment", "hostile", "--days", "1", "--target-images", "1000", "--out", "h")
    assert proc.returncode in (0, 1), proc.stderr  # a verdict, not a crash
    assert all(c.isprintable() or c == "\n" for c in proc.stdout + proc.stderr)
    assert "note: the recommended trial's timed windows lasted 0.10 s each on " in proc.stdout, proc.stdout
    page = (tmp_path / "h" / "report.html").read_text()
    assert "<script" not in page and "<img src=x" not in page and 'href="javascript' not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # shown, as text
    # Markdown in a name is shown as typed, and a backtick in a --set cannot end the command's code span early.
    assert "<strong>bold" not in page and "<code>tick" not in page and "**bold** `tick" in page
    assert "PWNED" in page and "PWNED" not in re.sub(r"<code>[^<]*</code>", "", page)
    report = (tmp_path / "h" / "report.md").read_text()
    assert "\n# Pwned" not in report and "\u202e" not in report
    assert "--set 'x=$(touch PWNED)' --set 'm # Pwned [2J`q`'" in report, report  # shell words, quoted
    for table in re.findall(r"((?:^\|.*\|$\n?)+)", report, re.M):  # every row as many cells as its header
        widths = {len(re.findall(r"(?<!\\)\|", line)) for line in table.splitlines()}
        assert len(widths) == 1, table
    assert list((tmp_path / "h").glob("*.png"))  # the plots, with "m$^{$" in them


@pytest.mark.parametrize("out", ["/dev/null", "/proc/dinox-decision"])
def test_decide_out_where_nothing_can_be_written_is_one_line_and_exit_2(sqlite_store, out):
    """Both were a traceback with exit 1 (NO-GO)."""
    work, uri, _ = sqlite_store
    proc = decide(work, uri, "--experiment", "study", *BUDGET, "--no-log", "--out", out)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"error: --out {out}: cannot write the report there (")


def test_links_planted_in_a_shared_out_are_replaced_never_written_through(sqlite_store, tmp_path):
    """A `.report.md.tmp` link planted in a shared --out once made decide overwrite the file it pointed to.
    Every file decide writes (and every temporary name beside it) now replaces a link, never follows it."""
    work, uri, _ = sqlite_store
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "shared"
    out.mkdir()
    names = ["report.md", "report.html", "decision.json", "throughput_vs_batch.png", "days_vs_budget.png"]
    for name in names + [f".{n}.tmp" for n in names]:
        (out / name).symlink_to(victim)
    proc = run_dinox(
        ["decide", "--experiment", "study", *BUDGET, "--no-log", "--out", str(out)],
        tmp_path,
        {"MLFLOW_TRACKING_URI": uri},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert victim.read_text() == "precious\n"
    for name in names:
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 0, name
    assert json.loads((out / "decision.json").read_text())["verdict"] == "GO"


@pytest.mark.parametrize(
    "experiment, budget, verdict",
    [
        ("study", BUDGET, "GO"),
        ("study", ["--days", "10", "--target-images", "24452700"], "NO-GO"),
        ("loader", BUDGET, None),
        ("two_devices", [*BUDGET, "--price", "2.5"], None),
    ],
)
def test_decision_json_validates_against_the_shipped_schema(sqlite_store, experiment, budget, verdict):
    """decision.json is a public contract (users' scripts and CI gates parse it): a real decision, each
    verdict, validates against docs/decision.schema.json, whose schema_version is the one decide writes."""
    import jsonschema

    from dinox.report.decision_json import SCHEMA_VERSION

    schema = json.loads((ROOT / "docs" / "decision.schema.json").read_text())
    assert schema["properties"]["schema_version"] == {"const": SCHEMA_VERSION}
    work, uri, _ = sqlite_store
    out = f"schema-{experiment}-{verdict}"
    proc = decide(work, uri, "--experiment", experiment, *budget, "--no-log", "--out", out)
    data = json.loads((work / out / "decision.json").read_text())
    assert verdict is None or data["verdict"] == verdict, proc.stdout
    jsonschema.validate(data, schema)
    broken = {k: v for k, v in data.items() if k != "recommended"}
    with pytest.raises(jsonschema.ValidationError, match="'recommended' is a required property"):
        jsonschema.validate(broken, schema)


def test_a_ctrl_c_while_the_report_is_written_leaves_the_previous_decision_whole(sqlite_store, tmp_path):
    """`dinox decide` stopped by Ctrl-C while it writes its files (seconds of plotting): the decision before it
    stays as it was, never this one's plots beside that one's decision.json; a first decide leaves no --out.
    The Ctrl-C comes the moment its files are being made (their folder appears), through the command."""
    import signal
    import time

    work, uri, _ = sqlite_store
    out = tmp_path / "decision"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}

    def interrupted(args: list[str]) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "dinox", "decide", "--tracking-uri", uri, *args, "--out", str(out)]
        proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None and not list(out.glob(".decide-*")):
            time.sleep(0.005)
        assert proc.poll() is None, "decide ended before its files were being written"
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
        return subprocess.CompletedProcess(command, proc.returncode, stdout.decode(), stderr.decode())

    first = interrupted(["--experiment", "study", *BUDGET, "--no-log"])
    assert first.returncode == 130 and "Traceback" not in first.stderr, first.stderr
    assert not out.exists()
    go = decide(work, uri, "--experiment", "study", *BUDGET, "--no-log", "--out", str(out))
    assert go.returncode == 0, go.stdout + go.stderr
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert json.loads(before["decision.json"])["verdict"] == "GO"
    again = interrupted(["--experiment", "study", "--days", "10", "--target-images", "24452700", "--no-log"])
    assert again.returncode == 130 and "Traceback" not in again.stderr, again.stderr
    assert again.stderr.strip().splitlines()[-1].startswith("dinox: interrupted by SIGINT"), again.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing of the NO-GO, nothing left over


def test_a_ctrl_c_while_the_files_are_renamed_into_place_waits_for_the_whole_set(tmp_path):
    """The last step of writing a decision renames its files into --out one by one: a Ctrl-C between two of
    them once left the new decision.json beside the last decision's plots. It is noted, the set finished, and
    the caller honours it after."""
    import signal

    from dinox.cli.decide import _renamed_whole

    class SignalledOnUse(os.PathLike):  # a Ctrl-C the moment a rename reads its source
        def __init__(self, path):
            self.path = path

        def __fspath__(self) -> str:
            signal.raise_signal(signal.SIGINT)
            return str(self.path)

    names = ["report.md", "decision.json", "days_vs_budget.png"]
    for name in names:
        (tmp_path / name).write_text(name)
    (tmp_path / "out").mkdir()
    noted: list[int] = []
    before = signal.getsignal(signal.SIGINT)  # Python's own, or SIG_IGN in a suite started with `&`
    _renamed_whole([(SignalledOnUse(tmp_path / n), tmp_path / "out" / n) for n in names], noted)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(names)
    assert noted == [signal.SIGINT] * 3
    assert signal.getsignal(signal.SIGINT) is before  # the handler before it, back


def _swept(workers: int, lo: float, hi: float, name: str) -> dict:
    row = study.trial(study.VIT_L, 32, 2, (lo + hi) / 2, workers=workers, run_id=name)
    row["metrics"].update(images_per_s_min=lo, images_per_s_max=hi, windows=5)
    row["tags"]["dinox.trial_id"] = f"t-w{workers}"
    return row


def test_leaders_from_two_sweeps_the_box_moved_between_are_tied_in_every_file(tmp_path):
    """A first sweep, then `--remeasure-unsettled` of one trial after the box slowed: decide reads both
    sweeps from the store, ties the two leaders (the trial's own windows moved between the sweeps) and says
    so in the report; decision.json names the tie and its head-to-head."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    _, first = study.log(
        client, "moved", [_swept(0, 194.7, 225.5, "5 bs=32 w=0"), _swept(2, 193.3, 212.0, "6 bs=32 w=2")]
    )
    _parent, ids = study.log(client, "moved", [_swept(0, 145.7, 189.4, "5 bs=32 w=0")])
    proc = decide(tmp_path, uri, "--experiment", "moved", *BUDGET, "--no-log", "--out", "d")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(tied with 1: planned at the slowest)" in proc.stdout
    md = (tmp_path / "d" / "report.md").read_text()
    # Trial 5, measured again, is the slower of the two: the plan's, and recommended; trial 6 leads, tied.
    assert "Tied with `6 bs=32 w=2`: measured in another sweep than this one, and the box moved between" in md
    assert "ran 194.7-225.5 img/s in the earlier sweep and 145.7-189.4 in the later" in md
    rec = json.loads((tmp_path / "d" / "decision.json").read_text())["recommended"]
    assert rec["run_id"] == ids["5 bs=32 w=0"] and rec["tied_with"] == [first["6 bs=32 w=2"]]
    (tie,) = rec["ties"]
    assert (tie["run_id"], tie["why"]) == (first["6 bs=32 w=2"], "moved")
    said = "5 bs=32 w=0 ran 194.7-225.5 img/s in the earlier sweep and 145.7-189.4 in the later, 25.4% apart"
    assert tie["detail"] == said + " by their mid-ranges"
