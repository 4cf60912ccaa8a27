"""One set of container edits, computed once from inventory + request + config.

Every applier applies this value: the spec rewrite (``dry-run``, ``precreate``,
``oci-gpu-runtime``) writes it into config.json; the live ``prestart`` hook makes
the nodes and links and extends the device cgroup; the CDI spec carries the
same edits per device.  It says *what* the container gets, never *how*.
"""

from __future__ import annotations

from oci_gpu_hook.core.edits import Edits

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from typing import Any

    from oci_gpu_hook.config import Config
    from oci_gpu_hook.core.devices import Rule
    from oci_gpu_hook.inventory import Device, Inventory
    from oci_gpu_hook.oci_spec import ContainerSpec
    from oci_gpu_hook.request import Request


class Plan:
    """The devices granted and the edits that grant them.  Empty = touch nothing."""

    __slots__ = ("devices", "edits", "request", "rules")

    def __init__(self, request: Request, devices: tuple[Device, ...], edits: Edits, rules: tuple[Rule, ...]) -> None:
        self.request = request
        self.devices = devices
        self.edits = edits
        self.rules = rules

    def __bool__(self) -> bool:
        return bool(self.edits.nodes or self.edits.mounts)

    @property
    def nodes(self) -> tuple[Any, ...]:
        return self.edits.nodes

    def summary(self) -> str:
        """``amd 1 (0000:23:00.0): /dev/dri/card2 /dev/dri/renderD129 /dev/kfd``, and the request's note."""
        note = f" ({self.request.note})" if self.request.note else ""
        if not self.devices:
            asked = any(a.values for a in self.request.asks) or bool(self.request.note)  # a request set aside
            return ("no GPU granted" if asked else "no GPU requested") + note
        parts = []
        for device in self.devices:
            part = f" {device.part}" if device.part else ""
            parts.append(f"{device.kind} {device.label} ({device.pci_address}{part})")
        mounts = f" + {len(self.edits.mounts)} driver files" if self.edits.mounts else ""
        return ", ".join(parts) + ": " + " ".join(n.path for n in self.edits.nodes) + mounts + note

    def record(self, config: Config, entry: str, cid: str | None, started: float, **extra: Any) -> None:
        """The log line of a run that granted GPUs, or ignored a request (``allow_env_requests``, annotations
        won, ``all`` of a kind the host has none of); none for a container that asked for nothing, nor without a log
        file (:mod:`oci_gpu_hook.log`).  What was ignored also goes to the journal, at info level (the config's
        ``syslog``): where a pod got no GPU by its env, the node's journal says why."""
        if self.request.note:
            from oci_gpu_hook.log import to_syslog

            to_syslog(config, "info", entry, self.summary(), cid)
        if (not self and not self.request.note) or not config.log_file:
            return
        import time

        from oci_gpu_hook.log import record

        fields: dict[str, Any] = {"entry": entry, "id": cid, "source": self.request.source,
                                  "request": self.request.value, "devices": [n.path for n in self.nodes]}
        if self.request.note:
            fields["note"] = self.request.note
        record(config, **fields, **extra, outcome="ok" if self else "ignored",
               duration_ms=round((time.monotonic() - started) * 1000, 2))


def device_edits(device: Device, config: Config, options: object = None) -> Edits:
    """One device's own edits: its nodes (with the configured mode and owner) and by-path links; ``options``:
    what the container asked of its kind besides devices (NVIDIA: driver capabilities; None: everything)."""
    from oci_gpu_hook.inventory import backend

    return backend(device.kind).device_edits(device, config, options)


def shared_edits(inventory: Inventory, kind: str, config: Config, options: object = None) -> Edits:
    """What every device of ``kind`` needs (AMD: /dev/kfd; NVIDIA: its control nodes and driver files)."""
    from oci_gpu_hook.inventory import backend

    return backend(kind).kind_edits(inventory, options, config)


def container_options(kind: str, env: list[str] | None) -> object:
    """What a container's env asks of ``kind`` besides devices (NVIDIA_DRIVER_CAPABILITIES); None for none."""
    from oci_gpu_hook.inventory import backend

    return backend(kind).container_options(env)


def masked_paths(inventory: Inventory, granted: tuple[Device, ...]) -> tuple[str, ...]:
    """The sysfs directories of every device not granted (a PCI GPU's only when none of its partitions is)."""
    from oci_gpu_hook.inventory.sysfs import container_path

    mine = {d.sysfs_dir for d in granted}
    gpus = {d.pci_address for d in granted}
    out = []
    for device in inventory.all_devices:
        if device.sysfs_dir in mine:
            continue
        if device.partition in (None, 0) and device.pci_address in gpus:
            continue  # the PCI device of a GPU the container has a partition of
        out.append(container_path(inventory.sysfs_root, device.sysfs_dir))
        out.extend(device.masks)
    return tuple(sorted(set(out)))


def build_plan(inventory: Inventory, request: Request, config: Config, env: list[str] | None = None) -> Plan:
    """Each granted device's edits, then its kind's shared ones; one allow rule per node.  ``env``: the
    container's, for what it asks of a kind besides devices (NVIDIA_DRIVER_CAPABILITIES)."""
    devices = tuple(d for kind in request.devices for d in request.devices[kind])
    options = {kind: container_options(kind, env) for kind, chosen in request.devices.items() if chosen}
    parts = [device_edits(d, config, options[d.kind]) for d in devices]
    for kind, chosen in request.devices.items():
        if chosen:
            parts.append(shared_edits(inventory, kind, config, options[kind]))
    if devices and config.mask_other_gpus:
        parts.append(Edits(masked=masked_paths(inventory, devices)))
    edits = Edits.merged(parts)
    return Plan(request, devices, edits, edits.rules(config.cgroup_access))


def plan_for_spec(spec: ContainerSpec, config: Config, devices: str | None = None) -> Plan:
    """The plan for a container's config.json.

    ``devices`` (``dry-run --devices``) replaces the request the spec carries.  When nothing is
    requested sysfs is not even read and the plan is empty; otherwise only the kinds asked for are
    scanned (so only their backends are imported), plus every kind when other GPUs are masked.
    """
    from oci_gpu_hook.request import Request, asks_for, resolve

    asks = asks_for(spec, config, devices)
    if not any(a.values for a in asks):
        return Plan(Request(asks), (), Edits(), ())
    from oci_gpu_hook.inventory import scan

    kinds = None if config.mask_other_gpus else [a.kind for a in asks if a.values]
    inventory = scan(config.sysfs_root, kinds, proc_root=config.proc_root, driver_root=config.driver_root)
    return build_plan(inventory, resolve(asks, inventory, spec.present), config, spec.env)
