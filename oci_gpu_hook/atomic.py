"""Replacing a file atomically: the one way every part of the project writes files.

A temp file in the same directory (a random name, opened ``O_EXCL|O_NOFOLLOW``,
so a stale one from a killed writer or a planted symlink is never reused), the
exact mode whatever the umask, then ``rename`` over the target: readers see the
old file or the new one, never a half-written one.  A writer killed between
the two leaves its temp file behind; the next write of the same target removes
it (:func:`remove_stale_temps`).  ``durable`` adds the fsyncs
(file and directory) for files that must survive a crash (specs in /etc, the
install manifest); a runtime bundle does not outlive its host, so the start
path skips them.
"""

from __future__ import annotations

import os
import stat
import time

from oci_gpu_hook.errors import HookError


def fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
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


def _temp_name(path: str) -> tuple[str, str]:
    directory, name = os.path.split(os.path.abspath(path))
    return directory, os.path.join(directory, f".{name}{TEMP_TAG}{os.getpid()}.{os.urandom(4).hex()}")


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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # EPERM: someone else's live process
    return True


def remove_stale_temps(path: str) -> list[str]:
    """Remove the temp files that killed writers of ``path`` left behind: regular files (never a symlink,
    never followed) named exactly as :func:`_temp_name` names them, whose PID is gone (and which are
    older than a moment) or which are older than ``STALE_AFTER_S``.  Returns the names removed."""
    directory, name = os.path.split(os.path.abspath(path))
    removed: list[str] = []
    try:
        dirfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
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


def _discard(temp: str) -> None:
    try:
        os.unlink(temp)
    except OSError:
        pass


def symlink_atomic(path: str, target: str) -> None:
    """Make ``path`` a symlink to ``target``, replacing whatever is there in one rename."""
    directory, temp = _temp_name(path)
    try:
        os.symlink(target, temp)
        os.rename(temp, path)
    except OSError as err:
        _discard(temp)
        raise HookError(f"cannot make the symlink {path}: {err.strerror}") from None
    fsync_dir(directory)


def write_atomic(path: str, data: str | bytes, mode: int | None = None, owner: tuple[int, int] | None = None,
                 mtime_ns: int | None = None, *, durable: bool = False) -> None:
    """Replace ``path`` with ``data``; ``mode`` None keeps the current file's mode (0644 for a new file)."""
    remove_stale_temps(path)
    directory, temp = _temp_name(path)
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except OSError:
            mode = 0o644
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
            handle.flush()
            if owner is not None and os.geteuid() == 0:
                os.fchown(handle.fileno(), *owner)
            os.fchmod(handle.fileno(), mode)
            if mtime_ns is not None:
                os.utime(handle.fileno(), ns=(mtime_ns, mtime_ns))
            if durable:
                os.fsync(handle.fileno())
        os.rename(temp, path)
    except OSError as err:
        _discard(temp)
        raise HookError(f"cannot write {path}: {err.strerror}") from None
    if durable:
        fsync_dir(directory)
