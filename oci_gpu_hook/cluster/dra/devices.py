"""What the DRA driver publishes: one :class:`DraDevice` per allocatable device of the inventory, with the
attributes a claim selects on, and the counters that keep a whole GPU and its parts from being allocated at once.

:func:`build` is the only place that turns the inventory into DRA devices.  A
device is what a container can be given on its own: a whole GPU, an AMD compute
partition (an XCP, in the GPU's current mode), an NVIDIA MIG device.  A GPU
split into partitions or MIG devices is published as its parts, each with its
GPU as the ``parent`` attribute, and as itself (``type`` gpu, ``partitionCount``
its parts): the whole GPU in its current mode, which a container gets as all its
parts together.  The whole and each part consume the GPU's counter set (named
after the GPU's device; one counter, ``partitions``, of the parts' count: a part
takes 1, the whole takes all), so the scheduler never allocates the whole and a
part together.  Where the API cannot keep counters, :func:`without_counters`
is what is published: the parts only, as before partitionable devices (so no
device and its parts are ever both allocatable; a mode change republishes the
GPU's devices).

Device names are DNS labels derived from the device's stable name
(:func:`oci_gpu_hook.inventory.stable_name`), never from an index: the stable
name lower-cased with ``:`` and ``.`` turned into ``-``, ``gpu-`` in front when
it does not start with a letter (``gpu-0000-05-00-0``, ``gpu-0000-05-00-0-p3``,
``gpu-8f3c...`` for ``GPU-8F3C...``, ``mig-...``).  So a name allocated once
names the same hardware while other devices come and go, or the device is gone
and a prepare that asks for it is refused.

Attributes (unqualified, so in the driver's own domain: CEL reads them as
``device.attributes["<driver>"].<name>``), one name for one meaning across
vendors (docs/dra.md has the table): ``vendor`` (amd, intel, nvidia),
``type`` (gpu, partition, mig), ``model`` (AMD: the gfx target; NVIDIA: the
driver's model name; Intel: the driver), ``productName`` (the board's name: AMD
``product_name`` where sysfs has it, NVIDIA the driver's model name),
``architecture`` (the ISA code is compiled for: AMD the gfx target ``gfx942``,
NVIDIA ``sm_90``), ``computeCapability`` (NVIDIA, a version: ``9.0.0``),
``pciAddress`` (the GPU's, for a part too), ``pciDeviceId``, ``stableName``
(the device's stable CDI name), ``parent`` (a part's GPU: its stable name),
``uuid`` (NVIDIA), ``numaNode``, ``partitionIndex``, ``partitionCount`` (a split
GPU's parts), ``computePartition`` and ``memoryPartition`` (AMD: ``CPX``,
``NPS1``), ``migProfile`` (NVIDIA: ``1g.10gb``), ``hiveId`` (AMD XGMI, hex),
``driver``, ``driverVersion`` (a version when it is one).  Capacity ``memory``:
AMD the VRAM of the device's memory partition (the GPU's VRAM divided by its NPS
count; a whole GPU all of it), NVIDIA the GPU's memory or the MIG profile's
(NVML: :func:`oci_gpu_hook.inventory.nvml.gpu_facts`), Intel the VRAM where
sysfs says it (xe ``tile*/physical_vram_size_bytes``, i915 ``lmem_total_bytes``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace

from oci_gpu_hook.inventory import Device, Inventory, backend, stable_name
from oci_gpu_hook.inventory.sysfs import read

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from oci_gpu_hook.inventory import DraValue

Attribute = tuple[str, str | int | bool]  # (type: string|int|bool|version, value)
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")
MAX_STRING = 64  # the API's limit on a string or version attribute
# Every attribute this driver may publish (the module docstring says what each is): claims and DeviceClasses
# select on these names.
ATTRIBUTES = ("vendor", "type", "model", "productName", "architecture", "computeCapability", "pciAddress",
              "pciDeviceId", "stableName", "parent", "uuid", "numaNode", "partitionIndex", "partitionCount",
              "computePartition", "memoryPartition", "migProfile", "hiveId", "driver", "driverVersion")
CAPACITIES = ("memory",)
PARTS_COUNTER = "partitions"  # the one counter of a split GPU's counter set: its parts' count
Consumption = tuple[str, tuple[tuple[str, str], ...]]  # (counter set, ((counter, quantity), ...))
TAINT_NAME = "unhealthy"  # the taint's key is <driver>/unhealthy


@dataclass(frozen=True)
class Taint:
    """A device taint (KEP-5055): ``<driver>/unhealthy=<signal>:<effect>``, added at ``time_added`` (RFC 3339)."""

    key: str
    value: str  # the health signal (a label value: the reason's text goes to the health stream)
    effect: str  # NoSchedule, NoExecute
    time_added: str


@dataclass(frozen=True)
class DraDevice:
    name: str  # DNS label, unique on the node
    kind: str  # the inventory backend
    stable: str  # the stable CDI name
    attributes: dict[str, Attribute] = field(default_factory=dict)
    capacity: dict[str, str] = field(default_factory=dict)  # name -> quantity
    device: Device | None = field(default=None, compare=False, repr=False)  # the inventory's (a split GPU's whole:
    # None, it is its parts), from the same scan
    consumes: tuple[Consumption, ...] = ()  # the counters it takes (a split GPU's whole and parts)
    parts: tuple[Device, ...] = field(default=(), compare=False, repr=False)  # what a container gets: its devices
    taint: Taint | None = None  # while its GPU is Unhealthy (oci_gpu_hook.cluster.health)

    @property
    def pci_address(self) -> str:
        """The PCI address of the device's GPU (whose health it shares)."""
        return str(self.attributes["pciAddress"][1])

    def fingerprint(self) -> tuple[object, ...]:
        """What a republish compares: the published fields (a changed one bumps the pool generation)."""
        return self.name, sorted(self.attributes.items()), sorted(self.capacity.items()), self.consumes, self.taint

    def shares_hardware(self, other: DraDevice) -> bool:
        """True when this device and ``other`` give a container some of the same hardware (a whole GPU and its
        part, or the same device)."""
        mine = {stable_name(d) for d in self.parts}
        return self.name == other.name or any(stable_name(d) in mine for d in other.parts)


