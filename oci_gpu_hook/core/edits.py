"""Container edits: the one value every applier applies (as CDI's ``ContainerEdits``).

Device nodes, the ``/dev/dri/by-path`` links beside them, masked paths and env;
and a driver's user-space files (NVIDIA): read-only bind mounts of host files,
the soname symlinks beside them and the directories the container's ld cache
must list.  Cgroup rules are not stored: :meth:`Edits.rules` derives them from
the nodes (through :meth:`Node.rule`), so no applier can grant a device it does
not make or make one it does not grant.
"""

from __future__ import annotations

from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from typing import Any

    from oci_gpu_hook.core.devices import Node, Rule

BY_PATH_DIR = "/dev/dri/by-path/"
LINK_NODES = ("card", "renderD")  # a by-path link points at ../<one of these><digits>
MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")  # every mount of these edits: a host file, read-only


class Mount:
    """A host file or directory bind-mounted read-only (``MOUNT_OPTIONS``) at ``destination`` in the container."""

    __slots__ = ("destination", "source")

    def __init__(self, source: str, destination: str) -> None:
        self.source = source
        self.destination = destination

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mount) and (self.source, self.destination) == (other.source, other.destination)

    def __hash__(self) -> int:
        return hash((self.source, self.destination))

    def __repr__(self) -> str:
        return f"Mount({self.source!r} -> {self.destination!r})"

    def to_oci(self) -> dict[str, Any]:
        """The OCI ``mounts`` entry (and, with ``hostPath``/``containerPath``, the CDI one)."""
        return {"destination": self.destination, "type": "bind", "source": self.source,
                "options": list(MOUNT_OPTIONS)}

    def to_cdi(self) -> dict[str, Any]:
        return {"hostPath": self.source, "containerPath": self.destination, "type": "bind",
                "options": list(MOUNT_OPTIONS)}


