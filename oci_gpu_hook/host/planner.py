"""``oci-gpu-hook serve``: the resident planner, which answers the native front's GPU requests without a Python start.

A container that asks for a GPU makes the native front (``oci_gpu_hook/fastpath/front.c``) hand over to Python: a
Python start and the imports cost more than everything else the request needs.  The planner is that Python,
started once: the imports loaded, every first-call cost paid.  The front sends it what it would have given the
Python launcher (the launcher's name and argv, the environment, stdin, the umask and parent pid; its mount,
pid, cgroup and user namespaces, root and working directory as file descriptors) and applies the answer: the
stdout and stderr bytes, then the exit status or the runtime to exec.

**One outcome either way.**  Each request runs in a process of its own, forked from the planner beforehand (a pool
of ``--workers``, each serving one request and then replaced), which *becomes* the launcher process the front would
have started: it enters the front's mount namespace, root and working directory (so every path, config file, sysfs,
bundle and log file is the one the front sees), takes its environment, umask, argv and stdin, the parent pid that
``check_container`` compares, and the stdio encoding CPython would have picked for that environment
(:func:`python_stdio`; a front whose Python would not write UTF-8 is sent back), and then runs the launcher's own
entry point, ``entry.cli.main`` or ``entry.runtime.prepare`` (which ``serve``'s command passes in: the planner imports
nothing of the entry layer) -- the same code on the same inputs.  It writes
config.json itself, as Python does (:func:`oci_gpu_hook.atomic.write_atomic`: a rename, so a planner killed
mid-request leaves the old file or the new one, never half of one).  **Once or not at all** (the protocol, below):
nothing outside the worker changes before the front's GO, which comes only inside the front's bound; after it, the
front never runs the request again.  A live hook (``prestart``) is served only in the front's pid and cgroup
namespaces, where the pids and cgroup paths it reads mean the same; the front's user namespace always.

**The inventory.**  Every request scans sysfs afresh in the front's mount namespace, exactly as the Python path
does: on a warm dentry cache an 8-GPU host takes well under a millisecond, about what checking a cached
inventory against sysfs would cost, and a fresh scan is never staler than itself.  So no uevent stream is kept.

**Trust.**  The socket lives in a directory that is root's alone (mode 0700, created so, on a path only root can
change); the planner answers only uid 0 peers (``SO_PEERCRED``), and the front talks only to a uid 0 server in such
a directory; a worker acts only for a front whose credentials are the planner's (the front's credentials, below).
**Versions.**  The front bakes :func:`version_line` (package version, protocol, a hash of the package's files and
the interpreter's version); the planner computes its own at start and answers only requests that carry the same
line, and the front checks the answer's; the planner watches its package's files (:class:`PackageWatch`) and, once
one changes on disk, refuses every request and exits, for its unit to start the new build (which the old fronts
refuse by its hash until ``install`` rebuilds them).  **Robustness.**  Workers exit after one request; a bad request
ends its worker alone; SIGTERM lets busy workers finish, idle ones go at once; a killed planner's idle workers
follow it (``PR_SET_PDEATHSIG``); one planner per socket (a lock beside it).
"""

from __future__ import annotations

import os
import struct
import sys

from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: the launchers import this module's constants when they bake

if TYPE_CHECKING:
    import socket as socket_module
    from collections.abc import Callable, Sequence

    from oci_gpu_hook.config import Config

    # a launcher's entry point, which the entry layer passes in (``serve``'s command): (role, argv, the runtime baked
    # into the shim's launcher) -> (exit status, the runtime to exec or None)
    Launch = Callable[[str, list[str], str], tuple[int, str | None]]

DEFAULT_SOCKET = "/run/oci-gpu-hook/planner.sock"
SOCKET_ENV = "OCI_GPU_HOOK_PLANNER_SOCKET"  # overrides the socket the front asks ('' : never ask)
ANSWER_TIMEOUT_MS = 2000  # the front's bound on the whole exchange; then it falls back to Python
REQUEST_TIMEOUT_S = 10.0  # a worker's bound on writing its answer
PROTOCOL = 2
DEFAULT_WORKERS = 8
STOP_GRACE_S = 10.0
MAX_REQUEST = 96 << 20  # stdin up to the front's 64 MiB, argv and environment
MAX_ITEMS = 1 << 16
REQUEST_MAGIC, ANSWER_MAGIC = b"OGHQ", b"OGHA"
READY, GO, STARTED = b"OGHR", b"OGHG", b"OGHS"  # the worker's "ready", the front's "go", the worker's "acting now"
SO_PEERPIDFD = 77  # Linux 6.5: a pidfd of the process that connected, which no pid reuse can redirect
PR_GET_SECUREBITS = 27
FD_NAMES = ("mnt", "pid", "cgroup", "user", "root", "cwd")  # the order the front sends them in
ROLES = ("oci-gpu-runtime", "oci-gpu-hook")
COERCION_TARGETS = ("C.UTF-8", "C.utf8", "UTF-8")  # CPython's _TARGET_LOCALES (PEP 538)
CLONE_NEWNS = 0x00020000
PR_SET_PDEATHSIG = 1

