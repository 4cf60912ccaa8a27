"""A private mount namespace that looks like a node before install, also on a machine where the README's
"Install on a node" was done: shell lines that take that install back in the namespace's overlays only.

Tests that run ``install`` or the README's node blocks "for real" do so in a namespace whose /etc, /usr/local,
/var, ... are overlays over the machine's own.  Where this machine was installed as a node, the lower layer
holds that install (its manifest, launchers, hook file, the merged daemon.json, the symlink on PATH): install in
the namespace would then keep files as "changed since install", and ``ln -s`` would find the symlink there.
The lines below remove (or put back from its backup) each file the machine's manifest lists, and the
README's venv and symlink, wherever it lies under an overlaid directory: the host itself never changes.
"""

from __future__ import annotations

import json
import shlex

from oci_gpu_hook.install.paths import MANIFEST_PATH, STATE_DIR

# What the README's node install makes besides what install records: the venv and the symlink on PATH.
README_NODE = ("/opt/oci-gpu-hook", "/usr/local/bin/oci-gpu-hook")


def take_back_lines(overlaid: tuple[str, ...], manifest_path: str = MANIFEST_PATH) -> list[str]:
    """Shell lines (for ``sh -e`` inside the namespace) that undo this machine's install under ``overlaid``."""
    def inside(path: str) -> bool:
        return any(path == d or path.startswith(d.rstrip("/") + "/") for d in overlaid)

    lines = [f"rm -rf {shlex.quote(path)}" for path in README_NODE if inside(path)]
    try:
        with open(manifest_path, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except FileNotFoundError:
        return lines
    for entry in manifest.get("files") or []:
        path, backup = entry["path"], entry.get("backup")
        if not inside(path):
            continue
        if backup and inside(backup["path"]):
            lines.append(f"cp -p {shlex.quote(backup['path'])} {shlex.quote(path)}")
        else:
            lines.append(f"rm -f {shlex.quote(path)}")
    for directory in sorted(manifest.get("directories") or [], key=len, reverse=True):
        if isinstance(directory, str) and inside(directory):
            lines.append(f"rmdir {shlex.quote(directory)} 2>/dev/null || true")  # install's, if now empty
    if inside(STATE_DIR):
        lines.append(f"rm -rf {shlex.quote(STATE_DIR)}")
    return lines
