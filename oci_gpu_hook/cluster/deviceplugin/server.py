"""The kubelet device plugin (API v1beta1): endpoints, registration, the device tracker.

One gRPC endpoint per resource name, each on its own Unix socket in the
kubelet's device-plugins directory, registered at ``kubelet.sock`` there.  A
starting kubelet empties that directory, its plugins' sockets included, and
creates a new ``kubelet.sock``: :class:`Manager` checks once a second (by
default) and, when its socket is gone or ``kubelet.sock`` is a new file,
serves again on a fresh socket and registers again.

The devices come from :func:`~oci_gpu_hook.cluster.deviceplugin.devices.plan`
over the served kinds (AMD and NVIDIA: one process serves both kinds'
resources, one endpoint each), rescanned periodically (every 10 s by default: a
GPU gone without a uevent, or a MIG instance destroyed, is noticed then),
shortly after each GPU uevent (:func:`oci_gpu_hook.cluster.watch.gpu_uevent`), and
before every Allocate.  A device seen once stays in the list: Unhealthy while it
is missing from the host, Healthy again when it comes back under the same ID.
A device whose GPU's own signals say it is failing (:mod:`oci_gpu_hook.cluster.health`: amdgpu's RAS
uncorrectable errors, PCIe AER fatal errors, a ``WEDGED=`` uevent, its nodes gone while its PCI device
stays) is Unhealthy too, with the reason in the log, until the monitor says it recovered.

Allocate answers each container with the stable CDI names of its devices
(``amd.com/gpu=0000:05:00.0``, ``amd.com/gpu=0000:05:00.0-p3``,
``nvidia.com/gpu=GPU-...``, ``nvidia.com/gpu=MIG-...``; never an index, which
names other hardware once a GPU before it leaves), both in ``cdi_devices``
(kubelet passes them in the CRI's CDI field, which containerd 1.7+ with CDI
enabled and CRI-O apply) and in one container annotation,
``cdi.k8s.io/oci-gpu-hook_<resource>`` (which containerd 1.6 copies into
config.json for the ``oci-gpu`` RuntimeClass, where ``oci-gpu-runtime`` applies
it).  ``--device-specs`` adds the nodes as device specs, for nodes with neither.

Socket and annotation names: ``<resource name>`` for ``amd.com`` resources
(``oci-gpu-hook-gpu.sock``, ``cdi.k8s.io/oci-gpu-hook_cpx_nps1``), the vendor
before it for the others (``oci-gpu-hook-nvidia-gpu.sock``,
``cdi.k8s.io/oci-gpu-hook_nvidia-mig-1g.10gb``), so that every resource has its own.

The CDI specs of the managed directories (:mod:`.specs`) are regenerated after
every scan and checked before every answer: a name is handed out only when the
spec a runtime will read maps it to the device numbers the plugin sees now.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from dataclasses import replace
from typing import Any

import grpc

from oci_gpu_hook.cluster.daemon import Resident, log_writer
from oci_gpu_hook.cluster.deviceplugin import api_pb2 as api
from oci_gpu_hook.cluster.deviceplugin import api_pb2_grpc as api_grpc
from oci_gpu_hook.cluster.deviceplugin.allocation import preferred
from oci_gpu_hook.cluster.deviceplugin.devices import (
    ALWAYS_SERVED,
    SERVED,
    PluginDevice,
    gone,
    plan,
    scan_served,
    whole_gpu_resource,
)
from oci_gpu_hook.cluster.deviceplugin.specs import SpecKeeper
from oci_gpu_hook.cluster.health import Monitor
from oci_gpu_hook.cluster.metrics import DeviceRow
from oci_gpu_hook.cluster.watch import EventSource
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.inventory import Inventory

VERSION = "v1beta1"
DEFAULT_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
ANNOTATION_PREFIX = "cdi.k8s.io/oci-gpu-hook_"
PROGRAM = "oci-gpu-hook device-plugin"
UNIX_PATH_MAX = 108  # sun_path, its terminating NUL included
KEPT_NAMES = "amd.com"  # the first domain served: its sockets and annotations keep their unprefixed names

Log = Callable[[str], None]
Scan = Callable[[str], Inventory]


log_line = log_writer(PROGRAM)


def short_name(resource: str) -> str:
    """The socket and annotation suffix: ``amd.com/cpx_nps1`` -> ``cpx_nps1``, ``nvidia.com/gpu`` -> ``nvidia-gpu``,
    ``nvidia.com/mig-1g.10gb`` -> ``nvidia-mig-1g.10gb``."""
    vendor, _, name = resource.rpartition("/")
    return name if vendor == KEPT_NAMES else f"{vendor.partition('.')[0]}-{name}"


def annotation_key(resource: str) -> str:
    return ANNOTATION_PREFIX + short_name(resource)


def _order(device: PluginDevice) -> tuple[str, int]:
    return device.parent, device.partition or 0


class Tracker:
    """The devices of the host, by ID; every device seen since start stays, Unhealthy while missing.  With
    ``specs``, the managed CDI specs follow every scan."""

    def __init__(self, sysfs_root: str, strategy: str, scan: Scan | None = None, log: Log = log_line,
                 specs: SpecKeeper | None = None, *, proc_root: str = "/proc", driver_root: str = "/",
                 kinds: tuple[str, ...] = SERVED, monitor: Monitor | None = None) -> None:
        self.sysfs_root = sysfs_root
        self.monitor = monitor or Monitor(sysfs_root=sysfs_root)  # the GPUs' health from their drivers' signals
        self.strategy = strategy
        if scan is None:
            def scan(root: str) -> Inventory:
                return scan_served(root, proc_root=proc_root, driver_root=driver_root, kinds=kinds)
        self.scan = scan
        self.log = log
        self.specs = specs
        self.notes: list[str] = []  # the last scan's lines about devices left out
        self.devices: dict[str, PluginDevice] = {}
        self.inventory: Inventory | None = None  # the scan the device list is from
        self.generation = 0
        self.changed = threading.Condition()
        self.scan_lock = threading.Lock()  # a scan, its device list and the specs written from it, together
        self.last_error: str | None = None

    def rescan(self, reason: str) -> bool:
        """Read sysfs again (and bring the managed specs in line with it); True when anything the plugin
        advertises changed.  Never raises for sysfs."""
        with self.scan_lock:
            try:
                inventory = self.scan(self.sysfs_root)
                found, notes = plan(inventory, self.strategy)
            except Exception as err:  # sysfs changing under the scan must not end the plugin
                detail = str(err) if isinstance(err, (HookError, OSError)) else f"{type(err).__name__}: {err}"
                message = f"rescan ({reason}) failed, keeping the last device list: {detail}"
                if message != self.last_error:
                    self.log(message)
                self.last_error = message
                return False
            self.last_error = None
            for note in notes:
                if note not in self.notes:
                    self.log(f"{reason}: {note}")
            self.notes = notes
            self.inventory = inventory
            if self.specs is not None:
                self.specs.update(inventory, reason)
            verdicts = self.monitor.sample(inventory)
            current = {}
            for device in found:
                verdict = verdicts.get(device.parent)
                current[device.id] = device if verdict is None or verdict.healthy else replace(
                    device, healthy=False, reason=verdict.reason)
            for device_id, old in self.devices.items():
                if device_id not in current:
                    verdict = verdicts.get(old.parent)
                    why = verdict.reason if verdict is not None and not verdict.healthy else gone(old.kind)
                    current[device_id] = replace(old, healthy=False, present=False, reason=why)
            with self.changed:
                if current == self.devices:
                    return False
                for device_id in sorted(current):
                    old, new = self.devices.get(device_id), current[device_id]
                    if old is None or (old.healthy, old.reason) != (new.healthy, new.reason):
                        state = HEALTHY if new.healthy else f"{UNHEALTHY} ({new.reason})"
                        self.log(f"{reason}: {new.resource} {device_id} (CDI {new.qualified}) {state}")
                self.devices = current
                self.generation += 1
                self.changed.notify_all()
                return True

    def resources(self) -> set[str]:
        with self.changed:
            return {d.resource for d in self.devices.values()}

    def of(self, resource: str) -> list[PluginDevice]:
        with self.changed:
            return sorted((d for d in self.devices.values() if d.resource == resource), key=_order)

    def rows(self) -> list[DeviceRow]:
        """Every device as the metrics show it."""
        with self.changed:
            devices = list(self.devices.values())
        verdicts = self.monitor.verdicts()
        out = []
        for device in devices:
            verdict = verdicts.get(device.parent)
            signal = "gone" if not device.present else verdict.signal if verdict is not None else ""
            out.append(DeviceRow(device.id, device.kind, device.type, "advertised" if device.present else "gone",
                                 device.healthy, signal))
        return out

    def check_specs(self, devices: list[PluginDevice]) -> str | None:
        """With :attr:`scan_lock` held: None when every managed spec maps ``devices`` to their numbers now
        (rewriting a wrong one first), else why not."""
        if self.specs is None or self.inventory is None:
            return None
        return self.specs.ensure(self.inventory, devices)

    def wait(self, generation: int, timeout: float) -> int:
        """Block until the generation differs from ``generation`` or ``timeout`` passes; return the current one."""
        with self.changed:
            self.changed.wait_for(lambda: self.generation != generation, timeout)
            return self.generation


def device_list(devices: list[PluginDevice]) -> api.ListAndWatchResponse:
    response = api.ListAndWatchResponse()
    for device in devices:
        entry = response.devices.add(ID=device.id, health=HEALTHY if device.healthy else UNHEALTHY)
        if device.numa is not None:
            entry.topology.nodes.add(ID=device.numa)
    return response


class Servicer(api_grpc.DevicePluginServicer):
    """The DevicePlugin service of one resource name."""

    def __init__(self, resource: str, tracker: Tracker, *, device_specs: bool = False, log: Log = log_line,
                 stream_poll: float = 0.5) -> None:
        self.resource = resource
        self.tracker = tracker
        self.device_specs = device_specs
        self.log = log
        self.stream_poll = stream_poll
        self.stopping = threading.Event()

    def GetDevicePluginOptions(self, request: api.Empty, context: grpc.ServicerContext) -> api.DevicePluginOptions:
        return api.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: api.Empty, context: grpc.ServicerContext) -> Iterator[api.ListAndWatchResponse]:
        generation = -1
        sent: list[tuple[str, bool, int | None]] | None = None
        while context.is_active() and not self.stopping.is_set():
            generation = self.tracker.wait(generation, self.stream_poll)
            devices = self.tracker.of(self.resource)
            state = [(d.id, d.healthy, d.numa) for d in devices]
            if state != sent:
                sent = state
                yield device_list(devices)

    def GetPreferredAllocation(self, request: api.PreferredAllocationRequest,
                               context: grpc.ServicerContext) -> api.PreferredAllocationResponse:
        devices = [d for d in self.tracker.of(self.resource) if d.healthy]
        response = api.PreferredAllocationResponse()
        for container in request.container_requests:
            ids = preferred(devices, list(container.available_deviceIDs), list(container.must_include_deviceIDs),
                            container.allocation_size)
            response.container_responses.add(deviceIDs=ids)
        return response

    def _device(self, device_id: str, context: grpc.ServicerContext) -> PluginDevice:
        devices = {d.id: d for d in self.tracker.of(self.resource)}
        device = devices.get(device_id)
        if device is None:
            known = ", ".join(sorted(devices)) or "none"
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"unknown device ID {device_id!r} for resource {self.resource} (known: {known})")
        assert device is not None
        if not device.healthy:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"device {device_id!r} ({self.resource}) is {UNHEALTHY}, {device.reason}: it cannot be "
                          "allocated")
        return device

    def Allocate(self, request: api.AllocateRequest, context: grpc.ServicerContext) -> api.AllocateResponse:
        self.tracker.rescan("allocate")  # health, and the managed specs, as the host is now
        response = api.AllocateResponse()
        for container in request.container_requests:
            with self.tracker.scan_lock:  # the devices and the specs checked for them: of one scan
                devices = [self._device(i, context) for i in dict.fromkeys(container.devices_ids)]
                devices.sort(key=_order)
                problem = self.tracker.check_specs(devices)
            if problem is not None:
                self.log(f"allocate {self.resource}: {problem}")
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, problem)
            names = [d.qualified for d in devices]
            answer = response.container_responses.add()
            for name in names:
                answer.cdi_devices.add(name=name)
            if names:
                answer.annotations[annotation_key(self.resource)] = ",".join(names)
            if self.device_specs:
                for path in dict.fromkeys(p for d in devices for p in d.host_nodes):
                    answer.devices.add(container_path=path, host_path=path, permissions="rw")
            self.log(f"allocate {self.resource}: {', '.join(d.id for d in devices)} -> {', '.join(names)}")
        return response

    def PreStartContainer(self, request: api.PreStartContainerRequest,
                          context: grpc.ServicerContext) -> api.PreStartContainerResponse:
        return api.PreStartContainerResponse()


def _identity(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


class Endpoint:
    """One resource's gRPC server on ``<dir>/oci-gpu-hook-<name>.sock``."""

    def __init__(self, directory: str, resource: str, make_servicer: Callable[[], Servicer]) -> None:
        self.directory = directory
        self.resource = resource
        self.name = f"oci-gpu-hook-{short_name(resource)}.sock"
        self.path = os.path.join(directory, self.name)
        self.make_servicer = make_servicer
        self.server: grpc.Server | None = None
        self.servicer: Servicer | None = None
        self.identity: tuple[int, int, int] | None = None

    def start(self) -> None:
        self.stop()
        try:
            os.unlink(self.path)  # a socket left by an earlier run
        except FileNotFoundError:
            pass
        except OSError as err:
            raise HookError(f"cannot remove {self.path}: {err.strerror}") from None
        self.servicer = self.make_servicer()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="device-plugin"))
        api_grpc.add_DevicePluginServicer_to_server(self.servicer, server)
        try:
            bound = server.add_insecure_port(f"unix://{self.path}")
        except RuntimeError:  # grpcio 1.5x raises where older ones returned 0
            bound = 0
        if not bound:
            server.stop(None)
            why = f" (a Unix socket path has at most {UNIX_PATH_MAX - 1} bytes)" if len(
                os.fsencode(self.path)) >= UNIX_PATH_MAX else ""
            raise HookError(f"cannot listen on {self.path}{why}")
        server.start()
        self.server = server
        self.identity = _identity(self.path)

    def alive(self) -> bool:
        return self.server is not None and self.identity is not None and _identity(self.path) == self.identity

    def stop(self) -> None:
        if self.servicer is not None:
            self.servicer.stopping.set()
        if self.server is not None:
            self.server.stop(grace=0.5).wait()
            if self.identity is not None and _identity(self.path) == self.identity:
                try:
                    os.unlink(self.path)
                except OSError:
                    pass
        self.server = self.servicer = self.identity = None


