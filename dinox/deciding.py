"""`dinox decide` end to end: the trials from the store, the policy, the report files, the decision run.

The command line only turns options into a Budget and a Policy; this module sequences the rest."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dinox import report, report_json
from dinox.budget import Budget, DecisionError
from dinox.decide import Decision, Policy, decide
from dinox.plots import write_plots
from dinox.readback import fetch_trials, log_decision
from dinox.records import TrialRecord
from dinox.report_html import render_html


@dataclass(frozen=True)
class DecideRequest:
    uri: str
    experiments: list[str]
    run_ids: list[str]
    budget: Budget
    policy: Policy
    out: Path
    log: bool = True


def run(req: DecideRequest, echo: Callable[[str], None]) -> Decision:
    """Decide, write the report files, say the verdict, log the decision run. Raises DecisionError and
    TrackingError, both one line for the user."""
    records, sources, home = fetch_trials(req.uri, req.experiments, req.run_ids)
    if not records:
        raise DecisionError(f"no dinox trial runs (tag dinox.status) in {', '.join(sources)} at {req.uri}")
    decision = decide(records, req.budget, req.policy)
    decision.sources = sources
    files = write_reports(decision, records, req.out)
    echo(report.render_terminal(decision))
    echo(f"report: {files[0]} ({files[1].name} beside it)  decision: {files[2]}")
    if req.log:
        note = f"**{decision.verdict}**\n\n```\n{report.render_terminal(decision)}\n```"
        params, metrics = report_json.log_params(decision), report_json.log_metrics(decision)
        run_id = log_decision(req.uri, home, decision.verdict, params, metrics, files, note)
        echo(f"logged as decision run {run_id}")
    return decision


def write_reports(decision: Decision, records: list[TrialRecord], out: Path) -> list[Path]:
    """report.md, report.html, decision.json and the plots, in that order, written to `out`."""
    out.mkdir(parents=True, exist_ok=True)
    plots = write_plots(decision, records, out)
    markdown = report.render_markdown(decision, [p.name for p in plots])
    paths = [out / "report.md", out / "report.html", out / "decision.json"]
    paths[0].write_text(markdown)
    paths[1].write_text(render_html(markdown, decision.verdict, out))
    paths[2].write_text(report_json.dumps(decision))
    return [*paths, *plots]
