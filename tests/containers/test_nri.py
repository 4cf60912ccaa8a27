"""``oci-gpu-hook nri`` against an NRI runtime double, its adjustments applied to real runc containers.

The plugin runs as it is started on a node (the launcher, ``nri --socket``), connects to the double's socket
(tests/helpers/nriruntime.py: NRI's own multiplexing, ttrpc and messages, its handshake) and answers
CreateContainer for containers described from real runc bundles; the double applies each adjustment to the
bundle's config.json as containerd applies it, runc runs it, and the isolation probe shows exactly the asked GPUs
(ENXIO) and every other one refused (EPERM), cgroup v1 and v2.  Then the plugin down: what starts and what is
refused with NRI's default validator requiring it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from oci_gpu_hook.serve.nri import api_pb2
from tests.helpers import containerlib as cl
from tests.helpers import nriruntime as nr
from tests.helpers import systemdenv, wheellib

pytestmark = pytest.mark.containers
POD = api_pb2.PodSandbox(id="pod-1", name="gpu-pod", namespace="default", uid="0000-1111")


def _start(setup: dict[str, Path], socket_path: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([str(setup["hook"]), "nri", "--socket", str(socket_path)], stdout=out, stderr=out,
                                env=cl.hook_env())


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    cl.need("runc", "busybox", "unshare")
    paths = cl.hook_setup(tmp_path_factory.mktemp("nri"))
    yield paths


@pytest.fixture(scope="module")
def runtime(setup: dict[str, Path]) -> Iterator[nr.NRIRuntime]:
    """The double with the plugin connected, registered, configured and synchronized."""
    double = nr.NRIRuntime(setup["base"] / "nri.sock")
    plugin = _start(setup, double.path, setup["base"] / "plugin.log")
    try:
        double.accept()
        yield double
    finally:
        double.close()
        _stop(plugin)


def _create(runtime: nr.NRIRuntime, setup: dict[str, Path], env: list[str],
            annotations: dict[str, str] | None = None, pod: api_pb2.PodSandbox = POD) -> tuple[Path, dict, dict]:
    """A runc bundle for a container with ``env`` and ``annotations``, after CreateContainer: its config.json
    adjusted as containerd adjusts it (the bundle, the spec before, the adjustment as a dict)."""
    bundle = cl.make_bundle(setup["base"] / cl.container_id(), setup["rootfs"], env)
    spec = json.loads((bundle / "config.json").read_text())
    before = json.loads(json.dumps(spec))
    if annotations:
        spec["annotations"] = dict(annotations)
    adjust = runtime.create_container(pod, nr.container_of(spec, bundle.name, annotations=annotations))
    nr.apply_adjustment(spec, adjust)
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle, before, spec


def _run(bundle: Path, v2: bool = False) -> subprocess.CompletedProcess[str]:
    argv = ["runc", "run", "--bundle", str(bundle), bundle.name]
    return cl.run(cl.cgroup2_wrap(argv) if v2 else argv)


def test_registration(runtime: nr.NRIRuntime) -> None:
    """Registered under its name and index, subscribed to CREATE_CONTAINER only (NRI's event bit 4 - 1)."""
    assert runtime.plugin is not None
    assert (runtime.plugin.name, runtime.plugin.idx) == ("oci-gpu-hook", "10")
    assert runtime.plugin.events == 1 << (api_pb2.CREATE_CONTAINER - 1)


def test_a_container_that_asks_for_nothing_is_untouched(runtime: nr.NRIRuntime, setup: dict[str, Path]) -> None:
    bundle, before, after = _create(runtime, setup, ["AMD_VISIBLE_DEVICES=none"])
    assert after == before
    done = _run(bundle)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [])


@pytest.mark.parametrize("v2", [False, True], ids=["cgroup-v1", "cgroup-v2"])
@pytest.mark.parametrize(("request_env", "gpus"), [("AMD_VISIBLE_DEVICES=1", [1]),
                                                   ("AMD_VISIBLE_DEVICES=0000:63:00.0,5-6", [3, 5, 6])])
