"""The NVIDIA backend without containers: inventory, request forms, driver capabilities, the driver's files,
the ld cache reader against the real ldconfig, in-rootfs resolution, the plan and spec rewrite, MIG UUIDs
through NVML (a fake libnvidia-ml built here), and the checked-in example trees."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from oci_gpu_hook.appliers import mounts
from oci_gpu_hook.appliers.ocispec import apply as apply_edits
from oci_gpu_hook.config import Config
from oci_gpu_hook.core.devices import Node
from oci_gpu_hook.core.edits import Edits, Mount
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.inventory import Inventory, elf, ldcache, nvdriver, nvidia, nvml, scan
from oci_gpu_hook.oci_spec import ContainerSpec
from oci_gpu_hook.plan import build_plan, plan_for_spec
from oci_gpu_hook.request import requested, resolve, select
from tests.conftest import unavailable
from tests.helpers import fakenvidia
from tests.helpers.fakenvidia import build_driver, build_fake_nvml, build_proc, elf_shared_object, ld_cache, mig_minor
from tests.helpers.fakesysfs import EXAMPLE_DIRS, HOSTS, FakeGpu, FakeHost, build, build_all

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "hosts"
NVIDIA_HOSTS = ("nvidia-h100", "nvidia-mig", "amd-nvidia")


def roots(name: str) -> Path:
    return EXAMPLES / EXAMPLE_DIRS[name]


def inventory(name: str) -> Inventory:
    base = roots(name)
    return scan(str(base / "sys"), proc_root=str(base / "proc"), driver_root=str(base / "driver"))


def config(name: str, **values: Any) -> Config:
    base = roots(name)
    return Config(**{"sysfs_root": str(base / "sys"), "proc_root": str(base / "proc"),
                     "driver_root": str(base / "driver"), "hook_path": "/bin/sh", **values})


def fake(tmp_path: Path, host: FakeHost) -> tuple[Inventory, Path]:
    build_all(str(tmp_path / "sys"), host)
    inv = scan(str(tmp_path / "sys"), proc_root=str(tmp_path / "proc"), driver_root=str(tmp_path / "driver"))
    return inv, tmp_path


# --- inventory ------------------------------------------------------------------------------------


def test_h100_host_gpus_in_pci_order_with_their_own_minors() -> None:
    inv = inventory("nvidia-h100")
    gpus = inv.devices("nvidia")
    assert [g.pci_address for g in gpus] == ["0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:c1:00.0"]
    assert [g.minor for g in gpus] == [2, 0, 3, 1]  # minor != index
    assert [g.nodes for g in gpus] == [(Node(f"/dev/nvidia{m}", "c", 195, m),) for m in (2, 0, 3, 1)]
    host = {g.pci: g for g in HOSTS["nvidia-h100"]().nvidia}
    assert [g.uuid for g in gpus] == [host[g.pci_address].uuid for g in gpus]
    assert all(g.display_nodes == () and g.links == () and g.mig is None for g in gpus)  # no nvidia-drm
    assert gpus[0].model == "NVIDIA H100 80GB HBM3" and gpus[0].device_id == "0x2330" and gpus[3].numa_node == 1
    assert inv.shared("nvidia") == (Node("/dev/nvidiactl", "c", 195, 255), Node("/dev/nvidia-uvm", "c", 510, 0),
                                    Node("/dev/nvidia-uvm-tools", "c", 510, 1))
    assert [name for name, why in inv.ignored if "NVSwitch" in why] == [f"0000:0{n}:00.0" for n in (5, 6, 7, 8)]


def test_mig_host_devices_nodes_and_drm() -> None:
    inv = inventory("nvidia-mig")
    devices = inv.devices("nvidia")
    assert [d.label for d in devices] == ["0", "1", "0:0", "0:1", "0:2", "0:3"]
    gpu0, gpu1 = devices[:2]
    assert (gpu0.pci_address, gpu0.minor, gpu1.pci_address, gpu1.minor) == ("0000:3b:00.0", 1, "0000:86:00.0", 0)
    assert [n.path for n in gpu0.display_nodes] == ["/dev/dri/card2", "/dev/dri/renderD129"]
    assert gpu0.links == (("/dev/dri/by-path/pci-0000:3b:00.0-card", "../card2"),
                          ("/dev/dri/by-path/pci-0000:3b:00.0-render", "../renderD129"))
    migs = devices[2:]
    assert [d.mig for d in migs] == [(1, 0), (2, 0), (5, 0), (5, 1)]
    assert all(d.parent == 0 and d.uuid is None for d in migs)  # no NVML in the example: no MIG UUIDs
    for device in migs:
        assert device.mig is not None
        gi, ci = device.mig
        assert device.nodes == (Node("/dev/nvidia1", "c", 195, 1),
                                Node(f"/dev/nvidia-caps/nvidia-cap{mig_minor(1, gi)}", "c", 236, mig_minor(1, gi)),
                                Node(f"/dev/nvidia-caps/nvidia-cap{mig_minor(1, gi, ci)}", "c", 236,
                                     mig_minor(1, gi, ci)))
    assert [n.minor for n in migs[0].nodes] == [1, 147, 148]  # gpu1/gi1/access, gpu1/gi1/ci0/access
    assert not any("card" in name or "render" in name for name, _why in inv.ignored)  # nvidia-drm's nodes: claimed


def test_mixed_host_each_vendor_claims_its_own_drm_devices() -> None:
    inv = inventory("amd-nvidia")
    assert [(d.pci_address, d.render.minor if d.render else None) for d in inv.devices("amd")] == [
        ("0000:03:00.0", 128), ("0000:41:00.0", 130)]
    assert [(d.pci_address, d.minor, d.render.minor if d.render else None) for d in inv.devices("nvidia")] == [
        ("0000:21:00.0", 1, 129), ("0000:61:00.0", 0, 131)]
    assert inv.ignored == []
    assert inv.shared("amd") == (Node("/dev/kfd", "c", 234, 0),)


def test_no_nvidia_driver_means_no_nvidia_devices(tmp_path: Path) -> None:
    root = build(str(tmp_path / "sys"), HOSTS["nvidia-h100"]())
    inv = scan(root, proc_root=str(tmp_path / "no-proc"))
    assert inv.devices("nvidia") == () and inv.shared("nvidia") == ()


def test_nvidia_gpus_read_without_their_proc_root_say_what_to_try() -> None:
    host = EXAMPLES / "amd-nvidia-2x2"
    inv = scan(str(host / "sys"), proc_root=str(host / "sys"))  # any tree without driver/nvidia
    missing = (f"nvidia, 0x10de: the nvidia backend needs {host / 'sys'}/driver/nvidia, missing under the proc "
               f"root {host / 'sys'} (try --proc-root HOST/proc)")
    assert inv.ignored == [("0000:21:00.0", missing), ("0000:61:00.0", missing)]
    amd_only = scan(str(host / "sys"), ["amd"], proc_root=str(host / "sys"))  # no nvidia backend: no such hint
    assert {why for _, why in amd_only.ignored} == {"nvidia, 0x10de: not of the kinds scanned"}


def test_nvidia_gpus_without_drm_nodes_read_without_their_proc_root_say_what_to_try_too() -> None:
    """A host without nvidia-drm (no DRM nodes: the GPUs are only PCI devices bound to nvidia): ``list`` names each
    with the hint rather than "(no GPUs ...)" alone; the per-container scan (strict) adds nothing."""
    host = EXAMPLES / "nvidia-4x-h100"
    wrong, right = str(host / "sys"), str(host / "proc")
    inv = scan(wrong, proc_root=wrong, strict=False)
    missing = (f"nvidia, 0x10de: the nvidia backend needs {wrong}/driver/nvidia, missing under the proc root {wrong} "
               "(try --proc-root HOST/proc)")
    nvidia = sorted(p.name for p in (host / "sys" / "bus" / "pci" / "devices").iterdir()
                    if (p / "driver").is_symlink() and os.readlink(p / "driver").endswith("/nvidia"))
    assert len(nvidia) == 4
    assert [entry for entry in inv.ignored if entry[1] == missing] == [(name, missing) for name in nvidia]
    assert not [why for _, why in scan(wrong, proc_root=right, strict=False).ignored if "try --proc-root" in why]
    assert not [why for _, why in scan(wrong, proc_root=wrong).ignored if "try --proc-root" in why]  # strict
    assert not [why for _, why in scan(wrong, ["amd"], proc_root=wrong, strict=False).ignored
                if "try --proc-root" in why]


def test_older_driver_frontend_name_and_dynamic_majors(tmp_path: Path) -> None:
    host = HOSTS["nvidia-h100"]()
    host.frontend_name, host.uvm_major = "nvidia-frontend", 499
    inv, _ = fake(tmp_path, host)
    assert [n.number for n in inv.shared("nvidia")] == [("c", 195, 255), ("c", 499, 0), ("c", 499, 1)]


def test_excluded_gpu_and_a_gpu_bound_elsewhere_are_ignored(tmp_path: Path) -> None:
    host = HOSTS["nvidia-h100"]()
    host.nvidia[0].excluded = True  # PCI c1 (index 3 otherwise)
    inv, base = fake(tmp_path, host)
    assert [g.pci_address for g in inv.devices("nvidia")] == ["0000:1b:00.0", "0000:43:00.0", "0000:52:00.0"]
    assert ("0000:c1:00.0", "excluded by the driver (GPU Excluded: Yes)") in inv.ignored
    link = base / "sys" / "devices" / "pci0000:43" / "0000:43:00.0" / "driver"
    link.unlink()
    link.symlink_to("../../../bus/pci/drivers/vfio-pci")
    inv = scan(str(base / "sys"), proc_root=str(base / "proc"))
    assert ("0000:43:00.0", "bound to vfio-pci, not nvidia") in inv.ignored


def test_mig_instance_whose_minor_disagrees_or_is_missing_is_ignored(tmp_path: Path) -> None:
    inv, base = fake(tmp_path, HOSTS["nvidia-mig"]())
    access = base / "proc" / "driver" / "nvidia" / "capabilities" / "gpu1" / "mig" / "gi2" / "ci0" / "access"
    access.write_text("DeviceFileMinor: 9\nDeviceFileMode: 292\n")
    with pytest.raises(HookError, match=r"says DeviceFileMinor 9, mig-minors says 157; refusing to number nvidia GPUs "
                                        "while a device is half there"):
        scan(str(base / "sys"), proc_root=str(base / "proc"))  # the per-container scan: skipping would renumber
    inv = scan(str(base / "sys"), proc_root=str(base / "proc"), strict=False)
    assert [d.mig for d in inv.devices("nvidia") if d.mig] == [(1, 0), (5, 0), (5, 1)]
    assert any(name == "0000:3b:00.0 MIG gi2/ci0" and why.startswith("/") and "DeviceFileMinor 9" in why
               for name, why in inv.ignored)
    devices = base / "proc" / "devices"
    devices.write_text(devices.read_text().replace("236 nvidia-caps\n", ""))
    inv = scan(str(base / "sys"), proc_root=str(base / "proc"))  # no caps major: no MIG device at all, no renumbering
    assert [d.label for d in inv.devices("nvidia")] == ["0", "1"]
    assert sum("no 'nvidia-caps' character major" in why for _n, why in inv.ignored) == 4


def test_a_gpu_half_there_stops_the_per_container_scan(tmp_path: Path) -> None:
    inv, base = fake(tmp_path, HOSTS["nvidia-h100"]())
    (base / "proc" / "driver" / "nvidia" / "gpus" / "0000:43:00.0" / "information").unlink()
    with pytest.raises(HookError, match=r"cannot read .*/0000:43:00\.0/information; refusing to number nvidia GPUs"):
        scan(str(base / "sys"), proc_root=str(base / "proc"))
    inv = scan(str(base / "sys"), proc_root=str(base / "proc"), strict=False)
    assert [g.pci_address for g in inv.devices("nvidia")] == ["0000:1b:00.0", "0000:52:00.0", "0000:c1:00.0"]
    assert any(name == "0000:43:00.0" and why.startswith("cannot read") for name, why in inv.ignored)


def test_drm_nodes_need_nvidia_drm(tmp_path: Path) -> None:
    host = HOSTS["nvidia-mig"]()
    host.nvidia_drm = False  # the nodes are there (a fixture's leftovers), the module is not: not given
    inv, _ = fake(tmp_path, host)
    assert all(d.display_nodes == () for d in inv.devices("nvidia"))
    assert [name for name, _ in inv.ignored] == ["0000:02:00.0"]  # the GPUs are devices, without those nodes


# --- requests --------------------------------------------------------------------------------------


def labels(value: str, name: str = "nvidia-mig") -> list[str]:
    return [d.label for d in select("nvidia", value, inventory(name).devices("nvidia"), "NVIDIA_VISIBLE_DEVICES")]


@pytest.mark.parametrize(("value", "wanted"), [
    ("0", ["0"]), ("1,0", ["0", "1"]), ("0-1", ["0", "1"]), ("all", ["0", "1", "0:0", "0:1", "0:2", "0:3"]),
    ("0:3", ["0:3"]), ("0:0, 0:2", ["0:0", "0:2"]), ("0000:86:00.0", ["1"]), ("86:00.0", ["1"]),
    ("00000000:3B:00.0", ["0"]), ("none", []), ("void", []), ("", []), ("1,1", ["1"]),
])
def test_request_forms(value: str, wanted: list[str]) -> None:
    assert labels(value) == wanted


def test_uuid_requests_are_case_insensitive() -> None:
    gpus = inventory("nvidia-h100").devices("nvidia")
    assert labels(gpus[2].uuid.lower(), "nvidia-h100") == ["2"]  # type: ignore[union-attr]
    assert labels(f"{gpus[3].uuid.upper().replace('GPU-', 'gpu-')},0", "nvidia-h100") == ["0", "3"]  # type: ignore[union-attr]


@pytest.mark.parametrize(("value", "why"), [
    ("2", "'2' is out of range (the host has 2 nvidia GPUs)"),
    ("0:4", "'0:4' is out of range (GPU 0 has 4 MIG devices)"),
    ("1:0", "names MIG device 0 of GPU 1, which has no MIG devices"),
    ("5:0", "names GPU '5', which is out of range (the host has 2 nvidia GPUs)"),
    ("0:x", "is not a MIG device"),
    ("GPU-0000", "is not the UUID of an NVIDIA GPU on this host"),
    ("GPU-", "is not a valid UUID"),
    ("0000:99:00.0", "is not the PCI address of an NVIDIA GPU on this host"),
    ("zz:00.0", "is not a valid PCI address"),
    ("1-0", "is a range that runs backwards"),
    ("0-", "is not a valid range"),
    ("0-7", "is a range whose end '7' is out of range"),
    ("gpu0", "is not a GPU index, range, GPU UUID (GPU-...), PCI address, MIG device (GPU:MIG or MIG-...)"),
    ("all,0", "'all' cannot be combined"),
    ("MIG-f00", "cannot be looked up: MIG UUIDs are known only to NVML"),
])
def test_bad_requests_say_what_is_valid(value: str, why: str) -> None:
    with pytest.raises(HookError) as info:
        labels(value)
    text = str(info.value)
    assert why in text and "valid: all, none, indices 0-1, ranges like 0-1, GPU UUIDs like GPU-" in text, text
    assert "MIG devices like 0:0" in text and "\n" not in text


def test_no_nvidia_gpus_all_grants_nothing_and_a_name_is_refused() -> None:
    assert select("nvidia", "all", (), "NVIDIA_VISIBLE_DEVICES") == ()
    with pytest.raises(HookError, match="'1' is out of range: this host has no nvidia GPUs"):
        select("nvidia", "1", (), "NVIDIA_VISIBLE_DEVICES")


def test_env_and_annotations_select_the_kind() -> None:
    cfg = config("nvidia-h100")
    asks = requested(["NVIDIA_VISIBLE_DEVICES=1", "AMD_VISIBLE_DEVICES=void"], {}, cfg)
    assert [(a.kind, a.values) for a in asks] == [("nvidia", ["1"])]
    asks = requested(["NVIDIA_VISIBLE_DEVICES=1"], {"cdi.k8s.io/x": "nvidia.com/gpu=3"}, cfg)
    assert [(a.kind, a.values, a.note) for a in asks] == [
        ("nvidia", ["3"], "NVIDIA_VISIBLE_DEVICES=1 ignored: annotations decide")]
    assert requested([], {}, cfg) == []  # unset: nothing (the legacy CUDA-image rule is not followed)


@pytest.mark.parametrize(("value", "caps"), [
    (None, {"utility", "compute"}), ("", {"utility", "compute"}), ("compute", {"compute"}),
    ("all", {"compute", "utility", "graphics", "video", "display", "ngx"}), (" Video , utility", {"video", "utility"}),
    ("compute,all", {"compute", "utility", "graphics", "video", "display", "ngx"}),
])
def test_driver_capabilities(value: str | None, caps: set[str]) -> None:
    assert nvidia.capabilities(value) == caps


@pytest.mark.parametrize(("value", "why"), [("compute,gpu", "'gpu' is not a driver capability"),
                                            ("compat32", "'compat32' (32-bit driver libraries) is not served")])
def test_bad_driver_capabilities(value: str, why: str) -> None:
    with pytest.raises(HookError) as info:
        nvidia.capabilities(value)
    assert why in str(info.value) and "(valid: all, compute, utility, graphics, video, display, ngx)" in str(info.value)


# --- the driver's files ----------------------------------------------------------------------------


def driver_files(name: str, caps: set[str]) -> Edits:
    base = roots(name)
    return nvdriver.driver_files(str(base / "proc"), str(base / "driver"), frozenset(caps))


def test_compute_and_utility_files() -> None:
    files = driver_files("nvidia-h100", {"compute", "utility"})
    base = roots("nvidia-h100") / "driver"
    by_dest = {m.destination: m.source for m in files.mounts}
    lib = "/usr/lib/x86_64-linux-gnu"
    assert by_dest[f"{lib}/libcuda.so.550.54.15"] == f"{base}{lib}/libcuda.so.550.54.15"  # /lib resolved in root
    assert by_dest["/usr/bin/nvidia-smi"] == f"{base}/usr/bin/nvidia-smi"
    assert by_dest["/lib/firmware/nvidia/550.54.15"] == f"{base}/usr/lib/firmware/nvidia/550.54.15"
    assert f"{lib}/libnvidia-ml.so.550.54.15" in by_dest and "/usr/bin/nvidia-cuda-mps-control" in by_dest
    assert not any("GLX" in d or "nvcuvid" in d or "ngx" in d for d in by_dest)  # graphics, video, ngx: not asked
    assert not any("i386" in s or "470.223.02" in s for s in by_dest.values())  # 32-bit and leftovers: never
    links = dict(files.symlinks)
    assert links[f"{lib}/libcuda.so.1"] == "libcuda.so.550.54.15" and links[f"{lib}/libcuda.so"] == "libcuda.so.1"
    assert links[f"{lib}/libnvidia-ml.so.1"] == "libnvidia-ml.so.550.54.15"
    assert links[f"{lib}/libnvidia-ml.so"] == "libnvidia-ml.so.1"  # the .so link of every library
    # the host's libnvidia-opencl.so.1 still points at a leftover: the container's follows the file's own DT_SONAME
    assert links[f"{lib}/libnvidia-opencl.so.1"] == "libnvidia-opencl.so.550.54.15"
    assert by_dest["/etc/OpenCL/vendors/nvidia.icd"] == f"{base}/etc/OpenCL/vendors/nvidia.icd"
    assert files.ldcache == (lib,)
    assert all(Path(m.source).exists() for m in files.mounts)


def test_files_per_capability() -> None:
    utility = {m.destination.rsplit("/", 1)[1] for m in driver_files("nvidia-h100", {"utility"}).mounts}
    assert "libnvidia-ml.so.550.54.15" in utility and "nvidia-smi" in utility and "libcuda.so.550.54.15" not in utility
    graphics = {m.destination.rsplit("/", 1)[1] for m in driver_files("nvidia-h100", {"graphics"}).mounts}
    assert {"libGLX_nvidia.so.550.54.15", "libEGL_nvidia.so.550.54.15", "libnvidia-glcore.so.550.54.15"} <= graphics
    assert graphics.isdisjoint({"nvidia-smi", "libnvidia-ml.so.550.54.15"})
    video = {m.destination.rsplit("/", 1)[1] for m in driver_files("nvidia-h100", {"video"}).mounts}
    assert "libnvcuvid.so.550.54.15" in video and "libnvidia-encode.so.550.54.15" in video
    assert {m.destination for m in driver_files("nvidia-h100", {"display"}).mounts} == {
        "/lib/firmware/nvidia/550.54.15"}
    assert "libvdpau_nvidia.so.550.54.15" in video  # from libcuda's directory's vdpau/


def layout_host(tmp_path: Path, layout: str) -> tuple[Path, Path, Path]:
    """(proc, driver root, sysfs) of the 4 x H100 host with its driver in ``layout``; the GPU operator's is the
    distribution layout under a driver root of its own."""
    host = HOSTS["nvidia-h100"]()
    driver = tmp_path / ("run/nvidia/driver" if layout == "operator" else "driver")
    build_proc(str(tmp_path / "proc"), host)
    build_driver(str(driver), host, "distro" if layout == "operator" else layout)
    sysfs = Path(build(str(tmp_path / "sys"), host))
    if layout == "gke":  # the kernel is told where the prefix keeps its firmware (firmware_class.path)
        (sysfs / "module" / "firmware_class" / "parameters").mkdir(parents=True, exist_ok=True)
        (sysfs / "module" / "firmware_class" / "parameters" / "path").write_text("/usr/local/nvidia/firmware\n")
    return tmp_path / "proc", driver, sysfs


ALL = frozenset(nvidia.CAPABILITIES)


@pytest.mark.parametrize("layout", ["distro", "runfile", "gke", "operator"])
def test_every_layout_gives_elf_binaries_config_files_and_firmware(tmp_path: Path, layout: str) -> None:
    """Distribution packages, NVIDIA's .run installer, a GKE-style prefix with wrapper scripts in /usr/bin, the GPU
    operator's driver root: what each loader reads is where it reads it, binaries are ELF files on every PATH."""
    proc, driver, sysfs = layout_host(tmp_path, layout)
    found = nvdriver.survey(str(proc), str(driver), ALL, str(sysfs))
    lib_dir, _cache, bin_dir, share, vulkan, firmware, wrappers = fakenvidia.LAYOUTS[
        "distro" if layout == "operator" else layout]
    by_dest = {m.destination: m.source for m in found.edits.mounts}
    v = found.version
    for name in fakenvidia.BINARIES:
        assert elf.inspect(by_dest[f"/usr/bin/{name}"])[0] == elf.NATIVE, name  # never the wrapper script
        assert by_dest[f"/usr/bin/{name}"] == f"{driver}{bin_dir}/{name}"
        if bin_dir != "/usr/bin":  # also where a CUDA image's PATH looks first
            assert by_dest[f"{bin_dir}/{name}"] == f"{driver}{bin_dir}/{name}"
    libraries = {d for d in by_dest if d.endswith(f".so.{v}")}
    assert {os.path.basename(d) for d in libraries} == {f"{lib}.{v}" for lib in fakenvidia.LIBRARIES}
    assert all(os.path.dirname(d) in (lib_dir, f"{lib_dir}/vdpau") for d in libraries)
    assert set(found.edits.ldcache) >= {lib_dir}
    egl = "glvnd/egl_vendor.d/10_nvidia.json"
    assert by_dest[f"/usr/share/{egl}"] == f"{driver}{share}/{egl}"
    assert by_dest["/etc/vulkan/icd.d/nvidia_icd.json"] == f"{driver}{vulkan}/vulkan/icd.d/nvidia_icd.json"
    assert by_dest["/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json"].startswith(f"{driver}{share}/")
    assert by_dest["/usr/share/nvidia/nvoptix.bin"] == f"{driver}{share}/nvidia/nvoptix.bin"
    assert by_dest["/etc/OpenCL/vendors/nvidia.icd"] == f"{driver}/etc/OpenCL/vendors/nvidia.icd"
    assert by_dest[f"{lib_dir}/libnvidia-egl-gbm.so.1.1.2"].endswith("libnvidia-egl-gbm.so.1.1.2")
    fw = "/usr/local/nvidia/firmware" if layout == "gke" else "/lib/firmware"
    assert by_dest[f"{fw}/nvidia/{v}"] == f"{driver}{firmware}/nvidia/{v}"
    links = dict(found.edits.symlinks)
    assert links[f"{lib_dir}/libGLX_indirect.so.0"] == f"libGLX_nvidia.so.{v}"
    assert links[f"{lib_dir}/gbm/nvidia-drm_gbm.so"] == "../libnvidia-allocator.so.1"
    assert links[f"{lib_dir}/libnvidia-egl-gbm.so.1"] == "libnvidia-egl-gbm.so.1.1.2"
    assert found.skipped == []  # a wrapper script on the way would be said; the installation's own bin comes first
    if wrappers:
        assert (driver / "usr/bin/nvidia-smi").read_bytes().startswith(b"#!/bin/sh")


