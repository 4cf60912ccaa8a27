"""A Kubernetes node's install refuses a GPU by env, through every path a pod can reach, and grants the device
plugin's.

``install`` (the checkout's, into a prefix: its launchers are Python launchers that run this checkout) on a node
with containerd 2.x's config, CRI-O's (whose hooks directory is podman's default, so ``--hook prestart`` puts the hook
where CRI-O reads it) and systemd: no ``--set`` for env requests.  Then, with what that install wrote:

- **the shim** (containerd's CRI runtime ``oci-gpu``, the RuntimeClass's handler, and CRI-O's handler: the drop-ins
  name the runtime launcher) under runc;
- **the NRI plugin** (the unit's ``oci-gpu-hook nri``) against the NRI runtime double (tests/helpers/nriruntime.py),
  its adjustment applied as containerd applies it and run by runc;
- **CRI-O's prestart hook** (the hooks file install wrote, as CRI-O lists it in the spec) under runc.

Each path: ``AMD_VISIBLE_DEVICES=all`` or ``NVIDIA_VISIBLE_DEVICES=all`` in the container's env (as a pod spec or an
image sets it) gets no GPU (the probe: every GPU node refused) and one journal line at info level that says why
(``/dev/log`` is the test's socket: tests/helpers/journallib.py); the device plugin's ``cdi.k8s.io`` annotation on
the same container gets exactly its GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from oci_gpu_hook.install import crio, launchers
from oci_gpu_hook.install.paths import HOOK_LAUNCHER, LAUNCHER_DIR, NRI_UNIT, RUNTIME_LAUNCHER
from oci_gpu_hook.serve.nri import api_pb2
from tests.helpers import containerlib as cl
from tests.helpers import nriruntime as nr
from tests.helpers.installtrees import CONTAINERD_V3, put
from tests.helpers.journallib import Listener, with_dev_log

pytestmark = pytest.mark.containers
HOOKS_DIR = "/usr/share/containers/oci/hooks.d"
POD = api_pb2.PodSandbox(id="pod-env", name="no-gpu-asked", namespace="default", uid="0000-2222")
ENV_ALL = ["AMD_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=all"]
PLUGIN = {"cdi.k8s.io/amd-device-plugin": "amd.com/gpu=2"}
IGNORED = "ignored: allow_env_requests is off, only annotations count"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    cl.need("runc", "busybox", "unshare")
    base = tmp_path_factory.mktemp("pods-env")
    prefix, config, log = base / "root", base / "config.toml", base / "hook.log"
    config.write_text(f'sysfs_root = "{cl.SEED_SYSFS}"\nlog_file = "{log}"\nhook_path = "{prefix}{HOOK_LAUNCHER}"\n')
    put(prefix, "/etc/containerd/config.toml", CONTAINERD_V3)
    put(prefix, "/etc/crio/crio.conf", f'[crio.runtime]\nhooks_dir = ["{HOOKS_DIR}"]\n')
    (prefix / "etc/systemd/system").mkdir(parents=True)
    env = {"PATH": os.environ["PATH"], "OCI_GPU_HOOK_CONFIG": str(config)}
    done = subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", "install", *cl.INSTALL_DEV, "--prefix",
                           str(prefix), "--containerd-version", "2.1", "--only", "containerd,crio,nri,podman",
                           "--hook", "prestart", "--set", f"OCI_GPU_HOOK_CONFIG={config}"],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (base / "install.out").write_text(done.stdout)
    yield {"base": base, "prefix": prefix, "log": log, "rootfs": cl.make_rootfs(base / "rootfs"),
           "hook": prefix / HOOK_LAUNCHER.lstrip("/"), "runtime": prefix / RUNTIME_LAUNCHER.lstrip("/"),
           "install": base / "install.out"}


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[tuple[Listener, Path]]:
    listener = Listener(tmp_path / "log.sock")
    scratch = tmp_path / "dev"
    scratch.mkdir()
    try:
        yield listener, scratch
    finally:
        listener.close()


def test_install_said_env_requests_are_off_and_baked_them(node: dict[str, Path]) -> None:
    out = node["install"].read_text()
    lines = [line for line in out.splitlines() if line.startswith("note: env requests")]
    assert len(lines) == 1 and lines[0].startswith(
        f"note: env requests: off, since pods reach these launchers (a hook in {HOOKS_DIR}, which CRI-O reads; "
        "containerd's CRI runtime oci-gpu; CRI-O's runtime handler oci-gpu; the NRI plugin's unit): "), out
    baked = launchers.baked_defaults(str(node["prefix"] / LAUNCHER_DIR.lstrip("/")))
    assert baked is not None and baked["OCI_GPU_HOOK_ALLOW_ENV_REQUESTS"] == "false"
    # the paths below are what pods reach: the drop-ins, the unit and the hooks file name these launchers
    drop_in = tomllib.loads((node["prefix"] / "etc/containerd/conf.d/oci-gpu-hook.toml").read_text())
    assert RUNTIME_LAUNCHER in json.dumps(drop_in)
    assert RUNTIME_LAUNCHER in (node["prefix"] / crio.DROP_IN_PATH.lstrip("/")).read_text()
    assert f"ExecStart={HOOK_LAUNCHER} nri" in (node["prefix"] / NRI_UNIT.lstrip("/")).read_text()
    hook = json.loads((node["prefix"] / HOOKS_DIR.lstrip("/") / "oci-gpu-hook-prestart.json").read_text())
    assert hook["hook"]["path"] == HOOK_LAUNCHER and hook["stages"] == ["prestart"]


def _info_lines(listener: Listener) -> list[str]:
    return [d.decode() for d in listener.lines() if d.startswith(b"<30>")]  # facility daemon, severity info


def _assert_ignored(node: dict[str, Path], listener: Listener, entry: str, before: int) -> None:
    """One log record and one journal line at info for the container: both variables set aside, and why."""
    records = [json.loads(r) for r in node["log"].read_text().splitlines()[before:]]
    assert [(r["entry"], r["outcome"]) for r in records] == [(entry, "ignored")], records
    for name in ENV_ALL:
        assert f"{name} {IGNORED}" in records[0]["note"]
    (line,) = _info_lines(listener)
    assert f" {entry}: container " in line and all(f"{name} {IGNORED}" in line for name in ENV_ALL), line


def _log_length(node: dict[str, Path]) -> int:
    return len(node["log"].read_text().splitlines()) if node["log"].exists() else 0


def _runc(bundle: Path, journal: tuple[Listener, Path]) -> subprocess.CompletedProcess[str]:
    listener, scratch = journal
    return cl.run(with_dev_log(["runc", "run", "--bundle", str(bundle), bundle.name], listener.path, scratch),
                  env=cl.hook_env())


def _bundle(node: dict[str, Path], env: list[str], annotations: dict[str, str] | None = None) -> Path:
    bundle = cl.make_bundle(node["base"] / cl.container_id(), node["rootfs"], env)
    if annotations:
        cl.edit_spec(bundle, lambda spec: spec.setdefault("annotations", {}).update(annotations))
    return bundle


# --- the shim: containerd's CRI runtime (the RuntimeClass), CRI-O's handler ---------------------------------


@pytest.mark.parametrize("annotated", [False, True], ids=["env", "device-plugin"])
def test_the_shim(node: dict[str, Path], journal: tuple[Listener, Path], annotated: bool) -> None:
    bundle = _bundle(node, ENV_ALL, PLUGIN if annotated else None)
    before = _log_length(node)
    listener, scratch = journal
    argv = [str(node["runtime"]), "run", "--bundle", str(bundle), bundle.name]
    done = cl.run(with_dev_log(argv, listener.path, scratch), env=cl.hook_env())
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [2] if annotated else [])
    if not annotated:
        _assert_ignored(node, listener, "oci-gpu-runtime", before)


# --- CRI-O's prestart hook: the hooks file install wrote, as CRI-O lists it ----------------------------------


@pytest.mark.parametrize("annotated", [False, True], ids=["env", "device-plugin"])
def test_crios_prestart_hook(node: dict[str, Path], journal: tuple[Listener, Path], annotated: bool) -> None:
    hook = json.loads((node["prefix"] / HOOKS_DIR.lstrip("/") / "oci-gpu-hook-prestart.json").read_text())["hook"]
    bundle = _bundle(node, ENV_ALL, PLUGIN if annotated else None)
    entry = {**hook, "path": str(node["prefix"]) + hook["path"]}  # the file's hook, at the prefix's launcher
    cl.edit_spec(bundle, lambda spec: spec.setdefault("hooks", {}).update(prestart=[entry]))
    before = _log_length(node)
    done = _runc(bundle, journal)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [2] if annotated else [])
    if not annotated:
        _assert_ignored(node, journal[0], "prestart", before)


# --- the NRI plugin (the unit's command) against the NRI runtime double ---------------------------------------


@pytest.fixture(scope="module")
def nri(node: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[nr.NRIRuntime, Listener]]:
    base = tmp_path_factory.mktemp("nri-env")
    listener = Listener(base / "log.sock")
    (base / "dev").mkdir()
    double = nr.NRIRuntime(base / "nri.sock")
    argv = with_dev_log([str(node["hook"]), "nri", "--socket", str(double.path)], listener.path, base / "dev")
    with (base / "plugin.log").open("ab") as out:
        plugin = subprocess.Popen(argv, stdout=out, stderr=out, env=cl.hook_env())
    try:
        double.accept()
        yield double, listener
    finally:
        double.close()
        if plugin.poll() is None:
            plugin.kill()
        plugin.wait(timeout=30)
        listener.close()


@pytest.mark.parametrize("annotated", [False, True], ids=["env", "device-plugin"])
def test_the_nri_plugin(node: dict[str, Path], nri: tuple[nr.NRIRuntime, Listener], annotated: bool) -> None:
    double, listener = nri
    listener.lines()  # what came before
    bundle = _bundle(node, ENV_ALL)
    spec = json.loads((bundle / "config.json").read_text())
    annotations = PLUGIN if annotated else None
    before = _log_length(node)
    adjust = double.create_container(POD, nr.container_of(spec, bundle.name, annotations=annotations))
    nr.apply_adjustment(spec, adjust)
    (bundle / "config.json").write_text(json.dumps(spec))
    done = cl.run(["runc", "run", "--bundle", str(bundle), bundle.name])
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [2] if annotated else [])
    if not annotated:
        assert list(adjust.linux.devices) == [] and list(adjust.mounts) == []
        _assert_ignored(node, listener, "nri", before)
