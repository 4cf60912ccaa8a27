"""What install writes: one :class:`Item` per file, per integration, built from this host's configuration.

The podman hook's one definition is :data:`HOOK_TEMPLATE`; the source tree's ``hooks.d/*.json`` are what
:func:`hook_file` makes of it (tests/test_readme.py holds them to it).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from oci_gpu_hook.appliers.cdi_dirs import DEFAULT_SPEC_DIRS
from oci_gpu_hook.appliers.ocispec import HOOK_ENV
from oci_gpu_hook.config import Config
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.install.paths import (
    HOOK_LAUNCHER,
    LAUNCHER_DIR,
    NRI_UNIT,
    PACKAGE_PARENT,
    PLANNER_UNIT,
    RUNTIME_LAUNCHER,
    SYSTEMD_UNIT,
)

# The podman hooks.d file of every stage ("STAGE"), naming the launcher install writes.
HOOK_TEMPLATE: dict[str, Any] = {
    "version": "1.0.0",
    "hook": {"path": HOOK_LAUNCHER, "args": ["oci-gpu-hook", "STAGE"], "env": list(HOOK_ENV), "timeout": 10},
    "when": {"always": True},
    "stages": ["STAGE"],
}


# containerd_items' note; the installer replaces it when this run writes none of containerd's files
RESTART_CONTAINERD = "restart containerd to load its new configuration"
CONTAINERD_UNCHANGED = "containerd: its drop-in and main config are as they were: nothing new for containerd to load"


@dataclass(frozen=True)
class Item:
    """One file install wants: its real path, content and mode, and the integration it belongs to."""

    path: str
    data: bytes
    mode: int
    what: str
    integration: str = "core"
    merge: str | None = None  # "docker": uninstall takes our entry out of a file edited since


class Skip(Exception):
    """An integration that is left out, with the note that says why."""


def hook_template(stage: str) -> dict[str, Any]:
    """The hooks.d file of ``stage``, from :data:`HOOK_TEMPLATE`."""
    return json.loads(json.dumps(HOOK_TEMPLATE).replace('"STAGE"', json.dumps(stage)))  # type: ignore[no-any-return]


def hook_file(stage: str, launcher: str) -> str:
    """The hooks.d JSON of ``stage`` with ``hook.path`` pointed at ``launcher``."""
    data = hook_template(stage)
    data["hook"]["path"] = launcher
    return json.dumps(data, indent=2) + "\n"


UNIT_FALLBACK = """\
# oci-gpu-hook watch: keeps the GPUs' CDI specs current (see examples/systemd in the source tree).
[Unit]
Description=oci-gpu-hook: keep the GPUs' CDI spec current on GPU and partition uevents
After=local-fs.target systemd-modules-load.service
Before=containerd.service crio.service docker.service

[Service]
Type=simple
ExecStartPre=-{launcher} watch --once
ExecStart={launcher} watch
Restart=on-failure
RestartSec=5s

[Install]
WantedBy=multi-user.target
"""


PLANNER_UNIT_FALLBACK = """\
# oci-gpu-hook serve: the resident planner the native front asks (see examples/systemd in the source tree).
[Unit]
Description=oci-gpu-hook: the resident planner the native front asks before it starts Python
After=local-fs.target
Before=containerd.service crio.service docker.service

[Service]
Type=simple
ExecStart={launcher} serve
Restart=always
RestartSec=1s
TimeoutStopSec=15s
User=root
RuntimeDirectory=oci-gpu-hook
RuntimeDirectoryMode=0700
RuntimeDirectoryPreserve=yes

