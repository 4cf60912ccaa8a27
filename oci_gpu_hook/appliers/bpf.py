"""The few bpf(2) commands the cgroup v2 device filter needs, through ctypes.

Only what is used: load a BPF_PROG_TYPE_CGROUP_DEVICE program, query and
attach programs on a cgroup, and read a program's info (name, translated
instructions).  Every failure is an
:class:`OSError` with the kernel's errno, plus the verifier log for loads.
"""

from __future__ import annotations

import ctypes
import os
import struct

SYS_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351, "riscv64": 280}

# commands
PROG_LOAD, PROG_ATTACH = 5, 8
PROG_GET_FD_BY_ID, OBJ_GET_INFO_BY_FD, PROG_QUERY = 13, 15, 16

PROG_TYPE_CGROUP_DEVICE = 15
ATTACH_CGROUP_DEVICE = 6
F_ALLOW_OVERRIDE, F_ALLOW_MULTI, F_REPLACE = 1, 2, 4

_ATTR_SIZE = 144  # larger than every struct used; the kernel accepts zeroed tails

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def _nr() -> int:
    machine = os.uname().machine
    if machine not in SYS_BPF:
        raise OSError(f"bpf(2): unsupported architecture {machine}")
    return SYS_BPF[machine]


def _call(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
    result = _syscall(ctypes.c_long(_nr()), ctypes.c_int(cmd), attr, ctypes.c_uint(len(attr)))
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return int(result)


def _attr(layout: str, *values: int | bytes) -> ctypes.Array[ctypes.c_char]:
    packed = struct.pack("=" + layout, *values)
    buf = ctypes.create_string_buffer(_ATTR_SIZE)
    ctypes.memmove(buf, packed, len(packed))
    return buf


def _addr(buffer: ctypes.Array[ctypes.c_char] | ctypes.Array[ctypes.c_uint32]) -> int:
    return ctypes.addressof(buffer)


def prog_load(insns: bytes, name: str, expected_attach_type: int = 0, license: str = "Apache-2.0") -> int:
    """Load a cgroup device program; return its fd.  Errors carry the verifier's log."""
    code = ctypes.create_string_buffer(insns, len(insns))
    lic = ctypes.create_string_buffer(license.encode())
    log = ctypes.create_string_buffer(65536)
    fields = (PROG_TYPE_CGROUP_DEVICE, len(insns) // 8, _addr(code), _addr(lic), 1, len(log), _addr(log),
              0, 0, name.encode()[:15], 0, expected_attach_type)
    attr = _attr("IIQQIIQII16sII", *fields)
    try:
        return _call(PROG_LOAD, attr)
    except OSError as err:
        detail = log.value.decode(errors="replace").strip().splitlines()
        raise OSError(err.errno, f"{err.strerror}; verifier: {detail[-1] if detail else 'no log'}") from None


def prog_attach(cgroup_fd: int, prog_fd: int, flags: int, replace_fd: int = 0) -> None:
    _call(PROG_ATTACH, _attr("IIIII", cgroup_fd, prog_fd, ATTACH_CGROUP_DEVICE, flags, replace_fd))


def prog_query(cgroup_fd: int) -> tuple[int, list[int]]:
    """(attach flags, ids of the device programs attached to this cgroup itself)."""
    ids = (ctypes.c_uint32 * 64)()
    attr = _attr("IIIIQI", cgroup_fd, ATTACH_CGROUP_DEVICE, 0, 0, _addr(ids), 64)
    _call(PROG_QUERY, attr)
    flags, count = struct.unpack_from("=I", attr.raw, 12)[0], struct.unpack_from("=I", attr.raw, 24)[0]
    return flags, list(ids[:count])


def prog_fd_by_id(prog_id: int) -> int:
    return _call(PROG_GET_FD_BY_ID, _attr("III", prog_id, 0, 0))


class ProgInfo:
    __slots__ = ("id", "insns", "map_ids", "name", "type")

    def __init__(self, id: int, type: int, name: str, map_ids: list[int], insns: bytes) -> None:
        self.id = id
        self.type = type
        self.name = name
        self.map_ids = map_ids
        self.insns = insns  # translated (xlated) instructions; b"" when the kernel will not show them


# struct bpf_prog_info offsets (include/uapi/linux/bpf.h)
_INFO_SIZE = 232
_OFF_TYPE, _OFF_ID, _OFF_XLATED_LEN, _OFF_XLATED_PTR = 0, 4, 20, 32
_OFF_NR_MAP_IDS, _OFF_MAP_IDS, _OFF_NAME = 52, 56, 64


def prog_info(prog_fd: int) -> ProgInfo:
    info = ctypes.create_string_buffer(_INFO_SIZE)
    _call(OBJ_GET_INFO_BY_FD, _attr("IIQ", prog_fd, _INFO_SIZE, _addr(info)))
    xlated_len = struct.unpack_from("=I", info.raw, _OFF_XLATED_LEN)[0]
    nr_maps = struct.unpack_from("=I", info.raw, _OFF_NR_MAP_IDS)[0]
    insns = ctypes.create_string_buffer(max(xlated_len, 8))
    maps = (ctypes.c_uint32 * max(nr_maps, 1))()
    info2 = ctypes.create_string_buffer(_INFO_SIZE)
    struct.pack_into("=I", info2, _OFF_XLATED_LEN, xlated_len)
    struct.pack_into("=Q", info2, _OFF_XLATED_PTR, _addr(insns) if xlated_len else 0)
    struct.pack_into("=I", info2, _OFF_NR_MAP_IDS, nr_maps)
    struct.pack_into("=Q", info2, _OFF_MAP_IDS, _addr(maps) if nr_maps else 0)
    _call(OBJ_GET_INFO_BY_FD, _attr("IIQ", prog_fd, _INFO_SIZE, _addr(info2)))
    got_len = struct.unpack_from("=I", info2.raw, _OFF_XLATED_LEN)[0]
    return ProgInfo(
        id=struct.unpack_from("=I", info2.raw, _OFF_ID)[0],
        type=struct.unpack_from("=I", info2.raw, _OFF_TYPE)[0],
        name=info2.raw[_OFF_NAME:_OFF_NAME + 16].split(b"\0", 1)[0].decode(errors="replace"),
        map_ids=list(maps[:nr_maps]),
        insns=insns.raw[:got_len] if got_len and any(insns.raw[:got_len]) else b"",
    )
