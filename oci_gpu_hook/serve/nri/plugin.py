"""The NRI plugin's life: connect, register, be configured and synchronized, then answer CreateContainer.

As NRI's own plugin stub (containerd/nri ``pkg/stub``) does it: the plugin connects to the runtime's NRI socket
(or, started by the runtime itself from its plugin directory, uses the connected socket whose descriptor
``NRI_PLUGIN_SOCKET`` names), multiplexes it (:mod:`oci_gpu_hook.serve.nri.ttrpc`), calls ``RegisterPlugin``
(name, two-digit index) on the runtime's connection and serves its own: ``Configure`` (answered with the one
event it wants, CREATE_CONTAINER), ``Synchronize`` (nothing to change in running containers), ``CreateContainer``
(:mod:`oci_gpu_hook.serve.nri.adjust`) and ``Shutdown``.  One request at a time: NRI calls a plugin under one lock.

The runtime must be root: the socket's peer credentials (``SO_PEERCRED``) are checked before anything is sent
(:func:`check_peer`).  A CreateContainer that took more than half the runtime's request timeout (sent at
Configure) is logged.

A refusal answers CreateContainer with an error status whose message is the one line; the runtime fails that
container's creation with it (``kubectl describe pod``, ``crictl create``).  An internal error (a bug) fails that
container too, never the plugin.  The plugin ends when the runtime closes the connection or asks it to shut down
(exit status 1 or 0): what restarts it is the service manager's (a DaemonSet, ``Restart=always``), as for every
NRI plugin.
"""

from __future__ import annotations

import os
import socket
import sys
import time

from oci_gpu_hook.errors import HookError
from oci_gpu_hook.serve.nri import ttrpc

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from google.protobuf.message import Message as ProtoMessage

    from oci_gpu_hook.config import Config

DEFAULT_SOCKET = "/var/run/nri/nri.sock"
DEFAULT_NAME = "oci-gpu-hook"
DEFAULT_IDX = "10"
SOCKET_ENV, NAME_ENV, IDX_ENV = "NRI_PLUGIN_SOCKET", "NRI_PLUGIN_NAME", "NRI_PLUGIN_IDX"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
REGISTRATION_TIMEOUT = 5.0  # NRI's default, seconds; the runtime's own (from Configure) is used after
NRI_VERSION = "v0.12.0"  # the API version these messages were written from (api.proto)
CREATE_CONTAINER = 4  # api.Event


def event_mask(*events: int) -> int:
    """ConfigureResponse.events: bit ``event - 1`` per event."""
    mask = 0
    for event in events:
        mask |= 1 << (event - 1)
    return mask


def check_name(name: str) -> str:
    if not name or not all(c.isascii() and (c.isalnum() or c in "-_.+") for c in name):
        raise HookError(f"NRI plugin name {name!r}: use letters, digits and - _ . + only")
    return name


def check_idx(idx: str) -> str:
    if len(idx) != 2 or not idx.isascii() or not idx.isdigit():
        raise HookError(f"NRI plugin index {idx!r}: two digits, 00 to 99 (plugins are called in ascending order)")
    return idx


def identity(name: str | None, idx: str | None, argv0: str) -> tuple[str, str]:
    """The plugin's name and index: the options, else NRI's environment, else an ``NN-name`` program name (a
    plugin the runtime starts from its plugin directory), else the defaults."""
    base = os.path.basename(argv0)
    named = base[3:] if len(base) > 3 and base[2] == "-" and base[:2].isdigit() else None
    name = name or os.environ.get(NAME_ENV) or named or DEFAULT_NAME
    idx = idx or os.environ.get(IDX_ENV) or (base[:2] if named else None) or DEFAULT_IDX
    return check_name(name), check_idx(idx)


def connect(path: str) -> socket.socket:
    """The runtime's socket: the one ``NRI_PLUGIN_SOCKET`` holds (started by the runtime), else ``path``; either
    only with a peer :func:`check_peer` accepts."""
    inherited = os.environ.get(SOCKET_ENV)
    if inherited:
        if not inherited.isdigit():
            raise HookError(f"{SOCKET_ENV}={inherited!r} is not a file descriptor")
        sock = socket.socket(fileno=int(inherited))
        where = f"the NRI socket of {SOCKET_ENV}={inherited}"
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        where = f"the NRI socket {path}"
        try:
            sock.connect(path)
        except OSError as err:
            sock.close()
            raise HookError(f"cannot connect to {where}: {err.strerror} (is NRI enabled in containerd 2.x or CRI-O, "
                            "and is this its socket_path / nri_listen?)") from None
    try:
        check_peer(sock, where)
    except HookError:
        sock.close()
        raise
    return sock