class Edits:
    __slots__ = ("env", "ldcache", "ldlibs", "links", "masked", "mounts", "nodes", "symlinks")

    def __init__(self, nodes: tuple[Node, ...] = (), links: tuple[tuple[str, str], ...] = (),
                 masked: tuple[str, ...] = (), env: tuple[str, ...] = (), mounts: tuple[Mount, ...] = (),
                 symlinks: tuple[tuple[str, str], ...] = (), ldcache: tuple[str, ...] = (),
                 ldlibs: tuple[str, ...] = ()) -> None:
        self.nodes = nodes
        self.links = links  # /dev/dri/by-path links (check_link)
        self.masked = masked
        self.env = env
        self.mounts = mounts
        self.symlinks = symlinks  # a driver's links, PATH -> a file name in the same directory (or ../NAME)
        self.ldcache = ldcache  # directories the container's ld cache must list
        self.ldlibs = ldlibs  # the libraries in them it must list (the ldcache hook's; else library_paths derives)

    def __bool__(self) -> bool:
        return bool(self.nodes or self.links or self.masked or self.env or self.mounts or self.symlinks
                    or self.ldcache)

    def __repr__(self) -> str:
        return (f"Edits(nodes={[n.path for n in self.nodes]}, links={list(self.links)}, masked={list(self.masked)}, "
                f"mounts={[m.destination for m in self.mounts]}, symlinks={list(self.symlinks)})")

    @property
    def library_paths(self) -> tuple[str, ...]:
        """The driver's libraries the container's ld cache lists, by their paths in the container: ``ldlibs`` where
        given, else each mount in an ld cache directory whose name holds ``.so``, else (an ``ldcache`` hook of an
        older spec) each soname link there."""
        if self.ldlibs:
            return self.ldlibs
        folders = set(self.ldcache)
        mounted = tuple(m.destination for m in self.mounts
                        if m.destination.rpartition("/")[0] in folders and ".so" in m.destination.rpartition("/")[2])
        return mounted or tuple(p for p, _ in self.symlinks if p.rpartition("/")[0] in folders)

    @property
    def driver_hook_args(self) -> list[str]:
        """The arguments of the ``ldcache`` createRuntime hook that makes the symlinks and updates the ld cache."""
        return [*(f"{p}={t}" for p, t in self.symlinks), *(f"--folder={d}" for d in self.ldcache),
                *(f"--lib={p}" for p in self.library_paths)]

    @classmethod
    def merged(cls, parts: list[Edits]) -> Edits:
        """All of ``parts`` in order; a path given twice must name the same thing (else a HookError)."""
        nodes: dict[str, Node] = {}
        links: dict[str, str] = {}
        mounts: dict[str, Mount] = {}
        symlinks: dict[str, str] = {}
        for part in parts:
            for node in part.nodes:
                old = nodes.setdefault(node.path, node)
                if old.number != node.number:
                    raise HookError(f"two devices claim {node.path}: {old.type} {old.major}:{old.minor} and "
                                    f"{node.type} {node.major}:{node.minor}")
            for path, target in part.links:
                if links.setdefault(path, target) != target:
                    raise HookError(f"two devices claim the link {path}: {links[path]} and {target}")
            for mount in part.mounts:
                if mounts.setdefault(mount.destination, mount) != mount:
                    raise HookError(f"two mounts claim {mount.destination}: {mounts[mount.destination].source} and "
                                    f"{mount.source}")
            for path, target in part.symlinks:
                if symlinks.setdefault(path, target) != target:
                    raise HookError(f"two symlinks claim {path}: {symlinks[path]} and {target}")
        return cls(tuple(nodes.values()), tuple(links.items()),
                   tuple(dict.fromkeys(m for p in parts for m in p.masked)),
                   tuple(dict.fromkeys(e for p in parts for e in p.env)), tuple(mounts.values()),
                   tuple(symlinks.items()), tuple(dict.fromkeys(d for p in parts for d in p.ldcache)),
                   tuple(dict.fromkeys(lib for p in parts for lib in p.ldlibs)))

    def rules(self, access: str) -> tuple[Rule, ...]:
        """One allow rule per node, derived in the one place a node becomes a rule."""
        return tuple(node.rule(access) for node in self.nodes)


def check_link(path: str, target: str) -> None:
    """Only ``/dev/dri/by-path/NAME -> ../cardN|../renderDN`` links exist in these edits."""
    name = path[len(BY_PATH_DIR):]
    base = target[3:]
    node = any(base.startswith(prefix) and base[len(prefix):].isdigit() for prefix in LINK_NODES)
    if (not path.startswith(BY_PATH_DIR) or not name or "/" in name or name in (".", "..")
            or not target.startswith("../") or not node or not base.isascii()):
        raise HookError(f"refusing the link {path} -> {target}: only /dev/dri/by-path/NAME -> ../cardN or "
                        "../renderDN links are made")


def check_container_path(path: str, what: str) -> None:
    """An absolute, normalized path below ``/`` (no ``.``, ``..``, ``//``, NUL or newline): what a mount
    destination, a symlink or an ld cache directory of these edits may be."""
    parts = path.split("/")
    if (not path.startswith("/") or path == "/" or any(p in ("", ".", "..") for p in parts[1:])
            or "\0" in path or "\n" in path):
        raise HookError(f"refusing the {what} {path!r}: only absolute, normalized paths inside the container are "
                        "used")


def check_symlink(path: str, target: str) -> None:
    """A driver's link: ``/DIR/libcuda.so.1 -> libcuda.so.550.54.15`` (a file in the same directory), or
    ``/DIR/gbm/nvidia-drm_gbm.so -> ../libnvidia-allocator.so.1`` (one in the directory above)."""
    check_container_path(path, "symlink")
    name = target[3:] if target.startswith("../") else target
    if not name or "/" in name or name in (".", "..") or "\0" in name or "\n" in name:
        raise HookError(f"refusing the symlink {path} -> {target}: a driver's link points at a file name in its "
                        "own directory or, as ../NAME, in the one above")
