"""`dinox submit --launcher kubernetes` through the command a user types, against a fake `kubectl` on PATH that
records what it was asked and answers as the API server does (Job status with completedIndexes and
failedIndexes, pods with their completion index); the store is a real `mlflow server`. The pod's command is run
by /bin/sh as the kubelet would, with its completion index."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dinox.launch import kubernetes
from dinox.launch.launcher import Job, TaskState
from tests.conftest import TINY, run_dinox

SPEC = TINY.format(name="kube_sweep") + "sweep:\n  grid:\n    batch.size: [2, 3, 4]\n"

# The fake: each call appended to calls.jsonl (argv and stdin); `get job` answers the next of job_states.json
# (the last one for good), `get pods` with pods.json; a state "down" answers as an unreachable API server.
FAKE = """#!{python}
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
args = sys.argv[1:]
stdin = sys.stdin.read() if "-" in args else ""
with open(os.path.join(here, "calls.jsonl"), "a") as f:
    f.write(json.dumps({{"args": args, "stdin": stdin}}) + "\\n")
if "--namespace" in args:
    i = args.index("--namespace"); args = args[:i] + args[i + 2:]
if args[:1] == ["apply"]:
    for item in json.loads(stdin)["items"]:
        print(item["kind"].lower() + "/" + item["metadata"]["name"] + " created")
elif args[:2] == ["get", "job"]:
    path = os.path.join(here, "job_states.json")
    states = json.load(open(path))
    state = states.pop(0) if len(states) > 1 else states[0]
    json.dump(states, open(path, "w"))
    if state == "down":
        sys.stderr.write("The connection to the server 10.0.0.1:6443 was refused - did you specify the right host?\\n")
        sys.exit(1)
    if state == "gone":
        sys.stderr.write('Error from server (NotFound): jobs.batch "%s" not found\\n' % args[2]); sys.exit(1)
    print(json.dumps({{"status": state}}))
elif args[:2] == ["get", "pods"]:
    print(open(os.path.join(here, "pods.json")).read())
else:
    sys.stderr.write("fake kubectl: unexpected " + " ".join(args) + "\\n"); sys.exit(2)
"""


def _pod(index: int, phase: str, created: str = "2026-11-26T10:00:00Z") -> dict:
    annotations = {"batch.kubernetes.io/job-completion-index": str(index)}
    return {"metadata": {"annotations": annotations, "creationTimestamp": created}, "status": {"phase": phase}}


@pytest.fixture
def kube(tmp_path):
    """A folder with the spec and a fake kubectl first on PATH; (work, env, calls())."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "kubectl"
    fake.write_text(FAKE.format(python=sys.executable))
    fake.chmod(0o755)
    (bin_dir / "job_states.json").write_text(json.dumps([{"active": 3}]))
    (bin_dir / "pods.json").write_text(json.dumps({"items": [_pod(0, "Running"), _pod(1, "Pending")]}))
    (tmp_path / "s.yaml").write_text(SPEC)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}

    def calls() -> list[dict]:
        path = bin_dir / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    return tmp_path, env, bin_dir, calls


def _submit(work: Path, env: dict, uri: str, *extra: str):
    args = ["submit", "s.yaml", "--tasks", "3", "--launcher", "kubernetes", "--image", "reg.example/dinox:1.2"]
    return run_dinox([*args, "--tracking-uri", uri, *extra], cwd=work, env=env)


def test_submit_applies_an_indexed_job_with_the_spec_in_a_configmap_and_the_store_in_a_secret(kube, mlflow_server):
    work, env, _bin, calls = kube
    uri = mlflow_server.url.replace("http://", "http://team:s3cret@")  # a password: never in a file
    extra = ["--namespace", "ml", "--volume", "data:/mnt/data", "--gpus-per-task", "1", "--mem", "64Gi"]
    proc = _submit(work, env, uri, *extra, "--set", "model.img_size=48")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "submitted as Kubernetes job dinox-kube-sweep-" in proc.stdout and "s3cret" not in proc.stdout
    (call,) = calls()
    assert call["args"] == ["--namespace", "ml", "apply", "-f", "-"]
    secret, config, job = json.loads(call["stdin"])["items"]
    name = job["metadata"]["name"]
    assert secret["kind"] == "Secret" and secret["stringData"]["MLFLOW_TRACKING_URI"] == uri
    assert config["data"]["spec.yaml"] == SPEC and config["metadata"]["namespace"] == "ml"
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 3)
    (container,) = spec["template"]["spec"]["containers"]
    assert container["image"] == "reg.example/dinox:1.2"
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1", "memory": "64Gi"}
    env_in_pod = {e["name"]: e for e in container["env"]}
    assert env_in_pod["DINOX_TASKS"]["value"] == "1 2 3"
    assert env_in_pod["MLFLOW_TRACKING_URI"]["valueFrom"]["secretKeyRef"]["name"] == f"{name}-store"
    assert {"name": "volume-0", "mountPath": "/mnt/data"} in container["volumeMounts"]
    # The manifest kept beside the submission: everything but the Secret.
    (kept,) = (work / ".dinox" / "kubernetes").glob("*/job.json")
    assert [i["kind"] for i in json.loads(kept.read_text())["items"]] == ["ConfigMap", "Job"]
    assert "s3cret" not in kept.read_text()
    # The pod's command, run as the kubelet runs it for completion index 1: task 2 of 3, its journal on the
    # volume, the --set passed on quoted.
    shown = _run_pod_command(work, container["command"], index=1, tasks="1 2 3")
    assert shown == [
        "-m", "dinox", "run", "/dinox/spec/spec.yaml", "--set", "model.img_size=48", "--shard", "2/3",
        "--workdir", f"/mnt/data/dinox/{name}/task-2",
    ]  # fmt: skip