# What the served entry points may import, loaded before the workers fork (a worker that entered another mount
# namespace must not look for code there): the package but its operator-only parts, and these.
PRELOAD_STDLIB = ("tomllib", "fcntl", "ctypes", "resource", "select", "traceback", "locale", "codecs", "io", "json",
                  "array", "struct", "encodings.utf_8", "encodings.latin_1", "encodings.ascii")
NOT_PRELOADED = ("oci_gpu_hook.host", "oci_gpu_hook.models", "oci_gpu_hook.schemas", "oci_gpu_hook.entry.commands",
                 "oci_gpu_hook.appliers.cdi")


# --- versions -----------------------------------------------------------------------------------------------


def build_id(package_dir: str | None = None) -> str:
    """A hash of the package's files (every .py and .c below it, by path and content) and of the interpreter's
    version: two installs agree on it exactly when they run the same code."""
    import hashlib

    root = package_dir or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256(sys.version.encode())
    found = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
        found.extend(os.path.join(directory, f) for f in files if f.endswith((".py", ".c")))
    for path in sorted(found):
        with open(path, "rb") as handle:
            data = handle.read()
        digest.update(os.path.relpath(path, root).encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return digest.hexdigest()[:24]


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
        from oci_gpu_hook import LIVE_COMMANDS

        return self.role == "oci-gpu-hook" and bool(self.args) and os.fsdecode(self.args[0]) in LIVE_COMMANDS


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


# --- the front's credentials --------------------------------------------------------------------------------
#
# A worker acts with the planner's privileges; the Python launcher the front would have started acts with the
# front's.  So a request is served only from a front whose credentials are the planner's own: every field of
# /proc/PID/status that decides what a process may do (STATUS_FIELDS), its LSM label, its securebits (which
# /proc does not show: the front sends its own, and a front that lies about them holds the capabilities anyway,
# for they must equal the planner's), and the memory limits (RLIMITS_SAME: a fork of the planner holds more
# memory than a fresh Python).  The other rlimits the worker takes on (RLIMITS_TAKEN): the file size limit, the
# descriptor limit and the rest bound the Python launcher exactly as they bind the worker; and so it takes on the
# supplementary groups (a root shell's "0", a service's none).  Anything else
# differs: refused, and the front's Python runs with the front's own credentials.  The peer is named by
# SO_PEERPIDFD (the process that connected, not whatever holds its pid now), its /proc files are read while
# that pidfd shows the same pid (a reaped front's pid could be another process's), before the request is read.

STATUS_FIELDS = ("Uid", "Gid", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp",
                 "Seccomp_filters")
RLIMITS_SAME = ("AS", "DATA", "STACK", "RSS")
RLIMITS_TAKEN = ("CPU", "FSIZE", "CORE", "NPROC", "NOFILE", "MEMLOCK", "LOCKS", "SIGPENDING", "MSGQUEUE", "NICE",
                 "RTPRIO", "RTTIME")
RLIMIT_NUMBERS = {"CPU": 0, "FSIZE": 1, "DATA": 2, "STACK": 3, "CORE": 4, "RSS": 5, "NPROC": 6, "NOFILE": 7,
                  "MEMLOCK": 8, "AS": 9, "LOCKS": 10, "SIGPENDING": 11, "MSGQUEUE": 12, "NICE": 13, "RTPRIO": 14,
                  "RTTIME": 15}  # Linux's (the resource module lacks RLIMIT_LOCKS), all RLIM_NLIMITS of them


class Credentials:
    """What decides what a process may do: the STATUS_FIELDS lines, the LSM label and the rlimits."""

    __slots__ = ("groups", "label", "limits", "status")

    def __init__(self, status: dict[str, str], label: bytes | None, limits: dict[str, tuple[int, int]],
                 groups: list[int] | None = None) -> None:
        self.status = status
        self.label = label
        self.limits = limits
        self.groups = groups or []


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None  # attr/current where no LSM is loaded (EINVAL); the comparison then sees None on both sides


_WANTED = frozenset(f.encode() for f in (*STATUS_FIELDS, "Groups"))


def _status_fields(text: bytes) -> dict[str, str]:
    fields = {}
    for line in text.split(b"\n"):
        name, _colon, value = line.partition(b":")
        if name in _WANTED:
            fields[name.decode()] = b" ".join(value.split()).decode("ascii", "replace")
    return fields


def credentials_of(pid: int) -> Credentials | None:
    """``pid``'s credentials (``0``: this process's own), or None where its /proc files cannot be read."""
    import resource

    where = f"/proc/{pid or 'self'}"
    status = _read(f"{where}/status")
    if status is None:
        return None
    try:
        limits = {n: resource.prlimit(pid, RLIMIT_NUMBERS[n]) for n in (*RLIMITS_SAME, *RLIMITS_TAKEN)}
    except OSError:
        return None
    fields = _status_fields(status)
    groups = [int(g) for g in fields.pop("Groups", "").split() if g.isdigit()]
    return Credentials(fields, _read(f"{where}/attr/current"), limits, groups)


def _pidfd_pid(fdinfo: int) -> int:
    """The pid in the pidfd's /proc/self/fdinfo (open as ``fdinfo``): -1 once the process is reaped."""
    text = os.pread(fdinfo, 4096, 0)
    at = text.find(b"\nPid:")
    value = text[at + 5:text.find(b"\n", at + 5)].strip() if at >= 0 else b""
    return int(value) if value.isdigit() else -1


def peer_credentials(conn: socket_module.socket) -> Credentials | str:
    """The credentials of the process that connected to ``conn``, or why they cannot be known."""
    import socket

    try:
        pidfd = conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError as err:
        return f"the front cannot be named (SO_PEERPIDFD: {err.strerror}; Linux 6.5 or later)"
    fdinfo = -1
    try:
        fdinfo = os.open(f"/proc/self/fdinfo/{pidfd}", os.O_RDONLY | os.O_CLOEXEC)
        pid = _pidfd_pid(fdinfo)
        if pid <= 0:
            return "the front is gone or in a pid namespace this planner cannot see"
        found = credentials_of(pid)
        if found is None or _pidfd_pid(fdinfo) != pid:
            return "the front is gone"
        return found
    except OSError as err:
        return f"the front cannot be read ({err.strerror})"
    finally:
        os.close(pidfd)
        if fdinfo >= 0:
            os.close(fdinfo)


def securebits() -> int:
    import ctypes

    return int(ctypes.CDLL(None, use_errno=True).prctl(PR_GET_SECUREBITS, 0, 0, 0, 0))


def credentials_problem(peer: Credentials, own: Credentials, peer_securebits: int, own_securebits: int) -> str:
    """Why a worker of ``own`` credentials may not act for a front of ``peer``'s ('' : it may)."""
    for name in STATUS_FIELDS:
        if peer.status.get(name) != own.status.get(name):
            return f"the front's {name} is {peer.status.get(name)!r}, the planner's {own.status.get(name)!r}"
    if peer.label != own.label:
        return "the front has another LSM label"
    if peer_securebits != own_securebits:
        return f"the front's securebits are {peer_securebits:#x}, the planner's {own_securebits:#x}"
    for name in RLIMITS_SAME:
        if peer.limits[name] != own.limits[name]:
            return f"the front's RLIMIT_{name} is {peer.limits[name]}, the planner's {own.limits[name]}"
    return ""


def take_limits(peer: Credentials, own: Credentials) -> None:
    """The RLIMITS_TAKEN and the supplementary groups of the front, set on this worker where they differ from the
    planner's."""
    import resource

    if peer.groups != own.groups:
        try:
            os.setgroups(peer.groups)
        except OSError as err:
            raise BadRequest(f"cannot take the front's groups: {err.strerror}") from None

    for name in RLIMITS_TAKEN:
        if peer.limits[name] != own.limits[name]:
            try:
                resource.setrlimit(RLIMIT_NUMBERS[name], peer.limits[name])
            except (OSError, ValueError) as err:
                raise BadRequest(f"cannot take the front's RLIMIT_{name}: {err}") from None


def exec_problem(own: Credentials) -> str:
    """Why the planner's own capabilities are not what its exec would give a root process ('' : they are): only
    then does a front of the same credentials start a Python launcher of them too."""
    if own.status.get("Uid", "").split()[1:2] != ["0"]:
        return "it does not run as root"
    permitted, effective = own.status.get("CapPrm"), own.status.get("CapEff")
    try:
        after = int(own.status.get("CapInh", "0"), 16) | int(own.status.get("CapBnd", "0"), 16)
        same = int(permitted or "x", 16) == after == int(effective or "x", 16)
    except ValueError:
        same = False
    if not same or securebits():
        return "its capabilities are not those an exec as root gives (permitted = effective = bounding, no securebits)"
    return ""


# --- the package on disk -------------------------------------------------------------------------------------


class PackageWatch:
    """Whether any file of the package changed since the watch began: inotify on every file of it and every
    directory (but __pycache__, which Python itself writes), shared by the planner and its workers and never read,
    so that one change makes it readable for good.  A file written, truncated, renamed over or away, deleted, or
    its mode changed is seen (a rename over a file or its removal changes its link count); a file added beside the
    others is not, but no upgrade adds a module without changing one that imports it.  Where inotify cannot be
    had, a stamp of every file (inode, size, times) compared on each request."""

    FILE_MASK = 0x2 | 0x4 | 0x8 | 0x400 | 0x800  # IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE, IN_DELETE_SELF, IN_MOVE_SELF
    DIR_MASK = 0x400 | 0x800

    def __init__(self, root: str | None = None) -> None:
        import ctypes

        self.root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.fd = -1
        self.stamp: list[tuple[str, tuple[int, ...]]] = []
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        ok = fd >= 0
        for directory, subdirs, files in os.walk(self.root):
            subdirs[:] = [d for d in subdirs if d != "__pycache__"]
            for path, mask in [(directory, self.DIR_MASK), *((os.path.join(directory, f), self.FILE_MASK)
                                                              for f in files)]:
                if ok and libc.inotify_add_watch(fd, os.fsencode(path), mask) < 0:
                    ok = False
        if ok:
            self.fd = fd
        else:
            if fd >= 0:
                os.close(fd)
            self.stamp = self._stamp()

    def _stamp(self) -> list[tuple[str, tuple[int, ...]]]:
        found = []
        for directory, subdirs, files in os.walk(self.root):
            subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
            for name in sorted([".", *files]):
                path = os.path.join(directory, name)
                try:
                    st = os.stat(path)
                    found.append((path, (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)))
                except OSError:
                    found.append((path, ()))
        return found

    def changed(self) -> bool:
        if self.fd < 0:
            return self._stamp() != self.stamp
        import select

        return bool(select.select([self.fd], [], [], 0)[0])


# --- becoming the launcher ----------------------------------------------------------------------------------


def _same(fd: int, path: str) -> bool:
    a, b = os.fstat(fd), os.stat(path)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _setns(fd: int) -> None:
    if hasattr(os, "setns"):
        os.setns(fd, CLONE_NEWNS)
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNS) != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


