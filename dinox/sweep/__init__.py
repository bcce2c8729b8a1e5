"""The sweep: every trial of a spec run in order, each result kept the moment it is known.

- ``run``: the ``Sweep`` (trials -> child processes -> results -> the store, the journal first); ``end``: how it
  finishes or is stopped; ``interrupts``: SIGINT/SIGTERM as an exception the sweep cleans up after;
  ``recording``: one trial's record (its run opened and journaled, its result journaled, logged, in the CSV).
- ``lanes`` and ``flights``: trials side by side on several slots, and the runs they have open.
- ``best_effort``: the store as the sweep calls it (its local journal, results surviving a store outage, is
  ``dinox.store.journal``); ``outputs``: results.csv and the lines printed as trials end; ``progress``: the
  terminal bar.
- ``batch_search``: ``batch.size: auto``; ``prune``: larger batches skipped after an OOM.
- ``drift``: the sweep's first ok trial measured again after its last: how far the box moved while it ran.
- ``shards``: ``--shard auto`` from Slurm or Kubernetes.
"""
