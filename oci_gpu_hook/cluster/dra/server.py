"""The DRA kubelet plugin: its two sockets, the kubelet's calls, and the rescan that keeps the slices current.

The kubelet's plugin watcher finds ``<registry dir>/<driver>-reg.sock``
(``/var/lib/kubelet/plugins_registry``), calls ``Registration.GetInfo`` there
(type ``DRAPlugin``, the driver name, the DRA socket
``<plugins dir>/<driver>/dra.sock``, and the services offered there:
``v1.DRAPlugin`` for Kubernetes 1.34+, ``v1beta1.DRAPlugin`` for 1.32 and
1.33, and ``v1alpha1.DRAResourceHealth``), then ``NotifyRegistrationStatus``.  It then calls
``NodePrepareResources`` / ``NodeUnprepareResources`` of the version it chose
on the DRA socket (:mod:`.claims` does the work; a claim's failure is its
entry's ``error``, one line).  A kubelet with ResourceHealthStatus on watches
``NodeWatchResources`` there: every device seen since start, Healthy while
published and its GPU's own signals (:mod:`oci_gpu_hook.cluster.health`) are clear, else Unhealthy with the
reason as its message (once gone: gone), sent at every change and again every
``HEALTH_RESEND_S`` (a 1.36 kubelet counts a device whose last report is older
than 30 s as Unknown, and shows that in the status of a pod started later).
When a socket file disappears (a kubelet that cleans its directories, an
operator), :class:`Driver` serves again on a fresh one, as the device plugin
does.

The devices (:func:`.devices.build` over a lenient scan) are read again every
``--rescan-interval`` seconds, soon after each GPU uevent
(:func:`oci_gpu_hook.cluster.watch.gpu_uevent`), and before every prepare; the
slices (:class:`.slices.Publisher`) follow every scan, so a GPU that leaves, or
changes partition mode, leaves the node's ResourceSlices within one rescan.
An API server that cannot be reached is said once and retried at every rescan.

Health in the slices: a device whose GPU is Unhealthy carries the taint ``<driver>/unhealthy=<signal>``
(KEP-5055), ``NoSchedule``, or ``NoExecute`` for the signals the config's ``health_noexecute`` names, for as long
as the monitor says so (a count signal is held ``health_hold`` seconds); where the server keeps no taints
(:class:`.slices.Publisher` finds out) the health stream is all there is.  A device whose GPU's nodes vanished
while its PCI device stays is kept in the slice, tainted, until the GPU is back or gone (a ``NoExecute`` taint
then evicts the pods that used it); a prepare that names it is refused as gone.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from dataclasses import replace
from typing import Any

import grpc

from oci_gpu_hook.cluster.daemon import Resident, log_writer
from oci_gpu_hook.cluster.dra import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from oci_gpu_hook.cluster.dra import health_v1alpha1_pb2 as health
from oci_gpu_hook.cluster.dra import health_v1alpha1_pb2_grpc as health_grpc
from oci_gpu_hook.cluster.dra import registration_pb2 as reg
from oci_gpu_hook.cluster.dra import registration_pb2_grpc as reg_grpc
from oci_gpu_hook.cluster.dra.claims import ClaimError, Claims
from oci_gpu_hook.cluster.dra.devices import TAINT_NAME, DraDevice, Taint, build
from oci_gpu_hook.cluster.dra.kube import ApiError
from oci_gpu_hook.cluster.dra.slices import Publisher
from oci_gpu_hook.cluster.health import Monitor, Verdict
from oci_gpu_hook.cluster.metrics import DRA_PREPARED_CLAIMS, DeviceRow
from oci_gpu_hook.cluster.watch import EventSource
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.inventory import Inventory

PROGRAM = "oci-gpu-hook dra"
PLUGIN_TYPE = "DRAPlugin"
# What GetInfo offers: the kubelet picks the newest DRAPlugin it speaks, and watches health where it can.
SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth")
GONE = "gone from the host, or its GPU changed partition mode"
HEALTH_RESEND_S = 10.0  # well inside the kubelet's 30 s, after which an unreported device's health is Unknown
REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
PLUGINS_DIR = "/var/lib/kubelet/plugins"
UNIX_PATH_MAX = 108

Log = Callable[[str], None]
Scan = Callable[[], Inventory]


log_line = log_writer(PROGRAM)


class RegistrationServicer(reg_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: str, log: Log) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.log = log
        self.status: reg.RegistrationStatus | None = None
        self.notified = threading.Event()

    def GetInfo(self, request: reg.InfoRequest, context: grpc.ServicerContext) -> reg.PluginInfo:
        return reg.PluginInfo(type=PLUGIN_TYPE, name=self.driver, endpoint=self.endpoint,
                              supported_versions=list(SERVICES))

    def NotifyRegistrationStatus(self, request: reg.RegistrationStatus,
                                 context: grpc.ServicerContext) -> reg.RegistrationStatusResponse:
        self.status = request
        if request.plugin_registered:
            self.log(f"registered at the kubelet as {self.driver} (DRA socket {self.endpoint})")
        else:
            self.log(f"the kubelet refused to register {self.driver}: {' '.join(request.error.split())}")
        self.notified.set()
        return reg.RegistrationStatusResponse()


def _line(err: Exception, claim: Any) -> str:
    if isinstance(err, ClaimError):
        return str(err)
    detail = str(err) if isinstance(err, (HookError, OSError)) else f"internal error: {type(err).__name__}: {err}"
    return f"claim {claim.namespace}/{claim.name}: {' '.join(detail.split())}"


def _dra_servicer(pb2: Any, pb2_grpc: Any, claims: Claims, log: Log) -> Any:
    """The DRAPlugin service of one API version (v1 and v1beta1 differ only in their package)."""

    class Servicer(pb2_grpc.DRAPluginServicer):  # type: ignore[misc,name-defined]
        def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
            response = pb2.NodePrepareResourcesResponse()
            for claim in request.claims:
                entry = response.claims[claim.uid]
                try:
                    prepared = claims.prepare(claim.namespace, claim.name, claim.uid)
                except Exception as err:  # a claim's failure is its entry's one line, never the whole call's
                    entry.error = _line(err, claim)
                    log(f"prepare: {entry.error}")
                    continue
                for item in prepared:
                    entry.devices.add(request_names=[item.request] if item.request else [], pool_name=item.pool,
                                      device_name=item.device, cdi_device_ids=[item.cdi_name])
            return response

        def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
            response = pb2.NodeUnprepareResourcesResponse()
            for claim in request.claims:
                entry = response.claims[claim.uid]
                try:
                    claims.unprepare(claim.namespace, claim.name, claim.uid)
                except Exception as err:
                    entry.error = _line(err, claim)
                    log(f"unprepare: {entry.error}")
            return response

    return Servicer()


class HealthServicer(health_grpc.DRAResourceHealthServicer):
    """NodeWatchResources: every device seen since start, Healthy while published, Unhealthy once gone; a new
    answer on the stream at every change, and the same again every ``resend`` seconds (the kubelet forgets a
    report after 30 s)."""

    def __init__(self, driver: Driver, resend: float = HEALTH_RESEND_S) -> None:
        self.driver = driver
        self.resend = resend

    def NodeWatchResources(self, request: health.NodeWatchResourcesRequest,
                           context: grpc.ServicerContext) -> Iterator[health.NodeWatchResourcesResponse]:
        driver = self.driver
        seen = -1
        sent = 0.0
        while context.is_active() and not driver.stopping:
            with driver.health_changed:
                due = sent + self.resend - time.monotonic()
                if driver.health_generation == seen and due > 0:
                    driver.health_changed.wait(min(0.5, due))
                    continue
                seen = driver.health_generation
                snapshot = sorted(driver.health.items())
            sent = time.monotonic()
            answer = health.NodeWatchResourcesResponse()
            for name, (healthy, since, message) in snapshot:
                answer.devices.add(device=health.DeviceIdentifier(pool_name=driver.claims.node, device_name=name),
                                   health=health.HEALTHY if healthy else health.UNHEALTHY, last_updated_time=since,
                                   message=message)
            yield answer


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class Sockets:
    """The registration socket and the DRA socket, served by one gRPC server."""

    def __init__(self, registration_path: str, dra_path: str, make: Callable[[grpc.Server], None]) -> None:
        self.paths = (registration_path, dra_path)
        self.make = make
        self.server: grpc.Server | None = None
        self.identities: tuple[tuple[int, int] | None, ...] = ()

    def start(self) -> None:
        self.stop()
        for path in self.paths:
            if len(os.fsencode(path)) >= UNIX_PATH_MAX:
                raise HookError(f"cannot listen on {path} (a Unix socket path has at most {UNIX_PATH_MAX - 1} bytes)")
            try:
                os.makedirs(os.path.dirname(path), mode=0o750, exist_ok=True)
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as err:
                raise HookError(f"cannot prepare {path}: {err.strerror}") from None
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="dra"))
        self.make(server)
        for path in self.paths:
            try:
                bound = server.add_insecure_port(f"unix://{path}")
            except RuntimeError:
                bound = 0
            if not bound:
                server.stop(None)
                raise HookError(f"cannot listen on {path}")
        server.start()
        self.server = server
        self.identities = tuple(_identity(p) for p in self.paths)

    def alive(self) -> bool:
        return self.server is not None and all(
            i is not None and _identity(p) == i for p, i in zip(self.paths, self.identities, strict=True))

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=0.5).wait()
            for path, identity in zip(self.paths, self.identities, strict=True):
                if identity is not None and _identity(path) == identity:
                    try:
                        os.unlink(path)
                    except OSError:
                        pass
        self.server = None
        self.identities = ()


class Driver(Resident):
    """Scan, publish, serve; :meth:`run` until :meth:`stop`."""

    def __init__(self, driver: str, scan: Scan, publisher: Publisher | None, claims_factory: Callable[[Driver], Claims],
                 *, registry_dir: str = REGISTRY_DIR, plugins_dir: str = PLUGINS_DIR, rescan_interval: float = 10.0,
                 poll_interval: float = 1.0, events: EventSource | None = None, uevent_delay: float = 0.5,
                 log: Log = log_line, health_resend: float = HEALTH_RESEND_S, monitor: Monitor | None = None) -> None:
        self.driver = driver
        self.monitor = monitor or Monitor()  # the GPUs' health from their drivers' own signals
        self.scan = scan
        self.publisher = publisher
        self.log = log
        self.rescan_interval = rescan_interval
        self.poll_interval = poll_interval
        self.events = events
        self.uevent_delay = uevent_delay
        self.health_resend = health_resend
        self.lock = threading.Lock()  # a scan and the device list made from it, together
        self.publish_lock = threading.Lock()  # one sync at a time (the loop's and a prepare's)
        self.inventory: Inventory | None = None
        self.devices: list[DraDevice] = []
        self.ghosts: list[DraDevice] = []  # published, tainted, though gone: their GPU's nodes vanished
        self.seen: dict[str, DraDevice] = {}  # every device seen since start, as last seen (for the metrics)
        self.health: dict[str, tuple[bool, int, str]] = {}  # every device seen: (healthy, since, why not)
        self.health_generation = 0
        self.health_changed = threading.Condition()
        self.notes: list[str] = []
        self.scan_error: str | None = None
        self.api_error: str | None = None
        self.socket_error: str | None = None
        self.dirty = True  # the slices may not show self.devices
        self.next_rescan = 0.0
        self.rescan_reason = "start"
        self.stopping = False
        self.dra_path = os.path.join(os.path.abspath(plugins_dir), driver, "dra.sock")
        self.registration_path = os.path.join(os.path.abspath(registry_dir), f"{driver}-reg.sock")
        self.registration = RegistrationServicer(driver, self.dra_path, log)
        self.claims = claims_factory(self)
        self.sockets = Sockets(self.registration_path, self.dra_path, self._services)

    def _services(self, server: grpc.Server) -> None:
        reg_grpc.add_RegistrationServicer_to_server(self.registration, server)
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(
            _dra_servicer(dra_v1_pb2, dra_v1_pb2_grpc, self.claims, self.log), server)
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
            _dra_servicer(dra_v1beta1_pb2, dra_v1beta1_pb2_grpc, self.claims, self.log), server)
        health_grpc.add_DRAResourceHealthServicer_to_server(HealthServicer(self, self.health_resend), server)

    def rescan(self, reason: str) -> tuple[Inventory, list[DraDevice]]:
        """Read the host again (the last good scan stays when this one fails); the scan and its devices."""
        with self.lock:
            try:
                inventory = self.scan()
                devices, notes = build(inventory)
                if self.publisher is not None:  # a split GPU's whole too, only where the slices keep counters
                    devices = self.publisher.offered(devices)
            except Exception as err:  # sysfs changing under the scan must not end the plugin
                detail = str(err) if isinstance(err, (HookError, OSError)) else f"{type(err).__name__}: {err}"
                keeping = "keeping the last device list" if self.inventory is not None else "no devices known yet"
                message = f"rescan ({reason}) failed, {keeping}: {detail}"
                if message != self.scan_error:
                    self.log(message)
                self.scan_error = message
                if self.inventory is None:
                    raise HookError(f"cannot read this node's devices: {detail}") from None
                return self.inventory, self.devices
            self.scan_error = None
            for note in notes:
                if note not in self.notes:
                    self.log(f"{reason}: {note}")
            self.notes = notes
            verdicts = self.monitor.sample(inventory)
            devices = [self._tainted(d, verdicts.get(d.pci_address)) for d in devices]
            present = {d.name for d in devices}
            ghosts = [self._tainted(d, verdicts[d.pci_address]) for d in self.devices + self.ghosts
                      if d.name not in present and d.pci_address in verdicts
                      and verdicts[d.pci_address].signal == "vanished"]
            before = {d.name: d.fingerprint() for d in self.devices + self.ghosts}
            after = {d.name: d.fingerprint() for d in devices + ghosts}
            if before != after:
                gone = sorted(set(before) - set(after))
                came = sorted(set(after) - set(before))
                changed = sorted(n for n in set(before) & set(after) if before[n] != after[n])
                parts = [f"{label} {', '.join(names)}" for label, names in
                         (("new", came), ("gone", gone), ("changed", changed)) if names]
                self.log(f"{reason}: {len(devices)} device(s); {'; '.join(parts)}")
                self.dirty = True
            self.inventory, self.devices, self.ghosts = inventory, devices, ghosts
            self.seen.update((d.name, d) for d in devices + ghosts)
            self._track_health(devices + ghosts, verdicts)
            return inventory, devices

    def _tainted(self, device: DraDevice, verdict: Verdict | None) -> DraDevice:
        """The device with its GPU's taint (none while Healthy)."""
        if verdict is None or verdict.healthy:
            return replace(device, taint=None) if device.taint is not None else device
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(verdict.since))
        return replace(device, taint=Taint(f"{self.driver}/{TAINT_NAME}", verdict.signal,
                                           self.monitor.settings.effect(verdict.signal), stamp))

    def _track_health(self, devices: list[DraDevice], verdicts: Mapping[str, Verdict]) -> None:
        now = int(time.time())
        with self.health_changed:
            changed = False
            for device in devices:
                verdict = verdicts.get(device.pci_address)
                state = (True, 0, "") if verdict is None or verdict.healthy else (False, int(verdict.since),
                                                                                 verdict.reason)
                old = self.health.get(device.name)
                if old is None or (old[0], old[2]) != (state[0], state[2]):
                    self.health[device.name] = (state[0], state[1] or now, state[2])
                    changed = True
            present = {d.name for d in devices}
            for name, (_healthy, _since, why) in list(self.health.items()):
                if name not in present and why != GONE:
                    self.health[name] = (False, now, GONE)
                    changed = True
            if changed:
                self.health_generation += 1
                self.health_changed.notify_all()

    def current(self) -> tuple[Inventory, list[DraDevice]]:
        """A fresh scan for a prepare; the slices follow at once when it changed anything."""
        found = self.rescan("prepare")
        if self.dirty:
            self.publish()
        return found

    def publish(self) -> None:
        if self.publisher is None:
            self.dirty = False
            return
        with self.publish_lock:
            with self.lock:
                devices = self.devices + self.ghosts
                self.dirty = False
            try:
                self.publisher.sync(devices)
            except ApiError as err:
                self.dirty = True
                message = f"publishing ResourceSlices failed (retrying at every rescan): {err}"
                if message != self.api_error:
                    self.log(message)
                self.api_error = message
                return
            with self.lock:  # the sync may have learnt that the server keeps no counters
                self.devices = self.publisher.offered(self.devices)
            if self.api_error is not None:
                self.log("publishing ResourceSlices works again")
            self.api_error = None

    def step(self) -> None:
        reason = self.rescan_due()
        if reason is not None:
            try:
                self.rescan(reason)
            except HookError:
                pass  # said by rescan; nothing to publish yet
            self.publish()  # also a check: a slice changed or deleted by someone else is written again
        if not self.sockets.alive():
            if self.sockets.server is not None:
                self.log("a socket of the plugin is gone: serving again (the kubelet registers it anew)")
            try:
                self.sockets.start()
            except HookError as err:
                message = f"{err} (retrying)"
                if message != self.socket_error:
                    self.log(message)
                self.socket_error = message
                return
            self.socket_error = None

    def observe(self, event: Mapping[str, Any]) -> object:
        return self.monitor.event(event)

    def rows(self) -> list[DeviceRow]:
        """Every device seen since start as the metrics show it: published, prepared (a prepared claim holds it)
        or gone."""
        with self.claims.lock:
            held = {d.get("device") for record in self.claims.prepared.values() for d in record.get("devices", [])}
        with self.lock:
            seen = dict(self.seen)
        with self.health_changed:
            health = dict(self.health)
        verdicts = self.monitor.verdicts()
        out = []
        for name, (healthy, _since, why) in sorted(health.items()):
            device = seen.get(name)
            if device is None:
                continue
            gone = why == GONE
            verdict = verdicts.get(device.pci_address)
            signal = "gone" if gone else verdict.signal if verdict is not None else ""
            state = "gone" if gone else "prepared" if name in held else "published"
            out.append(DeviceRow(name, str(device.attributes["vendor"][1]), str(device.attributes["type"][1]), state,
                                 healthy, signal))
        return out

    def gauges(self) -> dict[str, tuple[str, float]]:
        with self.claims.lock:
            claims = len(self.claims.prepared)
        return {DRA_PREPARED_CLAIMS: ("Claims this driver has prepared on this node.", claims)}

    def started(self) -> str:
        return (f"driver {self.driver}: registration {self.registration_path}, DRA {self.dra_path}, rescan every "
                f"{self.rescan_interval:g} s")

    def close(self) -> None:
        self.sockets.stop()
