"""eBPF device programs for the tests: an assembler for hand-written ones, bpf_jit_harden's constant blinding
re-derived, the hostile shapes (the attacker classes the decoder must refuse or read exactly), and random
programs of many shapes."""

from __future__ import annotations

import random
import struct

from hypothesis import strategies as st

from oci_gpu_hook.appliers import devicefilter as df

U32 = (1 << 32) - 1
ACCESS = ["r", "w", "m", "rw", "rm", "wm", "rwm"]
AX = df.REG_AX


# --- an assembler for hand-written programs ---------------------------------------------------------


def i(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("=BBhi", code, dst | src << 4, off, (imm + (1 << 31)) % (1 << 32) - (1 << 31))


def insns_of(program: bytes) -> list[tuple[int, int, int, int, int]]:
    out = []
    for at in range(0, len(program), 8):
        code, regs, off, imm = struct.unpack_from("=BBhi", program, at)
        out.append((code, regs & 0xF, regs >> 4, off, imm))
    return out


def asm(*blocks: list[tuple]) -> bytes:
    """Blocks of instructions; ("j", code, dst, src, imm, "next") jumps to the next block's start,
    ("j", code, dst, src, imm, n) jumps n instructions forward (clamped to the last instruction)."""
    flat = [item for block in blocks for item in block]
    starts, at = [], 0
    for block in blocks:
        starts.append(at)
        at += len(block)
    starts.append(at)
    out, pos = [], 0
    for number, block in enumerate(blocks):
        for item in block:
            if isinstance(item, bytes):
                out.append(item)
            else:
                _, code, dst, src, imm, target = item
                goal = starts[number + 1] if target == "next" else min(pos + 1 + target, len(flat) - 1)
                out.append(i(code, dst, src, goal - pos - 1, imm))
            pos += 1
    return b"".join(out)


PROLOGUE = [i(0x61, 2, 1, 0), i(0x54, 2, imm=0xFFFF), i(0x61, 3, 1, 0), i(0x74, 3, imm=16),
            i(0x61, 4, 1, 4), i(0x61, 5, 1, 8)]
ALLOW, DENY = [i(0xB4, 0, imm=1), i(0x95)], [i(0xB4, 0, imm=0), i(0x95)]


def jne(reg: int, imm: int) -> tuple:
    return ("j", 0x55, reg, 0, imm, "next")


# --- bpf_jit_harden's constant blinding (kernel/bpf/core.c bpf_jit_blind_insn), re-derived ------------

_BLINDED_ALU = {0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x90, 0xA0, 0xB0}  # add sub mul div or and mod xor mov
_BLINDED_JMP = {0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0xA0, 0xB0, 0xC0, 0xD0}


def blind(program: bytes, seed: int) -> bytes:
    """What the kernel shows after blinding every constant: mov ax, imm^rnd; xor ax, rnd; OP dst, ax
    (ALU32 ops in 32 bits, jumps and ALU64 in 64), and `mov dst, 0` as `dst ^= dst` (ALU64)."""
    rnd = random.Random(seed)
    old = insns_of(program)
    pieces: list[list[tuple[int, int, int, int, int]]] = []
    for at, (code, dst, src, off, imm) in enumerate(old):
        cls, op = code & 0x07, code & 0xF0
        immediate = not code & 0x08
        r = rnd.randrange(1 << 32) - (1 << 31)
        if code == df.LD_IMM64:  # the high half, shifted up, then the low half or-ed in
            high = old[at + 1][4]
            pieces.append([(0xB7, AX, 0, 0, high ^ r), (0xA7, AX, 0, 0, r), (0x67, AX, 0, 0, 32),
                           (0xBF, dst, AX, 0, 0)])
        elif code == 0 and at and old[at - 1][0] == df.LD_IMM64:
            low = old[at - 1][4]
            pieces.append([(0xB4, AX, 0, 0, low ^ r), (0xA4, AX, 0, 0, r), (0x4F, old[at - 1][1], AX, 0, 0)])
        elif immediate and imm == 0 and code in (0xB4, 0xB7):
            pieces.append([(0xAF, dst, dst, 0, 0)])
        elif immediate and cls in (0x04, 0x07) and op in _BLINDED_ALU:
            mov, xor = (0xB4, 0xA4) if cls == 0x04 else (0xB7, 0xA7)
            pieces.append([(mov, AX, 0, 0, imm ^ r), (xor, AX, 0, 0, r), (code | 0x08, dst, AX, 0, 0)])
        elif immediate and cls in (0x05, 0x06) and op in _BLINDED_JMP:
            mov, xor = (0xB4, 0xA4) if cls == 0x06 else (0xB7, 0xA7)
            pieces.append([(mov, AX, 0, 0, imm ^ r), (xor, AX, 0, 0, r), (code | 0x08, dst, AX, off, 0)])
        else:
            pieces.append([(code, dst, src, off, imm)])
    new_start, at = [], 0
    for piece in pieces:
        new_start.append(at)
        at += len(piece)
    new_start.append(at)
    out = []
    for index, piece in enumerate(pieces):
        for k, (code, dst, src, off, imm) in enumerate(piece):
            if code & 0x07 in (0x05, 0x06) and code != df.EXIT and k == len(piece) - 1:
                here = new_start[index] + k
                off = new_start[index + 1 + off] - here - 1
            out.append(i(code, dst, src, off, imm))
    return b"".join(out)


# --- hostile shapes, by hand: the attacker classes a decoder must resist ----------------------------------------

FIELD_TWICE = asm(PROLOGUE, [jne(4, 1), jne(4, 226), *ALLOW], DENY)  # never matches; `allow 226:*` if misread
DUPLICATE_LOAD = asm(PROLOGUE, [jne(2, 2), i(0x61, 4, 1, 8), jne(4, 5), *ALLOW],  # r4 = minor on one path only
                     [jne(4, 226), *ALLOW], DENY)
JOIN_DIFFERENT = asm(PROLOGUE, [jne(5, 7), i(0xBC, 4, 5), jne(2, 2), *DENY],  # r4 = major or minor at the join
                     [jne(4, 226), *ALLOW], DENY)
WIDE_TYPE = asm([i(0x61, 2, 1, 0), i(0x61, 4, 1, 4), i(0x61, 5, 1, 8)],  # type compared without `& 0xffff`
                [jne(2, 2), jne(4, 226), *DENY], [i(0xB4, 0, imm=1), i(0x95)])
TWICE_TWO_LOADS = asm(PROLOGUE, [i(0x61, 6, 1, 4), jne(2, 2), jne(4, 999), jne(6, 226), *ALLOW],  # major twice
                      DENY)  # never matches; a reader keeping the last test sees `allow c 226:* rwm`
RELOAD_AFTER_JUMP = asm(PROLOGUE, [i(0xBC, 4, 5), jne(2, 1), i(0x61, 4, 1, 4), *DENY],  # r4 = minor at the jump,
                        [jne(4, 226), *ALLOW], DENY)  # major on the fall-through: `allow 226:*` if misread
IMM64_VERDICT = asm(PROLOGUE, [jne(2, 2), jne(4, 226), i(0x18, 0, imm=1), i(0, imm=0), i(0x95)],  # r0 = 1 ll
                    [i(0x18, 0, imm=0), i(0, imm=1), i(0x77, 0, imm=32), i(0x95)])  # r0 = (1 << 32) >> 32
BLOCK_AND_CHAR = asm(PROLOGUE, [("j", 0x25, 2, 0, 2, "next"), ("j", 0x15, 2, 0, 0, "next"), jne(4, 226), *DENY],
                     ALLOW)  # types 1 and 2 but not the others: no rule type says that
JSET_MINOR = asm(PROLOGUE, [("j", 0x45, 5, 0, 0x80, "next"), jne(4, 226), *ALLOW], DENY)
ORDERED = asm(PROLOGUE, [("j", 0x25, 4, 0, 200, "next"), *ALLOW], DENY)  # if major > 200 goto next: 0..200 allowed
EXACT_BY_ORDER = asm(PROLOGUE, [("j", 0xA5, 4, 0, 226, "next"), ("j", 0x25, 4, 0, 226, "next"), jne(2, 2),
                                *ALLOW], DENY)  # major < 226 or > 226 skip: exactly `allow c 226:*`
JMP32_SIGNED = asm(PROLOGUE, [("j", 0xC6, 5, 0, 0, "next"), jne(4, 226), *ALLOW], DENY)  # minor <s 0 skip
NOT_NEXT_BLOCK = asm(PROLOGUE, [jne(2, 2), ("j", 0x55, 4, 0, 226, 3), *ALLOW], [jne(4, 1), *ALLOW], DENY)
DEFAULT_ALLOW = asm(PROLOGUE, [jne(2, 2), jne(4, 226), *DENY], ALLOW)  # runc's `deny c 226:* rwm` list
SYSTEMD_LIKE = asm(PROLOGUE,
                   [i(0xBC, 1, 3), i(0x54, 1, imm=6), ("j", 0x5D, 1, 3, 0, "next"), jne(2, 2), jne(4, 1),
                    jne(5, 3), i(0x05, off=5)],
                   [jne(2, 2), jne(4, 136), i(0x05, off=2)],
                   DENY, ALLOW)  # shared verdict blocks reached by `ja`

HOSTILE = {"field-twice": FIELD_TWICE, "duplicate-load": DUPLICATE_LOAD, "join-different": JOIN_DIFFERENT,
           "wide-type": WIDE_TYPE, "block-and-char": BLOCK_AND_CHAR,
           "twice-two-loads": TWICE_TWO_LOADS, "imm64-verdict": IMM64_VERDICT, "reload-after-jump": RELOAD_AFTER_JUMP,
           "jset-minor": JSET_MINOR, "ordered": ORDERED, "exact-by-order": EXACT_BY_ORDER,
           "jmp32-signed": JMP32_SIGNED, "not-next-block": NOT_NEXT_BLOCK}


# --- random programs of many shapes -------------------------------------------------------------------

REGS = [2, 3, 4, 5, 6, 7]
LOADS = [(0x61, 0), (0x61, 4), (0x61, 8), (0x69, 0), (0x69, 2), (0x71, 0), (0x71, 2)]
CONSTS = [0, 1, 2, 3, 4, 6, 7, 5, 136, 200, 226, 234, 0xFFFF, 1 << 31, U32, -1, -226]
JUMPS = [0x15, 0x55, 0x25, 0x35, 0xA5, 0xB5, 0x45, 0x65, 0x75, 0xC5, 0xD5]  # JMP imm ops


@st.composite
def programs(draw: st.DrawFn, ax: int = AX) -> bytes:
    """Random programs; ``ax`` is the register the blinded-looking constants go through (the kernel's AX,
    11, which the verifier does not let a loaded program use: the kernel tests pass another)."""
    prologue: list = []
    if draw(st.integers(0, 4)):
        prologue += PROLOGUE
    for reg in draw(st.lists(st.sampled_from([6, 7, 6, 7, 2, 4, 5]), max_size=3)):  # (duplicate) loads, narrow
        code, off = draw(st.sampled_from(LOADS))
        prologue.append(i(code, reg, 1, off))
        if draw(st.booleans()):
            prologue.append(i(draw(st.sampled_from([0x54, 0x74, 0x57, 0x44, 0xA4])), reg,
                              imm=draw(st.sampled_from([0xFFFF, 16, 7, 6, 2]))))
    blocks = [prologue]
    for _ in range(draw(st.integers(1, 5))):
        block: list = []
        for _ in range(draw(st.sampled_from([0, 1, 1, 2, 2, 3]))):
            reg = draw(st.sampled_from([2, 4, 5, 2, 4, 5, 3, 6, 7]))
            kind = draw(st.sampled_from(["jne", "jne", "jne", "other", "x-blinded", "access", "access", "mov",
                                         "mov-const"]))
            code = 0x55 if kind == "jne" else draw(st.sampled_from(JUMPS))
            if draw(st.booleans()):
                code = code & ~0x07 | 0x06  # JMP32
            imm = draw(st.sampled_from(CONSTS))
            target = "next" if draw(st.integers(0, 9)) else draw(st.integers(0, 6))
            if kind in ("jne", "other"):
                block.append(("j", code, reg, 0, imm, target))
            elif kind == "x-blinded":
                r = draw(st.integers(-(1 << 31), (1 << 31) - 1))
                block += [i(0xB7, ax, imm=imm ^ r), i(0xA7, ax, imm=r), ("j", code | 0x08, reg, ax, 0, target)]
            elif kind == "access":
                block += [i(0xBC, 1, 3), i(0x54, 1, imm=draw(st.integers(0, 7))), ("j", 0x5D, 1, 3, 0, target)]
            elif kind == "mov":
                block.append(i(draw(st.sampled_from([0xBC, 0xBF])), reg, draw(st.sampled_from(REGS))))
            else:
                block.append(i(0xB4, reg, imm=imm))
        verdict = draw(st.sampled_from([0, 1]))
        block += [i(0xAF, 0, 0)] if verdict == 0 and draw(st.booleans()) else [i(0xB4, 0, imm=verdict)]
        block.append(i(0x95))
        blocks.append(block)
    blocks.append([i(0xB4, 0, imm=draw(st.sampled_from([0, 1]))), i(0x95)])
    return asm(*blocks)
