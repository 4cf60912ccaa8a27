"""NVIDIA GPUs and MIG devices, numbered as nvidia-smi numbers them, and the driver's files a container needs.

Facts, with their sources, in ``docs/hardware.md#nvidia`` (``docs/hardware.md#nvidia-mig`` for MIG):

* A GPU is a ``/proc/driver/nvidia/gpus/<BDF>/information`` file (``Bus Location``, ``Device Minor``,
  ``GPU UUID``, ``Model``, ``GPU Excluded``) whose PCI device in sysfs is vendor ``0x10de``, a display
  controller (class ``0x03xxxx``) bound to ``nvidia``.  NVSwitches (``0x068000``), the GPUs' audio
  functions and GPUs the driver excluded are not GPUs here.
* Index order is PCI address order (nvidia-smi's and NVML's in practice).  The device minor is read from
  the information file, never taken from the index: ``/dev/nvidia<minor>`` is ``c <nvidia>:<minor>``.
* Majors come from ``/proc/devices`` (character devices): ``nvidia`` (driver 550.40 and later) or
  ``nvidia-frontend`` (older) for the GPUs, ``/dev/nvidiactl`` (minor 255) and ``/dev/nvidia-modeset``
  (254); dynamic ``nvidia-uvm`` (``/dev/nvidia-uvm`` 0, ``/dev/nvidia-uvm-tools`` 1) and ``nvidia-caps``.
* DRM nodes exist only when ``nvidia-drm`` is loaded (``module/nvidia_drm`` in sysfs): the GPU's PCI
  device then has ``drm/cardN`` and ``drm/renderDN``.  They, their ``/dev/dri/by-path`` links and
  ``/dev/nvidia-modeset`` go to a container that asks for ``graphics`` or ``display``.
* MIG devices: the compute instances under ``capabilities/gpu<minor>/mig/gi<G>/ci<C>/access`` in
  ``/proc/driver/nvidia``.  Each is the GPU's node plus two ``/dev/nvidia-caps/nvidia-cap<m>`` nodes
  (major ``nvidia-caps``), the GPU instance's and the compute instance's, whose minors are read from
  ``/proc/driver/nvidia-caps/mig-minors`` (``gpu<minor>/gi<G>/access <m>``), never computed.  MIG device
  ``M`` of GPU ``I`` (request ``I:M``) is the ``M``-th by (GPU instance id, compute instance id) [A: NVML's
  own MIG index order is not documented; this is the order its ids sort in].  MIG UUIDs exist only
  through NVML: :mod:`oci_gpu_hook.inventory.nvml` reads them when a request or a CDI spec needs them.

Requests (``NVIDIA_VISIBLE_DEVICES``, CDI ``nvidia.com/gpu``), as libnvidia-container reads them, strictly:
``all`` (every GPU and MIG device), GPU indices and ranges of them, ``GPU-<uuid>``, PCI addresses
(``0000:1a:00.0``, NVML's ``00000000:1a:00.0``, ``1a:00.0``), ``<gpu>:<mig>`` and ``MIG-<uuid>``.
``NVIDIA_DRIVER_CAPABILITIES`` (``compute``, ``utility``, ``graphics``, ``video``, ``display``, ``ngx``,
``all``; default ``utility,compute`` as in the toolkit) chooses which of the driver's files and nodes
are given: see :mod:`oci_gpu_hook.inventory.nvdriver`.
"""

from __future__ import annotations

import os

from oci_gpu_hook.core.devices import Node
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.inventory import HALF_THERE, NOT_A_DEVICE, Backend, Device
from oci_gpu_hook.inventory.sysfs import HEX_DIGITS, driver, follow, numa_node, parse_pci_address, read

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from collections.abc import Sequence, Set

    from oci_gpu_hook.config import Config
    from oci_gpu_hook.core.edits import Edits
    from oci_gpu_hook.inventory import DraValue, Inventory, PluginEntry
    from oci_gpu_hook.inventory.sysfs import DrmDevice

