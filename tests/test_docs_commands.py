"""Every command block (bash, sh) of README.md and docs/ as the CLIs read it, and where each block is run.

A renamed option, a spec or script that moved, an MLproject entry point or parameter the docs still name: each
is caught here, in the fast tier, without running anything. Every `dinox` line is parsed by dinox's own click
commands (option names, choices, types, files); every `python scripts/X.py` line's options are checked
against that script's `--help`; every `mlflow run` line's entry point and `-P` names against MLproject. And
every block is classified in BLOCKS: run end to end by a test, or run in parts (by the tests named, with the
reason it cannot run whole here). A new block fails until it is one or the other.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import click
import pytest
import yaml

from tests.conftest import ROOT

# Sample values for the docs' placeholders: a run id, a shell variable.
PLACEHOLDERS = {r"<[^>]*run[^>]*id[^>]*>": "0123456789abcdef0123456789abcdef", r"<run [AB]>": "0" * 32, r"\$i\b": "1"}

# Each block, by its file and the start of its key (Block.key): the tests that run it, whole or in parts (and why).
BLOCKS: dict[tuple[str, str], tuple[str, list[str]]] = {
    ("README.md", "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && dinox run"): (
        "whole",
        ["tests/test_docs_blocks.py::test_the_readme_first_block_runs_the_quickstart_opens_the_ui_and_decides"],
    ),
    ("README.md", "mlflow run . --env-manager local --experiment-name quickstart"): (
        "whole",
        ["tests/test_packaging.py::test_mlflow_run_makes_its_own_run_the_sweep_parent"],
    ),
    ("README.md", "python3 -m venv .venv && .venv/bin/pip install -e '.[test]'"): (
        "whole: it is .ci/run's last line",
        ["tests/test_packaging.py::test_ci_runs_exactly_the_readme_test_command"],
    ),
    ("docs/clusters.md", "mlflow server --backend-store-uri postgresql://"): (
        "whole, to the device line (the study is CUDA's): a PostgreSQL server on loopback for db-host",
        ["tests/test_docs_blocks.py::test_the_three_host_block_runs_against_a_postgresql_server_to_the_device_line"],
    ),
    ("docs/clusters.md", "export MLFLOW_TRACKING_URI=http://mlflow-host:5000"): (
        "in parts: the block asks for a gpu partition; the one-node Slurm here has none",
        [
            "tests/launch/test_slurm.py::test_a_sweep_submitted_as_a_slurm_array_records_each_trial_once_through_a_cancelled_task"
        ],
    ),
    ("docs/clusters.md", "export MLFLOW_TRACKING_URI=http://mlflow.ml.svc:5000"): (
        "in parts: no Kubernetes here; a fake kubectl answers as its API does",
        [
            "tests/launch/test_kubernetes.py::test_submit_applies_an_indexed_job_with_the_spec_in_a_configmap_and_the_store_in_a_secret",
            "tests/launch/test_kubernetes.py::test_wait_follows_the_job_status_and_names_each_failed_task_with_its_log_and_resubmission",
        ],
    ),
    ("docs/data.md", "python3 -m venv .venv && . .venv/bin/activate && pip install -e ."): (
        "whole, to the device line (the study is CUDA's)",
        ["tests/test_docs_blocks.py::test_the_data_docs_headline_block_runs_to_the_device_line_on_a_cpu_box"],
    ),
    ("docs/data.md", "python scripts/make_demo_images.py data/demo_images"): (
        "in parts: the spec is CUDA's (fp16, 12 workers); here its cases small, on the same demo JPEGs",
        [
            "tests/data/test_data_sources.py::test_a_shard_folder_is_one_whole_set_or_refused",
            "tests/test_workloads.py::test_resnet50_case_runs",
            "tests/test_scripts.py::test_bench_loader_writes_the_demo_tree_and_prints_a_row_per_decoder_and_augment",
        ],
    ),
    ("docs/deciding.md", "dinox decide --spec specs/quickstart.yaml"): (
        "in parts: the ViT-L/ViT-g experiments and H100 prices are a GPU team's store",
        [
            "tests/cli/test_decide_cli.py::test_mlproject_decide_entry_point",
            "tests/cli/test_decide_cli.py::test_decide_against_a_real_tracking_server",
        ],
    ),
    ("docs/deciding.md", "dinox decide --spec specs/quickstart.yaml  dinox head-to-head"): (
        "in parts: a tie is not there to order on a quiet box",
        [
            "tests/decide/test_head_to_head.py::test_head_to_head_measures_interleaved_rounds_that_decide_then_plans_with"
        ],
    ),
    ("docs/deciding.md", "dinox decide --spec specs/quickstart.yaml  dinox verify"): (
        "in parts: three minutes of training a block",
        [
            "tests/verify/test_verify.py::test_verify_trains_the_trial_through_epochs_and_records_the_forecast_error",
            "tests/cli/test_shrink_cli.py::test_a_shrunk_sweep_is_marked_and_decide_plans_from_it_only_when_told",
        ],
    ),
    ("docs/measuring.md", "python scripts/make_wheelhouse.py wheelhouse"): (
        "in parts: no other node; the wheelhouse installs offline into a venv beside this torch",
        ["tests/test_wheelhouse.py::test_the_wheelhouse_installs_offline_beside_the_node_s_own_torch"],
    ),
    ("docs/measuring.md", "python scripts/gpu_check.py --quick"): (
        "in parts: it needs a GPU; its --small run on this CPU",
        ["tests/test_scripts.py::test_gpu_check_small_passes_on_this_cpu"],
    ),
    ("docs/measuring.md", "python scripts/bench_verify.py --spec scripts/gpu_verify.yaml"): (
        "in parts: it needs a GPU; a round of a tiny spec on this CPU, and the GPU spec validated",
        [
            "tests/test_scripts.py::test_bench_verify_prints_a_row_per_round",
            "tests/test_scripts.py::test_the_gpu_verify_spec_is_valid_and_named_in_its_docs",
        ],
    ),
}


@dataclass
class Block:
    file: str
    line: int
    lines: list[str]  # as written
    commands: list[str]  # continuation lines joined, comments cut, `&&` chains split

    @property
    def key(self) -> str:
        """The first command line as written (and, for blocks that open alike, the next one's first two words)."""
        written = [ln.split("  #", 1)[0].strip() for ln in self.lines if ln.strip() and not ln.lstrip().startswith("#")]
        return written[0] if len(written) < 2 else f"{written[0]}  {' '.join(written[1].split()[:2])}"


def _commands(lines: list[str]) -> list[str]:
    joined, out = "", []
    for raw in lines:
        line = raw.split("  #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        joined += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            out += [part.strip() for part in joined.split("&&") if part.strip()]
            joined = ""
    return out


def documented_blocks() -> list[Block]:
    blocks = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines = path.read_text().splitlines()
        opened = None
        for i, line in enumerate(lines):
            if line.startswith(("```bash", "```sh", "```console")):
                opened = i
            elif line.startswith("```") and opened is not None:
                body = lines[opened + 1 : i]
                blocks.append(Block(str(path.relative_to(ROOT)), opened + 1, body, _commands(body)))
                opened = None
    return blocks


BLOCK_LIST = documented_blocks()


def _classified(block: Block) -> tuple[str, list[str]] | None:
    return next((v for (f, start), v in BLOCKS.items() if f == block.file and block.key.startswith(start)), None)


def _words(command: str) -> list[str]:
    for pattern, value in PLACEHOLDERS.items():
        command = re.sub(pattern, value, command)
    return shlex.split(command)


@pytest.mark.parametrize("block", BLOCK_LIST, ids=[f"{b.file}:{b.line}" for b in BLOCK_LIST])
def test_every_documented_block_is_run_whole_or_in_named_parts(block):
    found = _classified(block)
    assert found is not None, f"{block.file}:{block.line}: a block no test runs: {block.commands}"
    how, tests = found
    assert how.startswith(("whole", "in parts: ")) and tests, (block.file, how)
    for test in tests:
        path, name = test.split("::")
        assert re.search(rf"^def {re.escape(name)}\(", (ROOT / path).read_text(), re.M), f"{test}: no such test"


def test_each_classification_names_a_block_that_is_there():
    """A block rewritten or removed leaves no stale row behind (it would hide the new block's check)."""
    stale = [key for key in BLOCKS if not any(b.file == key[0] and b.key.startswith(key[1]) for b in BLOCK_LIST)]
    assert not stale, stale


def _dinox_parses(words: list[str]) -> None:
    """dinox's click command reads `words` (after `dinox`) as the shell would hand them over; nothing runs."""
    from dinox.cli.main import main

    assert words and words[0] in main.commands, f"not a dinox command: dinox {' '.join(words)}"
    with main.commands[words[0]].make_context(words[0], words[1:], resilient_parsing=False):
        pass


@cache
def _script_options(script: Path) -> set[str]:
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", out.stdout))


def _checked(words: list[str], monkeypatch) -> str:
    """What was checked of one command: its tool's reading of it, and the files it names."""
    for w in words:
        if re.match(r"(specs|scripts)/", w.split("=", 1)[-1]):
            assert (ROOT / w.split("=", 1)[-1]).exists(), f"{w}: no such file in the repository"
    if words[0] == "dinox":
        monkeypatch.chdir(ROOT)
        _dinox_parses(words[1:])
        return "dinox"
    if words[0] == "python" and words[1].startswith("scripts/"):
        used = {w.split("=", 1)[0] for w in words[2:] if w.startswith("-")}
        unknown = used - _script_options(ROOT / words[1])
        assert not unknown, f"{words[1]} has no option {sorted(unknown)}"
        return "script"
    if words[:2] == ["mlflow", "run"]:
        entries = yaml.safe_load((ROOT / "MLproject").read_text())["entry_points"]
        entry = words[words.index("-e") + 1] if "-e" in words else "main"
        assert entry in entries, f"MLproject has no entry point {entry!r}"
        names = [words[i + 1].split("=", 1)[0] for i, w in enumerate(words) if w == "-P"]
        missing = set(names) - set(entries[entry].get("parameters", {}))
        assert not missing, f"MLproject's {entry} has no parameter {sorted(missing)}"
        return "mlproject"
    return "other"


def test_every_documented_command_is_one_its_tool_accepts(monkeypatch):
    checked = {"dinox": 0, "script": 0, "mlproject": 0, "other": 0}
    for block in BLOCK_LIST:
        for command in block.commands:
            try:
                checked[_checked(_words(command), monkeypatch)] += 1
            except (AssertionError, click.ClickException) as e:
                message = e.format_message() if isinstance(e, click.ClickException) else str(e)
                raise AssertionError(f"{block.file}:{block.line}: {command}\n  {message}") from None
    # Nothing left unchecked by mistake: the blocks hold these many of each (pip, venv, export, mlflow server).
    assert checked["dinox"] >= 20 and checked["script"] >= 4 and checked["mlproject"] >= 3, checked


def test_a_documented_command_with_a_renamed_option_or_a_moved_spec_is_caught(monkeypatch):
    """The check itself, on commands that are wrong: each is refused."""
    for wrong in (
        "dinox run specs/quickstart.yaml --shards 1/3",
        "dinox decide --spec specs/no_such.yaml",
        "dinox decide --spec specs/quickstart.yaml --verdict GO",
        "dinox submit specs/quickstart.yaml --launcher nomad",
        "mlflow run . -e nowhere -P spec=specs/quickstart.yaml",
        "mlflow run . -P specfile=specs/quickstart.yaml",
        "python scripts/gpu_check.py --quickly",
    ):
        with pytest.raises((AssertionError, click.ClickException)):
            _checked(_words(wrong), monkeypatch)
