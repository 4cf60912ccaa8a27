"""``oci-gpu-hook watch``: keep the CDI spec current as GPUs and partitions come and go.

The watcher listens for the kernel's uevents (netlink ``NETLINK_KOBJECT_UEVENT``,
the kernel multicast group, through pyroute2's ``UeventSocket``) and acts on the
ones whose ``SUBSYSTEM`` is watched (``drm``, ``kfd`` and ``pci`` by default: a
GPU, a render node or a compute partition appearing, disappearing or changing).
NVIDIA GPUs without nvidia-drm have no DRM nodes, and their driver creates its
``/dev/nvidia*`` and ``/dev/nvidia-caps`` nodes without uevents: what they do
send is their PCI device's ``add``/``remove``/``bind``/``unbind``.  So ``pci``
events count only for a GPU's PCI function (:func:`gpu_uevent`: ``PCI_ID`` of
AMD ``1002``, NVIDIA ``10DE`` or Intel ``8086``, ``PCI_CLASS`` a display
controller ``03xxxx`` or processing accelerator ``12xxxx``), never for an
NVSwitch, a GPU's audio function or any other PCI device.  MIG instances being
created or destroyed send no uevent at all: the device plugin's periodic rescan
notices them; ``watch`` does not.

- **Start**: the socket is bound first, then the spec is regenerated once, so an
  event that arrives during that first scan is not lost (it only causes one more,
  usually ``unchanged``, regeneration).  Then ``listening ...`` is logged.
- **Debounce**: a relevant event starts a quiet period of ``--debounce`` seconds;
  every further relevant event restarts it, so a burst (8 GPUs x card, render,
  partitions) gives one regeneration.  An endless stream of events cannot
  postpone it for ever: it happens at the latest ``MAX_WAIT_FACTOR`` quiet periods
  after the first event of the burst.
- **Regeneration**: sysfs is scanned again, the spec generated and checked
  (:func:`oci_gpu_hook.appliers.cdi.validate`), and written atomically only when its text
  changed (:func:`oci_gpu_hook.appliers.cdi.write`), so an unchanged spec keeps its mtime
  and CDI consumers (containerd, CRI-O, podman watch the spec directories) see no
  spurious change.
- **A host with no GPUs**: a CDI spec needs at least one device, so nothing is
  written.  A spec already at the output path would then name device nodes that
  no longer exist (all GPUs unbound, the driver unloaded): the watcher *removes*
  it, so that consumers stop resolving those names and a container asking for
  one fails clearly instead of starting with dead device nodes.  It removes only
  a file that is a CDI spec of this project's kind (``cdi_kind``, i.e. one this
  watcher or ``cdi generate`` wrote); anything else at that path is left alone
  and the line says so.  A sysfs that cannot be *read* is a failure, not "no
  GPUs": the spec is then kept as it is.  When GPUs come back the spec is
  written again.
- **Failures** (sysfs unreadable, spec invalid, cannot write) are logged as
  ``failed: ...`` and the watcher keeps running; the next relevant event retries.
  At start, an output directory that cannot be created or written is one error
  line and exit 1, as is a kernel uevent socket that cannot be opened.
- **Lost events**: when the kernel drops uevents because the socket's receive
  buffer overflowed (``ENOBUFS``), pyroute2's socket is unusable afterwards; the
  watcher opens a new one and rescans, since it cannot know what it missed.
- **Where it runs**: the kernel sends device uevents only into network
  namespaces owned by the initial user namespace.  A private network namespace
  (a pod without hostNetwork, systemd's PrivateNetwork=) is fine; a user
  namespace (a pod with ``hostUsers: false``, systemd's PrivateUsers=) gets none,
  and the watcher warns at start when it finds itself in one.
- **Stop**: SIGTERM or SIGINT ends the watcher cleanly with exit status 0 (a
  regeneration in progress finishes first; a pending one is dropped, the next
  start rescans anyway).

``--once`` regenerates once and exits (0, or 1 with the error line when the spec
cannot be written; a host with no GPUs is not an error): a DaemonSet's init
container, or a boot-time unit.  It does not import pyroute2.

Each action is one line on stderr: UTC time, what happened, the outcome
(``wrote PATH (N devices, G GPUs)``, ``unchanged PATH (...)``, ``no GPUs ...``,
``failed: ...``).

The event source is injectable: :class:`Watcher` takes anything with
``poll(timeout)`` and ``wake()`` (:class:`EventSource`).  Tests feed a
:class:`QueueEvents` by hand; production uses :class:`KernelUevents`, whose reader
thread owns the pyroute2 socket and feeds the same kind of queue.  (A reader
thread, rather than ``select()`` on the socket: pyroute2 0.9's sync ``get()``
runs an asyncio loop that may read several datagrams at once and keep the extra
ones in its own queue, where ``select()`` no longer sees them.)
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, NamedTuple, Protocol, TextIO

from oci_gpu_hook.appliers import cdi
from oci_gpu_hook.config import Config
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.inventory import Inventory, backend
from oci_gpu_hook.log import PROGRAM

DEFAULT_SUBSYSTEMS = ("drm", "kfd", "pci")
GPU_VENDORS = frozenset({"1002", "10DE", "8086"})  # PCI_ID's vendor: AMD, NVIDIA, Intel (upper-case hex)
GPU_CLASSES = frozenset({0x03, 0x12})  # PCI base classes: display controller, processing accelerator
DEFAULT_DEBOUNCE = 1.0
MAX_WAIT_FACTOR = 10  # a burst is regenerated at the latest this many quiet periods after its first event
RESYNC = "OCI_GPU_HOOK_RESYNC"  # key of a marker event: uevents may have been lost, rescan
SUMMARY_EVENTS = 3  # events named in a regeneration line; the rest are counted


class Outcome(NamedTuple):
    """What one regeneration did: ``kind`` is wrote, unchanged, removed, none or failed."""

    kind: str
    text: str


class EventSource(Protocol):
    def poll(self, timeout: float | None) -> Mapping[str, Any] | None:
        """The next event, or None when ``timeout`` seconds passed (None: wait) or :meth:`wake` was called."""

    def wake(self) -> None:
        """Make a waiting :meth:`poll` return None now; safe to call from a signal handler."""


class QueueEvents:
    """Events put into a queue (by a test, or by :class:`KernelUevents`' reader thread)."""

    _WAKE = object()

    def __init__(self) -> None:
        # SimpleQueue: put() is reentrant, so a signal handler may call wake() while get() waits.
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def put(self, event: Mapping[str, Any]) -> None:
        self._queue.put(event)

    def poll(self, timeout: float | None) -> Mapping[str, Any] | None:
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        return None if item is self._WAKE else item

    def wake(self) -> None:
        self._queue.put(self._WAKE)


class UeventSocketLike(Protocol):
    def get(self) -> Any: ...

    def close(self) -> None: ...


def open_kernel_socket() -> UeventSocketLike:
    """pyroute2's uevent socket bound to the kernel's multicast group (not udev's)."""
    from pyroute2 import UeventSocket  # ~0.3 s: only the listening watcher pays for it
    from pyroute2.netlink.uevent import MONITOR_GROUP_KERNEL

    sock = UeventSocket()
    try:
        sock.bind(groups=MONITOR_GROUP_KERNEL)
    except BaseException:
        sock.close()
        raise
    return sock


def plain_event(message: Any) -> dict[str, Any] | None:
    """A pyroute2 ueventmsg as a plain dict (header + the KEY=VALUE fields); None for what is not a uevent.

    pyroute2 also hands out a terminator (on close) and, after a receive error, a
    message made from its internal error packet: neither has ``ACTION``.
    """
    event = {key: value for key, value in message.items() if key != "attrs"}
    header = event.get("header")
    event["header"] = dict(header) if isinstance(header, Mapping) else {}
    return event if event.get("ACTION") else None


class KernelUevents(QueueEvents):
    """The kernel's uevents: a daemon thread blocks in ``UeventSocket.get()`` and queues each one.

    The thread creates, binds and reads the socket itself (pyroute2 keeps its
    asyncio loop per thread).  On a read error (``ENOBUFS`` after an overflow;
    pyroute2's socket stays broken afterwards) it queues a :data:`RESYNC` marker,
    opens a new socket and goes on, retrying with a growing delay if that fails.
    """

    def __init__(self, open_socket: Callable[[], UeventSocketLike] = open_kernel_socket,
                 retry_delay: float = 1.0, max_retry_delay: float = 60.0) -> None:
        super().__init__()
        self._open_socket = open_socket
        self._retry_delay = retry_delay
        self._max_retry_delay = max_retry_delay
        self._ready = threading.Event()
        self._closed = threading.Event()
        self._start_error: BaseException | None = None
        self._sock: UeventSocketLike | None = None
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 30.0) -> None:
        """Open and bind the socket (in the reader thread); HookError when that fails."""
        self._thread = threading.Thread(target=self._read, name="uevents", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise HookError(f"cannot listen for kernel uevents: the netlink socket was not ready in {timeout:g} s")
        if self._start_error is not None:
            err = self._start_error
            reason = err.strerror if isinstance(err, OSError) and err.strerror else f"{type(err).__name__}: {err}"
            raise HookError(f"cannot listen for kernel uevents (netlink NETLINK_KOBJECT_UEVENT): {reason}")

    def close(self) -> None:
        self._closed.set()
        sock = self._sock
        if sock is not None:
            try:
                sock.close()  # wakes the reader's get()
            except Exception:
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2.0)

    def _read(self) -> None:
        delay = self._retry_delay
        first = True
        while not self._closed.is_set():
            try:
                sock = self._open_socket()
            except Exception as err:
                if first:
                    self._start_error = err
                    self._ready.set()
                    return
                self.put({RESYNC: f"cannot reopen the uevent socket ({_reason(err)}); retrying in {delay:g} s"})
                self._closed.wait(delay)
                delay = min(delay * 2, self._max_retry_delay)
                continue
            self._sock = sock
            if first:
                first = False
                self._ready.set()
            else:
                self.put({RESYNC: "uevent socket reopened"})
                delay = self._retry_delay
            try:
                while not self._closed.is_set():
                    for message in sock.get():
                        event = plain_event(message)
                        if event is not None:
                            self.put(event)
            except Exception as err:
                if not self._closed.is_set():
                    self.put({RESYNC: f"uevent socket failed ({_reason(err)}): uevents may have been lost"})
            finally:
                self._sock = None
                try:
                    sock.close()
                except Exception:
                    pass
            self._closed.wait(delay)


