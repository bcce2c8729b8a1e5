"""`dinox decide` end to end: the trials from the store, the policy, the report files, the decision run.

The command line only turns options into a Budget and a Policy; this module sequences the rest."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dinox.decide.budget import Budget, DecisionError
from dinox.decide.verdict import Decision, Policy, decide
from dinox.report import decision_json
from dinox.report import text as report
from dinox.report.html import render_html
from dinox.report.plots import write_plots
from dinox.store.readback import fetch_trials, log_decision
from dinox.store.trial_record import TrialRecord


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
        params, metrics = decision_json.log_params(decision), decision_json.log_metrics(decision)
        run_id = log_decision(req.uri, home, decision.verdict, params, metrics, files, note)
        echo(f"logged as decision run {run_id}")
    return decision


def write_reports(decision: Decision, records: list[TrialRecord], out: Path) -> list[Path]:
    """report.md, report.html, decision.json and the plots, in that order, written to `out`, each file whole
    or not at all (written beside its name, then renamed). Raises DecisionError naming --out when it cannot
    be written (/dev/null, /proc, a read-only mount, a full disk)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        plots = write_plots(decision, records, out)
        markdown = report.render_markdown(decision, [p.name for p in plots])
        paths = [out / "report.md", out / "report.html", out / "decision.json"]
        texts = [markdown, render_html(markdown, decision.verdict, out), decision_json.dumps(decision)]
        for path, text in zip(paths, texts, strict=True):
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(text)
            os.replace(tmp, path)
    except OSError as e:
        raise DecisionError(f"--out {out}: cannot write the report there ({e.strerror or e})") from None
    return [*paths, *plots]
