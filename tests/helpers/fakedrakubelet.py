"""A fake kubelet for DRA plugins, over real gRPC on Unix sockets, as the kubelet's plugin manager does it.

:meth:`FakeDraKubelet.discover` waits for a socket in the registry directory,
calls ``Registration.GetInfo`` there, checks the answer as the kubelet does
(type ``DRAPlugin``, a driver name, an endpoint that is a socket, a supported
service among those this kubelet speaks: ``v1.DRAPlugin`` for a 1.34 kubelet,
``v1beta1.DRAPlugin`` for 1.32/1.33), tells the plugin with
``NotifyRegistrationStatus``, and dials the endpoint with the service version
it chose; :meth:`watch_health` opens the health stream.  :meth:`prepare` and :meth:`unprepare` then call
``NodePrepareResources``/``NodeUnprepareResources`` with the claims given.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from types import ModuleType

import grpc

from oci_gpu_hook.cluster.dra import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from oci_gpu_hook.cluster.dra import health_v1alpha1_pb2 as health
from oci_gpu_hook.cluster.dra import health_v1alpha1_pb2_grpc as health_grpc
from oci_gpu_hook.cluster.dra import registration_pb2 as reg
from oci_gpu_hook.cluster.dra import registration_pb2_grpc as reg_grpc

SERVICES: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}


@dataclass
class Registered:
    driver: str
    endpoint: str
    service: str
    info: reg.PluginInfo


class FakeDraKubelet:
    def __init__(self, registry_dir: str, speaks: tuple[str, ...] = ("v1.DRAPlugin", "v1beta1.DRAPlugin")) -> None:
        self.registry_dir = registry_dir
        self.speaks = speaks
        self.plugin: Registered | None = None
        self.channel: grpc.Channel | None = None
        self.stub: object = None
        self.pb2: ModuleType | None = None

    def discover(self, timeout: float = 20.0) -> Registered:
        deadline = time.monotonic() + timeout
        while True:
            sockets = sorted(n for n in os.listdir(self.registry_dir)
                             if stat.S_ISSOCK(os.lstat(os.path.join(self.registry_dir, n)).st_mode)) \
                if os.path.isdir(self.registry_dir) else []
            if sockets:
                try:
                    return self._register(os.path.join(self.registry_dir, sockets[0]))
                except grpc.RpcError:
                    pass  # listening not yet
            if time.monotonic() > deadline:
                raise AssertionError(f"no plugin registered in {self.registry_dir} within {timeout} s")
            time.sleep(0.1)

    def _register(self, path: str) -> Registered:
        with grpc.insecure_channel(f"unix://{path}") as channel:
            stub = reg_grpc.RegistrationStub(channel)
            info = stub.GetInfo(reg.InfoRequest(), timeout=5)
            problem = None
            if info.type != "DRAPlugin":
                problem = f"type {info.type!r} is not DRAPlugin"
            chosen = next((s for s in self.speaks if s in info.supported_versions), None)
            if chosen is None:
                problem = f"none of {list(info.supported_versions)} is among {list(self.speaks)}"
            if not info.endpoint or not os.path.exists(info.endpoint) or not stat.S_ISSOCK(
                    os.stat(info.endpoint).st_mode):
                problem = f"endpoint {info.endpoint!r} is no socket"
            stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=problem is None,
                                                                 error=problem or ""), timeout=5)
        if problem is not None:
            raise AssertionError(f"the kubelet would refuse the plugin: {problem}")
        assert chosen is not None
        self.pb2, pb2_grpc = SERVICES[chosen]
        self.channel = grpc.insecure_channel(f"unix://{info.endpoint}")
        self.stub = pb2_grpc.DRAPluginStub(self.channel)
        self.plugin = Registered(info.name, info.endpoint, chosen, info)
        return self.plugin

    def _claims(self, claims: list[tuple[str, str, str]]) -> list[object]:
        assert self.pb2 is not None
        return [self.pb2.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]

    def prepare(self, *claims: tuple[str, str, str]) -> object:
        """``(namespace, name, uid)`` each; the NodePrepareResourcesResponse."""
        assert self.pb2 is not None
        request = self.pb2.NodePrepareResourcesRequest(claims=self._claims(list(claims)))
        return self.stub.NodePrepareResources(request, timeout=30)  # type: ignore[attr-defined]

    def unprepare(self, *claims: tuple[str, str, str]) -> object:
        assert self.pb2 is not None
        request = self.pb2.NodeUnprepareResourcesRequest(claims=self._claims(list(claims)))
        return self.stub.NodeUnprepareResources(request, timeout=30)  # type: ignore[attr-defined]

    def watch_health(self) -> object:
        """The NodeWatchResources stream (an iterator of responses), as a kubelet with ResourceHealthStatus on
        opens it when the plugin offers v1alpha1.DRAResourceHealth."""
        assert self.plugin is not None and self.channel is not None
        assert "v1alpha1.DRAResourceHealth" in self.plugin.info.supported_versions
        return health_grpc.DRAResourceHealthStub(self.channel).NodeWatchResources(
            health.NodeWatchResourcesRequest(), timeout=30)

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None
