"""containerd 1.6: ``ctr run --runc-binary oci-gpu-runtime`` on a real daemon, and the CRI drop-in.

A private containerd (its own root, state, sockets and namespace under the
test's temp dir) imports the busybox probe image from an OCI layout tarball
(tests/ocilayout.py).  Its configuration is made the way ``install`` makes a
node's: a main config with CRI settings of its own (CNI, sandbox image, a runc
runtime with options, a registry mirror) gets its ``imports`` line from
``oci_gpu_hook.host.containerd.with_import`` (pointed at the test's conf.d), and
conf.d holds ``oci_gpu_hook.host.containerd.drop_in`` for the lean launcher, built
from that parsed main config.  containerd 1.x replaces the main config's whole
CRI table with the drop-in's, so ``config dump`` and the CRI plugin's start line
must show the host's CRI settings and the oci-gpu runtime together; a drop-in
built without the main config shows what goes wrong otherwise.
containerd's runc shim (io.containerd.runc.v2) runs the launcher with
containerd's environment, not ctr's, so the launcher carries OCI_GPU_HOOK_CONFIG
(the seed host's sysfs).  Every container runs the isolation probe
(tests/containerlib.py).  Teardown removes what is left, stops the daemon by its
PID and fails if anything under the temp dir is still mounted or running.  Needs
root, containerd, ctr, runc and busybox; under CI=true a missing one fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import tomllib
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from oci_gpu_hook.host import containerd
from oci_gpu_hook.host.containerd import RUNTIME_NAME, drop_in
from tests import containerlib as cl
from tests import ocilayout

pytestmark = pytest.mark.containers

IMAGE = "docker.io/library/oci-gpu-hook-probe:test"
IMAGE_ENV_ALL = "docker.io/library/oci-gpu-hook-probe:env-all"  # ships AMD_VISIBLE_DEVICES=all in its config
CRI = "io.containerd.grpc.v1.cri"
# The main config's own CRI settings, which must survive the drop-in (Debian's config.toml sets bin_dir).
CNI_BIN_DIR = "/usr/lib/cni"
SANDBOX_IMAGE = "registry.example/pause:3.9"
MIRROR = "https://mirror.registry.example"


@dataclass
class Daemon:
    base: Path
    config: Path
    socket: Path
    namespace: str
    runtime: Path  # the launcher with allow_env_requests on (the default)
    runtime_no_env: Path  # the launcher whose config has allow_env_requests = false
    hook_log: Path
    daemon_log: Path
    process: subprocess.Popen[bytes] | None = None
    timings: dict[str, float] = field(default_factory=dict)
    enter: list[str] = field(default_factory=list)  # a command prefix containerd runs through (a private root)

    def ctr(self, *args: str, timeout: int = 60) -> subprocess.CompletedProcess[str]:
        return cl.run(["ctr", "-a", str(self.socket), "-n", self.namespace, *args], stdin="", timeout=timeout)

    def run(self, cid: str, *, env: list[str] | None = None, annotations: dict[str, str] | None = None,
            runtime: Path | None = None, image: str = IMAGE) -> subprocess.CompletedProcess[str]:
        argv = ["run", "--rm", "--runc-binary", str(runtime or self.runtime), "--runc-root", str(self.base / "runc"),
                "--fifo-dir", str(self.base / "fifo"), "--cap-add", "CAP_MKNOD",
                # ctr adds no nodev to a tmpfs (unlike podman): the probe's mknod'ed nodes can be opened
                "--mount", "type=tmpfs,src=tmpfs,dst=/tmp,options=rw:nosuid:mode=1777"]
        for entry in env or []:
            argv += ["--env", entry]
        for key, value in (annotations or {}).items():
            argv += ["--annotation", f"{key}={value}"]
        return self.ctr(*argv, image, cid, "/bin/sh", "/probe.sh")

    def log_entries(self, cid: str) -> list[dict[str, object]]:
        if not self.hook_log.exists():
            return []
        return [e for e in map(json.loads, self.hook_log.read_text().splitlines()) if e.get("id") == cid]

    def leftovers(self) -> list[str]:
        """Containers, tasks and active snapshots (container root filesystems) still in this test's namespace."""
        left = [f"container {c}" for c in self.ctr("containers", "ls", "-q").stdout.split()]
        left += [f"task {t}" for t in self.ctr("tasks", "ls", "-q").stdout.split()]
        for line in self.ctr("snapshots", "ls").stdout.splitlines()[1:]:  # KEY PARENT KIND
            if line.strip() and line.split()[-1] != "Committed":  # committed ones are the image's layers
                left.append(f"snapshot {line.split()[0]}")
        return left


