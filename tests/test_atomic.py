"""The one writer (:mod:`oci_gpu_hook.atomic`) by a directory fd, as the live hook writes inside a container's root
(:mod:`oci_gpu_hook.appliers.mounts`): a hostile image's symlinks in the target's place or in its parents lead
nowhere outside the root, a planted temp name is never reused, the mode is exact whatever the umask."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
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


# --- a writer killed at each system call of its write ------------------------------------------------------

WRITER = """
import os, sys
from oci_gpu_hook import atomic
how, directory, name = sys.argv[1:4]
if how == "at":
    dir_fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
os.write(2, b"WRITE-BEGINS\\n")
if how == "at":
    atomic.write_at(dir_fd, name, "new content\\n", 0o640, shown=name)
else:
    atomic.write_atomic(os.path.join(directory, name), "new content\\n", 0o640)
os.write(2, b"WRITE-ENDS\\n")
"""
TRACED = "openat,write,fchmod,linkat,rename,renameat,renameat2,close,getdents64,unlink,unlinkat,newfstatat"


def _strace(argv: list[str], *options: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1",  # the same system calls in every run
           "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    return subprocess.run(["strace", "-qq", *options, *argv], capture_output=True, text=True, env=env, timeout=120)


def _write_calls(argv: list[str], log: Path) -> list[tuple[str, int]]:
    """The system calls of the write (between the markers) as (name, its ordinal among that process's calls of the
    name, for strace's ``when=``)."""
    done = _strace(argv, "-o", str(log), "-e", f"trace={TRACED}")
    assert done.returncode == 0 and "WRITE-ENDS" in done.stderr, done.stderr
    seen: dict[str, int] = {}
    calls, inside = [], False
    for line in log.read_text().splitlines():
        name = line.split("(", 1)[0]
        if not name.isidentifier():
            continue  # a resumed or signal line
        seen[name] = seen.get(name, 0) + 1
        if name == "write" and "WRITE-BEGINS" in line:
            inside = True
        elif name == "write" and "WRITE-ENDS" in line:
            break
        elif inside:
            calls.append((name, seen[name]))
    return calls


@pytest.mark.skipif(shutil.which("strace") is None, reason="no strace")
@pytest.mark.parametrize("how", ["path", "at"])
@pytest.mark.parametrize("there", [True, False], ids=["replace", "new"])
def test_a_writer_killed_at_each_system_call_leaves_nothing(tmp_path: Path, how: str, there: bool) -> None:
    """A real SIGKILL (strace's fault injection) at each system call of a write, O_TMPFILE open, write, fchmod,
    linkat, rename and the rest: the target is the old file or the new one, whole, and nothing else is there;
    but for the one window the module names (killed at the rename, after the temp name's link: that temp file,
    whole, with its final mode), which the next write removes."""
    directory = tmp_path / "bundle"
    directory.mkdir()
    target = directory / "config.json"
    argv = [sys.executable, "-c", WRITER, how, str(directory), target.name]
    if there:
        target.write_text("old content\n")
    calls = _write_calls(argv, tmp_path / "trace")
    names = [n for n, _ in calls]
    assert {"openat", "write", "fchmod", "linkat"} <= set(names), calls
    assert ("rename" in names or "renameat" in names) == there, calls  # new: linked as the name itself
    windows = 0
    for name, when in calls:
        if there:
            target.write_text("old content\n")
        else:
            target.unlink(missing_ok=True)
        done = _strace(argv, "-o", os.devnull, "-e", f"inject={name}:signal=SIGKILL:when={when}")
        assert done.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL) and "WRITE-ENDS" not in done.stderr, (
            name, when, done.stderr)
        left = sorted(os.listdir(directory))
        whole = target.read_text() if target.exists() else None
        assert whole in (("old content\n", "new content\n") if there else (None, "new content\n")), (name, whole)
        temps = [e for e in left if e != target.name]
        if name.startswith("rename"):  # the window: linked under its temp name, not yet renamed
            windows += 1
            assert len(temps) == 1 and atomic.is_temp(temps[0]), left
            temp = directory / temps[0]
            assert temp.read_text() == "new content\n" and stat.S_IMODE(temp.stat().st_mode) == 0o640
            then = temp.stat().st_mtime - atomic.GRACE_S - 5
            os.utime(temp, (then, then))
            atomic.write_atomic(str(target), "next\n")  # the next write of the same target removes it
            assert sorted(os.listdir(directory)) == [target.name] and target.read_text() == "next\n"
        else:
            assert temps == [], (name, when, left)
    assert windows == (1 if there else 0)


NAMED_CHECK = """
import os, stat, sys
from oci_gpu_hook import atomic
directory = sys.argv[1]
assert atomic._unnamed(os.path.join(directory, "x"), None) == -1  # EOPNOTSUPP: no O_TMPFILE file here
target = os.path.join(directory, "config.json")
atomic.write_atomic(target, "first\\n", 0o600)  # new
atomic.write_atomic(target, "second\\n")  # replaced, its mode kept
dir_fd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
atomic.write_at(dir_fd, "ld.so.conf", "/usr/lib/x\\n", 0o644, shown="ld.so.conf")
assert open(target).read() == "second\\n" and stat.S_IMODE(os.stat(target).st_mode) == 0o600
assert stat.S_IMODE(os.stat(os.path.join(directory, "ld.so.conf")).st_mode) == 0o644
print(sorted(os.listdir(directory)))
"""


@pytest.mark.skipif(shutil.which("fuse-overlayfs") is None or not os.path.exists("/dev/fuse"), reason="no FUSE")
def test_a_filesystem_without_o_tmpfile_gets_the_named_writer(tmp_path: Path) -> None:
    """fuse-overlayfs makes no O_TMPFILE file (EOPNOTSUPP): the writer falls back to a named temp file and rename,
    with the same results (content, exact mode, nothing left), in a private mount namespace."""
    for name in ("lower", "upper", "work", "merged"):
        (tmp_path / name).mkdir()
    merged = tmp_path / "merged"
    script = (f"fuse-overlayfs -o lowerdir={tmp_path / 'lower'},upperdir={tmp_path / 'upper'},"
              f"workdir={tmp_path / 'work'} {merged} && {shlex.quote(sys.executable)} -c {shlex.quote(NAMED_CHECK)} "
              f"{merged}; status=$?; umount {merged}; exit $status")
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['config.json', 'ld.so.conf']", done.stdout
    assert sorted(os.listdir(tmp_path / "upper")) == ["config.json", "ld.so.conf"]