def check_peer(sock: socket.socket, where: str) -> None:
    """The runtime at the other end must be root, as the native front asks only a planner whose peer credentials
    (``SO_PEERCRED``: who listened, or who made the socket pair) are uid 0: the container specs it sends decide what
    this process, root, grants.  A plugin that is not root (a test's) also takes a peer of its own uid, which could
    do whatever it likes to this process anyway.  Else the one line, and nothing sent."""
    import struct

    try:
        pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except OSError as err:
        raise HookError(f"{where}: cannot read its peer's credentials: {err.strerror} (not a unix socket?)") from None
    if uid not in (0, os.geteuid()):
        raise HookError(f"{where}: refused: its peer (pid {pid}) is uid {uid}, not root: only the runtime, root, "
                        "may send this plugin container specs")


class Plugin:
    """One registered connection to the runtime."""

    def __init__(self, channel: ttrpc.Channel, config: Config, name: str, idx: str,
                 log: Callable[[str], None]) -> None:
        self.channel = channel
        self.config = config
        self.name = name
        self.idx = idx
        self.log = log
        self.request_timeout = 2.0
        self.handlers: dict[str, Callable[[bytes], ProtoMessage]] = {
            "Configure": self.configure, "Synchronize": self.synchronize, "Shutdown": self.shutdown,
            "CreateContainer": self.create_container}
        self.done = False

    def register(self) -> None:
        from oci_gpu_hook.serve.nri import api_pb2

        request = api_pb2.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.idx, NRI_version=NRI_VERSION)
        try:
            self.channel.call(RUNTIME_SERVICE, "RegisterPlugin", request, api_pb2.Empty, REGISTRATION_TIMEOUT)
        except ttrpc.RemoteError as err:
            raise HookError(f"the runtime refused to register NRI plugin {self.idx}-{self.name}: {err}") from None

    def configure(self, payload: bytes) -> ProtoMessage:
        from oci_gpu_hook.serve.nri import api_pb2

        request = api_pb2.ConfigureRequest.FromString(payload)
        if request.request_timeout > 0:
            self.request_timeout = request.request_timeout / 1000
        self.log(f"registered as {self.idx}-{self.name} with {request.runtime_name} {request.runtime_version} "
                 f"(NRI {request.NRI_version or 'version unknown'}, request timeout {self.request_timeout:g} s)")
        return api_pb2.ConfigureResponse(events=event_mask(CREATE_CONTAINER))

    def synchronize(self, payload: bytes) -> ProtoMessage:
        from oci_gpu_hook.serve.nri import api_pb2

        request = api_pb2.SynchronizeRequest.FromString(payload)
        return api_pb2.SynchronizeResponse(more=request.more)  # running containers keep what they have

    def shutdown(self, payload: bytes) -> ProtoMessage:
        from oci_gpu_hook.serve.nri import api_pb2

        self.done = True
        return api_pb2.Empty()

    def create_container(self, payload: bytes) -> ProtoMessage:
        from oci_gpu_hook.serve.nri import adjust, api_pb2

        started = time.monotonic()
        request = api_pb2.CreateContainerRequest.FromString(payload)
        container = request.container
        try:
            adjustment, plan = adjust.create_container(container, self.config)
        except HookError as err:
            from oci_gpu_hook.log import error_line, refused

            refused(self.config, "nri", container.id or None, error_line(str(err)))
            raise
        plan.record(self.config, "nri", container.id or None, started)
        if adjustment is None:
            return api_pb2.CreateContainerResponse()
        self.log(f"{self._label(request)}: {plan.summary()}")
        return api_pb2.CreateContainerResponse(adjust=adjustment)

    def _label(self, request: Any) -> str:
        pod = request.pod
        where = f"{pod.namespace}/{pod.name}/" if pod.name else ""
        return f"{where}{request.container.name or request.container.id}"

    def serve_one(self, message: ttrpc.Message) -> None:
        """Answer one message from the runtime."""
        if message.conn != ttrpc.PLUGIN_CONN or message.type != ttrpc.REQUEST:
            return  # a stray response or stream data: nothing of ours waits for it
        from oci_gpu_hook.serve.nri import ttrpc_pb2

        try:
            envelope = ttrpc_pb2.Request.FromString(message.payload)
        except Exception:
            self.channel.respond(message, code=ttrpc.INVALID_ARGUMENT, message="not a ttrpc Request")
            return
        handler = self.handlers.get(envelope.method) if envelope.service == PLUGIN_SERVICE else None
        if handler is None:
            self.channel.respond(message, code=ttrpc.UNIMPLEMENTED,
                                 message=f"{envelope.service}/{envelope.method} is not served by {self.name}")
            return
        try:
            reply = self._timed(handler, envelope.method, envelope.payload)
        except HookError as err:
            self.log(f"refused: {err}")
            self.channel.respond(message, code=ttrpc.UNKNOWN, message="oci-gpu-hook: " + " ".join(str(err).split()))
            return
        except Exception as err:  # a bug: this container fails, the plugin goes on
            if self.config.debug:
                import traceback

                traceback.print_exc(file=sys.stderr)
            first = str(err).splitlines()[0] if str(err) else ""
            self.log(f"internal error: {type(err).__name__}: {first} (--debug for a traceback)")
            self.channel.respond(message, code=ttrpc.INTERNAL,
                                 message=f"oci-gpu-hook: internal error: {type(err).__name__}: {first}")
            return
        self.channel.respond(message, reply.SerializeToString())

    def _timed(self, handler: Callable[[bytes], ProtoMessage], method: str, payload: bytes) -> ProtoMessage:
        """``handler(payload)``, and, for a CreateContainer that took more than half the runtime's request timeout
        (answered or refused), one line before it is answered (past the timeout the runtime has failed that
        container's creation already, and drops whatever the plugin answers)."""
        started = time.monotonic()
        try:
            return handler(payload)
        finally:
            seconds = time.monotonic() - started
            if method == "CreateContainer" and seconds > self.request_timeout / 2:
                self._slow(payload, seconds)

    def _slow(self, payload: bytes, seconds: float) -> None:
        from oci_gpu_hook.serve.nri import api_pb2

        try:
            label = self._label(api_pb2.CreateContainerRequest.FromString(payload))
        except Exception:  # the request the handler could not read either
            label = "a container"
        past = "past it: the runtime has failed the container" if seconds > self.request_timeout else "more than half"
        self.log(f"{label}: CreateContainer took {seconds:.3f} s of the runtime's request timeout of "
                 f"{self.request_timeout:g} s ({past})")

    def serve(self) -> int:
        """Answer the runtime until it closes the connection (1) or asks the plugin to shut down (0)."""
        while not self.done:
            message = self.channel.receive()
            if message is None:
                self.log("the runtime closed the NRI connection")
                return 1
            self.serve_one(message)
        self.log("the runtime asked the plugin to shut down")
        return 0


def run(config: Config, socket_path: str, name: str, idx: str, log: Callable[[str], None]) -> int:
    """Connect, register and serve; the exit status."""
    from oci_gpu_hook.serve.nri import adjust

    adjust.check_config(config)
    try:
        from oci_gpu_hook.serve.nri import api_pb2, ttrpc_pb2  # noqa: F401 (the messages need protobuf)
    except Exception as err:  # ImportError, or protobuf's VersionError for one older than the generated code
        raise HookError(f"nri needs protobuf 7.35.1 or later ({type(err).__name__}: {err}): "
                        "pip install 'oci-gpu-hook[nri]'") from None
    sock = connect(socket_path)
    adjust.warm_up(config)  # connected: a runtime is there to serve
    try:
        plugin = Plugin(ttrpc.Channel(sock), config, name, idx, log)
        try:
            plugin.register()
        except ttrpc.ProtocolError as err:
            raise HookError(f"registering NRI plugin {idx}-{name} failed: {err}") from None
        try:
            return plugin.serve()
        except ttrpc.ProtocolError as err:
            raise HookError(f"the NRI connection failed: {err}") from None
    finally:
        sock.close()
