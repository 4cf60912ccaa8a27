"""CDI specs: the plan's container edits for every device of one kind, as a spec file podman,
containerd and CRI-O read.

One spec per kind (``amd.com/gpu``, ``intel.com/gpu``, ``nvidia.com/gpu``), in ``cdi_dir`` as
``<vendor>-<class>.json``.  One CDI device per device under its index; the
backend's other names (AMD: each GPU's PCI address and unique id, naming all its
partitions, and each partition's ``<pci>-p<N>``; Intel: ``cardN`` and the PCI
address) are devices with the same edits (CDI has no aliases); plus ``all``.
Among them every device's stable name (:func:`oci_gpu_hook.inventory.stable_name`),
the one to use across process boundaries (the device plugin answers with it):
an index names other hardware once a GPU before it leaves.  Each device's edits are the plan's
:func:`~oci_gpu_hook.plan.device_edits` (its nodes, and the ``createRuntime``
hook that makes its ``/dev/dri/by-path`` links); the kind's shared nodes
(``/dev/kfd``; NVIDIA: ``/dev/nvidiactl``, ``/dev/nvidia-uvm*``, and the driver's
files as read-only mounts with the ``ldcache`` hook) are the spec-wide edits,
which apply whenever any device of the spec is used.  So the CDI path gives a
container the same view as the hooks.  A CDI spec cannot read a container's
``NVIDIA_DRIVER_CAPABILITIES``: the NVIDIA spec gives every capability (its
DRM nodes, ``/dev/nvidia-modeset`` and every library), as ``nvidia-ctk`` does.
"""

from __future__ import annotations

import json
import os
from typing import Any

from oci_gpu_hook.appliers.ocispec import hooks
from oci_gpu_hook.atomic import write_atomic
from oci_gpu_hook.config import Config
from oci_gpu_hook.core.edits import Edits
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.inventory import Device, Inventory, backend, stable_name
from oci_gpu_hook.plan import device_edits, shared_edits

# Device names starting with a digit need CDI 0.5.0 (specs-go/version.go: requiresV050); nothing
# else used here needs more.
CDI_VERSION = "0.5.0"


def mask_ignored(mask_other_gpus: object) -> str | None:
    """What ``mask_other_gpus = true`` does not do on the CDI path (said by validate, cdi generate, install)."""
    if mask_other_gpus is not True:
        return None
    return ("mask_other_gpus = true is ignored on the CDI path (CDI has no masked paths): a container given its GPUs "
            "by a runtime's own CDI (podman --device amd.com/gpu=N, containerd 1.7+) or by the live prestart hook "
            "sees every GPU's sysfs; only the precreate hook and the shim hide them")


def container_edits(edits: Edits, config: Config) -> dict[str, Any]:
    out: dict[str, Any] = {"deviceNodes": [n.to_cdi(config.cgroup_access) for n in edits.nodes]}
    if edits.mounts:
        out["mounts"] = [m.to_cdi() for m in edits.mounts]
    wanted = hooks(edits, config.hook_path)
    if wanted:
        out["hooks"] = [{"hookName": "createRuntime", **hook} for hook in wanted]
    return out


def device_names(devices: tuple[Device, ...], kind: str) -> list[tuple[str, tuple[Device, ...]]]:
    """Every CDI name of ``kind`` on this host with the devices it stands for: indices, then the backend's
    other names (all valid request entries; NVIDIA MIG devices are named ``GPU:MIG`` there)."""
    own = backend(kind)
    names = [(str(d.index), (d,)) for d in own.indexed(devices)]
    names.extend(own.aliases(devices))
    named = {name for name, chosen in names if len(chosen) == 1}
    missing = [stable_name(d) for d in devices if stable_name(d) not in named]
    if missing:  # a backend whose aliases leave a device without its stable name: never write such a spec
        raise HookError(f"internal error: no CDI device named {missing[0]} (the stable name of a {kind} device)")
    return names


def generate(inventory: Inventory, kind: str, config: Config) -> dict[str, Any]:
    """The CDI spec of ``kind`` on this host (devices in index order; deterministic for golden files)."""
    devices = inventory.devices(kind)
    entries = []
    for name, chosen in device_names(devices, kind):
        edits = Edits.merged([device_edits(d, config) for d in chosen])
        entries.append({"name": name, "containerEdits": container_edits(edits, config)})
    if devices:
        edits = Edits.merged([device_edits(d, config) for d in devices])
        entries.append({"name": "all", "containerEdits": container_edits(edits, config)})
    spec: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": config.cdi_kind(kind), "devices": entries}
    shared = shared_edits(inventory, kind, config)
    if shared.nodes or shared.mounts:
        spec["containerEdits"] = container_edits(shared, config)
    return spec


def render(spec: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(spec, indent=2) + "\n"
    if fmt == "yaml":
        import yaml

        return str(yaml.safe_dump(spec, sort_keys=False, default_flow_style=False))
    raise HookError(f"unknown format {fmt!r} (valid: json, yaml)")


def file_name(config: Config, kind: str, fmt: str) -> str:
    """``amd.com-gpu.json``: the name a kind's spec has in a CDI directory."""
    return config.cdi_kind(kind).replace("/", "-") + "." + fmt


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
    check_output_dir(directory)
    write_atomic(path, text, 0o644, durable=True)  # a spec in /etc/cdi outlives reboots
    return True


def make_dirs(directory: str, what: str) -> None:
    """Create ``directory`` and any missing parent, each mode 0755 whatever the umask, only below a directory
    nobody but root (or the invoking user) can change (:mod:`oci_gpu_hook.trust`); one line on failure."""
    from oci_gpu_hook.trust import config_problem

    missing = []
    path = os.path.abspath(directory)
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        raise HookError(f"{what} {directory}: {path} is not a directory")
    why = config_problem(directory if not missing else path)
    if why:
        raise HookError(f"{what} {directory} is not trusted: {why} (CDI consumers run as root and apply what "
                        "a spec there says)")
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o755)
            os.chmod(path, 0o755)
        except FileExistsError:
            if not os.path.isdir(path):
                raise HookError(f"{what} {directory}: {path} is not a directory") from None
        except OSError as err:
            raise HookError(f"{what} {directory}: cannot create {path}: {err.strerror}") from None


def check_output_dir(directory: str) -> None:
    """Refuse to write a spec where a non-root user could replace it: CDI consumers run as root and
    add its device nodes and hooks to containers (:mod:`oci_gpu_hook.trust`)."""
    from oci_gpu_hook.trust import config_problem

    why = config_problem(directory)
    if why:
        raise HookError(f"CDI output directory {directory} is not trusted: {why}")


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
    if any(e.get("netDevices") or (e.get("intelRdt") or {}).get("schemata") is not None
           or (e.get("intelRdt") or {}).get("enableMonitoring") for e in edits):
        return "1.1.0"
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
