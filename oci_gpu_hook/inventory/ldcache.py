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

It also writes them (:func:`build`), as glibc's ``ldconfig`` writes the new format (``elf/cache.c``
``save_cache``): the header with flags 2 (little-endian), the entries sorted as ``ldconfig`` sorts them
(:func:`order`: descending by ``_dl_cache_libcmp``, which compares runs of digits as numbers; for one soname
the higher flags first, the ``glibc-hwcaps`` entries before the others, then the higher hwcap, then the order
they were given in), the string table, and an extension (4-aligned: magic ``0xeaa42174``, a count, then
``tag, flags, offset, size`` sections) holding a generator string (tag 0) and, where any entry has one, the
``glibc-hwcaps`` subdirectory names (tag 1, an array of string offsets; such an entry's hwcap is
``1 << 62 | isa level << 32 | index``).  The loader binary-searches the entries, steps back to the first
equal soname and takes the first whose flags and hwcaps fit: an order other than ldconfig's makes lookups miss
without a word, so tests hold :func:`build` to the host's ``ldconfig -p`` and to the loader itself.  The old
format is never written: every glibc loader since 2.3 reads a new-only file.  A container's cache is merged
from the image's and the driver's entries in :mod:`oci_gpu_hook.appliers.mounts`; :func:`elf_soname` and
:func:`elf_note` read what ldconfig reads of a library (its ``DT_SONAME`` and ABI) and the CUDA forward
compatibility note, without a process and without reading more of a file than those few headers.
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
# ELF e_machine (64-bit little-endian) -> the cache flags ldconfig gives its libraries (readelflib.c)
ELF_FLAGS = {62: 0x0303, 183: 0x0A03, 21: 0x0503}
EXTENSION_MAGIC = 0xEAA42174
TAG_GENERATOR, TAG_HWCAPS = 0, 1
HWCAP_EXTENSION = 1 << 62
FLAGS_LITTLE_ENDIAN = 2
GENERATOR = b"oci-gpu-hook"
# What a cache may be, read here: the host's holds 556 entries in 60 kB; 16 MiB is ~100 times the largest seen.
MAX_CACHE = 16 << 20


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

    def same(self) -> tuple[str, str, int, int]:
        return self.soname, self.path, self.flags, self.hwcap


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
    return parse_cache(data, where)[0]


def parse_cache(data: bytes, where: str = "ld.so.cache") -> tuple[list[Entry], list[str]]:
    """The entries of a cache in the new or compat format, in file order, and the ``glibc-hwcaps`` subdirectory
    names of its extension (their hwcap values index them); a HookError for anything else."""
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
    return entries, _hwcaps(data, base, where)


