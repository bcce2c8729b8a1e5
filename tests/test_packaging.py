"""The project as a newcomer meets it: README and docs, CI, MLproject, conda.yaml, shipped specs, boundaries."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from dinox.plan import grid
from dinox.spec import fields as spec_fields
from dinox.spec import file as spec_file
from dinox.spec.sections import TrialSpec
from tests.conftest import ROOT, TINY, run_dinox

SPECS = sorted((ROOT / "specs").glob("*.yaml"))


def test_conda_env_lists_the_same_dependencies_as_pyproject():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    conda = yaml.safe_load((ROOT / "conda.yaml").read_text())
    (pip_section,) = [d for d in conda["dependencies"] if isinstance(d, dict)]
    assert sorted(pip_section["pip"]) == sorted(deps)


def test_ci_runs_exactly_the_readme_test_command():
    ci_command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    readme = (ROOT / "README.md").read_text()
    assert ci_command.endswith("python -m pytest -n 2 --dist worksteal")  # pytest-xdist: the box's two cores
    assert f"\n{ci_command}\n" in readme


def test_readme_quickstart_command_runs_the_shipped_quickstart():
    readme = (ROOT / "README.md").read_text()
    assert "pip install -e . && dinox run specs/quickstart.yaml" in readme
    assert (ROOT / "specs" / "quickstart.yaml").exists()


def test_mlproject_main_entry_takes_a_spec():
    project = yaml.safe_load((ROOT / "MLproject").read_text())
    main = project["entry_points"]["main"]
    assert "spec" in main["parameters"]
    assert main["command"] == "python -m dinox run {spec} --set {set} --shrink-if {shrink}"
    assert main["parameters"]["set"]["default"] == "" and main["parameters"]["shrink"]["default"] == "false"
    assert project["conda_env"] == "conda.yaml"
    decide_entry = project["entry_points"]["decide"]
    assert {"spec", "out"} <= set(decide_entry["parameters"])
    assert decide_entry["command"].startswith("python -m dinox decide --spec {spec} --out {out}")
    pre = project["entry_points"]["preprocess"]
    assert {"dicom_root", "out_root"} <= set(pre["parameters"])
    assert pre["command"] == "python -m dinox preprocess --dicom-root {dicom_root} --out-root {out_root}"


def _field_paths(model, prefix=""):
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        members = spec_fields.models_in(field.annotation)
        if not members or name == "kwargs":
            yield path
        for member in members:
            yield from _field_paths(member, path + ".")


def test_the_spec_reference_covers_every_field():
    readme = (ROOT / "docs" / "spec.md").read_text()
    paths = list(dict.fromkeys(_field_paths(TrialSpec)))
    assert {"objective.out_dim", "data.index_csv", "data.shards", "batch.size"} <= set(paths)
    missing = [p for p in paths if f"`{p}`" not in readme and f"`{p}," not in readme and f" `{p}" not in readme]
    assert not missing, f"docs/spec.md lacks: {missing}"
    assert "`sweep.grid`" in readme and "`sweep.cases`" in readme


@pytest.mark.parametrize("path", SPECS, ids=[p.name for p in SPECS])
def test_every_shipped_spec_validates_and_names_its_command(path):
    trials = grid.expand(spec_file.load(path))
    assert trials
    modeline, header = path.read_text().splitlines()[:2]
    assert modeline == "# yaml-language-server: $schema=dinox.schema.json"  # editor completion from the schema
    assert re.match(rf"# Run: dinox run specs/{path.name}$", header), header


def test_every_shipped_spec_passes_dinox_validate_where_its_data_exists(tmp_path):
    # The CT specs read data/processed/_index/index.csv relative to where dinox runs; give them one, so
    # validate's preflight gets to check everything else, the timm model names included.
    index = tmp_path / "data" / "processed" / "_index" / "index.csv"
    index.parent.mkdir(parents=True)
    # Enough slices and images for the largest batch a shipped spec asks for (a set smaller than one batch
    # would yield none: validate refuses it, naming the sizes).
    index.write_text("png_path,series_dir,slice_index\n" + "".join(f"a/{z:05d}.png,a,{z}\n" for z in range(256)))
    images = tmp_path / "data" / "demo_images" / "n0"  # the ImageNet spec's image folder
    images.mkdir(parents=True)
    for i in range(400):
        (images / f"{i}.jpg").touch()
    proc = run_dinox(["validate", *map(str, SPECS)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split(":")[0] for line in lines if not line.startswith("  ")] == [f"OK {p}" for p in SPECS]
    # A spec for a GPU box, validated where there is none: valid, and said to be not for this machine.
    notes = [line for line in lines if line.startswith("  ")]
    assert all(n.startswith("  but not on this machine: ") and ": hardware.device: " in n for n in notes), notes


def _modules() -> list[str]:
    """Every module of the package, found by walking the tree (no hand-kept list)."""
    names = []
    for path in sorted((ROOT / "dinox").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return [n for n in names if n != "dinox.__main__"]


# The child side: what runs in a trial's process. Everything else is the parent side, which must import
# without torch (spec checks, plans, decisions and DICOM run on a box without a GPU stack).
CHILD_SIDE = ("dinox.measure", "dinox.data")


def test_parent_side_never_imports_torch_and_child_never_imports_mlflow():
    parent = [m for m in _modules() if not m.startswith(CHILD_SIDE)]
    assert len(parent) > 40 and "dinox.cli.main" in parent and "dinox.store.recorder" in parent
    heavy = ("torch", "timm", "torchvision")
    code = f"import sys, importlib\nfor m in {parent!r}: importlib.import_module(m)\n"
    code += f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout
    child = "import sys; import dinox.measure.trial; print(any(m.split('.')[0] == 'mlflow' for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def _imports(path: Path) -> set[str]:
    """The dinox modules a module imports: at its top, inside a function, or for type checkers only (a cycle
    of types is a cycle of meaning all the same)."""
    import ast

    found: set[str] = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("dinox"):
            for alias in n.names:
                sub = f"{n.module}.{alias.name}"
                found.add(sub if (ROOT / (sub.replace(".", "/") + ".py")).exists() else n.module)
        elif isinstance(n, ast.Import):
            found |= {a.name for a in n.names if a.name.startswith("dinox")}
    return found


def test_no_import_cycles():
    graph = {}
    for name in _modules():
        rel = name.replace(".", "/")
        path = ROOT / (rel + ".py") if (ROOT / (rel + ".py")).exists() else ROOT / rel / "__init__.py"
        graph[name] = _imports(path) - {name}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*trail[trail.index(dep) :], dep]))
            if dep not in state:
                visit(dep, [*trail, dep])
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])


def test_every_module_lives_in_a_room():
    loose = sorted(p.name for p in (ROOT / "dinox").glob("*.py"))
    shared = ["contract.py", "entrypoints.py", "errors.py", "record.py", "writes.py"]
    assert loose == ["__init__.py", "__main__.py", *shared], loose
    for pkg in sorted(p for p in (ROOT / "dinox").iterdir() if (p / "__init__.py").exists()):
        doc = (pkg / "__init__.py").read_text()
        assert doc.startswith('"""') and len(doc.splitlines()) >= 3, f"{pkg.name}/__init__.py says what it offers"


