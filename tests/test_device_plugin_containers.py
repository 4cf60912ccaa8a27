"""End to end: what the device plugin's Allocate returns gets exactly those GPUs into a real container.

The plugin runs on the seed example host (8 GPUs) behind the fake kubelet
(tests/fakekubelet.py).  The container annotation of its Allocate response goes,
as containerd's CRI puts it there for the ``oci-gpu`` RuntimeClass, into the
bundle's config.json annotations; ``oci-gpu-runtime`` runs it through runc in
cgroup v1 and v2, and the isolation probe (tests/containerlib.py) must see the
allocated GPUs' nodes (ENXIO) and EPERM for every other GPU minor.  The same
through containerd 1.6 (``ctr run --runc-binary`` the shim ``--annotation``),
with env requests off, as on a Kubernetes node.  Needs root, runc, busybox
(and containerd, ctr); under CI=true a missing one fails.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from oci_gpu_hook.host.deviceplugin import server
from tests import containerlib as cl
from tests import test_containerd
from tests.fakekubelet import FakeKubelet

pytestmark = pytest.mark.containers

SEED_IDS = [f"0000:{bus}:00.0" for bus in cl.SEED_PCI]

daemon = test_containerd.daemon  # the same private containerd 1.6 (a fixture of this module too)


@contextlib.contextmanager
def plugin(directory: Path, sysfs: Path, strategy: str, resource: str, count: int) -> Iterator[FakeKubelet]:
    """The plugin on ``sysfs`` behind a fake kubelet in ``directory``, once it advertises ``count`` devices."""
    fake = FakeKubelet(str(directory))
    fake.start()
    manager = server.Manager(str(directory), server.Tracker(str(sysfs), strategy, log=lambda _m: None),
                             poll_interval=0.1, log=lambda _m: None)
    thread = threading.Thread(target=manager.run, daemon=True)
    thread.start()
    try:
        fake.devices(resource, lambda d: len(d) == count)
        yield fake
    finally:
        manager.stop()
        thread.join(10)
        fake.stop()


@pytest.fixture(scope="module")
def kubelet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeKubelet]:
    with plugin(tmp_path_factory.mktemp("kubelet") / "device-plugins", cl.SEED_SYSFS, "single", "amd.com/gpu",
                8) as fake:
        yield fake


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    cl.need("runc", "busybox", "unshare")
    return cl.hook_setup(tmp_path_factory.mktemp("plugin-containers"))


def _annotations(kubelet: FakeKubelet, ids: list[str]) -> dict[str, str]:
    (answer,) = kubelet.allocate("amd.com/gpu", ids).container_responses
    annotations = dict(answer.annotations)
    assert list(annotations) == ["cdi.k8s.io/oci-gpu-hook_gpu"]
    assert annotations["cdi.k8s.io/oci-gpu-hook_gpu"] == ",".join(c.name for c in answer.cdi_devices)
    assert not answer.envs
    return annotations


@pytest.mark.parametrize("v2", [False, True], ids=["cgroup-v1", "cgroup-v2"])
@pytest.mark.parametrize(("ids", "gpus", "env"), [
    ([SEED_IDS[2]], [2], []),
    ([SEED_IDS[6], SEED_IDS[5]], [5, 6], []),
    ([SEED_IDS[1]], [1], ["AMD_VISIBLE_DEVICES=all"]),  # the annotation decides, whatever the image says
], ids=["one", "two", "image-env-all"])
def test_allocate_response_through_the_shim_and_runc(setup: dict[str, Path], kubelet: FakeKubelet, v2: bool,
                                                     ids: list[str], gpus: list[int], env: list[str]) -> None:
    annotations = _annotations(kubelet, ids)
    bundle = cl.make_bundle(setup["base"] / cl.container_id(), setup["rootfs"], env)
    cl.edit_spec(bundle, lambda spec: spec.setdefault("annotations", {}).update(annotations))
    argv = [str(setup["runtime"]), "run", "--bundle", str(bundle), bundle.name]
    done = cl.run(cl.cgroup2_wrap(argv) if v2 else argv, env=cl.hook_env())
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, gpus, cgroup_v2=v2)


@pytest.mark.parametrize(("ids", "gpus"), [([SEED_IDS[3]], [3]), ([SEED_IDS[0], SEED_IDS[7]], [0, 7])],
                         ids=["one", "two"])
def test_allocate_response_through_containerd(daemon: test_containerd.Daemon, kubelet: FakeKubelet,
                                              ids: list[str], gpus: list[int]) -> None:
    annotations = _annotations(kubelet, ids)
    cid = cl.container_id()
    done = daemon.run(cid, annotations=annotations, runtime=daemon.runtime_no_env,
                      image=test_containerd.IMAGE_ENV_ALL)  # env requests off; the image asks for all GPUs
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, gpus)
    (entry,) = daemon.log_entries(cid)
    assert (entry["outcome"], entry["source"]) == ("ok", "cdi.k8s.io annotations"), entry
    assert entry["request"] == annotations["cdi.k8s.io/oci-gpu-hook_gpu"], entry


@pytest.fixture(scope="module")
def cpx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """The plugin (mixed strategy) on the MI300X CPX example host, and a shim configured for that host."""
    cl.need("runc", "busybox", "unshare")
    base = tmp_path_factory.mktemp("plugin-cpx")
    model = cl.host_model("mi300x-cpx")
    config = base / "config.toml"
    config.write_text(f'sysfs_root = "{model.sysfs}"\nhook_path = "{base / "bin" / "oci-gpu-hook"}"\n')
    _hook, runtime = cl.write_launchers(base / "bin", config)
    with plugin(base / "device-plugins", model.sysfs, "mixed", "amd.com/cpx_nps1", 16) as fake:
        yield {"kubelet": fake, "model": model, "runtime": runtime, "rootfs": cl.make_rootfs(base / "rootfs"),
               "base": base}


@pytest.mark.parametrize("v2", [False, True], ids=["cgroup-v1", "cgroup-v2"])
@pytest.mark.parametrize(("ids", "indices"), [
    (["0000:26:00.0/p3"], [11]),
    (["0000:05:00.0", "0000:05:00.0/p7"], [0, 7]),
], ids=["one-partition", "two-partitions"])
def test_allocated_partitions_through_the_shim(cpx: dict[str, object], v2: bool, ids: list[str],
                                               indices: list[int]) -> None:
    """A CPX partition allocated by the kubelet reaches the container, with its by-path link, and nothing else:
    every other partition's and GPU's minor, valid or not, is refused."""
    kubelet = cpx["kubelet"]
    assert isinstance(kubelet, FakeKubelet)
    (answer,) = kubelet.allocate("amd.com/cpx_nps1", ids).container_responses
    annotations = dict(answer.annotations)
    assert annotations == {"cdi.k8s.io/oci-gpu-hook_cpx_nps1": ",".join(f"amd.com/gpu={i}" for i in indices)}
    bundle = cl.make_bundle(Path(str(cpx["base"])) / cl.container_id(), Path(str(cpx["rootfs"])), [],
                            ["/bin/sh", "/probe-mi300x-cpx.sh"])
    cl.edit_spec(bundle, lambda spec: spec.setdefault("annotations", {}).update(annotations))
    argv = [str(cpx["runtime"]), "run", "--bundle", str(bundle), bundle.name]
    done = cl.run(cl.cgroup2_wrap(argv) if v2 else argv, env=cl.hook_env())
    assert done.returncode == 0, done.stderr
    model = cpx["model"]
    assert isinstance(model, cl.HostModel)
    cl.assert_granted(done.stdout, model, {"amd": indices}, cgroup_v2=v2)