def _hwcaps(data: bytes, base: int, where: str) -> list[str]:
    """The ``glibc-hwcaps`` names of the extension at the header's offset (none: [])."""
    offset = _u32(data, base + 32)
    if not offset:
        return []
    at = base + offset
    if offset % 4 or len(data) < at + 8 or _u32(data, at) != EXTENSION_MAGIC:
        return []  # the loader ignores an extension it cannot read: so do we
    count = _u32(data, at + 4)
    if count > (len(data) - at - 8) // 16:
        raise HookError(f"{where}: truncated (the extension announces {count} sections)")
    for i in range(count):
        tag, _, section, size = (_u32(data, at + 8 + 16 * i + k) for k in (0, 4, 8, 12))
        if tag != TAG_HWCAPS:
            continue
        if section % 4 or size % 4 or base + section + size > len(data):
            raise HookError(f"{where}: the glibc-hwcaps section lies outside the file")
        return [_string(data, base, _u32(data, base + section + 4 * k), where) for k in range(size // 4)]
    return []


def _libcmp_key(name: str) -> list[tuple[int, int]]:
    """``_dl_cache_libcmp`` as a sort key: each run of digits one number, above any other byte; other bytes by
    value (as unsigned bytes: glibc compares plain chars, signed on x86-64, for which a byte above 127 would sort
    below; no soname of a supported distribution has one)."""
    key: list[tuple[int, int]] = []
    digits = -1
    for byte in name.encode():
        if 48 <= byte <= 57:
            digits = (0 if digits < 0 else digits * 10) + byte - 48
            continue
        if digits >= 0:
            key.append((1, digits))
            digits = -1
        key.append((0, byte))
    if digits >= 0:
        key.append((1, digits))
    return key


def _sort_key(entry: Entry, names: list[str]) -> tuple[list[tuple[int, int]], int, int, list[int], int]:
    """ldconfig's order as an ascending key (the cache is in descending order of it)."""
    ext = bool(entry.hwcap & HWCAP_EXTENSION)
    index = entry.hwcap & 0xFFFFFFFF
    # among the hwcaps entries of one soname: by subdirectory name ascending (negated bytes: the key descends)
    name = [-b for b in names[index].encode()] + [0] if ext and index < len(names) else []
    return _libcmp_key(entry.soname), entry.flags, int(ext), name, 0 if ext else entry.hwcap


def order(entries: list[Entry], hwcaps: list[str] | None = None) -> list[Entry]:
    """``entries`` in ldconfig's order (see the module's docstring); equal ones keep the order given, so the
    first given of one soname is the one the loader takes."""
    names = hwcaps or []
    return sorted(entries, key=lambda entry: _sort_key(entry, names), reverse=True)


def _in_order(first: Entry, second: Entry, names: list[str]) -> bool:
    """Whether ``first`` may precede ``second`` in a cache: by the bytes where the sonames first differ when
    neither that byte nor the one before it is a digit (most neighbours), else by the whole key."""
    a, b = first.soname, second.soname
    if a != b:
        i = 0
        for i, (x, y) in enumerate(zip(a, b, strict=False)):  # noqa: B007 - the index is used after the loop
            if x != y:
                break
        else:
            i = min(len(a), len(b))
        x, y = a[i:i + 1], b[i:i + 1]
        if not x.isdigit() and not y.isdigit() and not (i and a[i - 1].isdigit()):
            return x > y  # the end of a name ("") sorts below any character
    return _sort_key(first, names) >= _sort_key(second, names)


def merged(image: list[Entry], ours: list[Entry], hwcaps: list[str] | None = None) -> list[Entry]:
    """``ours`` (in the order given: the first of one soname wins) placed into the image's entries, each before the
    image's entries it ties with, as :func:`order` of ``ours + image`` would place them.  Where the image's
    cache is in ldconfig's order (checked neighbour by neighbour, cheaply), its entries are kept as they are and
    ours found by binary search (the cost stays flat as the image grows); else the whole list is sorted."""
    names = hwcaps or []
    if not all(_in_order(image[i], image[i + 1], names) for i in range(len(image) - 1)):
        return order(ours + image, names)
    keyed = [(_sort_key(e, names), e) for e in order(ours, names)]
    out: list[Entry] = []
    start = 0
    for key, entry in keyed:
        low, high = start, len(image)
        while low < high:  # the first image entry whose key is not above ours
            mid = (low + high) // 2
            if _sort_key(image[mid], names) > key:
                low = mid + 1
            else:
                high = mid
        out += image[start:low]
        out.append(entry)
        start = low
    return out + image[start:]


def build(entries: list[Entry], hwcaps: list[str] | None = None) -> bytes:
    """The new-format cache file of ``entries`` (in the order given: :func:`order` them first) with ``hwcaps``
    (the names their hwcap indexes) and our generator string in the extension."""
    names = list(hwcaps or [])
    strings: dict[bytes, int] = {}
    table = bytearray()
    first = NEW_HEADER + NEW_ENTRY * len(entries)

    def offset(text: str) -> int:
        raw = text.encode()
        if raw not in strings:
            strings[raw] = first + len(table)
            table.extend(raw + b"\0")
        return strings[raw]

    body = bytearray()
    for entry in entries:
        key, value = offset(entry.soname), offset(entry.path)
        body += (entry.flags.to_bytes(4, "little", signed=True) + key.to_bytes(4, "little")
                 + value.to_bytes(4, "little") + bytes(4) + entry.hwcap.to_bytes(8, "little"))
    hwcap_offsets = [offset(name) for name in names]
    generator_at = first + len(table)
    table += GENERATOR
    end = first + len(table)
    extension = (end + 3) & ~3
    sections = [(TAG_GENERATOR, generator_at, len(GENERATOR))]
    data_at = extension + 8 + 16 * (1 + bool(names))
    if names:
        sections.append((TAG_HWCAPS, data_at, 4 * len(names)))
    tail = bytearray(EXTENSION_MAGIC.to_bytes(4, "little") + len(sections).to_bytes(4, "little"))
    for tag, at, size in sections:
        tail += b"".join(v.to_bytes(4, "little") for v in (tag, 0, at, size))
    tail += b"".join(v.to_bytes(4, "little") for v in hwcap_offsets)
    header = (NEW_MAGIC + len(entries).to_bytes(4, "little") + (end - first).to_bytes(4, "little")
              + bytes([FLAGS_LITTLE_ENDIAN]) + bytes(3) + extension.to_bytes(4, "little") + bytes(12))
    return bytes(header + body + table + bytes(extension - end) + tail)


def _pread(fd: int, size: int, at: int) -> bytes:
    data = os.pread(fd, size, at) if size > 0 and at >= 0 else b""
    return data if len(data) == size else b""


def _elf_header(fd: int) -> bytes:
    """The ELF header of a 64-bit little-endian file (what every library a cache here lists is), or b""."""
    head = _pread(fd, 64, 0)
    return head if head[:6] == b"\x7fELF\x02\x01" else b""


def elf_soname(fd: int) -> tuple[str, int] | None:
    """The ``DT_SONAME`` and cache flags of the 64-bit little-endian ELF library open at ``fd`` (as ldconfig
    reads them: the dynamic segment, its string table found through the loadable segments); None for anything
    else (no ELF, another ABI, no soname, headers that point outside the file)."""
    head = _elf_header(fd)
    flags = ELF_FLAGS.get(int.from_bytes(head[18:20], "little")) if head else None
    if flags is None:
        return None
    phoff, phsize, phnum = (int.from_bytes(head[32:40], "little"), int.from_bytes(head[54:56], "little"),
                            int.from_bytes(head[56:58], "little"))
    if phsize < 56 or phnum > 256:
        return None
    table = _pread(fd, phsize * phnum, phoff)
    loads, dynamic = [], None
    for i in range(len(table) // phsize):
        ph = table[i * phsize:(i + 1) * phsize]
        kind, offset, vaddr, size = (int.from_bytes(ph[0:4], "little"), int.from_bytes(ph[8:16], "little"),
                                     int.from_bytes(ph[16:24], "little"), int.from_bytes(ph[32:40], "little"))
        if kind == 1:
            loads.append((vaddr, offset, size))
        elif kind == 2:
            dynamic = (offset, min(size, 1 << 16))
    if dynamic is None:
        return None
    data = _pread(fd, dynamic[1] - dynamic[1] % 16, dynamic[0])
    strtab = soname = None
    for at in range(0, len(data), 16):
        tag, value = int.from_bytes(data[at:at + 8], "little"), int.from_bytes(data[at + 8:at + 16], "little")
        if tag == 0:
            break
        if tag == 5:
            strtab = value
        elif tag == 14:
            soname = value
    if strtab is None or soname is None:
        return None
    where = next((strtab - vaddr + offset for vaddr, offset, size in loads if vaddr <= strtab < vaddr + size), None)
    raw = os.pread(fd, 256, where + soname) if where is not None and where + soname >= 0 else b""
    name, nul, _ = raw.partition(b"\0")
    if not nul or not name or b"/" in name:
        return None
    try:
        return name.decode(), flags
    except UnicodeDecodeError:
        return None


def elf_note(fd: int, section_name: str, owner: str) -> bytes | None:
    """The descriptor of the first note of ``owner`` in the section ``section_name`` of the 64-bit little-endian
    ELF file at ``fd`` (its name and descriptor padded to the section's alignment, as NVIDIA's reader takes
    them), trailing NULs removed; None where there is no such section or note; a ValueError for a section or
    note that points outside the file."""
    head = _elf_header(fd)
    if not head:
        return None
    shoff, shsize, shnum, shstrndx = (int.from_bytes(head[40:48], "little"), int.from_bytes(head[58:60], "little"),
                                      int.from_bytes(head[60:62], "little"), int.from_bytes(head[62:64], "little"))
    if shsize < 64 or shnum > 4096 or shstrndx >= shnum:
        return None
    table = _pread(fd, shsize * shnum, shoff)
    if not table:
        raise ValueError("the section headers lie outside the file")

    def section(i: int) -> tuple[int, int, int, int, int]:
        sh = table[i * shsize:i * shsize + 64]
        return (int.from_bytes(sh[0:4], "little"), int.from_bytes(sh[4:8], "little"),
                int.from_bytes(sh[24:32], "little"), int.from_bytes(sh[32:40], "little"),
                int.from_bytes(sh[48:56], "little"))

    _, _, names_at, names_size, _ = section(shstrndx)
    names = _pread(fd, min(names_size, 1 << 20), names_at)
    wanted = section_name.encode() + b"\0"
    for i in range(shnum):
        name, kind, at, size, align = section(i)
        if kind != 7 or names[name:name + len(wanted)] != wanted:  # SHT_NOTE
            continue
        if size > 1 << 16:
            raise ValueError(f"the {section_name} section is {size} bytes")
        data = _pread(fd, size, at)
        if len(data) < 12:
            raise ValueError(f"the {section_name} section lies outside the file or is too short")
        namesz, descsz = int.from_bytes(data[0:4], "little"), int.from_bytes(data[4:8], "little")
        align = max(align, 1)
        desc_at = 12 + (namesz + align - 1) // align * align
        if namesz == 0 or descsz == 0 or desc_at + descsz > len(data):
            raise ValueError(f"the note in {section_name} is malformed (its sizes do not fit the section)")
        if data[12:12 + namesz].strip(b"\0") != owner.encode():
            return None
        return data[desc_at:desc_at + descsz].strip(b"\0")
    return None


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