def _main_config(base: Path, socket: Path) -> str:
    """A containerd config like a host's: its own paths and CRI settings of its own, no ``imports`` yet."""
    cri = f'plugins."{CRI}"'
    return (
        "# the node's containerd config\n"
        "version = 2\n"
        f'root = "{base / "root"}"\n'
        f'state = "{base / "state"}"\n\n'
        "[grpc]\n"
        f'  address = "{socket}"\n\n'
        "[ttrpc]\n"
        f'  address = "{socket}.ttrpc"\n\n'
        "[plugins]\n"
        f"  [{cri}]\n"
        f'    sandbox_image = "{SANDBOX_IMAGE}"\n'
        f"    [{cri}.cni]\n"
        f'      bin_dir = "{CNI_BIN_DIR}"\n'
        f'      conf_dir = "{base / "cni"}"\n'
        f"    [{cri}.containerd]\n"
        '      default_runtime_name = "runc"\n'
        f"      [{cri}.containerd.runtimes.runc]\n"
        '        runtime_type = "io.containerd.runc.v2"\n'
        f"        [{cri}.containerd.runtimes.runc.options]\n"
        "          SystemdCgroup = true\n"
        f'    [{cri}.registry.mirrors."docker.io"]\n'
        f'      endpoint = ["{MIRROR}"]\n'
        '  [plugins."io.containerd.internal.v1.opt"]\n'
        f'    path = "{base / "opt"}"\n'
    )


def _write_config(base: Path, socket: Path, runtime: Path, cdi: bool = False) -> Path:
    """What ``install`` writes on a node: the main config with its imports line, and the drop-in built
    from the parsed main config (native CDI on with ``cdi``); conf.d is the test's, not /etc/containerd/conf.d."""
    conf_d = base / "conf.d"
    conf_d.mkdir()
    main = _main_config(base, socket)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(containerd, "DROP_IN_DIR", str(conf_d))
        patch.setattr(containerd, "DROP_IN_PATH", str(conf_d / "oci-gpu-hook.toml"))
        imported = containerd.with_import(main)
    assert imported is not None
    assert f'imports = ["{conf_d}/*.toml"]  # added by oci-gpu-hook install\n' in imported
    (conf_d / "oci-gpu-hook.toml").write_text(drop_in(str(runtime), tomllib.loads(main), cdi=cdi))
    config = base / "config.toml"
    config.write_text(imported)
    return config


def _launchers(directory: Path, config: Path, body: str) -> Path:
    config.write_text(body)
    return cl.write_launchers(directory, config)[1]


def _start(daemon: Daemon) -> None:
    with open(daemon.daemon_log, "wb") as log:
        daemon.process = subprocess.Popen([*daemon.enter, "containerd", "--config", str(daemon.config)],
                                          stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
    deadline = time.monotonic() + 30
    while True:
        if daemon.process.poll() is not None:
            pytest.fail(f"containerd exited with {daemon.process.returncode}:\n{daemon.daemon_log.read_text()[-3000:]}")
        if daemon.socket.exists() and daemon.ctr("version", timeout=10).returncode == 0:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"containerd did not answer on {daemon.socket}:\n{daemon.daemon_log.read_text()[-3000:]}")
        time.sleep(0.1)