[Install]
WantedBy=multi-user.target
"""


def unit_file(launcher: str, unit: str = SYSTEMD_UNIT) -> str:
    """The shipped unit ``unit`` (examples/systemd: the watch's or the planner's) with its ExecStart lines running
    ``launcher``."""
    name = os.path.basename(unit)
    shipped = os.path.join(PACKAGE_PARENT, "examples", "systemd", name)
    try:
        with open(shipped, encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return (PLANNER_UNIT_FALLBACK if unit == PLANNER_UNIT else UNIT_FALLBACK).format(launcher=launcher)
    lines = []
    for line in text.splitlines(keepends=True):
        key, eq, value = line.partition("=")
        if eq and key in ("ExecStart", "ExecStartPre"):
            dash = "-" if value.startswith("-") else ""
            command = value.lstrip("-").split(" ", 1)
            line = f"{key}={dash}{launcher}{' ' + command[1] if len(command) > 1 else chr(10)}"
        lines.append(line)
    return "".join(lines)


def wanted(config: Config, hook: str, defaults: dict[str, str], notes: list[str],
           disk: Callable[[str], str], only: set[str] | None = None,
           errors: list[str] | None = None, native: bool | None = False, trust: bool = False, *,
           docker_default_runtime: bool = False, containerd_version: str | None = None,
           host_root: str | None = None) -> list[Item]:
    """Every file this install writes, in the order it writes them.  An integration that cannot be done is
    left out: a note (``Skip``) or an error in ``errors`` (raised when ``errors`` is None).  The launchers:
    ``native`` as ``launchers.launcher_files`` takes it (None: the native front when a compiler is found,
    an error when it is found but the front cannot be built); ``trust``: they refuse code that a non-root
    user could change.  ``docker_default_runtime``: make oci-gpu dockerd's default-runtime;
    ``containerd_version``, ``host_root``: see :func:`containerd_items`."""
    from oci_gpu_hook.install.launchers import for_pods, launcher_files

    items: list[Item] = []
    planners: dict[str, Callable[[], list[Item]]] = {
        "podman": lambda: podman_items(hook, disk, notes),
        "cdi": lambda: cdi_items(config, notes),
        "docker": lambda: docker_items(disk, notes, only is not None, docker_default_runtime),
        "containerd": lambda: containerd_items(disk, notes, only is not None, containerd_version=containerd_version,
                                               host_root=host_root),
        "crio": lambda: crio_items(config, disk, only is not None),
        "systemd": lambda: systemd_items(disk, notes, only is not None),
        "nri": lambda: nri_items(disk, notes, only is not None, containerd_version=containerd_version,
                                 host_root=host_root, config=config),
    }
    for name in ("podman", "cdi", "docker", "containerd", "crio", "systemd", "nri"):
        if only is not None and name not in only:
            continue
        try:
            items.extend(replace_integration(planners[name](), name))
        except Skip as skip:
            notes.append(f"{name}: {skip}")
        except HookError as err:
            if errors is None:
                raise
            errors.append(f"{name}: {err}")
    defaults, line = for_pods(defaults, kubernetes_facing(disk, items), "install")
    if line:
        notes.append(line)
    launchers = [Item(path, data, 0o755, "launcher")
                 for path, data in launcher_files(LAUNCHER_DIR, defaults, native=native, trust=trust)]
    return launchers + items


# What pods reach: a runtime or handler that the CRI serves (containerd's drop-in, CRI-O's), the NRI plugin (every
# container of the runtime), a hook in a directory CRI-O reads.  The launchers of an install that writes one of these,
# or whose earlier run did, serve pods, so env requests are off there unless asked for (launchers.for_pods).
POD_FACING = {"containerd": "containerd's CRI runtime oci-gpu", "crio": "CRI-O's runtime handler oci-gpu",
              "nri": "the NRI plugin's unit"}


def pod_facing(path: str, integration: str, disk: Callable[[str], str]) -> str | None:
    """What a file install writes (or wrote) at ``path`` for ``integration`` lets pods reach, in words; None when
    nothing: podman's hook serves pods too where CRI-O reads its directory (one CRI-O's config names, or one it
    cannot read, taken as read)."""
    if integration == "containerd" and cri_disabled(disk):
        return None  # no kubelet can use this containerd: Docker's own (containerd.io ships it so)
    if integration in POD_FACING:
        return POD_FACING[integration]
    if integration != "podman" or not os.path.isdir(disk("/etc/crio")):
        return None
    from oci_gpu_hook.install import crio

    directory = os.path.dirname(path)
    try:
        read = directory in crio.hooks_dirs(disk)
    except HookError:
        read = True
    return f"a hook in {directory}, which CRI-O reads" if read else None


# The gRPC plugin that serves the CRI (a kubelet's), by ID and by its full name, in containerd 1.x and 2.x alike
CRI_SERVICE = ("cri", "io.containerd.grpc.v1.cri")


def cri_disabled(disk: Callable[[str], str]) -> bool:
    """containerd's main config turns its CRI service off (``disabled_plugins``), as the config Docker's containerd.io
    package ships does: nothing of the drop-in then reaches a pod.  A config install cannot read counts as on."""
    import tomllib

    from oci_gpu_hook.install import containerd

    try:
        with open(disk(containerd.MAIN_CONFIG_PATH), "rb") as handle:
            disabled = tomllib.load(handle).get("disabled_plugins")
    except (OSError, tomllib.TOMLDecodeError):
        return False
    return isinstance(disabled, list) and any(name in CRI_SERVICE for name in disabled)


def kubernetes_facing(disk: Callable[[str], str], items: list[Item]) -> list[str]:
    """What pods reach through the launchers once this install is done: the files of ``items``, and those an earlier
    install wrote (its manifest) that are still there (:func:`pod_facing`), each said once."""
    from oci_gpu_hook.install.manifest import load_manifest
    from oci_gpu_hook.install.paths import MANIFEST_PATH

    found = [pod_facing(i.path, i.integration, disk) for i in items]
    try:
        earlier = load_manifest(disk(MANIFEST_PATH))
    except HookError:
        earlier = None  # install itself says what is wrong with it
    for entry in earlier.files if earlier else ():
        if entry["path"] not in {i.path for i in items} and os.path.lexists(disk(entry["path"])):
            what = pod_facing(entry["path"], entry.get("integration", "core"), disk)
            found.append(f"{what} (an earlier install's)" if what else None)
    return list(dict.fromkeys(f for f in found if f))


def replace_integration(items: list[Item], name: str) -> list[Item]:
    return [Item(i.path, i.data, i.mode, i.what, name, i.merge) for i in items]


def podman_items(hook: str, disk: Callable[[str], str], notes: list[str]) -> list[Item]:
    from oci_gpu_hook.install import podman

    if hook == "none":
        raise Skip("--hook none: no hooks.d file")
    directory, source = podman.hooks_dir(disk)
    if hook == "precreate" and os.path.isdir(disk("/etc/crio")):
        from oci_gpu_hook.install import crio

        if directory in crio.hooks_dirs(disk):
            raise Skip(f"no precreate hook: CRI-O is configured here and reads hooks from {directory} too, where "
                       "it refuses to start on podman's precreate hook ('unknown stage'); podman containers get "
                       "no GPU from a hook until install --hook prestart (a hook both run), or a hooks_dir of "
                       "podman's own in containers.conf")
    notes.append(f"podman reads hooks from {directory} ({source})")
    return [Item(f"{directory}/oci-gpu-hook-{hook}.json", hook_file(hook, HOOK_LAUNCHER).encode(),
                 0o644, f"podman {hook} hook")]


def cdi_items(config: Config, notes: list[str]) -> list[Item]:
    from oci_gpu_hook.appliers import cdi
    from oci_gpu_hook.inventory import scan_host

    hook_launcher = HOOK_LAUNCHER
    inventory = scan_host(config)
    if not os.path.isabs(config.cdi_dir):
        raise HookError(f"cdi_dir {config.cdi_dir!r} is not an absolute path")
    if config.hook_path != hook_launcher:
        notes.append(f"hook_path is {config.hook_path}, not the launcher installed here ({hook_launcher}): "
                     "the CDI specs and rewritten specs name hook_path")
    masked = cdi.mask_ignored(config.mask_other_gpus)
    if masked:
        notes.append(masked)
    items = []
    for kind in config.backends:
        path = os.path.normpath(config.cdi_spec_path(kind))
        if inventory.devices(kind):
            spec = cdi.generate(inventory, kind, config)
            cdi.validate(spec, f"generated CDI spec of {kind}")
            items.append(Item(path, cdi.render(spec, "json").encode(), 0o644, f"CDI spec ({kind})"))
        else:
            notes.append(f"no {kind} GPUs under {inventory.sysfs_root}: the CDI spec {path} is not written")
    return items


def _read_text(disk_path: str) -> tuple[str | None, int]:
    """A config file's text and mode; (None, 0o644) when there is none."""
    try:
        with open(disk_path, encoding="utf-8") as handle:
            text = handle.read()
        return text, stat.S_IMODE(os.stat(disk_path).st_mode)
    except FileNotFoundError:
        return None, 0o644
    except (OSError, ValueError) as err:
        raise HookError(f"cannot read {disk_path}: {getattr(err, 'strerror', None) or err}") from None


