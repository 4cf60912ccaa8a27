"""The host's ``/etc/ld.so.cache``, read as ``ld.so`` reads it: which file each soname resolves to.

The file is parsed here, not through ``ldconfig -p``: no process on a container's start, and a driver
root (a driver installed under ``/run/nvidia/driver``, say) is read like any other tree.  Formats
(glibc ``elf/dl-cache.h``):

* new (glibc 2.32 and later by default): the header ``glibc-ld.so.cache1.1``, ``nlibs``,
  ``len_strings``, a flags byte and the extension offset (48 bytes), then ``nlibs`` entries of 24 bytes
  (``int32 flags, uint32 key, uint32 value, uint32 osversion, uint64 hwcap``); ``key`` (the soname) and
  ``value`` (the path) are offsets from the start of that header;
* compat (older glibc): the old ``ld.so-1.7.0`` table (16 bytes, then 12-byte entries) followed, at the
  next 8-byte boundary, by the new format, whose entries are the ones read.

The old table alone (glibc before 2.4's default) is refused: no supported distribution writes it.  The
flags say the ABI: type ``FLAG_ELF_LIBC6`` (3) and an architecture in the high byte
(``0x0300`` x86-64, ``0x0a00`` AArch64, ``0x0500`` 64-bit PowerPC); 32-bit x86 libraries have none.
Tests compare this reader with ``ldconfig -p`` on real caches of both formats.

This module only reads caches.  A container's cache is rebuilt by the host's ``ldconfig`` in
:mod:`oci_gpu_hook.appliers.mounts`, which says why it runs where no procfs is under the rootfs (an image's
ld.so.conf naming ``/proc/1/root/...`` would otherwise list the host's libraries).
"""

from __future__ import annotations

import os

from oci_gpu_hook.errors import HookError

OLD_MAGIC = b"ld.so-1.7.0"
NEW_MAGIC = b"glibc-ld.so.cache1.1"
NEW_HEADER = 48
NEW_ENTRY = 24
FLAG_ELF_LIBC6 = 0x0003
# os.uname().machine -> the flags of that architecture's native libraries
NATIVE_FLAGS = {"x86_64": 0x0303, "aarch64": 0x0A03, "ppc64le": 0x0503}


class Entry:
    """One cache entry: a soname, the path it resolves to, and its ABI flags and hwcap bits."""

    __slots__ = ("flags", "hwcap", "path", "soname")

    def __init__(self, soname: str, path: str, flags: int, hwcap: int) -> None:
        self.soname = soname
        self.path = path
        self.flags = flags
        self.hwcap = hwcap

    def __repr__(self) -> str:
        return f"Entry({self.soname} -> {self.path}, flags {self.flags:#06x})"


def _u32(data: bytes, offset: int) -> int:
    return int.from_bytes(data[offset:offset + 4], "little")


def _string(data: bytes, base: int, offset: int, where: str) -> str:
    start = base + offset
    end = data.find(b"\0", start)
    if offset >= len(data) or start >= len(data) or end < 0:
        raise HookError(f"{where}: a string offset points outside the file (a truncated or corrupt ld cache)")
    try:
        return data[start:end].decode()
    except UnicodeDecodeError:
        raise HookError(f"{where}: a name that is not UTF-8 at byte {start}") from None


def parse(data: bytes, where: str = "ld.so.cache") -> list[Entry]:
    """The entries of a cache in the new or compat format, in file order; a HookError for anything else."""
    if data.startswith(NEW_MAGIC):
        base = 0
    elif data.startswith(OLD_MAGIC):
        if len(data) < 16:
            raise HookError(f"{where}: truncated (the old header)")
        base = (16 + 12 * _u32(data, 12) + 7) & ~7
        if data[base:base + len(NEW_MAGIC)] != NEW_MAGIC:
            raise HookError(f"{where}: only the old ld.so-1.7.0 format (no {NEW_MAGIC.decode()} part); "
                            "run ldconfig on the host to write a current cache")
    else:
        raise HookError(f"{where}: not an ld.so cache (no {NEW_MAGIC.decode()} header)")
    if len(data) < base + NEW_HEADER:
        raise HookError(f"{where}: truncated (the header)")
    count = _u32(data, base + 20)
    first = base + NEW_HEADER
    if count > (len(data) - first) // NEW_ENTRY:
        raise HookError(f"{where}: truncated ({count} entries announced, the file holds fewer)")
    entries = []
    for i in range(count):
        at = first + i * NEW_ENTRY
        flags = int.from_bytes(data[at:at + 4], "little", signed=True)
        key, value = _u32(data, at + 4), _u32(data, at + 8)
        hwcap = int.from_bytes(data[at + 16:at + 24], "little")
        entries.append(Entry(_string(data, base, key, where), _string(data, base, value, where), flags, hwcap))
    return entries


def read(path: str) -> list[Entry]:
    """Parse the cache file at ``path``; [] when there is none (a host without one resolves nothing here)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return []
    except OSError as err:
        raise HookError(f"cannot read the ld cache {path}: {err.strerror}") from None
    return parse(data, path)


def native_flags(machine: str | None = None) -> int:
    """The flags of this machine's native libraries (HookError on an architecture not known here)."""
    name = machine or os.uname().machine
    flags = NATIVE_FLAGS.get(name)
    if flags is None:
        raise HookError(f"no ld cache ABI known for the architecture {name} (known: {', '.join(NATIVE_FLAGS)})")
    return flags
