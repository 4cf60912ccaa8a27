"""The one walk inside a container's root: every path below a rootfs that the package opens, resolves or makes.

A container's rootfs is the image's, and the image is hostile: its symlinks, its ``..`` and the procfs
mounted in it must never take a write of ours (run as root) out of it.  One function walks it,
:func:`open_dir`, in one of two modes, and this docstring is the rule for both:

``FOLLOW``: resolved as runc resolves a mount destination (its filepath-securejoin), so that the live hook
    takes every image as the shim and the CDI path (where runc mounts) take it.  Used for a driver's files
    (:mod:`oci_gpu_hook.appliers.mounts`: bind mounts, soname links, the ld cache) and to find them in a driver
    container's root (:func:`real_path`, for :mod:`oci_gpu_hook.inventory.nvdriver`).

    * a symlink is followed by its text: an absolute one from the root, a relative one from the directory it
      sits in; never through the kernel, so its text can only name something inside the root;
    * ``..`` goes up the path walked so far (the directory we came from) and stops at the root;
    * a procfs "magic link" (``/proc/PID/root``, ``/proc/self/fd/N``, ``/proc/PID/cwd``) met in a procfs
      mounted under the root is a symlink like any other: followed by the text ``readlink`` gives, inside the
      root, never jumped to what it names.  runc follows them so (an image's ``/lib -> /proc/1/root/usr/lib``
      starts under runc, and tests/containers/test_nvidia_hostile_images.py holds every applier to that);
      refusing them would make the live hook refuse images the shim starts;
    * at most ``MAX_LINKS`` (255, securejoin's) symlinks in one path, then ELOOP;
    * a mount point met on the way (a volume, a tmpfs, a procfs) is entered: it is the container's own view;
      ``..`` from its top goes back to the directory walked before it, never into the tree it was bound from;
    * a component that is no directory (a file, a fifo, a device) is ENOTDIR; a missing one is ENOENT or,
      where ``make``, made (mode 0755, by ``mkdirat`` below the fd of its parent).

``REFUSE``: no symlink at all.  Used for the device nodes and ``/dev/dri/by-path`` links of the live hook
    (:mod:`oci_gpu_hook.appliers.rootfs`), where the path is ours (``/dev/...``) and an image that put a symlink
    at ``/dev``, ``/dev/dri`` or ``/dev/dri/by-path`` is refused, not followed.

    * any symlink on the way is refused (ELOOP), a magic link too;
    * ``.`` and ``..`` are refused in the path's text (EINVAL) before anything is opened or made;
    * mount points, non-directories and missing directories as in ``FOLLOW`` (``make``: made).

How, and why two ways.  The kernel does the same walk in one call: ``openat2`` with ``RESOLVE_IN_ROOT |
RESOLVE_NO_MAGICLINKS`` (``FOLLOW``) or ``RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH`` (``REFUSE``), Linux 5.6.  It
cannot do all of ``FOLLOW``: it refuses a magic link (ELOOP) where runc follows its text, stops at 40
symlinks where runc allows 255, and makes nothing.  So the authority is the walk here (:func:`walk`): one
component at a time, each opened ``O_PATH | O_NOFOLLOW`` below the fd of its parent, a symlink read through
its own fd (``readlinkat(fd, "")``), ``..`` taken from the stack of fds walked, never handed to the kernel.
The kernel's call (:func:`kernel_open`) is tried first where it is cheap; where it succeeds its answer is the
walk's (tests/test_inroot.py holds the two, and the C front's two calls, to one corpus of hostile layouts);
where it fails (ELOOP, EXDEV, ENOENT, ENOSYS, a seccomp EPERM, anything) the walk runs and decides, and its
error is the one said.  Where is it cheap: ``openat2`` needs ctypes (Python has no ``os.openat2``), and
importing ctypes costs 28 to 40 ms (``python -X importtime -I -S -c 'import ctypes'``, this project's CI
machine, loaded) against 24 us for the walk of ``/dev/dri/by-path`` (three components; the kernel's one call
12 us, 22 us with its real path read back; medians of 20000 on the same machine).  So :func:`open_dir` asks the
kernel only where ctypes is imported already (the driver's path: ``mounts`` imported it for ``open_tree``)
and the per-container start path without a driver walks; the answer is the same either way.

The C front (oci_gpu_hook/fastpath/front.c ``in_root``, ``dir_beneath``) makes the ``/dev/dri/by-path`` links
with the kernel's two calls and hands over to Python wherever one fails, so it too either agrees with the walk
or lets the walk decide.
"""

from __future__ import annotations

import os
import stat
import sys

from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from typing import Any