def test_env_request(runtime: nr.NRIRuntime, setup: dict[str, Path], v2: bool, request_env: str,
                     gpus: list[int]) -> None:
    bundle, _, spec = _create(runtime, setup, [request_env])
    mounts = [m for m in spec["mounts"] if m["destination"] == "/dev/dri/by-path"]
    assert len(mounts) == 1 and mounts[0]["options"][:2] == ["bind", "ro"], spec["mounts"]
    done = _run(bundle, v2)
    assert done.returncode == 0, done.stderr
    result = cl.assert_isolated(done.stdout, gpus, cgroup_v2=v2)
    assert result.links == cl.expected_links(gpus)
    record = json.loads(setup["log"].read_text().splitlines()[-1])
    asked = "amd.com/gpu=" + request_env.split("=")[1]
    assert (record["entry"], record["id"], record["outcome"], record["request"]) == ("nri", bundle.name, "ok", asked)


def test_cdi_annotation(runtime: nr.NRIRuntime, setup: dict[str, Path]) -> None:
    """A device plugin's CDI annotation decides for its kind: the image's env asks in vain."""
    bundle, _, _ = _create(runtime, setup, ["AMD_VISIBLE_DEVICES=all"], {"cdi.k8s.io/devplugin": "amd.com/gpu=2"})
    done = _run(bundle)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [2])


def test_cdi_annotation_already_injected_adds_nothing_twice(runtime: nr.NRIRuntime, setup: dict[str, Path]) -> None:
    """containerd injected the CDI device before NRI (its nodes are in the spec): the plugin adds only what is
    missing (the by-path mount), never a second grant."""
    _, _, injected = _create(runtime, setup, [], {"cdi.k8s.io/devplugin": "amd.com/gpu=2"})
    bundle = cl.make_bundle(setup["base"] / cl.container_id(), setup["rootfs"], [])
    spec = json.loads((bundle / "config.json").read_text())
    spec["linux"]["devices"] = injected["linux"]["devices"]
    spec["linux"]["resources"]["devices"] = injected["linux"]["resources"]["devices"]
    annotations = {"cdi.k8s.io/devplugin": "amd.com/gpu=2"}
    adjust = runtime.create_container(POD, nr.container_of(spec, bundle.name, annotations=annotations))
    assert list(adjust.linux.devices) == [] and list(adjust.linux.resources.devices) == []
    assert [m.destination for m in adjust.mounts] == ["/dev/dri/by-path"]
    nr.apply_adjustment(spec, adjust)
    (bundle / "config.json").write_text(json.dumps(spec))
    done = _run(bundle)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [2])


def test_a_bad_request_fails_the_container_with_one_line(runtime: nr.NRIRuntime, setup: dict[str, Path]) -> None:
    with pytest.raises(nr.PluginError) as refused:
        _create(runtime, setup, ["AMD_VISIBLE_DEVICES=1,8"])
    line = refused.value.message
    assert "\n" not in line and line.startswith("oci-gpu-hook: AMD_VISIBLE_DEVICES=1,8: '8' is out of range")
    assert "valid:" in line
    records = [json.loads(r) for r in setup["log"].read_text().splitlines()]
    assert {"entry": "nri", "outcome": "error", "error": line.replace("oci-gpu-hook: ", "oci-gpu-hook: error: ", 1)
            }.items() <= records[-1].items()
    # the plugin goes on serving
    bundle, _, _ = _create(runtime, setup, ["AMD_VISIBLE_DEVICES=4"])
    done = _run(bundle)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [4])


