"""cgroup v2 device filters, rules -> eBPF program: runc's counterpart.

:func:`build` writes runc's format (libcontainer/cgroups/devices/
devicefilter.go): a prologue loads type, access, major and minor from the
context into r2..r5; each rule is a block that jumps to the next block on a
mismatch and otherwise returns its verdict; the first matching rule wins
(:func:`oci_gpu_hook.core.rules.first_match`).

Reading a program back (the live hook's v2 grant, ``inspect``) is
:mod:`oci_gpu_hook.appliers.devicefilter_decode`'s.
"""

from __future__ import annotations

import struct

from oci_gpu_hook.core.devices import Rule

PROGRAM_NAME = "oci_gpu_hook"  # how our programs are recognised on a cgroup (15 chars max)

TYPE_BITS = {"b": 1, "c": 2}
TYPE_NAMES = {v: k for k, v in TYPE_BITS.items()}
ACCESS_BITS = {"m": 1, "r": 2, "w": 4}

# opcodes (include/uapi/linux/bpf.h)
LDX_W = 0x61
ALU32_AND_K, ALU32_RSH_K, ALU32_MOV_K, ALU32_MOV_X = 0x54, 0x74, 0xB4, 0xBC
ALU64_MOV_K, ALU64_MOV_X = 0xB7, 0xBF
JA, EXIT = 0x05, 0x95
LD_IMM64 = 0x18
REG_AX = 11  # the kernel's auxiliary register, used by constant blinding

U32, U64 = (1 << 32) - 1, (1 << 64) - 1


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("=BBhi", code, dst | src << 4, off, imm)


def _access_mask(access: str) -> int:
    mask = 0
    for letter in access:
        mask |= ACCESS_BITS[letter]
    return mask


def _number_check(reg: int, number: int) -> tuple[int, int, int, int]:
    """``if reg != number``: runc's 64-bit jne, whose immediate is sign-extended, cannot say 2**31 and up
    (it would compare with 0xffffffff8xxxxxxx and never match); those take the 32-bit jne."""
    if number < 1 << 31:
        return (0x55, reg, 0, number)
    return (0x56, reg, 0, number - (1 << 32))


def _block(rule: Rule) -> list[bytes]:
    """One rule; jump offsets are filled in once the block length is known (-1 = to next block)."""
    checks: list[tuple[int, int, int, int]] = []  # (code, dst, src, imm) of the mismatch jumps
    prefix: list[bytes] = []
    if rule.type != "a":
        checks.append((0x55, 2, 0, TYPE_BITS[rule.type]))  # if type != T
    mask = _access_mask(rule.access)
    if mask != 7:
        prefix_at = len(checks)
        checks.append((0x5D, 1, 3, 0))  # if (access & mask) != access
        prefix = [_insn(ALU32_MOV_X, 1, 3), _insn(ALU32_AND_K, 1, imm=mask)]
    else:
        prefix_at = -1
    if rule.major is not None:
        checks.append(_number_check(4, rule.major))
    if rule.minor is not None:
        checks.append(_number_check(5, rule.minor))
    tail = [_insn(ALU32_MOV_K, 0, imm=1 if rule.allow else 0), _insn(EXIT)]
    out: list[bytes] = []
    # Lay out the block, then set each jump to skip the rest of it.
    layout: list[tuple[int, int, int, int] | bytes] = []
    for i, check in enumerate(checks):
        if i == prefix_at:
            layout.extend(prefix)
        layout.append(check)
    layout.extend(tail)
    for position, item in enumerate(layout):
        if isinstance(item, bytes):
            out.append(item)
        else:
            code, dst, src, imm = item
            out.append(_insn(code, dst, src, off=len(layout) - position - 1, imm=imm))
    return out


def build(rules: list[Rule] | tuple[Rule, ...]) -> bytes:
    """The program for ``rules`` (first match wins; no match = deny)."""
    insns = [
        _insn(LDX_W, 2, 1, 0), _insn(ALU32_AND_K, 2, imm=0xFFFF),  # type
        _insn(LDX_W, 3, 1, 0), _insn(ALU32_RSH_K, 3, imm=16),  # access
        _insn(LDX_W, 4, 1, 4),  # major
        _insn(LDX_W, 5, 1, 8),  # minor
    ]
    for rule in rules:
        insns += _block(rule)
        if rule.type == "a" and rule.major is None and rule.minor is None and rule.access == "rwm":
            return b"".join(insns)  # a catch-all decides everything; the verifier refuses dead code
    insns += [_insn(ALU32_MOV_K, 0, imm=0), _insn(EXIT)]
    return b"".join(insns)
