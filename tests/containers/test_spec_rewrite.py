"""The truth: real runc and podman containers, real kernel device cgroups (v1 and v2).

Every test runs the isolation probe inside a container and checks that it sees
exactly its GPUs' nodes (ENXIO) and that every other GPU minor is refused (EPERM).
Needs root, runc, podman and busybox; under CI=true a missing tool fails the run
instead of skipping it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

from tests.helpers import containerlib as cl

pytestmark = pytest.mark.containers


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    cl.need("runc", "podman", "busybox", "unshare")
    paths = cl.hook_setup(tmp_path_factory.mktemp("containers"))
    paths["hooks_dir"] = cl.write_hooks_dir(paths["base"] / "hooks.d", paths["hook"], paths["config"])
    paths["empty_hooks"] = (paths["base"] / "no-hooks").resolve()
    return paths


def _bundle(setup: dict[str, Path], env: list[str]) -> Path:
    return cl.make_bundle(setup["base"] / cl.container_id(), setup["rootfs"], env)


def _dry_run(setup: dict[str, Path], bundle: Path) -> None:
    """oci-gpu-hook dry-run, its output installed as the bundle's config.json."""
    done = cl.run([str(setup["hook"]), "dry-run", str(bundle)], env=cl.hook_env())
    assert done.returncode == 0, done.stderr
    (bundle / "config.json").write_text(done.stdout)


# --- dry-run + runc run ------------------------------------------------------------------------

@pytest.mark.parametrize("v2", [False, True], ids=["cgroup-v1", "cgroup-v2"])
@pytest.mark.parametrize(("request_env", "gpus"), [
    ("AMD_VISIBLE_DEVICES=1", [1]),
    ("AMD_VISIBLE_DEVICES=all", list(range(8))),
    ("AMD_VISIBLE_DEVICES=0000:63:00.0", [3]),
    ("AMD_VISIBLE_DEVICES=GPU-3149e0fac5157acf,5-6", [1, 5, 6]),
    (None, []),
])
def test_dry_run_then_runc(setup: dict[str, Path], v2: bool, request_env: str | None, gpus: list[int]) -> None:
    bundle = _bundle(setup, [request_env] if request_env else [])
    before = (bundle / "config.json").read_bytes()
    _dry_run(setup, bundle)
    if not gpus:
        assert json.loads((bundle / "config.json").read_text()) == json.loads(before)
    argv = ["runc", "run", "--bundle", str(bundle), bundle.name]
    done = cl.run(cl.cgroup2_wrap(argv) if v2 else argv)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, gpus, cgroup_v2=v2)


def test_dry_run_refuses_bad_request(setup: dict[str, Path]) -> None:
    bundle = _bundle(setup, ["AMD_VISIBLE_DEVICES=1,8"])
    done = cl.run([str(setup["hook"]), "dry-run", str(bundle)], env=cl.hook_env())
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "'8' is out of range" in done.stderr and "valid:" in done.stderr


# --- the runtime shim called as runc ----------------------------------------------------------

@pytest.mark.parametrize("v2", [False, True], ids=["cgroup-v1", "cgroup-v2"])
def test_shim_run(setup: dict[str, Path], v2: bool) -> None:
    bundle = _bundle(setup, ["AMD_VISIBLE_DEVICES=2"])
    argv = [str(setup["runtime"]), "run", "--bundle", str(bundle), bundle.name]
    done = cl.run(cl.cgroup2_wrap(argv) if v2 else argv, env=cl.hook_env())
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [2], cgroup_v2=v2)


def test_shim_without_request_touches_nothing(setup: dict[str, Path]) -> None:
    bundle = _bundle(setup, ["AMD_VISIBLE_DEVICES=void"])
    digest = hashlib.sha256((bundle / "config.json").read_bytes()).hexdigest()
    mtime = (bundle / "config.json").stat().st_mtime_ns
    done = cl.run([str(setup["runtime"]), "run", "--bundle", str(bundle), bundle.name], env=cl.hook_env())
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [])
    assert hashlib.sha256((bundle / "config.json").read_bytes()).hexdigest() == digest
    assert (bundle / "config.json").stat().st_mtime_ns == mtime


def _traced_shim_run(setup: dict[str, Path], bundle: Path, where: Path, v2: bool
                     ) -> tuple[subprocess.CompletedProcess[str], list[str], list[str]]:
    """``shim run`` of ``bundle`` under strace -f, the planner's socket a bound one in ``where`` that no one serves:
    the run, every program exec'd and every connect to that socket."""
    socket_path, trace = where / "planner.sock", where / "trace"
    trace.unlink(missing_ok=True)
    unserved = socket.socket(socket.AF_UNIX)
    unserved.bind(str(socket_path))  # a connect is refused at once (no listen): a front that asks goes on to Python
    try:
        argv = ["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=execve,connect", str(setup["runtime"]), "run",
                "--bundle", str(bundle), bundle.name]
        done = cl.run(cl.cgroup2_wrap(argv) if v2 else argv,
                      env={**cl.hook_env(), "OCI_GPU_HOOK_PLANNER_SOCKET": str(socket_path)})
    finally:
        unserved.close()
        socket_path.unlink()
    lines = trace.read_text().splitlines()
    execs = [m.group(1) for line in lines if (m := re.search(r'execve\("([^"]*)"', line))]
    return done, execs, [line for line in lines if "connect(" in line and str(socket_path) in line]


