"""A team's own step (`objective: {kind: python, entry: ...}`), from a module outside the dinox package: built,
held to the protocol, each bad entry one line; measured through `dinox run`, its source part of the trial."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from dinox.measure import estimate, user_step
from dinox.spec.sections import TrialSpec
from tests.conftest import ROOT, run_dinox


def _docs_module(nth: int) -> str:
    """docs/spec.md's example modules (0: the step, 1: the dataset): the tests measure the very text a user copies."""
    text = (ROOT / "docs" / "spec.md").read_text()
    start = text.index("## Your own training step")
    for _ in range(nth + 1):
        start = text.index("```python\n", start) + len("```python\n")
    return text[start : text.index("```", start)]


RECIPE, DATA = _docs_module(0), _docs_module(1)
SPEC = """\
name: mine
model: {{name: mynet, img_size: 32}}
objective: {{kind: python, entry: "{entry}", num_classes: 10, options: {{smoothing: 0.1}}}}
batch: {{size: 8}}
measure: {{warmup_steps: 1, bench_steps: 3, repeats: 1, timeout_s: 120, ablation: false}}
"""

# (entry, module text under bad/, what the one line says)
BAD = {
    "no_module": ("nope.mod:build", None, "module 'nope.mod' is not in"),
    "syntax": (
        "bad.m:build",
        "def build(ctx:\n",
        "importing bad.m failed: SyntaxError: '(' was never closed (bad/m.py:1)",
    ),
    "import_fails": (
        "bad.m:build",
        "import no_such_pkg_xyz\n",
        "ModuleNotFoundError: No module named 'no_such_pkg_xyz' (bad/m.py:1)",
    ),
    "no_name": ("bad.m:missing", "def build(ctx):\n    return None\n", "bad/m.py has no 'missing'"),
    "not_callable": ("bad.m:build", "build = 3\n", "build is an int, not a callable"),
    "raises": (
        "bad.m:build",
        "def build(ctx):\n    raise ValueError('no config')\n",
        "the call raised ValueError: no config (bad/m.py:2)",
    ),
    "returns_none": (
        "bad.m:build",
        "def build(ctx):\n    return None\n",
        "returned None; it must return an object with",
    ),
    "protocol": (
        "bad.m:build",
        "class Half:\n    def parameters(self): return []\n    def loss(self, b): return 0\n"
        "def build(ctx):\n    return Half()\n",
        "returned a Half without after_optimizer_step, compile, distribute",
    ),
}


def _project(root: Path, entry: str = "mypkg.recipe:build") -> Path:
    (root / "mypkg").mkdir(exist_ok=True)
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "recipe.py").write_text(RECIPE)
    (root / "mypkg" / "data.py").write_text(DATA)
    (root / "spec.yaml").write_text(SPEC.format(entry=entry))
    return root / "spec.yaml"