def _reason(err: BaseException) -> str:
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return f"{type(err).__name__}: {err}"


def gpu_pci(event: Mapping[str, Any]) -> bool:
    """A uevent of a GPU's PCI function: ``PCI_ID`` ``VVVV:DDDD`` of a GPU vendor, ``PCI_CLASS`` (hex, no leading
    zero: ``30200``) of a display controller or a processing accelerator.  The kernel sends both with every
    action of a PCI device, ``remove`` and ``unbind`` included."""
    vendor = str(event.get("PCI_ID") or "").partition(":")[0].upper()
    text = str(event.get("PCI_CLASS") or "")
    if vendor not in GPU_VENDORS or not text or not all(c in "0123456789abcdefABCDEF" for c in text):
        return False
    return int(text, 16) >> 16 in GPU_CLASSES


def gpu_uevent(event: Mapping[str, Any], subsystems: Collection[str] = DEFAULT_SUBSYSTEMS) -> bool:
    """Whether ``event`` may change a GPU: its ``SUBSYSTEM`` is one of ``subsystems``, and a ``pci`` one is a GPU's
    (:func:`gpu_pci`)."""
    subsystem = event.get("SUBSYSTEM")
    if subsystem not in subsystems:
        return False
    return subsystem != "pci" or gpu_pci(event)


