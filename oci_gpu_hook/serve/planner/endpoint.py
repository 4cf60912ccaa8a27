"""The planner's optional Prometheus endpoint (``serve --metrics-address``): a process of its own.

**Why a process.**  The daemon forks a worker for every request; a fork of a process with threads copies the locks
its other threads hold, and an HTTP server is threads.  So the endpoint (``prometheus_client``'s server, as for the
device plugin and the DRA driver: :mod:`oci_gpu_hook.cluster.metrics`) runs in a child forked from the daemon, which
stays one thread; a slow scrape, or the scan a scrape makes, never delays a start either.

**What it counts.**  Each worker tells it its request's path, outcome and reason (the closed sets of
:mod:`oci_gpu_hook.cluster.metrics`) and its time from accept to answer, as one datagram on a socket only the
daemon's forks hold, sent (never blocking; dropped where the queue is full) just before the worker answers: a
scrape after a start's answer counts that start (:class:`~oci_gpu_hook.cluster.metrics.StartCounts`).  This process
takes the datagrams in every DRAIN_S and at each scrape, and never waits on the socket: a datagram wakes no process
on its way (a woken reader can take the CPU from the worker before its answer: docs/health.md).  The fronts and
hooks send nothing: what the planner sees of a request is all there is (a front that runs Python without asking,
the planner absent or not root's, is not counted here; the journal has its line).

**The devices.**  A scrape scans the host as the config says (as ``list`` does) and samples every GPU's health
signals (:class:`oci_gpu_hook.cluster.health.Monitor`, kept between scrapes so that a count that rises between two is
seen); no uevents reach it, so a wedged GPU is for the device plugin and the DRA driver to report.  A device seen
once stays listed, ``gone`` once the scan no longer finds it.  The rows of a scan serve every scrape for ROWS_FRESH_S
after it: a storm of scrapes (or of connections, which anyone who reaches the port can send) rescans sysfs once a
second at most.

**Privileges.**  The daemon is root with every capability (it enters the fronts' namespaces); the endpoint needs
none of that once its socket is bound.  So the process, after it binds and before its serving thread starts
(capabilities and no-new-privs are per thread: a thread started before would keep them), scans once (the modules a
scan and a scrape import are loaded while it can still read them) and then drops what it does not need
(:func:`drop_privileges`): no-new-privs, an empty capability bounding set, no ambient, inheritable, permitted or
effective capability, no supplementary group, and uid and gid UNPRIVILEGED (65534, the kernel's default overflow ids,
``nobody`` and ``nogroup`` on most distributions: ids that own no file here, so the process reads what everyone may
read, sysfs included, and writes only where everyone may).  A daemon that is not root (only tests start one so) keeps
its uid and drops the rest.  A drop that fails is the one line, and no endpoint: ``serve`` exits 1 at start, a
restart says so and tries again.

**Lifetime.**  It starts before the daemon serves (a bad address, a port in use, no ``prometheus_client``: the one
line, and ``serve`` exits 1); it dies with the daemon (``PR_SET_PDEATHSIG``) and is stopped with it; one that exits
is started again after RESTART_S (its counts then start from 0, which Prometheus's ``rate`` and ``increase`` take
as a counter reset).
"""

from __future__ import annotations

import os

from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from oci_gpu_hook.cluster.metrics import DeviceRow
    from oci_gpu_hook.config import Config

READY_TIMEOUT_S = 30.0  # for the child's first line: imported, listening
RESTART_S = 10.0
DRAIN_S = 0.5  # how often the endpoint's process takes the workers' datagrams in (and at each scrape)
SEND_BUFFER = 4 << 20  # the datagrams waiting for it: thousands (each costs its buffer about 1 KiB)
PR_SET_PDEATHSIG = 1
ROWS_FRESH_S = 1.0  # a scan's rows serve every scrape for this long
UNPRIVILEGED = 65534  # the endpoint's uid and gid once it listens (when the daemon is root): nobody, nogroup
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
CAPABILITY_VERSION_3 = 0x20080522  # capset(2)'s header: 64-bit sets, two 32-bit words each


def say(line: str) -> None:
    import sys

    print(f"oci-gpu-hook serve: metrics: {line}", file=sys.stderr, flush=True)


