"""The wheel as an operator gets it: built from a clean copy of this checkout, installed into a venv of its own,
and a private root (a mount namespace) for ``install`` to write its real paths into.

``built_wheel()`` builds once per test session (``pip wheel`` of the files a clone has, copied by
tests/helpers/plainvenv.py, so that nothing stale of an earlier build/ or egg-info gets in).  ``make_venv`` is the
README's production route (``python3 -m venv DIR && DIR/bin/pip install ...``) with the wheel; its dependencies
come from the index this test environment was installed from, pinned to the versions installed here (pip's
cache makes that fast).
``PrivateRoot`` holds a mount namespace open whose /etc, /usr/local, /usr/share/containers and /var/lib (or the
directories a caller names) are overlays with their upper layers in a temporary directory (or in the namespace's
memory): what ``install`` writes there is at the paths
podman, dockerd and containerd read by default, and the host never changes.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

from tests.helpers import plainvenv, pristinenode

REPO = plainvenv.REPO
OVERLAID = ("/etc", "/usr/local", "/usr/share/containers", "/var/lib")


@cache
def built_wheel() -> Path:
    """The wheel of this checkout (built once per session; removed at exit)."""
    work = Path(tempfile.mkdtemp(prefix="ogh-wheel-"))
    atexit.register(shutil.rmtree, work, True)
    source = plainvenv.copy_tree(work / "src")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "--disable-pip-version-check", "-q", "-w", str(work / "dist"), str(source)],
                          capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise AssertionError(f"pip wheel failed:\n{done.stdout}\n{done.stderr}")
    wheels = list((work / "dist").glob("oci_gpu_hook-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def make_venv(directory: Path, wheel: Path, enter: list[str] | None = None, python: str | None = None) -> Path:
    """``python3 -m venv DIRECTORY`` and ``pip install WHEEL`` into it; its python.  ``enter``: a prefix that runs
    both where the venv belongs (``PrivateRoot.enter([])``: a venv at its real path in a private root); ``python``:
    the interpreter to make it with (the one this suite's venv was made from unless given)."""
    enter = enter or []
    subprocess.run([*enter, python or plainvenv.base_python(), "-m", "venv", str(directory)], check=True,
                   capture_output=True, timeout=300)
    frozen = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True,
                            text=True, check=True, timeout=120).stdout
    with tempfile.TemporaryDirectory(prefix="ogh-constraints-") as scratch:  # never written into ``directory`` here
        constraints = Path(scratch) / "constraints.txt"
        constraints.write_text("".join(line + "\n" for line in frozen.splitlines() if "==" in line))
        done = subprocess.run([*enter, str(directory / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                               "-c", str(constraints), str(wheel)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise AssertionError(f"pip install {wheel.name} failed:\n{done.stdout}\n{done.stderr}")
    return directory / "bin" / "python"


class PrivateRoot:
    """A mount namespace held open by a shell that waits on its stdin; ``enter(argv)`` runs argv inside it."""

    def __init__(self, base: Path, overlaid: tuple[str, ...] = OVERLAID, *, in_memory: bool = False,
                 setup: tuple[str, ...] = ()) -> None:
        """``overlaid``: the directories given an overlay; ``in_memory``: their upper layers on a tmpfs of the
        namespace's own (gone with it; :meth:`path` cannot reach them then); ``setup``: shell lines run last."""
        self.base = base
        self.overlaid = overlaid
        self.in_memory = in_memory
        self.setup = setup
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        lines = ["set -e"]
        if self.in_memory:
            (self.base / "ovl").mkdir(parents=True)
            lines.append(f"mount -t tmpfs -o mode=0700 none {self.base / 'ovl'}")
        for n, target in enumerate(self.overlaid):
            upper, work = self.base / "ovl" / f"u{n}", self.base / "ovl" / f"w{n}"
            if self.in_memory:
                lines.append(f"mkdir {upper} {work}")
            else:
                upper.mkdir(parents=True)
                work.mkdir(parents=True)
            lines.append(f"mount -t overlay overlay -o lowerdir={target},upperdir={upper},workdir={work} {target}")
        lines += pristinenode.take_back_lines(self.overlaid)  # a node before install, also where this machine is one
        lines += [*self.setup, "echo ready", "read -r _ || true"]
        # unshare -m: a private mount namespace (propagation private: nothing mounted in it reaches the host)
        self.proc = subprocess.Popen(["unshare", "-m", "sh", "-c", "\n".join(lines)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
                                     start_new_session=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            self.proc.wait(timeout=30)
            error = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"the private root did not come up: {error}")

    def enter(self, argv: list[str]) -> list[str]:
        assert self.proc is not None
        return ["nsenter", f"--mount=/proc/{self.proc.pid}/ns/mnt", "--", *argv]

    def run(self, argv: list[str], *, env: dict[str, str] | None = None, timeout: int = 300,
            stdin: str | None = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.enter(argv), capture_output=True, text=True, env=env, input=stdin,
                              timeout=timeout, check=False)

    def path(self, real: str) -> Path:
        """Where a file written at ``real`` inside the namespace lies (its overlay's upper layer)."""
        if self.in_memory:
            raise ValueError("the upper layers are in the namespace's memory: read through run()")
        for n, target in enumerate(self.overlaid):
            if real == target or real.startswith(target + "/"):
                return self.base / "ovl" / f"u{n}" / os.path.relpath(real, target)
        raise ValueError(f"{real} is not under a private directory")

    def stop(self) -> list[str]:
        """Let the holder go; the processes still running in the namespace (it ends with the last of them)."""
        if self.proc is None:
            return []
        namespace = os.stat(f"/proc/{self.proc.pid}/ns/mnt").st_ino if self.proc.poll() is None else None
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        left = []
        for pid in filter(str.isdigit, os.listdir("/proc")) if namespace else ():
            try:
                if os.stat(f"/proc/{pid}/ns/mnt").st_ino == namespace:
                    left.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue
        return left
