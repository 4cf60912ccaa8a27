"""Settings: the one definition of the config's keys and types, and the loader every entry point uses.

Precedence, lowest first: the defaults below, ``/etc/oci-gpu-hook/config.toml``
(path overridable by ``OCI_GPU_HOOK_CONFIG``), ``OCI_GPU_HOOK_*`` environment
variables, command-line flags.  :data:`FIELDS` is the only description of the
keys: the loader checks every value with it, ``oci-gpu-hook validate`` runs the
same loader, and the pydantic model behind ``schemas/config.schema.json`` is
generated from it (:mod:`oci_gpu_hook.models`).  This module is on the
per-container path, so it imports nothing heavy: a config file is read with
:mod:`oci_gpu_hook.tomlsubset`, and :mod:`tomllib` is loaded only for a file
outside that subset.  The backends and their defaults are
:data:`oci_gpu_hook.kinds.KINDS`.

**A config that cannot be used never stops a container that asks for nothing.**  Most of a node's containers
ask for no GPU, and one bad edit of this file must not stop them all; nor may a request be served by guessing
what the file meant.  When the settings cannot be
loaded -- the file is unreadable, not TOML, untrusted (:func:`check_trusted`), has an unknown key
(``mask_other_gpu``) or a bad value, or an ``OCI_GPU_HOOK_*`` variable has a bad value -- nothing in them is
acted upon, and each per-container entry point (the precreate hook, the live prestart hook, the shim's
create/run, the resident planner, which runs the same code) decides by the *default* request names alone
(:func:`oci_gpu_hook.request.on_unusable_config`): a container whose spec carries no request under them (the
default ``request_env`` variables of every kind, ``cdi.k8s.io/`` annotations naming a known kind; an empty,
``none`` or ``void`` value asks for nothing) passes through untouched, with one warning line
(:func:`oci_gpu_hook.log.warn`); one that carries a request is refused with the config's one-line error.  The
shim then execs the runtime a pass-through command would
(:func:`oci_gpu_hook.entry.runtime.passthrough_runtime_name`: never one named by an untrusted file).  A request
under a name that only the broken file would have added is not seen: the file cannot be believed.  The operator
commands fail on such a config, and ``install`` and ``launchers`` refuse to make one live
(:func:`oci_gpu_hook.install.launchers.check_live_config`).  An unknown key's error names the key it was probably
meant to be (``did you mean 'mask_other_gpus'?``).
"""

from __future__ import annotations

import os

from oci_gpu_hook.errors import HookError
from oci_gpu_hook.kinds import KINDS

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

DEFAULT_CONFIG_PATH = "/etc/oci-gpu-hook/config.toml"
CONFIG_ENV = "OCI_GPU_HOOK_CONFIG"  # names the config file
ACCESS_VALUES = ("r", "w", "m", "rw", "rm", "wm", "rwm")
# The health signals a GPU can be Unhealthy by (oci_gpu_hook/cluster/health.py reads them; docs/health.md says each
# one's kernel source); the DRA driver's taint names the first as its value.
HEALTH_SIGNALS = ("ras-uncorrectable", "pcie-fatal", "wedged", "vanished")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class Field:
    """One key: its default, its type (``str``, ``path``, ``bool``, ``mode``, ``id``, ``count``, ``access``,
    ``kinds``, ``signals``, ``env_table``), its environment variable, and what it is for."""

    __slots__ = ("default", "doc", "env", "type")

    def __init__(self, default: Any, type: str, env: str | None, doc: str) -> None:
        self.default = default
        self.type = type
        self.env = env
        self.doc = doc