class Devices:
    """The host's devices and their health, as a scrape of the planner shows them."""

    def __init__(self, config: Config, clock: Callable[[], float] | None = None) -> None:
        import threading
        import time

        from oci_gpu_hook.cluster.health import Monitor, Settings

        self.config = config
        self.clock = clock or time.monotonic
        # a counter file that cannot be read is one line on the endpoint's stderr (the planner unit's journal)
        self.monitor = Monitor(Settings.from_config(config), config.sysfs_root, log=say)
        self.seen: dict[str, tuple[str, str, str]] = {}  # stable name -> (vendor, type, PCI address)
        self.last: list[DeviceRow] = []
        self.scanned: float | None = None  # self.clock() at the last scan
        self.scans = 0
        self.lock = threading.Lock()

    def rows(self) -> list[DeviceRow]:
        """The devices, from a scan at most ROWS_FRESH_S old (under one lock: concurrent scrapes share a scan)."""
        from oci_gpu_hook.cluster.health import GOOD
        from oci_gpu_hook.cluster.metrics import DeviceRow
        from oci_gpu_hook.inventory import backend, scan_host, stable_name

        with self.lock:
            now = self.clock()
            if self.scanned is not None and 0 <= now - self.scanned < ROWS_FRESH_S:
                return self.last
            self.scanned = now
            self.scans += 1
            try:
                inventory = scan_host(self.config, strict=False)
                verdicts = self.monitor.sample(inventory)
            except (HookError, OSError, ImportError):
                return self.last  # sysfs changing under the scan (or unreadable): the last rows, until the next one
            present = {}
            for device in inventory.all_devices:
                kind = "gpu" if device.partition is None else backend(device.kind).part  # as the device plugin
                present[stable_name(device)] = (device.kind, kind, device.pci_address)
            self.seen.update(present)
            rows = []
            for name, (vendor, kind, pci) in sorted(self.seen.items()):
                if name in present:
                    verdict = verdicts.get(pci, GOOD)
                    rows.append(DeviceRow(name, vendor, kind, "present", verdict.healthy, verdict.signal))
                else:
                    rows.append(DeviceRow(name, vendor, kind, "gone", False, "gone"))
            self.last = rows
            return rows


class Metrics:
    """The daemon's side: the socket its workers report on (:meth:`report`), the endpoint's process (:meth:`start`,
    :meth:`keep`, :meth:`stop`)."""

    def __init__(self, address: str, config: Config, say: Callable[[str], None]) -> None:
        import socket

        from oci_gpu_hook.cluster.metrics import parse_address, start_line

        parse_address(address)  # a bad one is the one line before anything starts
        self.start_line = start_line  # loaded before the workers fork: they only look it up
        self.address = address
        self.config = config
        self.say = say
        self.receive, self.send = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.receive.setblocking(False)
        self.send.setblocking(False)
        for option in (getattr(socket, "SO_SNDBUFFORCE", 32), socket.SO_SNDBUF):  # root may pass wmem_max
            try:
                self.send.setsockopt(socket.SOL_SOCKET, option, SEND_BUFFER)
                break
            except OSError:
                continue
        self.pid = 0
        self.due = 0.0  # monotonic: when a process that exited is started again

    def report(self, path: str, outcome: str, reason: str, seconds: float | None) -> None:
        """A worker's request, told to the endpoint's process (never blocking)."""
        try:
            self.send.send(self.start_line(path, outcome, reason, seconds))
        except OSError:
            pass  # its queue is full (or it is being started again): this one is not counted

    def in_worker(self) -> None:
        """A worker keeps the sending end only."""
        self.receive.close()

    def start(self, close: Callable[[], None]) -> str:
        """Fork the endpoint's process (``close``: what the child must not hold, called in it first) and wait for it
        to listen; where it listens, or HookError with its one line."""
        import select

        ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child; tests scrape it
            code = 1
            try:
                os.close(ready_r)
                close()
                code = _serve(self.address, self.config, self.receive, ready_w, parent)
            except BaseException as err:
                try:
                    os.write(ready_w, f"error the metrics endpoint failed: {type(err).__name__}: {err}\n".encode())
                except OSError:
                    pass
            finally:
                os._exit(code)
        os.close(ready_w)
        try:
            line = b""
            while not line.endswith(b"\n"):
                if not select.select([ready_r], [], [], READY_TIMEOUT_S)[0]:
                    break
                chunk = os.read(ready_r, 4096)
                if not chunk:
                    break
                line += chunk
        finally:
            os.close(ready_r)
        text = line.decode(errors="replace").strip()
        if text.startswith("ok "):
            self.pid = pid
            return text[3:]
        self._reap(pid)
        raise HookError(text[6:] if text.startswith("error ") else
                        f"--metrics-address {self.address}: the endpoint's process did not start")

    def _reap(self, pid: int) -> None:
        import signal

        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass

    def exited(self, pid: int, status: int) -> bool:
        """Whether ``pid`` (reaped by the daemon) was the endpoint's process; then it is said, and started again
        after RESTART_S."""
        import time

        if pid != self.pid or pid == 0:
            return False
        self.pid = 0
        self.due = time.monotonic() + RESTART_S
        self.say(f"the metrics endpoint exited (wait status {status}); starting it again in {RESTART_S:g} s")
        return True

    def keep(self, close: Callable[[], None]) -> None:
        """Start the endpoint's process again where it exited and its time has come."""
        import time

        if self.pid or time.monotonic() < self.due:
            return
        try:
            where = self.start(close)
        except HookError as err:
            self.due = time.monotonic() + RESTART_S
            self.say(f"{err}; trying again in {RESTART_S:g} s")
            return
        self.say(f"metrics at http://{where}/metrics (process {self.pid}, started again; the counts start from 0)")

    def stop(self) -> None:
        if self.pid:
            self._reap(self.pid)
            self.pid = 0