def enter(request: Request) -> None:
    """Take the front's namespaces, root, working directory and umask: every path then means what it means to
    the front.  BadRequest where that cannot be (another user namespace; a live hook from other pid or cgroup
    namespaces, whose pids and cgroup paths would read differently here)."""
    mnt, pid, cgroup, user, root, cwd = request.fds
    if not _same(user, "/proc/self/ns/user"):
        raise BadRequest("the front is in another user namespace")
    if request.live and not (_same(pid, "/proc/self/ns/pid") and _same(cgroup, "/proc/self/ns/cgroup")):
        raise BadRequest("a live hook from another pid or cgroup namespace")
    if not _same(mnt, "/proc/self/ns/mnt"):
        _setns(mnt)
    if not _same(root, "/"):
        os.fchdir(root)
        os.chroot(".")
    os.fchdir(cwd)
    os.umask(request.umask)


def set_environ(entries: Sequence[bytes]) -> None:
    """os.environ as CPython builds it from ``entries`` (the first of a name wins; an entry without '=' is
    skipped); the C environment too.  BadRequest for a name putenv cannot take."""
    os.environ.clear()
    for entry in entries:
        name, eq, value = entry.partition(b"=")
        if not eq:
            continue
        if not name or b"\0" in entry:
            raise BadRequest("an environment entry without a name")
        if name not in os.environb:
            os.environb[name] = value


