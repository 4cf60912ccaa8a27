"""The containerd configuration that runs pods of a Kubernetes RuntimeClass through the shim.

A runtime of containerd's CRI plugin whose runc ``BinaryName`` is
``oci-gpu-runtime``: containerd's runc shim (io.containerd.runc.v2) then calls
the shim for every create/start/delete of those pods, and the shim writes the
plan into each bundle before runc sees it.  It is a drop-in for the main
config's ``imports``.

Config versions: 2 (containerd 1.x: the CRI plugin ``io.containerd.grpc.v1.cri``), 3 (containerd
2.x: the CRI runtime plugin ``io.containerd.cri.v1.runtime``, runtimes under its
``containerd.runtimes``) and 4 (what ``containerd config default`` writes from 2.3 on: server
settings moved into plugins, the CRI runtime plugin as in 3).  The drop-in takes the main config's
version; 2.x also reads (and migrates) an older one.  A version 1 config (no ``version`` key) is not
changed: install skips containerd with a note (``containerd config migrate`` converts it).  On
containerd 1.7+ and 2.x the drop-in also turns on containerd's native CDI (``enable_cdi``,
``cdi_spec_dirs``), the preferred path for Kubernetes: the device plugin's CDI devices are applied
by containerd itself, with no shim in the way.  Which containerd the node runs is found by
:mod:`containerd_detect`, never from install's own PATH.

containerd 1.x merges an imported file plugin by plugin: the drop-in's
``plugins."io.containerd.grpc.v1.cri"`` table *replaces* the main config's
whole CRI table (containerd issues 5837, 7982), which would drop the host's
runtimes, CNI and registry settings and can stop the CRI plugin from loading.
So the drop-in carries the main config's CRI table, plus the ``runc`` runtime
its ``default_runtime_name`` needs, plus ours; ``install`` builds it from the
node's main config and adds the ``imports`` line there.

Only ``container_annotations`` pass ``cdi.k8s.io/*`` into the OCI spec: those
come from kubelet and the device plugin.  Pod annotations are written by
whoever creates the pod, so passing them would let any pod ask for any GPU.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from oci_gpu_hook.appliers.cdi_dirs import DEFAULT_SPEC_DIRS
from oci_gpu_hook.errors import HookError

RUNTIME_NAME = "oci-gpu"  # the RuntimeClass handler
MAIN_CONFIG_PATH = "/etc/containerd/config.toml"
DROP_IN_DIR = "/etc/containerd/conf.d"
DROP_IN_PATH = f"{DROP_IN_DIR}/oci-gpu-hook.toml"
IMPORT_MARK = "  # added by oci-gpu-hook install"  # the end of the imports line install adds (uninstall finds it)
CRI = "io.containerd.grpc.v1.cri"
CRI_V3 = "io.containerd.cri.v1.runtime"
CRI_PLUGIN = {2: CRI, 3: CRI_V3, 4: CRI_V3}  # 4: containerd 2.3+ (its server settings moved; CRI as in 3)


def config_version(main: dict[str, Any] | None) -> int:
    """The ``version`` of a parsed config (1 when absent, as containerd reads it)."""
    version = (main or {}).get("version", 1)
    return version if isinstance(version, int) and not isinstance(version, bool) else 0


def has_cdi(containerd_version: tuple[int, int] | None) -> bool:
    """Native CDI: containerd 1.7 and later."""
    return containerd_version is not None and containerd_version >= (1, 7)


def cri_table(main: dict[str, Any] | None, binary: str, runtime_name: str = RUNTIME_NAME, *,
              version: int = 2, cdi: bool = False) -> dict[str, Any]:
    """The CRI plugin table of ``main`` (a parsed config.toml, or None for a config of ``version``) with
    our runtime added, and native CDI turned on when ``cdi``."""
    if main is not None:
        version = config_version(main)
    if version not in CRI_PLUGIN:
        raise HookError(f"{MAIN_CONFIG_PATH} is a version {(main or {}).get('version', 1)} containerd config; the "
                        "drop-in needs version 2 or 3 (convert it: `containerd config migrate` on 1.7+, or by hand)")
    plugin = CRI_PLUGIN[version]
    cri = copy.deepcopy(((main or {}).get("plugins") or {}).get(plugin) or {})
    if not isinstance(cri, dict):
        raise HookError(f"the containerd config's plugins.\"{plugin}\" is not a table")
    runtimes = cri.setdefault("containerd", {}).setdefault("runtimes", {})
    default = cri["containerd"].get("default_runtime_name", "runc")
    if default not in runtimes:  # containerd's own default, which replacing the table would lose
        runtimes[default] = {"runtime_type": "io.containerd.runc.v2"}
    runtimes[runtime_name] = {
        "runtime_type": "io.containerd.runc.v2",
        "container_annotations": ["cdi.k8s.io/*"],
        "options": {"BinaryName": binary},
    }
    if cdi:
        cri["enable_cdi"] = True
        dirs = cri.get("cdi_spec_dirs")
        cri["cdi_spec_dirs"] = dirs if isinstance(dirs, list) and dirs else list(DEFAULT_SPEC_DIRS)
    return cri


def drop_in(binary: str, main: dict[str, Any] | None = None, runtime_name: str = RUNTIME_NAME, *,
            version: int = 2, cdi: bool = False) -> str:
    """The drop-in TOML text for a node whose main config is ``main`` (parsed; None = no main config, one
    of ``version`` is assumed); ``cdi`` turns on containerd's native CDI (1.7+)."""
    if main is not None:
        version = config_version(main)
    table = cri_table(main, binary, runtime_name, version=version, cdi=cdi)
    body = to_toml({"version": version, "plugins": {CRI_PLUGIN[version]: table}})
    return (
        f"# Written by oci-gpu-hook: pods of RuntimeClass handler '{runtime_name}' run through oci-gpu-runtime.\n"
        f"# containerd 1.x replaces the main config's whole CRI table with this one, so it carries that\n"
        f"# table too: regenerate it (oci-gpu-hook install) after editing the CRI section of {MAIN_CONFIG_PATH}.\n"
        f'# The main config must import it: imports = ["{DROP_IN_DIR}/*.toml"]\n\n' + body
    )


