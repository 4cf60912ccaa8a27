"""The device plugin on NVIDIA hosts, against the fake kubelet (real v1beta1 gRPC over Unix sockets).

Hosts are built fresh in temp dirs from tests/helpers/fakesysfs.py and tests/helpers/fakenvidia.py (sysfs, /proc,
the driver root): 4 x H100 whose minors do not follow PCI order, 2 x H100 with MIG instances on GPU 0 (their UUIDs
and profiles from a fake libnvidia-ml compiled here), and two AMD and two NVIDIA GPUs side by side, served by one
plugin process. The CDI directories the plugin manages are temp dirs too.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from oci_gpu_hook.appliers import cdi
from oci_gpu_hook.cluster.deviceplugin import server
from oci_gpu_hook.cluster.deviceplugin.devices import plan, scan_served
from oci_gpu_hook.cluster.deviceplugin.specs import SpecKeeper, mismatch
from oci_gpu_hook.cluster.watch import QueueEvents
from oci_gpu_hook.config import Config
from oci_gpu_hook.inventory import nvml
from oci_gpu_hook.inventory.nvcluster import mig_resource
from tests.conftest import unavailable
from tests.helpers import fakesysfs
from tests.helpers.fakekubelet import FakeKubelet
from tests.helpers.fakenvidia import build_fake_nvml

H100 = fakesysfs.nvidia_h100_host().nvidia  # in probe order: PCI c1 (minor 1), 1b (2), 52 (3), 43 (0)
UUID = {g.pci: g.uuid for g in H100}
MIG_GPU = "0000:3b:00.0"  # GPU 0 of the MIG host (minor 1), split into gi1/ci0, gi2/ci0, gi5/ci0, gi5/ci1
WHOLE_GPU = "0000:86:00.0"  # GPU 1 of the MIG host (minor 0), whole
# The fake NVML's MIG devices: (gi, ci) -> (UUID, GPU slices, compute slices, MiB, GPU instance profile id)
MIGS = {(1, 0): ("MIG-5b2c7e10-0a11-5d3e-8f00-00000000a100", 3, 3, 40448, 2),  # 3g.40gb
        (2, 0): ("MIG-5b2c7e10-0a11-5d3e-8f00-00000000b200", 2, 2, 20096, 1),  # 2g.20gb
        (5, 0): ("MIG-5b2c7e10-0a11-5d3e-8f00-00000000c500", 2, 1, 20096, 1),  # 1c.2g.20gb
        (5, 1): ("MIG-5b2c7e10-0a11-5d3e-8f00-00000000c510", 2, 1, 20096, 1)}  # 1c.2g.20gb
MIG_UUID = {key: value[0] for key, value in MIGS.items()}
SPEC = "nvidia.com-gpu.json"


def host_tree(base: Path, host: fakesysfs.FakeHost) -> Path:
    """``host``'s sysfs, /proc and driver root under ``base`` (sys, proc, driver)."""
    fakesysfs.build_all(str(base / "sys"), host)
    return base


def spec_config(base: Path, hook_path: str = "/bin/sh") -> Config:
    return Config(sysfs_root=str(base / "sys"), proc_root=str(base / "proc"), driver_root=str(base / "driver"),
                  hook_path=hook_path)


def nvml_table(path: Path, migs: dict[tuple[int, int], tuple[str, int, int, int, int]], pci: str = MIG_GPU) -> None:
    """Write the fake NVML's table (atomically: the plugin may be reading it)."""
    new = path.with_name(path.name + ".new")
    new.write_text("".join(f"{pci} {gi} {ci} {' '.join(map(str, value))}\n" for (gi, ci), value in migs.items()))
    new.rename(path)


