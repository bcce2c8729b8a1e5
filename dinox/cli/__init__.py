"""The command line: click commands that read options, call the rooms above, and turn errors into exit codes.

- ``entry``: the console script (nothing heavy imported before its Ctrl-C handling).
- ``main``: the ``dinox`` group (validate, plan, schema here; run, decide, submit, sync, ui, preprocess, shards
  from the modules below).
- ``run``: ``dinox run``, the sweep started (the fork server first, its imports beside the store's opening).
- ``common``: what commands share (bad input as exit 2, loading a spec into trials); ``decide``: ``dinox
  decide`` end to end; ``submit``: ``dinox submit`` (a Slurm job array) end to end; ``tools``: the commands
  around a sweep.
"""
