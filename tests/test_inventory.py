"""The sysfs inventory: which devices each backend claims, in which order, with which nodes and links."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from oci_gpu_hook.core.devices import Node
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.inventory import parse_pci_address, scan
from oci_gpu_hook.inventory.amd import gfx_name
from tests.helpers.fakesysfs import (
    EXAMPLE_DIRS,
    HOSTS,
    FakeGpu,
    FakeHost,
    build,
    intel_amd_host,
    mi300x_host,
    seed_host,
    shuffled_host,
)

REPO = Path(__file__).resolve().parent.parent
SEED_PCI = [f"0000:{bus}:00.0" for bus in ("03", "23", "43", "63", "83", "a3", "c3", "e3")]


@pytest.fixture
def seed_root(tmp_path: Path) -> Path:
    return Path(build(str(tmp_path / "sys"), seed_host()))


def _root(tmp_path: Path, host: FakeHost) -> str:
    return build(str(tmp_path / "sys"), host)


# --- the seed host ----------------------------------------------------------


def test_seed_host_has_eight_gpus_in_pci_order(seed_root: Path) -> None:
    inv = scan(str(seed_root))
    amd = inv.devices("amd")
    assert [g.index for g in amd] == list(range(8))
    assert [g.pci_address for g in amd] == SEED_PCI
    assert inv.devices("intel") == ()


def test_seed_host_nodes_links_and_kfd_are_read_from_sysfs(seed_root: Path) -> None:
    inv = scan(str(seed_root))
    for i, gpu in enumerate(inv.devices("amd")):
        assert gpu.card == Node(f"/dev/dri/card{i + 1}", "c", 226, i + 1)
        assert gpu.render == Node(f"/dev/dri/renderD{128 + i}", "c", 226, 128 + i)
        assert gpu.nodes == (gpu.card, gpu.render)
        assert gpu.links == ((f"/dev/dri/by-path/pci-{SEED_PCI[i]}-card", f"../card{i + 1}"),
                             (f"/dev/dri/by-path/pci-{SEED_PCI[i]}-render", f"../renderD{128 + i}"))
    assert inv.shared("amd") == (Node("/dev/kfd", "c", 234, 0),)
    assert inv.sysfs_root == str(seed_root)


def test_seed_host_facts(seed_root: Path) -> None:
    """The seed's GPUs are Radeon Pro W7900D: PCI 0x744b, gfx1100 (gfx_target_version 110000)."""
    inv = scan(str(seed_root))
    for i, gpu in enumerate(inv.devices("amd")):
        assert (gpu.kind, gpu.vendor_id, gpu.device_id, gpu.driver) == ("amd", "0x1002", "0x744b", "amdgpu")
        assert gpu.numa_node == (0 if i < 4 else 1)
        assert gpu.model == "gfx1100"
        assert gpu.partition is None and gpu.compute_mode is None
    assert inv.devices("amd")[1].unique_id_hex == "0x3149e0fac5157acf"
    assert inv.ignored == [("0000:c1:00.0", "ast, 0x1a03: no render node (a display-only device)")]


@pytest.mark.parametrize(("version", "name"), [(110000, "gfx1100"), (90402, "gfx942"), (90010, "gfx90a"),
                                               (90500, "gfx950"), (0, ""), (None, "")])
def test_gfx_name(version: int | None, name: str) -> None:
    assert gfx_name(version) == name


def test_shuffled_host_index_follows_pci_address_not_probe_order(tmp_path: Path) -> None:
    inv = scan(_root(tmp_path, shuffled_host()))
    amd = inv.devices("amd")
    assert [g.pci_address for g in amd] == ["0000:0a:00.0", "0000:1b:00.0", "0000:8c:00.0", "0000:c1:00.0"]
    assert [os.path.basename(g.render.path) for g in amd] == ["renderD129", "renderD131", "renderD130",
                                                               "renderD128"]


def test_index_sorts_by_domain_then_bus_device_function(tmp_path: Path) -> None:
    pcis = ["0001:00:00.0", "0000:ff:00.0", "0000:10:01.0", "0000:10:00.1"]
    host = FakeHost(gpus=[FakeGpu(pci=p, card=i, render=128 + i) for i, p in enumerate(pcis)])
    inv = scan(_root(tmp_path, host))
    assert [g.pci_address for g in inv.devices("amd")] == sorted(pcis, key=parse_pci_address)


