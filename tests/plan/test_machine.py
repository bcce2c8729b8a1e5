"""Which devices the machine has: the torch-free first look and the estimate's exact answer."""

import sys

from dinox.plan.footprint import Machine
from dinox.plan.machine import missing_message, without_torch


def test_the_estimate_machine_names_the_kinds_it_lacks():
    cpu_box = Machine("cpu", "cpu", 24.0, 24.0, 0.5, ("cpu",), "only a CPU")
    assert cpu_box.missing({"cuda", "auto", "cpu"}) == ["cuda"]
    gpu_box = Machine("cuda", "NVIDIA H100", 80.0, 1000.0, 0.5, ("cpu", "cuda"), "1 CUDA device")
    assert gpu_box.missing({"cuda", "cpu"}) == [] and gpu_box.missing({"mps"}) == ["mps"]


def test_without_torch_never_refuses_what_may_be_there():
    assert without_torch("cpu") == "" and without_torch("auto") == ""
    if sys.platform != "darwin":
        assert "MPS is macOS only" in without_torch("mps")
    assert missing_message("s.yaml", "cuda", "only a CPU").startswith(
        "s.yaml: hardware.device: cuda is not on this machine, which has only a CPU; set hardware.device: auto"
    )
