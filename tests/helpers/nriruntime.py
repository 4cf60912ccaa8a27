"""A runtime-side test double of NRI: the socket, protocol and messages a plugin meets in containerd 2.x / CRI-O.

:class:`NRIRuntime` listens on a unix socket of its own; :meth:`NRIRuntime.accept` takes a plugin's connection and
runs NRI's handshake on it as ``pkg/adaptation/plugin.go`` does: it serves the runtime's ttrpc service on
multiplexed connection 2 and waits (bounded) for ``RegisterPlugin`` (name and two-digit index checked as NRI
checks them), then calls ``Configure`` (runtime name, version, the timeouts in milliseconds) and ``Synchronize``
(no pods, no containers) on connection 1.  :meth:`Peer.create_container` then sends one CreateContainer and
returns the adjustment, or the error message the plugin answered with.

Its framing is written here, apart from the plugin's (:mod:`oci_gpu_hook.serve.nri.ttrpc`), from the same public
sources (containerd/nri ``pkg/net/multiplex``: u32 connection id, u32 length; containerd/ttrpc ``channel.go``:
u32 length, u32 stream id, u8 type, u8 flags; ``request.proto``), so that a misreading in one is not mirrored in
the other; the messages are the generated ones (their field numbers are checked by tests/test_nri_proto.py).  It
sends each message as several multiplexer frames, cut where a ttrpc header ends, as Go's ttrpc does when its
buffered writer flushes a large payload.

:func:`apply_adjustment` applies an adjustment to an OCI config.json as containerd applies it (containerd/nri
``pkg/runtime-tools/generate``: ``Generator.Adjust``).  Faithful in: annotations (``-key`` removes), env (an entry
of an existing name replaced in place, new ones appended, ``-NAME`` removes), OCI hooks appended per stage,
``linux.devices`` (one of the same path replaced, and an ``rw`` allow rule, ``rwm`` for a block device, appended
for each, as ``AdjustDevices`` does), ``linux.resources.devices`` rules appended, mounts (one at the same
destination replaced, then every mount of the spec sorted by the depth of its destination, then by destination,
as ``sortMounts`` does).  Not done: CDI devices in the adjustment, rlimits, args, cgroups path, OOM score,
seccomp, namespaces, sysctls, net devices, the scheduler, RDT, block I/O and memory-policy fields, mount
propagation (``ensurePropagation``), the runtime's resource check; nor NRI's merging of several plugins'
adjustments and its conflict detection (one plugin is connected here).  :meth:`NRIRuntime.create_container`
models NRI's treatment of a plugin that is not connected: it is skipped; and the default validator's
``required_plugins`` (configured, or the pod annotation ``required-plugins.noderesource.dev``): a container that
requires a plugin that is not connected is refused.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from pathlib import Path
from typing import Any

from oci_gpu_hook.serve.nri import api_pb2, ttrpc_pb2

MUX = struct.Struct(">II")
TTRPC = struct.Struct(">IIBB")
PLUGIN_CONN, RUNTIME_CONN = 1, 2
T_REQUEST, T_RESPONSE = 1, 2
PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
REQUIRED_PLUGINS = "required-plugins.noderesource.dev"
WAIT = 30.0  # bound of every wait for the plugin (a slow CI machine); a healthy plugin answers in milliseconds


class PluginError(Exception):
    """The plugin answered a call with a non-OK status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class PluginGone(AssertionError):
    """The plugin's connection closed under a call."""


