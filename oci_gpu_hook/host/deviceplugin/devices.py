"""What the device plugin advertises: one :class:`PluginDevice` per schedulable device of each kind it serves.

:func:`plan` is the only place that reads the inventory's API, so that a change
there is a change here only.  It serves the kinds of :data:`SERVED` (AMD GPUs
and compute partitions, NVIDIA GPUs and MIG devices) through one code path:
each kind's adapter says, for each of its devices, the plugin device ID and the
resource; everything else (the stable CDI name, the CDI kind, NUMA node, the
device numbers its spec entry must have) comes from the backend
(:func:`oci_gpu_hook.inventory.stable_name`, ``kind_nodes``) and the device.

Device IDs are derived from what identifies the hardware, never from list
positions, so that an ID names the same physical device while others come and
go:

- AMD: the GPU's PCI address (``0000:05:00.0``) for a whole GPU and for
  partition 0, ``0000:05:00.0/p3`` for partition 3; the stable CDI name
  ``0000:05:00.0`` / ``0000:05:00.0-p3`` (p0 included).  Resources: ``amd.com/gpu``;
  with the mixed strategy a partitioned GPU's devices by mode
  (``amd.com/cpx_nps1``), as AMD's plugin names them.
- NVIDIA: the GPU's UUID (``GPU-...``) for a whole GPU, the MIG UUID
  (``MIG-...``) for a MIG device: ID and stable CDI name alike, as NVIDIA's
  plugin does.  A MIG device's UUID and profile come from NVML
  (:func:`oci_gpu_hook.inventory.nvml.refresh`, read again at every scan); a MIG
  device NVML cannot name is not advertised (its ``GPU:MIG`` index moves when
  an instance before it is destroyed).  A GPU split into MIG devices is not
  advertised whole.  Resources, as NVIDIA's plugin names them: ``mixed``:
  whole GPUs ``nvidia.com/gpu``, MIG devices ``nvidia.com/mig-<profile>``
  (``nvidia.com/mig-1g.10gb``; ``+`` becomes ``.``; compute-instance profiles
  ``1c.2g.20gb`` are not advertised, as there); ``single``: MIG devices are
  ``nvidia.com/gpu`` when every NVIDIA GPU is split into MIG devices of one
  profile, else whole GPUs only (NVIDIA's plugin refuses to start; this one
  leaves the MIG devices out and says why).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from oci_gpu_hook.config import KINDS
from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from oci_gpu_hook.core.devices import Node
    from oci_gpu_hook.inventory import Device, Inventory

SERVED = ("amd", "nvidia")  # the inventory backends whose devices the plugin advertises, in this order
# Kinds whose whole-GPU resource is served even before any device of it is seen (the kubelet then shows 0);
# the others' resources appear with their first device, so that a node without such GPUs keeps its vendor's
# own plugin for that resource name undisturbed.
ALWAYS_SERVED = ("amd",)
STRATEGIES = ("single", "mixed")


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
    reason: str = ""  # why not healthy: gone, or its GPU's health signal (oci_gpu_hook.host.health)
    host_nodes: tuple[str, ...] = ()  # its nodes and its kind's shared ones, for --device-specs
    numbers: tuple[Number, ...] = ()  # its own nodes' device numbers, as the host has them now
    shared: tuple[Number, ...] = ()  # the numbers of the nodes every device of the kind needs (/dev/kfd, ...)
    kind: str = SERVED[0]  # the inventory backend

    @property
    def type(self) -> str:
        """``gpu``, ``partition`` (AMD) or ``mig`` (NVIDIA)."""
        return "gpu" if self.partition is None else "mig" if self.kind == "nvidia" else "partition"

    @property
    def cdi_kind(self) -> str:
        return cdi_kind(self.kind)

    @property
    def qualified(self) -> str:
        """The fully qualified CDI name: ``amd.com/gpu=0000:05:00.0``, ``nvidia.com/gpu=GPU-...``."""
        return f"{self.cdi_kind}={self.cdi_name}"


def cdi_kind(kind: str) -> str:
    return KINDS[kind][0]


def domain(kind: str) -> str:
    """``amd.com``, ``nvidia.com``: the vendor domain of the kind's resource names (its CDI kind's)."""
    return cdi_kind(kind).partition("/")[0]


def whole_gpu_resource(kind: str) -> str:
    return f"{domain(kind)}/gpu"


def device_id(pci_address: str, partition: int | None) -> str:
    """An AMD device's ID."""
    return pci_address if not partition else f"{pci_address}/p{partition}"