def _serve(address: str, config: Config, receive: object, ready: int, parent: int) -> int:  # pragma: no cover
    """The endpoint's process (a child of ``parent``, the daemon): listen, say so on ``ready``, count what the
    workers send until killed."""
    import ctypes
    import signal
    import time

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)

    def follow_parent() -> bool:  # again after the drop: a change of credentials clears the parent-death signal
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass
        return os.getppid() == parent

    if not follow_parent():
        return 0  # the daemon is already gone
    from oci_gpu_hook.cluster.metrics import Collector, Endpoint, StartCounts

    counts = StartCounts(receive)

    def before_serving(registry: Any) -> None:  # bound, no thread yet: a scrape while root, then the drop
        from prometheus_client import generate_latest

        generate_latest(registry)  # every module a scrape imports is loaded, and the rows are primed
        drop_privileges()
        if not follow_parent():
            os._exit(0)  # the daemon went while this process dropped its privileges

    try:
        endpoint = Endpoint(address, Collector(Devices(config).rows), counts, before_serving=before_serving)
    except HookError as err:
        os.write(ready, f"error {' '.join(str(err).split())}\n".encode())
        return 1
    os.write(ready, f"ok {endpoint.address}\n".encode())
    os.close(ready)
    while True:  # never waiting on the socket: a worker's datagram wakes nothing on its way to its answer
        time.sleep(DRAIN_S)
        counts.take()


def drop_privileges(uid: int = UNPRIVILEGED, gid: int = UNPRIVILEGED) -> None:
    """Drop what a process that only listens and reads world-readable files does not need (see the module's text),
    in this thread and every thread it starts after; HookError with the one line where the kernel refuses a step.
    Root becomes ``uid``/``gid``; any other uid keeps its ids."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def prctl(what: str, *args: int) -> None:
        if libc.prctl(*(ctypes.c_ulong(a) for a in (*args, 0, 0, 0, 0)[:5])) != 0:
            raise HookError(f"the metrics endpoint cannot drop its privileges ({what}): "
                            f"{os.strerror(ctypes.get_errno())}")

    root = os.geteuid() == 0
    if root:  # the bounding set first: it takes CAP_SETPCAP, which the uid change below ends
        with open("/proc/sys/kernel/cap_last_cap", "rb") as handle:
            last = int(handle.read())
        for cap in range(last + 1):
            prctl(f"capability {cap} out of the bounding set", PR_CAPBSET_DROP, cap)
    prctl("ambient capabilities", PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    if root:
        try:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)  # permitted and effective capabilities go with uid 0
        except OSError as err:
            raise HookError(f"the metrics endpoint cannot become uid {uid} gid {gid}: {err.strerror} "
                            "(does this user namespace map them?)") from None

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    if libc.capset(ctypes.byref(Header(CAPABILITY_VERSION_3, 0)), ctypes.byref((Data * 2)())) != 0:
        raise HookError(f"the metrics endpoint cannot drop its capabilities: {os.strerror(ctypes.get_errno())}")
    prctl("no new privileges", PR_SET_NO_NEW_PRIVS, 1)
    held = _held(uid if root else os.getuid(), gid if root else os.getgid(), bounded=root)
    if held:
        raise HookError(f"the metrics endpoint still holds {held} after dropping its privileges")


def _held(uid: int, gid: int, bounded: bool) -> str:
    """What this thread still holds that it should not, as /proc says (empty when nothing): a capability in any set
    (the bounding set where ``bounded``), a uid or gid other than ``uid``/``gid``, a supplementary group where it was
    root, no-new-privs off."""
    with open("/proc/thread-self/status", "rb") as handle:  # bytes: no codec to import once unprivileged
        text = handle.read().decode(errors="replace")
    fields = {key: value.split() for key, _colon, value in (line.partition(":") for line in text.splitlines())}
    sets = ("CapInh", "CapPrm", "CapEff", "CapAmb", *(("CapBnd",) if bounded else ()))
    held = [name for name in sets if int((fields.get(name) or ["1"])[0], 16)]
    if fields.get("Uid") != [str(uid)] * 4 or fields.get("Gid") != [str(gid)] * 4:
        held.append(f"ids other than uid {uid} gid {gid}")
    if bounded and fields.get("Groups"):
        held.append("supplementary groups")
    if fields.get("NoNewPrivs") != ["1"]:
        held.append("the right to gain privileges (no-new-privs is off)")
    return ", ".join(held)