def event_summary(event: Mapping[str, Any]) -> str:
    """``ACTION SUBSYSTEM DEVPATH`` (``change mem /devices/virtual/mem/null``)."""
    if RESYNC in event:
        return str(event[RESYNC])
    header = event.get("header")
    message = str(header.get("message", "")) if isinstance(header, Mapping) else ""
    action, _, devpath = message.partition("@")
    action = str(event.get("ACTION") or action or "?")
    devpath = str(event.get("DEVPATH") or devpath or "?")
    return f"{action} {event.get('SUBSYSTEM') or '?'} {devpath}"


def output_format(path: str) -> str:
    if path.endswith(".json"):
        return "json"
    if path.endswith((".yaml", ".yml")):
        return "yaml"
    raise HookError(f"--output {path}: a CDI spec file ends in .json or .yaml (CDI consumers read only those)")


def resolve_targets(target: str | None, config: Config, kind: str | None = None) -> list[tuple[str, str, str]]:
    """(kind, spec file, format) for each kind kept current: a directory (default ``cdi_dir``) gets one
    ``<vendor>-<class>.json`` per backend, as ``cdi generate`` names them; a file needs one kind.

    Directories are created if missing (``/var/run/cdi`` is a tmpfs); one that cannot be created or
    written is a HookError.
    """
    kinds = [kind] if kind else list(config.backends)
    target = target or config.cdi_dir
    if os.path.isdir(target) or target.endswith("/") or target == config.cdi_dir:
        targets = [(k, os.path.join(os.path.abspath(target), cdi.file_name(config, k, "json")), "json")
                   for k in kinds]
    else:  # a file holds one kind: the one its name says (intel.com-gpu.json), else the first backend
        named = [k for k in kinds if os.path.basename(target).startswith(cdi.file_name(config, k, ""))]
        targets = [((named or kinds)[0], os.path.abspath(target), output_format(target))]
    for _kind, path, _fmt in targets:
        directory = os.path.dirname(path)
        if os.path.lexists(directory) and not os.path.isdir(directory):
            raise HookError(f"--output {target}: {directory} is not a directory")
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as err:
            raise HookError(f"--output {target}: cannot create {directory}: {err.strerror}") from None
        if not os.access(directory, os.W_OK | os.X_OK):
            raise HookError(f"--output {target}: cannot write into {directory}")
    return targets


