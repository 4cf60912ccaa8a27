"""The planner's optional Prometheus endpoint (``serve --metrics-address``): a process of its own.

**Why a process.**  The daemon forks a worker for every request; a fork of a process with threads copies the locks
its other threads hold, and an HTTP server is threads.  So the endpoint (``prometheus_client``'s server, as for the
device plugin and the DRA driver: :mod:`oci_gpu_hook.host.metrics`) runs in a child forked from the daemon, which
stays one thread; a slow scrape, or the scan a scrape makes, never delays a start either.

**What it counts.**  Each worker tells it its request's path, outcome and reason (the closed sets of
:mod:`oci_gpu_hook.host.metrics`) and its time from accept to answer, as one datagram on a socket only the
daemon's forks hold, sent (never blocking; dropped where the queue is full) just before the worker answers: a
scrape after a start's answer counts that start (:class:`~oci_gpu_hook.host.metrics.StartCounts`).  This process
takes the datagrams in every DRAIN_S and at each scrape, and never waits on the socket: a datagram wakes no process
on its way (a woken reader can take the CPU from the worker before its answer: docs/health.md).  The fronts and
hooks send nothing: what the planner sees of a request is all there is (a front that runs Python without asking,
the planner absent or not root's, is not counted here; the journal has its line).

**The devices.**  Each scrape scans the host as the config says (as ``list`` does) and samples every GPU's health
signals (:class:`oci_gpu_hook.host.health.Monitor`, kept between scrapes so that a count that rises between two is
seen); no uevents reach it, so a wedged GPU is for the device plugin and the DRA driver to report.  A device seen
once stays listed, ``gone`` once the scan no longer finds it.

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

    from oci_gpu_hook.config import Config
    from oci_gpu_hook.host.metrics import DeviceRow

READY_TIMEOUT_S = 30.0  # for the child's first line: imported, listening
RESTART_S = 10.0
DRAIN_S = 0.5  # how often the endpoint's process takes the workers' datagrams in (and at each scrape)
SEND_BUFFER = 4 << 20  # the datagrams waiting for it: thousands (each costs its buffer about 1 KiB)
PR_SET_PDEATHSIG = 1


class Devices:
    """The host's devices and their health, as a scrape of the planner shows them."""

    def __init__(self, config: Config) -> None:
        import threading

        from oci_gpu_hook.host.health import Monitor, Settings

        self.config = config
        self.monitor = Monitor(Settings.of(config), config.sysfs_root)
        self.seen: dict[str, tuple[str, str, str]] = {}  # stable name -> (vendor, type, PCI address)
        self.last: list[DeviceRow] = []
        self.lock = threading.Lock()

    def rows(self) -> list[DeviceRow]:
        from oci_gpu_hook.host.health import GOOD
        from oci_gpu_hook.host.metrics import DeviceRow
        from oci_gpu_hook.inventory import backend, scan_host, stable_name

        with self.lock:
            try:
                inventory = scan_host(self.config, strict=False)
                verdicts = self.monitor.sample(inventory)
            except (HookError, OSError):
                return self.last  # sysfs changing under the scan: the last rows, until the next scrape
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

        from oci_gpu_hook.host.metrics import parse_address, start_line

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
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        return 0  # the daemon is already gone
    from oci_gpu_hook.host.metrics import Collector, Endpoint, StartCounts

    counts = StartCounts(receive)
    try:
        endpoint = Endpoint(address, Collector(Devices(config).rows), counts)
    except HookError as err:
        os.write(ready, f"error {' '.join(str(err).split())}\n".encode())
        return 1
    os.write(ready, f"ok {endpoint.address}\n".encode())
    os.close(ready)
    while True:  # never waiting on the socket: a worker's datagram wakes nothing on its way to its answer
        time.sleep(DRAIN_S)
        counts.take()