def _stop(daemon: Daemon) -> list[str]:
    """Remove what the tests left, stop the daemon by its PID; return what is still mounted or running."""
    problems = []
    if daemon.process is not None and daemon.process.poll() is None:
        for task in daemon.ctr("tasks", "ls", "-q").stdout.split():
            problems.append(f"task {task} was still there")
            daemon.ctr("tasks", "kill", "-s", "SIGKILL", task)
            daemon.ctr("tasks", "delete", "-f", task)
        for container in daemon.ctr("containers", "ls", "-q").stdout.split():
            problems.append(f"container {container} was still there")
            daemon.ctr("containers", "delete", container)
        for image in daemon.ctr("images", "ls", "-q").stdout.split():
            daemon.ctr("images", "remove", "--sync", image)
        for line in daemon.ctr("snapshots", "ls").stdout.splitlines()[1:]:
            if line.strip():
                daemon.ctr("snapshots", "remove", line.split()[0])
        daemon.process.send_signal(signal.SIGTERM)
        try:
            daemon.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            problems.append("containerd ignored SIGTERM for 20 s")
            daemon.process.kill()
            daemon.process.wait(timeout=10)
    # containerd's runc shim makes a parent cgroup per namespace; remove the empty ones it left
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        group = hierarchy / daemon.namespace
        if group.is_dir():
            try:
                group.rmdir()
            except OSError as err:
                problems.append(f"cgroup {group} not removed: {err.strerror}")
    mounted = [line for line in cl.run(["mount"]).stdout.splitlines() if str(daemon.base) in line]
    for line in reversed(mounted):
        target = line.split(" on ", 1)[1].rsplit(" type ", 1)[0]
        cl.run(["umount", "-l", target])
    problems += [f"still mounted: {line}" for line in mounted]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(daemon.socket) in cmdline or str(daemon.base / "runc") in cmdline:
            problems.append(f"process {pid} still runs: {cmdline}")
    return problems


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory):
    cl.need("containerd", "ctr", "runc", "busybox")
    started = time.monotonic()
    base = tmp_path_factory.mktemp("ctrd")
    hook_log = base / "hook.log"
    common = f'sysfs_root = "{cl.SEED_SYSFS}"\nlog_file = "{hook_log}"\nhook_path = "{base / "bin" / "oci-gpu-hook"}"\n'
    runtime = _launchers(base / "bin", base / "hook.toml", common)
    runtime_no_env = _launchers(base / "bin-no-env", base / "hook-no-env.toml", common + "allow_env_requests = false\n")
    socket = base / "c.sock"
    config = _write_config(base, socket, runtime)
    d = Daemon(base=base, config=config, socket=socket, namespace=f"ogh-test-{uuid.uuid4().hex[:8]}",
               runtime=runtime, runtime_no_env=runtime_no_env, hook_log=hook_log, daemon_log=base / "containerd.log")
    rootfs = cl.make_rootfs(base / "rootfs")
    archives = [ocilayout.build(rootfs, base / "image.tar", IMAGE),
                ocilayout.build(rootfs, base / "image-env-all.tar", IMAGE_ENV_ALL,
                                env=["PATH=/bin", "AMD_VISIBLE_DEVICES=all"])]
    try:
        _start(d)
        d.timings["start"] = time.monotonic() - started
        for archive in archives:
            done = d.ctr("images", "import", str(archive))
            assert done.returncode == 0, done.stderr
        yield d
    finally:
        stopping = time.monotonic()
        problems = _stop(d)
        d.timings["stop"] = time.monotonic() - stopping
        print(f"\ncontainerd fixture: start+import {d.timings.get('start', 0):.2f} s, stop {d.timings['stop']:.2f} s")
        assert not problems, "containerd teardown: " + "; ".join(problems)


@pytest.mark.parametrize("compress", [True, False], ids=["gzip", "tar"])
def test_image_layout_round_trips(tmp_path: Path, compress: bool) -> None:
    """The tarball is a valid OCI layout: digests, diff_id, ref name, every file of the rootfs (no root needed)."""
    rootfs = tmp_path / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    (rootfs / "tmp").mkdir()
    (rootfs / "bin" / "busybox").write_bytes(b"\x7fELF not really")
    (rootfs / "bin" / "sh").symlink_to("busybox")
    (rootfs / "probe.sh").write_text(cl.PROBE)
    parts = ocilayout.read(ocilayout.build(rootfs, tmp_path / "image.tar", IMAGE, compress=compress))
    assert parts["oci-layout"] == {"imageLayoutVersion": "1.0.0"}
    assert parts["index"]["manifests"][0]["annotations"] == {ocilayout.REF_NAME: IMAGE}  # type: ignore[index]
    assert parts["config"]["architecture"] == ocilayout.host_architecture()  # type: ignore[index]
    assert sorted(parts["members"]) == ["bin", "bin/busybox", "bin/sh", "probe.sh", "tmp"]  # type: ignore[arg-type]
    again = ocilayout.build(rootfs, tmp_path / "again.tar", IMAGE, compress=compress)
    assert again.read_bytes() == (tmp_path / "image.tar").read_bytes()  # reproducible


# --- ctr run --runc-binary oci-gpu-runtime ----------------------------------------------------

GPU3 = {"cdi.k8s.io/test": "amd.com/gpu=3"}


