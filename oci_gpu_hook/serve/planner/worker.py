"""A worker's request: checked against the front's credentials, run as the launcher process the front would have
started (its namespaces, root, working directory, environment, stdio), answered once (:func:`serve_one`).  The
package's docstring (:mod:`oci_gpu_hook.serve.planner`) says why each step is as it is."""

from __future__ import annotations

import os
import struct
import sys

from oci_gpu_hook.errors import HookError
from oci_gpu_hook.serve.planner.protocol import (
    ANSWER_TIMEOUT_MS,
    GO,
    READY,
    REQUEST_TIMEOUT_S,
    ROLES,
    STARTED,
    BadRequest,
    GaveUp,
    NoRequest,
    Request,
    _close_all,
    _recv_exact,
    _within,
    encode_answer,
    read_request,
)

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    import socket as socket_module
    from collections.abc import Callable, Sequence
    from typing import Any

    from oci_gpu_hook.serve.planner.build import PackageWatch

    # a launcher's entry point, which the entry layer passes in (``serve``'s command): (role, argv, the runtime baked
    # into the shim's launcher) -> (exit status, the runtime to exec or None)
    Launch = Callable[[str, list[str], str], tuple[int, str | None]]
    # what a worker tells the metrics (oci_gpu_hook.cluster.metrics): (path, outcome, reason, seconds from accept to
    # answer or None where it did not answer), before it answers
    Report = Callable[[str, str, str, float | None], None]

SO_PEERPIDFD = 77  # Linux 6.5: a pidfd of the process that connected, which no pid reuse can redirect
PR_GET_SECUREBITS = 27
COERCION_TARGETS = ("C.UTF-8", "C.utf8", "UTF-8")  # CPython's _TARGET_LOCALES (PEP 538)


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


# --- becoming the launcher ----------------------------------------------------------------------------------


def _same_file(fd: int, path: str) -> bool:
    a, b = os.fstat(fd), os.stat(path)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def enter(request: Request) -> None:
    """Take the front's namespaces, root, working directory and umask: every path then means what it means to
    the front.  BadRequest where that cannot be (another user namespace; a live hook from other pid or cgroup
    namespaces, whose pids and cgroup paths would read differently here)."""
    mnt, pid, cgroup, user, root, cwd = request.fds
    if not _same_file(user, "/proc/self/ns/user"):
        raise BadRequest("the front is in another user namespace")
    if request.live and not (_same_file(pid, "/proc/self/ns/pid") and _same_file(cgroup, "/proc/self/ns/cgroup")):
        raise BadRequest("a live hook from another pid or cgroup namespace")
    if not _same_file(mnt, "/proc/self/ns/mnt"):
        from oci_gpu_hook.appliers.rootfs import enter_mount_namespace  # loaded before the fork (preload)

        enter_mount_namespace(mnt)
    if not _same_file(root, "/"):
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
    from oci_gpu_hook import CREATE_RUNTIME_HOOKS, LIVE_COMMANDS, PRECREATE

    if request.role == "oci-gpu-hook":
        command = os.fsdecode(request.args[0]) if request.args else ""
        # the state hooks alone; the createRuntime hooks (links, ldcache) with their arguments
        if not ((len(request.args) == 1 and command in (PRECREATE, *LIVE_COMMANDS)) or command in CREATE_RUNTIME_HOOKS):
            raise BadRequest("not a hook command the front sends")
    set_environ(request.env)
    errors, coerced = python_stdio()
    if coerced:
        os.environ["LC_CTYPE"] = coerced
    return errors, coerced


class Seen:
    """What an entry point did, as the worker running it sees it (for the metrics, :func:`run_entry` with ``seen``):
    the error its one line reported (``log.report_failure``, which every refusal goes through), and whether a plan
    it recorded (``Plan.record``, which every start that got this far goes through) granted GPUs or ignored a
    request.  The worker wraps those two functions while the entry point runs: the launcher's code is the same
    code, and costs nothing more where no planner with metrics runs it."""

    __slots__ = ("error", "granted", "ignored")

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.granted = self.ignored = False

    def outcome(self, code: int) -> tuple[str, str]:
        """(outcome, reason) in the metrics' closed sets."""
        if code != 0 or self.error is not None:
            from oci_gpu_hook.cluster.metrics import refusal_reason

            return "refused", refusal_reason(self.error)
        return ("granted", "") if self.granted else ("ignored", "") if self.ignored else ("untouched", "")

    def watch(self) -> Callable[[], None]:
        """Wrap the two functions; what puts them back."""
        from oci_gpu_hook import log, plan

        report_failure, record = log.report_failure, plan.Plan.record

        def reported(err: BaseException, debug: bool) -> str:
            self.error = err
            return report_failure(err, debug)

        def recorded(made: plan.Plan, *args: Any, **kwargs: Any) -> None:
            self.granted = self.granted or bool(made)
            self.ignored = self.ignored or bool(made.request.note)
            record(made, *args, **kwargs)

        log.report_failure = reported
        plan.Plan.record = recorded  # type: ignore[method-assign]

        def restore() -> None:
            log.report_failure = report_failure
            plan.Plan.record = record  # type: ignore[method-assign]

        return restore