def _pythons(execs: list[str]) -> list[str]:
    """The programs of ``execs`` that are Python: an interpreter or a launcher script."""
    return [e for e in execs if os.path.basename(e).startswith("python") or e.endswith(".py")]


@pytest.mark.parametrize("v2", [False, True], ids=["cgroup-v1", "cgroup-v2"])
def test_shim_passes_an_empty_request_natively(setup: dict[str, Path], v2: bool, tmp_path: Path) -> None:
    """A request variable that asks for nothing (``AMD_VISIBLE_DEVICES=``) is the native front's to decide: the
    container starts untouched, and strace of the whole run shows neither Python nor the planner asked.  The same
    run with a request shows both (the trace sees a hand-over)."""
    cl.need("strace")
    bundle = _bundle(setup, ["AMD_VISIBLE_DEVICES="])
    before = (bundle / "config.json").read_bytes()
    mtime = (bundle / "config.json").stat().st_mtime_ns
    done, execs, asked = _traced_shim_run(setup, bundle, tmp_path, v2)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [], cgroup_v2=v2)
    assert (bundle / "config.json").read_bytes() == before and (bundle / "config.json").stat().st_mtime_ns == mtime
    assert execs[0] == str(setup["runtime"]) and any(e.endswith("/runc") for e in execs), execs
    assert not _pythons(execs) and not asked, (execs, asked)
    requesting = _bundle(setup, ["AMD_VISIBLE_DEVICES=1"])
    done, execs, asked = _traced_shim_run(setup, requesting, tmp_path, v2)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [1], cgroup_v2=v2)
    assert _pythons(execs) and asked, (execs, asked)


def test_shim_refuses_bad_request(setup: dict[str, Path]) -> None:
    bundle = _bundle(setup, ["AMD_VISIBLE_DEVICES=0000:24:00.0"])
    before = (bundle / "config.json").read_bytes()
    done = cl.run([str(setup["runtime"]), "run", "--bundle", str(bundle), bundle.name], env=cl.hook_env())
    assert done.returncode == 1
    assert "done" not in done.stdout  # the container never ran
    assert done.stderr.count("\n") == 1 and "0000:24:00.0" in done.stderr and "Traceback" not in done.stderr
    assert (bundle / "config.json").read_bytes() == before
    assert cl.run(["runc", "state", bundle.name]).returncode != 0


# --- podman with the precreate hook -----------------------------------------------------------

def _podman(setup: dict[str, Path], *, runtime: str = "runc", hooks: Path | None = None,
            env: list[str]) -> cl.subprocess.CompletedProcess[str]:
    argv = [*cl.PODMAN, f"--runtime={runtime}", f"--hooks-dir={hooks or setup['empty_hooks']}", *cl.PODMAN_RUN]
    for entry in env:
        argv += ["-e", entry]
    argv += ["--rootfs", str(setup["rootfs"]), "/bin/sh", "/probe.sh"]
    return cl.run(argv, env=cl.hook_env())


@pytest.mark.parametrize(("request_env", "gpus"), [
    (["AMD_VISIBLE_DEVICES=1"], [1]),
    (["AMD_VISIBLE_DEVICES=all"], list(range(8))),
    (["AMD_VISIBLE_DEVICES=0000:e3:00.0"], [7]),
    ([], []),
])
def test_podman_precreate_hook(setup: dict[str, Path], request_env: list[str], gpus: list[int]) -> None:
    done = _podman(setup, hooks=setup["hooks_dir"], env=request_env)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, gpus, cgroup_v2=False)


def test_podman_precreate_refuses_bad_request(setup: dict[str, Path]) -> None:
    done = _podman(setup, hooks=setup["hooks_dir"], env=["AMD_VISIBLE_DEVICES=2-1"])
    assert done.returncode != 0
    assert "done" not in done.stdout
    assert "precreate" in done.stderr
    # podman 4.3 drops a precreate hook's stderr; the reason is in the hook's log file.
    lines = [json.loads(line) for line in setup["log"].read_text().splitlines()]
    assert any(line["outcome"] == "error" and "runs backwards" in line["error"] for line in lines)


# --- podman --runtime oci-gpu-runtime ---------------------------------------------------------

@pytest.mark.parametrize(("request_env", "gpus"), [
    (["AMD_VISIBLE_DEVICES=1"], [1]),
    (["AMD_VISIBLE_DEVICES=all"], list(range(8))),
    (["AMD_VISIBLE_DEVICES=0x3149e0fac5157ac8"], [0]),
    ([], []),
])
def test_podman_runtime_shim(setup: dict[str, Path], request_env: list[str], gpus: list[int]) -> None:
    done = _podman(setup, runtime=str(setup["runtime"]), env=request_env)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, gpus, cgroup_v2=False)


def test_podman_runtime_shim_refuses_bad_request(setup: dict[str, Path]) -> None:
    done = _podman(setup, runtime=str(setup["runtime"]), env=["AMD_VISIBLE_DEVICES=nine"])
    assert done.returncode != 0
    assert "done" not in done.stdout
    # The shim's one line reaches the podman user through runc's --log file.
    assert "oci-gpu-hook: error: AMD_VISIBLE_DEVICES=nine: 'nine' is not a GPU index" in done.stderr, done.stderr