@pytest.fixture
def fake_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The NVML table file the fake libnvidia-ml reads (OGH_FAKE_NVML); NVML's per-process caches emptied."""
    table = tmp_path / "nvml.txt"
    nvml_table(table, MIGS)
    monkeypatch.setenv("OGH_FAKE_NVML", str(table))
    monkeypatch.setattr(nvml, "_problems", {})
    monkeypatch.setattr(nvml, "_read", {})
    monkeypatch.setattr(nvml, "_profiles", {})
    return table


def mig_tree(base: Path, host: fakesysfs.FakeHost | None = None) -> Path:
    """The MIG host (or ``host``) with the fake libnvidia-ml in its driver root."""
    host = host or fakesysfs.nvidia_mig_host()
    host_tree(base, host)
    if build_fake_nvml(str(base / "driver"), host.driver_version, str(base)) is None:
        unavailable("no C compiler for the fake NVML")
    return base


@dataclass
class Node:
    base: Path
    kubelet: FakeKubelet
    manager: server.Manager
    tracker: server.Tracker
    logs: list[str]
    cdi: Path


@dataclass
class Plugin:
    """The plugin on a host's roots; ``start`` it behind a fake kubelet."""

    base: Path
    strategy: str = "single"
    rescan: float = 0.3
    events: QueueEvents | None = None
    hook_path: str = "/bin/sh"  # the launcher the CDI specs' createRuntime hooks name

    def start(self, tmp_path: Path) -> Iterator[Node]:
        directory = tmp_path / "kp"  # short: a Unix socket path has at most 107 bytes
        kubelet = FakeKubelet(str(directory))
        kubelet.start()
        logs: list[str] = []
        cdi_dir = tmp_path / "cdi"
        specs = SpecKeeper(spec_config(self.base, self.hook_path), [str(cdi_dir)], logs.append)
        tracker = server.Tracker(str(self.base / "sys"), self.strategy, log=logs.append, specs=specs,
                                 proc_root=str(self.base / "proc"), driver_root=str(self.base / "driver"))
        manager = server.Manager(str(directory), tracker, rescan_interval=self.rescan, poll_interval=0.1,
                                 log=logs.append, events=self.events, uevent_delay=0.2)
        thread = threading.Thread(target=manager.run, daemon=True)
        thread.start()
        try:
            yield Node(self.base, kubelet, manager, tracker, logs, cdi_dir)
        finally:
            manager.stop()
            thread.join(10)
            kubelet.stop()
            assert not thread.is_alive()


def _names(kubelet: FakeKubelet, resource: str, ids: list[str]) -> list[str]:
    (answer,) = kubelet.allocate(resource, ids).container_responses
    names = [c.name for c in answer.cdi_devices]
    assert dict(answer.annotations) == {server.annotation_key(resource): ",".join(names)}
    assert not answer.envs and not answer.devices and not answer.mounts
    return names


def _spec_nodes(path: Path, name: str) -> list[tuple[str, int, int]]:
    entry = next(d for d in cdi.load(str(path))["devices"] if d["name"] == name)
    return [(n["path"], n["major"], n["minor"]) for n in entry["containerEdits"]["deviceNodes"]]


def remove_nvidia_gpu(base: Path, host: fakesysfs.FakeHost, pci: str) -> None:
    """A hot-remove: the GPU's PCI device leaves sysfs and the driver no longer lists it in /proc."""
    fakesysfs.remove_gpu(str(base / "sys"), host, pci)
    shutil.rmtree(base / "proc" / "driver" / "nvidia" / "gpus" / pci)


@pytest.fixture
def h100(tmp_path: Path) -> Iterator[Node]:
    yield from Plugin(host_tree(tmp_path / "host", fakesysfs.nvidia_h100_host())).start(tmp_path)


# --- whole GPUs ---------------------------------------------------------------------------------------------

