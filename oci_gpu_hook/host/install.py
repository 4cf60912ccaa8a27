"""``oci-gpu-hook install``: put everything a host needs in place, record it, and take it back out.

``install [--only podman,docker,containerd,crio,cdi,systemd]``: each integration on its own; one
that cannot be done (a config install cannot read, a containerd config of version 1) is reported and
skipped, and the others are still done.  Without ``--only``: the launchers, the podman hook and the
CDI specs always, and docker, containerd, CRI-O and systemd where their ``/etc`` directory exists.
What it writes (real paths; ``--prefix DIR`` puts each of them under DIR, creating what it needs):

- the lean launchers ``oci-gpu-hook`` and ``oci-gpu-runtime`` in :data:`LAUNCHER_DIR` (mode 0755);
- podman: the hooks.d file of the chosen stage (``--hook precreate|prestart|none``) in the hooks
  directory this podman reads (:mod:`podman`: containers.conf ``[engine] hooks_dir``, else
  podman's default ``/usr/share/containers/oci/hooks.d``), ``hook.path`` the installed launcher;
- cdi: the CDI spec of each kind with devices in ``cdi_dir`` (``<vendor>-<class>.json``);
- docker: the ``oci-gpu`` runtime merged into ``/etc/docker/daemon.json`` (``--docker-default-runtime``:
  also ``"default-runtime": "oci-gpu"``), and the ``amd-container-runtime`` name Docker 28.3+'s
  ``--gpus`` looks for on dockerd's PATH, unless someone else's is there (:mod:`docker`);
- containerd: the drop-in at :data:`containerd.DROP_IN_PATH` (config version 2, 3 or 4; native CDI on
  1.7+) and the main config with the ``imports`` line that loads it (:mod:`containerd`); which
  containerd the node runs is read under ``--host-root`` or given as ``--containerd-version``
  (:mod:`containerd_detect`);
- crio: the drop-in :data:`crio.DROP_IN_PATH` (CDI spec dirs, the ``oci-gpu`` runtime handler);
- systemd: the ``watch`` unit in :data:`SYSTEMD_UNIT` and the resident planner's (``serve``) in
  :data:`PLANNER_UNIT`, their ExecStart the installed launcher;
- the manifest :data:`MANIFEST_PATH`: each file written (its sha256 and mode, its integration, and
  what was there before), and each directory created.

A file that was already there with other content (or a symlink) is first saved under
:data:`BACKUP_DIR`, and put back by ``--uninstall``; one already exactly as wanted is adopted and left
in place by ``--uninstall``.  ``--prefix`` changes where files land, never what they say.

Running install again is idempotent.  A file install wrote that has been edited since is neither
overwritten nor removed (daemon.json excepted: uninstall takes just our runtime out of it).

**Crash safety.**  Every run is one transaction recorded in a journal
(:data:`JOURNAL_DIR`/journal.json, written atomically and fsync'd) *before* each change: a directory
made or removed, or a path about to change, with a copy of what was there.  The run ends by deleting
the journal.  A run killed at any point leaves the journal behind; the next run (install or
uninstall) first rolls the interrupted one back, step by step in reverse (each undo idempotent, so
a rollback killed half-way is simply done again), and then does its own work.  The state directory
is created (and removed by uninstall) with a single rename from a staging directory, so even those
moments leave nothing behind.  Tests kill a run at every one of its steps with
``OCI_GPU_HOOK_INSTALL_KILL_AT=N`` (SIGKILL just before the Nth change).
"""

from __future__ import annotations

import difflib
import errno
import hashlib
import json
import os
import shutil
import signal
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from oci_gpu_hook.atomic import fsync_dir
from oci_gpu_hook.config import Config
from oci_gpu_hook.errors import HookError

LAUNCHER_DIR = "/usr/local/libexec/oci-gpu-hook"
HOOK_STAGES = ("precreate", "prestart")
STATE_DIR = "/var/lib/oci-gpu-hook"
MANIFEST_PATH = f"{STATE_DIR}/install.json"
BACKUP_DIR = f"{STATE_DIR}/backup"
JOURNAL_DIR = f"{STATE_DIR}/journal.d"
JOURNAL_PATH = f"{JOURNAL_DIR}/journal.json"
STAGING = ".oci-gpu-hook-staging"  # a directory being created or removed as a whole, by one rename
SYSTEMD_UNIT = "/etc/systemd/system/oci-gpu-hook-watch.service"
PLANNER_UNIT = "/etc/systemd/system/oci-gpu-hook-planner.service"
MANIFEST_FORMAT = 1
SHOW_LIMIT = 4096  # --dry-run prints the content of new files up to this size, a diff for replaced ones
INTEGRATIONS = ("podman", "docker", "containerd", "crio", "cdi", "systemd")
KILL_ENV = "OCI_GPU_HOOK_INSTALL_KILL_AT"
TEMP_MARK = ".oci-gpu-hook."  # in the temp names of atomic writes: .<name>.oci-gpu-hook.<pid>.<hex>

# The shipped hooks.d/oci-gpu-hook-<stage>.json, for installs without the source tree (a wheel does
# not carry hooks.d/); a test keeps the two identical, and both name the launcher install writes.
HOOK_TEMPLATE: dict[str, Any] = {
    "version": "1.0.0",
    "hook": {
        "path": f"{LAUNCHER_DIR}/oci-gpu-hook",
        "args": ["oci-gpu-hook", "STAGE"],
        "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "timeout": 10,
    },
    "when": {"always": True},
    "stages": ["STAGE"],
}

PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))



