"""The host's GPUs, by vendor backend, each kind in the order its vendor's own toolkit uses.

A backend (``amd``, ``intel``, ``nvidia``; one module each in this package)
claims the devices that are its own (AMD and Intel: DRM devices; NVIDIA: the
GPUs the driver lists under ``/proc/driver/nvidia``), names its shared nodes
(AMD: ``/dev/kfd``; NVIDIA: ``/dev/nvidiactl``, ``/dev/nvidia-uvm*``), orders
its devices into its own index space and resolves its own request syntax.  A
device of one kind is never reachable through a request for another, and a
device that no backend claims (a BMC's VGA, a virtual display, a half-removed
device, a GPU the driver excluded) is listed as ignored, never granted.

The per-container path scans only the kinds a container asked for, so it
imports only those backends.  The sysfs and proc roots are parameters, so
directory trees that mimic them (``examples/hosts/``) stand in for a real host.

Optional backend functions (the NVIDIA backend has them): ``indexed(devices)``,
the devices that plain indices count (default: all); ``container_options(env)``,
what a container's env asks of the kind beyond devices (NVIDIA: driver
capabilities); ``device_edits(device, config, options)`` and
``kind_edits(inventory, options, config)``, a device's and the kind's edits for
those options (``None``: everything, as a CDI spec gives it); ``kind_nodes(inventory)``,
the nodes of those kind edits (default: the shared nodes).
"""

from __future__ import annotations

import os
import sys

from oci_gpu_hook.inventory.sysfs import drm_devices, parse_pci_address
from oci_gpu_hook.kinds import KINDS

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from collections.abc import Iterable
    from types import ModuleType

    from oci_gpu_hook.config import Config
    from oci_gpu_hook.core.devices import Node

__all__ = ["HALF_THERE", "KINDS", "NOT_A_DEVICE", "Device", "Inventory", "backend", "parse_pci_address", "scan",
           "scan_host", "stable_name"]
# A backend's reason that starts with this names a device that is half there (being removed, or being
# reconfigured): the per-container scan stops on it, as on a broken DRM entry, since skipping it renumbers.
HALF_THERE = "half there: "
# A backend's reason that ends with this names something of its vendor that is no device of its kind at all (an
# NVSwitch): listed as ignored, never counted as a device set aside.
NOT_A_DEVICE = ": not a GPU"


class Device:
    """One schedulable device of one kind: a whole GPU or one compute partition."""

    __slots__ = (
        "compute_mode", "device_id", "display_nodes", "driver", "driver_root", "drm_name", "hive_id", "index",
        "kfd_gpu_id", "kind", "links", "masks", "memory_mode", "mig", "minor", "model", "nodes", "numa_node", "parent",
        "partition", "pci_address", "sysfs_dir", "unique_id", "uuid", "vendor_id",
    )

    def __init__(self, *, kind: str, nodes: tuple[Node, ...], links: tuple[tuple[str, str], ...], pci_address: str,
                 sysfs_dir: str, drm_name: str, numa_node: int | None = None, model: str = "",
                 vendor_id: str = "", device_id: str = "", driver: str | None = None, partition: int | None = None,
                 unique_id: int | None = None, compute_mode: str | None = None, memory_mode: str | None = None,
                 hive_id: int | None = None, kfd_gpu_id: int | None = None, uuid: str | None = None,
                 minor: int | None = None, mig: tuple[int, int] | None = None, parent: int | None = None,
                 display_nodes: tuple[Node, ...] = (), masks: tuple[str, ...] = (),
                 driver_root: str | None = None) -> None:
        self.kind = kind
        self.index = -1  # set when the backend has ordered its devices
        self.nodes = nodes
        self.links = links
        self.pci_address = pci_address
        self.sysfs_dir = sysfs_dir
        self.drm_name = drm_name
        self.numa_node = numa_node
        self.model = model
        self.vendor_id = vendor_id
        self.device_id = device_id
        self.driver = driver
        self.partition = partition
        self.unique_id = unique_id
        self.compute_mode = compute_mode
        self.memory_mode = memory_mode
        self.hive_id = hive_id
        self.kfd_gpu_id = kfd_gpu_id
        self.uuid = uuid  # NVIDIA: GPU-... or MIG-...
        self.minor = minor  # NVIDIA: the device minor of the GPU (of the parent GPU for a MIG device)
        self.mig = mig  # NVIDIA MIG device: (GPU instance id, compute instance id); partition = its index in the GPU
        self.parent = parent  # NVIDIA MIG device: the index of its GPU
        self.display_nodes = display_nodes  # NVIDIA: DRM nodes, given with graphics or display
        self.masks = masks  # container paths besides sysfs_dir that mask_other_gpus hides when not granted
        self.driver_root = driver_root  # NVIDIA: where the driver's user-space (NVML) is

    @property
    def card(self) -> Node | None:
        return next((n for n in self.nodes + self.display_nodes if n.path.startswith("/dev/dri/card")), None)

    @property
    def render(self) -> Node | None:
        return next((n for n in self.nodes + self.display_nodes if n.path.startswith("/dev/dri/renderD")), None)

    @property
    def label(self) -> str:
        """The device's index as its vendor spells it: ``3``, or ``1:0`` for MIG device 0 of GPU 1."""
        return f"{self.parent}:{self.partition}" if self.mig is not None else str(self.index)

    @property
    def unique_id_hex(self) -> str | None:
        return None if self.unique_id is None else f"0x{self.unique_id:016x}"

    def __repr__(self) -> str:
        part = "" if self.partition is None or self.mig is not None else f" p{self.partition}"
        return f"Device({self.kind} {self.label}: {self.pci_address}{part})"


