"""The decoder never widens: differential tests of devicefilter against an independent concrete interpreter.

Every program here is either refused (NotDecodable) or decoded into rules whose ``first_match`` is the
program's verdict on every probed device (``devicefilter_decode.run``, plain concrete execution, is the oracle),
and the program built from old + grant allows exactly old plus the grant.  Programs come in runc's shape
(``build`` over random rules), blinded the way ``bpf_jit_harden`` does, and in hostile shapes: duplicate
loads, a field tested twice in a block, paths that join with different register contents, jset, ordered
comparisons, narrow loads, jumps that do not land on the next block.

The helpers (assembler, blinding, the hostile programs) are used by test_ebpf_kernel.py too.
"""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oci_gpu_hook.appliers import devicefilter as df
from oci_gpu_hook.appliers import devicefilter_decode as dfd
from oci_gpu_hook.core.devices import Rule
from oci_gpu_hook.core.rules import first_match
from oci_gpu_hook.errors import HookError

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


# --- the oracle -------------------------------------------------------------------------------------

def numbers(program: bytes, extra: list[int] = ()) -> list[int]:
    """Probe numbers: every constant of the program (blinded ones too) and its neighbours, and the edges."""
    found = {0, 1, U32, U32 - 1, 1 << 31, (1 << 31) - 1, *extra}
    regs: dict[int, int] = {}
    for code, dst, _src, _off, imm in insns_of(program):
        values = [imm & U32]
        if code in (0xA4, 0xA7) and dst in regs:
            values.append((regs[dst] ^ imm) & U32)
        if code in (0xB4, 0xB7):
            regs[dst] = imm
        for value in values:
            found.update({value, (value + 1) & U32, (value - 1) & U32})
    return sorted(found)


def probe(program: bytes, rules: list[Rule] | None = None, *, extra: list[int] = (), count: int = 300):
    """(device, verdict) pairs by the concrete interpreter: ``count`` points drawn from the words times the
    probe numbers (the program's constants, the rules' and ``extra``, with neighbours and edges)."""
    nums = numbers(program, [*extra, *(n for r in rules or () for n in (r.major, r.minor) if n is not None)])
    pick = random.Random(program)
    for _ in range(count):
        kind, access = pick.choice(dfd.WORDS)
        major, minor = pick.choice(nums), pick.choice(nums)
        yield (dfd.TYPE_OF[kind], major, minor, dfd.ACCESS_OF[access]), dfd.run(program, access << 16 | kind,
                                                                              major, minor)


def assert_exact(program: bytes, rules: list[Rule]) -> None:
    dfd.check_rules(program, rules)  # the whole space, by cells
    for (kind, major, minor, access), verdict in probe(program, rules):  # and the plain oracle on points
        assert bool(verdict) == first_match(rules, kind, major, minor, access), (kind, major, minor, access)


def assert_extension(program: bytes, rules: list[Rule], grant: list[Rule]) -> None:
    new = dfd.extend(program, rules, grant)
    extra = [n for r in grant for n in (r.major, r.minor)]
    for (kind, major, minor, access), verdict in probe(program, rules, extra=extra):
        want = bool(verdict) or first_match(grant, kind, major, minor, access)
        assert bool(dfd.run(new, _word(kind, access), major, minor)) == want, (kind, major, minor, access)


def _word(kind: str, access: str) -> int:
    bits = {"0": 0, "b": 1, "c": 2, "3": 3}[kind]
    return sum(df.ACCESS_BITS[letter] for letter in access) << 16 | bits


def decoded_or_refused(program: bytes) -> list[Rule] | None:
    try:
        rules = dfd.decode(program)
    except dfd.NotDecodable:
        return None
    assert_exact(program, rules)
    return rules


# --- runc's shape -----------------------------------------------------------------------------------

rule_lists = st.lists(st.builds(
    Rule, st.booleans(), st.sampled_from(["a", "b", "c"]),
    st.one_of(st.none(), st.sampled_from([0, 1, 5, 10, 136, 226, 234, U32]), st.integers(0, U32)),
    st.one_of(st.none(), st.sampled_from([0, 1, 3, 128, 129, 255, U32]), st.integers(0, U32)),
    st.sampled_from(ACCESS)), max_size=8)