def update_spec(inventory: Inventory, kind: str, path: str, fmt: str, config: Config, *,
                name_kind: bool = False) -> Outcome:
    """Bring the spec of ``kind`` at ``path`` in line with ``inventory``: generate, validate, write atomically
    when its text changed; with no device of the kind, remove a stale spec of this project's kind.  The one
    regeneration, for ``watch`` and the device plugin.  ``name_kind``: say the kind and path in the "no GPUs"
    line (several targets).  A HookError when the spec cannot be written or the stale one removed."""
    devices = inventory.devices(kind)
    if not devices:
        return _no_gpus(inventory.sysfs_root, kind, path, config, name_kind)
    spec = cdi.generate(inventory, kind, config)
    cdi.validate(spec, f"generated CDI spec of {kind}")
    modes = sorted({d.mode for d in devices} - {""})
    counts = (f"({len(spec['devices'])} devices, {len(devices)} GPU{'s' if len(devices) != 1 else ''}"
              f"{', mode ' + ' '.join(modes) if modes else ''})")
    if cdi.write(path, cdi.render(spec, fmt)):
        return Outcome("wrote", f"wrote {path} {counts}")
    return Outcome("unchanged", f"unchanged {path} {counts}")


def _no_gpus(sysfs_root: str, kind: str, path: str, config: Config, name_kind: bool) -> Outcome:
    what = f"{kind} GPUs" if name_kind else "GPUs"
    prefix = f"no {what} under {sysfs_root}: nothing written (a CDI spec needs a device)"
    if name_kind:
        prefix += f" to {path}"
    if not os.path.lexists(path):
        return Outcome("none", prefix)
    try:
        existing = cdi.load(path)
    except HookError as err:
        return Outcome("none", f"{prefix}; left {path} alone ({err})")
    cdi_kind = config.cdi_kind(kind)
    if existing.get("kind") != cdi_kind:
        return Outcome("none", f"{prefix}; left {path} alone (kind {existing.get('kind')!r}, not {cdi_kind!r})")
    try:
        os.unlink(path)
    except FileNotFoundError:
        return Outcome("none", prefix)
    except OSError as err:
        raise HookError(f"no {kind} GPUs, but cannot remove the stale spec {path}: {err.strerror}") from None
    return Outcome("removed", f"{prefix}; removed the stale spec {path}")


