"""Build directory trees that mimic a host's sysfs, symlinks and all.

Used by the tests and to (re)generate the example hosts under ``examples/hosts`` (into a new directory):

    python -m tests.helpers.fakesysfs examples/hosts/seed-8x-gfx1100/sys seed-8x-gfx1100
    python -m tests.helpers.fakesysfs examples/hosts/shuffled-4x-gfx942/sys shuffled-4x-gfx942
    python -m tests.helpers.fakesysfs examples/hosts/nvidia-4x-h100/sys nvidia-4x-h100  # also ../proc, ../driver

A host with NVIDIA GPUs also has ``/sys/bus/pci/devices`` links (its backend reads the PCI devices there),
``module/nvidia*`` and its non-GPU functions (NVSwitches, audio); its /proc and driver roots are
tests/helpers/fakenvidia.py's.

An AMD host carries what Debian's ``rocm-smi`` 5.2.3 (librocm_smi64) reads, in the kernel's formats
(docs/hardware.md#amd and docs/hardware.md#fake-hosts; link and property values from the real MI308X capture in
ROCm/k8s-device-plugin testdata/topology-parsing-mi308): ``/sys/module/amdgpu/initstate``, a
``vbios_version`` and an ``amdgpu`` hwmon per PCI GPU, and per KFD node the full ``properties`` line set
in ``node_show`` order, ``mem_banks/0`` and its ``io_links``/``p2p_links``.  Not modelled: KFD
``caches`` (``caches_count 0``).  A CPU node without P2P links has an empty ``p2p_links`` directory,
which git does not keep: rocm-smi reads only GPU nodes' ``p2p_links``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

DRM_MAJOR = 226
KFD_MAJOR = 234  # dynamic on a real host; any value works, it is read from sysfs


@dataclass
class FakeGpu:
    """A PCI function with DRM minors; for an MI300-class GPU also its compute partitions.

    ``xcps`` platform devices (partitions 1..xcps) get cards ``card+1..`` and renders ``render+1..``,
    named ``amdgpu_xcp<sep><xcp_first + k>``; only the first ``valid_partitions`` partitions (partition 0
    included) get a KFD node, as in DPX/QPX/CPX mode on real hardware.
    """

    pci: str  # 0000:23:00.0
    card: int | None  # DRM card number, None = no card node
    render: int | None  # render minor, None = no render node (e.g. a BMC's VGA)
    vendor: str = "0x1002"
    device: str = "0x744c"
    driver: str = "amdgpu"
    numa_node: int = 0
    unique_id: int | None = None
    gpu_id: int | None = None
    kfd_name: str = "ip discovery"
    pci_class: str = "0x030000"
    gfx_target_version: int = 110000
    bridges: int = 0  # upstream ports between the root port and the GPU
    xcps: int = 0
    xcp_first: int = 0
    xcp_sep: str = "_"
    valid_partitions: int = 1
    compute_mode: str | None = None
    memory_mode: str | None = None
    hive_id: int = 0
    # NVIDIA (driver "nvidia"): the device minor, UUID and model of /proc/driver/nvidia/gpus/<pci>/information,
    # MIG instances as (GPU instance id, (compute instance ids...)), and whether the driver excluded the GPU.
    # card/render are set only on a host whose nvidia-drm is loaded.
    minor: int | None = None
    uuid: str = ""
    model: str = ""
    migs: tuple[tuple[int, tuple[int, ...]], ...] = ()
    excluded: bool = False


@dataclass
class FakePci:
    """A PCI function that is not a GPU (an NVSwitch, a GPU's audio function)."""

    pci: str
    vendor: str
    device: str
    pci_class: str
    driver: str


@dataclass
class FakeHost:
    gpus: list[FakeGpu] = field(default_factory=list)
    kfd: bool = True
    kfd_major: int = KFD_MAJOR
    kfd_order: list[int] | None = None  # indices into gpus in KFD probe order
    cpu_nodes: int = 1
    # NVIDIA (tests/helpers/fakenvidia.py writes the proc and driver roots): modules loaded, dynamic majors, version
    others: list[FakePci] = field(default_factory=list)
    nvidia_drm: bool = False
    nvidia_modeset: bool = True
    nvidia_uvm: bool = True
    frontend_name: str = "nvidia"  # "nvidia-frontend" before driver 550.40
    uvm_major: int = 510
    caps_major: int = 236
    driver_version: str = "550.54.15"

    @property
    def nvidia(self) -> list[FakeGpu]:
        return [g for g in self.gpus if g.driver == "nvidia"]


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)


def _symlink(target_abs: str, link: str) -> None:
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(os.path.relpath(target_abs, os.path.dirname(link)), link)


def _pci_dir(root: str, gpu: FakeGpu) -> str:
    domain, bus_text, _rest = gpu.pci.split(":")
    bus = int(bus_text, 16)
    parts = [os.path.join(root, "devices"), f"pci{domain}:{bus - gpu.bridges:02x}"]
    for depth in range(gpu.bridges):  # a switch: upstream and downstream ports, each on the bus above the GPU's
        parts.append(f"{domain}:{bus - gpu.bridges + depth:02x}:00.0")
    parts.append(gpu.pci)
    return os.path.join(*parts)


