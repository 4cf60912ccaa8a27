"""Operator-facing output: one line on stderr for a failure, one JSON line per run in the log file, and the
system journal's line for each refusal and each hand-over to a slower path.

A leaf: what a line holds is its caller's (:meth:`oci_gpu_hook.plan.Plan.record`); this module only writes it.

**The journal line** (:func:`to_syslog`) goes to the syslog socket :data:`SYSLOG_SOCKET` as one datagram, as
glibc's ``syslog()`` writes it: ``<PRI>Mmm dd hh:mm:ss oci-gpu-hook[PID]: MESSAGE``, facility daemon (the tool
runs for the container daemons), the local time, no host name (journald and rsyslog add it).  MESSAGE is
``ENTRY: container ID: TEXT`` (``ENTRY: TEXT`` where the input names no container), TEXT an error line without
its ``oci-gpu-hook:`` prefix, escaped and cut by :func:`syslog_text` (the one rule, which the C front's
``syslog_text`` follows byte for byte: tests/test_journal.py holds the two to one corpus).  It is sent
non-blocking on a fresh socket: a missing socket, a full one, anything else at that path is silently no line;
the container never waits for nor fails by it.  ``syslog = false`` in the config turns it off; with no config
(it could not be read) it is on.  ``journalctl -t oci-gpu-hook`` shows the lines.
"""

from __future__ import annotations

import os
import stat
import sys
import time

from oci_gpu_hook import fastjson

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from typing import Any

    from oci_gpu_hook.config import Config

PROGRAM = "oci-gpu-hook"
SYSLOG_SOCKET = "/dev/log"
SYSLOG_FACILITY = 3  # LOG_DAEMON
SEVERITY = {"error": 3, "warning": 4, "info": 6}  # LOG_ERR, LOG_WARNING, LOG_INFO
SYSLOG_MAX = 4096  # bytes of MESSAGE; a longer one is cut (journald takes more, a classic syslogd 1024 or more)
CONTAINER_MAX = 128  # bytes of the container's id or name in MESSAGE
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def error_line(message: str) -> str:
    """Collapse a message to the single line operators see."""
    return f"{PROGRAM}: error: " + " ".join(str(message).split())


class _Refused(Exception):
    pass


def open_log(path: str) -> int:
    """An fd to append to ``path``: every directory opened from ``/`` by fd with ``O_NOFOLLOW`` (no symlink
    anywhere), each trusted (:mod:`oci_gpu_hook.trust`); the file opened ``O_NONBLOCK`` (a FIFO never
    blocks) and only when it is a regular file, trusted, with one link.  _Refused or OSError otherwise."""
    from oci_gpu_hook.trust import entry_problem, trusted_owners

    if not path.startswith("/"):
        raise _Refused("not an absolute path")
    owners = trusted_owners()
    parts = [p for p in path.split("/") if p and p != "."]
    if not parts or ".." in parts:
        raise _Refused("not a plain absolute file path")
    dirfd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        where = ""
        for name in [*parts[:-1], None]:
            bad = entry_problem(where or "/", os.fstat(dirfd), owners)
            if bad:
                raise _Refused(bad)
            if name is None:
                break
            where += "/" + name
            try:
                fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
            except OSError as err:
                if os.path.islink(where):
                    raise _Refused(f"{where} is a symlink") from None
                raise _Refused(f"{where}: {err.strerror}") from None
            os.close(dirfd)
            dirfd = fd
        try:
            st = os.stat(parts[-1], dir_fd=dirfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise _Refused("it is a symlink" if stat.S_ISLNK(st.st_mode) else "it is not a regular file")
        fd = os.open(parts[-1], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                     | os.O_CLOEXEC, 0o640, dir_fd=dirfd)
    finally:
        os.close(dirfd)
    st = os.fstat(fd)
    bad = (None if stat.S_ISREG(st.st_mode) else "it is not a regular file") or entry_problem(path, st, owners) or (
        f"it has {st.st_nlink} hard links" if st.st_nlink > 1 else None)
    if bad:
        os.close(fd)
        raise _Refused(bad)
    return fd


def record(config: Config | None, **fields: Any) -> None:
    """Append one structured line to ``config.log_file``; never fail nor block the container for it (one
    warning line on stderr instead)."""
    path = config.log_file if config else ""
    if not path:
        return
    line = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **fields}
    try:
        fd = open_log(path)
        try:
            os.write(fd, (fastjson.dumps(line) + "\n").encode())
        finally:
            os.close(fd)
    except _Refused as err:
        print(f"{PROGRAM}: warning: log file {path} not written: {err}", file=sys.stderr)
    except OSError as err:
        print(f"{PROGRAM}: warning: cannot write log file {path}: {err.strerror}", file=sys.stderr)