def request_path(request: Request) -> str:
    """How ``request`` reached the planner, as the metrics' ``path`` label says it."""
    if request.role == "oci-gpu-runtime":
        return "shim"
    if request.role == "oci-gpu-hook" and len(request.args) == 1:
        from oci_gpu_hook import LIVE_COMMANDS, PRECREATE

        command = os.fsdecode(request.args[0])
        if command in (PRECREATE, *LIVE_COMMANDS):
            return command  # each one of metrics.PATHS
    return "unknown"


def run_entry(request: Request, prepared: tuple[str, str], launch: Launch,
              seen: Seen | None = None) -> tuple[int, bytes, bytes, bytes, bytes]:
    """Run the launcher's entry point (``launch``) as the launcher process would: (exit status, runtime to exec,
    LC_CTYPE entry for it, stdout, stderr); what it did into ``seen`` (None: not watched)."""
    import io

    errors, coerced = prepared
    real_ppid = os.getppid
    os.getppid = lambda: request.ppid  # live.check_container: the runtime that ran the hook is the front's parent
    restore = seen.watch() if seen is not None else None
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
        if restore is not None:
            restore()
    sys.stdout.flush()
    sys.stderr.flush()
    setenv = f"LC_CTYPE={coerced}".encode() if coerced and runtime else b""
    return code & 0xFF, os.fsencode(runtime or ""), setenv, out.getvalue(), err.getvalue()


def peer_uid(conn: socket_module.socket) -> int:
    import socket

    _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return int(uid)


def serve_one(conn: socket_module.socket, version: str, own: Credentials | None = None, own_securebits: int = 0,
              watch: PackageWatch | None = None, *, launch: Launch, report: Report | None = None) -> str:
    """Read, check, run and answer one request on ``conn`` (see the protocol above); what happened, in a word (for
    the planner's log).  ``own``: the planner's credentials, which the front's must match; ``watch``: the
    package's files, which must not have changed since the planner started; ``launch``: the entry points;
    ``report``: told each request's path, outcome and reason (the metrics' closed sets) before its answer."""
    import time

    accepted = time.monotonic()
    deadline = accepted + ANSWER_TIMEOUT_MS / 1000  # the front's bound, which began before our accept

    def tell(path: str, outcome: str, reason: str = "", answered: bool = True) -> None:
        if report is not None:
            report(path, outcome, reason, time.monotonic() - accepted if answered else None)

    if peer_uid(conn) != 0:
        tell("unknown", "handed-back", "not-root", answered=False)
        return "refused a peer that is not root"
    peer = peer_credentials(conn) if own is not None else None  # at accept, before the peer can do more
    try:
        request = read_request(conn, deadline)
    except NoRequest:
        return "ok: no request"
    except (BadRequest, OSError, UnicodeDecodeError) as err:
        tell("unknown", "handed-back", "malformed", answered=False)
        _answer(conn, encode_answer(version, "refused"))
        return f"bad request: {err}"
    path = request_path(request) if report is not None else "unknown"
    started = False
    stage = "version"  # the check under way: a hand-back's reason
    seen = Seen() if report is not None else None
    try:
        if request.version != version:
            raise BadRequest(f"a front of another version ({request.version[:80]})")
        stage = "stale"
        if watch is not None and watch.changed():
            raise BadRequest("stale: the package's files changed since the planner started")
        stage = "credentials"
        if own is not None:
            if isinstance(peer, str):
                raise BadRequest(peer)
            assert peer is not None
            why = credentials_problem(peer, own, request.securebits, own_securebits)
            if why:
                raise BadRequest(f"credentials: {why}")
        stage = "namespace"
        enter(request)
        stage = "environment"
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
        code, runtime, setenv, out, err = run_entry(request, prepared, launch, seen)
    except GaveUp as gone:
        tell(path, "handed-back", "gave-up", answered=False)
        return f"the front gave up before go ({gone}): nothing done"
    except (BadRequest, OSError, UnicodeDecodeError, HookError) as bad:
        if started:
            tell(path, "refused", "planner")
        else:
            tell(path, "handed-back", stage, answered=False)
        _answer(conn, encode_answer(version, "refused"))
        return f"{'failed after go' if started else 'refused'}: {bad}"
    finally:
        _close_all(request.fds)
    if seen is not None:
        tell(path, *seen.outcome(code))
    _answer(conn, encode_answer(version, "ok", code, runtime, setenv, out, err))
    return f"ok {code}"


def _answer(conn: socket_module.socket, data: bytes) -> None:
    try:
        conn.sendall(data)
    except OSError:
        pass  # the front gave up: it falls back
