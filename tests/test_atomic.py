"""The one writer (:mod:`oci_gpu_hook.atomic`) by a directory fd, as the live hook writes inside a container's root
(:mod:`oci_gpu_hook.appliers.mounts`): a hostile image's symlinks in the target's place or in its parents lead
nowhere outside the root, a planted temp name is never reused, the mode is exact whatever the umask."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from oci_gpu_hook import atomic
from oci_gpu_hook.appliers import mounts
from oci_gpu_hook.errors import HookError


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """A container root and, beside it, the host's files an image's symlinks aim at."""
    root, outside = tmp_path / "rootfs", tmp_path / "host"
    (root / "etc").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_text("host's\n")
    old = os.umask(0o077)  # the mode is the writer's, not the umask's
    try:
        yield {"root": root, "outside": outside}
    finally:
        os.umask(old)


def host_untouched(outside: Path) -> bool:
    return sorted(os.listdir(outside)) == ["secret"] and (outside / "secret").read_text() == "host's\n"


def open_path(directory: Path) -> int:
    return os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)  # as mounts.dir_in_root gives it


@pytest.mark.parametrize("aim", ["absolute", "relative"])
def test_a_symlinked_target_is_replaced_not_followed(tree: dict[str, Path], aim: str) -> None:
    secret = tree["outside"] / "secret"
    link = tree["root"] / "etc" / "ld.so.conf"
    link.symlink_to(secret if aim == "absolute" else os.path.relpath(secret, link.parent))
    dir_fd = open_path(link.parent)
    try:
        atomic.write_at(dir_fd, "ld.so.conf", "/usr/lib/x\n", 0o644, shown="/etc/ld.so.conf in the container")
    finally:
        os.close(dir_fd)
    st = os.lstat(link)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644
    assert link.read_text() == "/usr/lib/x\n"
    assert host_untouched(tree["outside"])
    assert os.listdir(link.parent) == ["ld.so.conf"]  # no temp file left


def test_a_symlink_replaces_a_symlink_to_a_host_directory(tree: dict[str, Path]) -> None:
    link = tree["root"] / "etc" / "libcuda.so.1"
    link.symlink_to(tree["outside"])
    dir_fd = open_path(link.parent)
    try:
        atomic.symlink_at(dir_fd, "libcuda.so.1", "libcuda.so.550.1", shown="/etc/libcuda.so.1 in the container")
    finally:
        os.close(dir_fd)
    assert os.readlink(link) == "libcuda.so.550.1"
    assert host_untouched(tree["outside"])


def test_a_name_with_a_slash_is_refused(tree: dict[str, Path]) -> None:
    """Below a directory fd the writer takes one name: a path would have the kernel walk (and follow) its parents."""
    (tree["root"] / "etc" / "sub").symlink_to(tree["outside"])
    dir_fd = open_path(tree["root"] / "etc")
    try:
        for name in ("sub/secret", "sub/new", "..", "."):
            with pytest.raises(HookError, match="is not a name in its directory"):
                atomic.write_at(dir_fd, name, "x\n", 0o644, shown=f"/etc/{name} in the container")
            with pytest.raises(HookError, match="is not a name in its directory"):
                atomic.symlink_at(dir_fd, name, "x", shown=f"/etc/{name} in the container")
    finally:
        os.close(dir_fd)
    assert host_untouched(tree["outside"])


AIMS = {"absolute": "{host}", "climbing": "../../{name}", "magic link": "/proc/self/root{host}"}


@pytest.mark.parametrize("aim", list(AIMS))
def test_a_symlinked_parent_leads_inside_the_root(tree: dict[str, Path], aim: str) -> None:
    """``/etc/ld.so.conf.d`` a symlink at the host's directory (by its absolute path, by climbing above the root,
    through a magic link): the writer's directory is resolved inside the root as runc resolves it
    (mounts.dir_in_root), so the file lands inside the root."""
    host = tree["outside"]
    (tree["root"] / "etc" / "ld.so.conf.d").symlink_to(AIMS[aim].format(host=host, name=host.name))
    root_fd = os.open(tree["root"], os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        mounts._write_in_root(root_fd, mounts.CONF_FILE, "/usr/lib/x\n")
        mounts._write_in_root(root_fd, mounts.CONF_FILE, "/usr/lib/x\n")  # unchanged: kept
    finally:
        os.close(root_fd)
    assert host_untouched(host)
    found = [p for p in tree["root"].rglob("*") if p.name == os.path.basename(mounts.CONF_FILE)]
    assert len(found) == 1 and found[0].read_text() == "/usr/lib/x\n", found
    assert stat.S_IMODE(found[0].stat().st_mode) == 0o644
    assert tree["root"] in found[0].resolve().parents  # inside the root, wherever the symlink sent it


def test_a_fifo_in_the_file_s_place_is_replaced_without_waiting(tree: dict[str, Path]) -> None:
    """The unchanged-content check reads what is there: an image's FIFO there is no reason to wait for a writer (the
    runtime's hook timeout, not one line).  In a child, so that a regression fails instead of hanging the suite."""
    conf = tree["root"] / mounts.CONF_FILE.lstrip("/")
    conf.parent.mkdir(parents=True)
    os.mkfifo(conf)
    code = ("import os, sys; from oci_gpu_hook.appliers import mounts; "
            "fd = os.open(sys.argv[1], os.O_PATH | os.O_DIRECTORY); "
            "mounts._write_in_root(fd, mounts.CONF_FILE, '/usr/lib/x\\n')")
    subprocess.run([sys.executable, "-c", code, str(tree["root"])], check=True, timeout=60,
                   cwd=Path(__file__).resolve().parent.parent)
    assert stat.S_ISREG(os.lstat(conf).st_mode) and conf.read_text() == "/usr/lib/x\n"


