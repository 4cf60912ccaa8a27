"""What the DRA driver publishes: one :class:`DraDevice` per allocatable device of the inventory, with the
attributes a claim selects on.

:func:`build` is the only place that turns the inventory into DRA devices.  A
device is what a container can be given on its own: a whole GPU, an AMD compute
partition (an XCP, in the GPU's current mode), an NVIDIA MIG device.  A GPU
split into partitions or MIG devices is published as its parts only (so no
device and its parts are ever both allocatable; a mode change republishes the
GPU's devices), each with its GPU as the ``parent`` attribute.

Device names are DNS labels derived from the device's stable name
(:func:`oci_gpu_hook.inventory.stable_name`), never from an index: the stable
name lower-cased with ``:`` and ``.`` turned into ``-``, ``gpu-`` in front when
it does not start with a letter (``gpu-0000-05-00-0``, ``gpu-0000-05-00-0-p3``,
``gpu-8f3c...`` for ``GPU-8F3C...``, ``mig-...``).  So a name allocated once
names the same hardware while other devices come and go, or the device is gone
and a prepare that asks for it is refused.

Attributes (unqualified, so in the driver's own domain: CEL reads them as
``device.attributes["<driver>"].<name>``): ``vendor`` (amd, intel, nvidia),
``type`` (gpu, partition, mig), ``model`` (AMD: the gfx target; NVIDIA: the
driver's model name; Intel: the driver), ``productName`` (AMD: the board's
``product_name`` where sysfs has it), ``architecture`` (AMD: the gfx target),
``pciAddress`` (the GPU's, for a part too), ``pciDeviceId``, ``stableName``
(the device's stable CDI name), ``parent`` (a part's GPU: its stable name),
``uuid`` (NVIDIA), ``numaNode``, ``partitionIndex``, ``computePartition`` and
``memoryPartition`` (AMD: ``CPX``, ``NPS1``), ``migProfile`` (NVIDIA:
``1g.10gb``), ``hiveId`` (AMD XGMI, hex), ``driver``, ``driverVersion`` (a version
when it is one). Capacity ``memory`` (AMD: the VRAM of the device's memory
partition: the GPU's VRAM divided by its NPS count).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from oci_gpu_hook.inventory import Device, Inventory, stable_name
from oci_gpu_hook.inventory.sysfs import read

Attribute = tuple[str, str | int | bool]  # (type: string|int|bool|version, value)
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")
VENDORS = {"amd": "amd", "intel": "intel", "nvidia": "nvidia"}
MAX_STRING = 64  # the API's limit on a string or version attribute
# Every attribute this driver may publish (the module docstring says what each is): claims and DeviceClasses
# select on these names.
ATTRIBUTES = ("vendor", "type", "model", "productName", "architecture", "pciAddress", "pciDeviceId", "stableName",
              "parent", "uuid", "numaNode", "partitionIndex", "computePartition", "memoryPartition", "migProfile",
              "hiveId", "driver", "driverVersion")
CAPACITIES = ("memory",)


@dataclass(frozen=True)
class DraDevice:
    name: str  # DNS label, unique on the node
    kind: str  # the inventory backend
    stable: str  # the stable CDI name
    attributes: dict[str, Attribute] = field(default_factory=dict)
    capacity: dict[str, str] = field(default_factory=dict)  # name -> quantity
    device: Device | None = field(default=None, compare=False, repr=False)  # the inventory's, from the same scan

    def fingerprint(self) -> tuple[object, ...]:
        """What a republish compares: the published fields (a changed one bumps the pool generation)."""
        return self.name, sorted(self.attributes.items()), sorted(self.capacity.items())


def device_name(stable: str) -> str:
    """The DNS label of a stable name: ``0000:05:00.0-p3`` -> ``gpu-0000-05-00-0-p3``, ``MIG-ab..`` -> ``mig-ab..``."""
    name = re.sub(r"[^a-z0-9-]", "-", stable.lower()).strip("-")
    if not name[:1].isalpha():
        name = f"gpu-{name}"
    return name


def quantity(size: int) -> str:
    """Bytes as a Kubernetes quantity in its canonical form: ``192Gi`` where the binary suffix divides it."""
    for suffix, unit in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if size >= unit and size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def _string(value: str | None) -> Attribute | None:
    if not value:
        return None
    text = " ".join(value.split())
    return ("string", text[:MAX_STRING]) if text else None


def _version(value: str | None) -> Attribute | None:
    if not value:
        return None
    if SEMVER.match(value):
        return "version", value
    return _string(value)


def _nvidia_driver_version(proc_root: str) -> str | None:
    """``535.104.05`` from /proc/driver/nvidia/version (the first word that is a dotted number)."""
    text = read(os.path.join(proc_root, "driver", "nvidia", "version")) or ""
    line = text.splitlines()[0] if text else ""
    return next((w for w in line.split() if re.fullmatch(r"\d+(\.\d+)+", w)), None)


def _module_version(sysfs_root: str, driver: str | None) -> str | None:
    return read(os.path.join(sysfs_root, "module", driver, "version")) if driver else None


def _gpu_dir(inventory: Inventory, device: Device) -> str:
    """The GPU's PCI directory (a partition's DRM device is a platform device: its GPU's is that of partition 0)."""
    for other in inventory.devices(device.kind):
        if other.pci_address == device.pci_address and os.path.basename(other.sysfs_dir) == device.pci_address:
            return other.sysfs_dir
    return os.path.join(inventory.sysfs_root, "bus", "pci", "devices", device.pci_address)


