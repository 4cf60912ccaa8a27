"""A GPU's health from its drivers' own signals (oci_gpu_hook/cluster/health.py): the monitor on fake hosts whose RAS
and AER counters change and whose uevents fire, with its clocks stepped by the test (never slept); `list`'s column; the
device plugin marking those devices Unhealthy to a fake kubelet (and still after its restart, for a wedged GPU);
the DRA driver's taints in the fake API server's
ResourceSlices (appear, hold, go; at once after a restart beside a failing GPU; none where the server keeps none)
and the same state and reason in the health stream.

Rescans are the test's explicit calls (a device plugin's manager runs with an hour's rescan interval; the DRA
driver is stepped), so nothing waits on a clock; waits on the gRPC streams are bounded."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from oci_gpu_hook.cluster.deviceplugin import server
from oci_gpu_hook.cluster.health import (
    Monitor,
    Reads,
    Settings,
    aer_fatal,
    event_gpu,
    ras_uncorrectable,
    resident_monitor,
)
from oci_gpu_hook.cluster.watch import QueueEvents
from oci_gpu_hook.config import Config
from oci_gpu_hook.inventory import scan
from tests.helpers import fakesysfs
from tests.helpers.fakeapiserver import FakeApiServer
from tests.helpers.fakedrakubelet import FakeDraKubelet
from tests.helpers.fakekubelet import FakeKubelet
from tests.test_dra import DRIVER, NODE, _driver, _sockets

KEY = f"{DRIVER}/unhealthy"
AER = "TOTAL_ERR_FATAL"


class Clock:
    """A monotonic clock the test steps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _monitor(clock: Clock, **settings: object) -> Monitor:
    return Monitor(Settings(**settings), clock=clock, wall=lambda: 1_780_000_000.0)  # type: ignore[arg-type]


def _seed(tmp_path: Path) -> tuple[Path, fakesysfs.FakeHost]:
    host = fakesysfs.seed_host()
    return Path(fakesysfs.build(str(tmp_path / "sys"), host)), host


def _wedged(pci: str, value: str = "rebind,bus-reset") -> dict[str, str]:
    """The change uevent drm_dev_wedged_event sends on the GPU's card minor."""
    return {"ACTION": "change", "SUBSYSTEM": "drm", "DEVNAME": "dri/card2", "WEDGED": value,
            "DEVPATH": f"/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/{pci}/drm/card2"}


# --- the signals, read ----------------------------------------------------------------------------------------

def test_ras_counts_are_summed_over_the_blocks_and_aer_read_from_its_total(tmp_path: Path) -> None:
    sysfs, host = _seed(tmp_path)
    gpu = next(sysfs.glob("devices/**/0000:23:00.0"))
    reads = Reads(str(sysfs))
    assert ras_uncorrectable(str(gpu), reads) is None and aer_fatal(str(gpu), reads) is None  # no RAS, no AER
    fakesysfs.set_ras(str(sysfs), host, "0000:23:00.0", ue={"umc": 3, "gfx": 1}, ce={"umc": 40})
    fakesysfs.set_aer_fatal(str(sysfs), host, "0000:23:00.0", 2)
    assert ras_uncorrectable(str(gpu), reads) == (4, ["gfx 1", "umc 3"])
    assert aer_fatal(str(gpu), reads) == 2
    assert reads.bad == {}


def test_a_uevent_names_its_gpu_by_devpath_or_by_its_card() -> None:
    root = str(Path(__file__).resolve().parent.parent / "examples" / "hosts" / "seed-8x-gfx1100" / "sys")
    assert event_gpu(_wedged("0000:23:00.0"), root) == "0000:23:00.0"
    assert event_gpu({"SUBSYSTEM": "drm", "DEVNAME": "dri/card2"}, root) == "0000:23:00.0"
    assert event_gpu({"SUBSYSTEM": "drm", "DEVNAME": "dri/card99"}, root) is None


def _card_event(sysfs: Path, pci: str, **fields: str) -> dict[str, str]:
    """A uevent on the card minor of the GPU ``pci`` of a fake host, with its real DEVPATH there."""
    card = next(sysfs.glob(f"devices/**/{pci}/drm/card*"))
    return {"SUBSYSTEM": "drm", "DEVNAME": f"dri/{card.name}", "DEVPATH": "/" + str(card.relative_to(sysfs)),
            **fields}


def test_only_the_gpus_own_card_or_pci_device_speaks_for_it() -> None:
    root = "/nonexistent"
    gpu = "/devices/pci0000:00/0000:00:01.1/0000:03:00.0"
    assert event_gpu({"SUBSYSTEM": "drm", "DEVPATH": f"{gpu}/drm/card1"}, root) == "0000:03:00.0"
    assert event_gpu({"SUBSYSTEM": "pci", "DEVPATH": gpu}, root) == "0000:03:00.0"
    for below in (f"{gpu}/drm/card1/card1-DP-3", f"{gpu}/drm/card1/card1-DP-3-1", f"{gpu}/drm/renderD128",
                  f"{gpu}/drm/card1x", f"{gpu}/drm", f"{gpu}/i2c-4/drm/card1", f"{gpu}/0000:04:00.0/drm/card9/x"):
        assert event_gpu({"SUBSYSTEM": "drm", "DEVPATH": below}, root) is None, below
    assert event_gpu({"SUBSYSTEM": "pci", "DEVPATH": f"{gpu}/virtfn0"}, root) is None


def test_a_connector_added_below_a_wedged_gpu_does_not_end_the_wedge(tmp_path: Path) -> None:
    """DP-MST adds a connector (``card1-DP-3``) when a monitor is plugged into a hub: no rebind.  Only the card's own
    add, or its PCI device's, ends a wedge."""
    sysfs, _host = _seed(tmp_path)
    inventory = scan(str(sysfs), strict=False)
    monitor = _monitor(Clock())
    monitor.sample(inventory)
    wedge = _card_event(sysfs, "0000:43:00.0", ACTION="change", WEDGED="rebind")
    assert monitor.event(wedge)
    for name in ("card2-DP-3", "card2-DP-3-1"):
        connector = {"ACTION": "add", "SUBSYSTEM": "drm", "DEVPATH": wedge["DEVPATH"] + "/" + name}
        assert not monitor.event(connector)
    render = {"ACTION": "add", "SUBSYSTEM": "drm", "DEVPATH": wedge["DEVPATH"].rpartition("/")[0] + "/renderD130"}
    assert not monitor.event(render)
    assert not monitor.sample(inventory)["0000:43:00.0"].healthy
    assert monitor.event({k: v for k, v in wedge.items() if k != "WEDGED"} | {"ACTION": "add"})  # the card's own
    assert monitor.sample(inventory)["0000:43:00.0"].healthy


