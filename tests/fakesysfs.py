"""Build directory trees that mimic a host's sysfs, symlinks and all.

Used by the tests and to (re)generate the example hosts under ``examples/hosts``:

    python -m tests.fakesysfs examples/hosts/seed-8x-gfx1100/sys seed
    python -m tests.fakesysfs examples/hosts/shuffled-4x-gfx942/sys shuffled
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

DRM_MAJOR = 226
KFD_MAJOR = 234  # dynamic on a real host; any value works, it is read from sysfs


@dataclass
class FakeGpu:
    pci: str  # 0000:23:00.0
    card: int | None  # DRM card number, None = no card node
    render: int | None  # render minor, None = no render node (e.g. a BMC's VGA)
    vendor: str = "0x1002"
    device: str = "0x744c"
    driver: str = "amdgpu"
    numa_node: int = 0
    unique_id: int | None = None
    gpu_id: int | None = None
    kfd_name: str = "gfx1100"
    pci_class: str = "0x030000"


@dataclass
class FakeHost:
    gpus: list[FakeGpu] = field(default_factory=list)
    kfd: bool = True
    kfd_major: int = KFD_MAJOR
    kfd_order: list[int] | None = None  # indices into gpus in KFD probe order


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)


def _symlink(target_abs: str, link: str) -> None:
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(os.path.relpath(target_abs, os.path.dirname(link)), link)


def build(root: str, host: FakeHost) -> str:
    """Write ``host`` as a sysfs tree under ``root``; return ``root``."""
    os.makedirs(root, exist_ok=True)
    drivers = os.path.join(root, "bus", "pci", "drivers")
    for gpu in host.gpus:
        bus = gpu.pci.split(":")[1]
        dev_dir = os.path.join(root, "devices", f"pci{gpu.pci[:4]}:{bus}", gpu.pci)
        for name, value in (("vendor", gpu.vendor), ("device", gpu.device),
                            ("class", gpu.pci_class), ("numa_node", str(gpu.numa_node))):
            _write(os.path.join(dev_dir, name), value + "\n")
        _write(os.path.join(dev_dir, "uevent"), f"DRIVER={gpu.driver}\nPCI_SLOT_NAME={gpu.pci}\n")
        os.makedirs(os.path.join(drivers, gpu.driver), exist_ok=True)
        _symlink(os.path.join(drivers, gpu.driver), os.path.join(dev_dir, "driver"))
        nodes = []
        if gpu.card is not None:
            nodes.append((f"card{gpu.card}", gpu.card))
        if gpu.render is not None:
            nodes.append((f"renderD{gpu.render}", gpu.render))
        for name, minor in nodes:
            node_dir = os.path.join(dev_dir, "drm", name)
            _write(os.path.join(node_dir, "dev"), f"{DRM_MAJOR}:{minor}\n")
            _write(os.path.join(node_dir, "uevent"), f"MAJOR={DRM_MAJOR}\nMINOR={minor}\nDEVNAME=dri/{name}\n")
            _symlink(dev_dir, os.path.join(node_dir, "device"))
            _symlink(node_dir, os.path.join(root, "class", "drm", name))
        if gpu.card is not None:  # a connector entry, which is not a node
            conn = os.path.join(dev_dir, "drm", f"card{gpu.card}", f"card{gpu.card}-DP-1")
            _write(os.path.join(conn, "status"), "disconnected\n")
            _symlink(conn, os.path.join(root, "class", "drm", f"card{gpu.card}-DP-1"))
    if host.gpus:
        _write(os.path.join(root, "class", "drm", "version"), "drm 1.1.0 20060810\n")
    if host.kfd:
        kfd_dir = os.path.join(root, "devices", "virtual", "kfd", "kfd")
        _write(os.path.join(kfd_dir, "dev"), f"{host.kfd_major}:0\n")
        _symlink(kfd_dir, os.path.join(root, "class", "kfd", "kfd"))
        nodes_dir = os.path.join(kfd_dir, "topology", "nodes")
        _write(os.path.join(nodes_dir, "0", "properties"), "cpu_cores_count 64\nsimd_count 0\n")
        _write(os.path.join(nodes_dir, "0", "gpu_id"), "0\n")
        _write(os.path.join(nodes_dir, "0", "name"), "\n")
        amd = [g for g in host.gpus if g.vendor == "0x1002" and g.render is not None]
        order = [host.gpus[i] for i in host.kfd_order] if host.kfd_order else amd
        for number, gpu in enumerate(order, start=1):
            domain, bus, rest = gpu.pci.split(":")
            slot, func = rest.split(".")
            location = int(bus, 16) << 8 | int(slot, 16) << 3 | int(func)
            props = {
                "cpu_cores_count": 0, "simd_count": 192, "vendor_id": int(gpu.vendor, 16),
                "device_id": int(gpu.device, 16), "location_id": location, "domain": int(domain, 16),
                "drm_render_minor": gpu.render, "unique_id": gpu.unique_id or 0,
                "gfx_target_version": 110000, "num_xcc": 1,
            }
            node_dir = os.path.join(nodes_dir, str(number))
            _write(os.path.join(node_dir, "properties"), "".join(f"{k} {v}\n" for k, v in props.items()))
            _write(os.path.join(node_dir, "gpu_id"), f"{gpu.gpu_id or 1000 + number}\n")
            _write(os.path.join(node_dir, "name"), gpu.kfd_name + "\n")
    return root


SEED_BUSES = ("03", "23", "43", "63", "83", "a3", "c3", "e3")


def seed_host() -> FakeHost:
    """The seed document's host: 8 x gfx1100, card1..card8, renderD128..135, /dev/kfd.

    GPU 1 (PCI 23) has the seed's unique id 0x3149e0fac5157acf.
    """
    return FakeHost(gpus=[
        FakeGpu(pci=f"0000:{bus}:00.0", card=i + 1, render=128 + i, numa_node=0 if i < 4 else 1,
                unique_id=0x3149E0FAC5157AC0 + (7 * i + 8) % 16, gpu_id=50000 + 1111 * i)
        for i, bus in enumerate(SEED_BUSES)
    ])


def shuffled_host() -> FakeHost:
    """Card numbers and KFD order follow a probe order that is not PCI order; a BMC VGA is card0."""
    order = [3, 0, 2, 1]  # probe order, as indices into the PCI-sorted buses
    buses = ("0a", "1b", "8c", "c1")
    gpus = [FakeGpu(pci="0000:02:00.0", card=0, render=None, vendor="0x1a03", device="0x2000",
                    driver="ast")]
    for probe_pos, pci_pos in enumerate(order):
        gpus.append(FakeGpu(pci=f"0000:{buses[pci_pos]}:00.0", card=probe_pos + 1, render=128 + probe_pos,
                            unique_id=0xABC0 + pci_pos, device="0x74a1", kfd_name="gfx942"))
    return FakeHost(gpus=gpus, kfd_order=list(range(1, 5)))


HOSTS = {"seed": seed_host, "shuffled": shuffled_host}


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or (len(argv) == 2 and argv[1] not in HOSTS):
        print(f"usage: python -m tests.fakesysfs DIR [{'|'.join(HOSTS)}]", file=sys.stderr)
        return 2
    build(argv[0], HOSTS[argv[1] if len(argv) == 2 else "seed"]())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
