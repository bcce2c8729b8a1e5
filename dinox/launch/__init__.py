"""Launching a sweep on a cluster's scheduler: the sweep itself stays `dinox run`, one slice per task.

- ``launcher``: what every launcher shares: the ``Launcher`` protocol (render, submit, poll, one task again),
  a submission's ``Job`` and its tasks' ``TaskState``, the ``Wait`` that follows them to their end, the store
  every task must reach (``shared_store``) and the count of trials recorded there.
- ``slurm``: ``dinox submit``'s job array (the sbatch script, sbatch, scontrol).
- ``kubernetes``: ``dinox submit --launcher kubernetes``: an Indexed Job (the spec in a ConfigMap, the store's
  URI in a Secret), applied and read back with kubectl.
"""