class Peer:
    """One plugin's connection."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.settimeout(WAIT)
        self.raw = b""
        self.streams = {PLUGIN_CONN: b"", RUNTIME_CONN: b""}
        self.inbox: list[tuple[int, int, int, int, bytes]] = []
        self.next_stream = 1
        self.name = ""
        self.idx = ""
        self.events = 0
        self.configure_request: api_pb2.ConfigureRequest | None = None
        self.gone = False

    # --- framing ---------------------------------------------------------------------------------------------

    def send(self, conn: int, stream: int, type_: int, flags: int, payload: bytes) -> None:
        header = TTRPC.pack(len(payload), stream, type_, flags)
        # two frames, as Go's buffered writer does with a payload larger than its buffer: header, then payload
        out = MUX.pack(conn, len(header)) + header
        if payload:
            out += MUX.pack(conn, len(payload)) + payload
        self.sock.sendall(out)

    def _read(self) -> bool:
        """False when the plugin closed its end (or reset it) or stayed silent; :attr:`gone` tells which."""
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return False
        except (ConnectionResetError, OSError):
            self.gone = True
            return False
        if not data:
            self.gone = True
            return False
        self.raw += data
        while len(self.raw) >= 8:
            conn, length = MUX.unpack_from(self.raw)
            if len(self.raw) < 8 + length:
                break
            payload, self.raw = self.raw[8:8 + length], self.raw[8 + length:]
            if conn in self.streams:
                self.streams[conn] += payload
        for conn, data in self.streams.items():
            while len(data) >= 10:
                length, stream, type_, flags = TTRPC.unpack_from(data)
                if len(data) < 10 + length:
                    break
                self.inbox.append((conn, stream, type_, flags, data[10:10 + length]))
                data = data[10 + length:]
            self.streams[conn] = data
        return True

    def next_message(self, want: Any) -> tuple[int, int, int, int, bytes]:
        """The first message ``want(message)`` accepts; an AssertionError if the plugin closes or stays silent."""
        deadline = time.monotonic() + WAIT
        while True:
            for i, message in enumerate(self.inbox):
                if want(message):
                    return self.inbox.pop(i)
            if time.monotonic() > deadline or not self._read():
                if self.gone:
                    raise PluginGone("the plugin closed the connection")
                raise AssertionError("the plugin did not answer")

    def closed(self) -> bool:
        """Whether the plugin has closed its end (waits, bounded, for the close)."""
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if not self._read():
                return True
        return False

    def call(self, method: str, request: Any, reply: type) -> Any:
        stream = self.next_stream
        self.next_stream += 2
        envelope = ttrpc_pb2.Request(service=PLUGIN_SERVICE, method=method, payload=request.SerializeToString(),
                                     timeout_nano=2_000_000_000)
        try:
            self.send(PLUGIN_CONN, stream, T_REQUEST, 1, envelope.SerializeToString())
        except OSError:
            self.gone = True
            raise PluginGone("the plugin closed the connection") from None
        _, _, _, _, payload = self.next_message(
            lambda m: m[0] == PLUGIN_CONN and m[1] == stream and m[2] == T_RESPONSE)
        response = ttrpc_pb2.Response.FromString(payload)
        if response.status.code != 0:
            raise PluginError(response.status.code, response.status.message)
        return reply.FromString(response.payload)

    # --- NRI ------------------------------------------------------------------------------------------------

    def handshake(self, runtime_name: str = "nri-test-double", runtime_version: str = "2.x",
                  request_timeout_ms: int = 2000) -> None:
        conn, stream, _, flags, payload = self.next_message(lambda m: m[0] == RUNTIME_CONN and m[2] == T_REQUEST)
        assert stream % 2 == 1, f"a client's stream ids are odd, got {stream}"
        assert flags == 1, f"a unary request carries 'remote closed', got flags {flags}"
        envelope = ttrpc_pb2.Request.FromString(payload)
        assert (envelope.service, envelope.method) == (RUNTIME_SERVICE, "RegisterPlugin"), envelope
        request = api_pb2.RegisterPluginRequest.FromString(envelope.payload)
        assert request.plugin_name and all(c.isalnum() or c in "-_.+" for c in request.plugin_name), request
        assert len(request.plugin_idx) == 2 and request.plugin_idx.isdigit(), request
        self.name, self.idx = request.plugin_name, request.plugin_idx
        reply = ttrpc_pb2.Response(payload=api_pb2.Empty().SerializeToString())
        reply.status.code = 0
        self.send(conn, stream, T_RESPONSE, 0, reply.SerializeToString())
        self.configure_request = api_pb2.ConfigureRequest(
            runtime_name=runtime_name, runtime_version=runtime_version, registration_timeout=5000,
            request_timeout=request_timeout_ms, NRI_version="v0.12.0")
        configured = self.call("Configure", self.configure_request, api_pb2.ConfigureResponse)
        self.events = configured.events or (1 << 14) - 1  # 0: every event, as NRI reads it
        self.call("Synchronize", api_pb2.SynchronizeRequest(), api_pb2.SynchronizeResponse)

    def subscribed(self, event: int) -> bool:
        return bool(self.events & (1 << (event - 1)))

    def create_container(self, pod: api_pb2.PodSandbox,
                         container: api_pb2.Container) -> api_pb2.CreateContainerResponse:
        return self.call("CreateContainer", api_pb2.CreateContainerRequest(pod=pod, container=container),
                         api_pb2.CreateContainerResponse)

    def shutdown(self) -> None:
        self.call("Shutdown", api_pb2.Empty(), api_pb2.Empty)

    def close(self) -> None:
        self.sock.close()


class NRIRuntime:
    """The runtime's NRI socket, and at most one plugin connected to it."""

    def __init__(self, path: Path, required_plugins: tuple[str, ...] = ()) -> None:
        self.path = path
        self.required_plugins = required_plugins
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        os.chmod(path, 0o600)
        self.listener.listen(4)
        self.listener.settimeout(WAIT)
        self.plugin: Peer | None = None

    def accept(self, **handshake: Any) -> Peer:
        sock, _ = self.listener.accept()
        peer = Peer(sock)
        peer.handshake(**handshake)
        self.plugin = peer
        return peer

    def create_container(self, pod: api_pb2.PodSandbox, container: api_pb2.Container) -> api_pb2.ContainerAdjustment:
        """As NRI's CreateContainer: the connected plugin's adjustment (a PluginError refuses the container); a
        plugin that is not connected is skipped; then the required-plugins rule of the default validator (a
        PluginError naming the missing plugin, as the validator's error).  A plugin whose connection closed is
        still counted as present for the request that finds it closed, which drops it and creates the container
        without its adjustment (NRI's ``pkg/adaptation``: ``CreateContainer`` adds each plugin to the
        validation request before calling it; seen on a real containerd 2.3.4, docs/nri.md)."""
        adjust = api_pb2.ContainerAdjustment()
        present = set()
        if self.plugin is not None:
            present.add(self.plugin.name)
            if self.plugin.subscribed(api_pb2.CREATE_CONTAINER):
                try:
                    adjust = self.plugin.create_container(pod, container).adjust
                except PluginGone:
                    self.plugin.close()
                    self.plugin = None
        required = list(self.required_plugins)
        keys = (f"{REQUIRED_PLUGINS}/container.{container.name}", f"{REQUIRED_PLUGINS}/pod", REQUIRED_PLUGINS)
        annotated = next((pod.annotations[k] for k in keys if k in pod.annotations), None)  # the first, as NRI
        if annotated:
            required += json.loads(annotated)
        missing = [name for name in required if name not in present]
        if missing:
            raise PluginError(2, f"validation error: required plugin {missing[0]!r} not present")
        return adjust

    def close(self) -> None:
        if self.plugin is not None:
            self.plugin.close()
        self.listener.close()


