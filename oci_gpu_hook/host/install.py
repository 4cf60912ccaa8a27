"""``oci-gpu-hook install``: put everything a host needs in place, record it, and take it back out.

What it writes (real paths; ``--prefix DIR`` puts each of them under DIR):

- the lean launchers ``oci-gpu-hook`` and ``oci-gpu-runtime`` in :data:`LAUNCHER_DIR` (mode 0755);
- the podman hooks.d file of the chosen stage (``--hook precreate|prestart|none``) in
  :data:`HOOKS_DIR`, the shipped ``hooks.d/`` template with ``hook.path`` set to the installed
  launcher;
- the CDI spec of each kind with devices in ``cdi_dir`` (``<vendor>-<class>.json``; none for a kind
  without devices);
- on a host with /etc/containerd: the containerd drop-in at :data:`containerd.DROP_IN_PATH`
  (``BinaryName`` the installed ``oci-gpu-runtime``; built from the node's main config, see
  :mod:`containerd`) and the main config with the ``imports`` line that loads it (the original is
  saved and put back by ``--uninstall``);
- the manifest :data:`MANIFEST_PATH`: each file written (its sha256 and mode, and what was there
  before), and each directory created.

Everything but the launchers is mode 0644; every file is written atomically (temp file, fsync,
rename).  A file that was already there with other content (or a symlink) is first saved under
:data:`BACKUP_DIR`, and put back by ``--uninstall``; one that was already there with exactly the
content and mode install wants is adopted and left in place by ``--uninstall``.

``--prefix`` changes where files land, never what they say: ``hook.path``, ``BinaryName`` and the
paths in the manifest stay the real absolute paths, so a tree staged with ``--prefix`` (a package
build) works once copied to ``/``, and ``--uninstall --prefix DIR`` reads the same manifest.

Running install again is idempotent: a file already as wanted is not rewritten, the manifest is
rewritten only when it changes.  A file install wrote that has been edited since is neither
overwritten (install) nor removed (uninstall): it is kept and reported.  A file that an earlier
install wrote and this one no longer wants (another ``--hook`` stage, a host that lost its GPUs)
is removed as ``--uninstall`` would.
"""

from __future__ import annotations

import difflib
import errno
import hashlib
import json
import os
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from oci_gpu_hook.atomic import fsync_dir, symlink_atomic, write_atomic
from oci_gpu_hook.config import Config
from oci_gpu_hook.errors import HookError

LAUNCHER_DIR = "/usr/local/libexec/oci-gpu-hook"
HOOKS_DIR = "/etc/containers/oci/hooks.d"
HOOK_STAGES = ("precreate", "prestart")
STATE_DIR = "/var/lib/oci-gpu-hook"
MANIFEST_PATH = f"{STATE_DIR}/install.json"
BACKUP_DIR = f"{STATE_DIR}/backup"
MANIFEST_FORMAT = 1
SHOW_LIMIT = 4096  # --dry-run prints the content of new files up to this size, a diff for replaced ones

