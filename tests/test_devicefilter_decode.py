"""The decoder never widens: differential tests of devicefilter against an independent concrete interpreter.

Every program here is either refused (NotDecodable) or decoded into rules whose ``first_match`` is the
program's verdict on every probed device (``devicefilter_decode.run``, plain concrete execution, is the oracle),
and the program built from old + grant allows exactly old plus the grant.  Programs come in runc's shape
(``build`` over random rules), blinded the way ``bpf_jit_harden`` does, and in hostile shapes: duplicate
loads, a field tested twice in a block, paths that join with different register contents, jset, ordered
comparisons, narrow loads, jumps that do not land on the next block.

The assembler, the blinding and the hostile and random programs are tests/helpers/ebpfprograms.py's.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oci_gpu_hook.appliers import devicefilter as df
from oci_gpu_hook.appliers import devicefilter_decode as dfd
from oci_gpu_hook.core.devices import Rule
from oci_gpu_hook.core.rules import first_match
from oci_gpu_hook.errors import HookError
from tests.helpers.ebpfprograms import (
    ACCESS,
    ALLOW,
    BLOCK_AND_CHAR,
    DEFAULT_ALLOW,
    DENY,
    DUPLICATE_LOAD,
    EXACT_BY_ORDER,
    FIELD_TWICE,
    HOSTILE,
    IMM64_VERDICT,
    JMP32_SIGNED,
    JOIN_DIFFERENT,
    JSET_MINOR,
    NOT_NEXT_BLOCK,
    ORDERED,
    PROLOGUE,
    RELOAD_AFTER_JUMP,
    SYSTEMD_LIKE,
    TWICE_TWO_LOADS,
    U32,
    WIDE_TYPE,
    asm,
    blind,
    i,
    insns_of,
    jne,
    programs,
)

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
