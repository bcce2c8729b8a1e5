"""The cluster templates in scripts/: the Slurm array script and the Kubernetes Indexed Job."""

from __future__ import annotations

import os
import re
import shlex
import subprocess

import yaml

from dinox.cli.run import run as run_command
from tests.conftest import ROOT

SBATCH = ROOT / "scripts" / "slurm_sweep.sbatch"
K8S = ROOT / "scripts" / "k8s_sweep_job.yaml"


def _run_options(args: list[str]) -> set[str]:
    """The options of `dinox run` a template passes, each checked to exist."""
    known = {opt for p in run_command.params for opt in p.opts}
    used = {a.split("=")[0] for a in args if a.startswith("--")}
    assert used <= known, used - known
    return used


def test_the_slurm_script_parses_and_runs_one_slice_per_array_task():
    assert subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True).returncode == 0
    text = SBATCH.read_text()
    directives = dict(re.findall(r"^#SBATCH (--[\w-]+)=(\S+)", text, re.M))
    low, high = re.fullmatch(r"(\d+)-(\d+)", directives["--array"]).groups()  # type: ignore[union-attr]
    assert directives["--gres"] == "gpu:1"
    # The array's ids are the slices, 1 to SHARDS, and SHARDS defaults to the array's size.
    assert low == "1" and re.search(rf"^SHARDS=\${{SHARDS:-{high}}}$", text, re.M)
    (command,) = re.findall(r"^exec (dinox run .*)$", text, re.M)
    args = shlex.split(command)
    assert args[args.index("--shard") + 1] == "${SLURM_ARRAY_TASK_ID:?run it as an array task}/${SHARDS}"
    assert _run_options(args) == {"--shard", "--workdir"} and "SLURM_ARRAY_TASK_ID" in args[-1]
    # Without a tracking server to share, the tasks would each write their own store: it refuses.
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.run(["bash", str(SBATCH)], env=env, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode != 0 and "export MLFLOW_TRACKING_URI" in proc.stderr


def test_the_kubernetes_job_is_indexed_and_records_into_its_mlflow_service():
    docs = {d["kind"]: d for d in yaml.safe_load_all(K8S.read_text())}
    assert set(docs) == {"Job", "Deployment", "Service"}
    job = docs["Job"]["spec"]
    assert job["completionMode"] == "Indexed" and 1 <= job["parallelism"] <= job["completions"]
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # a failed pod is a new pod with the same index: resume
    (container,) = pod["containers"]
    args = container["command"]
    assert args[:2] == ["dinox", "run"] and _run_options(args) == {"--shard", "--workdir"}
    assert args[args.index("--shard") + 1] == f"auto/{job['completions']}"  # the count a Job does not tell
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert args[2].startswith(mounts["spec"] + "/") and mounts["shm"] == "/dev/shm"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["spec"]["configMap"]["name"] == "dinox-spec"
    # The pods reach the server through the Service, by a name and port the server accepts.
    uri = {e["name"]: e["value"] for e in container["env"]}["MLFLOW_TRACKING_URI"]
    service = docs["Service"]
    (port,) = service["spec"]["ports"]
    assert uri == f"http://{service['metadata']['name']}:{port['port']}"
    server = docs["Deployment"]["spec"]["template"]
    assert service["spec"]["selector"] == server["metadata"]["labels"]
    flags = dict(a.split("=", 1) for a in server["spec"]["containers"][0]["command"] if "=" in a)
    assert flags["--port"] == str(port["targetPort"]) and flags["--host"] == "0.0.0.0"
    assert f"{service['metadata']['name']}:{port['port']}" in flags["--allowed-hosts"].split(",")