def test_a_wedge_seen_before_the_first_sample_is_marked_and_cleared_by_a_rebind_while_down(tmp_path: Path) -> None:
    """The uevent may come before the monitor's first sample (a plugin just started): the mark comes from the PCI
    device's drm directory all the same, so a restart keeps the wedge, and a restart after a rebind ends it."""
    host = fakesysfs.seed_host()
    sysfs = Path(fakesysfs.build(str(tmp_path / "sys"), host))
    state = tmp_path / "state" / "health.json"
    logs: list[str] = []

    def monitor() -> Monitor:
        return Monitor(Settings(), str(sysfs), clock=Clock(), state_file=str(state), log=logs.append)

    first = monitor()
    assert first.event(_card_event(sysfs, "0000:a3:00.0", ACTION="change", WEDGED="bus-reset"))
    saved = json.loads(state.read_text())["wedged"]["0000:a3:00.0"]
    assert saved["methods"] == "bus-reset" and isinstance(saved["drm"], list) and len(saved["drm"]) == 2
    assert not monitor().sample(scan(str(sysfs), strict=False))["0000:a3:00.0"].healthy  # kept across a restart
    shutil.rmtree(sysfs)
    fakesysfs.build(str(sysfs), host)  # rebound while down: its drm directory is another one
    assert monitor().sample(scan(str(sysfs), strict=False))["0000:a3:00.0"].healthy
    assert json.loads(state.read_text()) == {"wedged": {}}
    assert logs == []


def test_a_saved_wedge_without_a_mark_is_dropped_with_one_line(tmp_path: Path) -> None:
    """A state file from before the mark was always taken (``"drm": null``) would pin the GPU Unhealthy forever:
    nothing could ever show the rebind that ends it.  Dropped, and said."""
    sysfs, _host = _seed(tmp_path)
    state = tmp_path / "state" / "health.json"
    state.parent.mkdir(mode=0o700)
    state.write_text(json.dumps({"wedged": {"0000:23:00.0": {"methods": "rebind", "drm": None},
                                            "0000:43:00.0": {"methods": "rebind", "drm": [1, True]}}}))
    logs: list[str] = []
    monitor = Monitor(Settings(), str(sysfs), clock=Clock(), state_file=str(state), log=logs.append)
    assert all(v.healthy for v in monitor.sample(scan(str(sysfs), strict=False)).values())
    assert logs == [f"health state {state}: the wedge of 0000:23:00.0 has no mark of its drm directory, so a rebind "
                    "meanwhile cannot be told: dropped",
                    f"health state {state}: the wedge of 0000:43:00.0 has no mark of its drm directory, so a rebind "
                    "meanwhile cannot be told: dropped"]