@dataclass(frozen=True)
class CounterSet:
    name: str  # a DNS label, unique in the pool
    counters: tuple[tuple[str, str], ...]  # (counter, quantity)


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


def _module_version(sysfs_root: str, driver: str | None) -> str | None:
    return read(os.path.join(sysfs_root, "module", driver, "version")) if driver else None


def _attribute(value: DraValue) -> Attribute | None:
    """A backend's attribute value as published: a str a string attribute, an int an int one, a pair as it is."""
    if isinstance(value, tuple):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return "int", value
    return _string(value)


def _described(inventory: Inventory, device: Device, driver_version: str | None, whole: tuple[Device, ...] = ()
               ) -> tuple[dict[str, Attribute], dict[str, str]]:
    """A device's attributes and capacity; with ``whole``, those of the GPU that ``device`` (its first part, or
    the GPU itself) belongs to, split into the parts ``whole``."""
    kind = device.kind
    own = backend(kind)
    # a split GPU's whole is named by its PCI address where the device standing for it is its first part (AMD)
    stable = device.pci_address if whole and device.partition is not None else stable_name(device)
    part = device.partition is not None and not whole
    attributes: dict[str, Attribute | None] = {
        "vendor": ("string", kind),
        "type": ("string", "gpu" if whole or device.partition is None else own.part),
        "model": _string(device.model),
        "pciAddress": ("string", device.pci_address),
        "pciDeviceId": _string(device.device_id),
        "stableName": ("string", stable),
        "parent": None if whole else _string(own.parent_name(inventory, device)),
        "numaNode": ("int", device.numa_node) if device.numa_node is not None and device.numa_node >= 0 else None,
        "partitionIndex": ("int", device.partition) if part else None,
        "partitionCount": ("int", len(whole)) if whole else None,
        "driver": _string(device.driver),
        "driverVersion": _version(driver_version or _module_version(inventory.sysfs_root, device.driver)),
    }
    vendor, size = own.dra_describe(inventory, device, bool(whole))
    attributes.update((name, _attribute(value)) for name, value in vendor.items())
    capacity = {name: quantity(value) for name, value in size.items()}
    assert set(attributes) <= set(ATTRIBUTES) and set(capacity) <= set(CAPACITIES)
    return {k: v for k, v in attributes.items() if v is not None}, capacity


