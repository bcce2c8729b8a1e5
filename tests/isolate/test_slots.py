"""--devices: parsing, equal disjoint core shares (NUMA-local for GPUs where sysfs says), what each child gets."""

from __future__ import annotations

import pytest

from dinox.isolate import slots as devices
from dinox.isolate.slots import DevicesError, Request, Slot


def test_parse_reads_all_a_list_and_cpu_slots():
    assert devices.parse("all") == Request("all")
    assert devices.parse("0,1,3") == Request("cuda", gpus=(0, 1, 3))
    assert devices.parse("cpu:4") == Request("cpu", count=4)


@pytest.mark.parametrize("text", ["cpu:0", "cpu:x", "0,0", "-1", "gpu", "0,,1"])
def test_parse_refuses_what_it_cannot_read(text):
    with pytest.raises(DevicesError, match=repr(text).replace("(", r"\(")):
        devices.parse(text)


def test_cpu_slots_get_equal_disjoint_shares_and_the_remainder_idles():
    slots = devices.resolve(Request("cpu", count=3), 0, affinity=[0, 1, 2, 3, 4, 5, 6])
    assert slots == [Slot("cpu:0", None, (0, 1)), Slot("cpu:1", None, (2, 3)), Slot("cpu:2", None, (4, 5))]
    with pytest.raises(DevicesError, match="cpu:3 asks for more slots than the 2 cores"):
        devices.resolve(Request("cpu", count=3), 0, affinity=[0, 1])


def test_gpus_take_their_share_from_their_own_numa_node():
    nodes = {0: list(range(0, 8)), 1: list(range(8, 16))}
    # GPUs 0, 1 on node 0, GPUs 2, 3 on node 1: each its own half of its node's cores.
    slots = devices.resolve(Request("all"), 4, range(16), numa=(0, 0, 1, 1), node_cpus=nodes)
    assert [s.cores for s in slots] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)]
    # Three on node 0, one on node 1: every share as small as the smallest, so trials compare.
    slots = devices.resolve(Request("all"), 4, range(16), numa=(0, 0, 0, 1), node_cpus=nodes)
    assert [s.cores for s in slots] == [(0, 1), (2, 3), (4, 5), (8, 9)]
    assert [s.label for s in slots] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]


def test_gpus_share_all_cores_when_a_node_is_unknown_or_outside_the_affinity():
    nodes = {0: list(range(0, 8)), 1: list(range(8, 16))}
    unknown = devices.resolve(Request("cuda", gpus=(0, 1)), 2, range(16), numa=(0, -1), node_cpus=nodes)
    assert [s.cores for s in unknown] == [tuple(range(0, 8)), tuple(range(8, 16))]
    # This process may only run on node 0's cores: node 1's GPU cannot have local ones.
    outside = devices.resolve(Request("cuda", gpus=(0, 1)), 2, range(8), numa=(0, 1), node_cpus=nodes)
    assert [s.cores for s in outside] == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_gpu_requests_the_machine_cannot_give_are_refused():
    with pytest.raises(DevicesError, match="CUDA device 2 is not on this machine, which has 2"):
        devices.resolve(Request("cuda", gpus=(0, 2)), 2, range(8), node_cpus={})
    with pytest.raises(DevicesError, match="no CUDA device; --devices cpu:N"):
        devices.resolve(Request("all"), 0, range(8), node_cpus={})
    with pytest.raises(DevicesError, match="unknown"):
        devices.resolve(Request("all"), None, range(8), node_cpus={})


def test_each_child_sees_its_own_devices_and_cores():
    a, b = Slot("cuda:0", 0, (0, 1, 2, 3)), Slot("cuda:1", 1, (4, 5, 6, 7))
    assert devices.child_env([b], {}) == {"CUDA_VISIBLE_DEVICES": "1", "DINOX_CORES": "4-7"}
    # The parent itself limited to GPUs 4 and 6: the child gets the real index, not the parent's 0 and 1.
    assert devices.child_env([a, b], {"CUDA_VISIBLE_DEVICES": "4,6"}) == {
        "CUDA_VISIBLE_DEVICES": "4,6",
        "DINOX_CORES": "0-7",
    }
    # A CPU slot hides every GPU, so hardware.device: auto means the CPU there.
    assert devices.child_env([Slot("cpu:1", None, (1,))], {})["CUDA_VISIBLE_DEVICES"] == ""
    # With the UUIDs the estimate child read, a child gets its device by UUID: the same GPU to CUDA (whatever
    # its device order) and to NVML, whose index is the PCI bus order.
    uuids = ("GPU-aaa", "GPU-bbb")
    assert devices.child_env([b], {"CUDA_VISIBLE_DEVICES": "4,6"}, uuids)["CUDA_VISIBLE_DEVICES"] == "GPU-bbb"


def test_a_trial_s_system_metrics_show_its_own_gpus_in_its_own_order():
    from dinox.store.system_metrics import own_handles

    uuids = ("GPU-aaa", "GPU-bbb", "GPU-ccc")
    a, c = Slot("cuda:0", 0, (0,)), Slot("cuda:2", 2, (2,))
    assert devices.trial_gpus([c], 1, uuids) == ("GPU-ccc",)
    assert devices.trial_gpus([c, a], 2, uuids) == ("GPU-ccc", "GPU-aaa")
    assert devices.trial_gpus([], 2, uuids) == ("GPU-aaa", "GPU-bbb")  # no --devices: the first it sees
    # NVML lists the node's GPUs by bus; the trial on GPU-ccc sees it alone, as its gpu_0.
    handles = [{"uuid": b"GPU-bbb"}, {"uuid": "GPU-ccc"}, {"uuid": "GPU-aaa"}, {"broken": True}]
    mine = own_handles(handles, lambda h: h["uuid"], devices.trial_gpus([c, a], 2, uuids))
    assert mine == [handles[1], handles[2]]
    assert own_handles(handles, lambda h: h["uuid"], ("GPU-bbb",)) == [handles[0]]  # older pynvml: bytes
    assert own_handles(handles, lambda h: h["uuid"], ()) == []  # a CPU trial shows no GPU


def test_a_child_pins_to_its_cores_and_each_rank_to_its_part():
    env = {"DINOX_CORES": "0-3,8-11"}
    assert devices.child_cores(env) == (0, 1, 2, 3, 8, 9, 10, 11)
    assert devices.child_cores(env, local_rank=1, local_world=2) == (8, 9, 10, 11)
    assert devices.child_cores({}) == ()


def test_core_lists_read_and_write_linux_cpulist_format(tmp_path):
    assert devices.parse_cores("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert devices.format_cores([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert devices.format_cores([5]) == "5"
    for damaged in ("0-4000000000", "3-1", "-1", "a", "0;1"):  # a record's text, not the kernel's: refused, not a list
        with pytest.raises(ValueError):
            devices.parse_cores(damaged)
    for n, text in ((0, "0-1\n"), (1, "2-3\n")):
        (tmp_path / f"node{n}").mkdir()
        (tmp_path / f"node{n}" / "cpulist").write_text(text)
    (tmp_path / "possible").write_text("0-1")  # a sysfs file beside the nodes, not a node
    assert devices.node_cpu_lists(tmp_path) == {0: [0, 1], 1: [2, 3]}
