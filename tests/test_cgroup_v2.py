"""cgroup v2 program swap against the real kernel, outside any container: what happens when it must not swap."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from oci_gpu_hook.appliers import bpf, cgroups
from oci_gpu_hook.appliers import devicefilter as df
from oci_gpu_hook.appliers import devicefilter_decode as dfd
from oci_gpu_hook.core.devices import Rule as DeviceRule
from oci_gpu_hook.core.rules import first_match
from oci_gpu_hook.errors import HookError
from tests.helpers.cgroup2 import UNIFIED, attach, attached, new_group

pytestmark = [pytest.mark.root, pytest.mark.skipif(not (UNIFIED / "cgroup.procs").exists(),
                                                   reason="no cgroup2 hierarchy at /sys/fs/cgroup/unified")]
PLAN = (DeviceRule(True, "c", 226, 129, "rwm"),)


@pytest.fixture
def group() -> Iterator[Path]:
    with new_group() as path:
        yield path


def test_a_program_it_cannot_read_stays_attached(group: Path) -> None:
    """A foreign program (here: `if major == 226 allow`, written with jeq) is never replaced blind."""
    prologue = df.build([])[:6 * 8]
    jeq = struct.pack("=BBhi", 0x15, 4, 2, 226)  # if r4 == 226 goto +2
    deny = struct.pack("=BBhi", 0xB4, 0, 0, 0) + struct.pack("=BBhi", 0x95, 0, 0, 0)
    allow = struct.pack("=BBhi", 0xB4, 0, 0, 1) + struct.pack("=BBhi", 0x95, 0, 0, 0)
    prog_id = attach(group, prologue + jeq + deny + allow)
    with pytest.raises(HookError, match=r"cannot read the device policy of eBPF program .* every program was left in"):
        cgroups.v2_grant(str(group), PLAN)
    assert attached(group) == [prog_id]


def test_swap_then_idempotent_then_every_program_extended(group: Path) -> None:
    runc_like = [DeviceRule(True, "c", 1, 3, "rwm"), DeviceRule(False, "a", None, None, "rwm")]
    first = attach(group, df.build(runc_like))
    second = attach(group, df.build([DeviceRule(True, "c", None, None, "rwm"),
                                                DeviceRule(False, "a", None, None, "rwm")]))
    result = cgroups.v2_grant(str(group), PLAN)
    assert f"program {first} replaced by" in result  # the one that denied renderD129
    assert f"program {second} already grants the plan" in result
    now = attached(group)
    assert second in now and first not in now and len(now) == 2
    assert "already grants" in cgroups.v2_grant(str(group), PLAN).split(";")[0]
    assert attached(group) == now  # a second run swaps nothing
    (replacement,) = [p for p in now if p != second]
    fd = bpf.prog_fd_by_id(replacement)
    try:
        rules = dfd.decode(bpf.prog_info(fd).insns)
    finally:
        os.close(fd)
    assert rules == [*PLAN, *runc_like]  # exactly old + planned
    assert first_match(rules, "c", 226, 129, "rw") and first_match(rules, "c", 1, 3, "rw")
    assert not first_match(rules, "c", 226, 128, "rw")


def test_no_program_means_nothing_to_add(group: Path) -> None:
    assert "allows every device already" in cgroups.v2_grant(str(group), PLAN)
    assert attached(group) == []