# --- what to write -------------------------------------------------------------------------------


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
    """The shipped hooks.d file of ``stage`` (from the source tree when there, else the built-in copy)."""
    shipped = os.path.join(PACKAGE_PARENT, "hooks.d", f"oci-gpu-hook-{stage}.json")
    try:
        with open(shipped, "rb") as handle:
            text = handle.read()
    except FileNotFoundError:
        return json.loads(json.dumps(HOOK_TEMPLATE).replace('"STAGE"', json.dumps(stage)))
    except OSError as err:
        raise HookError(f"cannot read the hooks.d template {shipped}: {err.strerror}") from None
    try:
        data = json.loads(text)
    except ValueError as err:
        raise HookError(f"hooks.d template {shipped} is not valid JSON ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("hook"), dict) or stage not in data.get("stages", []):
        raise HookError(f"hooks.d template {shipped}: expected a podman hook object with stage {stage!r}")
    return data


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
    from oci_gpu_hook.host.launchers import launcher_files

    items = [Item(path, data, 0o755, "launcher")
             for path, data in launcher_files(LAUNCHER_DIR, defaults, native=native, trust=trust)]
    planners: dict[str, Callable[[], list[Item]]] = {
        "podman": lambda: podman_items(hook, disk, notes),
        "cdi": lambda: cdi_items(config, notes),
        "docker": lambda: docker_items(disk, notes, only is not None, docker_default_runtime),
        "containerd": lambda: containerd_items(disk, notes, only is not None, containerd_version=containerd_version,
                                               host_root=host_root),
        "crio": lambda: crio_items(config, disk, only is not None),
        "systemd": lambda: systemd_items(disk, notes, only is not None),
    }
    for name in ("podman", "cdi", "docker", "containerd", "crio", "systemd"):
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
    return items


def replace_integration(items: list[Item], name: str) -> list[Item]:
    return [Item(i.path, i.data, i.mode, i.what, name, i.merge) for i in items]


def podman_items(hook: str, disk: Callable[[str], str], notes: list[str]) -> list[Item]:
    from oci_gpu_hook.host import podman

    if hook == "none":
        raise Skip("--hook none: no hooks.d file")
    directory, source = podman.hooks_dir(disk)
    notes.append(f"podman reads hooks from {directory} ({source})")
    return [Item(f"{directory}/oci-gpu-hook-{hook}.json", hook_file(hook, f"{LAUNCHER_DIR}/oci-gpu-hook").encode(),
                 0o644, f"podman {hook} hook")]


def cdi_items(config: Config, notes: list[str]) -> list[Item]:
    from oci_gpu_hook.appliers import cdi
    from oci_gpu_hook.inventory import scan_host

    hook_launcher = f"{LAUNCHER_DIR}/oci-gpu-hook"
    inventory = scan_host(config)
    if not os.path.isabs(config.cdi_dir):
        raise HookError(f"cdi_dir {config.cdi_dir!r} is not an absolute path")
    if config.hook_path != hook_launcher:
        notes.append(f"hook_path is {config.hook_path}, not the launcher installed here ({hook_launcher}): "
                     "the CDI specs and rewritten specs name hook_path")
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
    from oci_gpu_hook.host import docker

    if not explicit and not os.path.isdir(disk(os.path.dirname(docker.DAEMON_JSON))):
        raise Skip(f"no {os.path.dirname(docker.DAEMON_JSON)} here: docker is not configured")
    runtime = f"{LAUNCHER_DIR}/oci-gpu-runtime"
    text, mode = _read_text(disk(docker.DAEMON_JSON))
    new = docker.merged(text, runtime, disk(docker.DAEMON_JSON), default_runtime)
    data = text if new is None else new
    assert data is not None
    what = "docker daemon.json (runtime oci-gpu" + (", default-runtime oci-gpu)" if default_runtime else ")")
    items = [Item(docker.DAEMON_JSON, data.encode(), mode, what, merge="docker")]
    foreign = [p for p in docker.on_dockerd_path(disk, docker.GPUS_NAME) if not docker.ours(p)]
    if foreign:
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
                 "(Docker 28.3+) or -e AMD_VISIBLE_DEVICES=1 (any Docker)")
    return items


def containerd_items(disk: Callable[[str], str], notes: list[str], explicit: bool = False, *,
                     containerd_version: str | None = None, host_root: str | None = None) -> list[Item]:
    """The drop-in (built from the node's main config, see :mod:`containerd`) and the main config with
    the ``imports`` line it needs; nothing on a host without /etc/containerd.  The config version and
    native CDI follow the node's containerd, found under ``host_root`` (default: the prefix) or given
    as ``containerd_version`` (:mod:`containerd_detect`)."""
    import tomllib

    from oci_gpu_hook.host import containerd, containerd_detect

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
                  containerd.drop_in(f"{LAUNCHER_DIR}/oci-gpu-runtime", main, version=version, cdi=cdi).encode(),
                  0o644, "containerd drop-in")]
    if text is None:
        imports = f'version = {version}\nimports = ["{containerd.DROP_IN_DIR}/*.toml"]\n'
    else:  # as it is when it imports the drop-in already: still wanted, so a re-run keeps it
        imports = containerd.with_import(text, main_disk) or text
    items.append(Item(containerd.MAIN_CONFIG_PATH, imports.encode(), mode, "containerd config (imports)"))
    notes.append("restart containerd to load its new configuration")
    return items


def crio_items(config: Config, disk: Callable[[str], str], explicit: bool) -> list[Item]:
    from oci_gpu_hook.host import crio

    if not explicit and not os.path.isdir(disk("/etc/crio")):
        raise Skip("no /etc/crio here: CRI-O is not configured")
    dirs = ["/etc/cdi", "/var/run/cdi"]
    if os.path.normpath(config.cdi_dir) not in dirs:
        dirs.append(os.path.normpath(config.cdi_dir))
    return [Item(crio.DROP_IN_PATH, crio.drop_in(f"{LAUNCHER_DIR}/oci-gpu-runtime", dirs).encode(), 0o644,
                 "CRI-O drop-in")]


def systemd_items(disk: Callable[[str], str], notes: list[str], explicit: bool) -> list[Item]:
    if not explicit and not os.path.isdir(disk("/etc/systemd/system")):
        raise Skip("no /etc/systemd/system here: the watch and planner units are not installed")
    notes.append("systemctl daemon-reload && systemctl enable --now oci-gpu-hook-watch oci-gpu-hook-planner "
                 "(after an upgrade: systemctl restart oci-gpu-hook-planner; until then the launchers start Python)")
    launcher = f"{LAUNCHER_DIR}/oci-gpu-hook"
    return [Item(SYSTEMD_UNIT, unit_file(launcher).encode(), 0o644, "systemd watch unit"),
            Item(PLANNER_UNIT, unit_file(launcher, PLANNER_UNIT).encode(), 0o644, "systemd planner unit")]


# --- the manifest --------------------------------------------------------------------------------


