"""AMD GPUs and compute partitions (amdgpu + KFD), numbered as AMD's container toolkit numbers them.

A device is a DRM device bound to ``amdgpu`` (a PCI GPU, or one of its compute
partitions) whose render minor has a KFD topology node.  Facts, with their sources, in
``docs/hardware.md#amd`` (``docs/hardware.md#amd-kfd-topology``, ``docs/hardware.md#amd-compute-partitions``,
``docs/hardware.md#amd-numbering``):

* Partition 0 of a GPU is the PCI device's own card and render node; partitions
  1..7 are platform devices ``amdgpu_xcp_N`` (kernel 6.11 and later) or
  ``amdgpu_xcp.N`` (older kernels, DKMS builds), each with its own nodes, no
  ``driver`` link and no ``vendor`` file.  All seven exist in every mode; only
  those with a KFD node are valid.  A render node without one opens with ENOENT
  on real hardware: it is never counted or granted, and is listed as ignored.
* Partitions are grouped to their GPU by the KFD node's ``domain`` and
  ``location_id`` (bus << 8 | device << 3 | function, the partition index ORed
  into the low three bits), never by ``unique_id`` (some systems give
  partitions distinct ones) and never by DRM or KFD numbering (probe order).
* Index order: GPUs by PCI address; within a GPU, partitions by render minor.
* ``/dev/kfd`` (dynamic major, from ``class/kfd/kfd/dev``) is shared by all.

Stable names (:func:`stable_name`): an index is a position, and names other
hardware when a GPU before it leaves or returns; a stable name names the same
hardware for as long as it exists.  A whole (unpartitioned) GPU's is its PCI
address (``0000:23:00.0``); a partition's is its GPU's PCI address and its
partition number, ``<pci>-p<N>`` (``0000:05:00.0-p3``; N is the KFD
``location_id & 7``, 0 to 7), for every partition of a partitioned GPU, p0
included (the PCI address of a partitioned GPU names all its partitions).
The CDI spec, ``list``, the device plugin's Allocate and the ``cdi.k8s.io``
annotation it writes use these; index names stay in the spec for people.

Request entries beyond indices and ranges: a PCI address (``0000:23:00.0`` or
``23:00.0``) or a unique id (``0x3149e0fac5157acf``, ``GPU-3149e0fac5157acf``,
or bare hex longer than 8 digits, zero padding optional, as AMD's toolkit
reads it) names every partition of its GPU; a partition name
(``0000:05:00.0-p3`` or ``05:00.0-p3``) names one partition.
"""

from __future__ import annotations

import os

from oci_gpu_hook.core.devices import Node
from oci_gpu_hook.inventory import Backend, Device, check_strategy
from oci_gpu_hook.inventory.sysfs import HEX_DIGITS, driver, numa_node, parse_pci_address, read, read_dev

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from oci_gpu_hook.inventory import DraValue, Inventory, PluginEntry
    from oci_gpu_hook.inventory.sysfs import DrmDevice

NAME = "amd"
DRIVER = "amdgpu"
XCP_PREFIXES = ("amdgpu_xcp_", "amdgpu_xcp.")
FORMS = "PCI address, partition name (PCI-pN) or unique id"  # request entries besides indices and ranges


class AmdDevice(Device):
    """An AMD GPU or compute partition: the GPU's partition modes (when it has them), its unique id, its XGMI hive
    id and the KFD node's gpu_id."""

    __slots__ = ("compute_mode", "hive_id", "kfd_gpu_id", "memory_mode", "unique_id")

    def __init__(self, *, kind: str, nodes: tuple[Node, ...], links: tuple[tuple[str, str], ...], pci_address: str,
                 sysfs_dir: str, drm_name: str, numa_node: int | None = None, model: str = "", vendor_id: str = "",
                 device_id: str = "", driver: str | None = None, partition: int | None = None,
                 unique_id: int | None = None, compute_mode: str | None = None, memory_mode: str | None = None,
                 hive_id: int | None = None, kfd_gpu_id: int | None = None) -> None:
        # every argument spelt out, never **common: packing them costs ~3 µs a device on every container start
        Device.__init__(self, kind=kind, nodes=nodes, links=links, pci_address=pci_address, sysfs_dir=sysfs_dir,
                        drm_name=drm_name, numa_node=numa_node, model=model, vendor_id=vendor_id, device_id=device_id,
                        driver=driver, partition=partition)
        self.unique_id = unique_id
        self.compute_mode = compute_mode  # CPX, SPX, ... (a partitioned GPU only)
        self.memory_mode = memory_mode  # NPS1, NPS4, ...
        self.hive_id = hive_id
        self.kfd_gpu_id = kfd_gpu_id

    @property
    def mode(self) -> str:
        return "/".join(m for m in (self.compute_mode, self.memory_mode) if m)

    @property
    def unique_id_hex(self) -> str | None:
        return None if self.unique_id is None else f"0x{self.unique_id:016x}"

    def facts(self) -> dict[str, object]:
        return {"compute_mode": self.compute_mode, "memory_mode": self.memory_mode, "unique_id": self.unique_id_hex,
                "hive_id": self.hive_id, "kfd_gpu_id": self.kfd_gpu_id}


