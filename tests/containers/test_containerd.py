"""containerd 1.6: ``ctr run --runc-binary oci-gpu-runtime`` on a real daemon, and the CRI drop-in.

A private containerd (its own root, state, sockets and namespace under the
test's temp dir) imports the busybox probe image from an OCI layout tarball
(tests/helpers/ocilayout.py).  Its configuration is made the way ``install`` makes a
node's: a main config with CRI settings of its own (CNI, sandbox image, a runc
runtime with options, a registry mirror) gets its ``imports`` line from
``oci_gpu_hook.install.containerd.with_import`` (pointed at the test's conf.d), and
conf.d holds ``oci_gpu_hook.install.containerd.drop_in`` for the lean launcher, built
from that parsed main config.  containerd 1.x replaces the main config's whole
CRI table with the drop-in's, so ``config dump`` and the CRI plugin's start line
must show the host's CRI settings and the oci-gpu runtime together; a drop-in
built without the main config shows what goes wrong otherwise.
containerd's runc shim (io.containerd.runc.v2) runs the launcher with
containerd's environment, not ctr's, so the launcher carries OCI_GPU_HOOK_CONFIG
(the seed host's sysfs).  Every container runs the isolation probe
(tests/helpers/containerlib.py).  Teardown removes what is left, stops the daemon by its
PID and fails if anything under the temp dir is still mounted or running.  Needs
root, containerd, ctr, runc and busybox; under CI=true a missing one fails.
"""

from __future__ import annotations

import tomllib
import uuid
from pathlib import Path
from typing import Any

import pytest

from oci_gpu_hook.install.containerd import RUNTIME_NAME, drop_in
from tests.helpers import containerlib as cl
from tests.helpers import ocilayout
from tests.helpers.containerdlib import (
    CNI_BIN_DIR,
    CRI,
    IMAGE,
    IMAGE_ENV_ALL,
    MIRROR,
    SANDBOX_IMAGE,
    Daemon,
    main_config,
    start,
    stop,
    write_config,
)
from tests.helpers.containerdlib import daemon as daemon  # the module's fixture
from tests.helpers.imageenvs import CUDA_BASE

pytestmark = pytest.mark.containers

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


@pytest.mark.parametrize(("env", "gpus"), [(CUDA_BASE, []), ([*CUDA_BASE, "AMD_VISIBLE_DEVICES=1"], [1])],
                         ids=["cuda-image", "cuda-image-and-amd-1"])
def test_a_cuda_image_on_an_amd_node(daemon: Daemon, env: list[str], gpus: list[int]) -> None:
    """A CUDA image's env (NVIDIA_VISIBLE_DEVICES=all) on this node without NVIDIA GPUs: it starts with what else it
    asks for, and the one log line notes the nvidia ask that granted nothing."""
    cid = cl.container_id()
    done = daemon.run(cid, env=env)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, gpus)
    (entry,) = daemon.log_entries(cid)
    assert entry["outcome"] == ("ok" if gpus else "ignored"), entry
    assert "this host has no nvidia GPUs, none granted" in entry["note"], entry
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


def test_a_typo_in_the_config_stops_only_what_asks_for_a_gpu(daemon: Daemon) -> None:
    """The rule of oci_gpu_hook/config.py under containerd's runc shim: after an edit that breaks the config, a
    container that asks for nothing runs untouched; the image that asks (its own env) is refused with the line."""
    config = daemon.base / "hook.toml"
    good = config.read_text()
    config.write_text(good + "mask_other_gpu = true\n")
    try:
        done = daemon.run(cl.container_id(), env=["AMD_VISIBLE_DEVICES="])
        assert done.returncode == 0, done.stderr
        cl.assert_isolated(done.stdout, [])
        done = daemon.run(cl.container_id(), image=IMAGE_ENV_ALL)
        assert done.returncode != 0 and "done" not in done.stdout
        assert (f"OCI runtime create failed: oci-gpu-hook: error: config file {config}: unknown key "
                "'mask_other_gpu' (did you mean 'mask_other_gpus'?)") in done.stderr, done.stderr
    finally:
        config.write_text(good)
    assert daemon.leftovers() == []


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
    config = write_config(tmp_path, tmp_path / "c.sock", runtime)
    _assert_hosts_cri_settings(_dump(config)["plugins"][CRI])  # type: ignore[index]
    (tmp_path / "conf.d" / "oci-gpu-hook.toml").write_text(drop_in(str(runtime)))  # built without the main config
    cri = _dump(config)["plugins"][CRI]  # type: ignore[index]
    assert cri["containerd"]["runtimes"][RUNTIME_NAME]["options"]["BinaryName"] == str(runtime)
    assert cri["sandbox_image"] != SANDBOX_IMAGE
    assert cri["cni"]["bin_dir"] != CNI_BIN_DIR
    assert "docker.io" not in cri["registry"]["mirrors"]
    assert cri["containerd"]["runtimes"]["runc"]["options"] == {}  # SystemdCgroup lost


