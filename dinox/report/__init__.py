"""The decision written out: for people and for programs. Reads decide's results; computes nothing new.

- ``text``: the terminal summary and report.md; ``settling``: the verdict's words (shared by all three);
  ``findings``: report.md's sections beside the verdict (profile, knobs, input pipeline, memory); ``money``: its
  sections on hardware and cost.
- ``html``: report.html (report.md with the plots embedded, safe to open in MLflow's artifact view).
- ``decision_json``: decision.json and the decision run's params and metrics; ``plots``: the PNGs.
"""
