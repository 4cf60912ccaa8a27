"""A driver's files put into a running container: read-only bind mounts, soname links, the ld cache.

Runs in the namespace helper of :mod:`oci_gpu_hook.appliers.rootfs` (a child that entered the container's
mount namespace before ``pivot_root``, where the host's tree is still the namespace's root and the
container's root is ``root.path``); the ``ldcache`` hook's links and cache also from the hook's own process, the
root reached through ``/proc/PID/root`` (:func:`oci_gpu_hook.appliers.live._driver_through_proc`), and from the
spec rewrite before ``runc create``, the libraries' sonames read from the mounts' host files
(:func:`oci_gpu_hook.appliers.ocispec.prewrite`): all three by :func:`links_and_cache`.  Lessons of
the NVIDIA toolkit's CVE-2024-0132 and CVE-2025-23359 (paths in the rootfs resolved as strings, so that an image's
symlinks sent host paths into the container):

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
* the ld cache is written here, without a process (:func:`update_ldcache`): each driver library's soname and
  ABI read from its ELF headers, its entry merged into the image's ``/etc/ld.so.cache`` before the image's own
  and after its ``glibc-hwcaps`` copies (and after the CUDA compat libraries where :func:`compat_choice` takes
  them), sorted as glibc's ldconfig sorts (:mod:`oci_gpu_hook.inventory.ldcache`), written by the one atomic
  writer; the driver's directories in a drop-in of ``/etc/ld.so.conf.d`` for the image's own later ldconfig.
  Nothing of the image is read but its cache (never its ld.so.conf, nor the directories it names): an image's
  ``/proc/1/root/...`` there leads nowhere at this step.  A cache that cannot be merged (no regular file, too
  large, not a cache glibc reads) is rebuilt by the host's ``ldconfig`` instead, confined (:func:`_run_ldconfig`):
  chrooted into the root without capabilities and with no-new-privs, in a mount namespace of its own where an
  empty read-only tmpfs covers every procfs under the rootfs (before ``pivot_root`` the container's
  ``/proc/1/root`` is the host's ``/``, and a chroot does not stop a magic link), killed after
  ``LDCONFIG_SECONDS`` (an image's FIFO where it reads would otherwise hold the container's start forever).
  The merge costs ~3 ms in process (a 556-entry cache), ~0.4 ms where the cache already lists the driver.

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
from oci_gpu_hook.inventory import ldcache

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
# NVIDIA's enable-cuda-compat names its drop-in 00-compat-*.conf: it sorts before ours, the compat libcuda first
COMPAT_CONF_FILE = "/etc/ld.so.conf.d/00-compat-oci-gpu-hook.conf"
COMPAT_DIR = "/usr/local/cuda/compat"
COMPAT_NOTE, COMPAT_NOTE_OWNER = ".note.cuda.fwd_compatibility", "NVIDIA Corporation"
COMPAT_REFUSED = "; the host's libcuda is used"
WARNING = "; warning: "  # what follows in a result line is said as a warning (live.py: the hook's journal line)
CACHE, LD_SO_CONF, INCLUDE_LINE = "/etc/ld.so.cache", "/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n"
# Under the runtime's timeout of the hooks that run it (prestart: 10 s for everything, as installed; ldcache: 30 s),
# so that a refusal is this line, not the runtime's kill; ldconfig over the 1100 libraries of a Debian host: 0.3 s.
LDCONFIG_SECONDS = 5
CLONE_NEWNS, MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 0x20000, 1, 2, 4, 8, 0x4000, 1 << 18
PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 28, 38, 47, 4
SECUREBITS_NO_ROOT = 0x0F  # NOROOT and NO_SETUID_FIXUP, each locked: uid 0 gains no capability at exec
CAPABILITY_VERSION_3 = 0x20080522
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


def _check(result: int, what: str) -> None:
    import ctypes

    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _hide_proc(root: str) -> None:
    """In the calling process: a mount namespace of its own (private, nothing propagates to the container's),
    with an empty read-only tmpfs over every procfs below ``root``; raises OSError."""
    import ctypes

    libc = _load_libc()
    _check(libc.unshare(ctypes.c_int(CLONE_NEWNS)), "unshare")
    _check(libc.mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None), "making mounts private")
    for point in _proc_mounts_under(root):
        _check(libc.mount(b"none", os.fsencode(point), b"tmpfs", ctypes.c_ulong(MS_RDONLY | MS_NOSUID | MS_NODEV
                                                                                 | MS_NOEXEC), b"mode=0555,size=4k"),
               f"covering {point}")


def _confine(root: str) -> None:
    """In the calling process, before it execs the host's ldconfig: chrooted into ``root``, with no capability
    left (bounding, ambient, effective, permitted, inheritable), securebits that give root none back at exec,
    and no-new-privs; raises OSError.  What ldconfig can then do to the image's files is what the image's own
    root user without capabilities could: write where root owns the directory, nothing outside the root."""
    import ctypes

    libc = _load_libc()
    os.chroot(root)
    os.chdir("/")
    _check(libc.prctl(PR_SET_SECUREBITS, ctypes.c_ulong(SECUREBITS_NO_ROOT), 0, 0, 0), "setting securebits")
    _check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clearing ambient capabilities")
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) != 0:
            break  # past the last capability this kernel knows (EINVAL)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "setting no-new-privs")
    header = (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(libc.capset(header, data), "dropping capabilities")


def _run_ldconfig(root_fd: int, rootfs: str, real: list[str]) -> str:
    """The host's ldconfig over the container's root, where the cache cannot be merged: chrooted into it with no
    capability and no-new-privs (:func:`_confine`), in a mount namespace of its own where no procfs is under the
    root, the binary opened on the host before the chroot and run from that descriptor, killed after
    LDCONFIG_SECONDS (a FIFO where it reads never holds the container)."""
    import select
    import time

    root = os.readlink(f"/proc/self/fd/{root_fd}")  # the rootfs as mountinfo names it
    binary = ldconfig(rootfs)
    argv = [binary, "-X", *real]
    _load_libc()  # here, not in each child
    exe = os.open(binary, os.O_RDONLY | os.O_CLOEXEC)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the exec'd ldconfig
        try:
            os.close(read_end)
            try:
                _hide_proc(root)
                _confine(root)
            except OSError as err:
                os.write(write_end, f"cannot confine ldconfig ({err.strerror})".encode())
                os._exit(126)
            os.dup2(write_end, 1)
            os.dup2(write_end, 2)
            os.execve(exe, argv, {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        finally:
            os._exit(127)
    os.close(write_end)
    os.close(exe)
    chunks = []
    deadline = time.monotonic() + LDCONFIG_SECONDS
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                os.kill(child, 9)
                os.waitpid(child, 0)
                raise HookError(f"{binary} in {rootfs} did not finish in {LDCONFIG_SECONDS} s (a FIFO or a device "
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
        raise HookError(f"{binary} in {rootfs} failed: {said[-1] if said else f'status {status}'}")
    return "rebuilt by the host's ldconfig, chrooted, without capabilities"


def _open_file(root_fd: int, path: str) -> tuple[int | None, str, str]:
    """``path`` inside the rootfs (FOLLOW mode, nothing made) opened for reading without following a symlink
    out of it, without waiting on a FIFO: (fd or None where it is missing, what it is when it is no regular file
    ("" for one), its real path)."""
    try:
        dir_fd, name, real = inroot.open_leaf(root_fd, path, make=False)
    except inroot.WalkError as err:
        if err.errno in (2, 20):  # ENOENT, ENOTDIR: not there
            return None, "", path
        return None, f"path the walk does not take ({err})", path
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY, dir_fd=dir_fd)
    except FileNotFoundError:
        return None, "", real
    except OSError as err:
        return None, err.strerror or "unreadable", real
    finally:
        os.close(dir_fd)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        return None, inroot.describe(mode), real
    return fd, "", real


def _image_cache(root_fd: int) -> tuple[list[ldcache.Entry], list[str], str | None]:
    """The image's /etc/ld.so.cache: (entries, hwcaps names, None), or ([], [], why it cannot be merged) for a
    cache that is there and no regular file, too large, or not one that glibc's loader reads; none: ([], [],
    None)."""
    fd, what, _ = _open_file(root_fd, CACHE)
    if fd is None:
        return [], [], f"its {CACHE} is a {what}" if what else None
    try:
        size = os.fstat(fd).st_size
        if size > ldcache.MAX_CACHE:
            return [], [], f"its {CACHE} is {size} bytes (at most {ldcache.MAX_CACHE} are read)"
        data = os.pread(fd, size, 0)
    finally:
        os.close(fd)
    try:
        entries, hwcaps = ldcache.parse_cache(data, CACHE)
    except HookError as err:
        return [], [], str(err)
    return entries, hwcaps, None


def _library(root_fd: int, path: str, source: str | None = None) -> tuple[ldcache.Entry | None, str]:
    """The cache entry of the driver's library at ``path`` in the container (its soname, in its real directory) and
    its real file name; no entry for a file that is no 64-bit library of a known ABI with a soname (ldconfig lists
    none for it either); HookError where no regular file is there (its mount is missing).  ``source``: the host
    file the runtime will mount there (before ``runc create``, where the mount is not made yet): its ELF is read,
    the place it lands resolved in the rootfs as runc will resolve the mount's destination."""
    if source is None:
        fd, what, real = _open_file(root_fd, path)
    else:
        dir_fd, _, real = inroot.open_leaf(root_fd, path, make=False)
        os.close(dir_fd)
        try:
            fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError as err:
            raise HookError(f"the driver's library {source}: {err.strerror}") from None
        what = "" if stat.S_ISREG(os.fstat(fd).st_mode) else "non-regular file"
        if what:
            os.close(fd)
            fd = None
    if fd is None:
        raise HookError(f"the driver's library {path} is {'a ' + what if what else 'missing'} in the container")
    try:
        found = ldcache.elf_soname(fd)
    finally:
        os.close(fd)
    if found is None:
        return None, real.rpartition("/")[2]
    soname, flags = found
    return ldcache.Entry(soname, f"{real.rpartition('/')[0]}/{soname}", flags, 0), real.rpartition("/")[2]


