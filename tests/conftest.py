"""The tests' one rule for what they need of the machine: root, tools on PATH, a kernel facility.

A test that cannot run here says so (:func:`unavailable`): a skip, or under ``CI=true`` a failure, never a
silent skip.  A test or module marked ``@pytest.mark.root`` (optionally ``root("runc", "busybox")``) needs
root (and those tools) before anything of it runs; a fixture that starts what needs them calls :func:`need`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import NoReturn

import pytest

ROOT = os.geteuid() == 0

# Tests never change the host: the spec-rewrite paths prepare /dev/dri/by-path directories under by_path_dir
# (default /run/oci-gpu-hook/by-path); every run of the package that inherits this environment uses a
# session's own directory instead (a test's own config may name another one of its own).
# A test that still wrote to the default directory fails the session (and what it made there is removed).
BY_PATH_DIR = tempfile.mkdtemp(prefix="ogh-by-path-")
os.environ["OCI_GPU_HOOK_BY_PATH_DIR"] = os.path.join(BY_PATH_DIR, "by-path")
HOST_BY_PATH_DIR = "/run/oci-gpu-hook/by-path"


def _host_by_path() -> set[str]:
    try:
        return set(os.listdir(HOST_BY_PATH_DIR))
    except OSError:
        return set()


HOST_BY_PATH_BEFORE = _host_by_path()
HOST_BY_PATH_WAS_THERE = os.path.lexists(HOST_BY_PATH_DIR)


@pytest.fixture(autouse=True)
def _no_host_by_path_directory(request: pytest.FixtureRequest) -> Iterator[None]:
    """Names the test that made a by-path directory on the host (the session's end only sees that one did)."""
    before = _host_by_path()
    yield
    made = sorted(_host_by_path() - before)
    if made:
        for name in made:
            shutil.rmtree(os.path.join(HOST_BY_PATH_DIR, name), ignore_errors=True)
        pytest.fail(f"{request.node.nodeid} changed the host: it made {made} in {HOST_BY_PATH_DIR} (removed); give "
                    "what it runs the session's by_path_dir (tests/helpers/clilib.py without_tool_vars)")


def pytest_sessionfinish(session: pytest.Session) -> None:
    shutil.rmtree(BY_PATH_DIR, ignore_errors=True)
    leaked = sorted(_host_by_path() - HOST_BY_PATH_BEFORE)
    for name in leaked:
        shutil.rmtree(os.path.join(HOST_BY_PATH_DIR, name), ignore_errors=True)
    if not HOST_BY_PATH_WAS_THERE and os.path.isdir(HOST_BY_PATH_DIR) and not os.path.islink(HOST_BY_PATH_DIR):
        leaked = leaked or ["the directory itself"]
        try:
            os.rmdir(HOST_BY_PATH_DIR)
        except OSError:
            pass
    if leaked:
        print(f"\nFAILED: the tests changed the host: they made {leaked} in {HOST_BY_PATH_DIR} (removed); "
              "give them a by_path_dir of their own")
        session.exitstatus = 1


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
