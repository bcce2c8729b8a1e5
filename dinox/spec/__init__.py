"""The spec: what a user writes, read and checked before anything else happens. No torch, no MLflow.

- ``sections``: the pydantic models (one trial, every knob single-valued, each field with its role); ``base``
  what every section shares; ``data_sources`` the ``data:`` choices; ``objectives`` the ``objective:`` ones
  (classification, DINO, DINOv2, a team's own step); ``runtime`` the process-wide settings;
  ``routine`` the run's checkpoints and evaluation passes;
  ``shard_urls`` which shard locations may be named.
- ``file``: reading a spec file safely, with every key's line; ``overrides``: ``--set KEY=VALUE``.
- ``fields``: field paths (``loader.num_workers``) and the messages that name them; ``rules``: checks that span
  fields; ``roles``: what each field is for (identifies a trial, bounds its memory, steers the search).
- ``schema``: the JSON Schema shipped beside the specs.
- ``params``: the params the parent reads back (decide, store, report), named once and checked against the
  fields at import.
"""