def test_whole_gpus_register_as_nvidia_com_gpu_by_uuid(h100: Node) -> None:
    devices = h100.kubelet.devices("nvidia.com/gpu", lambda d: len(d) == 4)
    assert sorted(devices) == sorted(UUID.values())  # IDs are the GPUs' UUIDs, not positions or minors
    assert {i: [n.ID for n in d.topology.nodes] for i, d in devices.items()} == {
        UUID["0000:1b:00.0"]: [0], UUID["0000:43:00.0"]: [0], UUID["0000:52:00.0"]: [0], UUID["0000:c1:00.0"]: [1]}
    assert {d.health for d in devices.values()} == {"Healthy"}
    endpoints = {r.resource_name: r.endpoint for r in h100.kubelet.registrations}
    # amd.com/gpu is always served (0 devices here); nvidia.com/gpu has its own socket
    assert endpoints == {"amd.com/gpu": "oci-gpu-hook-gpu.sock", "nvidia.com/gpu": "oci-gpu-hook-nvidia-gpu.sock"}
    amd = h100.kubelet.plugin("amd.com/gpu")
    assert h100.kubelet.wait(lambda: amd.lists, what="amd.com/gpu's device list") == [[]]
    assert (h100.cdi / SPEC).exists() and not (h100.cdi / "amd.com-gpu.json").exists()


def test_allocate_answers_uuid_names_that_the_spec_maps_to_the_gpus_minor(h100: Node) -> None:
    h100.kubelet.devices("nvidia.com/gpu", lambda d: len(d) == 4)
    names = _names(h100.kubelet, "nvidia.com/gpu", [UUID["0000:c1:00.0"], UUID["0000:1b:00.0"]])
    # PCI order: 1b (minor 2) before c1 (minor 1); the names are stable, never an index
    assert names == [f"nvidia.com/gpu={UUID['0000:1b:00.0']}", f"nvidia.com/gpu={UUID['0000:c1:00.0']}"]
    assert server.annotation_key("nvidia.com/gpu") == "cdi.k8s.io/oci-gpu-hook_nvidia-gpu"
    assert _spec_nodes(h100.cdi / SPEC, UUID["0000:1b:00.0"]) == [("/dev/nvidia2", 195, 2)]
    assert _spec_nodes(h100.cdi / SPEC, UUID["0000:c1:00.0"]) == [("/dev/nvidia1", 195, 1)]
    shared = cdi.load(str(h100.cdi / SPEC))["containerEdits"]
    assert {(n["path"], n["major"], n["minor"]) for n in shared["deviceNodes"]} >= {
        ("/dev/nvidiactl", 195, 255), ("/dev/nvidia-uvm", 510, 0), ("/dev/nvidia-uvm-tools", 510, 1)}
    assert shared["mounts"]  # the driver's files, as `cdi generate` gives them
    assert any(line.startswith("allocate nvidia.com/gpu: ") for line in h100.logs), h100.logs


def test_allocate_rewrites_a_stale_nvidia_spec_first(tmp_path: Path) -> None:
    """The spec maps a GPU's UUID to another minor (written before a reload renumbered it, or by hand) and no
    rescan is due (60 s): Allocate rewrites it before answering, so the name resolves to that GPU's node now."""
    base = host_tree(tmp_path / "host", fakesysfs.nvidia_h100_host())
    for node in Plugin(base, rescan=60).start(tmp_path):
        node.kubelet.devices("nvidia.com/gpu", lambda d: len(d) == 4)
        spec = node.cdi / SPEC
        data = json.loads(spec.read_text())
        uuid = UUID["0000:52:00.0"]
        for entry in data["devices"]:
            if entry["name"] == uuid:
                entry["containerEdits"]["deviceNodes"][0].update(path="/dev/nvidia0", minor=0)
        spec.write_text(json.dumps(data))
        devices = plan(scan_served(str(base / "sys"), proc_root=str(base / "proc")))[0]
        wanted = [d for d in devices if d.id == uuid]
        assert f"maps nvidia.com/gpu={uuid} to 195:0 " in (mismatch(str(spec), wanted) or "")
        assert _names(node.kubelet, "nvidia.com/gpu", [uuid]) == [f"nvidia.com/gpu={uuid}"]
        assert _spec_nodes(spec, uuid) == [("/dev/nvidia3", 195, 3)]
        assert mismatch(str(spec), wanted) is None
        assert any(line.startswith(f"allocate: CDI spec wrote {spec}") for line in node.logs), node.logs