def _properties(node_dir: str) -> dict[str, int]:
    props: dict[str, int] = {}
    for line in (read(os.path.join(node_dir, "properties")) or "").splitlines():
        key, _, value = line.partition(" ")
        value = value.strip()
        if value.isdigit() and value.isascii():
            props[key] = int(value)
    return props


def kfd_topology(root: str) -> tuple[Node | None, dict[int, dict[str, int]]]:
    """The /dev/kfd node, and the KFD GPU nodes' properties (plus ``gpu_id``) by DRM render minor."""
    kfd_dir = os.path.join(root, "class", "kfd", "kfd")
    number = read_dev(os.path.join(kfd_dir, "dev"))
    if number is None:
        return None, {}
    nodes_dir = os.path.join(kfd_dir, "topology", "nodes")
    try:
        names = os.listdir(nodes_dir)
    except OSError:
        names = []
    by_render: dict[int, dict[str, int]] = {}
    for name in names:
        node_dir = os.path.join(nodes_dir, name)
        gpu_id = read(os.path.join(node_dir, "gpu_id"))
        if not gpu_id or not gpu_id.isdigit() or int(gpu_id) == 0:
            continue  # a CPU node (libhsakmt's test), or unreadable
        props = _properties(node_dir)
        if "drm_render_minor" not in props or "location_id" not in props:
            continue
        props["gpu_id"] = int(gpu_id)
        by_render[props["drm_render_minor"]] = props
    return Node("/dev/kfd", "c", number[0], number[1]), by_render


def gfx_name(version: int | None) -> str:
    """KFD's gfx_target_version (major*10000 + minor*100 + stepping) as ``gfx1100``, ``gfx942``, ``gfx90a``."""
    if not version:
        return ""
    return f"gfx{version // 10000}{(version // 100) % 100:x}{version % 100:x}"


def _is_partition_device(device: DrmDevice) -> bool:
    return device.pci is None and any(
        device.name.startswith(p) and device.name[len(p):].isdigit() for p in XCP_PREFIXES)


def discover(root: str, drm: list[DrmDevice], _proc_root: str = "/proc",
             _driver_root: str = "/") -> tuple[list[AmdDevice], tuple[Node, ...], dict[str, str]]:
    """AMD devices (unordered), the shared nodes, and every DRM device looked at -> '' or why it is not one."""
    seen: dict[str, str] = {}
    gpus = {}  # (domain, bus << 5 | device) -> the PCI DrmDevice of an amdgpu GPU
    candidates = []
    for device in drm:
        if device.pci is not None and driver(device.directory) == DRIVER:
            domain, bus, slot, _fn = device.pci
            gpus[(domain, bus << 5 | slot)] = device
            candidates.append(device)
        elif _is_partition_device(device):
            candidates.append(device)
    if not candidates:
        return [], (), seen
    kfd, by_render = kfd_topology(root)
    found: list[tuple[tuple[int, int, int, int], int, AmdDevice]] = []
    for device in candidates:
        if device.problem:
            seen[device.directory] = device.problem
            continue
        if device.render is None:
            seen[device.directory] = "amdgpu device without a render node"
            continue
        props = by_render.get(device.render.minor) if kfd else None
        if props is None:
            seen[device.directory] = (f"{os.path.basename(device.render.path)} has no KFD topology node: not a valid "
                                      "compute device or partition in this mode (it would open with ENOENT)")
            continue
        location = props["location_id"]
        parent = gpus.get((props.get("domain", 0), location >> 3))
        if parent is None or parent.pci is None:
            seen[device.directory] = f"KFD location {location:#x} is no amdgpu PCI device here"
            continue
        partitioned = os.path.exists(os.path.join(parent.directory, "current_compute_partition"))
        unique_id = props.get("unique_id") or _pci_unique_id(parent.directory)
        found.append((parent.pci, device.render.minor, AmdDevice(
            kind=NAME, nodes=device.nodes, links=device.links(), pci_address=parent.name,
            sysfs_dir=device.directory, drm_name=device.name, numa_node=numa_node(parent.directory),
            model=gfx_name(props.get("gfx_target_version")) or "amdgpu",
            vendor_id="0x1002", device_id=(read(os.path.join(parent.directory, "device")) or "").lower(),
            driver=DRIVER, partition=location & 7 if partitioned else None, unique_id=unique_id or None,
            compute_mode=read(os.path.join(parent.directory, "current_compute_partition")) if partitioned else None,
            memory_mode=read(os.path.join(parent.directory, "current_memory_partition")) if partitioned else None,
            hive_id=props.get("hive_id") or None, kfd_gpu_id=props.get("gpu_id"),
        )))
        seen[device.directory] = ""
    found.sort(key=lambda item: (item[0], item[1]))
    devices = [device for _pci, _minor, device in found]
    return devices, ((kfd,) if devices and kfd else ()), seen


