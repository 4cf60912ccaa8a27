"""cgroup v2 device filters, eBPF program -> rules, checked: an exact interpreter and a decoder.

Reading.  To grant devices on a live cgroup the hook reads the attached
program back (the kernel's translated instructions), turns it into rules, and
loads ``build([*grant, *old_rules])``.  Reading a program that somebody else
wrote must never *widen* the policy, so nothing read is trusted:

1. :func:`decode` proposes a rule list by following the fall-through path of
   each block (any straight-line code, constants included, so the kernel's
   constant blinding under ``net.core.bpf_jit_harden`` reads like the
   original).  Every mismatch jump of a block must land on the next block,
   and registers that differ between the paths joining there become unknown.
2. The proposal is then *checked*: the original program and the program
   built from the proposal are both executed by :func:`_leaves`, an exact
   interpreter of the instruction subset below, over the whole input space,
   and must agree everywhere (identical bytes need no run: runc's and our
   programs without hardening).  Old and new program are compared the same
   way (:func:`check_extension`): equal everywhere except exactly the
   granted devices and accesses, which the new one must allow.  Any
   difference, any instruction outside the subset: :class:`NotDecodable`.
   That ``build(rules)`` is ``first_match(rules)`` is what the tests prove
   (:func:`check_rules`, the same cells with ``first_match`` per cell, over
   random rule lists and every accepted random program; kernel probes), so
   the hook does not pay for a ``first_match`` per cell.

The input space and why a finite check covers it.  The context is
``access_type = access << 16 | type``, ``major``, ``minor`` (three u32).  The
kernel only asks with type 1 (block) or 2 (char) and access bits 1..7, so the
access_type word is enumerated: types 0..3 times access 1..7 (28 words, a
superset).  major and minor range over all 2**32 values each and are handled
as *sets of intervals*: the interpreter runs on a region (set of words x
major intervals x minor intervals) and splits it at every conditional jump
into the part that jumps and the part that falls through, so each resulting
leaf is a region on which the program takes one single path, and the leaves
partition the space.  This is exact because of what the interpreter allows a
register holding a major/minor to do: be copied (mov), and be compared with a
*constant* by ``==, !=, <, <=, >, >=`` (unsigned or signed, 32 or 64 bit).
Such a predicate ``v OP k`` over v in [0, 2**32) is constant on every piece
of the interval split at the points ``k mod 2**32``, ``k+1 mod 2**32`` and
``2**31`` (unsigned order: the pieces lie on one side of k or are {k}; 64-bit
compares of a zero-extended u32 with a constant outside [0, 2**32) are
constant; signed 32-bit order equals unsigned order inside each half split
at 2**31), so evaluating it at one point of a piece decides the whole piece.
Everything else on a major or minor register is refused: arithmetic,
``jset`` (``v & k`` is not constant on intervals), comparing it with another
field or with a value computed from the access_type word.  Values computed
from the access_type word are vectors (one value per enumerated word) and
any ALU/jump on them is evaluated word by word; constants are plain numbers.
Comparing two programs (or a program and a rule list) then needs only one
point per cell of the common refinement of their leaves (plus the rules'
constants): both are constant on each such cell.  ``first_match`` compares a
rule's major/minor to the device by equality only, so it too is constant on
every cell.  Constants come from ALU immediates and plain 64-bit loads
(``ld_imm64`` with src 0), blinded or not.  Refused outright: backward jumps
(no loops), calls, loads other than the context fields (W at 0/4/8; H/B
inside access_type on little-endian machines), stores, ``r10``, signed
div/mod and sign-extending moves, byte swaps, exits whose r0 is not 0 or 1,
and programs whose exploration exceeds a step budget.

Hardening.  With ``net.core.bpf_jit_harden`` (1: unprivileged loads, 2: all)
the kernel's read-back is the blinded program (kernel/bpf/core.c,
``bpf_jit_blind_insn``): ``OP dst, imm`` becomes ``mov ax, imm^rnd; xor ax,
rnd; OP dst, ax`` for ALU32/ALU64 add/sub/mul/div/mod/and/or/xor/mov and for
every conditional JMP/JMP32 (in the width of the original), ``mov dst, 0``
becomes ``dst ^= dst``, and ``ld_imm64`` becomes mov/xor/lsh/mov then
mov/xor/or through ax (register 11).  Nothing special-cases these: they are
ordinary instructions of the subset, executed exactly; ``x ^= x`` and ``x -=
x`` are 0 even when x was never set.  The verifier's own rewrites (dead code
removed, ``if ... goto +0`` left behind, div-by-zero guards) are read the
same way.
"""

