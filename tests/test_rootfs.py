"""Node creation under a rootfs by file descriptor (no namespaces here: the container tests cover that)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from oci_gpu_hook.appliers import rootfs
from oci_gpu_hook.config import Config
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.inventory import scan
from oci_gpu_hook.plan import Plan, build_plan
from oci_gpu_hook.request import KindAsk, Request
from tests.helpers.containerlib import SEED_SYSFS

pytestmark = pytest.mark.root  # mknod


def _plan(indices: list[int], **config: object) -> Plan:
    inventory = scan(str(SEED_SYSFS))
    gpus = tuple(inventory.devices("amd")[i] for i in indices)
    request = Request([KindAsk("amd", "test", [",".join(map(str, indices))])], {"amd": gpus})
    return build_plan(inventory, request, Config(**config))


def _make(root: Path, plan: Plan) -> list[str]:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return rootfs.make_nodes(fd, plan.edits)
    finally:
        os.close(fd)


def test_nodes_and_links_are_made(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        done = _make(tmp_path, _plan([1], device_file_mode=0o660, device_uid=12, device_gid=34))
    finally:
        os.umask(old)
    assert done == ["/dev/dri/card2 made", "/dev/dri/renderD129 made", "/dev/kfd made"]
    for name, (major, minor) in {"dev/dri/card2": (226, 2), "dev/dri/renderD129": (226, 129),
                                 "dev/kfd": (234, 0)}.items():
        st = os.lstat(tmp_path / name)
        assert stat.S_ISCHR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660
        assert (os.major(st.st_rdev), os.minor(st.st_rdev), st.st_uid, st.st_gid) == (major, minor, 12, 34)
    assert os.readlink(tmp_path / "dev/dri/by-path/pci-0000:23:00.0-card") == "../card2"
    assert os.readlink(tmp_path / "dev/dri/by-path/pci-0000:23:00.0-render") == "../renderD129"
    assert _make(tmp_path, _plan([1])) == ["/dev/dri/card2 present", "/dev/dri/renderD129 present",
                                          "/dev/kfd present"]


def test_a_node_with_other_numbers_is_refused(tmp_path: Path) -> None:
    (tmp_path / "dev/dri").mkdir(parents=True)
    os.mknod(tmp_path / "dev/dri/card2", stat.S_IFCHR | 0o600, os.makedev(226, 7))
    with pytest.raises(HookError, match="already exists in the container as 226:7"):
        _make(tmp_path, _plan([1]))


@pytest.mark.parametrize("component", ["dev", "dev/dri", "dev/dri/by-path"])
@pytest.mark.parametrize("how", ["absolute", "relative", "proc-self-root"])
def test_symlinked_directories_are_never_followed(tmp_path: Path, component: str, how: str) -> None:
    root, escape = tmp_path / "root", tmp_path / "escape"
    escape.mkdir()
    parent = root / component
    parent.parent.mkdir(parents=True, exist_ok=True)
    target = {"absolute": str(escape), "relative": "../" * 8 + str(escape).lstrip("/"),
              "proc-self-root": f"/proc/self/root{escape}"}[how]
    parent.symlink_to(target)
    with pytest.raises(HookError, match=f"refusing to use /{component} .* it is a symlink"):
        _make(root, _plan([1]))
    assert list(escape.iterdir()) == []


@pytest.mark.parametrize(("link", "target"), [
    ("/dev/dri/by-path/../../etc/x", "../card1"), ("/etc/passwd", "../card1"), ("/dev/dri/by-path/a", "/etc/shadow"),
    ("/dev/dri/by-path/a", "../../etc"), ("/dev/dri/by-path/a", "../card1/x"), ("/dev/dri/by-path/a/b", "../card1"),
])
def test_only_by_path_links_to_dri_nodes_are_made(tmp_path: Path, link: str, target: str) -> None:
    from oci_gpu_hook.core.edits import Edits

    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(HookError, match="refusing the link"):
            rootfs.make_nodes(fd, Edits(links=((link, target),)))
    finally:
        os.close(fd)
    assert list(tmp_path.iterdir()) == []
