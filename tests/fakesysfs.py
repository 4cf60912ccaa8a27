"""Build directory trees that mimic a host's sysfs, symlinks and all.

Used by the tests and to (re)generate the example hosts under ``examples/hosts`` (into a new directory):

    python -m tests.fakesysfs examples/hosts/seed-8x-gfx1100/sys seed-8x-gfx1100
    python -m tests.fakesysfs examples/hosts/shuffled-4x-gfx942/sys shuffled-4x-gfx942
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


@dataclass
class FakeHost:
    gpus: list[FakeGpu] = field(default_factory=list)
    kfd: bool = True
    kfd_major: int = KFD_MAJOR
    kfd_order: list[int] | None = None  # indices into gpus in KFD probe order
    cpu_nodes: int = 1


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
    if host.gpus:
        _write(os.path.join(root, "class", "drm", "version"), "drm 1.1.0 20060810\n")
    if host.kfd:
        _build_kfd(root, host)
    return root


def _build_kfd(root: str, host: FakeHost) -> None:
    kfd_dir = os.path.join(root, "devices", "virtual", "kfd", "kfd")
    _write(os.path.join(kfd_dir, "dev"), f"{host.kfd_major}:0\n")
    _write(os.path.join(kfd_dir, "uevent"), f"MAJOR={host.kfd_major}\nMINOR=0\nDEVNAME=kfd\n")
    _symlink(kfd_dir, os.path.join(root, "class", "kfd", "kfd"))
    nodes_dir = os.path.join(kfd_dir, "topology", "nodes")
    for number in range(host.cpu_nodes):
        _write(os.path.join(nodes_dir, str(number), "properties"), "cpu_cores_count 64\nsimd_count 0\n"
               "vendor_id 0\ndevice_id 0\nlocation_id 0\ndomain 0\ndrm_render_minor 0\nhive_id 0\n")
        _write(os.path.join(nodes_dir, str(number), "gpu_id"), "0\n")
        _write(os.path.join(nodes_dir, str(number), "name"), "\n")
    amd = [g for g in host.gpus if g.driver == "amdgpu" and g.render is not None]
    order = [host.gpus[i] for i in host.kfd_order] if host.kfd_order else amd
    number = host.cpu_nodes
    for gpu in order:
        domain, bus, rest = gpu.pci.split(":")
        slot, func = rest.split(".")
        location = int(bus, 16) << 8 | int(slot, 16) << 3 | int(func)
        assert gpu.render is not None
        for part in range(gpu.valid_partitions):
            props = {
                "cpu_cores_count": 0, "simd_count": 192 if not gpu.xcps else 304 // gpu.valid_partitions,
                "gfx_target_version": gpu.gfx_target_version, "vendor_id": int(gpu.vendor, 16),
                "device_id": int(gpu.device, 16), "location_id": location | part, "domain": int(domain, 16),
                "drm_render_minor": gpu.render + part, "hive_id": gpu.hive_id, "unique_id": gpu.unique_id or 0,
                "num_xcc": 8 // gpu.valid_partitions if gpu.xcps else 1,
            }
            node_dir = os.path.join(nodes_dir, str(number))
            _write(os.path.join(node_dir, "properties"), "".join(f"{k} {v}\n" for k, v in props.items()))
            _write(os.path.join(node_dir, "gpu_id"), f"{(gpu.gpu_id or 1000 + number) + part}\n")
            _write(os.path.join(node_dir, "name"), gpu.kfd_name + "\n")
            number += 1


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


HOSTS = {
    "seed": seed_host,
    "shuffled": shuffled_host,
    "intel-amd": intel_amd_host,
    "mi300x-cpx": lambda: mi300x_host("CPX", "_"),
    "mi300x-dpx-dot": lambda: mi300x_host("DPX", "."),
    "intel-xe": intel_xe_host,
}
# examples/hosts/<directory>/sys is HOSTS[name] built fresh (a test keeps them equal)
EXAMPLE_DIRS = {
    "seed": "seed-8x-gfx1100",
    "shuffled": "shuffled-4x-gfx942",
    "intel-amd": "intel-igpu-2x-gfx1100",
    "mi300x-cpx": "mi300x-2x-cpx",
    "mi300x-dpx-dot": "mi300x-2x-dpx-dot-naming",
    "intel-xe": "intel-i915-xe",
}


def main(argv: list[str]) -> int:
    """``python -m tests.fakesysfs DIR [HOST]``: HOST is an examples/hosts/ directory name (or its short name
    in :data:`HOSTS`), default the seed host."""
    names = {**{d: n for n, d in EXAMPLE_DIRS.items()}, **{n: n for n in HOSTS}}
    if len(argv) not in (1, 2) or (len(argv) == 2 and argv[1] not in names):
        print(f"usage: python -m tests.fakesysfs DIR [{'|'.join(EXAMPLE_DIRS.values())}]", file=sys.stderr)
        return 2
    if os.path.lexists(argv[0]):
        print(f"fakesysfs: {argv[0]} exists: name a new directory (remove the old tree first)", file=sys.stderr)
        return 1
    build(argv[0], HOSTS[names[argv[1]] if len(argv) == 2 else "seed"]())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
