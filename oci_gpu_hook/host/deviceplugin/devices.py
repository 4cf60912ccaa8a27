"""What the device plugin advertises: one :class:`PluginDevice` per schedulable GPU or compute partition.

:func:`plugin_devices` is the only place that reads the inventory's API, so
that a change there (compute partitions as their own devices) is a change here
only.  Attributes that today's ``Gpu`` may lack (``partition``,
``compute_mode``, ``memory_mode``, ``hive_id``) are read with ``getattr``; the
XGMI hive falls back to the KFD topology's ``hive_id`` (:func:`kfd_hives`).

Device IDs are derived from what identifies the hardware, never from list
positions: the PCI address of the GPU (``0000:05:00.0``) for a whole GPU and
for partition 0, ``0000:05:00.0/p3`` for partition 3.  So an ID names the same
physical device while others come and go; the CDI name it maps to (the index
name of the spec ``cdi generate`` writes) is looked up afresh at every scan.
"""

from __future__ import annotations

import os
import tempfile
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


def _scan(sysfs_root: str) -> object:
    """The inventory, tolerating half-removed devices: when a DRM entry cannot be read (a dangling
    /sys/class/drm link while a GPU goes away), scan again through a view of sysfs without it."""
    from oci_gpu_hook.inventory import scan

    try:
        return scan(sysfs_root)
    except HookError:
        root = os.path.abspath(sysfs_root)
        drm = os.path.join(root, "class", "drm")
        names = os.listdir(drm)  # OSError: sysfs itself is unreadable, which the caller reports
        with tempfile.TemporaryDirectory(prefix="oci-gpu-hook-sysfs-") as view:
            for name in os.listdir(root):
                if name != "class":
                    os.symlink(os.path.join(root, name), os.path.join(view, name))
            os.makedirs(os.path.join(view, "class", "drm"))
            for name in os.listdir(os.path.join(root, "class")):
                if name != "drm":
                    os.symlink(os.path.join(root, "class", name), os.path.join(view, "class", name))
            for name in names:
                real = os.path.realpath(os.path.join(drm, name))
                if os.path.exists(os.path.join(real, "dev")) or not name.startswith(("card", "renderD")):
                    os.symlink(real, os.path.join(view, "class", "drm", name))
            return scan(view)


def kfd_hives(sysfs_root: str) -> dict[int, int]:
    """XGMI hive ids by DRM render minor, from the KFD topology's node properties (``hive_id``, 0 when the GPU
    is in no hive), for an inventory that does not report them itself."""
    nodes = os.path.join(sysfs_root, "class", "kfd", "kfd", "topology", "nodes")
    hives: dict[int, int] = {}
    try:
        names = os.listdir(nodes)
    except OSError:
        return hives
    for name in names:
        try:
            with open(os.path.join(nodes, name, "properties")) as handle:
                props = dict(line.split(None, 1) for line in handle.read().splitlines() if " " in line)
        except (OSError, ValueError):
            continue  # a node the cgroup hides (EPERM), or one going away
        render, hive = props.get("drm_render_minor", "").strip(), props.get("hive_id", "").strip()
        if render.isdigit() and hive.isdigit() and int(render) and int(hive):
            hives[int(render)] = int(hive)
    return hives


def plugin_devices(sysfs_root: str, strategy: str = "single") -> list[PluginDevice]:
    """The adapter over the inventory: every GPU or compute partition of ``sysfs_root`` as the plugin
    advertises it.  A device that cannot be read is left out (the tracker then reports it Unhealthy)."""
    inventory = _scan(sysfs_root)
    shared = tuple(node.path for node in getattr(inventory, "shared_nodes", {}).get("amd", ()))
    found = []
    hives: dict[int, int] | None = None
    for gpu in getattr(inventory, "gpus", ()):
        if getattr(gpu, "vendor", "amd") != "amd":
            continue
        partition = getattr(gpu, "partition", None)
        pci = str(gpu.pci_address)
        nodes = tuple(node.path for node in gpu.nodes)
        hive = getattr(gpu, "hive_id", None)
        if hive is None:
            hives = kfd_hives(sysfs_root) if hives is None else hives
            hive = hives.get(gpu.render.minor)
        found.append(PluginDevice(
            id=device_id(pci, partition),
            cdi_name=str(gpu.index),
            resource=resource_for(strategy, getattr(gpu, "compute_mode", None), getattr(gpu, "memory_mode", None)),
            numa=gpu.numa_node,
            hive=_positive(hive),
            parent=pci,
            partition=partition,
            host_nodes=nodes + shared,
        ))
    return found
