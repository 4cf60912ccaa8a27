"""The DRA driver's attributes across vendors and its shared counters for split GPUs (oci_gpu_hook/cluster/dra/
devices.py, slices.py).

Attributes: NVIDIA memory and compute capability through the fake libnvidia-ml (tests/helpers/fakenvidia.py), a MIG
device's memory from its profile, AMD's gfx target and VRAM, Intel's VRAM where sysfs says it.  Counters: that no
allocation the counters allow gives two claims the same hardware (an allocator's sum, over every pair of devices);
the slices in the layout of each Kubernetes minor version (1.33 and 1.34: the sets in their devices' slice; 1.35+:
in slices of their own), checked by the API's field rules (tests/helpers/fakeapiserver.py's slice_problems) and
against a hand-written exact fixture (the field names as the resource.k8s.io types spell them: sharedCounters[].name
and .counters.<name>.value, devices[].consumesCounters[].counterSet and .counters); publishing to the fake API
server of each version, and the fallback (the parts only) where the server is older, does not say its version, or
drops the fields (the feature gate off).  Everything the driver writes goes below the test's tmp_path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from oci_gpu_hook.cluster.dra import devices as dra_devices
from oci_gpu_hook.cluster.dra.claims import Claims, spec_file
from oci_gpu_hook.cluster.dra.devices import DraDevice, counter_sets, without_counters
from oci_gpu_hook.cluster.dra.slices import SAME, SPLIT, layout, slice_objects
from oci_gpu_hook.config import Config
from oci_gpu_hook.inventory import nvml, scan, stable_name
from tests.helpers import fakesysfs
from tests.helpers.fakeapiserver import slice_problems
from tests.test_device_plugin_nvidia import MIG_GPU, MIG_UUID, MIGS, WHOLE_GPU, fake_nvml, mig_tree, nvml_table
from tests.test_dra import DRIVER, HOSTS, NODE, Rig, _inventory
from tests.test_dra import _rig as dra_rig

__all__ = ["fake_nvml"]  # the fixture, used by name

VERSIONS_OF = {(1, 32): ("v1beta1",), (1, 33): ("v1beta2", "v1beta1"), (1, 34): ("v1", "v1beta2", "v1beta1"),
               (1, 35): ("v1", "v1beta2", "v1beta1"), (1, 36): ("v1", "v1beta2")}


def _fits(chosen: list[DraDevice]) -> bool:
    """What the scheduler checks of devices allocated together: no counter set gives more than it has."""
    capacity = {c.name: dict(c.counters) for c in counter_sets(list(_cpx()))}
    used: dict[tuple[str, str], int] = {}
    for device in chosen:
        for name, counters in device.consumes:
            for counter, value in counters:
                used[(name, counter)] = used.get((name, counter), 0) + int(value)
    return all(amount <= int(capacity[name][counter]) for (name, counter), amount in used.items())


def _cpx() -> list[DraDevice]:
    devices, notes = dra_devices.build(_inventory("mi300x-2x-cpx"))  # type: ignore[arg-type]
    assert notes == []
    return devices


# --- devices and counters -------------------------------------------------------------------------------------

def test_a_split_gpu_is_its_whole_and_its_parts_each_consuming_its_counter_set() -> None:
    devices = _cpx()
    assert len(devices) == 18
    whole = devices[0]
    assert whole.name == "gpu-0000-05-00-0" and [d.name for d in devices[1:3]] == [
        "gpu-0000-05-00-0-p0", "gpu-0000-05-00-0-p1"]
    assert {k: v[1] for k, v in whole.attributes.items() if k != "hiveId"} == {
        "vendor": "amd", "type": "gpu", "model": "gfx942", "architecture": "gfx942", "pciAddress": "0000:05:00.0",
        "pciDeviceId": "0x74a1", "stableName": "0000:05:00.0", "numaNode": 0, "partitionCount": 8,
        "computePartition": "CPX", "memoryPartition": "NPS1", "driver": "amdgpu"}
    assert whole.capacity == {"memory": "192Gi"} and len(whole.parts) == 8
    assert whole.consumes == (("gpu-0000-05-00-0", (("partitions", "8"),)),)
    assert all(d.consumes == ((dra_devices.device_name(str(d.attributes["parent"][1])), (("partitions", "1"),)),)
               for d in devices if d.attributes["type"][1] == "partition")
    assert [(c.name, c.counters) for c in counter_sets(devices)] == [
        ("gpu-0000-05-00-0", (("partitions", "8"),)), ("gpu-0000-26-00-0", (("partitions", "8"),))]
    parts = without_counters(devices)
    assert len(parts) == 16 and not any(d.consumes or d.attributes.get("partitionCount") for d in parts)


def test_no_allocation_the_counters_allow_gives_the_same_hardware_twice() -> None:
    devices = _cpx()
    for a in devices:
        for b in devices:
            if a is not b:
                assert _fits([a, b]) != a.shares_hardware(b), (a.name, b.name)
    whole_a, whole_b = (d for d in devices if d.attributes.get("partitionCount"))
    parts_a = [d for d in devices if d.attributes.get("parent") == ("string", "0000:05:00.0")]
    assert len(parts_a) == 8 and _fits(parts_a) and _fits([whole_b, *parts_a])
    assert _fits([whole_a]) and not _fits([whole_a, parts_a[5]])


def test_each_kubernetes_version_gets_slices_it_accepts_in_its_layout() -> None:
    """Every example host, every version each minor release serves, by the API's field rules; every counter set a
    device consumes is in its pool once, and in 1.33 and 1.34 in the device's own slice."""
    for host in sorted(p.name for p in HOSTS.iterdir()):
        devices, _ = dra_devices.build(_inventory(host))  # type: ignore[arg-type]
        for kubernetes, versions in VERSIONS_OF.items():
            how = layout(kubernetes)
            assert how == (None if kubernetes < (1, 33) else SAME if kubernetes < (1, 35) else SPLIT)
            for version in versions:
                bodies = slice_objects(devices, DRIVER, NODE, 3, version, counters=how)
                for body in bodies:
                    assert slice_problems(body, version, kubernetes) == [], (host, kubernetes, version, body)
                    assert body["spec"]["pool"] == {"name": NODE, "generation": 3, "resourceSliceCount": len(bodies)}
                defined = [c["name"] for b in bodies for c in b["spec"].get("sharedCounters", [])]
                published = [d for b in bodies for d in b["spec"].get("devices", [])]
                assert len(defined) == len(set(defined))
                for item in published:
                    for used in (item.get("basic", item)).get("consumesCounters", []):
                        assert used["counterSet"] in defined
                want = devices if how else without_counters(devices)
                assert [d["name"] for d in published] == [d.name for d in want], (host, kubernetes)


