"""GetPreferredAllocation's choice, on device lists built here (no gRPC), and the inventory adapter."""

from __future__ import annotations

from pathlib import Path

import pytest

from oci_gpu_hook.cluster.deviceplugin.allocation import preferred
from oci_gpu_hook.cluster.deviceplugin.devices import PluginDevice, plugin_devices
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.inventory.amd import device_id, resource_for
from tests.helpers import fakesysfs


def gpu(pci: str, numa: int | None, hive: int | None = None, partition: int | None = None) -> PluginDevice:
    return PluginDevice(id=device_id(pci, partition), cdi_name="0", resource="amd.com/gpu", numa=numa, hive=hive,
                        parent=pci, partition=partition)


def partitions(pci: str, numa: int, hive: int | None = None, count: int = 8) -> list[PluginDevice]:
    return [gpu(pci, numa, hive, p) for p in range(count)]


def ids(devices: list[PluginDevice]) -> list[str]:
    return [d.id for d in devices]


EIGHT = [gpu(f"0000:{b}:00.0", 0 if i < 4 else 1) for i, b in enumerate(fakesysfs.SEED_BUSES)]


def test_one_numa_node_when_it_fits() -> None:
    available = ids([EIGHT[i] for i in (0, 1, 4, 5, 6)])
    assert sorted(preferred(EIGHT, available, [], 3)) == ids(EIGHT[4:7])
    assert sorted(preferred(EIGHT, available, [], 2)) == ids(EIGHT[0:2])  # best fit: the smaller group


def test_must_include_decides_the_numa_node_and_comes_first() -> None:
    available = ids(EIGHT)
    assert preferred(EIGHT, available, [EIGHT[6].id], 3) == [EIGHT[6].id, EIGHT[4].id, EIGHT[5].id]
    assert preferred(EIGHT, available, [EIGHT[2].id, EIGHT[1].id], 2) == [EIGHT[2].id, EIGHT[1].id]


def test_only_available_devices_are_chosen() -> None:
    available = ids([EIGHT[i] for i in (3, 7)])
    assert sorted(preferred(EIGHT, available, [], 2)) == available
    assert preferred(EIGHT, available, [], 1) in ([EIGHT[3].id], [EIGHT[7].id])


def test_spans_numa_nodes_only_when_it_must() -> None:
    result = preferred(EIGHT, ids(EIGHT), [], 6)
    numa = [EIGHT[[d.id for d in EIGHT].index(i)].numa for i in result]
    assert sorted(numa) in ([0, 0, 0, 0, 1, 1], [0, 0, 1, 1, 1, 1])


def test_hive_before_numa_spread() -> None:
    """Four GPUs: two in hive 7 (NUMA 0 and 1), two outside any hive (NUMA 0 and 1): a pair across NUMA
    nodes stays in the hive."""
    devices = [gpu("0000:05:00.0", 0, 7), gpu("0000:26:00.0", 1, 7), gpu("0000:45:00.0", 0), gpu("0000:65:00.0", 1)]
    available = ids(devices)
    assert sorted(preferred(devices, available, [], 2)) in (["0000:05:00.0", "0000:45:00.0"],
                                                           ["0000:26:00.0", "0000:65:00.0"])  # one NUMA node
    assert sorted(preferred(devices, available, ["0000:05:00.0"], 2)) == [
        "0000:05:00.0", "0000:45:00.0"]
    # NUMA 0 has only the hive GPU left: a pair in the hive beats a pair across hive and no hive.
    available = ["0000:05:00.0", "0000:26:00.0", "0000:65:00.0"]
    assert sorted(preferred(devices, available, ["0000:05:00.0"], 2)) == ["0000:05:00.0", "0000:26:00.0"]


def test_partitions_of_one_gpu_first() -> None:
    devices = partitions("0000:05:00.0", 0, 1) + partitions("0000:26:00.0", 0, 1)
    # GPU 05 has 3 free partitions, GPU 26 has 8: 2 partitions come from one GPU, the one that fits best.
    available = ids(devices[5:])
    result = preferred(devices, available, [], 2)
    assert result == ["0000:05:00.0/p5", "0000:05:00.0/p6"]
    # 4 partitions do not fit on 05: all from 26.
    assert {i.split("/")[0] for i in preferred(devices, available, [], 4)} == {"0000:26:00.0"}
    # 10 partitions: all 8 of 26 and 2 of 05, never more GPUs than needed.
    result = preferred(devices, available, [], 10)
    assert len(result) == 10 and len(set(result)) == 10
    assert sum(i.startswith("0000:26:00.0") for i in result) == 8


def test_one_gpu_beats_a_tighter_numa_node() -> None:
    """NUMA 0 has 3 free partitions on 3 GPUs, NUMA 1 a whole free GPU: 2 partitions come from that GPU."""
    devices = [gpu("0000:05:00.0", 0, None, 1), gpu("0000:15:00.0", 0, None, 1), gpu("0000:25:00.0", 0, None, 1),
               *partitions("0000:85:00.0", 1)]
    result = preferred(devices, ids(devices), [], 2)
    assert {i.split("/")[0] for i in result} == {"0000:85:00.0"}


