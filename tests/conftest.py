"""The tests' one rule for what they need of the machine: root, tools on PATH, a kernel facility.

A test that cannot run here says so (:func:`unavailable`): a skip, or under ``CI=true`` a failure, never a
silent skip.  A test or module marked ``@pytest.mark.root`` (optionally ``root("runc", "busybox")``) needs
root (and those tools) before anything of it runs; a fixture that starts what needs them calls :func:`need`.
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

ROOT = os.geteuid() == 0


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def unavailable(problem: str) -> NoReturn:
    """This test cannot run on this machine: a skip, or under CI=true a failure."""
    if in_ci():
        pytest.fail(f"cannot run here: {problem}")
    pytest.skip(problem)


def need(*tools: str) -> None:
    """Root and ``tools`` on PATH, or :func:`unavailable`."""
    missing = [t for t in tools if shutil.which(t) is None]
    problem = "not root" if not ROOT else (f"missing {', '.join(missing)}" if missing else "")
    if problem:
        unavailable(problem)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker in item.iter_markers("root"):
        need(*marker.args)