FIELDS: dict[str, Field] = {
    "sysfs_root": Field("/sys", "path", "OCI_GPU_HOOK_SYSFS_ROOT", "Where sysfs is read (a fake tree for tests)."),
    "proc_root": Field("/proc", "path", "OCI_GPU_HOOK_PROC_ROOT",
                       "Where the NVIDIA driver's /proc files are read (/proc/devices, /proc/driver/nvidia*)."),
    "driver_root": Field("/", "path", "OCI_GPU_HOOK_DRIVER_ROOT",
                         "The root of the NVIDIA driver's user-space files (its ld cache etc/ld.so.cache, binaries, "
                         "firmware), e.g. /run/nvidia/driver for a containerized driver."),
    "runtime": Field("runc", "path", "OCI_GPU_HOOK_RUNTIME",
                     "The real OCI runtime that oci-gpu-runtime execs (a name on PATH or an absolute path)."),
    "backends": Field(tuple(KINDS), "kinds", None, "The vendor backends in use (" + ", ".join(KINDS) + ")."),
    "request_env": Field({name: list(env) for name, (_kind, env) in KINDS.items()}, "env_table", None,
                         "Per backend, the container env variables that carry a GPU request."),
    "allow_env_requests": Field(True, "bool", "OCI_GPU_HOOK_ALLOW_ENV_REQUESTS",
                                "Honour GPU requests in the container's env; when off, only cdi.k8s.io "
                                "annotations (the orchestrator's) count.  install bakes it off into launchers that "
                                "pods reach, unless --set turns it on."),
    "cdi_dir": Field("/var/run/cdi", "path", "OCI_GPU_HOOK_CDI_DIR",
                     "Where the CDI spec of each kind is written (<vendor>-<class>.json)."),
    "hook_path": Field("/usr/local/libexec/oci-gpu-hook/oci-gpu-hook", "path", "OCI_GPU_HOOK_HOOK_PATH",
                       "The oci-gpu-hook launcher that CDI specs name as the createRuntime hook making "
                       "/dev/dri/by-path links, and rewritten specs as the one making NVIDIA's ld cache."),
    "by_path_dir": Field("/run/oci-gpu-hook/by-path", "path", "OCI_GPU_HOOK_BY_PATH_DIR",
                         "Where the spec-rewrite paths prepare the /dev/dri/by-path directory they bind-mount "
                         "read-only into a container (one per set of links; only root may write it)."),
    "mask_other_gpus": Field(False, "bool", None,
                             "Spec-rewrite paths: add the sysfs directories of every GPU the container did not "
                             "get to linux.maskedPaths."),
    "device_file_mode": Field(0o666, "mode", None, "Mode of the created nodes."),
    "device_uid": Field(0, "id", None, "Owner uid of the created nodes."),
    "device_gid": Field(0, "id", None, "Owner gid of the created nodes."),
    "cgroup_access": Field("rwm", "access", None, "Access granted by each device cgroup rule."),
    "log_file": Field("", "str", "OCI_GPU_HOOK_LOG_FILE", "Append one JSON line per hook run here ('' = off)."),
    "syslog": Field(True, "bool", None, "Also write each refusal and each hand-over to a slower path to the "
                    "system journal (the syslog socket /dev/log, identifier oci-gpu-hook)."),
    "debug": Field(False, "bool", "OCI_GPU_HOOK_DEBUG", "Print tracebacks on internal errors."),
    "health_ue_start": Field(0, "count", None,
                             "Device plugin, DRA driver, list: a GPU whose uncorrectable error count (amdgpu RAS "
                             "ue, PCIe AER fatal) is above this when first read is Unhealthy."),
    "health_ue_rise": Field(0, "count", None,
                            "Device plugin, DRA driver: a GPU whose uncorrectable error count rises by more than "
                            "this between two reads is Unhealthy."),
    "health_hold": Field(300, "count", None,
                         "Seconds an Unhealthy GPU stays Unhealthy (and its DRA taint stays) after its last signal "
                         "cleared, so that a flapping signal does not flap the taint."),
    "health_noexecute": Field((), "signals", None,
                              "The health signals (" + ", ".join(HEALTH_SIGNALS) + ") whose DRA taint is NoExecute "
                              "(the pods using the device are evicted) rather than NoSchedule."),
}
RENAMED = {"cdi_spec": "cdi_dir", "cdi_kind": "backends"}