def test_a_wrapper_script_met_first_is_skipped_with_why(tmp_path: Path) -> None:
    """The installation's own bin (/usr/bin, beside /usr/lib/x86_64-linux-gnu) holds scripts: each is said and
    passed over; the ELF further down the search is given, on every PATH and at its own place."""
    proc, driver, sysfs = layout_host(tmp_path, "distro")
    (driver / "usr/local/bin").mkdir(parents=True)
    (driver / "usr/bin/nvidia-smi").rename(driver / "usr/local/bin/nvidia-smi")
    (driver / "usr/bin/nvidia-smi").write_text("#!/bin/sh\nexec /usr/local/bin/nvidia-smi \"$@\"\n")
    (driver / "usr/bin/nvidia-smi").chmod(0o755)
    (driver / "usr/bin/nvidia-debugdump").write_text("#!/bin/sh\nexec /opt/nvidia/nvidia-debugdump\n")
    found = nvdriver.survey(str(proc), str(driver), frozenset({"utility"}), str(sysfs))
    by_dest = {m.destination: m.source for m in found.edits.mounts}
    assert by_dest["/usr/bin/nvidia-smi"] == by_dest["/usr/local/bin/nvidia-smi"] == (
        f"{driver}/usr/local/bin/nvidia-smi")
    assert "/usr/bin/nvidia-debugdump" not in by_dest
    script = "a script (#!), not the driver's program; not given"
    assert found.skipped == [f"{driver}/usr/bin/nvidia-smi: {script}", f"{driver}/usr/bin/nvidia-debugdump: {script}"]