def test_two_grants_of_one_kind_are_refused(runtime: nr.NRIRuntime, setup: dict[str, Path]) -> None:
    """Annotations that name other devices than the container already has: refused, never the union."""
    spec = json.loads((cl.make_bundle(setup["base"] / cl.container_id(), setup["rootfs"], []) / "config.json")
                      .read_text())
    spec["linux"]["devices"] = [{"path": "/dev/dri/card2", "type": "c", "major": 226, "minor": 2}]
    annotations = {"cdi.k8s.io/devplugin": "amd.com/gpu=3"}
    with pytest.raises(nr.PluginError) as refused:
        runtime.create_container(POD, nr.container_of(spec, "c-union", annotations=annotations))
    assert "never their union" in refused.value.message and "\n" not in refused.value.message


# --- the plugin down ----------------------------------------------------------------------------------------

REQUIRES_PLUGIN = {nr.REQUIRED_PLUGINS: '["oci-gpu-hook"]'}


def test_plugin_down_then_back(setup: dict[str, Path], tmp_path: Path) -> None:
    """Plugin gone (shut down by the runtime: exit 0): a container that asks for nothing starts; a GPU pod that
    requires the plugin (NRI's default validator, by pod annotation) is refused, never started without its GPU.
    Plugin back: that pod starts with exactly its GPU."""
    double = nr.NRIRuntime(tmp_path / "nri.sock")
    log = tmp_path / "plugin.log"
    plugin = _start(setup, double.path, log)
    try:
        peer = double.accept()
        peer.shutdown()
        assert plugin.wait(timeout=30) == 0, log.read_text()
        assert peer.closed()
        gpu_pod = api_pb2.PodSandbox(id="pod-2", name="gpu", namespace="default", annotations=REQUIRES_PLUGIN)

        bundle, before, after = _create(double, setup, [])
        assert after == before
        done = _run(bundle)
        assert done.returncode == 0, done.stderr
        cl.assert_isolated(done.stdout, [])
        with pytest.raises(nr.PluginError, match="required plugin 'oci-gpu-hook' not present"):
            _create(double, setup, ["AMD_VISIBLE_DEVICES=1"], pod=gpu_pod)

        plugin = _start(setup, double.path, log)
        double.accept()
        bundle, _, _ = _create(double, setup, ["AMD_VISIBLE_DEVICES=1"], pod=gpu_pod)
        done = _run(bundle)
        assert done.returncode == 0, done.stderr
        cl.assert_isolated(done.stdout, [1])
    finally:
        double.close()
        _stop(plugin)


def test_the_first_container_after_the_plugin_died_passes_the_validator(setup: dict[str, Path],
                                                                        tmp_path: Path) -> None:
    """What NRI does (seen on a real containerd 2.3.4, docs/nri.md): the plugin killed, the first container of a
    pod that requires it is still created, without its GPU (NRI counts the dead plugin as present until a request
    to it fails); the next one is refused."""
    double = nr.NRIRuntime(tmp_path / "nri.sock")
    plugin = _start(setup, double.path, tmp_path / "plugin.log")
    try:
        peer = double.accept()
        plugin.kill()
        plugin.wait(timeout=30)
        assert peer.closed()
        gpu_pod = api_pb2.PodSandbox(id="pod-3", name="gpu", namespace="default", annotations=REQUIRES_PLUGIN)
        bundle, before, after = _create(double, setup, ["AMD_VISIBLE_DEVICES=1"], pod=gpu_pod)
        assert after == before and double.plugin is None
        done = _run(bundle)
        assert done.returncode == 0, done.stderr
        cl.assert_isolated(done.stdout, [])
        with pytest.raises(nr.PluginError, match="required plugin 'oci-gpu-hook' not present"):
            _create(double, setup, ["AMD_VISIBLE_DEVICES=1"], pod=gpu_pod)
    finally:
        double.close()
        _stop(plugin)