def _version(text: str) -> tuple[int, ...] | None:
    parts = text.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() and p.isascii() for p in parts) else None


def compat_choice(root_fd: int, host_version: str) -> tuple[str | None, str]:
    """CUDA forward compatibility as NVIDIA decides it (docs/requests.md): the real path of the image's
    /usr/local/cuda/compat when its libcuda is to come first, else None; and what was decided, in words."""
    try:
        dir_fd, real = inroot.open_dir(root_fd, COMPAT_DIR, inroot.FOLLOW)
    except HookError:
        return None, "no CUDA compat directory"
    try:
        listing = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    try:
        names = sorted(n for n in os.listdir(listing) if n.startswith("libcuda.so.") and "." in n[11:])
    finally:
        os.close(listing)
    if len(names) != 1:
        return None, f"{len(names)} compat libcuda.so.*.* in {COMPAT_DIR}: not used" if names else "no compat libcuda"
    compat, host = _version(names[0][11:]), _version(host_version)
    if compat is None or host is None:
        return None, f"compat {names[0]}: not a driver version; not used"
    fd, what, _ = _open_file(root_fd, f"{real}/{names[0]}")
    if fd is None or what:
        return None, f"compat {names[0]} is {'a ' + what if what else 'unreadable'}; not used"
    try:
        note = ldcache.elf_note(fd, COMPAT_NOTE, COMPAT_NOTE_OWNER)
        branches = None
        if note is not None:
            from oci_gpu_hook import fastjson

            parsed = fastjson.loads(note.decode())
            branches = parsed.get("Driver") if isinstance(parsed, dict) else None
            if not isinstance(branches, list) or not all(type(b) is int for b in branches):
                raise ValueError('its note has no "Driver" list of driver branches')
    except (ValueError, UnicodeDecodeError) as err:
        return None, f"compat {names[0]}: {str(err).splitlines()[0]}{COMPAT_REFUSED}"
    finally:
        os.close(fd)
    if branches is None:
        use = compat[0] > host[0]
        why = f"no note; its major {'above' if use else 'not above'} the host's {host[0]}"
    else:
        listed = host[0] in branches
        use = listed and compat > host
        why = (f"host branch {host[0]} {'listed' if listed else 'not listed'} in its note, "
               f"{'newer' if compat > host else 'not newer'} than the host's {host_version}")
    return (real if use else None), f"compat {names[0]} {'used' if use else 'not used'} ({why})"