NAME = "nvidia"
VENDOR = "0x10de"
DRIVER = "nvidia"
FRONTEND_NAMES = ("nvidia", "nvidia-frontend")
CTL_MINOR, MODESET_MINOR = 255, 254
FORMS = "GPU UUID (GPU-...), PCI address, MIG device (GPU:MIG or MIG-...)"
CAPABILITY_ENV = "NVIDIA_DRIVER_CAPABILITIES"
CAPABILITIES = ("compute", "utility", "graphics", "video", "display", "ngx")
DEFAULT_CAPABILITIES = frozenset({"utility", "compute"})
DISPLAY_CAPABILITIES = frozenset({"graphics", "display"})


class NvidiaDevice(Device):
    """An NVIDIA GPU or MIG device: its UUID, the GPU's device minor, a MIG device's ids and GPU, the GPU's DRM nodes
    (given only with graphics or display) and where the driver's user space (NVML) is."""

    __slots__ = ("display_nodes", "driver_root", "mig", "minor", "parent", "uuid")

    def __init__(self, *, kind: str, nodes: tuple[Node, ...], links: tuple[tuple[str, str], ...], pci_address: str,
                 sysfs_dir: str, drm_name: str, numa_node: int | None = None, model: str = "", vendor_id: str = "",
                 device_id: str = "", driver: str | None = None, partition: int | None = None,
                 masks: tuple[str, ...] = (), uuid: str | None = None, minor: int | None = None,
                 mig: tuple[int, int] | None = None, parent: int | None = None, display_nodes: tuple[Node, ...] = (),
                 driver_root: str | None = None) -> None:
        # every argument spelt out, never **common: packing them costs ~3 µs a device on every container start
        Device.__init__(self, kind=kind, nodes=nodes, links=links, pci_address=pci_address, sysfs_dir=sysfs_dir,
                        drm_name=drm_name, numa_node=numa_node, model=model, vendor_id=vendor_id, device_id=device_id,
                        driver=driver, partition=partition, masks=masks)
        self.uuid = uuid  # GPU-... or MIG-... (a MIG device's from NVML, when asked)
        self.minor = minor  # the device minor of the GPU (of the parent GPU for a MIG device)
        self.mig = mig  # a MIG device: (GPU instance id, compute instance id); partition = its index in the GPU
        self.parent = parent  # a MIG device: the index of its GPU
        self.display_nodes = display_nodes  # DRM nodes, given with graphics or display
        self.driver_root = driver_root  # where the driver's user-space (NVML) is

    @property
    def all_nodes(self) -> tuple[Node, ...]:
        return self.nodes + self.display_nodes

    @property
    def label(self) -> str:
        """``3``, or ``1:0`` for MIG device 0 of GPU 1."""
        return f"{self.parent}:{self.partition}" if self.mig is not None else str(self.index)

    @property
    def part(self) -> str:
        return "" if self.mig is None else f"MIG {self.drm_name}"

    def facts(self) -> dict[str, object]:
        return {"uuid": self.uuid, "minor": self.minor, "mig": self.mig, "parent": self.parent}

    def __repr__(self) -> str:
        return f"Device({self.kind} {self.label}: {self.pci_address})"


def char_majors(proc_root: str) -> dict[str, int]:
    """``/proc/devices``: the character devices' majors by name."""
    majors: dict[str, int] = {}
    in_char = False
    for line in (read(os.path.join(proc_root, "devices")) or "").splitlines():
        if line.endswith("devices:"):
            in_char = line.startswith("Character")
            continue
        number, _, name = line.strip().partition(" ")
        if in_char and number.isdigit() and number.isascii() and name.strip():
            majors.setdefault(name.strip(), int(number))
    return majors


def information(path: str) -> dict[str, str] | None:
    """An information file's ``Key: value`` lines (split on the first colon, trimmed)."""
    text = read(path)
    if text is None:
        return None
    fields = {}
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if colon:
            fields[key.strip()] = value.strip()
    return fields


