"""Install and uninstall killed (SIGKILL) at any change, then install (which recovers) and uninstall, give
back exactly the tree that was there before the first install.

The kill comes from ``OCI_GPU_HOOK_INSTALL_KILL_AT=N`` (install kills itself just before its Nth change:
each directory made or removed, each temp file created, each rename, each unlink, the journal's own
writes included), in a forked child so that each point costs no interpreter start.  Every
``STRIDE``-th point is tested by default, a different offset per tree so that the trees together cover
every residue; ``OCI_GPU_HOOK_TEST_EVERY_KILL_POINT=1`` tests them all.  A test with strace's fault
injection (a SIGKILL on the Nth rename/unlink/mkdir/openat syscall of a real ``oci-gpu-hook install``
process) checks the same without the built-in hook.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from oci_gpu_hook.entry import cli
from oci_gpu_hook.install import containerd, paths, undo
from tests.helpers import clilib
from tests.helpers.containerlib import INSTALL_DEV
from tests.helpers.installtrees import build, isolated_env, snapshot

REPO = Path(__file__).resolve().parent.parent
SYSFS = REPO / "examples" / "hosts" / "seed-8x-gfx1100" / "sys"
__all__ = ["isolated_env"]  # the autouse fixture, imported
TREES = ["empty", "docker-v2", "v3-conf"]
STRIDE = 1 if os.environ.get("OCI_GPU_HOOK_TEST_EVERY_KILL_POINT") else 5


def run(prefix: Path, *args: str, code: int = 0) -> None:
    """``install --prefix PREFIX ARGS`` in this process; it must exit ``code``."""
    saved = sys.stdout
    with open(os.devnull, "w") as sink:
        sys.stdout = sink
        try:
            got = cli.main(["--sysfs-root", str(SYSFS), "install", *INSTALL_DEV, "--prefix", str(prefix), *args])
        finally:
            sys.stdout = saved
    assert got == code


def killed_at(prefix: Path, n: int, *args: str, code: int = 0) -> bool:
    """Run install in a forked child that kills itself before its ``n``th change: True if it was killed,
    False if it finished first (``n`` is past its last change)."""
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        try:
            os.environ[undo.KILL_ENV] = str(n)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
            sys.stderr = sys.stdout
            code = cli.main(["--sysfs-root", str(SYSFS), "install", *INSTALL_DEV, "--prefix", str(prefix), *args])
        finally:
            os._exit(70)
        os._exit(code)  # pragma: no cover
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True
    assert os.WEXITSTATUS(status) in (code, 70), status
    assert os.WEXITSTATUS(status) != 70 or n > 0
    return False


def points(tree: str) -> range:
    offset = TREES.index(tree) % STRIDE
    return range(1 + offset, 10_000, STRIDE)


@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("op", ["install", *INSTALL_DEV, "uninstall"])
def test_killed_at_any_change_then_install_and_uninstall_give_the_tree_back(tmp_path: Path, tree: str,
                                                                          op: str) -> None:
    reference = tmp_path / "reference"
    build(reference, tree)
    original = snapshot(reference, mtimes=True)
    run(reference)
    installed = snapshot(reference)
    run(reference, "--uninstall")
    assert snapshot(reference, mtimes=True) == original
    tested = 0
    for n in points(tree):
        prefix = tmp_path / f"{op}-{n}"
        build(prefix, tree)
        if op == "uninstall":
            run(prefix)
        was_killed = killed_at(prefix, n, *(["--uninstall"] if op == "uninstall" else []))
        run(prefix)  # rolls back the killed run, then installs
        assert snapshot(prefix) == installed, f"killed at change {n} of {op}: install did not recover"
        run(prefix, "--uninstall")
        assert snapshot(prefix, mtimes=True) == original, f"killed at change {n} of {op}: the tree differs"
        shutil.rmtree(prefix)
        if not was_killed:
            break
        tested += 1
    assert tested >= 5, f"only {tested} kill points"
    print(f"{tree} {op}: {tested} kill points, every {STRIDE}th")


def test_a_rollback_killed_half_way_is_done_again(tmp_path: Path) -> None:
    prefix = tmp_path / "p"
    build(prefix, "docker-v2")
    original = snapshot(prefix, mtimes=True)
    assert killed_at(prefix, 40)
    journal = prefix / paths.JOURNAL_PATH.lstrip("/")
    assert journal.is_file()
    for n in (1, 3, 6):  # the recovering run killed while it rolls back
        assert killed_at(prefix, n)
    run(prefix)
    run(prefix, "--uninstall")
    assert snapshot(prefix, mtimes=True) == original


STRACE_POINTS = [("rename", 3), ("rename", 17), ("mkdir", 2), ("unlink", 2), ("unlink", 7)]


@pytest.mark.skipif(shutil.which("strace") is None, reason="no strace")
@pytest.mark.parametrize(("syscall", "when"), STRACE_POINTS)
def test_strace_sigkill_on_a_syscall(tmp_path: Path, syscall: str, when: int) -> None:
    prefix = tmp_path / "p"
    build(prefix, "docker-v2")
    original = snapshot(prefix, mtimes=True)
    env = clilib.without_tool_vars()
    env["OCI_GPU_HOOK_CONFIG"] = os.devnull
    argv = [sys.executable, "-m", "oci_gpu_hook.entry.cli", "--sysfs-root", str(SYSFS), "install", *INSTALL_DEV,
            "--prefix",
            str(prefix)]
    if syscall in ("unlink", "rename"):  # an uninstall: install first
        assert subprocess.run(argv, env=env, cwd=REPO, capture_output=True, check=False).returncode == 0
        argv.append("--uninstall")
    # The interpreter's start makes none of these calls (its bytecode is cached by the runs before).
    result = subprocess.run(["strace", "-f", "-qq", "-o", os.devnull,
                             "-e", f"inject={syscall}:signal=SIGKILL:when={when}", *argv],
                            env=env, cwd=REPO, capture_output=True, check=False, timeout=120)
    assert result.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL), f"{syscall} #{when}: {result!r}"
    assert snapshot(prefix, mtimes=True) != original or syscall == "unlink"  # it left something to clean up
    run(prefix)
    run(prefix, "--uninstall")
    assert snapshot(prefix, mtimes=True) == original


def edit_drop_in(prefix: Path) -> None:
    drop_in = prefix / containerd.DROP_IN_PATH.lstrip("/")
    drop_in.write_text(drop_in.read_text() + "# tuned by hand\n")


@pytest.mark.parametrize("tree", ["docker-v2", "v3-conf"])
def test_killed_uninstall_that_leaves_an_edited_file_then_the_one_that_finishes(tmp_path: Path, tree: str) -> None:
    """An uninstall that must leave the edited drop-in (and the runtime launcher it names), killed at any change,
    is rolled back by the next, which leaves exactly what an unkilled one leaves; after the operator moves the
    file away, the uninstall that finishes, killed at any change, is rolled back too, and the next gives back the
    tree of before install."""
    reference = tmp_path / "reference"
    build(reference, tree)
    original = snapshot(reference, mtimes=True)
    run(reference)
    edit_drop_in(reference)
    run(reference, "--uninstall", code=1)
    partial = snapshot(reference)
    assert paths.MANIFEST_PATH.lstrip("/") in partial
    tested = 0
    for n in points(tree):
        prefix = tmp_path / f"{tree}-{n}"
        build(prefix, tree)
        run(prefix)
        edit_drop_in(prefix)
        first = killed_at(prefix, n, "--uninstall", code=1)
        run(prefix, "--uninstall", code=1)  # rolls back the killed run, then leaves what it must
        assert snapshot(prefix) == partial, f"killed at change {n} of the first uninstall"
        drop_in = prefix / containerd.DROP_IN_PATH.lstrip("/")
        drop_in.rename(tmp_path / "mine.toml")
        second = killed_at(prefix, n, "--uninstall")
        run(prefix, "--uninstall")
        assert snapshot(prefix, mtimes=True) == original, f"killed at change {n} of the second uninstall"
        shutil.rmtree(prefix)
        if not first and not second:
            break
        tested += 1
    assert tested >= 5, f"only {tested} kill points"
    print(f"{tree} uninstall leaving an edited file, then the one that finishes: {tested} kill points, every "
          f"{STRIDE}th")
