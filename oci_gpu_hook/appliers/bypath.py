"""The ``/dev/dri/by-path`` links of a rewritten spec: one prepared host directory, bind-mounted read-only.

The OCI spec has no field for a symlink, so the spec-rewrite paths (the shim, the ``precreate`` hook,
``dry-run``, the resident planner, which runs this same code) give a container its by-path links as ONE
read-only bind mount (:data:`MOUNT_OPTIONS`) at ``/dev/dri/by-path`` of a host directory that holds exactly
those links (``pci-0000:03:00.0-card -> ../card1``; relative, so inside the container they name its own
``/dev/dri`` nodes).  No ``createRuntime`` hook runs (one exec, setns and path walk less per container).
CDI specs keep the ``links`` hook: a CDI spec outlives any directory prepared on a host, and its edits are per
device (two devices' mounts at one path would hide each other).

The directory is ``<by_path_dir>/<digest>``, the digest naming its content (:func:`digest`: the sorted link
set), so it never changes under a running container and two containers with the same GPUs share it.
:func:`prepare`:

- walks ``by_path_dir`` from ``/`` one component at a time by file descriptor, ``O_NOFOLLOW``: a symlink on the
  way is refused, never followed; every component must pass the trust rule (:func:`oci_gpu_hook.trust.entry_problem`:
  a trusted owner, not writable by group or others, ``/tmp``'s sticky bit aside);
  missing ones are made (0755);
- makes a new directory as a temporary one (``.tmp-<digest>-<pid>``, mode 0700 while it is filled), its links,
  then mode 0755 and an atomic ``rename`` to the digest's name;
- finds one already there (or loses the rename to a concurrent create of the same set): opens it ``O_NOFOLLOW``
  and checks its exact content (a directory, owned by a trusted owner, mode 0755, exactly these names, each a
  symlink owned by a trusted owner with exactly this target); anything else is refused with one line naming what
  is wrong (the container does not start), never used or followed.  Its mtime is then touched: the last time a
  container was given it.

Removal: none while the node runs.  They live on ``/run`` (a tmpfs): each is a few inodes (one directory, a
symlink per link, under 4 KiB of memory), there is one per distinct set of links that containers were given since
boot, and a set changes only when a GPU's PCI address or DRM minor does (a driver reload, a hot-plug); a reboot
empties ``/run``.  One that no mount uses may be removed by hand at any time (a container being created that
names it then fails to start, closed, and the next create makes it again).

On the per-container path: imports nothing but :mod:`os`, :mod:`errno` (built in) and
:mod:`oci_gpu_hook.trust` (itself only os).
"""

from __future__ import annotations

import errno
import os

from oci_gpu_hook.core.edits import BY_PATH_DIR, check_link
from oci_gpu_hook.errors import HookError

MOUNT_OPTIONS = ["bind", "ro", "nosuid", "noexec", "nodev"]
DESTINATION = BY_PATH_DIR.rstrip("/")
DIR_MODE = 0o755
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FNV_OFFSET = 0x6C62272E07BB014262B821756295C58D  # FNV-1a, 128 bits
_FNV_PRIME = 0x0000000001000000000000000000013B
_MASK = (1 << 128) - 1
_NOT_DIR = (errno.ELOOP, errno.ENOTDIR)  # O_NOFOLLOW met a symlink; a file in the way