def python_stdio() -> tuple[str, str]:
    """(the error handler of stdin and stdout, the LC_CTYPE its C locale coercion sets, or '') that CPython (3.8
    and later, ``-I``) picks at start for the environment now set: LC_CTYPE from the environment; "C" or "POSIX"
    turns on the UTF-8 mode; "C" with no LC_ALL is coerced to the first of COERCION_TARGETS that exists (PEP 538),
    which also lands in the environment; the handler is surrogateescape in the UTF-8 mode and in the C, POSIX and
    coercion-target locales (config_get_stdio_errors), else strict, and the encoding the locale's codeset.
    BadRequest when that codeset is not UTF-8 (then the front runs Python)."""
    import codecs
    import locale

    locale.setlocale(locale.LC_CTYPE, "C")  # where a process starts
    try:
        locale.setlocale(locale.LC_CTYPE, "")
    except locale.Error:
        pass  # CPython keeps "C"
    current = locale.setlocale(locale.LC_CTYPE)
    coerced = ""
    if current == "C" and not os.environ.get("LC_ALL"):
        for target in COERCION_TARGETS:
            try:
                locale.setlocale(locale.LC_CTYPE, target)
            except locale.Error:
                continue
            coerced = target
            break
    if current in ("C", "POSIX"):
        return "surrogateescape", coerced
    try:
        codeset = codecs.lookup(locale.nl_langinfo(locale.CODESET)).name
    except LookupError:
        codeset = "?"
    if codeset != "utf-8":
        raise BadRequest(f"the front's Python would write {codeset}")
    return ("surrogateescape" if current in COERCION_TARGETS else "strict"), ""


