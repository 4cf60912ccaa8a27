"""The v2 swap against the real kernel, with net.core.bpf_jit_harden 0, 1 and 2.

Each test attaches hand-written or runc-shaped device programs to a fresh cgroup2 group, runs the hook's
``v2_grant`` and probes what the kernel then enforces: a process moved into the group opens device nodes
(EPERM = denied; ENXIO or success = allowed, see testing-here.md) and makes them (mknod = access m).
Nothing outside the grant may go from denied to allowed, nothing may go from allowed to denied, and a
refusal leaves exactly the programs that were attached.  The same probes hold the user-space interpreter
(``devicefilter_decode.run`` on the kernel's own read-back) to the kernel's verdicts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from oci_gpu_hook.appliers import bpf, cgroups
from oci_gpu_hook.appliers import devicefilter as df
from oci_gpu_hook.appliers import devicefilter_decode as dfd
from oci_gpu_hook.core.devices import Rule
from oci_gpu_hook.core.rules import first_match
from oci_gpu_hook.errors import HookError
from tests.helpers import ebpfprograms as programs
from tests.helpers.cgroup2 import UNIFIED, attach, attached, new_group
from tests.helpers.cgroup2 import harden as harden  # bpf_jit_harden 0, 1, 2 (a fixture)

pytestmark = [pytest.mark.root, pytest.mark.skipif(not (UNIFIED / "cgroup.procs").exists(),
                                                   reason="no cgroup2 hierarchy at /sys/fs/cgroup/unified")]

PLAN = (Rule(True, "c", 226, 129, "rwm"), Rule(True, "c", 234, 0, "rw"))
# Majors without a driver here (open gives ENXIO when allowed), /dev/null, and numbers around the
# hostile programs' constants.
DEVICES = [("c", 1, 3), ("c", 226, 0), ("c", 226, 1), ("c", 226, 2), ("c", 226, 128), ("c", 226, 129),
           ("c", 226, 130), ("c", 234, 0), ("c", 234, 1), ("c", 195, 0), ("c", 199, 7), ("c", 200, 3),
           ("c", 201, 0), ("b", 226, 1), ("b", 234, 0)]
ACCESSES = ("r", "w", "rw", "m")

RUNC_LIKE = [Rule(True, "c", None, None, "m"), Rule(True, "b", None, None, "m"), Rule(True, "c", 1, 3, "rwm"),
             Rule(True, "c", 226, 1, "rw"), Rule(False, "a", None, None, "rwm")]

_CHILD = r"""
import errno, json, os, sys
group, nodes, devices = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
with open(os.path.join(group, "cgroup.procs"), "w") as handle:
    handle.write(str(os.getpid()))
out = {}
for index, (kind, major, minor) in enumerate(devices):
    node = os.path.join(nodes, f"n{index}")
    for access, flags in (("r", os.O_RDONLY), ("w", os.O_WRONLY), ("rw", os.O_RDWR)):
        try:
            os.close(os.open(node, flags | os.O_NONBLOCK))
            out[f"{kind} {major}:{minor} {access}"] = True
        except OSError as err:
            out[f"{kind} {major}:{minor} {access}"] = err.errno != errno.EPERM
    made = os.path.join(nodes, f"m{index}")
    try:
        os.mknod(made, 0o600 | (0o020000 if kind == "c" else 0o060000), os.makedev(major, minor))
        os.unlink(made)
        out[f"{kind} {major}:{minor} m"] = True
    except OSError as err:
        out[f"{kind} {major}:{minor} m"] = err.errno != errno.EPERM