grants = st.lists(st.builds(Rule, st.just(True), st.sampled_from(["b", "c"]), st.sampled_from([226, 234, 1, 7]),
                            st.sampled_from([0, 1, 2, 129, 3]), st.sampled_from(ACCESS)), min_size=1, max_size=3)


def _expected(rules: list[Rule]) -> list[Rule]:
    out = []
    for rule in rules:
        out.append(rule)
        if rule.type == "a" and rule.major is None and rule.minor is None and rule.access == "rwm":
            return out
    return [*out, Rule(False, "a", None, None, "rwm")]


@settings(max_examples=120, deadline=None)
@given(rule_lists, st.integers(0, 1 << 30))
def test_runc_shape_plain_and_blinded_decode_exactly(rules: list[Rule], seed: int) -> None:
    program = df.build(rules)
    assert dfd.decode(program) == _expected(rules)
    dfd.check_rules(program, rules)  # build is first_match, on every cell of the device space
    blinded = blind(program, seed)
    assert blinded != program
    assert dfd.decode(blinded) == _expected(rules)  # every constant blinded, `r0 = 0` as `r0 ^= r0`
    assert_exact(blinded, _expected(rules))


@settings(max_examples=80, deadline=None)
@given(rule_lists, grants, st.booleans())
def test_extension_is_old_plus_grant(rules: list[Rule], grant: list[Rule], hardened: bool) -> None:
    program = df.build(rules)
    if hardened:
        program = blind(program, len(rules))
    decoded = dfd.decode(program)
    assert_extension(program, decoded, grant)


def test_check_extension_refuses_anything_but_old_plus_grant() -> None:
    old = [Rule(True, "c", 1, 3, "rwm"), Rule(False, "a", None, None, "rwm")]
    grant = [Rule(True, "c", 226, 1, "rw")]
    dfd.check_extension(df.build(old), df.build([*grant, *old]), grant)
    with pytest.raises(dfd.NotDecodable, match="would allow c 226:1 m"):
        dfd.check_extension(df.build(old), df.build([Rule(True, "c", 226, 1, "rwm"), *old]), grant)
    with pytest.raises(dfd.NotDecodable, match="would allow c 226:0 r"):
        dfd.check_extension(df.build(old), df.build([Rule(True, "c", 226, None, "rw"), *old]), grant)
    with pytest.raises(dfd.NotDecodable, match="would deny c 1:3"):
        dfd.check_extension(df.build(old), df.build(grant), grant)


# --- hostile shapes, by hand: the attacker classes of the issue ----------------------------------------

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


@pytest.mark.parametrize("name", sorted(HOSTILE))
@pytest.mark.parametrize("hardened", [False, True], ids=["plain", "blinded"])
def test_hostile_programs_are_refused_or_exact(name: str, hardened: bool) -> None:
    program = blind(HOSTILE[name], 7) if hardened else HOSTILE[name]
    rules = decoded_or_refused(program)
    if rules is not None:
        assert_extension(program, rules, [Rule(True, "c", 226, 129, "rw")])


@pytest.mark.parametrize(("program", "rules"), [
    (FIELD_TWICE, [Rule(False, "a", None, None, "rwm")]),  # the dead block is no rule at all
    (b"".join([*PROLOGUE, i(0x55, 4, off=0, imm=1), *DENY]),  # ... and as the verifier leaves it
     [Rule(False, "a", None, None, "rwm")]),
    (WIDE_TYPE, [Rule(True, "a", None, None, "rwm")]),
    (TWICE_TWO_LOADS, [Rule(False, "a", None, None, "rwm")]),
    (IMM64_VERDICT, [Rule(True, "c", 226, None, "rwm"), Rule(True, "a", None, None, "rwm")]),
    (RELOAD_AFTER_JUMP, [Rule(False, "b", None, None, "rwm"), Rule(True, "a", None, 226, "rwm"),
                         Rule(False, "a", None, None, "rwm")]),  # the whole word is never 2: the deny never matches
    (EXACT_BY_ORDER, [Rule(True, "c", 226, None, "rwm"), Rule(False, "a", None, None, "rwm")]),
    (DEFAULT_ALLOW, [Rule(False, "c", 226, None, "rwm"), Rule(True, "a", None, None, "rwm")]),
    (SYSTEMD_LIKE, [Rule(True, "c", 1, 3, "rw"), Rule(True, "c", 136, None, "rwm"),
                    Rule(False, "a", None, None, "rwm")]),
])
def test_other_writers_programs_decode_exactly(program: bytes, rules: list[Rule]) -> None:
    assert dfd.decode(program) == rules
    assert dfd.decode(blind(program, 3)) == rules
    assert_exact(program, rules)