def test_gpu_without_card_node_is_still_a_gpu(tmp_path: Path) -> None:
    inv = scan(_root(tmp_path, FakeHost(gpus=[FakeGpu(pci="0000:41:00.0", card=None, render=128)])))
    assert inv.devices("amd")[0].nodes == (Node("/dev/dri/renderD128", "c", 226, 128),)


def test_empty_hosts(tmp_path: Path) -> None:
    assert scan(str(tmp_path)).all_devices == ()
    (tmp_path / "class" / "drm").mkdir(parents=True)
    assert scan(str(tmp_path)).all_devices == ()


def test_missing_root_is_an_error_not_an_empty_host(tmp_path: Path) -> None:
    with pytest.raises(HookError, match="is not a directory"):
        scan(str(tmp_path / "nope"))


def test_amdgpu_without_kfd_is_no_compute_device(tmp_path: Path) -> None:
    host = seed_host()
    host.kfd = False
    inv = scan(_root(tmp_path, host))
    assert inv.devices("amd") == () and inv.shared("amd") == ()
    assert len([r for _n, r in inv.ignored if "KFD" in r]) == 8


def test_unique_id_zero_and_negative_numa_are_none(tmp_path: Path) -> None:
    host = FakeHost(gpus=[FakeGpu(pci="0000:41:00.0", card=1, render=128, unique_id=None, numa_node=-1)])
    gpu = scan(_root(tmp_path, host)).devices("amd")[0]
    assert gpu.unique_id is None and gpu.numa_node is None


# --- device numbers come from sysfs; a half-removed device ------------------------


@pytest.mark.parametrize("content", ["garbage\n", "226\n", "226:\n", ":129\n", "a:b\n", "", "226:12x\n", "²:1\n"])
def test_unreadable_dev_file_stops_the_per_container_scan(seed_root: Path, content: str) -> None:
    dev = seed_root / "class" / "drm" / "renderD129" / "dev"
    dev.write_text(content)  # follows the class symlink into devices/
    with pytest.raises(HookError) as info:
        scan(str(seed_root))
    assert "renderD129" in str(info.value) and "MAJOR:MINOR" in str(info.value)
    lenient = scan(str(seed_root), strict=False)  # operator commands: listed as ignored
    assert [g.pci_address for g in lenient.devices("amd")] == [p for p in SEED_PCI if p != "0000:23:00.0"]
    assert any(name == "0000:23:00.0" and "renderD129" in why for name, why in lenient.ignored)


def test_dangling_drm_link_is_never_a_crash(seed_root: Path) -> None:
    """A GPU half removed: /sys/class/drm/renderD129 points at a directory that is gone."""
    target = seed_root / "class" / "drm" / "renderD129"
    real = Path(os.path.realpath(target))
    for child in real.iterdir():
        child.unlink()
    real.rmdir()
    with pytest.raises(HookError, match="is gone"):
        scan(str(seed_root))
    assert len(scan(str(seed_root), strict=False).devices("amd")) == 7


@pytest.mark.parametrize("major", [235, 509, 1])
def test_non_default_kfd_major_is_read(tmp_path: Path, major: int) -> None:
    host = seed_host()
    host.kfd_major = major
    assert scan(_root(tmp_path, host)).shared("amd") == (Node("/dev/kfd", "c", major, 0),)


def test_drm_numbers_are_read_not_computed(seed_root: Path) -> None:
    (seed_root / "class" / "drm" / "card2" / "dev").write_text("510:3\n")
    gpu = scan(str(seed_root)).devices("amd")[1]
    assert gpu.card == Node("/dev/dri/card2", "c", 510, 3)


def test_connectors_and_control_links_are_not_nodes(seed_root: Path) -> None:
    drm = seed_root / "class" / "drm"
    assert (drm / "card1-DP-1").exists()
    assert any(p.name.startswith("controlD") for p in Path(os.path.realpath(drm / "card2")).parent.iterdir())
    connector = Path(os.path.realpath(drm / "card2")) / "card2-HDMI-A-1"
    connector.mkdir()
    (connector / "dev").write_text("not a number\n")
    os.symlink(os.path.relpath(connector, drm), drm / "card2-HDMI-A-1")
    inv = scan(str(seed_root))
    paths = [n.path for g in inv.devices("amd") for n in g.nodes]
    assert len(paths) == 16 and all("-" not in os.path.basename(p) for p in paths)


# --- several vendors --------------------------------------------------------------


