"""Device nodes made inside a running container's rootfs, safe against a hostile image.

Runs in a child process that enters the container's mount namespace
(``/proc/<pid>/ns/mnt``), so the container's own ``/dev`` (a tmpfs that exists
only there) is what gets the nodes.  Every directory below the rootfs is opened
by the one walk's REFUSE mode (:mod:`oci_gpu_hook.core.inroot`: one component
at a time, ``O_NOFOLLOW``, ``*at`` calls on directory file descriptors): a
symlink anywhere (``/dev``, ``/dev/dri``, ``/dev/dri/by-path``, or the node
itself) is refused, never followed, so nothing is ever written outside the
container's root.  A node already there with the planned device
number is left alone; anything else in its place is an error.
"""

from __future__ import annotations

import os
import stat

from oci_gpu_hook.core import inroot
from oci_gpu_hook.core.edits import check_link
from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from oci_gpu_hook.core.devices import Node
    from oci_gpu_hook.core.edits import Edits

CLONE_NEWNS = 0x00020000


def _walk(root_fd: int, directory: str) -> int:
    """fd of ``directory`` (absolute, inside the container), made where missing: the one walk's REFUSE mode
    (:mod:`oci_gpu_hook.core.inroot`: no symlink, no '.' or '..', every component a real directory)."""
    return inroot.open_dir(root_fd, directory, inroot.REFUSE, make=True)[0]


def _make_node(dir_fd: int, name: str, node: Node) -> str:
    kind = stat.S_IFCHR if node.type == "c" else stat.S_IFBLK
    rdev = os.makedev(node.major, node.minor)
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None:
        if stat.S_IFMT(st.st_mode) == kind and st.st_rdev == rdev:
            return "present"
        found = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(
            st.st_mode) else inroot.describe(st.st_mode)
        raise HookError(f"{node.path} already exists in the container as {found}, "
                        f"not {node.type} {node.major}:{node.minor}; refusing to replace it")
    os.mknod(name, kind | node.file_mode, rdev, dir_fd=dir_fd)
    os.chown(name, node.uid, node.gid, dir_fd=dir_fd, follow_symlinks=False)
    return "made"


def _make_symlink(dir_fd: int, name: str, target: str, shown: str) -> None:
    try:
        current = os.readlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        os.symlink(target, name, dir_fd=dir_fd)
        return
    except OSError:
        raise HookError(f"{shown} already exists in the container and is not a symlink") from None
    if current != target:
        raise HookError(f"{shown} already points to {current!r}, not {target!r}")


def make_nodes(root_fd: int, edits: Edits) -> list[str]:
    """Create the nodes and by-path links of ``edits`` under the rootfs ``root_fd``; return what was done."""
    done = []
    for node in edits.nodes:
        directory, _, name = node.path.rpartition("/")
        if not name or not node.path.startswith("/"):
            raise HookError(f"refusing device path {node.path!r}")
        dir_fd = _walk(root_fd, directory)
        try:
            done.append(f"{node.path} {_make_node(dir_fd, name, node)}")
        finally:
            os.close(dir_fd)
    for link, target in edits.links:
        check_link(link, target)
        directory, _, name = link.rpartition("/")
        dir_fd = _walk(root_fd, directory)
        try:
            _make_symlink(dir_fd, name, target, link)
        finally:
            os.close(dir_fd)
    return done


def enter_mount_namespace(ns_fd: int) -> None:
    """Enter the mount namespace open at ``ns_fd``: os.setns on Python 3.12+, libc's through ctypes before that;
    OSError if the kernel refuses.  The one entry into a container's mount namespace: the live hook's child here,
    the planner's worker (:func:`oci_gpu_hook.serve.planner.worker.enter`)."""
    if hasattr(os, "setns"):
        os.setns(ns_fd, CLONE_NEWNS)
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(ns_fd, CLONE_NEWNS) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def apply_in_container(pid: int, rootfs: str, edits: Edits) -> list[str]:
    """Enter ``pid``'s mount namespace in a child process and make the nodes and links under ``rootfs``; a
    driver's mounts, soname links and ld cache too (:mod:`oci_gpu_hook.appliers.mounts`)."""
    try:
        ns_fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as err:
        raise HookError(f"cannot open the mount namespace of container process {pid}: {err.strerror} "
                        "(is the container still there?)") from None
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child; its outcome is checked through the pipe
        code = 1
        try:
            os.close(read_end)
            driver = bool(edits.mounts or edits.symlinks or edits.ldcache)
            if driver:
                from oci_gpu_hook.appliers import mounts

                trees = [mounts.clone_tree(m) for m in edits.mounts]  # in the host's namespace, before setns
            try:
                enter_mount_namespace(ns_fd)
            except OSError as err:
                raise HookError(f"cannot enter the mount namespace of process {pid}: {err.strerror}") from None
            os.umask(0)
            try:
                root_fd = os.open(rootfs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError as err:
                raise HookError(f"cannot open the container's rootfs {rootfs}: {err.strerror}") from None
            done = make_nodes(root_fd, edits)
            if driver:
                done += mounts.apply(root_fd, rootfs, edits, trees)
            message = "ok\n" + "\n".join(done)
            code = 0
        except HookError as err:
            message = str(err)
        except BaseException as err:
            message = f"internal error in the namespace helper: {type(err).__name__}: {err}"
        try:
            os.write(write_end, message.encode())
        finally:
            os._exit(code)
    os.close(write_end)
    os.close(ns_fd)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(child, 0)
    text = b"".join(chunks).decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        raise HookError(text or f"the namespace helper failed (status {status})")
    return text.splitlines()[1:]