@dataclass
class Manifest:
    files: list[dict[str, Any]] = field(default_factory=list)
    directories: list[str] = field(default_factory=list)

    def entry(self, path: str) -> dict[str, Any] | None:
        return next((e for e in self.files if e["path"] == path), None)

    def record(self, entry: dict[str, Any]) -> None:
        """Put ``entry`` in place of the one for the same path, or add it."""
        for i, old in enumerate(self.files):
            if old["path"] == entry["path"]:
                self.files[i] = entry
                return
        self.files.append(entry)

    def forget(self, path: str) -> None:
        self.files = [e for e in self.files if e["path"] != path]

    def text(self) -> str:
        from oci_gpu_hook import __version__

        return json.dumps({"format": MANIFEST_FORMAT, "written_by": f"oci-gpu-hook {__version__}",
                           "files": self.files, "directories": self.directories}, indent=2) + "\n"


def _real_path(value: Any, where: str) -> str:
    if (not isinstance(value, str) or not value.startswith("/") or os.path.normpath(value) != value or value == "/"
            or "\0" in value):
        raise HookError(f"{where}: {value!r} is not a normalized absolute path")
    return value


def _check_entry(entry: Any, where: str) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise HookError(f"{where}: a file entry is an object")
    _real_path(entry.get("path"), where)
    sha = entry.get("sha256")
    if not isinstance(sha, str) or len(sha) != 64 or set(sha) - set("0123456789abcdef"):
        raise HookError(f"{where}: {entry['path']}: bad sha256 {sha!r}")
    _mode(entry.get("mode"), f"{where}: {entry['path']}")
    backup = entry.get("backup")
    if backup is not None:
        if not isinstance(backup, dict):
            raise HookError(f"{where}: {entry['path']}: bad backup {backup!r}")
        if "symlink" in backup:
            if not isinstance(backup["symlink"], str):
                raise HookError(f"{where}: {entry['path']}: bad backup symlink {backup['symlink']!r}")
        else:
            _real_path(backup.get("path"), f"{where}: {entry['path']}: backup")
            _mode(backup.get("mode"), f"{where}: {entry['path']}: backup")
            for key in ("uid", "gid", "mtime_ns"):
                if key in backup and (not isinstance(backup[key], int) or isinstance(backup[key], bool)
                                      or backup[key] < 0):
                    raise HookError(f"{where}: {entry['path']}: bad backup {key} {backup[key]!r}")
    return entry


def _mode(value: Any, where: str) -> int:
    try:
        mode = int(value, 8)
    except (TypeError, ValueError):
        mode = -1
    if not 0 <= mode <= 0o7777:
        raise HookError(f"{where}: bad mode {value!r} (expected an octal string like '0644')")
    return mode


def load_manifest(disk_path: str) -> Manifest | None:
    """The manifest at ``disk_path``, or None when there is none."""
    try:
        with open(disk_path, "rb") as handle:
            text = handle.read()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise HookError(f"cannot read the manifest {disk_path}: {err.strerror}") from None
    hint = f"manifest {disk_path}"
    try:
        data = json.loads(text)
    except ValueError as err:
        raise HookError(f"{hint} is not valid JSON ({err}); fix it or move it away") from None
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise HookError(f"{hint}: not an install manifest of format {MANIFEST_FORMAT}")
    files, directories = data.get("files"), data.get("directories")
    if not isinstance(files, list) or not isinstance(directories, list):
        raise HookError(f"{hint}: 'files' and 'directories' must be lists")
    return Manifest([_check_entry(e, hint) for e in files], [_real_path(d, hint) for d in directories])


# --- the file system, under the prefix: every change is one step ----------------------------------


_STEPS = {"done": 0}


def _step() -> None:
    """Count one change about to be made; ``OCI_GPU_HOOK_INSTALL_KILL_AT=N`` kills the run just before the Nth
    (the crash tests)."""
    at = os.environ.get(KILL_ENV)
    if at:
        _STEPS["done"] += 1
        if _STEPS["done"] == int(at):
            os.kill(os.getpid(), signal.SIGKILL)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _replace(path: str, make: Callable[[str], None], what: str) -> None:
    """Make a temp entry next to ``path`` with ``make``, then rename it over ``path``: two steps."""
    directory, name = os.path.split(path)
    temp = os.path.join(directory, f".{name}{TEMP_MARK}{os.getpid()}.{os.urandom(4).hex()}")
    _step()
    try:
        make(temp)
        _step()
        os.rename(temp, path)
    except OSError as err:
        _clean_temps(directory, name)
        raise HookError(f"cannot {what} {path}: {err.strerror}") from None
    fsync_dir(directory)


def write_file(path: str, data: bytes, mode: int, owner: tuple[int, int] | None = None,
               mtime_ns: int | None = None) -> None:
    """Replace ``path`` atomically and durably with exactly ``mode``: a temp file (fsync'd), then a rename."""

    def fill(temp: str) -> None:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if owner is not None and os.geteuid() == 0:
                os.fchown(fd, *owner)
            os.fchmod(fd, mode)
            if mtime_ns is not None:
                os.utime(fd, ns=(mtime_ns, mtime_ns))
            os.fsync(fd)
        finally:
            os.close(fd)

    _replace(path, fill, "write")


def _symlink(path: str, target: str) -> None:
    _replace(path, lambda temp: os.symlink(target, temp), "make the symlink")


def _unlink(path: str) -> None:
    _step()
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as err:
        raise HookError(f"cannot remove {path}: {err.strerror}") from None
    fsync_dir(os.path.dirname(path))