def docker_items(disk: Callable[[str], str], notes: list[str], explicit: bool,
                 default_runtime: bool = False) -> list[Item]:
    """daemon.json with the ``oci-gpu`` runtime (and ``default-runtime`` when asked), and the
    ``amd-container-runtime`` name Docker's ``--gpus`` looks for on dockerd's PATH (see :mod:`docker`)."""
    from oci_gpu_hook.install import docker

    if not explicit and not os.path.isdir(disk(os.path.dirname(docker.DAEMON_JSON))):
        raise Skip(f"no {os.path.dirname(docker.DAEMON_JSON)} here: docker is not configured")
    runtime = RUNTIME_LAUNCHER
    text, mode = _read_text(disk(docker.DAEMON_JSON))
    new = docker.merged(text, runtime, disk(docker.DAEMON_JSON), default_runtime)
    data = text if new is None else new
    assert data is not None
    what = "docker daemon.json (runtime oci-gpu" + (", default-runtime oci-gpu)" if default_runtime else ")")
    items = [Item(docker.DAEMON_JSON, data.encode(), mode, what, merge="docker")]
    foreign = [p for p in docker.on_dockerd_path(disk, docker.GPUS_NAME) if not docker.written_by_install(p)]
    version = docker.dockerd_version(disk)
    if version is not None and version >= docker.CDI_GPUS:
        notes.append(f"docker: dockerd {version[0]}.{version[1]} serves --gpus through CDI from the amd.com spec "
                     f"(install --only cdi writes it), so {docker.GPUS_PATH} is not written: with it, a --gpus id "
                     "the spec lacks would fall back to AMD_VISIBLE_DEVICES, which runc ignores (a container "
                     "without its GPU, and no error)" + (f"; {', '.join(foreign)} (not this install's) does just "
                                                         "that: remove it" if foreign else ""))
    elif foreign:
        notes.append(f"docker: {', '.join(foreign)} is not this install's (AMD's container toolkit?): left as it is, "
                     f"and {docker.GPUS_PATH} is not written; that file already makes Docker 28.3+ register its AMD "
                     "driver, so `docker run --runtime oci-gpu --gpus ...` reaches this shim just the same")
    else:
        items.append(Item(docker.GPUS_PATH, docker.gpus_script(runtime).encode(), 0o755,
                          "the name Docker's --gpus looks for on dockerd's PATH"))
    nvidia = [p for name in docker.NVIDIA_NAMES for p in docker.on_dockerd_path(disk, name)]
    if nvidia:
        notes.append(f"docker: NVIDIA's {', '.join(nvidia)} is on dockerd's PATH: Docker then registers its NVIDIA "
                     "driver for --gpus instead of AMD's (it looks for NVIDIA first), --gpus sets "
                     "NVIDIA_VISIBLE_DEVICES and never asks this shim for a GPU; ask with "
                     "-e AMD_VISIBLE_DEVICES=N or --device amd.com/gpu=N (CDI) instead")
    current = json.loads(data).get("default-runtime") if data.strip() else None
    if current == docker.RUNTIME_NAME:
        notes.append("docker: default-runtime is oci-gpu: every container goes through the shim (one without a "
                     "GPU request goes straight on to runc)")
    else:
        notes.append("docker: containers run through the shim only with --runtime oci-gpu; without it, runc runs "
                     "them and a GPU request (--gpus, -e AMD_VISIBLE_DEVICES) gets no GPU, with no error. "
                     "install --docker-default-runtime makes oci-gpu dockerd's default-runtime")
    notes.append("restart dockerd to load the oci-gpu runtime and the --gpus driver (it looks for "
                 f"{docker.GPUS_NAME} only when it starts); then: docker run --runtime oci-gpu --gpus device=1 ... "
                 "(Docker 28.3+), or -e AMD_VISIBLE_DEVICES=1 (any Docker) where env requests are on")
    return items


