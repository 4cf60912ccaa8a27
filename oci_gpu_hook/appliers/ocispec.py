"""The spec-rewrite applier: a plan written into an OCI config.json.

Nodes go to ``linux.devices`` and one allow rule per node to
``linux.resources.devices``; runc or crun then create the nodes and program
the device cgroup themselves (v1 or v2), and the rules survive ``runc update``
and systemd reloads.  The rewrite is idempotent, never removes or widens an
existing entry, and leaves every field it does not own as it was.
"""

from __future__ import annotations

from oci_gpu_hook import fastjson
from oci_gpu_hook.core.devices import Rule
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.plan import plan_for_spec

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms per container start

if TYPE_CHECKING:
    from typing import Any

    from oci_gpu_hook.config import Config
    from oci_gpu_hook.plan import Plan


def _field(parent: dict[str, Any], key: str, kind: type, where: str, create: bool) -> Any:
    value = parent.get(key)
    if value is None:
        if not create:
            return None
        value = parent[key] = kind()
    if not isinstance(value, kind):
        raise HookError(f"config.json: {where} is not {'a list' if kind is list else 'an object'}")
    return value


def _check_object(spec: Any) -> dict[str, Any]:
    if not isinstance(spec, dict):
        raise HookError("config.json: the top level is not a JSON object")
    return spec


def process_env(spec: Any) -> list[str]:
    """``process.env`` of the spec (empty when absent)."""
    process = _field(_check_object(spec), "process", dict, "process", create=False)
    env = _field(process, "env", list, "process.env", create=False) if process else None
    if env and not all(isinstance(entry, str) for entry in env):
        raise HookError("config.json: process.env holds a value that is not a string")
    return env or []


def annotations(spec: Any) -> dict[str, Any]:
    """``annotations`` of the spec (empty when absent)."""
    return _field(_check_object(spec), "annotations", dict, "annotations", create=False) or {}


def apply(spec: Any, plan: Plan) -> bool:
    """Write ``plan`` into ``spec`` in place; return whether anything changed."""
    if not plan:
        return False
    spec = _check_object(spec)
    linux = _field(spec, "linux", dict, "linux", create=True)
    devices = _field(linux, "devices", list, "linux.devices", create=True)
    resources = _field(linux, "resources", dict, "linux.resources", create=True)
    rules = _field(resources, "devices", list, "linux.resources.devices", create=True)
    if not all(isinstance(entry, dict) for entry in devices + rules):
        raise HookError("config.json: linux.devices or linux.resources.devices holds a non-object entry")
    if not all(isinstance(entry.get("path"), str) for entry in devices):
        raise HookError("config.json: linux.devices has an entry without a string 'path'")

    existing = {entry.get("path"): entry for entry in devices}
    new_devices = []
    for node in plan.nodes:
        entry = existing.get(node.path)
        if entry is None:
            new_devices.append(node.to_oci())
        elif (entry.get("type"), entry.get("major"), entry.get("minor")) != (node.type, node.major, node.minor):
            raise HookError(
                f"config.json already lists {node.path} as {entry.get('type')} "
                f"{entry.get('major')}:{entry.get('minor')}, not {node.type} {node.major}:{node.minor}; "
                "refusing to replace it")

    from oci_gpu_hook.core.rules import Policy, grants

    policy = Policy.of(Rule.from_oci(entry) for entry in rules)
    missing = [rule for rule in plan.rules if not grants(policy.allows, rule)]
    for rule in missing:
        policy.apply(rule)  # a HookError where runc would refuse the list with it
    new_rules = [rule.to_oci() for rule in missing]
    devices.extend(new_devices)
    rules.extend(new_rules)
    return bool(new_devices or new_rules)


def rewrite_text(text: str, config: Config, devices: str | None = None) -> tuple[str | None, Plan]:
    """Parse a config.json, apply its plan; return the new text (None if unchanged) and the plan."""
    try:
        spec = fastjson.loads(text)
    except ValueError as err:
        raise HookError(f"config.json is {err}") from None
    plan = plan_for_spec(spec, config, devices)
    if not apply(spec, plan):
        return None, plan
    return fastjson.dumps(spec), plan


def read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as err:
        raise HookError(f"cannot read {path}: {err.strerror}") from None