OUTCOME_WEIGHT = {"failed": 4, "wrote": 3, "removed": 2, "unchanged": 1, "none": 0}


class Watcher:
    """Regenerates the CDI spec at ``output`` when a watched uevent comes from ``source``."""

    def __init__(self, config: Config, targets: list[tuple[str, str, str]], source: EventSource | None = None, *,
                 subsystems: tuple[str, ...] = DEFAULT_SUBSYSTEMS, debounce: float = DEFAULT_DEBOUNCE,
                 clock: Callable[[], float] = time.monotonic, stream: TextIO | None = None,
                 dev: str | None = None) -> None:
        self.config = config
        self.dev = dev  # where the missing /dev/char links are made as GPUs appear (None: nowhere)
        self.targets = targets
        self.source = source if source is not None else QueueEvents()
        self.subsystems = frozenset(subsystems)
        self.subsystem_list = tuple(subsystems)
        self.debounce = debounce
        self.clock = clock
        self.stream = stream
        self.pending: list[Mapping[str, Any]] = []
        self.first_pending = 0.0
        self.deadline: float | None = None
        self.stop_reason: str | None = None
        self.last: Outcome | None = None

    # --- output ---------------------------------------------------------------

    def log(self, message: str) -> None:
        now = time.time()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
        stream = self.stream or sys.stderr
        stream.write(f"{stamp} {PROGRAM} watch: {' '.join(message.split())}\n")
        stream.flush()

    # --- regeneration ---------------------------------------------------------

    def generate(self) -> Outcome:
        """Scan, generate, validate, write each kind's spec when changed (or remove a stale one)."""
        from oci_gpu_hook.inventory import scan_host

        inventory = scan_host(self.config, [kind for kind, _path, _fmt in self.targets])
        for kind in inventory.kinds:  # NVIDIA's MIG UUIDs afresh: a resident process outlives MIG instances
            backend(kind).refresh(inventory.devices(kind))
        outcomes = [self._one(inventory, kind, path, fmt) for kind, path, fmt in self.targets]
        links = self._dev_char_links(inventory)
        if len(outcomes) == 1:
            return Outcome(outcomes[0].kind, outcomes[0].text + links)
        worst = max(outcomes, key=lambda o: OUTCOME_WEIGHT[o.kind])
        return Outcome(worst.kind, "; ".join(o.text for o in outcomes) + links)

    def _dev_char_links(self, inventory: Inventory) -> str:
        """The missing /dev/char links of the GPUs now there (:mod:`oci_gpu_hook.cluster.devchar`), as text to append to
        the line: nothing when none was missing; a failure is said, and the spec's outcome stands."""
        if self.dev is None:
            return ""
        from oci_gpu_hook.cluster import devchar

        try:
            made = devchar.make_links(inventory, self.dev, devchar.state_for(self.dev))
        except HookError as err:
            return f"; /dev/char links not made: {err}"
        return f"; made {', '.join(made)}" if made else ""

    def _one(self, inventory: Inventory, kind: str, path: str, fmt: str) -> Outcome:
        return update_spec(inventory, kind, path, fmt, self.config, name_kind=len(self.targets) > 1)

    def regenerate(self, reason: str) -> Outcome:
        """:meth:`generate`, with any failure logged instead of raised; one log line either way."""
        try:
            outcome = self.generate()
        except HookError as err:
            outcome = Outcome("failed", f"failed: {err}")
        except Exception as err:  # the watcher outlives a bug in one regeneration; the line says what it was
            if self.config.debug:
                import traceback

                traceback.print_exception(err, file=self.stream or sys.stderr)
            outcome = Outcome("failed", f"failed: internal error: {type(err).__name__}: {err}")
        self.last = outcome
        self.log(f"{reason}: {outcome.text}")
        return outcome

    # --- events ---------------------------------------------------------------

    def relevant(self, event: Mapping[str, Any]) -> bool:
        return RESYNC in event or gpu_uevent(event, self.subsystems)

    def handle(self, event: Mapping[str, Any]) -> bool:
        """Take one event; a relevant one (re)starts the quiet period.  Returns whether it was relevant."""
        if not self.relevant(event):
            if self.config.debug:
                self.log(f"ignored uevent {event_summary(event)}")
            return False
        now = self.clock()
        if not self.pending:
            self.first_pending = now
        self.pending.append(event)
        cap = self.first_pending + MAX_WAIT_FACTOR * self.debounce
        self.deadline = min(now + self.debounce, cap)
        return True

    def due(self) -> bool:
        return self.deadline is not None and self.clock() >= self.deadline

    def flush(self) -> Outcome | None:
        """Regenerate for the pending events, if any."""
        if not self.pending:
            return None
        events, self.pending, self.deadline = self.pending, [], None
        names = list(dict.fromkeys(event_summary(e) for e in events))
        shown = ", ".join(names[:SUMMARY_EVENTS]) + (f", +{len(names) - SUMMARY_EVENTS} more"
                                                     if len(names) > SUMMARY_EVENTS else "")
        count = f"{len(events)} uevent{'s' if len(events) != 1 else ''}"
        return self.regenerate(f"after {count} ({shown})")

    def step(self) -> None:
        """Wait for the next event or the end of the quiet period, whichever comes first; act on it."""
        timeout = None if self.deadline is None else max(0.0, self.deadline - self.clock())
        event = self.source.poll(timeout)
        if event is not None:
            self.handle(event)
        if self.due() and self.stop_reason is None:
            self.flush()

    def listening_line(self) -> str:
        return (f"listening for kernel uevents of {', '.join(self.subsystem_list)} "
                f"(debounce {self.debounce:g} s, specs {', '.join(path for _k, path, _f in self.targets)})")

    def run(self, warning: str | None = None) -> int:
        """Write the spec once, then regenerate after each burst of relevant events until :meth:`stop`."""
        if self.stop_reason is None:
            self.regenerate("start")
        if self.stop_reason is None:
            if warning:
                self.log(warning)
            self.log(self.listening_line())
        while self.stop_reason is None:
            self.step()
        dropped = f" ({len(self.pending)} pending uevents dropped; the next start rescans)" if self.pending else ""
        self.log(f"stopping on {self.stop_reason}{dropped}")
        return 0

    def stop(self, reason: str = "request") -> None:
        """End :meth:`run` after the current step; safe to call from a signal handler."""
        self.stop_reason = reason
        self.source.wake()


def user_namespace_warning(uid_map: str = "/proc/self/uid_map") -> str | None:
    """A warning when this process is not in the initial user namespace (where uevents may not arrive)."""
    try:
        with open(uid_map, encoding="ascii") as handle:
            fields = handle.read().split()
    except OSError:
        return None
    if fields == ["0", "0", "4294967295"]:
        return None
    return ("warning: running in a user namespace: unless the network namespace is the host's (or another one "
            "owned by the initial user namespace), the kernel delivers no uevents here and the spec is only "
            "written at start")
