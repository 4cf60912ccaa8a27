"""NRI's wire: ttrpc messages on two logical connections multiplexed over one unix socket.

Two layers, both big-endian, as containerd/nri (``pkg/net/multiplex``) and containerd/ttrpc (``channel.go``)
write them:

- the multiplexer's frame: connection id (u32), payload length (u32), payload.  Connection 1 carries the
  plugin's service (the runtime calls Configure, Synchronize, CreateContainer...), connection 2 the runtime's
  (the plugin calls RegisterPlugin).  Connection 0 is reserved; frames for a connection nobody opened are
  dropped.  A payload is at most one ttrpc header and one ttrpc message long (:data:`MAX_MUX_PAYLOAD`), and each
  connection is a byte stream: a ttrpc message may span frames and a frame may end inside one.
- ttrpc's message: length (u32, the payload's, at most 4 MiB), stream id (u32), type (u8: 1 request, 2
  response, 3 data), flags (u8), payload.  A client's streams are odd and grow by two; a unary request carries
  the flag "remote closed" (1).  The payload of a request is a ``ttrpc.Request`` (service, method, the
  request message's bytes); of a response a ``ttrpc.Response`` (a google.rpc.Status, the reply's bytes).

:class:`Demux` reassembles what a socket delivers into whole messages; :class:`Channel` sends and receives them
on a socket, one at a time (NRI's runtime sends a plugin one request at a time: its calls into plugins hold one
lock), and :meth:`Channel.call` makes a unary call while it queues requests that arrive in the meantime.
"""

from __future__ import annotations

import socket
import struct
from collections import deque

from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from google.protobuf.message import Message as ProtoMessage

PLUGIN_CONN = 1  # the plugin serves, the runtime calls
RUNTIME_CONN = 2  # the runtime serves, the plugin calls
MUX_HEADER = struct.Struct(">II")  # connection id, payload length
TTRPC_HEADER = struct.Struct(">IIBB")  # payload length, stream id, type, flags
MAX_MESSAGE = 4 << 20  # ttrpc's messageLengthMax
MAX_MUX_PAYLOAD = TTRPC_HEADER.size + MAX_MESSAGE
REQUEST, RESPONSE, DATA = 1, 2, 3
FLAG_REMOTE_CLOSED = 0x1
# gRPC status codes (google.rpc.Code) that these messages use
OK, UNKNOWN, INVALID_ARGUMENT, UNIMPLEMENTED, INTERNAL = 0, 2, 3, 12, 13
_READ_SIZE = 1 << 16


class ProtocolError(HookError):
    """The peer broke the framing (or closed the connection): the connection cannot go on."""


