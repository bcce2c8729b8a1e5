"""The store: everything that talks to MLflow (the names it writes are in ``dinox.record``).

- ``backend``: where the store is, reaching it, creating an embedded one under a lock, refusing what cannot
  hold a sweep.
- ``recorder``: writing a sweep (a parent run, one nested run per trial); ``descriptions``: what the MLflow UI
  shows without a click; ``throughput_figure``: throughput against batch, drawn one way for the parent run and
  for decide's report; ``system_metrics``: each trial's system metrics through MLflow's monitor.
- ``readback``: reading a sweep's trials back; ``trial_record``: a trial as read back (plain, no MLflow, what
  ``dinox.decide`` consumes).
- ``journal``: the sweep's local journal (results survive a store outage, written before the store);
  ``sync``: completing in the store what a sweep kept locally.
"""
