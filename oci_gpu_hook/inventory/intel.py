"""Intel GPUs (``i915`` and ``xe``): card and render node, no shared node.

As Intel's device plugin finds them: a PCI device of vendor ``0x8086`` bound to
``i915`` or ``xe`` with DRM minors (``controlD`` links and connectors are not
nodes).  Index order is PCI address order.  Names follow Intel's CDI naming
(``cardN``, the card node's name) besides indices; request entries are
indices, ranges, ``cardN`` and PCI addresses.  The stable name of a GPU
(:func:`stable_name`) is its PCI address: ``cardN`` follows probe order and
can change at a reboot or a driver reload.
"""

from __future__ import annotations

import os

from oci_gpu_hook.inventory import Backend, Device
from oci_gpu_hook.inventory.sysfs import driver, numa_node, parse_pci_address, read

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from oci_gpu_hook.core.devices import Node
    from oci_gpu_hook.inventory import DraValue, Inventory
    from oci_gpu_hook.inventory.sysfs import DrmDevice

NAME = "intel"
VENDOR = "0x8086"
DRIVERS = ("i915", "xe")
FORMS = "card name (cardN) or PCI address"  # request entries besides indices and ranges


def discover(root: str, drm: list[DrmDevice], _proc_root: str = "/proc",
             _driver_root: str = "/") -> tuple[list[Device], tuple[Node, ...], dict[str, str]]:
    seen: dict[str, str] = {}
    found = []
    for device in drm:
        if device.pci is None or (read(os.path.join(device.directory, "vendor")) or "").lower() != VENDOR:
            continue
        bound = driver(device.directory)
        if bound not in DRIVERS:
            continue
        if device.problem or device.render is None or device.card is None:
            seen[device.directory] = device.problem or "Intel GPU without a card and a render node"
            continue
        found.append((device.pci, Device(
            kind=NAME, nodes=device.nodes, links=device.links(), pci_address=device.name,
            sysfs_dir=device.directory, drm_name=device.name, numa_node=numa_node(device.directory),
            model=bound,
            vendor_id=VENDOR, device_id=(read(os.path.join(device.directory, "device")) or "").lower(),
            driver=bound)))
        seen[device.directory] = ""
    found.sort(key=lambda item: item[0])
    return [device for _pci, device in found], (), seen


def card_name(device: Device) -> str:
    card = device.card
    return os.path.basename(card.path) if card else ""


def stable_name(device: Device) -> str:
    """The name that names the same GPU for as long as it exists: its PCI address."""
    return device.pci_address


def match(token: str, devices: tuple[Device, ...]) -> tuple[Device, ...] | str | None:
    lower = token.lower()
    if lower.startswith("card") and lower[4:].isdigit():
        chosen = tuple(d for d in devices if card_name(d) == lower)
        return chosen or "is not the card of an Intel GPU on this host"
    if ":" in token:
        address = lower if lower.count(":") == 2 else "0000:" + lower
        if parse_pci_address(address) is None:
            return "is not a valid PCI address"
        chosen = tuple(d for d in devices if d.pci_address == address)
        return chosen or "is not the PCI address of an Intel GPU on this host"
    return None


def aliases(devices: tuple[Device, ...]) -> list[tuple[str, tuple[Device, ...]]]:
    """Intel's CDI names (``cardN``) and PCI addresses."""
    out: list[tuple[str, tuple[Device, ...]]] = []
    for device in devices:
        out.append((card_name(device), (device,)))
        out.append((device.pci_address, (device,)))
    return out


def examples(devices: tuple[Device, ...]) -> list[str]:
    if not devices:
        return []
    return [f"card names like {card_name(devices[0])}", f"PCI addresses like {devices[0].pci_address}"]


def vram(device: Device) -> int:
    """Bytes of VRAM where the driver says it: xe per tile (``tile<N>/physical_vram_size_bytes`` of the PCI device),
    i915 (its DKMS backports) as the card's ``lmem_total_bytes``; 0 for none (an integrated GPU)."""
    tiles = []
    try:
        tiles = sorted(n for n in os.listdir(device.sysfs_dir) if n.startswith("tile") and _decimal(n[4:]))
    except OSError:
        pass
    sizes = [read(os.path.join(device.sysfs_dir, t, "physical_vram_size_bytes")) or "" for t in tiles]
    total = sum(int(v, 0) for v in sizes if _decimal(v) or (v[:2] == "0x" and _hex(v[2:])))
    card = device.card
    if not total and card is not None:
        lmem = read(os.path.join(device.sysfs_dir, "drm", os.path.basename(card.path), "lmem_total_bytes")) or ""
        total = int(lmem) if lmem.isdigit() else 0
    return total


def _decimal(text: str) -> bool:
    return text.isdigit() and text.isascii()


def _hex(text: str) -> bool:
    return bool(text) and text.isascii() and all(c in "0123456789abcdefABCDEF" for c in text)


class Intel(Backend):
    """Intel GPUs (module docstring)."""

    name = NAME
    forms = FORMS

    discover = staticmethod(discover)  # type: ignore[assignment]
    stable_name = staticmethod(stable_name)  # type: ignore[assignment]
    match = staticmethod(match)  # type: ignore[assignment]
    aliases = staticmethod(aliases)  # type: ignore[assignment]
    examples = staticmethod(examples)  # type: ignore[assignment]

    def dra_describe(self, inventory: Inventory, device: Device,
                     whole: bool) -> tuple[dict[str, DraValue], dict[str, int]]:
        memory = vram(device)
        return {}, ({"memory": memory} if memory > 0 else {})


BACKEND = Intel()