def prepare_entry(request: Request) -> tuple[str, str]:
    """What run_entry needs and may refuse, checked and set before anything outside this process changes: the
    launcher and its command, the environment, the stdio CPython would pick (python_stdio)."""
    if request.role not in ROLES:
        raise BadRequest(f"no launcher {request.role!r}")
    from oci_gpu_hook import LIVE_COMMANDS, PRECREATE

    if request.role == "oci-gpu-hook" and (len(request.args) != 1 or
                                           os.fsdecode(request.args[0]) not in (PRECREATE, *LIVE_COMMANDS)):
        raise BadRequest("not a hook command the front sends")
    set_environ(request.env)
    errors, coerced = python_stdio()
    if coerced:
        os.environ["LC_CTYPE"] = coerced
    return errors, coerced


def run_entry(request: Request, prepared: tuple[str, str], launch: Launch) -> tuple[int, bytes, bytes, bytes, bytes]:
    """Run the launcher's entry point (``launch``) as the launcher process would: (exit status, runtime to exec,
    LC_CTYPE entry for it, stdout, stderr)."""
    import io

    errors, coerced = prepared
    real_ppid = os.getppid
    os.getppid = lambda: request.ppid  # live.check_container: the runtime that ran the hook is the front's parent
    out, err = io.BytesIO(), io.BytesIO()
    sys.stdin = io.TextIOWrapper(io.BytesIO(request.stdin or b""), encoding="utf-8", errors=errors)
    sys.stdout = io.TextIOWrapper(out, encoding="utf-8", errors=errors)
    sys.stderr = io.TextIOWrapper(err, encoding="utf-8", errors="backslashreplace", line_buffering=True)
    args = [os.fsdecode(a) for a in request.args]
    sys.argv = [os.fsdecode(request.argv0), *args]
    runtime = None
    try:
        code, runtime = launch(request.role, args, os.fsdecode(request.baked_runtime))
    except SystemExit as done:  # sys.exit(main()) in the launcher
        if done.code is None or isinstance(done.code, int):
            code = done.code or 0
        else:
            print(done.code, file=sys.stderr)
            code = 1
    finally:
        os.getppid = real_ppid
    sys.stdout.flush()
    sys.stderr.flush()
    setenv = f"LC_CTYPE={coerced}".encode() if coerced and runtime else b""
    return code & 0xFF, os.fsencode(runtime or ""), setenv, out.getvalue(), err.getvalue()


def peer_uid(conn: socket_module.socket) -> int:
    import socket

    _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return int(uid)