def entries(links: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """``links`` (``/dev/dri/by-path/NAME``, ``../cardN``) as the directory's entries NAME -> target, sorted."""
    out: dict[str, str] = {}
    for path, target in links:
        check_link(path, target)
        name = path[len(BY_PATH_DIR):]
        if out.setdefault(name, target) != target:
            raise HookError(f"two devices claim the link {path}: {out[name]} and {target}")
    return dict(sorted(out.items()))


def digest(names: dict[str, str]) -> str:
    """The directory's name: FNV-1a (128 bits, hex) of its sorted ``NAME=target`` lines.  Not a secret and not
    a guard (an existing directory is always checked entry by entry); hashlib would cost every container ~6 ms
    of imports."""
    value = _FNV_OFFSET
    for byte in "".join(f"{name}={target}\n" for name, target in names.items()).encode():
        value = ((value ^ byte) * _FNV_PRIME) & _MASK
    return f"{value:032x}"


def mount(source: str) -> dict[str, object]:
    """The spec's ``mounts`` entry for a prepared directory."""
    return {"destination": DESTINATION, "type": "bind", "source": source, "options": list(MOUNT_OPTIONS)}


def _problem(path: str, st: os.stat_result, owners: tuple[int, ...]) -> str | None:
    from oci_gpu_hook.trust import entry_problem

    return entry_problem(path, st, owners)


def _open_root(root: str, owners: tuple[int, ...], make: bool = True) -> int | None:
    """A descriptor of ``root``, walked from ``/`` without following a symlink; missing components made 0755
    (or, with ``make`` false, None at the first one missing or unreadable)."""
    if not root.startswith("/") or any(p in (".", "..") for p in root.split("/")):
        raise HookError(f"by_path_dir {root!r} is not an absolute, normalized path")
    fd = os.open("/", _OPEN_DIR)
    where = ""
    try:
        for part in [p for p in root.split("/") if p]:
            where += "/" + part
            try:
                child = os.open(part, _OPEN_DIR, dir_fd=fd)
            except (FileNotFoundError, PermissionError) as err:
                if not make:  # nothing there to check, or nothing this user may see: the root that runs it will
                    os.close(fd)
                    return None
                if isinstance(err, PermissionError):
                    raise
                made = True
                try:
                    os.mkdir(part, 0o700, dir_fd=fd)
                except FileExistsError:
                    made = False  # a concurrent create made it: checked below as any other
                child = os.open(part, _OPEN_DIR, dir_fd=fd)
                if made:
                    os.fchmod(child, DIR_MODE)  # the umask aside
            os.close(fd)
            fd = child
            why = _problem(where, os.fstat(fd), owners)
            if why:
                raise HookError(f"refusing to prepare the /dev/dri/by-path links under {root}: {why}")
        return fd
    except OSError as err:
        os.close(fd)
        what = "is a symlink or not a directory" if err.errno in _NOT_DIR else err.strerror
        raise HookError(f"cannot prepare the /dev/dri/by-path links under {root}: {where} {what} (by_path_dir "
                        "must be a directory that only root can write, without symlinks)") from None
    except BaseException:
        os.close(fd)
        raise


def stat_mode(st: os.stat_result) -> int:
    return st.st_mode & 0o7777


def _check(dir_fd: int, path: str, names: dict[str, str], owners: tuple[int, ...]) -> str | None:
    """Why the directory open at ``dir_fd`` is not exactly ``names``, or None."""
    st = os.fstat(dir_fd)
    why = _problem(path, st, owners)
    if why:
        return why
    if stat_mode(st) != DIR_MODE:
        return f"{path} has mode {stat_mode(st):04o}, not {DIR_MODE:04o}"
    found = sorted(os.listdir(dir_fd))
    if found != list(names):
        return f"{path} holds {found}, not exactly {list(names)}"
    for name, target in names.items():
        entry = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if (entry.st_mode & 0o170000) != 0o120000:
            return f"{path}/{name} is not a symlink"
        if entry.st_uid not in owners:
            return f"{path}/{name} is owned by uid {entry.st_uid}"
        if os.readlink(name, dir_fd=dir_fd) != target:
            return f"{path}/{name} points at {os.readlink(name, dir_fd=dir_fd)!r}, not {target!r}"
    return None


def _use(root_fd: int, name: str, path: str, names: dict[str, str], owners: tuple[int, ...],
         touch: bool = True) -> bool:
    """Check the existing ``name`` and touch it; False when it is not there."""
    try:
        fd = os.open(name, _OPEN_DIR, dir_fd=root_fd)
    except FileNotFoundError:
        return False
    except OSError as err:
        what = "is a symlink or not a directory" if err.errno in _NOT_DIR else err.strerror
        raise HookError(f"refusing {path} for the /dev/dri/by-path links: it {what}; remove it") from None
    try:
        why = _check(fd, path, names, owners)
        if why:
            raise HookError(f"refusing {path} for the /dev/dri/by-path links: {why}; remove it")
        if touch:
            os.utime(fd)
    finally:
        os.close(fd)
    return True


def prepare(links: tuple[tuple[str, str], ...], root: str, make: bool = True) -> str:
    """The host directory under ``root`` holding exactly ``links`` (made, or checked if already there).  With
    ``make`` false (``validate``) nothing is written: what is there is checked, what is missing left so."""
    names = entries(links)
    name = digest(names)
    path = f"{root.rstrip('/')}/{name}"
    from oci_gpu_hook.trust import trusted_owners

    owners = trusted_owners()
    root_fd = _open_root(root, owners, make)
    if root_fd is None:
        return path
    try:
        if _use(root_fd, name, path, names, owners, make) or not make:
            return path
        temp = f".tmp-{name}-{os.getpid()}"
        try:
            os.mkdir(temp, 0o700, dir_fd=root_fd)
            fd = os.open(temp, _OPEN_DIR, dir_fd=root_fd)
            try:
                for link, target in names.items():
                    os.symlink(target, link, dir_fd=fd)
                os.fchmod(fd, DIR_MODE)
            finally:
                os.close(fd)
            os.rename(temp, name, src_dir_fd=root_fd, dst_dir_fd=root_fd)
        except OSError as err:
            _remove(root_fd, temp)
            if err.errno not in (errno.EEXIST, errno.ENOTEMPTY) or not _use(root_fd, name, path, names, owners):
                raise HookError(f"cannot prepare {path} for the /dev/dri/by-path links: {err.strerror}") from None
        return path
    finally:
        os.close(root_fd)


def _remove(root_fd: int, temp: str) -> None:
    """Remove our own temporary directory (its symlinks, then it), if it is there."""
    try:
        fd = os.open(temp, _OPEN_DIR, dir_fd=root_fd)
    except OSError:
        return
    try:
        for entry in os.listdir(fd):
            os.unlink(entry, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        os.rmdir(temp, dir_fd=root_fd)
    except OSError:
        pass