def test_a_removed_gpu_turns_unhealthy_and_is_never_allocated(h100: Node) -> None:
    h100.kubelet.devices("nvidia.com/gpu", lambda d: len(d) == 4)
    gone = UUID["0000:43:00.0"]
    remove_nvidia_gpu(h100.base, fakesysfs.nvidia_h100_host(), "0000:43:00.0")
    devices = h100.kubelet.devices("nvidia.com/gpu", lambda d: d[gone].health == "Unhealthy")
    assert {i for i, d in devices.items() if d.health == "Unhealthy"} == {gone}
    with pytest.raises(grpc.RpcError) as caught:
        h100.kubelet.allocate("nvidia.com/gpu", [gone])
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "gone from the driver's /proc, sysfs or NVML: it cannot be allocated" in caught.value.details()
    # the GPUs after it moved up one index; their names did not
    assert _names(h100.kubelet, "nvidia.com/gpu", [UUID["0000:52:00.0"]]) == [
        f"nvidia.com/gpu={UUID['0000:52:00.0']}"]
    assert gone not in {d["name"] for d in cdi.load(str(h100.cdi / SPEC))["devices"]}


def test_a_gpu_the_driver_stops_listing_turns_unhealthy(h100: Node) -> None:
    """Unbound from nvidia (its information file gone, the PCI device still there): Unhealthy too."""
    h100.kubelet.devices("nvidia.com/gpu", lambda d: len(d) == 4)
    shutil.rmtree(h100.base / "proc" / "driver" / "nvidia" / "gpus" / "0000:1b:00.0")
    gone = UUID["0000:1b:00.0"]
    devices = h100.kubelet.devices("nvidia.com/gpu", lambda d: d[gone].health == "Unhealthy")
    assert sum(d.health == "Healthy" for d in devices.values()) == 3


def test_a_gpus_pci_uevent_brings_the_rescan_forward(tmp_path: Path) -> None:
    """No drm uevent comes from an NVIDIA GPU without nvidia-drm: its PCI device's remove brings the rescan forward
    (a 60 s interval here).  Which pci events count: tests/test_watch_gpu_uevents.py."""
    events = QueueEvents()
    base = host_tree(tmp_path / "host", fakesysfs.nvidia_h100_host())
    for node in Plugin(base, rescan=60, events=events).start(tmp_path):
        node.kubelet.devices("nvidia.com/gpu", lambda d: len(d) == 4)
        remove_nvidia_gpu(base, fakesysfs.nvidia_h100_host(), "0000:c1:00.0")
        events.put({"ACTION": "remove", "SUBSYSTEM": "pci", "DEVPATH": "/devices/pci0000:c1/0000:c1:00.0",
                    "PCI_CLASS": "30200", "PCI_ID": "10DE:2330", "PCI_SLOT_NAME": "0000:c1:00.0"})
        node.kubelet.devices("nvidia.com/gpu", lambda d: d[UUID["0000:c1:00.0"]].health == "Unhealthy")
        assert any(line.startswith("uevent remove pci /devices/pci0000:c1/0000:c1:00.0: nvidia.com/gpu "
                                   f"{UUID['0000:c1:00.0']}") for line in node.logs), node.logs


