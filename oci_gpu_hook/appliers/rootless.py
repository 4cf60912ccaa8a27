"""What a rootless runtime makes of a plan, checked before the container is created.

Rootless podman runs its hooks, and its runc, as the user, in a user namespace that maps the user's own uid to
0 and does not map the host's root.  Such a runtime cannot make a device node: for each ``linux.devices`` entry
runc bind-mounts the host's node at that same path, and it has no device cgroup to grant (the container cannot
``mknod`` either, lacking CAP_MKNOD over the host).  What the container can open is then decided by the kernel's
permission check on the host's node for the user's uid and primary gid, without supplementary groups (runc drops
them for the container's process).  So a plan is only right for a rootless container when every node it gives:

- exists on the host at that path, as that very device (type, major and minor): else the runtime would fail at
  its bind mount, or give another device;
- may be opened for reading and writing by the user without the help of a supplementary group.  The tool never
  hands a user a node that the user could not open: a bind mount keeps the host node's permissions, and this
  check turns what would be a container with a GPU it cannot open into one line before the start.

The ``/dev/dri/by-path`` links of a rootless container are prepared under the user's own runtime directory
(``/run/user/UID/oci-gpu-hook/by-path``, the directory systemd-logind makes for each user and rootless podman
itself uses) when ``by_path_dir`` is the default: the default is root's and a rootless hook cannot write there.
A user without one (no logind session: ``su``, a CI runner's service user without linger) gets its GPUs without
the links, and a warning line says why: a convenience never stops a GPU container.
"""

from __future__ import annotations

import os
import stat

from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from collections.abc import Iterable

    from oci_gpu_hook.config import Config
    from oci_gpu_hook.core.devices import Node
    from oci_gpu_hook.oci_spec import ContainerSpec

_ACL_XATTR = "system.posix_acl_access"
_ACL_USER, _ACL_MASK = 0x02, 0x10  # linux/posix_acl.h tags (xattr layout: u32 version, then u16 tag, u16 perm, u32 id)
_RW = 0o6  # read and write, in one class's bits


def _acl_user_bits(path: str, uid: int) -> int | None:
    """The rw bits a POSIX ACL's named-user entry gives ``uid`` on ``path`` (its mask applied), or None."""
    try:
        data = os.getxattr(path, _ACL_XATTR)
    except OSError:
        return None
    entries = [(int.from_bytes(data[i:i + 2], "little"), int.from_bytes(data[i + 2:i + 4], "little"),
                int.from_bytes(data[i + 4:i + 8], "little")) for i in range(4, len(data) - 7, 8)]
    mask = next((perm for tag, perm, _id in entries if tag == _ACL_MASK), 0o7)
    return next((perm & mask & _RW for tag, perm, ident in entries if tag == _ACL_USER and ident == uid), None)


def can_open(path: str, st: os.stat_result, uid: int, gid: int) -> bool:
    """Whether ``uid`` with primary group ``gid`` and no supplementary group may open ``path`` (stat ``st``) for
    reading and writing: the kernel's order (owner, named user in the ACL, group, others), where the first class
    that matches decides."""
    if st.st_uid == uid:
        return st.st_mode >> 6 & _RW == _RW
    named = _acl_user_bits(path, uid)
    if named is not None:
        return named == _RW
    if st.st_gid == gid:
        return st.st_mode >> 3 & _RW == _RW
    return st.st_mode & _RW == _RW


def _host_id(number: int, kind: str) -> str:
    """An id as the host knows it: in a rootless user namespace, through its map (one the namespace does not map is
    the host's root or another user's, which it cannot tell apart); elsewhere as it is."""
    from oci_gpu_hook.trust import id_ranges, identity, parent_id, rootless

    if not rootless():
        return str(number)
    host = parent_id(number, id_ranges(kind))
    if host is None or number == identity()[1]:  # the overflow id: what every id the namespace does not map reads as
        return f"{number} here (a host {kind} this user namespace does not map, such as root's)"
    return str(host)


