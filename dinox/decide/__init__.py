"""The decision: trial records and a budget in, GO / NO-GO out. Pure functions: no MLflow, no torch, no files.

- ``budget``: the schedule and the days and money it must fit in; ``verdict``: the verdict per model and the
  decision; ``reasons``: the decision in words (why this verdict, an unstable best's warning); ``money``:
  what a schedule costs and what would change the answer.
- ``grouping``: trials grouped by model and by the params that bound memory; ``checks``: predicted against
  measured memory, scaling across devices; ``loader_findings``: the worker knee and pinned-memory pairs;
  ``knobs``: what each varied param bought, from the pairs of trials equal in everything else.
- ``candidates``: each ok trial as a Candidate (its forecast and range; a head-to-head's rounds or a
  verification replacing the sweep's figures); ``head_to_head``: the rounds of a head-to-head read back and
  the sign test that orders tied leaders.
- ``occasions``: which sweeps' ranges can be set side by side (a trial measured in two sweeps whose windows
  share no rate shows the box moved between them).
- ``routine``: the run's checkpoints and evaluation passes over the schedule, from the trial's measurement.
- ``types``: the verdict's types (the policy, a candidate trial, a model's verdict).
"""