FOLLOW, REFUSE = "follow", "refuse"
MAX_LINKS = 255  # symlinks followed in one path, as runc (filepath-securejoin) allows
ENOENT, ENOTDIR, ELOOP, EINVAL = 2, 20, 40, 22  # the errno module is not imported on the start path for four names
SYS_OPENAT2 = 437  # the generic syscall table (x86_64, arm64, ppc64le, riscv64 alike)
EAGAIN = 11
OPENAT2_TRIES = 16  # the C front's openat2_fd tries as often
RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH, RESOLVE_IN_ROOT = 0x02, 0x04, 0x08, 0x10
KERNEL_RESOLVE = {FOLLOW: RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
                  REFUSE: RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_BENEATH}
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_openat2: Any = None


class WalkError(HookError):
    """A path the walk does not take, in one line; ``errno`` says which kind (ENOENT, ENOTDIR, ELOOP, EINVAL or
    the kernel's own), for the corpus that holds the ways to each other."""

    def __init__(self, message: str, errno: int) -> None:
        super().__init__(message)
        self.errno = errno


def describe(mode: int) -> str:
    """What a non-directory entry is, in words (from its ``st_mode``)."""
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISFIFO(mode):
        return "a fifo"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "not a directory"


def _refused(mode_name: str, shown: str, what: str, errno: int) -> WalkError:
    """The walk's words for a component it does not take, per mode (each mode's callers have said them so)."""
    if mode_name == REFUSE:
        return WalkError(f"refusing to use {shown} in the container's rootfs: it is {what} ({os.strerror(errno)}); "
                         "only real directories are used", errno)
    return WalkError(f"cannot use {shown} in the container: it is not a directory", errno)


def walk(root_fd: int, path: str, mode: str, make: bool = False) -> tuple[int, str]:
    """An O_PATH fd of the directory ``path`` inside the root ``root_fd`` and its real path there (absolute, from
    the root), by the rule of ``mode`` (this module's docstring); missing directories made where ``make``.
    Raises :class:`WalkError`; nothing outside the root is ever opened or made."""
    todo = [p for p in path.split("/") if p]
    if mode == REFUSE and ("." in todo or ".." in todo):
        raise WalkError(f"refusing path {path!r}: '.' and '..' are not allowed", EINVAL)
    stack = [os.dup(root_fd)]  # the directories walked, the root first
    names: list[str] = []
    links = raced = 0
    try:
        while todo:
            part = todo.pop(0)
            if part == ".":
                continue
            if part == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                    names.pop()
                continue
            shown = "/" + "/".join([*names, part])
            try:
                fd = os.open(part, _PATH_FLAGS, dir_fd=stack[-1])
            except FileNotFoundError:
                if not make or raced > MAX_LINKS:  # made by another, then gone again, and again, as we go
                    raise WalkError(f"{shown} is missing in the container", ENOENT) from None
                try:
                    os.mkdir(part, 0o755, dir_fd=stack[-1])
                except FileExistsError:
                    raced += 1  # made meanwhile: opened (without following) below
                except OSError as err:
                    raise WalkError(f"cannot make {shown} in the container: {err.strerror}", err.errno) from None
                todo.insert(0, part)
                continue
            except OSError as err:
                raise WalkError(f"cannot use {shown} in the container: {err.strerror}", err.errno) from None
            try:
                found = os.fstat(fd).st_mode
                if stat.S_ISDIR(found):
                    stack.append(fd)
                    names.append(part)
                    continue
                if not stat.S_ISLNK(found):
                    raise _refused(mode, shown, describe(found), ENOTDIR)
                if mode == REFUSE:
                    raise _refused(mode, shown, "a symlink", ELOOP)
                links += 1
                if links > MAX_LINKS:
                    raise WalkError(f"cannot use {path} in the container: more than {MAX_LINKS} symlinks", ELOOP)
                try:
                    target = os.readlink("", dir_fd=fd)  # the link this fd holds: read once, never looked up again
                except OSError as err:
                    raise WalkError(f"cannot read the symlink {shown} in the container: {err.strerror}",
                                    err.errno) from None
            finally:
                if stack[-1] != fd:
                    os.close(fd)
            if not target:
                raise WalkError(f"cannot use {shown} in the container: an empty symlink", ENOENT)
            if target.startswith("/"):
                while len(stack) > 1:
                    os.close(stack.pop())
                names.clear()
            todo[:0] = [p for p in target.split("/") if p]
    except BaseException:
        for fd in stack:
            os.close(fd)
        raise
    for fd in stack[:-1]:
        os.close(fd)
    return stack[-1], "/" + "/".join(names)


