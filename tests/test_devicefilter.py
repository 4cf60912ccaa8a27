"""cgroup v2 device programs: build -> decode round trips, runc's layout, blinded constants, first-match semantics."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oci_gpu_hook.appliers import devicefilter as df
from oci_gpu_hook.appliers import devicefilter_decode as dfd
from oci_gpu_hook.core.devices import Rule as DeviceRule
from oci_gpu_hook.core.rules import first_match

ACCESS = ["r", "w", "m", "rw", "rm", "wm", "rwm"]

rules_strategy = st.lists(st.builds(
    DeviceRule,
    st.booleans(),
    st.sampled_from(["a", "b", "c"]),
    st.one_of(st.none(), st.integers(0, 4095)),
    st.one_of(st.none(), st.integers(0, 1 << 20)),
    st.sampled_from(ACCESS),
), max_size=12)


def _evaluate(insns: bytes, kind: str, major: int, minor: int, access: str) -> int:
    """A tiny interpreter for the instructions build() emits: the reference semantics."""
    prog = [struct.unpack_from("=BBhi", insns, i) for i in range(0, len(insns), 8)]
    ctx = (df._access_mask(access) << 16 | df.TYPE_BITS[kind], major, minor)
    regs = [0] * 11
    pc = 0
    while True:
        code, regbyte, off, imm = prog[pc]
        dst, src = regbyte & 0xF, regbyte >> 4
        if code == df.LDX_W:
            regs[dst] = ctx[off // 4]
        elif code == df.ALU32_AND_K:
            regs[dst] &= imm
        elif code == df.ALU32_RSH_K:
            regs[dst] >>= imm
        elif code == df.ALU32_MOV_X:
            regs[dst] = regs[src]
        elif code == df.ALU32_MOV_K:
            regs[dst] = imm
        elif code == 0x55:  # jne imm
            if regs[dst] != imm:
                pc += off
        elif code == 0x5D:  # jne reg
            if regs[dst] != regs[src]:
                pc += off
        elif code == df.EXIT:
            return regs[0]
        else:
            raise AssertionError(hex(code))
        pc += 1


@given(rules_strategy)
def test_build_then_decode_round_trips(rules: list[DeviceRule]) -> None:
    decoded = dfd.decode(df.build(rules))
    expected = []
    for rule in rules:
        expected.append(rule)
        if rule.type == "a" and rule.major is None and rule.minor is None and rule.access == "rwm":
            break
    else:
        expected.append(DeviceRule(False, "a", None, None, "rwm"))
    assert decoded == expected


@given(rules_strategy, st.sampled_from(["b", "c"]), st.integers(0, 4095), st.integers(0, 1 << 20),
       st.sampled_from(ACCESS))
def test_program_semantics_match_first_match_rules(rules: list[DeviceRule], kind: str, major: int, minor: int,
                                                   access: str) -> None:
    program = df.build(rules)
    verdict = first_match(rules, kind, major, minor, access)
    assert _evaluate(program, kind, major, minor, access) == (1 if verdict else 0)


def test_planned_rules_first_keep_the_old_policy() -> None:
    """What the hook loads: plan + old rules = old policy plus exactly the planned devices."""
    old = [DeviceRule(True, "c", None, None, "m"), DeviceRule(True, "c", 1, 3, "rwm"),
           DeviceRule(False, "c", 226, None, "rwm"), DeviceRule(True, "c", 136, None, "rwm"),
           DeviceRule(False, "a", None, None, "rwm")]
    plan = [DeviceRule(True, "c", 226, 2, "rwm"), DeviceRule(True, "c", 226, 129, "rwm")]
    new = dfd.decode(df.build([*plan, *dfd.decode(df.build(old))]))
    for major, minor in [(1, 3), (1, 5), (136, 4), (226, 1), (226, 2), (226, 129), (226, 130), (8, 0)]:
        for access in ACCESS:
            before = bool(first_match(old, "c", major, minor, access))
            after = bool(first_match(new, "c", major, minor, access))
            planned = (major, minor) in ((226, 2), (226, 129))
            assert after == (before or planned), (major, minor, access)


def _i(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("=BBhi", code, dst | src << 4, off, imm)


def test_decodes_constants_blinded_by_bpf_jit_harden() -> None:
    """jit_harden=2 rewrites `jne r4, 226` as `mov ax, a; xor ax, b; jne r4, ax` (a ^ b = 226)."""
    a, b = 0x5A5A5A5A, 0x5A5A5A5A ^ 226
    c, d = 0x13371337, 0x13371337 ^ 129
    prologue = df.build([])[:6 * 8]
    block = [
        _i(0xB7, 11, imm=a), _i(0xA7, 11, imm=b), _i(0x5D, 4, 11, off=5),  # if major != 226
        _i(0xB7, 11, imm=c), _i(0xA7, 11, imm=d), _i(0x5D, 5, 11, off=2),  # if minor != 129
        _i(0xB4, 0, imm=1), _i(0x95),
    ]
    tail = [_i(0xB4, 11, imm=7), _i(0xA4, 11, imm=7), _i(0xBC, 0, 11), _i(0x95)]  # r0 = 7 ^ 7 = 0
    rules = dfd.decode(prologue + b"".join(block + tail))
    assert rules == [DeviceRule(True, "a", 226, 129, "rwm"), DeviceRule(False, "a", None, None, "rwm")]


@pytest.mark.parametrize("program", [
    b"",
    b"\x00" * 7,
    _i(0x85, imm=1) + _i(0x95),  # a helper call
    _i(0xB4, 0, imm=1) + _i(0x05, off=-2) + _i(0x95),  # a backward jump
    df.build([])[:-8],  # no exit at the end
    df.build([])[:6 * 8] + _i(0x55, 6, off=1, imm=3) + _i(0xB4, 0, imm=1) + _i(0x95) + _i(0xB4) + _i(0x95),
])
def test_unknown_programs_are_not_decodable(program: bytes) -> None:
    with pytest.raises(dfd.NotDecodable):
        dfd.decode(program)