def test_the_layout_check_can_fail() -> None:
    devices = _cpx()
    same = slice_objects(devices, DRIVER, NODE, 1, "v1", counters=SAME)
    split = slice_objects(devices, DRIVER, NODE, 1, "v1", counters=SPLIT)
    assert "spec: only one of sharedCounters or devices is allowed" in slice_problems(same[0], "v1", (1, 35))
    assert any("is not in this slice's sharedCounters" in p for p in slice_problems(split[0], "v1", (1, 34)))
    assert any("unknown field 'sharedCounters'" in p for p in slice_problems(same[0], "v1beta1", (1, 32)))
    assert any("unknown field 'consumesCounters'" in p for p in slice_problems(split[0], "v1", None))


def test_the_slices_are_the_hand_written_fixture() -> None:
    """Written by hand from the resource.k8s.io v1 and v1beta1 types (not from the driver's output): the 1.35+
    layout's counter slice, the first GPU's whole and a part, and the v1beta1 form of the whole in 1.34."""
    devices = _cpx()
    slices = slice_objects(devices, DRIVER, NODE, 7, "v1", counters=SPLIT)
    assert len(slices) == 2
    assert slices[1] == {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpu.oci-gpu-hook.io-1"},
        "spec": {"driver": "gpu.oci-gpu-hook.io", "nodeName": "node-a",
                 "pool": {"name": "node-a", "generation": 7, "resourceSliceCount": 2},
                 "sharedCounters": [
                     {"name": "gpu-0000-05-00-0", "counters": {"partitions": {"value": "8"}}},
                     {"name": "gpu-0000-26-00-0", "counters": {"partitions": {"value": "8"}}}]}}
    whole, part = slices[0]["spec"]["devices"][:2]
    hive = whole["attributes"]["hiveId"]
    assert whole == {
        "name": "gpu-0000-05-00-0",
        "attributes": {"architecture": {"string": "gfx942"}, "computePartition": {"string": "CPX"},
                       "driver": {"string": "amdgpu"}, "hiveId": hive, "memoryPartition": {"string": "NPS1"},
                       "model": {"string": "gfx942"}, "numaNode": {"int": 0}, "partitionCount": {"int": 8},
                       "pciAddress": {"string": "0000:05:00.0"}, "pciDeviceId": {"string": "0x74a1"},
                       "stableName": {"string": "0000:05:00.0"}, "type": {"string": "gpu"},
                       "vendor": {"string": "amd"}},
        "capacity": {"memory": {"value": "192Gi"}},
        "consumesCounters": [{"counterSet": "gpu-0000-05-00-0", "counters": {"partitions": {"value": "8"}}}]}
    assert part["name"] == "gpu-0000-05-00-0-p0" and part["consumesCounters"] == [
        {"counterSet": "gpu-0000-05-00-0", "counters": {"partitions": {"value": "1"}}}]
    assert part["attributes"]["parent"] == {"string": "0000:05:00.0"}
    assert part["attributes"]["partitionIndex"] == {"int": 0}
    (same,) = slice_objects(devices, DRIVER, NODE, 7, "v1beta1", counters=SAME)
    assert [c["name"] for c in same["spec"]["sharedCounters"]] == ["gpu-0000-05-00-0", "gpu-0000-26-00-0"]
    first = same["spec"]["devices"][0]
    assert set(first) == {"name", "basic"} and first["basic"]["consumesCounters"] == whole["consumesCounters"]