def kernel_open(root_fd: int, path: str, mode: str) -> int:
    """``openat2(root_fd, path, O_PATH|O_DIRECTORY, KERNEL_RESOLVE[mode])``: the kernel's walk by the same rule
    (short of what its docstring says it cannot do); raises OSError (ENOSYS where the kernel lacks the call)."""
    import ctypes

    global _openat2
    if _openat2 is None:
        libc = ctypes.CDLL(None, use_errno=True)

        class OpenHow(ctypes.Structure):
            _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]

        def call(dir_fd: int, name: bytes, flags: int, resolve: int) -> int:
            how = OpenHow(flags, 0, resolve)
            for _ in range(OPENAT2_TRIES):  # EAGAIN: a rename or mount on the host raced a "..": try again
                fd = int(libc.syscall(ctypes.c_long(SYS_OPENAT2), ctypes.c_int(dir_fd), ctypes.c_char_p(name),
                                      ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how))))
                errno = ctypes.get_errno() if fd < 0 else 0
                if errno != EAGAIN:
                    break
            if fd < 0:
                raise OSError(errno, os.strerror(errno))
            return fd

        _openat2 = call
    if mode == REFUSE and any(p in (".", "..") for p in path.split("/")):
        raise OSError(EINVAL, os.strerror(EINVAL))
    return int(_openat2(root_fd, os.fsencode(path.lstrip("/") or "."),
                        os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, KERNEL_RESOLVE[mode]))


def _real_path(root_fd: int, fd: int) -> str | None:
    """``fd``'s path from the root ``root_fd`` (both read back from /proc/self/fd), or None where that is unsure."""
    try:
        root, here = os.readlink(f"/proc/self/fd/{root_fd}"), os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    if here == root:
        return "/"
    prefix = root.rstrip("/") + "/"
    if not root.startswith("/") or not here.startswith(prefix) or here.endswith(" (deleted)"):
        return None
    return here[len(prefix) - 1:]


def open_dir(root_fd: int, path: str, mode: str, make: bool = False, kernel: bool | None = None) -> tuple[int, str]:
    """The directory ``path`` inside the root ``root_fd`` by the rule of ``mode``: an O_PATH fd and its real path
    from the root.  ``kernel``: ask ``openat2`` first, the walk deciding wherever the kernel does not answer;
    None (the callers' way): where ctypes is imported already, and only there.  Raises :class:`WalkError`."""
    if kernel is None:
        kernel = "ctypes" in sys.modules
    if kernel:
        try:
            fd = kernel_open(root_fd, path, mode)
        except OSError:
            pass
        else:
            real = _real_path(root_fd, fd)
            if real is not None:
                return fd, real
            os.close(fd)
    return walk(root_fd, path, mode, make)


def open_leaf(root_fd: int, path: str, make: bool = True) -> tuple[int, str, str]:
    """FOLLOW mode for a path whose last component may be no directory (a file the caller makes, mounts on or
    reads): its directory (an O_PATH fd, missing ones made where ``make``), a name in it that is no symlink (or
    missing), and the real path; a symlink in the last place is followed by its text inside the root as the
    directories are (runc follows a mount destination so)."""
    for _ in range(MAX_LINKS):
        directory, _, name = path.rpartition("/")
        dir_fd, real = open_dir(root_fd, directory or "/", FOLLOW, make=make)
        try:
            target = os.readlink(name, dir_fd=dir_fd)
        except OSError:  # missing, or no symlink
            return dir_fd, name, f"{real.rstrip('/')}/{name}"
        os.close(dir_fd)
        path = target if target.startswith("/") else f"{real.rstrip('/')}/{target}"
        if path.rstrip("/").rpartition("/")[2] in ("", ".", ".."):
            raise HookError(f"refusing {path!r} in the container: a symlink there leads to a directory name")
    raise WalkError(f"cannot use {path} in the container: more than {MAX_LINKS} symlinks", ELOOP)


def real_path(root: str, path: str) -> str | None:
    """``path`` inside the directory tree ``root`` (a host path: a driver container's root, or ``/``) with every
    symlink resolved inside it by FOLLOW mode, as that root's own processes see it; None where it does not exist
    (or the walk refuses it).  Looks only: nothing is made."""
    try:
        root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if not parts or parts[-1] == "..":
            dir_fd, real = open_dir(root_fd, path, FOLLOW)
            os.close(dir_fd)
            return real
        dir_fd, name, real = open_leaf(root_fd, path, make=False)
        try:
            os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return None
        finally:
            os.close(dir_fd)
        return real
    except HookError:
        return None
    finally:
        os.close(root_fd)