@pytest.mark.parametrize(("env", "annotations", "gpus"), [
    (["AMD_VISIBLE_DEVICES=1"], {}, [1]),
    ([], GPU3, [3]),
    (["AMD_VISIBLE_DEVICES=all"], GPU3, [3]),  # annotations win over the env
    ([], {"cdi.k8s.io/plugin_dev": "amd.com/gpu=0000:a3:00.0,amd.com/gpu=0x3149e0fac5157ac2"}, [5, 6]),
    ([], {}, []),
    (["AMD_VISIBLE_DEVICES=none"], {}, []),
], ids=["env-1", "cdi-3", "cdi-wins-over-env-all", "cdi-pci-and-unique-id", "no-request", "env-none"])
def test_ctr_run(daemon: Daemon, env: list[str], annotations: dict[str, str], gpus: list[int]) -> None:
    cid = cl.container_id()
    done = daemon.run(cid, env=env, annotations=annotations)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, gpus)
    entries = daemon.log_entries(cid)
    if gpus:  # the shim rewrote the bundle: one log line for the create
        assert [e["outcome"] for e in entries] == ["ok"], entries
    else:
        assert entries == []
    assert daemon.leftovers() == []


@pytest.mark.parametrize(("runtime", "image", "env", "annotations", "gpus"), [
    ("on", IMAGE_ENV_ALL, [], {}, list(range(8))),  # the image's own env asks, and is honoured
    ("off", IMAGE_ENV_ALL, [], {}, []),
    ("off", IMAGE, ["AMD_VISIBLE_DEVICES=1"], {}, []),
    ("off", IMAGE_ENV_ALL, [], GPU3, [3]),
], ids=["image-env-honoured", "image-env-ignored", "run-env-ignored", "cdi-still-counts"])
def test_allow_env_requests(daemon: Daemon, runtime: str, image: str, env: list[str],
                            annotations: dict[str, str], gpus: list[int]) -> None:
    launcher = daemon.runtime if runtime == "on" else daemon.runtime_no_env
    done = daemon.run(cl.container_id(), env=env, annotations=annotations, runtime=launcher, image=image)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, gpus)


@pytest.mark.parametrize(("env", "annotations", "message"), [
    (["AMD_VISIBLE_DEVICES=9"], {}, "oci-gpu-hook: error: AMD_VISIBLE_DEVICES=9: '9' is out of range"),
    ([], {"cdi.k8s.io/test": "amd.com/gpu=9"},  # as examples/kubernetes/device-plugin-contract.md quotes it
     "oci-gpu-hook: error: cdi.k8s.io annotations=9: '9' is out of range (the host has 8 amd GPUs) (valid: all, none, "
     "indices 0-7, "),
    ([], {"cdi.k8s.io/test": "amd.com/gpu=nine"}, "oci-gpu-hook: error: cdi.k8s.io annotations=nine: 'nine' is not"),
    ([], {"cdi.k8s.io/test": "amd.com/gpu"}, "oci-gpu-hook: error: annotation cdi.k8s.io/test: 'amd.com/gpu' is not"),
], ids=["env-out-of-range", "cdi-out-of-range", "cdi-unknown-name", "cdi-malformed"])
def test_bad_request_stops_the_task(daemon: Daemon, env: list[str], annotations: dict[str, str],
                                    message: str) -> None:
    cid = cl.container_id()
    done = daemon.run(cid, env=env, annotations=annotations)
    assert done.returncode != 0
    assert "done" not in done.stdout  # the probe never ran
    # containerd reads runc's --log file, where the shim also wrote its line:
    # "ctr: failed to create shim task: OCI runtime create failed: oci-gpu-hook: error: ...: unknown"
    assert "failed to create shim task: OCI runtime create failed: " + message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert [e["outcome"] for e in daemon.log_entries(cid)] == ["error"]
    assert daemon.leftovers() == []  # ctr run --rm removed the container and its snapshot


# --- the CRI drop-in --------------------------------------------------------------------------

def _dump(config: Path) -> dict[str, object]:
    done = cl.run(["containerd", "--config", str(config), "config", "dump"])
    assert done.returncode == 0, done.stderr
    return tomllib.loads(done.stdout)


def test_config_dump_has_the_runtime(daemon: Daemon) -> None:
    dump = _dump(daemon.config)
    # containerd lists the main config too, in no fixed order
    assert sorted(dump["imports"]) == sorted([str(daemon.config), str(daemon.base / "conf.d" / "oci-gpu-hook.toml")])
    runtime = dump["plugins"][CRI]["containerd"]["runtimes"][RUNTIME_NAME]  # type: ignore[index]
    assert runtime["runtime_type"] == "io.containerd.runc.v2"
    assert runtime["options"]["BinaryName"] == str(daemon.runtime)
    assert runtime["container_annotations"] == ["cdi.k8s.io/*"]
    assert runtime["pod_annotations"] == []  # a pod's author must not be able to ask for GPUs


