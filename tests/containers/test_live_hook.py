"""The live prestart hook in real containers: runc (cgroup v1 and v2) and podman --hooks-dir.

Also: v2 policy equivalence by probing (with and without bpf_jit_harden), hostile
rootfs layouts, bad input, 16 containers in parallel, and the hook listed twice.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import containerlib as cl

pytestmark = pytest.mark.containers


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    cl.need("runc", "podman", "busybox", "unshare")
    paths = cl.hook_setup(tmp_path_factory.mktemp("prestart"))
    hooks_dir = paths["hooks_dir"] = paths["base"] / "hooks.d"
    hooks_dir.mkdir()
    shipped = json.loads((cl.REPO / "hooks.d" / "oci-gpu-hook-prestart.json").read_text())
    shipped["hook"]["path"] = str(paths["hook"])
    (hooks_dir / "oci-gpu-hook-prestart.json").write_text(json.dumps(shipped))
    return paths


def _bundle(setup: dict[str, Path], env: list[str], *, args: list[str] | None = None, times: int = 1,
            stage: str = "prestart") -> Path:
    bundle = cl.make_bundle(setup["base"] / cl.container_id(), setup["rootfs"], env, args)
    cl.add_prestart(bundle, setup["hook"], times, stage)
    return bundle


def _runc(bundle: Path, v2: bool, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = ["runc", "run", "--bundle", str(bundle), bundle.name]
    return cl.run(cl.cgroup2_wrap(argv) if v2 else argv, env=env)


def _log_lines(setup: dict[str, Path], cid: str) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in setup["log"].read_text().splitlines()] if setup["log"].exists() else []
    return [line for line in lines if line.get("id") == cid]


V1_V2 = pytest.mark.parametrize("v2", [False, True], ids=["cgroup-v1", "cgroup-v2"])


@V1_V2
@pytest.mark.parametrize(("request_env", "gpus"), [
    ("AMD_VISIBLE_DEVICES=1", [1]),
    ("AMD_VISIBLE_DEVICES=all", list(range(8))),
    ("AMD_VISIBLE_DEVICES=0000:c3:00.0,0", [0, 6]),
])
def test_runc_prestart(setup: dict[str, Path], v2: bool, request_env: str, gpus: list[int]) -> None:
    bundle = _bundle(setup, [request_env])
    done = _runc(bundle, v2)
    assert done.returncode == 0, done.stderr
    result = cl.assert_isolated(done.stdout, gpus, cgroup_v2=v2)
    assert result.links == cl.expected_links(gpus)
    (line,) = _log_lines(setup, bundle.name)
    assert line["outcome"] == "ok" and line["cgroup"] == ("v2" if v2 else "v1")


@V1_V2
def test_runc_create_runtime_stage(setup: dict[str, Path], v2: bool) -> None:
    bundle = _bundle(setup, ["AMD_VISIBLE_DEVICES=4"], stage="createRuntime")
    done = _runc(bundle, v2)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [4], cgroup_v2=v2)


@V1_V2
def test_no_request_touches_nothing(setup: dict[str, Path], v2: bool) -> None:
    bundle = _bundle(setup, [])
    done = _runc(bundle, v2)
    assert done.returncode == 0, done.stderr
    result = cl.assert_isolated(done.stdout, [], cgroup_v2=v2)
    assert result.links == {}
    assert _log_lines(setup, bundle.name) == []


@V1_V2
def test_bad_request_stops_the_container(setup: dict[str, Path], v2: bool) -> None:
    bundle = _bundle(setup, ["AMD_VISIBLE_DEVICES=3,12"])
    done = _runc(bundle, v2)
    assert done.returncode != 0
    assert "done" not in done.stdout
    # runc shows the hook's stderr: our one line is in its error message
    assert "oci-gpu-hook: error: AMD_VISIBLE_DEVICES=3,12: '12' is out of range" in done.stderr
    assert "Traceback" not in done.stderr


@V1_V2
def test_hook_listed_twice_is_the_same_as_once(setup: dict[str, Path], v2: bool) -> None:
    bundle = _bundle(setup, ["AMD_VISIBLE_DEVICES=5"], times=2)
    done = _runc(bundle, v2)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [5], cgroup_v2=v2)
    first, second = _log_lines(setup, bundle.name)
    assert all(n.endswith(" made") for n in first["nodes"])  # type: ignore[union-attr]
    assert all(n.endswith(" present") for n in second["nodes"])  # type: ignore[union-attr]
    if v2:
        assert "already grants" in str(second["cgroup_result"])
    else:
        assert second["cgroup_result"] == "already allowed"


@pytest.mark.parametrize(("request_env", "gpus"), [
    (["AMD_VISIBLE_DEVICES=1"], [1]),
    (["AMD_VISIBLE_DEVICES=all"], list(range(8))),
    ([], []),
])
def test_podman_prestart_hooks_dir(setup: dict[str, Path], request_env: list[str], gpus: list[int]) -> None:
    argv = [*cl.PODMAN, "--runtime=runc", f"--hooks-dir={setup['hooks_dir']}", *cl.PODMAN_RUN]
    for entry in request_env:
        argv += ["-e", entry]
    argv += ["--rootfs", str(setup["rootfs"]), "/bin/sh", "/probe.sh"]
    done = cl.run(argv, env=cl.hook_env())
    assert done.returncode == 0, done.stderr
    result = cl.assert_isolated(done.stdout, gpus, cgroup_v2=False)
    assert result.links == cl.expected_links(gpus)


def test_podman_prestart_bad_request(setup: dict[str, Path]) -> None:
    argv = [*cl.PODMAN, "--runtime=runc", f"--hooks-dir={setup['hooks_dir']}", *cl.PODMAN_RUN,
            "-e", "AMD_VISIBLE_DEVICES=GPU-0123", "--rootfs", str(setup["rootfs"]), "/bin/sh", "/probe.sh"]
    done = cl.run(argv, env=cl.hook_env())
    assert done.returncode != 0
    assert "done" not in done.stdout
    assert "'GPU-0123' is not the unique id of an AMD GPU on this host" in done.stderr


# --- v2 equivalence -----------------------------------------------------------------------------

@pytest.fixture
def jit_harden(request: pytest.FixtureRequest) -> Iterator[str]:
    path = Path("/proc/sys/net/core/bpf_jit_harden")
    old = path.read_text().strip()
    path.write_text(str(request.param))
    try:
        yield path.read_text().strip()
    finally:
        path.write_text(old)


@V1_V2
@pytest.mark.parametrize("jit_harden", [0, 2], indirect=True, ids=["harden-0", "harden-2"])
def test_policy_is_old_plus_planned(setup: dict[str, Path], v2: bool, jit_harden: str) -> None:
    """Every access allowed before the hook is still allowed after it, and only the planned nodes were added."""
    args = ["/bin/sh", "/wide.sh"]
    plain = cl.make_bundle(setup["base"] / cl.container_id(), setup["rootfs"], ["AMD_VISIBLE_DEVICES=1"], args)
    hooked = _bundle(setup, ["AMD_VISIBLE_DEVICES=1"], args=args)
    before_run, after_run = _runc(plain, v2), _runc(hooked, v2)
    assert before_run.returncode == 0 and after_run.returncode == 0, before_run.stderr + after_run.stderr
    before, after = cl.parse_wide(before_run.stdout), cl.parse_wide(after_run.stdout)
    assert set(before) == set(after) == set(cl.WIDE_DEVICES)
    allowed_before = {d for d, r in before.items() if "EPERM" not in r}
    allowed_after = {d for d, r in after.items() if "EPERM" not in r}
    assert allowed_before <= allowed_after
    assert allowed_after - allowed_before == {("c", 226, 2), ("c", 226, 129), ("c", 234, 0)}
    assert ("c", 1, 3) in allowed_before  # /dev/null: the probe itself can tell allowed from denied
    for device in allowed_before:
        assert after[device] == before[device], device  # same outcome, not just "not EPERM"
    (line,) = _log_lines(setup, hooked.name)
    assert line["cgroup"] == ("v2" if v2 else "v1")


# --- hostile images -----------------------------------------------------------------------------

HOOK_NAMES = {"dri", "card2", "renderD129", "kfd", "by-path"}


def _hostile_rootfs(setup: dict[str, Path], layout: str, escape: Path) -> Path:
    """A rootfs whose own /dev (no tmpfs over it) is laid out by a hostile image."""
    root = setup["base"] / f"hostile-{uuid.uuid4().hex[:8]}"
    shutil.copytree(setup["rootfs"], root, symlinks=True)
    dev = root / "dev"
    shutil.rmtree(dev)
    if layout == "dev-absolute":
        dev.symlink_to(escape)
    elif layout == "dev-relative":
        dev.symlink_to("../../../../../../../../.." + str(escape))
    else:
        (dev / "dri").parent.mkdir()
        dri = dev / "dri"
        if layout == "dri-proc-self-root":
            dri.symlink_to(f"/proc/self/root{escape}")
        elif layout == "dri-dotdot":
            dri.symlink_to("../../../../.." + str(escape))
        elif layout == "dri-inside-root":
            dri.symlink_to("/etc")
        elif layout == "by-path":
            dri.mkdir()
            (dri / "by-path").symlink_to(str(escape))
        elif layout == "card-is-file":
            dri.mkdir()
            (dri / "card2").write_text("not a device\n")
        elif layout == "card-is-fifo":
            dri.mkdir()
            os.mkfifo(dri / "card2")
        elif layout == "kfd-is-symlink":
            dri.mkdir()
            (dev / "kfd").symlink_to(str(escape / "kfd"))
        else:
            raise AssertionError(layout)
    return root


@pytest.mark.parametrize("layout", ["dev-absolute", "dev-relative", "dri-proc-self-root", "dri-dotdot",
                                    "dri-inside-root", "by-path", "card-is-file", "card-is-fifo",
                                    "kfd-is-symlink"])
def test_hostile_rootfs_never_escapes(setup: dict[str, Path], layout: str) -> None:
    escape = setup["base"] / f"escape-{uuid.uuid4().hex[:8]}"
    escape.mkdir()
    root = _hostile_rootfs(setup, layout, escape)
    bundle = _bundle(setup, ["AMD_VISIBLE_DEVICES=1"])

    def hostile(spec: dict[str, object]) -> None:
        spec["root"] = {"path": str(root), "readonly": False}
        spec["mounts"] = [m for m in spec["mounts"] if m["destination"] not in ("/dev",)]  # type: ignore[attr-defined,index]

    cl.edit_spec(bundle, hostile)
    done = _runc(bundle, v2=False)
    # runc itself follows a /dev symlink when no tmpfs covers /dev (it writes its fd, stdin, ptmx, ...
    # links there); what must never appear outside the rootfs is anything of the hook's.
    ours = [p for p in escape.rglob("*") if p.name in HOOK_NAMES or p.name.startswith("pci-")]
    assert ours == [], f"written outside the rootfs: {ours}"
    assert not any((Path("/etc") / name).exists() for name in HOOK_NAMES)
    # Each of these layouts is refused by the hook (correct nodes are impossible without
    # following the image's links), so the container does not start.
    assert done.returncode != 0 and "done" not in done.stdout
    (line,) = _log_lines(setup, bundle.name)
    assert line["outcome"] == "error" and "refusing" in str(line["error"])
    assert "refusing" in done.stderr and "Traceback" not in done.stderr


# --- bad input ----------------------------------------------------------------------------------

def _hook(setup: dict[str, Path], stdin: str) -> subprocess.CompletedProcess[str]:
    return cl.run([str(setup["hook"]), "prestart"], env=cl.hook_env(), stdin=stdin)


@pytest.mark.parametrize(("stdin", "message"), [
    ("", "no container state on stdin"),
    ('{"ociVersion": "1.0.2", "id": "x", "pid": 1', "not valid JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"id": "x", "bundle": "/tmp"}', "no valid 'pid'"),
    ('{"id": "x", "pid": "12", "bundle": "/tmp"}', "no valid 'pid'"),
    ('{"id": "x", "pid": 1, "bundle": "relative/dir"}', "absolute 'bundle'"),
    ('{"id": "x", "pid": 1, "bundle": "/nonexistent-bundle-dir"}', "cannot read /nonexistent-bundle-dir/config.json"),
])
def test_bad_state_input(setup: dict[str, Path], stdin: str, message: str) -> None:
    from oci_gpu_hook import schemas
    from oci_gpu_hook.errors import HookError

    try:  # each of these is also outside schemas/oci-state.schema.json (or not JSON at all)
        parsed = json.loads(stdin)
    except ValueError:
        parsed = None
    if parsed is not None and "nonexistent" not in stdin:
        with pytest.raises(HookError):
            schemas.validate(parsed, "oci-state.schema.json", "state")
    done = _hook(setup, stdin)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("oci-gpu-hook: error: ")
    assert message in done.stderr and "Traceback" not in done.stderr


def test_missing_config_json_and_gone_pid(setup: dict[str, Path]) -> None:
    empty = setup["base"] / "empty-bundle"
    empty.mkdir()
    done = _hook(setup, json.dumps({"id": "x", "pid": os.getpid(), "bundle": str(empty)}))
    assert done.returncode == 1 and "config.json" in done.stderr and done.stderr.count("\n") == 1
    bundle = _bundle(setup, ["AMD_VISIBLE_DEVICES=1"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    done = _hook(setup, json.dumps({"id": "x", "pid": gone.pid, "bundle": str(bundle)}))
    assert done.returncode == 1 and f"container process {gone.pid} is gone" in done.stderr
    assert done.stderr.count("\n") == 1


# --- concurrency --------------------------------------------------------------------------------

@V1_V2
def test_sixteen_containers_in_parallel(setup: dict[str, Path], v2: bool) -> None:
    bundles = [(_bundle(setup, [f"AMD_VISIBLE_DEVICES={i % 8}"]), i % 8) for i in range(16)]
    procs = []
    for bundle, _gpu in bundles:
        argv = ["runc", "run", "--bundle", str(bundle), bundle.name]
        procs.append(subprocess.Popen(cl.cgroup2_wrap(argv) if v2 else argv, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    for (_bundle_dir, gpu), proc in zip(bundles, procs, strict=True):
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        cl.assert_isolated(out, [gpu], cgroup_v2=v2)


# --- inspect ------------------------------------------------------------------------------------

@V1_V2
@pytest.mark.parametrize("jit_harden", [0, 2], indirect=True, ids=["harden-0", "harden-2"])
def test_inspect_shows_what_the_container_may_open(setup: dict[str, Path], v2: bool, jit_harden: str) -> None:
    bundle = _bundle(setup, ["AMD_VISIBLE_DEVICES=1"], args=["/bin/sleep", "600"])
    start = ["runc", "run", "--detach", "--bundle", str(bundle), bundle.name]
    delete = ["runc", "delete", "--force", bundle.name]
    errors = setup["base"] / f"{bundle.name}.stderr"
    with errors.open("w") as stderr:  # a detached container keeps runc's stdio: no pipes here
        started = subprocess.run(cl.cgroup2_wrap(start) if v2 else start, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=stderr, timeout=60)
    assert started.returncode == 0, errors.read_text()
    try:
        state = json.loads(cl.run(["runc", "state", bundle.name]).stdout)
        from oci_gpu_hook import schemas

        schemas.validate(state, "oci-state.schema.json", "runc state")  # what runc really hands a hook
        # v2: the cgroup2 hierarchy is mounted at /sys/fs/cgroup/unified outside the test's namespace
        target = ["--cgroup", f"/sys/fs/cgroup/unified/{bundle.name}"] if v2 else ["--pid", str(state["pid"])]
        shown = cl.run([str(setup["hook"]), "inspect", *target], env=cl.hook_env())
        assert shown.returncode == 0, shown.stderr
        lines = [line.split() for line in shown.stdout.splitlines()]
        allowed = {(w[1], w[2]) for w in lines if w and w[0] == "allow"}
        assert {("c", "226:2"), ("c", "226:129"), ("c", "234:0"), ("c", "1:3")} <= allowed
        assert not any(w[2].startswith("226:") for w in lines if w and w[0] == "allow" and w[2] not in (
            "226:2", "226:129"))
        assert "amd 1 /dev/dri/renderD129 (0000:23:00.0)" in shown.stdout
        if v2:
            assert "program" in shown.stdout and "'oci_gpu_hook'" in shown.stdout
            assert ["deny", "a", "*:*", "rwm"] in lines
        else:
            # cross-check against cgroupspy's reading of the same devices.list
            from cgroupspy.nodes import Node

            node = Node(bundle.name, parent=Node("devices", parent=Node("/sys/fs/cgroup")))
            oracle = {(str(a.dev_type), f"{a.major}:{a.minor}") for a in node.controller.list}
            assert allowed == oracle
    finally:
        cl.run(cl.cgroup2_wrap(delete) if v2 else delete)


def test_inspect_of_something_else_is_one_clear_line(setup: dict[str, Path], tmp_path: Path) -> None:
    done = cl.run([str(setup["hook"]), "inspect", "--cgroup", str(tmp_path)], env=cl.hook_env())
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert "is neither a cgroup v1 devices group nor a cgroup2 group" in done.stderr
