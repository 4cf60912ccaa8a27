"""What a driver file is, from its first bytes: an ELF file of this machine's architecture (and its ``DT_SONAME``),
an ELF file of another, a ``#!`` script, or something else.

Read as the kernel and ``ld.so`` read it (the ELF header's ``EI_CLASS``, ``EI_DATA`` and ``e_machine``; the
program headers' ``PT_LOAD`` and ``PT_DYNAMIC``; in the dynamic section ``DT_STRTAB`` and ``DT_SONAME``), never
by running anything.  Only 64-bit objects of this machine count as native: the driver's 32-bit copies
(``compat32``) are not served.  A soname is read where the driver's library needs a link of that name in the
container (``libnvidia-opencl.so.1 -> libnvidia-opencl.so.550.54.15``), whatever the host's own links say.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from typing import BinaryIO

NATIVE, FOREIGN, SCRIPT, OTHER, MISSING = "native", "foreign", "script", "other", "missing"
# os.uname().machine -> e_machine of its 64-bit objects (elf.h: EM_X86_64, EM_AARCH64, EM_PPC64)
MACHINES = {"x86_64": 62, "aarch64": 183, "ppc64le": 21}
PT_LOAD, PT_DYNAMIC, DT_NULL, DT_STRTAB, DT_SONAME = 1, 2, 0, 5, 14
MAX_HEADERS, MAX_DYNAMIC, MAX_NAME = 64, 4096, 255
WHAT = {FOREIGN: "an ELF file of another architecture or class", SCRIPT: "a script (#!), not the driver's program",
        OTHER: "not an ELF file", MISSING: "unreadable"}


def native_machine(machine: str | None = None) -> int | None:
    """``e_machine`` of this machine's native 64-bit objects (None: an architecture not known here)."""
    return MACHINES.get(machine or os.uname().machine)


def inspect(path: str, want_soname: bool = False) -> tuple[str, str | None]:
    """(kind, soname) of the file at ``path``: kind is :data:`NATIVE`, :data:`FOREIGN`, :data:`SCRIPT`,
    :data:`OTHER` or :data:`MISSING`; the soname (``want_soname``, a native file with one) or None."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(64)
            if head[:2] == b"#!":
                return SCRIPT, None
            if head[:4] != b"\x7fELF" or len(head) < 64:
                return OTHER, None
            # every machine of MACHINES is little-endian: a big-endian object is another architecture's
            if head[4] != 2 or head[5] != 1 or int.from_bytes(head[18:20], "little") != native_machine():
                return FOREIGN, None
            return NATIVE, _soname(handle, head) if want_soname else None
    except OSError:
        return MISSING, None


def _soname(handle: BinaryIO, head: bytes) -> str | None:
    """The ``DT_SONAME`` of a 64-bit little-endian ELF object whose header is ``head`` (None: none, or a file that
    does not say)."""
    def num(data: bytes, at: int, size: int) -> int:
        return int.from_bytes(data[at:at + size], "little")

    read, seek = handle.read, handle.seek
    phoff, phentsize, phnum = num(head, 32, 8), num(head, 54, 2), num(head, 56, 2)
    if phentsize < 56 or phnum > MAX_HEADERS:
        return None
    seek(phoff)
    table = read(phentsize * phnum)
    loads: list[tuple[int, int, int]] = []
    dynamic: tuple[int, int] | None = None
    for at in range(0, len(table) - phentsize + 1, phentsize):
        kind, offset, vaddr, size = num(table, at, 4), num(table, at + 8, 8), num(table, at + 16, 8), num(
            table, at + 32, 8)
        if kind == PT_LOAD:
            loads.append((vaddr, offset, size))
        elif kind == PT_DYNAMIC:
            dynamic = (offset, min(size, MAX_DYNAMIC * 16))
    if dynamic is None:
        return None
    seek(dynamic[0])
    data = read(dynamic[1])
    strtab = soname = None
    for at in range(0, len(data) - 15, 16):
        tag, value = num(data, at, 8), num(data, at + 8, 8)
        if tag == DT_NULL:
            break
        if tag == DT_STRTAB:
            strtab = value
        elif tag == DT_SONAME:
            soname = value
    if strtab is None or soname is None:
        return None
    base = next((offset + strtab - vaddr for vaddr, offset, size in loads if vaddr <= strtab < vaddr + size), None)
    if base is None:
        return None
    seek(base + soname)
    name = read(MAX_NAME + 1).split(b"\0", 1)[0]
    try:
        text = name.decode()
    except UnicodeDecodeError:
        return None
    return text if text and "/" not in text and len(name) <= MAX_NAME else None