def test_a_planted_temp_is_never_reused_and_a_killed_writers_is_removed(tree: dict[str, Path]) -> None:
    directory = tree["root"] / "etc"
    child = subprocess.Popen(["true"])
    child.wait()
    dead = child.pid
    planted = directory / f".ld.so.conf.oci-gpu-hook.{dead}.0badcafe"  # a temp name, but a symlink to the host
    planted.symlink_to(tree["outside"] / "secret")
    stale = directory / f".ld.so.conf.oci-gpu-hook.{dead}.00000001"
    stale.write_text("partial")
    then = os.stat(stale).st_mtime - atomic.GRACE_S - 5
    for path in (planted, stale):
        os.utime(path, (then, then), follow_symlinks=False)
    dir_fd = open_path(directory)
    try:
        atomic.write_at(dir_fd, "ld.so.conf", "new\n", 0o600, shown="/etc/ld.so.conf in the container")
    finally:
        os.close(dir_fd)
    assert sorted(os.listdir(directory)) == sorted([planted.name, "ld.so.conf"])  # the symlink is no temp file
    assert os.readlink(planted) == str(tree["outside"] / "secret")
    assert stat.S_IMODE(os.lstat(directory / "ld.so.conf").st_mode) == 0o600
    assert host_untouched(tree["outside"])


def test_a_failed_write_says_where_and_leaves_nothing(tree: dict[str, Path]) -> None:
    directory = tree["root"] / "etc"
    (directory / "ld.so.conf").mkdir()  # a directory in the file's place: the rename fails
    (directory / "ld.so.conf" / "keep").write_text("image's")
    dir_fd = open_path(directory)
    try:
        with pytest.raises(HookError, match=r"^cannot write /etc/ld.so.conf in the container: Is a directory$"):
            atomic.write_at(dir_fd, "ld.so.conf", "new\n", 0o644, shown="/etc/ld.so.conf in the container")
    finally:
        os.close(dir_fd)
    assert os.listdir(directory) == ["ld.so.conf"] and (directory / "ld.so.conf" / "keep").read_text() == "image's"