def syslog_text(message: str) -> bytes:
    """MESSAGE as the journal's line carries it: the reference of the one rule, which the C front's ``syslog_text``
    (oci_gpu_hook/fastpath/front.c) follows byte for byte.  Over the message's bytes (UTF-8; a byte that
    ``surrogateescape`` stands for is that byte):

    - printable ASCII (``0x20``-``0x7e``, the space too) is kept, and so is every well-formed UTF-8 sequence of a
      character from U+00A0 up;
    - every other byte is written ``\\xNN`` (two lower-case hex digits): the controls (a newline, a tab, ESC),
      DEL, the UTF-8 of a C1 control (U+0080-U+009F), and each byte of a sequence that is not well-formed UTF-8
      (truncated, overlong, a surrogate, past U+10FFFF), so that no byte of a hostile text reaches a terminal
      or a log parser as itself, and nothing is folded: two spaces stay two;
    - at most :data:`SYSLOG_MAX` bytes are kept, whole pieces only (a character or an escape is never split),
      then ``...``."""
    try:
        raw = message.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that stands for no byte (JSON's "\\ud800"): its bytes, escaped
        raw = b"".join(c.encode("utf-8", "surrogateescape" if "\udc80" <= c <= "\udcff" else "surrogatepass")
                       for c in message[:SYSLOG_MAX + 4])
    out, size = [], 0
    for char in raw[:SYSLOG_MAX + 4].decode("utf-8", "surrogateescape"):  # more than that is cut anyway
        if " " <= char <= "~" or (char >= "\xa0" and not "\udc80" <= char <= "\udcff"):
            piece = char.encode()
        else:
            piece = "".join(f"\\x{b:02x}" for b in char.encode("utf-8", "surrogateescape")).encode()
        if size + len(piece) > SYSLOG_MAX:
            return b"".join(out) + b"..."
        out.append(piece)
        size += len(piece)
    return b"".join(out)


def syslog_line(severity: str, message: str, now: float | None = None, pid: int | None = None) -> bytes:
    """The datagram for ``message`` at ``severity`` (a key of :data:`SEVERITY`), as glibc's syslog() frames it."""
    t = time.localtime(now)
    head = (f"<{SYSLOG_FACILITY * 8 + SEVERITY[severity]}>{_MONTHS[t.tm_mon - 1]} {t.tm_mday:2d} "
            f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} {PROGRAM}[{os.getpid() if pid is None else pid}]: ")
    return head.encode() + syslog_text(message)


def syslog_message(entry: str, text: str, container: str | None = None) -> str:
    """MESSAGE before :func:`syslog_text`: ``ENTRY: container ID: TEXT``, the id cut to its first
    :data:`CONTAINER_MAX` bytes (as the C front keeps it), ``ENTRY: TEXT`` without one."""
    if text.startswith(PROGRAM + ": "):
        text = text[len(PROGRAM) + 2:]
    if not container:
        return f"{entry}: {text}"
    try:
        cut = container.encode("utf-8", "surrogateescape")[:CONTAINER_MAX].decode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        cut = container[:CONTAINER_MAX]
    return f"{entry}: container {cut}: {text}"


def to_syslog(config: Config | None, severity: str, entry: str, text: str, container: str | None = None) -> None:
    """Send the journal's line (see the top) unless ``config.syslog`` is off; never block, never fail."""
    if config is not None and not config.syslog:
        return
    try:
        import _socket  # not socket: that one imports enum, selectors, ... (~5 ms); this is the C module alone

        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM | _socket.SOCK_NONBLOCK | _socket.SOCK_CLOEXEC)
        try:
            sock.sendto(syslog_line(severity, syslog_message(entry, text, container)), SYSLOG_SOCKET)
        finally:
            sock.close()
    except (OSError, ImportError):
        pass  # no journal, a full one, no socket at the path: the line is dropped


def refused(config: Config | None, entry: str, container: str | None, line: str) -> None:
    """A container refused with the error line ``line`` (already on stderr): the log file's record and the
    journal's line, both naming ``container`` (its id, or what the input names it by) where known."""
    record(config, entry=entry, id=container, outcome="error", error=line)
    to_syslog(config, "error", entry, line, container)


def warn(message: str, **about: Any) -> None:
    """The one warning line on stderr, ``oci-gpu-hook: warning: ...``, for something a container start went on
    past, and the journal's line at warning level; ``about``: what it concerns (``entry``, the container ``id``),
    for the places a warning is kept (the journal's line names both; ``config``: the config in use, whose
    ``syslog`` decides, when there is one)."""
    line = " ".join(str(message).split())
    print(f"{PROGRAM}: warning: " + line, file=sys.stderr)
    to_syslog(about.get("config"), "warning", str(about.get("entry") or PROGRAM), "warning: " + line, about.get("id"))


def report_failure(err: BaseException, debug: bool) -> str:
    """Print the one stderr line for ``err`` (a traceback too when debugging); return the line."""
    from oci_gpu_hook.errors import HookError

    if isinstance(err, HookError):
        message = str(err)
    else:
        message = (f"internal error: {type(err).__name__}: {err} "
                   "(set OCI_GPU_HOOK_DEBUG=1 or pass --debug for a traceback)")
    if debug:
        import traceback

        traceback.print_exception(err, file=sys.stderr)
    line = error_line(message)
    print(line, file=sys.stderr)
    return line


def debug_from_env() -> bool:
    return os.environ.get("OCI_GPU_HOOK_DEBUG", "").lower() in ("1", "true", "yes", "on")