def test_the_keeper_rewrites_a_stale_nvidia_spec_and_checks_again(tmp_path: Path) -> None:
    base = host_tree(tmp_path / "host", fakesysfs.nvidia_h100_host())
    config = spec_config(base)
    inventory = scan_served(str(base / "sys"), proc_root=str(base / "proc"), driver_root=str(base / "driver"))
    uuid = UUID["0000:43:00.0"]
    wanted = [d for d in plan(inventory)[0] if d.id == uuid]
    logs: list[str] = []
    keeper = SpecKeeper(config, [str(tmp_path / "cdi")], logs.append)
    assert [os.path.basename(p) for paths in keeper.paths.values() for p in paths] == ["amd.com-gpu.json", SPEC]
    spec = tmp_path / "cdi" / SPEC
    spec.parent.mkdir()
    text = cdi.render(cdi.generate(inventory, "nvidia", config), "json")
    spec.write_text(text.replace('"minor": 255', '"minor": 254'))  # /dev/nvidiactl as another minor
    why = f"maps nvidia.com/gpu={uuid} to 195:0 195:254 510:0 510:1, not to its device numbers now"
    assert why in (mismatch(str(spec), wanted) or "")
    assert keeper.ensure(inventory, wanted) is None
    assert spec.read_text() == text and mismatch(str(spec), wanted) is None
    assert logs[-2].startswith(f"allocate: CDI spec {spec} {why}") and logs[-1].startswith("allocate: CDI spec wrote")


def test_allocate_fails_in_one_line_when_the_nvidia_spec_cannot_be_written(tmp_path: Path) -> None:
    """The driver's user-space is not where driver_root says (a plugin container without the node's driver files):
    no NVIDIA spec can be written, so no NVIDIA name is handed out; AMD's resource is untouched."""
    base = host_tree(tmp_path / "host", fakesysfs.nvidia_h100_host())
    (base / "driver" / "etc" / "ld.so.cache").unlink()
    for node in Plugin(base).start(tmp_path):
        node.kubelet.devices("nvidia.com/gpu", lambda d: len(d) == 4)
        uuid = UUID["0000:43:00.0"]
        with pytest.raises(grpc.RpcError) as caught:
            node.kubelet.allocate("nvidia.com/gpu", [uuid])
        details = caught.value.details()
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "\n" not in details
        assert details.startswith(f"not allocating nvidia.com/gpu={uuid}: the CDI spec {node.cdi / SPEC} ")
        assert "cannot be rewritten (" in details and "is not in the ld cache" in details, details
        assert not (node.cdi / SPEC).exists()


# --- MIG devices --------------------------------------------------------------------------------------------