def _groups(inventory: Inventory, kind: str, devices: tuple[Device, ...]) -> list[tuple[Device, tuple[Device, ...]]]:
    """The devices in the inventory's order as (device, its parts): a device on its own is (it, (it,)); a split
    GPU is (its GPU, or its first part where the inventory has no GPU device, and all its parts), before them."""
    out: list[tuple[Device, tuple[Device, ...]]] = []
    done: set[str] = set()
    for device in devices:
        if device.partition is None:
            out.append((device, (device,)))
            continue
        key, head, parts = backend(kind).split_gpu(inventory, device, devices)
        if key not in done and head is not None and len(parts) > 1:
            done.add(key)
            out.append((head, parts))
        out.append((device, (device,)))
    return out


def build(inventory: Inventory) -> tuple[list[DraDevice], list[str]]:
    """Every allocatable device of the inventory (in the inventory's order; a split GPU's whole before its parts),
    and a line per device left out."""
    out: list[DraDevice] = []
    notes: list[str] = []
    for kind in inventory.kinds:
        own = backend(kind)
        devices, left_out = own.dra_devices(inventory)
        notes += left_out
        driver_version = own.driver_version(inventory)
        for device, parts in _groups(inventory, kind, devices):
            why = own.dra_left_out(device)
            if why:
                notes.append(why)
                continue
            whole = parts if parts != (device,) else ()
            attributes, capacity = _described(inventory, device, driver_version, whole)
            stable = str(attributes["stableName"][1])
            name = device_name(stable)
            if not DNS_LABEL.match(name):
                notes.append(f"{kind} device {stable} left out: {name!r} is no DNS label")
                continue
            out.append(DraDevice(name=name, kind=kind, stable=stable, attributes=attributes, capacity=capacity,
                                 device=None if whole else device, parts=parts))
    names = [d.name for d in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # never publish two devices under one name: the name is what a claim is prepared by
        notes.append(f"devices named {', '.join(twice)} more than once left out")
        out = [d for d in out if d.name not in twice]
    return _counted(out), notes


def _counted(devices: list[DraDevice]) -> list[DraDevice]:
    """The devices with their counters: a split GPU's whole takes all of its set, each part one."""
    wholes = {d.name: d for d in devices if d.attributes.get("partitionCount")}
    out = []
    for device in devices:
        if device.name in wholes:
            taken = len(device.parts)
            out.append(replace(device, consumes=((device.name, ((PARTS_COUNTER, str(taken)),)),)))
            continue
        parent = next((w for w in wholes.values() if w.shares_hardware(device)), None)
        out.append(replace(device, consumes=((parent.name, ((PARTS_COUNTER, "1"),)),)) if parent else device)
    return out


def counter_sets(devices: list[DraDevice]) -> list[CounterSet]:
    """The counter sets ``devices`` consume: one per split GPU, as much as its whole takes."""
    return [CounterSet(d.consumes[0][0], d.consumes[0][1]) for d in devices
            if d.consumes and d.attributes.get("partitionCount")]


def without_counters(devices: list[DraDevice]) -> list[DraDevice]:
    """What is published where the API keeps no counters: a split GPU as its parts only, nothing consuming."""
    return [replace(d, consumes=()) for d in devices if not d.attributes.get("partitionCount")]


def find(devices: list[DraDevice], name: str) -> DraDevice | None:
    """The published device of that name (None when it is gone or changed mode)."""
    return next((d for d in devices if d.name == name), None)
