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

**What a vendor backend provides** is this file's :class:`Backend`: every operation the rest of the project asks of
a vendor, with its default; :class:`Device` is what every vendor's device has.  (Here, not in a module of their own:
the start path imports this package anyway, and a module more cost every GPU start 0.1-0.2 ms: docs/speed.md.)

A vendor is one module in this package (``amd.py``, ``intel.py``, ``nvidia.py``) and one line in the vendor table
(:data:`oci_gpu_hook.kinds.KINDS`: the kind, its CDI kind, the env variables that carry its requests).  The module
defines a subclass of :class:`Backend` and one instance of it, ``BACKEND``; :func:`backend`
imports the module on first use and returns that instance.  A backend says what it provides by overriding: the
request parser, the planner, the CDI spec writer, ``list``, the device plugin and the DRA driver call these methods
and nothing else of a vendor, and never ask whether a backend has one.

Must override: :meth:`Backend.discover` (and set ``name``).  Everything else has a default that suits a vendor whose
devices are whole GPUs named by their PCI address, each its DRM nodes and nothing more (Intel's backend overrides
little beyond that; ``tests/test_vendor_backend.py`` adds a toy fourth vendor with ``discover`` and ``match`` only).
A backend whose devices carry facts of their own (AMD's partition modes, NVIDIA's UUIDs and MIG ids) subclasses
:class:`Device` in its own module; the rest of the project reads those facts only through the device's
:meth:`~Device.facts`, :attr:`~Device.label`, :attr:`~Device.part`, :attr:`~Device.mode`, :attr:`~Device.all_nodes`
and the methods here.

