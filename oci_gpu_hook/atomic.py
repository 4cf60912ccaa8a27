"""Replacing a file atomically: the one way every part of the project writes files.

A temp file in the same directory (a random name, opened ``O_EXCL|O_NOFOLLOW``,
so a stale one from a killed writer or a planted symlink is never reused), the
exact mode whatever the umask, then ``rename`` over the target: readers see the
old file or the new one, never a half-written one.  One writer whichever way
the target is named: by a path (:func:`write_atomic`, :func:`symlink_atomic`:
the host's files, a bundle's config.json) or as a name in a directory open as
a file descriptor (:func:`write_at`, :func:`symlink_at`: files inside a
container's root, whose directory :mod:`oci_gpu_hook.appliers.mounts` resolved
there without following a symlink out of it).  By a directory fd every call is
relative to that fd, nothing is resolved again by path, and the rename
replaces the name itself, a symlink there included, never what it points to.
A writer killed between the two leaves its temp file behind; the next write of the same target removes
it (:func:`remove_stale_temps`), or, where the caller knows the writer is gone
(install's rollback, under its lock), :func:`remove_temps`.  ``durable`` adds
the fsyncs (file and directory) for files that must survive a crash (specs in
/etc, the install manifest); a runtime bundle does not outlive its host, so the
start path skips them.  ``step``, where given, is called just before each
change on disk (the temp file made, the rename, the unlink): install counts its
changes there and its crash tests kill a run at any one of them.
"""

from __future__ import annotations

import os
import stat
import time

from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms per container start

if TYPE_CHECKING:
    from collections.abc import Callable


def fsync_dir(directory: str, dir_fd: int | None = None) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


TEMP_TAG = ".oci-gpu-hook."
STALE_AFTER_S = 600  # a temp file this old is stale even when its PID is alive again (reused)
GRACE_S = 2  # younger than this, a temp file may be another PID namespace's write in progress


def _temp_name(path: str, in_dir_fd: bool = False) -> tuple[str, str]:
    """(the directory, the temp entry beside ``path``); for a name in a directory fd: (".", a name in it)."""
    directory, name = (".", path) if in_dir_fd else os.path.split(os.path.abspath(path))
    temp = f".{name}{TEMP_TAG}{os.getpid()}.{os.urandom(4).hex()}"
    return directory, temp if in_dir_fd else os.path.join(directory, temp)


def _temp_pid(entry: str, name: str) -> int | None:
    """The writer's PID when ``entry`` is exactly ``.NAME.oci-gpu-hook.PID.RANDOM`` (RANDOM: 8 hex digits)."""
    prefix = f".{name}{TEMP_TAG}"
    if not entry.startswith(prefix):
        return None
    pid, dot, random = entry[len(prefix):].partition(".")
    if not (dot and pid.isascii() and pid.isdigit() and len(random) == 8
            and all(c in "0123456789abcdef" for c in random)):
        return None
    return int(pid)


def is_temp(entry: str) -> bool:
    """Whether the directory entry ``entry`` is a temp file of this module's writers (of any target)."""
    name, tag, _rest = entry.rpartition(TEMP_TAG)
    return bool(tag) and name.startswith(".") and _temp_pid(entry, name[1:]) is not None


