"""Settings: documented defaults, then the config file, then environment variables.

Precedence, lowest first: the defaults below, ``/etc/oci-gpu-hook/config.toml``
(path overridable by ``OCI_GPU_HOOK_CONFIG``), ``OCI_GPU_HOOK_*`` environment
variables, command-line flags.  This module is on the per-container path, so it
imports nothing heavy: :mod:`tomllib` is loaded only when a config file exists.
The same fields are described by the pydantic model in :mod:`oci_gpu_hook.models`
(used by ``oci-gpu-hook validate`` and to write ``schemas/config.schema.json``);
a test keeps the two in step.
"""

from __future__ import annotations

import os

from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms per container start

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

DEFAULT_CONFIG_PATH = "/etc/oci-gpu-hook/config.toml"

# name -> (default, type, environment variable or None)
FIELDS: dict[str, tuple[Any, type, str | None]] = {
    "sysfs_root": ("/sys", str, "OCI_GPU_HOOK_SYSFS_ROOT"),
    "runtime": ("runc", str, "OCI_GPU_HOOK_RUNTIME"),
    "request_env": (("AMD_VISIBLE_DEVICES",), tuple, None),
    "allow_env_requests": (True, bool, "OCI_GPU_HOOK_ALLOW_ENV_REQUESTS"),
    "cdi_kind": ("amd.com/gpu", str, None),
    "cdi_spec": ("/var/run/cdi/amd.com-gpu.json", str, "OCI_GPU_HOOK_CDI_SPEC"),
    "device_file_mode": (0o666, int, None),
    "device_uid": (0, int, None),
    "device_gid": (0, int, None),
    "cgroup_access": ("rwm", str, None),
    "log_file": ("", str, "OCI_GPU_HOOK_LOG_FILE"),
    "debug": (False, bool, "OCI_GPU_HOOK_DEBUG"),
}

ACCESS_VALUES = ("r", "w", "m", "rw", "rm", "wm", "rwm")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class Config:
    """Resolved settings; one attribute per entry of :data:`FIELDS`."""

    __slots__ = (*FIELDS, "source")

    sysfs_root: str
    runtime: str
    request_env: tuple[str, ...]
    allow_env_requests: bool
    cdi_kind: str
    cdi_spec: str
    device_file_mode: int
    device_uid: int
    device_gid: int
    cgroup_access: str
    log_file: str
    debug: bool
    source: str

    def __init__(self, **values: Any) -> None:
        for name, (default, _kind, _env) in FIELDS.items():
            setattr(self, name, values.get(name, default))
        self.source = values.get("source", "defaults")

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in FIELDS}


def _coerce(name: str, value: Any, where: str) -> Any:
    kind = FIELDS[name][1]
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    elif kind is tuple:
        if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
            return tuple(value)
    elif kind is str and isinstance(value, str):
        return value
    raise HookError(f"{where}: bad value {value!r} for '{name}' (expected {_expected(name)})")


def _expected(name: str) -> str:
    kind = FIELDS[name][1]
    return {
        bool: "true or false",
        int: "a non-negative integer",
        tuple: "a non-empty list of strings",
        str: "a string",
    }[kind]


def _check(config: Config) -> None:
    if config.device_file_mode > 0o7777:
        raise HookError(f"device_file_mode {config.device_file_mode:#o} is not a file mode (0..0o7777)")
    if config.cgroup_access not in ACCESS_VALUES:
        raise HookError(f"cgroup_access {config.cgroup_access!r} is not valid (one of {', '.join(ACCESS_VALUES)})")
    config.sysfs_root = os.path.abspath(config.sysfs_root)


def load_file(path: str) -> dict[str, Any]:
    """Read the TOML file; unknown keys and bad types are errors."""
    import tomllib  # only when a file exists: it costs ~8 ms

    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as err:
        raise HookError(f"config file {path}: not valid TOML ({err})") from None
    except OSError as err:
        raise HookError(f"config file {path}: cannot read ({err.strerror})") from None
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise HookError(f"config file {path}: unknown key {unknown[0]!r} (valid: {', '.join(FIELDS)})")
    return {name: _coerce(name, value, f"config file {path}") for name, value in data.items()}


def load_config(environ: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None) -> Config:
    """Defaults, then the config file, then ``OCI_GPU_HOOK_*`` variables, then ``overrides``."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    path = env.get("OCI_GPU_HOOK_CONFIG") or DEFAULT_CONFIG_PATH
    sources = []
    if env.get("OCI_GPU_HOOK_CONFIG") or os.path.exists(path):
        values.update(load_file(path))
        sources.append(path)
    for name, (_default, _kind, var) in FIELDS.items():
        if var and env.get(var) is not None and (env[var] != "" or name == "log_file"):
            values[name] = _coerce(name, env[var], f"environment variable {var}")
            sources.append(var)
    for name, value in (overrides or {}).items():
        if value is not None:
            values[name] = value
            sources.append(f"--{name.replace('_', '-')}")
    values["source"] = ", ".join(sources) or "defaults"
    config = Config(**values)
    _check(config)
    return config