def _cri_start_line(base: Path, config: Path, runtime: Path) -> str:
    """Start a private containerd on ``config``: its CRI plugin must load; its start line (the CRI config it read)."""
    d = Daemon(base=base, config=config, socket=base / "c.sock", namespace=f"ogh-test-{uuid.uuid4().hex[:8]}",
               runtime=runtime, runtime_no_env=runtime, hook_log=base / "hook.log",
               daemon_log=base / "containerd.log")
    try:
        start(d)
        plugins = d.ctr("plugins", "ls").stdout
        assert any(line.split()[:2] == ["io.containerd.grpc.v1", "cri"] and line.split()[-1] == "ok"
                   for line in plugins.splitlines()), plugins
        log = d.daemon_log.read_text()
        assert f"failed to load plugin {CRI}" not in log
        (started,) = [line for line in log.splitlines() if "Start cri plugin with config" in line]
    finally:
        problems = stop(d)
    assert not problems, "containerd teardown: " + "; ".join(problems)
    return started


def test_containerd_1_6_ignores_enable_cdi(tmp_path_factory: pytest.TempPathFactory) -> None:
    """What install writes when it cannot tell the node's containerd version: a version 2 drop-in with native CDI
    on.  containerd 1.6 (which has no CDI) must start with it, the CRI plugin and our runtime loaded."""
    cl.need("containerd", "ctr")
    base = tmp_path_factory.mktemp("ctrd-cdi")
    runtime = base / "oci-gpu-runtime"
    config = write_config(base, base / "c.sock", runtime, cdi=True)
    assert "enable_cdi = true" in (base / "conf.d" / "oci-gpu-hook.toml").read_text()
    started = _cri_start_line(base, config, runtime)
    assert f"BinaryName:{runtime}" in started and f"SandboxImage:{SANDBOX_IMAGE}" in started


def test_containerd_starts_on_the_main_config_an_uninstall_left(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The operator edited the main config after install: uninstall keeps their edit and takes out only the imports
    line install added (``containerd.without_import``).  containerd 1.6 must start on what is left, with the host's
    CRI settings, no drop-in and no oci-gpu runtime."""
    from oci_gpu_hook.install import containerd

    cl.need("containerd", "ctr")
    base = tmp_path_factory.mktemp("ctrd-uninstalled")
    runtime = base / "oci-gpu-runtime"
    config = write_config(base, base / "c.sock", runtime)
    original = main_config(base, base / "c.sock")
    tuned = "[grpc]\n  # tuned by hand\n  max_recv_message_size = 16777216\n"
    edited = config.read_text().replace("[grpc]\n", tuned)
    assert edited != config.read_text()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(containerd, "DROP_IN_DIR", str(base / "conf.d"))
        left = containerd.without_import(edited, original)
    assert left == original.replace("[grpc]\n", tuned)
    config.write_text(left)
    started = _cri_start_line(base, config, runtime)
    assert f"SandboxImage:{SANDBOX_IMAGE}" in started and str(runtime) not in started
    dump = _dump(config)
    assert RUNTIME_NAME not in dump["plugins"][CRI]["containerd"]["runtimes"]  # type: ignore[index]
    assert dump["grpc"]["max_recv_message_size"] == 16777216  # type: ignore[index]
