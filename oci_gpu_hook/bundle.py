"""A container's config.json, read as the runtime reads it: the fields every entry point takes from it.

Both the plan (what was requested: ``process.env``, ``annotations``) and the
appliers (``root.path``, where to write) read the spec only through here.
"""

from __future__ import annotations

import os

from oci_gpu_hook import fastjson
from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms per container start

if TYPE_CHECKING:
    from typing import Any


def field(parent: dict[str, Any], key: str, kind: type, where: str, create: bool) -> Any:
    """``parent[key]`` checked to be a ``kind`` (None when absent, or made when ``create``)."""
    value = parent.get(key)
    if value is None:
        if not create:
            return None
        value = parent[key] = kind()
    if not isinstance(value, kind):
        raise HookError(f"config.json: {where} is not {'a list' if kind is list else 'an object'}")
    return value


def check_object(spec: Any) -> dict[str, Any]:
    if not isinstance(spec, dict):
        raise HookError("config.json: the top level is not a JSON object")
    return spec


def process_env(spec: Any) -> list[str]:
    """``process.env`` of the spec (empty when absent)."""
    process = field(check_object(spec), "process", dict, "process", create=False)
    env = field(process, "env", list, "process.env", create=False) if process else None
    if env and not all(isinstance(entry, str) for entry in env):
        raise HookError("config.json: process.env holds a value that is not a string")
    return env or []


def annotations(spec: Any) -> dict[str, Any]:
    """``annotations`` of the spec (empty when absent)."""
    return field(check_object(spec), "annotations", dict, "annotations", create=False) or {}


def device_rules(spec: Any, create: bool = False) -> list[Any]:
    """``linux.resources.devices`` (the list itself; made when ``create``), every entry an object."""
    linux = field(check_object(spec), "linux", dict, "linux", create=create)
    resources = None if linux is None else field(linux, "resources", dict, "linux.resources", create=create)
    rules = None if resources is None else field(resources, "devices", list, "linux.resources.devices",
                                                 create=create)
    if rules is None:
        return []
    if not all(isinstance(entry, dict) for entry in rules):
        raise HookError("config.json: linux.resources.devices holds a non-object entry")
    return rules


def spec_policy(spec: Any) -> Any:
    """runc's reading of the container's device rules (:class:`oci_gpu_hook.core.rules.Policy`)."""
    from oci_gpu_hook.core.devices import Rule
    from oci_gpu_hook.core.rules import Policy

    return Policy.of(Rule.from_oci(entry) for entry in device_rules(spec))


def spec_device_numbers(spec: Any) -> set[tuple[str, int, int]]:
    """(type, major, minor) of every well-formed ``linux.devices`` entry the spec already carries."""
    linux = check_object(spec).get("linux")
    devices = linux.get("devices") if isinstance(linux, dict) else None
    found = set()
    for entry in devices if isinstance(devices, list) else ():
        if isinstance(entry, dict) and entry.get("type") in ("c", "b", "u") and all(
                isinstance(entry.get(k), int) and not isinstance(entry.get(k), bool) for k in ("major", "minor")):
            found.add(("c" if entry["type"] == "u" else entry["type"], entry["major"], entry["minor"]))
    return found


def root_path(spec: Any, bundle: str) -> str:
    """``root.path``, made absolute against the bundle as the runtime does."""
    root = check_object(spec).get("root")
    path = root.get("path") if isinstance(root, dict) else None
    if not isinstance(path, str) or not path:
        raise HookError(f"{bundle}/config.json has no root.path")
    return os.path.normpath(os.path.join(bundle, path))


def loads(text: str) -> Any:
    """Parse config.json text; a HookError saying why it is not JSON."""
    try:
        return fastjson.loads(text)
    except ValueError as err:
        raise HookError(f"config.json is {err}") from None


def read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as err:
        raise HookError(f"cannot read {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise HookError(f"{path} is not UTF-8 text") from None