def containerd_items(disk: Callable[[str], str], notes: list[str], explicit: bool = False, *,
                     containerd_version: str | None = None, host_root: str | None = None) -> list[Item]:
    """The drop-in (built from the node's main config, see :mod:`containerd`) and the main config with
    the ``imports`` line it needs; nothing on a host without /etc/containerd.  The config version and
    native CDI follow the node's containerd, found under ``host_root`` (default: the prefix) or given
    as ``containerd_version`` (:mod:`containerd_detect`)."""
    import tomllib

    from oci_gpu_hook.install import containerd, containerd_detect

    if not explicit and not os.path.isdir(disk(os.path.dirname(containerd.MAIN_CONFIG_PATH))):
        raise Skip(f"no {os.path.dirname(containerd.MAIN_CONFIG_PATH)} here: containerd is not configured")
    main_disk = disk(containerd.MAIN_CONFIG_PATH)
    text, mode = _read_text(main_disk)
    try:
        main = tomllib.loads(text) if text is not None else None
    except tomllib.TOMLDecodeError as err:
        raise HookError(f"{main_disk} is not valid TOML ({err})") from None
    if main is not None and containerd.config_version(main) not in containerd.CRI_PLUGIN:
        raise Skip(f"{main_disk} is a version {main.get('version', 1)} config: containerd is left as it "
                   "is (convert it with `containerd config migrate`, then install again)")
    detection = containerd_detect.detect(host_root or disk("/"), option=containerd_version,
                                         path_env=os.environ.get("PATH"))
    chosen = containerd_detect.plan(detection, containerd.config_version(main) if main is not None else None,
                                    main_disk)
    version, cdi = chosen.version, chosen.cdi
    notes.append(f"containerd: {chosen.note}")
    items = [Item(containerd.DROP_IN_PATH,
                  containerd.drop_in(RUNTIME_LAUNCHER, main, version=version, cdi=cdi).encode(),
                  0o644, "containerd drop-in")]
    if text is None:
        imports = f'version = {version}\nimports = ["{containerd.DROP_IN_DIR}/*.toml"]{containerd.IMPORT_MARK}\n'
    else:  # as it is when it imports the drop-in already: still wanted, so a re-run keeps it
        imports = containerd.with_import(text, main_disk) or text
    items.append(Item(containerd.MAIN_CONFIG_PATH, imports.encode(), mode, "containerd config (imports)"))
    notes.append(RESTART_CONTAINERD)
    return items


