"""``oci-gpu-hook watch``: the CDI spec follows the host's GPUs as uevents report them.

In-process tests drive :class:`Watcher` with scripted events and a fake clock
(deterministic debounce, no sleeps); the subprocess tests run the real command
and make the kernel send a real uevent (root: ``change`` written to
``/sys/devices/virtual/mem/null/uevent``, which only re-announces /dev/null).
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from oci_gpu_hook.cluster import watch
from oci_gpu_hook.cluster.watch import RESYNC, KernelUevents, Outcome, QueueEvents, Watcher
from oci_gpu_hook.config import Config
from oci_gpu_hook.errors import HookError
from tests.conftest import need, unavailable
from tests.helpers import clilib
from tests.helpers.fakesysfs import FakeGpu, FakeHost, build

REPO = Path(__file__).resolve().parent.parent
NULL_UEVENT = "/sys/devices/virtual/mem/null/uevent"

GPU_A = FakeGpu(pci="0000:03:00.0", card=1, render=128, unique_id=0xA1, gpu_id=1001)
GPU_B = FakeGpu(pci="0000:23:00.0", card=2, render=129, unique_id=0xB2, gpu_id=1002)
GPU_C = FakeGpu(pci="0000:43:00.0", card=3, render=130)


# --- helpers ----------------------------------------------------------------------


def devpath(gpu: FakeGpu, node: str) -> str:
    bus = gpu.pci.split(":")[1]
    return f"/devices/pci{gpu.pci[:4]}:{bus}/{gpu.pci}/drm/{node}"


def uevent(action: str, subsystem: str, path: str, seqnum: int = 1) -> dict[str, Any]:
    """A uevent as :func:`watch.plain_event` makes it from pyroute2's message."""
    return {"header": {"message": f"{action}@{path}", "sequence_number": 0}, "ACTION": action,
            "DEVPATH": path, "SUBSYSTEM": subsystem, "SEQNUM": str(seqnum)}


def drm_events(action: str, gpu: FakeGpu) -> list[dict[str, Any]]:
    return [uevent(action, "drm", devpath(gpu, f"card{gpu.card}")),
            uevent(action, "drm", devpath(gpu, f"renderD{gpu.render}"))]


def kfd_nodes(root: Path) -> Path:
    return root / "devices" / "virtual" / "kfd" / "kfd" / "topology" / "nodes"


def plug(root: Path, gpu: FakeGpu, scratch: Path) -> None:
    """Add one GPU's sysfs directories (PCI device, drm entries, class links, its KFD node) to an existing tree."""
    part = scratch / f"plug-{gpu.pci}"
    build(str(part), FakeHost(gpus=[gpu], cpu_nodes=0))
    node = kfd_nodes(part) / "0"
    node.rename(kfd_nodes(part) / str(1 + max(int(n.name) for n in kfd_nodes(root).iterdir())))
    for name in ("dev", "uevent"):
        (part / "devices" / "virtual" / "kfd" / "kfd" / name).unlink()
    (part / "class" / "kfd" / "kfd").unlink()
    shutil.rmtree(part / "module", ignore_errors=True)  # the driver's module is loaded on the host already
    taken = [int(link.name[5:]) for link in (root / "class" / "hwmon").glob("hwmon*")]
    for number, link in enumerate(sorted((part / "class" / "hwmon").glob("hwmon*")), 1 + max(taken, default=-1)):
        hwmon = link.resolve()  # the next free hwmon number, as the kernel gives it
        link.unlink()
        hwmon = hwmon.rename(hwmon.with_name(f"hwmon{number}"))
        link.with_name(hwmon.name).symlink_to(os.path.relpath(hwmon, link.parent))
    (root / "bus" / "pci" / "drivers" / gpu.driver / gpu.pci).unlink(missing_ok=True)
    shutil.copytree(part, root, symlinks=True, dirs_exist_ok=True)
    shutil.rmtree(part)


def unplug(root: Path, gpu: FakeGpu) -> None:
    """Remove one GPU's directories and class links, as a hot-unplug (or driver unbind) does."""
    drm = root / "class" / "drm"
    for name in (f"card{gpu.card}", f"card{gpu.card}-DP-1", f"renderD{gpu.render}"):
        (drm / name).unlink(missing_ok=True)
    bus = gpu.pci.split(":")[1]
    shutil.rmtree(root / "devices" / f"pci{gpu.pci[:4]}:{bus}" / gpu.pci)
    for link in (root / "class" / "hwmon").glob("hwmon*"):  # its hwmon went with it
        if not link.exists():
            link.unlink()
    for node in kfd_nodes(root).iterdir():  # the driver takes its KFD node away too
        if f"drm_render_minor {gpu.render}\n" in (node / "properties").read_text():
            shutil.rmtree(node)