The start path imports a backend module whenever a container asks for its kind, so a backend imports nothing at its
top beyond what the start path already has (``os``, this package, ``core``); what only the device plugin, the DRA
driver or ``list`` need (``re``, NVML) is imported inside the method that needs it.  A device subclass spells out its
``__init__``'s arguments (never ``**common``): a scan builds every device on every container start.
"""

from __future__ import annotations

import os
import sys

from oci_gpu_hook.inventory.sysfs import drm_devices, parse_pci_address
from oci_gpu_hook.kinds import KINDS

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence, Set

    from oci_gpu_hook.config import Config
    from oci_gpu_hook.core.devices import Node
    from oci_gpu_hook.core.edits import Edits
    from oci_gpu_hook.inventory.sysfs import DrmDevice

    PluginEntry = tuple["Device", str, str]  # a device, its device plugin ID, its resource name
    DraValue = str | int | tuple[str, str] | None  # a DRA attribute's value (Backend.dra_describe)

__all__ = ["HALF_THERE", "KINDS", "NOT_A_DEVICE", "STRATEGIES", "Backend", "Device", "Inventory", "KindInventory",
           "backend", "check_strategy", "parse_pci_address", "scan", "scan_host", "stable_name"]
# A backend's reason that starts with this names a device that is half there (being removed, or being
# reconfigured): the per-container scan stops on it, as on a broken DRM entry, since skipping it renumbers.
HALF_THERE = "half there: "
# A backend's reason that ends with this names something of its vendor that is no device of its kind at all (an
# NVSwitch): listed as ignored, never counted as a device set aside.
NOT_A_DEVICE = ": not a GPU"


class Device:
    """One schedulable device of one kind: a whole GPU or one compute partition; what every vendor's device has.

    A backend whose devices carry more (AMD: partition modes, unique and hive ids; NVIDIA: UUIDs, MIG ids) subclasses
    it in its own module; the rest of the project reads those facts through :meth:`facts`, :attr:`label`,
    :attr:`part`, :attr:`mode` and :attr:`all_nodes` and the backend's methods (:class:`Backend`), never by name."""

    __slots__ = ("device_id", "driver", "drm_name", "index", "kind", "links", "masks", "model", "nodes", "numa_node",
                 "partition", "pci_address", "sysfs_dir", "vendor_id")

    def __init__(self, *, kind: str, nodes: tuple[Node, ...], links: tuple[tuple[str, str], ...], pci_address: str,
                 sysfs_dir: str, drm_name: str, numa_node: int | None = None, model: str = "",
                 vendor_id: str = "", device_id: str = "", driver: str | None = None, partition: int | None = None,
                 masks: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.index = -1  # set when the backend has ordered its devices
        self.nodes = nodes
        self.links = links
        self.pci_address = pci_address  # the GPU's (a partition's too)
        self.sysfs_dir = sysfs_dir
        self.drm_name = drm_name
        self.numa_node = numa_node
        self.model = model
        self.vendor_id = vendor_id
        self.device_id = device_id
        self.driver = driver
        self.partition = partition  # a split GPU's part: its number in the GPU (None: a whole GPU)
        self.masks = masks  # container paths besides sysfs_dir that mask_other_gpus hides when not granted

    @property
    def all_nodes(self) -> tuple[Node, ...]:
        """Every node of the device a container may be given (NVIDIA: its DRM nodes too, given with display)."""
        return self.nodes

    @property
    def card(self) -> Node | None:
        return next((n for n in self.all_nodes if n.path.startswith("/dev/dri/card")), None)

    @property
    def render(self) -> Node | None:
        return next((n for n in self.all_nodes if n.path.startswith("/dev/dri/renderD")), None)

    @property
    def label(self) -> str:
        """The device's index as its vendor spells it: ``3`` (NVIDIA: ``1:0`` for MIG device 0 of GPU 1)."""
        return str(self.index)

    @property
    def part(self) -> str:
        """Which part of its GPU the device is, for people: ``partition 3``, ``MIG gpu0/gi1/ci0``; "" when whole."""
        return "" if self.partition is None else f"partition {self.partition}"

    @property
    def mode(self) -> str:
        """The GPU's partition mode (AMD: ``CPX/NPS1``); "" for none."""
        return ""

    def facts(self) -> dict[str, object]:
        """The vendor's own facts of the device, by their ``list --json`` names (schemas/inventory.schema.json)."""
        return {}

    def __repr__(self) -> str:
        part = "" if self.partition is None else f" p{self.partition}"
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


STRATEGIES = ("single", "mixed")  # the device plugin's resource strategies (--resource-strategy)


def check_strategy(strategy: str) -> None:
    """A HookError for a resource strategy that is none of :data:`STRATEGIES`."""
    if strategy not in STRATEGIES:
        from oci_gpu_hook.errors import HookError

        raise HookError(f"unknown resource strategy {strategy!r} (valid: {', '.join(STRATEGIES)})")


class Backend:
    """One vendor's devices: how they are found, named, requested, granted and advertised.  Subclass it, override
    what the vendor does differently from the default, and make one instance, ``BACKEND``, in the module."""

    name = ""  # the kind: this backend's key in the vendor table (oci_gpu_hook.kinds.KINDS) and its module's name
    forms = ""  # request entries besides indices and ranges, for refusals ("PCI address or card name (cardN)")
    part = "partition"  # what one device of a split GPU is called (the device plugin's and DRA's type): NVIDIA "mig"
    plugin = False  # does the device plugin advertise this kind?
    plugin_always = False  # device plugin: serve the whole-GPU resource before any device is seen (the kubelet: 0)
    gone = "gone from sysfs"  # device plugin: why a device that was advertised is Unhealthy once it is not found

    # --- the devices ------------------------------------------------------------------------------------------

    def discover(self, root: str, drm: list[DrmDevice], proc_root: str,
                 driver_root: str) -> tuple[list[Device], tuple[Node, ...], dict[str, str]]:
        """The kind's devices in its index order (``index`` is set by the caller), the nodes every device of the
        kind needs (AMD ``/dev/kfd``), and what was looked at -> ``""`` when claimed, else why it is not a device
        (prefix :data:`oci_gpu_hook.inventory.HALF_THERE` when it is half there: the per-container scan stops on it;
        suffix :data:`oci_gpu_hook.inventory.NOT_A_DEVICE` for something of the vendor that is no GPU).  ``root``:
        the sysfs root; ``drm``: its DRM devices (:func:`oci_gpu_hook.inventory.sysfs.drm_devices`), which a
        backend claims by their ``directory``."""
        raise NotImplementedError(f"the {self.name or type(self).__name__} backend does not discover devices")

    def unclaimed(self, device_dir: str, owner: str | None, proc_root: str) -> str:
        """Why a DRM device bound to ``owner`` that no backend claimed is not this kind's ("" when this backend has
        nothing to say of it): a hint where the scan's roots are wrong for this vendor."""
        return ""

    def missing(self, root: str, proc_root: str, listed: set[str]) -> list[tuple[str, str]]:
        """Operator commands, when this kind found no device: the vendor's devices that the scan could not see,
        with why (NVIDIA: GPUs bound to its driver where the proc root has no ``driver/nvidia``)."""
        return []

    # --- requests ---------------------------------------------------------------------------------------------

    def stable_name(self, device: Device) -> str:
        """The CDI name that names ``device``'s hardware for as long as it exists, whatever else comes and goes."""
        return device.pci_address

    def indexed(self, devices: tuple[Device, ...]) -> tuple[Device, ...]:
        """The devices plain indices count (NVIDIA: the whole GPUs; a MIG device is ``GPU:MIG``)."""
        return devices

    def match(self, token: str, devices: tuple[Device, ...]) -> tuple[Device, ...] | str | None:
        """The devices one request entry names (never empty); a str saying why when the entry is of one of the
        backend's forms and names nothing; None when it is not of its forms (indices and ranges are then tried)."""
        return None

    def aliases(self, devices: tuple[Device, ...]) -> list[tuple[str, tuple[Device, ...]]]:
        """The CDI names besides the indices, with the devices each stands for; every device's stable name among
        them."""
        return [(self.stable_name(d), (d,)) for d in devices]

    def examples(self, devices: tuple[Device, ...]) -> list[str]:
        """What else is a valid request entry here, for refusals (``PCI addresses like 0000:23:00.0``)."""
        return []

    def present(self, devices: tuple[Device, ...], numbers: Set[tuple[str, int, int]]) -> tuple[Device, ...]:
        """The devices a container spec already carries, by its nodes' numbers: one of a device's own nodes
        (NVIDIA: a MIG device shares its GPU's node, so it is there when all its nodes are)."""
        return tuple(d for d in devices if any(n.number in numbers for n in d.nodes))

    # --- what a container gets --------------------------------------------------------------------------------

    def container_options(self, env: Sequence[str] | None) -> object:
        """What a container's env asks of the kind besides devices (NVIDIA: ``NVIDIA_DRIVER_CAPABILITIES``);
        None: nothing.  Passed back as ``options`` below (None there: everything, as a CDI spec gives it)."""
        return None

    def device_edits(self, device: Device, config: Config, options: object) -> Edits:
        """One device's own edits: its nodes with the configured mode and owner, its by-path links."""
        from oci_gpu_hook.core.edits import Edits

        made = tuple(n.made(config.device_file_mode, config.device_uid, config.device_gid) for n in device.nodes)
        return Edits(made, device.links)

    def kind_nodes(self, inventory: Inventory, options: object = None) -> tuple[Node, ...]:
        """The nodes every container with a device of the kind gets for ``options`` (default: the shared ones)."""
        return inventory.shared(self.name)

    def kind_edits(self, inventory: Inventory, options: object, config: Config) -> Edits:
        """What every container with a device of the kind gets: :meth:`kind_nodes` made with the configured mode
        and owner (NVIDIA: and the driver's files)."""
        from oci_gpu_hook.core.edits import Edits

        return Edits(tuple(n.made(config.device_file_mode, config.device_uid, config.device_gid)
                           for n in self.kind_nodes(inventory, options)))

    def refresh(self, devices: tuple[Device, ...]) -> str:
        """Read again what can change after a scan without the devices changing (NVIDIA: MIG UUIDs, through
        NVML), for a process that outlives its scan; "" when done, else why not."""
        return ""

    # --- the device plugin (when ``plugin``) ----------------------------------------------------------------

    def resource(self, name: str = "gpu") -> str:
        """A resource name in the vendor's domain (its CDI kind's): ``amd.com/gpu``, ``nvidia.com/mig-1g.10gb``."""
        from oci_gpu_hook.kinds import KINDS

        return f"{KINDS[self.name][0].partition('/')[0]}/{name}"

    def plugin_devices(self, inventory: Inventory, strategy: str) -> tuple[list[PluginEntry], list[str]]:
        """What the device plugin advertises under ``strategy`` (one of :data:`STRATEGIES`): (device, its plugin
        device ID, derived from its hardware and never from a position, its resource), and a line for each device
        left out.  Default: every device, by its stable name, as ``<domain>/gpu``."""
        return [(d, self.stable_name(d), self.resource()) for d in inventory.devices(self.name)], []

    # --- the DRA driver ---------------------------------------------------------------------------------------

    def dra_devices(self, inventory: Inventory) -> tuple[tuple[Device, ...], list[str]]:
        """The devices the DRA driver may publish (a GPU split into parts is published as its parts), and a line
        for each left out.  Default: every device."""
        return inventory.devices(self.name), []

    def dra_left_out(self, device: Device) -> str:
        """Why ``device`` (one of :meth:`dra_devices`) cannot be published now ("" when it can): NVIDIA, a MIG
        device NVML names no UUID for."""
        return ""

    def split_gpu(self, inventory: Inventory, device: Device,
                  devices: tuple[Device, ...]) -> tuple[str, Device | None, tuple[Device, ...]]:
        """For a part (``device.partition`` set) of a split GPU: a key naming that GPU, the device published as
        the whole (its first part where the inventory has no device for the GPU; None: publish no whole), and
        all its parts among ``devices``.  Default: the parts that share its PCI address."""
        parts = tuple(d for d in devices if d.partition is not None and d.pci_address == device.pci_address)
        return device.pci_address, parts[0], parts

    def parent_name(self, inventory: Inventory, device: Device) -> str | None:
        """A part's GPU, by its stable name (None for a whole GPU)."""
        return device.pci_address if device.partition is not None else None

    def driver_version(self, inventory: Inventory) -> str | None:
        """The version of the kind's driver (None: the kernel module's ``version`` in sysfs is used)."""
        return None

    def dra_describe(self, inventory: Inventory, device: Device,
                     whole: bool) -> tuple[dict[str, DraValue], dict[str, int]]:
        """The vendor's DRA attributes of ``device`` and its capacity in bytes (``memory``); ``whole``: those of the
        GPU that ``device``, its first part, belongs to.  An attribute's value is a str (a string attribute), an
        int, a (type, value) pair (``("version", "9.0.0")``) or None (not published).  The names are those of
        :data:`oci_gpu_hook.cluster.dra.devices.ATTRIBUTES` (one meaning across vendors, docs/dra.md); the common ones
        (vendor, type, model, PCI address, ...) are set by the DRA driver.  Default: none."""
        return {}, {}


def backend(kind: str) -> Backend:
    """The backend of ``kind`` (its module imported on first use): :class:`Backend`'s methods, overridden
    where the vendor differs."""
    if kind not in KINDS:
        raise KeyError(kind)
    name = f"oci_gpu_hook.inventory.{kind}"
    __import__(name)  # not importlib: importing it costs ~1 ms on every container start
    return sys.modules[name].BACKEND  # type: ignore[no-any-return]


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
                        or _unclaimed_reason(device, set(wanted) == set(KINDS), wanted, proc)))
    for what, reason in seen.items():  # devices without DRM nodes a backend looked at (NVIDIA)
        if reason:
            ignored.append((os.path.basename(what) if what.startswith("/") else what, reason.removeprefix(HALF_THERE)))
    if not strict:  # what a backend that found nothing could not see (NVIDIA: its GPUs, with another proc root)
        for kind in wanted:
            if not found[kind].devices:
                ignored += backend(kind).missing(root, proc, {name for name, _ in ignored})
    return Inventory(found, ignored, root, proc)


def scan_host(config: Config, kinds: Iterable[str] | None = None, *, strict: bool = False) -> Inventory:
    """:func:`scan` with the config's roots (sysfs, proc, driver) and backends: what the operator commands read."""
    return scan(config.sysfs_root, config.backends if kinds is None else kinds, strict=strict,
                proc_root=config.proc_root, driver_root=config.driver_root)


def _unclaimed_reason(device: object, every_backend: bool, wanted: list[str], proc_root: str) -> str:
    from oci_gpu_hook.inventory.sysfs import DrmDevice, driver, read

    assert isinstance(device, DrmDevice)
    owner = driver(device.directory) or "no driver"
    vendor = read(os.path.join(device.directory, "vendor")) or "no vendor"
    what = f"{owner}, {vendor}"
    if device.render is None:
        return f"{what}: no render node (a display-only device)"
    for kind in wanted:
        why = backend(kind).unclaimed(device.directory, owner, proc_root)
        if why:
            return f"{what}: {why}"
    return f"{what}: no backend claims it" if every_backend else f"{what}: not of the kinds scanned"
