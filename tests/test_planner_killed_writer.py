"""A planner worker killed while it writes a bundle's config.json (oci_gpu_hook/atomic.py): the container is refused
in one line and the bundle holds its config.json as it was, whole, and nothing else, but for the one window the
module names (killed at the rename, the new file linked under its temp name), whose temp file is whole and is
removed by the next write.  The kill is real: strace's fault injection sends SIGKILL to the worker at each system
call of the write (the O_TMPFILE open, write, fchmod, linkat, rename), counted per worker from a traced run; and
workers are killed at random moments of many requests."""

from __future__ import annotations

import json
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from oci_gpu_hook import atomic
from tests.conftest import need
from tests.helpers import containerlib as cl
from tests.helpers import plannerlib
from tests.test_planner import bundle_with, expected_config, make_install, shim, spec_text

pytestmark = [pytest.mark.skipif(shutil.which("strace") is None, reason="no strace"),
              pytest.mark.skipif(platform.machine() != "x86_64", reason="ACCEPT4 is x86_64's number"),
              pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")]

TEXT = spec_text(["AMD_VISIBLE_DEVICES=1"])
WRITE_CALLS = ("openat", "write", "fchmod", "linkat", "rename")
UNFINISHED = b"the resident planner did not finish this request"
LINE = re.compile(r"^(\d+) +([a-z0-9_]+)\((.*)")


class Traced:
    """A planner of one worker, which strace attaches to (``options`` its own) once it waits in ``accept4`` (its
    warm-up done): its counts of system calls (``when=``) then start at the same point in every run."""

    def __init__(self, install: dict[str, Path], log: Path, *options: str) -> None:
        env = {**cl.hook_env(), "OCI_GPU_HOOK_CONFIG": str(install["config"])}
        self.planner = plannerlib.Planner(install["native"] / "oci-gpu-hook", install["socket"], env, 1)
        self.planner.log = log
        self.planner.start()
        assert self.planner.process is not None
        self.pid = self.planner.process.pid
        self.strace: subprocess.Popen[bytes] | None = None
        try:  # a planner left running by a failed start would hold the socket of every later test
            found: list[int] = []
            _until(lambda: _one_waiting_worker(self.pid, found))
            self.worker = found[0]
            self.strace = subprocess.Popen(["strace", "-f", "-qq", *options, "-p", str(self.worker)],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            tracer = self.strace.pid
            _until(lambda: _tracer(self.worker) == tracer)
        except BaseException:
            self.close()
            raise

    def detach(self) -> None:
        """strace lets go of the worker (SIGTERM: it detaches), which then runs on untouched."""
        assert self.strace is not None
        if self.strace.poll() is None:
            self.strace.terminate()
        self.strace.wait(timeout=60)

    def close(self) -> None:
        self.planner.kill_group()
        if self.strace is not None:
            if self.strace.poll() is None:
                self.strace.kill()
            self.strace.wait()


ACCEPT4 = "288"  # x86_64; /proc/PID/syscall names the call a process is blocked in


def _waiting(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/syscall").read_text().split()[0] == ACCEPT4
    except (OSError, IndexError):
        return False


def _until(ready: object, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ready():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _one_waiting_worker(pid: int, found: list[int]) -> bool:
    """The planner has exactly one worker, waiting in accept4 (its warm-up done): put it in ``found``.  One read
    of the children: two reads may see a worker list change between them."""
    children = _children(pid)
    if len(children) == 1 and _waiting(children[0]):
        found[:] = children
        return True
    return False


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _tracer(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return int(status.split("TracerPid:", 1)[1].split()[0])


def _write_ordinals(trace: Path, bundle: Path) -> dict[str, int]:
    """For the worker that wrote ``bundle``'s config.json in ``trace``: each WRITE_CALLS call of that write as its
    ordinal among the worker's calls of the name since strace attached (its ``when=``, counted per process)."""
    seen: dict[tuple[str, str], int] = {}
    worker, found = None, {}
    for line in trace.read_text().splitlines():
        match = LINE.match(line)
        if not match:
            continue  # "<... resumed>", signals, exits
        pid, name, args = match.groups()
        seen[(pid, name)] = seen.get((pid, name), 0) + 1
        if worker is None and name == "openat" and f'"{bundle}"' in args and "O_TMPFILE" in args:
            worker = pid
        if pid != worker:
            continue
        if name in WRITE_CALLS and name not in found:
            found[name] = seen[(pid, name)]
        if name == "rename":
            break
    assert worker is not None and sorted(found) == sorted(WRITE_CALLS), found
    return found


def _temps(bundle: Path) -> list[str]:
    return sorted(e for e in os.listdir(bundle) if e != "config.json")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    need()  # the planner runs as root
    base = tmp_path_factory.mktemp("killed-writer")
    install = make_install(base / "install")
    want = expected_config(install, TEXT)
    running = Traced(install, base / "traced.log", "-o", str(base / "trace"), "-e", "trace=" + ",".join(WRITE_CALLS))
    try:
        bundle = bundle_with(base, "traced", TEXT)
        done = shim(install, "native", bundle)
        assert done.returncode == 0 and (bundle / "config.json").read_bytes() == want, done.stderr
    finally:
        running.close()
    return {"base": base, "install": install, "want": want, "ordinals": _write_ordinals(base / "trace", bundle)}


@pytest.mark.parametrize("name", WRITE_CALLS)
def test_a_worker_killed_at_each_system_call_of_the_write(setup: dict[str, object], name: str) -> None:
    base, install, want = setup["base"], setup["install"], setup["want"]
    assert isinstance(base, Path) and isinstance(install, dict) and isinstance(want, bytes)
    when = setup["ordinals"][name]  # type: ignore[index]
    running = Traced(install, base / f"{name}.log", "-o", os.devnull, "-e", f"inject={name}:signal=SIGKILL:when={when}")
    try:
        bundle = bundle_with(base, f"killed-at-{name}", TEXT)
        done = shim(install, "native", bundle)
        assert done.returncode != 0 and done.stderr.count(b"\n") == 1 and UNFINISHED in done.stderr, done.stderr
        temps = _temps(bundle)
        assert (bundle / "config.json").read_text() == TEXT, name  # as it was, whole
        if name == "rename":  # the window: linked under its temp name, not yet renamed
            assert len(temps) == 1 and atomic.is_temp(temps[0]), temps
            temp = bundle / temps[0]
            assert temp.read_bytes() == want
            then = temp.stat().st_mtime - atomic.GRACE_S - 5  # its writer is gone; older than a moment
            os.utime(temp, (then, then))
        else:
            assert temps == [], (name, temps)
        running.detach()
        done = shim(install, "native", bundle)  # the next write (a new worker's) removes what the window left
        assert done.returncode == 0 and _temps(bundle) == [], (done.stderr, _temps(bundle))
        assert (bundle / "config.json").read_bytes() == want
    finally:
        running.close()


def _workers(planner_pid: int) -> list[int]:
    """The planner's workers (its children)."""
    return _children(planner_pid)


def test_workers_killed_at_random_moments_leave_no_temp_file(setup: dict[str, object]) -> None:
    """120 requests, each worker of the planner killed at a random moment while one is served: every bundle holds
    the config.json it had or the one the planner writes, whole, and no temp file but the window's, whole."""
    base, install, want = setup["base"], setup["install"], setup["want"]
    assert isinstance(base, Path) and isinstance(install, dict) and isinstance(want, bytes)
    launcher = install["native"] / "oci-gpu-hook"
    env = {**cl.hook_env(), "OCI_GPU_HOOK_CONFIG": str(install["config"])}
    running = plannerlib.Planner(launcher, install["socket"], env, 2)
    running.log = base / "random.log"
    running.start()
    rng = random.Random(30)
    outcomes = {"refused": 0, "written": 0, "window": 0}
    try:
        for i in range(120):
            bundle = bundle_with(base, f"random-{i}", TEXT)
            assert running.process is not None
            pids = _workers(running.process.pid) if i % 2 else []
            delay = rng.uniform(0, 0.02)

            def kill(pids: list[int] = pids, delay: float = delay) -> None:
                time.sleep(delay)  # a random moment of the request, not a synchronisation
                for pid in pids or _workers(running.process.pid):  # type: ignore[union-attr]
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

            killer = threading.Thread(target=kill)
            killer.start()
            done = shim(install, "native", bundle)
            killer.join()
            config = (bundle / "config.json").read_bytes()
            assert config in (TEXT.encode(), want), i
            if done.returncode == 0:
                assert config == want, i
                outcomes["written"] += 1
            else:
                assert done.stderr.count(b"\n") == 1 and UNFINISHED in done.stderr, done.stderr
                outcomes["refused"] += 1
            for temp in _temps(bundle):  # only the window's: linked whole, killed before its rename
                assert atomic.is_temp(temp) and (bundle / temp).read_bytes() == want, (i, temp)
                outcomes["window"] += 1
    finally:
        running.kill_group()
    print(json.dumps(outcomes))
    assert outcomes["refused"] > 0 and outcomes["written"] > 0  # kills landed mid-request, and requests were served