def test_the_library_set_follows_the_version_suffix(tmp_path: Path) -> None:
    """A library the lists do not name is given anyway (with any capability but display); a 32-bit one beside the
    others is said and left out; another version's file never counts."""
    proc, driver, sysfs = layout_host(tmp_path, "distro")
    lib = driver / "usr/lib/x86_64-linux-gnu"
    (lib / "libnvidia-future.so.550.54.15").write_bytes(elf_shared_object("libnvidia-future.so.1"))
    (lib / "libnvidia-thirtytwo.so.550.54.15").write_bytes(elf_shared_object("x", machine=3, elf64=False))
    (lib / "libnvidia-future.so.560.35.03").write_bytes(elf_shared_object("libnvidia-future.so.1"))
    for caps in ({"compute"}, {"video"}):
        found = nvdriver.survey(str(proc), str(driver), frozenset(caps), str(sysfs))
        dests = {m.destination for m in found.edits.mounts}
        assert "/usr/lib/x86_64-linux-gnu/libnvidia-future.so.550.54.15" in dests
        assert dict(found.edits.symlinks)["/usr/lib/x86_64-linux-gnu/libnvidia-future.so.1"] == (
            "libnvidia-future.so.550.54.15")
        assert not any("560.35.03" in d or "thirtytwo" in d for d in dests)
        assert found.skipped == [f"{lib}/libnvidia-thirtytwo.so.550.54.15: an ELF file of another architecture or "
                                 "class; not given"]
    display = nvdriver.survey(str(proc), str(driver), frozenset({"display"}), str(sysfs))
    assert not any("future" in m.destination for m in display.edits.mounts)