def _run_pod_command(work: Path, command: list[str], index: int, tasks: str) -> list[str]:
    """/bin/sh -c COMMAND with a `python` that prints its arguments, as a pod would run it."""
    fake_bin = work / "podbin"
    fake_bin.mkdir(exist_ok=True)
    (fake_bin / "python").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    (fake_bin / "python").chmod(0o755)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "JOB_COMPLETION_INDEX": str(index), "DINOX_TASKS": tasks}
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_wait_follows_the_job_status_and_names_each_failed_task_with_its_log_and_resubmission(kube, mlflow_server):
    work, env, bin_dir, _calls = kube
    states = [{"active": 3}, "down", {"completedIndexes": "0,2", "active": 1}, {"completedIndexes": "0,2",
              "failedIndexes": "1"}]  # fmt: skip
    (bin_dir / "job_states.json").write_text(json.dumps(states))
    proc = _submit(work, env, mlflow_server.url, "--wait")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    job = lines[0].split("submitted as Kubernetes job ")[1].split(":")[0]
    assert f"kubernetes job {job}: 3 tasks (2 pending, 1 running); trials recorded 0/3" in lines
    assert any(
        ln.startswith("kubernetes API server not answering (kubectl get refused: The connection") for ln in lines
    )
    assert "kubernetes API server answers again" in lines
    assert f"kubernetes job {job}: 3 tasks (2 completed, 1 failed); trials recorded 0/3" in lines
    assert (
        f"task 2 FAILED: log: kubectl logs -l job-name={job},batch.kubernetes.io/job-completion-index=1; again: "
        "dinox submit SPEC --tasks 3 --launcher kubernetes --image reg.example/dinox:1.2 --array 2"
    ) in lines


def test_one_task_again_is_a_one_completion_job_of_that_task(kube, mlflow_server):
    work, env, _bin, calls = kube
    proc = _submit(work, env, mlflow_server.url, "--array", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = json.loads(calls()[0]["stdin"])["items"][2]
    assert job["spec"]["completions"] == 1
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert {e["name"]: e.get("value") for e in container["env"]}["DINOX_TASKS"] == "2"
    shown = _run_pod_command(work, container["command"], index=0, tasks="2")
    assert shown[shown.index("--shard") + 1] == "2/3"  # the task's own slice, not the Job's size


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "error: --launcher kubernetes needs --image"),
        (["--image", "x", "--partition", "gpu"], "error: --partition: not an option of --launcher kubernetes"),
        (["--image", "x; rm -rf /"], "error: --image 'x; rm -rf /': not an image reference"),
        (["--image", "x", "--namespace", "Team_A"], "error: --namespace 'Team_A': not a namespace's name"),
        (["--image", "x", "--volume", "data"], "error: --volume 'data': give CLAIM:/PATH"),
        (["--image", "x", "--volume", "data:/mnt/../etc"], "error: --volume 'data:/mnt/../etc': give CLAIM:/PATH"),
        (["--image", "x", "--volume", "data:/"], "error: --volume 'data:/': give CLAIM:/PATH"),
        (["--image", "x", "--volume", "data:/dinox/spec"], "error: --volume 'data:/dinox/spec': give CLAIM:/PATH"),
        (["--image", "x", "--mem", "64 GB"], "error: --mem '64 GB': not a memory quantity Kubernetes reads"),
    ],
)
def test_bad_kubernetes_options_are_one_line_before_the_store_or_kubectl_is_asked(kube, extra, message):
    work, env, _bin, calls = kube
    args = ["submit", "s.yaml", "--tasks", "2", "--launcher", "kubernetes", "--tracking-uri", "http://127.0.0.1:9"]
    proc = run_dinox([*args, *extra], cwd=work, env=env)
    assert proc.returncode == 2 and proc.stderr.startswith(message) and "Traceback" not in proc.stderr, proc.stderr
    assert calls() == [] and not (work / ".dinox").exists()


def test_slurm_refuses_the_kubernetes_options(kube):
    work, env, _bin, _calls = kube
    proc = run_dinox(["submit", "s.yaml", "--tasks", "2", "--image", "reg/x:1"], cwd=work, env=env)
    assert proc.returncode == 2 and proc.stderr.startswith("error: --image: not an option of --launcher slurm")


def test_task_states_read_terminal_indexes_from_the_job_and_the_rest_from_the_newest_pod():
    job = {"status": {"completedIndexes": "0-1", "failedIndexes": "3"}}
    pods = {"items": [_pod(2, "Failed", "2026-11-26T10:00:00Z"), _pod(2, "Running", "2026-11-26T10:05:00Z"),
                      _pod(3, "Failed"), _pod(9, "Running")]}  # fmt: skip
    states = kubernetes.task_states((1, 2, 3, 4, 5), job, pods)
    assert states == {1: TaskState("COMPLETED"), 2: TaskState("COMPLETED"), 3: TaskState("RUNNING"),
                      4: TaskState("FAILED"), 5: TaskState("PENDING")}  # fmt: skip
    name = kubernetes.job_name(Job("My_Sweep.v2", 5, (1,), Path("/w/kubernetes/20261126-101500-My_Sweep.v2")))
    assert name == "dinox-my-sweep-v2-20261126101500"
