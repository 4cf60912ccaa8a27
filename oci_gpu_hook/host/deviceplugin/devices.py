"""What the device plugin advertises: one :class:`PluginDevice` per schedulable GPU or compute partition.

:func:`plugin_devices` is the only place that reads the inventory's API, so
that a change there (compute partitions as their own devices) is a change here
only.  The inventory lists each compute partition as its own device, with its
GPU's PCI address, its partition number, the compute and memory modes and the
XGMI hive id of its KFD node.

Device IDs are derived from what identifies the hardware, never from list
positions: the PCI address of the GPU (``0000:05:00.0``) for a whole GPU and
for partition 0, ``0000:05:00.0/p3`` for partition 3.  So an ID names the same
physical device while others come and go; the CDI name it maps to (the index
name of the spec ``cdi generate`` writes) is looked up afresh at every scan.
"""

from __future__ import annotations

from dataclasses import dataclass

from oci_gpu_hook.errors import HookError

VENDOR_DOMAIN = "amd.com"
WHOLE_GPU_RESOURCE = "amd.com/gpu"
CDI_KIND = "amd.com/gpu"
STRATEGIES = ("single", "mixed")


@dataclass(frozen=True)
class PluginDevice:
    id: str  # stable: PCI address [+ /pN]
    cdi_name: str  # the CDI device name (index) at the time of the scan, without the kind
    resource: str  # amd.com/gpu, amd.com/cpx_nps1, ...
    numa: int | None
    hive: int | None  # XGMI hive id; None when not in a hive
    parent: str  # PCI address of the physical GPU
    partition: int | None
    healthy: bool = True
    host_nodes: tuple[str, ...] = ()  # /dev/dri/cardN, /dev/dri/renderDN (and /dev/kfd), for --device-specs


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


def plugin_devices(sysfs_root: str, strategy: str = "single") -> list[PluginDevice]:
    """The adapter over the inventory: every AMD GPU or compute partition of ``sysfs_root`` as the plugin
    advertises it.  The scan is lenient (``strict=False``): a half-removed device (a dangling
    /sys/class/drm link) is left out and the tracker reports it Unhealthy, never a crash."""
    from oci_gpu_hook.inventory import scan

    inventory = scan(sysfs_root, ["amd"], strict=False)
    shared = tuple(node.path for node in inventory.shared("amd"))
    return [PluginDevice(
        id=device_id(device.pci_address, device.partition),
        cdi_name=str(device.index),
        resource=resource_for(strategy, device.compute_mode, device.memory_mode),
        numa=device.numa_node,
        hive=_positive(device.hive_id),
        parent=device.pci_address,
        partition=device.partition,
        host_nodes=tuple(node.path for node in device.nodes) + shared,
    ) for device in inventory.devices("amd")]