def _compat_entries(root_fd: int, real: str) -> list[ldcache.Entry]:
    """The cache entries of the libraries in the compat directory ``real`` (a soname whose file or link is there)."""
    dir_fd = inroot.open_dir(root_fd, real, inroot.FOLLOW)[0]
    try:
        listing = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    try:
        names = set(os.listdir(listing))
    finally:
        os.close(listing)
    entries: dict[str, ldcache.Entry] = {}
    for name in sorted(names):
        if not name.startswith("lib") or ".so" not in name:
            continue
        fd, _, _ = _open_file(root_fd, f"{real}/{name}")
        if fd is None:
            continue
        try:
            found = ldcache.elf_soname(fd)
        finally:
            os.close(fd)
        if found is not None and found[0] in names:
            entries.setdefault(found[0], ldcache.Entry(found[0], f"{real}/{found[0]}", found[1], 0))
    return list(entries.values())


def _write_cache(root_fd: int, data: bytes) -> None:
    dir_fd = dir_in_root(root_fd, "/etc")
    try:
        write_at(dir_fd, "ld.so.cache", data, 0o644, shown=f"{CACHE} in the container")
    finally:
        os.close(dir_fd)


def _ensure_ld_so_conf(root_fd: int) -> None:
    """An /etc/ld.so.conf that includes the drop-ins, where the image has none (an image's own is kept as it is)."""
    dir_fd = dir_in_root(root_fd, "/etc")
    try:
        try:
            os.stat("ld.so.conf", dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            write_at(dir_fd, "ld.so.conf", INCLUDE_LINE, 0o644, shown=f"{LD_SO_CONF} in the container")
    finally:
        os.close(dir_fd)


class NeedsNamespace(HookError):
    """The cache cannot be merged and ldconfig must run, which needs the container's mount namespace (entered by
    :func:`oci_gpu_hook.appliers.rootfs.apply_in_container`), not a root reached through ``/proc/PID/root``."""


def update_ldcache(root_fd: int, rootfs: str, folders: tuple[str, ...], libraries: tuple[str, ...],
                   in_namespace: bool = True, sources: dict[str, str] | None = None) -> str:
    """Make the driver's ``libraries`` (in ``folders``) resolvable in the container without a process: their
    entries merged into the image's /etc/ld.so.cache (after the image's glibc-hwcaps entries and the CUDA compat
    libraries where :func:`compat_choice` takes them, before the image's own), the folders listed in a drop-in
    of /etc/ld.so.conf.d (and /etc/ld.so.conf made to include the drop-ins where the image has none) so that a
    later ldconfig in the container keeps them.  Nothing is written where the image's cache resolves all of it
    so already.  A cache that cannot be merged (no regular file, too large, not a cache glibc reads) is rebuilt
    by the host's ldconfig, confined (:func:`_run_ldconfig`), in the container's mount namespace only
    (``in_namespace`` false: :class:`NeedsNamespace`, before anything of the cache is written).  ``sources``: the
    host file of each library not yet mounted in the container (the spec rewrite, before ``runc create``)."""
    real = []
    for folder in folders:
        check_container_path(folder, "ld cache directory")
        fd, path = inroot.open_dir(root_fd, folder, inroot.FOLLOW, make=True)
        os.close(fd)
        real.append(path)
    drivers: dict[tuple[str, str, int, int], ldcache.Entry] = {}
    host_version = ""
    unlisted = []
    for path in libraries:
        check_container_path(path, "driver library")
        entry, name = _library(root_fd, path, (sources or {}).get(path))
        if entry is None:
            unlisted.append(path)
        else:
            drivers.setdefault(entry.same(), entry)
        if name.startswith("libcuda.so.") and _version(name[11:]):
            host_version = name[11:]
    compat_dir, compat_said = compat_choice(root_fd, host_version) if host_version else (None, "")
    image, hwcaps, unusable = _image_cache(root_fd)
    if unusable is not None and not in_namespace:
        raise NeedsNamespace(unusable)
    _write_in_root(root_fd, CONF_FILE, "".join(f"{f}\n" for f in real))
    if compat_dir:
        _write_in_root(root_fd, COMPAT_CONF_FILE, f"{compat_dir}\n")
    _ensure_ld_so_conf(root_fd)
    notes = [f"not listed (no soname): {', '.join(unlisted)}"] if unlisted else []
    if compat_said.endswith(COMPAT_REFUSED):
        notes.insert(0, compat_said)
    said = f"; {compat_said}" if compat_said and not notes else ""
    if unusable is not None:
        done = _run_ldconfig(root_fd, rootfs, ([compat_dir] if compat_dir else []) + real)
        notes.insert(0, f"the image's cache could not be merged ({unusable}): {done}")
        return f"ld cache of {rootfs}{WARNING}{'; '.join(notes)}{said}"
    said += f"{WARNING}{'; '.join(notes)}" if notes else ""
    ours = (_compat_entries(root_fd, compat_dir) if compat_dir else []) + list(drivers.values())
    mine = {e.same() for e in ours}
    merged = ldcache.merged([e for e in image if e.same() not in mine], ours, hwcaps)
    if [e.same() for e in merged] == [e.same() for e in image]:
        return f"ld cache of {rootfs} already resolves the driver ({len(ours)} libraries){said}"
    _write_cache(root_fd, ldcache.build(merged, hwcaps))
    return f"ld cache of {rootfs} merged ({len(ours)} libraries of {', '.join(real)}; {len(image)} of the image){said}"


def links_and_cache(root_fd: int, rootfs: str, edits: Edits, in_namespace: bool = True,
                    sources: dict[str, str] | None = None) -> list[str]:
    """A driver's soname links, then its libraries merged into the ld cache (:func:`update_ldcache`): the one
    implementation of the three places that make them (the namespace helper, the ``ldcache`` hook through
    ``/proc/PID/root``, the spec rewrite before ``runc create`` with ``sources``, the mounts' host files)."""
    done = [symlink(root_fd, path, target) for path, target in edits.symlinks]
    if edits.ldcache:
        done.append(update_ldcache(root_fd, rootfs, edits.ldcache, edits.library_paths, in_namespace, sources))
    return done


def warn_notes(done: list[str], cid: str) -> None:
    """The warning a result line carries (the ld cache: a malformed CUDA compat note, a cache ldconfig had to
    rebuild, a driver file without a soname), as the one warning line and the journal's."""
    for line in done:
        if WARNING in line:
            from oci_gpu_hook.log import warn

            warn(line.split(WARNING, 1)[1], entry="ldcache", id=cid)


def apply(root_fd: int, rootfs: str, edits: Edits, trees: list[int]) -> list[str]:
    """The mounts (their detached trees, in order), the symlinks, then the ld cache."""
    done = [bind(root_fd, mount, tree) for mount, tree in zip(edits.mounts, trees, strict=True)]
    return done + links_and_cache(root_fd, rootfs, edits)
