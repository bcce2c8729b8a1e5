"""The hostile-input test: every text and path parameter of every command `dinox --help` lists, given the
values a hostile week brings (a control character, shell syntax, Slurm's %, an escape sequence), through
`dinox` itself. What each command must do: refuse in one line with exit 2 (or end as it would on any bad
name), never print a raw escape sequence, never run what the value says, never leave a traceback. A new
command or option joins by being listed in PARAMS; a test compares PARAMS with the commands themselves."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from dinox.cli.main import main
from tests.conftest import ROOT, TINY

# A line break then a command, escape sequences (a window title, a cleared screen, text turned around).
CONTROL = "x\n$(touch PWNED)\x1b]0;owned\x07\x1b[2J\u202e"
# All printable: shell syntax, Slurm's and printf's % patterns, a path that climbs out.
SHELL = "$(touch PWNED);`touch PWNED`|touch PWNED %n%A%s ../../x"

# Each command's valid call; the parameter under test replaces its value there (or is added).
BASE = {
    "validate": ["validate", "s.yaml"],
    "plan": ["plan", "s.yaml"],
    "run": ["run", "bad.yaml", "--tracking-uri", "sqlite:///m.db", "--workdir", "wd"],
    "submit": ["submit", "s.yaml", "--tasks", "1", "--tracking-uri", "http://127.0.0.1:9"],
    "decide": ["decide", "--tracking-uri", "sqlite:///m.db", "--experiment", "none", "--days", "1", "--no-log"],
    "verify": ["verify", "s.yaml", "--tracking-uri", "sqlite:///m.db", "--minutes", "0.01"],
    "head-to-head": ["head-to-head", "s.yaml", "--tracking-uri", "sqlite:///m.db", "--rounds", "5"],
    "preprocess": ["preprocess", "--dicom-root", "dicom", "--out-root", "png"],
    "shards": ["shards", "--index-csv", "idx.csv", "--out", "sh"],
    "sync": ["sync", "--workdir", "wd"],
    "ui": ["ui", "--tracking-uri", "sqlite:///m.db", "--port", "1"],
    "schema": ["schema"],
}
# Every text or path parameter, by command: the option, or the positional's name.
PARAMS = {
    "validate": ["SPEC_FILES", "--set"],
    "plan": ["SPEC_FILE", "--set"],
    "run": ["SPEC_FILE", "--tracking-uri", "--workdir", "--shard", "--devices", "--profile", "--set"],
    "submit": [
        "SPEC_FILE",
        "--tracking-uri",
        "--array",
        "--partition",
        "--mem",
        "--time",
        "--sbatch-option",
        "--workdir",
        "--image",
        "--namespace",
        "--volume",
        "--set",
    ],
    "decide": ["--experiment", "--run-id", "--tracking-uri", "--out", "--spec", "--price"],
    "verify": ["SPEC_FILE", "--decision", "--run-id", "--tracking-uri", "--workdir", "--set"],
    "head-to-head": ["SPEC_FILE", "--decision", "--run-id", "--tracking-uri", "--workdir", "--set"],
    "preprocess": ["--dicom-root", "--out-root"],
    "shards": ["--index-csv", "--image-folder", "--out", "--root"],
    "sync": ["SWEEP_DIRS", "--workdir", "--tracking-uri"],
    "ui": ["--tracking-uri", "--host", "--experiment"],
    "schema": [],
}
# A printable value some commands take as a name or a path and go on with: their outcome is their own (a
# name not found, a folder made), and still nothing runs, nothing prints raw, nothing crashes.
ACCEPTS_PRINTABLE = {("run", "--workdir"), ("decide", "--out"), ("preprocess", "--out-root"), ("shards", "--out")}


def _texty(command: click.Command) -> list[str]:
    return [
        p.opts[0] if isinstance(p, click.Option) else p.name.upper()
        for p in command.params
        if isinstance(p.type, click.types.StringParamType | click.Path)
    ]


def test_params_lists_every_text_and_path_parameter_of_every_command():
    assert sorted(main.commands) == sorted(PARAMS)
    for name, command in main.commands.items():
        assert sorted(_texty(command)) == sorted(PARAMS[name]), name


def _argv(command: str, param: str, value: str) -> list[str]:
    argv = list(BASE[command])
    if param.startswith("--"):
        if param == "--set":
            return [*argv, "--set", f"model.name={value}"]
        if param in argv:
            argv[argv.index(param) + 1] = value
            return argv
        return [*argv, param, value]
    return [argv[0], value, *argv[2:]] if command not in ("sync",) else [*argv, value]


CASES = [(c, p, kind) for c in PARAMS for p in PARAMS[c] for kind in ("control", "shell")]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    work = tmp_path_factory.mktemp("hostile")
    (work / "s.yaml").write_text(TINY.format(name="hostile"))
    (work / "bad.yaml").write_text("name: hostile\nmodel: {name: no_such_model}\n")
    (work / "dicom").mkdir()
    (work / "idx.csv").write_text("png_path,series_dir,slice_index\n")
    cases = []
    for command, param, kind in CASES:
        case_dir = work / f"{command}{param}-{kind}".replace("/", "_")
        case_dir.mkdir()
        for name in ("s.yaml", "bad.yaml", "idx.csv"):
            (case_dir / name).write_text((work / name).read_text())
        (case_dir / "dicom").mkdir()
        value = CONTROL if kind == "control" else SHELL
        cases.append({"argv": _argv(command, param, value), "cwd": str(case_dir), "timeout": 90})
    return work, dict(zip(CASES, run_cases(work, cases), strict=True))


def run_cases(work, cases: list[dict]) -> list[dict]:
    """Each case's `dinox ARGS` through tests.cli.hostile_runner: its exit code, stdout and stderr."""
    (work / "cases.json").write_text(json.dumps(cases))
    (work / "out").mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "tests.cli.hostile_runner", str(work / "cases.json"), str(work / "out")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_a_hostile_value_is_refused_or_inert(results, case):
    work, by_case = results
    command, param, kind = case
    r = by_case[case]
    shown = f"dinox {' '.join(_argv(command, param, '<' + kind + '>'))}: rc {r['rc']}\n{r['out']}\n{r['err']}"
    assert r["rc"] in (0, 1, 2, 3), shown  # not a crash (99), a signal or a hang
    assert "Traceback" not in r["err"] + r["out"], shown
    for raw in ("\x1b", "\x07", "\u202e"):
        assert raw not in r["out"] + r["err"], shown  # shown as its escape, never as itself
    # A newline in the value never starts a line of its own (a line that reads as dinox's).
    assert not any(ln.startswith("$(touch") for ln in (r["out"] + r["err"]).splitlines()), shown
    assert not list(work.rglob("PWNED")), shown  # nothing the value said ran
    if kind == "control" or (command, param) not in ACCEPTS_PRINTABLE:
        assert r["rc"] == 2, shown