def test_a_pool_past_one_slices_limits_keeps_each_gpus_devices_together() -> None:
    """Nine split GPUs (81 devices over 64, 9 sets over 8): 1.33/1.34 keep each GPU's devices with its set in one
    slice; 1.35+ splits devices at 64 and sets at 8."""
    one = _cpx()[:9]
    many: list[DraDevice] = []
    for n in range(9):
        many += [replace(d, name=f"{d.name}-{n}", consumes=tuple(
            (f"{s}-{n}", c) for s, c in d.consumes)) for d in one]
    for kubernetes in ((1, 34), (1, 35)):
        bodies = slice_objects(many, DRIVER, NODE, 1, "v1", counters=layout(kubernetes))
        assert all(slice_problems(b, "v1", kubernetes) == [] for b in bodies), kubernetes
        assert sum(len(b["spec"].get("devices", [])) for b in bodies) == 81
        assert sum(len(b["spec"].get("sharedCounters", [])) for b in bodies) == 9
        assert len(bodies) == (2 if kubernetes == (1, 34) else 4)


# --- attributes -----------------------------------------------------------------------------------------------

def test_nvidia_gpus_say_memory_compute_capability_and_mig_memory(tmp_path: Path, fake_nvml: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "_gpus", {})
    monkeypatch.setattr(nvml, "_mig_memory", {})
    nvml_table(fake_nvml, MIGS)
    with fake_nvml.open("a") as table:
        table.write(f"{WHOLE_GPU}\n")  # a GPU without MIG devices: NVML knows it too
    base = mig_tree(tmp_path / "host")
    inventory = scan(str(base / "sys"), strict=False, proc_root=str(base / "proc"), driver_root=str(base / "driver"))
    devices, notes = dra_devices.build(inventory)
    assert notes == [], notes
    by_uuid = {d.attributes["uuid"][1]: d for d in devices}
    gpus = {g.pci: g for g in fakesysfs.nvidia_mig_host().nvidia}
    plain, split = by_uuid[gpus[WHOLE_GPU].uuid], by_uuid[gpus[MIG_GPU].uuid]
    for gpu in (plain, split):
        assert gpu.capacity == {"memory": "81559Mi"}  # the fake's 85520809984 bytes
        assert gpu.attributes["computeCapability"] == ("version", "9.0.0")
        assert gpu.attributes["architecture"] == ("string", "sm_90")
        assert gpu.attributes["productName"] == ("string", "NVIDIA H100 PCIe")
    assert split.attributes["partitionCount"] == ("int", 4) and "partitionCount" not in plain.attributes
    big = by_uuid[MIG_UUID[(1, 0)]]
    assert big.capacity == {"memory": "40448Mi"} and big.attributes["migProfile"] == ("string", "3g.40gb")
    assert big.attributes["architecture"] == ("string", "sm_90")
    assert big.consumes == ((split.name, (("partitions", "1"),)),) and split.consumes == (
        (split.name, (("partitions", "4"),)),)
    assert {stable_name(p) for p in split.parts} == set(MIG_UUID.values())
    config = Config(sysfs_root=str(base / "sys"), proc_root=str(base / "proc"), driver_root=str(base / "driver"))
    claims = Claims(config, DRIVER, NODE, str(tmp_path / "cdi"), str(tmp_path / "state"), None,
                    lambda: (inventory, devices), lambda _line: None, lambda: "v1")
    (entry,) = claims.spec("uid-1", inventory, [split])["devices"]
    nodes = sorted(n["path"] for n in entry["containerEdits"]["deviceNodes"])
    want = sorted({n.path for p in split.parts for n in p.nodes})  # the GPU's node and every MIG device's caps
    assert nodes == want and len([p for p in nodes if "nvidia-cap" in p]) == 7


