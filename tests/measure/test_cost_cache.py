"""A model's cost kept between sweeps: keyed by what the cost depends on, read back only when it is a cost,
and used by the next `dinox run` of the same model."""

from __future__ import annotations

import json

import pytest

from dinox.measure import cost_cache, estimate
from dinox.spec.sections import TrialSpec
from tests.conftest import TINY, run_dinox


def spec(**over) -> TrialSpec:
    base = {"name": "x", "model": {"name": "vit_tiny_patch16_224", "img_size": 32}, "hardware": {"device": "cpu"}}
    return TrialSpec.model_validate({**base, **over})


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_the_key_is_what_the_cost_depends_on():
    plain = cost_cache.path_for(spec())
    assert plain is not None and plain.parent.name == "costs"
    # The sweep's name, its batch and its loader change no model's cost.
    assert cost_cache.path_for(spec(name="other", batch={"size": 64}, loader={"num_workers": 2})) == plain
    others = [
        spec(model={"name": "vit_tiny_patch16_224", "img_size": 64}),
        spec(model={"name": "vit_tiny_patch16_224", "img_size": 32, "grad_checkpointing": True}),
        spec(model={"name": "vit_tiny_patch16_224", "img_size": 32, "fused_attention": False}),
        spec(objective={"kind": "classification", "num_classes": 10}),
        spec(objective={"kind": "dino", "out_dim": 1024}),
    ]
    assert len({cost_cache.path_for(s) for s in others} | {plain}) == len(others) + 1
    # The team's own step is never kept: its code is theirs, and the key would not see it change.
    user = spec(objective={"kind": "python", "entry": "mypkg.recipe:build"})
    assert cost_cache.path_for(user) is None


COST = {
    "params": 5,
    "trainable_params": 5,
    "frozen_params": 0,
    "flops_per_image": 1.5e9,
    "saved_bytes_per_image": 2.0e6,
    "sample_bytes": 12296,
}


@pytest.mark.parametrize(
    "text",
    [
        "{",  # cut short
        "[1, 2]",
        json.dumps({**COST, "extra": 1}),
        json.dumps({k: v for k, v in COST.items() if k != "params"}),
        json.dumps({**COST, "params": "5"}),
        json.dumps({**COST, "params": True}),
        json.dumps({**COST, "flops_per_image": -1.0}),
        json.dumps({**COST, "flops_per_image": float("nan")}),
    ],
)
def test_a_kept_file_that_is_not_a_cost_is_not_read(tmp_path, text):
    path = tmp_path / "c.json"
    path.write_text(text)
    assert cost_cache.load(path) is None


def test_a_cost_kept_is_read_back_and_a_cache_that_cannot_be_written_costs_nothing(tmp_path):
    path = cost_cache.path_for(spec())
    cost_cache.save(path, COST)
    assert cost_cache.load(path) == COST
    assert cost_cache.load(tmp_path / "absent.json") is None
    blocked = tmp_path / "file"
    blocked.write_text("")
    cost_cache.save(blocked / "costs" / "c.json", COST)  # a parent that is a file: left as it is
    assert blocked.read_text() == ""


def test_the_estimate_child_recomputes_a_damaged_cost_and_keeps_it_again(tmp_path):
    s = spec()
    (tmp_path / "request.json").write_text(json.dumps({"specs": {"k": s.model_dump(mode="json")}}))
    path = cost_cache.path_for(s)
    path.parent.mkdir(parents=True)
    path.write_text('{"params": ')
    assert estimate.run_child(str(tmp_path / "request.json"), str(tmp_path / "out.json")) == 0
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["cached"] == [] and out["errors"] == {}
    assert cost_cache.load(path) == out["costs"]["k"] and out["costs"]["k"]["params"] > 0
    assert estimate.run_child(str(tmp_path / "request.json"), str(tmp_path / "again.json")) == 0
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["cached"] == ["k"] and again["costs"] == out["costs"]


def test_the_next_dinox_run_of_the_same_model_reads_its_cost_from_the_cache(tmp_path):
    (tmp_path / "a.yaml").write_text(TINY.format(name="first"))
    (tmp_path / "b.yaml").write_text(TINY.format(name="second").replace("size: 4", "size: 8"))
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    seen = []
    for name in ("a", "b"):
        proc = run_dinox(["run", f"{name}.yaml", "--no-system-metrics"], cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (kept,) = (tmp_path / ".dinox" / "sweeps").glob(f"{'first' if name == 'a' else 'second'}/*/estimate")
        seen.append(json.loads((kept / "estimate.json").read_text()))
    assert seen[0]["cached"] == [] and len(seen[1]["cached"]) == 1
    assert list(seen[0]["costs"].values()) == list(seen[1]["costs"].values())
    assert len(list((tmp_path / "cache" / "dinox" / "costs").glob("*.json"))) == 1


def test_a_link_planted_at_a_cache_file_is_replaced_never_written_through(tmp_path):
    path = cost_cache.path_for(spec())
    path.parent.mkdir(parents=True)
    target = tmp_path / "elsewhere.txt"
    target.write_text("someone else's file")
    path.symlink_to(target)
    assert cost_cache.load(path) is None  # not a cost: read as JSON and refused
    cost_cache.save(path, COST)
    assert not path.is_symlink() and cost_cache.load(path) == COST
    assert target.read_text() == "someone else's file"