EXPECTED = {
    "str": "a string",
    "path": "a non-empty string",
    "bool": "true or false",
    "mode": "a file mode, 0 to 0o7777",
    "id": "an integer, 0 to 4294967294",
    "count": "an integer, 0 to 4294967294",
    "access": "one of " + ", ".join(ACCESS_VALUES),
    "kinds": "a non-empty list of backend names (" + ", ".join(KINDS) + ")",
    "env_table": "a table of backend name = a non-empty list of variable names",
    "signals": "a list of health signal names (" + ", ".join(HEALTH_SIGNALS) + "), each once",
}


def _env_name(value: Any) -> bool:
    return (isinstance(value, str) and value != "" and value.isascii() and "=" not in value
            and (value[0].isalpha() or value[0] == "_") and all(c.isalnum() or c == "_" for c in value))


def check_value(name: str, value: Any, where: str) -> Any:
    """``value`` for key ``name`` as the program uses it; a HookError naming the key and what is valid."""
    kind = FIELDS[name].type
    ok: Any = _BAD
    if kind in ("str", "path"):
        if isinstance(value, str) and "\0" not in value and (kind == "str" or value):
            ok = value
    elif kind == "bool":
        if isinstance(value, bool):
            ok = value
        elif isinstance(value, str) and where.startswith("environment") and value.lower() in _TRUE | _FALSE:
            ok = value.lower() in _TRUE
    elif kind in ("mode", "id", "count"):
        top = 0o7777 if kind == "mode" else 4294967294
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= top:
            ok = value
    elif kind == "access":
        if value in ACCESS_VALUES:
            ok = value
    elif kind == "kinds":
        if (isinstance(value, (list, tuple)) and value and all(v in KINDS for v in value)
                and len(set(value)) == len(value)):
            ok = tuple(value)
    elif kind == "signals":
        if (isinstance(value, (list, tuple)) and all(v in HEALTH_SIGNALS for v in value)
                and len(set(value)) == len(value)):
            ok = tuple(value)
    elif kind == "env_table" and isinstance(value, dict) and all(
            k in KINDS and isinstance(v, list) and v and all(_env_name(e) for e in v) for k, v in value.items()):
        ok = {**FIELDS[name].default, **{k: list(v) for k, v in value.items()}}
        names = [e for v in ok.values() for e in v]
        if len(names) != len(set(names)):
            ok = _BAD
    if ok is _BAD:
        raise HookError(f"{where}: bad value {value!r} for '{name}' (expected {EXPECTED[kind]})")
    return ok


_BAD = object()


class Config:
    """Resolved settings; one attribute per entry of :data:`FIELDS`, plus where they came from."""

    __slots__ = (*FIELDS, "source")

    sysfs_root: str
    proc_root: str
    driver_root: str
    runtime: str
    backends: tuple[str, ...]
    request_env: dict[str, list[str]]
    allow_env_requests: bool
    cdi_dir: str
    hook_path: str
    by_path_dir: str
    mask_other_gpus: bool
    device_file_mode: int
    device_uid: int
    device_gid: int
    cgroup_access: str
    log_file: str
    syslog: bool
    debug: bool
    health_ue_start: int
    health_ue_rise: int
    health_hold: int
    health_noexecute: tuple[str, ...]
    source: str

    def __init__(self, **values: Any) -> None:
        for name, field in FIELDS.items():
            setattr(self, name, values.get(name, field.default))
        self.source = values.get("source", "defaults")

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in FIELDS}

    def cdi_kind(self, backend: str) -> str:
        return KINDS[backend][0]

    def cdi_spec_path(self, backend: str) -> str:
        """``<cdi_dir>/<vendor>-<class>.json``, the file name CDI consumers expect for one kind."""
        return os.path.join(self.cdi_dir, KINDS[backend][0].replace("/", "-") + ".json")


