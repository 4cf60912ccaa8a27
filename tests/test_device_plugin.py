"""oci-gpu-hook device-plugin against a fake kubelet speaking the real v1beta1 protocol over Unix sockets.

Fixture hosts are fake sysfs trees (tests/helpers/fakesysfs.py) in temp dirs; the
kubelet's directory and the CDI directories the plugin manages are temp dirs too.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from oci_gpu_hook.appliers import cdi
from oci_gpu_hook.cluster.deviceplugin import server
from oci_gpu_hook.cluster.deviceplugin.devices import devices_of, scan_amd
from oci_gpu_hook.cluster.deviceplugin.specs import SpecKeeper, mismatch
from oci_gpu_hook.cluster.watch import QueueEvents
from oci_gpu_hook.config import Config, load_config
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.inventory import scan
from tests.helpers import clilib, fakesysfs
from tests.helpers.fakekubelet import FakeKubelet

SEED_IDS = [f"0000:{bus}:00.0" for bus in fakesysfs.SEED_BUSES]


@dataclass
class Node:
    sysfs: Path
    kubelet: FakeKubelet
    manager: server.Manager
    tracker: server.Tracker
    logs: list[str]


def _start(tmp_path: Path, *, strategy: str = "single", rescan: float = 0.3, device_specs: bool = False,
           sysfs: Path | None = None, cdi_dirs: tuple[Path, ...] = ()) -> Iterator[Node]:
    if sysfs is None:
        sysfs = Path(fakesysfs.build(str(tmp_path / "sys"), fakesysfs.seed_host()))
    directory = tmp_path / "device-plugins"
    kubelet = FakeKubelet(str(directory))
    kubelet.start()
    logs: list[str] = []
    specs = SpecKeeper(spec_config(sysfs), [str(d) for d in cdi_dirs], logs.append) if cdi_dirs else None
    tracker = server.Tracker(str(sysfs), strategy, log=logs.append, specs=specs)
    manager = server.Manager(str(directory), tracker, device_specs=device_specs, rescan_interval=rescan,
                             poll_interval=0.1, log=logs.append)
    thread = threading.Thread(target=manager.run, daemon=True)
    thread.start()
    try:
        yield Node(sysfs, kubelet, manager, tracker, logs)
    finally:
        manager.stop()
        thread.join(10)
        kubelet.stop()
        assert not thread.is_alive()


def spec_config(sysfs: Path) -> Config:
    return Config(sysfs_root=str(sysfs))


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    yield from _start(tmp_path)


def _health(devices: dict[str, object]) -> dict[str, str]:
    return {i: d.health for i, d in devices.items()}  # type: ignore[attr-defined]


# --- registration, ListAndWatch, Allocate on 8 whole GPUs ----------------------------------------

def test_registers_and_lists_every_gpu_with_its_numa_node(node: Node) -> None:
    plugin = node.kubelet.plugin("amd.com/gpu")
    (request,) = node.kubelet.registrations
    assert (request.version, request.resource_name, request.endpoint) == ("v1beta1", "amd.com/gpu",
                                                                          "oci-gpu-hook-gpu.sock")
    assert request.options.get_preferred_allocation_available and not request.options.pre_start_required
    assert plugin.options.get_preferred_allocation_available  # what GetDevicePluginOptions answered
    devices = node.kubelet.devices("amd.com/gpu", lambda d: len(d) == 8)
    assert sorted(devices) == SEED_IDS  # IDs are PCI addresses, not positions
    assert set(_health(devices).values()) == {"Healthy"}
    assert {i: [n.ID for n in d.topology.nodes] for i, d in devices.items()} == {
        i: [0 if n < 4 else 1] for n, i in enumerate(SEED_IDS)}
    assert (node.sysfs.parent / "device-plugins" / "oci-gpu-hook-gpu.sock").is_socket()


def test_allocate_answers_with_cdi_names_and_the_annotation(node: Node) -> None:
    node.kubelet.devices("amd.com/gpu", lambda d: len(d) == 8)
    response = node.kubelet.allocate("amd.com/gpu", ["0000:83:00.0", "0000:63:00.0"], ["0000:03:00.0"])
    first, second = response.container_responses
    # stable names only: the PCI address names that GPU whatever comes and goes, an index would not
    assert [c.name for c in first.cdi_devices] == ["amd.com/gpu=0000:63:00.0", "amd.com/gpu=0000:83:00.0"]
    assert dict(first.annotations) == {"cdi.k8s.io/oci-gpu-hook_gpu":
                                       "amd.com/gpu=0000:63:00.0,amd.com/gpu=0000:83:00.0"}
    assert not first.envs and not first.devices and not first.mounts  # never only an env variable
    assert [c.name for c in second.cdi_devices] == ["amd.com/gpu=0000:03:00.0"]
    assert dict(second.annotations) == {"cdi.k8s.io/oci-gpu-hook_gpu": "amd.com/gpu=0000:03:00.0"}
    # The same IDs always give the same names, whatever their order.
    again = node.kubelet.allocate("amd.com/gpu", ["0000:63:00.0", "0000:83:00.0"]).container_responses[0]
    assert again == first


def test_cdi_names_are_the_devices_of_the_generated_spec(node: Node) -> None:
    """Each name the plugin returns is a device of ``cdi generate``'s spec with that GPU's nodes."""
    config = load_config({}, {"sysfs_root": str(node.sysfs)})
    inventory = scan(str(node.sysfs))
    spec = cdi.generate(inventory, "amd", config)
    edits = {d["name"]: sorted(n["path"] for n in d["containerEdits"]["deviceNodes"]) for d in spec["devices"]}
    by_pci = {g.pci_address: g for g in inventory.devices("amd")}
    node.kubelet.devices("amd.com/gpu", lambda d: len(d) == 8)
    for device_id in SEED_IDS:
        (name,) = node.kubelet.allocate("amd.com/gpu", [device_id]).container_responses[0].cdi_devices
        kind, _, device = name.name.partition("=")
        assert kind == spec["kind"] == "amd.com/gpu"
        assert edits[device] == sorted(n.path for n in by_pci[device_id].nodes)


def test_unknown_device_id_is_invalid_argument(node: Node) -> None:
    node.kubelet.devices("amd.com/gpu", lambda d: len(d) == 8)
    with pytest.raises(grpc.RpcError) as caught:
        node.kubelet.allocate("amd.com/gpu", ["0000:03:00.0", "0000:24:00.0"])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown device ID '0000:24:00.0' for resource amd.com/gpu" in caught.value.details()
    assert "0000:03:00.0" in caught.value.details()  # the known IDs are listed


def test_pre_start_container_is_a_no_op(node: Node) -> None:
    plugin = node.kubelet.plugin("amd.com/gpu")
    from oci_gpu_hook.cluster.deviceplugin import api_pb2 as api

    assert plugin.stub.PreStartContainer(api.PreStartContainerRequest(devices_ids=[SEED_IDS[0]]), timeout=5) \
        == api.PreStartContainerResponse()


def test_device_specs_for_nodes_without_cdi_or_shim(tmp_path: Path) -> None:
    for started in _start(tmp_path, device_specs=True):
        started.kubelet.devices("amd.com/gpu", lambda d: len(d) == 8)
        (answer,) = started.kubelet.allocate("amd.com/gpu", ["0000:23:00.0"]).container_responses
        assert [(d.host_path, d.container_path, d.permissions) for d in answer.devices] == [
            ("/dev/dri/card2", "/dev/dri/card2", "rw"), ("/dev/dri/renderD129", "/dev/dri/renderD129", "rw"),
            ("/dev/kfd", "/dev/kfd", "rw")]
        assert [c.name for c in answer.cdi_devices] == ["amd.com/gpu=0000:23:00.0"]  # the CDI names stay


# --- kubelet restart -------------------------------------------------------------------------------

def test_kubelet_restart_reregisters_on_a_fresh_endpoint(node: Node) -> None:
    node.kubelet.devices("amd.com/gpu", lambda d: len(d) == 8)
    socket = node.sysfs.parent / "device-plugins" / "oci-gpu-hook-gpu.sock"
    started = time.monotonic()
    node.kubelet.restart()  # empties the directory (our socket too), new kubelet.sock
    assert node.kubelet.generation == 2
    devices = node.kubelet.devices("amd.com/gpu", lambda d: len(d) == 8, timeout=5)
    took = time.monotonic() - started
    assert sorted(devices) == SEED_IDS
    assert len(node.kubelet.registrations) == 2
    assert socket.is_socket()  # served again (the inode number may be reused: not compared)
    response = node.kubelet.allocate("amd.com/gpu", ["0000:c3:00.0"])
    assert [c.name for c in response.container_responses[0].cdi_devices] == ["amd.com/gpu=0000:c3:00.0"]
    assert took < 3, took
    assert any("gone (kubelet restart?)" in line for line in node.logs), node.logs


def test_registers_once_the_kubelet_appears(tmp_path: Path) -> None:
    """A plugin started before the kubelet serves, retries, and registers when kubelet.sock appears."""
    sysfs = fakesysfs.build(str(tmp_path / "sys"), fakesysfs.seed_host())
    directory = tmp_path / "device-plugins"
    directory.mkdir()
    logs: list[str] = []
    manager = server.Manager(str(directory), server.Tracker(sysfs, "single", log=logs.append), poll_interval=0.1,
                             log=logs.append)
    thread = threading.Thread(target=manager.run, daemon=True)
    thread.start()
    kubelet = FakeKubelet(str(directory))
    try:
        time.sleep(0.5)
        assert not any(line.startswith("registered") for line in logs)
        kubelet.start()
        assert len(kubelet.devices("amd.com/gpu", lambda d: len(d) == 8, timeout=5)) == 8
    finally:
        manager.stop()
        thread.join(10)
        kubelet.stop()


def test_no_kubelet_socket_is_said_once_while_it_lasts(tmp_path: Path) -> None:
    sysfs = fakesysfs.build(str(tmp_path / "sys"), fakesysfs.seed_host())
    directory = tmp_path / "device-plugins"
    directory.mkdir()
    logs: list[str] = []
    manager = server.Manager(str(directory), server.Tracker(sysfs, "single", log=logs.append), log=logs.append)
    kubelet = FakeKubelet(str(directory))
    waiting = (f"waiting for the kubelet's socket {directory}/kubelet.sock (is the kubelet running, and "
               "--kubelet-dir its device-plugins directory?)")
    try:
        manager.step()
        manager.step()
        assert logs.count(waiting) == 1, logs
        kubelet.start()
        manager.step()
        kubelet.stop()
        manager.step()
        assert logs.count(waiting) == 2, logs  # gone again: said again
    finally:
        manager.close()
        kubelet.stop()


# --- health ----------------------------------------------------------------------------------------

def _remove_gpu(sysfs: Path, pci: str, *, leave_links: bool = False) -> None:
    """Take a GPU out of the fake sysfs: its device directory, and (unless leave_links) its class/drm links."""
    device = next(sysfs.glob(f"devices/**/{pci}"))
    for name in [p.name for p in (device / "drm").iterdir() if p.name.startswith(("card", "renderD"))]:
        link = sysfs / "class" / "drm" / name
        if link.is_symlink() and not leave_links:
            link.unlink()
    shutil.rmtree(device)


def test_removed_gpu_turns_unhealthy_within_the_rescan_interval(node: Node) -> None:
    node.kubelet.devices("amd.com/gpu", lambda d: len(d) == 8)
    _remove_gpu(node.sysfs, "0000:43:00.0")
    # rescan every 0.3 s here (10 s by default): the wait's bound, not a timed assert, says it came by a rescan
    devices = node.kubelet.devices("amd.com/gpu", lambda d: d["0000:43:00.0"].health == "Unhealthy", timeout=5)
    assert {i for i, h in _health(devices).items() if h == "Unhealthy"} == {"0000:43:00.0"}
    with pytest.raises(grpc.RpcError) as caught:
        node.kubelet.allocate("amd.com/gpu", ["0000:43:00.0"])
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "gone from sysfs" in caught.value.details()
    # The GPUs after it moved up one index; their IDs and names stay.
    (answer,) = node.kubelet.allocate("amd.com/gpu", ["0000:63:00.0"]).container_responses
    assert [c.name for c in answer.cdi_devices] == ["amd.com/gpu=0000:63:00.0"]


def test_half_removed_gpu_is_unhealthy_never_a_crash(node: Node) -> None:
    """Dangling /sys/class/drm links (the device directory is gone first) make the inventory fail to read
    that GPU; the plugin reports it Unhealthy and keeps serving the others."""
    node.kubelet.devices("amd.com/gpu", lambda d: len(d) == 8)
    _remove_gpu(node.sysfs, "0000:a3:00.0", leave_links=True)
    assert os.path.islink(node.sysfs / "class/drm/card6") and not os.path.exists(node.sysfs / "class/drm/card6")
    with pytest.raises(HookError, match="cannot read a device number"):  # today's inventory refuses the host
        scan(str(node.sysfs))
    devices = node.kubelet.devices("amd.com/gpu", lambda d: d["0000:a3:00.0"].health == "Unhealthy", timeout=5)
    assert sum(h == "Healthy" for h in _health(devices).values()) == 7
    (answer,) = node.kubelet.allocate("amd.com/gpu", ["0000:c3:00.0"]).container_responses
    assert [c.name for c in answer.cdi_devices] == ["amd.com/gpu=0000:c3:00.0"]


def test_gpu_that_comes_back_is_healthy_again_under_the_same_id(tmp_path: Path) -> None:
    backup = tmp_path / "backup"
    for started in _start(tmp_path):
        started.kubelet.devices("amd.com/gpu", lambda d: len(d) == 8)
        shutil.copytree(started.sysfs, backup, symlinks=True)
        _remove_gpu(started.sysfs, "0000:e3:00.0")
        started.kubelet.devices("amd.com/gpu", lambda d: d["0000:e3:00.0"].health == "Unhealthy", timeout=5)
        shutil.rmtree(started.sysfs)
        shutil.copytree(backup, started.sysfs, symlinks=True)
        # a rescan while the tree was being copied back may have seen others half there: the next one heals them
        devices = started.kubelet.devices("amd.com/gpu", lambda d: len(d) == 8 and set(_health(d).values()) == {
            "Healthy"}, timeout=5)
        assert set(_health(devices).values()) == {"Healthy"} and len(devices) == 8


def test_uevent_brings_the_rescan_forward(tmp_path: Path) -> None:
    """With a 60 s rescan interval, a drm uevent makes the plugin notice the removal at once."""
    events = QueueEvents()
    sysfs = Path(fakesysfs.build(str(tmp_path / "sys"), fakesysfs.seed_host()))
    directory = tmp_path / "device-plugins"
    kubelet = FakeKubelet(str(directory))
    kubelet.start()
    logs: list[str] = []
    manager = server.Manager(str(directory), server.Tracker(str(sysfs), "single", log=logs.append),
                             rescan_interval=60, poll_interval=0.1, log=logs.append, events=events, uevent_delay=0.2)
    thread = threading.Thread(target=manager.run, daemon=True)
    thread.start()
    try:
        kubelet.devices("amd.com/gpu", lambda d: len(d) == 8)
        _remove_gpu(sysfs, "0000:23:00.0")
        events.put({"ACTION": "add", "SUBSYSTEM": "pci", "DEVPATH": "/devices/unrelated"})  # not a GPU's: ignored
        time.sleep(0.5)
        assert kubelet.devices("amd.com/gpu")["0000:23:00.0"].health == "Healthy"
        events.put({"ACTION": "remove", "SUBSYSTEM": "drm", "DEVNAME": "dri/card2"})
        # within 5 s of a 60 s rescan interval: only the uevent can have brought it (no timed assert)
        kubelet.devices("amd.com/gpu", lambda d: d["0000:23:00.0"].health == "Unhealthy", timeout=5)
        assert any(line.startswith("uevent remove drm dri/card2: amd.com/gpu 0000:23:00.0") for line in logs), logs
    finally:
        manager.stop()
        thread.join(10)
        kubelet.stop()


def test_default_rescan_reports_a_vanished_gpu_within_30_seconds() -> None:
    """Without uevents, the periodic rescan is what notices: every 10 s by default (the CLI's too)."""
    manager = server.Manager("/nonexistent", server.Tracker("/nonexistent", "single"))
    assert manager.rescan_interval == 10.0 <= 30 and manager.poll_interval == 1.0
    done = subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", "device-plugin", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "(default 10)" in done.stdout


# --- the CDI specs the plugin manages ----------------------------------------------------------------

SPEC = "amd.com-gpu.json"


def _wait_for(condition: object, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def _spec_names(path: Path) -> set[str]:
    return {d["name"] for d in cdi.load(str(path))["devices"]}


def _rebuild(sysfs: Path, host: fakesysfs.FakeHost) -> None:
    shutil.rmtree(sysfs)
    fakesysfs.build(str(sysfs), host)


def _renumbered_seed() -> fakesysfs.FakeHost:
    """The seed host after GPU 0000:63:00.0 came back from a reset as card9/renderD140 (same PCI address)."""
    host = fakesysfs.seed_host()
    gpu = next(g for g in host.gpus if g.pci == "0000:63:00.0")
    gpu.card, gpu.render = 9, 140
    return host


def test_the_plugin_writes_its_specs_at_start_and_keeps_them_current(tmp_path: Path) -> None:
    """No watch: the plugin's own periodic rescan writes the spec, then rewrites it when a GPU leaves, and
    removes it when none is left."""
    cdi_dir = tmp_path / "cdi"
    for started in _start(tmp_path, cdi_dirs=(cdi_dir,)):
        started.kubelet.devices("amd.com/gpu", lambda d: len(d) == 8)
        spec = cdi_dir / SPEC
        assert spec.read_text() == cdi.render(cdi.generate(scan(str(started.sysfs)), "amd",
                                                           spec_config(started.sysfs)), "json")
        assert (spec.stat().st_mode & 0o777) == 0o644
        _remove_gpu(started.sysfs, "0000:43:00.0")
        _wait_for(lambda spec=spec, logs=started.logs: "0000:43:00.0" not in _spec_names(spec) and any(
            line.startswith("rescan: CDI spec wrote ") for line in logs), 10, "the spec without 0000:43:00.0, said")
        inventory = scan(str(started.sysfs))
        assert mismatch(str(spec), devices_of(inventory)) is None
        for pci in SEED_IDS:
            if pci != "0000:43:00.0":
                _remove_gpu(started.sysfs, pci)
        # the file goes before the plugin logs that it went: wait for both
        _wait_for(lambda spec=spec, logs=started.logs: not spec.exists() and any(
            "removed the stale spec" in line for line in logs), 10, "the stale spec removed, and said")


@pytest.mark.parametrize("strategy", ["single", "mixed"])
def test_a_uevent_regenerates_the_specs_after_a_mode_change(tmp_path: Path, strategy: str) -> None:
    """CPX -> DPX with a 60 s rescan interval: the drm uevent makes the plugin rewrite the spec at once; the
    partitions that no longer exist stay advertised, Unhealthy, and are never allocated; with ``mixed`` the
    remaining ones move to the new mode's resource, served and registered then."""
    events = QueueEvents()
    sysfs = Path(fakesysfs.build(str(tmp_path / "sys"), fakesysfs.mi300x_host("CPX")))
    cdi_dir = tmp_path / "cdi"
    kubelet = FakeKubelet(str(tmp_path / "device-plugins"))
    kubelet.start()
    logs: list[str] = []
    tracker = server.Tracker(str(sysfs), strategy, log=logs.append,
                             specs=SpecKeeper(spec_config(sysfs), [str(cdi_dir)], logs.append))
    manager = server.Manager(str(tmp_path / "device-plugins"), tracker, rescan_interval=60, poll_interval=0.1,
                             log=logs.append, events=events, uevent_delay=0.2)
    thread = threading.Thread(target=manager.run, daemon=True)
    thread.start()
    before, after = ("amd.com/gpu", "amd.com/gpu") if strategy == "single" else ("amd.com/cpx_nps1",
                                                                                  "amd.com/dpx_nps1")
    try:
        kubelet.devices(before, lambda d: len(d) == 16)
        assert "0000:05:00.0-p7" in _spec_names(cdi_dir / SPEC)
        _rebuild(sysfs, fakesysfs.mi300x_host("DPX", "."))
        events.put({"ACTION": "change", "SUBSYSTEM": "drm", "DEVNAME": "dri/card1"})
        _wait_for(lambda: "0000:05:00.0-p7" not in _spec_names(cdi_dir / SPEC), 10, "the DPX spec")
        assert {n for n in _spec_names(cdi_dir / SPEC) if "-p" in n} == {
            "0000:05:00.0-p0", "0000:05:00.0-p1", "0000:26:00.0-p0", "0000:26:00.0-p1"}
        gone = kubelet.devices(before, lambda d: d["0000:05:00.0/p7"].health == "Unhealthy")
        healthy = kubelet.devices(after, lambda d: sum(x.health == "Healthy" for x in d.values()) == 4)
        assert sorted(i for i, d in healthy.items() if d.health == "Healthy") == [
            "0000:05:00.0", "0000:05:00.0/p1", "0000:26:00.0", "0000:26:00.0/p1"]
        assert {i for i, d in gone.items() if d.health == "Unhealthy"} == {
            f"{pci}/p{n}" for pci in ("0000:05:00.0", "0000:26:00.0") for n in range(2, 8)}
        with pytest.raises(grpc.RpcError) as caught:
            kubelet.allocate(before, ["0000:05:00.0/p7"])
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        (answer,) = kubelet.allocate(after, ["0000:26:00.0/p1"]).container_responses
        assert [c.name for c in answer.cdi_devices] == ["amd.com/gpu=0000:26:00.0-p1"]
        assert any(line.startswith("uevent change drm dri/card1: CDI spec wrote") and "mode DPX/NPS1" in line
                   for line in logs), logs
    finally:
        manager.stop()
        thread.join(10)
        kubelet.stop()


def test_allocate_rewrites_a_stale_spec_before_answering(tmp_path: Path) -> None:
    """A GPU is back from a reset under its PCI address with new minors, and nothing has rescanned yet (60 s
    interval, no uevents): the spec still maps its name to the old minors.  Allocate rewrites it first, so
    the name it answers resolves to the GPU's nodes now."""
    cdi_dir = tmp_path / "cdi"
    for started in _start(tmp_path, cdi_dirs=(cdi_dir,), rescan=60):
        started.kubelet.devices("amd.com/gpu", lambda d: len(d) == 8)
        spec = cdi_dir / SPEC
        old = spec.read_text()
        _rebuild(started.sysfs, _renumbered_seed())
        assert spec.read_text() == old  # stale: nothing noticed yet
        (answer,) = started.kubelet.allocate("amd.com/gpu", ["0000:63:00.0"]).container_responses
        assert [c.name for c in answer.cdi_devices] == ["amd.com/gpu=0000:63:00.0"]
        nodes = next(d for d in cdi.load(str(spec))["devices"] if d["name"] == "0000:63:00.0")["containerEdits"]
        assert [(n["path"], n["minor"]) for n in nodes["deviceNodes"]] == [("/dev/dri/card9", 9),
                                                                           ("/dev/dri/renderD140", 140)]
        assert any(line.startswith("allocate: CDI spec wrote") for line in started.logs), started.logs


def test_the_keeper_checks_rewrites_and_checks_again(tmp_path: Path) -> None:
    """The check before an answer: a stale, missing, unreadable or foreign spec is rewritten from the scan and
    checked again; a right one is left alone."""
    sysfs = Path(fakesysfs.build(str(tmp_path / "sys"), _renumbered_seed()))
    stale_host = Path(fakesysfs.build(str(tmp_path / "before"), fakesysfs.seed_host()))
    config = spec_config(sysfs)
    inventory = scan_amd(str(sysfs))
    wanted = [d for d in devices_of(inventory) if d.id == "0000:63:00.0"]
    cdi_dir = tmp_path / "cdi"
    cdi_dir.mkdir()
    spec = cdi_dir / SPEC
    logs: list[str] = []
    keeper = SpecKeeper(config, [str(cdi_dir)], logs.append)
    stale = cdi.render(cdi.generate(scan(str(stale_host)), "amd", config), "json")
    for content, why in ((stale, "maps amd.com/gpu=0000:63:00.0 to 226:131 226:4 234:0, not to its device "
                                 "numbers now (226:140 226:9 234:0)"),
                         (None, "is unusable (cannot read"),
                         ("{not json", "is unusable ("),
                         (stale.replace('"amd.com/gpu"', '"vendor.com/gpu"', 1), "is of kind 'vendor.com/gpu', not")):
        if content is None:
            spec.unlink(missing_ok=True)
        else:
            spec.write_text(content)
        assert why in (mismatch(str(spec), wanted) or ""), mismatch(str(spec), wanted)
        assert keeper.ensure(inventory, wanted) is None
        assert mismatch(str(spec), wanted) is None
        assert f"allocate: CDI spec {spec} {why}" in logs[-2], logs
    inode = spec.stat().st_ino
    logs.clear()
    assert keeper.ensure(inventory, wanted) is None and spec.stat().st_ino == inode and not logs


@pytest.mark.parametrize("how", ["untrusted", "not-a-directory"])
def test_allocate_fails_in_one_line_when_a_spec_cannot_be_made_right(tmp_path: Path, how: str) -> None:
    """A managed directory the plugin cannot write (group/world-writable, so refused; or not a directory):
    Allocate answers FAILED_PRECONDITION with one line, never a name the node may resolve to another GPU."""
    cdi_dir = tmp_path / "cdi"
    if how == "untrusted":
        cdi_dir.mkdir()
        fakesysfs.build(str(tmp_path / "before"), _renumbered_seed())
        (cdi_dir / SPEC).write_text(cdi.render(cdi.generate(scan(str(tmp_path / "before")), "amd", Config()),
                                               "json"))
        cdi_dir.chmod(0o777)
    else:
        cdi_dir.write_text("")
    for started in _start(tmp_path, cdi_dirs=(cdi_dir,)):
        started.kubelet.devices("amd.com/gpu", lambda d: len(d) == 8)
        with pytest.raises(grpc.RpcError) as caught:
            started.kubelet.allocate("amd.com/gpu", ["0000:63:00.0"])
        details = caught.value.details()
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "\n" not in details and "Traceback" not in details
        assert details.startswith(f"not allocating amd.com/gpu=0000:63:00.0: the CDI spec {cdi_dir / SPEC} ")
        assert " and cannot be rewritten (" in details
        assert ("is not trusted" if how == "untrusted" else "Not a directory") in details, details
        assert details.endswith("; a runtime reading it would not give these devices")
        assert sum("failed:" in line for line in started.logs if line.startswith("rescan")) <= 1  # said once


# --- partitions, mixed strategy, preferred allocation over the wire -----------------------------------

def cpx_sysfs(tmp_path: Path) -> Path:
    """Two MI300X in CPX/NPS1 (8 partitions each, one XGMI hive, NUMA 0 and 1) and one gfx1100 whole GPU."""
    host = fakesysfs.mi300x_host("CPX")
    host.gpus.append(fakesysfs.FakeGpu(pci="0000:c1:00.0", card=17, render=144, numa_node=1))
    return Path(fakesysfs.build(str(tmp_path / "sys"), host))


def test_mixed_strategy_serves_one_endpoint_per_resource(tmp_path: Path) -> None:
    for started in _start(tmp_path, strategy="mixed", sysfs=cpx_sysfs(tmp_path)):
        partitions = started.kubelet.devices("amd.com/cpx_nps1", lambda d: len(d) == 16)
        whole = started.kubelet.devices("amd.com/gpu", lambda d: len(d) == 1)
        assert sorted(whole) == ["0000:c1:00.0"]
        assert "0000:05:00.0/p3" in partitions and "0000:26:00.0" in partitions
        assert {r.resource_name: r.endpoint for r in started.kubelet.registrations} == {
            "amd.com/cpx_nps1": "oci-gpu-hook-cpx_nps1.sock", "amd.com/gpu": "oci-gpu-hook-gpu.sock"}
        (answer,) = started.kubelet.allocate("amd.com/cpx_nps1", ["0000:26:00.0/p2", "0000:26:00.0/p1"]) \
            .container_responses
        assert dict(answer.annotations) == {"cdi.k8s.io/oci-gpu-hook_cpx_nps1":
                                            "amd.com/gpu=0000:26:00.0-p1,amd.com/gpu=0000:26:00.0-p2"}
        with pytest.raises(grpc.RpcError) as caught:  # a device of another resource is not this endpoint's
            started.kubelet.allocate("amd.com/gpu", ["0000:26:00.0/p1"])
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # Two partitions: from one GPU, the one on whose NUMA node the must-include device is.
        ids = started.kubelet.preferred("amd.com/cpx_nps1", sorted(partitions), ["0000:26:00.0/p5"], 2)
        assert ids[0] == "0000:26:00.0/p5" and ids[1].startswith("0000:26:00.0")


def test_single_strategy_puts_partitions_under_amd_com_gpu(tmp_path: Path) -> None:
    for started in _start(tmp_path, sysfs=cpx_sysfs(tmp_path)):
        assert len(started.kubelet.devices("amd.com/gpu", lambda d: len(d) == 17)) == 17
        assert [r.resource_name for r in started.kubelet.registrations] == ["amd.com/gpu"]


def test_preferred_allocation_over_the_wire_keeps_numa(node: Node) -> None:
    node.kubelet.devices("amd.com/gpu", lambda d: len(d) == 8)
    # 3 GPUs from [0, 4, 5, 6, 1]: NUMA 1 holds 4, 5, 6.
    available = [SEED_IDS[i] for i in (0, 4, 5, 6, 1)]
    assert sorted(node.kubelet.preferred("amd.com/gpu", available, [], 3)) == [SEED_IDS[i] for i in (4, 5, 6)]
    # must include GPU 0 (NUMA 0): the other comes from NUMA 0 too.
    assert node.kubelet.preferred("amd.com/gpu", available, [SEED_IDS[0]], 2) == [SEED_IDS[0], SEED_IDS[1]]


# --- the command itself ------------------------------------------------------------------------------

def test_the_command_serves_registers_and_stops_on_sigterm(tmp_path: Path) -> None:
    sysfs = fakesysfs.build(str(tmp_path / "sys"), fakesysfs.seed_host())
    directory = tmp_path / "device-plugins"
    kubelet = FakeKubelet(str(directory))
    kubelet.start()
    stderr = tmp_path / "stderr"
    with open(stderr, "w") as err:
        process = subprocess.Popen([sys.executable, "-m", "oci_gpu_hook.entry.cli", "device-plugin", "--kubelet-dir",
                                    str(directory), "--sysfs-root", sysfs, "--rescan-interval", "0.5",
                                    "--cdi-dir", str(tmp_path / "cdi"), "--cdi-dir", str(tmp_path / "cdi2")],
                                   stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, "PYTHONPATH": str(
                                       Path(__file__).resolve().parent.parent)})
    try:
        devices = kubelet.devices("amd.com/gpu", lambda d: len(d) == 8, timeout=30)
        assert sorted(devices) == SEED_IDS
        (answer,) = kubelet.allocate("amd.com/gpu", [SEED_IDS[5]]).container_responses
        assert dict(answer.annotations) == {"cdi.k8s.io/oci-gpu-hook_gpu": "amd.com/gpu=0000:a3:00.0"}
        for managed in ("cdi", "cdi2"):  # every --cdi-dir holds the spec the name was checked against
            assert mismatch(str(tmp_path / managed / SPEC), devices_of(scan(sysfs))) is None
        kubelet.restart()
        assert len(kubelet.devices("amd.com/gpu", lambda d: len(d) == 8, timeout=10)) == 8
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        kubelet.stop()
    lines = stderr.read_text().splitlines()
    assert not (directory / "oci-gpu-hook-gpu.sock").exists()  # removed on the way out
    assert any("oci-gpu-hook device-plugin: serving in" in line for line in lines), lines
    assert sum("registered amd.com/gpu at" in line for line in lines) == 2, lines
    assert any("allocate amd.com/gpu: 0000:a3:00.0 -> amd.com/gpu=0000:a3:00.0" in line for line in lines), lines
    assert "Traceback" not in stderr.read_text()


def test_list_prints_stable_names_and_the_spec_options_exclude_each_other(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent), "OCI_GPU_HOOK_CONFIG": "/dev/null"}
    base = [sys.executable, "-m", "oci_gpu_hook.entry.cli", "device-plugin"]
    listed = subprocess.run([*base, "--sysfs-root", str(cpx_sysfs(tmp_path)), "--list", "--resource-strategy=mixed"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()]
    assert rows[0][:3] == ["amd.com/cpx_nps1", "0000:05:00.0", "amd.com/gpu=0000:05:00.0-p0"]
    assert rows[11][:3] == ["amd.com/cpx_nps1", "0000:26:00.0/p3", "amd.com/gpu=0000:26:00.0-p3"]
    assert rows[16][:3] == ["amd.com/gpu", "0000:c1:00.0", "amd.com/gpu=0000:c1:00.0"]
    assert not any(row[2].split("=")[1].isdigit() for row in rows)  # no index names
    both = subprocess.run([*base, "--cdi-dir", str(tmp_path), "--no-cdi-specs"], capture_output=True, text=True,
                          env=env, timeout=60)
    assert both.returncode == 2 and both.stderr.count("\n") == 1
    assert "--cdi-dir and --no-cdi-specs exclude each other" in both.stderr
    untrusted = tmp_path / "open"
    untrusted.mkdir(mode=0o777)
    untrusted.chmod(0o777)
    refused = subprocess.run([*base, "--sysfs-root", str(tmp_path / "sys"), "--cdi-dir", str(untrusted),
                              "--kubelet-dir", str(tmp_path / "kubelet")], capture_output=True, text=True, env=env,
                             timeout=60)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert "is not trusted" in refused.stderr and "Traceback" not in refused.stderr


# --- --list needs no gRPC -------------------------------------------------------------------------

# `oci-gpu-hook` run by an interpreter where grpc and protobuf cannot be imported (not installed: the
# device-plugin extra left out)
WITHOUT_GRPC = """import sys
sys.modules.update({name: None for name in ("grpc", "google.protobuf")})
from oci_gpu_hook.entry.cli import main
sys.exit(main())
"""


def without_grpc(*args: str) -> subprocess.CompletedProcess[str]:
    env = clilib.without_tool_vars()
    env["OCI_GPU_HOOK_CONFIG"] = os.devnull
    repo = Path(__file__).resolve().parent.parent
    return subprocess.run([sys.executable, "-c", WITHOUT_GRPC, *args], capture_output=True, text=True, timeout=60,
                          cwd=repo, env=env, check=False)


def test_list_works_without_grpc(tmp_path: Path) -> None:
    sysfs = fakesysfs.build(str(tmp_path / "sys"), fakesysfs.seed_host())
    done = without_grpc("--sysfs-root", sysfs, "device-plugin", "--list")
    assert done.returncode == 0, done.stderr
    with_grpc = subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", "--sysfs-root", sysfs,
                                "device-plugin", "--list"], capture_output=True, text=True, timeout=60,
                               env={**os.environ, "OCI_GPU_HOOK_CONFIG": os.devnull}, check=False)
    assert done.stdout == with_grpc.stdout and len(done.stdout.splitlines()) == 8
    serving = without_grpc("--sysfs-root", sysfs, "device-plugin", "--kubelet-dir", str(tmp_path))
    assert serving.returncode == 1
    assert serving.stderr.startswith("oci-gpu-hook: error: device-plugin needs grpcio and protobuf (")
    assert serving.stderr.endswith("pip install 'oci-gpu-hook[device-plugin]'\n")
    assert serving.stderr.count("\n") == 1