def test_a_library_without_a_soname_gets_the_ld_caches(tmp_path: Path) -> None:
    """A library whose file names no DT_SONAME (a build without -soname) is linked by the name the host's ld cache
    knows it by."""
    proc, driver, sysfs = layout_host(tmp_path, "distro")
    lib = driver / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15"
    data = bytearray(lib.read_bytes())
    data[data.index(b"\x0e\x00\x00\x00\x00\x00\x00\x00")] = 0x0f  # DT_SONAME -> DT_RPATH: the file says none
    lib.write_bytes(bytes(data))
    assert elf.inspect(str(lib), want_soname=True) == (elf.NATIVE, None)
    found = nvdriver.survey(str(proc), str(driver), frozenset({"utility"}), str(sysfs))
    assert dict(found.edits.symlinks)["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"] == "libnvidia-ml.so.550.54.15"


def test_firmware_in_the_kernels_search_order(tmp_path: Path) -> None:
    proc, driver, sysfs = layout_host(tmp_path, "distro")
    updates = driver / f"usr/lib/firmware/updates/{fakenvidia.KERNEL_RELEASE}/nvidia/550.54.15"
    updates.mkdir(parents=True)
    found = nvdriver.survey(str(proc), str(driver), frozenset({"display"}), str(sysfs))
    assert [m.destination for m in found.edits.mounts] == [
        f"/lib/firmware/updates/{fakenvidia.KERNEL_RELEASE}/nvidia/550.54.15"]


def test_bad_driver_files_are_one_line_each_and_the_rest_is_given(tmp_path: Path) -> None:
    """A json naming a library the container will not have, a binary that is a symlink out of the driver root:
    each said in one line and left out; a driver root that is not a directory: one error."""
    proc, driver, sysfs = layout_host(tmp_path, "operator")
    icd = driver / "usr/share/vulkan/icd.d/nvidia_icd.json"
    icd.write_text('{"file_format_version": "1.0.1", "ICD": {"library_path": "libGLX_nvidia.so.9"}}')
    (driver / "usr/bin/nvidia-debugdump").unlink()
    outside = tmp_path / "outside-debugdump"
    outside.write_bytes((driver / "usr/bin/nvidia-smi").read_bytes())
    outside.chmod(0o755)
    (driver / "usr/bin/nvidia-debugdump").symlink_to(os.path.relpath(outside, driver / "usr/bin"))
    found = nvdriver.survey(str(proc), str(driver), ALL, str(sysfs))
    dests = {m.destination for m in found.edits.mounts}
    assert "/etc/vulkan/icd.d/nvidia_icd.json" not in dests and "/usr/bin/nvidia-debugdump" not in dests
    assert "/usr/share/glvnd/egl_vendor.d/10_nvidia.json" in dests and "/usr/bin/nvidia-smi" in dests
    assert f"{icd}: names libGLX_nvidia.so.9, which the container will not have; not given" in found.skipped
    assert any(line.startswith(f"{driver}/usr/bin/nvidia-debugdump: a symlink out of driver_root {driver}")
               for line in found.skipped), found.skipped
    assert len(found.skipped) == 2
    (tmp_path / "driver-link").symlink_to(driver)  # a driver root that is itself a symlink: nothing more escapes
    linked = nvdriver.survey(str(proc), str(tmp_path / "driver-link"), ALL, str(sysfs))
    assert len(linked.skipped) == 2 and len(linked.edits.mounts) == len(found.edits.mounts)
    (tmp_path / "file").write_text("")
    for bad in (tmp_path / "file", tmp_path / "missing"):
        with pytest.raises(HookError, match=f"^driver_root {bad} is not a directory"):
            nvdriver.survey(str(proc), str(bad), ALL, str(sysfs))