# The shipped hooks.d/oci-gpu-hook-<stage>.json, for installs without the source tree (a wheel does
# not carry hooks.d/); a test keeps the two identical.
HOOK_TEMPLATE: dict[str, Any] = {
    "version": "1.0.0",
    "hook": {
        "path": "/usr/local/bin/oci-gpu-hook",
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
    """One file install wants: its real path, content and mode."""

    path: str
    data: bytes
    mode: int
    what: str


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


def wanted(config: Config, hook: str, defaults: dict[str, str], notes: list[str],
           disk: Callable[[str], str]) -> list[Item]:
    """Every file this install writes, in the order it writes them."""
    from oci_gpu_hook.appliers import cdi
    from oci_gpu_hook.host.launchers import LAUNCHERS, launcher_text
    from oci_gpu_hook.inventory import scan

    items = [Item(f"{LAUNCHER_DIR}/{name}", launcher_text(module, defaults).encode(), 0o755, "launcher")
             for name, module in LAUNCHERS]
    hook_launcher = f"{LAUNCHER_DIR}/oci-gpu-hook"
    if hook != "none":
        items.append(Item(f"{HOOKS_DIR}/oci-gpu-hook-{hook}.json", hook_file(hook, hook_launcher).encode(), 0o644,
                          f"podman {hook} hook"))
    inventory = scan(config.sysfs_root, config.backends, strict=False)
    if not os.path.isabs(config.cdi_dir):
        raise HookError(f"cdi_dir {config.cdi_dir!r} is not an absolute path")
    if config.hook_path != hook_launcher:
        notes.append(f"hook_path is {config.hook_path}, not the launcher installed here ({hook_launcher}): "
                     "the CDI specs and rewritten specs name hook_path")
    for kind in config.backends:
        path = os.path.normpath(config.cdi_spec_path(kind))
        if inventory.devices(kind):
            spec = cdi.generate(inventory, kind, config)
            cdi.validate(spec, f"generated CDI spec of {kind}")
            items.append(Item(path, cdi.render(spec, "json").encode(), 0o644, f"CDI spec ({kind})"))
        else:
            notes.append(f"no {kind} GPUs under {inventory.sysfs_root}: the CDI spec {path} is not written")
    items.extend(containerd_items(disk, notes))
    return items


def containerd_items(disk: Callable[[str], str], notes: list[str]) -> list[Item]:
    """The drop-in (built from the node's main config, see :mod:`containerd`) and the main config with
    the ``imports`` line it needs; nothing on a host without /etc/containerd."""
    import tomllib

    from oci_gpu_hook.host import containerd

    if not os.path.isdir(disk(os.path.dirname(containerd.MAIN_CONFIG_PATH))):
        notes.append(f"no {os.path.dirname(containerd.MAIN_CONFIG_PATH)} here: containerd is not configured")
        return []
    main_disk = disk(containerd.MAIN_CONFIG_PATH)
    try:
        with open(main_disk, encoding="utf-8") as handle:
            text: str | None = handle.read()
        mode = stat.S_IMODE(os.stat(main_disk).st_mode)
    except FileNotFoundError:
        text, mode = None, 0o644
    except OSError as err:
        raise HookError(f"cannot read {main_disk}: {err.strerror}") from None
    try:
        main = tomllib.loads(text) if text is not None else None
    except tomllib.TOMLDecodeError as err:
        raise HookError(f"{main_disk} is not valid TOML ({err})") from None
    items = [Item(containerd.DROP_IN_PATH,
                  containerd.drop_in(f"{LAUNCHER_DIR}/oci-gpu-runtime", main).encode(), 0o644, "containerd drop-in")]
    if text is None:
        imports = f'version = 2\nimports = ["{containerd.DROP_IN_DIR}/*.toml"]\n'
    else:  # as it is when it imports the drop-in already: still wanted, so a re-run keeps it
        imports = containerd.with_import(text, main_disk) or text
    items.append(Item(containerd.MAIN_CONFIG_PATH, imports.encode(), mode, "containerd config (imports)"))
    notes.append("restart containerd to load its new configuration")
    return items


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


# --- the file system, under the prefix -----------------------------------------------------------


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_file(path: str, data: bytes, mode: int, owner: tuple[int, int] | None = None,
               mtime_ns: int | None = None) -> None:
    """Replace ``path`` atomically and durably with exactly ``mode``."""
    write_atomic(path, data, mode, owner, mtime_ns, durable=True)


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


class Installer:
    """Install, uninstall and their dry runs, for one prefix."""

    def __init__(self, prefix: str, dry_run: bool) -> None:
        self.prefix = os.path.abspath(prefix) if prefix else ""
        self.dry_run = dry_run
        self.manifest = Manifest()
        self.planned_dirs: set[str] = set()  # --dry-run: directories that would have been created

    def disk(self, real: str) -> str:
        return os.path.join(self.prefix, real.lstrip("/")) if self.prefix else real

    def say(self, status: str, real: str, detail: str = "") -> None:
        print(f"{status}: {self.disk(real)}{f' ({detail})' if detail else ''}")

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
            try:
                os.mkdir(disk, 0o755)
                os.chmod(disk, 0o755)
            except OSError as err:
                raise HookError(f"cannot create the directory {disk}: {err.strerror}") from None
            self.manifest.directories.append(path)
            fsync_dir(os.path.dirname(disk))
            print(f"directory: {disk}/ (new)")

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
        self.ensure_dir(STATE_DIR)
        text = self.manifest.text().encode()
        if not self.dry_run and self.manifest_text() != text:
            write_file(self.disk(MANIFEST_PATH), text, 0o644)

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
            write_file(self.disk(backup), current.data, 0o600, mtime_ns=current.st.st_mtime_ns)
        return {"path": backup, "sha256": _sha256(current.data), "mode": f"{current.mode:04o}",
                "uid": current.st.st_uid, "gid": current.st.st_gid, "mtime_ns": current.st.st_mtime_ns}

    def restore(self, real: str, backup: dict[str, Any]) -> bool:
        """Put back what install replaced at ``real``; False (and a warning) when its backup is lost."""
        disk = self.disk(real)
        if "symlink" in backup:
            if not self.dry_run:
                symlink_atomic(disk, backup["symlink"])
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
            write_file(disk, data, _mode(backup["mode"], saved), owner, backup.get("mtime_ns"))
            try:
                os.unlink(saved)
            except OSError as err:
                raise HookError(f"cannot remove the backup {saved}: {err.strerror}") from None
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
                try:
                    os.unlink(disk)
                except OSError as err:
                    raise HookError(f"cannot remove {disk}: {err.strerror}") from None
            self.say("removed", real, why)
            return
        if current.kind == "missing":
            self.say("gone", real, "already removed")
            if backup:
                self.restore(real, backup)
            return
        kept = "changed since install: kept, not removed"
        if backup:
            where = backup["symlink"] if "symlink" in backup else self.disk(backup["path"])
            kept += f"; what install replaced is {'a symlink to ' if 'symlink' in backup else 'at '}{where}"
        self.say("kept", real, kept)

    # install

    def install(self, items: list[Item], notes: list[str]) -> None:
        before = self.manifest_text()
        old = load_manifest(self.disk(MANIFEST_PATH))
        if old is not None:
            # Every entry stays listed until it is replaced or taken out: a failure half-way leaves a
            # manifest of everything on disk that install wrote.
            self.manifest.files = list(old.files)
            self.manifest.directories = [d for d in old.directories if os.path.isdir(self.disk(d))]
        plan = [(item, _current(self.disk(item.path))) for item in items]  # every refusal before any write
        if self.dry_run:
            print("dry run: nothing is written")
        try:
            self.ensure_dir(STATE_DIR)
            for item, current in plan:
                self.install_one(item, current, old.entry(item.path) if old else None)
            wanted_paths = {item.path for item in items}
            for entry in old.files if old else []:
                if entry["path"] not in wanted_paths:
                    self.take_out(entry, "no longer installed")
                    self.manifest.forget(entry["path"])
                    self.save()
        except HookError:
            try:
                self.save()  # record the directories made before the failure, for --uninstall
            except HookError:
                pass
            raise
        self.save()
        after = self.manifest.text().encode()
        status = "new" if before is None else "unchanged" if before == after else "updated"
        print(f"manifest: {self.disk(MANIFEST_PATH)} ({status})")
        main_config = self.disk("/etc/containerd/config.toml")
        try:
            if self.dry_run:
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
                                 "backup": None}
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
                fresh = None
                if entry.pop("existed", False):  # it was the host's own: save it before changing it
                    fresh = entry["backup"] = self.back_up(item.path, current)
                self.write(item, current, "updated", item.what, fresh)
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
            self.write(item, current, "replaced", f"{item.what}; what was there is {saved}", backup)
        self.manifest.record(entry)
        self.save()

    def write(self, item: Item, current: Current, status: str, detail: str,
              backup: dict[str, Any] | None = None) -> None:
        """Write one file; if that fails, drop the backup just made of it (the file is still intact)."""
        disk = self.disk(item.path)
        if not self.dry_run:
            try:
                self.ensure_dir(os.path.dirname(item.path))
                write_file(disk, item.data, item.mode)
            except HookError:
                if backup and "path" in backup:
                    try:
                        os.unlink(self.disk(backup["path"]))
                    except OSError:
                        pass
                raise
        else:
            self.ensure_dir(os.path.dirname(item.path))
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

    def uninstall(self) -> None:
        manifest_disk = self.disk(MANIFEST_PATH)
        old = load_manifest(manifest_disk)
        if old is None:
            print(f"nothing to uninstall: no manifest at {manifest_disk}")
            return
        if self.dry_run:
            print("dry run: nothing is removed")
        self.manifest = old
        while self.manifest.files:
            entry = self.manifest.files[0]
            self.take_out(entry, "installed")
            self.manifest.files.pop(0)
            if self.manifest.files:
                self.save()  # a failure later leaves a manifest of what is still installed
        if not self.dry_run:
            try:
                os.unlink(manifest_disk)
            except OSError as err:
                raise HookError(f"cannot remove the manifest {manifest_disk}: {err.strerror}") from None
        print(f"removed: {manifest_disk}")
        kept: set[str] = set()
        for real in sorted(old.directories, key=lambda d: d.count("/"), reverse=True):
            disk = self.disk(real)
            if not os.path.isdir(disk) or os.path.islink(disk):
                continue
            if self.dry_run:
                print(f"directory: {disk}/ (removed if empty)")
                continue
            try:
                os.rmdir(disk)
            except OSError as err:
                if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise HookError(f"cannot remove the directory {disk}: {err.strerror}") from None
                kept.add(real)
                if not all(f"{real}/{name}" in kept for name in os.listdir(disk)):  # not just a kept child
                    print(f"kept: {disk}/ (created by install, not empty)")
                continue
            print(f"removed: {disk}/ (created by install)")


def command(args: list[str], config: Config) -> int:
    from oci_gpu_hook.cliparse import parser as _parser
    from oci_gpu_hook.host.launchers import launcher_defaults

    parser = _parser("install", "Install the launchers, a podman hooks.d file, the CDI spec and the containerd "
                                "drop-in, recorded in a manifest; or take them out again (--uninstall).")
    parser.add_argument("--hook", choices=(*HOOK_STAGES, "none"), default=None,
                        help=f"the podman hooks.d file to install into {HOOKS_DIR} (default: precreate)")
    parser.add_argument("--set", action="append", default=[], metavar="OCI_GPU_HOOK_VAR=VALUE",
                        help="bake a default into the launchers, as `oci-gpu-hook launchers --set` does")
    parser.add_argument("--prefix", metavar="DIR", default="",
                        help="put every file under DIR (staging, packaging, tests); the paths written into "
                             "files (hook.path, BinaryName) stay the real ones")
    parser.add_argument("--dry-run", action="store_true",
                        help="print what would be written (new, replaced, unchanged; content or diff); write nothing")
    parser.add_argument("--uninstall", action="store_true",
                        help=f"remove what the manifest ({MANIFEST_PATH}) lists, restoring the files install "
                             "replaced; files changed since install are kept")
    opts = parser.parse_args(args)
    if opts.prefix and not os.path.isdir(opts.prefix):
        raise HookError(f"install --prefix {opts.prefix}: no such directory")
    installer = Installer(opts.prefix, opts.dry_run)
    if opts.uninstall:
        if opts.hook is not None or opts.set:
            raise HookError("install --uninstall takes no --hook or --set: it removes what the manifest lists")
        installer.uninstall()
        return 0
    notes: list[str] = []
    items = wanted(config, opts.hook or "precreate", launcher_defaults(opts.set, "install"), notes, installer.disk)
    installer.install(items, notes)
    return 0