def parse_file(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The keys of a parsed config file, each checked; unknown keys are errors."""
    for key in data:
        if key not in FIELDS:
            meant = _meant(key)
            raise HookError(f"{where}: unknown key {key!r}{meant}" if meant.startswith(" (did you mean")
                            else f"{where}: unknown key {key!r}{meant} (valid: {', '.join(FIELDS)})")
    return {name: check_value(name, value, where) for name, value in data.items()}


def _meant(key: str) -> str:
    """What an unknown key was probably meant to be: its new name, or the closest key (a typo)."""
    if key in RENAMED:
        return f"; it is now '{RENAMED[key]}'"
    import difflib  # only on this error path

    close = difflib.get_close_matches(key, FIELDS, n=1, cutoff=0.75)
    return f" (did you mean '{close[0]}'?)" if close else ""


def check_trusted(path: str) -> tuple[int, int]:
    """Refuse a config file that anyone but root (or the invoking user) could have changed: its
    ``runtime`` is exec'd as root (:mod:`oci_gpu_hook.trust` has the rule).  The (device, inode) the check ended
    on, which the read that follows must find (:func:`oci_gpu_hook.trust.checked`)."""
    from oci_gpu_hook.trust import checked

    why, entry = checked(path)
    if why:
        raise HookError(f"config file {path} is not trusted: {why}; refusing a config that others could change")
    return entry


def load_file(path: str) -> dict[str, Any]:
    """Read and check the TOML file: the bytes of the very file the trust check walked to (read through its
    descriptor; a file renamed over it after the check is refused, not read)."""
    walked = check_trusted(path)
    where = f"config file {path}"
    from oci_gpu_hook.trust import read_regular

    try:
        # a FIFO, socket or device never blocks a container's start; /dev/null is the empty config, as it is written
        raw = b"" if path == os.devnull else read_regular(path, walked)
    except OSError as err:
        raise HookError(f"{where}: cannot read ({err.strerror})") from None
    return parse_bytes(raw, where)


def parse_bytes(raw: bytes, where: str) -> dict[str, Any]:
    """The checked keys of the config file whose bytes are ``raw``."""
    from oci_gpu_hook.tomlsubset import parse_toml_subset

    data = parse_toml_subset(raw)
    if data is None:  # outside the subset: the real parser decides (and words the errors)
        import tomllib

        try:
            data = tomllib.loads(raw.decode())
        except UnicodeDecodeError as err:
            raise HookError(f"{where}: not UTF-8 text (byte {err.start})") from None
        except tomllib.TOMLDecodeError as err:
            raise HookError(f"{where}: not valid TOML ({err})") from None
    return parse_file(data, where)


def load_config(environ: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None) -> Config:
    """Defaults, then the config file, then ``OCI_GPU_HOOK_*`` variables, then ``overrides``."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    path = env.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH
    sources = []
    if env.get(CONFIG_ENV) or os.path.exists(path):
        values.update(load_file(path))
        sources.append(path)
    else:  # absent: walked all the same, so that one pinned present, or a directory given away, is seen
        check_trusted(path)
    for name, field in FIELDS.items():
        var = field.env
        if var and env.get(var) is not None and (env[var] != "" or field.type == "str"):
            values[name] = check_value(name, env[var], f"environment variable {var}")
            sources.append(var)
    for name, value in (overrides or {}).items():
        if value is not None:
            values[name] = check_value(name, value, f"--{name.replace('_', '-')}")
            sources.append(f"--{name.replace('_', '-')}")
    values["source"] = ", ".join(sources) or "defaults"
    config = Config(**values)
    config.sysfs_root = os.path.abspath(config.sysfs_root)
    config.proc_root = os.path.abspath(config.proc_root)
    config.driver_root = os.path.abspath(config.driver_root)
    return config
