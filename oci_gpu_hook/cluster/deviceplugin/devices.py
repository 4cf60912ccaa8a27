"""What the device plugin advertises: one :class:`PluginDevice` per schedulable device of each kind it serves.

:func:`plan` is the only place that reads the inventory's API, so that a change
there is a change here only.  It serves the kinds whose backend says so
(:attr:`oci_gpu_hook.inventory.Backend.plugin`: AMD GPUs and compute
partitions, NVIDIA GPUs and MIG devices) through one code path: each backend's
:meth:`~oci_gpu_hook.inventory.Backend.plugin_devices` says, for each of
its devices, the plugin device ID and the resource, and which devices it leaves
out; everything else (the stable CDI name, the CDI kind, NUMA node, the device
numbers its spec entry must have) comes from the backend (``stable_name``,
``kind_nodes``) and the device.

Device IDs are derived from what identifies the hardware, never from list
positions, so that an ID names the same physical device while others come and
go; resource names are those of the vendor's own plugin:

- AMD (:func:`oci_gpu_hook.inventory.amd.device_id`, ``resource_for``): the
  GPU's PCI address (``0000:05:00.0``) for a whole GPU and for partition 0,
  ``0000:05:00.0/p3`` for partition 3; the stable CDI name ``0000:05:00.0`` /
  ``0000:05:00.0-p3`` (p0 included).  Resources: ``amd.com/gpu``; with the
  mixed strategy a partitioned GPU's devices by mode (``amd.com/cpx_nps1``).
- NVIDIA (:func:`oci_gpu_hook.inventory.nvcluster.plugin_devices`): the GPU's UUID
  (``GPU-...``) for a whole GPU, the MIG UUID (``MIG-...``) for a MIG device: ID
  and stable CDI name alike.  A MIG device's UUID and profile come from NVML
  (:func:`oci_gpu_hook.inventory.nvml.refresh`, read again at every scan); a MIG
  device NVML cannot name is not advertised (its ``GPU:MIG`` index moves when
  an instance before it is destroyed).  A GPU split into MIG devices is not
  advertised whole.  Resources: ``mixed``: whole GPUs ``nvidia.com/gpu``, MIG
  devices ``nvidia.com/mig-<profile>`` (``nvidia.com/mig-1g.10gb``; ``+``
  becomes ``.``; compute-instance profiles ``1c.2g.20gb`` are not advertised, as
  there); ``single``: MIG devices are ``nvidia.com/gpu`` when every NVIDIA GPU is
  split into MIG devices of one profile, else whole GPUs only (NVIDIA's plugin
  refuses to start; this one leaves the MIG devices out and says why).
"""

from __future__ import annotations

from dataclasses import dataclass

from oci_gpu_hook.config import KINDS
from oci_gpu_hook.inventory import STRATEGIES, backend, check_strategy

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from oci_gpu_hook.inventory import Inventory

# the backends whose devices the plugin advertises, in the vendor table's order (AMD, NVIDIA)
SERVED = tuple(kind for kind in KINDS if backend(kind).plugin)
# Kinds whose whole-GPU resource is served even before any device of it is seen (the kubelet then shows 0);
# the others' resources appear with their first device, so that a node without such GPUs keeps its vendor's
# own plugin for that resource name undisturbed.
ALWAYS_SERVED = tuple(kind for kind in SERVED if backend(kind).plugin_always)
__all__ = ["ALWAYS_SERVED", "SERVED", "STRATEGIES", "PluginDevice", "plan"]


Number = tuple[str, int, int]  # (type, major, minor) of a device node


