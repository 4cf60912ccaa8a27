"""End to end on NVIDIA hosts: the CDI names the device plugin's Allocate returns, resolved by a runtime that applies
CDI itself (podman 4.3, as containerd 2.x and CRI-O do) from the spec the plugin keeps, give a real container
exactly the allocated NVIDIA GPU or MIG device: by the probe over every ``c 195:*`` minor, the host's nvidia-caps
minors (every MIG instance's), nvidia-uvm's, every DRM minor and /dev/kfd (tests/containers/test_nvidia_hosts.py's,
whose expectations come from the fixture definitions, not from the code under test).  Also after a GPU left the
node (or a MIG instance was destroyed) with no ``watch`` running and no rescan due: the stable names still name
the allocated hardware.  Needs root, runc, podman, busybox; under CI=true a missing one fails.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.containers import test_nvidia_hosts as nc
from tests.helpers import containerlib as cl
from tests.helpers import fakesysfs
from tests.helpers.fakekubelet import FakeKubelet
from tests.test_device_plugin_nvidia import (
    MIG_UUID,
    MIGS,
    Plugin,
    fake_nvml,
    host_tree,
    mig_tree,
    nvml_table,
    remove_nvidia_gpu,
)

pytestmark = pytest.mark.containers
__all__ = ["fake_nvml"]  # a fixture of this module too


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cl.need("runc", "podman", "busybox", "unshare")
    empty = tmp_path_factory.mktemp("no-hooks")
    return empty


def launcher(base: Path) -> Path:
    """The hook launcher the plugin's CDI specs name (their createRuntime hooks: by-path links, the ld cache),
    reading a config with the host's roots."""
    config = base / "config.toml"
    hook = base / "bin" / "oci-gpu-hook"
    config.write_text(f'sysfs_root = "{base / "sys"}"\nproc_root = "{base / "proc"}"\n'
                      f'driver_root = "{base / "driver"}"\nhook_path = "{hook}"\n')
    cl.write_launchers(base / "bin", config)
    return hook


def names(kubelet: FakeKubelet, resource: str, ids: list[str]) -> list[str]:
    (answer,) = kubelet.allocate(resource, ids).container_responses
    return [c.name for c in answer.cdi_devices]


def podman_cdi(tools: Path, tmp_path: Path, cdi_dir: Path, nv: nc.NvModel, cdi_names: list[str]) -> str:
    """podman applying the plugin's CDI specs itself (``--device`` per name; no hook, no shim)."""
    rootfs = nc.make_rootfs(tmp_path / f"{cl.container_id()}-rootfs", nv)
    argv = [*cl.PODMAN, "--runtime=runc", f"--hooks-dir={tools}", *cl.PODMAN_RUN,
            *[o for name in cdi_names for o in ("--device", name)], "--rootfs", str(rootfs), "/bin/sh", "/probe.sh"]
    done = cl.run(cl.private_cdi(argv, cdi_dir), env=cl.hook_env())
    assert done.returncode == 0, done.stderr
    return done.stdout


def granted(output: str, nv: nc.NvModel, grants: dict[str, list[Any]]) -> None:
    """Exactly ``grants`` (kind -> indices, MIG devices as G:M of the host before any change), with every driver
    capability (a CDI spec cannot read the container's NVIDIA_DRIVER_CAPABILITIES)."""
    nc.check(output, nc.expected(nv, grants, nc.ALL_CAPS), cgroup_v2=None)


def plugin(base: Path, tmp_path: Path, strategy: str, hook: Path) -> Iterator[Any]:
    return Plugin(base, strategy=strategy, rescan=60, hook_path=str(hook)).start(tmp_path)