# --- the OCI side -------------------------------------------------------------------------------------------

def container_of(spec: dict[str, Any], cid: str, name: str = "ctr",
                 annotations: dict[str, str] | None = None) -> api_pb2.Container:
    """The NRI Container the runtime describes for the container of ``spec`` (containerd fills it from the
    spec it is about to adjust)."""
    linux = spec.get("linux") or {}
    container = api_pb2.Container(id=cid, name=name, args=spec["process"].get("args", []),
                                  env=spec["process"].get("env", []), annotations=annotations or {})
    for mount in spec.get("mounts", []):
        container.mounts.add(destination=mount["destination"], type=mount.get("type", ""),
                             source=mount.get("source", ""), options=mount.get("options", []))
    for device in linux.get("devices", []):
        entry = container.linux.devices.add(path=device["path"], type=device["type"], major=device["major"],
                                            minor=device["minor"])
        if "fileMode" in device:
            entry.file_mode.value = device["fileMode"]
    for rule in (linux.get("resources") or {}).get("devices", []):
        entry = container.linux.resources.devices.add(allow=rule["allow"], type=rule.get("type", ""),
                                                      access=rule.get("access", ""))
        if rule.get("major") is not None:
            entry.major.value = rule["major"]
        if rule.get("minor") is not None:
            entry.minor.value = rule["minor"]
    return container