def test_must_include_partition_keeps_its_gpu() -> None:
    devices = partitions("0000:05:00.0", 0) + partitions("0000:26:00.0", 0)
    result = preferred(devices, ids(devices), ["0000:26:00.0/p6"], 3)
    assert result[0] == "0000:26:00.0/p6" and all(i.startswith("0000:26:00.0") for i in result)


def test_unknown_ids_come_last_and_size_is_kept() -> None:
    result = preferred(EIGHT[:2], ["x", EIGHT[0].id, EIGHT[1].id], [], 3)
    assert result[-1] == "x" and sorted(result[:2]) == ids(EIGHT[:2])
    assert preferred(EIGHT, ids(EIGHT), [], 0) == []
    assert len(preferred(EIGHT, ids(EIGHT[:2]), [], 5)) == 2  # no more than available


# --- the adapter ---------------------------------------------------------------------------------

def test_resource_names() -> None:
    assert resource_for("single", "CPX", "NPS1") == "amd.com/gpu"
    assert resource_for("mixed", "CPX", "NPS1") == "amd.com/cpx_nps1"
    assert resource_for("mixed", "SPX\n", "NPS4") == "amd.com/spx_nps4"
    assert resource_for("mixed", None, None) == "amd.com/gpu"
    with pytest.raises(HookError, match="unknown resource strategy 'odd'"):
        resource_for("odd", None, None)


def test_device_ids_are_stable_identity() -> None:
    assert device_id("0000:05:00.0", None) == device_id("0000:05:00.0", 0) == "0000:05:00.0"
    assert device_id("0000:05:00.0", 3) == "0000:05:00.0/p3"
    assert max(len(device_id("ffff:ff:1f.7", 7)), 0) <= 63  # the kubelet's limit on a device ID


def test_adapter_on_the_seed_host(tmp_path: Path) -> None:
    root = fakesysfs.build(str(tmp_path / "sys"), fakesysfs.seed_host())
    devices = plugin_devices(root, "mixed")
    assert [(d.id, d.cdi_name, d.numa, d.resource, d.partition, d.hive) for d in devices] == [
        (f"0000:{b}:00.0", f"0000:{b}:00.0", 0 if i < 4 else 1, "amd.com/gpu", None, None)
        for i, b in enumerate(fakesysfs.SEED_BUSES)]
    assert devices[1].host_nodes == ("/dev/dri/card2", "/dev/dri/renderD129", "/dev/kfd")
    assert devices[1].numbers == (("c", 226, 2), ("c", 226, 129)) and devices[1].shared == (("c", 234, 0),)


@pytest.mark.parametrize(("mode", "sep", "per_gpu"), [("CPX", "_", 8), ("DPX", ".", 2)])
def test_adapter_on_mi300x_partitions(tmp_path: Path, mode: str, sep: str, per_gpu: int) -> None:
    """The inventory's partitions (both kernel namings) pass straight through: stable IDs, the mode's resource,
    the GPU's NUMA node and XGMI hive, and the stable CDI names of the generated spec (p0 included)."""
    root = fakesysfs.build(str(tmp_path / "sys"), fakesysfs.mi300x_host(mode, sep))
    devices = plugin_devices(root, "mixed")
    assert [d.id for d in devices] == [device_id(pci, p) for pci in ("0000:05:00.0", "0000:26:00.0")
                                       for p in range(per_gpu)]
    assert [d.cdi_name for d in devices] == [f"{pci}-p{p}" for pci in ("0000:05:00.0", "0000:26:00.0")
                                             for p in range(per_gpu)]
    assert {d.resource for d in devices} == {f"amd.com/{mode.lower()}_nps1"}
    assert {d.hive for d in devices} == {0x7D3B9E2F10AC4411}
    assert [d.numa for d in devices] == [0] * per_gpu + [1] * per_gpu
    assert {d.resource for d in plugin_devices(root, "single")} == {"amd.com/gpu"}


def test_adapter_reads_xgmi_hives_from_the_kfd_topology(tmp_path: Path) -> None:
    """4 GPUs: two in hive 0x5a5a (KFD hive_id, decimal in properties), two in none (hive_id 0)."""
    host = fakesysfs.FakeHost(gpus=[fakesysfs.FakeGpu(pci=f"0000:{b}:00.0", card=i + 1, render=128 + i,
                                                      numa_node=0) for i, b in enumerate(("05", "26", "45", "65"))])
    root = Path(fakesysfs.build(str(tmp_path / "sys"), host))
    for node in (root / "devices/virtual/kfd/kfd/topology/nodes").iterdir():
        props = node / "properties"
        render = next((int(line.split()[1]) for line in props.read_text().splitlines()
                       if line.startswith("drm_render_minor ")), None)
        hive = 0x5A5A if render in (129, 130) else 0
        props.write_text(props.read_text() + f"hive_id {hive}\n")
    devices = plugin_devices(str(root))
    assert {d.id: d.hive for d in devices} == {"0000:05:00.0": None, "0000:26:00.0": 0x5A5A,
                                               "0000:45:00.0": 0x5A5A, "0000:65:00.0": None}
    # A pair on this one NUMA node stays in the hive (PCI order alone would add 05).
    assert sorted(preferred(devices, ids(devices), ["0000:45:00.0"], 2)) == ["0000:26:00.0", "0000:45:00.0"]
    assert sorted(preferred(devices, ids(devices), [], 2)) == ["0000:26:00.0", "0000:45:00.0"]