print(json.dumps(out))
"""


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Path]:
    make_nodes(tmp_path)
    with new_group() as path:
        yield path


def make_nodes(directory: Path) -> None:
    for index, (kind, major, minor) in enumerate(DEVICES):  # made outside the group, opened inside it
        os.mknod(directory / f"n{index}", 0o600 | (0o020000 if kind == "c" else 0o060000), os.makedev(major, minor))


def xlated(prog_id: int) -> bytes:
    fd = bpf.prog_fd_by_id(prog_id)
    try:
        return bpf.prog_info(fd).insns
    finally:
        os.close(fd)


def kernel_probe(group: Path, nodes: Path) -> dict[str, bool]:
    """What the kernel allows a process in ``group``: 'c 226:1 rw' -> allowed."""
    done = subprocess.run([sys.executable, "-I", "-S", "-c", _CHILD, str(group), str(nodes), json.dumps(DEVICES)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def interpreted(programs_: list[bytes]) -> dict[str, bool]:
    """The same table by the user-space interpreter: every program must allow."""
    out = {}
    for kind, major, minor in DEVICES:
        for access in ACCESSES:
            word = sum(df.ACCESS_BITS[letter] for letter in access) << 16 | df.TYPE_BITS[kind]
            out[f"{kind} {major}:{minor} {access}"] = all(dfd.run(p, word, major, minor) for p in programs_)
    return out


def granted(key: str) -> bool:
    kind, number, access = key.split()
    major, minor = number.split(":")
    return first_match(PLAN, kind, int(major), int(minor), access)


def assert_old_plus_plan(before: dict[str, bool], after: dict[str, bool]) -> None:
    assert {k for k, v in after.items() if v} == {k for k, v in before.items() if v or granted(k)}


HOSTILE = {**programs.HOSTILE, "runc-like": df.build(RUNC_LIKE), "systemd-like": programs.SYSTEMD_LIKE,
           "default-allow-deny-10-200": df.build([Rule(False, "c", 10, 200, "rwm"),
                                                  Rule(True, "a", None, None, "rwm")]),
           "default-allow-deny-exact-gpu": df.build([Rule(False, "c", 226, 129, "rwm"),
                                                     Rule(True, "a", None, None, "rwm")])}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_grant_never_widens_in_the_kernel(group: Path, tmp_path: Path, harden: int, name: str) -> None:
    prog_id = attach(group, HOSTILE[name])
    old = xlated(prog_id)
    if harden == 2:
        assert old != HOSTILE[name]  # the kernel blinded the constants
    before = kernel_probe(group, tmp_path)
    assert interpreted([old]) == before  # the interpreter is the kernel, device by device
    try:
        result = cgroups.v2_grant(str(group), PLAN)
    except HookError as err:
        assert "every program was left in place" in str(err)
        assert attached(group) == [prog_id]
        assert kernel_probe(group, tmp_path) == before
        return
    after = kernel_probe(group, tmp_path)
    assert_old_plus_plan(before, after)
    now = attached(group)
    assert len(now) == 1
    assert interpreted([xlated(now[0])]) == after
    assert "already grants" in cgroups.v2_grant(str(group), PLAN), result  # a second run changes nothing
    assert attached(group) == now


def test_the_hostile_programs_are_refused_or_read_as_expected(group: Path, harden: int) -> None:
    """Which of the attacker programs are swapped and which refused, whatever the hardening."""
    outcome = {}
    for name in ("field-twice", "join-different", "duplicate-load", "ordered", "systemd-like", "exact-by-order"):
        sub = group / name
        sub.mkdir()
        try:
            attach(sub, HOSTILE[name])
            try:
                outcome[name] = cgroups.v2_grant(str(sub), PLAN).split(" ", 2)[2].split(" by ")[0]
            except HookError:
                outcome[name] = "refused"
        finally:
            sub.rmdir()
    assert outcome == {"field-twice": "replaced", "join-different": "refused", "duplicate-load": "refused",
                       "ordered": "refused", "systemd-like": "replaced", "exact-by-order": "replaced"}


def test_default_allow_with_a_deny_gets_its_gpu(group: Path, tmp_path: Path, harden: int) -> None:
    """The harden=2 regression: `r0 = 0` reads back as `r0 ^= r0`; the GPU is already allowed."""
    attach(group, df.build([Rule(False, "c", 10, 200, "rwm"), Rule(True, "a", None, None, "rwm")]))
    assert "already grants the plan" in cgroups.v2_grant(str(group), PLAN)
    assert all(v for k, v in kernel_probe(group, tmp_path).items() if granted(k))


def test_a_grant_over_an_operator_deny_is_refused(group: Path, tmp_path: Path, harden: int) -> None:
    prog_id = attach(group, df.build([Rule(False, "c", 226, None, "rwm"), Rule(True, "a", None, None, "rwm")]))
    before = kernel_probe(group, tmp_path)
    with pytest.raises(HookError, match=r"has the rule 'deny c 226:\* rwm', which covers the planned 'c 226:129"):
        cgroups.v2_grant(str(group), PLAN)
    assert attached(group) == [prog_id]
    assert kernel_probe(group, tmp_path) == before


def test_an_undecodable_second_program_leaves_both(group: Path, tmp_path: Path, harden: int) -> None:
    first = attach(group, df.build(RUNC_LIKE))
    second = attach(group, programs.JOIN_DIFFERENT)
    before = kernel_probe(group, tmp_path)
    with pytest.raises(HookError, match=f"eBPF program {second} .*every program was left in place"):
        cgroups.v2_grant(str(group), PLAN)
    assert attached(group) == [first, second]
    assert kernel_probe(group, tmp_path) == before


def test_a_failed_swap_is_undone(group: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = attach(group, df.build(RUNC_LIKE))
    second = attach(group, df.build([Rule(True, "c", 1, 3, "rwm"), Rule(True, "c", 226, None, "r"),
                                     Rule(False, "a", None, None, "rwm")]))
    before = kernel_probe(group, tmp_path)
    real, calls = bpf.prog_attach, []

    def failing_second(*args: int) -> None:
        calls.append(args)
        if len(calls) == 2:
            raise OSError(16, "Device or resource busy (injected)")
        real(*args)

    monkeypatch.setattr(bpf, "prog_attach", failing_second)
    with pytest.raises(HookError, match=r"injected.*keeps its old programs"):
        cgroups.v2_grant(str(group), PLAN)
    assert len(calls) == 3  # swap 1, failed swap 2, undo 1
    assert attached(group) == [first, second]
    assert kernel_probe(group, tmp_path) == before


def test_two_programs_both_extended(group: Path, tmp_path: Path, harden: int) -> None:
    attach(group, df.build(RUNC_LIKE))
    attach(group, df.build([Rule(True, "c", 1, 3, "rwm"), Rule(True, "c", 226, None, "rw"),
                            Rule(True, "c", 234, None, "rw"), Rule(False, "a", None, None, "rwm")]))
    before = kernel_probe(group, tmp_path)
    assert interpreted([xlated(p) for p in attached(group)]) == before
    cgroups.v2_grant(str(group), PLAN)
    after = kernel_probe(group, tmp_path)
    assert_old_plus_plan(before, after)
    assert interpreted([xlated(p) for p in attached(group)]) == after


LOADED: list[bytes] = []


def reachable_only(program: bytes) -> bytes:
    """The program without the instructions no path reaches (the verifier refuses those), jumps re-aimed."""
    insns = programs.insns_of(program)
    seen, todo = set(), [0]
    while todo:
        pc = todo.pop()
        if pc in seen or pc >= len(insns):
            continue
        seen.add(pc)
        code, off = insns[pc][0], insns[pc][3]
        if code == df.EXIT:
            continue
        if code & 0x07 in (0x05, 0x06):
            todo.append(pc + 1 + off)
            if code == df.JA:
                continue
        todo.append(pc + 1)
    kept = sorted(seen)
    where = {pc: n for n, pc in enumerate(kept)}
    out = []
    for n, pc in enumerate(kept):
        code, dst, src, off, imm = insns[pc]
        if code & 0x07 in (0x05, 0x06) and code != df.EXIT:
            off = where[pc + 1 + off] - n - 1
        out.append(programs.i(code, dst, src, off, imm))
    return b"".join(out)


@pytest.mark.parametrize("harden", [0, 2], indirect=True, ids=["harden-0", "harden-2"])
@settings(max_examples=40, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(programs.programs(ax=9))
def test_random_programs_interpreter_and_swap_in_the_kernel(tmp_path: Path, harden: int, program: bytes) -> None:
    """Random programs of many shapes that the verifier takes: the interpreter (on what we wrote and on the
    kernel's read-back) gives the kernel's verdict on every probe, and the hook's swap adds exactly the plan."""
    if not (tmp_path / "n0").exists():
        make_nodes(tmp_path)
    with new_group() as group:
        program = reachable_only(program)
        try:
            prog_id = attach(group, program)
        except OSError:
            return  # the verifier refused it (mostly unreachable code): nothing to compare
        LOADED.append(program)
        before = kernel_probe(group, tmp_path)
        assert interpreted([program]) == interpreted([xlated(prog_id)]) == before
        try:
            cgroups.v2_grant(str(group), PLAN)
        except HookError:
            assert attached(group) == [prog_id]
            assert kernel_probe(group, tmp_path) == before
            return
        after = kernel_probe(group, tmp_path)
        assert_old_plus_plan(before, after)


def test_random_programs_reached_the_kernel() -> None:
    """The random test above is not vacuous (runs after it, in file order)."""
    if not LOADED:
        pytest.skip("the random kernel test did not run")
    assert len(LOADED) >= 20, len(LOADED)
