"""Launching a sweep on a cluster's scheduler: the sweep itself stays `dinox run`, one slice per task.

- ``slurm``: ``dinox submit``'s job array (the sbatch script, submitting it, following its tasks to the end).
"""