def test_the_plugin_exits_when_the_runtime_goes(setup: dict[str, Path], tmp_path: Path) -> None:
    """The runtime closes the connection (a restart): the plugin says so on one line and exits 1, for its
    service manager to start it again."""
    double = nr.NRIRuntime(tmp_path / "nri.sock")
    log = tmp_path / "plugin.log"
    plugin = _start(setup, double.path, log)
    try:
        double.accept()
        double.plugin.close()  # type: ignore[union-attr]
        assert plugin.wait(timeout=30) == 1
        assert log.read_text().splitlines()[-1] == "oci-gpu-hook nri: the runtime closed the NRI connection"
    finally:
        double.listener.close()
        _stop(plugin)


# --- what ships ---------------------------------------------------------------------------------------------

def _wheel_venv(directory: Path) -> Path:
    """The wheel in a venv of its own, with the protobuf of this suite (no other version is fetched)."""
    from google.protobuf import __version__ as protobuf_version

    python = wheellib.make_venv(directory, wheellib.built_wheel())
    installed = subprocess.run([str(python.parent / "pip"), "install", "-q", "--disable-pip-version-check",
                                f"protobuf=={protobuf_version}"], capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr
    return python


def test_the_installed_unit_outlasts_a_long_runtime_restart() -> None:
    """install's unit under a real systemd (tests/helpers/systemdenv.py): with the runtime's socket gone, each
    start of the plugin fails at once; systemd keeps starting it past its default start limit (5 starts in 10 s,
    after which a unit without ``StartLimitIntervalSec=0`` stays failed: seen with a real containerd 2.1.9 down
    for a few seconds), and once the runtime listens again the plugin registers and serves a GPU container.
    Hardened as the DaemonSet's container: the serving plugin is root with no capability in any set (bounding set
    included) and no-new-privs, in a read-only system where it still writes its by-path directory (under
    /run/oci-gpu-hook) and the config's log file (its directory, a ReadWritePaths= install added)."""
    cl.need("unshare", "nsenter", "setpriv", "/lib/systemd/systemd", "systemd-run")
    base = Path(tempfile.mkdtemp(prefix="ogh-nri-sd-"))
    try:
        python = _wheel_venv(base / "venv")
        (base / "nri").mkdir()
        with systemdenv.booted(binds=(base,)) as env:
            log = base / "hook.log"
            (base / "config.toml").write_text(f'sysfs_root = "{cl.SEED_SYSFS}"\nlog_file = "{log}"\n')
            by_path = Path("/run/oci-gpu-hook/by-path")  # the default: the unit's RuntimeDirectory
            setup = (f"mkdir -p /etc/oci-gpu-hook /run/nri && mount --bind {base / 'nri'} /run/nri && "
                     f"cp {base / 'config.toml'} /etc/oci-gpu-hook/config.toml")
            done = env.run(["sh", "-c", setup], unit=False)
            assert done.returncode == 0, done.stderr
            done = env.run([str(python.parent / "oci-gpu-hook"), "install", "--only", "nri"], env=cl.hook_env(),
                           unit=False, timeout=300)
            assert done.returncode == 0, done.stdout + done.stderr
            assert "note: env requests: off, since pods reach these launchers (the NRI plugin's unit)" in done.stdout
            assert env.systemctl("daemon-reload").returncode == 0
            assert env.systemctl("start", "oci-gpu-hook-nri").returncode == 0

            def state() -> dict[str, str]:
                out = env.systemctl("show", "-p", "ActiveState,NRestarts", "oci-gpu-hook-nri").stdout
                return dict(line.split("=", 1) for line in out.split())

            deadline = time.monotonic() + 120
            while int((now := state())["NRestarts"]) < 7:  # past the default limit's 5
                assert now["ActiveState"] != "failed", now
                assert time.monotonic() < deadline, f"systemd restarted the plugin {now['NRestarts']} times"
                time.sleep(0.5)
            double = nr.NRIRuntime(base / "nri" / "nri.sock")
            try:
                double.accept()  # the next start registers (bounded by the double's wait)
                container = api_pb2.Container(id="c-after-restarts", name="ctr", env=["AMD_VISIBLE_DEVICES=1"],
                                              annotations={"cdi.k8s.io/devplugin": "amd.com/gpu=1"})
                adjust = double.create_container(POD, container)
                assert [d.path for d in adjust.linux.devices] == ["/dev/dri/card2", "/dev/dri/renderD129", "/dev/kfd"]
                _assert_hardened(env, by_path, adjust, log)
            finally:
                double.close()
                env.systemctl("stop", "oci-gpu-hook-nri")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _assert_hardened(env: systemdenv.SystemdEnv, by_path: Path, adjust: api_pb2.ContainerAdjustment,
                     log: Path) -> None:
    """The serving plugin of the unit install wrote: what systemd says of it, what /proc says of its process, what it
    wrote (the by-path directory it prepared, a log line) and what it cannot write (the system, read-only)."""
    shown = dict(line.split("=", 1) for line in env.systemctl(
        "show", "-p", "MainPID,NoNewPrivileges,CapabilityBoundingSet,ProtectSystem", "oci-gpu-hook-nri").stdout.split())
    assert (shown["NoNewPrivileges"], shown["CapabilityBoundingSet"], shown["ProtectSystem"]) == ("yes", "", "strict")
    status = env.run(["cat", f"/proc/{shown['MainPID']}/status"], unit=False).stdout
    fields = {k: " ".join(v.split()) for k, _c, v in (line.partition(":") for line in status.splitlines())}
    assert fields["Uid"] == "0 0 0 0" and fields["NoNewPrivs"] == "1", status
    assert {fields[f] for f in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")} == {"0" * 16}, status
    sources = [m.source for m in adjust.mounts if m.destination == "/dev/dri/by-path"]
    assert len(sources) == 1 and Path(sources[0]).parent == by_path, list(adjust.mounts)
    assert env.run(["test", "-d", sources[0]], unit=False).returncode == 0
    assert '"c-after-restarts"' in log.read_text()
    probe = env.run(["nsenter", "-t", shown["MainPID"], "-m", "touch", "/etc/oci-gpu-hook/written-by-the-plugin"],
                    unit=False)
    assert probe.returncode != 0 and "Read-only file system" in probe.stderr, probe.stderr


def test_the_wheels_plugin(setup: dict[str, Path], tmp_path: Path) -> None:
    """The plugin as an operator installs it: the wheel in a venv of its own.  Without protobuf it says which
    extra to install, one line; with it, it registers and a GPU container gets exactly its GPU."""
    python = wheellib.make_venv(tmp_path / "venv", wheellib.built_wheel())
    hook = python.parent / "oci-gpu-hook"
    double = nr.NRIRuntime(tmp_path / "nri.sock")
    try:
        argv = [str(hook), "--config", str(setup["config"]), "nri", "--socket", str(double.path)]
        bare = python.parent / "pip"
        assert subprocess.run([str(python), "-c", "import google.protobuf"], capture_output=True,
                              timeout=60).returncode != 0, "protobuf came with the wheel's own dependencies"
        done = cl.run(argv, env=cl.hook_env())
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
        assert "pip install 'oci-gpu-hook[nri]'" in done.stderr
        from google.protobuf import __version__ as protobuf_version  # the suite's: no other version is fetched

        installed = subprocess.run([str(bare), "install", "-q", "--disable-pip-version-check",
                                    f"protobuf=={protobuf_version}"], capture_output=True, text=True, timeout=600)
        assert installed.returncode == 0, installed.stderr
        with (tmp_path / "plugin.log").open("ab") as out:
            plugin = subprocess.Popen(argv, stdout=out, stderr=out, env=cl.hook_env())
        try:
            double.accept()
            bundle, _, _ = _create(double, setup, ["AMD_VISIBLE_DEVICES=6"])
            done = _run(bundle)
            assert done.returncode == 0, done.stderr
            cl.assert_isolated(done.stdout, [6])
        finally:
            _stop(plugin)
    finally:
        double.close()
