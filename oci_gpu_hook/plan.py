"""One set of container edits, computed once from inventory + request + config.

Every entry point applies this same value: the spec rewrite (``dry-run``,
``precreate``, ``oci-gpu-runtime``) writes it into config.json; the live
``prestart`` hook makes the nodes and extends the device cgroup.  Like CDI's
container edits, it says *what* the container gets, never *how*.
"""

from __future__ import annotations

from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms per container start

if TYPE_CHECKING:
    from typing import Any

    from oci_gpu_hook.config import Config
    from oci_gpu_hook.inventory import DeviceNode, Gpu, Inventory
    from oci_gpu_hook.request import Request


class NodeEdit:
    """A device node to create in the container."""

    __slots__ = ("file_mode", "gid", "major", "minor", "path", "type", "uid")

    def __init__(self, path: str, type: str, major: int, minor: int, file_mode: int, uid: int, gid: int) -> None:
        self.path = path
        self.type = type
        self.major = major
        self.minor = minor
        self.file_mode = file_mode
        self.uid = uid
        self.gid = gid

    def to_oci(self) -> dict[str, Any]:
        """The ``linux.devices`` entry (fileMode is a decimal number in JSON)."""
        return {"path": self.path, "type": self.type, "major": self.major, "minor": self.minor,
                "fileMode": self.file_mode, "uid": self.uid, "gid": self.gid}


class DeviceRule:
    """A device cgroup rule; ``None`` major/minor means any (``*``)."""

    __slots__ = ("access", "allow", "major", "minor", "type")

    def __init__(self, allow: bool, type: str, major: int | None, minor: int | None, access: str) -> None:
        self.allow = allow
        self.type = type
        self.major = major
        self.minor = minor
        self.access = access

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeviceRule) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    def __repr__(self) -> str:
        return f"DeviceRule({'allow' if self.allow else 'deny'} {self.v1_line()})"

    def key(self) -> tuple[bool, str, int | None, int | None, str]:
        return (self.allow, self.type, self.major, self.minor, "".join(sorted(self.access)))

    def v1_line(self) -> str:
        """``c 226:128 rwm``, the cgroup v1 ``devices.allow``/``devices.deny`` format."""
        major = "*" if self.major is None else str(self.major)
        minor = "*" if self.minor is None else str(self.minor)
        return f"{self.type} {major}:{minor} {self.access}"

    def to_oci(self) -> dict[str, Any]:
        """The ``linux.resources.devices`` entry."""
        rule: dict[str, Any] = {"allow": self.allow, "type": self.type}
        if self.major is not None:
            rule["major"] = self.major
        if self.minor is not None:
            rule["minor"] = self.minor
        rule["access"] = self.access
        return rule

    @classmethod
    def from_oci(cls, entry: dict[str, Any]) -> DeviceRule:
        """Read a ``linux.resources.devices`` entry: type and access default to all; a missing or
        -1 major/minor means any, as in runc.  A wrong type is a HookError."""
        kind, access = entry.get("type") or "a", entry.get("access") or "rwm"
        numbers = [entry.get("major"), entry.get("minor")]
        if (not isinstance(entry.get("allow", False), bool) or kind not in ("a", "b", "c")
                or not isinstance(access, str) or not set(access) <= set("rwm")
                or not all(n is None or (isinstance(n, int) and not isinstance(n, bool)) for n in numbers)):
            raise HookError(f"config.json: linux.resources.devices has a malformed entry {entry!r}")
        major, minor = (None if n is None or n == -1 else n for n in numbers)
        return cls(bool(entry.get("allow")), kind, major, minor, access)

    def covers(self, type: str, major: int, minor: int) -> bool:
        """Does this rule match device ``type major:minor``?"""
        return ((self.type == "a" or self.type == type)
                and (self.major is None or self.major == major)
                and (self.minor is None or self.minor == minor))


class Plan:
    """The GPUs granted and the edits that grant them.  Empty = touch nothing."""

    __slots__ = ("gpus", "nodes", "request", "rules")

    def __init__(self, request: Request, gpus: tuple[Gpu, ...], nodes: tuple[NodeEdit, ...],
                 rules: tuple[DeviceRule, ...]) -> None:
        self.request = request
        self.gpus = gpus
        self.nodes = nodes
        self.rules = rules

    def __bool__(self) -> bool:
        return bool(self.nodes)

    def summary(self) -> str:
        """``gpu 1 (0000:23:00.0): /dev/dri/card2 /dev/dri/renderD129 /dev/kfd``."""
        if not self.gpus:
            return "no GPU requested" + (f" ({self.request.note})" if self.request.note else "")
        gpus = ", ".join(f"{g.index} ({g.pci_address})" for g in self.gpus)
        return f"gpu {gpus}: " + " ".join(n.path for n in self.nodes)


def build_plan(inventory: Inventory, request: Request, config: Config) -> Plan:
    """Nodes (each GPU's card and render node, then the vendors' shared nodes) and one allow rule per node."""
    wanted: list[DeviceNode] = []
    for gpu in request.gpus:
        wanted.extend(gpu.nodes)
    for vendor in sorted({gpu.vendor for gpu in request.gpus}):
        wanted.extend(inventory.shared_nodes.get(vendor, ()))
    nodes = tuple(node_edit(n, config) for n in dict.fromkeys(wanted))
    rules = tuple(DeviceRule(True, n.type, n.major, n.minor, config.cgroup_access) for n in nodes)
    return Plan(request, request.gpus, nodes, rules)


def node_edit(node: DeviceNode, config: Config) -> NodeEdit:
    """A host node as the container gets it: the configured mode and owner."""
    return NodeEdit(node.path, node.type, node.major, node.minor, config.device_file_mode, config.device_uid,
                    config.device_gid)


def plan_for_spec(spec: Any, config: Config, devices: str | None = None) -> Plan:
    """The plan for a container's config.json.

    ``devices`` (``dry-run --devices``) replaces the request the spec carries.
    When nothing is requested sysfs is not even read and the plan is empty.
    """
    from oci_gpu_hook.inventory import scan
    from oci_gpu_hook.request import NO_GPU, Ask, Request, requested, resolve_ask
    from oci_gpu_hook.spec import annotations, process_env

    if devices is not None:
        ask = Ask("--devices", [devices]) if devices.strip().lower() not in NO_GPU else None
    else:
        ask = requested(process_env(spec), annotations(spec), config.request_env, config.cdi_kind,
                        config.allow_env_requests)
    if ask is None or not ask.values:
        return Plan(Request(ask.source if ask else "env", None, (), ask.note if ask else ""), (), (), ())
    inventory = scan(config.sysfs_root)
    return build_plan(inventory, resolve_ask(ask, inventory), config)