@pytest.mark.parametrize(("program", "message"), [
    (DUPLICATE_LOAD, "set differently on paths that join"),
    (JOIN_DIFFERENT, "set differently on paths that join"),
    (BLOCK_AND_CHAR, "device types"),
    (JSET_MINOR, "jset on the minor"),
    (ORDERED, "range of device numbers"),
    (JMP32_SIGNED, "range of device numbers"),
    (NOT_NEXT_BLOCK, "does not jump to the next block"),
])
def test_what_cannot_be_said_in_rules_is_refused(program: bytes, message: str) -> None:
    with pytest.raises(dfd.NotDecodable, match=message):
        dfd.decode(program)


@pytest.mark.parametrize("program", [  # with test_devicefilter's (calls, backward jumps, no exit)
    i(0x61, 4, 1, 4) + i(0x07, 4, imm=1) + asm([jne(4, 227), *ALLOW], DENY),  # arithmetic on the major
    i(0x61, 4, 1, 4) + i(0x61, 5, 1, 8) + asm([("j", 0x5D, 4, 5, 0, "next"), *ALLOW], DENY),  # major == minor
    i(0x79, 4, 1, 0) + asm([jne(4, 226), *ALLOW], DENY),  # a DW load
    i(0x69, 4, 1, 4) + asm([jne(4, 226), *ALLOW], DENY),  # a narrow load of the major
    i(0x61, 4, 10, -4) + asm([jne(4, 226), *ALLOW], DENY),  # a stack load
    asm(PROLOGUE, [i(0xB4, 0, imm=2), i(0x95)]),  # verdict 2
    asm(PROLOGUE, [i(0xBF, 0, 4), i(0x95)]),  # verdict = the major
    asm(PROLOGUE, [i(0xBC, 0, 3), i(0x54, 0, imm=1), i(0x95)]),  # verdict from the access bits
])
def test_unknown_programs_are_not_decodable(program: bytes) -> None:
    with pytest.raises(dfd.NotDecodable):
        dfd.decode(program)