def _removal(key: str) -> tuple[str, bool]:
    return (key[1:], True) if key.startswith("-") else (key, False)


def _hook(hook: api_pb2.Hook) -> dict[str, Any]:
    out: dict[str, Any] = {"path": hook.path}
    if hook.args:
        out["args"] = list(hook.args)
    if hook.env:
        out["env"] = list(hook.env)
    if hook.HasField("timeout"):
        out["timeout"] = hook.timeout.value
    return out


def apply_adjustment(spec: dict[str, Any], adjust: api_pb2.ContainerAdjustment) -> None:
    """``adjust`` applied to the OCI ``spec`` in place, in the order and manner of NRI's ``Generator.Adjust``
    (the module docstring says what is left out)."""
    for key, value in adjust.annotations.items():
        name, removed = _removal(key)
        annotations = spec.setdefault("annotations", {})
        if removed:
            annotations.pop(name, None)
        else:
            annotations[key] = value
    if adjust.env:
        changes = {_removal(e.key)[0]: e for e in adjust.env}
        env = []
        for entry in spec["process"].get("env", []):
            name, eq, _ = entry.partition("=")
            if not eq:
                continue
            change = changes.pop(name, None)
            if change is None:
                env.append(entry)
            elif not _removal(change.key)[1]:
                env.append(f"{change.key}={change.value}")
        for change in adjust.env:
            if not _removal(change.key)[1] and change.key in changes:
                env.append(f"{change.key}={change.value}")
        spec["process"]["env"] = env
    for field, stage in (("prestart", "prestart"), ("poststart", "poststart"), ("poststop", "poststop"),
                         ("create_runtime", "createRuntime"), ("create_container", "createContainer"),
                         ("start_container", "startContainer")):
        for hook in getattr(adjust.hooks, field):
            spec.setdefault("hooks", {}).setdefault(stage, []).append(_hook(hook))
    if not adjust.linux.devices and not adjust.linux.resources.devices and not adjust.mounts:
        return
    linux = spec.setdefault("linux", {})
    rules = linux.setdefault("resources", {}).setdefault("devices", [])
    for device in adjust.linux.devices:
        path, removed = _removal(device.path)
        linux["devices"] = [d for d in linux.get("devices", []) if d.get("path") != path]
        if removed:
            continue
        entry: dict[str, Any] = {"path": device.path, "type": device.type, "major": device.major,
                                 "minor": device.minor}
        if device.HasField("file_mode"):
            entry["fileMode"] = device.file_mode.value
        if device.HasField("uid"):
            entry["uid"] = device.uid.value
        if device.HasField("gid"):
            entry["gid"] = device.gid.value
        linux["devices"].append(entry)
        rules.append({"allow": True, "type": device.type, "major": device.major, "minor": device.minor,
                      "access": "rwm" if device.type == "b" else "rw"})
    for rule in adjust.linux.resources.devices:
        entry = {"allow": rule.allow, "type": rule.type, "access": rule.access}
        if rule.HasField("major"):
            entry["major"] = rule.major.value
        if rule.HasField("minor"):
            entry["minor"] = rule.minor.value
        rules.append(entry)
    if adjust.mounts:
        mounts = spec.setdefault("mounts", [])
        for mount in adjust.mounts:
            destination, removed = _removal(mount.destination)
            mounts[:] = [m for m in mounts if m.get("destination") != destination]
            if not removed:
                mounts.append({"destination": mount.destination, "type": mount.type, "source": mount.source,
                               "options": list(mount.options)})
        mounts.sort(key=lambda m: (os.path.normpath(m["destination"]).count("/"), m["destination"]))
