"""Operator-facing output: one line on stderr for a failure, one JSON line per run in the log file.

A leaf: what a line holds is its caller's (:meth:`oci_gpu_hook.plan.Plan.record`); this module only writes it.
"""

from __future__ import annotations

import os
import stat
import sys
import time

from oci_gpu_hook import fastjson

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms per container start

if TYPE_CHECKING:
    from typing import Any

    from oci_gpu_hook.config import Config

PROGRAM = "oci-gpu-hook"


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


def warn(message: str, **about: Any) -> None:
    """The one warning line on stderr, ``oci-gpu-hook: warning: ...``, for something a container start went on
    past; ``about``: what it concerns (``entry``, the container ``id``), for the places a warning is kept."""
    print(f"{PROGRAM}: warning: " + " ".join(str(message).split()), file=sys.stderr)


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