def test_the_checker_is_what_catches_a_wrong_proposal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Even a decoder bug cannot widen: a proposal that differs from the program is refused."""
    program = df.build([Rule(True, "c", 1, 3, "rwm")])
    monkeypatch.setattr(dfd, "_propose", lambda prog: [Rule(True, "c", None, None, "rwm"),
                                                      Rule(False, "a", None, None, "rwm")])
    with pytest.raises(dfd.NotDecodable, match="the rules read differ from the program"):
        dfd.decode(program)


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


def _leaf_verdict(program: bytes, kind: int, access: int, major: int, minor: int) -> int:
    word = dfd.WORDS.index((kind, access))
    for words, majors, minors, verdict in dfd._leaves(program):
        if words >> word & 1 and any(lo <= major <= hi for lo, hi in majors) and any(
                lo <= minor <= hi for lo, hi in minors):
            return verdict[word] if isinstance(verdict, tuple) else verdict
    raise AssertionError("the leaves do not cover the input")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs_are_refused_or_decoded_exactly(program: bytes) -> None:
    rules = decoded_or_refused(program)
    if rules is not None:
        assert_extension(program, rules, [Rule(True, "c", 226, 129, "rw"), Rule(True, "c", 234, 0, "rwm")])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.data())
def test_the_path_interpreter_is_the_concrete_one(program: bytes, data: st.DataObject) -> None:
    """The interval/vector interpreter behind every check agrees with plain execution, input by input."""
    try:
        dfd._leaves(program)
    except dfd.NotDecodable:
        return
    nums = numbers(program)
    for _ in range(30):
        kind, access = data.draw(st.sampled_from(dfd.WORDS))
        major = data.draw(st.one_of(st.sampled_from(nums), st.integers(0, U32)))
        minor = data.draw(st.one_of(st.sampled_from(nums), st.integers(0, U32)))
        assert _leaf_verdict(program, kind, access, major, minor) == dfd.run(program, access << 16 | kind,
                                                                             major, minor)


# --- the exact interpreter's arithmetic -----------------------------------------------------------------

@pytest.mark.parametrize(("code", "a", "b", "result"), [
    (0x04, U32, 1, 0), (0x07, U32, 1, 1 << 32), (0x1C, 0, 1, U32), (0x1F, 0, 1, (1 << 64) - 1),
    (0x84, 5, 0, U32 - 4), (0x87, 5, 0, (1 << 64) - 5), (0xC4, 0x80000000, 4, 0xF8000000),
    (0xC7, 1 << 63, 63, (1 << 64) - 1), (0x34, 7, 0, 0), (0x94, 7, 0, 7), (0x64, 1, 33, 2), (0x74, 1 << 31, 31, 1),
    (0xA4, 0xF0, 0xFF, 0x0F), (0xB4, 9, (1 << 64) - 1, U32), (0xB7, 9, (1 << 64) - 1, (1 << 64) - 1),
])
def test_alu(code: int, a: int, b: int, result: int) -> None:
    assert dfd._alu(code, a, b) == result


@pytest.mark.parametrize(("code", "a", "b", "taken"), [
    (0x25, 1 << 31, 5, True), (0x26, 1 << 31, 5, True), (0x66, 1 << 31, 5, False), (0x65, 1 << 31, 5, True),
    (0x55, 226, (1 << 64) - 1, True), (0x56, U32, (1 << 64) - 1, False), (0x45, 6, 4, True), (0x45, 2, 4, False),
    (0xC5, 3, (1 << 64) - 1, False), (0xC6, U32, 0, True), (0xD5, 7, 7, True), (0xB6, 8, 7, False),
])
def test_jumps(code: int, a: int, b: int, taken: bool) -> None:
    assert dfd._cond(code, a, b) == taken


# --- v2_grant's rule for explicit denies (no kernel needed for the decision itself) --------------------

def test_grant_over_an_operator_deny_is_refused() -> None:
    """Refused exactly where runc's emulator refuses the same list in the spec path (a hole in a wildcard)."""
    from oci_gpu_hook.appliers.cgroups import _v2_grants
    from oci_gpu_hook.core.rules import Policy

    plan = (Rule(True, "c", 226, 1, "rw"),)
    default_deny = [Rule(True, "c", 1, 3, "rwm"), Rule(False, "a", None, None, "rwm")]
    assert _v2_grants(default_deny, plan, "p") is False  # denied by default: prepend the allow rule
    assert _v2_grants([Rule(True, "c", 226, None, "rwm"), *default_deny], plan, "p") is True
    allow_all = Rule(True, "a", None, None, "rwm")
    for denies, refused in [
        ([Rule(False, "c", 226, None, "rwm")], True),
        ([Rule(False, "c", 226, None, "w")], True),  # shares the w
        ([Rule(False, "c", 226, None, "m")], False),  # shares nothing with rw
        ([Rule(False, "c", None, 1, "r")], True),
        ([Rule(False, "b", 226, None, "rwm")], False),  # another type
        ([Rule(False, "c", 226, 1, "rwm")], False),  # exactly the device: the planned allow overrides it
        ([Rule(False, "c", 226, 1, "rwm"), Rule(False, "c", 226, None, "rwm")], True),
        ([Rule(False, "c", 10, 200, "rwm")], False),  # already allowed: nothing to grant
    ]:
        old = [*denies, allow_all]
        emulator = Policy.of([allow_all, *denies])  # the config runc would have made this program from
        try:
            for rule in plan:
                emulator.apply(rule)
            runc_refuses = False
        except HookError:
            runc_refuses = True
        assert runc_refuses == refused, denies
        if refused:
            with pytest.raises(HookError, match=r"has the rule 'deny .*', which covers the planned 'c 226:1 rw'"):
                _v2_grants(old, plan, "p")
        else:
            _v2_grants(old, plan, "p")
