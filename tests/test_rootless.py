"""What a rootless runtime can give (appliers/rootless.py): the host node must be the GPU's device and openable by
the user without supplementary groups; a rootless hook knows itself and prepares by-path links in the user's own
runtime directory.  The real rootless podman containers: containers/test_rootless_podman.py."""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

import oci_gpu_hook
from oci_gpu_hook.appliers import rootless
from oci_gpu_hook.core.devices import Node
from oci_gpu_hook.errors import HookError

USER, GROUP, OTHER = 1000, 1000, 1001


def st(uid: int, gid: int, mode: int) -> os.stat_result:
    return SimpleNamespace(st_uid=uid, st_gid=gid, st_mode=stat.S_IFCHR | mode)  # type: ignore[return-value]


@pytest.mark.parametrize(("owner", "group", "mode", "opens"), [
    (USER, 0, 0o600, True),  # the user's own node
    (USER, 0, 0o066, False),  # the owner class decides, even where others could
    (0, GROUP, 0o060, True),  # the primary group still counts (runc keeps it)
    (0, GROUP, 0o606, False),  # the group class decides before others
    (0, 44, 0o660, False),  # another group: a supplementary group does not reach the container
    (0, 44, 0o666, True),
    (0, 44, 0o664, False),  # read alone is not enough for a GPU
])
def test_who_may_open_a_node(tmp_path: Path, owner: int, group: int, mode: int, opens: bool) -> None:
    path = tmp_path / "no-acl"
    path.write_text("")
    assert rootless.can_open(str(path), st(owner, group, mode), USER, GROUP) is opens


def _acl(entries: list[tuple[int, int, int]]) -> bytes:
    return (2).to_bytes(4, "little") + b"".join(
        tag.to_bytes(2, "little") + perm.to_bytes(2, "little") + ident.to_bytes(4, "little")
        for tag, perm, ident in entries)


@pytest.mark.parametrize(("entries", "opens"), [
    ([(0x01, 6, 0xFFFFFFFF), (0x02, 6, USER), (0x04, 0, 0xFFFFFFFF), (0x10, 6, 0xFFFFFFFF), (0x20, 0, 0xFFFFFFFF)],
     True),  # logind's uaccess: a named-user entry for the seat's user
    ([(0x01, 6, 0xFFFFFFFF), (0x02, 6, USER), (0x04, 0, 0xFFFFFFFF), (0x10, 4, 0xFFFFFFFF), (0x20, 0, 0xFFFFFFFF)],
     False),  # the mask takes the write away
    ([(0x01, 6, 0xFFFFFFFF), (0x02, 6, OTHER), (0x04, 0, 0xFFFFFFFF), (0x10, 6, 0xFFFFFFFF), (0x20, 0, 0xFFFFFFFF)],
     False),  # another user's entry
])
def test_an_acl_entry_for_the_user_counts(tmp_path: Path, entries: list[tuple[int, int, int]], opens: bool) -> None:
    path = tmp_path / "node"
    path.write_text("")
    try:
        os.setxattr(path, "system.posix_acl_access", _acl(entries))
    except OSError as err:
        pytest.skip(f"no POSIX ACLs on {tmp_path}: {err.strerror}")
    assert rootless.can_open(str(path), os.stat(path), USER, GROUP) is opens


@pytest.mark.root
def test_the_host_node_must_be_the_gpus_device(tmp_path: Path) -> None:
    node = Node(str(tmp_path / "renderD129"), "c", 226, 129)
    assert "the host has no" in (rootless.node_problem(node, 0, 0) or "")
    os.mknod(node.path, stat.S_IFCHR | 0o666, os.makedev(226, 130))
    assert "not the character device 226:129" in (rootless.node_problem(node, 0, 0) or "")
    os.unlink(node.path)
    os.mknod(node.path, stat.S_IFCHR | 0o660, os.makedev(226, 129))
    os.chown(node.path, 0, 44)
    why = rootless.node_problem(node, USER, GROUP) or ""
    assert f"uid {USER} may not open the host's {node.path}" in why and "supplementary groups" in why
    with pytest.raises(HookError) as err:
        rootless.check_nodes([node], USER, GROUP)
    assert str(err.value).startswith("rootless container: ")
    os.chmod(node.path, 0o666)
    assert rootless.node_problem(node, USER, GROUP) is None


