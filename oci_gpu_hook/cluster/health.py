"""A GPU's health from its drivers' own signals: one :class:`Verdict` per GPU, shared by its partitions and MIG devices.

The device plugin, the DRA driver and ``list`` read it; nothing on a container's start path imports it.  The
signals (docs/health.md says each one's kernel source, file and attribute, and what would need NVML):

- ``ras-uncorrectable``: amdgpu's RAS error counters, ``<pci device>/ras/<block>_err_count`` (``ue: N`` and
  ``ce: N`` lines, one file per hardware block), summed over the blocks' ``ue`` counts;
- ``pcie-fatal``: the PCI core's AER counters, ``<pci device>/aer_dev_fatal`` (``TOTAL_ERR_FATAL N``), any
  vendor's GPU;
- ``wedged``: the DRM core's ``WEDGED=<recovery methods>`` change uevent on the GPU's card minor (amdgpu, i915,
  xe: a reset failed and the driver gave up on the device); held until the device recovers: ``WEDGED=none``
  (the driver says it recovered), the PCI device or its card added or bound again (a rebind), or the GPU gone
  from the host (a new device when it comes back).  With a ``state_file`` (:func:`resident_monitor`: the DRA
  driver's and the device plugin's ``--state-dir``) it outlives a restart of the process: kept with the identity
  of its PCI device's ``drm`` directory in sysfs, taken when the uevent comes (kernfs makes the directory anew
  when the driver binds again), so a rebind while the process was down ends it.  Only the GPU's own card minor
  or PCI device speaks for it (:func:`event_gpu`); the state file is read by the config's trust rule;
- ``vanished``: the GPU's devices are gone from the scan (AMD: its KFD topology node or DRM minors; NVIDIA: the
  driver no longer lists it, or excluded it) while its PCI device stays.

A count signal is read each sample: above ``health_ue_start`` when a GPU is first read (a driver restarted beside
a failing GPU sees it at once), or risen by more than ``health_ue_rise`` since the last sample.  A GPU with any
signal is Unhealthy.  A count signal holds for ``health_hold`` seconds after the sample that saw it, so that a
flapping counter does not flap a taint; the states (wedged, vanished) hold while they last and clear with the
recovery that ends them (a rebind, the device back).  The clocks are parameters: tests step them, never sleep.

The scan runs on the thread every Allocate and prepare waits for, so it never blocks nor reads without bound: each
counter file is read within the sysfs root, as a regular file opened non-blocking, at most :data:`ATTRIBUTE_MAX`
bytes (:class:`Reads`); one that is not so, or holds no count, counts nothing and is one log line.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from oci_gpu_hook.config import HEALTH_SIGNALS, Config
from oci_gpu_hook.inventory import Device, Inventory, parse_pci_address

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
RAS_DIR = "ras"
RAS_SUFFIX = "_err_count"
AER_FATAL = "aer_dev_fatal"
AER_TOTAL = "TOTAL_ERR_FATAL"
WEDGED = "WEDGED"
COUNTED = ("ras-uncorrectable", "pcie-fatal")  # the signals of counts: held after they clear
RECOVERED = "none"  # WEDGED=none: the driver recovered the device itself (telemetry may be collected)
ATTRIBUTE_MAX = 8192  # bytes of a counter file read: sysfs shows an attribute in one page (4 KiB on x86_64)
HEALTH_STATE = "health.json"  # in a resident process's state directory: the wedged GPUs, across its restart


@dataclass(frozen=True)
class Verdict:
    healthy: bool = True
    signal: str = ""  # the first of HEALTH_SIGNALS that holds, while Unhealthy
    reason: str = ""  # one line: what the driver said, with its source
    since: float = 0.0  # wall clock (time.time()) when it turned Unhealthy

    @property
    def status_line(self) -> str:
        """``Healthy`` or ``Unhealthy: <reason>``: the device's health as ``list`` and ``inspect`` print it."""
        return HEALTHY if self.healthy else f"{UNHEALTHY}: {self.reason}"


GOOD = Verdict()