def register(directory: str, endpoint: str, resource: str, timeout: float = 5.0) -> None:
    """Register at the kubelet (grpc.RpcError when it refuses or is not there)."""
    socket = os.path.join(os.path.abspath(directory), KUBELET_SOCKET)
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        api_grpc.RegistrationStub(channel).Register(api.RegisterRequest(
            version=VERSION, endpoint=endpoint, resource_name=resource,
            options=api.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True),
        ), timeout=timeout)


class Manager(Resident):
    """Serve and register an endpoint per resource name; re-serve and re-register after a kubelet restart."""

    def __init__(self, directory: str, tracker: Tracker, *, device_specs: bool = False, rescan_interval: float = 10.0,
                 poll_interval: float = 1.0, always: tuple[str, ...] | None = None, log: Log = log_line,
                 events: EventSource | None = None, uevent_delay: float = 0.5) -> None:
        self.directory = os.path.abspath(directory)
        self.events = events  # GPU/partition uevents (oci_gpu_hook.cluster.watch): a rescan soon after each
        self.uevent_delay = uevent_delay
        self.rescan_reason = "rescan"
        self.tracker = tracker
        self.device_specs = device_specs
        self.rescan_interval = rescan_interval
        self.poll_interval = poll_interval
        self.always = tuple(whole_gpu_resource(k) for k in ALWAYS_SERVED) if always is None else always
        self.log = log
        self.endpoints: dict[str, Endpoint] = {}
        self.registered: dict[str, tuple[int, int, int]] = {}  # resource -> the kubelet.sock it registered at
        self.failures: dict[str, str] = {}
        self.next_rescan = 0.0
        self.stopping = False

    def observe(self, event: Mapping[str, Any]) -> object:
        return self.tracker.monitor.event(event)

    def rows(self) -> list[DeviceRow]:
        return self.tracker.rows()

    def _servicer(self, resource: str) -> Callable[[], Servicer]:
        return lambda: Servicer(resource, self.tracker, device_specs=self.device_specs, log=self.log)

    def step(self) -> None:
        reason = self.rescan_due()
        if reason is not None:
            self.tracker.rescan(reason)
        kubelet = _identity(os.path.join(self.directory, KUBELET_SOCKET))
        if kubelet is None:  # said once while it lasts: otherwise nothing follows `serving in ...`
            self._failed("", f"waiting for the kubelet's socket {self.directory}/{KUBELET_SOCKET} (is the kubelet "
                             "running, and --kubelet-dir its device-plugins directory?)")
        else:
            self.failures.pop("", None)
        for resource in sorted(set(self.always) | self.tracker.resources()):
            endpoint = self.endpoints.get(resource)
            if endpoint is None:
                endpoint = self.endpoints[resource] = Endpoint(self.directory, resource, self._servicer(resource))
            if not endpoint.alive():
                if endpoint.server is not None:
                    self.log(f"{endpoint.path} is gone (kubelet restart?): serving {resource} again")
                self.registered.pop(resource, None)
                try:
                    endpoint.start()
                except HookError as err:
                    self._failed(resource, f"{err} (retrying)")
                    continue
            if kubelet is None or self.registered.get(resource) == kubelet:
                continue
            try:
                register(self.directory, endpoint.name, resource)
            except grpc.RpcError as err:
                self._failed(resource, f"registering {resource} at {self.directory}/{KUBELET_SOCKET} failed: "
                                       f"{err.code().name}: {err.details()} (retrying)")
                continue
            self.failures.pop(resource, None)
            self.registered[resource] = kubelet
            self.log(f"registered {resource} at {self.directory}/{KUBELET_SOCKET}, endpoint {endpoint.name}, "
                     f"{len(self.tracker.of(resource))} device(s)")

    def _failed(self, resource: str, message: str) -> None:
        """Log a failure once (not at every retry)."""
        if self.failures.get(resource) != message:
            self.log(message)
        self.failures[resource] = message

    def started(self) -> str:
        return (f"serving in {self.directory} (sysfs {self.tracker.sysfs_root}, strategy {self.tracker.strategy}, "
                f"rescan every {self.rescan_interval:g} s)")

    def close(self) -> None:
        for endpoint in self.endpoints.values():
            endpoint.stop()
        self.endpoints.clear()
        self.registered.clear()