def device_names(path: Path) -> set[str]:
    return {d["name"] for d in json.loads(path.read_text())["devices"]}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Script:
    """An event source that plays events and pauses (floats, seconds) on a fake clock."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.items: list[Mapping[str, Any] | float] = []
        self.polls = 0

    def add(self, *items: Mapping[str, Any] | float) -> None:
        self.items.extend(items)

    def poll(self, timeout: float | None) -> Mapping[str, Any] | None:
        self.polls += 1
        if self.items:
            item = self.items.pop(0)
            if not isinstance(item, float):
                return item
            if timeout is not None and item > timeout:  # the quiet period ends during the pause
                self.items.insert(0, item - timeout)
                item = timeout
            self.clock.now += item
            return None
        assert timeout is not None, "the watcher would wait for ever with nothing pending"
        self.clock.now += timeout
        return None

    def wake(self) -> None:
        pass


class Setup:
    def __init__(self, tmp_path: Path, host: FakeHost, debounce: float = 1.0,
                 subsystems: tuple[str, ...] = ("drm", "kfd"), fmt: str = "json", debug: bool = False) -> None:
        self.tmp = tmp_path
        self.root = Path(build(str(tmp_path / "sys"), host))
        self.spec = tmp_path / "cdi" / f"amd.com-gpu.{fmt}"
        self.config = Config(sysfs_root=str(self.root), cdi_dir=str(tmp_path / "cdi"), backends=("amd",), debug=debug)
        self.clock = Clock()
        self.source = Script(self.clock)
        self.log = io.StringIO()
        self.watcher = Watcher(self.config, [("amd", str(self.spec), fmt)], self.source, subsystems=subsystems,
                               debounce=debounce, clock=self.clock, stream=self.log)

    def drain(self) -> None:
        """Step until every scripted event is taken and nothing is pending."""
        while self.source.items or self.watcher.pending:
            self.watcher.step()

    def lines(self, pattern: str = "") -> list[str]:
        return [line for line in self.log.getvalue().splitlines() if pattern in line]


@pytest.fixture
def two(tmp_path: Path) -> Setup:
    setup = Setup(tmp_path, FakeHost(gpus=[GPU_A, GPU_B]))
    assert setup.watcher.regenerate("start").kind == "wrote"
    return setup


# --- regeneration on events -----------------------------------------------------------


def test_start_writes_the_spec_then_finds_it_unchanged(two: Setup) -> None:
    names = device_names(two.spec)
    assert names == {"0", "1", "0000:03:00.0", "0000:23:00.0", "0x00000000000000a1", "0x00000000000000b2", "all"}
    assert oct(two.spec.stat().st_mode & 0o777) == "0o644"
    assert two.watcher.regenerate("start").kind == "unchanged"
    first, second = two.lines()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z oci-gpu-hook watch: start: "
                        rf"wrote {re.escape(str(two.spec))} \(7 devices, 2 GPUs\)", first)
    assert second.endswith(f"start: unchanged {two.spec} (7 devices, 2 GPUs)")


def test_added_gpu_appears_after_its_uevent(two: Setup) -> None:
    plug(two.root, GPU_C, two.tmp)
    assert "2" not in device_names(two.spec)  # sysfs alone does not trigger anything
    two.source.add(*drm_events("add", GPU_C))
    two.drain()
    names = device_names(two.spec)
    assert {"2", "0000:43:00.0"} <= names
    assert two.watcher.last == Outcome("wrote", f"wrote {two.spec} (9 devices, 3 GPUs)")
    (line,) = two.lines("after ")
    assert f"after 2 uevents (add drm {devpath(GPU_C, 'card3')}, add drm {devpath(GPU_C, 'renderD130')}): " \
           f"wrote {two.spec} (9 devices, 3 GPUs)" in line


def test_removed_gpu_disappears_after_its_uevent(two: Setup) -> None:
    unplug(two.root, GPU_B)
    two.source.add(*drm_events("remove", GPU_B))
    two.drain()
    names = device_names(two.spec)
    assert names == {"0", "0000:03:00.0", "0x00000000000000a1", "all"}
    assert two.watcher.last is not None and two.watcher.last.kind == "wrote"


def test_a_burst_gives_one_write(two: Setup) -> None:
    plug(two.root, GPU_C, two.tmp)
    burst: list[Mapping[str, Any] | float] = []
    for event in [*drm_events("add", GPU_C), uevent("change", "kfd", "/devices/virtual/kfd/kfd"),
                  *drm_events("change", GPU_C), *drm_events("change", GPU_A)]:
        burst += [event, 0.4]  # each gap shorter than the 1 s quiet period
    two.source.add(*burst)
    two.drain()
    assert len(two.lines("after ")) == 1
    assert "after 7 uevents (" in two.lines("after ")[0]
    assert ", +4 more): wrote" in two.lines("after ")[0]
    assert "2" in device_names(two.spec)


def test_the_quiet_period_restarts_with_each_event(two: Setup) -> None:
    two.source.add(uevent("change", "drm", devpath(GPU_A, "card1")), 0.9)
    while two.source.items:
        two.watcher.step()
    assert two.watcher.pending and not two.lines("after ")
    two.source.add(uevent("change", "drm", devpath(GPU_A, "card1")), 0.9)
    while two.source.items:
        two.watcher.step()
    assert two.watcher.pending and not two.lines("after ")  # 1.8 s after the first event: still quiet-waiting
    two.drain()
    assert two.clock.now == pytest.approx(1000.0 + 0.9 + 1.0)
    assert len(two.lines("after 2 uevents")) == 1


def test_separate_bursts_give_separate_regenerations(two: Setup) -> None:
    plug(two.root, GPU_C, two.tmp)
    two.source.add(*drm_events("add", GPU_C), 5.0)
    two.drain()
    unplug(two.root, GPU_C)
    two.source.add(*drm_events("remove", GPU_C))
    two.drain()
    assert [line.rsplit(": ", 1)[1].split()[0] for line in two.lines("after ")] == ["wrote", "wrote"]
    assert "2" not in device_names(two.spec)


def test_an_endless_stream_cannot_postpone_the_regeneration(two: Setup) -> None:
    two.source.add(*[x for _ in range(60) for x in (uevent("change", "drm", devpath(GPU_A, "card1")), 0.5)])
    start = two.clock.now
    times = []
    while two.source.items:
        before = len(two.lines("after "))
        two.watcher.step()
        if len(two.lines("after ")) > before:
            times.append(two.clock.now - start)
    # 30 s of events 0.5 s apart, never a 1 s quiet period: regenerated every MAX_WAIT_FACTOR quiet periods
    assert times == pytest.approx([10.0, 20.0, 30.0])
    assert watch.MAX_WAIT_FACTOR == 10


def test_an_irrelevant_subsystem_changes_nothing(two: Setup) -> None:
    plug(two.root, GPU_C, two.tmp)
    mtime = two.spec.stat().st_mtime_ns
    two.source.add(uevent("add", "usb", "/devices/pci0000:00/0000:00:14.0/usb1/1-1"),
                   uevent("change", "mem", "/devices/virtual/mem/null"), 5.0)
    two.drain()
    assert not two.watcher.handle(uevent("add", "pci", f"/devices/pci0000:43/{GPU_C.pci}"))
    assert two.watcher.pending == [] and two.watcher.deadline is None
    assert two.lines() == two.lines("start: ")  # not one line more
    assert two.spec.stat().st_mtime_ns == mtime
    assert "2" not in device_names(two.spec)


def test_ignored_events_are_logged_with_debug(tmp_path: Path) -> None:
    setup = Setup(tmp_path, FakeHost(gpus=[GPU_A]), debug=True)
    assert not setup.watcher.handle(uevent("add", "usb", "/devices/usb1"))
    assert setup.lines("ignored uevent add usb /devices/usb1")


def test_extra_subsystems_count(tmp_path: Path) -> None:
    setup = Setup(tmp_path, FakeHost(gpus=[GPU_A]), subsystems=("drm", "kfd", "mem"))
    assert setup.watcher.handle(uevent("change", "mem", "/devices/virtual/mem/null"))
    setup.drain()
    assert setup.lines("after 1 uevent (change mem /devices/virtual/mem/null): wrote ")
    assert setup.lines()[0].endswith("(4 devices, 1 GPU)")


def test_unchanged_content_is_not_rewritten(two: Setup) -> None:
    os.utime(two.spec, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    inode = two.spec.stat().st_ino
    two.source.add(*drm_events("change", GPU_A))
    two.drain()
    assert two.spec.stat().st_mtime_ns == 1_000_000_000_000_000_000
    assert two.spec.stat().st_ino == inode
    assert two.lines("after 2 uevents")[0].endswith(f": unchanged {two.spec} (7 devices, 2 GPUs)")


def test_yaml_output(tmp_path: Path) -> None:
    import yaml

    setup = Setup(tmp_path, FakeHost(gpus=[GPU_A]), fmt="yaml")
    assert setup.watcher.regenerate("start").kind == "wrote"
    spec = yaml.safe_load(setup.spec.read_text())
    assert spec["kind"] == "amd.com/gpu" and {d["name"] for d in spec["devices"]} >= {"0", "all"}


def test_a_resync_marker_triggers_a_rescan(two: Setup) -> None:
    plug(two.root, GPU_C, two.tmp)
    two.source.add({RESYNC: "uevent socket failed (No buffer space available): uevents may have been lost"})
    two.drain()
    assert two.lines("after 1 uevent (uevent socket failed (No buffer space available)")
    assert "2" in device_names(two.spec)


# --- no GPUs, failures ----------------------------------------------------------------


def test_no_gpus_at_start_writes_nothing(tmp_path: Path) -> None:
    setup = Setup(tmp_path, FakeHost(gpus=[]))
    outcome = setup.watcher.regenerate("start")
    assert outcome.kind == "none"
    assert not setup.spec.exists()
    assert setup.lines()[0].endswith(
        f"start: no GPUs under {setup.root}: nothing written (a CDI spec needs a device)")


def test_all_gpus_gone_removes_the_stale_spec_and_they_come_back(two: Setup) -> None:
    for gpu in (GPU_A, GPU_B):
        unplug(two.root, gpu)
    two.source.add(*drm_events("remove", GPU_A), *drm_events("remove", GPU_B))
    two.drain()
    assert not two.spec.exists()
    assert two.lines("after 4 uevents")[0].endswith(f"; removed the stale spec {two.spec}")
    plug(two.root, GPU_B, two.tmp)
    two.source.add(*drm_events("add", GPU_B))
    two.drain()
    assert device_names(two.spec) == {"0", "0000:23:00.0", "0x00000000000000b2", "all"}  # now index 0


def test_no_gpus_leaves_a_file_that_is_not_our_spec(tmp_path: Path) -> None:
    setup = Setup(tmp_path, FakeHost(gpus=[]))
    setup.spec.parent.mkdir()
    foreign = {"cdiVersion": "0.5.0", "kind": "vendor.com/thing", "devices": [{"name": "x", "containerEdits": {}}]}
    setup.spec.write_text(json.dumps(foreign))
    assert setup.watcher.regenerate("start").kind == "none"
    assert json.loads(setup.spec.read_text()) == foreign
    assert "left" in setup.lines()[0] and "'vendor.com/thing'" in setup.lines()[0]
    setup.spec.write_text("not json")
    assert setup.watcher.regenerate("start").kind == "none"
    assert setup.spec.read_text() == "not json"


def test_a_write_failure_is_logged_and_the_watcher_keeps_going(two: Setup) -> None:
    two.spec.unlink()
    two.spec.mkdir()  # the spec path is now a directory: cannot read it, cannot rename over it
    two.source.add(*drm_events("change", GPU_A))
    two.drain()
    assert two.watcher.last is not None and two.watcher.last.kind == "failed"
    assert two.lines("after 2 uevents")[0].split(": ", 1)[1].startswith("after 2 uevents (")
    assert f"failed: cannot read {two.spec}" in two.lines("after 2 uevents")[0]
    two.spec.rmdir()
    two.source.add(*drm_events("change", GPU_A))
    two.drain()
    assert two.watcher.last is not None and two.watcher.last.kind == "wrote"
    assert device_names(two.spec) >= {"0", "1"}


def test_unreadable_sysfs_keeps_the_spec(two: Setup) -> None:
    before = two.spec.read_text()
    drm = two.root / "class" / "drm"
    shutil.rmtree(drm)
    drm.write_text("")  # not a directory: scan() cannot list it
    two.source.add(*drm_events("remove", GPU_A))
    two.drain()
    assert two.lines("after 2 uevents")[0].endswith(f"failed: cannot list {drm}: Not a directory")
    assert two.spec.read_text() == before


def test_an_unexpected_error_is_logged_and_the_watcher_keeps_going(two: Setup,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object) -> dict[str, Any]:
        raise KeyError("boom")

    monkeypatch.setattr(watch.cdi, "generate", broken)
    assert two.watcher.regenerate("test") == Outcome("failed", "failed: internal error: KeyError: 'boom'")


# --- run/stop with a queue ------------------------------------------------------------


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_run_from_a_queue_and_stop(tmp_path: Path) -> None:
    root = Path(build(str(tmp_path / "sys"), FakeHost(gpus=[GPU_A])))
    spec = tmp_path / "spec.json"
    source = QueueEvents()
    log = io.StringIO()
    watcher = Watcher(Config(sysfs_root=str(root)), [("amd", str(spec), "json")], source, debounce=0.05, stream=log)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(watcher.run()))
    thread.start()
    try:
        wait_until(lambda: "listening for kernel uevents of drm, kfd" in log.getvalue())
        assert "start: wrote" in log.getvalue()
        plug(root, GPU_B, tmp_path)
        for event in drm_events("add", GPU_B):
            source.put(event)
        wait_until(lambda: "after 2 uevents" in log.getvalue())
        assert "1" in device_names(spec)
    finally:
        watcher.stop("test")
        thread.join(10)
    assert result == [0]
    assert log.getvalue().splitlines()[-1].endswith("stopping on test")


def test_stop_before_run_writes_nothing(tmp_path: Path) -> None:
    log = io.StringIO()
    watcher = Watcher(Config(sysfs_root=str(tmp_path)), [("amd", str(tmp_path / "spec.json"), "json")], QueueEvents(),
                      stream=log)
    watcher.stop("SIGTERM")
    assert watcher.run() == 0
    assert log.getvalue().count("\n") == 1 and "stopping on SIGTERM" in log.getvalue()


def test_user_namespace_warning(tmp_path: Path) -> None:
    uid_map = tmp_path / "uid_map"
    uid_map.write_text("         0          0 4294967295\n")
    assert watch.user_namespace_warning(str(uid_map)) is None
    uid_map.write_text("         0     100000      65536\n")
    assert "user namespace" in (watch.user_namespace_warning(str(uid_map)) or "")
    assert watch.user_namespace_warning(str(tmp_path / "missing")) is None
    log = io.StringIO()
    watcher = Watcher(Config(sysfs_root=str(tmp_path)), [("amd", str(tmp_path / "spec.json"), "json")], QueueEvents(),
                      stream=log)
    threading.Timer(0.2, watcher.stop, ("test",)).start()
    assert watcher.run("warning: test") == 0
    assert [line.split(" watch: ", 1)[1].split(" ")[0] for line in log.getvalue().splitlines()] == [
        "start:", "warning:", "listening", "stopping"]


# --- the kernel socket reader (with a stand-in socket) ------------------------------------


class FakeSocket:
    def __init__(self, batches: list[Any]) -> None:
        self.batches = batches
        self.closed = threading.Event()

    def get(self) -> list[Any]:
        if self.batches:
            item = self.batches.pop(0)
            if isinstance(item, BaseException):
                raise item
            return item
        self.closed.wait()
        return [{"header": {"message": ""}}]  # what pyroute2 returns when closed under a waiting get()

    def close(self) -> None:
        self.closed.set()


def test_kernel_uevents_queues_events_and_reopens_after_an_overflow() -> None:
    enobufs = OSError(errno.ENOBUFS, os.strerror(errno.ENOBUFS))
    bogus = {"header": {"message": "\x1c"}}  # pyroute2's parse of its own error packet
    sockets = [FakeSocket([[uevent("add", "drm", "/devices/a")], [bogus], enobufs]),
               FakeSocket([[uevent("remove", "drm", "/devices/a")]])]
    opened: list[FakeSocket] = []

    def opener() -> FakeSocket:
        opened.append(sockets.pop(0))
        return opened[-1]

    source = KernelUevents(opener, retry_delay=0.01)
    source.start()
    try:
        got = [source.poll(5.0) for _ in range(4)]
    finally:
        source.close()
    assert got[0] == uevent("add", "drm", "/devices/a")
    assert got[1] == {RESYNC: "uevent socket failed (No buffer space available): uevents may have been lost"}
    assert got[2] == {RESYNC: "uevent socket reopened"}
    assert got[3] == uevent("remove", "drm", "/devices/a")
    assert len(opened) == 2 and all(s.closed.is_set() for s in opened)


def test_kernel_uevents_start_failure_is_one_line() -> None:
    def opener() -> FakeSocket:
        raise OSError(errno.EAFNOSUPPORT, os.strerror(errno.EAFNOSUPPORT))

    with pytest.raises(HookError, match=r"^cannot listen for kernel uevents \(netlink NETLINK_KOBJECT_UEVENT\): "
                                        r"Address family not supported by protocol$"):
        KernelUevents(opener).start()


def test_plain_event_from_pyroute2_parsing() -> None:
    from pyroute2.netlink.uevent import MarshalUevent

    data = b"add@/devices/x/drm/card1\0ACTION=add\0DEVPATH=/devices/x/drm/card1\0SUBSYSTEM=drm\0SEQNUM=7\0"
    (message,) = MarshalUevent().parse(data)
    event = watch.plain_event(message)
    assert event is not None
    assert event["ACTION"] == "add" and event["SUBSYSTEM"] == "drm" and event["DEVPATH"] == "/devices/x/drm/card1"
    assert event["header"]["message"] == "add@/devices/x/drm/card1"
    assert watch.event_summary(event) == "add drm /devices/x/drm/card1"
    (terminator,) = MarshalUevent().parse(b"")
    assert watch.plain_event(terminator) is None


def test_event_summary_falls_back_to_the_header() -> None:
    assert watch.event_summary({"header": {"message": "bind@/devices/p"}, "SUBSYSTEM": "pci"}) == "bind pci /devices/p"


# --- the command: arguments, --once, errors -------------------------------------------------


def clean_env(**extra: str) -> dict[str, str]:
    env = clilib.without_tool_vars()
    env["OCI_GPU_HOOK_CONFIG"] = os.devnull
    env["OCI_GPU_HOOK_CDI_DIR"] = "/nonexistent/oci-gpu-hook-tests/cdi"  # a test that writes specs names its own
    env.update(extra)
    return env


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", *args], capture_output=True, text=True,
                          env=env or clean_env(), cwd=REPO, timeout=60, check=False)


def test_once_writes_and_exits(tmp_path: Path) -> None:
    root = build(str(tmp_path / "sys"), FakeHost(gpus=[GPU_A, GPU_B]))
    out = tmp_path / "run" / "cdi" / "amd.com-gpu.json"  # directories are created
    result = cli("--sysfs-root", root, "watch", "--once", "--output", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.rstrip().endswith(f"watch: once: wrote {out} (7 devices, 2 GPUs)")
    again = cli("--sysfs-root", root, "watch", "--once", "--output", str(out))
    assert again.stderr.rstrip().endswith(f"once: unchanged {out} (7 devices, 2 GPUs)")


def test_once_into_a_directory_and_the_config_default(tmp_path: Path) -> None:
    root = build(str(tmp_path / "sys"), FakeHost(gpus=[GPU_A]))
    (tmp_path / "cdi").mkdir()
    result = cli("--sysfs-root", root, "watch", "--once", "--output", str(tmp_path / "cdi"))
    assert result.returncode == 0, result.stderr
    assert device_names(tmp_path / "cdi" / "amd.com-gpu.json") == {"0", "0000:03:00.0", "0x00000000000000a1", "all"}
    default = tmp_path / "default"
    result = cli("--sysfs-root", root, "watch", "--once", env=clean_env(OCI_GPU_HOOK_CDI_DIR=str(default)))
    assert result.returncode == 0, result.stderr
    assert json.loads((default / "amd.com-gpu.json").read_text())["cdiVersion"] == "0.5.0"
    assert "no intel GPUs under" in result.stderr and not (default / "intel.com-gpu.json").exists()
    yaml_file = tmp_path / "spec.yaml"
    result = cli("--sysfs-root", root, "watch", "--once", "--output", str(yaml_file))
    assert result.returncode == 0, result.stderr
    assert yaml_file.read_text().startswith("cdiVersion: 0.5.0\n")


def test_once_without_gpus_is_not_an_error(tmp_path: Path) -> None:
    root = build(str(tmp_path / "sys"), FakeHost(gpus=[]))
    result = cli("--sysfs-root", root, "watch", "--once", "--output", str(tmp_path / "spec.json"))
    assert result.returncode == 0, result.stderr
    assert "once: no GPUs under" in result.stderr
    assert not (tmp_path / "spec.json").exists()


def test_once_failure_is_one_error_line(tmp_path: Path) -> None:
    root = build(str(tmp_path / "sys"), FakeHost(gpus=[GPU_A]))
    drm = Path(root) / "class" / "drm"
    shutil.rmtree(drm)
    drm.write_text("")
    result = cli("--sysfs-root", root, "watch", "--once", "--output", str(tmp_path / "spec.json"))
    assert result.returncode == 1
    assert result.stderr == f"oci-gpu-hook: error: cannot list {drm}: Not a directory\n"
    assert not (tmp_path / "spec.json").exists()


@pytest.mark.parametrize(("args", "message"), [
    (("--output", "{tmp}/file/spec.json"), "--output {tmp}/file/spec.json: {tmp}/file is not a directory"),
    (("--output", "{tmp}/file/sub/spec.json"), "--output {tmp}/file/sub/spec.json: cannot create {tmp}/file/sub: "
                                               "Not a directory"),
    (("--output", "{tmp}/spec.txt"), "--output {tmp}/spec.txt: a CDI spec file ends in .json or .yaml"),
    (("--debounce", "-1"), "--debounce '-1': expected seconds, 0 to 3600"),
    (("--debounce", "soon"), "--debounce 'soon': expected seconds"),
    (("--subsystems", ","), "--subsystems ',': expected a comma-separated list of kernel subsystems"),
    (("--bogus",), "oci-gpu-hook watch: unrecognized arguments: --bogus"),
])
def test_bad_arguments_are_one_error_line(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    (tmp_path / "file").write_text("")
    args = tuple(a.format(tmp=tmp_path) for a in args)
    if "--output" not in args:
        args += ("--output", str(tmp_path / "spec.json"))
    result = cli("--sysfs-root", str(tmp_path), "watch", *args)
    assert result.returncode == (2 if "--bogus" in args else 1), result.stderr  # argparse's error: usage, 2
    assert result.stderr.startswith("oci-gpu-hook: error: " + message.format(tmp=tmp_path)), result.stderr
    assert result.stderr.count("\n") == 1


def test_watch_help() -> None:
    result = cli("watch", "--help")
    assert result.returncode == 0
    for option in ("--output", "--debounce", "--once", "--subsystems"):
        assert option in result.stdout


def test_importing_the_module_and_once_do_not_import_pyroute2(tmp_path: Path) -> None:
    code = ("import sys; from oci_gpu_hook.entry import cli; "
            f"rc = cli.main(['--sysfs-root', {str(tmp_path)!r}, 'watch', '--once', '--output', "
            f"{str(tmp_path / 'spec.json')!r}]); "
            "assert rc == 0, rc; assert 'pyroute2' not in sys.modules, 'pyroute2 imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(),
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr


# --- the real command, a real kernel uevent -------------------------------------------------


def uevent_socket_available() -> bool:
    try:
        watch.open_kernel_socket().close()
    except Exception:
        return False
    return True


class Watching:
    """``oci-gpu-hook watch`` as a subprocess, its stderr read line by line."""

    def __init__(self, args: list[str]) -> None:
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.proc = subprocess.Popen([sys.executable, "-m", "oci_gpu_hook.entry.cli", *args], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=clean_env(),
                                     cwd=REPO)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def wait_for(self, text: str, after: int = 0, timeout: float = 30.0) -> tuple[int, str]:
        """The first line from index ``after`` on that contains ``text``: (index, line)."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                for index in range(after, len(self.lines)):
                    if text in self.lines[index]:
                        return index, self.lines[index]
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self.reader.is_alive()):
                    raise AssertionError(f"no line with {text!r} in {timeout} s; "
                                         f"exit {self.proc.poll()}; stderr:\n" + "\n".join(self.lines))
                self.changed.wait(left)

    def stop(self, sig: int) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(15)
        finally:
            self.reader.join(5)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def trigger_null_uevent() -> None:
    with open(NULL_UEVENT, "w") as handle:
        handle.write("change")