def _nps(mode: str | None) -> int:
    match = re.fullmatch(r"NPS(\d+)", (mode or "").strip().upper())
    return int(match.group(1)) if match and int(match.group(1)) > 0 else 1


def _amd(inventory: Inventory, device: Device, attributes: dict[str, Attribute | None],
         capacity: dict[str, str]) -> None:
    gpu = _gpu_dir(inventory, device)
    attributes["architecture"] = _string(device.model if device.model.startswith("gfx") else None)
    attributes["productName"] = _string(read(os.path.join(gpu, "product_name")))
    attributes["computePartition"] = _string(device.compute_mode)
    attributes["memoryPartition"] = _string(device.memory_mode)
    attributes["hiveId"] = ("string", f"0x{device.hive_id:x}") if device.hive_id else None  # may pass int64
    vram = read(os.path.join(gpu, "mem_info_vram_total"))
    if vram and vram.isdigit() and int(vram) > 0:
        share = int(vram) // _nps(device.memory_mode) if device.partition is not None else int(vram)
        capacity["memory"] = quantity(share)


def _nvidia(inventory: Inventory, device: Device, attributes: dict[str, Attribute | None]) -> None:
    from oci_gpu_hook.inventory import nvml

    attributes["uuid"] = _string(device.uuid)
    if device.mig is not None:
        attributes["migProfile"] = _string(nvml.profile(device))


def _parent(inventory: Inventory, device: Device) -> str | None:
    """A part's GPU, by its stable name."""
    if device.mig is not None:
        gpu = next((d for d in inventory.devices(device.kind) if d.mig is None and d.index == device.parent), None)
        return stable_name(gpu) if gpu is not None else None
    return device.pci_address if device.partition is not None else None


def _parts(device: Device) -> str:
    if device.mig is not None:
        return "mig"
    return "partition" if device.partition is not None else "gpu"


def build(inventory: Inventory) -> tuple[list[DraDevice], list[str]]:
    """Every allocatable device of the inventory (in the inventory's order), and a line per device left out."""
    out: list[DraDevice] = []
    notes: list[str] = []
    for kind, found in inventory.kinds.items():
        devices = found.devices
        if kind == "nvidia":
            from oci_gpu_hook.inventory import nvml

            migs = [d for d in devices if d.mig is not None]
            problem = nvml.refresh(migs) if migs else ""
            if problem:
                notes.append(f"{len(migs)} MIG device(s) left out: only NVML names them, and {problem}")
                migs = []
            split = {d.parent for d in devices if d.mig is not None}  # a split GPU is published as its MIG devices
            devices = tuple(d for d in devices if (d.mig is None and d.index not in split) or d in migs)
        driver_version = (_nvidia_driver_version(inventory.proc_root) if kind == "nvidia" else None)
        for device in devices:
            if device.mig is not None and not device.uuid:
                notes.append(f"nvidia MIG device {device.label} left out: NVML names no UUID for it")
                continue
            stable = stable_name(device)
            attributes: dict[str, Attribute | None] = {
                "vendor": ("string", VENDORS.get(kind, kind)),
                "type": ("string", _parts(device)),
                "model": _string(device.model),
                "pciAddress": ("string", device.pci_address),
                "pciDeviceId": _string(device.device_id),
                "stableName": ("string", stable),
                "parent": _string(_parent(inventory, device)),
                "numaNode": ("int", device.numa_node) if device.numa_node is not None and device.numa_node >= 0
                else None,
                "partitionIndex": ("int", device.partition) if device.partition is not None else None,
                "driver": _string(device.driver),
                "driverVersion": _version(driver_version or _module_version(inventory.sysfs_root, device.driver)),
            }
            capacity: dict[str, str] = {}
            if kind == "amd":
                _amd(inventory, device, attributes, capacity)
            elif kind == "nvidia":
                _nvidia(inventory, device, attributes)
            assert set(attributes) <= set(ATTRIBUTES) and set(capacity) <= set(CAPACITIES)
            name = device_name(stable)
            if not DNS_LABEL.match(name):
                notes.append(f"{kind} device {stable} left out: {name!r} is no DNS label")
                continue
            out.append(DraDevice(name=name, kind=kind, stable=stable,
                                 attributes={k: v for k, v in attributes.items() if v is not None},
                                 capacity=capacity, device=device))
    names = [d.name for d in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # never publish two devices under one name: the name is what a claim is prepared by
        notes.append(f"devices named {', '.join(twice)} more than once left out")
        out = [d for d in out if d.name not in twice]
    return out, notes


def find(devices: list[DraDevice], name: str) -> DraDevice | None:
    """The published device of that name (None when it is gone or changed mode)."""
    return next((d for d in devices if d.name == name), None)