def _drm_node(root: str, device_dir: str, name: str, minor: int) -> str:
    node_dir = os.path.join(device_dir, "drm", name)
    _write(os.path.join(node_dir, "dev"), f"{DRM_MAJOR}:{minor}\n")
    _write(os.path.join(node_dir, "uevent"),
           f"MAJOR={DRM_MAJOR}\nMINOR={minor}\nDEVNAME=dri/{name}\nDEVTYPE=drm_minor\n")
    _symlink(device_dir, os.path.join(node_dir, "device"))
    _symlink(node_dir, os.path.join(root, "class", "drm", name))
    return node_dir


def build(root: str, host: FakeHost) -> str:
    """Write ``host`` as a sysfs tree under ``root``; return ``root``."""
    os.makedirs(root, exist_ok=True)
    drivers = os.path.join(root, "bus", "pci", "drivers")
    hwmons = 0
    for gpu in host.gpus:
        dev_dir = _pci_dir(root, gpu)
        for name, value in (("vendor", gpu.vendor), ("device", gpu.device),
                            ("class", gpu.pci_class), ("numa_node", str(gpu.numa_node))):
            _write(os.path.join(dev_dir, name), value + "\n")
        pci_id = f"{gpu.vendor[2:]}:{gpu.device[2:]}".upper()
        _write(os.path.join(dev_dir, "uevent"),
               f"DRIVER={gpu.driver}\nPCI_CLASS={int(gpu.pci_class, 16):X}\nPCI_ID={pci_id}\nPCI_SLOT_NAME={gpu.pci}\n")
        os.makedirs(os.path.join(drivers, gpu.driver), exist_ok=True)
        _symlink(os.path.join(drivers, gpu.driver), os.path.join(dev_dir, "driver"))
        _symlink(dev_dir, os.path.join(drivers, gpu.driver, gpu.pci))
        if gpu.driver == "amdgpu" and gpu.unique_id:
            _write(os.path.join(dev_dir, "unique_id"), f"{gpu.unique_id:016x}\n")
        if gpu.driver == "amdgpu":
            _amdgpu_files(dev_dir, gpu)
            _hwmon(root, dev_dir, gpu, hwmons)
            hwmons += 1
        if host.nvidia:  # a host with NVIDIA GPUs also has /sys/bus/pci/devices, which their backend reads
            _symlink(dev_dir, os.path.join(root, "bus", "pci", "devices", gpu.pci))
        if gpu.compute_mode:
            _write(os.path.join(dev_dir, "current_compute_partition"), gpu.compute_mode + "\n")
            _write(os.path.join(dev_dir, "available_compute_partition"), "SPX, DPX, QPX, CPX\n")
            _write(os.path.join(dev_dir, "current_memory_partition"), (gpu.memory_mode or "NPS1") + "\n")
            _write(os.path.join(dev_dir, "available_memory_partition"), "NPS1, NPS4\n")
        if gpu.card is not None:
            card_dir = _drm_node(root, dev_dir, f"card{gpu.card}", gpu.card)
            conn = os.path.join(card_dir, f"card{gpu.card}-DP-1")  # a connector entry, which is not a node
            _write(os.path.join(conn, "status"), "disconnected\n")
            _symlink(conn, os.path.join(root, "class", "drm", f"card{gpu.card}-DP-1"))
            os.symlink(f"card{gpu.card}", os.path.join(dev_dir, "drm", f"controlD{64 + gpu.card}"))
        if gpu.render is not None:
            _drm_node(root, dev_dir, f"renderD{gpu.render}", gpu.render)
        for k in range(gpu.xcps):  # platform devices of partitions 1..xcps: no driver, no vendor file
            xcp_dir = os.path.join(root, "devices", "platform", f"amdgpu_xcp{gpu.xcp_sep}{gpu.xcp_first + k}")
            _write(os.path.join(xcp_dir, "uevent"), "")
            _write(os.path.join(xcp_dir, "modalias"), "platform:amdgpu_xcp\n")
            assert gpu.card is not None and gpu.render is not None
            _drm_node(root, xcp_dir, f"card{gpu.card + 1 + k}", gpu.card + 1 + k)
            _drm_node(root, xcp_dir, f"renderD{gpu.render + 1 + k}", gpu.render + 1 + k)
    for other in host.others:
        dev_dir = _pci_dir(root, FakeGpu(pci=other.pci, card=None, render=None))
        for name, value in (("vendor", other.vendor), ("device", other.device), ("class", other.pci_class),
                            ("numa_node", "0")):
            _write(os.path.join(dev_dir, name), value + "\n")
        os.makedirs(os.path.join(drivers, other.driver), exist_ok=True)
        _symlink(os.path.join(drivers, other.driver), os.path.join(dev_dir, "driver"))
        _symlink(dev_dir, os.path.join(drivers, other.driver, other.pci))
        _symlink(dev_dir, os.path.join(root, "bus", "pci", "devices", other.pci))
    if host.nvidia:
        loaded = ["nvidia", *(["nvidia_drm"] if host.nvidia_drm else []),
                  *(["nvidia_modeset"] if host.nvidia_modeset else []), *(["nvidia_uvm"] if host.nvidia_uvm else [])]
        for module in loaded:
            _write(os.path.join(root, "module", module, "initstate"), "live\n")
    if any(g.card is not None or g.render is not None for g in host.gpus):
        _write(os.path.join(root, "class", "drm", "version"), "drm 1.1.0 20060810\n")
    if any(g.driver == "amdgpu" for g in host.gpus):
        module = os.path.join(root, "module", "amdgpu")
        _write(os.path.join(module, "initstate"), "live\n")
        _symlink(os.path.join(drivers, "amdgpu"), os.path.join(module, "drivers", "pci:amdgpu"))
    if host.kfd:
        _build_kfd(root, host)
    return root


