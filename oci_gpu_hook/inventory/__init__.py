"""The host's GPUs, read from sysfs, in a stable order.

Every major:minor comes from a ``dev`` file; none is computed.  A GPU is a
device with a DRM render node (a BMC's VGA has a card node only and is not
one).  GPU index = position in PCI address order (domain:bus:device.function),
as AMD's container toolkit and nvidia-smi number them; DRM card numbers and
KFD node order follow probe order and decide nothing.

The sysfs root is a parameter so that a directory tree that mimics sysfs (see
``examples/hosts/``) stands in for a real host.
"""

from __future__ import annotations

import os

from oci_gpu_hook.core.devices import Node
from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms per container start

if TYPE_CHECKING:
    from collections.abc import Iterable

VENDORS = {"0x1002": "amd", "0x10de": "nvidia", "0x8086": "intel"}
HEX_DIGITS = frozenset("0123456789abcdef")


class Gpu:
    """One schedulable GPU.  ``nodes`` are its own device nodes (card, render)."""

    __slots__ = (
        "card",
        "device_id",
        "driver",
        "index",
        "kfd_gpu_id",
        "location_id",
        "model",
        "numa_node",
        "partition",
        "pci_address",
        "render",
        "unique_id",
        "vendor",
        "vendor_id",
    )

    def __init__(self, *, index: int, vendor: str, vendor_id: str, device_id: str,
                 pci_address: str, numa_node: int | None, driver: str | None,
                 card: Node | None, render: Node, model: str,
                 kfd_gpu_id: int | None = None, unique_id: int | None = None,
                 location_id: int | None = None, partition: int | None = None) -> None:
        self.index = index
        self.vendor = vendor
        self.vendor_id = vendor_id
        self.device_id = device_id
        self.pci_address = pci_address
        self.numa_node = numa_node
        self.driver = driver
        self.card = card
        self.render = render
        self.model = model
        self.kfd_gpu_id = kfd_gpu_id
        self.unique_id = unique_id
        self.location_id = location_id
        # Compute partitions (a later issue) get their own index and name their
        # partition number here; a whole GPU has None.
        self.partition = partition

    @property
    def nodes(self) -> tuple[Node, ...]:
        return (self.card, self.render) if self.card else (self.render,)

    @property
    def unique_id_hex(self) -> str | None:
        return None if self.unique_id is None else f"0x{self.unique_id:016x}"

    def __repr__(self) -> str:
        return f"Gpu(index={self.index}, pci={self.pci_address}, render={self.render.path})"


class Inventory:
    """All GPUs of a host in index order, plus the nodes their vendors share."""

    __slots__ = ("gpus", "shared_nodes", "sysfs_root")

    def __init__(self, gpus: Iterable[Gpu], shared_nodes: dict[str, tuple[Node, ...]],
                 sysfs_root: str) -> None:
        self.gpus = tuple(gpus)
        self.shared_nodes = shared_nodes
        self.sysfs_root = sysfs_root


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def _follow(path: str) -> str:
    """Resolve one sysfs symlink lexically (sysfs links are relative and point at real
    directories), which is ~10x cheaper than os.path.realpath on the start path."""
    try:
        target = os.readlink(path)
    except OSError:
        return path
    return os.path.normpath(os.path.join(os.path.dirname(path), target))


def _read_dev(path: str) -> tuple[int, int]:
    text = _read(path)
    major, sep, minor = (text or "").partition(":")
    if not (sep and major.isdigit() and minor.isdigit()):
        raise HookError(f"cannot read a device number from {path} (got {text!r}, expected MAJOR:MINOR)")
    return int(major), int(minor)


def parse_pci_address(text: str) -> tuple[int, int, int, int] | None:
    """``0000:23:00.0`` -> (domain, bus, device, function); None if it is not one."""
    parts = text.lower().split(":")
    if len(parts) != 3 or "." not in parts[2]:
        return None
    slot, _, function = parts[2].partition(".")
    fields = (parts[0], parts[1], slot, function)
    widths = (4, 2, 2, 1)
    if any(len(f) != w or not set(f) <= HEX_DIGITS for f, w in zip(fields, widths, strict=True)):
        return None
    domain, bus, device, func = (int(f, 16) for f in fields)
    if device > 0x1F or func > 7:
        return None
    return domain, bus, device, func


def _kfd_properties(node_dir: str) -> dict[str, int]:
    props: dict[str, int] = {}
    for line in (_read(os.path.join(node_dir, "properties")) or "").splitlines():
        key, _, value = line.partition(" ")
        value = value.strip()
        if value.isdigit():
            props[key] = int(value)
    return props


