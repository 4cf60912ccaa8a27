"""Which paths root may believe: nobody but root (or the invoking user) can have put anything on the way.

The rule of OpenSSH's ``StrictModes`` and sudo's secure-path checks, applied to the
config file (whose ``runtime`` the shim execs as root), the log file and CDI
output directories.  Every component from ``/`` down, and every symlink met on
the way (its target is walked in turn), must be owned by root or the effective
uid, and must not be writable by group or others.  One exception: a directory
with the sticky bit (``/tmp``) may be world-writable, because there nobody can
rename or remove an entry they do not own, and the entries below it must pass
the owner rule themselves.  ``/dev/null`` reads as empty whoever writes to it,
so it is trusted as the usual "no config" file.

On the per-container path: imports nothing but :mod:`os` and :mod:`stat`
(which :mod:`os` has already loaded).
"""

from __future__ import annotations

import os
import stat

MAX_SYMLINKS = 40  # as the kernel's path walk (ELOOP)
_DEV_NULL = (1, 3)


def trusted_owners() -> tuple[int, ...]:
    euid = os.geteuid()
    return (0,) if euid == 0 else (0, euid)


def _whom(owners: tuple[int, ...]) -> str:
    return "root" if owners == (0,) else f"root or uid {owners[1]}"


def entry_problem(path: str, st: os.stat_result, owners: tuple[int, ...]) -> str | None:
    """Why one entry (lstat'ed or fstat'ed) cannot be trusted, or None."""
    if st.st_uid not in owners:
        return f"{path} is owned by uid {st.st_uid}, not by {_whom(owners)}"
    mode = st.st_mode
    if not mode & 0o022 or stat.S_ISLNK(mode):  # a symlink's own mode means nothing
        return None
    if stat.S_ISDIR(mode) and mode & stat.S_ISVTX:
        return None
    if stat.S_ISCHR(mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == _DEV_NULL:
        return None
    who = "group and others" if mode & 0o022 == 0o022 else "group" if mode & 0o020 else "others"
    return f"{path} is writable by {who} (mode {stat.S_IMODE(mode):04o})"


def problem(path: str) -> str | None:
    """Why ``path`` cannot be trusted, or None.  Walks ``/`` down with lstat, following each symlink by
    hand; a missing component ends the walk (whoever opens the path next reports it)."""
    owners = trusted_owners()
    if not path.startswith("/"):
        path = os.path.join(os.getcwd(), path)
    todo = [p for p in reversed(path.split("/")) if p and p != "."]
    current = "/"
    try:
        st = os.lstat("/")
    except OSError as err:
        return f"cannot check /: {err.strerror}"
    bad = entry_problem("/", st, owners)
    links = 0
    while todo and bad is None:
        name = todo.pop()
        if name == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, name)
        try:
            st = os.lstat(candidate)
        except FileNotFoundError:
            return None
        except OSError as err:
            return f"cannot check {candidate}: {err.strerror}"
        bad = entry_problem(candidate, st, owners)
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_SYMLINKS:
                return f"{path}: too many levels of symbolic links"
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = "/"
            todo.extend(p for p in reversed(target.split("/")) if p and p != ".")
        elif todo and not stat.S_ISDIR(st.st_mode):
            return None  # opening it fails with ENOTDIR, and says so
        else:
            current = candidate
    return bad


def read_regular(path: str) -> bytes:
    """The bytes of the file at ``path``; a FIFO, socket or device is refused unopened (its open could block or
    act), and again on the fd (replaced in between: the open was non-blocking, so it never hung): an OSError whose
    ``strerror`` is "it is not a regular file".  A directory is the OSError its read gives ("Is a directory")."""
    def special(mode: int) -> bool:
        return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode)

    if special(os.stat(path).st_mode):
        raise OSError(0, NOT_REGULAR, path)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        if special(os.fstat(fd).st_mode):
            raise OSError(0, NOT_REGULAR, path)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


NOT_REGULAR = "it is not a regular file"
