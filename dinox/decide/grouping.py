"""Trials grouped by their params: by model, by the params that bound memory (dinox.spec.roles), equal in all but
one swept param; and the few params that tell groups apart, to label them."""

from __future__ import annotations

from collections import defaultdict

from dinox import record as rec
from dinox.spec import params
from dinox.spec.sections import ROLES
from dinox.store.trial_record import TrialRecord


def model_key(r: TrialRecord) -> tuple[str, str, dict[str, str]]:
    name = r.params.get(params.MODEL_NAME, "?")
    inside = params.MODEL_KWARGS + "."
    kwargs = {k.removeprefix(inside): v for k, v in r.params.items() if k.startswith(inside)}
    if r.params.get(params.MODEL_KWARGS) not in (None, "{}"):
        kwargs["kwargs"] = r.params[params.MODEL_KWARGS]
    key = name + "".join(f" {k}={v}" for k, v in sorted(kwargs.items()))
    return key, name, kwargs


def memory_groups(records: list[TrialRecord]) -> dict[tuple[tuple[str, str], ...], list[TrialRecord]]:
    """The ok and oom trials by the params that bound their memory: each group has one OOM boundary over
    the physical batch, the same grouping `dinox.sweep.prune` skips larger batches by."""
    groups: dict[tuple[tuple[str, str], ...], list[TrialRecord]] = defaultdict(list)
    for r in records:
        if r.status in ("ok", "oom") and r.batch_size is not None:
            groups[ROLES.memory_key(r.params)].append(r)
    return dict(sorted(groups.items()))


def groups_without(records: list[TrialRecord], swept: str) -> list[tuple[tuple, list[TrialRecord]]]:
    """Trials equal in every workload param but `swept`, keyed by those params."""
    groups: dict[tuple, list[TrialRecord]] = defaultdict(list)
    for r in records:
        if swept in r.params:
            key = tuple(sorted((k, v) for k, v in r.params.items() if k != swept and ROLES.describes(k)))
            groups[key].append(r)
    return list(groups.items())


def telling(keys: list[tuple]) -> list[dict[str, str]]:
    """Each key shown by only the params that tell it apart from the other keys of its own list."""
    values: dict[str, set[str]] = defaultdict(set)
    for key in keys:
        for k, v in key:
            values[k].add(v)
    differing = {k for k, vs in values.items() if len(vs) > 1}
    return [{k: v for k, v in key if k in differing} for key in keys]


def device_of(r: TrialRecord, default: str = "") -> tuple[str, int]:
    """The device that measured a trial (its `dinox.device_name`; `default` for one that never reached a
    device: skipped, or crashed before it said) and how many of them (`hardware.gpus`): trials measured on
    different hardware are decided apart."""
    return r.tags.get(rec.DEVICE_NAME) or default, r.param_int(params.HARDWARE_GPUS) or 1


def only_device(records: list[TrialRecord]) -> str:
    """The one device name the records carry, where they carry one: what a trial that never reached a device
    (skipped after a predicted OOM, crashed at start) was meant for. "" when they name none or several."""
    names = {name for r in records if (name := r.tags.get(rec.DEVICE_NAME))}
    return names.pop() if len(names) == 1 else ""


def device_label(name: str, count: int) -> str:
    name = name or "an unnamed device"
    return name if count == 1 else f"{count} x {name}"