def _access_minor(path: str) -> int | None:
    """``DeviceFileMinor`` of a capability's access file in /proc (None when absent)."""
    fields = information(path) or {}
    value = fields.get("DeviceFileMinor", "")
    return int(value) if value.isdigit() and value.isascii() else None


def mig_minors(proc_root: str) -> dict[str, int]:
    """``/proc/driver/nvidia-caps/mig-minors``: ``gpu0/gi1/access`` -> its nvidia-cap minor."""
    out: dict[str, int] = {}
    for line in (read(os.path.join(proc_root, "driver", "nvidia-caps", "mig-minors")) or "").splitlines():
        name, _, minor = line.strip().partition(" ")
        if minor.strip().isdigit() and minor.strip().isascii():
            out[name] = int(minor)
    return out


def _numbered(directory: str, prefix: str) -> list[int]:
    """The N of every ``<prefix>N`` directory in ``directory``, sorted."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    out = []
    for name in names:
        digits = name[len(prefix):]
        if name.startswith(prefix) and digits.isdigit() and digits.isascii() and os.path.isdir(
                os.path.join(directory, name)):
            out.append(int(digits))
    return sorted(out)


def _gpu_problem(sys_dir: str, address: str) -> str:
    if not os.path.isdir(sys_dir):
        return f"{HALF_THERE}{address}: the driver lists it, sysfs has no such PCI device"
    vendor = (read(os.path.join(sys_dir, "vendor")) or "").lower()
    if vendor != VENDOR:
        return f"vendor {vendor or 'unknown'}, not NVIDIA's {VENDOR}"
    pci_class = (read(os.path.join(sys_dir, "class")) or "").lower()
    if not pci_class.startswith("0x03"):
        return f"class {pci_class or 'unknown'}: not a display controller (an NVSwitch or another function)"
    bound = driver(sys_dir)
    if bound != DRIVER:
        return f"bound to {bound or 'no driver'}, not {DRIVER}"
    return ""


def discover(root: str, drm: list[DrmDevice], proc_root: str = "/proc",
             driver_root: str = "/") -> tuple[list[NvidiaDevice], tuple[Node, ...], dict[str, str]]:
    """NVIDIA GPUs (PCI order) then MIG devices (by GPU, then GPU and compute instance id), the shared
    nodes, and what was looked at -> '' or why it is not a device."""
    gpus_dir = os.path.join(proc_root, "driver", "nvidia", "gpus")
    seen: dict[str, str] = {}
    try:
        names = os.listdir(gpus_dir)
    except FileNotFoundError:
        return [], (), seen  # no NVIDIA driver loaded
    except OSError as err:
        raise HookError(f"cannot list {gpus_dir}: {err.strerror}") from None
    majors = char_majors(proc_root)
    frontend = next((majors[n] for n in FRONTEND_NAMES if n in majors), None)
    drm_loaded = os.path.isdir(os.path.join(root, "module", "nvidia_drm"))
    by_dir = {d.directory: d for d in drm if d.pci is not None}
    found: list[tuple[tuple[int, int, int, int], NvidiaDevice, list[DrmDevice]]] = []
    for name in sorted(names):
        info = information(os.path.join(gpus_dir, name, "information"))
        address = ((info or {}).get("Bus Location") or name).lower()
        pci = parse_pci_address(address)
        sys_dir = follow(os.path.join(root, "bus", "pci", "devices", address))
        minor = (info or {}).get("Device Minor", "")
        why = ""
        if info is None:
            why = f"{HALF_THERE}cannot read {gpus_dir}/{name}/information"
        elif pci is None:
            why = f"Bus Location {address!r} is not a PCI address"
        elif not (minor.isdigit() and minor.isascii()):
            why = f"no Device Minor in {gpus_dir}/{name}/information"
        elif info.get("GPU Excluded", "No").lower().startswith("y"):
            why = "excluded by the driver (GPU Excluded: Yes)"
        elif frontend is None:
            why = f"no '{FRONTEND_NAMES[0]}' (or '{FRONTEND_NAMES[1]}') character major in {proc_root}/devices"
        else:
            why = _gpu_problem(sys_dir, address)
        if why or info is None or pci is None:
            seen[address if pci is None else sys_dir] = why
            continue
        assert frontend is not None
        card = by_dir.get(sys_dir)
        display: tuple[Node, ...] = ()
        links: tuple[tuple[str, str], ...] = ()
        claimed = []
        if card is not None and drm_loaded:
            if card.problem:
                seen[card.directory] = card.problem
            else:
                display, links = card.nodes, card.links()
                claimed.append(card)
        found.append((pci, NvidiaDevice(
            kind=NAME, nodes=(Node(f"/dev/nvidia{int(minor)}", "c", frontend, int(minor)),), links=links,
            pci_address=address, sysfs_dir=sys_dir, drm_name=address, numa_node=numa_node(sys_dir),
            model=info.get("Model") or "NVIDIA GPU", vendor_id=VENDOR,
            device_id=(read(os.path.join(sys_dir, "device")) or "").lower(), driver=DRIVER,
            uuid=info.get("GPU UUID") or None, minor=int(minor), display_nodes=display,
            masks=(f"/proc/driver/nvidia/gpus/{name}",), driver_root=driver_root), claimed))
    found.sort(key=lambda item: item[0])
    gpus = [device for _pci, device, _drm in found]
    for _pci, device, claimed in found:
        seen[device.sysfs_dir] = ""
        for card in claimed:
            seen[card.directory] = ""
    switches = os.path.join(root, "bus", "pci", "drivers", "nvidia-nvswitch")
    for name in sorted(os.listdir(switches)) if os.path.isdir(switches) else ():
        if parse_pci_address(name):
            seen[follow(os.path.join(switches, name))] = "an NVSwitch (nvidia-nvswitch)" + NOT_A_DEVICE
    migs = _mig_devices(proc_root, gpus, majors.get("nvidia-caps"), seen)
    if not gpus:
        return [], (), seen
    assert frontend is not None
    shared = [Node("/dev/nvidiactl", "c", frontend, CTL_MINOR)]
    uvm = majors.get("nvidia-uvm")
    if uvm is not None:
        shared += [Node("/dev/nvidia-uvm", "c", uvm, 0), Node("/dev/nvidia-uvm-tools", "c", uvm, 1)]
    return gpus + migs, tuple(shared), seen


def _mig_devices(proc_root: str, gpus: list[NvidiaDevice], caps_major: int | None,
                 seen: dict[str, str]) -> list[NvidiaDevice]:
    minors = None
    out = []
    for index, gpu in enumerate(gpus):
        mig_dir = os.path.join(proc_root, "driver", "nvidia", "capabilities", f"gpu{gpu.minor}", "mig")
        position = 0
        for gi in _numbered(mig_dir, "gi"):
            gi_dir = os.path.join(mig_dir, f"gi{gi}")
            for ci in _numbered(gi_dir, "ci"):
                if minors is None:
                    minors = mig_minors(proc_root)
                what = f"{gpu.pci_address} MIG gi{gi}/ci{ci}"
                caps = []
                why = "" if caps_major is not None else f"no 'nvidia-caps' character major in {proc_root}/devices"
                pairs = ((f"gpu{gpu.minor}/gi{gi}/access", os.path.join(gi_dir, "access")),
                         (f"gpu{gpu.minor}/gi{gi}/ci{ci}/access", os.path.join(gi_dir, f"ci{ci}", "access")))
                for cap, access in pairs:
                    minor = minors.get(cap)
                    stated = _access_minor(access)
                    if minor is None:
                        why = why or f"{HALF_THERE}{cap} is not in {proc_root}/driver/nvidia-caps/mig-minors"
                    elif stated is not None and stated != minor:
                        why = why or f"{HALF_THERE}{access} says DeviceFileMinor {stated}, mig-minors says {minor}"
                    caps.append(minor)
                if why:
                    seen[what] = why
                    continue
                assert caps_major is not None and caps[0] is not None and caps[1] is not None
                out.append(NvidiaDevice(
                    kind=NAME, nodes=(gpu.nodes[0], *(Node(f"/dev/nvidia-caps/nvidia-cap{m}", "c", caps_major, m)
                                                      for m in caps)),
                    links=(), pci_address=gpu.pci_address, sysfs_dir=gpu.sysfs_dir,
                    drm_name=f"gpu{gpu.minor}/gi{gi}/ci{ci}", numa_node=gpu.numa_node, model=gpu.model,
                    vendor_id=VENDOR, device_id=gpu.device_id, driver=DRIVER, partition=position,
                    minor=gpu.minor, mig=(gi, ci), parent=index, driver_root=gpu.driver_root))
                position += 1
    return out


# --- requests ---------------------------------------------------------------------------------


def indexed(devices: tuple[NvidiaDevice, ...]) -> tuple[NvidiaDevice, ...]:
    """The devices plain indices count: the whole GPUs (MIG devices are ``GPU:MIG``)."""
    return tuple(d for d in devices if d.mig is None)


def _gpu_index(token: str, gpus: tuple[NvidiaDevice, ...]) -> NvidiaDevice | str:
    if not token.isdigit() or not token.isascii():
        return "is not an nvidia GPU index"
    digits = token.lstrip("0") or "0"
    if not gpus:
        return "is out of range: this host has no nvidia GPUs"
    if len(digits) > 9 or int(digits) >= len(gpus):
        return f"is out of range (the host has {len(gpus)} nvidia GPUs)"
    return gpus[int(digits)]


def _uuids(devices: tuple[NvidiaDevice, ...], token: str) -> tuple[NvidiaDevice, ...] | str:
    from oci_gpu_hook.inventory import nvml

    lower = token.lower()
    if lower.startswith("mig-"):
        problem = nvml.fill_mig_uuids(devices)
        chosen = tuple(d for d in devices if d.mig is not None and (d.uuid or "").lower() == lower)
        if chosen:
            return chosen
        return problem or "is not the UUID of a MIG device on this host"
    chosen = tuple(d for d in devices if d.mig is None and (d.uuid or "").lower() == lower)
    return chosen or "is not the UUID of an NVIDIA GPU on this host"


def match(token: str, devices: tuple[NvidiaDevice, ...]) -> tuple[NvidiaDevice, ...] | str | None:
    """The devices an NVIDIA entry names; a str saying why when it names nothing; None: not an NVIDIA form."""
    lower = token.lower()
    gpus = indexed(devices)
    if lower.startswith(("gpu-", "mig-")):
        if len(lower) == 4:
            return "is not a valid UUID"
        return _uuids(devices, token)
    if "." in token and ":" in token:  # a PCI address; NVML writes an 8-digit domain
        parts = lower.split(":")
        if len(parts) == 2:
            parts = ["0000", *parts]
        if len(parts) == 3 and len(parts[0]) == 8 and set(parts[0]) <= HEX_DIGITS and parts[0].startswith("0000"):
            parts[0] = parts[0][4:]
        address = ":".join(parts)
        if parse_pci_address(address) is None:
            return "is not a valid PCI address"
        chosen = tuple(d for d in gpus if d.pci_address == address)
        return chosen or "is not the PCI address of an NVIDIA GPU on this host"
    if ":" in token:
        gpu, _, mig = token.partition(":")
        parent = _gpu_index(gpu, gpus)
        if isinstance(parent, str):
            return f"names GPU '{gpu}', which {parent}"
        mine = [d for d in devices if d.mig is not None and d.parent == parent.index]
        if not mig.isdigit() or not mig.isascii():
            return "is not a MIG device (expected GPU:MIG, e.g. 0:0)"
        if not mine:
            return f"names MIG device {mig} of GPU {gpu}, which has no MIG devices"
        if len(mig.lstrip("0") or "0") > 3 or int(mig) >= len(mine):
            return f"is out of range (GPU {gpu} has {len(mine)} MIG devices)"
        return (mine[int(mig)],)
    if token.isdigit() and token.isascii():
        found = _gpu_index(token, gpus)
        return found if isinstance(found, str) else (found,)
    first, dash, last = token.partition("-")
    if dash and (first.isdigit() or last.isdigit() or not first or not last):
        if not first or not last:
            return "is not a valid range (expected FIRST-LAST, e.g. 0-3)"
        start, stop = _gpu_index(first, gpus), _gpu_index(last, gpus)
        for end, found in ((first, start), (last, stop)):
            if isinstance(found, str):
                return f"is a range whose end '{end}' {found}"
        assert isinstance(start, NvidiaDevice) and isinstance(stop, NvidiaDevice)
        if start.index > stop.index:
            return "is a range that runs backwards"
        return gpus[start.index:stop.index + 1]
    return None


def stable_name(device: NvidiaDevice) -> str:
    """A GPU's UUID; a MIG device's UUID when NVML says it, else its ``GPU:MIG`` index (which moves when
    instances before it are destroyed: run where NVML works for stable MIG names)."""
    if device.mig is not None:
        from oci_gpu_hook.inventory import nvml

        nvml.fill_mig_uuids((device,))
    return device.uuid or (device.label if device.mig is not None else device.pci_address)


def present(devices: tuple[NvidiaDevice, ...], numbers: Set[tuple[str, int, int]]) -> tuple[NvidiaDevice, ...]:
    """The devices a spec already carries: a MIG device when all its nodes are there (its GPU's and both caps
    nodes), a whole GPU when its node is there and no MIG device of it is (a MIG grant carries the GPU's node)."""
    migs = [d for d in devices if d.mig is not None and all(n.number in numbers for n in d.nodes)]
    parents = {d.parent for d in migs}
    gpus = [d for d in devices if d.mig is None and d.index not in parents and d.nodes[0].number in numbers]
    return tuple(sorted(gpus + migs, key=lambda d: d.index))


def aliases(devices: tuple[NvidiaDevice, ...]) -> list[tuple[str, tuple[NvidiaDevice, ...]]]:
    """CDI names besides the GPU indices: ``GPU:MIG`` and the UUIDs (MIG UUIDs when NVML can say them)."""
    from oci_gpu_hook.inventory import nvml

    nvml.fill_mig_uuids(devices)
    out: list[tuple[str, tuple[NvidiaDevice, ...]]] = []
    for device in devices:
        if device.mig is not None:
            out.append((device.label, (device,)))
    for device in devices:
        if device.uuid:
            out.append((device.uuid, (device,)))
        elif device.mig is None:  # no UUID (never seen): its PCI address is its stable name
            out.append((device.pci_address, (device,)))
    return out


def examples(devices: tuple[NvidiaDevice, ...]) -> list[str]:
    gpus = indexed(devices)
    out = [f"GPU UUIDs like {gpus[0].uuid}"] if gpus and gpus[0].uuid else []
    if gpus:
        out.append(f"PCI addresses like {gpus[0].pci_address}")
    migs = [d for d in devices if d.mig is not None]
    if migs:
        out.append(f"MIG devices like {migs[0].label}")
    return out


# --- what a container gets ---------------------------------------------------------------------


def capabilities(value: str | None) -> frozenset[str]:
    """``NVIDIA_DRIVER_CAPABILITIES``: unset or empty is the toolkit's default (utility, compute)."""
    if value is None or not value.strip():
        return DEFAULT_CAPABILITIES
    words = [w.strip().lower() for w in value.split(",") if w.strip()]
    if "all" in words:
        return frozenset(CAPABILITIES)
    for word in words:
        if word == "compat32":
            raise HookError(f"{CAPABILITY_ENV}={value}: 'compat32' (32-bit driver libraries) is not served by this "
                            f"hook (valid: all, {', '.join(CAPABILITIES)})")
        if word not in CAPABILITIES:
            raise HookError(f"{CAPABILITY_ENV}={value}: '{word}' is not a driver capability "
                            f"(valid: all, {', '.join(CAPABILITIES)})")
    return frozenset(words)


def container_options(env: Sequence[str] | None) -> frozenset[str]:
    from oci_gpu_hook.oci_spec import env_value

    return capabilities(env_value(env, CAPABILITY_ENV))


def device_edits(device: NvidiaDevice, config: Config, options: frozenset[str] | None) -> Edits:
    """A device's nodes; its DRM nodes and by-path links only with graphics or display."""
    from oci_gpu_hook.core.edits import Edits

    nodes, links = device.nodes, device.links
    if options is None or options & DISPLAY_CAPABILITIES:
        nodes += device.display_nodes
    else:
        links = ()
    return Edits(tuple(n.made(config.device_file_mode, config.device_uid, config.device_gid) for n in nodes), links)


def kind_nodes(inventory: Inventory, options: frozenset[str] | None = None) -> tuple[Node, ...]:
    """The nodes every NVIDIA container gets for ``options`` (None: every capability, as a CDI spec gives them):
    /dev/nvidiactl, /dev/nvidia-uvm*, and /dev/nvidia-modeset with display when nvidia-modeset is loaded."""
    nodes = inventory.shared(NAME)
    caps = frozenset(CAPABILITIES) if options is None else options
    if "display" in caps and nodes and os.path.isdir(os.path.join(inventory.sysfs_root, "module", "nvidia_modeset")):
        nodes += (Node("/dev/nvidia-modeset", "c", nodes[0].major, MODESET_MINOR),)
    return nodes


def kind_edits(inventory: Inventory, options: frozenset[str] | None, config: Config) -> Edits:
    """What every NVIDIA container gets: /dev/nvidiactl and /dev/nvidia-uvm*, /dev/nvidia-modeset with display
    (when nvidia-modeset is loaded), and the driver's files for ``options`` (None: every capability)."""
    from oci_gpu_hook.core.edits import Edits
    from oci_gpu_hook.inventory import nvdriver

    caps = frozenset(CAPABILITIES) if options is None else options
    nodes = kind_nodes(inventory, options)
    if not nodes:  # no NVIDIA GPU: nothing of the driver either
        return Edits()
    made = tuple(n.made(config.device_file_mode, config.device_uid, config.device_gid) for n in nodes)
    found = nvdriver.survey(inventory.proc_root, config.driver_root, caps, inventory.sysfs_root)
    if found.skipped:  # one line each (a wrapper script, a json naming a library it will not have); the rest is given
        from oci_gpu_hook.log import warn

        for line in found.skipped:
            warn(f"nvidia driver file left out: {line}", config=config)
    return Edits.merged([Edits(made), found.edits])


class Nvidia(Backend):
    """NVIDIA GPUs and MIG devices, and the driver's files (module docstring); what the device plugin advertises and
    the DRA driver publishes of them is :mod:`oci_gpu_hook.inventory.nvcluster` (off the start path)."""

    name = NAME
    forms = FORMS
    part = "mig"
    plugin = True
    gone = "gone from the driver's /proc, sysfs or NVML"

    discover = staticmethod(discover)  # type: ignore[assignment]
    stable_name = staticmethod(stable_name)  # type: ignore[assignment]
    indexed = staticmethod(indexed)  # type: ignore[assignment]
    match = staticmethod(match)  # type: ignore[assignment]
    aliases = staticmethod(aliases)  # type: ignore[assignment]
    examples = staticmethod(examples)  # type: ignore[assignment]
    present = staticmethod(present)  # type: ignore[assignment]
    container_options = staticmethod(container_options)  # type: ignore[assignment]
    device_edits = staticmethod(device_edits)  # type: ignore[assignment]
    kind_nodes = staticmethod(kind_nodes)  # type: ignore[assignment]
    kind_edits = staticmethod(kind_edits)  # type: ignore[assignment]

    def unclaimed(self, device_dir: str, owner: str | None, proc_root: str) -> str:
        if owner == DRIVER and not os.path.isdir(os.path.join(proc_root, "driver", "nvidia")):
            return (f"the nvidia backend needs {proc_root}/driver/nvidia, missing under the proc root {proc_root} "
                    "(try --proc-root HOST/proc)")
        return ""

    def missing(self, root: str, proc_root: str, listed: set[str]) -> list[tuple[str, str]]:
        """The PCI devices bound to the nvidia driver (with no DRM node, so not listed yet) where the proc root has
        no ``driver/nvidia``: a host's sysfs read with another proc root (``--proc-root``)."""
        if os.path.isdir(os.path.join(proc_root, "driver", "nvidia")):
            return []
        devices = os.path.join(root, "bus", "pci", "devices")
        try:
            names = sorted(os.listdir(devices))
        except OSError:
            return []
        return [(name, f"nvidia, {read(os.path.join(devices, name, 'vendor')) or 'no vendor'}: "
                       f"{self.unclaimed('', DRIVER, proc_root)}")
                for name in names if name not in listed and driver(os.path.join(devices, name)) == DRIVER]

    def refresh(self, devices: tuple[Device, ...]) -> str:
        from oci_gpu_hook.inventory import nvml

        return nvml.refresh(devices) if devices else ""

    def plugin_devices(self, inventory: Inventory, strategy: str) -> tuple[list[PluginEntry], list[str]]:
        from oci_gpu_hook.inventory import nvcluster

        return nvcluster.plugin_devices(inventory, strategy)

    def dra_devices(self, inventory: Inventory) -> tuple[tuple[Device, ...], list[str]]:
        from oci_gpu_hook.inventory import nvcluster

        return nvcluster.dra_devices(inventory)

    def dra_left_out(self, device: Device) -> str:
        assert isinstance(device, NvidiaDevice)
        return f"nvidia MIG device {device.label} left out: NVML names no UUID for it" if (
            device.mig is not None and not device.uuid) else ""

    def split_gpu(self, inventory: Inventory, device: Device,
                  devices: tuple[Device, ...]) -> tuple[str, Device | None, tuple[Device, ...]]:
        """A MIG device's GPU: published whole as the GPU's own device."""
        assert isinstance(device, NvidiaDevice)
        parts = tuple(d for d in devices if isinstance(d, NvidiaDevice) and d.mig is not None
                      and d.parent == device.parent)
        return f"gpu {device.parent}", _gpu_of(inventory, device), parts

    def parent_name(self, inventory: Inventory, device: Device) -> str | None:
        assert isinstance(device, NvidiaDevice)
        gpu = _gpu_of(inventory, device) if device.mig is not None else None
        return stable_name(gpu) if gpu is not None else None

    def driver_version(self, inventory: Inventory) -> str | None:
        from oci_gpu_hook.inventory import nvcluster

        return nvcluster.driver_version(inventory.proc_root)

    def dra_describe(self, inventory: Inventory, device: Device,
                     whole: bool) -> tuple[dict[str, DraValue], dict[str, int]]:
        from oci_gpu_hook.inventory import nvcluster

        return nvcluster.dra_describe(device)


def _gpu_of(inventory: Inventory, device: NvidiaDevice) -> NvidiaDevice | None:
    """A MIG device's GPU."""
    return next((d for d in inventory.devices(NAME) if isinstance(d, NvidiaDevice) and d.mig is None
                 and d.index == device.parent), None)


BACKEND = Nvidia()
