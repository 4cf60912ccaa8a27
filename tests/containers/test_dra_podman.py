"""The DRA driver's claim-scoped CDI specs in real containers: a claim prepared over the kubelet's gRPC on the seed
host (the allocation read from a fake API server), its spec applied by podman (`--device <the name prepared>`,
no hook), and the isolation probe over every GPU minor: the container gets exactly its claim's devices, and the
other claim's spec beside it gives it nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from oci_gpu_hook.cluster.dra.claims import Claims
from oci_gpu_hook.cluster.dra.kube import Client, Credentials
from oci_gpu_hook.cluster.dra.server import Driver
from oci_gpu_hook.config import load_config
from oci_gpu_hook.inventory import scan
from tests.helpers import containerlib as cl
from tests.helpers.fakeapiserver import FakeApiServer
from tests.helpers.fakedrakubelet import FakeDraKubelet

pytestmark = pytest.mark.containers

DRIVER = "gpu.oci-gpu-hook.io"
NODE = "seed"
SEED_BUSES = ("03", "23", "43", "63", "83", "a3", "c3", "e3")  # GPU i of the seed host: 0000:<bus>:00.0


def _name(gpu: int) -> str:
    return f"gpu-0000-{SEED_BUSES[gpu]}-00-0"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    cl.need("runc", "podman", "busybox")
    base = tmp_path_factory.mktemp("dra")
    rootfs = cl.make_rootfs(base / "rootfs")
    config_file = base / "config.toml"
    config_file.write_text(f'sysfs_root = "{cl.SEED_SYSFS}"\nhook_path = "{base / "bin" / "oci-gpu-hook"}"\n')
    cl.write_launchers(base / "bin", config_file)  # the specs' createRuntime hook (the by-path links)
    config = load_config({"OCI_GPU_HOOK_CONFIG": str(config_file)})
    cdi_dir = base / "cdi"
    cdi_dir.mkdir(mode=0o755)
    api = FakeApiServer(base)
    client = Client(Credentials(api.url, str(api.token_file), str(api.cert)))
    sockets = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))

    def claims(plugin: Driver) -> Claims:
        return Claims(config, DRIVER, NODE, str(cdi_dir), str(base / "state"), client, plugin.current,
                      lambda _line: None, lambda: "v1")

    driver = Driver(DRIVER, lambda: scan(str(cl.SEED_SYSFS), strict=False), None, claims,
                    registry_dir=str(sockets / "registry"), plugins_dir=str(sockets / "plugins"), rescan_interval=0,
                    log=lambda _line: None)
    driver.step()
    kubelet = FakeDraKubelet(str(sockets / "registry"))
    kubelet.discover()
    prepared: dict[str, list[str]] = {}
    for uid, gpus in (("uid-one", [2]), ("uid-two", [1, 7])):
        api.add_claim("default", uid, uid, [{"request": "gpus", "driver": DRIVER, "pool": NODE, "device": _name(g)}
                                            for g in gpus])
        answer = kubelet.prepare(("default", uid, uid)).claims[uid]  # type: ignore[attr-defined]
        assert answer.error == "", answer.error
        prepared[uid] = [name for d in answer.devices for name in d.cdi_device_ids]
    try:
        yield {"rootfs": rootfs, "cdi": cdi_dir, "prepared": prepared}
    finally:
        kubelet.close()
        driver.sockets.stop()
        api.close()
        shutil.rmtree(sockets, ignore_errors=True)


def _podman(node: dict[str, object], *devices: str) -> subprocess.CompletedProcess[str]:
    options = [o for d in devices for o in ("--device", d)]
    argv = [*cl.PODMAN, "--runtime=runc", f"--hooks-dir={node['cdi']}/none", *cl.PODMAN_RUN, *options, "--rootfs",
            str(node["rootfs"]), "/bin/sh", "/probe.sh"]
    return cl.run(cl.private_cdi(argv, node["cdi"]), env=cl.hook_env())  # type: ignore[arg-type]


@pytest.mark.parametrize(("uid", "gpus"), [("uid-one", [2]), ("uid-two", [1, 7])])
def test_a_container_gets_exactly_its_claims_devices(node: dict[str, object], uid: str, gpus: list[int]) -> None:
    names = node["prepared"][uid]  # type: ignore[index]
    assert names == [f"k8s.{DRIVER}/claim={uid}-{_name(g)}" for g in gpus]
    done = _podman(node, *names)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, gpus, cgroup_v2=False)


def test_a_name_of_no_prepared_claim_stops_the_container(node: dict[str, object]) -> None:
    done = _podman(node, f"k8s.{DRIVER}/claim=uid-one-{_name(1)}")  # GPU 1 is uid-two's
    assert done.returncode != 0 and "done" not in done.stdout
    assert "unresolvable" in done.stderr.lower(), done.stderr
    assert sorted(os.listdir(str(node["cdi"]))) == [f"k8s.{DRIVER}-claim_uid-one.json",
                                                    f"k8s.{DRIVER}-claim_uid-two.json"]
