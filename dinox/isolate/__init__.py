"""Isolation: each trial in its own process, always coming back with a status. No torch here.

- ``runner``: a trial (or its torchrun ranks) in a child with a hard timeout, its log and peak memory kept.
- ``forkserver``: a zygote with torch and timm imported once, forking each child.
- ``process_tree``: a child's whole tree (its PSS peak, ending it whole); ``lifeline``: processes that die with
  their parent; ``ranks``: one result from the results of a trial's ranks.
- ``slots``: the devices and cores a child runs on (``dinox run --devices``).
- ``contention``: a busy box read before the first child and between trials; its children's OpenMP threads
  then sleep when they wait (``OMP_WAIT_POLICY=PASSIVE``), recorded per trial; or a trial's recorded policy
  held for every child (``hold``: ``dinox verify``).
"""
