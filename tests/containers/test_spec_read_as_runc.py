"""In real runc containers: config.json keys that runc reads differently from Python are refused by the prestart
hook and by the shim, and the prestart hook acts only for the process that is the bundle's container.

Each config.json below is first run by runc alone, to show which value runc really uses (the attacker's), then
with the hook: one line, no container, nothing made outside the rootfs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import containerlib as cl

pytestmark = pytest.mark.containers

SHOW = ["/bin/sh", "-c", "echo AMD=$AMD_VISIBLE_DEVICES; ls /"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    cl.need("runc", "busybox", "unshare")
    paths = cl.hook_setup(tmp_path_factory.mktemp("runtime-view"))
    decoy = paths["decoy"] = paths["base"] / "decoy"  # a host directory that is not the container's root
    (decoy / "dev").mkdir(parents=True)
    (decoy / "etc").mkdir()
    return paths


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def _root_and_Root(spec: dict[str, Any], setup: dict[str, Path]) -> str:
    # a GPU request, so that the hooks have work to do (a container asking for nothing is never touched)
    spec["process"]["env"] = [e for e in spec["process"]["env"] if not e.startswith("AMD_")] + ["AMD_VISIBLE_DEVICES=1"]
    real = spec.pop("root")
    spec["root"] = {"path": str(setup["decoy"])}
    return json.dumps(spec)[:-1] + ', "Root": ' + json.dumps(real) + "}"


def _env_and_Env(spec: dict[str, Any], setup: dict[str, Path]) -> str:
    env = spec["process"]["env"]
    spec["process"]["env"] = [e for e in env if not e.startswith("AMD_")] + ["AMD_VISIBLE_DEVICES=1"]
    spec["process"]["Env"] = [e for e in env if not e.startswith("AMD_")] + ["AMD_VISIBLE_DEVICES=5"]
    return json.dumps(spec)


def _process_and_Process(spec: dict[str, Any], setup: dict[str, Path]) -> str:
    env = [e for e in spec["process"]["env"] if not e.startswith("AMD_")]
    spec["process"]["env"] = [*env, "AMD_VISIBLE_DEVICES=1"]
    return json.dumps(spec)[:-1] + ', "Process": ' + json.dumps({"env": [*env, "AMD_VISIBLE_DEVICES=5"]}) + "}"


def _process_twice(spec: dict[str, Any], setup: dict[str, Path]) -> str:
    env = [e for e in spec["process"]["env"] if not e.startswith("AMD_")]
    spec["process"]["env"] = [*env, "AMD_VISIBLE_DEVICES=1"]
    return json.dumps(spec)[:-1] + ', "process": ' + json.dumps({"env": [*env, "AMD_VISIBLE_DEVICES=5"]}) + "}"


# (name, how to write config.json, what runc alone shows, the hook's line)
AMBIGUOUS: list[tuple[str, Callable[[dict[str, Any], dict[str, Path]], str], str, str]] = [
    ("root-Root", _root_and_Root, "probe.sh", "has both 'root' and 'Root' in the top level"),
    ("env-Env", _env_and_Env, "AMD=5", "has both 'env' and 'Env' in process"),
    ("process-Process", _process_and_Process, "AMD=5", "has both 'process' and 'Process' in the top level"),
    ("process-process", _process_twice, "AMD=5", "repeats the key 'process'"),
]


def _write(setup: dict[str, Path], name: str, make: Callable[[dict[str, Any], dict[str, Path]], str],
           args: list[str], hook: bool) -> Path:
    bundle = cl.make_bundle(setup["base"] / f"{name}-{cl.container_id()}", setup["rootfs"], [], args)
    if hook:
        cl.add_prestart(bundle, setup["hook"])
    spec = json.loads((bundle / "config.json").read_text())
    (bundle / "config.json").write_text(make(spec, setup))
    return bundle


@pytest.mark.parametrize(("name", "make", "runc_sees", "line"), AMBIGUOUS, ids=[a[0] for a in AMBIGUOUS])
def test_runc_reads_the_attackers_value(setup: dict[str, Path], name: str, make: Any, runc_sees: str,
                                        line: str) -> None:
    """Without the hook, runc runs the config and uses the value the hook would not have read."""
    bundle = _write(setup, name, make, SHOW, hook=False)
    done = cl.run(["runc", "run", "--bundle", str(bundle), bundle.name])
    assert done.returncode == 0, done.stderr
    assert runc_sees in done.stdout.split(), done.stdout


@pytest.mark.parametrize("v2", [False, True], ids=["cgroup-v1", "cgroup-v2"])
@pytest.mark.parametrize(("name", "make", "runc_sees", "line"), AMBIGUOUS, ids=[a[0] for a in AMBIGUOUS])
def test_prestart_refuses_in_one_line(setup: dict[str, Path], name: str, make: Any, runc_sees: str, line: str,
                                      v2: bool) -> None:
    decoy = _tree(setup["decoy"])
    bundle = _write(setup, name, make, ["/bin/sh", "/probe.sh"], hook=True)
    argv = ["runc", "run", "--bundle", str(bundle), bundle.name]
    done = cl.run(cl.cgroup2_wrap(argv) if v2 else argv)
    assert done.returncode != 0
    assert "done" not in done.stdout.splitlines()  # the container never ran
    ours = [x for x in done.stderr.replace("\\n", "\n").splitlines() if "oci-gpu-hook: error:" in x]
    assert len(ours) == 1 and line in ours[0], done.stderr
    assert _tree(setup["decoy"]) == decoy  # nothing mknod'ed in the host directory
    assert bundle.name not in cl.run(["runc", "list", "-q"]).stdout


@pytest.mark.parametrize(("name", "make", "runc_sees", "line"), AMBIGUOUS, ids=[a[0] for a in AMBIGUOUS])
def test_shim_refuses_in_one_line(setup: dict[str, Path], name: str, make: Any, runc_sees: str, line: str) -> None:
    bundle = _write(setup, name, make, ["/bin/sh", "/probe.sh"], hook=False)
    before = (bundle / "config.json").read_text()
    done = cl.run([str(setup["runtime"]), "run", "--bundle", str(bundle), bundle.name], env=cl.hook_env())
    assert done.returncode == 1
    assert done.stdout == ""
    (only,) = done.stderr.splitlines()
    assert only.startswith("oci-gpu-hook: error: config.json") and line in only
    assert (bundle / "config.json").read_text() == before
    assert bundle.name not in cl.run(["runc", "list", "-q"]).stdout


# --- the state's pid must be the bundle's container ------------------------------------------------------------


def _state(pid: int, bundle: Path, cid: str = "ogh-test-pid") -> str:
    return json.dumps({"ociVersion": "1.0.2", "id": cid, "status": "creating", "pid": pid, "bundle": str(bundle)})


def _devices_list(pid: int) -> str:
    line = next(x for x in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if ":devices:" in x)
    return Path("/sys/fs/cgroup/devices", line.split(":", 2)[2].lstrip("/"), "devices.list").read_text()


@pytest.fixture
def gpu_bundle(setup: dict[str, Path]) -> Path:
    return cl.make_bundle(setup["base"] / cl.container_id(), setup["rootfs"], ["AMD_VISIBLE_DEVICES=1"])


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def test_prestart_refuses_an_unrelated_host_process(setup: dict[str, Path], gpu_bundle: Path,
                                                    stranger: subprocess.Popen[bytes]) -> None:
    rootfs = _tree(setup["rootfs"])
    devices = _devices_list(stranger.pid)
    done = cl.run([str(setup["hook"]), "prestart"], stdin=_state(stranger.pid, gpu_bundle), env=cl.hook_env())
    assert done.returncode == 1
    (only,) = done.stderr.splitlines()
    assert only.startswith(f"oci-gpu-hook: error: the container state's pid {stranger.pid} is not the container")
    assert _devices_list(stranger.pid) == devices
    assert _tree(setup["rootfs"]) == rootfs


def test_prestart_refuses_another_container(setup: dict[str, Path], gpu_bundle: Path) -> None:
    """The pid of a running container of another bundle: its device cgroup and its /dev stay as they were."""
    other = cl.make_bundle(setup["base"] / cl.container_id(), setup["rootfs"], [], ["/bin/sleep", "60"])
    with open(os.devnull, "wb") as null:
        subprocess.run(["runc", "run", "-d", "--bundle", str(other), other.name], stdin=null, stdout=null,
                       stderr=null, check=True, timeout=60)
    try:
        pid = json.loads(cl.run(["runc", "state", other.name]).stdout)["pid"]
        devices = _devices_list(pid)
        done = cl.run([str(setup["hook"]), "prestart"], stdin=_state(pid, gpu_bundle), env=cl.hook_env())
        assert done.returncode == 1
        (only,) = done.stderr.splitlines()
        assert f"pid {pid} is not the container of {gpu_bundle}" in only
        assert _devices_list(pid) == devices
        listing = cl.run(["nsenter", "-t", str(pid), "-m", "ls", f"{setup['rootfs']}/dev"]).stdout.split()
        assert not [n for n in listing if n in ("dri", "kfd")]
    finally:
        cl.run(["runc", "delete", "-f", other.name])


CHECK = """
import sys
sys.path.insert(0, sys.argv[4])
from oci_gpu_hook.appliers.live import check_container
from oci_gpu_hook.errors import HookError
try:
    check_container(int(sys.argv[1]), sys.argv[2], sys.argv[3])