def test_a_container_start_says_each_file_left_out_in_one_line(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    proc, driver, sysfs = layout_host(tmp_path, "distro")
    icd = driver / "usr/share/vulkan/icd.d/nvidia_icd.json"
    icd.write_text('{"ICD": {"library_path": "/opt/elsewhere/libGLX_nvidia.so.0"}}')
    inv = scan(str(sysfs), proc_root=str(proc), driver_root=str(driver))
    cfg = Config(sysfs_root=str(sysfs), proc_root=str(proc), driver_root=str(driver), hook_path="/bin/sh")
    edits = nvidia.kind_edits(inv, ALL, cfg)
    assert "/usr/share/glvnd/egl_vendor.d/10_nvidia.json" in {m.destination for m in edits.mounts}
    assert "/etc/vulkan/icd.d/nvidia_icd.json" not in {m.destination for m in edits.mounts}
    assert capsys.readouterr().err == (f"oci-gpu-hook: warning: nvidia driver file left out: {icd}: names "
                                       "/opt/elsewhere/libGLX_nvidia.so.0, which the container will not have; not "
                                       "given\n")


def test_elf_reader_on_the_fake_driver_files(tmp_path: Path) -> None:
    lib = tmp_path / "lib.so"
    lib.write_bytes(elf_shared_object("libnvidia-opencl.so.1"))
    assert elf.inspect(str(lib), want_soname=True) == (elf.NATIVE, "libnvidia-opencl.so.1")
    lib.write_bytes(elf_shared_object("libcuda.so.1", machine=3, elf64=False))
    assert elf.inspect(str(lib)) == (elf.FOREIGN, None)
    lib.write_text("#!/bin/sh\n")
    assert elf.inspect(str(lib)) == (elf.SCRIPT, None)
    lib.write_bytes(b"\x7fELF" + bytes(10))
    assert elf.inspect(str(lib)) == (elf.OTHER, None)
    assert elf.inspect(str(tmp_path / "missing")) == (elf.MISSING, None)
    program = tmp_path / "prog"
    program.write_bytes(fakenvidia.elf_executable('echo "$0|$1|$2"; exit 3'))
    program.chmod(0o755)
    assert elf.inspect(str(program)) == (elf.NATIVE, None)
    done = subprocess.run([str(program), "a", "b c"], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (3, f"{program}|a|b c\n")


def test_missing_driver_library_is_an_error(tmp_path: Path) -> None:
    _, base = fake(tmp_path, HOSTS["nvidia-h100"]())
    (base / "proc" / "driver" / "nvidia" / "version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  560.35.03  Fri Aug 16 21:39:15 UTC 2024\n")
    with pytest.raises(HookError, match=r"compute: the NVIDIA driver's libcuda.so.560.35.03 \(the running driver's"):
        nvdriver.driver_files(str(base / "proc"), str(base / "driver"), frozenset({"compute"}))
    assert nvdriver.driver_version(str(base / "proc")) == "560.35.03"
    (base / "proc" / "driver" / "nvidia" / "version").unlink()
    with pytest.raises(HookError, match="is the nvidia module loaded"):
        nvdriver.driver_version(str(base / "proc"))


def test_resolve_stays_inside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "usr" / "lib" / "libx.so.1").write_text("")
    (root / "lib").symlink_to("/usr/lib")  # absolute: from the root, not from the host
    (root / "up").symlink_to("../../../../../usr")
    (root / "loop").symlink_to("loop")
    assert nvdriver.resolve(str(root), "/lib/libx.so.1") == "/usr/lib/libx.so.1"
    assert nvdriver.resolve(str(root), "/up/lib/libx.so.1") == "/usr/lib/libx.so.1"
    assert nvdriver.resolve(str(root), "/loop/x") is None
    assert nvdriver.resolve(str(root), "/usr/lib/missing") is None


# --- the ld cache reader, against the real ldconfig ------------------------------------------------

LDCONFIG = shutil.which("ldconfig") or "/sbin/ldconfig"
FLAG_NAMES = {0x0303: "libc6,x86-64", 0x0003: "libc6", 0x0A03: "libc6,AArch64"}


def ldconfig_view(cache: Path) -> list[tuple[str, str, str]]:
    out = subprocess.run([LDCONFIG, "-p", "-C", str(cache)], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines()[1:]:
        if " => " not in line:
            continue  # "Cache generated by: ...", from the cache's extension section (not read here)
        name, _, rest = line.strip().partition(" (")
        flags, _, path = rest.partition(") => ")
        rows.append((name, path, flags))
    return rows


def our_view(cache: Path) -> list[tuple[str, str, str]]:
    return [(e.soname, e.path, FLAG_NAMES.get(e.flags, hex(e.flags)) + (f", hwcap: {e.hwcap:#018x}" if e.hwcap else ""))
            for e in ldcache.read(str(cache))]


@pytest.mark.skipif(not os.access(LDCONFIG, os.X_OK), reason="no ldconfig")
def test_reader_agrees_with_ldconfig(tmp_path: Path) -> None:
    """The host's own cache, a compat-format one, the fake driver's, and one ldconfig builds over it."""
    driver = Path(build_driver(str(tmp_path / "driver"), HOSTS["nvidia-h100"]()))
    built, compat = tmp_path / "built.cache", tmp_path / "compat.cache"
    subprocess.run([LDCONFIG, "-X", "-C", str(built), "-f", "/dev/null", str(driver / "usr/lib/x86_64-linux-gnu"),
                    str(driver / "usr/lib/i386-linux-gnu")], check=True, capture_output=True)
    subprocess.run([LDCONFIG, "-X", "-c", "compat", "-C", str(compat), "-f", "/dev/null",
                    str(driver / "usr/lib/x86_64-linux-gnu")], check=True, capture_output=True)
    for cache in (Path("/etc/ld.so.cache"), built, compat, driver / "etc" / "ld.so.cache"):
        if cache.exists():
            assert our_view(cache) == ldconfig_view(cache), cache
    fixture = {(e.soname, e.flags) for e in ldcache.read(str(driver / "etc" / "ld.so.cache"))}
    assert fixture == {(e.soname, e.flags) for e in ldcache.read(str(built)) if e.path.startswith(str(driver))}


@pytest.mark.parametrize("damage", ["empty", "old-only", "truncated", "bad-offset", "not-a-cache"])
def test_damaged_caches_are_one_line(damage: str) -> None:
    good = ld_cache([("libcuda.so.1", "/lib/libcuda.so.1", 0x0303)])
    data = {"empty": b"", "old-only": b"ld.so-1.7.0" + b"\0" * 5 + bytes(12), "truncated": good[:60],
            "bad-offset": good[:56] + (10_000).to_bytes(4, "little") + good[60:],
            "not-a-cache": b"\x7fELF" * 20}[damage]
    with pytest.raises(HookError) as info:
        ldcache.parse(data, "cache")
    assert "\n" not in str(info.value)


def test_native_flags() -> None:
    assert ldcache.native_flags("x86_64") == 0x0303 and ldcache.native_flags("aarch64") == 0x0A03
    with pytest.raises(HookError, match="no ld cache ABI known"):
        ldcache.native_flags("mips")


# --- resolution inside a rootfs (as runc resolves), without mounting ----------------------------------


def test_symlinks_and_directories_never_leave_the_rootfs(tmp_path: Path) -> None:
    rootfs, outside = tmp_path / "rootfs", tmp_path / "outside"
    (rootfs / "usr").mkdir(parents=True)
    outside.mkdir()
    (rootfs / str(outside).lstrip("/")).mkdir(parents=True)  # where /lib leads inside the rootfs
    (rootfs / "outside").mkdir()  # where ../../../../outside leads: .. stops at the root
    (rootfs / "lib").symlink_to(str(outside))  # absolute: inside the rootfs, that is <rootfs>/<outside>
    (rootfs / "usr" / "lib64").symlink_to("../../../../outside")
    (rootfs / "opt").symlink_to("/nonexistent")
    fd = os.open(rootfs, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert mounts.symlink(fd, "/lib/x86_64-linux-gnu/libcuda.so.1", "libcuda.so.550.54.15").endswith("made")
        assert mounts.symlink(fd, "/usr/lib64/libnvidia-ml.so.1", "libnvidia-ml.so.550.54.15").endswith("made")
        assert mounts.symlink(fd, "/usr/lib64/libnvidia-ml.so.1", "libnvidia-ml.so.550.54.15").endswith("present")
        assert "replaced" in mounts.symlink(fd, "/usr/lib64/libnvidia-ml.so.1", "libnvidia-ml.so.1.new")
        (rootfs / "usr" / "x").write_text("")
        with pytest.raises(HookError, match="is not a symlink; refusing to replace it"):
            mounts.symlink(fd, "/usr/x", "y")
        with pytest.raises(HookError, match="only absolute, normalized paths"):
            mounts.symlink(fd, "/usr/../etc/passwd", "y")
        with pytest.raises(HookError, match="a file name in its own directory"):
            mounts.symlink(fd, "/usr/libz.so.1", "../../etc/shadow")
        # a dangling symlink: its target is made inside the rootfs, as runc makes a mount destination's
        assert mounts.symlink(fd, "/opt/lib/libz.so.1", "libz.so.1.2").endswith("made")
        # .. after a symlink goes up the path walked (lexically), and stops at the root
        (rootfs / "up").symlink_to("usr/lib64/../../../../.." + str(outside) + "/m")
        assert mounts.symlink(fd, "/up/libm.so.1", "libm.so.1.2").endswith("made")
        (rootfs / "loop").symlink_to("loop")
        with pytest.raises(HookError, match="more than 255 symlinks"):
            mounts.symlink(fd, "/loop/libz.so.1", "libz.so.1.2")
        (rootfs / "file").write_text("")
        with pytest.raises(HookError, match="cannot use /file in the container: it is not a directory"):
            mounts.symlink(fd, "/file/libz.so.1", "libz.so.1.2")
    finally:
        os.close(fd)
    assert list(outside.iterdir()) == []  # nothing outside the rootfs
    assert os.readlink(rootfs / "nonexistent" / "lib" / "libz.so.1") == "libz.so.1.2"
    assert os.readlink(rootfs / str(outside).lstrip("/") / "m" / "libm.so.1") == "libm.so.1.2"
    inside = rootfs / str(outside).lstrip("/") / "x86_64-linux-gnu" / "libcuda.so.1"
    assert os.readlink(inside) == "libcuda.so.550.54.15"
    assert os.readlink(rootfs / "outside" / "libnvidia-ml.so.1") == "libnvidia-ml.so.1.new"  # .. stops at the root


@pytest.mark.root("unshare")
def test_bind_mounts_read_only_inside_the_rootfs_only(tmp_path: Path) -> None:
    """In a private mount namespace: the detached read-only copy lands on the destination inside the rootfs (through
    the image's symlinks, a symlink in the destination's own place too, as runc mounts), and nothing outside the
    rootfs is touched."""
    rootfs, outside = tmp_path / "rootfs", tmp_path / "outside"
    (rootfs / "usr" / "lib").mkdir(parents=True)
    outside.mkdir()
    (rootfs / "lib").symlink_to("usr/lib")
    (rootfs / "usr" / "lib" / "evil.so").symlink_to(str(outside / "target"))
    source = tmp_path / "libcuda.so.550.54.15"
    source.write_text("driver\n")
    code = f"""
import os, sys
sys.path.insert(0, {str(REPO)!r})
from oci_gpu_hook.appliers import mounts
from oci_gpu_hook.core.edits import Mount
from oci_gpu_hook.errors import HookError
fd = os.open({str(rootfs)!r}, os.O_RDONLY | os.O_DIRECTORY)
good = Mount({str(source)!r}, "/lib/x86_64-linux-gnu/libcuda.so.550.54.15")
print(mounts.bind(fd, good, mounts.clone_tree(good)))
print(mounts.bind(fd, good, mounts.clone_tree(good)))
try:
    evil = Mount({str(source)!r}, "/usr/lib/evil.so")
    print(mounts.bind(fd, evil, mounts.clone_tree(evil)))
except HookError as err:
    print("refused:", err)
target = {str(rootfs)!r} + "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
try:
    open(target, "a").write("x")
except OSError as err:
    print("write:", err.strerror)
print(open(target).read().strip())
for line in open("/proc/self/mountinfo"):
    if target in line:
        print("options:", line.split()[5])
"""
    done = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "/lib/x86_64-linux-gnu/libcuda.so.550.54.15 mounted"
    assert lines[1] == "/lib/x86_64-linux-gnu/libcuda.so.550.54.15 present"
    assert lines[2] == "/usr/lib/evil.so mounted"
    assert lines[3] == "write: Read-only file system" and lines[4] == "driver"
    assert lines[5].startswith("options: ro,nosuid,nodev")
    assert list(outside.iterdir()) == [] and source.read_text() == "driver\n"
    assert (rootfs / str(outside / "target").lstrip("/")).read_text() == ""  # where evil.so leads in the rootfs
    assert (rootfs / "usr" / "lib" / "x86_64-linux-gnu" / "libcuda.so.550.54.15").read_text() == ""  # a mount point


@pytest.mark.root("unshare")
def test_ldconfig_reads_no_procfs_under_the_rootfs(tmp_path: Path) -> None:
    """In a private mount namespace with two procfs under the rootfs (one at a path with a space, one bound over
    a part of the other): ldconfig run as update_ldcache runs it where it cannot merge (confined) lists nothing
    that an ld.so.conf names through /proc/PID/root, where ldconfig -r alone lists the host's library; the procfs
    mounts are left as they were."""
    rootfs, host = tmp_path / "root fs", tmp_path / "host"
    (host / "lib").mkdir(parents=True)
    (host / "lib" / "libhostonly.so.7").write_bytes(fakenvidia.elf_shared_object("libhostonly.so.7"))
    for sub in ("proc", "x y/hp", "etc", "usr/lib/x86_64-linux-gnu"):
        (rootfs / sub).mkdir(parents=True)
    code = f"""
import os, subprocess, sys
sys.path.insert(0, {str(REPO)!r})
from oci_gpu_hook.appliers import mounts
from oci_gpu_hook.inventory import ldcache
root, pid = {str(rootfs)!r}, os.getpid()
for point in (root + "/proc", root + "/x y/hp"):
    subprocess.run(["mount", "-t", "proc", "proc", point], check=True)
subprocess.run(["mount", "--bind", root + "/proc/sys", root + "/proc/sys"], check=True)
open(root + "/etc/ld.so.conf", "w").write(f"/proc/{{pid}}/root{host}/lib\\n/x y/hp/{{pid}}/root{host}/lib\\n")
print(mounts._proc_mounts_under(root))
subprocess.run([mounts.ldconfig(root), "-r", root], check=True, env={{}})
print(sorted(e.soname for e in ldcache.read(root + "/etc/ld.so.cache")))
fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
print(mounts._run_ldconfig(fd, root, ["/usr/lib/x86_64-linux-gnu"]))
print(sorted(e.soname for e in ldcache.read(root + "/etc/ld.so.cache")))
print(mounts._proc_mounts_under(root))
"""
    done = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == str([f"{rootfs}/proc", f"{rootfs}/x y/hp"])  # /proc/sys is covered with /proc
    assert lines[1] == "['libhostonly.so.7']"  # ldconfig -r alone reads the host's library
    assert lines[2] == "rebuilt by the host's ldconfig, chrooted, without capabilities"
    assert lines[3] == "[]"
    assert lines[4] == lines[0]  # nothing propagated back


# --- the plan and the spec rewrite -----------------------------------------------------------------


def spec(env: list[str]) -> dict[str, Any]:
    return {"ociVersion": "1.0.2", "process": {"args": ["/bin/true"], "env": ["PATH=/bin", *env]},
            "root": {"path": "rootfs"}, "linux": {}}


def test_plan_default_capabilities() -> None:
    plan = plan_for_spec(ContainerSpec(spec(["NVIDIA_VISIBLE_DEVICES=0"])), config("nvidia-mig"))
    assert [n.path for n in plan.nodes] == ["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm",
                                            "/dev/nvidia-uvm-tools"]
    assert plan.edits.links == ()  # DRM nodes and by-path links only with graphics or display
    names = {m.destination.rsplit("/", 1)[1] for m in plan.edits.mounts}
    assert {"libcuda.so.535.104.05", "libnvidia-ml.so.535.104.05", "nvidia-smi"} <= names
    assert [(r.major, r.minor) for r in plan.rules] == [(195, 1), (195, 255), (510, 0), (510, 1)]
    assert plan.summary().startswith("nvidia 0 (0000:3b:00.0): /dev/nvidia1 ") and "driver files" in plan.summary()


def test_plan_graphics_and_display() -> None:
    env = ["NVIDIA_VISIBLE_DEVICES=0,0:1", "NVIDIA_DRIVER_CAPABILITIES=graphics,display"]
    plan = plan_for_spec(ContainerSpec(spec(env)), config("nvidia-mig"))
    assert [n.path for n in plan.nodes] == [
        "/dev/nvidia1", "/dev/dri/card2", "/dev/dri/renderD129", "/dev/nvidia-caps/nvidia-cap156",
        "/dev/nvidia-caps/nvidia-cap157", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset"]
    assert len(plan.edits.links) == 2
    names = {m.destination.rsplit("/", 1)[1] for m in plan.edits.mounts}
    assert "libGLX_nvidia.so.535.104.05" in names and "libcuda.so.535.104.05" not in names


def test_bad_capabilities_stop_the_container() -> None:
    with pytest.raises(HookError, match="NVIDIA_DRIVER_CAPABILITIES=compute,gpu: 'gpu' is not a driver capability"):
        plan_for_spec(ContainerSpec(spec(["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute,gpu"])),
                      config("nvidia-mig"))


def test_mixed_host_plan_serves_both_vendors() -> None:
    plan = plan_for_spec(ContainerSpec(spec(["NVIDIA_VISIBLE_DEVICES=1", "AMD_VISIBLE_DEVICES=0"])),
                         config("amd-nvidia"))
    assert [n.path for n in plan.nodes] == [
        "/dev/dri/card0", "/dev/dri/renderD128", "/dev/nvidia0", "/dev/kfd", "/dev/nvidiactl", "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools"]


def test_mask_other_gpus_hides_their_sysfs_and_proc_directories() -> None:
    plan = plan_for_spec(ContainerSpec(spec(["NVIDIA_VISIBLE_DEVICES=0:2"])),
                         config("nvidia-mig", mask_other_gpus=True))
    assert plan.edits.masked == ("/proc/driver/nvidia/gpus/0000:86:00.0",
                                 "/sys/devices/pci0000:86/0000:86:00.0")


def test_spec_rewrite_mounts_and_hooks_idempotent() -> None:
    cfg = config("nvidia-h100")
    doc = spec(["NVIDIA_VISIBLE_DEVICES=GPU-" + inventory("nvidia-h100").devices("nvidia")[1].uuid[4:]])  # type: ignore[index]
    plan = plan_for_spec(ContainerSpec(doc), cfg)
    assert apply_edits(ContainerSpec(doc), plan, cfg) is True
    bound = {m["destination"]: m for m in doc["mounts"]}
    lib = bound["/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"]
    assert lib["type"] == "bind" and lib["options"] == ["ro", "nosuid", "nodev", "bind"]
    hooks = doc["hooks"]["createRuntime"]
    assert [h["args"][1] for h in hooks] == ["ldcache"]
    assert "--folder=/usr/lib/x86_64-linux-gnu" in hooks[0]["args"]
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.1=libcuda.so.550.54.15" in hooks[0]["args"]
    assert [d["path"] for d in doc["linux"]["devices"]][:1] == ["/dev/nvidia0"]
    before = json.dumps(doc)
    again = ContainerSpec(doc)
    assert apply_edits(again, plan_for_spec(again, cfg), cfg) is False and json.dumps(doc) == before


def test_someone_elses_mount_at_a_driver_path_is_refused() -> None:
    cfg = config("nvidia-h100")
    doc = spec(["NVIDIA_VISIBLE_DEVICES=0"])
    doc["mounts"] = [{"destination": "/usr/bin/nvidia-smi", "type": "bind", "source": "/tmp/mine", "options": ["bind"]}]
    with pytest.raises(HookError, match="already mounts '/tmp/mine' at /usr/bin/nvidia-smi"):
        apply_edits(ContainerSpec(doc), plan_for_spec(ContainerSpec(doc), cfg), cfg)


def test_edits_merge_refuses_two_sources_for_one_destination() -> None:
    with pytest.raises(HookError, match="two mounts claim /a"):
        Edits.merged([Edits(mounts=(Mount("/x", "/a"),)), Edits(mounts=(Mount("/y", "/a"),))])


def test_ldcache_hook_refuses_bad_arguments() -> None:
    for args in (["/etc/../x=y"], ["relative=y"], ["/lib/a.so.1=../../b"], ["--folder=lib"], ["--weird"]):
        done = subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", "ldcache", *args], input="{}",
                              capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
        assert done.returncode == 1 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, args


def test_build_plan_for_a_request() -> None:
    inv = inventory("nvidia-h100")
    asks = requested(["NVIDIA_VISIBLE_DEVICES=3"], {}, config("nvidia-h100"))
    plan = build_plan(inv, resolve(asks, inv), config("nvidia-h100"), ["NVIDIA_DRIVER_CAPABILITIES=utility"])
    names = {m.destination.rsplit("/", 1)[1] for m in plan.edits.mounts}
    assert "nvidia-smi" in names and "libcuda.so.550.54.15" not in names
    assert plan.nodes[0] == Node("/dev/nvidia1", "c", 195, 1)


# --- MIG UUIDs through NVML ------------------------------------------------------------------------

MIG_UUIDS = {(1, 0): "MIG-0d3f2a5c-1b2e-5f7a-9c41-aa00000000a1", (2, 0): "MIG-0d3f2a5c-1b2e-5f7a-9c41-aa00000000b2",
             (5, 0): "MIG-0d3f2a5c-1b2e-5f7a-9c41-aa00000000c3", (5, 1): "MIG-0d3f2a5c-1b2e-5f7a-9c41-aa00000000c4"}


@pytest.fixture
def nvml_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The MIG example host whose libnvidia-ml is tests/helpers/fakenvidia.py's fake (in NVML's MIG order:
    reversed)."""
    base = tmp_path / "host"
    shutil.copytree(roots("nvidia-mig"), base, symlinks=True)
    if build_fake_nvml(str(base / "driver"), "535.104.05", str(tmp_path)) is None:
        unavailable("no C compiler for the fake NVML")
    table = tmp_path / "nvml.txt"
    table.write_text("".join(f"0000:3b:00.0 {gi} {ci} {u}\n" for (gi, ci), u in reversed(MIG_UUIDS.items())))
    monkeypatch.setenv("OGH_FAKE_NVML", str(table))
    monkeypatch.setattr(nvml, "_problems", {})
    monkeypatch.setattr(nvml, "_read", {})
    return base


def test_mig_uuids_through_nvml(nvml_host: Path) -> None:
    inv = scan(str(nvml_host / "sys"), proc_root=str(nvml_host / "proc"), driver_root=str(nvml_host / "driver"))
    devices = inv.devices("nvidia")
    chosen = select("nvidia", MIG_UUIDS[(5, 1)].lower(), devices, "NVIDIA_VISIBLE_DEVICES")
    assert [d.label for d in chosen] == ["0:3"]
    assert {d.mig: d.uuid for d in devices if d.mig} == MIG_UUIDS  # matched by instance ids, not NVML's order
    from oci_gpu_hook.inventory import stable_name

    assert [stable_name(d) for d in devices[2:]] == list(MIG_UUIDS.values())  # a MIG device's stable name
    from oci_gpu_hook.appliers import cdi

    names = [d["name"] for d in cdi.generate(inv, "nvidia", Config(driver_root=str(nvml_host / "driver")))["devices"]]
    assert names[:6] == ["0", "1", "0:0", "0:1", "0:2", "0:3"] and set(MIG_UUIDS.values()) <= set(names)
    with pytest.raises(HookError, match="'MIG-00' is not the UUID of a MIG device on this host"):
        select("nvidia", "MIG-00", devices, "NVIDIA_VISIBLE_DEVICES")


def test_nvml_failure_is_one_line(nvml_host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OGH_FAKE_NVML", "/nonexistent")
    inv = scan(str(nvml_host / "sys"), proc_root=str(nvml_host / "proc"), driver_root=str(nvml_host / "driver"))
    with pytest.raises(HookError, match=r"nvmlInit_v2 failed: Driver Not Loaded \(999\) \(name MIG devices as GPU"):
        select("nvidia", "MIG-00", inv.devices("nvidia"), "NVIDIA_VISIBLE_DEVICES")


# --- the checked-in example trees ------------------------------------------------------------------


def tree(root: Path) -> dict[str, tuple[str, bytes]]:
    out: dict[str, tuple[str, bytes]] = {}
    for directory, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(directory, name)
            if os.path.islink(path):
                out[os.path.relpath(path, root)] = ("link", os.readlink(path).encode())
            elif os.path.isfile(path):
                with open(path, "rb") as handle:
                    out[os.path.relpath(path, root)] = ("file", handle.read())
    return out


@pytest.mark.parametrize("name", NVIDIA_HOSTS)
def test_checked_in_proc_and_driver_trees_are_fresh_builds(tmp_path: Path, name: str) -> None:
    """Regenerate: rm -rf examples/hosts/DIR/{sys,proc,driver} &&
    python -m tests.helpers.fakesysfs examples/hosts/DIR/sys NAME (tests/test_inventory.py checks the sysfs tree)."""
    host = HOSTS[name]()
    assert tree(Path(build_proc(str(tmp_path / "proc"), host))) == tree(roots(name) / "proc")
    assert tree(Path(build_driver(str(tmp_path / "driver"), host))) == tree(roots(name) / "driver")


def test_fake_libraries_are_elf_shared_objects() -> None:
    data = elf_shared_object("libcuda.so.1")
    assert data[:4] == b"\x7fELF" and data[16] == 3  # ET_DYN
    assert b"libcuda.so.1\0" in data and b"libc.so.6\0" in data
    assert isinstance(FakeGpu(pci="0000:01:00.0", card=None, render=None).migs, tuple)


# --- operator commands ---------------------------------------------------------------------------


def cli(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    base = roots(name)
    return subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", "--sysfs-root", str(base / "sys"),
                           "--proc-root", str(base / "proc"), "--driver-root", str(base / "driver"), *args],
                          capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "OCI_GPU_HOOK_CONFIG": "/dev/null"})


def test_list_shows_labels_uuids_and_what_is_ignored() -> None:
    done = cli("nvidia-mig", "list")
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("nvidia")]
    assert [r[1] for r in rows] == ["0", "1", "0:0", "0:1", "0:2", "0:3"]
    assert rows[2][2:6] == ["0:0", "0000:3b:00.0", "0", "(gpu1/gi1/ci0)"]  # no NVML: the MIG index names it
    assert rows[0][2] == HOSTS["nvidia-mig"]().nvidia[1].uuid  # a GPU's stable name: its UUID
    assert "shared by nvidia GPUs: /dev/nvidiactl (c 195:255), /dev/nvidia-uvm (c 510:0)" in done.stdout
    listed = json.loads(cli("nvidia-mig", "list", "--json").stdout)
    assert [(d["label"], d["minor"], d["mig"]) for d in listed["devices"]][:3] == [("0", 1, None), ("1", 0, None),
                                                                                  ("0:0", 1, [1, 0])]


def roots_cli(proc: Path, driver: Path, sysfs: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", "--sysfs-root", str(sysfs),
                           "--proc-root", str(proc), "--driver-root", str(driver), *args], capture_output=True,
                          text=True, env={"PATH": os.environ["PATH"], "OCI_GPU_HOOK_CONFIG": "/dev/null"})


def test_validate_says_what_a_gpu_container_gets_and_what_it_does_not(tmp_path: Path) -> None:
    done = cli("nvidia-h100", "validate")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    base = roots("nvidia-h100") / "driver"
    assert lines[1] == (f"ok: nvidia driver 550.54.15, driver_root {base}: libraries in /usr/lib/x86_64-linux-gnu, "
                        "/usr/lib/x86_64-linux-gnu/vdpau")
    per_cap = {line.split(":")[1].strip(): line for line in lines[2:]}
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15" in per_cap["compute"]
    assert "/usr/bin/nvidia-smi" in per_cap["utility"] and "/etc/vulkan/icd.d/nvidia_icd.json" in per_cap["graphics"]
    assert per_cap["firmware"].endswith(": 1 files: /lib/firmware/nvidia/550.54.15")
    assert not any(line.startswith("warning") for line in lines)
    # a GKE-style host whose wrapper scripts come first for one binary, and whose Vulkan ICD names a missing library
    proc, driver, sysfs = layout_host(tmp_path, "gke")
    (driver / "usr/local/nvidia/bin/nvidia-debugdump").unlink()
    (driver / "usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json").write_text('{"ICD": {}}')
    done = roots_cli(proc, driver, sysfs, "validate")
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stdout.splitlines() if line.startswith("warning")]
    assert warnings == [
        f"warning: {driver}/usr/bin/nvidia-debugdump: a script (#!), not the driver's program; not given",
        f"warning: {driver}/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json: names no library (not the "
        "ICD.library_path its loader reads); not given"]
    listed = roots_cli(proc, driver, sysfs, "list")
    assert listed.returncode == 0, listed.stderr
    assert f"driver of nvidia GPUs: 550.54.15, driver_root {driver}: libraries in /usr/local/nvidia/lib64; " in (
        listed.stdout)
    assert warnings[0] in listed.stdout
    # a driver root without the running driver's libcuda: one line, before any container meets it (list: the GPUs
    # all the same, and that line as a warning)
    (proc / "driver/nvidia/version").write_text("NVRM version: NVIDIA UNIX Open Kernel Module  560.35.03  x\n")
    done = roots_cli(proc, driver, sysfs, "validate")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    why = f"the ld cache {driver}/etc/ld.so.cache; is its user-space installed under driver_root {driver}?"
    assert done.stderr.strip().splitlines()[-1].endswith(why)
    listed = roots_cli(proc, driver, sysfs, "list")
    assert listed.returncode == 0 and listed.stdout.splitlines()[-1].startswith(
        "warning: driver of nvidia GPUs: compute: the NVIDIA driver's libcuda.so.560.35.03") and listed.stdout.endswith(
        why + "\n"), listed.stdout


def test_watch_once_writes_the_nvidia_spec(tmp_path: Path) -> None:
    done = cli("nvidia-h100", "watch", "--once", "--output", f"{tmp_path}/")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nvidia.com-gpu.json"]
    spec = json.loads((tmp_path / "nvidia.com-gpu.json").read_text())
    assert spec["kind"] == "nvidia.com/gpu" and spec["containerEdits"]["mounts"]


def test_inspect_names_nvidia_nodes() -> None:
    from oci_gpu_hook.entry.commands.inspect import device_names

    names = device_names(config("nvidia-mig"))
    assert names[("c", 195, 1)] == "nvidia 0 /dev/nvidia1 (0000:3b:00.0)"
    assert names[("c", 236, 185)] == "nvidia 0:3 /dev/nvidia-caps/nvidia-cap185 (0000:3b:00.0 partition 3)"
    assert names[("c", 226, 129)] == "nvidia 0 /dev/dri/renderD129 (0000:3b:00.0)"
    assert names[("c", 195, 255)] == "/dev/nvidiactl (all nvidia GPUs)"


def test_one_grant_whoever_injects_tells_a_mig_device_from_its_gpu() -> None:
    """A spec that already carries a MIG device's nodes (its GPU's node among them) holds that MIG device, not the
    whole GPU: an annotation naming it agrees; one naming the GPU is refused; an image's env adds nothing."""
    cfg = config("nvidia-mig")
    mig = [{"path": p, "type": "c", "major": ma, "minor": mi} for p, ma, mi in (
        ("/dev/nvidia1", 195, 1), ("/dev/nvidia-caps/nvidia-cap183", 236, 183),
        ("/dev/nvidia-caps/nvidia-cap185", 236, 185))]
    doc = spec([])
    doc["linux"]["devices"] = mig
    doc["annotations"] = {"cdi.k8s.io/x": "nvidia.com/gpu=0:3"}
    assert [d.label for d in plan_for_spec(ContainerSpec(doc), cfg).devices] == ["0:3"]
    doc["annotations"] = {"cdi.k8s.io/x": "nvidia.com/gpu=0"}
    with pytest.raises(HookError, match="one grant whoever injects"):
        plan_for_spec(ContainerSpec(doc), cfg)
    doc = spec(["NVIDIA_VISIBLE_DEVICES=all"])
    doc["linux"]["devices"] = mig[:1]  # the whole GPU 0
    plan = plan_for_spec(ContainerSpec(doc), cfg)
    assert plan.devices == () and "NVIDIA_VISIBLE_DEVICES=all ignored" in plan.request.note
    doc["annotations"] = {"cdi.k8s.io/x": "nvidia.com/gpu=0"}
    assert [d.label for d in plan_for_spec(ContainerSpec(doc), cfg).devices] == ["0"]