def crio_items(config: Config, disk: Callable[[str], str], explicit: bool) -> list[Item]:
    from oci_gpu_hook.install import crio

    if not explicit and not os.path.isdir(disk("/etc/crio")):
        raise Skip("no /etc/crio here: CRI-O is not configured")
    dirs = list(DEFAULT_SPEC_DIRS)
    if os.path.normpath(config.cdi_dir) not in dirs:
        dirs.append(os.path.normpath(config.cdi_dir))
    return [Item(crio.DROP_IN_PATH, crio.drop_in(RUNTIME_LAUNCHER, dirs).encode(), 0o644,
                 "CRI-O drop-in")]


def systemd_items(disk: Callable[[str], str], notes: list[str], explicit: bool) -> list[Item]:
    if not explicit and not os.path.isdir(disk("/etc/systemd/system")):
        raise Skip("no /etc/systemd/system here: the watch and planner units are not installed")
    notes.append("systemctl daemon-reload && systemctl enable --now oci-gpu-hook-watch oci-gpu-hook-planner "
                 "(after an upgrade: systemctl restart oci-gpu-hook-planner; until then the launchers start Python)")
    return [Item(SYSTEMD_UNIT, unit_file(HOOK_LAUNCHER).encode(), 0o644, "systemd watch unit"),
            Item(PLANNER_UNIT, unit_file(HOOK_LAUNCHER, PLANNER_UNIT).encode(), 0o644, "systemd planner unit")]


# The NRI plugin's unit (docs/nri.md): the plugin exits when the runtime closes its connection (a restart), and
# systemd starts it again, as often as it takes: while the runtime is down each start fails at once, and with
# systemd's default start limit (5 starts in 10 s) a runtime down for more than a few seconds would leave the plugin
# stopped for good (a real containerd 2.1.9 restart made each start fail; systemd 252 failed the unit after 5), hence
# StartLimitIntervalSec=0.  Hardened as the DaemonSet's container `nri` runs it (docs/security.md): root without a
# capability (it connects to the runtime's root-owned socket, reads sysfs and the config, and writes root-owned
# directories under /run/oci-gpu-hook: none of that takes one), no new privileges, and a read-only system but for
# /run/oci-gpu-hook (RuntimeDirectory: made 0700 root's where missing, as the planner makes it, and kept when the
# plugin stops) and the by-path directory and log file's directory the config names elsewhere ({writable}).
NRI_UNIT_TEXT = """# oci-gpu-hook nri: the NRI plugin for containerd 2.x and CRI-O (docs/nri.md in the source tree).
[Unit]
Description=oci-gpu-hook: the NRI plugin that gives each container the GPUs it asks for
After=containerd.service crio.service
StartLimitIntervalSec=0

[Service]
ExecStart={launcher} nri
Restart=always
RestartSec=1s
User=root
CapabilityBoundingSet=
AmbientCapabilities=
NoNewPrivileges=yes
ProtectSystem=strict
RuntimeDirectory=oci-gpu-hook
RuntimeDirectoryMode=0700
RuntimeDirectoryPreserve=yes
{writable}RestrictAddressFamilies=AF_UNIX

[Install]
WantedBy=multi-user.target
"""
NRI_RUNTIME_DIRECTORY = "/run/oci-gpu-hook"


