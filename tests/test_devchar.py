"""The /dev/char/MAJ:MIN links install and watch make (oci_gpu_hook/cluster/devchar.py), on a /dev of the test's own:
``install --prefix P`` works in ``P/dev`` and records in ``P/run``, ``watch --dev D`` in ``D``, with stand-in
char nodes made with the seed host's numbers (mknod: root).  The real /dev of a booted systemd is
tests/containers/test_systemd_live.py's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from oci_gpu_hook.cluster import devchar
from oci_gpu_hook.config import Config
from oci_gpu_hook.inventory import scan_host
from tests.helpers import clilib
from tests.helpers.containerlib import INSTALL_DEV

pytestmark = pytest.mark.root

SEED_NODES = {f"dri/card{i + 1}": (226, i + 1) for i in range(8)} | {
    f"dri/renderD{128 + i}": (226, 128 + i) for i in range(8)} | {"kfd": (234, 0)}


def stand_ins(dev: Path, nodes: dict[str, tuple[int, int]]) -> None:
    for name, (major, minor) in nodes.items():
        path = dev / name
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(path, 0o600 | 0o020000, os.makedev(major, minor))


def links_in(dev: Path) -> dict[str, str]:
    char = dev / "char"
    return {name: os.readlink(char / name) for name in sorted(os.listdir(char)) if (char / name).is_symlink()} \
        if char.is_dir() else {}


def seed_inventory() -> object:
    return scan_host(Config(sysfs_root=str(clilib.EXAMPLE_SYSFS)))


def test_a_link_for_each_grantable_node_present_with_its_number(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    present = {k: v for k, v in SEED_NODES.items() if k in ("dri/card2", "dri/renderD129", "kfd")}
    stand_ins(dev, present)
    stand_ins(dev, {"dri/renderD130": (226, 77)})  # the name of a grantable node, another device's number
    (dev / "dri" / "card3").write_text("")  # not a device node at all
    lines = devchar.make_links(seed_inventory(), str(dev), str(tmp_path / "state"))  # type: ignore[arg-type]
    assert links_in(dev) == {"226:2": "../dri/card2", "226:129": "../dri/renderD129", "234:0": "../kfd"}
    assert sorted(lines) == sorted(f"{dev}/char/{n} -> {t}" for n, t in links_in(dev).items())
    for name, target in links_in(dev).items():  # each resolves to the node with its own number, as udev's do
        st = os.stat(dev / "char" / name)
        assert f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}" == name, target
    assert sorted((tmp_path / "state").read_text().splitlines()) == sorted(
        f"{dev}/char/{n} {t}" for n, t in links_in(dev).items())


def test_what_is_there_is_never_touched_and_a_second_run_makes_nothing(tmp_path: Path) -> None:
    dev, state = tmp_path / "dev", tmp_path / "state"
    stand_ins(dev, SEED_NODES)
    (dev / "char").mkdir()
    (dev / "char" / "226:1").symlink_to("../somewhere/else")  # udev's or an operator's, even a wrong one
    (dev / "char" / "226:128").write_text("a file")
    (dev / "char" / "234:0").symlink_to("../nothing")  # dangling
    first = devchar.make_links(seed_inventory(), str(dev), str(state))  # type: ignore[arg-type]
    assert len(first) == len(SEED_NODES) - 3
    assert os.readlink(dev / "char" / "226:1") == "../somewhere/else"
    assert (dev / "char" / "226:128").read_text() == "a file"
    assert os.readlink(dev / "char" / "234:0") == "../nothing"
    assert devchar.make_links(seed_inventory(), str(dev), str(state)) == []  # type: ignore[arg-type]
    assert len(state.read_text().splitlines()) == len(first)


def test_no_node_no_link_no_record(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    assert devchar.make_links(seed_inventory(), str(dev), str(tmp_path / "state")) == []  # type: ignore[arg-type]
    assert not (dev / "char").exists() and not (tmp_path / "state").exists()


def test_remove_takes_out_only_ours_still_as_made(tmp_path: Path) -> None:
    dev, state = tmp_path / "dev", tmp_path / "state"
    stand_ins(dev, SEED_NODES)
    (dev / "char").mkdir()
    (dev / "char" / "226:1").symlink_to("../dri/card1")  # udev's, before us: not ours
    devchar.make_links(seed_inventory(), str(dev), str(state))  # type: ignore[arg-type]
    (dev / "char" / "226:2").unlink()
    (dev / "char" / "226:2").symlink_to("../dri/card2-elsewhere")  # replaced since
    (dev / "char" / "226:3").unlink()  # gone since
    lines = devchar.remove_links(str(dev), str(state))
    assert f"kept: {dev}/char/226:2 (points to ../dri/card2-elsewhere now, not ../dri/card2 as made)" in lines
    assert links_in(dev) == {"226:1": "../dri/card1", "226:2": "../dri/card2-elsewhere"}
    assert not state.exists()


def test_a_record_of_a_link_never_made_is_harmless(tmp_path: Path) -> None:
    """make_links records first: a run killed before the link leaves a record of nothing, which uninstall skips."""
    dev, state = tmp_path / "dev", tmp_path / "state"
    (dev / "char").mkdir(parents=True)
    state.write_text(f"{dev}/char/226:130 ../dri/renderD130\n")
    assert devchar.remove_links(str(dev), str(state)) == []
    assert not state.exists()


def _install(prefix: Path, *args: str) -> str:
    done = clilib.cli("install", "--prefix", str(prefix), "--only", "cdi", *INSTALL_DEV, *args,
                      env=clilib.clean_env(OCI_GPU_HOOK_CDI_DIR="/etc/cdi"))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_install_makes_them_says_so_and_uninstall_takes_them_out(tmp_path: Path) -> None:
    prefix = tmp_path / "root"
    dev = prefix / "dev"
    stand_ins(dev, {k: v for k, v in SEED_NODES.items() if k in ("dri/card1", "dri/renderD128", "kfd")})
    dry = _install(prefix, "--dry-run")
    assert f"dev-char: {dev}/char/226:128 -> ../dri/renderD128 (would be made)" in dry
    assert not (dev / "char").exists()
    out = _install(prefix)
    for line in (f"dev-char: {dev}/char/226:1 -> ../dri/card1", f"dev-char: {dev}/char/226:128 -> ../dri/renderD128",
                 f"dev-char: {dev}/char/234:0 -> ../kfd"):
        assert line in out.splitlines(), out
    assert links_in(dev) == {"226:1": "../dri/card1", "226:128": "../dri/renderD128", "234:0": "../kfd"}
    assert (prefix / devchar.STATE.lstrip("/")).is_file()
    again = _install(prefix)
    assert "dev-char:" not in again
    done = clilib.cli("install", "--prefix", str(prefix), "--uninstall", env=clilib.clean_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"dev-char: removed: {dev}/char/226:128 (made by install or watch)" in done.stdout
    assert links_in(dev) == {} and not (prefix / devchar.STATE.lstrip("/")).exists()


def test_watch_once_makes_them_in_its_dev_and_none_with_dev_none(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    stand_ins(dev, {"dri/renderD131": (226, 131)})
    env = clilib.clean_env(OCI_GPU_HOOK_CDI_DIR=str(tmp_path / "cdi"))
    done = clilib.cli("watch", "--once", "--dev", "none", env=env)
    assert done.returncode == 0, done.stderr
    assert links_in(dev) == {} and "made" not in done.stderr
    done = clilib.cli("watch", "--once", "--dev", str(dev), env=env)
    assert done.returncode == 0, done.stderr
    assert links_in(dev) == {"226:131": "../dri/renderD131"}
    assert f"; made {dev}/char/226:131 -> ../dri/renderD131" in done.stderr
    assert (tmp_path / devchar.STATE.lstrip("/")).read_text() == f"{dev}/char/226:131 ../dri/renderD131\n"


@pytest.mark.parametrize("host", ["nvidia-4x-h100", "nvidia-2x-h100-mig", "amd-nvidia-2x2", "intel-i915-xe"])
def test_every_grantable_node_of_other_hosts(tmp_path: Path, host: str) -> None:
    """NVIDIA's nodes (no /sys/dev/char entry on a real host, so runc under systemd needs the links most), MIG
    capability nodes in their directory, Intel's: one link each, relative, resolving to the node's own number."""
    root = clilib.REPO / "examples" / "hosts" / host
    inventory = scan_host(Config(sysfs_root=str(root / "sys"), proc_root=str(root / "proc"),
                                 driver_root=str(root / "driver")))
    nodes = devchar.grantable_nodes(inventory)
    assert nodes and all(n.type == "c" for n in nodes)
    dev = tmp_path / "dev"
    stand_ins(dev, {n.path[len("/dev/"):]: (n.major, n.minor) for n in nodes})
    made = devchar.make_links(inventory, str(dev), str(tmp_path / "state"))
    assert len(made) == len({(n.major, n.minor) for n in nodes})
    for node in nodes:
        link = dev / "char" / f"{node.major}:{node.minor}"
        assert os.readlink(link) == os.path.relpath(dev / node.path[len("/dev/"):], dev / "char")
        assert os.stat(link).st_rdev == os.makedev(node.major, node.minor)
    if host.startswith("nvidia"):
        assert os.readlink(dev / "char" / "195:255") == "../nvidiactl"
    if host == "nvidia-2x-h100-mig":
        assert any(os.readlink(dev / "char" / name).startswith("../nvidia-caps/") for name in os.listdir(dev / "char"))
