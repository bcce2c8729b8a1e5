"""The plan: a spec expanded into trials and what each will cost, before anything runs. No torch here.

- ``grid``: the sweep expanded into trials with stable ids (and ``--shard`` slices of them).
- ``preflight``: checks that need more than the spec (the model exists, the data is there and big enough).
- ``machine``: is the device a spec asks for on this machine.
- ``footprint``: FLOPs per image, device memory and loader RAM per trial (the model figures come from
  ``dinox.measure.estimate``, run in a child); ``peaks``: peak TFLOPs per accelerator, for MFU.
- ``model_names``: timm's architectures without importing timm; ``table``: ``dinox plan``'s table.
- ``shrink``: ``--shrink``, each sweep point made small to try the spec here first (marked shrunk).
- ``user_entry``: a ``kind: python`` objective's module found on disk and its source hashed, never imported.
"""
