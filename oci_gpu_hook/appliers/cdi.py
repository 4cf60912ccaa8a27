"""CDI specs: the plan's container edits for every GPU, as a spec file podman, containerd and CRI-O read.

One CDI device per GPU, under its index and, as alternative names (CDI has no
aliases, so each is a device with the same edits), its PCI address and unique
id; plus ``all``.  Each device's edits are that GPU's nodes; the nodes its
vendor shares (``/dev/kfd``) are the spec-wide edits, which apply whenever any
device of the spec is used.  The edits are built from the same node model the
plan uses, so the CDI path gives a container the same view as the hooks.
"""

from __future__ import annotations

import json
import os
from typing import Any

from oci_gpu_hook.atomic import write_atomic
from oci_gpu_hook.config import Config
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.inventory import Gpu, Inventory
from oci_gpu_hook.plan import node_edit

# Device names starting with a digit need CDI 0.5.0 (specs-go/version.go: requiresV050); nothing
# else used here needs more, and nothing later is needed.
CDI_VERSION = "0.5.0"


def _node(node: Any, config: Config) -> dict[str, Any]:
    edit = node_edit(node, config)
    return {"path": edit.path, "type": edit.type, "major": edit.major, "minor": edit.minor,
            "fileMode": edit.file_mode, "permissions": config.cgroup_access, "uid": edit.uid, "gid": edit.gid}


def device_names(gpu: Gpu) -> list[str]:
    """The CDI names of one GPU: index, PCI address, unique id (all valid request entries)."""
    names = [str(gpu.index), gpu.pci_address]
    if gpu.unique_id_hex:
        names.append(gpu.unique_id_hex)
    return names


def generate(inventory: Inventory, config: Config) -> dict[str, Any]:
    """The CDI spec of this host (devices in index order; deterministic for golden files)."""
    devices = []
    for gpu in inventory.gpus:
        devices.extend({"name": name, "containerEdits": {"deviceNodes": [_node(n, config) for n in gpu.nodes]}}
                       for name in device_names(gpu))  # a copy each: YAML would write &anchors otherwise
    if inventory.gpus:
        every = [_node(n, config) for gpu in inventory.gpus for n in gpu.nodes]
        devices.append({"name": "all", "containerEdits": {"deviceNodes": every}})
    shared = []
    for vendor in sorted({gpu.vendor for gpu in inventory.gpus}):
        shared.extend(_node(n, config) for n in inventory.shared_nodes.get(vendor, ()))
    spec: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": config.cdi_kind, "devices": devices}
    if shared:
        spec["containerEdits"] = {"deviceNodes": shared}
    return spec


def render(spec: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(spec, indent=2) + "\n"
    if fmt == "yaml":
        import yaml

        return str(yaml.safe_dump(spec, sort_keys=False, default_flow_style=False))
    raise HookError(f"unknown format {fmt!r} (valid: json, yaml)")


def output_path(target: str, config: Config, fmt: str) -> str:
    """A directory (``/etc/cdi``, ``/var/run/cdi``) gets ``<vendor>-<class>.<fmt>``; a file is used as is."""
    if os.path.isdir(target):
        return os.path.join(target, config.cdi_kind.replace("/", "-") + "." + fmt)
    return target


def write(path: str, text: str) -> bool:
    """Write atomically (temp file + rename, mode 0644) when the content changed; return whether it did."""
    try:
        with open(path, encoding="utf-8") as handle:
            if handle.read() == text:
                return False
    except FileNotFoundError:
        pass
    except OSError as err:
        raise HookError(f"cannot read {path}: {err.strerror}") from None
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as err:
        raise HookError(f"cannot create {directory}: {err.strerror}") from None
    write_atomic(path, text, 0o644, durable=True)  # a spec in /etc/cdi outlives reboots
    return True


def load(path: str) -> dict[str, Any]:
    """Read a CDI spec file (JSON or YAML by extension)."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as err:
        raise HookError(f"cannot read {path}: {err.strerror}") from None
    if path.endswith((".yaml", ".yml")):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise HookError(f"{path} is not valid YAML ({' '.join(str(err).split())})") from None
    else:
        try:
            data = json.loads(text)
        except ValueError as err:
            raise HookError(f"{path} is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise HookError(f"{path}: a CDI spec is an object")
    return data


def minimum_version(spec: dict[str, Any]) -> str:
    """The lowest cdiVersion the fields of ``spec`` need (the rules of CDI's specs-go/version.go)."""
    devices = [d for d in spec.get("devices", []) if isinstance(d, dict)]
    edits = [d.get("containerEdits") or {} for d in devices] + [spec.get("containerEdits") or {}]
    if any(e.get("intelRdt") is not None or e.get("additionalGids") for e in edits):
        return "0.7.0"
    if spec.get("annotations") or any(d.get("annotations") for d in devices) or "." in str(
            spec.get("kind", "")).partition("/")[2]:
        return "0.6.0"
    if any(str(d.get("name", "a"))[:1].isdigit() for d in devices) or any(
            n.get("hostPath") for e in edits for n in e.get("deviceNodes") or []):
        return "0.5.0"
    if any(m.get("type") for e in edits for m in e.get("mounts") or []):
        return "0.4.0"
    return "0.3.0"


def validate(spec: dict[str, Any], what: str) -> None:
    """jsonschema (schemas/cdi.schema.json), the version rule, and unique device names."""
    from oci_gpu_hook import schemas

    schemas.validate(spec, "cdi.schema.json", what)
    needed = minimum_version(spec)
    if tuple(map(int, spec["cdiVersion"].split("."))) < tuple(map(int, needed.split("."))):
        raise HookError(f"{what}: cdiVersion {spec['cdiVersion']} is too low for the fields used (needs {needed})")
    names = [d["name"] for d in spec["devices"]]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise HookError(f"{what}: device name {duplicates[0]!r} appears more than once")
