"""NVIDIA on the cluster side: what the device plugin advertises and the DRA driver publishes of NVIDIA GPUs and MIG
devices (the :class:`oci_gpu_hook.inventory.nvidia.Nvidia` backend's ``plugin_devices``, ``dra_devices``,
``driver_version`` and ``dra_describe``).

Apart from :mod:`oci_gpu_hook.inventory.nvidia` so that the per-container path, which imports that module for every
NVIDIA request, never loads this code.  A MIG device's UUID and profile, and a GPU's memory and compute capability,
are known only to NVML (:mod:`oci_gpu_hook.inventory.nvml`), read afresh at every scan.  The devices here are
:class:`oci_gpu_hook.inventory.nvidia.NvidiaDevice` (typed ``Device``: nvidia.py imports this module).
"""

from __future__ import annotations

import os
import re

from oci_gpu_hook.inventory import backend, check_strategy
from oci_gpu_hook.inventory.sysfs import read

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from oci_gpu_hook.inventory import Device, DraValue, Inventory, PluginEntry

NAME = "nvidia"


def mig_resource(profile: str) -> str:
    """Mixed strategy: ``1g.10gb`` -> ``nvidia.com/mig-1g.10gb``, ``1g.10gb+me`` -> ``nvidia.com/mig-1g.10gb.me``."""
    return backend(NAME).resource(f"mig-{profile.replace('+', '.')}")


def _mig_name(device: Device) -> str:
    assert device.mig is not None
    return f"MIG device {device.label} ({device.pci_address} gi{device.mig[0]}/ci{device.mig[1]})"


def plugin_devices(inventory: Inventory, strategy: str) -> tuple[list[PluginEntry], list[str]]:
    """As NVIDIA's plugin: whole GPUs by UUID as ``nvidia.com/gpu`` (a GPU split into MIG devices is not advertised
    whole); MIG devices by MIG UUID, as ``nvidia.com/mig-<profile>`` (mixed) or ``nvidia.com/gpu`` (single: when
    every GPU is split into MIG devices of one profile, else not at all, and a line says why).  A MIG device's UUID
    and profile come from NVML, read afresh: a MIG device NVML cannot name is left out."""
    from oci_gpu_hook.inventory import nvml

    check_strategy(strategy)
    devices = inventory.devices(NAME)
    migs = [d for d in devices if d.mig is not None]
    split = {d.parent for d in migs}
    whole = [d for d in devices if d.mig is None and d.index not in split]
    resource = backend(NAME).resource()
    entries: list[PluginEntry] = [(d, d.uuid or d.pci_address, resource) for d in whole]
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


def dra_devices(inventory: Inventory) -> tuple[tuple[Device, ...], list[str]]:
    """The GPUs not split into MIG devices and the MIG devices NVML names (their UUIDs and profiles read afresh);
    the GPUs' memory and compute capability read from NVML (once per GPU)."""
    from oci_gpu_hook.inventory import nvml

    devices = inventory.devices(NAME)
    notes = []
    migs = [d for d in devices if d.mig is not None]
    problem = nvml.refresh(migs) if migs else ""
    if problem:
        notes.append(f"{len(migs)} MIG device(s) left out: only NVML names them, and {problem}")
        migs = []
    problem = nvml.gpu_facts([d for d in devices if d.mig is None])
    if problem:
        notes.append(f"nvidia GPUs' memory and compute capability left out: only NVML says them, and {problem}")
    split = {d.parent for d in devices if d in migs}  # a split GPU is published as its MIG devices
    return tuple(d for d in devices if (d.mig is None and d.index not in split) or d in migs), notes


def driver_version(proc_root: str) -> str | None:
    """``535.104.05`` from /proc/driver/nvidia/version (the first word that is a dotted number)."""
    text = read(os.path.join(proc_root, "driver", "nvidia", "version")) or ""
    line = text.splitlines()[0] if text else ""
    return next((w for w in line.split() if re.fullmatch(r"\d+(\.\d+)+", w)), None)


def dra_describe(device: Device) -> tuple[dict[str, DraValue], dict[str, int]]:
    """The UUID, the model as the product name, a MIG device's profile, and from NVML the compute capability (and
    the architecture it names, ``sm_90``) and the memory (a MIG device's: its profile's)."""
    from oci_gpu_hook.inventory import nvml

    attributes: dict[str, DraValue] = {"uuid": device.uuid, "productName": device.model}
    if device.mig is not None:
        attributes["migProfile"] = nvml.profile(device)
    capability = nvml.compute_capability(device)
    if re.fullmatch(r"\d+\.\d+", capability):
        major, minor = capability.split(".")
        attributes["computeCapability"] = ("version", f"{int(major)}.{int(minor)}.0")
        attributes["architecture"] = ("string", f"sm_{int(major)}{int(minor)}")
    memory = nvml.gpu_memory(device)
    return attributes, ({"memory": memory} if memory > 0 else {})


