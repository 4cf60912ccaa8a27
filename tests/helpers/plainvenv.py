"""The project as an operator gets it: a fresh copy of this tree (what a clone has), and a plain ``pip install``
of it into a virtual environment of its own (no editable install, no launchers)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def tree_files() -> list[str]:
    """The files a clone has: tracked ones, and new ones git does not ignore (this checkout's edits)."""
    done = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                          capture_output=True, check=True, timeout=60)
    return sorted({name for name in done.stdout.decode().split("\0") if name})


def copy_tree(dest: Path) -> Path:
    """Copy the tree's files (symlinks as symlinks, modes kept) to ``dest``, which must not exist."""
    dest.mkdir(parents=True)
    for name in tree_files():
        source = REPO / name
        if not os.path.lexists(source):
            continue  # deleted in this checkout, not yet committed
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            os.symlink(os.readlink(source), target)
        else:
            shutil.copy2(source, target)
    return dest


def base_python() -> str:
    """The interpreter this test suite's venv was made from (``python3 -m venv`` of it)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def pip_install(venv: Path, source: Path, timeout: int = 600) -> Path:
    """``python3 -m venv VENV && VENV/bin/pip install SOURCE``; returns VENV/bin."""
    subprocess.run([base_python(), "-m", "venv", str(venv)], check=True, capture_output=True, timeout=timeout)
    done = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-cache-dir", str(source)],
                          capture_output=True, text=True, timeout=timeout, cwd=source)
    assert done.returncode == 0, done.stdout + done.stderr
    return venv / "bin"
