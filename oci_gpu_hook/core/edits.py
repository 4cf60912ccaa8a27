"""Container edits: the one value every applier applies (as CDI's ``ContainerEdits``).

Device nodes, the ``/dev/dri/by-path`` links beside them, masked paths and env.
Cgroup rules are not stored: :meth:`Edits.rules` derives them from the nodes
(through :meth:`Node.rule`), so no applier can grant a device it does not make
or make one it does not grant.
"""

from __future__ import annotations

from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms per container start

if TYPE_CHECKING:
    from oci_gpu_hook.core.devices import Node, Rule

BY_PATH_DIR = "/dev/dri/by-path/"
LINK_NODES = ("card", "renderD")  # a by-path link points at ../<one of these><digits>


class Edits:
    __slots__ = ("env", "links", "masked", "nodes")

    def __init__(self, nodes: tuple[Node, ...] = (), links: tuple[tuple[str, str], ...] = (),
                 masked: tuple[str, ...] = (), env: tuple[str, ...] = ()) -> None:
        self.nodes = nodes
        self.links = links
        self.masked = masked
        self.env = env

    def __bool__(self) -> bool:
        return bool(self.nodes or self.links or self.masked or self.env)

    def __repr__(self) -> str:
        return f"Edits(nodes={[n.path for n in self.nodes]}, links={list(self.links)}, masked={list(self.masked)})"

    @classmethod
    def merged(cls, parts: list[Edits]) -> Edits:
        """All of ``parts`` in order; a path given twice must name the same thing (else a HookError)."""
        nodes: dict[str, Node] = {}
        links: dict[str, str] = {}
        for part in parts:
            for node in part.nodes:
                old = nodes.setdefault(node.path, node)
                if old.number != node.number:
                    raise HookError(f"two devices claim {node.path}: {old.type} {old.major}:{old.minor} and "
                                    f"{node.type} {node.major}:{node.minor}")
            for path, target in part.links:
                if links.setdefault(path, target) != target:
                    raise HookError(f"two devices claim the link {path}: {links[path]} and {target}")
        return cls(tuple(nodes.values()), tuple(links.items()),
                   tuple(dict.fromkeys(m for p in parts for m in p.masked)),
                   tuple(dict.fromkeys(e for p in parts for e in p.env)))

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