def serve_one(conn: socket_module.socket, version: str, own: Credentials | None = None, own_securebits: int = 0,
              watch: PackageWatch | None = None, *, launch: Launch) -> str:
    """Read, check, run and answer one request on ``conn`` (see the protocol above); what happened, in a word (for
    the planner's log).  ``own``: the planner's credentials, which the front's must match; ``watch``: the
    package's files, which must not have changed since the planner started; ``launch``: the entry points."""
    import time

    deadline = time.monotonic() + ANSWER_TIMEOUT_MS / 1000  # the front's bound, which began before our accept
    if peer_uid(conn) != 0:
        return "refused a peer that is not root"
    peer = peer_credentials(conn) if own is not None else None  # at accept, before the peer can do more
    try:
        request = read_request(conn, deadline)
    except NoRequest:
        return "ok: no request"
    except (BadRequest, OSError, UnicodeDecodeError) as err:
        _answer(conn, encode_answer(version, "refused"))
        return f"bad request: {err}"
    started = False
    try:
        if request.version != version:
            raise BadRequest(f"a front of another version ({request.version[:80]})")
        if watch is not None and watch.changed():
            raise BadRequest("stale: the package's files changed since the planner started")
        if own is not None:
            if isinstance(peer, str):
                raise BadRequest(peer)
            assert peer is not None
            why = credentials_problem(peer, own, request.securebits, own_securebits)
            if why:
                raise BadRequest(f"credentials: {why}")
        enter(request)
        prepared = prepare_entry(request)
        if own is not None and peer is not None and not isinstance(peer, str):
            take_limits(peer, own)
        try:
            _within(conn, deadline)
            conn.sendall(READY)
            go = _recv_exact(conn, len(GO), deadline)
        except (BadRequest, OSError) as err:
            raise GaveUp(str(err)) from None
        if go != GO:
            raise GaveUp("no go")
        conn.settimeout(REQUEST_TIMEOUT_S)
        try:
            conn.sendall(STARTED)  # past this, the front does not run the request again
        except OSError as err:
            raise GaveUp(str(err)) from None
        started = True
        code, runtime, setenv, out, err = run_entry(request, prepared, launch)
    except GaveUp as gone:
        return f"the front gave up before go ({gone}): nothing done"
    except (BadRequest, OSError, UnicodeDecodeError, HookError) as bad:
        _answer(conn, encode_answer(version, "refused"))
        return f"{'failed after go' if started else 'refused'}: {bad}"
    finally:
        _close_all(request.fds)
    _answer(conn, encode_answer(version, "ok", code, runtime, setenv, out, err))
    return f"ok {code}"


def _answer(conn: socket_module.socket, data: bytes) -> None:
    try:
        conn.sendall(data)
    except OSError:
        pass  # the front gave up: it falls back


# --- the daemon ---------------------------------------------------------------------------------------------


def _say(text: str) -> None:
    import time

    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        os.write(2, f"{stamp} planner: {text}\n".encode(errors="replace"))
    except OSError:
        pass


def prepare_directory(socket_path: str) -> str:
    """The socket's directory, made (0700) where missing and checked: a real directory, root's (the planner's
    user's), mode 0700 (a wider one of ours is narrowed), on a trusted path."""
    from oci_gpu_hook.trust import problem

    if not socket_path.startswith("/") or socket_path.endswith("/"):
        raise HookError(f"planner socket {socket_path!r}: expected an absolute file path")
    directory = os.path.dirname(socket_path)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise HookError(f"cannot create the planner's directory {directory}: {err.strerror}") from None
    import stat

    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise HookError(f"planner directory {directory} is not a directory of uid {os.geteuid()} "
                        "(it must be root's alone, mode 0700)")
    if st.st_mode & 0o077:
        os.chmod(directory, 0o700)
    why = problem(directory)
    if why:
        raise HookError(f"planner directory {directory} is not trusted: {why}")
    return directory


