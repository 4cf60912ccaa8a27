"""The operator's route, end to end: the wheel, a root-owned venv, ``oci-gpu-hook install``, and real containers
through exactly what install wrote.

The wheel is built once per session from a clean copy of this checkout (tests/helpers/wheellib.py) and installed into a
venv in a temporary directory (``python3 -m venv`` + ``pip install``).  A private root (a mount namespace with
/etc, /usr/local, /usr/share/containers and /var/lib overlaid) gets what an operator has before installing: the
config file at its default path /etc/oci-gpu-hook/config.toml (the seed host's sysfs, a log file, CDI specs in
/etc/cdi), dockerd's daemon.json and containerd's config.toml (each daemon's own state in the temporary
directory).  Then ``<venv>/bin/oci-gpu-hook install --only podman,cdi,docker,containerd`` runs there with no
--prefix or --allow-editable, and every runtime finds what install wrote where it looks by default.  Its one --set
turns env requests on: containerd's CRI serves pods, so install would bake them off (docs/security.md), and the
env requests below are what this module runs; install says so in one line:

- podman with no --hooks-dir runs the precreate hook from its built-in hooks directory;
- podman --device amd.com/gpu=N reads the CDI spec install generated;
- the shim (install's oci-gpu-runtime) under runc, and as containerd's --runc-binary;
- dockerd reads install's daemon.json and runs its ``oci-gpu`` runtime.

Each case: a GPU request gets exactly that GPU by the probe (tests/helpers/containerlib.py), and a container that asks
for nothing gets nothing and leaves no trace (no log line; the shim leaves its config.json as it was).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from oci_gpu_hook.fastpath import build as fastbuild
from tests.helpers import containerdlib as ctrd
from tests.helpers import containerlib as cl
from tests.helpers import dockerlib as dk
from tests.helpers import dockersave, ocilayout, wheellib

pytestmark = pytest.mark.containers

LAUNCHER_DIR = "/usr/local/libexec/oci-gpu-hook"
HOOK, RUNTIME = f"{LAUNCHER_DIR}/oci-gpu-hook", f"{LAUNCHER_DIR}/oci-gpu-runtime"
HOOKS_DIR = "/usr/share/containers/oci/hooks.d"  # Debian's podman 4.3 reads only this one by default
CONFIG = "/etc/oci-gpu-hook/config.toml"
CDI_SPEC = "/etc/cdi/amd.com-gpu.json"
INTEGRATIONS = "podman,cdi,docker,containerd"
# what install writes, each checked on the host before and after: none of them may appear there
WRITTEN = [HOOK, RUNTIME, f"{HOOKS_DIR}/oci-gpu-hook-precreate.json", CDI_SPEC, CONFIG, "/var/lib/oci-gpu-hook",
           "/etc/containerd/conf.d/oci-gpu-hook.toml"]


@dataclass
class Installed:
    base: Path
    root: wheellib.PrivateRoot
    venv: Path
    install_out: str
    rootfs: Path
    log: Path
    containerd_socket: Path
    docker_key: Path

    def read(self, real: str) -> str:
        done = self.root.run(["cat", real])
        assert done.returncode == 0, done.stderr
        return done.stdout

    def log_lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


def _put(root: wheellib.PrivateRoot, real: str, text: str) -> None:
    done = root.run(["sh", "-c", f"mkdir -p \"$(dirname '{real}')\" && cat > '{real}'"], stdin=text)
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def installed() -> Iterator[Installed]:
    cl.need("podman", "runc", "unshare", "nsenter", "busybox")
    base = Path(tempfile.mkdtemp(prefix="ogh-wh-"))  # short: podman's --runroot, dockerd's exec-root sockets
    host_before = {path: os.path.lexists(path) for path in WRITTEN}
    root = wheellib.PrivateRoot(base)
    try:
        venv = base / "venv"
        wheellib.make_venv(venv, wheellib.built_wheel())
        root.start()
        log = base / "hook.log"
        _put(root, CONFIG, f'sysfs_root = "{cl.SEED_SYSFS}"\nlog_file = "{log}"\ncdi_dir = "/etc/cdi"\n'
                           f'by_path_dir = "{base / "by-path"}"\n')
        socket = base / "ctrd" / "c.sock"
        socket.parent.mkdir()
        _put(root, "/etc/containerd/config.toml", ctrd.main_config(socket.parent, socket))
        key = base / "dk" / "key.json"
        key.parent.mkdir()
        _put(root, "/etc/docker/daemon.json", dk.OPERATOR_DAEMON_JSON.replace("KEY", str(key)))
        done = root.run([str(venv / "bin" / "oci-gpu-hook"), "install", "--only", INTEGRATIONS, "--set",
                         "OCI_GPU_HOOK_ALLOW_ENV_REQUESTS=true"], env=cl.hook_env())
        assert done.returncode == 0, done.stdout + done.stderr
        yield Installed(base, root, venv, done.stdout, cl.make_rootfs(base / "rootfs"), log, socket, key)
    finally:
        left = root.stop()
        shutil.rmtree(base, ignore_errors=True)
        assert left == [], "still running in the private root"
        assert {path: os.path.lexists(path) for path in WRITTEN} == host_before, "the host changed"


def test_install_wrote_the_wheels_launchers_where_each_runtime_looks(installed: Installed) -> None:
    out = installed.install_out
    for path in (HOOK, RUNTIME, f"{HOOKS_DIR}/oci-gpu-hook-precreate.json", CDI_SPEC,
                 "/etc/containerd/conf.d/oci-gpu-hook.toml"):
        assert f"new: {path} (" in out, out
    assert "replaced: /etc/docker/daemon.json" in out and "replaced: /etc/containerd/config.toml" in out, out
    assert f"checked: podman reads {HOOKS_DIR} (podman's built-in default) and runs {HOOK}" in out
    assert ("note: env requests: on, as --set OCI_GPU_HOOK_ALLOW_ENV_REQUESTS=true asks, although pods reach these "
            "launchers (containerd's CRI runtime oci-gpu)") in out
    site = installed.root.run([str(installed.venv / "bin" / "python"), "-c",
                               "import oci_gpu_hook, os; print(os.path.dirname(oci_gpu_hook.__file__))"])
    package = site.stdout.strip()
    assert package.startswith(str(installed.venv)) and "site-packages" in package, site
    native = fastbuild.find_cc() is not None
    for launcher in (HOOK, RUNTIME):
        head = installed.root.run(["head", "-c", "4", launcher]).stdout
        assert (head == "\x7fELF") is native, f"{launcher}: the native front was expected: {native}"
        python = installed.read(launcher + ".py" if native else launcher)
        assert python.startswith(f"#!{installed.venv}/bin/python") and os.path.dirname(package) in python
        assert str(cl.REPO / "oci_gpu_hook") not in python  # the wheel's code, never this checkout's
    hook = json.loads(installed.read(f"{HOOKS_DIR}/oci-gpu-hook-precreate.json"))
    assert hook["hook"]["path"] == HOOK and hook["stages"] == ["precreate"]
    spec = json.loads(installed.read(CDI_SPEC))
    assert spec["kind"] == "amd.com/gpu" and len(spec["devices"]) >= 8
    daemon_json = json.loads(installed.read("/etc/docker/daemon.json"))
    assert daemon_json["runtimes"] == {"oci-gpu": {"path": RUNTIME}}
    drop_in = tomllib.loads(installed.read("/etc/containerd/conf.d/oci-gpu-hook.toml"))
    assert RUNTIME in json.dumps(drop_in)


# --- podman, by its defaults ------------------------------------------------------------------------

def _podman(installed: Installed, *options: str) -> subprocess.CompletedProcess[str]:
    """podman in the private root with its own storage: no --hooks-dir, no CDI directory given."""
    argv = [*cl.PODMAN, "--root", str(installed.base / "pm"), "--runroot", str(installed.base / "pr"),
            "--runtime", "runc", *cl.PODMAN_RUN, *options, "--rootfs", str(installed.rootfs), "/bin/sh", "/probe.sh"]
    return installed.root.run(argv, env=cl.hook_env())


@pytest.mark.parametrize(("options", "gpus"), [(["-e", "AMD_VISIBLE_DEVICES=1"], [1]), ([], [])],
                         ids=["request", "no-request"])
def test_podman_runs_the_hook_install_put_in_its_default_hooks_dir(installed: Installed, options: list[str],
                                                                   gpus: list[int]) -> None:
    before = installed.log_lines()
    done = _podman(installed, *options)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, gpus)
    added = installed.log_lines()[len(before):]
    if gpus:
        assert [json.loads(line)["outcome"] for line in added] == ["ok"], added
    else:
        assert added == []


def test_podman_device_reads_the_cdi_spec_install_wrote(installed: Installed) -> None:
    done = _podman(installed, "--device", "amd.com/gpu=4")
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [4])


# --- the shim under runc ----------------------------------------------------------------------------

@pytest.mark.parametrize(("env", "gpus"), [(["AMD_VISIBLE_DEVICES=2"], [2]), ([], [])],
                         ids=["request", "no-request"])
def test_the_installed_shim_under_runc(installed: Installed, env: list[str], gpus: list[int]) -> None:
    bundle = cl.make_bundle(installed.base / f"bundle-{uuid.uuid4().hex[:8]}", installed.rootfs, env)
    pristine = (bundle / "config.json").read_bytes()
    before = installed.log_lines()
    done = installed.root.run([RUNTIME, "run", "--bundle", str(bundle), cl.container_id()], env=cl.hook_env(),
                              timeout=120)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, gpus)
    if not gpus:  # nothing asked: the bundle and the log are as they were
        assert (bundle / "config.json").read_bytes() == pristine
        assert installed.log_lines() == before


# --- containerd: ctr --runc-binary, the config install wrote ---------------------------------------

@pytest.fixture(scope="module")
def containerd(installed: Installed) -> Iterator[ctrd.Daemon]:
    cl.need("containerd", "ctr")
    base = installed.containerd_socket.parent
    daemon = ctrd.Daemon(base=base, config=Path("/etc/containerd/config.toml"), socket=installed.containerd_socket,
                         namespace=f"ogh-test-{uuid.uuid4().hex[:8]}", runtime=Path(RUNTIME),
                         runtime_no_env=Path(RUNTIME), hook_log=installed.log, daemon_log=base / "containerd.log",
                         enter=installed.root.enter([]))
    try:
        ctrd.start(daemon)
        done = daemon.ctr("images", "import", str(ocilayout.build(installed.rootfs, base / "image.tar", ctrd.IMAGE)))
        assert done.returncode == 0, done.stderr
        yield daemon
    finally:
        problems = ctrd.stop(daemon)
        assert not problems, "containerd teardown: " + "; ".join(problems)


def test_containerd_loads_the_runtime_install_wrote(installed: Installed, containerd: ctrd.Daemon) -> None:
    done = installed.root.run(["containerd", "--config", "/etc/containerd/config.toml", "config", "dump"])
    assert done.returncode == 0, done.stderr
    runtime = tomllib.loads(done.stdout)["plugins"][ctrd.CRI]["containerd"]["runtimes"]["oci-gpu"]
    assert runtime["options"]["BinaryName"] == RUNTIME


@pytest.mark.parametrize(("env", "gpus"), [(["AMD_VISIBLE_DEVICES=5"], [5]), ([], [])],
                         ids=["request", "no-request"])
def test_ctr_run_with_the_installed_shim(containerd: ctrd.Daemon, env: list[str], gpus: list[int]) -> None:
    cid = cl.container_id()
    done = containerd.run(cid, env=env)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, gpus)
    assert [e["outcome"] for e in containerd.log_entries(cid)] == (["ok"] if gpus else [])
    assert containerd.leftovers() == []


# --- Docker: the daemon.json install merged ----------------------------------------------------------

@pytest.fixture(scope="module")
def dockerd(installed: Installed) -> Iterator[dk.Dockerd]:
    cl.need("dockerd", dk.DOCKER)
    daemon = dk.Dockerd(installed.docker_key.parent, None, enter=installed.root.enter([]))
    daemon.start()
    try:
        loaded = daemon.docker("load", "-i", str(dockersave.build(installed.rootfs, daemon.base / "image.tar",
                                                                  dk.IMAGE)))
        assert loaded.returncode == 0, loaded.stderr
        yield daemon
    finally:
        daemon.stop()


def test_dockerd_runs_the_runtime_install_merged(installed: Installed, dockerd: dk.Dockerd) -> None:
    info = dockerd.docker("info", "--format", "{{json .Runtimes}}")
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["oci-gpu"]["path"] == RUNTIME
    assert installed.docker_key.is_file()  # dockerd read the operator's daemon.json (its deprecated-key-path)


@pytest.mark.parametrize(("env", "gpus"), [(["AMD_VISIBLE_DEVICES=6"], [6]), ([], [])],
                         ids=["request", "no-request"])
def test_docker_run_with_the_installed_runtime(installed: Installed, dockerd: dk.Dockerd, env: list[str],
                                               gpus: list[int]) -> None:
    before = installed.log_lines()
    done = dk.run(dockerd, *env)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, gpus)
    added = installed.log_lines()[len(before):]
    assert [json.loads(line)["outcome"] for line in added] == (["ok"] if gpus else [])
