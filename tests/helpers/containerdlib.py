"""A private containerd 1.6 for the tests: its own root, state, sockets and namespace under a temp dir, configured
as ``install`` configures a node (a main config with CRI settings of its own, its ``imports`` line, the drop-in),
the busybox probe image imported from an OCI layout; :func:`stop` fails on anything left mounted or running.
``daemon`` is a module-scoped fixture for the modules that assign it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from oci_gpu_hook.install import containerd
from oci_gpu_hook.install.containerd import drop_in
from tests.helpers import containerlib as cl
from tests.helpers import ocilayout

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


def main_config(base: Path, socket: Path) -> str:
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


def write_config(base: Path, socket: Path, runtime: Path, cdi: bool = False) -> Path:
    """What ``install`` writes on a node: the main config with its imports line, and the drop-in built
    from the parsed main config (native CDI on with ``cdi``); conf.d is the test's, not /etc/containerd/conf.d."""
    conf_d = base / "conf.d"
    conf_d.mkdir()
    main = main_config(base, socket)
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


def launchers(directory: Path, config: Path, body: str) -> Path:
    config.write_text(body)
    return cl.write_launchers(directory, config)[1]


def start(daemon: Daemon) -> None:
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


def stop(daemon: Daemon) -> list[str]:
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
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    cl.need("containerd", "ctr", "runc", "busybox")
    started = time.monotonic()
    base = tmp_path_factory.mktemp("ctrd")
    hook_log = base / "hook.log"
    common = (f'sysfs_root = "{cl.SEED_SYSFS}"\nlog_file = "{hook_log}"\n'
              f'hook_path = "{base / "bin" / "oci-gpu-hook"}"\nby_path_dir = "{base / "by-path"}"\n')
    runtime = launchers(base / "bin", base / "hook.toml", common)
    runtime_no_env = launchers(base / "bin-no-env", base / "hook-no-env.toml", common + "allow_env_requests = false\n")
    socket = base / "c.sock"
    config = write_config(base, socket, runtime)
    d = Daemon(base=base, config=config, socket=socket, namespace=f"ogh-test-{uuid.uuid4().hex[:8]}",
               runtime=runtime, runtime_no_env=runtime_no_env, hook_log=hook_log, daemon_log=base / "containerd.log")
    rootfs = cl.make_rootfs(base / "rootfs")
    archives = [ocilayout.build(rootfs, base / "image.tar", IMAGE),
                ocilayout.build(rootfs, base / "image-env-all.tar", IMAGE_ENV_ALL,
                                env=["PATH=/bin", "AMD_VISIBLE_DEVICES=all"])]
    try:
        start(d)
        d.timings["start"] = time.monotonic() - started
        for archive in archives:
            done = d.ctr("images", "import", str(archive))
            assert done.returncode == 0, done.stderr
        yield d
    finally:
        stopping = time.monotonic()
        problems = stop(d)
        d.timings["stop"] = time.monotonic() - stopping
        print(f"\ncontainerd fixture: start+import {d.timings.get('start', 0):.2f} s, stop {d.timings['stop']:.2f} s")
        assert not problems, "containerd teardown: " + "; ".join(problems)
