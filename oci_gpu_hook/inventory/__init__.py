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

What a backend provides, and the default for what it does not, is :class:`.vendor.Backend`
(``vendor.py``): a backend module holds a subclass of it and one instance, ``BACKEND``.
"""

from __future__ import annotations

import os
import sys

from oci_gpu_hook.inventory.sysfs import drm_devices, parse_pci_address
from oci_gpu_hook.inventory.vendor import Backend, Device, Inventory, KindInventory
from oci_gpu_hook.kinds import KINDS

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms per container start

if TYPE_CHECKING:
    from collections.abc import Iterable

    from oci_gpu_hook.config import Config

__all__ = ["HALF_THERE", "KINDS", "NOT_A_DEVICE", "Backend", "Device", "Inventory", "KindInventory", "backend",
           "parse_pci_address", "scan", "scan_host", "stable_name"]
# A backend's reason that starts with this names a device that is half there (being removed, or being
# reconfigured): the per-container scan stops on it, as on a broken DRM entry, since skipping it renumbers.
HALF_THERE = "half there: "
# A backend's reason that ends with this names something of its vendor that is no device of its kind at all (an
# NVSwitch): listed as ignored, never counted as a device set aside.
NOT_A_DEVICE = ": not a GPU"


def backend(kind: str) -> Backend:
    """The backend of ``kind`` (its module imported on first use): :class:`.vendor.Backend`'s methods, overridden
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