class RemoteError(HookError):
    """A call answered with a non-OK status: its code and message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Message:
    """One ttrpc message, with the multiplexed connection it came on."""

    __slots__ = ("conn", "flags", "payload", "stream", "type")

    def __init__(self, conn: int, stream: int, type_: int, flags: int, payload: bytes) -> None:
        self.conn = conn
        self.stream = stream
        self.type = type_
        self.flags = flags
        self.payload = payload

    def __repr__(self) -> str:
        return f"Message(conn={self.conn}, stream={self.stream}, type={self.type}, flags={self.flags}, " \
               f"{len(self.payload)} bytes)"


def encode(conn: int, stream: int, type_: int, flags: int, payload: bytes) -> bytes:
    """The bytes on the socket for one ttrpc message on multiplexed connection ``conn``: its ttrpc header and
    payload, cut into multiplexer frames of at most :data:`MAX_MUX_PAYLOAD` bytes."""
    if len(payload) > MAX_MESSAGE:
        raise ProtocolError(f"a ttrpc message of {len(payload)} bytes is over ttrpc's limit of {MAX_MESSAGE}")
    if not 0 < conn <= 0xFFFFFFFF or not 0 <= stream <= 0xFFFFFFFF:
        raise ProtocolError(f"connection {conn} / stream {stream} out of range")
    data = TTRPC_HEADER.pack(len(payload), stream, type_, flags) + payload
    out = []
    for start in range(0, len(data), MAX_MUX_PAYLOAD):
        chunk = data[start:start + MAX_MUX_PAYLOAD]
        out.append(MUX_HEADER.pack(conn, len(chunk)))
        out.append(chunk)
    return b"".join(out)


class Demux:
    """Whole ttrpc messages out of the bytes a multiplexed socket delivers, in any pieces."""

    def __init__(self, conns: tuple[int, ...] = (PLUGIN_CONN, RUNTIME_CONN)) -> None:
        self._trunk = bytearray()
        self._streams: dict[int, bytearray] = {conn: bytearray() for conn in conns}

    def feed(self, data: bytes) -> list[Message]:
        """The messages that ``data`` completes, in order (a ProtocolError for a frame or message over the
        limits, or a ttrpc message of an unknown type)."""
        self._trunk += data
        out: list[Message] = []
        while len(self._trunk) >= MUX_HEADER.size:
            conn, length = MUX_HEADER.unpack_from(self._trunk)
            if length > MAX_MUX_PAYLOAD:
                raise ProtocolError(f"a multiplexer frame of {length} bytes is over the limit of {MAX_MUX_PAYLOAD}")
            if len(self._trunk) < MUX_HEADER.size + length:
                break
            payload = bytes(self._trunk[MUX_HEADER.size:MUX_HEADER.size + length])
            del self._trunk[:MUX_HEADER.size + length]
            stream = self._streams.get(conn)
            if stream is None:
                continue  # a connection nobody opened: dropped, as the multiplexer does
            stream += payload
            out.extend(self._messages(conn, stream))
        return out

    @staticmethod
    def _messages(conn: int, stream: bytearray) -> list[Message]:
        out = []
        while len(stream) >= TTRPC_HEADER.size:
            length, sid, type_, flags = TTRPC_HEADER.unpack_from(stream)
            if length > MAX_MESSAGE:
                raise ProtocolError(f"a ttrpc message of {length} bytes is over ttrpc's limit of {MAX_MESSAGE}")
            if type_ not in (REQUEST, RESPONSE, DATA):
                raise ProtocolError(f"a ttrpc message of unknown type {type_}")
            if len(stream) < TTRPC_HEADER.size + length:
                break
            out.append(Message(conn, sid, type_, flags,
                               bytes(stream[TTRPC_HEADER.size:TTRPC_HEADER.size + length])))
            del stream[:TTRPC_HEADER.size + length]
        return out

    @property
    def idle(self) -> bool:
        """Nothing half-received: the peer may close here without cutting a message."""
        return not self._trunk and not any(self._streams.values())


class Channel:
    """ttrpc over NRI's multiplexed socket: requests in, responses out, and unary calls of our own."""

    def __init__(self, sock: socket.socket, client_conn: int = RUNTIME_CONN) -> None:
        self.sock = sock
        self.client_conn = client_conn  # where this end calls
        self._demux = Demux()
        self._queued: deque[Message] = deque()
        self._next_stream = 1

    def send(self, conn: int, stream: int, type_: int, flags: int, payload: bytes) -> None:
        data = encode(conn, stream, type_, flags, payload)
        try:
            self.sock.settimeout(None)
            self.sock.sendall(data)
        except OSError as err:
            raise ProtocolError(f"the connection failed: {err.strerror or err}") from None

    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message (one queued while a call waited first); None when the peer closed the socket
        between messages (a ProtocolError inside one, or after ``timeout`` seconds)."""
        if self._queued:
            return self._queued.popleft()
        self.sock.settimeout(timeout)
        while True:
            try:
                data = self.sock.recv(_READ_SIZE)
            except TimeoutError:
                raise ProtocolError(f"no answer from the peer within {timeout:g} s") from None
            except OSError as err:
                raise ProtocolError(f"the connection failed: {err.strerror or err}") from None
            if not data:
                if self._demux.idle:
                    return None
                raise ProtocolError("the peer closed the connection in the middle of a message")
            messages = self._demux.feed(data)
            if messages:
                self._queued.extend(messages[1:])
                return messages[0]

    def respond(self, request: Message, payload: bytes = b"", code: int = OK, message: str = "") -> None:
        """Answer ``request`` with ``payload`` (the reply message's bytes), or with a non-OK ``code`` and
        ``message``."""
        from oci_gpu_hook.serve.nri import ttrpc_pb2

        response = ttrpc_pb2.Response(payload=payload)
        if code != OK:
            response.status.code = code
            response.status.message = message
        else:
            response.status.code = OK
        self.send(request.conn, request.stream, RESPONSE, 0, response.SerializeToString())

    def call(self, service: str, method: str, request: ProtoMessage, reply: type[ProtoMessage],
             timeout: float) -> ProtoMessage:
        """A unary call on :attr:`client_conn`; requests that arrive before its answer are kept for
        :meth:`receive`.  A RemoteError for a non-OK status, a ProtocolError when no answer comes."""
        from oci_gpu_hook.serve.nri import ttrpc_pb2

        stream = self._next_stream
        self._next_stream += 2
        envelope = ttrpc_pb2.Request(service=service, method=method, payload=request.SerializeToString(),
                                     timeout_nano=int(timeout * 1e9))
        self.send(self.client_conn, stream, REQUEST, FLAG_REMOTE_CLOSED, envelope.SerializeToString())
        held: list[Message] = []
        try:
            while True:
                message = self.receive(timeout)
                if message is None:
                    raise ProtocolError(f"the peer closed the connection before answering {method}")
                if message.conn == self.client_conn and message.stream == stream and message.type == RESPONSE:
                    break
                held.append(message)
        finally:
            self._queued.extendleft(reversed(held))
        try:
            response = ttrpc_pb2.Response.FromString(message.payload)
        except Exception:  # protobuf's DecodeError, without importing it for an except clause
            raise ProtocolError(f"the answer to {method} is not a ttrpc Response") from None
        if response.status.code != OK:
            raise RemoteError(response.status.code, response.status.message)
        try:
            return reply.FromString(response.payload)
        except Exception:
            raise ProtocolError(f"the answer to {method} is not a {reply.DESCRIPTOR.name}") from None
