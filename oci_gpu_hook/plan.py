"""One set of container edits, computed once from inventory + request + config.

Every entry point applies this same value: the spec rewrite (``dry-run``,
``precreate``, ``oci-gpu-runtime``) writes it into config.json; the live
``prestart`` hook makes the nodes and extends the device cgroup.  Like CDI's
container edits, it says *what* the container gets, never *how*.
"""

from __future__ import annotations

from oci_gpu_hook.core.devices import Node, Rule

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms per container start

if TYPE_CHECKING:
    from typing import Any

    from oci_gpu_hook.config import Config
    from oci_gpu_hook.inventory import Gpu, Inventory
    from oci_gpu_hook.request import Request


class Plan:
    """The GPUs granted and the edits that grant them.  Empty = touch nothing."""

    __slots__ = ("gpus", "nodes", "request", "rules")

    def __init__(self, request: Request, gpus: tuple[Gpu, ...], nodes: tuple[Node, ...],
                 rules: tuple[Rule, ...]) -> None:
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
    wanted: list[Node] = []
    for gpu in request.gpus:
        wanted.extend(gpu.nodes)
    for vendor in sorted({gpu.vendor for gpu in request.gpus}):
        wanted.extend(inventory.shared_nodes.get(vendor, ()))
    nodes = tuple(node_edit(n, config) for n in dict.fromkeys(wanted))
    rules = tuple(n.rule(config.cgroup_access) for n in nodes)
    return Plan(request, request.gpus, nodes, rules)


def node_edit(node: Node, config: Config) -> Node:
    """A host node as the container gets it: the configured mode and owner."""
    return node.made(config.device_file_mode, config.device_uid, config.device_gid)


def plan_for_spec(spec: Any, config: Config, devices: str | None = None) -> Plan:
    """The plan for a container's config.json.

    ``devices`` (``dry-run --devices``) replaces the request the spec carries.
    When nothing is requested sysfs is not even read and the plan is empty.
    """
    from oci_gpu_hook.appliers.ocispec import annotations, process_env
    from oci_gpu_hook.inventory import scan
    from oci_gpu_hook.request import NO_GPU, Ask, Request, requested, resolve_ask

    if devices is not None:
        ask = Ask("--devices", [devices]) if devices.strip().lower() not in NO_GPU else None
    else:
        ask = requested(process_env(spec), annotations(spec), config.request_env, config.cdi_kind,
                        config.allow_env_requests)
    if ask is None or not ask.values:
        return Plan(Request(ask.source if ask else "env", None, (), ask.note if ask else ""), (), (), ())
    inventory = scan(config.sysfs_root)
    return build_plan(inventory, resolve_ask(ask, inventory), config)