@pytest.mark.parametrize("kind", ["others-writable", "dir-foreign", "fifo", "directory"])
def test_a_state_file_that_could_steer_the_monitor_is_not_read(tmp_path: Path, kind: str) -> None:
    """The state file is read by the config's trust rule and as a regular file: one written by someone else (or
    that such a one could swap) pins no taint, a FIFO does not block the start; one line says which and why."""
    sysfs, _host = _seed(tmp_path)
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    state = state_dir / "health.json"
    wedged = json.dumps({"wedged": {"0000:23:00.0": {"methods": "rebind", "drm": [1, 2]}}})
    if kind == "fifo":
        os.mkfifo(state, 0o600)
    elif kind == "directory":
        state.mkdir()
    else:
        state.write_text(wedged)
        state.chmod(0o666 if kind == "others-writable" else 0o600)
        if kind == "dir-foreign":
            os.chown(state_dir, 4321, 4321)
    logs: list[str] = []
    made: list[Monitor] = []
    thread = threading.Thread(target=lambda: made.append(Monitor(Settings(), str(sysfs), state_file=str(state),
                                                                 log=logs.append)), daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the monitor blocked on its state file"
    (monitor,) = made
    assert monitor.wedged == {} and len(logs) == 1, logs
    assert logs[0].startswith(f"health state {state} ") and logs[0].endswith("starting without the wedges it held")
    why = {"others-writable": "writable by", "dir-foreign": "owned by", "fifo": "not a regular file",
           "directory": "Is a directory"}[kind]
    assert why in logs[0], logs


# --- counter files that are no counters ------------------------------------------------------------------------

def test_counter_files_that_are_no_counters_count_nothing_and_are_said_once_each(tmp_path: Path) -> None:
    """Each is read within the sysfs root, non-blocking, as a regular file of at most a few KiB: a FIFO, a file of
    256 MiB, a symlink out of the root, garbage.  None counts; one line each, said again only when it changes."""
    sysfs, host = _seed(tmp_path)
    inventory = scan(str(sysfs), strict=False)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "umc_err_count").write_text("ue: 99\nce: 0\n")
    (outside / "aer_dev_fatal").write_text(f"{AER} 7\n")
    gpus = {pci: next(sysfs.glob(f"devices/**/{pci}")) for pci in ("0000:03:00.0", "0000:23:00.0", "0000:43:00.0",
                                                                   "0000:63:00.0", "0000:83:00.0")}
    fakesysfs.set_ras(str(sysfs), host, "0000:03:00.0", ue={})
    fifo = gpus["0000:03:00.0"] / "ras" / "umc_err_count"
    fifo.unlink()
    os.mkfifo(fifo)
    big = gpus["0000:23:00.0"] / "aer_dev_fatal"
    with big.open("wb") as handle:
        handle.truncate(256 << 20)  # sparse: 256 MiB to read, none on disk
    (gpus["0000:43:00.0"] / "aer_dev_fatal").symlink_to(outside / "aer_dev_fatal")
    (gpus["0000:63:00.0"] / "ras").symlink_to(outside)
    fakesysfs.set_ras(str(sysfs), host, "0000:83:00.0", ue={})
    garbage = gpus["0000:83:00.0"] / "ras" / "gfx_err_count"
    garbage.write_text("Query currently inaccessible\n")
    logs: list[str] = []
    monitor = Monitor(Settings(), str(sysfs), clock=Clock(), log=logs.append)
    done: list[dict[str, object]] = []
    thread = threading.Thread(target=lambda: done.append(monitor.sample(inventory)), daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the sample blocked"
    assert all(v.healthy for v in done[0].values())  # type: ignore[attr-defined]
    assert sorted(logs) == sorted([
        f"health: {fifo} not read as a counter: it is a fifo, not a regular file; it counts nothing until it reads",
        f"health: {big} not read as a counter: it holds more than 8192 bytes, more than any counter shows; it counts "
        "nothing until it reads",
        f"health: {gpus['0000:43:00.0']}/aer_dev_fatal not read as a counter: it is a symlink, not a regular file; it "
        "counts nothing until it reads",
        f"health: {gpus['0000:63:00.0']}/ras not read as a counter: it is a symlink; it counts nothing until it reads",
        f"health: {garbage} not read as a counter: no 'ue: N' line in 'Query currently inaccessible'; it counts "
        "nothing until it reads"]), logs
    monitor.sample(inventory)
    assert len(logs) == 5  # said once
    garbage.write_text("ue: 0\nce: 0\n")
    monitor.sample(inventory)
    assert len(logs) == 5
    garbage.write_text("ue: -1\n")
    monitor.sample(inventory)
    assert logs[5:] == [f"health: {garbage} not read as a counter: no 'ue: N' line in 'ue: -1'; it counts nothing "
                        "until it reads"]


def test_list_says_a_counter_file_that_is_no_counter_on_stderr(tmp_path: Path) -> None:
    sysfs, host = _seed(tmp_path)
    fakesysfs.set_aer_fatal(str(sysfs), host, "0000:23:00.0", 0)
    aer = next(sysfs.glob("devices/**/0000:23:00.0")) / "aer_dev_fatal"
    aer.write_text("TOTAL_ERR_FATAL lots\n")
    done = subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", "--sysfs-root", str(sysfs), "list"],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={"PATH": "/usr/bin:/bin", "OCI_GPU_HOOK_CONFIG": "/dev/null"})
    assert done.returncode == 0, done.stderr
    assert done.stderr == (f"warning: health: {aer} not read as a counter: no 'TOTAL_ERR_FATAL N' line in "
                           "'TOTAL_ERR_FATAL lots'; it counts nothing until it reads\n")


def test_a_gpu_directory_reached_through_a_symlink_is_read_inside_the_sysfs_root(tmp_path: Path) -> None:
    """``bus/pci/devices/<address>`` is a symlink: resolved inside the root (an absolute one too), never out of it."""
    sysfs, host = _seed(tmp_path)
    fakesysfs.set_aer_fatal(str(sysfs), host, "0000:23:00.0", 3)
    gpu = next(sysfs.glob("devices/**/0000:23:00.0"))
    (sysfs / "bus" / "pci" / "devices").mkdir(parents=True)
    inside = sysfs / "bus" / "pci" / "devices" / "0000:23:00.0"
    inside.symlink_to(os.path.relpath(gpu, inside.parent))
    reads = Reads(str(sysfs))
    assert aer_fatal(str(inside), reads) == 3
    escape = sysfs / "bus" / "pci" / "devices" / "0000:43:00.0"
    escape.symlink_to(gpu)  # absolute: taken as a path inside the root, where there is none
    assert aer_fatal(str(escape), reads) is None and reads.bad == {}
    assert aer_fatal(str(tmp_path / "elsewhere"), reads) is None
    assert reads.bad == {str(tmp_path / "elsewhere"): f"it is outside the sysfs root {sysfs}"}
    loop = sysfs / "bus" / "pci" / "devices" / "0000:63:00.0"
    loop.symlink_to("0000:63:00.0")
    assert aer_fatal(str(loop), reads) is None
    assert reads.bad[str(loop)] == (f"it cannot be reached inside the sysfs root {sysfs} (Too many levels of "
                                    "symbolic links)")


def test_a_fifo_in_sysfs_never_blocks_the_device_plugins_scan(plugin: tuple) -> None:  # type: ignore[type-arg]
    """The scanning thread reads every GPU's counters and nodes: a FIFO at one of them (held open by a writer, or
    not) leaves its rescans, and so every Allocate, as quick as before."""
    sysfs, _host, kubelet, tracker, _clock, _events = plugin
    gpu = next(sysfs.glob("devices/**/0000:c3:00.0"))
    os.mkfifo(gpu / "aer_dev_fatal")
    dev = next(gpu.glob("drm/card*")) / "dev"
    dev.unlink()
    os.mkfifo(dev)
    writer = os.open(dev, os.O_RDWR)  # a writer that never writes: a blocking read would wait forever
    try:
        thread = threading.Thread(target=tracker.rescan, args=("test",), daemon=True)
        thread.start()
        thread.join(30)
        assert not thread.is_alive(), "the rescan blocked on a FIFO"
        (answer,) = kubelet.allocate("amd.com/gpu", ["0000:03:00.0"]).container_responses
        assert [c.name for c in answer.cdi_devices] == ["amd.com/gpu=0000:03:00.0"]
    finally:
        os.close(writer)


# --- the monitor over time --------------------------------------------------------------------------------------

def test_a_count_above_the_start_threshold_is_unhealthy_at_the_first_read(tmp_path: Path) -> None:
    sysfs, host = _seed(tmp_path)
    fakesysfs.set_ras(str(sysfs), host, "0000:23:00.0", ue={"umc": 2})
    fakesysfs.set_ras(str(sysfs), host, "0000:43:00.0", ue={})
    verdicts = _monitor(Clock()).sample(scan(str(sysfs), strict=False))
    assert len(verdicts) == 8
    bad = verdicts["0000:23:00.0"]
    assert (bad.healthy, bad.signal) == (False, "ras-uncorrectable")
    assert bad.reason.startswith("amdgpu RAS: 2 uncorrectable errors (umc 2; ") and "/ras/*_err_count" in bad.reason
    assert all(v.healthy for pci, v in verdicts.items() if pci != "0000:23:00.0")
    lenient = _monitor(Clock(), ue_start=2).sample(scan(str(sysfs), strict=False))
    assert lenient["0000:23:00.0"].healthy  # 2 is not above 2


def test_a_rising_count_holds_for_the_hold_time_and_a_flapping_one_keeps_it(tmp_path: Path) -> None:
    sysfs, host = _seed(tmp_path)
    clock = Clock()
    monitor = _monitor(clock, ue_start=10, ue_rise=1, hold=300)
    inventory = scan(str(sysfs), strict=False)
    fakesysfs.set_ras(str(sysfs), host, "0000:63:00.0", ue={"umc": 5})
    assert monitor.sample(inventory)["0000:63:00.0"].healthy  # 5 at start: not above 10
    fakesysfs.set_ras(str(sysfs), host, "0000:63:00.0", ue={"umc": 6})
    assert monitor.sample(inventory)["0000:63:00.0"].healthy  # one more: not more than 1
    fakesysfs.set_ras(str(sysfs), host, "0000:63:00.0", ue={"umc": 6, "sdma": 2})
    clock.now += 10
    first = monitor.sample(inventory)["0000:63:00.0"]
    assert (first.healthy, first.signal) == (False, "ras-uncorrectable")
    assert first.reason.startswith("amdgpu RAS: 2 new (8 in all) uncorrectable errors (sdma 2, umc 6; ")
    clock.now += 299
    assert not monitor.sample(inventory)["0000:63:00.0"].healthy  # no new errors, but within the hold
    fakesysfs.set_ras(str(sysfs), host, "0000:63:00.0", ue={"umc": 9, "sdma": 2})  # it flaps: the hold starts again
    clock.now += 200
    again = monitor.sample(inventory)["0000:63:00.0"]
    assert not again.healthy and again.since == first.since  # one Unhealthy spell, not two
    clock.now += 299
    assert not monitor.sample(inventory)["0000:63:00.0"].healthy
    clock.now += 1
    assert monitor.sample(inventory)["0000:63:00.0"].healthy
    fakesysfs.set_ras(str(sysfs), host, "0000:63:00.0", ue={})  # the driver reloaded: counting from 0 is no rise
    assert monitor.sample(inventory)["0000:63:00.0"].healthy


def test_pcie_fatal_errors_count_for_any_vendor(tmp_path: Path) -> None:
    host = fakesysfs.nvidia_h100_host()
    sysfs = Path(fakesysfs.build_all(str(tmp_path / "sys"), host))
    inventory = scan(str(sysfs), ["nvidia"], strict=False, proc_root=str(tmp_path / "proc"))
    monitor = _monitor(Clock())
    fakesysfs.set_aer_fatal(str(sysfs), host, "0000:52:00.0", 0)
    assert all(v.healthy for v in monitor.sample(inventory).values())
    fakesysfs.set_aer_fatal(str(sysfs), host, "0000:52:00.0", 1)
    verdict = monitor.sample(inventory)["0000:52:00.0"]
    assert (verdict.healthy, verdict.signal) == (False, "pcie-fatal")
    assert verdict.reason.startswith("PCIe AER: 1 new (1 in all) fatal errors (") and "aer_dev_fatal" in verdict.reason


def test_a_wedged_uevent_holds_until_the_device_recovers_and_partitions_share_it(tmp_path: Path) -> None:
    host = fakesysfs.mi300x_host("CPX")
    sysfs = Path(fakesysfs.build(str(tmp_path / "sys"), host))
    inventory = scan(str(sysfs), strict=False)
    monitor = _monitor(Clock(), hold=300)
    monitor.sample(inventory)
    assert monitor.event(_wedged("0000:26:00.0"))
    monitor.sample(inventory)
    states = {d.drm_name: monitor.verdict_for(d) for d in inventory.devices("amd")}
    wedged = [name for name, v in states.items() if not v.healthy]
    assert len(wedged) == 8 and all(states[n].signal == "wedged" for n in wedged)
    assert states[wedged[0]].reason == "the driver declared it wedged (uevent WEDGED=rebind,bus-reset: a reset failed)"
    monitor.sample(inventory)
    assert not monitor.verdict("0000:26:00.0").healthy  # held while it lasts, whatever the hold time
    assert not monitor.event({"ACTION": "change", "SUBSYSTEM": "drm", "DEVPATH": "/devices/platform/x/drm/card3"})
    assert monitor.event({"ACTION": "bind", "SUBSYSTEM": "pci", "DEVPATH": "/devices/pci0000:20/0000:26:00.0"})
    assert monitor.sample(inventory)["0000:26:00.0"].healthy  # rebound: at once
    monitor.event(_wedged("0000:05:00.0", "vendor-specific"))
    assert not monitor.sample(inventory)["0000:05:00.0"].healthy
    assert monitor.event(_wedged("0000:05:00.0", "none"))  # WEDGED=none: the driver recovered it itself
    assert monitor.sample(inventory)["0000:05:00.0"].healthy


def test_a_gpu_whose_kfd_nodes_vanish_while_its_pci_device_stays_is_unhealthy_then_back(tmp_path: Path) -> None:
    sysfs, host = _seed(tmp_path)
    monitor = _monitor(Clock())
    monitor.sample(scan(str(sysfs), strict=False))
    backup = tmp_path / "backup"
    shutil.copytree(sysfs, backup, symlinks=True)
    fakesysfs.remove_kfd_nodes(str(sysfs), "0000:a3:00.0")
    verdict = monitor.sample(scan(str(sysfs), strict=False))["0000:a3:00.0"]
    assert (verdict.healthy, verdict.signal) == (False, "vanished")
    assert verdict.reason == ("its devices are gone while its PCI device 0000:a3:00.0 stays (renderD133 has no KFD "
                              "topology node: not a valid compute device or partition in this mode (it would open "
                              "with ENOENT))")
    shutil.rmtree(sysfs)
    shutil.copytree(backup, sysfs, symlinks=True)  # the driver reloaded
    assert monitor.sample(scan(str(sysfs), strict=False))["0000:a3:00.0"].healthy
    fakesysfs.remove_gpu(str(sysfs), host, "0000:a3:00.0")  # gone from the host: forgotten, no verdict
    assert "0000:a3:00.0" not in monitor.sample(scan(str(sysfs), strict=False))


def test_a_gpu_the_nvidia_driver_excludes_is_unhealthy_with_the_drivers_word(tmp_path: Path) -> None:
    host = fakesysfs.nvidia_h100_host()
    sysfs = Path(fakesysfs.build_all(str(tmp_path / "sys"), host))
    proc = tmp_path / "proc"
    monitor = _monitor(Clock())
    monitor.sample(scan(str(sysfs), ["nvidia"], strict=False, proc_root=str(proc)))
    information = proc / "driver" / "nvidia" / "gpus" / "0000:1b:00.0" / "information"
    information.write_text(information.read_text().replace("GPU Excluded:\t No", "GPU Excluded:\t Yes"))
    verdict = monitor.sample(scan(str(sysfs), ["nvidia"], strict=False, proc_root=str(proc)))["0000:1b:00.0"]
    assert (verdict.healthy, verdict.signal) == (False, "vanished")
    assert verdict.reason.endswith("(excluded by the driver (GPU Excluded: Yes))")


def test_list_shows_each_devices_health_with_its_reason(tmp_path: Path) -> None:
    sysfs, host = _seed(tmp_path)
    fakesysfs.set_ras(str(sysfs), host, "0000:43:00.0", ue={"umc": 1})
    done = subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", "--sysfs-root", str(sysfs), "list"],
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin",
                                                                             "OCI_GPU_HOOK_CONFIG": "/dev/null"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[-1] == "HEALTH"
    rows = {line.split()[2]: line for line in lines[1:9]}
    assert rows["0000:43:00.0"].endswith("Unhealthy: amdgpu RAS: 1 uncorrectable errors (umc 1; "
                                         f"{next(sysfs.glob('devices/**/0000:43:00.0'))}/ras/*_err_count)")
    assert all(row.endswith("Healthy") for pci, row in rows.items() if pci != "0000:43:00.0")


def test_inspect_names_an_unhealthy_gpus_nodes_with_its_health(tmp_path: Path) -> None:
    from oci_gpu_hook.entry.commands.inspect import device_names

    sysfs, host = _seed(tmp_path)
    fakesysfs.set_ras(str(sysfs), host, "0000:43:00.0", ue={"sdma": 2})
    names = device_names(Config(sysfs_root=str(sysfs)))
    assert names[("c", 226, 130)].startswith("amd 2 /dev/dri/renderD130 (0000:43:00.0); Unhealthy: amdgpu RAS: 2 "
                                             "uncorrectable errors (sdma 2; ")
    assert names[("c", 226, 129)] == "amd 1 /dev/dri/renderD129 (0000:23:00.0)"


def test_the_device_plugins_list_shows_each_devices_health(tmp_path: Path) -> None:
    sysfs, host = _seed(tmp_path)
    fakesysfs.set_aer_fatal(str(sysfs), host, "0000:83:00.0", 3)
    done = subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", "--sysfs-root", str(sysfs), "device-plugin",
                           "--list"], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "OCI_GPU_HOOK_CONFIG": "/dev/null"})
    assert done.returncode == 0, done.stderr
    rows = {line.split()[1]: line for line in done.stdout.splitlines()}
    assert rows["0000:83:00.0"].endswith("hive -  Unhealthy: PCIe AER: 3 fatal errors "
                                         f"({next(sysfs.glob('devices/**/0000:83:00.0'))}/aer_dev_fatal)")
    assert rows["0000:03:00.0"].endswith("hive -  Healthy")