from __future__ import annotations

import struct
import sys

from oci_gpu_hook.appliers.devicefilter import (
    ACCESS_BITS,
    EXIT,
    JA,
    LD_IMM64,
    REG_AX,
    U32,
    U64,
    build,
)
from oci_gpu_hook.core.devices import Rule

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    Value = int | tuple[int, ...] | str | None  # constant, per-word vector, 'ctx'/'major'/'minor', unknown
    Intervals = tuple[tuple[int, int], ...]
    Region = tuple[int, Intervals, Intervals]  # (bit mask over WORDS, major set, minor set)
    Leaf = tuple[int, Intervals, Intervals, int | tuple[int, ...]]


class NotDecodable(ValueError):
    """The program cannot be read into rules that provably mean the same (see the module doc)."""


# --- the input space ------------------------------------------------------------------------------

WORDS = tuple((kind, access) for kind in (0, 1, 2, 3) for access in range(1, 8))  # access_type words
ALL_WORDS = (1 << len(WORDS)) - 1
FULL: Intervals = ((0, U32),)
FIELDS = ("major", "minor")
TYPE_OF = {0: "0", 1: "b", 2: "c", 3: "3"}  # first_match's name of each enumerated type
ACCESS_OF = tuple("".join(letter for letter in "rwm" if bits & ACCESS_BITS[letter]) for bits in range(8))
STEP_BUDGET = 100_000  # instructions the checker may execute (all paths together) per program
_LITTLE = sys.byteorder == "little"
_MIRROR = {0x20: 0xA0, 0xA0: 0x20, 0x30: 0xB0, 0xB0: 0x30, 0x60: 0xC0, 0xC0: 0x60, 0x70: 0xD0, 0xD0: 0x70}


def _parse(insns: bytes) -> list[tuple[int, int, int, int, int]]:
    if not insns or len(insns) % 8:
        raise NotDecodable("no instructions to read")
    prog = []
    for at in range(0, len(insns), 8):
        code, regs, off, imm = struct.unpack_from("=BBhi", insns, at)
        if regs & 0xF > REG_AX or regs >> 4 > REG_AX:
            raise NotDecodable(f"register number out of range at {at // 8}")
        prog.append((code, regs & 0xF, regs >> 4, off, imm))
    return prog


# --- exact semantics of one instruction on numbers ------------------------------------------------

def _alu(code: int, a: int, b: int) -> int:
    """``a OP b`` as the kernel computes it: u64, or u32 zero-extended for the ALU32 class."""
    bits = 64 if code & 0x07 == 0x07 else 32
    mask = (1 << bits) - 1
    a, b, op = a & mask, b & mask, code & 0xF0
    if op == 0x00:
        out = a + b
    elif op == 0x10:
        out = a - b
    elif op == 0x20:
        out = a * b
    elif op == 0x30:
        out = a // b if b else 0  # the verifier patches division by zero to give 0
    elif op == 0x40:
        out = a | b
    elif op == 0x50:
        out = a & b
    elif op == 0x60:
        out = a << (b & (bits - 1))
    elif op == 0x70:
        out = a >> (b & (bits - 1))
    elif op == 0x80:
        out = -a
    elif op == 0x90:
        out = a % b if b else a  # ... and modulo by zero to leave dst alone
    elif op == 0xA0:
        out = a ^ b
    elif op == 0xB0:
        out = b
    elif op == 0xC0:
        out = (a - (a >> (bits - 1) << bits)) >> (b & (bits - 1))
    else:
        raise NotDecodable(f"ALU operation {code:#x}")
    return out & mask