def remove_temps(directory: str, name: str | None = None) -> None:
    """Remove the temp files in ``directory`` (of the target ``name``, or of any) whatever their age: for a
    caller that knows their writers are gone (it holds the lock they held)."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in entries:
        if _temp_pid(entry, name) is not None if name is not None else is_temp(entry):
            _discard(os.path.join(directory, entry))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # EPERM: someone else's live process
    return True


def remove_stale_temps(path: str, dir_fd: int | None = None) -> list[str]:
    """Remove the temp files that killed writers of ``path`` (a name in ``dir_fd`` where given) left behind:
    regular files (never a symlink, never followed) named exactly as :func:`_temp_name` names them, whose PID
    is gone (and which are older than a moment) or which are older than ``STALE_AFTER_S``.  Returns the names
    removed."""
    directory, name = os.path.split(os.path.abspath(path)) if dir_fd is None else (".", path)
    removed: list[str] = []
    try:
        dirfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return removed
    try:
        now = time.time()
        for entry in os.listdir(dirfd):
            pid = _temp_pid(entry, name)
            if pid is None:
                continue
            try:
                st = os.stat(entry, dir_fd=dirfd, follow_symlinks=False)
            except OSError:
                continue
            age = now - st.st_mtime
            if not stat.S_ISREG(st.st_mode) or pid == os.getpid():
                continue
            if age > STALE_AFTER_S or (age > GRACE_S and not _alive(pid)):
                try:
                    os.unlink(entry, dir_fd=dirfd)
                    removed.append(entry)
                except OSError:
                    pass
    except OSError:
        pass
    finally:
        os.close(dirfd)
    return removed


def _discard(temp: str, dir_fd: int | None = None) -> None:
    try:
        os.unlink(temp, dir_fd=dir_fd)
    except OSError:
        pass


def _no_step() -> None:
    pass


def _replace(path: str, make: Callable[[str], None], what: str, durable: bool, step: Callable[[], None],
             dir_fd: int | None = None, shown: str = "") -> None:
    """Make a temp entry next to ``path`` (a name in ``dir_fd`` where given) with ``make``, then rename it over
    ``path`` (a step before each); ``shown``: how an error names the target (``path``)."""
    if dir_fd is not None and ("/" in path or path in ("", ".", "..")):
        raise HookError(f"cannot {what} {shown or path}: {path!r} is not a name in its directory")
    directory, temp = _temp_name(path, dir_fd is not None)
    at = {} if dir_fd is None else {"src_dir_fd": dir_fd, "dst_dir_fd": dir_fd}
    step()
    try:
        make(temp)
        step()
        os.rename(temp, path, **at)
    except OSError as err:
        _discard(temp, dir_fd)
        raise HookError(f"cannot {what} {shown or path}: {err.strerror}") from None
    if durable:
        fsync_dir(directory, dir_fd)


def symlink_atomic(path: str, target: str, *, step: Callable[[], None] = _no_step) -> None:
    """Make ``path`` a symlink to ``target``, replacing whatever is there in one rename (durably)."""
    _replace(path, lambda temp: os.symlink(target, temp), "make the symlink", True, step)


def symlink_at(dir_fd: int, name: str, target: str, *, shown: str) -> None:
    """Make the entry ``name`` of the directory ``dir_fd`` a symlink to ``target``, replacing whatever is there in
    one rename (not durably: a container's root does not outlive its host).  ``shown``: the path in errors."""
    _replace(name, lambda temp: os.symlink(target, temp, dir_fd=dir_fd), "make the symlink", False, _no_step,
             dir_fd, shown)


def write_at(dir_fd: int, name: str, data: str | bytes, mode: int, *, shown: str) -> None:
    """Replace the entry ``name`` of the directory ``dir_fd`` (any fd of it, ``O_PATH`` too) with a regular file of
    ``data`` and exactly ``mode``, not durably: every step relative to ``dir_fd``, the temp file ``O_EXCL`` and
    ``O_NOFOLLOW``, the rename over ``name`` itself (a symlink there is replaced, never followed).  ``shown``: the
    path in errors ("cannot write SHOWN: why")."""
    _write(name, data, mode, None, None, False, _no_step, dir_fd, shown)


def write_atomic(path: str, data: str | bytes, mode: int | None = None, owner: tuple[int, int] | None = None,
                 mtime_ns: int | None = None, *, durable: bool = False, step: Callable[[], None] = _no_step) -> None:
    """Replace ``path`` with ``data``; ``mode`` None keeps the current file's mode (0644 for a new file)."""
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except OSError:
            mode = 0o644
    _write(path, data, mode, owner, mtime_ns, durable, step, None, path)


def _write(path: str, data: str | bytes, chosen: int, owner: tuple[int, int] | None, mtime_ns: int | None,
           durable: bool, step: Callable[[], None], dir_fd: int | None, shown: str) -> None:
    """The one writer: write_atomic's (by path) and write_at's (by a directory fd)."""
    remove_stale_temps(path, dir_fd)

    def fill(temp: str) -> None:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
            handle.flush()
            if owner is not None and os.geteuid() == 0:
                os.fchown(handle.fileno(), *owner)
            os.fchmod(handle.fileno(), chosen)
            if mtime_ns is not None:
                os.utime(handle.fileno(), ns=(mtime_ns, mtime_ns))
            if durable:
                os.fsync(handle.fileno())

    _replace(path, fill, "write", durable, step, dir_fd, shown)


def remove_file(path: str, *, step: Callable[[], None] = _no_step) -> None:
    """Unlink ``path`` durably (nothing there is no error)."""
    step()
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as err:
        raise HookError(f"cannot remove {path}: {err.strerror}") from None
    fsync_dir(os.path.dirname(path))