def _check(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise HookError(f"unknown resource strategy {strategy!r} (valid: {', '.join(STRATEGIES)})")


def resource_for(strategy: str, compute_mode: str | None, memory_mode: str | None) -> str:
    """AMD.  single: everything is amd.com/gpu.  mixed: a partitioned GPU's devices by mode, as AMD's plugin
    names them (amd.com/cpx_nps1, amd.com/spx_nps4), a GPU without partition modes amd.com/gpu."""
    _check(strategy)
    if strategy == "single" or not compute_mode or not memory_mode:
        return whole_gpu_resource("amd")
    return f"{domain('amd')}/{compute_mode.strip().lower()}_{memory_mode.strip().lower()}"


def mig_resource(profile: str) -> str:
    """NVIDIA, mixed: ``1g.10gb`` -> ``nvidia.com/mig-1g.10gb``, ``1g.10gb+me`` -> ``nvidia.com/mig-1g.10gb.me``."""
    return f"{domain('nvidia')}/mig-{profile.replace('+', '.')}"


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


# --- the kinds ----------------------------------------------------------------------------------------------

Entry = tuple["Device", str, str]  # a device, its plugin device ID, its resource
Adapter = Callable[["Inventory", str], tuple[list[Entry], list[str]]]  # -> entries, notes (what is left out, why)


def _amd(inventory: Inventory, strategy: str) -> tuple[list[Entry], list[str]]:
    return [(d, device_id(d.pci_address, d.partition), resource_for(strategy, d.compute_mode, d.memory_mode))
            for d in inventory.devices("amd")], []


def _mig_name(device: Device) -> str:
    assert device.mig is not None
    return f"MIG device {device.label} ({device.pci_address} gi{device.mig[0]}/ci{device.mig[1]})"


def _nvidia(inventory: Inventory, strategy: str) -> tuple[list[Entry], list[str]]:
    from oci_gpu_hook.inventory import nvml

    _check(strategy)
    devices = inventory.devices("nvidia")
    migs = [d for d in devices if d.mig is not None]
    split = {d.parent for d in migs}
    whole = [d for d in devices if d.mig is None and d.index not in split]
    resource = whole_gpu_resource("nvidia")
    entries: list[Entry] = [(d, d.uuid or d.pci_address, resource) for d in whole]
    notes: list[str] = []
    problem = nvml.refresh(migs)  # fresh UUIDs and profiles: instances come and go
    if problem:
        notes.append(f"{len(migs)} MIG device(s) not advertised: their UUIDs and profiles are known only to NVML, "
                     f"and {problem}")
        return entries, notes
    named: list[tuple[Device, str]] = []
    for device in migs:
        profile = nvml.profile(device)
        if not device.uuid or not profile:
            notes.append(f"{_mig_name(device)} not advertised: NVML names no {'profile' if device.uuid else 'UUID'} "
                         "for it")
        elif not all(c.isascii() and (c.isalnum() or c in "+-.") for c in profile):
            notes.append(f"{_mig_name(device)} not advertised: its profile {profile!r} makes no resource name")
        else:
            named.append((device, profile))
    if strategy == "mixed":
        for device, profile in named:
            if profile.split(".")[0].endswith("c"):
                notes.append(f"{_mig_name(device)} not advertised: {profile} is a compute-instance profile (as "
                             "NVIDIA's plugin, only profiles whose compute and GPU instance are one are resources)")
            else:
                entries.append((device, str(device.uuid), mig_resource(profile)))
        return entries, notes
    profiles = sorted({p for _d, p in named})
    if named and (whole or len(profiles) > 1):
        why = (f"GPUs {', '.join(d.pci_address for d in whole)} are not split into MIG devices" if whole
               else f"the MIG devices have {len(profiles)} profiles ({', '.join(profiles)})")
        notes.append(f"single strategy: {len(named)} MIG device(s) not advertised: MIG devices are {resource} only "
                     f"when every NVIDIA GPU is split into MIG devices of one profile, and {why} "
                     "(--resource-strategy mixed advertises them by profile)")
    else:
        entries += [(device, str(device.uuid), resource) for device, _p in named]
    return entries, notes


ADAPTERS: dict[str, Adapter] = {"amd": _amd, "nvidia": _nvidia}
GONE = {"nvidia": "gone from the driver's /proc, sysfs or NVML"}  # default: gone from sysfs


def gone(kind: str) -> str:
    return GONE.get(kind, "gone from sysfs")


def _kind_nodes(inventory: Inventory, kind: str) -> tuple[Node, ...]:
    """The nodes the kind's CDI spec gives every device (the backend's ``kind_nodes``, else its shared nodes)."""
    from oci_gpu_hook.inventory import backend

    own = getattr(backend(kind), "kind_nodes", None)
    return tuple(own(inventory)) if own is not None else inventory.shared(kind)


def plan(inventory: Inventory, strategy: str = "single") -> tuple[list[PluginDevice], list[str]]:
    """Every device of the served kinds as the plugin advertises it, and a line for each device left out."""
    from oci_gpu_hook.inventory import stable_name

    _check(strategy)
    out: list[PluginDevice] = []
    notes: list[str] = []
    for kind in SERVED:
        if kind not in inventory.kinds:
            continue
        entries, left_out = ADAPTERS[kind](inventory, strategy)
        notes += left_out
        shared = _kind_nodes(inventory, kind)
        for device, plugin_id, resource in entries:
            own = device.nodes + device.display_nodes
            out.append(PluginDevice(
                id=plugin_id, cdi_name=stable_name(device), resource=resource, numa=device.numa_node,
                hive=_positive(device.hive_id), parent=device.pci_address, partition=device.partition,
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
