"""`dinox submit --launcher kubernetes`: the sweep as a Kubernetes Indexed Job, one completion index per slice,
each pod a `dinox run --shard I/N` recording into one tracking server; read back with kubectl.

The objects, in one manifest applied with `kubectl apply -f -`:

- a ConfigMap holding the spec file, mounted read-only at /dinox/spec/ (the image needs no copy of it);
- a Secret holding MLFLOW_TRACKING_URI (it may carry a password; the manifest kept beside the logs has the
  Secret's name, never its value);
- an Indexed Job (`completionMode: Indexed`): completion index k runs the k-th task of DINOX_TASKS, so the
  whole sweep is tasks 1..N and one task submitted again alone (`--array 3`) is a one-completion Job of the
  same template whose DINOX_TASKS is "3": the slice is the task, never derived from the Job's size.

Each pod runs `/bin/sh -c` with every value shell-quoted; the image (--image) must hold dinox and its torch
stack, and the data the spec names must be where the spec says inside the pod (a --volume CLAIM:PATH mounts
a PersistentVolumeClaim). Task states come from the Job's status (completedIndexes, failedIndexes: terminal)
and its pods' phases (pending, running). Kubernetes is reached through `kubectl` on PATH, with the user's
kubeconfig and context; --namespace picks the namespace.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dinox.launch.launcher import Job, LaunchError, SchedulerDown, ScriptValueError, TaskState, compress, expand

SPEC_DIR = "/dinox/spec"
SPEC_NAME = "spec.yaml"
# A DNS-1123 label: what a Kubernetes object's name (and a label's value) must be.
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# An image reference: registry/path:tag@digest, no whitespace or shell characters.
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}")
# A quantity Kubernetes reads for memory: 64Gi, 64G, 16000Mi, 500M.
_MEMORY = re.compile(r"\d+(\.\d+)?([KMGTPE]i?)?")
_PATH = re.compile(r"/[A-Za-z0-9._-][A-Za-z0-9._/-]*")  # absolute, not "/" itself
_COMMAND = (
    'set -eu; set -- $DINOX_TASKS; shift "$JOB_COMPLETION_INDEX"; task="$1"; '
    'exec {run} --shard "$task/{tasks}" --workdir {workdir}/task-"$task"'
)


@dataclass(frozen=True)
class Volume:
    """A PersistentVolumeClaim mounted into every pod (--volume CLAIM:PATH)."""

    claim: str
    path: str

    @classmethod
    def parse(cls, text: str) -> Volume:
        claim, sep, path = text.partition(":")
        clash = path.rstrip("/") in ("/dinox", SPEC_DIR) or f"{path}/".startswith(f"{SPEC_DIR}/")
        if not sep or not _LABEL.fullmatch(claim) or not _PATH.fullmatch(path) or "/../" in f"{path}/" or clash:
            raise ScriptValueError(
                f"--volume {text!r}: give CLAIM:/PATH, a PersistentVolumeClaim's name (lowercase letters, digits, "
                f"-) and an absolute mount path (not /, not {SPEC_DIR}, where the spec is mounted)"
            )
        return cls(claim, path)


@dataclass(frozen=True)
class Kubernetes:
    """The Launcher for Kubernetes: an Indexed Job applied with kubectl, read back with kubectl get."""

    image: str
    spec_text: str  # the spec file's text, for the ConfigMap
    tracking_uri: str = ""
    namespace: str | None = None
    volumes: tuple[Volume, ...] = ()
    gpus_per_task: int | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    parallel: int | None = None
    name: str = "kubernetes"

    def check(self) -> None:
        """Every value that enters the manifest as a name, an image or a quantity, in its own form."""
        if not _IMAGE.fullmatch(self.image):
            raise ScriptValueError(f"--image {self.image!r}: not an image reference (registry/name:tag)")
        if self.namespace is not None and not _LABEL.fullmatch(self.namespace):
            raise ScriptValueError(f"--namespace {self.namespace!r}: not a namespace's name (a DNS-1123 label)")
        if self.mem is not None and not _MEMORY.fullmatch(self.mem):
            raise ScriptValueError(f"--mem {self.mem!r}: not a memory quantity Kubernetes reads (64Gi, 500M)")

    def render(self, job: Job, spec: Path, sets: tuple[str, ...], cwd: Path) -> dict[Path, str]:
        """The manifest kept beside the submission (the Secret is added for kubectl alone, in submit)."""
        self.check()
        name = job_name(job)
        run_args = ["python", "-m", "dinox", "run", f"{SPEC_DIR}/{SPEC_NAME}", *(a for s in sets for a in ("--set", s))]
        objects = [self._config_map(name), self._job(job, name, run_args)]
        kept = {"apiVersion": "v1", "kind": "List", "items": objects}
        return {job.job_dir / "job.json": json.dumps(kept, indent=2) + "\n"}

    def submit(self, job: Job, files: dict[Path, str], env: dict[str, str]) -> str:
        manifest = json.loads(files[job.job_dir / "job.json"])
        manifest["items"].insert(0, self._secret(job_name(job)))  # never written to a file
        kubectl(["apply", "-f", "-"], env, self.namespace, json.dumps(manifest))
        return job_name(job)

    def poll(self, job: Job, job_id: str, env: dict[str, str]) -> dict[int, TaskState]:
        try:
            status = json.loads(kubectl(["get", "job", job_id, "-o", "json"], env, self.namespace))
            pods = json.loads(kubectl(["get", "pods", "-l", f"job-name={job_id}", "-o", "json"], env, self.namespace))
        except LaunchError as e:
            if "(NotFound)" in str(e):
                return {}  # deleted (ttlSecondsAfterFinished, or by hand)
            raise SchedulerDown(str(e)) from None
        except ValueError as e:
            raise SchedulerDown(f"kubectl's answer is not JSON ({e})") from None
        return task_states(job.array, status, pods)

    def log(self, job: Job, task: int, job_id: str) -> str:
        index = job.array.index(task)
        return f"log: kubectl logs{self._ns()} -l job-name={job_id},batch.kubernetes.io/job-completion-index={index}"

    def again(self, job: Job, task: int) -> str:
        return f"dinox submit SPEC --tasks {job.tasks} --launcher kubernetes --image {self.image} --array {task}"

    def follow(self, job_id: str) -> tuple[str, str]:
        return f"kubectl get job{self._ns()} {job_id}", f"kubectl delete job{self._ns()} {job_id}"

    def _ns(self) -> str:
        return f" -n {self.namespace}" if self.namespace else ""

    def _meta(self, name: str) -> dict:
        meta: dict = {"name": name, "labels": {"app.kubernetes.io/managed-by": "dinox"}}
        if self.namespace:
            meta["namespace"] = self.namespace
        return meta

    def _config_map(self, name: str) -> dict:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": self._meta(f"{name}-spec"),
                "data": {SPEC_NAME: self.spec_text}}  # fmt: skip

    def _secret(self, name: str) -> dict:
        return {"apiVersion": "v1", "kind": "Secret", "metadata": self._meta(f"{name}-store"), "type": "Opaque",
                "stringData": {"MLFLOW_TRACKING_URI": self.tracking_uri}}  # fmt: skip

    def _job(self, job: Job, name: str, run_args: list[str]) -> dict:
        # Each task's journal: on the first volume, where it outlives the pod; else the pod's own disk.
        workdir = shlex.quote(f"{self.volumes[0].path}/dinox/{name}" if self.volumes else f".dinox/{name}")
        command = _COMMAND.format(run=" ".join(shlex.quote(a) for a in run_args), tasks=job.tasks, workdir=workdir)
        store = {"secretKeyRef": {"name": f"{name}-store", "key": "MLFLOW_TRACKING_URI"}}
        container = {
            "name": "dinox",
            "image": self.image,
            "command": ["/bin/sh", "-c", command],
            "env": [
                {"name": "DINOX_TASKS", "value": " ".join(str(t) for t in job.array)},
                {"name": "MLFLOW_TRACKING_URI", "valueFrom": store},
            ],
            "resources": self._resources(),
            "volumeMounts": [{"name": "spec", "mountPath": SPEC_DIR, "readOnly": True}]
            + [{"name": f"volume-{i}", "mountPath": v.path} for i, v in enumerate(self.volumes)],
        }
        volumes = [{"name": "spec", "configMap": {"name": f"{name}-spec"}}]
        volumes += [{"name": f"volume-{i}", "persistentVolumeClaim": {"claimName": v.claim}} for i, v in
                    enumerate(self.volumes)]  # fmt: skip
        pod = {"metadata": {"labels": {"dinox-job": name}}, "spec": {"restartPolicy": "Never",
               "containers": [container], "volumes": volumes}}  # fmt: skip
        size = len(job.array)
        spec = {"completionMode": "Indexed", "completions": size, "parallelism": min(self.parallel or size, size),
                "backoffLimitPerIndex": 0, "template": pod}  # fmt: skip
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": self._meta(name), "spec": spec}

    def _resources(self) -> dict:
        limits: dict[str, str] = {}
        if self.gpus_per_task:
            limits["nvidia.com/gpu"] = str(self.gpus_per_task)
        if self.cpus_per_task:
            limits["cpu"] = str(self.cpus_per_task)
        if self.mem:
            limits["memory"] = self.mem
        return {"limits": limits, "requests": dict(limits)} if limits else {}


def job_name(job: Job) -> str:
    """The Job's name: dinox-<spec name>-<its folder's stamp>, as a DNS-1123 label (at most 63)."""
    stamp = job.job_dir.name.split("-", 2)
    slug = re.sub(r"[^a-z0-9-]+", "-", job.name.lower()).strip("-")[:30].strip("-") or "sweep"
    tail = "".join(stamp[:2]) if len(stamp) >= 2 else "0"
    return f"dinox-{slug}-{re.sub(r'[^0-9]', '', tail)[-14:]}"


def task_states(array: tuple[int, ...], job: dict, pods: dict) -> dict[int, TaskState]:
    """The tasks' states from the Job's status (completed and failed indexes end a task) and its pods' phases
    (the newest pod of an index: pending or running); completion index k is the k-th task of `array`."""
    status = job.get("status") or {}
    out: dict[int, TaskState] = {}
    for key, state in (("completedIndexes", "COMPLETED"), ("failedIndexes", "FAILED")):
        for index in expand(status[key]) if status.get(key) else ():
            if index < len(array):
                out[array[index]] = TaskState(state)
    newest: dict[int, tuple[str, dict]] = {}
    for pod in pods.get("items", []):
        meta = pod.get("metadata") or {}
        index = (meta.get("annotations") or {}).get("batch.kubernetes.io/job-completion-index", "")
        if index.isdigit() and int(index) < len(array):
            created = meta.get("creationTimestamp", "")
            if int(index) not in newest or created >= newest[int(index)][0]:
                newest[int(index)] = (created, pod)
    for index, (_created, pod) in newest.items():
        task = array[index]
        if task not in out:
            phase = (pod.get("status") or {}).get("phase", "Pending")
            state = {"Running": "RUNNING", "Succeeded": "COMPLETED", "Failed": "FAILED"}.get(phase, "PENDING")
            out[task] = TaskState(state, reason=(pod.get("status") or {}).get("reason", ""))
    for task in array:  # the Job is there: an index with no pod yet waits for one
        out.setdefault(task, TaskState("PENDING"))
    return out


def kubectl(args: list[str], env: dict[str, str], namespace: str | None, stdin: str | None = None) -> str:
    """kubectl's stdout; LaunchError with its words when it refuses or is not here."""
    full = ["kubectl", *(["--namespace", namespace] if namespace else []), *args]
    try:
        proc = subprocess.run(full, input=stdin, capture_output=True, text=True, env=env, timeout=60)
    except FileNotFoundError:
        raise LaunchError("kubectl is not on PATH: run dinox submit where kubectl reaches the cluster") from None
    except subprocess.TimeoutExpired:
        raise SchedulerDown("kubectl did not answer in 60 s") from None
    if proc.returncode != 0:
        raise LaunchError(f"kubectl {args[0]} refused: {' '.join(proc.stderr.split())[:400]}")
    return proc.stdout


__all__ = ["Kubernetes", "Volume", "compress", "job_name", "kubectl", "task_states"]