class KindInventory:
    """The devices of one kind in index order, the nodes they all share, and what the backend saw of its kind but
    set aside (name, why): a GPU the driver excluded, a DRM device without its KFD node."""

    __slots__ = ("devices", "kind", "set_aside", "shared")

    def __init__(self, kind: str, devices: Iterable[Device], shared: tuple[Node, ...],
                 set_aside: tuple[tuple[str, str], ...] = ()) -> None:
        self.kind = kind
        self.devices = tuple(devices)
        self.shared = shared
        self.set_aside = set_aside
        for index, device in enumerate(self.devices):
            device.index = index


class Inventory:
    """The scanned kinds, and the DRM devices no scanned backend claimed (with why)."""

    __slots__ = ("ignored", "kinds", "proc_root", "sysfs_root")

    def __init__(self, kinds: dict[str, KindInventory], ignored: list[tuple[str, str]], sysfs_root: str,
                 proc_root: str = "/proc") -> None:
        self.kinds = kinds
        self.ignored = ignored
        self.sysfs_root = sysfs_root
        self.proc_root = proc_root

    def devices(self, kind: str) -> tuple[Device, ...]:
        found = self.kinds.get(kind)
        return found.devices if found else ()

    def shared(self, kind: str) -> tuple[Node, ...]:
        found = self.kinds.get(kind)
        return found.shared if found else ()

    def set_aside(self, kind: str) -> tuple[tuple[str, str], ...]:
        found = self.kinds.get(kind)
        return found.set_aside if found else ()

    @property
    def all_devices(self) -> tuple[Device, ...]:
        return tuple(d for kind in self.kinds.values() for d in kind.devices)


def backend(kind: str) -> ModuleType:
    """The backend module of ``kind`` (imported on first use)."""
    if kind not in KINDS:
        raise KeyError(kind)
    name = f"oci_gpu_hook.inventory.{kind}"
    __import__(name)  # not importlib: importing it costs ~1 ms on every container start
    return sys.modules[name]


def stable_name(device: Device) -> str:
    """The CDI name that names ``device``'s hardware for as long as it exists, whatever else comes and goes
    (the backend's ``stable_name``: AMD ``0000:05:00.0`` or ``0000:05:00.0-p3``, Intel the PCI address,
    NVIDIA the GPU's or MIG device's UUID)."""
    return str(backend(device.kind).stable_name(device))