# --- the device plugin ---------------------------------------------------------------------------------------

@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[tuple[Path, fakesysfs.FakeHost, FakeKubelet, server.Tracker, Clock,
                                             QueueEvents]]:
    sysfs, host = _seed(tmp_path)
    kubelet = FakeKubelet(str(tmp_path / "device-plugins"))
    kubelet.start()
    clock, events = Clock(), QueueEvents()
    tracker = server.Tracker(str(sysfs), "single", log=lambda _line: None, monitor=_monitor(clock, hold=60))
    manager = server.Manager(str(tmp_path / "device-plugins"), tracker, rescan_interval=3600, poll_interval=0.05,
                             log=lambda _line: None, events=events, uevent_delay=3600)
    thread = threading.Thread(target=manager.run, daemon=True)
    thread.start()
    try:
        kubelet.devices("amd.com/gpu", lambda d: len(d) == 8)
        yield sysfs, host, kubelet, tracker, clock, events
    finally:
        manager.stop()
        thread.join(10)
        kubelet.stop()
        assert not thread.is_alive()


def test_the_device_plugin_marks_a_failing_gpu_unhealthy_and_healthy_again(plugin: tuple) -> None:  # type: ignore[type-arg]
    sysfs, host, kubelet, tracker, clock, _events = plugin
    fakesysfs.set_ras(str(sysfs), host, "0000:c3:00.0", ue={})
    tracker.rescan("test")  # the first read: none
    fakesysfs.set_ras(str(sysfs), host, "0000:c3:00.0", ue={"gfx": 1})
    tracker.rescan("test")
    devices = kubelet.devices("amd.com/gpu", lambda d: d["0000:c3:00.0"].health == "Unhealthy")
    assert [i for i, d in devices.items() if d.health == "Unhealthy"] == ["0000:c3:00.0"]
    with pytest.raises(grpc.RpcError) as caught:
        kubelet.allocate("amd.com/gpu", ["0000:c3:00.0"])
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "is Unhealthy, amdgpu RAS: 1 new (1 in all) uncorrectable errors (gfx 1; " in caught.value.details()
    clock.now += 59
    tracker.rescan("test")
    assert kubelet.devices("amd.com/gpu")["0000:c3:00.0"].health == "Unhealthy"
    clock.now += 1
    tracker.rescan("test")
    kubelet.devices("amd.com/gpu", lambda d: d["0000:c3:00.0"].health == "Healthy")
    (answer,) = kubelet.allocate("amd.com/gpu", ["0000:c3:00.0"]).container_responses
    assert [c.name for c in answer.cdi_devices] == ["amd.com/gpu=0000:c3:00.0"]  # the same name, in service again