def test_mig_devices_by_profile_with_the_mixed_strategy(tmp_path: Path, fake_nvml: Path) -> None:
    """Mixed: the whole GPU is nvidia.com/gpu, each MIG device nvidia.com/mig-<profile> under its MIG UUID; the GPU
    split into MIG devices is not advertised whole; compute-instance profiles (1c.2g.20gb) are left out, said once."""
    base = mig_tree(tmp_path / "host")
    whole_uuid = next(g.uuid for g in fakesysfs.nvidia_mig_host().nvidia if g.pci == WHOLE_GPU)
    for node in Plugin(base, strategy="mixed").start(tmp_path):
        assert sorted(node.kubelet.devices("nvidia.com/gpu")) == [whole_uuid]
        big = node.kubelet.devices("nvidia.com/mig-3g.40gb")
        small = node.kubelet.devices("nvidia.com/mig-2g.20gb")
        assert sorted(big) == [MIG_UUID[(1, 0)]] and sorted(small) == [MIG_UUID[(2, 0)]]
        assert [n.ID for n in big[MIG_UUID[(1, 0)]].topology.nodes] == [0]
        endpoints = {r.resource_name: r.endpoint for r in node.kubelet.registrations}
        assert endpoints["nvidia.com/mig-3g.40gb"] == "oci-gpu-hook-nvidia-mig-3g.40gb.sock"
        assert {r for r in endpoints if r.startswith("nvidia.com/")} == {
            "nvidia.com/gpu", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-2g.20gb"}
        names = _names(node.kubelet, "nvidia.com/mig-3g.40gb", [MIG_UUID[(1, 0)]])
        assert names == [f"nvidia.com/gpu={MIG_UUID[(1, 0)]}"]
        assert server.annotation_key("nvidia.com/mig-3g.40gb") == "cdi.k8s.io/oci-gpu-hook_nvidia-mig-3g.40gb"
        # its spec entry: the GPU's node and the GPU and compute instances' caps nodes, minors from mig-minors
        assert _spec_nodes(node.cdi / SPEC, MIG_UUID[(1, 0)]) == [
            ("/dev/nvidia1", 195, 1), ("/dev/nvidia-caps/nvidia-cap147", 236, 147),
            ("/dev/nvidia-caps/nvidia-cap148", 236, 148)]
        left_out = [line for line in node.logs if "1c.2g.20gb is a compute-instance profile" in line]
        assert len(left_out) == 2, node.logs  # gi5/ci0 and gi5/ci1, once each whatever the rescans
        with pytest.raises(grpc.RpcError) as caught:  # a MIG device is not the whole-GPU endpoint's
            node.kubelet.allocate("nvidia.com/gpu", [MIG_UUID[(1, 0)]])
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_mig_devices_with_the_single_strategy(tmp_path: Path, fake_nvml: Path) -> None:
    """Single: a host with a whole GPU beside a split one advertises the whole GPU only and says why; a host whose
    every GPU is split into MIG devices of one profile advertises them as nvidia.com/gpu, by MIG UUID."""
    base = mig_tree(tmp_path / "mixed-mig")
    whole_uuid = next(g.uuid for g in fakesysfs.nvidia_mig_host().nvidia if g.pci == WHOLE_GPU)
    for node in Plugin(base).start(tmp_path / "one"):
        assert sorted(node.kubelet.devices("nvidia.com/gpu")) == [whole_uuid]
        assert any(f"GPUs {WHOLE_GPU} are not split into MIG devices" in line for line in node.logs), node.logs
    host = fakesysfs.nvidia_mig_host()
    for gpu in host.nvidia:
        gpu.migs = ((1, (0,)), (2, (0,)))
    uniform = {(1, 0): MIGS[(1, 0)], (2, 0): (MIGS[(2, 0)][0], *MIGS[(1, 0)][1:])}  # 2 x 3g.40gb per GPU
    other = {key: (uuid.replace("-5b2c", "-6c3d"), *rest) for key, (uuid, *rest) in uniform.items()}
    nvml_table(fake_nvml, uniform)
    with fake_nvml.open("a") as table:
        table.write("".join(f"{WHOLE_GPU} {gi} {ci} {' '.join(map(str, v))}\n" for (gi, ci), v in other.items()))
    base = mig_tree(tmp_path / "uniform", host)
    for node in Plugin(base).start(tmp_path / "two"):
        devices = node.kubelet.devices("nvidia.com/gpu", lambda d: len(d) == 4)
        assert sorted(devices) == sorted([v[0] for v in uniform.values()] + [v[0] for v in other.values()])
        assert [r.resource_name for r in node.kubelet.registrations if r.resource_name.startswith("nvidia")] == [
            "nvidia.com/gpu"]
        (uuid,) = [v[0] for k, v in other.items() if k == (2, 0)]
        assert _names(node.kubelet, "nvidia.com/gpu", [uuid]) == [f"nvidia.com/gpu={uuid}"]


def test_a_destroyed_mig_instance_turns_unhealthy_and_a_new_one_appears(tmp_path: Path, fake_nvml: Path) -> None:
    """MIG instances change without a uevent: the periodic rescan reads /proc and NVML again.  GPU instance 2
    destroyed and created again with the same ids gets a new UUID: the old ID is Unhealthy, never allocated,
    the new one Healthy."""
    base = mig_tree(tmp_path / "host")
    old, new = MIG_UUID[(2, 0)], MIG_UUID[(2, 0)].replace("b200", "b201")
    for node in Plugin(base, strategy="mixed").start(tmp_path):
        node.kubelet.devices("nvidia.com/mig-2g.20gb", lambda d: old in d)
        gi2 = base / "proc" / "driver" / "nvidia" / "capabilities" / "gpu1" / "mig" / "gi2"
        saved = tmp_path / "gi2"
        shutil.move(gi2, saved)
        nvml_table(fake_nvml, {k: v for k, v in MIGS.items() if k != (2, 0)})
        node.kubelet.devices("nvidia.com/mig-2g.20gb", lambda d: d[old].health == "Unhealthy")
        with pytest.raises(grpc.RpcError) as caught:
            node.kubelet.allocate("nvidia.com/mig-2g.20gb", [old])
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert old not in {d["name"] for d in cdi.load(str(node.cdi / SPEC))["devices"]}
        nvml_table(fake_nvml, {**MIGS, (2, 0): (new, *MIGS[(2, 0)][1:])})
        shutil.move(saved, gi2)
        devices = node.kubelet.devices("nvidia.com/mig-2g.20gb", lambda d: new in d)
        assert {i: d.health for i, d in devices.items()} == {old: "Unhealthy", new: "Healthy"}, node.logs
        assert _names(node.kubelet, "nvidia.com/mig-2g.20gb", [new]) == [f"nvidia.com/gpu={new}"], node.logs


def test_without_nvml_mig_devices_are_not_advertised(tmp_path: Path, fake_nvml: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A MIG device's UUID and profile are NVML's only; without them it has no stable name (its GPU:MIG index moves
    when an instance before it is destroyed): left out, with the reason, never named by index."""
    monkeypatch.setenv("OGH_FAKE_NVML", str(tmp_path / "missing"))
    base = mig_tree(tmp_path / "host")
    whole_uuid = next(g.uuid for g in fakesysfs.nvidia_mig_host().nvidia if g.pci == WHOLE_GPU)
    for node in Plugin(base, strategy="mixed").start(tmp_path):
        assert sorted(node.kubelet.devices("nvidia.com/gpu")) == [whole_uuid]
        assert not any(r.resource_name.startswith("nvidia.com/mig-") for r in node.kubelet.registrations)
        (line,) = [line for line in node.logs if "MIG device(s) not advertised" in line]
        assert "4 MIG device(s) not advertised: their UUIDs and profiles are known only to NVML" in line
        assert "nvmlInit_v2 failed: Driver Not Loaded (999)" in line


def test_mig_resource_names_follow_nvidias_plugin() -> None:
    assert mig_resource("1g.10gb") == "nvidia.com/mig-1g.10gb"
    assert mig_resource("1g.10gb+me") == "nvidia.com/mig-1g.10gb.me"  # '+' is not allowed in a resource name
    assert mig_resource("1g.20gb-me") == "nvidia.com/mig-1g.20gb-me"
    assert nvml.profile_name(3, 3, 40, 2) == "3g.40gb" and nvml.profile_name(1, 2, 20, 1) == "1c.2g.20gb"
    assert nvml.profile_name(1, 1, 10, 7) == "1g.10gb+me" and nvml.profile_name(1, 1, 10, 15) == "1g.10gb+me.all"
    assert nvml.profile_name(4, 4, 20, 12) == "4g.20gb+gfx" and nvml.profile_name(1, 1, 10, 13) == "1g.10gb-me"
    # go-nvlib's rounding: the share of the GPU's memory up to eighths, times its whole GiB
    a100_40gb, h100_80gb = 40536 * 2**20, 81559 * 2**20
    assert [nvml.mig_memory_gb(a100_40gb, mb) for mb in (4864, 9984, 19968, 40192)] == [5, 10, 20, 40]
    assert [nvml.mig_memory_gb(h100_80gb, mb) for mb in (9856, 20096, 40448, 80896)] == [10, 20, 40, 80]
    assert server.short_name("amd.com/cpx_nps1") == "cpx_nps1" and server.short_name("nvidia.com/gpu") == "nvidia-gpu"


# --- AMD and NVIDIA on one host, one plugin -----------------------------------------------------------------

def test_one_plugin_serves_both_kinds_of_a_mixed_host(tmp_path: Path) -> None:
    host = fakesysfs.amd_nvidia_host()
    base = host_tree(tmp_path / "host", host)
    nvidia = {g.pci: g.uuid for g in host.nvidia}
    for node in Plugin(base, strategy="mixed").start(tmp_path):
        amd = node.kubelet.devices("amd.com/gpu", lambda d: len(d) == 2)
        nv = node.kubelet.devices("nvidia.com/gpu", lambda d: len(d) == 2)
        assert sorted(amd) == ["0000:03:00.0", "0000:41:00.0"] and sorted(nv) == sorted(nvidia.values())
        endpoints = {r.resource_name: r.endpoint for r in node.kubelet.registrations}
        assert endpoints == {"amd.com/gpu": "oci-gpu-hook-gpu.sock", "nvidia.com/gpu": "oci-gpu-hook-nvidia-gpu.sock"}
        assert _names(node.kubelet, "amd.com/gpu", ["0000:41:00.0"]) == ["amd.com/gpu=0000:41:00.0"]
        uuid = nvidia["0000:61:00.0"]
        assert _names(node.kubelet, "nvidia.com/gpu", [uuid]) == [f"nvidia.com/gpu={uuid}"]
        # the NVIDIA GPU's spec entry: its node and its DRM nodes (nvidia-drm is loaded), nothing of the AMD GPUs
        assert _spec_nodes(node.cdi / SPEC, uuid) == [("/dev/nvidia0", 195, 0), ("/dev/dri/card3", 226, 3),
                                                      ("/dev/dri/renderD131", 226, 131)]
        assert _spec_nodes(node.cdi / "amd.com-gpu.json", "0000:41:00.0") == [
            ("/dev/dri/card2", 226, 2), ("/dev/dri/renderD130", 226, 130)]
        with pytest.raises(grpc.RpcError) as caught:  # another kind's device is not this endpoint's
            node.kubelet.allocate("amd.com/gpu", [uuid])
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        remove_nvidia_gpu(base, host, "0000:21:00.0")
        node.kubelet.devices("nvidia.com/gpu", lambda d: d[nvidia["0000:21:00.0"]].health == "Unhealthy")
        assert {d.health for d in node.kubelet.devices("amd.com/gpu").values()} == {"Healthy"}


def test_list_shows_both_kinds_and_what_is_left_out(tmp_path: Path, fake_nvml: Path) -> None:
    import subprocess
    import sys

    base = mig_tree(tmp_path / "host")
    env = {**os.environ, "OCI_GPU_HOOK_CONFIG": os.devnull}
    done = subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", "--sysfs-root", str(base / "sys"),
                           "--proc-root", str(base / "proc"), "--driver-root", str(base / "driver"), "device-plugin",
                           "--list", "--resource-strategy=mixed"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if not line.startswith("#")]
    assert [row[:3] for row in rows] == [
        ["nvidia.com/gpu", next(g.uuid for g in fakesysfs.nvidia_mig_host().nvidia if g.pci == WHOLE_GPU),
         f"nvidia.com/gpu={next(g.uuid for g in fakesysfs.nvidia_mig_host().nvidia if g.pci == WHOLE_GPU)}"],
        ["nvidia.com/mig-3g.40gb", MIG_UUID[(1, 0)], f"nvidia.com/gpu={MIG_UUID[(1, 0)]}"],
        ["nvidia.com/mig-2g.20gb", MIG_UUID[(2, 0)], f"nvidia.com/gpu={MIG_UUID[(2, 0)]}"]]
    notes = [line for line in done.stdout.splitlines() if line.startswith("#")]
    assert len(notes) == 2 and all("compute-instance profile" in n for n in notes)