def _cond(code: int, a: int, b: int) -> bool:
    """Is the conditional jump ``code`` taken for ``a`` (dst) and ``b`` (src or imm)?"""
    bits = 32 if code & 0x07 == 0x06 else 64
    mask = (1 << bits) - 1
    a, b, op = a & mask, b & mask, code & 0xF0
    if op in (0x60, 0x70, 0xC0, 0xD0):  # signed
        sign = 1 << (bits - 1)
        a, b = (a ^ sign) - sign, (b ^ sign) - sign
    if op == 0x10:
        return a == b
    if op == 0x50:
        return a != b
    if op == 0x40:
        return bool(a & b)
    if op in (0x20, 0x60):
        return a > b
    if op in (0x30, 0x70):
        return a >= b
    if op in (0xA0, 0xC0):
        return a < b
    if op in (0xB0, 0xD0):
        return a <= b
    raise NotDecodable(f"jump operation {code:#x}")


def _jump_kind(code: int, off: int, pc: int) -> str:
    """'exit', 'ja' or 'cond' for a JMP/JMP32 instruction; NotDecodable for calls, backward jumps, the rest."""
    if code == EXIT:
        return "exit"
    if off < 0:
        raise NotDecodable(f"backward jump at {pc}")
    if code == JA:
        return "ja"
    op = code & 0xF0
    if op in (0x00, 0x80, 0x90, 0xE0, 0xF0):
        raise NotDecodable(f"unexpected jump opcode {code:#x} at {pc}")
    return "cond"


# --- abstract values: constants, per-word vectors, the major/minor fields -------------------------

def _initial() -> list[Value]:
    regs: list[Value] = [None] * (REG_AX + 1)
    regs[1], regs[10] = "ctx", "fp"
    return regs


def _collapse(vector: tuple[int, ...]) -> int | tuple[int, ...]:
    return vector[0] if vector.count(vector[0]) == len(vector) else vector


def _unusable(value: Value) -> str:
    if value in FIELDS:
        return "arithmetic on the major/minor number"
    if value is None:
        return "a register read before it is set, or set differently on paths that join"
    return f"arithmetic on the {value} pointer"


def _step(insn: tuple[int, int, int, int, int], regs: list[Value], pc: int) -> None:
    """One ALU or LDX instruction on abstract registers."""
    code, dst, src, off, imm = insn
    cls = code & 0x07
    if cls == 0x01:
        regs[dst] = _load(code, regs[src], off, pc)
        return
    if cls not in (0x04, 0x07) or off:
        raise NotDecodable(f"unexpected opcode {code:#x} at {pc}")
    op, wide = code & 0xF0, cls == 0x07
    if code & 0x08:
        if src == dst and op in (0x10, 0xA0):  # x -= x, x ^= x: 0 (blinding writes `r0 = 0` as r0 ^= r0)
            regs[dst] = 0
            return
        operand = regs[src]
    else:
        operand = imm & (U64 if wide else U32)
    if op == 0xB0 and (operand in FIELDS or (operand == "ctx" and wide)):
        regs[dst] = operand  # a copy (a u32 field zero-extended is itself)
        return
    value = 0 if op == 0xB0 else regs[dst]
    if op == 0x80:
        operand = 0
    for item in (value, operand):
        if not isinstance(item, (int, tuple)):
            raise NotDecodable(f"{_unusable(item)} at {pc}")
    regs[dst] = _lift(code, value, operand)  # type: ignore[arg-type]


_TAKEN: dict[tuple[int, int | tuple[int, ...], int | tuple[int, ...]], int] = {}  # vector jumps, memoised
_LIFTED: dict[tuple[int, int | tuple[int, ...], int | tuple[int, ...]], int | tuple[int, ...]] = {}


def _lift(code: int, a: int | tuple[int, ...], b: int | tuple[int, ...]) -> int | tuple[int, ...]:
    if isinstance(a, int) and isinstance(b, int):
        return _alu(code, a, b)
    key = (code, a, b)
    if key not in _LIFTED:
        _LIFTED[key] = _lift_vector(code, a, b)
    return _LIFTED[key]


def _lift_vector(code: int, a: int | tuple[int, ...], b: int | tuple[int, ...]) -> int | tuple[int, ...]:
    left = a if isinstance(a, tuple) else (a,) * len(WORDS)
    right = b if isinstance(b, tuple) else (b,) * len(WORDS)
    return _collapse(tuple(_alu(code, x, y) for x, y in zip(left, right, strict=True)))