def _pci_unique_id(directory: str) -> int | None:
    text = read(os.path.join(directory, "unique_id"))
    return int(text, 16) if text and set(text.lower()) <= HEX_DIGITS else None


def _whole_gpus(devices: tuple[Device, ...], chosen: list[Device]) -> tuple[Device, ...]:
    """Every partition of the GPUs ``chosen`` belong to."""
    addresses = {d.pci_address for d in chosen}
    return tuple(d for d in devices if d.pci_address in addresses)


def match(token: str, devices: tuple[AmdDevice, ...]) -> tuple[Device, ...] | str | None:
    """The devices an AMD-specific entry names; None when ``token`` is not of these forms; a str saying why
    when it is of one of them and names nothing."""
    lower = token.lower()
    if ":" in token and "-" in token:
        return _match_partition(lower, devices)
    if ":" in token:
        address = lower if lower.count(":") == 2 else "0000:" + lower
        if parse_pci_address(address) is None:
            return "is not a valid PCI address"
        chosen = [d for d in devices if d.pci_address == address]
        return _whole_gpus(devices, chosen) if chosen else "is not the PCI address of an AMD GPU on this host"
    if lower.startswith(("0x", "gpu-")):
        digits = lower[2:] if lower.startswith("0x") else lower[4:]
    elif len(lower) > 8 and set(lower) <= HEX_DIGITS:
        digits = lower  # AMD's toolkit: more than 8 hex digits (all-digit ones too) is a unique id
    else:
        return None
    if not digits or not set(digits) <= HEX_DIGITS or len(digits.lstrip("0")) > 16:
        return "is not a valid hex unique id"
    wanted = int(digits, 16)
    chosen = [d for d in devices if d.unique_id == wanted]
    return _whole_gpus(devices, chosen) if chosen else "is not the unique id of an AMD GPU on this host"


def stable_name(device: Device) -> str:
    """The name of ``device`` that names the same hardware for as long as it exists: a whole GPU's PCI
    address, a partition's ``<pci>-p<N>`` (module docstring).  The one definition: the CDI spec, ``list``
    and the device plugin take it from here."""
    if device.partition is None:
        return device.pci_address
    return f"{device.pci_address}-p{device.partition}"


def _match_partition(lower: str, devices: tuple[AmdDevice, ...]) -> tuple[Device, ...] | str:
    """``0000:05:00.0-p3`` (or ``05:00.0-p3``): one partition of a partitioned GPU."""
    address, dash_p, number = lower.rpartition("-p")
    if address.count(":") == 1:
        address = "0000:" + address
    if not dash_p or parse_pci_address(address) is None or len(number) != 1 or number not in "01234567":
        return "is not a valid partition name (expected PCI-pN, N 0 to 7, e.g. 0000:05:00.0-p3)"
    gpu = [d for d in devices if d.pci_address == address]
    if not gpu:
        return "is not a partition of an AMD GPU on this host (no AMD GPU at that PCI address)"
    if gpu[0].partition is None:
        return f"is not a partition: the AMD GPU at {address} is not partitioned (its name is {address})"
    chosen = tuple(d for d in gpu if d.partition == int(number))
    if not chosen:
        there = ", ".join(stable_name(d) for d in gpu)
        return f"is not a partition of the AMD GPU at {address} in its mode ({gpu[0].compute_mode}: {there})"
    return chosen


def aliases(devices: tuple[AmdDevice, ...]) -> list[tuple[str, tuple[Device, ...]]]:
    """CDI names besides the indices: each GPU by PCI address and by unique id (all its partitions), and
    each partition of a partitioned GPU by its stable name."""
    out: list[tuple[str, tuple[Device, ...]]] = []
    for address in dict.fromkeys(d.pci_address for d in devices):
        gpu = tuple(d for d in devices if d.pci_address == address)
        out.append((address, gpu))
        unique = {d.unique_id for d in gpu if d.unique_id is not None}
        if len(unique) == 1:
            out.append((f"0x{unique.pop():016x}", gpu))
        out.extend((stable_name(d), (d,)) for d in gpu if d.partition is not None)
    return out