def test_ruff_clean():
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "dinox", "tests", "scripts"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _mlflow_run(tmp_path: Path, extra: list[str]):
    (tmp_path / "s.yaml").write_text(TINY.format(name="mlproj"))
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    env.pop("MLFLOW_RUN_ID", None)
    # MLproject's command calls `python`: the interpreter of this environment, as in an activated venv.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlflow",
            "run",
            str(ROOT),
            "--env-manager",
            "local",
            *extra,
            "-P",
            f"spec={tmp_path / 's.yaml'}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    return proc, client, runs


def test_mlflow_run_makes_its_own_run_the_sweep_parent(tmp_path):
    """One `mlflow run` without --experiment-name (the sweep lands in MLflow's Default experiment and dinox
    says how to keep the spec's name) and with -P set (the MLproject parameter reaches `dinox run --set`; its
    empty default is what `mlflow run` passes otherwise, as `--set ''`)."""
    proc, client, runs = _mlflow_run(tmp_path, ["-P", "set=batch.size=2;precision=fp32"])
    assert "pass --experiment-name mlproj to mlflow run" in proc.stdout
    top = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(top) == 1, "one invocation, one top-level run"
    (parent,) = top
    assert parent.data.tags["dinox.role"] == "sweep" and parent.info.status == "FINISHED"
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert [c.data.tags["dinox.status"] for c in children] == ["ok"]
    assert children[0].info.experiment_id == parent.info.experiment_id  # nested in the UI
    assert children[0].data.params["batch.size"] == "2"  # TINY says 4


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_readme_is_short_and_points_to_every_doc():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert readme.index("dinox decide --spec specs/quickstart.yaml") < 1500, "decide in the first screen"
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{doc.name})" in readme, doc.name