@pytest.fixture(autouse=True)
def _own_imports(monkeypatch):
    """Each test imports its modules afresh (a trial's child always does): `bad.m` is a new file each time."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name in [n for n in sys.modules if n.split(".")[0] in ("bad", "mypkg")]:
        del sys.modules[name]


def _spec(root: Path, entry: str) -> TrialSpec:
    from dinox.plan import grid
    from dinox.spec import file as spec_file

    (root / "s.yaml").write_text(SPEC.format(entry=entry))
    return grid.expand(spec_file.load(str(root / "s.yaml")))[0].spec


def test_the_entry_builds_a_step_dinox_trains(tmp_path, monkeypatch):
    _project(tmp_path)
    monkeypatch.chdir(tmp_path)
    spec = _spec(tmp_path, "mypkg.recipe:build")
    o = spec.objective
    assert (o.path, o.file) == (str(tmp_path), str(tmp_path / "mypkg" / "recipe.py")) and len(o.code) == 64
    step = user_step.build(o, user_step.Context(spec.model, torch.device("cpu"), "fp32", 10, o.options))
    assert [type(m).__name__ for m in step.modules()] == ["Net"]  # dinox's default: its nn.Module attributes
    batch = (torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,)))
    step.loss(batch).backward()
    step.after_optimizer_step()
    assert step.inner.steps == 1 and all(p.grad is not None for p in step.parameters())
    assert set(step.state()) == {"module0"} and step.evaluate(batch).dim() == 0


def test_plan_counts_the_user_step_with_torch_s_flop_counter(tmp_path, monkeypatch):
    _project(tmp_path)
    monkeypatch.chdir(tmp_path)
    spec = _spec(tmp_path, "mypkg.recipe:build")
    cost = estimate.cost_of(spec)
    step = user_step.build(spec.objective, user_step.Context(spec.model, torch.device("cpu"), "fp32", 10, {}))
    with FlopCounterMode(display=False) as counter:
        step.loss(
            (torch.randn(estimate.SAMPLES, 3, 32, 32), torch.zeros(estimate.SAMPLES, dtype=torch.long))
        ).backward()
    assert (
        cost.flops_per_image == pytest.approx(counter.get_total_flops() / estimate.SAMPLES) and cost.flops_per_image > 0
    )
    assert cost.params == sum(p.numel() for p in step.parameters())


@pytest.mark.parametrize("case", list(BAD))
def test_each_bad_entry_is_one_line(tmp_path, monkeypatch, case):
    entry, text, says = BAD[case]
    monkeypatch.chdir(tmp_path)
    if text is not None:
        (tmp_path / "bad").mkdir()
        (tmp_path / "bad" / "m.py").write_text(text)
    from dinox.spec.file import SpecError

    try:
        spec = _spec(tmp_path, entry)
    except SpecError as e:  # found on disk or not: the parent's own check, before any child
        message = str(e)
    else:
        with pytest.raises(user_step.EntryError) as caught:
            user_step.build(spec.objective, user_step.Context(spec.model, torch.device("cpu"), "fp32", 10, {}))
        message = str(caught.value)
    assert says in message and "\n" not in message, message


@pytest.mark.slow
def test_validate_gives_each_bad_entry_one_line_and_exit_2(tmp_path):
    """Every spec's entries are checked in one child where they import from one folder: each spec is still told
    of its own (a bad entry two specs share, to both), and a module of the same name in another folder is the
    other folder's (its own child: an imported module is never imported again from elsewhere)."""
    (tmp_path / "bad").mkdir()
    paths, cases = [], []
    for case, (entry, text, says) in BAD.items():
        if text is not None:
            (tmp_path / "bad" / f"{case}.py").write_text(text)
            entry = entry.replace("bad.m:", f"bad.{case}:")
        for name in (case, "raises_too") if case == "raises" else (case,):
            (tmp_path / f"{name}.yaml").write_text(SPEC.format(entry=entry))
            paths.append(f"{name}.yaml")
            cases.append((name, case, says))
    (tmp_path / "other" / "bad").mkdir(parents=True)
    (tmp_path / "other" / "bad" / "raises.py").write_text(RECIPE)  # a good step, under the bad one's name
    elsewhere = SPEC.format(entry="bad.raises:build").replace("kind: python,", "kind: python, path: other,")
    (tmp_path / "elsewhere.yaml").write_text(elsewhere)
    proc = run_dinox(["validate", *paths, "elsewhere.yaml"], cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == "OK elsewhere.yaml: 1 trial, experiment 'mine'\n", proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == len(BAD) + 1, proc.stderr
    for line, (name, case, says) in zip(lines, cases, strict=True):
        assert (
            line.startswith(f"error: {name}.yaml:3: objective.entry: ")
            and says.replace("bad/m.py", f"bad/{case}.py").replace("bad.m ", f"bad.{case} ") in line
        ), line


@pytest.mark.slow
def test_dinox_run_measures_the_user_step_and_again_once_its_source_changes(tmp_path):
    from mlflow import MlflowClient

    _project(tmp_path)
    first = run_dinox(["run", "spec.yaml", "--no-system-metrics"], cwd=tmp_path)
    assert first.returncode == 0 and "[1/1] ok" in first.stdout, first.stdout + first.stderr
    again = run_dinox(["run", "spec.yaml", "--no-system-metrics"], cwd=tmp_path)
    assert "[1/1] recorded" in again.stdout, again.stdout  # the same code: the trial the experiment holds
    with open(tmp_path / "mypkg" / "recipe.py", "a") as f:
        f.write("\n# a change in the team's code\n")
    changed = run_dinox(["run", "spec.yaml", "--no-system-metrics"], cwd=tmp_path)
    assert changed.returncode == 0 and "[1/1] ok" in changed.stdout, changed.stdout + changed.stderr
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs(["1"], "tags.`dinox.role` = 'trial'", order_by=["attributes.start_time ASC"])
    assert len(runs) == 2 and runs[0].data.tags["dinox.trial_id"] != runs[1].data.tags["dinox.trial_id"]
    for run in runs:
        p = run.data.params
        assert (p["objective.entry"], p["objective.file"]) == (
            "mypkg.recipe:build",
            str(tmp_path / "mypkg" / "recipe.py"),
        )
        assert run.data.tags["dinox.status"] == "ok" and run.data.metrics["images_per_s"] > 0
    assert runs[0].data.params["objective.code"] != runs[1].data.params["objective.code"]

    (tmp_path / "own_data.yaml").write_text(SPEC.format(entry="mypkg.recipe:build") + OWN_DATA)
    own = run_dinox(["run", "own_data.yaml", "--no-system-metrics"], cwd=tmp_path)
    assert own.returncode == 0 and "[1/1] ok" in own.stdout, own.stdout + own.stderr
    (run,) = client.search_runs(["1"], "params.`data.source` = 'python'")
    assert run.data.params["data.file"] == str(tmp_path / "mypkg" / "data.py") and run.data.tags["dinox.status"] == "ok"


OWN_DATA = 'data: {source: python, entry: "mypkg.data:build", normalize: true, options: {samples: 64}}\n'


def test_the_data_entry_gives_the_loader_its_dataset(tmp_path, monkeypatch):
    from dinox.data import build_dataset
    from dinox.data.views import view_plan

    _project(tmp_path)
    monkeypatch.chdir(tmp_path)
    spec = _spec(tmp_path, "mypkg.recipe:build")
    (tmp_path / "d.yaml").write_text(SPEC.format(entry="mypkg.recipe:build") + OWN_DATA)
    from dinox.plan import grid
    from dinox.spec import file as spec_file

    spec = grid.expand(spec_file.load(str(tmp_path / "d.yaml")))[0].spec
    assert spec.data.file == str(tmp_path / "mypkg" / "data.py") and spec.data.code == spec.objective.code
    pipeline = build_dataset(spec, 3, 10, 200, view_plan(spec))
    assert pipeline.images and pipeline.samples == 64 and pipeline.repeats == 4  # 64 repeated to cover 200
    image, label = pipeline.dataset[65]
    assert image.shape == (3, 32, 32) and image.dtype == torch.uint8 and label == 1


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("def build(ctx):\n    return None\n", "returned None; it must return a torch Dataset"),
        ("def build(ctx):\n    return [1, 2, 3]\n", "a sample is int; the step takes (image or views, label) pairs"),
        ("class D:\n    def __len__(self): return 0\n    def __getitem__(self, i): return i\n"
         "def build(ctx):\n    return D()\n", "the dataset is empty"),
        ("class D:\n    def __len__(self): return 4\n    def __getitem__(self, i): raise KeyError('no image 0')\n"
         "def build(ctx):\n    return D()\n", "its first sample raised KeyError: 'no image 0' (bad/d.py:3)"),
    ],
    ids=["none", "not_pairs", "empty", "raises"],
)  # fmt: skip
def test_each_bad_data_entry_is_one_line(tmp_path, monkeypatch, text, says):
    from dinox.measure import entry_check
    from dinox.plan import grid
    from dinox.spec import file as spec_file

    _project(tmp_path)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "d.py").write_text(text)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.yaml").write_text(
        SPEC.format(entry="mypkg.recipe:build") + 'data: {source: python, entry: "bad.d:build"}\n'
    )
    spec = grid.expand(spec_file.load(str(tmp_path / "d.yaml")))[0].spec
    ((index, field, message),) = entry_check.check([spec])
    assert (index, field) == (0, "data.entry") and says in message and "\n" not in message, message