def _load(code: int, base: Value, off: int, pc: int) -> Value:
    if base != "ctx":
        raise NotDecodable(f"a load from memory other than the device context at {pc}")
    size = {0x00: 4, 0x08: 2, 0x10: 1}.get(code & 0x18)
    if code & 0xE0 != 0x60 or size is None:
        raise NotDecodable(f"unexpected load opcode {code:#x} at {pc}")
    if size == 4 and off in (4, 8):
        return FIELDS[off // 4 - 1]
    if off >= 0 and off + size <= 4 and off % size == 0 and (size == 4 or _LITTLE):
        shift, mask = 8 * off, (1 << 8 * size) - 1
        return _collapse(tuple((access << 16 | kind) >> shift & mask for kind, access in WORDS))
    raise NotDecodable(f"a load of {size} bytes at context offset {off} at {pc}")


def _split(insn: tuple[int, int, int, int, int], regs: list[Value], region: Region,
           pc: int) -> tuple[Region | None, Region | None]:
    """The parts of ``region`` for which the conditional jump is taken, and not taken (None: empty)."""
    code, dst, src, _off, imm = insn
    a = regs[dst]
    b = regs[src] if code & 0x08 else imm & (U32 if code & 0x07 == 0x06 else U64)
    words, major, minor = region
    if isinstance(a, int) and isinstance(b, int):
        return (region, None) if _cond(code, a, b) else (None, region)
    if isinstance(a, (int, tuple)) and isinstance(b, (int, tuple)):
        key = (code, a, b)
        if key not in _TAKEN:
            left = a if isinstance(a, tuple) else (a,) * len(WORDS)
            right = b if isinstance(b, tuple) else (b,) * len(WORDS)
            _TAKEN[key] = sum(1 << i for i, (x, y) in enumerate(zip(left, right, strict=True)) if _cond(code, x, y))
        taken = _TAKEN[key] & words
        return ((taken, major, minor) if taken else None,
                (words & ~taken, major, minor) if words & ~taken else None)
    if a in FIELDS and isinstance(b, int):
        field, k = a, b
    elif b in FIELDS and isinstance(a, int):
        field, k, code = b, a, code & 0x0F | _MIRROR.get(code & 0xF0, code & 0xF0)
    else:
        culprit = a if not isinstance(a, (int, tuple)) else b
        what = "compares the major/minor number with a non-constant" if culprit in FIELDS else _unusable(culprit)
        raise NotDecodable(f"a jump that {what} at {pc}")
    if code & 0xF0 == 0x40:
        raise NotDecodable(f"jset on the {field} number at {pc}")
    yes, no = _cut(major if field == "major" else minor, code, k)
    if field == "major":
        return ((words, yes, minor) if yes else None), ((words, no, minor) if no else None)
    return ((words, major, yes) if yes else None), ((words, major, no) if no else None)


_CUTS: dict[tuple[Intervals, int, int], tuple[Intervals, Intervals]] = {}


def _cut(intervals: Intervals, code: int, k: int) -> tuple[Intervals, Intervals]:
    key = (intervals, code, k)
    if key not in _CUTS:
        _CUTS[key] = _cut_now(intervals, code, k)
    return _CUTS[key]


def _cut_now(intervals: Intervals, code: int, k: int) -> tuple[Intervals, Intervals]:
    """Split u32 intervals by ``v OP k``: constant on each piece between k, k+1 and 2**31 (module doc)."""
    points = sorted({k & U32, (k + 1) & U32, 1 << 31})
    yes: list[tuple[int, int]] = []
    no: list[tuple[int, int]] = []
    for lo, hi in intervals:
        start = lo
        for end in [p - 1 for p in points if lo < p <= hi] + [hi]:
            side = yes if _cond(code, start, k) else no
            if side and side[-1][1] == start - 1:
                side[-1] = (side[-1][0], end)
            else:
                side.append((start, end))
            start = end + 1
    return tuple(yes), tuple(no)


def _run_to_jump(prog: list[tuple[int, int, int, int, int]], pc: int, regs: list[Value]) -> int:
    """Execute the ALU and load instructions from ``pc`` on; the index of the next JMP-class one."""
    while pc < len(prog):
        code, dst, src, _off, imm = prog[pc]
        if code & 0x07 in (0x05, 0x06):
            return pc
        if code == LD_IMM64:  # two slots: the low and the high half of a 64-bit constant
            if src or pc + 1 >= len(prog) or prog[pc + 1][0]:
                raise NotDecodable(f"a 64-bit load that is not a plain constant at {pc}")
            regs[dst] = imm & U32 | (prog[pc + 1][4] & U32) << 32
            pc += 2
            continue
        _step(prog[pc], regs, pc)
        pc += 1
    raise NotDecodable("the program runs off its end")


def _verdict(value: Value, pc: int) -> int | tuple[int, ...]:
    if isinstance(value, int) and value in (0, 1):
        return value
    if isinstance(value, tuple) and set(value) <= {0, 1}:
        return value
    raise NotDecodable(f"exit without a verdict of 0 or 1 at {pc}")


# --- the checker: every path of a program over the whole input space ------------------------------

_LEAVES: dict[bytes, list[Leaf]] = {}


def _leaves(insns: bytes) -> list[Leaf]:
    """(words, majors, minors, verdict) regions, one per path, that partition the input space."""
    if insns in _LEAVES:
        return _LEAVES[insns]
    if len(_LEAVES) > 16 or len(_TAKEN) + len(_LIFTED) + len(_CUTS) > 50_000:  # memos for one hook run
        for memo in (_LEAVES, _TAKEN, _LIFTED, _CUTS):
            memo.clear()
    prog = _parse(insns)
    leaves: list[Leaf] = []
    budget = STEP_BUDGET
    stack: list[tuple[int, list[Value], Region]] = [(0, _initial(), (ALL_WORDS, FULL, FULL))]
    while stack:
        pc, regs, region = stack.pop()
        while True:
            start, pc = pc, _run_to_jump(prog, pc, regs)
            budget -= pc - start + 1
            if budget < 0:
                raise NotDecodable("too many paths to check")
            insn = prog[pc]
            kind = _jump_kind(insn[0], insn[3], pc)
            if kind == "exit":
                leaves.append((*region, _verdict(regs[0], pc)))
                break
            if kind == "ja":
                pc += 1 + insn[3]
                continue
            taken, fallen = _split(insn, regs, region, pc)
            if taken and fallen:
                stack.append((pc + 1 + insn[3], list(regs), taken))
            if fallen:
                region, pc = fallen, pc + 1
            else:
                region, pc = taken, pc + 1 + insn[3]  # type: ignore[assignment]
    _LEAVES[insns] = leaves
    return leaves


def run(insns: bytes, access_type: int, major: int, minor: int) -> int:
    """The program's verdict for one context, executed concretely (no abstraction): the reference the
    tests hold :func:`_leaves` to."""
    prog = _parse(insns)
    regs = [0] * (REG_AX + 1)
    fields = {0: access_type & U32, 4: major & U32, 8: minor & U32}
    pc = 0
    while True:
        code, dst, src, off, imm = prog[pc]
        cls = code & 0x07
        if cls == 0x01:
            size = {0x00: 4, 0x08: 2, 0x10: 1}[code & 0x18]
            word = fields[off & ~3]
            regs[dst] = word >> 8 * (off & 3) & (1 << 8 * size) - 1
        elif cls in (0x04, 0x07):
            operand = regs[src] if code & 0x08 else imm
            regs[dst] = _alu(code, regs[dst], operand)
        elif code == LD_IMM64:
            regs[dst] = imm & U32 | (prog[pc + 1][4] & U32) << 32
            pc += 1
        elif code == EXIT:
            return regs[0]
        elif code == JA or _cond(code, regs[dst], regs[src] if code & 0x08 else imm):
            pc += off
        pc += 1


def _starts(leaf_sets: Iterable[list[Leaf]], field: int, extra: Iterable[int | None]) -> list[int]:
    """The first value of every cell of the common refinement of the leaves (and the rules' numbers)."""
    points = {0}
    for leaves in leaf_sets:
        for leaf in leaves:
            for lo, hi in leaf[field]:  # type: ignore[union-attr]
                points.add(lo)
                points.add(hi + 1)
    for k in extra:
        if k is not None:
            points.update((k, k + 1))
    points.discard(U32 + 1)
    return sorted(points)


def _paint(leaves: list[Leaf], majors: list[int], minors: list[int]) -> list[int]:
    """The verdict on every cell, from the leaves: one row per (word, major cell), a bit per minor cell."""
    nmaj, nmin = len(majors), len(minors)
    at_maj = {s: i for i, s in enumerate(majors)}
    at_min = {s: i for i, s in enumerate(minors)}
    grid = [0] * (len(WORDS) * nmaj)
    for words, major, minor, verdict in leaves:
        bits = 0
        for lo, hi in minor:
            first = at_min[lo]
            bits |= ((1 << (at_min.get(hi + 1, nmin) - first)) - 1) << first
        spans = [(at_maj[lo], at_maj.get(hi + 1, nmaj)) for lo, hi in major]
        for i in range(len(WORDS)):
            if words >> i & 1 and (verdict[i] if isinstance(verdict, tuple) else verdict):
                for first, end in spans:
                    for row in range(i * nmaj + first, i * nmaj + end):
                        grid[row] |= bits
    return grid


def _table(rules: Sequence[Rule], majors: list[int], minors: list[int]) -> list[int]:
    """``first_match`` of the rules on every cell, in :func:`_paint`'s layout; it compares numbers only for
    equality with the rules' own, so all numbers that are none of them give one answer (computed once)."""
    from oci_gpu_hook.core.rules import first_match

    own_majors, own_minors = {r.major for r in rules}, {r.minor for r in rules}
    major_keys = [m if m in own_majors else -1 for m in majors]
    minor_keys = [m if m in own_minors else -1 for m in minors]
    memo: dict[tuple[int, int, int], int] = {}
    grid = []
    for i, (kind, access) in enumerate(WORDS):
        kind_name, access_name = TYPE_OF[kind], ACCESS_OF[access]
        for major, major_key in zip(majors, major_keys, strict=True):
            row = 0
            for k, (minor, minor_key) in enumerate(zip(minors, minor_keys, strict=True)):
                key = (i, major_key, minor_key)
                if key not in memo:
                    memo[key] = int(first_match(rules, kind_name, major, minor, access_name))
                row |= memo[key] << k
            grid.append(row)
    return grid


def _difference(got: list[int], want: list[int], majors: list[int], minors: list[int]) -> tuple[bool, str]:
    """The first cell where two grids differ: (allowed in ``got``?, a device and access there)."""
    row = next(r for r, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
    bit = ((got[row] ^ want[row]) & -(got[row] ^ want[row])).bit_length() - 1
    i, j = divmod(row, len(majors))
    kind, access = WORDS[i]
    return bool(got[row] >> bit & 1), f"{TYPE_OF[kind]} {majors[j]}:{minors[bit]} {ACCESS_OF[access]}"


def _same(programs: Sequence[bytes], want: bytes, what: str) -> None:
    """NotDecodable unless program ``want`` allows exactly what the ``programs`` together (any of them) allow."""
    leaf_sets = [_leaves(p) for p in (*programs, want)]
    majors, minors = _starts(leaf_sets, 1, ()), _starts(leaf_sets, 2, ())
    expected = _paint(leaf_sets[0], majors, minors)
    for leaves in leaf_sets[1:-1]:
        expected = [a | b for a, b in zip(expected, _paint(leaves, majors, minors), strict=True)]
    got = _paint(leaf_sets[-1], majors, minors)
    if got != expected:
        allowed, where = _difference(got, expected, majors, minors)
        raise NotDecodable(f"{what} {'allow' if allowed else 'deny'} {where}")


def check_rules(insns: bytes, rules: Sequence[Rule]) -> None:
    """NotDecodable unless ``first_match(rules)`` is the program's verdict on every input (the tests' check:
    it costs a first_match per cell; the hook checks ``build(rules)`` instead, see :func:`decode`)."""
    leaves = _leaves(insns)
    majors = _starts([leaves], 1, (r.major for r in rules))
    minors = _starts([leaves], 2, (r.minor for r in rules))
    got, want = _paint(leaves, majors, minors), _table(rules, majors, minors)
    if got != want:
        allowed, where = _difference(got, want, majors, minors)
        raise NotDecodable(f"the rules read differ from the program on {where} "
                           f"(the program {'allows' if allowed else 'denies'} it)")


def check_extension(old: bytes, new: bytes, grant: Sequence[Rule]) -> None:
    """NotDecodable unless program ``new`` allows exactly what ``old`` allows plus ``grant``."""
    _same([old, build(grant)], new, "the new program would")


# --- the decoder: a rule list proposed from the fall-through paths, then checked ------------------

def decode(insns: bytes) -> list[Rule]:
    """First-match rules that provably mean what the program does (module doc); NotDecodable otherwise.

    The proof run here compares the program with ``build(rules)`` by the interpreter; that ``build`` is
    ``first_match`` is what the tests prove (:func:`check_rules` over random rule lists, kernel probes)."""
    rules = _propose(_parse(insns))
    rebuilt = build(rules)
    if rebuilt != insns:  # identical bytes need no proof (runc's and our programs without hardening)
        _same([rebuilt], insns, "the rules read differ from the program, which would")
    return rules


def extend(insns: bytes, rules: Sequence[Rule], grant: Sequence[Rule]) -> bytes:
    """The program for ``grant`` before the decoded ``rules`` of ``insns``, checked against ``insns``."""
    new = build([*grant, *rules])
    check_extension(insns, new, grant)
    return new


def _propose(prog: list[tuple[int, int, int, int, int]]) -> list[Rule]:
    regs, pc, rules = _initial(), 0, []
    while True:
        region: Region | None = (ALL_WORDS, FULL, FULL)
        jumps: list[tuple[int, list[Value]]] = []  # each mismatch jump: where to, registers there
        resume = -1  # after a `ja` to a shared verdict: where the next block starts
        while True:
            pc = _run_to_jump(prog, pc, regs)
            insn = prog[pc]
            kind = _jump_kind(insn[0], insn[3], pc)
            if kind == "exit":
                break
            if resume >= 0:
                raise NotDecodable(f"a jump after a rule's jump to its verdict at {pc}")
            if kind == "ja":
                resume, pc = pc + 1, pc + 1 + insn[3]
                continue
            if insn[3] == 0:  # goes on either way (the verifier leaves these when it drops dead code)
                pc += 1
                continue
            if region is not None:
                region = _split(insn, regs, region, pc)[1]
            jumps.append((pc + 1 + insn[3], list(regs)))
            pc += 1
        verdict = regs[0]
        if verdict not in (0, 1) or not isinstance(verdict, int):
            raise NotDecodable(f"exit without a constant verdict at {pc}")
        rule = _rule_of(region, bool(verdict))
        if rule is not None:
            rules.append(rule)
        if not jumps:
            return rules
        after = resume if resume >= 0 else pc + 1
        if any(target != after for target, _ in jumps):
            raise NotDecodable(f"a rule block ending at {pc} does not jump to the next block")
        regs = jumps[0][1]
        if any(seen != regs for _, seen in jumps):
            regs = [value if all(seen[r] == value for _, seen in jumps) else None for r, value in enumerate(regs)]
        pc = after


# For each access mask, the accesses a rule with it matches (those within it), as bits of one type's 7 words.
_WITHIN = {sum(1 << (a - 1) for a in range(1, 8) if not a & ~mask): mask for mask in range(1, 8)}
_KINDS = {(0, 1, 2, 3): "a", (1,): "b", (2,): "c"}


def _rule_of(region: Region | None, allow: bool) -> Rule | None:
    """The rule of a block that matches ``region`` (None: nothing); NotDecodable when no rule says it."""
    if region is None:
        return None
    words, major, minor = region
    rows = [words >> 7 * kind & 0x7F for kind in range(4)]  # WORDS is type-major, 7 accesses per type
    present = tuple(kind for kind in range(4) if rows[kind])
    kind_name = _KINDS.get(present)
    if kind_name is None:
        raise NotDecodable(f"a block for device types {list(present)}")
    mask = _WITHIN.get(rows[present[0]])
    if mask is None or any(rows[kind] != rows[present[0]] for kind in present):
        raise NotDecodable("a block whose access condition is not 'the access asked is within a set'")
    return Rule(allow, kind_name, _number(major), _number(minor), ACCESS_OF[mask])


def _number(intervals: Intervals) -> int | None:
    if intervals == FULL:
        return None
    if len(intervals) == 1 and intervals[0][0] == intervals[0][1]:
        return intervals[0][0]
    raise NotDecodable("a block that matches a range of device numbers")
