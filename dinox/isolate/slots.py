"""`dinox run --devices`: the slots a sweep runs trials in side by side, each a device and its own cores.

`all` is every CUDA device the estimate child saw, `0,1,3` those indices, `cpu:N` N CPU slots. Each slot gets
an equal share of the cores this process may run on (`os.sched_getaffinity`), disjoint from the others, so
two trials side by side do not measure each other's loader: a GPU takes its share from the cores of its own
NUMA node where the machine says which (sysfs), else from all of them. Equal shares, not all the cores
split as far as they go: trials measured on unequal shares would not compare. Torch-free: the parent sets
CUDA_VISIBLE_DEVICES and DINOX_CORES for each child (`child_env`); the child pins itself (`child_cores`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dinox.errors import DinoxError

CORES_VAR = "DINOX_CORES"


class DevicesError(DinoxError, ValueError):
    """A --devices value that cannot be read or that this machine cannot give (the message says which)."""


@dataclass(frozen=True)
class Request:
    kind: str  # "all", "cuda" (the listed indices) or "cpu"
    gpus: tuple[int, ...] = ()
    count: int = 0  # cpu:N


@dataclass(frozen=True)
class Slot:
    label: str  # "cuda:1" or "cpu:0": the dinox.slot tag
    gpu: int | None  # the CUDA index (as this process sees it) the child gets as its only device
    cores: tuple[int, ...]


def parse(text: str) -> Request:
    """`all`, `0,1,3` or `cpu:N`."""
    text = text.strip()
    if text == "all":
        return Request("all")
    if text.startswith("cpu:"):
        count = _int(text[4:], text)
        if count < 1:
            raise DevicesError(f"{text!r}: cpu:N needs N >= 1")
        return Request("cpu", count=count)
    gpus = tuple(_int(part, text) for part in text.split(","))
    if len(set(gpus)) != len(gpus) or min(gpus) < 0:
        raise DevicesError(f"{text!r}: CUDA device indices must be distinct and >= 0")
    return Request("cuda", gpus=gpus)


def _int(text: str, whole: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise DevicesError(f"{whole!r}: expected all, a list of CUDA device indices (0,1,3) or cpu:N") from None


def resolve(
    request: Request,
    cuda_devices: int | None,
    affinity: Sequence[int],
    numa: Sequence[int] = (),
    node_cpus: Mapping[int, Sequence[int]] | None = None,
) -> list[Slot]:
    """The slots for `request` on a machine with `cuda_devices` GPUs (None: unknown) whose i-th GPU sits on
    NUMA node numa[i] (-1 or missing: unknown), this process allowed `affinity`."""
    cores = sorted(affinity)
    if request.kind == "cpu":
        if request.count > len(cores):
            raise DevicesError(f"cpu:{request.count} asks for more slots than the {len(cores)} cores this process has")
        return [Slot(f"cpu:{i}", None, share) for i, share in enumerate(split(cores, request.count))]
    if cuda_devices is None:
        raise DevicesError("the number of CUDA devices is unknown here (the estimate child failed); list them: 0,1")
    gpus = list(range(cuda_devices)) if request.kind == "all" else list(request.gpus)
    if not gpus:
        raise DevicesError("all: this machine has no CUDA device; --devices cpu:N runs CPU trials side by side")
    if missing := [g for g in gpus if g >= cuda_devices]:
        raise DevicesError(f"CUDA device {missing[0]} is not on this machine, which has {cuda_devices}")
    if len(gpus) > len(cores):
        raise DevicesError(f"{len(gpus)} devices but only {len(cores)} cores: a trial needs a core of its own")
    shares = _gpu_shares(gpus, cores, numa, node_cpus if node_cpus is not None else node_cpu_lists())
    return [Slot(f"cuda:{g}", g, shares[g]) for g in gpus]


def _gpu_shares(
    gpus: list[int], cores: list[int], numa: Sequence[int], node_cpus: Mapping[int, Sequence[int]]
) -> dict[int, tuple[int, ...]]:
    """Each GPU an equal share of its NUMA node's cores, where every GPU's node is known and has enough of
    ours; else an equal share of all of them. The share is the smallest any GPU can get, so all are equal."""
    nodes = {g: numa[g] if g < len(numa) else -1 for g in gpus}
    local = {g: [c for c in node_cpus.get(n, ()) if c in set(cores)] for g, n in nodes.items()}
    on_node = {n: [g for g in gpus if nodes[g] == n] for n in set(nodes.values())}
    if all(n >= 0 for n in nodes.values()) and all(len(local[g]) >= len(on_node[nodes[g]]) for g in gpus):
        per_node = {n: split(local[members[0]], len(members)) for n, members in on_node.items()}
        size = min(len(part) for parts in per_node.values() for part in parts)
        return {g: per_node[nodes[g]][on_node[nodes[g]].index(g)][:size] for g in gpus}
    return dict(zip(gpus, split(cores, len(gpus)), strict=True))


def split(cores: Sequence[int], n: int) -> list[tuple[int, ...]]:
    """n disjoint, equal, contiguous shares of `cores` (the remainder stays idle)."""
    size = len(cores) // n
    return [tuple(cores[i * size : (i + 1) * size]) for i in range(n)]


def node_cpu_lists(root: Path = Path("/sys/devices/system/node")) -> dict[int, list[int]]:
    """Each NUMA node's CPUs, from sysfs; {} where the kernel does not say (not Linux, a container)."""
    nodes: dict[int, list[int]] = {}
    for path in sorted(root.glob("node[0-9]*")):
        try:
            nodes[int(path.name[4:])] = parse_cores((path / "cpulist").read_text())
        except (OSError, ValueError):
            continue
    return nodes


