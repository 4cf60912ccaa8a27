"""A driver's files put into a running container: read-only bind mounts, soname links, the ld cache.

Runs in the namespace helper of :mod:`oci_gpu_hook.appliers.rootfs` (a child that entered the container's
mount namespace before ``pivot_root``, where the host's tree is still the namespace's root and the
container's root is ``root.path``).  Lessons of the NVIDIA toolkit's CVE-2024-0132 and CVE-2025-23359 (paths
in the rootfs resolved as strings, so that an image's symlinks sent host paths into the container):

* every path inside the rootfs is resolved as runc resolves a mount destination, so that the live hook
  takes every image exactly as the shim and the CDI specs (where runc mounts) take it: by the one walk's FOLLOW
  mode (:mod:`oci_gpu_hook.core.inroot`, where the rule is written: symlinks by their text, a
  ``/proc/*/root`` magic link too, ``..`` no further than the root, missing directories made with ``mkdirat``);
  a symlink in the destination's own place is followed the same way.  An image's ``/lib -> usr/lib``,
  ``/lib/firmware -> /proc/1/root/x`` or ``-> ../../../x`` thus lead where they lead for runc, inside the rootfs,
  on all three paths alike; nothing outside it is opened;
* a mount's source is cloned in the host's namespace before the helper enters the container's
  (``open_tree(OPEN_TREE_CLONE)``), made read-only, nosuid and nodev while still detached
  (``mount_setattr``), and attached onto the destination's file descriptor (``move_mount``): it is never
  writable in the container, not even for an instant, and no path is resolved twice;
* the ld cache is rebuilt by the host's ``ldconfig -r ROOTFS`` (it chroots into the rootfs and reads the
  image's ``/etc/ld.so.conf`` there), never by a binary of the image.  A chroot keeps symlinks and ``..``
  inside, but not the magic links of a procfs: before ``pivot_root`` the container's ``/proc/1/root`` is the
  host's ``/``, so an image whose ld.so.conf (or a symlink in a scanned directory, or a symlinked
  ``/etc/ld.so.conf``) names ``/proc/1/root/usr/lib`` would have ldconfig read and list the host's libraries.
  So ldconfig runs in a mount namespace of its own (a private copy of the container's, nothing propagating
  back) where an empty read-only tmpfs covers every procfs mounted under the rootfs: what it sees is what the
  container's processes will see after ``pivot_root``, less ``/proc``.  That was chosen over parsing the
  image's ld.so.conf here and handing ldconfig a list of our own: ldconfig would still follow the symlinks
  of the directories it scans through ``/proc``, and its config grammar (``include`` globs, ``hwcap``) would
  be written twice.  The cost, measured: 4 ms a container given a driver's libraries (20 ms for the fork and
  ldconfig on an empty rootfs instead of 16), and ctypes' import where the hook had not loaded it.
  Our own directories are passed by their real paths inside the rootfs; ldconfig is killed after
  ``LDCONFIG_SECONDS`` (an image's FIFO where it reads would otherwise hold the container's start forever).

Needs Linux 5.12 (``mount_setattr``); an older kernel is one clear error, and the spec-rewrite and CDI paths,
where the runtime mounts, work there.
"""

from __future__ import annotations

import os
import stat

from oci_gpu_hook.atomic import symlink_at, write_at
from oci_gpu_hook.core import inroot
from oci_gpu_hook.core.edits import check_container_path, check_symlink
from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from typing import Any

    from oci_gpu_hook.core.edits import Edits, Mount

# Syscall numbers of the generic table (the same on x86_64, arm64, ppc64le, riscv64: numbers above 424 are shared)
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442
OPEN_TREE_CLONE, AT_EMPTY_PATH, AT_FDCWD = 1, 0x1000, -100
MOVE_MOUNT_F_EMPTY_PATH, MOVE_MOUNT_T_EMPTY_PATH = 0x04, 0x40
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
LDCONFIG = ("/sbin/ldconfig.real", "/sbin/ldconfig", "/usr/sbin/ldconfig")  # Ubuntu's ldconfig is a script
CONF_FILE = "/etc/ld.so.conf.d/00-oci-gpu-hook.conf"
# Under the runtime's timeout of the hooks that run it (prestart: 10 s for everything, as installed; ldcache: 30 s),
# so that a refusal is this line, not the runtime's kill; ldconfig over the 1100 libraries of a Debian host: 0.3 s.
LDCONFIG_SECONDS = 5
CLONE_NEWNS, MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 0x20000, 1, 2, 4, 8, 0x4000, 1 << 18
_libc: Any = None


def _load_libc() -> Any:
    import ctypes

    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _syscall(number: int, *args: Any) -> int:
    import ctypes

    result = int(_load_libc().syscall(ctypes.c_long(number), *args))
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return result


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
    """An O_PATH fd of ``directory`` inside the rootfs by the one walk's FOLLOW mode (as runc resolves a mount
    destination: :mod:`oci_gpu_hook.core.inroot`), every missing one made."""
    return inroot.open_dir(root_fd, directory, inroot.FOLLOW, make=True)[0]


def bind(root_fd: int, mount: Mount, tree_fd: int) -> str:
    """Attach the detached ``tree_fd`` at ``mount.destination`` inside the rootfs ('made' or 'present')."""
    check_container_path(mount.destination, "mount destination")
    is_dir = stat.S_ISDIR(os.fstat(tree_fd).st_mode)
    dir_fd, name, _ = inroot.open_leaf(root_fd, mount.destination)
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
        symlink_at(dir_fd, name, target, shown=f"{path} in the container")
        return f"{path} replaced (was -> {current})"
    finally:
        os.close(dir_fd)