def node_problem(node: Node, uid: int, gid: int) -> str | None:
    """Why a rootless runtime of ``uid``/``gid`` cannot give ``node`` as the plan means it, or None."""
    kind = "character" if node.type == "c" else "block"
    try:
        st = os.stat(node.path)
    except OSError as err:
        return (f"the host has no {node.path} ({node.type} {node.major}:{node.minor}: {err.strerror}), and a "
                "rootless runtime cannot make device nodes, only bind-mount the host's")
    is_kind = stat.S_ISCHR(st.st_mode) if node.type == "c" else stat.S_ISBLK(st.st_mode)
    if not is_kind or (os.major(st.st_rdev), os.minor(st.st_rdev)) != (node.major, node.minor):
        return (f"the host's {node.path} is not the {kind} device {node.major}:{node.minor} this GPU has; a "
                "rootless runtime would bind-mount another device")
    if not can_open(node.path, st, uid, gid):
        return (f"uid {_host_id(uid, 'uid')} may not open the host's {node.path} for reading and writing (owner "
                f"{_host_id(st.st_uid, 'uid')}, group {_host_id(st.st_gid, 'gid')}, mode "
                f"{stat.S_IMODE(st.st_mode):04o}); a rootless runtime bind-mounts the host's node "
                "and runc drops supplementary groups, so the container could not open it either: give the user "
                "access to the node itself (an ACL, as systemd-logind's uaccess does) or run the container as root")
    return None


def check_nodes(nodes: Iterable[Node], uid: int, gid: int, who: str = "rootless container") -> None:
    """Refuse (one line) a plan whose nodes a rootless runtime of ``uid``/``gid`` could not give as planned."""
    for node in nodes:
        why = node_problem(node, uid, gid)
        if why:
            raise HookError(f"{who}: {why}")


def check_given(spec: ContainerSpec, config: Config) -> None:
    """The same check for the GPU nodes that the spec already lists when the hook sees it (rootless podman applied a
    CDI spec, or ``--device``): a node of one of this host's GPUs that the user could not be given is refused as the
    plan's would be.  Device nodes of anything else are the user's own business and pass untouched."""
    if not spec.present:
        return
    from oci_gpu_hook.core.devices import Node
    from oci_gpu_hook.inventory import scan_host

    inventory = scan_host(config)
    gpus = {node.number for device in inventory.all_devices for node in device.all_nodes}
    gpus.update(node.number for kind in inventory.kinds for node in inventory.shared(kind))
    entries = (spec.raw.get("linux") or {}).get("devices") or []
    given = [Node(e["path"], e["type"], e["major"], e["minor"]) for e in entries
             if isinstance(e, dict) and (e.get("type"), e.get("major"), e.get("minor")) in gpus
             and isinstance(e.get("path"), str)]
    check_nodes(given, os.geteuid(), os.getegid())


def by_path_root(configured: str, default: str) -> str | None:
    """Where a rootless hook prepares the by-path links: the user's runtime directory when ``by_path_dir`` is the
    default (root's, which a rootless hook cannot write), else what the operator configured.  None, after one warning
    line (stderr and the journal), where the user has no runtime directory of its own (no logind session: ``su``, a
    service user without linger): the links are a convenience, and the container gets its GPU without them."""
    if configured != default:
        return configured
    from oci_gpu_hook.trust import host_uid

    runtime_dir = f"/run/user/{host_uid()}"
    try:
        st = os.stat(runtime_dir)
    except OSError as err:
        why = f"there is no {runtime_dir} ({err.strerror}; systemd-logind makes it at login, or loginctl enable-linger)"
    else:
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            return f"{runtime_dir}/oci-gpu-hook/by-path"
        why = f"{runtime_dir} is not a directory of this user's"
    from oci_gpu_hook.log import warn

    warn(f"rootless container: no /dev/dri/by-path links: {why}; the container gets its GPUs without them (set "
         "by_path_dir to a directory the user owns for them)", entry="rootless")
    return None