def test_the_device_plugin_takes_a_wedged_uevent_from_its_listener(plugin: tuple) -> None:  # type: ignore[type-arg]
    _sysfs, _host, kubelet, tracker, _clock, events = plugin
    events.put(_wedged("0000:83:00.0"))
    # the manager's listener hands it to the monitor; the next rescan (the test's) publishes it
    kubelet.wait(lambda: tracker.monitor.wedged, 10, "the monitor to take the uevent")
    tracker.rescan("test")
    kubelet.devices("amd.com/gpu", lambda d: d["0000:83:00.0"].health == "Unhealthy")
    events.put({"ACTION": "bind", "SUBSYSTEM": "pci", "DEVPATH": "/devices/pci0000:80/0000:83:00.0",
                "PCI_ID": "1002:744B", "PCI_CLASS": "30000"})
    kubelet.wait(lambda: not tracker.monitor.wedged, 10, "the monitor to take the rebind")
    tracker.rescan("test")
    kubelet.devices("amd.com/gpu", lambda d: d["0000:83:00.0"].health == "Healthy")


def test_a_wedge_outlives_a_restart_of_the_device_plugin(tmp_path: Path) -> None:
    """The wedge a uevent brought is kept in the plugin's state directory (the command's default, inside the
    kubelet's directory, which a starting kubelet leaves): the restarted plugin, the real command that never saw the
    uevent, advertises the GPU Unhealthy in its first list; the driver's recovery uevent makes it Healthy again,
    under the same name, to a plugin restarted once more; one restarted after a rebind while it was down is
    Healthy at once."""
    sysfs, host = _seed(tmp_path)
    plugins = tmp_path / "device-plugins"
    state = plugins / "oci-gpu-hook"
    kubelet = FakeKubelet(str(plugins))
    kubelet.start()
    config = Config(sysfs_root=str(sysfs))
    logs: list[str] = []

    def in_process() -> tuple[server.Manager, threading.Thread, QueueEvents]:
        events = QueueEvents()
        tracker = server.Tracker(str(sysfs), "single", log=logs.append,
                                 monitor=resident_monitor(config, str(state), logs.append))
        manager = server.Manager(str(plugins), tracker, rescan_interval=3600, poll_interval=0.05,
                                 log=logs.append, events=events, uevent_delay=0.05)
        thread = threading.Thread(target=manager.run, daemon=True)
        thread.start()
        return manager, thread, events

    def stop(manager: server.Manager, thread: threading.Thread) -> None:
        manager.stop()
        thread.join(10)
        assert not thread.is_alive()

    def first_list(old: object) -> dict[str, object]:
        """The first device list of the plugin that registered after ``old`` (the one before)."""
        def new() -> object:
            found = kubelet.plugins.get("amd.com/gpu")
            return found if found is not None and found is not old else None

        plugin = kubelet.wait(new, 30, "a new registration")
        kubelet.wait(lambda: plugin.lists, 30, "its first list")  # type: ignore[attr-defined]
        return {d.ID: d.health for d in plugin.lists[0]}  # type: ignore[attr-defined]

    try:
        manager, thread, events = in_process()
        assert set(first_list(None).values()) == {"Healthy"}
        events.put(_wedged("0000:83:00.0"))  # the manager's listener hands it to the monitor, and rescans soon
        kubelet.devices("amd.com/gpu", lambda d: d["0000:83:00.0"].health == "Unhealthy")
        assert json.loads((state / "health.json").read_text())["wedged"]["0000:83:00.0"]["methods"] == (
            "rebind,bus-reset")
        old = kubelet.plugins["amd.com/gpu"]
        stop(manager, thread)
        kubelet.restart()  # a kubelet starting meanwhile removes the sockets, not the state directory
        process = subprocess.Popen(
            [sys.executable, "-m", "oci_gpu_hook.entry.cli", "--sysfs-root", str(sysfs), "device-plugin",
             "--kubelet-dir", str(plugins), "--no-uevents", "--no-cdi-specs"], cwd=REPO, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin", "OCI_GPU_HOOK_CONFIG": "/dev/null"})
        try:
            health = first_list(old)
            assert [i for i, h in health.items() if h != "Healthy"] == ["0000:83:00.0"]  # at once, no uevent
            old = kubelet.plugins["amd.com/gpu"]
        finally:
            process.send_signal(signal.SIGTERM)
            _out, err = process.communicate(timeout=30)
        assert process.returncode == 0 and "Traceback" not in err, err
        assert "amd.com/gpu 0000:83:00.0 (CDI amd.com/gpu=0000:83:00.0) Unhealthy (the driver declared it wedged" in err
        manager, thread, events = in_process()
        assert first_list(old)["0000:83:00.0"] == "Unhealthy"
        events.put(_wedged("0000:83:00.0", "none"))  # the driver recovered it
        kubelet.devices("amd.com/gpu", lambda d: d["0000:83:00.0"].health == "Healthy")
        (answer,) = kubelet.allocate("amd.com/gpu", ["0000:83:00.0"]).container_responses
        assert [c.name for c in answer.cdi_devices] == ["amd.com/gpu=0000:83:00.0"]  # the same name, in service
        assert json.loads((state / "health.json").read_text()) == {"wedged": {}}
        events.put(_wedged("0000:83:00.0"))  # wedged again; then rebound while no plugin runs
        kubelet.devices("amd.com/gpu", lambda d: d["0000:83:00.0"].health == "Unhealthy")
        old = kubelet.plugins["amd.com/gpu"]
        stop(manager, thread)
        shutil.rmtree(sysfs)
        fakesysfs.build(str(sysfs), host)  # its drm directory is another one now
        manager, thread, events = in_process()
        assert set(first_list(old).values()) == {"Healthy"}
        stop(manager, thread)
    finally:
        kubelet.stop()
    assert not any("health state" in line for line in logs), logs


# --- the DRA driver: taints and the health stream -----------------------------------------------------------------

class Dra:
    def __init__(self, tmp: Path, host: fakesysfs.FakeHost, clock: Clock, before: object = None,
                 settings: dict[str, object] | None = None, **server: object) -> None:
        self.tmp, self.host, self.clock = tmp, host, clock
        self.sysfs = Path(fakesysfs.build(str(tmp / "sys"), host))
        if callable(before):
            before(self)
        (tmp / "cdi").mkdir(exist_ok=True)
        self.api = FakeApiServer(tmp, **{"kubernetes": (1, 36), **server})  # type: ignore[arg-type]
        self.api.state.nodes[NODE] = {"kind": "Node", "metadata": {"name": NODE, "uid": "node-uid-1"}}
        self.logs: list[str] = []
        self.driver = _driver(self.tmp, self.sysfs, self.api, self.logs,
                              monitor=_monitor(self.clock, **{"hold": 60, **(settings or {})}))
        self.driver.step()

    def devices(self) -> dict[str, dict[str, object]]:
        return {d["name"]: d for s in self.api.slices() for d in s["spec"].get("devices", [])}

    def taints(self) -> dict[str, list[dict[str, str]]]:
        return {name: d["taints"] for name, d in self.devices().items() if d.get("taints")}  # type: ignore[misc]

    def close(self) -> None:
        self.driver.sockets.stop()  # type: ignore[attr-defined]
        self.api.close()
        shutil.rmtree(_sockets(self.tmp), ignore_errors=True)


@pytest.fixture
def dra(tmp_path: Path) -> Iterator[Dra]:
    rig = Dra(tmp_path, fakesysfs.mi300x_host("CPX"), Clock())
    try:
        yield rig
    finally:
        rig.close()


def test_a_failing_gpu_is_tainted_then_held_then_untainted_under_the_same_names(dra: Dra) -> None:
    assert dra.taints() == {} and len(dra.devices()) == 18  # two split GPUs: each whole and its 8 parts
    fakesysfs.set_ras(str(dra.sysfs), dra.host, "0000:26:00.0", ue={"umc": 1})
    dra.driver.step()
    taints = dra.taints()
    names = sorted(n for n in dra.devices() if n.startswith("gpu-0000-26"))
    assert sorted(taints) == names and len(names) == 9  # the whole GPU and every partition
    assert {json.dumps(t) for t in taints.values()} == {json.dumps([
        {"key": KEY, "value": "ras-uncorrectable", "effect": "NoSchedule", "timeAdded": "2026-05-28T20:26:40Z"}])}
    generation = dra.api.slices()[0]["spec"]["pool"]["generation"]
    writes = len(dra.api.writes())
    dra.clock.now += 59
    dra.driver.step()  # within the hold: nothing written
    assert len(dra.api.writes()) == writes and sorted(dra.taints()) == names
    dra.clock.now += 1
    dra.driver.step()
    assert dra.taints() == {} and sorted(n for n in dra.devices() if n.startswith("gpu-0000-26")) == names
    assert dra.api.slices()[0]["spec"]["pool"]["generation"] > generation


def test_the_health_stream_carries_the_same_state_and_reason(dra: Dra) -> None:
    from oci_gpu_hook.cluster.dra import health_v1alpha1_pb2 as health

    kubelet = FakeDraKubelet(str(_sockets(dra.tmp) / "registry"))
    try:
        kubelet.discover()
        stream = kubelet.watch_health()
        first = next(stream)  # type: ignore[call-overload]
        assert {d.health for d in first.devices} == {health.HEALTHY}
        dra.driver.observe(_wedged("0000:05:00.0"))
        dra.driver.step()
        second = next(stream)  # type: ignore[call-overload]
        state = {d.device.device_name: (d.health, d.message) for d in second.devices}
        reason = "the driver declared it wedged (uevent WEDGED=rebind,bus-reset: a reset failed)"
        assert state["gpu-0000-05-00-0-p3"] == (health.UNHEALTHY, reason)
        assert state["gpu-0000-26-00-0-p3"] == (health.HEALTHY, "")
        assert {v for k, v in state.items() if k.startswith("gpu-0000-05")} == {(health.UNHEALTHY, reason)}
        assert dra.taints()["gpu-0000-05-00-0-p3"][0]["value"] == "wedged"
        stream.cancel()  # type: ignore[attr-defined]
    finally:
        kubelet.close()


def test_noexecute_for_the_signals_the_operator_names(tmp_path: Path) -> None:
    dra = Dra(tmp_path, fakesysfs.mi300x_host("CPX"), Clock(), settings={"noexecute": ("wedged",)})
    try:
        _noexecute(dra)
    finally:
        dra.close()


def _noexecute(dra: Dra) -> None:
    dra.driver.observe(_wedged("0000:05:00.0"))
    fakesysfs.set_ras(str(dra.sysfs), dra.host, "0000:26:00.0", ue={"umc": 1})
    dra.driver.step()
    effects = {name: t[0]["effect"] for name, t in dra.taints().items()}
    assert {e for n, e in effects.items() if n.startswith("gpu-0000-05")} == {"NoExecute"}
    assert {e for n, e in effects.items() if n.startswith("gpu-0000-26")} == {"NoSchedule"}


def test_a_driver_restarted_beside_a_failing_gpu_taints_it_at_once(tmp_path: Path) -> None:
    def failing(rig: Dra) -> None:
        fakesysfs.set_ras(str(rig.sysfs), rig.host, "0000:23:00.0", ue={"umc": 4})

    rig = Dra(tmp_path, fakesysfs.seed_host(), Clock(), before=failing)
    try:
        (published,) = rig.api.slices()
        assert published["spec"]["pool"]["generation"] == 1  # the first write already has it
        assert {n: t[0]["value"] for n, t in rig.taints().items()} == {"gpu-0000-23-00-0": "ras-uncorrectable"}
    finally:
        rig.close()


@pytest.mark.parametrize(("server_options", "said"), [
    ({"kubernetes": (1, 32)}, "Kubernetes 1.32: no device taints in the slices (they need 1.33 or later with "
                              "DRADeviceTaints); an unhealthy device is reported in the health stream only"),
    ({"kubernetes": None}, "an API server of no known version: no device taints in the slices (they need 1.33 or "
                           "later with DRADeviceTaints); an unhealthy device is reported in the health stream only"),
    ({"kubernetes": (1, 35), "device_taints": False},
     "the API server dropped the device taints (DRADeviceTaints is off): an unhealthy device is reported in the "
     "health stream only"),
])
def test_a_server_without_taints_gets_none_and_it_is_said_once(tmp_path: Path, server_options: dict[str, object],
                                                               said: str) -> None:
    rig = Dra(tmp_path, fakesysfs.seed_host(), Clock(), **server_options)
    try:
        for ue in (1, 2, 3):
            fakesysfs.set_ras(str(rig.sysfs), rig.host, "0000:23:00.0", ue={"umc": ue})
            rig.driver.step()
        assert rig.taints() == {} and len(rig.devices()) == 8
        assert [line for line in rig.logs if "taints" in line] == [said]
        assert not any(line.startswith("publishing ResourceSlices failed") for line in rig.logs), rig.logs
        assert not rig.driver.health["gpu-0000-23-00-0"][0]  # type: ignore[attr-defined]
    finally:
        rig.close()


def test_a_gpu_whose_nodes_vanish_stays_published_tainted_and_a_prepare_is_refused(dra: Dra) -> None:
    backup = dra.tmp / "backup"
    shutil.copytree(dra.sysfs, backup, symlinks=True)
    fakesysfs.remove_kfd_nodes(str(dra.sysfs), "0000:05:00.0")
    dra.driver.step()
    taints = dra.taints()
    assert len(dra.devices()) == 18 and sorted(taints) == sorted(n for n in dra.devices() if "0000-05" in n)
    assert {t[0]["value"] for t in taints.values()} == {"vanished"}
    dra.api.add_claim("default", "c", "uid-1", [{"request": "gpu", "driver": DRIVER, "pool": NODE,
                                                "device": "gpu-0000-05-00-0-p2"}])
    kubelet = FakeDraKubelet(str(_sockets(dra.tmp) / "registry"))
    try:
        kubelet.discover()
        error = kubelet.prepare(("default", "c", "uid-1")).claims["uid-1"].error  # type: ignore[attr-defined]
        assert error.startswith(f"claim default/c: device gpu-0000-05-00-0-p2 is not on node {NODE} now (gone")
    finally:
        kubelet.close()
    shutil.rmtree(dra.sysfs)
    shutil.copytree(backup, dra.sysfs, symlinks=True)  # the driver reloaded: back, untainted, same names
    dra.driver.step()
    assert dra.taints() == {} and len(dra.devices()) == 18
    fakesysfs.remove_gpu(str(dra.sysfs), dra.host, "0000:26:00.0")  # gone from the host: out of the slice
    dra.driver.step()
    assert len(dra.devices()) == 9 and dra.taints() == {}


def test_a_wedge_outlives_a_restart_of_the_driver_unless_the_gpu_was_rebound_meanwhile(tmp_path: Path) -> None:
    host = fakesysfs.seed_host()
    sysfs = Path(fakesysfs.build(str(tmp_path / "sys"), host))
    (tmp_path / "cdi").mkdir()
    state = tmp_path / "state" / "health.json"
    logs: list[str] = []

    def started(api: FakeApiServer) -> object:
        driver = _driver(tmp_path, sysfs, api, logs, monitor=Monitor(
            Settings(), str(sysfs), clock=Clock(), wall=lambda: 1_780_000_000.0, state_file=str(state),
            log=logs.append))
        driver.step()
        return driver

    def tainted(api: FakeApiServer) -> list[str]:
        return [d["name"] for s in api.slices() for d in s["spec"]["devices"] if d.get("taints")]

    api = FakeApiServer(tmp_path, kubernetes=(1, 36))
    try:
        first = started(api)
        first.observe(_wedged("0000:63:00.0"))  # type: ignore[attr-defined]
        first.step()  # type: ignore[attr-defined]
        assert tainted(api) == ["gpu-0000-63-00-0"]
        assert json.loads(state.read_text())["wedged"]["0000:63:00.0"]["methods"] == "rebind,bus-reset"
        assert state.stat().st_mode & 0o777 == 0o600
        first.sockets.stop()  # type: ignore[attr-defined]
        api.state.slices.clear()  # the restarted driver cannot learn it from its old slices
        second = started(api)  # the uevent is not sent again: the state file has it
        assert tainted(api) == ["gpu-0000-63-00-0"]
        second.sockets.stop()  # type: ignore[attr-defined]
        shutil.rmtree(sysfs)  # the GPU rebound while no driver ran: its drm directory is another one
        fakesysfs.build(str(sysfs), host)
        third = started(api)
        assert tainted(api) == [] and json.loads(state.read_text()) == {"wedged": {}}
        third.sockets.stop()  # type: ignore[attr-defined]
        state.write_text("{not json")
        fourth = started(api)
        assert tainted(api) == []
        assert any(line.startswith(f"health state {state} cannot be read (") for line in logs), logs
        fourth.sockets.stop()  # type: ignore[attr-defined]
    finally:
        api.close()
        shutil.rmtree(_sockets(tmp_path), ignore_errors=True)


def test_health_settings_come_from_the_config() -> None:
    settings = Settings.from_config(Config(health_ue_start=3, health_ue_rise=1, health_hold=7,
                                           health_noexecute=("vanished",)))
    assert settings == Settings(3, 1, 7.0, ("vanished",))
    assert (settings.effect("vanished"), settings.effect("wedged")) == ("NoExecute", "NoSchedule")


# --- the commands take the settings from the config -----------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent


def _config(tmp_path: Path, sysfs: Path) -> dict[str, str]:
    """A config file with health settings, and the environment that names it."""
    config = tmp_path / "config.toml"
    config.write_text(f'sysfs_root = "{sysfs}"\ncdi_dir = "{tmp_path / "cdi"}"\nhealth_ue_start = 1\n'
                      'health_noexecute = ["ras-uncorrectable"]\n')
    return {"PATH": "/usr/bin:/bin", "OCI_GPU_HOOK_CONFIG": str(config)}


def test_the_dra_command_taints_by_the_configs_settings(tmp_path: Path) -> None:
    sysfs, host = _seed(tmp_path)
    fakesysfs.set_ras(str(sysfs), host, "0000:23:00.0", ue={"umc": 2})
    fakesysfs.set_ras(str(sysfs), host, "0000:43:00.0", ue={"umc": 1})  # not above health_ue_start
    (tmp_path / "cdi").mkdir()
    api = FakeApiServer(tmp_path, kubernetes=(1, 36))
    socks = _sockets(tmp_path)
    process = subprocess.Popen(
        [sys.executable, "-m", "oci_gpu_hook.entry.cli", "dra", "--node-name", NODE, "--no-uevents",
         "--kubelet-registry-dir", str(socks / "registry"), "--kubelet-plugins-dir", str(socks / "plugins"),
         "--kube-api-server", api.url, "--kube-token-file", str(api.token_file), "--kube-ca-file", str(api.cert)],
        cwd=REPO, stderr=subprocess.PIPE, text=True, env=_config(tmp_path, sysfs))
    kubelet = FakeDraKubelet(str(socks / "registry"))
    try:
        kubelet.discover()  # the sockets come after the first publish
        (published,) = api.slices()
        taints = {d["name"]: d["taints"] for d in published["spec"]["devices"] if d.get("taints")}
        assert list(taints) == ["gpu-0000-23-00-0"]
        assert (taints["gpu-0000-23-00-0"][0]["value"], taints["gpu-0000-23-00-0"][0]["effect"]) == (
            "ras-uncorrectable", "NoExecute")
    finally:
        kubelet.close()
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=30)
        api.close()
        shutil.rmtree(socks, ignore_errors=True)
    assert process.returncode == 0, err
    assert "Traceback" not in err


def test_the_device_plugin_command_marks_by_the_configs_settings(tmp_path: Path) -> None:
    sysfs, host = _seed(tmp_path)
    fakesysfs.set_ras(str(sysfs), host, "0000:e3:00.0", ue={"gfx": 5})
    fakesysfs.set_ras(str(sysfs), host, "0000:03:00.0", ue={"gfx": 1})
    kubelet = FakeKubelet(str(tmp_path / "device-plugins"))
    kubelet.start()
    process = subprocess.Popen(
        [sys.executable, "-m", "oci_gpu_hook.entry.cli", "device-plugin", "--kubelet-dir",
         str(tmp_path / "device-plugins"), "--no-uevents", "--no-cdi-specs"], cwd=REPO, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, env=_config(tmp_path, sysfs))
    try:
        devices = kubelet.devices("amd.com/gpu", lambda d: len(d) == 8, timeout=30)
        assert [i for i, d in devices.items() if d.health == "Unhealthy"] == ["0000:e3:00.0"]
    finally:
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=30)
        kubelet.stop()
    assert process.returncode == 0, err
    assert "amd.com/gpu 0000:e3:00.0 (CDI amd.com/gpu=0000:e3:00.0) Unhealthy (amdgpu RAS: 5 uncorrectable " in err