def test_intel_igpu_probed_first_is_not_an_amd_gpu(tmp_path: Path) -> None:
    inv = scan(_root(tmp_path, intel_amd_host()))
    amd, intel = inv.devices("amd"), inv.devices("intel")
    assert [(g.index, g.pci_address, g.render.minor) for g in amd] == [(0, "0000:03:00.0", 129),
                                                                         (1, "0000:23:00.0", 130)]
    assert [(g.index, g.pci_address, g.render.minor, g.driver) for g in intel] == [
        (0, "0000:00:02.0", 128, "i915")]
    assert inv.shared("intel") == () and inv.shared("amd") == (Node("/dev/kfd", "c", 234, 0),)
    only_amd = scan(str(tmp_path / "sys"), ["amd"])
    assert list(only_amd.kinds) == ["amd"] and only_amd.devices("amd") == tuple(
        d for d in only_amd.devices("amd"))


def test_xe_and_i915(tmp_path: Path) -> None:
    inv = scan(_root(tmp_path, HOSTS["intel-xe"]()))
    assert [(g.index, g.driver, os.path.basename(g.card.path)) for g in inv.devices("intel")] == [
        (0, "i915", "card0"), (1, "xe", "card1")]
    assert inv.devices("amd") == ()


def test_other_vendors_and_drivers_are_ignored(tmp_path: Path) -> None:
    host = FakeHost(kfd=False, gpus=[
        FakeGpu(pci="0000:01:00.0", card=0, render=128, vendor="0x10de", device="0x2330", driver="nvidia"),
        FakeGpu(pci="0000:02:00.0", card=1, render=129, vendor="0x8086", device="0x56a0", driver="vfio-pci"),
        FakeGpu(pci="0000:03:00.0", card=2, render=130, vendor="0x1af4", device="0x1050", driver="virtio-pci"),
    ])
    inv = scan(_root(tmp_path, host), proc_root=str(tmp_path / "proc"))  # never the host's /proc/driver/nvidia
    assert inv.all_devices == ()
    assert [name for name, _why in inv.ignored] == ["0000:01:00.0", "0000:02:00.0", "0000:03:00.0"]
    assert inv.ignored[0][1].endswith(f"needs {tmp_path}/proc/driver/nvidia, missing under the proc root "
                                      f"{tmp_path}/proc (try --proc-root HOST/proc)")
    assert all("no backend claims it" in why for _name, why in inv.ignored[1:])


# --- compute partitions -------------------------------------------------------------


@pytest.mark.parametrize("sep", ["_", "."])
def test_cpx_gives_sixteen_partitions_in_toolkit_order(tmp_path: Path, sep: str) -> None:
    inv = scan(_root(tmp_path, mi300x_host("CPX", sep)))
    amd = inv.devices("amd")
    assert len(amd) == 16
    assert [(d.pci_address, d.partition) for d in amd] == [
        (f"0000:{bus}:00.0", p) for bus in ("05", "26") for p in range(8)]
    assert [d.render.minor for d in amd] == list(range(128, 144))
    assert amd[0].drm_name == "0000:05:00.0" and amd[1].drm_name == f"amdgpu_xcp{sep}0"
    assert amd[9].drm_name == f"amdgpu_xcp{sep}7"
    assert {(d.compute_mode, d.memory_mode, d.model, d.device_id) for d in amd} == {
        ("CPX", "NPS1", "gfx942", "0x74a1")}
    assert [d.numa_node for d in amd] == [0] * 8 + [1] * 8  # a partition has its GPU's NUMA node
    assert amd[3].links == ((f"/dev/dri/by-path/platform-amdgpu_xcp{sep}2-card", "../card4"),
                            (f"/dev/dri/by-path/platform-amdgpu_xcp{sep}2-render", "../renderD131"))
    assert amd[8].links[0] == ("/dev/dri/by-path/pci-0000:26:00.0-card", "../card9")
    assert len({d.unique_id for d in amd[:8]}) == 1 and amd[0].unique_id != amd[8].unique_id
    assert [name for name, _why in inv.ignored] == ["0000:02:00.0"]  # the BMC only


def test_dpx_counts_only_partitions_with_a_kfd_node(tmp_path: Path) -> None:
    inv = scan(_root(tmp_path, mi300x_host("DPX", ".")))
    amd = inv.devices("amd")
    assert [(d.pci_address, d.partition, d.render.minor) for d in amd] == [
        ("0000:05:00.0", 0, 128), ("0000:05:00.0", 1, 129), ("0000:26:00.0", 0, 136), ("0000:26:00.0", 1, 137)]
    invalid = sorted(why.split()[0] for _name, why in inv.ignored if "no KFD topology node" in why)
    assert invalid == sorted(f"renderD{m}" for m in [*range(130, 136), *range(138, 144)])