# Values inside a spec file: YAML's quoted strings hold a newline or a carriage return, which reach problems
# (one line each), the plan's table and the trials' lines.
SPEC_VALUES = {
    "name": 'name: "x\\n$(touch PWNED) fake"\nmodel: {name: vit_tiny_patch16_224}\n',
    "model": 'name: ok\nmodel: {name: "vit\\r$(touch PWNED) fake"}\n',
    "path": 'name: ok\nmodel: {name: vit_tiny_patch16_224}\ndata: {source: ct_png, index_csv: "a\\n$(touch PWNED)"}\n',
    "sweep": 'name: ok\nmodel: {name: vit_tiny_patch16_224}\nsweep: {grid: {batch.size: [4, "x\\n$(touch PWNED)"]}}\n',
    "drift": 'name: ok\nmodel: {name: vit_tiny_patch16_224}\nsweep: {drift_check: "x\\n$(touch PWNED)"}\n',
}


def test_a_newline_or_carriage_return_inside_a_spec_value_stays_inside_its_line(tmp_path):
    cases = []
    for name, text in SPEC_VALUES.items():
        (tmp_path / f"{name}.yaml").write_text(text)
        for argv in (["validate"], ["plan", "--no-estimate"], ["run", "--tracking-uri", "sqlite:///m.db"]):
            cases.append({"argv": [argv[0], f"{name}.yaml", *argv[1:]], "cwd": str(tmp_path), "timeout": 90})
    for case, r in zip(cases, run_cases(tmp_path, cases), strict=True):
        shown = f"dinox {' '.join(case['argv'])}: rc {r['rc']}\n{r['out']}\n{r['err']}"
        assert r["rc"] in (0, 2) and "Traceback" not in r["err"], shown
        assert "\r" not in r["out"] + r["err"], shown  # a carriage return would overwrite the line it is in
        assert not any(ln.startswith("$(touch") for ln in (r["out"] + r["err"]).splitlines()), shown
        if case["argv"][0] != "plan":  # plan shows what the spec holds; validate and run refuse each of these
            assert r["rc"] == 2, shown
    assert not list(tmp_path.rglob("PWNED"))


def test_a_path_inside_a_command_dinox_prints_stays_one_shell_word(tmp_path):
    """The commands dinox prints for a user to paste (the UI's `mlflow ui --backend-store-uri`, `dinox plan` of a
    spec whose device this box lacks): a path with a space, `;` or `$(...)` in them is one quoted word, so pasting the
    line runs that command on that path and nothing else."""
    import shlex

    from tests.conftest import run_dinox

    work = tmp_path / "runs; $(touch PWNED)"
    work.mkdir()
    (work / "my spec.yaml").write_text(TINY.format(name="paths"))
    (work / "gpu spec.yaml").write_text(TINY.format(name="paths") + "hardware: {device: mps}\n")  # never on Linux
    ran = run_dinox(["run", "my spec.yaml", "--no-system-metrics"], cwd=work)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    (browse,) = [ln.split("browse: ", 1)[1] for ln in ran.stdout.splitlines() if "browse: " in ln]
    command = browse.split("  (then open", 1)[0]
    assert shlex.split(command) == ["mlflow", "ui", "--backend-store-uri", f"sqlite:///{work / 'mlflow.db'}"], command
    refused = run_dinox(["run", "gpu spec.yaml"], cwd=work)
    assert refused.returncode == 2 and "`dinox plan 'gpu spec.yaml'` plans it" in refused.stderr, refused.stderr
    assert not list(tmp_path.rglob("PWNED"))
