"""The child: one trial measured in its own process. The only side that imports torch (and never MLflow).

- ``trial``: the child's entry (``python -m dinox.measure.trial``): builds model, data and step, measures,
  writes a ``dinox.contract.TrialResult``. ``step``: the training step itself (batch to device, micro-batch,
  optimizer update), one object the timed windows and ``dinox verify`` both drive. ``estimate``: the
  meta-device estimate child (parameters, FLOPs, saved activations).
- ``device``, ``models``, ``objectives``: the device and its flags, timm models, what a micro-batch computes
  (``objectives.Objective``: the protocol, the seam a team's own step plugs into; ``heads``: DINO's head;
  ``dinov2``: DINOv2's step, ``dinov2_masks`` its iBOT masks drawn in the loader's collate as DINOv2 draws
  them); ``user_step``: a team's own step,
  imported from the spec's entry; ``entry_check``: validate's child that builds it;
  ``runtime``: the spec's process-wide settings applied and read back.
- ``loading``: the trial's input (dataset, device-side preparation, DataLoader) from its spec.
- ``loop``: the timed step loop; ``batches`` the loader as the loop sees it; ``ahead`` the next batch copied
  ahead; ``timeline`` the device's own clock; ``windows`` what the loop measures as plain records.
- ``step_metrics``: those records as the trial's metrics; ``bound``: what holds the step back, and why.
- ``routine``: what a real run does besides its steps (a checkpoint save, an evaluation pass), timed;
  ``verify``: ``dinox verify``'s child, the trial's steps trained for a slice of real training.
- ``result``: how the child reads a failure (an OOM, an exception in one line); the parent imports only its
  OOM markers (the batch search), so it imports no torch. What a trial produces is ``dinox.contract``.
"""