class Planner:
    """The pool: a listening socket and up to ``workers`` forked workers, each serving one request."""

    def __init__(self, socket_path: str, workers: int, version: str, verbose: bool = False,
                 own: Credentials | None = None, watch: PackageWatch | None = None, *, launch: Launch) -> None:
        self.socket_path = socket_path
        self.launch = launch
        self.own = own
        self.own_securebits = securebits() if own is not None else 0
        self.watch = watch
        self.verbose = verbose
        self.workers = workers
        self.version = version
        self.children: set[int] = set()
        self.stopping = ""
        self.listener: socket_module.socket | None = None
        self.lock_fd = -1
        self.served = 0
        self.bound = (0, 0)
        self.warm_dir = ""
        self.warm_spec = ""
        self.parent = os.getpid()
        self.preloaded: set[str] = set()

    def bind(self) -> None:
        import fcntl
        import socket

        directory = prepare_directory(self.socket_path)
        lock = os.path.join(directory, os.path.basename(self.socket_path) + ".lock")
        self.lock_fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise HookError(f"another planner is serving {self.socket_path}") from None
        temp = os.path.join(directory, f".{os.path.basename(self.socket_path)}.{os.getpid()}")
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        listener.bind(temp)
        os.chmod(temp, 0o600)
        listener.listen(256)
        os.rename(temp, self.socket_path)  # one step: the old socket (a stopped planner's) or this one
        st = os.stat(self.socket_path)
        self.bound = (st.st_dev, st.st_ino)
        self.listener = listener

    def spawn(self) -> None:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the worker; tests see what it answers
            code = 1
            try:
                code = self._worker()
            except BaseException as err:  # the front sees the connection close, and falls back
                import traceback

                _say(f"a worker failed: {''.join(traceback.format_exception_only(err)).strip()}")
            finally:
                os._exit(code)
        self.children.add(pid)

    def _worker(self) -> int:
        import gc
        import signal

        assert self.listener is not None
        gc.disable()
        os.close(self.lock_fd)  # a worker finishing a request never holds the next planner back
        busy = False

        def on_term(_number: int, _frame: object) -> None:
            if not busy:
                os._exit(0)

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass
        if os.getppid() != self.parent:
            return 0
        self.warm_up()
        conn, _addr = self.listener.accept()
        busy = True
        import time

        started = time.monotonic()
        self.listener.close()
        with conn:
            outcome = serve_one(conn, self.version, self.own, self.own_securebits, self.watch, launch=self.launch)
        if outcome.startswith("refused: stale"):
            os.kill(self.parent, signal.SIGTERM)  # where no inotify wakes it
        if (self.verbose and outcome != "ok: no request") or not outcome.startswith("ok"):  # before the time is added
            _say(outcome + (f" ({(time.monotonic() - started) * 1000:.2f} ms from accept to answer)" if self.verbose
                            else ""))
        new = [m for m in sys.modules if m not in self.preloaded and m.startswith("oci_gpu_hook")]
        if new:
            _say(f"a request imported {', '.join(sorted(new))}: add it to PRELOAD")
        return 0

    def prepare_warm_up(self, config: Config | None) -> None:
        """A private directory (beside the socket, root's alone) with a config of its own (the daemon's sysfs, no log,
        /bin/true for runtime and hook) and the spec of a request for the first device found there."""
        directory = os.path.join(os.path.dirname(self.socket_path), "warm")
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
        sysfs = config.sysfs_root if config is not None else "/sys"
        request = []
        try:
            from oci_gpu_hook.inventory import scan

            inventory = scan(sysfs, strict=False)
            kind = next(k for k in (config.backends if config else ()) if inventory.devices(k))
            request = [f"{config.request_env[kind][0]}=0"]  # type: ignore[union-attr]
        except (HookError, OSError, StopIteration):
            pass  # the no-request path is warmed then
        from oci_gpu_hook import fastjson

        with open(os.path.join(directory, "config.toml"), "w", encoding="utf-8") as handle:
            handle.write(f'sysfs_root = "{sysfs}"\nruntime = "/bin/true"\nhook_path = "/bin/true"\nlog_file = ""\n')
        self.warm_spec = fastjson.dumps({"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin", *request]},
                                         "root": {"path": "rootfs"}})
        self.warm_dir = directory

    def warm_up(self) -> None:
        """Serve a request of our own, in the warm directory, before the real one: the first run in a fresh fork
        pays for the pages it copies and the bytecode it specializes (about 1.5 ms here), and then it has been paid.
        What a request sets (environment, stdio, working directory, umask) the real one sets again."""
        if not self.warm_dir or '"' in self.warm_dir:
            return
        bundle = os.path.join(self.warm_dir, f"b{os.getpid()}")
        saved = (dict(os.environ), sys.stdin, sys.stdout, sys.stderr, os.umask(0o022))
        try:
            os.mkdir(bundle, 0o700)
            with open(os.path.join(bundle, "config.json"), "w", encoding="utf-8") as handle:
                handle.write(self.warm_spec)
            env = [b"PATH=/usr/bin:/bin", b"OCI_GPU_HOOK_CONFIG=" + os.fsencode(self.warm_dir) + b"/config.toml"]
            request = Request(self.version, "oci-gpu-runtime", b"/", b"/bin/true", os.getppid(), 0o022,
                              [b"create", b"--bundle", os.fsencode(bundle), b"warm-up"], env, None, [])
            run_entry(request, prepare_entry(request), self.launch)
        except (BadRequest, OSError, HookError):
            pass
        finally:
            os.environ.clear()
            os.environ.update(saved[0])
            sys.stdin, sys.stdout, sys.stderr = saved[1:4]
            os.umask(saved[4])
            try:
                for name in os.listdir(bundle):
                    os.unlink(os.path.join(bundle, name))
                os.rmdir(bundle)
            except OSError:
                pass

    def reap(self) -> None:
        while self.children:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            if pid in self.children:
                self.children.discard(pid)
                self.served += 1

    def run(self) -> int:
        import gc
        import select
        import signal
        import time

        self.parent = os.getpid()
        self.preloaded = set(sys.modules)
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

        def on_stop(number: int, _frame: object) -> None:
            self.stopping = signal.Signals(number).name

        previous = {s: signal.signal(s, on_stop) for s in (signal.SIGTERM, signal.SIGINT)}
        previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda *_: None)
        old_wakeup = signal.set_wakeup_fd(wake_w)
        gc.collect()
        gc.freeze()  # the workers share these pages instead of copying them at their first collection
        try:
            _say(f"serving {self.socket_path} ({self.workers} workers, {self.version})")
            watched = [self.watch.fd] if self.watch is not None and self.watch.fd >= 0 else []
            while not self.stopping:
                if self.watch is not None and self.watch.changed():
                    self.stopping = "the package's files changed on disk; the unit starts the new build"
                    break
                self.reap()
                while len(self.children) < self.workers and not self.stopping:
                    self.spawn()
                try:
                    select.select([wake_r, *watched], [], [], 5.0)
                    os.read(wake_r, 4096)
                except (BlockingIOError, InterruptedError):
                    pass
            _say(f"stopping ({self.stopping})")
            self.close_socket()
            for pid in list(self.children):
                try:
                    os.kill(pid, signal.SIGTERM)  # idle ones exit now, busy ones after their request
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + STOP_GRACE_S
            while self.children and time.monotonic() < deadline:
                self.reap()
                time.sleep(0.02)
            for pid in self.children:
                os.kill(pid, signal.SIGKILL)
            return 0
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(wake_r)
            os.close(wake_w)

    def close_socket(self) -> None:
        """Take the socket away (only ours: a newer planner's stays) and stop listening."""
        if self.listener is None:
            return
        try:
            st = os.stat(self.socket_path)
            if (st.st_dev, st.st_ino) == self.bound:
                os.unlink(self.socket_path)
        except OSError:
            pass
        self.listener.close()
        self.listener = None