def test_without_nvml_the_nvidia_gpus_are_published_without_memory_in_one_note() -> None:
    devices, notes = dra_devices.build(_inventory("nvidia-4x-h100"))  # type: ignore[arg-type]
    assert len(devices) == 4 and not any(d.capacity or "computeCapability" in d.attributes for d in devices)
    assert len(notes) == 1 and notes[0].startswith("nvidia GPUs' memory and compute capability left out: only NVML "
                                                   "says them, and ")


def test_intel_vram_where_the_driver_says_it(tmp_path: Path) -> None:
    sysfs = Path(fakesysfs.build(str(tmp_path / "sys"), fakesysfs.intel_xe_host()))
    devices, _ = dra_devices.build(scan(str(sysfs), strict=False))
    assert [(d.name, d.capacity) for d in devices] == [("gpu-0000-00-02-0", {}), ("gpu-0000-03-00-0", {})]
    i915, xe = (Path(d.device.sysfs_dir) for d in devices)  # type: ignore[union-attr]
    for tile, size in (("tile0", "17179869184"), ("tile1", "0x400000000")):  # xe: per tile, decimal or hex
        (xe / tile).mkdir()
        (xe / tile / "physical_vram_size_bytes").write_text(size + "\n")
    devices, _ = dra_devices.build(scan(str(sysfs), strict=False))
    assert [(d.name, d.capacity) for d in devices] == [("gpu-0000-00-02-0", {}),
                                                      ("gpu-0000-03-00-0", {"memory": "32Gi"})]
    (i915 / "drm" / "card0" / "lmem_total_bytes").write_text("4294967296\n")  # an i915 backport's
    devices, _ = dra_devices.build(scan(str(sysfs), strict=False))
    assert devices[0].capacity == {"memory": "4Gi"}


def test_one_name_means_one_thing_across_vendors() -> None:
    """architecture is the ISA code is built for on AMD (gfx target) and NVIDIA (sm_XY), memory a capacity on each;
    every attribute published is one the module names."""
    seen: dict[str, set[str]] = {}
    for host in sorted(p.name for p in HOSTS.iterdir()):
        devices, _ = dra_devices.build(_inventory(host))  # type: ignore[arg-type]
        for device in devices:
            assert set(device.attributes) <= set(dra_devices.ATTRIBUTES)
            for name in device.attributes:
                seen.setdefault(name, set()).add(device.kind)
    assert seen["architecture"] >= {"amd"} and seen["vendor"] == {"amd", "intel", "nvidia"}
    amd = [d for d in _cpx() if d.attributes.get("architecture")]
    assert all(str(d.attributes["architecture"][1]).startswith("gfx") for d in amd)


# --- publishing and preparing ---------------------------------------------------------------------------------

def _rig(tmp: Path, kubernetes: tuple[int, int] | None, partitionable: bool = True) -> Iterator[Rig]:
    yield from dra_rig(tmp, fakesysfs.mi300x_host("CPX"), kubernetes=kubernetes, partitionable=partitionable)