def test_architecture_names_every_subpackage():
    text = (ROOT / "docs" / "architecture.md").read_text()
    for pkg in sorted(p.name for p in (ROOT / "dinox").iterdir() if (p / "__init__.py").exists()):
        assert f"`{pkg}/`" in text, pkg
    assert "flowchart" in text and "`dinox/record.py`" in text and "`dinox/errors.py`" in text


def test_what_the_docs_commands_write_is_ignored_by_git():
    """After following the README and docs, `git status` is clean: every folder their commands write is ignored."""
    written = {"decision/", "mlflow.db", ".dinox/"}
    for doc in DOCS:
        written |= set(re.findall(r"(?<![\w/])data/(?:demo_\w+|processed|\w*shards)/?", doc.read_text()))
    ignored = set((ROOT / ".gitignore").read_text().split())
    missing = {w for w in written if w.rstrip("/") + "/" not in ignored and w.rstrip("/") not in ignored}
    assert not missing, missing


def _fast_tier_files(request: pytest.FixtureRequest) -> set[str]:
    """The files `pytest -m "not slow"` runs: read off this session where it collected the whole suite (the
    README's command: the markers are the ones conftest set), else from a collection of its own (~12 s)."""
    config = request.config
    whole = config.args in ([], ["tests"], [str(ROOT / "tests")]) and not config.option.keyword
    if whole and not config.option.markexpr and str(config.rootpath) == str(ROOT):
        items = request.session.items
        return {i.nodeid.split("::")[0] for i in items if i.get_closest_marker("slow") is None}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "not slow", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    files = {line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line}
    assert files, proc.stdout[-2000:] + proc.stderr[-2000:]
    return files


def test_the_fast_tier_covers_every_room(request):
    """The tests mirror the rooms (tests/<room>/ for each room of dinox), and `pytest -m "not slow"` (the
    contributors' loop) still runs tests of each room's own folder and a test that imports each room."""
    import re

    files = _fast_tier_files(request)
    rooms = sorted(p.name for p in (ROOT / "dinox").iterdir() if (p / "__init__.py").exists())
    covered = set()
    for name in files:
        text = (ROOT / name).read_text()
        covered |= set(re.findall(r"\bdinox\.(\w+)", text)) | set(re.findall(r"from dinox import ([\w, ]+)", text))
    covered = {part.strip() for c in covered for part in c.split(",")}
    assert [r for r in rooms if r not in covered] == []
    assert [r for r in rooms if not any(f.startswith(f"tests/{r}/test_") for f in files)] == []


def test_the_session_runs_the_longest_modules_first_each_module_whole(request):
    """xdist's worksteal hands each worker a contiguous share of the collected tests: the modules holding the
    longest tests of tests/slow.txt (with their seconds) come first, so none starts with little else left, and
    each module's tests stay together (a module fixture set up once)."""
    from tests.conftest import slow_tests

    seconds = slow_tests()
    assert all(s >= 0 for s in seconds.values()) and max(seconds.values()) > 60  # the list carries its seconds
    for node in seconds:
        assert (ROOT / node.split("::")[0]).is_file(), f"tests/slow.txt names a missing module: {node}"
    modules = [item.nodeid.split("::")[0] for item in request.session.items]
    order = list(dict.fromkeys(modules))
    assert len(order) == len([m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m])  # whole
    longest = max(seconds, key=seconds.get).split("::")[0]
    if longest in order:  # a whole-suite session: the module of the longest test leads
        assert order[0] == longest