def _write_in_root(root_fd: int, path: str, text: str) -> None:
    """Replace the file ``path`` inside the rootfs with ``text`` (the one writer, :func:`oci_gpu_hook.atomic.write_at`,
    below the directory resolved inside the rootfs; unchanged: kept)."""
    directory, _, name = path.rpartition("/")
    dir_fd = dir_in_root(root_fd, directory)
    try:
        try:
            # O_NONBLOCK: an image's FIFO in the file's place is opened without waiting for a writer (and replaced)
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, 1 << 16) == text.encode():
                    return
            finally:
                os.close(fd)
        except OSError:
            pass
        write_at(dir_fd, name, text, 0o644, shown=f"{path} in the container")
    finally:
        os.close(dir_fd)


def ldconfig(rootfs: str) -> str:
    """The host's ldconfig (as this namespace sees the host before pivot_root)."""
    for path in LDCONFIG:
        if os.access(path, os.X_OK):
            return path
    raise HookError(f"no ldconfig on the host ({', '.join(LDCONFIG)}): cannot update the ld cache of {rootfs}")


def _proc_mounts_under(root: str) -> list[str]:
    """The procfs mount points at or below ``root`` in this mount namespace, outermost first (the inner ones are
    covered with them)."""
    found: list[str] = []
    with open("/proc/self/mountinfo", "rb") as handle:
        for line in handle.read().decode(errors="surrogateescape").splitlines():
            fields = line.split(" ")
            if " - " not in line or len(fields) < 5:
                continue
            if line.split(" - ", 1)[1].split(" ", 1)[0] != "proc":
                continue
            point = fields[4]
            for code in ("\\040", "\\011", "\\012", "\\134"):
                point = point.replace(code, chr(int(code[1:], 8)))
            if point == root or point.startswith(root.rstrip("/") + "/"):
                found.append(point)
    outer: list[str] = []
    for point in sorted(set(found), key=len):
        if not any(point == o or point.startswith(o + "/") for o in outer):
            outer.append(point)
    return outer


def _hide_proc(root: str) -> None:
    """In the calling process: a mount namespace of its own (private, nothing propagates to the container's),
    with an empty read-only tmpfs over every procfs below ``root``; raises OSError."""
    import ctypes

    libc = _load_libc()

    def check(result: int, what: str) -> None:
        if result != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"{what}: {os.strerror(errno)}")

    check(libc.unshare(ctypes.c_int(CLONE_NEWNS)), "unshare")
    check(libc.mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None), "making mounts private")
    for point in _proc_mounts_under(root):
        check(libc.mount(b"none", os.fsencode(point), b"tmpfs", ctypes.c_ulong(MS_RDONLY | MS_NOSUID | MS_NODEV
                                                                                | MS_NOEXEC), b"mode=0555,size=4k"),
              f"covering {point}")


def update_ldcache(root_fd: int, rootfs: str, folders: tuple[str, ...]) -> str:
    """List ``folders`` in the container's ld.so.conf.d (for the image's own later ldconfig runs) and rebuild
    its cache with them: ``ldconfig -r ROOTFS -X FOLDER...`` (-X: links are made here, not by ldconfig), each
    folder by its real path inside the rootfs, ldconfig in a mount namespace of its own where no procfs is
    under the rootfs and killed after LDCONFIG_SECONDS (a FIFO where it reads never holds the container)."""
    import select
    import time

    real = []
    for folder in folders:
        check_container_path(folder, "ld cache directory")
        fd, path = inroot.open_dir(root_fd, folder, inroot.FOLLOW, make=True)
        os.close(fd)
        real.append(path)
    _write_in_root(root_fd, CONF_FILE, "".join(f"{f}\n" for f in real))
    root = os.readlink(f"/proc/self/fd/{root_fd}")  # the rootfs as mountinfo names it
    argv = [ldconfig(rootfs), "-r", root, "-X", *real]
    _load_libc()  # here, not in each child
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the exec'd ldconfig
        try:
            os.close(read_end)
            try:
                _hide_proc(root)
            except OSError as err:
                os.write(write_end, f"cannot hide /proc from ldconfig ({err.strerror})".encode())
                os._exit(126)
            os.dup2(write_end, 1)
            os.dup2(write_end, 2)
            os.chdir("/")
            os.execve(argv[0], argv, {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        finally:
            os._exit(127)
    os.close(write_end)
    chunks = []
    deadline = time.monotonic() + LDCONFIG_SECONDS
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                os.kill(child, 9)
                os.waitpid(child, 0)
                raise HookError(f"{' '.join(argv[:3])} did not finish in {LDCONFIG_SECONDS} s (a FIFO or a device "
                                "where the image's ld.so.conf or libraries should be?)")
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
    _, status = os.waitpid(child, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        said = b"".join(chunks).decode(errors="replace").strip().splitlines()
        raise HookError(f"{' '.join(argv[:3])} failed: {said[-1] if said else f'status {status}'}")
    return f"ld cache of {rootfs} updated ({', '.join(real)})"


def apply(root_fd: int, rootfs: str, edits: Edits, trees: list[int]) -> list[str]:
    """The mounts (their detached trees, in order), the symlinks, then the ld cache."""
    done = [bind(root_fd, mount, tree) for mount, tree in zip(edits.mounts, trees, strict=True)]
    done += [symlink(root_fd, path, target) for path, target in edits.symlinks]
    if edits.ldcache:
        done.append(update_ldcache(root_fd, rootfs, edits.ldcache))
    return done