except HookError as err:
    print(err)
    sys.exit(3)
print("accepted")
"""


def _sibling_check(where: Path, own_ns: bool, rootfs: Path, bundle: Path) -> str:
    """check_container run by a process whose sibling (same parent, as the runtime's hook and container are) is a
    sleep with its cwd at ``where``, in a mount namespace of its own or in the test's."""
    sleeper = "unshare -m sleep 30" if own_ns else "sleep 30"
    script = (f"(cd '{where}' && exec {sleeper}) & sleep 0.3; "
              f"'{sys.executable}' -I -c '{CHECK}' $! '{rootfs}' '{bundle}' '{cl.REPO}'; kill $!")
    return cl.run(["sh", "-c", script]).stdout.strip()


def test_check_container_needs_every_condition(setup: dict[str, Path], gpu_bundle: Path) -> None:
    rootfs, elsewhere = setup["rootfs"], setup["decoy"]
    assert _sibling_check(rootfs, True, rootfs, gpu_bundle) == "accepted"
    assert "neither its root nor its working directory" in _sibling_check(elsewhere, True, rootfs, gpu_bundle)
    assert "shares this hook's mount namespace" in _sibling_check(rootfs, False, rootfs, gpu_bundle)


def test_gone_pid_is_one_line(setup: dict[str, Path], gpu_bundle: Path) -> None:
    process = subprocess.Popen(["true"])
    process.wait()
    time.sleep(0.1)
    done = cl.run([str(setup["hook"]), "prestart"], stdin=_state(process.pid, gpu_bundle), env=cl.hook_env())
    assert done.returncode == 1
    (only,) = done.stderr.splitlines()
    assert f"container process {process.pid} is gone" in only


@pytest.mark.parametrize("v2", [False, True], ids=["cgroup-v1", "cgroup-v2"])
@pytest.mark.parametrize("stage", ["prestart", "createRuntime"])
def test_the_real_container_passes_the_check(setup: dict[str, Path], v2: bool, stage: str) -> None:
    """The check holds where runc has not pivoted yet: --no-pivot, a root.path relative to the bundle."""
    bundle = cl.make_bundle(setup["base"] / cl.container_id(), setup["rootfs"], ["AMD_VISIBLE_DEVICES=2"])
    cl.add_prestart(bundle, setup["hook"], stage=stage)
    cl.edit_spec(bundle, lambda spec: spec["root"].update(path="../rootfs"))
    argv = ["runc", "run", "--no-pivot", "--bundle", str(bundle), bundle.name]
    done = cl.run(cl.cgroup2_wrap(argv) if v2 else argv)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [2], cgroup_v2=v2)