COLLATING = """\
import torch
from torch.utils.data import default_collate

from mypkg.recipe import Step


class Collating(Step):  # the documented step, and what its recipe's collate adds: here, labels as int32
    seen = ()

    def loss(self, batch):
        self.seen = (*self.seen, batch[1].dtype)
        return super().loss((batch[0], batch[1].long()))

    def collate(self, base):
        def collate(samples):
            images, labels = (base or default_collate)(samples)
            return images, labels.to(torch.int32)

        return collate


def build(ctx):
    return Collating(ctx)
"""


def test_a_user_step_s_collate_wraps_the_trial_s_loader(tmp_path, monkeypatch):
    """`collate(base)`, read where present (docs/spec.md): the trial's loader runs it, and the step gets what it
    made (as DINOv2's masks reach dinox's own step)."""
    from dinox.measure.trial import TrialRun

    _project(tmp_path)  # the documented module, which the collating step builds on
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "__init__.py").write_text("")
    (tmp_path / "bad" / "coll.py").write_text(COLLATING)
    monkeypatch.chdir(tmp_path)
    run = TrialRun(_spec(tmp_path, "bad.coll:build"), {}, {}, {}, out_dir=tmp_path)
    run.setup()
    assert run.make_loop().run(1, 1).windows[0].images_per_s > 0
    assert run.step.objective.inner.seen and set(run.step.objective.inner.seen) == {torch.int32}