@dataclass(frozen=True)
class _Profile:
    """Per-family values: the VBIOS part number, the hwmon sensors, the KFD node properties of one XCC."""

    vbios: str
    sensors: tuple[tuple[str, str], ...]  # hwmon file -> content
    node: tuple[tuple[str, int], ...]  # KFD properties per XCC (simd_count and array_count scale with num_xcc)
    vram: int  # bytes, the whole GPU
    vram_width: int
    mem_clk_max: int


# gfx1100 (Navi 31): the RX 7900 XTX capture in gpu-sysfs-layouts.md 1.3; W7900D: 48 GiB on a 384-bit bus.
# gfx942 (MI300X): the MI308X capture's per-XCC values with MI300X's 38 CUs per XCC; 192 GiB HBM3.
# The VBIOS part numbers and sensor readings are shaped like real ones, not copied from a board [A].
_NAVI31 = _Profile(
    vbios="113-D7070100-100",
    sensors=(("name", "amdgpu"), ("temp1_label", "edge"), ("temp1_input", "34000"),
             ("temp2_label", "junction"), ("temp2_input", "37000"), ("temp3_label", "mem"),
             ("temp3_input", "36000"), ("in0_label", "vddgfx"), ("in0_input", "760"), ("power1_average", "21000000"),
             ("power1_cap", "241000000"), ("fan1_input", "623"), ("freq1_label", "sclk"), ("freq1_input", "18000000"),
             ("freq2_label", "mclk"), ("freq2_input", "96000000")),
    node=(("simd_count", 192), ("max_waves_per_simd", 16), ("lds_size_in_kb", 64), ("gds_size_in_kb", 0),
          ("num_gws", 64), ("wave_front_size", 32), ("array_count", 12), ("simd_arrays_per_engine", 2),
          ("cu_per_simd_array", 8), ("simd_per_cu", 2), ("max_slots_scratch_cu", 32), ("num_sdma_engines", 2),
          ("num_sdma_xgmi_engines", 0), ("num_sdma_queues_per_engine", 6), ("num_cp_queues", 8),
          ("max_engine_clk_fcompute", 2482), ("fw_version", 2140), ("capability", 671588992), ("debug_prop", 1495),
          ("sdma_fw_version", 20)),
    vram=48 << 30, vram_width=384, mem_clk_max=1124)
_MI300 = _Profile(
    vbios="113-M3000100-102",
    sensors=(("name", "amdgpu"), ("temp2_label", "junction"), ("temp2_input", "41000"), ("temp3_label", "mem"),
             ("temp3_input", "38000"), ("in0_label", "vddgfx"), ("in0_input", "712"),
             ("power1_average", "141000000"), ("power1_cap", "750000000"), ("freq1_label", "sclk"),
             ("freq1_input", "132000000"), ("freq2_label", "mclk"), ("freq2_input", "900000000")),
    node=(("simd_count", 152), ("max_waves_per_simd", 8), ("lds_size_in_kb", 64), ("gds_size_in_kb", 0),
          ("num_gws", 64), ("wave_front_size", 64), ("array_count", 4), ("simd_arrays_per_engine", 1),
          ("cu_per_simd_array", 10), ("simd_per_cu", 4), ("max_slots_scratch_cu", 32), ("num_sdma_engines", 2),
          ("num_sdma_xgmi_engines", 0), ("num_sdma_queues_per_engine", 8), ("num_cp_queues", 24),
          ("max_engine_clk_fcompute", 2100), ("fw_version", 149), ("capability", 746037888), ("debug_prop", 1511),
          ("sdma_fw_version", 19)),
    vram=192 << 30, vram_width=8192, mem_clk_max=1300)


def _profile(gpu: FakeGpu) -> _Profile:
    return _MI300 if gpu.gfx_target_version // 10000 == 9 else _NAVI31


