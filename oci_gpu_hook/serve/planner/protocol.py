"""The planner's wire format: what a front and a worker say, and within which bounds (the package's docstring,
:mod:`oci_gpu_hook.serve.planner`, says why).  The socket's default path and variable, the front's bound on the whole
exchange, the request and the answer as bytes, READY, GO and STARTED (once or not at all), the version line both
sides must say; nothing here acts on a request."""

from __future__ import annotations

import os
import struct

from oci_gpu_hook.serve.planner.build import build_id

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    import socket as socket_module
    from collections.abc import Sequence

DEFAULT_SOCKET = "/run/oci-gpu-hook/planner.sock"
SOCKET_ENV = "OCI_GPU_HOOK_PLANNER_SOCKET"  # overrides the socket the front asks ('' : never ask)
ANSWER_TIMEOUT_MS = 2000  # the front's bound on the whole exchange; then it falls back to Python
REQUEST_TIMEOUT_S = 10.0  # a worker's bound on writing its answer
PROTOCOL = 2
MAX_REQUEST = 96 << 20  # stdin up to the front's 64 MiB, argv and environment
MAX_ITEMS = 1 << 16
REQUEST_MAGIC, ANSWER_MAGIC = b"OGHQ", b"OGHA"
READY, GO, STARTED = b"OGHR", b"OGHG", b"OGHS"  # the worker's "ready", the front's "go", the worker's "acting now"
FD_NAMES = ("mnt", "pid", "cgroup", "user", "root", "cwd")  # the order the front sends them in
ROLES = ("oci-gpu-runtime", "oci-gpu-hook")


# --- versions -----------------------------------------------------------------------------------------------


def version_line(build: str | None = None) -> str:
    """What a front and a planner must both say: package version, protocol, build."""
    from oci_gpu_hook import __version__

    return f"oci-gpu-hook {__version__} planner/{PROTOCOL} {build or build_id()}"


# --- the protocol -------------------------------------------------------------------------------------------
#
# request: b"OGHQ", u32 length, then fields, each u32 length + bytes, in this order: version line, launcher name,
#   argv[0] for Python (the front's path), the runtime baked into the shim's launcher, parent pid, umask and
#   securebits (decimal), u32 n + n argv words, u32 m + m environment entries, "1"/"0" (stdin given), stdin; with
#   the request's first bytes, SCM_RIGHTS carrying FD_NAMES in order.
# then, once or not at all: the worker reads the whole request within ANSWER_TIMEOUT_MS of its accept, checks
#   everything and enters the front's namespaces (nothing outside itself changed), and says READY, or sends a
#   refusal (an answer, "refused"); the front says GO only while inside its own bound, else it closes and runs
#   Python; a worker without GO within its bound does nothing.  After GO the worker says STARTED and then acts:
#   a connection that dies before STARTED came means nothing was done (the front falls back); after it, the
#   front cannot know what was, and stops with one line instead of doing it again.
# answer: b"OGHA", u32 length, then 7 fields: version line, "ok" | "refused", exit status (decimal), the runtime
#   to exec ("" = none), one NAME=VALUE for its environment ("" = none), stdout, stderr.  Integers big-endian.


class BadRequest(Exception):
    """A request this planner does not serve; the front falls back to Python."""


class NoRequest(BadRequest):
    """A connection closed before a byte came (a check that the planner listens)."""


class GaveUp(BadRequest):
    """The front closed or ran out of its bound before it said GO: it runs Python, and the worker does nothing."""


class Request:
    __slots__ = ("args", "argv0", "baked_runtime", "env", "fds", "ppid", "role", "securebits", "stdin", "umask",
                 "version")

    def __init__(self, version: str, role: str, argv0: bytes, baked_runtime: bytes, ppid: int, umask: int,
                 args: list[bytes], env: list[bytes], stdin: bytes | None, fds: list[int],
                 securebits: int = 0) -> None:
        self.version = version
        self.role = role
        self.argv0 = argv0
        self.baked_runtime = baked_runtime
        self.ppid = ppid
        self.umask = umask
        self.args = args
        self.env = env
        self.stdin = stdin
        self.fds = fds
        self.securebits = securebits

    @property
    def live(self) -> bool:
        """A hook that reads the state's pid (prestart, createRuntime, and the links and ldcache hooks)."""
        from oci_gpu_hook import CREATE_RUNTIME_HOOKS, LIVE_COMMANDS

        return (self.role == "oci-gpu-hook" and bool(self.args)
                and os.fsdecode(self.args[0]) in (*LIVE_COMMANDS, *CREATE_RUNTIME_HOOKS))


