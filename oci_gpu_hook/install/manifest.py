"""The install manifest: each file install wrote (its sha256 and mode, its integration, what was there before)
and each directory it created; read back strictly, a bad entry is one line naming it."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

from oci_gpu_hook.errors import HookError

MANIFEST_FORMAT = 1


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
    mode_of(entry.get("mode"), f"{where}: {entry['path']}")
    backup = entry.get("backup")
    if backup is not None:
        if not isinstance(backup, dict):
            raise HookError(f"{where}: {entry['path']}: bad backup {backup!r}")
        if "symlink" in backup:
            if not isinstance(backup["symlink"], str):
                raise HookError(f"{where}: {entry['path']}: bad backup symlink {backup['symlink']!r}")
        else:
            _real_path(backup.get("path"), f"{where}: {entry['path']}: backup")
            mode_of(backup.get("mode"), f"{where}: {entry['path']}: backup")
            for key in ("uid", "gid", "mtime_ns"):
                if key in backup and (not isinstance(backup[key], int) or isinstance(backup[key], bool)
                                      or backup[key] < 0):
                    raise HookError(f"{where}: {entry['path']}: bad backup {key} {backup[key]!r}")
    return entry


def mode_of(value: Any, where: str) -> int:
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
