"""A fake kubelet that speaks the device plugin API v1beta1 over Unix sockets, as the kubelet does.

It serves the Registration service on ``<dir>/kubelet.sock``.  On Register it
checks the request as the kubelet does (version ``v1beta1``, an extended
resource name, an endpoint in the directory), dials the plugin's endpoint,
calls GetDevicePluginOptions and keeps a ListAndWatch stream open, recording
every device list it receives.  GetPreferredAllocation and Allocate are then
called the way the kubelet's device manager calls them: one container per
request.  ``restart()`` does what a starting kubelet does: empty the directory
(the plugins' sockets included) and serve a new ``kubelet.sock``.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from oci_gpu_hook.cluster.deviceplugin import api_pb2 as api
from oci_gpu_hook.cluster.deviceplugin import api_pb2_grpc as api_grpc

RESOURCE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


@dataclass
class Plugin:
    """What the fake kubelet holds for one registered resource."""

    resource: str
    endpoint: str
    options: api.DevicePluginOptions
    channel: grpc.Channel
    stub: api_grpc.DevicePluginStub
    lists: list[list[api.Device]] = field(default_factory=list)
    stream_error: str | None = None


class FakeKubelet(api_grpc.RegistrationServicer):
    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.server: grpc.Server | None = None
        self.plugins: dict[str, Plugin] = {}
        self.registrations: list[api.RegisterRequest] = []
        self.changed = threading.Condition()
        self.generation = 0  # counts kubelet starts

    # --- the kubelet's life ------------------------------------------------------------------

    def start(self) -> None:
        """Empty the directory of its files, as a starting kubelet does (older kubelets every file, newer ones the
        sockets; a directory never), and serve Registration on kubelet.sock."""
        os.makedirs(self.directory, exist_ok=True)
        for name in os.listdir(self.directory):
            if not os.path.isdir(os.path.join(self.directory, name)):
                os.unlink(os.path.join(self.directory, name))
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_grpc.add_RegistrationServicer_to_server(self, server)
        assert server.add_insecure_port(f"unix://{os.path.join(self.directory, 'kubelet.sock')}")
        server.start()
        self.server = server
        self.generation += 1

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=0).wait()
            self.server = None
        with self.changed:
            for plugin in self.plugins.values():
                plugin.channel.close()
            self.plugins.clear()

    def restart(self) -> None:
        self.stop()
        self.start()

    # --- Registration ------------------------------------------------------------------------

    def Register(self, request: api.RegisterRequest, context: grpc.ServicerContext) -> api.Empty:
        self.registrations.append(request)
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported API version {request.version}")
        if not RESOURCE_NAME.match(request.resource_name) or request.resource_name.startswith("kubernetes.io/"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid resource name {request.resource_name}")
        if "/" in request.endpoint:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"endpoint {request.endpoint} is not a file name")
        socket = os.path.join(os.path.abspath(self.directory), request.endpoint)
        channel = grpc.insecure_channel(f"unix://{socket}")
        stub = api_grpc.DevicePluginStub(channel)
        try:
            options = stub.GetDevicePluginOptions(api.Empty(), timeout=5)
        except grpc.RpcError as err:
            channel.close()
            context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot reach the plugin at {socket}: {err.details()}")
        plugin = Plugin(request.resource_name, request.endpoint, options, channel, stub)
        with self.changed:
            old = self.plugins.get(request.resource_name)
            if old is not None:
                old.channel.close()
            self.plugins[request.resource_name] = plugin
            self.changed.notify_all()
        threading.Thread(target=self._watch, args=(plugin,), daemon=True).start()
        return api.Empty()

    def _watch(self, plugin: Plugin) -> None:
        try:
            for response in plugin.stub.ListAndWatch(api.Empty()):
                with self.changed:
                    plugin.lists.append(list(response.devices))
                    self.changed.notify_all()
        except grpc.RpcError as err:
            with self.changed:
                plugin.stream_error = f"{err.code().name}: {err.details()}"
                self.changed.notify_all()

    # --- what tests ask ----------------------------------------------------------------------

    def wait(self, condition: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> object:
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                value = condition()
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"fake kubelet: timed out after {timeout} s waiting for {what}; "
                                         f"plugins {sorted(self.plugins)}, registrations "
                                         f"{[r.resource_name for r in self.registrations]}")
                self.changed.wait(min(left, 0.1))

    def plugin(self, resource: str, timeout: float = 10.0) -> Plugin:
        plugin = self.wait(lambda: self.plugins.get(resource), timeout, f"registration of {resource}")
        assert isinstance(plugin, Plugin)
        return plugin

    def devices(self, resource: str, predicate: Callable[[dict[str, api.Device]], bool] = bool,
                timeout: float = 10.0) -> dict[str, api.Device]:
        """The latest device list of ``resource`` that satisfies ``predicate`` (waiting for it)."""
        plugin = self.plugin(resource, timeout)

        def latest() -> dict[str, api.Device] | None:
            if not plugin.lists:
                return None
            devices = {d.ID: d for d in plugin.lists[-1]}
            return devices if predicate(devices) else None

        found = self.wait(latest, timeout, f"a device list of {resource}")
        assert isinstance(found, dict)
        return found

    def allocate(self, resource: str, *containers: list[str]) -> api.AllocateResponse:
        request = api.AllocateRequest()
        for ids in containers:
            request.container_requests.add(devices_ids=ids)
        return self.plugin(resource).stub.Allocate(request, timeout=10)

    def preferred(self, resource: str, available: list[str], must_include: list[str], size: int) -> list[str]:
        request = api.PreferredAllocationRequest()
        request.container_requests.add(available_deviceIDs=available, must_include_deviceIDs=must_include,
                                       allocation_size=size)
        response = self.plugin(resource).stub.GetPreferredAllocation(request, timeout=10)
        return list(response.container_responses[0].deviceIDs)
