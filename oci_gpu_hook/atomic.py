"""Replacing a file atomically: the one way every part of the project writes files.

A temp file in the same directory (a random name, opened ``O_EXCL|O_NOFOLLOW``,
so a stale one from a killed writer or a planted symlink is never reused), the
exact mode whatever the umask, then ``rename`` over the target: readers see the
old file or the new one, never a half-written one.  ``durable`` adds the fsyncs
(file and directory) for files that must survive a crash (specs in /etc, the
install manifest); a runtime bundle does not outlive its host, so the start
path skips them.
"""

from __future__ import annotations

import os

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


def _temp_name(path: str) -> tuple[str, str]:
    directory, name = os.path.split(os.path.abspath(path))
    return directory, os.path.join(directory, f".{name}.oci-gpu-hook.{os.getpid()}.{os.urandom(4).hex()}")


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