@dataclass(frozen=True)
class Settings:
    ue_start: int = 0
    ue_rise: int = 0
    hold: float = 300.0
    noexecute: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, config: Config) -> Settings:
        return cls(config.health_ue_start, config.health_ue_rise, float(config.health_hold),
                   tuple(config.health_noexecute))

    def effect(self, signal: str) -> str:
        """The DRA taint effect of a signal: NoExecute where the operator named it, else NoSchedule."""
        return "NoExecute" if signal in self.noexecute else "NoSchedule"


def open_device(sysfs_root: str, directory: str) -> int:
    """An ``O_PATH`` fd of the device directory ``directory`` below ``sysfs_root``, reached by the one walk inside a
    root (:mod:`oci_gpu_hook.core.inroot`, FOLLOW: a symlink on the way, as ``bus/pci/devices/<address>``, is
    resolved inside the root, never out of it).  OSError with a one-line ``strerror`` (FileNotFoundError where
    it is missing)."""
    from oci_gpu_hook.core import inroot
    from oci_gpu_hook.errors import HookError

    relative = os.path.relpath(directory, sysfs_root)
    if relative == ".." or relative.startswith("../"):
        raise OSError(errno.EXDEV, f"it is outside the sysfs root {sysfs_root}")
    root_fd = os.open(sysfs_root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return inroot.open_dir(root_fd, relative, inroot.FOLLOW)[0]
    except inroot.WalkError as err:  # its words are a container's: said here as the sysfs root's
        raise (FileNotFoundError if err.errno == errno.ENOENT else OSError)(
            err.errno, f"it cannot be reached inside the sysfs root {sysfs_root} ({os.strerror(err.errno)})") from None
    except HookError:
        raise OSError(errno.ELOOP, f"a symlink on its way leads nowhere inside the sysfs root {sysfs_root}") from None
    finally:
        os.close(root_fd)


def read_attribute(dir_fd: int, name: str, limit: int = ATTRIBUTE_MAX) -> str:
    """The text of the sysfs attribute ``name`` in the directory ``dir_fd``: a regular file only (a symlink, a FIFO,
    a socket or a device is refused unopened, and again on the fd: opened non-blocking, so a FIFO swapped in between
    never blocks), at most ``limit`` bytes, UTF-8.  OSError with a one-line ``strerror`` otherwise
    (FileNotFoundError where it is missing)."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, f"it is {_kind(st.st_mode)}, not a regular file")
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"it is {_kind(st.st_mode)}, not a regular file")
        data = b""
        while len(data) <= limit and (chunk := os.read(fd, limit + 1 - len(data))):
            data += chunk
    finally:
        os.close(fd)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"it holds more than {limit} bytes, more than any counter shows")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise OSError(errno.EILSEQ, "it is not UTF-8 text") from None


def _kind(mode: int) -> str:
    from oci_gpu_hook.core.inroot import describe

    return "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else (
        "a directory" if stat.S_ISDIR(mode) else describe(mode))


class Reads:
    """The counter files of one sample, read within ``sysfs_root`` (:func:`open_device`, :func:`read_attribute`);
    what could not be read, or read as no counter, is kept in :attr:`bad` (path -> why, one line), for the monitor
    to say once per file."""

    def __init__(self, sysfs_root: str) -> None:
        self.sysfs_root = sysfs_root
        self.bad: dict[str, str] = {}

    def device(self, directory: str) -> int | None:
        """``directory``'s fd; None where it is missing or refused (refused: kept in :attr:`bad`)."""
        try:
            return open_device(self.sysfs_root, directory)
        except FileNotFoundError:
            return None
        except OSError as err:
            self.bad[directory] = err.strerror or str(err)
            return None

    def text(self, dir_fd: int, name: str, path: str) -> str | None:
        """The attribute ``name`` of ``dir_fd`` (shown as ``path``); None where it is missing or refused."""
        try:
            return read_attribute(dir_fd, name)
        except FileNotFoundError:
            return None
        except OSError as err:
            self.bad[path] = err.strerror or str(err)
            return None


def ras_uncorrectable(pci_dir: str, reads: Reads) -> tuple[int, list[str]] | None:
    """The sum of amdgpu's RAS ``ue`` counts of the GPU at ``pci_dir`` and the blocks that have any (None: no
    ``ras`` directory, a GPU or kernel without RAS).  A block's file that holds no ``ue: N`` line counts nothing and
    is kept in ``reads.bad``."""
    directory = os.path.join(pci_dir, RAS_DIR)
    device = reads.device(pci_dir)
    if device is None:
        return None
    try:
        try:
            ras = os.open(RAS_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=device)
        except FileNotFoundError:
            return None
        except OSError as err:
            link = err.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(directory)
            reads.bad[directory] = "it is a symlink" if link else (err.strerror or str(err))
            return None
    finally:
        os.close(device)
    try:
        total, blocks = 0, []
        for name in sorted(os.listdir(ras)):
            if not name.endswith(RAS_SUFFIX):
                continue
            path = os.path.join(directory, name)
            text = reads.text(ras, name, path)
            if text is None:
                continue
            counts = [value.strip() for key, _, value in (line.partition(":") for line in text.splitlines())
                      if key.strip() == "ue"]
            if len(counts) != 1 or not (counts[0].isdigit() and counts[0].isascii()):
                reads.bad[path] = f"no 'ue: N' line in {text.strip()[:80]!r}"
                continue
            if int(counts[0]) > 0:
                total += int(counts[0])
                blocks.append(f"{name.removesuffix(RAS_SUFFIX)} {int(counts[0])}")
        return total, blocks
    except OSError as err:
        reads.bad[directory] = err.strerror or str(err)
        return None
    finally:
        os.close(ras)


def aer_fatal(pci_dir: str, reads: Reads) -> int | None:
    """``TOTAL_ERR_FATAL`` of the PCI device's AER counters (None: not AER capable, or a kernel before 4.19; a file
    without that line is kept in ``reads.bad``)."""
    device = reads.device(pci_dir)
    if device is None:
        return None
    path = os.path.join(pci_dir, AER_FATAL)
    try:
        text = reads.text(device, AER_FATAL, path)
    finally:
        os.close(device)
    if text is None:
        return None
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        value = value.strip()
        if key == AER_TOTAL and value.isdigit() and value.isascii():
            return int(value)
    reads.bad[path] = f"no '{AER_TOTAL} N' line in {text.strip()[:80]!r}"
    return None


def gpu_dirs(inventory: Inventory) -> dict[str, str]:
    """Each GPU's PCI device directory, by PCI address (a partition's or MIG device's GPU: its own)."""
    out: dict[str, str] = {}
    for device in inventory.all_devices:
        if os.path.basename(device.sysfs_dir) == device.pci_address:
            out.setdefault(device.pci_address, device.sysfs_dir)
    for device in inventory.all_devices:
        out.setdefault(device.pci_address,
                       os.path.join(inventory.sysfs_root, "bus", "pci", "devices", device.pci_address))
    return out


def event_gpu(event: Mapping[str, Any], sysfs_root: str) -> str | None:
    """The PCI address of the GPU a ``drm`` or ``pci`` uevent is about, when it is about the GPU itself: a ``pci``
    one on its PCI device (``DEVPATH`` ending in the address), a ``drm`` one on its card minor
    (``/devices/pci0000:00/0000:00:01.0/0000:03:00.0/drm/card1``; without a ``DEVPATH``, its ``DEVNAME``'s card
    in sysfs).  None for anything else: a render minor, a connector (``drm/card1/card1-DP-3``: DP-MST adds and
    removes them as monitors come and go), a device below or beside the GPU."""
    path = str(event.get("DEVPATH") or "")
    parts = [p for p in path.split("/") if p]
    if event.get("SUBSYSTEM") == "pci":
        return parts[-1].lower() if parts and parse_pci_address(parts[-1]) else None
    if parts:
        if len(parts) >= 3 and parts[-2] == "drm" and _card(parts[-1]) and parse_pci_address(parts[-3]):
            return parts[-3].lower()
        return None
    name = str(event.get("DEVNAME") or "")
    if name.startswith("dri/") and _card(name[4:]):
        from oci_gpu_hook.inventory.sysfs import follow

        device = follow(os.path.join(follow(os.path.join(sysfs_root, "class", "drm", name[4:])), "device"))
        if parse_pci_address(os.path.basename(device)):
            return os.path.basename(device)
    return None


def _card(name: str) -> bool:
    """Whether ``name`` is a card minor's (``cardN``)."""
    return name.startswith("card") and name[4:].isdigit() and name[4:].isascii()


def drm_mark(sysfs_root: str, pci: str, *directories: str) -> list[int] | None:
    """The identity of the ``drm`` directory of the PCI device ``pci``: kernfs makes it anew when the driver binds
    again, so a mark that differs means a rebind.  Read in the first of ``directories`` (the PCI device's directory
    as the scan found it, the one a uevent's ``DEVPATH`` names) that has one, else ``bus/pci/devices/<pci>/drm``;
    None where there is none."""
    for directory in (*directories, os.path.join(sysfs_root, "bus", "pci", "devices", pci)):
        mark = _identity(os.path.join(directory, "drm"))
        if mark is not None:
            return mark
    return None


class _Gpu:
    """What the monitor keeps of one GPU between samples."""

    __slots__ = ("counts", "directory", "held", "kind", "verdict")

    def __init__(self, kind: str, directory: str) -> None:
        self.kind = kind
        self.directory = directory
        self.counts: dict[str, int] = {}  # signal -> the count read last
        self.held = 0.0  # monotonic: Unhealthy at least until then
        self.verdict = GOOD


class Monitor:
    """Every GPU's health, sample by sample (:meth:`sample` after each scan) and uevent by uevent
    (:meth:`event`).  Thread-safe: the resident processes read verdicts from their gRPC threads."""

    def __init__(self, settings: Settings | None = None, sysfs_root: str = "/sys", *,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 state_file: str | None = None, log: Callable[[str], None] | None = None) -> None:
        self.settings = settings or Settings()
        self.sysfs_root = sysfs_root
        self.clock = clock
        self.wall = wall
        self.gpus: dict[str, _Gpu] = {}
        self.wedged: dict[str, str] = {}  # PCI address -> the WEDGED value, until the device recovers
        self.marks: dict[str, list[int] | None] = {}  # PCI address -> its drm directory's identity when wedged
        self.unchecked: set[str] = set()  # wedges read from the state file, checked against sysfs at the next sample
        self.lock = threading.Lock()
        self.log = log
        self.state_file = state_file
        self.state_problem = ""
        self.bad_files: dict[str, str] = {}  # counter files that could not be read as counters, said once each
        if state_file is not None:
            self._load(state_file)

    def event(self, event: Mapping[str, Any]) -> bool:
        """Take a uevent in: a ``WEDGED=`` one marks its GPU wedged, a recovery clears it; True when it did
        either (the caller then rescans soon)."""
        subsystem, action = event.get("SUBSYSTEM"), event.get("ACTION")
        if subsystem not in ("drm", "pci"):
            return False
        pci = event_gpu(event, self.sysfs_root)
        if pci is None:
            return False
        with self.lock:
            value = event.get(WEDGED)
            if subsystem == "drm" and value is not None:
                methods = str(value).strip()
                if methods and methods != RECOVERED:
                    self.wedged[pci] = methods
                    gpu, path = self.gpus.get(pci), str(event.get("DEVPATH") or "").strip("/")
                    card = os.path.normpath(os.path.join(self.sysfs_root, path, "..", "..")) if path else ""
                    self.marks[pci] = drm_mark(self.sysfs_root, pci, *([gpu.directory] if gpu else []),
                                               *([card] if card else []))
                    self._save()
                    return True
                return self._unwedge(pci)
            if action in ("add", "bind"):  # a rebind or a new device: the wedge is over
                return self._unwedge(pci)
        return False

    def _unwedge(self, pci: str) -> bool:
        """With the lock held: end a wedge; True when there was one."""
        if self.wedged.pop(pci, None) is None:
            return False
        self.marks.pop(pci, None)
        self.unchecked.discard(pci)
        self._save()
        return True

    def _load(self, path: str) -> None:
        """The wedges a process before this one saw (unchecked until the first sample).  The file is read by the
        config's trust rule (:func:`oci_gpu_hook.trust.config_problem`: only root or this process's user could have
        written it, every directory above it too) and as a regular file only; anything else is one line, and the
        process starts without the wedges."""
        import json

        from oci_gpu_hook import trust

        lost = "starting without the wedges it held"
        try:
            why = trust.config_problem(path)
            if why is not None:
                self._said(f"health state {path} not read: {why}; {lost}")
                return
            data = json.loads(trust.read_regular(path))
        except FileNotFoundError:
            return
        except OSError as err:
            self._said(f"health state {path} cannot be read ({err.strerror or err}): {lost}")
            return
        except ValueError as err:
            self._said(f"health state {path} cannot be read (not JSON: {err}): {lost}")
            return
        entries = data.get("wedged") if isinstance(data, dict) else None
        if not isinstance(entries, dict):
            self._said(f"health state {path} is not one of this program's: {lost}")
            return
        for pci, entry in entries.items():
            if not (isinstance(pci, str) and parse_pci_address(pci) and isinstance(entry, dict)
                    and isinstance(entry.get("methods"), str) and entry["methods"]):
                continue
            mark = entry.get("drm")
            if not (isinstance(mark, list) and len(mark) == 2 and all(type(n) is int for n in mark)):
                self._said(f"health state {path}: the wedge of {pci} has no mark of its drm directory, so a rebind "
                           "meanwhile cannot be told: dropped")
                continue
            self.wedged[pci] = entry["methods"]
            self.marks[pci] = mark
            self.unchecked.add(pci)

    def _save(self) -> None:
        """With the lock held: the wedges to the state file (a failure said once; they stay in memory)."""
        if self.state_file is None:
            return
        import json

        from oci_gpu_hook.atomic import write_atomic

        text = json.dumps({"wedged": {pci: {"methods": methods, "drm": self.marks.get(pci)}
                                      for pci, methods in sorted(self.wedged.items())}}, indent=1) + "\n"
        try:
            os.makedirs(os.path.dirname(self.state_file) or ".", mode=0o700, exist_ok=True)
            write_atomic(self.state_file, text, 0o600)
        except OSError as err:
            self._said(f"cannot write the health state {self.state_file} ({err.strerror}): a wedged GPU is "
                       "forgotten if this process restarts")

    def _said(self, message: str) -> None:
        if message != self.state_problem and self.log is not None:
            self.log(message)
        self.state_problem = message

    def verdict(self, pci_address: str) -> Verdict:
        with self.lock:
            gpu = self.gpus.get(pci_address)
            return gpu.verdict if gpu is not None else GOOD

    def verdict_for(self, device: Device) -> Verdict:
        """A device's verdict: its GPU's."""
        return self.verdict(device.pci_address)

    def verdicts(self) -> dict[str, Verdict]:
        with self.lock:
            return {pci: gpu.verdict for pci, gpu in self.gpus.items()}

    def sample(self, inventory: Inventory) -> dict[str, Verdict]:
        """Read every GPU's signals once (the GPUs of ``inventory``, and those seen before whose PCI device
        stays); the verdicts by PCI address.  A GPU whose PCI device is gone is forgotten."""
        self.sysfs_root = inventory.sysfs_root
        now, present = self.clock(), gpu_dirs(inventory)
        kinds = {d.pci_address: d.kind for d in inventory.all_devices}
        with self.lock:
            for pci, directory in present.items():
                if pci not in self.gpus:
                    self.gpus[pci] = _Gpu(kinds[pci], directory)
                self.gpus[pci].directory = directory
            for pci in list(self.gpus):
                if pci not in present and not os.path.isdir(self.gpus[pci].directory):
                    del self.gpus[pci]  # gone from the host: a new device if it comes back
                    self._unwedge(pci)
            for pci in sorted(self.unchecked):  # wedged before this process: still, unless rebound meanwhile
                if pci not in present or self.marks.get(pci) != drm_mark(self.sysfs_root, pci, present[pci]):
                    self._unwedge(pci)
            self.unchecked.clear()
            reads = Reads(self.sysfs_root)
            for pci, gpu in self.gpus.items():
                signals = self._signals(pci, gpu, pci in present, inventory, reads)
                self._judge(gpu, signals, now)
            self._say_bad(reads.bad)
            return {pci: gpu.verdict for pci, gpu in self.gpus.items()}

    def _say_bad(self, bad: dict[str, str]) -> None:
        """With the lock held: one log line for each counter file newly bad (or bad for another reason); one that
        reads again is forgotten, so that it is said again if it goes bad again."""
        for path, why in sorted(bad.items()):
            if self.bad_files.get(path) != why and self.log is not None:
                self.log(f"health: {path} not read as a counter: {why}; it counts nothing until it reads")
        self.bad_files = dict(bad)

    def _signals(self, pci: str, gpu: _Gpu, present: bool, inventory: Inventory,
                 reads: Reads) -> list[tuple[str, str]]:
        """The signals that hold for ``gpu`` now, as (signal, reason), in :data:`HEALTH_SIGNALS` order."""
        found: dict[str, str] = {}
        if present:
            ras = ras_uncorrectable(gpu.directory, reads) if gpu.kind == "amd" else None
            if ras is not None:
                count, blocks = ras
                why = self._count(gpu, "ras-uncorrectable", count)
                if why:
                    found["ras-uncorrectable"] = (f"amdgpu RAS: {why} uncorrectable errors ({', '.join(blocks)}; "
                                                  f"{gpu.directory}/{RAS_DIR}/*{RAS_SUFFIX})")
            fatal = aer_fatal(gpu.directory, reads)
            if fatal is not None:
                why = self._count(gpu, "pcie-fatal", fatal)
                if why:
                    found["pcie-fatal"] = f"PCIe AER: {why} fatal errors ({gpu.directory}/{AER_FATAL})"
        else:
            gpu.counts.clear()  # a driver that comes back starts its counts again
            aside = "; ".join(why for name, why in inventory.set_aside(gpu.kind) if pci in name or name in pci)
            found["vanished"] = (f"its devices are gone while its PCI device {pci} stays"
                                 + (f" ({aside})" if aside else " (the driver lost its nodes: a failed reset?)"))
        if pci in self.wedged:
            found["wedged"] = f"the driver declared it wedged (uevent WEDGED={self.wedged[pci]}: a reset failed)"
        return [(signal, found[signal]) for signal in HEALTH_SIGNALS if signal in found]

    def _count(self, gpu: _Gpu, signal: str, count: int) -> str:
        """Why a count is a signal ('' when it is not): above ``ue_start`` at the first read, or risen by more
        than ``ue_rise`` since the last."""
        last = gpu.counts.get(signal)
        gpu.counts[signal] = count
        if last is None:
            return f"{count}" if count > self.settings.ue_start else ""
        if count < last:  # the driver reloaded: counting again from 0
            return ""
        rise = count - last
        return f"{rise} new ({count} in all)" if rise > self.settings.ue_rise else ""

    def _judge(self, gpu: _Gpu, signals: list[tuple[str, str]], now: float) -> None:
        if signals:
            if any(signal in COUNTED for signal, _why in signals):
                gpu.held = now + self.settings.hold
            signal, reason = signals[0]
            if len(signals) > 1:
                reason += "; also " + ", ".join(s for s, _r in signals[1:])
            since = gpu.verdict.since if not gpu.verdict.healthy else self.wall()
            gpu.verdict = Verdict(False, signal, reason, since)
        elif not gpu.verdict.healthy and now >= gpu.held:
            gpu.verdict = GOOD


def _identity(path: str) -> list[int] | None:
    """A sysfs directory's identity: its inode and its creation time (a directory made anew differs in both)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_ino, st.st_ctime_ns]


def resident_monitor(config: Config, state_dir: str, log: Callable[[str], None]) -> Monitor:
    """The monitor of a resident process (the device plugin, the DRA driver): the config's settings, the wedges it
    sees kept in ``state_dir`` (:data:`HEALTH_STATE`), so that a restart of the process forgets none."""
    return Monitor(Settings.from_config(config), config.sysfs_root, log=log,
                   state_file=os.path.join(state_dir, HEALTH_STATE))


def one_sample(config: Config, inventory: Inventory, log: Callable[[str], None] | None = None) -> dict[str, Verdict]:
    """What a one-shot command (``list``) can say: one sample, no uevents, counts against ``health_ue_start``;
    ``log``: where a counter file that is no counter is said."""
    return Monitor(Settings.from_config(config), inventory.sysfs_root, log=log).sample(inventory)

