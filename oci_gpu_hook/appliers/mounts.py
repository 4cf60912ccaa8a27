"""A driver's files put into a running container: read-only bind mounts, soname links, the ld cache.

Runs in the namespace helper of :mod:`oci_gpu_hook.appliers.rootfs` (a child that entered the container's
mount namespace before ``pivot_root``, where the host's tree is still the namespace's root and the
container's root is ``root.path``).  Lessons of the NVIDIA toolkit's CVE-2024-0132 and CVE-2025-23359 (paths
in the rootfs resolved as strings, so that an image's symlinks sent host paths into the container):

* every path inside the rootfs is resolved by the kernel inside it, ``openat2`` with ``RESOLVE_IN_ROOT``
  and ``RESOLVE_NO_MAGICLINKS``: an image's symlinks (``/lib -> usr/lib``) work as they would for its own
  processes, and none leads out of the rootfs; directories are made with ``mkdirat`` on the resolved parent;
* a mount's source is cloned in the host's namespace before the helper enters the container's
  (``open_tree(OPEN_TREE_CLONE)``), made read-only, nosuid and nodev while still detached
  (``mount_setattr``), and attached onto the destination's file descriptor (``move_mount``): it is never
  writable in the container, not even for an instant, and no path is resolved twice;
* a destination that is a symlink is refused, never mounted through;
* the ld cache is rebuilt by the host's ``ldconfig -r ROOTFS`` (it chroots into the rootfs first), never
  by a binary of the image.

Needs Linux 5.12 (``mount_setattr``); an older kernel is one clear error, and the spec-rewrite and CDI paths,
where the runtime mounts, work there.
"""

from __future__ import annotations

import os
import stat

from oci_gpu_hook.core.edits import check_container_path, check_symlink
from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms per container start

if TYPE_CHECKING:
    from typing import Any

    from oci_gpu_hook.core.edits import Edits, Mount

# Syscall numbers of the generic table (the same on x86_64, arm64, ppc64le, riscv64: numbers above 424 are shared)
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_OPENAT2, SYS_MOUNT_SETATTR = 428, 429, 437, 442
RESOLVE_NO_MAGICLINKS, RESOLVE_IN_ROOT = 0x02, 0x10
OPEN_TREE_CLONE, AT_EMPTY_PATH, AT_FDCWD = 1, 0x1000, -100
MOVE_MOUNT_F_EMPTY_PATH, MOVE_MOUNT_T_EMPTY_PATH = 0x04, 0x40
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
LDCONFIG = ("/sbin/ldconfig.real", "/sbin/ldconfig", "/usr/sbin/ldconfig")  # Ubuntu's ldconfig is a script
CONF_FILE = "/etc/ld.so.conf.d/00-oci-gpu-hook.conf"
_libc: Any = None


def _syscall(number: int, *args: Any) -> int:
    import ctypes

    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    result = int(_libc.syscall(ctypes.c_long(number), *args))
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return result


def openat2(dir_fd: int, path: str, flags: int) -> int:
    """``openat2(dir_fd, path, {flags, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS})``."""
    import ctypes

    class OpenHow(ctypes.Structure):
        _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]

    how = OpenHow(flags | os.O_CLOEXEC, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
    return _syscall(SYS_OPENAT2, ctypes.c_int(dir_fd), ctypes.c_char_p(os.fsencode(path)), ctypes.byref(how),
                    ctypes.c_size_t(ctypes.sizeof(how)))


def _kernel_error(err: OSError, what: str) -> HookError:
    if err.errno == 38:  # ENOSYS
        return HookError(f"{what}: this kernel lacks the call (Linux 5.12 or later is needed to mount driver "
                         "files live; the spec-rewrite and CDI paths let the runtime mount them)")
    return HookError(f"{what}: {err.strerror}")


def clone_tree(mount: Mount) -> int:
    """In the host's namespace: a detached read-only, nosuid, nodev copy of ``mount.source``."""
    import ctypes

    class MountAttr(ctypes.Structure):
        _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                    ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]

    try:
        mode = os.stat(mount.source).st_mode
    except OSError as err:
        raise HookError(f"driver file {mount.source}: {err.strerror}") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise HookError(f"driver file {mount.source} is neither a file nor a directory")
    try:
        fd = _syscall(SYS_OPEN_TREE, ctypes.c_int(AT_FDCWD), ctypes.c_char_p(os.fsencode(mount.source)),
                      ctypes.c_uint(OPEN_TREE_CLONE | os.O_CLOEXEC))
    except OSError as err:
        raise _kernel_error(err, f"cannot clone the mount of {mount.source}") from None
    attr = MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, 0, 0)
    try:
        _syscall(SYS_MOUNT_SETATTR, ctypes.c_int(fd), ctypes.c_char_p(b""), ctypes.c_uint(AT_EMPTY_PATH),
                 ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))
    except OSError as err:
        os.close(fd)
        raise _kernel_error(err, f"cannot make the mount of {mount.source} read-only") from None
    return fd