@pytest.mark.skipif(not uevent_socket_available(), reason="no kernel uevent netlink socket here")
def test_real_kernel_uevent_rewrites_the_spec_then_sigterm_exits_0(tmp_path: Path) -> None:
    need()
    if not os.access(NULL_UEVENT, os.W_OK):
        unavailable(f"cannot write {NULL_UEVENT}")
    root = tmp_path / "sys"
    build(str(root), FakeHost(gpus=[GPU_A, GPU_B]))
    spec = tmp_path / "cdi" / "amd.com-gpu.json"
    run = Watching(["--sysfs-root", str(root), "watch", "--output", str(spec), "--subsystems", "drm,kfd,mem",
                    "--debounce", "0.2"])
    try:
        start, line = run.wait_for("start: ")
        assert line.endswith(f"start: wrote {spec} (7 devices, 2 GPUs)")
        listening, line = run.wait_for("listening for kernel uevents of drm, kfd, mem", after=start)
        assert "debounce 0.2 s" in line

        # A real uevent with sysfs unchanged: logged, spec not rewritten.
        mtime = spec.stat().st_mtime_ns
        trigger_null_uevent()
        seen, line = run.wait_for("change mem /devices/virtual/mem/null", after=listening)
        assert re.search(r"after \d+ uevents? \(change mem /devices/virtual/mem/null\): "
                         rf"unchanged {re.escape(str(spec))} \(7 devices, 2 GPUs\)$", line), line
        assert spec.stat().st_mtime_ns == mtime

        # The tree gains a GPU; the next real uevent makes the watcher rescan and rewrite.
        plug(root, GPU_C, tmp_path)
        trigger_null_uevent()
        _, line = run.wait_for("change mem /devices/virtual/mem/null", after=seen + 1)
        assert line.endswith(f"wrote {spec} (9 devices, 3 GPUs)"), line
        assert {"2", "0000:43:00.0"} <= device_names(spec)

        assert run.stop(signal.SIGTERM) == 0
        assert run.lines[-1].endswith("stopping on SIGTERM")
        assert not any("Traceback" in x or "error" in x for x in run.lines), run.lines
    finally:
        run.kill()
    assert sorted(p.name for p in spec.parent.iterdir()) == ["amd.com-gpu.json"]  # no temp file left