MAX_CORE = 1 << 16  # beyond any kernel's CPU count (NR_CPUS is at most 8192): a text past it is not a cpulist


def parse_cores(text: str) -> list[int]:
    """Linux's cpulist format: "0-3,8,10-11". ValueError for anything else, a core past MAX_CORE among it (a
    damaged record's "0-4000000000" would otherwise be a list of four billion)."""
    cores: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        low, high = int(first), int(last or first)
        if not 0 <= low <= high < MAX_CORE:
            raise ValueError(f"not a cpulist range: {part[:20]!r}")
        cores.extend(range(low, high + 1))
    return cores


def format_cores(cores: Sequence[int]) -> str:
    """The inverse of parse_cores, ranges folded: (0, 1, 2, 3, 8) -> "0-3,8"."""
    parts: list[str] = []
    ordered = sorted(cores)
    start = prev = ordered[0] if ordered else 0
    for c in [*ordered[1:], None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        if c is not None:
            start = prev = c
    return ",".join(parts) if ordered else ""


def child_env(slots: Sequence[Slot], parent: Mapping[str, str], uuids: Sequence[str] = ()) -> dict[str, str]:
    """The variables a child on `slots` runs with: its devices (by UUID where the estimate child read them:
    an index means one GPU to CUDA's fastest-first order and another to NVML's bus order; else indices into
    the parent's own CUDA_VISIBLE_DEVICES where that is set) and its cores. CPU slots hide every GPU."""
    visible = [v for v in parent.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    gpus = [s.gpu for s in slots if s.gpu is not None]
    names = [uuids[g] if g < len(uuids) else visible[g] if g < len(visible) else str(g) for g in gpus]
    cores = [c for s in slots for c in s.cores]
    return {"CUDA_VISIBLE_DEVICES": ",".join(names), CORES_VAR: format_cores(cores)}


def child_cores(env: Mapping[str, str], local_rank: int = 0, local_world: int = 1) -> tuple[int, ...]:
    """The cores this child (this rank of `local_world` on the host) is to run on; () when not pinned."""
    text = env.get(CORES_VAR, "")
    if not text:
        return ()
    cores = parse_cores(text)
    if local_world > 1 and len(cores) >= local_world:
        return split(cores, local_world)[local_rank]
    return tuple(cores)


def affinity() -> list[int]:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def rank_threads(world: int, env: Mapping[str, str], parent: Mapping[str, str]) -> dict[str, str]:
    """OMP_NUM_THREADS for each of `world` ranks on this host: an equal share of the cores the trial has (its
    DINOX_CORES, else this process's), unless the user set it. torchrun sets 1 for more than one rank, which
    would measure an N-rank trial on a fraction of the cores its one-rank twin had: its scaling efficiency
    then says more about threads than about scaling."""
    if "OMP_NUM_THREADS" in parent or world <= 1:
        return {}
    cores = parse_cores(env[CORES_VAR]) if env.get(CORES_VAR) else affinity()
    return {"OMP_NUM_THREADS": str(max(1, len(cores) // world))}


def trial_gpus(slots: Sequence[Slot], ranks: int, uuids: Sequence[str]) -> tuple[str, ...]:
    """The UUIDs of the GPUs a trial runs on: its slots' (--devices), else the first `ranks` it sees."""
    indices = [s.gpu for s in slots if s.gpu is not None] if slots else list(range(ranks))
    return tuple(uuids[i] for i in indices if i < len(uuids))