def test_decide_store_and_report_name_params_only_through_spec_params():
    """A spec field renamed once emptied decide's columns silently: the rooms that read params back spell no
    field path themselves; dinox.spec.params names each, checked against the spec at import."""
    import re

    from dinox.spec import params

    fields = r"(?:batch|loader|model|data|hardware|measure|runtime|routine|augment)\.[a-z_.]+|precision"
    literal = re.compile(rf"([\"'])({fields})\1")  # the same quote at both ends: a string, not prose
    found = []
    for room in ("decide", "store", "report"):
        for path in sorted((ROOT / "dinox" / room).glob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                if not line.lstrip().startswith("#") and (m := literal.search(line)):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {m.group(0)}")
    assert found == []
    names = [v for k, v in vars(params).items() if k.isupper()]
    assert len(names) == len(set(names)) >= 16
    from dinox.spec.sections import TrialSpec

    spec = {
        "name": "p",
        "model": {"name": "resnet18"},
        "data": {"source": "webdataset", "shards": "shards/"},
        "routine": {"checkpoint_every_steps": 100, "eval_every_epochs": 1, "eval_images": 500},
        "shrunk": True,  # a param only where --shrink set it
    }
    flat = TrialSpec.model_validate(spec).flat_params()
    assert set(names) <= set(flat), sorted(set(names) - set(flat))  # each a param a trial logs


# The rooms, top to bottom: a room imports only rooms below it, and the shared vocabulary beside record.py.
# The data flows one way: spec -> plan (trials) -> isolate (the child process) -> measure (the result) ->
# store (MLflow) -> sweep -> decide -> report -> the commands.
LAYERS = [
    {"__main__"},
    {"cli"},
    {"verify"},
    {"report"},
    {"decide"},
    {"sweep", "launch"},
    {"store"},
    {"measure"},
    {"isolate"},
    {"plan"},
    {"data"},
    {"spec"},
]
SHARED = {"contract", "record", "errors", "writes", "entrypoints"}


def test_rooms_import_only_the_rooms_below_them():
    """A reading of every import (at module level or inside a function): no arrow from a lower room back
    up, and the shared modules import no room."""
    import ast

    level = {room: i for i, layer in enumerate(LAYERS) for room in layer}
    rooms = {p.name for p in (ROOT / "dinox").iterdir() if (p / "__init__.py").exists()} | {"__main__"}
    assert rooms == set(level), sorted(rooms ^ set(level))
    wrong = []
    for path in sorted((ROOT / "dinox").rglob("*.py")):
        parts = path.relative_to(ROOT / "dinox").parts
        room = parts[0] if len(parts) > 1 else path.stem.removesuffix(".py")
        if room == "__init__":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dinox"):
                targets = [node.module.split(".")[1]] if "." in node.module else [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name.split(".")[1] for a in node.names if a.name.startswith("dinox.")]
            else:
                continue
            for target in targets:
                if target == room or target in SHARED and room not in SHARED:
                    continue
                if room in SHARED and target in SHARED:
                    continue
                if target not in level or room not in level or level[target] <= level[room]:
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {room} imports {target}")
    assert wrong == []


def test_mlflow_run_with_shrink_true_measures_the_spec_shrunk_and_a_hostile_value_runs_nothing(tmp_path):
    """-P shrink=true reaches `dinox run --shrink` (through --shrink-if: MLflow cannot pass an optional flag);
    the trial is tagged shrunk, so decide will not plan from it unless told. A value that is not a boolean is
    refused in one line, and nothing it says runs."""
    proc, _client, runs = _mlflow_run(tmp_path, ["-P", "shrink=true"])
    assert "shrunk (--shrink): vit_tiny_patch16_224" in proc.stdout, proc.stdout
    assert "pass --experiment-name mlproj_shrunk to mlflow run" in proc.stdout, proc.stdout
    (trial,) = [r for r in runs if r.data.tags.get("dinox.role") == "trial"]
    assert trial.data.tags["dinox.shrunk"] == "true" and trial.data.tags["dinox.status"] == "ok"
    assert trial.data.params["shrunk"] == "True"
    hostile = run_dinox(["run", "s.yaml", "--shrink-if", "$(touch PWNED)\x1b[2J"], cwd=tmp_path)
    assert hostile.returncode == 2 and "is not a valid boolean" in hostile.stderr, hostile.stderr
    assert "\x1b" not in hostile.stderr and "Traceback" not in hostile.stderr
    assert not (tmp_path / "PWNED").exists()