def preload_names() -> list[str]:
    """Every module of the package that a container start may import (all but NOT_PRELOADED), and the stdlib
    modules they load lazily."""
    import pkgutil

    import oci_gpu_hook

    names = [m.name for m in pkgutil.walk_packages(oci_gpu_hook.__path__, "oci_gpu_hook.")
             if not m.name.startswith(NOT_PRELOADED)]
    return [*sorted(names), *PRELOAD_STDLIB]


def preload(config: Config | None) -> None:
    """Import everything a request may need, and pay the first-call costs (a scan of the configured sysfs)."""
    import importlib

    for name in preload_names():
        importlib.import_module(name)
    if config is not None:
        try:
            from oci_gpu_hook.inventory import scan

            scan(config.sysfs_root, strict=False)
        except (HookError, OSError):
            pass


def command(args: list[str], config: Config, launch: Launch) -> int:
    """``serve``'s command line; ``launch`` runs the launchers' entry points (which only the entry layer imports)."""
    from oci_gpu_hook.cliparse import parser as _parser

    parser = _parser("serve", "The resident planner: answer the native front's GPU requests over a Unix socket "
                              "(root's alone), so that a container asking for a GPU starts without a Python "
                              "start; where it is not running the front starts Python, with the same outcome.")
    parser.add_argument("--socket", metavar="PATH", default=os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET,
                        help=f"where to listen (default ${SOCKET_ENV}, else {DEFAULT_SOCKET}); its directory is "
                             "made root's alone, mode 0700")
    parser.add_argument("--workers", metavar="N", default=str(DEFAULT_WORKERS),
                        help="requests served at once, each by a process forked ahead (default %(default)s)")
    parser.add_argument("--verbose", action="store_true", help="one line for every request, not only the refused")
    opts = parser.parse_args(args)
    if not opts.workers.isdigit() or not 1 <= int(opts.workers) <= 256:
        raise HookError(f"--workers {opts.workers!r}: expected a number, 1 to 256 (default {DEFAULT_WORKERS})")
    if os.geteuid() != 0:
        raise HookError("serve runs as root: the fronts it answers are root's, and it enters their namespaces")
    own = credentials_of(0)
    why = "its /proc/self files cannot be read" if own is None else exec_problem(own)
    if why:
        raise HookError(f"serve cannot answer for the fronts: {why}")
    watch = PackageWatch()  # before the build is hashed: a change from here on is seen
    build = build_id()
    preload(config)
    version = version_line(build)
    if build_id() != build or watch.changed():
        raise HookError("the package changed while the planner was starting; start it again")
    planner = Planner(opts.socket, int(opts.workers), version, opts.verbose, own, watch, launch=launch)
    planner.bind()
    planner.prepare_warm_up(config)
    return planner.run()
