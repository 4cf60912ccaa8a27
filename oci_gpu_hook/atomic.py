"""Replacing a file atomically: the one way every part of the project writes files.

A file is made unnamed (``O_TMPFILE``) in the target's directory, written, given its owner, its exact mode
(whatever the umask) and its time through its descriptor, then given a name: ``linkat`` of
``/proc/self/fd/N`` (with ``AT_SYMLINK_FOLLOW``) straight to the target's name where nothing is there yet,
else to a temp name beside it (random, never reused) that ``rename`` then moves over the target.  Readers
see the old file or the new one, never a half-written one.  One writer whichever way the target is named:
by a path (:func:`write_atomic`, :func:`symlink_atomic`: the host's files, a bundle's config.json) or as a
name in a directory open as a file descriptor (:func:`write_at`, :func:`symlink_at`: files inside a
container's root, whose directory :mod:`oci_gpu_hook.appliers.mounts` resolved there without following a
symlink out of it).  By a directory fd every call is relative to that fd (the unnamed file is opened at
``.`` of it), nothing is resolved again by path, and the link and the rename make the name itself, a
symlink there included, never what it points to.  ``/proc/self/fd`` is resolved in the writer's own root,
never a container's: the host's procfs (the live hook's helper writes before ``pivot_root``, where ``/`` is
still the host's tree).

**What a writer killed at any instant (SIGKILL, the OOM killer) leaves.**  Until the link, nothing: the
file has no name, and the kernel frees it with the writer's last descriptor; the target is untouched.  A
new name appears whole in one ``linkat``.  One window remains where a name is replaced: between the
``linkat`` of the temp name and the ``rename`` (two consecutive system calls, the file complete by then, no
write between them) a killed writer leaves its temp file ``.NAME.oci-gpu-hook.PID.RANDOM``, whole, with its
final mode.  No system call closes it: ``linkat`` cannot replace an existing name, ``rename`` takes a
name, not a descriptor, and ``renameat2(RENAME_EXCHANGE)`` also needs the new file named.  Where the
filesystem makes no ``O_TMPFILE`` file (``EOPNOTSUPP``: overlayfs on kernels before its "ovl: implement
tmpfile" change, some FUSE and network filesystems; ``EISDIR`` before Linux 3.11; ``EINVAL``) or
``/proc/self/fd`` cannot link it (no procfs at ``/proc``: any error but ``EEXIST`` from the first link), the
file is written under a temp name directly (``O_EXCL|O_NOFOLLOW``) and renamed: there the window is the
whole write.  Symlinks are made whole in one ``symlink`` where nothing is there, else under a temp name
and renamed (the same two-call window).  A temp file left behind is removed by the next write of the same
target (:func:`remove_stale_temps`: its PID gone, or old; a temp-named symlink stays, since an image may
have planted it), or, where the caller knows the writer is gone (install's rollback, under its lock), by
:func:`remove_temps`.

``durable`` adds the fsyncs (file and directory) for files that must survive a crash (specs in /etc, the
install manifest); a runtime bundle does not outlive its host, so the start path skips them.  ``step``,
where given, is called just before each change on disk (the name made, by link, symlink or a named temp
file; the rename; the unlink): install counts its changes there and its crash tests kill a run at any one
of them.
"""

from __future__ import annotations

import errno
import os
import stat
import time

from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

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


def _check_name(path: str, what: str, dir_fd: int | None, shown: str) -> None:
    if dir_fd is not None and ("/" in path or path in ("", ".", "..")):
        raise HookError(f"cannot {what} {shown or path}: {path!r} is not a name in its directory")


def _replace(path: str, make: Callable[[str], None], what: str, durable: bool, step: Callable[[], None],
             dir_fd: int | None = None, shown: str = "", whole: bool = False) -> None:
    """Make the entry ``path`` (a name in ``dir_fd`` where given) with ``make`` (a step before each change):
    ``whole`` (``make`` makes an entry complete in one syscall: a link, a symlink) tries the name itself first,
    where nothing is there yet; otherwise, or where something is, a temp entry beside it, renamed over it.
    ``shown``: how an error names the target (``path``)."""
    _check_name(path, what, dir_fd, shown)
    directory, temp = _temp_name(path, dir_fd is not None)
    at = {} if dir_fd is None else {"src_dir_fd": dir_fd, "dst_dir_fd": dir_fd}
    step()
    try:
        if whole:
            try:
                make(path)
            except FileExistsError:
                pass
            else:
                if durable:
                    fsync_dir(directory, dir_fd)
                return
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
    _replace(path, lambda name: os.symlink(target, name), "make the symlink", True, step, whole=True)


def symlink_at(dir_fd: int, name: str, target: str, *, shown: str) -> None:
    """Make the entry ``name`` of the directory ``dir_fd`` a symlink to ``target``, replacing whatever is there in
    one rename (not durably: a container's root does not outlive its host).  ``shown``: the path in errors."""
    _replace(name, lambda entry: os.symlink(target, entry, dir_fd=dir_fd), "make the symlink", False, _no_step,
             dir_fd, shown, whole=True)


