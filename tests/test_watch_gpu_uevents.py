"""Which uevents make ``watch`` and the device plugin rescan: drm and kfd, and a GPU's PCI device.

NVIDIA GPUs without nvidia-drm have no DRM nodes, and the driver makes /dev/nvidia* without uevents: what the
kernel sends for them is their PCI device's add/remove/bind/unbind, with ``PCI_CLASS`` and ``PCI_ID`` as every
PCI uevent has them.  The events here are written in the kernel's format (the fake trees' ``uevent`` files
carry the same fields); the watcher runs on a fake clock (tests/test_watch.py's), so the debounce is exact.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from typing import Any

import pytest

from oci_gpu_hook.cluster.watch import DEFAULT_SUBSYSTEMS, Watcher, gpu_pci, gpu_uevent
from oci_gpu_hook.config import Config
from tests.helpers import fakesysfs
from tests.test_watch import Clock, Script, device_names


def pci_event(action: str, pci: str, pci_class: str, pci_id: str, driver: str | None = None) -> dict[str, Any]:
    """A PCI device's uevent as the kernel sends it (PCI_CLASS hex without leading zeros, PCI_ID upper case)."""
    bus = pci.split(":")[1]
    path = f"/devices/pci{pci[:4]}:{bus}/{pci}"
    event = {"header": {"message": f"{action}@{path}", "sequence_number": 0}, "ACTION": action, "DEVPATH": path,
             "SUBSYSTEM": "pci", "PCI_CLASS": pci_class, "PCI_ID": pci_id, "PCI_SLOT_NAME": pci,
             "MODALIAS": f"pci:v0000{pci_id[:4]}d0000{pci_id[5:]}sv00000000sd00000000bc{pci_class[:-4]:0>2}",
             "SEQNUM": "7"}
    if driver:
        event["DRIVER"] = driver
    return event


H100 = ("30200", "10DE:2330")
NVSWITCH = ("68000", "10DE:22A3")
NVIDIA_AUDIO = ("40300", "10DE:22BA")


@pytest.mark.parametrize(("pci_class", "pci_id", "gpu"), [
    (*H100, True),
    ("30000", "10DE:26B9", True),  # an L40S: VGA class
    ("30000", "1002:744C", True),  # a Radeon
    ("120000", "1002:74A1", True),  # an MI300X: processing accelerator
    ("38000", "8086:56C0", True),  # an Intel Flex: display (other)
    (*NVSWITCH, False),
    (*NVIDIA_AUDIO, False),
    ("20000", "15B3:101D", False),  # a ConnectX NIC
    ("30000", "1A03:2000", False),  # a BMC's VGA (ASPEED): not a GPU vendor
    ("3o200", "10DE:2330", False),  # not hex
    ("", "10DE:2330", False),
], ids=["h100", "l40s", "radeon", "mi300x", "intel-flex", "nvswitch", "nvidia-audio", "nic", "bmc", "garbage",
        "no-class"])
def test_which_pci_uevents_are_a_gpus(pci_class: str, pci_id: str, gpu: bool) -> None:
    for action in ("add", "bind", "unbind", "remove", "change"):
        event = pci_event(action, "0000:1b:00.0", pci_class, pci_id)
        assert gpu_pci(event) is gpu and gpu_uevent(event) is gpu


def test_drm_and_kfd_events_count_and_other_subsystems_do_not() -> None:
    assert DEFAULT_SUBSYSTEMS == ("drm", "kfd", "pci")
    for subsystem, counts in (("drm", True), ("kfd", True), ("mem", False), ("usb", False), ("module", False)):
        assert gpu_uevent({"ACTION": "change", "SUBSYSTEM": subsystem, "DEVPATH": "/x"}) is counts
    assert not gpu_uevent({"ACTION": "add", "SUBSYSTEM": "pci", "DEVPATH": "/devices/unrelated"})  # no PCI_ID
    event = pci_event("remove", "0000:1b:00.0", *H100)
    assert not gpu_uevent(event, ("drm", "kfd"))  # --subsystems drm,kfd: pci is not watched
    assert gpu_uevent({"ACTION": "change", "SUBSYSTEM": "mem"}, ("mem",))