def test_whole_gpus_by_uuid_after_one_left(tools: Path, tmp_path: Path) -> None:
    """4 x H100 (minor != index): allocate, a GPU leaves (no rescan due: 60 s), allocate again: each name gives
    exactly its GPU; the first pod's container, restarted with its kept answer, still gets its own."""
    nv = nc.model("nvidia-h100")
    host = fakesysfs.nvidia_h100_host()
    base = host_tree(tmp_path / "host", host)
    hook = launcher(base)
    by_pci = {g.pci: g.uuid for g in nv.gpus}
    for node in plugin(base, tmp_path, "single", hook):
        node.kubelet.devices("nvidia.com/gpu", lambda d: len(d) == 4)
        first = names(node.kubelet, "nvidia.com/gpu", [by_pci["0000:52:00.0"]])
        assert first == [f"nvidia.com/gpu={by_pci['0000:52:00.0']}"]
        granted(podman_cdi(tools, tmp_path, node.cdi, nv, first), nv, {"nvidia": [2]})
        remove_nvidia_gpu(base, host, "0000:1b:00.0")  # GPU 0: every index after it moves
        second = names(node.kubelet, "nvidia.com/gpu", [by_pci["0000:c1:00.0"]])
        granted(podman_cdi(tools, tmp_path, node.cdi, nv, second), nv, {"nvidia": [3]})
        both = names(node.kubelet, "nvidia.com/gpu", [by_pci["0000:c1:00.0"], by_pci["0000:43:00.0"]])
        granted(podman_cdi(tools, tmp_path, node.cdi, nv, both), nv, {"nvidia": [1, 3]})
        granted(podman_cdi(tools, tmp_path, node.cdi, nv, first), nv, {"nvidia": [2]})


def test_mig_devices_by_uuid_after_an_instance_was_destroyed(tools: Path, tmp_path: Path, fake_nvml: Path) -> None:
    """Mixed strategy on the MIG host: a 3g.40gb MIG device gets exactly its GPU's node and its two caps nodes;
    GPU instance 1 is destroyed (the 2g.20gb device is now GPU:MIG 0:0, was 0:1): its MIG UUID still gives it."""
    nv = nc.model("nvidia-mig")
    base = mig_tree(tmp_path / "host")
    hook = launcher(base)
    for node in plugin(base, tmp_path, "mixed", hook):
        node.kubelet.devices("nvidia.com/mig-2g.20gb")
        big = names(node.kubelet, "nvidia.com/mig-3g.40gb", [MIG_UUID[(1, 0)]])
        assert big == [f"nvidia.com/gpu={MIG_UUID[(1, 0)]}"]
        granted(podman_cdi(tools, tmp_path, node.cdi, nv, big), nv, {"nvidia": ["0:0"]})
        nvml_table(fake_nvml, {k: v for k, v in MIGS.items() if k != (1, 0)})
        shutil.rmtree(base / "proc" / "driver" / "nvidia" / "capabilities" / "gpu1" / "mig" / "gi1")
        small = names(node.kubelet, "nvidia.com/mig-2g.20gb", [MIG_UUID[(2, 0)]])
        granted(podman_cdi(tools, tmp_path, node.cdi, nv, small), nv, {"nvidia": ["0:1"]})
        whole = names(node.kubelet, "nvidia.com/gpu", [nv.gpus[1].uuid])
        granted(podman_cdi(tools, tmp_path, node.cdi, nv, whole), nv, {"nvidia": [1]})


def test_amd_and_nvidia_from_one_plugin_in_one_container(tools: Path, tmp_path: Path) -> None:
    """The mixed host: an AMD GPU and an NVIDIA GPU, each from its own resource of the one plugin, in one
    container; then the other NVIDIA GPU leaves and the allocated one is still exactly what its name gives."""
    nv = nc.model("amd-nvidia")
    host = fakesysfs.amd_nvidia_host()
    base = host_tree(tmp_path / "host", host)
    hook = launcher(base)
    for node in plugin(base, tmp_path, "mixed", hook):
        node.kubelet.devices("nvidia.com/gpu", lambda d: len(d) == 2)
        amd = names(node.kubelet, "amd.com/gpu", ["0000:41:00.0"])
        nvidia = names(node.kubelet, "nvidia.com/gpu", [nv.gpus[1].uuid])
        assert amd == ["amd.com/gpu=0000:41:00.0"] and nvidia == [f"nvidia.com/gpu={nv.gpus[1].uuid}"]
        granted(podman_cdi(tools, tmp_path, node.cdi, nv, amd + nvidia), nv, {"amd": [1], "nvidia": [1]})
        remove_nvidia_gpu(base, host, nv.gpus[0].pci)
        again = names(node.kubelet, "nvidia.com/gpu", [nv.gpus[1].uuid])
        granted(podman_cdi(tools, tmp_path, node.cdi, nv, again), nv, {"nvidia": [1]})