def write_at(dir_fd: int, name: str, data: str | bytes, mode: int, *, shown: str) -> None:
    """Replace the entry ``name`` of the directory ``dir_fd`` (any fd of it, ``O_PATH`` too) with a regular file of
    ``data`` and exactly ``mode``, not durably: every step relative to ``dir_fd``, the file made unnamed in that
    directory (or as a temp entry ``O_EXCL`` and ``O_NOFOLLOW``), the rename over ``name`` itself (a symlink there is
    replaced, never followed).  ``shown``: the path in errors ("cannot write SHOWN: why")."""
    _write(name, data, mode, None, None, False, _no_step, dir_fd, shown)


def write_atomic(path: str, data: str | bytes, mode: int | None = None, owner: tuple[int, int] | None = None,
                 mtime_ns: int | None = None, *, durable: bool = False, step: Callable[[], None] = _no_step) -> None:
    """Replace ``path`` with ``data``; ``mode`` None keeps the current file's mode (0644 for a new file)."""
    there = None  # not known: the unnamed file is linked as the name itself first, where nothing is there
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
            there = True  # a bundle's config.json: straight to the temp name (no linkat that fails EEXIST)
        except OSError:
            mode = 0o644
    _write(path, data, mode, owner, mtime_ns, durable, step, None, path, there)


def _fill(fd: int, data: bytes, chosen: int, owner: tuple[int, int] | None, mtime_ns: int | None,
          durable: bool) -> None:
    """The file's content, owner, exact mode and time, all set through its descriptor."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    if owner is not None and os.geteuid() == 0:
        os.fchown(fd, *owner)
    os.fchmod(fd, chosen)
    if mtime_ns is not None:
        os.utime(fd, ns=(mtime_ns, mtime_ns))
    if durable:
        os.fsync(fd)


def _unnamed(path: str, dir_fd: int | None) -> int:
    """An ``O_TMPFILE`` file in the directory of ``path`` (of ``dir_fd``: ``.`` relative to it, nothing resolved
    again), or -1 where that filesystem or kernel makes none (EOPNOTSUPP; EISDIR before Linux 3.11; EINVAL)."""
    directory = "." if dir_fd is not None else os.path.dirname(os.path.abspath(path))
    try:
        return os.open(directory, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except OSError as err:
        if err.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            return -1
        raise


def _write(path: str, data: str | bytes, chosen: int, owner: tuple[int, int] | None, mtime_ns: int | None,
           durable: bool, step: Callable[[], None], dir_fd: int | None, shown: str, there: bool | None = None) -> None:
    """The one writer: write_atomic's (by path) and write_at's (by a directory fd); ``there``: True where the target
    is known to exist."""
    _check_name(path, "write", dir_fd, shown)
    remove_stale_temps(path, dir_fd)
    content = data.encode() if isinstance(data, str) else data
    try:
        fd = _unnamed(path, dir_fd)
        if fd >= 0:
            try:
                _fill(fd, content, chosen, owner, mtime_ns, durable)
                if _link_in(fd, path, durable, step, dir_fd, there):
                    return
            finally:
                os.close(fd)
    except OSError as err:
        raise HookError(f"cannot write {shown or path}: {err.strerror}") from None

    def fill(temp: str) -> None:
        named = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                        dir_fd=dir_fd)
        try:
            _fill(named, content, chosen, owner, mtime_ns, durable)
        finally:
            os.close(named)

    _replace(path, fill, "write", durable, step, dir_fd, shown)


def _link_in(fd: int, path: str, durable: bool, step: Callable[[], None], dir_fd: int | None,
             there: bool | None) -> bool:
    """Give the complete unnamed file ``fd`` the name ``path``: linked as that name where nothing is there (not
    tried where ``there``), else linked as a temp name and renamed over it (a step before each change).  False
    where ``/proc/self/fd`` cannot link it (no procfs at /proc, another PID namespace's: the named writer then,
    which also says what is wrong where the directory refuses any new name)."""
    source = f"/proc/self/fd/{fd}"
    directory, temp = _temp_name(path, dir_fd is not None)
    # src_dir_fd is ignored for an absolute source; it makes CPython call linkat with AT_SYMLINK_FOLLOW (without a
    # dir fd it calls link(2), which follows no symlink: EXDEV on the magic link)
    step()
    if not there:
        try:
            os.link(source, path, src_dir_fd=fd, dst_dir_fd=dir_fd)
        except FileExistsError:
            pass  # something is there: a temp name, renamed over it
        except OSError:
            return False
        else:
            if durable:
                fsync_dir(directory, dir_fd)
            return True
    try:
        os.link(source, temp, src_dir_fd=fd, dst_dir_fd=dir_fd)
    except FileExistsError:
        raise
    except OSError:
        return False
    step()
    try:
        os.rename(temp, path, **({} if dir_fd is None else {"src_dir_fd": dir_fd, "dst_dir_fd": dir_fd}))
    except OSError:
        _discard(temp, dir_fd)
        raise
    if durable:
        fsync_dir(directory, dir_fd)
    return True


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