def _clean_temps(directory: str, name: str | None = None) -> None:
    """Remove the temp files of atomic writes killed half-way (of ``name``, or of any file) in ``directory``."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for entry in names:
        if entry.startswith(f".{name}{TEMP_MARK}" if name is not None else ".") and TEMP_MARK in entry:
            try:
                os.unlink(os.path.join(directory, entry))
            except OSError:
                pass


@dataclass
class Current:
    """What is at a path now: nothing, a regular file (its bytes and stat), or a symlink."""

    kind: str  # "missing", "file", "symlink"
    data: bytes = b""
    mode: int = 0
    target: str = ""
    st: os.stat_result | None = None


def _current(disk: str) -> Current:
    try:
        st = os.lstat(disk)
    except FileNotFoundError:
        return Current("missing")
    except NotADirectoryError:
        raise HookError(f"cannot write {disk}: a component of the path is not a directory") from None
    except OSError as err:
        raise HookError(f"cannot inspect {disk}: {err.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        try:
            return Current("symlink", target=os.readlink(disk), st=st)
        except OSError as err:
            raise HookError(f"cannot read the symlink {disk}: {err.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise HookError(f"{disk} is {what}: install writes a file there; move it away first")
    try:
        fd = os.open(disk, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            data = handle.read()
    except OSError as err:
        raise HookError(f"cannot read {disk}: {err.strerror}") from None
    return Current("file", data=data, mode=stat.S_IMODE(st.st_mode), st=st)


# --- the journal: each run is a transaction ------------------------------------------------------


class Journal:
    """The record of one run's changes, written before each change, so that a killed run can be rolled back."""

    def __init__(self, disk: Callable[[str], str]) -> None:
        self.disk = disk
        self.op = ""
        self.created: list[str] = []  # state directories this run made (with the journal, by one rename)
        self.steps: list[dict[str, Any]] = []
        self.noted: set[str] = set()
        self.active = False
        self.pending = ""  # the run whose journal starts at its first change (a run that changes nothing writes none)
        self.on_created: Callable[[list[str]], None] = lambda created: None

    # starting, finishing

    def recover(self) -> bool:
        """Roll back a run that was killed; True if there was one."""
        for real in self._state_ancestors():
            staging = os.path.join(self.disk(real), STAGING)
            if os.path.lexists(staging):
                shutil.rmtree(staging, ignore_errors=True)
        journal = self.disk(JOURNAL_PATH)
        try:
            with open(journal, "rb") as handle:
                data = json.loads(handle.read())
        except FileNotFoundError:
            if os.path.isdir(self.disk(JOURNAL_DIR)):  # a run that had finished but for this clean-up
                shutil.rmtree(self.disk(JOURNAL_DIR), ignore_errors=True)
            return False
        except (OSError, ValueError) as err:
            raise HookError(f"cannot read the install journal {journal} ({err}); fix it or move it away") from None
        if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
            raise HookError(f"{journal}: not an install journal")
        self.op, self.created, self.steps = data.get("op", "?"), list(data.get("created", [])), data["steps"]
        for entry in reversed(self.steps):
            self._undo(entry)
        print(f"recovered: an interrupted {self.op} was rolled back ({len(self.steps)} changes undone)")
        self._finish(remove_state=bool(self.created))
        self.steps, self.created, self.noted = [], [], set()
        return True

    def begin(self, op: str) -> list[str]:
        """Start recording (the journal exists on disk when this returns); the state directories it created."""
        self.op, self.active = op, True
        state = self.disk(STATE_DIR)
        if os.path.isdir(state):
            _step()
            os.makedirs(self.disk(JOURNAL_DIR), 0o700, exist_ok=True)
            self._save()
            return []
        missing = [real for real in self._state_ancestors()[1:] if not os.path.isdir(self.disk(real))]
        for real in missing:
            if os.path.lexists(self.disk(real)):
                raise HookError(f"{self.disk(real)} is not a directory: install needs a directory there")
        top = missing[0]
        staging_root = os.path.join(self.disk(os.path.dirname(top)), STAGING)
        inside = os.path.join(staging_root, os.path.relpath(self.disk(JOURNAL_DIR), self.disk(top)))
        _step()
        try:
            os.makedirs(inside, 0o755)
            self.created = missing
            for real in missing:  # exactly 0755 whatever the umask (the journal's own directory: 0700)
                os.chmod(os.path.join(staging_root, os.path.relpath(self.disk(real), self.disk(top))), 0o755)
            os.chmod(inside, 0o700)
            self._save(os.path.join(inside, os.path.basename(JOURNAL_PATH)))
            _step()
            os.rename(staging_root, self.disk(top))
        except OSError as err:
            shutil.rmtree(staging_root, ignore_errors=True)
            raise HookError(f"cannot create {self.disk(top)}: {err.strerror}") from None
        fsync_dir(os.path.dirname(self.disk(top)))
        return missing

    def commit(self, remove_state: bool = False) -> None:
        """The run is done: forget the journal (and, for an uninstall that emptied it, the state directory)."""
        if remove_state:
            self._open()  # the state directory goes with the journal, in one rename
        if self.active:
            self._finish(remove_state)
            self.active = False
        self.pending = ""

    def _finish(self, remove_state: bool) -> None:
        top = self._removable_state_top() if remove_state else None
        if top is not None:  # the journal and the state directories go together, in one rename
            staging = os.path.join(self.disk(os.path.dirname(top)), STAGING)
            _step()
            os.rename(self.disk(top), staging)
            fsync_dir(os.path.dirname(staging))
            shutil.rmtree(staging, ignore_errors=True)
            return
        _unlink(self.disk(JOURNAL_PATH))
        shutil.rmtree(self.disk(JOURNAL_DIR), ignore_errors=True)

    def _state_ancestors(self) -> list[str]:
        """"/", then each directory down to STATE_DIR."""
        parts = STATE_DIR.strip("/").split("/")
        return ["/"] + ["/" + "/".join(parts[:n]) for n in range(1, len(parts) + 1)]

    def _removable_state_top(self) -> str | None:
        """The highest created state directory that holds nothing but the chain down to the journal."""
        chain = self._state_ancestors()[1:]
        created = [real for real in chain if real in self.created]
        if STATE_DIR not in created:
            return None
        try:
            if [n for n in os.listdir(self.disk(STATE_DIR)) if TEMP_MARK not in n] != [os.path.basename(JOURNAL_DIR)]:
                return None
        except OSError:
            return None
        top = STATE_DIR
        for real in reversed(created[:-1]):
            below = chain[chain.index(real) + 1]
            try:
                if os.listdir(self.disk(real)) != [os.path.basename(below)]:
                    break
            except OSError:
                break
            top = real
        return top

    # recording

    def _save(self, path: str | None = None) -> None:
        text = json.dumps({"format": 1, "op": self.op, "created": self.created, "steps": self.steps}) + "\n"
        write_file(path or self.disk(JOURNAL_PATH), text.encode(), 0o600)

    def expect(self, op: str) -> None:
        """Start the journal of ``op`` at its first change."""
        self.pending = op

    def _open(self) -> bool:
        if not self.active and self.pending:
            self.on_created(self.begin(self.pending))
        return self.active

    def note_path(self, real: str) -> None:
        """Before ``real`` changes: record what is there (a copy of a file) unless this run recorded it already."""
        if not self._open() or real in self.noted:
            return
        disk = self.disk(real)
        current = _current(disk)
        prior: dict[str, Any] = {"kind": current.kind}
        if current.kind == "symlink":
            prior["target"] = current.target
        elif current.kind == "file":
            assert current.st is not None
            copy = f"{JOURNAL_DIR}/{len(self.steps)}"
            write_file(self.disk(copy), current.data, 0o600)
            prior.update(copy=copy, mode=f"{current.mode:04o}", uid=current.st.st_uid, gid=current.st.st_gid,
                         mtime_ns=current.st.st_mtime_ns)
        self.steps.append({"path": real, "prior": prior})
        self.noted.add(real)
        self._save()

    def note_mkdir(self, real: str) -> None:
        if self._open():
            self.steps.append({"mkdir": real})
            self._save()

    def note_rmdir(self, real: str, st: os.stat_result) -> None:
        if self._open():
            self.steps.append({"rmdir": real, "mode": f"{stat.S_IMODE(st.st_mode):04o}", "uid": st.st_uid,
                               "gid": st.st_gid})
            self._save()

    # undoing

    def _undo(self, entry: dict[str, Any]) -> None:
        if "mkdir" in entry:
            disk = self.disk(entry["mkdir"])
            _clean_temps(disk)
            try:
                os.rmdir(disk)
            except FileNotFoundError:
                pass
            except OSError as err:
                print(f"warning: rollback: kept the directory {disk}/ ({err.strerror})")
            return
        if "rmdir" in entry:
            disk = self.disk(entry["rmdir"])
            if not os.path.isdir(disk):
                os.mkdir(disk)
                os.chmod(disk, int(entry["mode"], 8))
                if os.geteuid() == 0:
                    os.chown(disk, entry["uid"], entry["gid"])
                fsync_dir(os.path.dirname(disk))
            return
        real, prior = entry["path"], entry["prior"]
        disk = self.disk(real)
        directory, name = os.path.split(disk)
        _clean_temps(directory, name)
        current = _current(disk) if os.path.isdir(directory) else Current("missing")
        if prior["kind"] == "missing":
            if current.kind != "missing":
                _unlink(disk)
        elif prior["kind"] == "symlink":
            if current.kind != "symlink" or current.target != prior["target"]:
                _symlink(disk, prior["target"])
        else:
            mode, owner = int(prior["mode"], 8), (prior["uid"], prior["gid"])
            with open(self.disk(prior["copy"]), "rb") as handle:
                data = handle.read()
            same = (current.kind == "file" and current.data == data and current.mode == mode and current.st is not None
                    and (current.st.st_uid, current.st.st_gid) == owner and current.st.st_mtime_ns == prior["mtime_ns"])
            if not same:
                write_file(disk, data, mode, owner, prior["mtime_ns"])