# --- hostile numbers, depth and bytes: what runc does, and the hook's one line ---------------------------------

HOSTILE: list[tuple[str, str, bool, str]] = [
    # (name, text spliced in as the value of an unknown top-level key, runc runs it, the hook's line)
    ("1e400", "1e400", True, "holds the number 1e400, out of the range of a 64-bit float"),
    ("5000-digits", "7" * 5000, True, "holds an integer of 5000 digits"),
    ("2000-deep", "[" * 2000 + "]" * 2000, True, "is nested too deeply"),
    ("NaN", "NaN", False, "not valid JSON"),
    ("20000-deep", "[" * 20000 + "]" * 20000, False, "is nested too deeply"),
]


def _hostile_bundle(setup: dict[str, Path], piece: bytes, hook: bool) -> Path:
    bundle = cl.make_bundle(setup["base"] / cl.container_id(), setup["rootfs"], ["AMD_VISIBLE_DEVICES=1"],
                            ["/bin/true"])
    if hook:
        cl.add_prestart(bundle, setup["hook"])
    text = json.dumps(json.loads((bundle / "config.json").read_text())).encode()
    (bundle / "config.json").write_bytes(text[:-1] + b', "x-hostile": ' + piece + b"}")
    return bundle


@pytest.mark.parametrize(("name", "piece", "runc_runs", "line"),
                         [*HOSTILE, ("xff-in-env", "", True, "is not UTF-8 text")],
                         ids=[*(h[0] for h in HOSTILE), "xff-in-env"])
def test_hostile_config_runc_and_the_hook(setup: dict[str, Path], name: str, piece: str, runc_runs: bool,
                                          line: str) -> None:
    def make(hook: bool) -> Path:
        if name != "xff-in-env":
            return _hostile_bundle(setup, piece.encode(), hook)
        bundle = _hostile_bundle(setup, b"0", hook)
        text = (bundle / "config.json").read_bytes()
        wanted = b'"AMD_VISIBLE_DEVICES=1"'
        (bundle / "config.json").write_bytes(text.replace(wanted, b'"A=\xff", ' + wanted))
        return bundle

    alone = make(hook=False)
    done = cl.run(["runc", "run", "--bundle", str(alone), alone.name])
    assert (done.returncode == 0) == runc_runs, done.stderr  # what runc 1.1.5 itself does with it
    hooked = make(hook=True)
    done = cl.run(["runc", "run", "--bundle", str(hooked), hooked.name])
    assert done.returncode != 0
    if runc_runs:  # runc got as far as the hook: its one line
        ours = [x for x in done.stderr.replace("\\n", "\n").splitlines() if "oci-gpu-hook: error:" in x]
        assert len(ours) == 1 and line in ours[0], done.stderr
    shim = make(hook=False)
    before = (shim / "config.json").read_bytes()
    done = cl.run([str(setup["runtime"]), "run", "--bundle", str(shim), shim.name], env=cl.hook_env())
    assert done.returncode == 1
    (only,) = done.stderr.splitlines()
    assert only.startswith("oci-gpu-hook: error:") and "config.json" in only and line in only
    assert (shim / "config.json").read_bytes() == before
