"""The motivating study's figures (the field reports dinox grew from) as trial records, and a writer that
logs them to MLflow through its public API, so decide is tested on known numbers."""

from __future__ import annotations

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag

from dinox.store.trial_record import TrialRecord

DATASET, EPOCHS = 244_527, 100
VIT_L = {"model.name": "vit_large_patch14_dinov2", "model.kwargs.embed_dim": "1024", "model.kwargs.depth": "24"}
VIT_G = {"model.name": "vit_giant_patch14_dinov2", "model.kwargs.embed_dim": "1536", "model.kwargs.depth": "40"}


def trial(
    model: dict,
    size: int,
    accum: int,
    ips: float | None,
    status: str = "ok",
    *,
    ckpt: bool = True,
    workers: int = 4,
    pin: bool = True,
    reserved_gb: float = 10.0,
    params_m: float = 304.0,
    bound: str = "compute_bound",
    run_id: str = "",
) -> dict:
    """One trial in the record the README describes. `ips` is both the forecast (images over the timed windows)
    and the p90 figure (step_s_p90 = images per step / ips); three windows within ±0.5 % of it."""
    params = {
        **model,
        "batch.size": str(size),
        "batch.accumulation": str(accum),
        "batch.effective": str(size * accum),
        "precision": "bf16-mixed",
        "model.grad_checkpointing": str(ckpt),
        "loader.num_workers": str(workers),
        "loader.pin_memory": str(pin),
        "model.img_size": "224",
    }
    metrics: dict[str, float] = {"params_m": params_m, "device_mem_total_gb": 96.0}
    tags = {"dinox.status": status, "dinox.role": "trial"}
    if status == "ok":
        p90 = size * accum / ips  # type: ignore[operator]
        metrics.update(
            {
                "images_per_s": ips,
                "images_per_s_min": ips * 0.995,  # type: ignore[operator]
                "images_per_s_max": ips * 1.005,  # type: ignore[operator]
                "windows": 3,
                "step_s_p90": p90,
                "step_s_p50": p90 * 0.97,  # type: ignore[operator]
                "peak_mem_reserved_gb": reserved_gb,
                "peak_mem_allocated_gb": reserved_gb * 0.9,
            }
        )
        tags["dinox.bound"] = bound
    else:
        tags["dinox.error"] = "CUDA out of memory" if status == "oom" else "boom"
    return {
        "run_id": run_id or f"{params['model.name'][:9]}-{size}x{accum}-w{workers}-{pin}-{status}",
        "params": params,
        "metrics": metrics,
        "tags": tags,
    }


def study() -> list[dict]:
    large = [
        trial(VIT_L, 48, 4, 23.54),
        trial(VIT_L, 64, 4, 23.51),
        trial(VIT_L, 96, 2, 23.22),
        trial(VIT_L, 128, 2, 22.46),
        trial(VIT_L, 160, 2, 22.40),
    ]
    giant = [
        trial(VIT_G, 4, 1, 2.71, ckpt=False, params_m=1100.0),
        trial(VIT_G, 8, 1, None, "oom", ckpt=False, params_m=1100.0),
        trial(VIT_G, 24, 8, 5.26, params_m=1100.0),
        trial(VIT_G, 32, 8, 5.40, params_m=1100.0),
    ]
    return large + giant


def loader_study() -> list[dict]:
    """The loader sweep at batch 32 (seed 001): workers x pin_memory, a small model."""
    model = {"model.name": "resnet18"}
    curve = {0: 78, 4: 337, 8: 495, 16: 482, 24: 503, 32: 485}
    out = [
        trial(
            model,
            32,
            1,
            float(ips),
            workers=w,
            pin=True,
            params_m=11.7,
            bound="io_bound" if w == 0 else "compute_bound",
        )
        for w, ips in curve.items()
    ]
    out += [trial(model, 32, 1, ips * 0.94, workers=w, pin=False, params_m=11.7) for w, ips in curve.items() if w]
    return out


def records(rows: list[dict]) -> list[TrialRecord]:
    return [TrialRecord(r["run_id"], "0", r["run_id"], r["params"], r["metrics"], r["tags"]) for r in rows]


def log(client: MlflowClient, experiment: str, rows: list[dict], parent: bool = True) -> tuple[str, dict[str, str]]:
    """Log rows as nested trial runs under a sweep run; returns (parent run id, row run_id -> MLflow id)."""
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp else client.create_experiment(experiment)
    parent_id = ""
    if parent:
        parent_id = client.create_run(exp_id, tags={"dinox.role": "sweep"}).info.run_id
    ids = {}
    for r in rows:
        tags = {**r["tags"], **({"mlflow.parentRunId": parent_id} if parent_id else {})}
        run = client.create_run(exp_id, run_name=r["run_id"], tags=tags)
        client.log_batch(
            run.info.run_id,
            params=[Param(k, v) for k, v in r["params"].items()],
            metrics=[Metric(k, v, 0, 0) for k, v in r["metrics"].items()],
            tags=[RunTag("dinox.role", "trial")],
        )
        client.set_terminated(run.info.run_id, "FINISHED" if r["tags"]["dinox.status"] == "ok" else "FAILED")
        ids[r["run_id"]] = run.info.run_id
    if parent_id:
        client.set_terminated(parent_id, "FINISHED")
    return parent_id, ids


APU = "AMD Strix Halo APU"  # the first field report's machine: 128 GB unified memory
H100 = "NVIDIA H100 80GB HBM3"


def two_devices() -> list[dict]:
    """The seeds' figures as measured on the APU (ViT-L 23.5 img/s, ViT-G 5.4), the same configurations on
    an H100 at 4x the rate, and the best ViT-L configuration on two H100s at 90 % scaling efficiency."""
    apu = study()
    h100 = study()
    for row in apu:
        row["tags"]["dinox.device_name"] = APU
    for row in h100:
        row["tags"]["dinox.device_name"] = H100
        row["run_id"] += "-h100"
        m = row["metrics"]
        m["device_mem_total_gb"] = 80.0
        for key in ("images_per_s", "images_per_s_min", "images_per_s_max", "step_s_p90", "step_s_p50"):
            if key in m:
                m[key] = m[key] * 4 if key.startswith("images_per_s") else m[key] / 4
    two = trial(VIT_L, 64, 4, 23.51 * 4 * 2 * 0.9, run_id="vit_large-64x4-2xh100")
    two["params"].update({"hardware.gpus": "2", "batch.effective": "512"})
    two["metrics"].update(step_s_p90=512 / (23.51 * 4 * 2 * 0.9), step_s_p50=512 / (23.51 * 4 * 2 * 0.9) * 0.97)
    two["tags"]["dinox.device_name"] = H100
    return apu + h100 + [two]