@dataclass(frozen=True)
class PluginDevice:
    id: str  # stable: AMD PCI address [+ /pN]; NVIDIA GPU or MIG UUID
    cdi_name: str  # the device's stable CDI name, without the kind
    resource: str  # amd.com/gpu, amd.com/cpx_nps1, nvidia.com/gpu, nvidia.com/mig-1g.10gb, ...
    numa: int | None
    hive: int | None  # XGMI hive id; None when not in a hive
    parent: str  # PCI address of the physical GPU
    partition: int | None  # AMD: the partition number; NVIDIA: a MIG device's index in its GPU
    healthy: bool = True
    present: bool = True  # False once gone from the host (it stays listed, Unhealthy)
    reason: str = ""  # why not healthy: gone, or its GPU's health signal (oci_gpu_hook.cluster.health)
    host_nodes: tuple[str, ...] = ()  # its nodes and its kind's shared ones, for --device-specs
    numbers: tuple[Number, ...] = ()  # its own nodes' device numbers, as the host has them now
    shared: tuple[Number, ...] = ()  # the numbers of the nodes every device of the kind needs (/dev/kfd, ...)
    kind: str = SERVED[0]  # the inventory backend

    @property
    def type(self) -> str:
        """``gpu``, or what the backend calls a split GPU's part: ``partition`` (AMD), ``mig`` (NVIDIA)."""
        return "gpu" if self.partition is None else backend(self.kind).part

    @property
    def cdi_kind(self) -> str:
        return cdi_kind(self.kind)

    @property
    def qualified(self) -> str:
        """The fully qualified CDI name: ``amd.com/gpu=0000:05:00.0``, ``nvidia.com/gpu=GPU-...``."""
        return f"{self.cdi_kind}={self.cdi_name}"


def cdi_kind(kind: str) -> str:
    return KINDS[kind][0]


def whole_gpu_resource(kind: str) -> str:
    """``amd.com/gpu``, ``nvidia.com/gpu``: the kind's whole-GPU resource."""
    return backend(kind).resource()


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def gone(kind: str) -> str:
    """Why a device of ``kind`` that was advertised is Unhealthy once the scan no longer finds it."""
    return backend(kind).gone


def plan(inventory: Inventory, strategy: str = "single") -> tuple[list[PluginDevice], list[str]]:
    """Every device of the served kinds as the plugin advertises it, and a line for each device left out."""
    from oci_gpu_hook.inventory import stable_name

    check_strategy(strategy)
    out: list[PluginDevice] = []
    notes: list[str] = []
    for kind in SERVED:
        if kind not in inventory.kinds:
            continue
        entries, left_out = backend(kind).plugin_devices(inventory, strategy)
        notes += left_out
        shared = backend(kind).kind_nodes(inventory)  # the nodes the kind's CDI spec gives every device
        for device, plugin_id, resource in entries:
            own = device.all_nodes
            out.append(PluginDevice(
                id=plugin_id, cdi_name=stable_name(device), resource=resource, numa=device.numa_node,
                hive=_positive(device.facts().get("hive_id")), parent=device.pci_address, partition=device.partition,
                host_nodes=tuple(dict.fromkeys(n.path for n in own + shared)),
                numbers=tuple(n.number for n in own), shared=tuple(n.number for n in shared),
                kind=kind))
    return out, notes


def devices_of(inventory: Inventory, strategy: str = "single") -> list[PluginDevice]:
    """The adapter over the inventory: every device of the served kinds as the plugin advertises it."""
    return plan(inventory, strategy)[0]


def scan_served(sysfs_root: str, *, proc_root: str = "/proc", driver_root: str = "/",
                kinds: tuple[str, ...] = SERVED) -> Inventory:
    """The inventory of the served ``kinds``, lenient (``strict=False``): a half-removed device (a dangling
    /sys/class/drm link, a GPU the driver lists but sysfs has not) is left out, and the tracker reports it
    Unhealthy, never a crash."""
    from oci_gpu_hook.inventory import scan

    return scan(sysfs_root, [k for k in SERVED if k in kinds], strict=False, proc_root=proc_root,
                driver_root=driver_root)


def scan_amd(sysfs_root: str) -> Inventory:
    """The AMD inventory alone, lenient."""
    return scan_served(sysfs_root, kinds=("amd",))


def plugin_devices(sysfs_root: str, strategy: str = "single", *, proc_root: str = "/proc", driver_root: str = "/",
                   kinds: tuple[str, ...] = SERVED) -> list[PluginDevice]:
    """:func:`devices_of` the lenient scan of the host."""
    return devices_of(scan_served(sysfs_root, proc_root=proc_root, driver_root=driver_root, kinds=kinds), strategy)