def test_partitions_are_grouped_by_kfd_location_not_unique_id(tmp_path: Path) -> None:
    """Some systems give partitions distinct unique ids: grouping must follow domain + location_id."""
    host = mi300x_host("QPX")
    root = _root(tmp_path, host)
    nodes = Path(root) / "devices" / "virtual" / "kfd" / "kfd" / "topology" / "nodes"
    for node in nodes.iterdir():
        props = (node / "properties").read_text()
        if "unique_id" in props and "drm_render_minor 0\n" not in props:
            minor = int(props.split("drm_render_minor ")[1].split()[0])
            (node / "properties").write_text(props.replace("unique_id ", f"unique_id {minor}0", 1))
    amd = scan(root).devices("amd")
    assert [(d.pci_address, d.partition) for d in amd] == [
        (f"0000:{bus}:00.0", p) for bus in ("05", "26") for p in range(4)]


def test_partition_without_its_pci_gpu_is_ignored(tmp_path: Path) -> None:
    root = Path(_root(tmp_path, mi300x_host("CPX")))
    (Path(os.path.realpath(root / "class" / "drm" / "card9")).parent.parent / "driver").unlink()  # GPU 1 unbound
    inv = scan(str(root), strict=False)
    assert [d.pci_address for d in inv.devices("amd")] == ["0000:05:00.0"] * 8
    assert sum("is no amdgpu PCI device here" in why for _n, why in inv.ignored) == 7


# --- the checked-in example trees -----------------------------------------------------


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


@pytest.mark.parametrize("name", sorted(EXAMPLE_DIRS))
def test_checked_in_example_trees_are_fresh_builds(tmp_path: Path, name: str) -> None:
    """Regenerate: rm -rf examples/hosts/DIR/sys && python -m tests.helpers.fakesysfs examples/hosts/DIR/sys NAME."""
    fresh = _tree(Path(build(str(tmp_path / "sys"), HOSTS[name]())))
    checked_in = _tree(REPO / "examples" / "hosts" / EXAMPLE_DIRS[name] / "sys")
    assert sorted(checked_in) == sorted(fresh)
    for rel, value in fresh.items():
        assert checked_in[rel] == value, rel


SYSFS_READ_CASES = {
    "plain": b"0x1002\n",
    "crlf": b"226:1\r\n",
    "lone-cr": b"a\rb\r",
    "inner-crlf": b"key 1\r\nother 2\r\n",
    "utf8": "n\u00e9e\n".encode(),
    "bom": b"\xef\xbb\xbfx\n",
    "invalid-utf8": b"\xff\xfe\n",
    "latin1": b"caf\xe9\n",
    "empty": b"",
    "blank": b"  \n\t\n",
    "large": b"x" * 70000 + b"\n",
    "nul": b"1\x002\n",
}

SYSFS_READ_PROBE = r"""
import json, os, sys
from oci_gpu_hook.inventory.sysfs import read
def text_read(path):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
folder = sys.argv[1]
paths = [os.path.join(folder, n) for n in sorted(os.listdir(folder))] + [folder, os.path.join(folder, "missing")]
print(json.dumps([[p, read(p), text_read(p)] for p in paths]))
"""


@pytest.mark.parametrize("env", [{}, {"LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"},
                                 {"PYTHONUTF8": "1"}], ids=["default", "ascii-locale", "utf8-mode"])
def test_sysfs_read_is_a_text_files_read(tmp_path, env):
    """sysfs.read reads with os.read (cheaper): it must give what open(path).read().strip() gives, for every file
    and under every locale the launcher may run in (newlines translated, the locale's encoding, strict)."""
    import json
    import subprocess
    import sys

    for name, data in SYSFS_READ_CASES.items():
        (tmp_path / name).write_bytes(data)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "PYTHON")) and k != "LANG"}
    out = subprocess.run([sys.executable, "-c", SYSFS_READ_PROBE, str(tmp_path)], capture_output=True, text=True,
                         env={**base, **env, "PYTHONPATH": str(REPO)}, check=True, timeout=60).stdout
    rows = json.loads(out)
    assert len(rows) == len(SYSFS_READ_CASES) + 2
    for path, fast, reference in rows:
        assert fast == reference, path
    decoded = {os.path.basename(p): fast for p, fast, _ in rows}
    assert decoded["crlf"] == "226:1" and decoded["inner-crlf"] == "key 1\nother 2"
    assert decoded["invalid-utf8"] is None and decoded["missing"] is None