def with_import(text: str, where: str = MAIN_CONFIG_PATH) -> str | None:
    """The main config text with ``imports`` covering the drop-in directory; None if it has it already."""
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise HookError(f"{where} is not valid TOML ({err})") from None
    imports = data.get("imports", [])
    wanted = f"{DROP_IN_DIR}/*.toml"
    if wanted in imports or DROP_IN_PATH in imports:
        return None
    line = f"imports = {json.dumps([*imports, wanted])}{IMPORT_MARK}\n"
    lines = text.splitlines(keepends=True)
    if "imports" in data:  # replace the existing top-level key, which must stand before the first table
        for i, current in enumerate(lines):
            if current.lstrip().startswith("imports") and current.split("=", 1)[0].strip() == "imports":
                if "]" not in current:
                    raise HookError(f"{where}: a multi-line imports list; add {wanted} to it by hand")
                lines[i] = line
                break
    else:
        # after the leading comments and top-level keys: before the first table header
        at = next((i for i, cur in enumerate(lines) if cur.lstrip().startswith("[")), len(lines))
        lines.insert(at, line)
    result = "".join(lines)
    if tomllib.loads(result).get("imports") != [*imports, wanted]:
        raise HookError(f"could not add imports to {where}; add {wanted} to it by hand")
    return result


def without_import(text: str, original: str | None) -> str | None:
    """``text`` (the main config, edited since install) with the ``imports`` line install added put back as it was
    in ``original`` (the file install replaced; None: there was none, or no imports line); None when that line is
    no longer there as install wrote it."""
    import tomllib

    ours = next((line for line in text.splitlines(keepends=True) if line.endswith(IMPORT_MARK + "\n")), None)
    if ours is None:
        return None
    before = next((line for line in (original or "").splitlines(keepends=True)
                   if line.lstrip().startswith("imports") and line.split("=", 1)[0].strip() == "imports"), "")
    result = text.replace(ours, before, 1)
    try:
        imports = tomllib.loads(result).get("imports", [])
    except tomllib.TOMLDecodeError:
        return None
    return None if f"{DROP_IN_DIR}/*.toml" in imports else result


# --- a small TOML writer: the subset a containerd config uses -------------------------------------

def _quote(text: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's; TOML also forbids a raw DEL."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _key(key: str) -> str:
    return key if key and all(c.isascii() and (c.isalnum() or c in "_-") for c in key) else _quote(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and value == value and value not in (float("inf"), float("-inf")):
        return repr(value)
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, list) and not any(isinstance(v, dict) for v in value):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise HookError(f"cannot write {type(value).__name__} value {value!r} into a containerd drop-in")


def _is_table(value: Any) -> bool:
    return isinstance(value, dict) or (isinstance(value, list) and bool(value)
                                       and all(isinstance(v, dict) for v in value))


def to_toml(table: dict[str, Any], path: tuple[str, ...] = ()) -> str:
    """Scalars first, then sub-tables and arrays of tables, recursively."""
    out = []
    nested = []
    for key, value in table.items():
        if _is_table(value):
            nested.append((key, value))
        else:
            out.append(f"{_key(key)} = {_value(value)}\n")
    for key, value in nested:
        name = ".".join(_key(k) for k in (*path, key))
        if isinstance(value, dict):
            has_own_keys = not value or any(not _is_table(v) for v in value.values())
            out.append((f"\n[{name}]\n" if has_own_keys else "") + to_toml(value, (*path, key)))
        else:
            for item in value:
                out.append(f"\n[[{name}]]\n" + to_toml(item, (*path, key)))
    return "".join(out)
