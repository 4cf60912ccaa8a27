"""The installer: install, uninstall and their dry runs, for one prefix (:mod:`run` is one run around it).

Why so careful: install edits files the operator owns too (daemon.json, containerd's config) on a node whose
containers keep running.  A clobbered edit, or a launcher taken out while a runtime's config still names it,
would break containers that never asked for a GPU; so every change can be undone, and nothing is removed from
under a file that names it.

A file that was already there with other content (or a symlink) is first saved under
:data:`~oci_gpu_hook.install.paths.BACKUP_DIR`, and put back by uninstall; one already exactly as
wanted is adopted and left in place by uninstall.  Running install again is idempotent; a file install
wrote that has been edited since is never overwritten.  Each change is recorded in the journal first
(:mod:`undo`), and the manifest (:mod:`manifest`) says what is installed.

**Uninstall is whole or says why not.**  Each file the manifest lists is removed (or the file it replaced put
back) when it is as install wrote it, or gone.  One changed since install is never removed or overwritten:

- daemon.json and the containerd main config: just what install put in is taken out (our runtime; the
  ``imports`` line install added, back to what it was), the operator's edits stay;
- a file that then names nothing uninstall would take out is the operator's: kept, out of the manifest, its
  backup deleted (that file is the operator's now);
- a file that still names something uninstall would take out (:func:`nameable`: a launcher, or the containerd
  drop-in, by path or by its directory's glob) is **left**, and so is, transitively, all it names, as installed:
  no file is left naming something removed.  Each such file is one ``left:`` line (what, why, what to do),
  stays in the manifest with its backup, and uninstall exits 1: the node is still integrated.  Once the
  operator reverts the edit, takes out what names this install, or moves the file away, the next uninstall
  finishes the job (and a later install still sees the manifest and backups).
"""

from __future__ import annotations

import difflib
import errno
import os
import re
import sys
from typing import Any

from oci_gpu_hook.atomic import fsync_dir
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.install import undo
from oci_gpu_hook.install.items import CONTAINERD_UNCHANGED, RESTART_CONTAINERD, Item
from oci_gpu_hook.install.manifest import Manifest, load_manifest, mode_of, sha256
from oci_gpu_hook.install.paths import (
    BACKUP_DIR,
    HOOK_LAUNCHER,
    INTEGRATIONS,
    JOURNAL_PATH,
    LAUNCHER_DIR,
    MANIFEST_PATH,
    RUNTIME_LAUNCHER,
    STATE_DIR,
)
from oci_gpu_hook.install.undo import Current, Journal, current_at