def _within(conn: socket_module.socket, deadline: float) -> None:
    """The socket's timeout set to what is left of ``deadline`` (time.monotonic): one bound for a whole exchange,
    however the peer trickles its bytes; BadRequest once it has passed."""
    import time

    left = deadline - time.monotonic()
    if left <= 0:
        raise BadRequest("the request took longer than its bound")
    conn.settimeout(left)


def _recv_exact(conn: socket_module.socket, size: int, deadline: float) -> bytes:
    chunks, got = [], 0
    while got < size:
        _within(conn, deadline)
        try:
            chunk = conn.recv(min(size - got, 1 << 20))
        except TimeoutError:
            raise BadRequest("the request took longer than its bound") from None
        if not chunk:
            raise BadRequest("the request ends early")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def read_request(conn: socket_module.socket, deadline: float) -> Request:
    """One request from ``conn`` (its descriptors with the first bytes), all of it before ``deadline``
    (time.monotonic); BadRequest for anything else."""
    import array
    import socket

    fds = array.array("i")
    _within(conn, deadline)
    try:
        data, ancillary, _flags, _addr = conn.recvmsg(8, socket.CMSG_SPACE(len(FD_NAMES) * fds.itemsize))
    except TimeoutError:
        raise BadRequest("the request took longer than its bound") from None
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    received = list(fds)
    try:
        if not data and not received:
            raise NoRequest("closed at once")
        if len(data) < 8:
            data += _recv_exact(conn, 8 - len(data), deadline)
        if data[:4] != REQUEST_MAGIC:
            raise BadRequest("not a planner request")
        if len(received) != len(FD_NAMES):
            raise BadRequest(f"{len(received)} descriptors, not {len(FD_NAMES)}")
        (size,) = struct.unpack(">I", data[4:8])
        if size > MAX_REQUEST:
            raise BadRequest(f"a request of {size} bytes")
        body = _recv_exact(conn, size, deadline)
        at = 0

        def field() -> bytes:
            nonlocal at
            if len(body) - at < 4:
                raise BadRequest("the request ends early")
            (n,) = struct.unpack_from(">I", body, at)
            if len(body) - at - 4 < n:
                raise BadRequest("the request ends early")
            at += 4 + n
            return body[at - n:at]

        def count() -> int:
            nonlocal at
            if len(body) - at < 4:
                raise BadRequest("the request ends early")
            (n,) = struct.unpack_from(">I", body, at)
            at += 4
            if n > MAX_ITEMS:
                raise BadRequest(f"{n} items")
            return int(n)

        def number(text: bytes) -> int:
            if not text.isdigit() or len(text) > 12:
                raise BadRequest(f"not a number: {text[:20]!r}")
            return int(text)

        version = field().decode("utf-8", "replace")
        role = field().decode("utf-8", "replace")
        argv0 = field()
        baked_runtime = field()
        ppid = number(field())
        umask = number(field())
        securebits = number(field())
        args = [field() for _ in range(count())]
        env = [field() for _ in range(count())]
        has_stdin = field()
        stdin = field()
        if at != len(body) or has_stdin not in (b"0", b"1"):
            raise BadRequest("a malformed request")
        return Request(version, role, argv0, baked_runtime, ppid, umask & 0o7777, args, env,
                       stdin if has_stdin == b"1" else None, received, securebits)
    except BaseException:
        _close_all(received)
        raise


def encode_answer(version: str, status: str, code: int = 1, runtime: bytes = b"", setenv: bytes = b"",
                  out: bytes = b"", err: bytes = b"") -> bytes:
    fields = [version.encode(), status.encode(), str(code).encode(), runtime, setenv, out, err]
    body = b"".join(struct.pack(">I", len(f)) + f for f in fields)
    return ANSWER_MAGIC + struct.pack(">I", len(body)) + body


def decode_answer(data: bytes) -> list[bytes]:
    """The seven fields of an answer (for the Python client and tests)."""
    if data[:4] != ANSWER_MAGIC or len(data) < 8:
        raise BadRequest("not a planner answer")
    (size,) = struct.unpack(">I", data[4:8])
    body, at, fields = data[8:8 + size], 0, []
    while at < len(body):
        (n,) = struct.unpack_from(">I", body, at)
        fields.append(body[at + 4:at + 4 + n])
        at += 4 + n
    if len(fields) != 7:
        raise BadRequest("a malformed answer")
    return fields