def test_the_fake_trees_uevent_files_say_what_the_kernel_sends(tmp_path: Path) -> None:
    """The PCI device's uevent file (the fields every uevent of it carries) of each fake host's functions."""
    host = fakesysfs.nvidia_h100_host()
    root = Path(fakesysfs.build(str(tmp_path / "sys"), host))
    for gpu in host.gpus:
        fields = dict(line.split("=", 1) for line in
                      (root / "bus" / "pci" / "devices" / gpu.pci / "uevent").read_text().splitlines())
        event = {"ACTION": "remove", "SUBSYSTEM": "pci", **fields}
        assert gpu_uevent(event) is (gpu.driver == "nvidia"), fields  # the BMC's VGA is not a GPU vendor's


class NvidiaWatch:
    """``watch`` keeping an NVIDIA host's spec (a copy of the H100 fixture host) on a fake clock."""

    def __init__(self, tmp_path: Path) -> None:
        self.host = fakesysfs.nvidia_h100_host()
        self.base = tmp_path / "host"
        fakesysfs.build_all(str(self.base / "sys"), self.host)
        self.spec = tmp_path / "cdi" / "nvidia.com-gpu.json"
        config = Config(sysfs_root=str(self.base / "sys"), proc_root=str(self.base / "proc"),
                        driver_root=str(self.base / "driver"), cdi_dir=str(tmp_path / "cdi"), backends=("nvidia",),
                        hook_path="/bin/sh")
        self.clock = Clock()
        self.source = Script(self.clock)
        self.log = io.StringIO()
        self.watcher = Watcher(config, [("nvidia", str(self.spec), "json")], self.source, debounce=1.0,
                               clock=self.clock, stream=self.log)
        assert self.watcher.regenerate("start").kind == "wrote"

    def remove(self, pci: str) -> None:
        fakesysfs.remove_gpu(str(self.base / "sys"), self.host, pci)
        shutil.rmtree(self.base / "proc" / "driver" / "nvidia" / "gpus" / pci)

    def drain(self) -> None:
        while self.source.items or self.watcher.pending:
            self.watcher.step()

    def regenerations(self) -> list[str]:
        return [line for line in self.log.getvalue().splitlines() if ": after " in line]


def test_watch_rewrites_the_nvidia_spec_after_a_gpus_pci_events_once_per_burst(tmp_path: Path) -> None:
    """A hot-removed H100 (no DRM nodes: nvidia-drm is not loaded) sends its PCI device's unbind and remove; with
    the NVSwitches' and within the quiet period, that is one regeneration, and the spec no longer names it."""
    nv = NvidiaWatch(tmp_path)
    uuid = next(g.uuid for g in nv.host.nvidia if g.pci == "0000:52:00.0")
    assert uuid in device_names(nv.spec)
    nv.remove("0000:52:00.0")
    nv.source.add(pci_event("unbind", "0000:52:00.0", *H100), 0.3, pci_event("remove", "0000:52:00.0", *H100), 0.3,
                  pci_event("unbind", "0000:05:00.0", *NVSWITCH), 0.3, pci_event("remove", "0000:05:00.0", *NVSWITCH))
    nv.drain()
    (line,) = nv.regenerations()
    gpu = "/devices/pci0000:52/0000:52:00.0"
    assert f"after 2 uevents (unbind pci {gpu}, remove pci {gpu}): wrote {nv.spec}" in line
    assert uuid not in device_names(nv.spec) and len([n for n in device_names(nv.spec) if n.startswith("GPU-")]) == 3


def test_an_nvswitch_or_an_audio_function_alone_rewrites_nothing(tmp_path: Path) -> None:
    nv = NvidiaWatch(tmp_path)
    before = nv.spec.stat().st_mtime_ns
    nv.source.add(pci_event("remove", "0000:05:00.0", *NVSWITCH), 5.0,
                  pci_event("bind", "0000:86:00.1", *NVIDIA_AUDIO, driver="snd_hda_intel"), 5.0)
    nv.drain()
    assert not nv.regenerations() and not nv.watcher.pending and nv.spec.stat().st_mtime_ns == before