def nri_unit(launcher: str, config: Config) -> str:
    """:data:`NRI_UNIT_TEXT` for ``launcher``, with a ``ReadWritePaths=`` line for each place ``config`` has the
    plugin write outside /run/oci-gpu-hook (``by_path_dir``, ``log_file``'s directory; ``-``: one missing when the
    unit starts is left out, and the plugin's write there is refused as before)."""
    places = [config.by_path_dir, os.path.dirname(config.log_file) if config.log_file else ""]
    writable = ""
    for place in dict.fromkeys(os.path.normpath(p) for p in places if p):
        if place == NRI_RUNTIME_DIRECTORY or place.startswith(NRI_RUNTIME_DIRECTORY + "/"):
            continue
        quoted = place.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
        writable += f'ReadWritePaths="-{quoted}"\n'
    return NRI_UNIT_TEXT.format(launcher=launcher, writable=writable)


# The first containerd whose NRI (containerd/nri v0.10.0) has the default validator: 2.0 and 2.1 vendor v0.8.0
NRI_VALIDATOR_CONTAINERD = (2, 2)


def nri_runtime(disk: Callable[[str], str], containerd_version: str | None = None,
                host_root: str | None = None) -> tuple[str, bool] | None:
    """The runtime here that has NRI, by its version (containerd 2.x; containerd 1.x has none), or CRI-O where
    /etc/crio is, and whether it is a containerd too old for NRI's default validator; None when neither."""
    from oci_gpu_hook.install import containerd_detect

    if containerd_version is not None or os.path.isdir(disk("/etc/containerd")):
        found = containerd_detect.detect(host_root or disk("/"), option=containerd_version,
                                         path_env=os.environ.get("PATH")).found
        if found is not None and found.version[0] >= 2:
            return f"containerd {found.shown}", found.version < NRI_VALIDATOR_CONTAINERD
    if os.path.isdir(disk("/etc/crio")):
        return "CRI-O", False
    return None


def nri_items(disk: Callable[[str], str], notes: list[str], explicit: bool, *, containerd_version: str | None = None,
              host_root: str | None = None, config: Config | None = None) -> list[Item]:
    """The NRI plugin's systemd unit, where a runtime with NRI is (``--only nri``: wherever asked)."""
    import importlib.util

    runtime = nri_runtime(disk, containerd_version, host_root)
    if runtime is None and not explicit:
        raise Skip("no containerd 2.x or CRI-O found here (containerd 1.x has no NRI): the NRI plugin's unit is "
                   "not installed")
    if not explicit and not os.path.isdir(disk("/etc/systemd/system")):
        raise Skip("no /etc/systemd/system here: the NRI plugin's unit is not installed")
    try:
        protobuf = importlib.util.find_spec("google.protobuf") is not None
    except ImportError:  # no google package at all: find_spec imports the parent
        protobuf = False
    if not protobuf:
        why = "the NRI plugin needs protobuf: pip install 'oci-gpu-hook[nri]', then install again"
        if explicit:
            raise HookError(why)
        raise Skip(why)
    name, no_validator = runtime or ("no containerd 2.x or CRI-O found", False)
    if no_validator:
        closed = (f"{name} has no NRI default validator (containerd 2.2 and later have it): while the plugin is "
                  "down, a container that asks by env starts without its GPU; where that must never happen, use the "
                  "RuntimeClass shim or CDI (docs/nri.md)")
    else:
        closed = "a pod that must never start without its GPU needs NRI's default validator (docs/nri.md)"
    notes.append(f"nri: {name}: systemctl daemon-reload && systemctl enable --now oci-gpu-hook-nri; NRI must be on "
                 f"in the runtime, and {closed}")
    unit = nri_unit(HOOK_LAUNCHER, config or Config())
    return [Item(NRI_UNIT, unit.encode(), 0o644, "systemd NRI plugin unit")]
