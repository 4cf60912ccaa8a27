"""What the device plugin advertises: one :class:`PluginDevice` per schedulable GPU or compute partition.

:func:`plugin_devices` is the only place that reads the inventory's API, so
that a change there (compute partitions as their own devices) is a change here
only.  The inventory lists each compute partition as its own device, with its
GPU's PCI address, its partition number, the compute and memory modes and the
XGMI hive id of its KFD node.

Device IDs are derived from what identifies the hardware, never from list
positions: the PCI address of the GPU (``0000:05:00.0``) for a whole GPU and
for partition 0, ``0000:05:00.0/p3`` for partition 3.  So an ID names the same
physical device while others come and go.  The CDI name it maps to is the
device's stable name (:func:`oci_gpu_hook.inventory.stable_name`: ``0000:05:00.0``
for a whole GPU, ``0000:05:00.0-p3`` for a partition, p0 included), never an
index: a name handed to the kubelet must name the same hardware when a runtime
resolves it later, whatever left or came back in between.
"""

from __future__ import annotations

from dataclasses import dataclass

from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False

if TYPE_CHECKING:
    from oci_gpu_hook.inventory import Inventory

VENDOR_DOMAIN = "amd.com"
WHOLE_GPU_RESOURCE = "amd.com/gpu"
CDI_KIND = "amd.com/gpu"
STRATEGIES = ("single", "mixed")


Number = tuple[str, int, int]  # (type, major, minor) of a device node


@dataclass(frozen=True)
class PluginDevice:
    id: str  # stable: PCI address [+ /pN]
    cdi_name: str  # the device's stable CDI name, without the kind: PCI address [+ -pN]
    resource: str  # amd.com/gpu, amd.com/cpx_nps1, ...
    numa: int | None
    hive: int | None  # XGMI hive id; None when not in a hive
    parent: str  # PCI address of the physical GPU
    partition: int | None
    healthy: bool = True
    host_nodes: tuple[str, ...] = ()  # /dev/dri/cardN, /dev/dri/renderDN (and /dev/kfd), for --device-specs
    numbers: tuple[Number, ...] = ()  # its own nodes' device numbers, as sysfs has them now
    shared: tuple[Number, ...] = ()  # the numbers of the nodes every device of the kind needs (/dev/kfd)


def device_id(pci_address: str, partition: int | None) -> str:
    return pci_address if not partition else f"{pci_address}/p{partition}"


def resource_for(strategy: str, compute_mode: str | None, memory_mode: str | None) -> str:
    """single: everything is amd.com/gpu.  mixed: a partitioned GPU's devices by mode, as AMD's plugin
    names them (amd.com/cpx_nps1, amd.com/spx_nps4), a GPU without partition modes amd.com/gpu."""
    if strategy not in STRATEGIES:
        raise HookError(f"unknown resource strategy {strategy!r} (valid: {', '.join(STRATEGIES)})")
    if strategy == "single" or not compute_mode or not memory_mode:
        return WHOLE_GPU_RESOURCE
    return f"{VENDOR_DOMAIN}/{compute_mode.strip().lower()}_{memory_mode.strip().lower()}"


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def scan_amd(sysfs_root: str) -> Inventory:
    """The AMD inventory, lenient (``strict=False``): a half-removed device (a dangling /sys/class/drm link)
    is left out, and the tracker reports it Unhealthy, never a crash."""
    from oci_gpu_hook.inventory import scan

    return scan(sysfs_root, ["amd"], strict=False)


def devices_of(inventory: Inventory, strategy: str = "single") -> list[PluginDevice]:
    """The adapter over the inventory: every AMD GPU or compute partition as the plugin advertises it."""
    from oci_gpu_hook.inventory import stable_name

    shared = inventory.shared("amd")
    return [PluginDevice(
        id=device_id(device.pci_address, device.partition),
        cdi_name=stable_name(device),
        resource=resource_for(strategy, device.compute_mode, device.memory_mode),
        numa=device.numa_node,
        hive=_positive(device.hive_id),
        parent=device.pci_address,
        partition=device.partition,
        host_nodes=tuple(node.path for node in device.nodes) + tuple(node.path for node in shared),
        numbers=tuple(node.number for node in device.nodes),
        shared=tuple(node.number for node in shared),
    ) for device in inventory.devices("amd")]


def plugin_devices(sysfs_root: str, strategy: str = "single") -> list[PluginDevice]:
    """:func:`devices_of` the lenient scan of ``sysfs_root``."""
    return devices_of(scan_amd(sysfs_root), strategy)