def _claim(rig: Rig, name: str, *devices: str) -> tuple[str, str, str]:
    rig.api.add_claim("default", name, f"uid-{name}", [
        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": d} for d in devices])
    return "default", name, f"uid-{name}"


@pytest.mark.parametrize("kubernetes", [(1, 34), (1, 36)])
def test_a_server_that_keeps_counters_gets_the_whole_gpus_too(tmp_path: Path, kubernetes: tuple[int, int]) -> None:
    for rig in _rig(tmp_path, kubernetes):
        published = rig.api.slices()
        devices = [d["name"] for s in published for d in s["spec"].get("devices", [])]
        sets = [c["name"] for s in published for c in s["spec"].get("sharedCounters", [])]
        assert len(devices) == 18 and sets == ["gpu-0000-05-00-0", "gpu-0000-26-00-0"]
        assert len(published) == (1 if kubernetes == (1, 34) else 2)
        assert f"Kubernetes {kubernetes[0]}.{kubernetes[1]}: split GPUs are published whole and as their parts, " \
               "with shared counters" in " ".join(rig.logs)
        assert len(rig.driver.devices) == 18


def test_the_whole_gpu_is_all_its_parts_and_a_part_of_it_is_refused_while_it_is_held(tmp_path: Path) -> None:
    for rig in _rig(tmp_path, (1, 35)):
        rig.kubelet.discover()
        whole = _claim(rig, "whole", "gpu-0000-05-00-0")
        assert rig.kubelet.prepare(whole).claims["uid-whole"].error == ""  # type: ignore[attr-defined]
        spec = json.loads(Path(spec_file(str(rig.cdi_dir), DRIVER, "uid-whole")).read_text())
        (entry,) = spec["devices"]
        nodes = sorted(n["path"] for n in entry["containerEdits"]["deviceNodes"])
        inventory = scan(str(rig.sysfs), strict=False)
        want = sorted({n.path for d in inventory.devices("amd") if d.pci_address == "0000:05:00.0" for n in d.nodes})
        assert nodes == want and len([p for p in nodes if "renderD" in p]) == 8
        part = _claim(rig, "part", "gpu-0000-05-00-0-p3")
        error = rig.kubelet.prepare(part).claims["uid-part"].error  # type: ignore[attr-defined]
        assert error == ("claim default/part: device gpu-0000-05-00-0-p3 is prepared for claim default/whole "
                         "(uid-whole) as gpu-0000-05-00-0")
        other = _claim(rig, "other", "gpu-0000-26-00-0-p3")
        assert rig.kubelet.prepare(other).claims["uid-other"].error == ""  # type: ignore[attr-defined]
        assert rig.kubelet.unprepare(whole).claims["uid-whole"].error == ""  # type: ignore[attr-defined]
        assert rig.kubelet.prepare(part).claims["uid-part"].error == ""  # type: ignore[attr-defined]


@pytest.mark.parametrize("kubernetes,partitionable", [((1, 35), False), ((1, 32), True), (None, True)])
def test_where_counters_are_not_kept_a_split_gpu_is_its_parts_only(tmp_path: Path, kubernetes: tuple[int, int] | None,
                                                                   partitionable: bool) -> None:
    """The gate off (the server drops the fields: said once, written again at once), a server before 1.33, or one
    that does not say its version: the parts only, and a claim naming a whole split GPU is refused."""
    for rig in _rig(tmp_path, kubernetes, partitionable):
        (published,) = rig.api.slices()
        devices = published["spec"]["devices"]
        assert len(devices) == 16 and "sharedCounters" not in published["spec"]
        assert not any("consumesCounters" in d for d in devices)
        assert len(rig.driver.devices) == 16
        dropped = [line for line in rig.logs if "dropped the shared counters" in line]
        assert len(dropped) == (0 if partitionable else 1)
        rig.kubelet.discover()
        whole = _claim(rig, "whole", "gpu-0000-05-00-0")
        error = rig.kubelet.prepare(whole).claims["uid-whole"].error  # type: ignore[attr-defined]
        assert error.startswith(f"claim default/whole: device gpu-0000-05-00-0 is not on node {NODE} now")
        rig.driver.step()
        assert len(rig.api.slices()) == 1 and len([line for line in rig.logs if "dropped" in line]) == len(dropped)