def examples(devices: tuple[AmdDevice, ...]) -> list[str]:
    """What else is valid, for error messages."""
    if not devices:
        return []
    first = devices[0]
    out = [f"PCI addresses like {first.pci_address}"]
    partition = next((d for d in devices if d.partition is not None), None)
    if partition is not None:
        out.append(f"partitions like {stable_name(partition)}")
    if first.unique_id is not None:
        out.append(f"unique ids like {first.unique_id_hex}")
    return out


# --- the device plugin and the DRA driver -------------------------------------------------------------------


def device_id(pci_address: str, partition: int | None) -> str:
    """An AMD device's plugin device ID: the GPU's PCI address (partition 0 too), ``<pci>/p<N>`` for partition N."""
    return pci_address if not partition else f"{pci_address}/p{partition}"


def resource_for(strategy: str, compute_mode: str | None, memory_mode: str | None) -> str:
    """single: everything is amd.com/gpu.  mixed: a partitioned GPU's devices by mode, as AMD's plugin names them
    (amd.com/cpx_nps1, amd.com/spx_nps4), a GPU without partition modes amd.com/gpu."""
    check_strategy(strategy)
    if strategy == "single" or not compute_mode or not memory_mode:
        return BACKEND.resource()
    return BACKEND.resource(f"{compute_mode.strip().lower()}_{memory_mode.strip().lower()}")


def _gpu_dir(inventory: Inventory, device: Device) -> str:
    """The GPU's PCI directory (a partition's DRM device is a platform device: its GPU's is that of partition 0)."""
    for other in inventory.devices(device.kind):
        if other.pci_address == device.pci_address and os.path.basename(other.sysfs_dir) == device.pci_address:
            return other.sysfs_dir
    return os.path.join(inventory.sysfs_root, "bus", "pci", "devices", device.pci_address)


def _nps(mode: str | None) -> int:
    """``NPS4`` -> 4: how many memory partitions the GPU's memory is split into (1 for anything else)."""
    text = (mode or "").strip().upper()
    digits = text[3:]
    return int(digits) if text.startswith("NPS") and digits.isdigit() and digits.isascii() and int(digits) > 0 else 1


class Amd(Backend):
    """AMD GPUs and compute partitions (module docstring)."""

    name = NAME
    forms = FORMS
    plugin = True
    plugin_always = True  # amd.com/gpu is served before any AMD device is seen (the kubelet then shows 0)

    discover = staticmethod(discover)  # type: ignore[assignment]
    stable_name = staticmethod(stable_name)  # type: ignore[assignment]
    match = staticmethod(match)  # type: ignore[assignment]
    aliases = staticmethod(aliases)  # type: ignore[assignment]
    examples = staticmethod(examples)  # type: ignore[assignment]

    def plugin_devices(self, inventory: Inventory, strategy: str) -> tuple[list[PluginEntry], list[str]]:
        """By PCI address (``<pci>/p<N>``), the resource by partition mode with the mixed strategy."""
        devices: tuple[AmdDevice, ...] = inventory.devices(NAME)  # type: ignore[assignment]
        return [(d, device_id(d.pci_address, d.partition), resource_for(strategy, d.compute_mode, d.memory_mode))
                for d in devices], []

    def dra_describe(self, inventory: Inventory, device: Device,
                     whole: bool) -> tuple[dict[str, DraValue], dict[str, int]]:
        """The gfx target, the board's name, the partition modes, the XGMI hive and the VRAM of the device's memory
        partition (the GPU's divided by its NPS count; a whole GPU's all of it)."""
        assert isinstance(device, AmdDevice)
        gpu = _gpu_dir(inventory, device)
        attributes: dict[str, DraValue] = {
            "architecture": device.model if device.model.startswith("gfx") else None,
            "productName": read(os.path.join(gpu, "product_name")),
            "computePartition": device.compute_mode,
            "memoryPartition": device.memory_mode,
            "hiveId": f"0x{device.hive_id:x}" if device.hive_id else None,  # a string: it may pass int64
        }
        vram = read(os.path.join(gpu, "mem_info_vram_total"))
        capacity = {}
        if vram and vram.isdigit() and int(vram) > 0:
            share = int(vram) // _nps(device.memory_mode) if device.partition is not None and not whole else int(vram)
            capacity["memory"] = share
        return attributes, capacity


BACKEND = Amd()