@pytest.mark.skipif(not uevent_socket_available(), reason="no kernel uevent netlink socket here")
def test_sigint_exits_0(tmp_path: Path) -> None:
    run = Watching(["--sysfs-root", str(tmp_path), "watch", "--output", str(tmp_path / "spec.json")])
    try:
        index, _ = run.wait_for("listening for kernel uevents of drm, kfd")
        assert "start: no GPUs under" in run.lines[0]
        assert run.stop(signal.SIGINT) == 0
        assert run.lines[-1].endswith("stopping on SIGINT")
        assert len(run.lines) == index + 2
    finally:
        run.kill()


def test_a_compute_mode_change_rewrites_the_spec_and_says_the_mode(tmp_path: Path) -> None:
    """CPX -> DPX on an MI300X host: the partitions change, the spec is rewritten, the line names the mode."""
    from tests.helpers.fakesysfs import mi300x_host

    setup = Setup(tmp_path, mi300x_host("CPX"))
    first = setup.watcher.regenerate("start")
    assert first.kind == "wrote" and "16 GPUs, mode CPX/NPS1" in first.text
    shutil.rmtree(setup.root)
    build(str(setup.root), mi300x_host("DPX"))
    second = setup.watcher.regenerate("change drm")
    assert second.kind == "wrote" and "4 GPUs, mode DPX/NPS1" in second.text
    assert device_names(setup.spec) == {"0", "1", "2", "3", "0000:05:00.0", "0000:26:00.0", "0xe3a9b1d2c4f56070",
                                        "0xe3a9b1d2c4f56071", "0000:05:00.0-p0", "0000:05:00.0-p1",
                                        "0000:26:00.0-p0", "0000:26:00.0-p1", "all"}


