"""cgroup2 groups and device programs on the real kernel for the tests (the hierarchy at /sys/fs/cgroup/unified)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from oci_gpu_hook.appliers import bpf

UNIFIED = Path("/sys/fs/cgroup/unified")
HARDEN = Path("/proc/sys/net/core/bpf_jit_harden")


@contextlib.contextmanager
def new_group() -> Iterator[Path]:
    """A fresh cgroup2 group, removed afterwards (its programs go with it)."""
    path = UNIFIED / f"ogh-test-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    try:
        yield path
    finally:
        path.rmdir()


def attach(group: Path, program: bytes) -> int:
    fd = os.open(group, os.O_RDONLY | os.O_DIRECTORY)
    prog = bpf.prog_load(program, "foreign")
    try:
        bpf.prog_attach(fd, prog, bpf.F_ALLOW_MULTI)
        return bpf.prog_info(prog).id
    finally:
        os.close(prog)
        os.close(fd)


def attached(group: Path) -> list[int]:
    fd = os.open(group, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return bpf.prog_query(fd)[1]
    finally:
        os.close(fd)


@pytest.fixture(params=[0, 1, 2], ids=["harden-0", "harden-1", "harden-2"])
def harden(request: pytest.FixtureRequest) -> Iterator[int]:
    """bpf_jit_harden for the programs loaded in the test (1 blinds only unprivileged loads, 2 all)."""
    old = HARDEN.read_text().strip()
    HARDEN.write_text(str(request.param))
    try:
        yield request.param
    finally:
        HARDEN.write_text(old)
