"""End to end: what the device plugin's Allocate returns gets exactly those GPUs into a real container.

The plugin runs on the seed example host (8 GPUs) behind the fake kubelet
(tests/helpers/fakekubelet.py).  The container annotation of its Allocate response goes,
as containerd's CRI puts it there for the ``oci-gpu`` RuntimeClass, into the
bundle's config.json annotations; ``oci-gpu-runtime`` runs it through runc in
cgroup v1 and v2, and the isolation probe (tests/helpers/containerlib.py) must see the
allocated GPUs' nodes (ENXIO) and EPERM for every other GPU minor.  The same
through containerd 1.6 (``ctr run --runc-binary`` the shim ``--annotation``),
with env requests off, as on a Kubernetes node.  And as containerd 2.x and
CRI-O do it, with the runtime resolving the plugin's ``cdi_devices`` from the
CDI spec itself (podman 4.3 applies CDI specs natively): after a GPU left the
node and no ``watch`` ran, the stable names the plugin returns still give
exactly the allocated GPU, from the spec the plugin keeps.  Needs root, runc,
busybox (and containerd, ctr; podman); under CI=true a missing one fails.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from oci_gpu_hook.appliers import cdi
from oci_gpu_hook.cluster.deviceplugin import server
from oci_gpu_hook.cluster.deviceplugin.specs import SpecKeeper
from oci_gpu_hook.config import Config
from oci_gpu_hook.inventory import scan
from tests.helpers import containerdlib, fakesysfs
from tests.helpers import containerlib as cl
from tests.helpers.fakekubelet import FakeKubelet

pytestmark = pytest.mark.containers

SEED_IDS = [f"0000:{bus}:00.0" for bus in cl.SEED_PCI]

daemon = containerdlib.daemon  # the same private containerd 1.6 (a fixture of this module too)


@contextlib.contextmanager
def plugin(directory: Path, sysfs: Path, strategy: str, resource: str, count: int,
           specs: SpecKeeper | None = None, rescan_interval: float = 10.0) -> Iterator[FakeKubelet]:
    """The plugin on ``sysfs`` behind a fake kubelet in ``directory``, once it advertises ``count`` devices."""
    fake = FakeKubelet(str(directory))
    fake.start()
    manager = server.Manager(str(directory), server.Tracker(str(sysfs), strategy, log=lambda _m: None, specs=specs),
                             poll_interval=0.1, log=lambda _m: None, rescan_interval=rescan_interval)
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
def test_allocate_response_through_containerd(daemon: containerdlib.Daemon, kubelet: FakeKubelet,
                                              ids: list[str], gpus: list[int]) -> None:
    annotations = _annotations(kubelet, ids)
    cid = cl.container_id()
    done = daemon.run(cid, annotations=annotations, runtime=daemon.runtime_no_env,
                      image=containerdlib.IMAGE_ENV_ALL)  # env requests off; the image asks for all GPUs
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
    names = [f"{pci}-p{part}" for pci, part in (i.split("/p") if "/p" in i else (i, "0") for i in ids)]
    assert annotations == {"cdi.k8s.io/oci-gpu-hook_cpx_nps1": ",".join(f"amd.com/gpu={n}" for n in names)}
    bundle = cl.make_bundle(Path(str(cpx["base"])) / cl.container_id(), Path(str(cpx["rootfs"])), [],
                            ["/bin/sh", "/probe-mi300x-cpx.sh"])
    cl.edit_spec(bundle, lambda spec: spec.setdefault("annotations", {}).update(annotations))
    argv = [str(cpx["runtime"]), "run", "--bundle", str(bundle), bundle.name]
    done = cl.run(cl.cgroup2_wrap(argv) if v2 else argv, env=cl.hook_env())
    assert done.returncode == 0, done.stderr
    model = cpx["model"]
    assert isinstance(model, cl.HostModel)
    cl.assert_granted(done.stdout, model, {"amd": indices}, cgroup_v2=v2)


# --- native CDI (podman 4.3, as containerd 2.x and CRI-O): the plugin's names, resolved from its spec -----------

@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    cl.need("runc", "podman", "busybox", "unshare")
    base = tmp_path_factory.mktemp("plugin-native-cdi")
    config = base / "config.toml"
    config.write_text(f'hook_path = "{base / "bin" / "oci-gpu-hook"}"\n')
    hook, _runtime = cl.write_launchers(base / "bin", config)  # the CDI spec's createRuntime hook (by-path links)
    (base / "no-hooks").mkdir()
    return {"base": base, "hook": hook, "rootfs": cl.make_rootfs(base / "rootfs"), "no-hooks": base / "no-hooks"}


def _node(native: dict[str, Path], tmp_path: Path, host: str) -> tuple[Path, Path, SpecKeeper]:
    """A node of its own: a fake sysfs of ``host``, and the CDI spec that install wrote once, in a directory
    the plugin manages."""
    sysfs = Path(fakesysfs.build(str(tmp_path / "sys"), fakesysfs.HOSTS[host]()))
    config = Config(sysfs_root=str(sysfs), hook_path=str(native["hook"]))
    cdi_dir = tmp_path / "cdi"
    cdi.write(str(cdi_dir / "amd.com-gpu.json"), cdi.render(cdi.generate(scan(str(sysfs)), "amd", config), "json"))
    return sysfs, cdi_dir, SpecKeeper(config, [str(cdi_dir)], lambda _m: None)


def _podman_cdi(native: dict[str, Path], cdi_dir: Path, names: list[str], probe: str = "/probe.sh") -> str:
    """podman applying the CDI spec of ``cdi_dir`` itself (``--device`` per name; no hook, no shim), in a
    private mount namespace whose /run/cdi holds that spec."""
    devices = [option for name in names for option in ("--device", name)]
    argv = [*cl.PODMAN, "--runtime=runc", f"--hooks-dir={native['no-hooks']}", *cl.PODMAN_RUN, *devices,
            "--rootfs", str(native["rootfs"]), "/bin/sh", probe]
    done = cl.run(cl.private_cdi(argv, cdi_dir), env=cl.hook_env())
    assert done.returncode == 0, done.stderr
    return done.stdout


def _names(kubelet: FakeKubelet, resource: str, ids: list[str]) -> list[str]:
    (answer,) = kubelet.allocate(resource, ids).container_responses
    names = [c.name for c in answer.cdi_devices]
    assert dict(answer.annotations) == {server.annotation_key(resource): ",".join(names)}
    return names


def test_native_cdi_gets_the_allocated_gpu_after_one_left(native: dict[str, Path], tmp_path: Path) -> None:
    """Allocate, a GPU leaves sysfs (no watch runs, no rescan is due: 60 s), allocate again: the runtime resolves
    each name the plugin returned to exactly the allocated GPU, by the probe over every DRM minor.  (With index
    names and the spec as install wrote it, the second pod got the GPU after the one allocated.)"""
    sysfs, cdi_dir, specs = _node(native, tmp_path, "seed")
    with plugin(tmp_path / "device-plugins", sysfs, "single", "amd.com/gpu", 8, specs, 60) as kubelet:
        first = _names(kubelet, "amd.com/gpu", ["0000:63:00.0"])
        assert first == ["amd.com/gpu=0000:63:00.0"]
        cl.assert_isolated(_podman_cdi(native, cdi_dir, first), [3], cgroup_v2=False)
        fakesysfs.remove_gpu(str(sysfs), fakesysfs.seed_host(), "0000:43:00.0")
        second = _names(kubelet, "amd.com/gpu", ["0000:83:00.0"])
        assert second == ["amd.com/gpu=0000:83:00.0"]
        cl.assert_isolated(_podman_cdi(native, cdi_dir, second), [4], cgroup_v2=False)
        both = _names(kubelet, "amd.com/gpu", ["0000:e3:00.0", "0000:23:00.0"])
        cl.assert_isolated(_podman_cdi(native, cdi_dir, both), [1, 7], cgroup_v2=False)
        # the first pod's container, restarted with the response the kubelet kept, still gets its own GPU
        cl.assert_isolated(_podman_cdi(native, cdi_dir, first), [3], cgroup_v2=False)
        names = {d["name"] for d in cdi.load(str(cdi_dir / "amd.com-gpu.json"))["devices"]}
        assert "0000:43:00.0" not in names and "0000:63:00.0" in names


def test_native_cdi_gets_the_allocated_partition_after_a_partitioned_gpu_left(native: dict[str, Path],
                                                                               tmp_path: Path) -> None:
    """The same on the MI300X CPX host (mixed strategy): GPU 0000:05:00.0 and its 8 partitions leave; a
    partition of the other GPU, by its stable name, is exactly what the container gets (its nodes and by-path
    links, every other minor of the host refused)."""
    sysfs, cdi_dir, specs = _node(native, tmp_path, "mi300x-cpx")
    model = cl.host_model("mi300x-cpx")  # the host before the removal: its minors are all probed
    probe = "/probe-mi300x-cpx.sh"
    with plugin(tmp_path / "device-plugins", sysfs, "mixed", "amd.com/cpx_nps1", 16, specs, 60) as kubelet:
        first = _names(kubelet, "amd.com/cpx_nps1", ["0000:26:00.0/p3"])
        assert first == ["amd.com/gpu=0000:26:00.0-p3"]
        cl.assert_granted(_podman_cdi(native, cdi_dir, first, probe), model, {"amd": [11]}, cgroup_v2=False)
        fakesysfs.remove_gpu(str(sysfs), fakesysfs.HOSTS["mi300x-cpx"](), "0000:05:00.0")
        second = _names(kubelet, "amd.com/cpx_nps1", ["0000:26:00.0/p5"])
        assert second == ["amd.com/gpu=0000:26:00.0-p5"]
        cl.assert_granted(_podman_cdi(native, cdi_dir, second, probe), model, {"amd": [13]}, cgroup_v2=False)
        p0 = _names(kubelet, "amd.com/cpx_nps1", ["0000:26:00.0"])
        assert p0 == ["amd.com/gpu=0000:26:00.0-p0"]  # partition 0 alone, never the whole GPU
        cl.assert_granted(_podman_cdi(native, cdi_dir, p0, probe), model, {"amd": [8]}, cgroup_v2=False)
