"""The sysfs inventory: which devices are GPUs, in which order, with which nodes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from oci_gpu_hook.core.devices import Node as DeviceNode
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.inventory import parse_pci_address, scan
from tests.fakesysfs import FakeGpu, FakeHost, build, seed_host, shuffled_host

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_SYSFS = REPO / "examples" / "hosts" / "seed-8x-gfx1100" / "sys"

SEED_PCI = [f"0000:{bus}:00.0" for bus in ("03", "23", "43", "63", "83", "a3", "c3", "e3")]


@pytest.fixture
def seed_root(tmp_path: Path) -> Path:
    return Path(build(str(tmp_path / "sys"), seed_host()))


# --- the seed host ----------------------------------------------------------


def test_seed_host_has_eight_gpus_in_pci_order(seed_root: Path) -> None:
    inv = scan(str(seed_root))
    assert [g.index for g in inv.gpus] == list(range(8))
    assert [g.pci_address for g in inv.gpus] == SEED_PCI


def test_seed_host_nodes_are_read_from_sysfs(seed_root: Path) -> None:
    inv = scan(str(seed_root))
    for i, gpu in enumerate(inv.gpus):
        assert gpu.card == DeviceNode(f"/dev/dri/card{i + 1}", "c", 226, i + 1)
        assert gpu.render == DeviceNode(f"/dev/dri/renderD{128 + i}", "c", 226, 128 + i)
        assert gpu.nodes == (gpu.card, gpu.render)


def test_seed_host_shares_kfd_read_from_sysfs(seed_root: Path) -> None:
    inv = scan(str(seed_root))
    assert inv.shared_nodes == {"amd": (DeviceNode("/dev/kfd", "c", 234, 0),)}
    assert inv.sysfs_root == str(seed_root)


def test_seed_host_pci_facts(seed_root: Path) -> None:
    inv = scan(str(seed_root))
    for i, gpu in enumerate(inv.gpus):
        assert gpu.vendor == "amd"
        assert gpu.vendor_id == "0x1002"
        assert gpu.device_id == "0x744c"
        assert gpu.driver == "amdgpu"
        assert gpu.numa_node == (0 if i < 4 else 1)
        assert gpu.model == "gfx1100"
        assert gpu.partition is None


def test_seed_host_kfd_facts(seed_root: Path) -> None:
    host = seed_host()
    inv = scan(str(seed_root))
    ids = [g.unique_id for g in inv.gpus]
    assert len(set(ids)) == 8
    assert ids == [g.unique_id for g in host.gpus]
    # the seed document's GPU 1
    assert inv.gpus[1].unique_id == 0x3149E0FAC5157ACF
    assert inv.gpus[1].unique_id_hex == "0x3149e0fac5157acf"
    assert [g.kfd_gpu_id for g in inv.gpus] == [50000 + 1111 * i for i in range(8)]
    for gpu in inv.gpus:
        bus = int(gpu.pci_address.split(":")[1], 16)
        assert gpu.location_id == bus << 8


def test_checked_in_example_scans_like_the_seed(seed_root: Path) -> None:
    fresh = scan(str(seed_root))
    example = scan(str(EXAMPLE_SYSFS))
    assert len(example.gpus) == 8
    for a, b in zip(fresh.gpus, example.gpus, strict=True):
        assert (a.index, a.pci_address, a.card, a.render, a.unique_id, a.kfd_gpu_id, a.numa_node) == (
            b.index, b.pci_address, b.card, b.render, b.unique_id, b.kfd_gpu_id, b.numa_node)
    assert example.shared_nodes == fresh.shared_nodes


# --- the shuffled host --------------------------------------------------------


def test_shuffled_host_index_follows_pci_address(tmp_path: Path) -> None:
    inv = scan(build(str(tmp_path / "sys"), shuffled_host()))
    assert [g.pci_address for g in inv.gpus] == ["0000:0a:00.0", "0000:1b:00.0", "0000:8c:00.0", "0000:c1:00.0"]
    # card/render numbers follow probe order, not PCI order
    assert [g.card.path for g in inv.gpus if g.card] == [
        "/dev/dri/card2", "/dev/dri/card4", "/dev/dri/card3", "/dev/dri/card1"]
    assert [g.render.minor for g in inv.gpus] == [129, 131, 130, 128]
    # unique ids were assigned by PCI position
    assert [g.unique_id for g in inv.gpus] == [0xABC0, 0xABC1, 0xABC2, 0xABC3]
    # KFD node n (gpu_id 1000+n) is the n-th probed GPU, matched by render minor
    assert [g.kfd_gpu_id for g in inv.gpus] == [1002, 1004, 1003, 1001]
    assert all(g.model == "gfx942" for g in inv.gpus)


def test_shuffled_host_bmc_vga_is_not_a_gpu(tmp_path: Path) -> None:
    inv = scan(build(str(tmp_path / "sys"), shuffled_host()))
    assert len(inv.gpus) == 4
    assert "0000:02:00.0" not in [g.pci_address for g in inv.gpus]
    assert all(g.card is None or g.card.path != "/dev/dri/card0" for g in inv.gpus)
    assert all(g.vendor == "amd" for g in inv.gpus)


def test_index_sorts_by_domain_then_bus_device_function(tmp_path: Path) -> None:
    pcis = ["0001:01:00.0", "0000:ff:00.0", "0000:10:01.0", "0000:10:00.1", "0000:10:00.0"]
    host = FakeHost(gpus=[FakeGpu(pci=p, card=i, render=128 + i) for i, p in enumerate(pcis)])
    inv = scan(build(str(tmp_path / "sys"), host))
    assert [g.pci_address for g in inv.gpus] == sorted(pcis, key=parse_pci_address)
    assert [g.pci_address for g in inv.gpus] == [
        "0000:10:00.0", "0000:10:00.1", "0000:10:01.0", "0000:ff:00.0", "0001:01:00.0"]


def test_gpu_without_card_node_is_still_a_gpu(tmp_path: Path) -> None:
    host = FakeHost(gpus=[FakeGpu(pci="0000:41:00.0", card=None, render=128)])
    inv = scan(build(str(tmp_path / "sys"), host))
    assert len(inv.gpus) == 1
    assert inv.gpus[0].card is None
    assert inv.gpus[0].nodes == (DeviceNode("/dev/dri/renderD128", "c", 226, 128),)


# --- hosts with nothing -------------------------------------------------------


def test_empty_directory_has_no_gpus(tmp_path: Path) -> None:
    inv = scan(str(tmp_path))
    assert inv.gpus == ()
    assert inv.shared_nodes == {}


def test_empty_class_drm_has_no_gpus(tmp_path: Path) -> None:
    (tmp_path / "class" / "drm").mkdir(parents=True)
    inv = scan(str(tmp_path))
    assert inv.gpus == ()
    assert inv.shared_nodes == {}


def test_missing_root_has_no_gpus(tmp_path: Path) -> None:
    inv = scan(str(tmp_path / "does-not-exist"))
    assert inv.gpus == ()


def test_unlistable_drm_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "drm").write_text("not a directory\n")
    with pytest.raises(HookError, match="drm"):
        scan(str(tmp_path))


def test_host_without_kfd(tmp_path: Path) -> None:
    host = seed_host()
    host.kfd = False
    inv = scan(build(str(tmp_path / "sys"), host))
    assert len(inv.gpus) == 8
    assert inv.shared_nodes == {}
    for gpu in inv.gpus:
        assert gpu.kfd_gpu_id is None
        assert gpu.unique_id is None
        assert gpu.location_id is None
        assert gpu.model == "pci 0x1002:0x744c"


def test_unknown_unique_id_zero_is_none(tmp_path: Path) -> None:
    host = FakeHost(gpus=[FakeGpu(pci="0000:41:00.0", card=1, render=128, unique_id=None)])
    inv = scan(build(str(tmp_path / "sys"), host))
    assert inv.gpus[0].unique_id is None
    assert inv.gpus[0].unique_id_hex is None


def test_negative_numa_node_is_none(tmp_path: Path) -> None:
    host = FakeHost(gpus=[FakeGpu(pci="0000:41:00.0", card=1, render=128, numa_node=-1)])
    inv = scan(build(str(tmp_path / "sys"), host))
    assert inv.gpus[0].numa_node is None


# --- device numbers come from sysfs -------------------------------------------


@pytest.mark.parametrize("content", ["garbage\n", "226\n", "226:\n", ":129\n", "a:b\n", "", "226:12x\n"])
def test_malformed_render_dev_file_names_the_file(tmp_path: Path, content: str) -> None:
    root = Path(build(str(tmp_path / "sys"), seed_host()))
    dev = root / "class" / "drm" / "renderD129" / "dev"
    dev.write_text(content)  # follows the class symlink into devices/
    with pytest.raises(HookError) as info:
        scan(str(root))
    message = str(info.value)
    assert str(dev) in message or os.path.realpath(dev) in message
    assert "MAJOR:MINOR" in message


def test_malformed_kfd_dev_file_names_the_file(tmp_path: Path) -> None:
    root = Path(build(str(tmp_path / "sys"), seed_host()))
    dev = root / "class" / "kfd" / "kfd" / "dev"
    dev.write_text("kfd\n")
    with pytest.raises(HookError) as info:
        scan(str(root))
    message = str(info.value)
    assert str(dev) in message or os.path.realpath(dev) in message


@pytest.mark.parametrize("major", [235, 509, 1])
def test_non_default_kfd_major_is_read(tmp_path: Path, major: int) -> None:
    host = seed_host()
    host.kfd_major = major
    inv = scan(build(str(tmp_path / "sys"), host))
    assert inv.shared_nodes["amd"] == (DeviceNode("/dev/kfd", "c", major, 0),)


def test_drm_numbers_are_read_not_computed(tmp_path: Path) -> None:
    root = Path(build(str(tmp_path / "sys"), seed_host()))
    (root / "class" / "drm" / "renderD129" / "dev").write_text("511:77\n")
    (root / "class" / "drm" / "card2" / "dev").write_text("510:3\n")
    inv = scan(str(root))
    assert inv.gpus[1].render == DeviceNode("/dev/dri/renderD129", "c", 511, 77)
    assert inv.gpus[1].card == DeviceNode("/dev/dri/card2", "c", 510, 3)


def test_connector_entries_are_ignored(tmp_path: Path) -> None:
    root = Path(build(str(tmp_path / "sys"), seed_host()))
    drm = root / "class" / "drm"
    assert (drm / "card1-DP-1").exists()
    # a connector that even carries an unreadable dev file must not be looked at
    connector = root / "devices" / "pci0000:23" / "0000:23:00.0" / "drm" / "card2" / "card2-HDMI-A-1"
    connector.mkdir()
    (connector / "dev").write_text("not a number\n")
    os.symlink(os.path.relpath(connector, drm), drm / "card2-HDMI-A-1")
    inv = scan(str(root))
    assert len(inv.gpus) == 8
    paths = [n.path for g in inv.gpus for n in g.nodes]
    assert all("-" not in os.path.basename(p) for p in paths)
    assert len(paths) == 16


# --- the checked-in example tree ----------------------------------------------


def _tree(root: Path) -> dict[str, tuple[str, str]]:
    """relative path -> ("link", target) or ("file", content) for every non-directory entry."""
    entries: dict[str, tuple[str, str]] = {}
    for directory, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(directory, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                entries[rel] = ("link", os.readlink(path))
            elif os.path.isfile(path):
                with open(path) as handle:
                    entries[rel] = ("file", handle.read())
    return entries


def test_checked_in_example_tree_is_a_fresh_build(tmp_path: Path) -> None:
    fresh = _tree(Path(build(str(tmp_path / "sys"), seed_host())))
    checked_in = _tree(EXAMPLE_SYSFS)
    assert sorted(checked_in) == sorted(fresh)
    for rel, value in fresh.items():
        assert checked_in[rel] == value, rel
    assert any(kind == "link" for kind, _ in fresh.values())
    assert len(fresh) > 100