def _assert_hosts_cri_settings(cri: dict[str, Any]) -> None:
    assert cri["sandbox_image"] == SANDBOX_IMAGE
    assert cri["cni"]["bin_dir"] == CNI_BIN_DIR
    assert cri["registry"]["mirrors"]["docker.io"]["endpoint"] == [MIRROR]
    assert cri["containerd"]["default_runtime_name"] == "runc"
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"] == {"SystemdCgroup": True}


def test_drop_in_keeps_the_hosts_cri_config(daemon: Daemon) -> None:
    cri = _dump(daemon.config)["plugins"][CRI]  # type: ignore[index]
    _assert_hosts_cri_settings(cri)
    assert set(cri["containerd"]["runtimes"]) == {"runc", RUNTIME_NAME}


def test_cri_plugin_loads_with_the_runtime(daemon: Daemon) -> None:
    log = daemon.daemon_log.read_text()
    assert f"failed to load plugin {CRI}" not in log
    started = [line for line in log.splitlines() if "Start cri plugin with config" in line]
    assert len(started) == 1, log[-3000:]
    line = started[0]
    ours = line[line.index(f"{RUNTIME_NAME}:{{Type:io.containerd.runc.v2"):]
    assert ours.index("PodAnnotations:[] ContainerAnnotations:[cdi.k8s.io/*]") < ours.index(
        f"BinaryName:{daemon.runtime}")
    assert "runc:{Type:io.containerd.runc.v2" in line
    assert "SystemdCgroup:true" in line
    assert f"SandboxImage:{SANDBOX_IMAGE}" in line
    assert f"NetworkPluginBinDir:{CNI_BIN_DIR}" in line


def test_a_drop_in_without_the_main_config_loses_the_hosts_cri_config(tmp_path: Path) -> None:
    """Why the drop-in carries the main config's CRI table: containerd 1.x replaces that whole table with
    the drop-in's (containerd issues 5837, 7982).  Only ``config dump``: no daemon."""
    cl.need("containerd")
    runtime = tmp_path / "oci-gpu-runtime"
    config = _write_config(tmp_path, tmp_path / "c.sock", runtime)
    _assert_hosts_cri_settings(_dump(config)["plugins"][CRI])  # type: ignore[index]
    (tmp_path / "conf.d" / "oci-gpu-hook.toml").write_text(drop_in(str(runtime)))  # built without the main config
    cri = _dump(config)["plugins"][CRI]  # type: ignore[index]
    assert cri["containerd"]["runtimes"][RUNTIME_NAME]["options"]["BinaryName"] == str(runtime)
    assert cri["sandbox_image"] != SANDBOX_IMAGE
    assert cri["cni"]["bin_dir"] != CNI_BIN_DIR
    assert "docker.io" not in cri["registry"]["mirrors"]
    assert cri["containerd"]["runtimes"]["runc"]["options"] == {}  # SystemdCgroup lost


def test_containerd_1_6_ignores_enable_cdi(tmp_path_factory: pytest.TempPathFactory) -> None:
    """What install writes when it cannot tell the node's containerd version: a version 2 drop-in with native CDI
    on.  containerd 1.6 (which has no CDI) must start with it, the CRI plugin and our runtime loaded."""
    cl.need("containerd", "ctr")
    base = tmp_path_factory.mktemp("ctrd-cdi")
    runtime = base / "oci-gpu-runtime"
    config = _write_config(base, base / "c.sock", runtime, cdi=True)
    assert "enable_cdi = true" in (base / "conf.d" / "oci-gpu-hook.toml").read_text()
    d = Daemon(base=base, config=config, socket=base / "c.sock", namespace=f"ogh-test-{uuid.uuid4().hex[:8]}",
               runtime=runtime, runtime_no_env=runtime, hook_log=base / "hook.log",
               daemon_log=base / "containerd.log")
    try:
        _start(d)
        plugins = d.ctr("plugins", "ls").stdout
        assert any(line.split()[:2] == ["io.containerd.grpc.v1", "cri"] and line.split()[-1] == "ok"
                   for line in plugins.splitlines()), plugins
        log = d.daemon_log.read_text()
        assert f"failed to load plugin {CRI}" not in log
        (started,) = [line for line in log.splitlines() if "Start cri plugin with config" in line]
        assert f"BinaryName:{runtime}" in started and f"SandboxImage:{SANDBOX_IMAGE}" in started
    finally:
        problems = _stop(d)
    assert not problems, "containerd teardown: " + "; ".join(problems)