@pytest.fixture(scope="module")
def package_copy() -> Iterator[Path]:
    """The package where a plain user may read it (the checkout may be in root's home)."""
    base = Path(tempfile.mkdtemp(prefix="oci-gpu-hook-rootless-", dir="/tmp"))
    try:
        shutil.copytree(Path(oci_gpu_hook.__file__).parent, base / "oci_gpu_hook",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for path in [base, *base.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


AS_USER = ["setpriv", f"--reuid={USER}", f"--regid={GROUP}", "--clear-groups"]
PROBE = ("import sys; sys.path.insert(0, sys.argv[1]); from oci_gpu_hook import log, trust; "
         "from oci_gpu_hook.appliers import rootless\n"
         "log.SYSLOG_SOCKET = '/nonexistent/log'  # the warning's journal line is not the host's business\n"
         "where = rootless.by_path_root('/run/oci-gpu-hook/by-path', '/run/oci-gpu-hook/by-path')\n"
         "print(trust.rootless(), rootless.by_path_root('/elsewhere', '/run/oci-gpu-hook/by-path'), where)")


@pytest.mark.root("setpriv", "unshare")
@pytest.mark.parametrize(("context", "active"),
                         [([], False), (AS_USER, False), ([*AS_USER, "unshare", "-U", "-r"], True)])
def test_a_hook_knows_when_it_runs_rootless(package_copy: Path, context: list[str], active: bool) -> None:
    """Rootless podman's hook runs as 0 of a user namespace that maps the user alone; root, and a plain user outside
    any namespace (whose runtime is not rootless podman's), are not rootless here."""
    done = subprocess.run([*context, "/usr/bin/python3", "-I", "-S", "-c", PROBE, str(package_copy)],
                          capture_output=True, text=True, cwd="/", timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    seen, elsewhere, _where = done.stdout.split(" ", 2)
    assert seen == str(active) and elsewhere == "/elsewhere"  # a by_path_dir the operator set is kept


@pytest.mark.root("setpriv", "unshare")
@pytest.mark.parametrize("state", ["missing", "roots", "users"])
def test_a_user_without_a_runtime_directory_gets_no_links_and_a_line(package_copy: Path, tmp_path: Path,
                                                                     state: str) -> None:
    """No ``/run/user/UID`` of the user's own (no logind session: ``su``, a CI runner's service user without linger):
    the by-path links are a convenience, so there are none, and one warning line says why, never a refusal.  In a
    private mount namespace whose /run/user is a tmpfs of its own."""
    made = {"missing": "", "roots": f"mkdir /run/user/{USER}",
            "users": f"mkdir -m 0700 /run/user/{USER} && chown {USER}:{GROUP} /run/user/{USER}"}[state]
    inner = shlex.join([*AS_USER, "unshare", "-U", "-r", "/usr/bin/python3", "-I", "-S", "-c", PROBE,
                        str(package_copy)])
    script = f"mkdir -p /run/user && mount -t tmpfs none /run/user && {made or 'true'} && exec {inner}"
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], capture_output=True,
                          text=True, cwd="/", timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    where = done.stdout.split(" ", 2)[2].strip()
    if state == "users":
        assert where == f"/run/user/{USER}/oci-gpu-hook/by-path" and done.stderr == ""
        return
    assert where == "None"
    why = (f"there is no /run/user/{USER} (No such file or directory; systemd-logind makes it at login, or loginctl "
           "enable-linger)" if state == "missing" else f"/run/user/{USER} is not a directory of this user's")
    assert done.stderr == (f"oci-gpu-hook: warning: rootless container: no /dev/dri/by-path links: {why}; the "
                           "container gets its GPUs without them (set by_path_dir to a directory the user owns for "
                           "them)\n")


@pytest.mark.root("setpriv", "unshare")
def test_inspect_says_what_isolates_a_rootless_process() -> None:
    from oci_gpu_hook.entry.commands.inspect import rootless_view

    names = {("c", 1, 3): "a stand-in GPU"}
    assert rootless_view(os.getpid(), names) == []  # root's own process: the cgroup's rules are the answer
    proc = subprocess.Popen([*AS_USER, "unshare", "-U", "-r", "sh", "-c", "echo ready; exec sleep 60"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        lines = rootless_view(proc.pid, names)
    finally:
        proc.kill()
        proc.wait()
    assert lines[0].startswith(f"rootless: process {proc.pid} runs in a user namespace that maps its root to host "
                               f"uid {USER}: no device cgroup")
    assert "  /dev/null  c 1:3  a stand-in GPU" in lines[1:]