def _amdgpu_files(dev_dir: str, gpu: FakeGpu) -> None:
    """What amdgpu adds to its PCI device beyond the DRM minors (amdgpu_pm.c, amdgpu_device.c, amdgpu_vram_mgr.c)."""
    profile = _profile(gpu)
    sclk = ("500", "1500", str(dict(profile.node)["max_engine_clk_fcompute"]))
    files = {
        "vbios_version": profile.vbios,
        "gpu_busy_percent": "0",
        "mem_info_vram_total": str(profile.vram),
        "mem_info_vram_used": str(profile.vram // 200),
        "power_dpm_force_performance_level": "auto",
        "pp_dpm_sclk": "\n".join(f"{i}: {mhz}Mhz{' *' if i == 0 else ''}" for i, mhz in enumerate(sclk)),
        "pp_dpm_mclk": f"0: 96Mhz *\n1: {profile.mem_clk_max}Mhz",
    }
    for name, value in files.items():
        _write(os.path.join(dev_dir, name), value + "\n")


def _hwmon(root: str, dev_dir: str, gpu: FakeGpu, number: int) -> None:
    """amdgpu's hwmon device under the PCI GPU, and its /sys/class/hwmon link."""
    hwmon = os.path.join(dev_dir, "hwmon", f"hwmon{number}")
    for name, value in _profile(gpu).sensors:
        _write(os.path.join(hwmon, name), value + "\n")
    _symlink(dev_dir, os.path.join(hwmon, "device"))
    _symlink(hwmon, os.path.join(root, "class", "hwmon", f"hwmon{number}"))


# KFD topology properties in the order node_show prints them (kfd_topology.c): every node's, then GPU nodes' only;
# every node ends with max_engine_clk_ccompute (a CPU node's clock).
_NODE_KEYS = ("cpu_cores_count", "simd_count", "mem_banks_count", "caches_count", "io_links_count",
              "p2p_links_count", "cpu_core_id_base", "simd_id_base", "max_waves_per_simd", "lds_size_in_kb",
              "gds_size_in_kb", "num_gws", "wave_front_size", "array_count", "simd_arrays_per_engine",
              "cu_per_simd_array", "simd_per_cu", "max_slots_scratch_cu", "gfx_target_version", "vendor_id",
              "device_id", "location_id", "domain", "drm_render_minor", "hive_id", "num_sdma_engines",
              "num_sdma_xgmi_engines", "num_sdma_queues_per_engine", "num_cp_queues")
_GPU_KEYS = ("max_engine_clk_fcompute", "local_mem_size", "fw_version", "capability", "debug_prop",
             "sdma_fw_version", "unique_id", "num_xcc")
CPU_CLOCK = 3800
_LINK_KEYS = ("type", "version_major", "version_minor", "node_from", "node_to", "weight", "min_latency",
              "max_latency", "min_bandwidth", "max_bandwidth", "recommended_transfer_size", "flags")
# io link types (kfd_crat.h): PCIe 2, QPI 5 (CPU to CPU), XGMI 11
_PCIE, _QPI, _XGMI = 2, 5, 11


@dataclass
class _KfdNode:
    number: int
    cpu: int  # the CPU node it hangs off (itself for a CPU node)
    gpu: FakeGpu | None = None
    part: int = 0
    io_links: list[dict[str, int]] = field(default_factory=list)
    p2p_links: list[dict[str, int]] = field(default_factory=list)


def _link(kind: int, src: int, dst: int, weight: int, bandwidth: tuple[int, int], flags: int) -> dict[str, int]:
    return {"type": kind, "version_major": 0, "version_minor": 0, "node_from": src, "node_to": dst,
            "weight": weight, "min_latency": 0, "max_latency": 0, "min_bandwidth": bandwidth[0],
            "max_bandwidth": bandwidth[1], "recommended_transfer_size": 0, "flags": flags}


def _kfd_links(nodes: list[_KfdNode]) -> None:
    """The links kfd_topology.c builds, with the weights and flags of the MI308X capture:

    - CPU to CPU (QPI, weight 21) and CPU to each GPU on its socket (PCIe, weight 20, large BAR);
    - GPU to its CPU (PCIe, weight 20) first, then XGMI to every node of its hive (13 within its own GPU,
      41 to another GPU);
    - indirect P2P links through the other socket: GPU to each other CPU, and each CPU to the GPUs of the
      other socket (weight 41);
    - P2P peer links between GPUs of no common hive (CONFIG_HSA_AMD_P2P, large BAR): the two PCIe links'
      weights added, plus the CPU-to-CPU link between sockets [A: not in a capture].
    """
    cpus = [n for n in nodes if n.gpu is None]
    gpus = [n for n in nodes if n.gpu is not None]
    pcie = (312, 64000)
    for cpu in cpus:
        cpu.io_links += [_link(_QPI, cpu.number, other.number, 21, (0, 0), 0) for other in cpus if other is not cpu]
        cpu.io_links += [_link(_PCIE, cpu.number, g.number, 20, pcie, 3) for g in gpus if g.cpu == cpu.number]
        cpu.p2p_links += [_link(_PCIE, cpu.number, g.number, 41, (0, 0), 3) for g in gpus if g.cpu != cpu.number]
    for node in gpus:
        assert node.gpu is not None
        node.io_links.append(_link(_PCIE, node.number, node.cpu, 20, pcie, 1))
        for peer in gpus:
            assert peer.gpu is not None
            if peer is node or not node.gpu.hive_id or peer.gpu.hive_id != node.gpu.hive_id:
                continue
            same = peer.gpu is node.gpu
            node.io_links.append(_link(_XGMI, node.number, peer.number, 13 if same else 41,
                                       (819200, 819200) if same else (0, 0), 1))
        node.p2p_links += [_link(_PCIE, node.number, c.number, 41, (0, 0), 1) for c in cpus if c.number != node.cpu]
        for peer in gpus:
            assert peer.gpu is not None
            if peer is node or (node.gpu.hive_id and peer.gpu.hive_id == node.gpu.hive_id):
                continue
            weight = 40 if peer.cpu == node.cpu else 61
            node.p2p_links.append(_link(_PCIE, node.number, peer.number, weight, pcie, 1))


def _build_kfd(root: str, host: FakeHost) -> None:
    kfd_dir = os.path.join(root, "devices", "virtual", "kfd", "kfd")
    _write(os.path.join(kfd_dir, "dev"), f"{host.kfd_major}:0\n")
    _write(os.path.join(kfd_dir, "uevent"), f"MAJOR={host.kfd_major}\nMINOR=0\nDEVNAME=kfd\n")
    _symlink(kfd_dir, os.path.join(root, "class", "kfd", "kfd"))
    nodes_dir = os.path.join(kfd_dir, "topology", "nodes")
    nodes = [_KfdNode(number, number) for number in range(host.cpu_nodes)]
    amd = [g for g in host.gpus if g.driver == "amdgpu" and g.render is not None]
    for gpu in [host.gpus[i] for i in host.kfd_order] if host.kfd_order else amd:
        cpu = gpu.numa_node if 0 <= gpu.numa_node < host.cpu_nodes else 0
        for part in range(gpu.valid_partitions):
            nodes.append(_KfdNode(len(nodes), cpu, gpu, part))
    _kfd_links(nodes)
    for node in nodes:
        node_dir = os.path.join(nodes_dir, str(node.number))
        props = {k: 0 for k in _NODE_KEYS}
        props.update(mem_banks_count=1, io_links_count=len(node.io_links), p2p_links_count=len(node.p2p_links))
        gpu = node.gpu
        if gpu is None:
            props.update(cpu_cores_count=64, cpu_core_id_base=64 * node.number)
            bank = {"heap_type": 0, "size_in_bytes": 270 << 30, "flags": 0, "width": 64, "mem_clk_max": 4800}
            gpu_id, name = 0, ""
        else:
            assert gpu.render is not None
            profile = _profile(gpu)
            xcc = 8 // gpu.valid_partitions if gpu.xcps else 1
            domain, bus, rest = gpu.pci.split(":")
            slot, func = rest.split(".")
            props.update({k: v for k, v in profile.node if k in props})
            props.update(
                simd_count=dict(profile.node)["simd_count"] * xcc, array_count=dict(profile.node)["array_count"] * xcc,
                simd_id_base=2147487744 + 4096 * node.number, gfx_target_version=gpu.gfx_target_version,
                vendor_id=int(gpu.vendor, 16), device_id=int(gpu.device, 16),
                location_id=(int(bus, 16) << 8 | int(slot, 16) << 3 | int(func)) | node.part, domain=int(domain, 16),
                drm_render_minor=gpu.render + node.part, hive_id=gpu.hive_id)
            props.update({k: dict(profile.node).get(k, 0) for k in _GPU_KEYS})
            props.update(unique_id=gpu.unique_id or 0, num_xcc=xcc)
            bank = {"heap_type": 1, "size_in_bytes": profile.vram // gpu.valid_partitions, "flags": 0,
                    "width": profile.vram_width, "mem_clk_max": profile.mem_clk_max}
            gpu_id, name = (gpu.gpu_id or 1000 + node.number) + node.part, gpu.kfd_name
        props["max_engine_clk_ccompute"] = CPU_CLOCK
        _write(os.path.join(node_dir, "properties"), "".join(f"{k} {v}\n" for k, v in props.items()))
        _write(os.path.join(node_dir, "gpu_id"), f"{gpu_id}\n")
        _write(os.path.join(node_dir, "name"), name + "\n")
        _write(os.path.join(node_dir, "mem_banks", "0", "properties"), "".join(f"{k} {v}\n" for k, v in bank.items()))
        for kind, links in (("io_links", node.io_links), ("p2p_links", node.p2p_links)):
            os.makedirs(os.path.join(node_dir, kind), exist_ok=True)
            for i, link in enumerate(links):
                _write(os.path.join(node_dir, kind, str(i), "properties"),
                       "".join(f"{k} {link[k]}\n" for k in _LINK_KEYS))


def remove_gpu(root: str, host: FakeHost, pci: str) -> None:
    """Take the GPU at ``pci`` out of a tree built from ``host``, as a hot-remove or a failed reset leaves sysfs:
    its PCI device, its partitions' platform devices, their /sys/class/drm links and its KFD topology nodes."""
    import shutil

    gpu = next(g for g in host.gpus if g.pci == pci)
    names = [f"card{gpu.card}", f"card{gpu.card}-DP-1"] if gpu.card is not None else []
    names += [f"renderD{gpu.render}"] if gpu.render is not None else []
    for k in range(gpu.xcps):
        assert gpu.card is not None and gpu.render is not None
        names += [f"card{gpu.card + 1 + k}", f"renderD{gpu.render + 1 + k}"]
        shutil.rmtree(os.path.join(root, "devices", "platform", f"amdgpu_xcp{gpu.xcp_sep}{gpu.xcp_first + k}"))
    for name in names:
        os.unlink(os.path.join(root, "class", "drm", name))
    shutil.rmtree(_pci_dir(root, gpu))
    remove_kfd_nodes(root, pci)


def remove_kfd_nodes(root: str, pci: str) -> None:
    """Take the KFD topology nodes of the GPU at ``pci`` out of the tree (what a GPU whose driver lost it shows:
    its PCI device stays)."""
    import shutil

    domain, bus, rest = pci.split(":")
    slot, func = rest.split(".")
    location = int(bus, 16) << 8 | int(slot, 16) << 3 | int(func)
    nodes_dir = os.path.join(root, "devices", "virtual", "kfd", "kfd", "topology", "nodes")
    for number in os.listdir(nodes_dir) if os.path.isdir(nodes_dir) else ():
        with open(os.path.join(nodes_dir, number, "gpu_id")) as handle:
            if handle.read().strip() == "0":
                continue  # a CPU node
        with open(os.path.join(nodes_dir, number, "properties")) as handle:
            props = dict(line.split() for line in handle if line.strip())
        if int(props["location_id"]) >> 3 == location >> 3 and int(props["domain"]) == int(domain, 16):
            shutil.rmtree(os.path.join(nodes_dir, number))


RAS_BLOCKS = ("umc", "gfx", "sdma", "mmhub")


def set_ras(root: str, host: FakeHost, pci: str, ue: dict[str, int] | None = None,
            ce: dict[str, int] | None = None) -> None:
    """amdgpu's RAS counters of the GPU at ``pci`` (amdgpu_ras.c: ``ras/<block>_err_count``, ``ue: N`` and
    ``ce: N`` lines, one file per block; blocks not named count 0), written as the driver shows them."""
    directory = os.path.join(_pci_dir(root, next(g for g in host.gpus if g.pci == pci)), "ras")
    _write(os.path.join(directory, "features"), "feature mask: 0x000001ff\n")
    for block in RAS_BLOCKS:
        _write(os.path.join(directory, f"{block}_err_count"),
               f"ue: {(ue or {}).get(block, 0)}\nce: {(ce or {}).get(block, 0)}\n")


def set_aer_fatal(root: str, host: FakeHost, pci: str, total: int) -> None:
    """The PCI core's AER fatal counters of the device at ``pci`` (drivers/pci/pcie/aer.c, ``aer_dev_fatal``: one
    ``<error> <count>`` line per error bit, then ``TOTAL_ERR_FATAL <count>``)."""
    path = os.path.join(_pci_dir(root, next(g for g in host.gpus if g.pci == pci)), "aer_dev_fatal")
    _write(path, f"Undefined 0\nDLP 0\nSDES 0\nTLP {total}\nFCP 0\nCmpltTO 0\nCmpltAbrt 0\nUnxCmplt 0\n"
                 f"RxOF 0\nMalfTLP 0\nECRC 0\nUnsupReq 0\nACSViol 0\nTOTAL_ERR_FATAL {total}\n")


SEED_BUSES = ("03", "23", "43", "63", "83", "a3", "c3", "e3")


BMC = FakeGpu(pci="0000:c1:00.0", card=0, render=None, vendor="0x1a03", device="0x2000", driver="ast")


def seed_host() -> FakeHost:
    """The seed document's host: 8 x Radeon Pro W7900D (0x744b, gfx1100) behind on-board switches,
    card1..card8, renderD128..135, a BMC's VGA as card0, /dev/kfd (234:0), two CPU KFD nodes.

    GPU 1 (PCI 23) has the seed's unique id 0x3149e0fac5157acf.
    """
    return FakeHost(cpu_nodes=2, gpus=[BMC, *(
        FakeGpu(pci=f"0000:{bus}:00.0", card=i + 1, render=128 + i, numa_node=0 if i < 4 else 1, device="0x744b",
                unique_id=0x3149E0FAC5157AC0 + (7 * i + 8) % 16, gpu_id=50000 + 1111 * i, bridges=2)
        for i, bus in enumerate(SEED_BUSES))])


def shuffled_host() -> FakeHost:
    """Card numbers and KFD order follow a probe order that is not PCI order; a BMC VGA is card0."""
    order = [3, 0, 2, 1]  # probe order, as indices into the PCI-sorted buses
    buses = ("0a", "1b", "8c", "c1")
    gpus = [FakeGpu(pci="0000:02:00.0", card=0, render=None, vendor="0x1a03", device="0x2000",
                    driver="ast")]
    for probe_pos, pci_pos in enumerate(order):
        gpus.append(FakeGpu(pci=f"0000:{buses[pci_pos]}:00.0", card=probe_pos + 1, render=128 + probe_pos,
                            unique_id=0xABC0 + pci_pos, device="0x74a1", gfx_target_version=90402))
    return FakeHost(gpus=gpus, kfd_order=list(range(1, 5)))


def intel_amd_host() -> FakeHost:
    """A workstation: an Intel iGPU (i915) probed first as card0/renderD128, then two W7900D."""
    return FakeHost(gpus=[
        FakeGpu(pci="0000:00:02.0", card=0, render=128, vendor="0x8086", device="0xa780", driver="i915"),
        FakeGpu(pci="0000:03:00.0", card=1, render=129, device="0x744b", unique_id=0x3149E0FAC5157AC8, bridges=2),
        FakeGpu(pci="0000:23:00.0", card=2, render=130, device="0x744b", unique_id=0x3149E0FAC5157ACF, bridges=2),
    ])


def mi300x_host(mode: str = "CPX", sep: str = "_") -> FakeHost:
    """Two MI300X (0x74a1, gfx942) in one XGMI hive behind a BMC's VGA (card0): each has its PCI device
    (partition 0: card1/renderD128, card9/renderD136) and 7 platform partition devices
    (``amdgpu_xcp_0..13``, or ``amdgpu_xcp.0..13`` on older kernels), of which the mode makes 8 (CPX),
    4 (QPX), 2 (DPX) or 1 (SPX) valid."""
    valid = {"SPX": 1, "DPX": 2, "QPX": 4, "CPX": 8}[mode]
    gpus = [FakeGpu(pci="0000:02:00.0", card=0, render=None, vendor="0x1a03", device="0x2000", driver="ast")]
    for g, (bus, numa) in enumerate((("05", 0), ("26", 1))):
        gpus.append(FakeGpu(pci=f"0000:{bus}:00.0", card=1 + 8 * g, render=128 + 8 * g, device="0x74a1",
                            pci_class="0x120000", gfx_target_version=90402, numa_node=numa,
                            unique_id=0xE3A9B1D2C4F56070 + g, xcps=7, xcp_first=7 * g, xcp_sep=sep,
                            valid_partitions=valid, compute_mode=mode, memory_mode="NPS1",
                            hive_id=0x7D3B9E2F10AC4411))
    return FakeHost(gpus=gpus, cpu_nodes=2)


def intel_xe_host() -> FakeHost:
    """An Intel iGPU (i915, card0/renderD128) and an Intel Arc dGPU on xe (card1/renderD129); no AMD, no KFD."""
    return FakeHost(kfd=False, gpus=[
        FakeGpu(pci="0000:00:02.0", card=0, render=128, vendor="0x8086", device="0xa780", driver="i915"),
        FakeGpu(pci="0000:03:00.0", card=1, render=129, vendor="0x8086", device="0xe20b", driver="xe", bridges=2),
    ])


def _uuid(seed: str) -> str:
    import hashlib

    digits = hashlib.sha256(seed.encode()).hexdigest()
    return f"GPU-{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:32]}"


def _nvidia(pci: str, minor: int, **kwargs: object) -> FakeGpu:
    values: dict[str, object] = {"card": None, "render": None, "vendor": "0x10de", "device": "0x2330",
                                 "driver": "nvidia", "pci_class": "0x030200", "model": "NVIDIA H100 80GB HBM3"}
    values.update(kwargs)
    return FakeGpu(pci=pci, minor=minor, uuid=_uuid(f"{pci} {values['model']}"), **values)  # type: ignore[arg-type]


def nvidia_h100_host() -> FakeHost:
    """An HGX node: 4 x H100 SXM5 (0x2330) whose device minors do not follow PCI order (minor != index), four
    NVSwitches (0x22a3, class 0x068000, bound to nvidia-nvswitch), a BMC's VGA as card0; nvidia-drm not loaded
    (no DRM nodes for the GPUs), nvidia-uvm loaded."""
    buses_minors = (("c1", 1), ("1b", 2), ("52", 3), ("43", 0))  # probe order, not PCI order
    gpus = [FakeGpu(pci="0000:02:00.0", card=0, render=None, vendor="0x1a03", device="0x2000", driver="ast")]
    gpus += [_nvidia(f"0000:{bus}:00.0", minor, numa_node=0 if bus < "80" else 1) for bus, minor in buses_minors]
    switches = [FakePci(f"0000:{bus}:00.0", "0x10de", "0x22a3", "0x068000", "nvidia-nvswitch")
                for bus in ("05", "06", "07", "08")]
    return FakeHost(gpus=gpus, others=switches, kfd=False, cpu_nodes=2)


def nvidia_mig_host() -> FakeHost:
    """Two H100 PCIe (0x2331) on an older driver (535: the major is named nvidia-frontend): GPU 0 (PCI 3b,
    minor 1) in MIG mode with GPU instances 1 (compute instance 0), 2 (ci 0) and 5 (ci 0 and 1); GPU 1 (PCI
    86, minor 0) whole.  nvidia-drm and nvidia-modeset are loaded: card1/renderD128 (PCI 86) and
    card2/renderD129 (PCI 3b) besides the BMC's card0.  An audio function (0000:86:00.1) is not a GPU."""
    gpus = [FakeGpu(pci="0000:02:00.0", card=0, render=None, vendor="0x1a03", device="0x2000", driver="ast"),
            _nvidia("0000:86:00.0", 0, card=1, render=128, device="0x2331", model="NVIDIA H100 PCIe", numa_node=1),
            _nvidia("0000:3b:00.0", 1, card=2, render=129, device="0x2331", model="NVIDIA H100 PCIe",
                    migs=((1, (0,)), (2, (0,)), (5, (0, 1))))]
    audio = [FakePci("0000:86:00.1", "0x10de", "0x22ba", "0x040300", "snd_hda_intel")]
    return FakeHost(gpus=gpus, others=audio, kfd=False, nvidia_drm=True, frontend_name="nvidia-frontend",
                    driver_version="535.104.05", cpu_nodes=2)


def amd_nvidia_host() -> FakeHost:
    """A mixed workstation: two W7900D (amdgpu) and two L40S (0x26b9, nvidia, nvidia-drm loaded), probed
    alternately: card0/renderD128 AMD 03, card1/renderD129 NVIDIA 21 (minor 1), card2/renderD130 AMD 41,
    card3/renderD131 NVIDIA 61 (minor 0); /dev/kfd 234:0 beside nvidia-caps 236 and nvidia-uvm 510."""
    return FakeHost(gpus=[
        FakeGpu(pci="0000:03:00.0", card=0, render=128, device="0x744b", unique_id=0x3149E0FAC5157AC8, bridges=2),
        _nvidia("0000:21:00.0", 1, card=1, render=129, device="0x26b9", pci_class="0x030000", model="NVIDIA L40S"),
        FakeGpu(pci="0000:41:00.0", card=2, render=130, device="0x744b", unique_id=0x3149E0FAC5157ACF, bridges=2),
        _nvidia("0000:61:00.0", 0, card=3, render=131, device="0x26b9", pci_class="0x030000", model="NVIDIA L40S"),
    ], nvidia_drm=True)


HOSTS = {
    "seed": seed_host,
    "shuffled": shuffled_host,
    "intel-amd": intel_amd_host,
    "mi300x-cpx": lambda: mi300x_host("CPX", "_"),
    "mi300x-dpx-dot": lambda: mi300x_host("DPX", "."),
    "intel-xe": intel_xe_host,
    "nvidia-h100": nvidia_h100_host,
    "nvidia-mig": nvidia_mig_host,
    "amd-nvidia": amd_nvidia_host,
}
# examples/hosts/<directory>/sys is HOSTS[name] built fresh (a test keeps them equal)
EXAMPLE_DIRS = {
    "seed": "seed-8x-gfx1100",
    "shuffled": "shuffled-4x-gfx942",
    "intel-amd": "intel-igpu-2x-gfx1100",
    "mi300x-cpx": "mi300x-2x-cpx",
    "mi300x-dpx-dot": "mi300x-2x-dpx-dot-naming",
    "intel-xe": "intel-i915-xe",
    "nvidia-h100": "nvidia-4x-h100",
    "nvidia-mig": "nvidia-2x-h100-mig",
    "amd-nvidia": "amd-nvidia-2x2",
}


def build_all(sys_root: str, host: FakeHost) -> str:
    """``host``'s sysfs at ``sys_root``; for a host with NVIDIA GPUs also its ``proc`` and ``driver`` roots beside
    it (tests/helpers/fakenvidia.py).  Returns ``sys_root``."""
    build(sys_root, host)
    if host.nvidia:
        from tests.helpers.fakenvidia import build_driver, build_proc

        base = os.path.dirname(os.path.abspath(sys_root))
        build_proc(os.path.join(base, "proc"), host)
        build_driver(os.path.join(base, "driver"), host)
    return sys_root


def main(argv: list[str]) -> int:
    """``python -m tests.helpers.fakesysfs DIR [HOST]``: HOST is an examples/hosts/ directory name (or its short name
    in :data:`HOSTS`), default the seed host."""
    names = {**{d: n for n, d in EXAMPLE_DIRS.items()}, **{n: n for n in HOSTS}}
    if len(argv) not in (1, 2) or (len(argv) == 2 and argv[1] not in names):
        print(f"usage: python -m tests.helpers.fakesysfs DIR [{'|'.join(EXAMPLE_DIRS.values())}]", file=sys.stderr)
        return 2
    if os.path.lexists(argv[0]):
        print(f"fakesysfs: {argv[0]} exists: name a new directory (remove the old tree first)", file=sys.stderr)
        return 1
    build_all(argv[0], HOSTS[names[argv[1]] if len(argv) == 2 else "seed"]())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
