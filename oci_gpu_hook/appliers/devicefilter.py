"""cgroup v2 device filters: rules -> eBPF program, and eBPF program -> rules.

The program format is runc's (libcontainer/cgroups/devices/devicefilter.go):
a prologue loads type, access, major and minor from the context into r2..r5;
each rule is a block that jumps to the next block on a mismatch and otherwise
returns its verdict; the first matching rule wins.

To grant devices on a live cgroup, the hook decodes the attached program into
rules and loads a new one with the planned allow rules first and the old rules
after them, in their order: first match wins, so the policy is exactly old +
planned.  This is runc's way (a program rebuilt from a rule list), not a
re-load of read-back instructions, so it keeps working when the kernel blinds
constants (``net.core.bpf_jit_harden=2``).

:func:`decode` turns a program's translated instructions back into rules by
following the fall-through path with constant tracking, which also reads
programs whose constants the kernel blinded (``bpf_jit_harden=2``).
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


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("=BBhi", code, dst | src << 4, off, imm)


def _access_mask(access: str) -> int:
    mask = 0
    for letter in access:
        mask |= ACCESS_BITS[letter]
    return mask


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
        checks.append((0x55, 4, 0, rule.major))
    if rule.minor is not None:
        checks.append((0x55, 5, 0, rule.minor))
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


class NotDecodable(ValueError):
    """The program is not in a format this module knows (runc's, or ours, which is the same)."""


_FIELDS = {0: "raw", 4: "major", 8: "minor"}


def decode(insns: bytes) -> list[Rule]:
    """Rules of a device program from its translated instructions (see the module doc)."""
    if not insns or len(insns) % 8:
        raise NotDecodable("no instructions to read")
    prog = [struct.unpack_from("=BBhi", insns, i) for i in range(0, len(insns), 8)]
    regs: dict[int, object] = {1: "ctx"}
    rules: list[Rule] = []
    cond: dict[str, object] = {}
    targets: set[int] = set()
    pc = 0
    while pc < len(prog):
        code, regbyte, off, imm = prog[pc]
        dst, src = regbyte & 0xF, regbyte >> 4
        value = regs.get(dst)
        if code & 0x07 in (0x04, 0x07):  # ALU32 / ALU64
            operand = regs.get(src) if code & 0x08 else (imm & 0xFFFFFFFF if code & 0x07 == 0x04 else imm)
            regs[dst] = _alu(code, value, operand)
        elif code == LDX_W:
            regs[dst] = _FIELDS.get(off) if regs.get(src) == "ctx" else None
        elif code & 0x07 in (0x05, 0x06) and code not in (EXIT, JA):
            operand = regs.get(src) if code & 0x08 else imm
            op = code & 0xF0
            if isinstance(value, int) and isinstance(operand, int):  # constant jump: fold it
                taken = {0x10: value == operand, 0x50: value != operand, 0x20: value > operand,
                         0x30: value >= operand, 0xA0: value < operand, 0xB0: value <= operand}.get(op)
                if taken is None:
                    raise NotDecodable(f"unexpected jump opcode {code:#x} at {pc}")
                pc += 1 + (off if taken else 0)
                continue
            if op != 0x50 or off < 0:
                raise NotDecodable(f"unexpected jump opcode {code:#x} at {pc}")
            if value in ("type", "major", "minor") and isinstance(operand, int):
                cond[str(value)] = operand
            elif isinstance(value, tuple) and operand == "access":
                cond["access"] = value[1]
            else:
                raise NotDecodable(f"a comparison this decoder does not know at {pc}")
            targets.add(pc + 1 + off)
        elif code == JA:
            if off < 0:
                raise NotDecodable(f"backward jump at {pc}")
            pc += 1 + off
            continue
        elif code == EXIT:
            verdict = regs.get(0)
            if not isinstance(verdict, int):
                raise NotDecodable(f"exit without a constant verdict at {pc}")
            if any(t != pc + 1 for t in targets):
                raise NotDecodable(f"a rule block at {pc} does not jump to the next block")
            rules.append(_rule(cond, bool(verdict)))
            cond, targets = {}, set()
        else:
            raise NotDecodable(f"unexpected opcode {code:#x} at {pc}")
        pc += 1
    if cond or targets or not rules:
        raise NotDecodable("the program does not end with a verdict")
    return rules


def _alu(code: int, value: object, operand: object) -> object:
    """Track one ALU instruction: the context fields runc's prologue derives, and constants
    (which is how blinded constants are read: mov ax, a; xor ax, b; op dst, ax)."""
    op = code & 0xF0
    if op == 0xB0:  # mov
        return operand
    if op == 0x50 and value == "raw" and operand == 0xFFFF:
        return "type"
    if op == 0x70 and value == "raw" and operand == 16:
        return "access"
    if op == 0x50 and value == "access" and isinstance(operand, int):
        return ("access&", operand)
    if not (isinstance(value, int) and isinstance(operand, int)):
        return None
    width = 0xFFFFFFFF if code & 0x07 == 0x04 else 0xFFFFFFFFFFFFFFFF
    shift = operand & (31 if width == 0xFFFFFFFF else 63)
    folded = {0x00: lambda: value + operand, 0x10: lambda: value - operand, 0x20: lambda: value * operand,
              0x40: lambda: value | operand, 0x50: lambda: value & operand, 0x60: lambda: value << shift,
              0x70: lambda: (value & width) >> shift, 0xA0: lambda: value ^ operand}.get(op)
    return None if folded is None else folded() & width


def _rule(cond: dict[str, object], allow: bool) -> Rule:
    type_bits = cond.get("type")
    if type_bits is not None and type_bits not in TYPE_NAMES:
        raise NotDecodable(f"device type {type_bits}")
    mask = cond.get("access", 7)
    assert isinstance(mask, int)
    access = "".join(letter for letter in "rwm" if mask & ACCESS_BITS[letter])
    major, minor = cond.get("major"), cond.get("minor")
    return Rule(allow, TYPE_NAMES[type_bits] if isinstance(type_bits, int) else "a",
                      major if isinstance(major, int) else None, minor if isinstance(minor, int) else None,
                      access)
