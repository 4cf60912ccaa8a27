"""Replacing a file atomically: the one way every part of the project writes files.

A temp file in the same directory (a random name, opened ``O_EXCL|O_NOFOLLOW``,
so a stale one from a killed writer or a planted symlink is never reused), the
exact mode whatever the umask, then ``rename`` over the target: readers see the
old file or the new one, never a half-written one.  A writer killed between
the two leaves its temp file behind; the next write of the same target removes
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


def _no_step() -> None:
    pass


def _replace(path: str, make: Callable[[str], None], what: str, durable: bool, step: Callable[[], None]) -> None:
    """Make a temp entry next to ``path`` with ``make``, then rename it over ``path`` (a step before each)."""
    directory, temp = _temp_name(path)
    step()
    try:
        make(temp)
        step()
        os.rename(temp, path)
    except OSError as err:
        _discard(temp)
        raise HookError(f"cannot {what} {path}: {err.strerror}") from None
    if durable:
        fsync_dir(directory)


def symlink_atomic(path: str, target: str, *, step: Callable[[], None] = _no_step) -> None:
    """Make ``path`` a symlink to ``target``, replacing whatever is there in one rename (durably)."""
    _replace(path, lambda temp: os.symlink(target, temp), "make the symlink", True, step)


def write_atomic(path: str, data: str | bytes, mode: int | None = None, owner: tuple[int, int] | None = None,
                 mtime_ns: int | None = None, *, durable: bool = False, step: Callable[[], None] = _no_step) -> None:
    """Replace ``path`` with ``data``; ``mode`` None keeps the current file's mode (0644 for a new file)."""
    remove_stale_temps(path)
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except OSError:
            mode = 0o644
    chosen = mode

    def fill(temp: str) -> None:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
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

    _replace(path, fill, "write", durable, step)


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