def test_the_links_of_a_gpu_that_appears_are_made(two: Setup) -> None:
    """With a /dev (``dev``), each regeneration makes the missing /dev/char links of the nodes there
    (oci_gpu_hook/cluster/devchar.py; tests/test_devchar.py has the rules): the GPU plugged in later gets its own."""
    dev = two.tmp / "dev"
    (dev / "dri").mkdir(parents=True)

    def node(name: str, minor: int) -> None:
        os.mknod(dev / "dri" / name, 0o600 | 0o020000, os.makedev(226, minor))

    node("card1", 1)
    node("renderD128", 128)
    watcher = Watcher(two.config, [("amd", str(two.spec), "json")], two.source, subsystems=("drm", "kfd"),
                      clock=two.clock, stream=two.log, dev=str(dev))
    first = watcher.regenerate("start")
    assert first.text.endswith(f"; made {dev}/char/226:1 -> ../dri/card1, {dev}/char/226:128 -> ../dri/renderD128")
    plug(two.root, GPU_C, two.tmp)
    node("card3", 3)
    node("renderD130", 130)
    two.source.add(*drm_events("add", GPU_C))
    while two.source.items or watcher.pending:
        watcher.step()
    assert watcher.last is not None and watcher.last.kind == "wrote"
    assert watcher.last.text.endswith(f"; made {dev}/char/226:3 -> ../dri/card3, "
                                      f"{dev}/char/226:130 -> ../dri/renderD130")
    assert sorted(os.listdir(dev / "char")) == ["226:1", "226:128", "226:130", "226:3"]
    assert watcher.regenerate("again").text == f"unchanged {two.spec} (9 devices, 3 GPUs)"  # nothing more to make
