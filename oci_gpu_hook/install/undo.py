"""Install's undo record (its journal, ``journal.d`` on disk; not the system journal, which :mod:`oci_gpu_hook.log`
writes): each install or uninstall run is one transaction, recorded before each change, so that the next
run rolls a killed one back.

Every change on disk is one step (:func:`step`): a directory made or removed, each temp file created, each
rename, each unlink, the journal's own writes included.  Files are written and removed only through
:mod:`oci_gpu_hook.atomic`, durably, with :func:`step` as its step hook.  ``OCI_GPU_HOOK_INSTALL_KILL_AT=N``
kills the run with SIGKILL just before its Nth step (the crash tests).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from oci_gpu_hook import atomic
from oci_gpu_hook.atomic import fsync_dir
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.install.paths import JOURNAL_DIR, JOURNAL_PATH, STAGING, STATE_DIR

KILL_ENV = "OCI_GPU_HOOK_INSTALL_KILL_AT"
_STEPS = {"done": 0}


def step() -> None:
    """Count one change about to be made; ``OCI_GPU_HOOK_INSTALL_KILL_AT=N`` kills the run just before the Nth
    (the crash tests)."""
    at = os.environ.get(KILL_ENV)
    if at:
        _STEPS["done"] += 1
        if _STEPS["done"] == int(at):
            os.kill(os.getpid(), signal.SIGKILL)


def write_file(path: str, data: bytes, mode: int, owner: tuple[int, int] | None = None,
               mtime_ns: int | None = None) -> None:
    """Replace ``path`` atomically and durably with exactly ``mode``: a step before the name is made (the link of
    the unnamed file, or the named temp file) and, where something is there, one before the rename."""
    atomic.write_atomic(path, data, mode, owner, mtime_ns, durable=True, step=step)


def symlink(path: str, target: str) -> None:
    atomic.symlink_atomic(path, target, step=step)


def unlink(path: str) -> None:
    atomic.remove_file(path, step=step)


@dataclass
class Current:
    """What is at a path now: nothing, a regular file (its bytes and stat), or a symlink."""

    kind: str  # "missing", "file", "symlink"
    data: bytes = b""
    mode: int = 0
    target: str = ""
    st: os.stat_result | None = None


def current_at(disk: str) -> Current:
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
            step()
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
        step()
        try:
            os.makedirs(inside, 0o755)
            self.created = missing
            for real in missing:  # exactly 0755 whatever the umask (the journal's own directory: 0700)
                os.chmod(os.path.join(staging_root, os.path.relpath(self.disk(real), self.disk(top))), 0o755)
            os.chmod(inside, 0o700)
            self._save(os.path.join(inside, os.path.basename(JOURNAL_PATH)))
            step()
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
            step()
            os.rename(self.disk(top), staging)
            fsync_dir(os.path.dirname(staging))
            shutil.rmtree(staging, ignore_errors=True)
            return
        unlink(self.disk(JOURNAL_PATH))
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
            left = [n for n in os.listdir(self.disk(STATE_DIR)) if not atomic.is_temp(n)]
            if left != [os.path.basename(JOURNAL_DIR)]:
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
        current = current_at(disk)
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
            atomic.remove_temps(disk)
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
        atomic.remove_temps(directory, name)
        current = current_at(disk) if os.path.isdir(directory) else Current("missing")
        if prior["kind"] == "missing":
            if current.kind != "missing":
                unlink(disk)
        elif prior["kind"] == "symlink":
            if current.kind != "symlink" or current.target != prior["target"]:
                symlink(disk, prior["target"])
        else:
            mode, owner = int(prior["mode"], 8), (prior["uid"], prior["gid"])
            with open(self.disk(prior["copy"]), "rb") as handle:
                data = handle.read()
            same = (current.kind == "file" and current.data == data and current.mode == mode and current.st is not None
                    and (current.st.st_uid, current.st.st_gid) == owner and current.st.st_mtime_ns == prior["mtime_ns"])
            if not same:
                write_file(disk, data, mode, owner, prior["mtime_ns"])