def scan(sysfs_root: str = "/sys", kinds: Iterable[str] | None = None, *, strict: bool = True,
         proc_root: str = "/proc", driver_root: str = "/") -> Inventory:
    """Read the devices of ``kinds`` (default: every backend) under ``sysfs_root`` (NVIDIA: and ``proc_root``;
    ``driver_root`` is where its NVML is, for MIG UUIDs).

    ``strict`` (the per-container path): a DRM entry that cannot be read (a device half removed, a
    dangling link) is a HookError, since skipping it would renumber every device after it.  Operator
    commands pass ``strict=False`` and get it listed as ignored.
    """
    from oci_gpu_hook.errors import HookError

    root = os.path.abspath(sysfs_root)
    proc = os.path.abspath(proc_root)
    wanted = list(KINDS) if kinds is None else [k for k in KINDS if k in set(kinds)]
    drm = drm_devices(root)
    broken = [d for d in drm if d.problem]
    if strict and broken:
        raise HookError(f"{broken[0].problem}; refusing to number GPUs while a DRM device is half there")
    seen: dict[str, str] = {}  # DRM device directory -> "" when a backend claimed it, else a backend's reason
    found: dict[str, KindInventory] = {}
    for kind in wanted:
        devices, shared, looked_at = backend(kind).discover(root, drm, proc, os.path.abspath(driver_root))
        half = next((why for why in looked_at.values() if why.startswith(HALF_THERE)), None)
        if strict and half:
            raise HookError(f"{half[len(HALF_THERE):]}; refusing to number {kind} GPUs while a device is half there")
        for directory, reason in looked_at.items():
            if seen.get(directory) != "":
                seen[directory] = reason
        aside = tuple((os.path.basename(what) if what.startswith("/") else what, why.removeprefix(HALF_THERE))
                      for what, why in looked_at.items() if why and not why.endswith(NOT_A_DEVICE))
        found[kind] = KindInventory(kind, devices, shared, aside)
    ignored = []
    for device in drm:
        reason = seen.pop(device.directory, None)
        if reason == "":
            continue
        ignored.append((device.name, device.problem or reason
                        or _unclaimed_reason(device, set(wanted) == set(KINDS), "nvidia" in wanted, proc)))
    for what, reason in seen.items():  # devices without DRM nodes a backend looked at (NVIDIA)
        if reason:
            ignored.append((os.path.basename(what) if what.startswith("/") else what, reason.removeprefix(HALF_THERE)))
    if not strict and "nvidia" in wanted and not found["nvidia"].devices:
        ignored += _nvidia_without_proc(root, proc, {name for name, _ in ignored})
    return Inventory(found, ignored, root, proc)


def _nvidia_without_proc(root: str, proc_root: str, listed: set[str]) -> list[tuple[str, str]]:
    """Operator commands: the PCI devices bound to the nvidia driver (with no DRM node, so not listed yet) where
    the proc root has no ``driver/nvidia``: a host's sysfs read with another proc root (``--proc-root``)."""
    from oci_gpu_hook.inventory.sysfs import driver, read

    if os.path.isdir(os.path.join(proc_root, "driver", "nvidia")):
        return []
    devices = os.path.join(root, "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(devices))
    except OSError:
        return []
    return [(name, f"nvidia, {read(os.path.join(devices, name, 'vendor')) or 'no vendor'}: the nvidia backend needs "
                   f"{proc_root}/driver/nvidia, missing under the proc root {proc_root} (try --proc-root HOST/proc)")
            for name in names if name not in listed and driver(os.path.join(devices, name)) == "nvidia"]


def scan_host(config: Config, kinds: Iterable[str] | None = None, *, strict: bool = False) -> Inventory:
    """:func:`scan` with the config's roots (sysfs, proc, driver) and backends: what the operator commands read."""
    return scan(config.sysfs_root, config.backends if kinds is None else kinds, strict=strict,
                proc_root=config.proc_root, driver_root=config.driver_root)


def _unclaimed_reason(device: object, every_backend: bool, nvidia: bool, proc_root: str) -> str:
    from oci_gpu_hook.inventory.sysfs import DrmDevice, driver, read

    assert isinstance(device, DrmDevice)
    owner = driver(device.directory) or "no driver"
    vendor = read(os.path.join(device.directory, "vendor")) or "no vendor"
    what = f"{owner}, {vendor}"
    if device.render is None:
        return f"{what}: no render node (a display-only device)"
    if nvidia and owner == "nvidia" and not os.path.isdir(os.path.join(proc_root, "driver", "nvidia")):
        return (f"{what}: the nvidia backend needs {proc_root}/driver/nvidia, missing under the proc root "
                f"{proc_root} (try --proc-root HOST/proc)")
    return f"{what}: no backend claims it" if every_backend else f"{what}: not of the kinds scanned"