def _read_kfd(root: str) -> tuple[Node | None, dict[int, dict[str, int | str]]]:
    """The /dev/kfd node and KFD topology facts keyed by DRM render minor."""
    kfd_dir = os.path.join(root, "class", "kfd", "kfd")
    if not os.path.exists(os.path.join(kfd_dir, "dev")):
        return None, {}
    major, minor = _read_dev(os.path.join(kfd_dir, "dev"))
    by_render: dict[int, dict[str, int | str]] = {}
    nodes_dir = os.path.join(kfd_dir, "topology", "nodes")
    try:
        node_names = os.listdir(nodes_dir)
    except OSError:
        node_names = []
    for name in node_names:
        node_dir = os.path.join(nodes_dir, name)
        props = _kfd_properties(node_dir)
        if not props.get("simd_count") or "drm_render_minor" not in props:
            continue  # CPU node
        facts: dict[str, int | str] = dict(props)
        gpu_id = _read(os.path.join(node_dir, "gpu_id"))
        if gpu_id and gpu_id.isdigit():
            facts["gpu_id"] = int(gpu_id)
        facts["name"] = _read(os.path.join(node_dir, "name")) or ""
        by_render[props["drm_render_minor"]] = facts
    return Node("/dev/kfd", "c", major, minor), by_render


def scan(sysfs_root: str = "/sys") -> Inventory:
    """Read the GPUs under ``sysfs_root``; raise HookError when sysfs is unreadable."""
    root = os.path.abspath(sysfs_root)
    drm = os.path.join(root, "class", "drm")
    try:
        names = os.listdir(drm)
    except FileNotFoundError:
        names = []  # no DRM driver loaded: a host with no GPUs
    except OSError as err:
        raise HookError(f"cannot list {drm}: {err.strerror}") from None

    # PCI device directory -> {"card": (name, dev), "render": (name, dev)}
    by_device: dict[str, dict[str, tuple[str, tuple[int, int]]]] = {}
    for name in names:
        if name.startswith("card") and name[4:].isdigit():
            kind = "card"
        elif name.startswith("renderD") and name[7:].isdigit():
            kind = "render"
        else:
            continue  # connectors (card1-DP-1), version file, ...
        entry = _follow(os.path.join(drm, name))
        device_dir = _follow(os.path.join(entry, "device"))
        by_device.setdefault(device_dir, {})[kind] = (name, _read_dev(os.path.join(entry, "dev")))

    kfd_node, kfd_by_render = _read_kfd(root)
    found = []
    for device_dir, entries in by_device.items():
        if "render" not in entries:
            continue  # a display-only device such as a BMC's VGA: not a GPU
        address = os.path.basename(device_dir)
        pci = parse_pci_address(address)
        if pci is None:
            # Non-PCI DRM devices (virtual drivers; compute partitions, which a
            # later change groups under their PCI parent) are not GPUs yet.
            continue
        found.append((pci, entries["render"][1][1], device_dir, address, entries))
    found.sort()

    gpus = []
    for index, (_pci, render_minor, device_dir, address, entries) in enumerate(found):
        vendor_id = (_read(os.path.join(device_dir, "vendor")) or "").lower()
        numa = _read(os.path.join(device_dir, "numa_node"))
        driver_link = os.path.join(device_dir, "driver")
        driver = os.path.basename(os.readlink(driver_link)) if os.path.islink(driver_link) else None
        card = None
        if "card" in entries:
            name, (major, minor) = entries["card"]
            card = Node(f"/dev/dri/{name}", "c", major, minor)
        name, (major, minor) = entries["render"]
        render = Node(f"/dev/dri/{name}", "c", major, minor)
        kfd = kfd_by_render.get(render_minor, {})
        device_id = (_read(os.path.join(device_dir, "device")) or "").lower()
        gpus.append(Gpu(
            index=index,
            vendor=VENDORS.get(vendor_id, vendor_id or "unknown"),
            vendor_id=vendor_id,
            device_id=device_id,
            pci_address=address,
            numa_node=int(numa) if numa and numa.lstrip("-").isdigit() and int(numa) >= 0 else None,
            driver=driver,
            card=card,
            render=render,
            model=str(kfd.get("name") or f"pci {vendor_id}:{device_id}"),
            kfd_gpu_id=_int_or_none(kfd.get("gpu_id")),
            unique_id=_int_or_none(kfd.get("unique_id")) or None,  # KFD reports 0 when unknown
            location_id=_int_or_none(kfd.get("location_id")),
        ))
    shared = {"amd": (kfd_node,)} if kfd_node else {}
    return Inventory(gpus, shared, root)


def _int_or_none(value: int | str | None) -> int | None:
    return value if isinstance(value, int) else None
