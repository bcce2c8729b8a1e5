"""Parameter roles: declared once on the spec's fields; the trial id, pruning, decide and the footprint agree."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated

import pytest
from pydantic import BaseModel

from dinox.decide import budget
from dinox.decide import verdict as decide
from dinox.plan import footprint, grid
from dinox.spec import file as spec_file
from dinox.spec.roles import CONFIG, MEMORY, RoleTable
from dinox.spec.sections import ROLES
from dinox.store.trial_record import TrialRecord
from dinox.sweep.prune import Pruner

SWEEP = """\
name: roles
model: {name: vit_tiny_patch16_224, img_size: 32}
measure: {timeout_s: 60}
sweep:
  grid:
    batch.size: [8, 16, 32, 64]
    optimizer.name: [adamw, sgd]
    loader.num_workers: [0, 2]
    measure.timeout_s: [60, 120]
  cases:
    - {objective: {kind: classification, num_classes: 10}}
    - {objective: {kind: dino, out_dim: 256, local_crops: 2, local_crop_size: 32}}
"""


def test_every_field_of_a_trial_has_a_role():
    assert set(ROLES.params) >= {"model.img_size", "optimizer.name", "objective.out_dim", "data.shards", "budget"}
    assert ROLES.role("model.kwargs.depth") == "shape"  # a key in a free-form mapping takes the mapping's role
    assert ROLES.role("spec.name") is None and not ROLES.describes("spec.name")  # the parent run's param

    class Undeclared(BaseModel):
        a: Annotated[int, CONFIG] = 1
        b: int = 2

    with pytest.raises(TypeError, match="Undeclared.b has no role"):
        RoleTable.of(Undeclared)


def test_union_members_must_agree_on_a_role():
    class One(BaseModel):
        x: Annotated[int, CONFIG] = 1

    class Two(BaseModel):
        x: Annotated[int, MEMORY] = 1

    class Root(BaseModel):
        part: One | Two = One()

    with pytest.raises(TypeError, match="part.x: union members declare different roles"):
        RoleTable.of(Root)


def _trials(write_spec) -> list[grid.Trial]:
    return grid.expand(spec_file.load(write_spec(SWEEP)))


def _record(t: grid.Trial, status: str) -> TrialRecord:
    metrics = {"images_per_s": 100.0} if status == "ok" else {}
    return TrialRecord(t.trial_id, "0", t.label, t.spec.flat_params(), metrics, {"dinox.status": status})


def test_prune_and_decide_group_the_same_trials(write_spec):
    trials = _trials(write_spec)

    # Out of memory from batch 32 with AdamW under the DINO objective, from 64 everywhere else.
    def oom(t: grid.Trial) -> bool:
        heavy = t.spec.optimizer.name == "adamw" and t.spec.objective.kind == "dino"
        return t.spec.size >= (32 if heavy else 64)

    records = [_record(t, "oom" if oom(t) else "ok") for t in trials]
    groups = decide.memory_groups(records)
    # Optimizer and objective keep trials apart (they change memory); the loader and the timeout do not.
    assert len(groups) == 4 and {len(rs) for rs in groups.values()} == {16}
    pruner = Pruner()
    for t, r in zip(trials, records, strict=True):
        pruner.observe(r.params, t.spec.size, r.status, r.run_id)
    for t in trials:
        group = next(rs for rs in groups.values() if any(r.run_id == t.trial_id for r in rs))
        smallest_oom = min(r.batch_size for r in group if r.status == "oom")
        assert (pruner.reason(t.spec) is not None) == (t.spec.size > smallest_oom), t.label
    by_model = decide.decide(records, budget.Budget(days=1, target_images=1000))
    boundaries = sorted((b.largest_ok, b.smallest_oom) for mv in by_model.models for b in mv.oom)
    assert boundaries == [(16, 32), (32, 64), (32, 64), (32, 64)]


def test_one_rule_reads_the_roles_everywhere(write_spec):
    trials = _trials(write_spec)
    base = trials[0].spec
    faster = base.model_copy(update={"measure": base.measure.model_copy(update={"timeout_s": 999})})
    more = base.model_copy(update={"measure": base.measure.model_copy(update={"bench_steps": 99})})
    assert grid.trial_id(faster) == grid.trial_id(base) != grid.trial_id(more)  # steer vs measure
    # The footprint's model cost follows the shape only: the optimizer or batch do not re-run the estimate.
    sgd = base.model_copy(update={"optimizer": base.optimizer.model_copy(update={"name": "sgd"})})
    assert footprint.estimate_key(sgd) == footprint.estimate_key(base.with_batch(64))
    assert footprint.estimate_key(base) != footprint.estimate_key(trials[-1].spec)  # classification vs DINO
    assert "batch.size" in ROLES.shown_keys() and "optimizer.lr" not in ROLES.shown_keys()


def test_a_knob_added_later_identifies_a_trial_only_away_from_its_default():
    """loader.device_prefetch came after trials were recorded: at its default a trial keeps the id it had
    before the knob existed (a resumed sweep recognises it); set, it is another trial."""
    from dinox.plan.grid import trial_id
    from dinox.spec.sections import ROLES, TrialSpec

    base = {"name": "x", "model": {"name": "resnet18"}}
    plain = TrialSpec.model_validate(base)
    ahead = TrialSpec.model_validate({**base, "loader": {"device_prefetch": True}})
    assert plain.flat_params()["loader.device_prefetch"] == "False"  # still a param MLflow shows
    assert not ROLES.identifies("loader.device_prefetch", "False") and ROLES.identifies(
        "loader.device_prefetch", "True"
    )
    assert trial_id(plain) != trial_id(ahead)
    params = {k: v for k, v in plain.flat_params().items() if ROLES.identifies(k) and k != "loader.device_prefetch"}
    before = hashlib.sha256(json.dumps(params, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    assert trial_id(plain) == before  # the id computed as it was before the knob
