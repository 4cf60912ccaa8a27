"""Reading sysfs: the DRM devices of a host, and the small readers every backend shares.

Every major:minor comes from a ``dev`` file; none is computed.  Names under
``/sys/class/drm`` are matched strictly (``cardN``, ``renderDN``): connectors
(``card1-DP-1``), ``controlD`` links and the ``version`` file are not nodes.
A DRM entry whose link dangles or whose ``dev`` cannot be read (a device half
removed) is reported, never a crash.
"""

from __future__ import annotations

import _locale
import os

from oci_gpu_hook.core.devices import Node
from oci_gpu_hook.errors import HookError

HEX_DIGITS = frozenset("0123456789abcdef")


def wrong_root(root: str) -> str | None:
    """Why ``root``, where no GPU was found, looks like no sysfs root (what to try instead); None if it may be one."""
    if not os.path.isdir(os.path.join(root, "class", "drm")) and os.path.isdir(os.path.join(root, "sys", "class")):
        return f"sysfs root {root}: no class/drm here; did you mean {os.path.join(root, 'sys')}?"
    if not os.path.isdir(os.path.join(root, "class")) and not os.path.isdir(os.path.join(root, "bus")):
        return f"sysfs root {root}: no class/ or bus/ here, not a sysfs tree (try --sysfs-root /sys)"
    return None


def read(path: str) -> str | None:
    """The text of ``path``, stripped; None when it cannot be read or decoded.  What ``open(path).read().strip()``
    gives, byte for byte (the locale's encoding as a text file picks it, strict; universal newlines), at a fifth of
    its cost: a scan reads ~60 files per request, and a text file object costs more than the read itself."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO put there never blocks the scan
    except OSError:
        return None
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        text = b"".join(chunks).decode(_locale.getencoding())  # what open() uses when no encoding is given
    except UnicodeDecodeError:
        return None
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text.strip()


def follow(path: str) -> str:
    """Resolve one sysfs symlink lexically (sysfs links are relative and point at real directories),
    which is ~10x cheaper than os.path.realpath."""
    try:
        target = os.readlink(path)
    except OSError:
        return path
    return os.path.normpath(os.path.join(os.path.dirname(path), target))


def read_dev(path: str) -> tuple[int, int] | None:
    """``MAJOR:MINOR`` from a ``dev`` file; None when it cannot be read or is not one."""
    text = read(path)
    major, sep, minor = (text or "").partition(":")
    if not (sep and major.isdigit() and minor.isdigit() and major.isascii() and minor.isascii()):
        return None
    return int(major), int(minor)


def driver(device_dir: str) -> str | None:
    link = os.path.join(device_dir, "driver")
    try:
        return os.path.basename(os.readlink(link))
    except OSError:
        return None


def numa_node(device_dir: str) -> int | None:
    text = read(os.path.join(device_dir, "numa_node"))
    if text and text.lstrip("-").isdigit() and int(text) >= 0:
        return int(text)
    return None


def parse_pci_address(text: str) -> tuple[int, int, int, int] | None:
    """``0000:23:00.0`` -> (domain, bus, device, function); None if it is not one."""
    parts = text.lower().split(":")
    if len(parts) != 3 or "." not in parts[2]:
        return None
    slot, _, function = parts[2].partition(".")
    fields = (parts[0], parts[1], slot, function)
    widths = (4, 2, 2, 1)
    if any(len(f) != w or not set(f) <= HEX_DIGITS for f, w in zip(fields, widths, strict=True)):
        return None
    domain, bus, device, func = (int(f, 16) for f in fields)
    if device > 0x1F or func > 7:
        return None
    return domain, bus, device, func


class DrmDevice:
    """One device with DRM minors: its sysfs directory and its card and render nodes."""

    __slots__ = ("card", "directory", "name", "pci", "problem", "render")

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.name = os.path.basename(directory)  # 0000:23:00.0, amdgpu_xcp_3, amdgpu_xcp.3, ...
        self.pci = parse_pci_address(self.name)
        self.card: Node | None = None
        self.render: Node | None = None
        self.problem = ""

    @property
    def nodes(self) -> tuple[Node, ...]:
        return tuple(n for n in (self.card, self.render) if n is not None)

    def by_path(self) -> str:
        """udev's ID_PATH: ``pci-<address>`` or ``platform-<name>`` (the /dev/dri/by-path prefix)."""
        return f"pci-{self.name}" if self.pci else f"platform-{self.name}"

    def links(self) -> tuple[tuple[str, str], ...]:
        """The ``/dev/dri/by-path`` symlinks udev makes for this device, with their relative targets."""
        out = []
        for suffix, node in (("card", self.card), ("render", self.render)):
            if node is not None:
                out.append((f"/dev/dri/by-path/{self.by_path()}-{suffix}", "../" + os.path.basename(node.path)))
        return tuple(out)


def drm_devices(root: str) -> list[DrmDevice]:
    """Every device under ``root/class/drm`` with its nodes, sorted by directory; [] without DRM."""
    if not os.path.isdir(root):
        raise HookError(f"sysfs root {root} is not a directory")
    drm = os.path.join(root, "class", "drm")
    try:
        names = os.listdir(drm)
    except FileNotFoundError:
        return []  # no DRM driver loaded: a host with no GPUs
    except OSError as err:
        raise HookError(f"cannot list {drm}: {err.strerror}") from None
    devices: dict[str, DrmDevice] = {}
    for name in sorted(names):
        if name.startswith("card") and name[4:].isdigit() and name[4:].isascii():
            slot = "card"
        elif name.startswith("renderD") and name[7:].isdigit() and name[7:].isascii():
            slot = "render"
        else:
            continue
        entry = follow(os.path.join(drm, name))
        device_dir = follow(os.path.join(entry, "device"))
        device = devices.get(device_dir)
        if device is None:
            device = devices[device_dir] = DrmDevice(device_dir)
        number = read_dev(os.path.join(entry, "dev"))
        if number is None:
            device.problem = (f"{name}: cannot read a device number (MAJOR:MINOR) from {entry}/dev"
                              + ("" if os.path.isdir(entry) else f" ({entry} is gone: the device is being removed?)"))
            continue
        setattr(device, slot, Node(f"/dev/dri/{name}", "c", number[0], number[1]))
    return [devices[key] for key in sorted(devices)]


def container_path(root: str, host_path: str) -> str:
    """Where a directory under the sysfs root appears in a container (``/sys/...``)."""
    return "/sys/" + os.path.relpath(host_path, root)