class Installer:
    """Install, uninstall and their dry runs, for one prefix."""

    def __init__(self, prefix: str, dry_run: bool) -> None:
        self.prefix = os.path.abspath(prefix) if prefix else ""
        self.dry_run = dry_run
        self.manifest = Manifest()
        self.planned_dirs: set[str] = set()  # --dry-run: directories that would have been created
        self.journal = Journal(self.disk)

    def disk(self, real: str) -> str:
        return os.path.join(self.prefix, real.lstrip("/")) if self.prefix else real

    def say(self, status: str, real: str, detail: str = "") -> None:
        print(f"{status}: {self.disk(real)}{f' ({detail})' if detail else ''}")

    # the changes, each recorded in the journal first

    def put(self, real: str, data: bytes, mode: int, owner: tuple[int, int] | None = None,
            mtime_ns: int | None = None) -> None:
        self.journal.note_path(real)
        write_file(self.disk(real), data, mode, owner, mtime_ns)

    def put_symlink(self, real: str, target: str) -> None:
        self.journal.note_path(real)
        _symlink(self.disk(real), target)

    def remove(self, real: str) -> None:
        self.journal.note_path(real)
        _unlink(self.disk(real))

    def start(self, op: str) -> None:
        """Roll back an interrupted run, then start this one's journal."""
        if self.dry_run:
            if os.path.exists(self.disk(JOURNAL_PATH)):
                print(f"note: {self.disk(JOURNAL_PATH)}: an interrupted run; the next real run rolls it back first")
            return
        self.journal.recover()

    # directories

    def ensure_dir(self, real: str) -> None:
        """Create ``real`` and its missing parents (mode 0755), recording each one created."""
        parts = real.strip("/").split("/")
        for depth in range(1, len(parts) + 1):
            path = "/" + "/".join(parts[:depth])
            disk = self.disk(path)
            if path in self.planned_dirs:
                continue
            if os.path.lexists(disk):
                if not os.path.isdir(disk):
                    raise HookError(f"{disk} is not a directory: install needs a directory there")
                continue
            if self.dry_run:
                self.planned_dirs.add(path)
                self.manifest.directories.append(path)
                print(f"directory: {disk}/ (new)")
                continue
            if path == STATE_DIR or STATE_DIR.startswith(path + "/"):
                raise HookError(f"{disk}: the state directory is made with the journal")  # never: begin() made it
            self.journal.note_mkdir(path)
            _step()
            try:
                os.mkdir(disk, 0o755)
                os.chmod(disk, 0o755)
            except OSError as err:
                raise HookError(f"cannot create the directory {disk}: {err.strerror}") from None
            self.manifest.directories.append(path)
            fsync_dir(os.path.dirname(disk))
            print(f"directory: {disk}/ (new)")

    def begin(self, op: str) -> None:
        if self.dry_run:
            self.ensure_dir(STATE_DIR)
            return
        self.journal.on_created = self.created_state
        self.journal.expect(op)

    def created_state(self, created: list[str]) -> None:
        for path in created:
            self.manifest.directories.append(path)
            print(f"directory: {self.disk(path)}/ (new)")

    # the manifest

    def manifest_text(self) -> bytes | None:
        """The manifest now on disk, or None."""
        disk = self.disk(MANIFEST_PATH)
        try:
            with open(disk, "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None
        except OSError as err:
            raise HookError(f"cannot read the manifest {disk}: {err.strerror}") from None

    def save(self) -> None:
        """Write the manifest when it changed (it lists itself nowhere; its directory is recorded)."""
        text = self.manifest.text().encode()
        if not self.dry_run and self.manifest_text() != text:
            self.put(MANIFEST_PATH, text, 0o644)

    # backups

    def backup_path(self, real: str) -> str:
        from urllib.parse import quote

        base = f"{BACKUP_DIR}/{quote(real.lstrip('/'), safe='')}"
        candidate, n = base, 0
        while os.path.lexists(self.disk(candidate)):  # one left behind by an uninstall that kept a file
            n += 1
            candidate = f"{base}.{n}"
        return candidate

    def back_up(self, real: str, current: Current) -> dict[str, Any]:
        """Save what is at ``real`` before it is replaced; return the manifest's record of it."""
        assert current.st is not None
        if current.kind == "symlink":
            return {"symlink": current.target}
        backup = self.backup_path(real)
        self.ensure_dir(BACKUP_DIR)
        if not self.dry_run:
            self.put(backup, current.data, 0o600, mtime_ns=current.st.st_mtime_ns)
        return {"path": backup, "sha256": _sha256(current.data), "mode": f"{current.mode:04o}",
                "uid": current.st.st_uid, "gid": current.st.st_gid, "mtime_ns": current.st.st_mtime_ns}

    def restore(self, real: str, backup: dict[str, Any]) -> bool:
        """Put back what install replaced at ``real``; False (and a warning) when its backup is lost."""
        disk = self.disk(real)
        if "symlink" in backup:
            if not self.dry_run:
                self.put_symlink(real, backup["symlink"])
            self.say("restored", real, f"the symlink to {backup['symlink']} that install replaced")
            return True
        saved = self.disk(backup["path"])
        try:
            with open(saved, "rb") as handle:
                data = handle.read()
        except OSError as err:
            print(f"warning: cannot restore {disk}: its backup {saved} is unreadable ({err.strerror})")
            return False
        if not self.dry_run:
            owner = (backup["uid"], backup["gid"]) if "uid" in backup and "gid" in backup else None
            self.put(real, data, _mode(backup["mode"], saved), owner, backup.get("mtime_ns"))
            self.remove(backup["path"])
        self.say("restored", real, f"the file install replaced, from {saved}")
        return True

    # taking one file out

    def take_out(self, entry: dict[str, Any], why: str) -> None:
        """Remove (or restore) one installed file as uninstall does; keep it if it changed since."""
        real = entry["path"]
        disk = self.disk(real)
        backup = entry.get("backup")
        if entry.get("existed"):
            self.say("left", real, "it was there, identical, before install")
            return
        current = _current(disk)
        if current.kind == "file" and _sha256(current.data) == entry["sha256"]:
            if backup and self.restore(real, backup):  # replaces ours atomically: no moment without the file
                return
            if not self.dry_run:
                self.remove(real)
            self.say("removed", real, why)
            return
        if current.kind == "missing":
            self.say("gone", real, "already removed")
            if backup:
                self.restore(real, backup)
            return
        if current.kind == "file" and entry.get("merge") == "docker":
            self.unmerge_docker(entry, current)
            return
        kept = "changed since install: kept, not removed"
        if backup:
            where = backup["symlink"] if "symlink" in backup else self.disk(backup["path"])
            kept += f"; what install replaced is {'a symlink to ' if 'symlink' in backup else 'at '}{where}"
        self.say("kept", real, kept)

    def unmerge_docker(self, entry: dict[str, Any], current: Current) -> None:
        """daemon.json edited since install: take out just our runtime, keep the operator's edits."""
        from oci_gpu_hook.host import docker

        real, disk = entry["path"], self.disk(entry["path"])
        try:
            text = docker.unmerged(current.data.decode(), f"{LAUNCHER_DIR}/oci-gpu-runtime", disk)
        except (HookError, UnicodeDecodeError) as err:
            self.say("kept", real, f"changed since install, and not readable JSON ({err}): remove the "
                                   f"{docker.RUNTIME_NAME} runtime by hand")
            return
        if text is None:
            self.say("kept", real, "changed since install; it no longer has the oci-gpu runtime")
        else:
            if not self.dry_run:
                self.put(real, text.encode(), current.mode)
            self.say("updated", real, f"changed since install: only the {docker.RUNTIME_NAME} runtime taken out")
        backup = entry.get("backup")
        if backup and "path" in backup and not self.dry_run:
            self.remove(backup["path"])  # the operator's file is the current one now

    # install

    def install(self, items: list[Item], notes: list[str], selected: set[str] | None = None,
                errors: list[str] | None = None) -> None:
        """Write ``items``; take out the earlier install's files of the ``selected`` integrations (all: None)
        that are no longer wanted.  An integration with a path install cannot write goes to ``errors`` (raised
        when None) and is skipped, before anything is written."""
        self.start("install")
        before = self.manifest_text()
        old = load_manifest(self.disk(MANIFEST_PATH))
        if old is not None:
            # Every entry stays listed until it is replaced or taken out.
            self.manifest.files = list(old.files)
            self.manifest.directories = [d for d in old.directories if os.path.isdir(self.disk(d))]
        plan = []
        for item in items:  # every refusal before any write
            try:
                plan.append((item, _current(self.disk(item.path))))
            except HookError as err:
                if errors is None or item.integration == "core":
                    raise
                errors.append(f"{item.integration}: {err}")
        failed = {e.split(":", 1)[0] for e in errors or []}
        plan = [(item, current) for item, current in plan if item.integration not in failed]
        if failed:
            selected = (set(selected or INTEGRATIONS) - failed) | {"core"}
        if self.dry_run:
            print("dry run: nothing is written")
        self.begin("install")
        for item, current in plan:
            self.install_one(item, current, old.entry(item.path) if old else None)
        wanted_paths = {item.path for item in items}
        for entry in old.files if old else []:
            if entry["path"] not in wanted_paths and (selected is None
                                                      or entry.get("integration", "core") in selected):
                self.take_out(entry, "no longer installed")
                self.manifest.forget(entry["path"])
                self.save()
        self.save()
        if not self.dry_run:
            self.journal.commit()
        after = self.manifest.text().encode()
        status = "new" if before is None else "unchanged" if before == after else "updated"
        print(f"manifest: {self.disk(MANIFEST_PATH)} ({status})")
        main_config = self.disk("/etc/containerd/config.toml")
        try:
            if self.dry_run or not any(item.path == "/etc/containerd/config.toml" for item in items):
                raise OSError  # the file on disk is not what install would leave
            with open(main_config, encoding="utf-8") as handle:
                if "conf.d" not in handle.read():
                    notes.append(f"{main_config} does not import the drop-in: add "
                                 'imports = ["/etc/containerd/conf.d/*.toml"] to it')
        except (OSError, ValueError):
            pass  # no containerd here (or not a text file: not ours to judge)
        for note in notes:
            print(f"note: {note}")

    def install_one(self, item: Item, current: Current, old: dict[str, Any] | None) -> None:
        entry: dict[str, Any] = {"path": item.path, "sha256": _sha256(item.data), "mode": f"{item.mode:04o}",
                                 "backup": None, "integration": item.integration}
        if item.merge:
            entry["merge"] = item.merge
        as_wanted = current.kind == "file" and current.data == item.data and current.mode == item.mode
        if old is not None:
            entry["backup"] = old.get("backup")
            if old.get("existed"):
                entry["existed"] = True
            ours = current.kind == "file" and (_sha256(current.data) == old["sha256"] or current.data == item.data)
            if as_wanted:
                self.say("unchanged", item.path, item.what)
                if _sha256(current.data) != old["sha256"]:
                    entry = old  # edited since install into what is wanted now: uninstall keeps it too
            elif current.kind == "missing":
                self.write(item, current, "new", f"{item.what}; it had been removed")
            elif ours:
                if entry.pop("existed", False):  # it was the host's own: save it before changing it
                    entry["backup"] = self.back_up(item.path, current)
                self.write(item, current, "updated", item.what)
            else:
                self.say("kept", item.path, f"{item.what}: changed since install; not overwritten "
                                            "(remove it and install again to get the new one)")
                entry = old
        elif as_wanted:
            entry["existed"] = True
            self.say("unchanged", item.path, f"{item.what}; it was already there and will be left by uninstall")
        elif current.kind == "missing":
            self.write(item, current, "new", item.what)
        else:
            backup = entry["backup"] = self.back_up(item.path, current)
            saved = f"saved to {self.disk(backup['path'])}" if "path" in backup else "recorded in the manifest"
            self.write(item, current, "replaced", f"{item.what}; what was there is {saved}")
        self.manifest.record(entry)
        self.save()

    def write(self, item: Item, current: Current, status: str, detail: str) -> None:
        """Write one file (its directory first)."""
        disk = self.disk(item.path)
        self.ensure_dir(os.path.dirname(item.path))
        if not self.dry_run:
            self.put(item.path, item.data, item.mode)
        self.say(status, item.path, f"{detail}; mode {item.mode:04o}")
        if self.dry_run:
            self.show(item, current, disk)

    def show(self, item: Item, current: Current, disk: str) -> None:
        """--dry-run: the content of a new small file, or a diff against what is there."""
        try:
            new = item.data.decode()
        except UnicodeDecodeError:
            print(f"    ({len(item.data)} bytes, sha256 {_sha256(item.data)})")
            return
        if current.kind == "file":
            try:
                old = current.data.decode()
            except UnicodeDecodeError:
                old = None
            if old is not None:
                if current.mode != item.mode:
                    print(f"    mode {current.mode:04o} -> {item.mode:04o}")
                sys.stdout.writelines(difflib.unified_diff(
                    old.splitlines(keepends=True), new.splitlines(keepends=True),
                    fromfile=f"{disk} (now)", tofile=f"{disk} (install)"))
                if old and not old.endswith("\n"):
                    print()
                return
        if current.kind == "symlink":
            print(f"    now a symlink to {current.target}")
        if len(item.data) > SHOW_LIMIT:
            print(f"    ({len(item.data)} bytes, sha256 {_sha256(item.data)})")
        else:
            sys.stdout.writelines(f"    {line}" for line in new.splitlines(keepends=True))

    # uninstall

    def uninstall(self, only: set[str] | None = None) -> None:
        """Take out what the manifest lists (of the ``only`` integrations; the launchers only with all)."""
        manifest_disk = self.disk(MANIFEST_PATH)
        self.start("uninstall")
        old = load_manifest(manifest_disk)
        if old is None:
            print(f"nothing to uninstall: no manifest at {manifest_disk}")
            return
        if self.dry_run:
            print("dry run: nothing is removed")
        self.manifest = Manifest(list(old.files), list(old.directories))
        self.begin("uninstall")
        mine = [e for e in old.files if only is None or e.get("integration", "core") in only]
        for entry in mine:
            self.take_out(entry, "installed")
            self.manifest.forget(entry["path"])
            if self.manifest.files:
                self.save()  # a failure later leaves a manifest of what is still installed
        if self.manifest.files:
            self.journal.commit()
            print(f"manifest: {manifest_disk} (updated: {len(self.manifest.files)} files still installed)")
            return
        if not self.dry_run:
            self.remove(MANIFEST_PATH)
        print(f"removed: {manifest_disk}")
        kept: set[str] = set()
        state = [d for d in old.directories if d == STATE_DIR or STATE_DIR.startswith(d + "/")]
        for real in sorted(set(old.directories) - set(state), key=lambda d: d.count("/"), reverse=True):
            disk = self.disk(real)
            if not os.path.isdir(disk) or os.path.islink(disk):
                continue
            if self.dry_run:
                print(f"directory: {disk}/ (removed if empty)")
                continue
            if os.listdir(disk):
                kept.add(real)
                if not all(f"{real}/{name}" in kept for name in os.listdir(disk)):  # not just a kept child
                    print(f"kept: {disk}/ (created by install, not empty)")
                continue
            self.journal.note_rmdir(real, os.stat(disk))
            _step()
            try:
                os.rmdir(disk)
            except OSError as err:
                if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise HookError(f"cannot remove the directory {disk}: {err.strerror}") from None
                kept.add(real)
                continue
            fsync_dir(os.path.dirname(disk))
            print(f"removed: {disk}/ (created by install)")
        if self.dry_run:
            return
        self.journal.created = state
        self.journal.commit(remove_state=True)
        for real in sorted(state, key=lambda d: d.count("/"), reverse=True):
            if not os.path.isdir(self.disk(real)):
                print(f"removed: {self.disk(real)}/ (created by install)")
            elif real not in kept and not any(k.startswith(real + "/") for k in kept):
                print(f"kept: {self.disk(real)}/ (created by install, not empty)")


def check_podman_hook(real: str, disk: Callable[[str], str], errors: list[str]) -> None:
    """After install: the hook file is in a directory podman reads, and names an executable that is there."""
    from oci_gpu_hook.host import podman

    dirs, source = podman.hooks_dirs(disk)
    try:
        with open(disk(real), "rb") as handle:
            path = json.loads(handle.read())["hook"]["path"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        errors.append(f"podman: the installed hook {disk(real)} cannot be read back ({err})")
        return
    if os.path.dirname(real) not in dirs:
        errors.append(f"podman: {os.path.dirname(real)} is not a hooks directory podman reads ({source}: {dirs})")
    elif not os.access(disk(path), os.X_OK):
        errors.append(f"podman: the hook's path {disk(path)} is not an executable: podman refuses every container")
    else:
        print(f"checked: podman reads {os.path.dirname(disk(real))} ({source}) and runs {disk(path)}")


def parse_only(value: str | None) -> set[str] | None:
    if value is None:
        return None
    names = {n.strip() for n in value.split(",") if n.strip()}
    unknown = names - set(INTEGRATIONS)
    if unknown or not names:
        raise HookError(f"install --only {value!r}: expected a comma list of {', '.join(INTEGRATIONS)}")
    return names


def command(args: list[str], config: Config) -> int:
    from oci_gpu_hook.cliparse import parser as _parser

    parser = _parser("install", "Install the launchers and each integration (podman hook, CDI specs, docker runtime, "
                                "containerd and CRI-O drop-ins, the systemd watch and planner units), recorded in a "
                                "manifest; or take them out again (--uninstall).  A killed run is rolled back by the "
                                "next.")
    parser.add_argument("--only", metavar="LIST", default=None,
                        help=f"only these integrations (comma list of {', '.join(INTEGRATIONS)}); each is done "
                             "even where its /etc directory is missing")
    parser.add_argument("--hook", choices=(*HOOK_STAGES, "none"), default=None,
                        help="the podman hooks.d file to install into the hooks directory podman reads "
                             "(default: precreate)")
    parser.add_argument("--set", action="append", default=[], metavar="OCI_GPU_HOOK_VAR=VALUE",
                        help="bake a default into the launchers, as `oci-gpu-hook launchers --set` does")
    parser.add_argument("--prefix", metavar="DIR", default="",
                        help="put every file under DIR, created if missing (staging, packaging, tests); the paths "
                             "written into files (hook.path, BinaryName, runtime paths) stay the real ones")
    parser.add_argument("--dry-run", action="store_true",
                        help="print what would be written (new, replaced, unchanged; content or diff); write nothing")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--native", dest="native", action="store_true", default=None,
                      help="require the native front: exit 1, writing nothing, when it cannot be built (default: "
                           "the native front when a C compiler is found, and then it must build)")
    kind.add_argument("--no-native", dest="native", action="store_false",
                      help="Python launchers only (each container start then pays a Python start)")
    parser.add_argument("--allow-editable", action="store_true",
                        help="install from an editable (development) install; root would then run code from it")
    parser.add_argument("--docker-default-runtime", action="store_true",
                        help="docker: also make oci-gpu dockerd's default-runtime, so that every docker run (and "
                             "--gpus) goes through the shim; refused when daemon.json names another default-runtime")
    parser.add_argument("--containerd-version", metavar="X.Y", default=None,
                        help="the node's containerd version (default: found under --host-root: the binary "
                             "containerd.service runs, the usual binary paths, dpkg; else the main config's version)")
    parser.add_argument("--host-root", metavar="DIR", default=None,
                        help="where this install sees the node's root file system (read only is enough; /host in a "
                             "pod with the node's / mounted there): install looks there for containerd's binary and "
                             "package (default: the --prefix, else /)")
    parser.add_argument("--uninstall", action="store_true",
                        help=f"remove what the manifest ({MANIFEST_PATH}) lists, restoring the files install "
                             "replaced; files changed since install are kept")
    opts = parser.parse_args(args)
    only = parse_only(opts.only)
    if opts.containerd_version is not None:
        from oci_gpu_hook.host.containerd_detect import explicit

        explicit(opts.containerd_version)  # a bad value stops here, before anything is read or written
    if opts.host_root is not None and not os.path.isdir(opts.host_root):
        raise HookError(f"install --host-root {opts.host_root}: not a directory (the node's / as mounted here)")
    if opts.prefix and not os.path.isdir(opts.prefix):
        if os.path.lexists(opts.prefix):
            raise HookError(f"install --prefix {opts.prefix}: not a directory")
        if not opts.dry_run:
            try:
                os.makedirs(opts.prefix, 0o755)
            except OSError as err:
                raise HookError(f"install --prefix {opts.prefix}: cannot create it ({err.strerror})") from None
    installer = Installer(opts.prefix, opts.dry_run)
    if opts.dry_run:
        return run(opts, only, installer, config)
    import fcntl

    # One run at a time: a second would roll back the first's journal as if it had died.
    lock = os.open(installer.prefix or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting: another install or uninstall is running on {installer.prefix or '/'}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        return run(opts, only, installer, config)
    finally:
        os.close(lock)


def run(opts: Any, only: set[str] | None, installer: Installer, config: Config) -> int:
    """install or uninstall, as parsed by :func:`command`."""
    from oci_gpu_hook.host.launchers import launcher_defaults

    if opts.uninstall:
        given = [flag for flag, value in (("--hook", opts.hook is not None), ("--set", opts.set),
                                          ("--docker-default-runtime", opts.docker_default_runtime),
                                          ("--containerd-version", opts.containerd_version is not None),
                                          ("--host-root", opts.host_root is not None)) if value]
        if given:
            raise HookError(f"install --uninstall takes no {', '.join(given)}: it removes what the manifest lists")
        installer.uninstall(only)
        return 0
    from oci_gpu_hook.host.launchers import editable_reason

    editable = editable_reason()
    if editable and not opts.allow_editable:
        raise HookError(f"install: {editable}")
    notes: list[str] = []
    errors: list[str] = []
    items = wanted(config, opts.hook or "precreate", launcher_defaults(opts.set, "install"), notes, installer.disk,
                   only, errors, native=opts.native, trust=not editable,
                   docker_default_runtime=opts.docker_default_runtime, containerd_version=opts.containerd_version,
                   host_root=os.path.abspath(opts.host_root) if opts.host_root else None)
    failed = {e.split(":", 1)[0] for e in errors}
    selected = None if only is None and not failed else (set(only or INTEGRATIONS) - failed) | {"core"}
    installer.install(items, notes, selected, errors)
    if not opts.dry_run:
        for item in items:
            if item.integration == "podman" and not any(e.startswith("podman:") for e in errors):
                check_podman_hook(item.path, installer.disk, errors)
    for error in errors:
        print(f"skipped: {error}")
    if errors:
        raise HookError("; ".join(errors) + " (the other integrations are installed)")
    return 0