def dir_in_root(root_fd: int, directory: str) -> int:
    """An O_PATH fd of ``directory`` resolved inside the rootfs, every missing component made (mode 0755)."""
    fd = os.dup(root_fd)
    path = ""
    try:
        for part in [p for p in directory.split("/") if p]:
            path += "/" + part
            try:
                child = openat2(root_fd, path, os.O_PATH | os.O_DIRECTORY)
            except FileNotFoundError:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass  # a dangling symlink (fails below) or made meanwhile
                try:
                    child = openat2(root_fd, path, os.O_PATH | os.O_DIRECTORY)
                except OSError as err:
                    raise HookError(f"cannot make {path} in the container: {err.strerror}") from None
            except OSError as err:
                if err.errno == 38:
                    raise _kernel_error(err, "openat2") from None
                raise HookError(f"cannot use {path} in the container: {err.strerror}") from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def bind(root_fd: int, mount: Mount, tree_fd: int) -> str:
    """Attach the detached ``tree_fd`` at ``mount.destination`` inside the rootfs ('made' or 'present')."""
    check_container_path(mount.destination, "mount destination")
    directory, _, name = mount.destination.rpartition("/")
    is_dir = stat.S_ISDIR(os.fstat(tree_fd).st_mode)
    dir_fd = dir_in_root(root_fd, directory or "/")
    try:
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            if is_dir:
                os.mkdir(name, 0o755, dir_fd=dir_fd)
            else:
                os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                                 dir_fd=dir_fd))
            mode = stat.S_IFDIR if is_dir else stat.S_IFREG
        if stat.S_ISLNK(mode):
            raise HookError(f"refusing to mount {mount.source} at {mount.destination}: the container has a symlink "
                            "there")
        if stat.S_ISDIR(mode) != is_dir or not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            raise HookError(f"refusing to mount {mount.source} at {mount.destination}: the container has a "
                            f"{'non-directory' if is_dir else 'directory or special file'} there")
        dest = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    try:
        here, source = os.fstat(dest), os.fstat(tree_fd)
        if (here.st_dev, here.st_ino) == (source.st_dev, source.st_ino):
            return f"{mount.destination} present"
        import ctypes

        try:
            _syscall(SYS_MOVE_MOUNT, ctypes.c_int(tree_fd), ctypes.c_char_p(b""), ctypes.c_int(dest),
                     ctypes.c_char_p(b""), ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH))
        except OSError as err:
            raise _kernel_error(err, f"cannot mount {mount.source} at {mount.destination}") from None
    finally:
        os.close(dest)
    return f"{mount.destination} mounted"


def symlink(root_fd: int, path: str, target: str) -> str:
    """Make ``path -> target`` inside the rootfs; an old link of the same name is replaced, anything else
    in its place is an error."""
    check_symlink(path, target)
    directory, _, name = path.rpartition("/")
    dir_fd = dir_in_root(root_fd, directory or "/")
    try:
        try:
            current = os.readlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            os.symlink(target, name, dir_fd=dir_fd)
            return f"{path} made"
        except OSError:
            raise HookError(f"{path} exists in the container and is not a symlink; refusing to replace it") from None
        if current == target:
            return f"{path} present"
        temp = f".{name}.oci-gpu-hook"
        try:
            os.unlink(temp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        os.symlink(target, temp, dir_fd=dir_fd)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return f"{path} replaced (was -> {current})"
    finally:
        os.close(dir_fd)


def _write_in_root(root_fd: int, path: str, text: str) -> None:
    """Replace the file ``path`` inside the rootfs with ``text`` (a new file renamed over it; unchanged: kept)."""
    directory, _, name = path.rpartition("/")
    dir_fd = dir_in_root(root_fd, directory)
    temp = f".{name}.oci-gpu-hook"
    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, 1 << 16) == text.encode():
                    return
            finally:
                os.close(fd)
        except OSError:
            pass
        try:
            os.unlink(temp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as err:
        raise HookError(f"cannot write {path} in the container: {err.strerror}") from None
    finally:
        os.close(dir_fd)


def ldconfig(rootfs: str) -> str:
    """The host's ldconfig (as this namespace sees the host before pivot_root)."""
    for path in LDCONFIG:
        if os.access(path, os.X_OK):
            return path
    raise HookError(f"no ldconfig on the host ({', '.join(LDCONFIG)}): cannot update the ld cache of {rootfs}")


def update_ldcache(root_fd: int, rootfs: str, folders: tuple[str, ...]) -> str:
    """List ``folders`` in the container's ld.so.conf.d (for the image's own later ldconfig runs) and rebuild
    its cache with them: ``ldconfig -r ROOTFS -X FOLDER...`` (-X: links are made here, not by ldconfig)."""
    for folder in folders:
        check_container_path(folder, "ld cache directory")
    _write_in_root(root_fd, CONF_FILE, "".join(f"{f}\n" for f in folders))
    argv = [ldconfig(rootfs), "-r", rootfs, "-X", *folders]
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the exec'd ldconfig
        try:
            os.close(read_end)
            os.dup2(write_end, 1)
            os.dup2(write_end, 2)
            os.chdir("/")
            os.execve(argv[0], argv, {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        finally:
            os._exit(127)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(child, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        said = b"".join(chunks).decode(errors="replace").strip().splitlines()
        raise HookError(f"{' '.join(argv[:3])} failed: {said[-1] if said else f'status {status}'}")
    return f"ld cache of {rootfs} updated ({', '.join(folders)})"


def apply(root_fd: int, rootfs: str, edits: Edits, trees: list[int]) -> list[str]:
    """The mounts (their detached trees, in order), the symlinks, then the ld cache."""
    done = [bind(root_fd, mount, tree) for mount, tree in zip(edits.mounts, trees, strict=True)]
    done += [symlink(root_fd, path, target) for path, target in edits.symlinks]
    if edits.ldcache:
        done.append(update_ldcache(root_fd, rootfs, edits.ldcache))
    return done
