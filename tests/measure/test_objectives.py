"""The DINO objective's mechanics, in-process on a tiny backbone."""

from __future__ import annotations

import pytest
import timm
import torch

from dinox.measure import objectives
from dinox.spec.objectives import DinoObjective


def tiny_dino(**kw) -> objectives.Dino:
    torch.manual_seed(0)
    backbone = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        num_classes=0,
        img_size=32,
        patch_size=8,
        depth=2,
        dynamic_img_size=True,
    )
    backbone.set_grad_checkpointing(True)
    spec = DinoObjective(
        out_dim=64, head_hidden_dim=32, head_bottleneck_dim=16, local_crops=2, local_crop_size=16, **kw
    )
    return objectives.Dino(backbone, spec)


def views(batch: int = 3) -> list[torch.Tensor]:
    return [torch.randn(batch, 3, 32, 32) for _ in range(2)] + [torch.randn(batch, 3, 16, 16) for _ in range(2)]


def test_student_trains_teacher_follows_by_ema():
    dino = tiny_dino(teacher_momentum=0.9)
    assert all(not p.requires_grad for p in dino.teacher.parameters())
    assert dino.teacher.backbone.grad_checkpointing is False and dino.student.backbone.grad_checkpointing is True
    opt = torch.optim.SGD(dino.parameters(), lr=0.5)
    loss = dino.loss((views(), None))
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is None for p in dino.teacher.parameters())
    before_t = [p.detach().clone() for p in dino.teacher.parameters()]
    opt.step()
    after_s = [p.detach().clone() for p in dino.student.parameters()]
    dino.after_optimizer_step()
    for t0, s1, t1 in zip(before_t, after_s, dino.teacher.parameters(), strict=True):
        torch.testing.assert_close(t1, 0.9 * t0 + 0.1 * s1)


def test_center_is_an_ema_of_teacher_outputs():
    dino = tiny_dino(center_momentum=0.5)
    v = views()
    with torch.no_grad():
        teacher_out = dino.teacher(v[:2]).float()
    dino.loss((v, None))
    torch.testing.assert_close(dino.center, 0.5 * teacher_out.mean(0, keepdim=True), rtol=1e-4, atol=1e-5)


def test_loss_matches_dino_formula():
    dino = tiny_dino()
    v = views(2)
    with torch.no_grad():
        t = dino.teacher(v[:2]).float()
        s = dino.student(v).float()
        q = torch.softmax(t / dino.spec.teacher_temp, -1).chunk(2)  # the center starts at zero
        logp = torch.log_softmax(s / dino.spec.student_temp, -1).chunk(4)
        expected = sum((-q[i] * logp[j]).sum(-1).mean() for i in range(2) for j in range(4) if i != j) / 6
    assert dino.loss((v, None)).item() == pytest.approx(float(expected), rel=1e-4)


def _rank(rank: int, world: int, store: str, out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    # Forked from a process whose libgomp pool is running: one thread, or the first parallel op waits for
    # threads the fork did not copy (the ranks hung in a full test run).
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    dino = tiny_dino(center_momentum=0.5)  # the same weights on both ranks (seeded), other images on each
    torch.manual_seed(100 + rank)
    v = views()
    with torch.no_grad():
        mine = dino.teacher(v[:2]).float().mean(0, keepdim=True)
    dino.distribute(lambda m: DistributedDataParallel(m))
    compiled = []
    dino.compile(lambda m: compiled.append(type(m).__name__) or m)
    dino.loss((v, None))
    torch.save({"center": dino.center, "mine": mine, "compiled": compiled}, f"{out}.{rank}")
    dist.destroy_process_group()


def test_under_ddp_the_centre_is_the_mean_over_every_rank_and_the_wrapper_is_compiled(tmp_path):
    """DINO's update_center all-reduces the teacher's batch mean: each rank's centre is the same, the mean of
    both ranks' outputs. compile(DDP(student)), so dynamo splits the graph at DDP's buckets (pytorch#89096)."""
    import torch.multiprocessing as mp

    out = str(tmp_path / "rank")
    mp.start_processes(_rank, args=(2, str(tmp_path / "store"), out), nprocs=2, start_method="fork")
    r0, r1 = (torch.load(f"{out}.{r}") for r in range(2))
    expected = 0.5 * (r0["mine"] + r1["mine"]) / 2
    torch.testing.assert_close(r0["center"], expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(r1["center"], expected, rtol=1e-4, atol=1e-5)
    assert r0["compiled"] == ["DistributedDataParallel", "VisionTransformer"]  # the student whole, the teacher


def test_compile_keeps_a_static_graph_per_resolution(monkeypatch):
    """DINO's student meets 224 px and 98 px crops in one step: compiled with static shapes, each keeps a graph
    of its own (torch's default would turn the second into one automatic-dynamic graph for both)."""
    from dinox.measure import models

    asked: dict = {}
    monkeypatch.setattr(torch, "compile", lambda model, **kw: asked.update(kw) or model)
    models.compile_model(torch.nn.Linear(2, 2), True)
    assert asked == {"mode": None, "dynamic": False}
    models.compile_model(torch.nn.Linear(2, 2), "max-autotune")
    assert asked["mode"] == "max-autotune" and asked["dynamic"] is False


def test_the_graph_count_says_what_warm_up_built_and_what_the_windows_compiled(monkeypatch):
    from dinox.measure import models

    count = iter([3, 5])  # read at the first window and at the first phase after the windows, never again
    monkeypatch.setattr(models, "compiled_graphs", lambda: next(count))
    told: list[str] = []
    graphs = models.GraphCount(told.append)
    for phase in ("warm-up", "window 1/3", "window 2/3", "ablation windows", "loader alone"):
        graphs.phase(phase)
    graphs.end()
    assert graphs.metrics == {"compile_graphs": 3.0, "recompiles_in_windows": 2.0}
    assert told == ["warm-up", "window 1/3", "window 2/3", "ablation windows", "loader alone"]


def test_inside_local_steps_the_centre_exchanges_nothing_between_ranks(monkeypatch):
    """The half-batch pair runs under DDP's no_sync: DINO's centre all-reduce stays out of it too, or it would
    read as the host's batch-independent cost; outside it, every micro-batch all-reduces the centre."""
    import torch.distributed as dist

    calls: list[int] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "all_reduce", lambda t, *a, **k: calls.append(1))
    obj = tiny_dino()
    with obj.local():
        obj.loss((views(), None))
    assert calls == [] and obj.reduce_center
    obj.loss((views(), None))
    assert calls == [1]