SHOW_LIMIT = 4096  # --dry-run prints the content of new files up to this size, a diff for replaced ones


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
        undo.write_file(self.disk(real), data, mode, owner, mtime_ns)

    def put_symlink(self, real: str, target: str) -> None:
        self.journal.note_path(real)
        undo.symlink(self.disk(real), target)

    def remove(self, real: str) -> None:
        self.journal.note_path(real)
        undo.unlink(self.disk(real))

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
            undo.step()
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
        return {"path": backup, "sha256": sha256(current.data), "mode": f"{current.mode:04o}",
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
            self.put(real, data, mode_of(backup["mode"], saved), owner, backup.get("mtime_ns"))
            self.remove(backup["path"])
        self.say("restored", real, f"the file install replaced, from {saved}")
        return True

    # taking one file out

    def take_out(self, entry: dict[str, Any], why: str) -> None:
        """Remove (or restore) one installed file as uninstall does; one changed since loses only what install put
        in it (:meth:`without_install_part`) and is then the operator's (what must stay listed, :meth:`left_in_place`
        decides first)."""
        real = entry["path"]
        disk = self.disk(real)
        backup = entry.get("backup")
        if entry.get("existed"):
            self.say("left", real, "it was there, identical, before install")
            return
        current = current_at(disk)
        if current.kind == "file" and sha256(current.data) == entry["sha256"]:
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
        rest = self.without_install_part(entry, current) if current.kind == "file" else None
        if rest is not None and rest != current.data:
            if not self.dry_run:
                assert current.st is not None
                self.put(real, rest, current.mode, (current.st.st_uid, current.st.st_gid))  # the operator's owner
            self.say("updated", real, f"changed since install: only {self.install_part_name(entry)} taken out")
        elif rest is not None and entry.get("merge") == "docker":
            self.say("kept", real, f"changed since install; it no longer has {self.install_part_name(entry)}")
        else:  # changed since install, and naming nothing this uninstall removes (left_in_place): the operator's
            self.say("kept", real, "changed since install, and names nothing of this install: kept as yours")
        if backup and "path" in backup and not self.dry_run and os.path.lexists(self.disk(backup["path"])):
            self.remove(backup["path"])  # the operator's file is the current one now
            print(f"removed: {self.disk(backup['path'])} (what install replaced at {disk}: that file is yours now)")

    @staticmethod
    def install_part_name(entry: dict[str, Any]) -> str:
        """What install put into a merged file (daemon.json, the containerd main config), in words."""
        return "the oci-gpu runtime" if entry.get("merge") == "docker" else "the imports line install added"

    def without_install_part(self, entry: dict[str, Any], current: Current) -> bytes | None:
        """A file changed since install with just what install put in it taken out: daemon.json without our
        runtime (as it is when it has none), the containerd main config without the ``imports`` line install
        added; None for any other file, or when that part cannot be found."""
        from oci_gpu_hook.install import containerd, docker

        disk = self.disk(entry["path"])
        try:
            text = current.data.decode()
            if entry.get("merge") == "docker":
                rest = docker.unmerged(text, RUNTIME_LAUNCHER, disk)
                return current.data if rest is None else rest.encode()
            if entry["path"] == containerd.MAIN_CONFIG_PATH:
                backup = entry.get("backup") or {}
                original = None
                if "path" in backup:
                    with open(self.disk(backup["path"]), encoding="utf-8") as handle:
                        original = handle.read()
                rest = containerd.without_import(text, original)
                return None if rest is None else rest.encode()
        except (HookError, OSError, UnicodeDecodeError):
            return None
        return None

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
                plan.append((item, current_at(self.disk(item.path))))
            except HookError as err:
                if errors is None or item.integration == "core":
                    raise
                errors.append(f"{item.integration}: {err}")
        failed = {e.split(":", 1)[0] for e in errors or []}
        plan = [(item, current) for item, current in plan if item.integration not in failed]
        containerd_plan = [as_wanted(item, current) for item, current in plan if item.integration == "containerd"]
        if containerd_plan and all(containerd_plan) and RESTART_CONTAINERD in notes:
            # an upgrade's or a pod restart's install writes nothing of containerd's: no restart is asked for
            notes[notes.index(RESTART_CONTAINERD)] = CONTAINERD_UNCHANGED
        if failed:
            selected = (set(selected or INTEGRATIONS) - failed) | {"core"}
        if self.dry_run:
            print("dry run: nothing is written")
        self.begin("install")
        for item, current in plan:
            self.install_one(item, current, old.entry(item.path) if old else None)
        wanted_paths = {item.path for item in items}
        dropped = [entry for entry in old.files if entry["path"] not in wanted_paths and (
            selected is None or entry.get("integration", "core") in selected)] if old else []
        left = self.left_in_place(dropped, self.manifest.files) if dropped else {}
        for entry in dropped:
            if entry["path"] in left:  # an uninstall must find it, or it would take out what it names
                self.say("kept", entry["path"], f"no longer installed, but {left[entry['path']]}: still listed "
                                                "for install --uninstall")
                continue
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
        entry: dict[str, Any] = {"path": item.path, "sha256": sha256(item.data), "mode": f"{item.mode:04o}",
                                 "backup": None, "integration": item.integration}
        if item.merge:
            entry["merge"] = item.merge
        wanted_there = as_wanted(item, current)
        if old is not None:
            entry["backup"] = old.get("backup")
            if old.get("existed"):
                entry["existed"] = True
            ours = current.kind == "file" and (sha256(current.data) == old["sha256"] or current.data == item.data)
            if wanted_there:
                self.say("unchanged", item.path, item.what)
                if sha256(current.data) != old["sha256"]:
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
        elif wanted_there:
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
            print(f"    ({len(item.data)} bytes, sha256 {sha256(item.data)})")
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
            print(f"    ({len(item.data)} bytes, sha256 {sha256(item.data)})")
        else:
            sys.stdout.writelines(f"    {line}" for line in new.splitlines(keepends=True))

    # uninstall

    def after_uninstall(self, entry: dict[str, Any]) -> bytes | None:
        """What uninstall would leave at ``entry``'s path when it is changed since install
        (:meth:`without_install_part`); None when it is as installed, gone, or left anyway (it was there before
        install)."""
        if entry.get("existed"):
            return None
        current = current_at(self.disk(entry["path"]))
        if current.kind != "file":
            return None  # gone, or a symlink: nothing of ours is read through it
        if sha256(current.data) == entry["sha256"]:
            return None
        rest = self.without_install_part(entry, current)
        return current.data if rest is None else rest

    def left_in_place(self, mine: list[dict[str, Any]], every: list[dict[str, Any]]) -> dict[str, str]:
        """The entries (of ``every``, the manifest's) that taking out ``mine`` must leave exactly as they are, and
        why: each file of ``mine`` changed since install that still names something an uninstall would take out
        (:func:`named_in`; ``--only``: also what a later one would), and, transitively, everything such a file
        names (and the hook launcher where the runtime launcher stays: its GPU containers run it as hook_path)."""
        removable = [e for e in every if not e.get("existed") and nameable(e["path"])]
        left: dict[str, str] = {}
        todo: list[tuple[str, bytes]] = []
        for entry in mine:
            data = self.after_uninstall(entry)
            if data is None:
                continue
            named = [e["path"] for e in removable if e["path"] != entry["path"] and named_in(e["path"], data)]
            if named:
                left[entry["path"]] = f"changed since install, and it names {', '.join(named)}"
                todo.append((entry["path"], data))
        while todo:
            by, data = todo.pop()
            for entry in removable:
                real = entry["path"]
                needed = by == RUNTIME_LAUNCHER and real == HOOK_LAUNCHER
                if real in left or real == by or not (needed or named_in(real, data)):
                    continue
                current = current_at(self.disk(real))
                if current.kind != "file":
                    continue  # gone already: nothing to keep
                # the shim runs the hook launcher in every GPU container (the by-path links hook: hook_path's
                # default), although the runtime launcher's text does not name it
                if needed and not named_in(real, data):
                    left[real] = f"needed by {self.disk(by)} (the by-path links hook of GPU containers), which is left"
                else:
                    left[real] = f"named by {self.disk(by)}, which is left"
                todo.append((real, current.data))
        return left

    def print_left_line(self, entry: dict[str, Any], why: str) -> str:
        """The line for a file uninstall leaves: what, why, what to do."""
        real = entry["path"]
        if why.startswith(("named by", "needed by")):
            todo = "removed by the next install --uninstall once nothing left names it"
        else:
            todo = ("revert your edit, take out what names this install, or move the file away; then run "
                    "install --uninstall again")
        backup = entry.get("backup")
        if backup and "path" in backup:
            todo += f" (what install replaced is saved at {self.disk(backup['path'])})"
        line = f"left: {self.disk(real)} ({why}: {todo})"
        print(line)
        return line

    def uninstall(self, only: set[str] | None = None) -> list[str]:
        """Take out what the manifest lists (of the ``only`` integrations; the launchers only with all); the
        ``left:`` lines of the files it had to leave (:meth:`left_in_place`), which stay in the manifest."""
        manifest_disk = self.disk(MANIFEST_PATH)
        self.start("uninstall")
        old = load_manifest(manifest_disk)
        if old is None:
            print(f"nothing to uninstall: no manifest at {manifest_disk}")
            return []
        if self.dry_run:
            print("dry run: nothing is removed")
        self.manifest = Manifest(list(old.files), list(old.directories))
        self.begin("uninstall")
        mine = [e for e in old.files if only is None or e.get("integration", "core") in only]
        left = self.left_in_place(mine, old.files)
        lines = []
        for entry in mine:
            if entry["path"] in left:
                lines.append(self.print_left_line(entry, left[entry["path"]]))
                continue  # stays in the manifest, with its backup
            self.take_out(entry, "installed")
            self.manifest.forget(entry["path"])
            if self.manifest.files:
                self.save()  # a failure later leaves a manifest of what is still installed
        if self.manifest.files:
            if not self.dry_run:
                self.journal.commit()
            print(f"manifest: {manifest_disk} (updated: {len(self.manifest.files)} files still installed)")
            return lines
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
            undo.step()
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
            return []
        self.journal.created = state
        self.journal.commit(remove_state=True)
        for real in sorted(state, key=lambda d: d.count("/"), reverse=True):
            if not os.path.isdir(self.disk(real)):
                print(f"removed: {self.disk(real)}/ (created by install)")
            elif real not in kept and not any(k.startswith(real + "/") for k in kept):
                print(f"kept: {self.disk(real)}/ (created by install, not empty)")
        return []


def as_wanted(item: Item, current: Current) -> bool:
    """What is at the item's path is already the file install wants there (bytes and mode)."""
    return current.kind == "file" and current.data == item.data and current.mode == item.mode


def nameable(real: str) -> bool:
    """What a file install wrote can name, so that uninstall must not take it out from under that file: the
    launchers, and the containerd drop-in (the main config's ``imports`` load it)."""
    from oci_gpu_hook.install import containerd

    return real.startswith(LAUNCHER_DIR + "/") or real == containerd.DROP_IN_PATH


def named_in(real: str, data: bytes) -> bool:
    """``data`` names the path ``real`` (as a whole path, not the start of a longer name); the containerd drop-in
    also by the glob of its directory."""
    from oci_gpu_hook.install import containerd

    spellings = [real] + ([f"{containerd.DROP_IN_DIR}/*.toml"] if real == containerd.DROP_IN_PATH else [])
    return any(re.search(re.escape(s.encode()) + rb"(?![\w.-])", data) for s in spellings)
