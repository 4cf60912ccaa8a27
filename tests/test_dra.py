"""The DRA driver (oci_gpu_hook/cluster/dra): its devices and attributes on the example hosts, ResourceSlice
publishing against a fake API server over real HTTPS, registration and prepare/unprepare against a fake kubelet
over real gRPC, the claim's CDI spec, the checkpoint across a restart, and slices following the host over time.

Hosts are built fresh from tests/helpers/fakesysfs.py (or read from examples/hosts); every file the driver writes
goes below the test's tmp_path.  The driver runs in-process with its loop stepped by the test (rescan interval 0:
every step rescans), so nothing waits on a clock; the real command runs once, as a process, at the end."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from oci_gpu_hook.appliers import cdi
from oci_gpu_hook.cluster.dra import devices as dra_devices
from oci_gpu_hook.cluster.dra.claims import ClaimError, Claims, spec_file
from oci_gpu_hook.cluster.dra.kube import Client, Credentials
from oci_gpu_hook.cluster.dra.server import Driver
from oci_gpu_hook.cluster.dra.slices import Publisher, choose_version, slice_objects
from oci_gpu_hook.cluster.watch import QueueEvents
from oci_gpu_hook.config import Config
from oci_gpu_hook.inventory import scan
from tests.helpers import fakesysfs
from tests.helpers.fakeapiserver import FakeApiServer, slice_problems
from tests.helpers.fakedrakubelet import FakeDraKubelet
from tests.test_device_plugin_nvidia import MIG_GPU, MIG_UUID, fake_nvml, mig_tree

__all__ = ["fake_nvml"]  # the fixture, used by name

REPO = Path(__file__).resolve().parent.parent
HOSTS = REPO / "examples" / "hosts"
DRIVER = "gpu.oci-gpu-hook.io"
NODE = "node-a"
KIND = f"k8s.{DRIVER}/claim"


def _inventory(host: str) -> object:
    base = HOSTS / host
    proc = base / "proc"
    return scan(str(base / "sys"), strict=False, proc_root=str(proc) if proc.is_dir() else "/proc")


# --- devices ------------------------------------------------------------------------------------------------

def test_cpx_partitions_are_devices_with_their_gpu_as_parent() -> None:
    built, notes = dra_devices.build(_inventory("mi300x-2x-cpx"))  # type: ignore[arg-type]
    assert notes == []
    devices = dra_devices.without_counters(built)  # the parts (tests/test_dra_counters.py: the wholes too)
    assert len(devices) == 16 and len(built) == 18
    by_name = {d.name: d for d in devices}
    p3 = by_name["gpu-0000-26-00-0-p3"]
    assert {k: v[1] for k, v in p3.attributes.items()} == {
        "vendor": "amd", "type": "partition", "model": "gfx942", "architecture": "gfx942",
        "pciAddress": "0000:26:00.0", "pciDeviceId": "0x74a1", "stableName": "0000:26:00.0-p3",
        "parent": "0000:26:00.0", "numaNode": 1, "partitionIndex": 3, "computePartition": "CPX",
        "memoryPartition": "NPS1", "hiveId": p3.attributes["hiveId"][1], "driver": "amdgpu"}
    assert p3.attributes["numaNode"] == ("int", 1) and p3.attributes["hiveId"][0] == "string"
    assert p3.capacity == {"memory": "192Gi"}  # NPS1: one memory partition, the whole VRAM
    assert all(dra_devices.DNS_LABEL.match(d.name) for d in devices)


def test_whole_gpus_of_each_vendor_by_stable_name() -> None:
    seed, _ = dra_devices.build(_inventory("seed-8x-gfx1100"))  # type: ignore[arg-type]
    assert [d.name for d in seed][:2] == ["gpu-0000-03-00-0", "gpu-0000-23-00-0"]
    assert {d.attributes["type"][1] for d in seed} == {"gpu"} and "parent" not in seed[0].attributes
    assert seed[0].capacity == {"memory": "48Gi"}
    nvidia, _ = dra_devices.build(_inventory("nvidia-4x-h100"))  # type: ignore[arg-type]
    first = nvidia[0]
    uuid = first.attributes["uuid"][1]
    assert isinstance(uuid, str) and uuid.startswith("GPU-") and first.name == "gpu-" + uuid[4:].lower()
    assert first.attributes["driverVersion"] == ("version", "550.54.15")
    assert first.attributes["model"] == ("string", "NVIDIA H100 80GB HBM3")
    intel, _ = dra_devices.build(_inventory("intel-i915-xe"))  # type: ignore[arg-type]
    assert [(d.name, d.attributes["vendor"][1], d.attributes["driver"][1]) for d in intel] == [
        ("gpu-0000-00-02-0", "intel", "i915"), ("gpu-0000-03-00-0", "intel", "xe")]


def test_every_example_host_makes_slices_the_api_accepts() -> None:
    """The API's shape rules (tests/helpers/fakeapiserver.py) for every example host, in every version."""
    for host in sorted(p.name for p in HOSTS.iterdir()):
        devices, _ = dra_devices.build(_inventory(host))  # type: ignore[arg-type]
        assert devices, host
        for version in ("v1", "v1beta2", "v1beta1"):
            for body in slice_objects(devices, DRIVER, NODE, 1, version):
                assert slice_problems(body, version) == [], (host, version)


def test_the_shape_check_can_fail() -> None:
    devices, _ = dra_devices.build(_inventory("seed-8x-gfx1100"))  # type: ignore[arg-type]
    (body,) = slice_objects(devices, DRIVER, NODE, 1, "v1")
    assert slice_problems(body, "v1beta1")  # v1beta1 wants "basic"
    body["spec"]["devices"][0]["attributes"]["numaNode"] = {"int": 1, "string": "x"}
    body["spec"]["devices"][1]["name"] = "GPU_0"
    problems = slice_problems(body, "v1")
    assert any("exactly one of" in p for p in problems) and any("no DNS label" in p for p in problems)


# --- a driver in-process ----------------------------------------------------------------------------------------

@dataclass
class Rig:
    tmp: Path
    sysfs: Path
    api: FakeApiServer
    kubelet: FakeDraKubelet
    driver: Driver
    logs: list[str]

    @property
    def cdi_dir(self) -> Path:
        return self.tmp / "cdi"


def _sockets(tmp: Path) -> Path:
    """A short directory for the sockets (a Unix socket path has at most 107 bytes; tmp_path's are long)."""
    link = tmp / "sockets"
    if not link.exists():
        link.symlink_to(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    return Path(os.readlink(link))


def _driver(tmp: Path, sysfs: Path, api: FakeApiServer, logs: list[str], version: str | None = None,
            **options: object) -> Driver:
    config = Config(sysfs_root=str(sysfs))
    client = Client(Credentials(api.url, str(api.token_file), str(api.cert)))
    publisher = Publisher(client, DRIVER, NODE, logs.append, version)

    def api_version() -> str:
        return publisher.version or choose_version(client)

    def claims(plugin: Driver) -> Claims:
        return Claims(config, DRIVER, NODE, str(tmp / "cdi"), str(tmp / "state"), client, plugin.current, logs.append,
                      api_version)

    return Driver(DRIVER, lambda: scan(str(sysfs), strict=False), publisher, claims,
                  registry_dir=str(_sockets(tmp) / "registry"), plugins_dir=str(_sockets(tmp) / "plugins"),
                  log=logs.append, **{"rescan_interval": 0, **options})  # type: ignore[arg-type]


def _rig(tmp: Path, host: fakesysfs.FakeHost, *, versions: tuple[str, ...] = ("v1", "v1beta2", "v1beta1"),
         speaks: tuple[str, ...] = ("v1.DRAPlugin", "v1beta1.DRAPlugin"), **server: object) -> Iterator[Rig]:
    """``server``: the fake API server's options (its Kubernetes version, whether it keeps counters)."""
    sysfs = Path(fakesysfs.build(str(tmp / "sys"), host))
    (tmp / "cdi").mkdir(mode=0o755)
    api = FakeApiServer(tmp, versions, **server)  # type: ignore[arg-type]
    api.state.nodes[NODE] = {"kind": "Node", "metadata": {"name": NODE, "uid": "node-uid-1"}}
    logs: list[str] = []
    driver = _driver(tmp, sysfs, api, logs)
    kubelet = FakeDraKubelet(str(_sockets(tmp) / "registry"), speaks)
    try:
        driver.step()
        yield Rig(tmp, sysfs, api, kubelet, driver, logs)
    finally:
        kubelet.close()
        driver.sockets.stop()
        api.close()
        shutil.rmtree(_sockets(tmp), ignore_errors=True)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    yield from _rig(tmp_path, fakesysfs.mi300x_host("CPX"))


def _allocated(rig: Rig, name: str, uid: str, *devices: str, pool: str = NODE, **extra: object) -> tuple[str, str, str]:
    rig.api.add_claim("default", name, uid, [
        {"request": "gpu", "driver": DRIVER, "pool": pool, "device": d, **extra} for d in devices])
    return "default", name, uid


# --- slices ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("versions", [("v1", "v1beta2", "v1beta1"), ("v1beta1",)])
def test_the_nodes_devices_are_published_as_one_slice_of_its_pool(tmp_path: Path, versions: tuple[str, ...]) -> None:
    for rig in _rig(tmp_path, fakesysfs.mi300x_host("CPX"), versions=versions):
        (published,) = rig.api.slices()
        version = versions[0]
        assert published["apiVersion"] == f"resource.k8s.io/{version}"
        assert published["metadata"]["name"] == f"{NODE}-{DRIVER}-0"
        assert published["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "node-uid-1", "controller": True}]
        spec = published["spec"]
        assert (spec["driver"], spec["nodeName"], spec["pool"]) == (
            DRIVER, NODE, {"name": NODE, "generation": 1, "resourceSliceCount": 1})
        names = [d["name"] for d in spec["devices"]]
        assert len(names) == 16 and "gpu-0000-05-00-0-p7" in names
        first = spec["devices"][0]
        body = first["basic"] if version == "v1beta1" else first
        assert body["attributes"]["computePartition"] == {"string": "CPX"}
        assert body["capacity"] == {"memory": {"value": "192Gi"}}
        assert {r.token for r in rig.api.state.requests} == {"test-token"}
        (list_call,) = [r for r in rig.api.state.requests if r.method == "GET" and r.path.endswith("resourceslices")]
        assert list_call.query == {"fieldSelector": f"spec.nodeName={NODE},spec.driver={DRIVER}"}


def test_slices_written_before_the_node_registers_get_its_owner_once_it_is_there(tmp_path: Path) -> None:
    # Seen on a real 1.36 control plane: the driver started before its kubelet registered the Node, and the slices
    # stayed unowned for good (the Node was read once).
    for rig in _rig(tmp_path, fakesysfs.mi300x_host("CPX")):
        del rig.api.state.nodes[NODE]
        rig.driver.publisher.owner = None
        rig.driver.publisher.written = None
        rig.driver.step()
        assert [s["metadata"].get("ownerReferences") for s in rig.api.slices()] == [None]
        rig.driver.step()
        assert [line for line in rig.logs if "not owned by node" in line] == [
            f"slices are not owned by node {NODE} until it can be read (they stay if the node object goes): "
            f"GET /api/v1/nodes/{NODE}: 404 nodes {NODE!r} not found"]
        writes = len(rig.api.writes())
        rig.api.state.nodes[NODE] = {"kind": "Node", "metadata": {"name": NODE, "uid": "node-uid-2"}}
        rig.driver.step()
        (published,) = rig.api.slices()
        assert published["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "node-uid-2", "controller": True}]
        assert len(rig.api.writes()) == writes + 1
        rig.driver.step()
        assert len(rig.api.writes()) == writes + 1


def test_a_rescan_that_changes_nothing_writes_nothing(rig: Rig) -> None:
    before = len(rig.api.writes())
    rig.driver.step()
    rig.driver.step()
    assert len(rig.api.writes()) == before == 1


def test_a_gpu_that_leaves_leaves_the_slice_with_a_new_generation(rig: Rig) -> None:
    fakesysfs.remove_gpu(str(rig.sysfs), fakesysfs.mi300x_host("CPX"), "0000:26:00.0")
    rig.driver.step()
    (published,) = rig.api.slices()
    names = [d["name"] for d in published["spec"]["devices"]]
    assert len(names) == 8 and not any(n.startswith("gpu-0000-26") for n in names)
    assert published["spec"]["pool"]["generation"] == 2
    assert any("gone gpu-0000-26-00-0-p0" in line for line in rig.logs)


def test_a_mode_change_republishes_the_gpus_devices(rig: Rig) -> None:
    shutil.rmtree(rig.sysfs)
    fakesysfs.build(str(rig.sysfs), fakesysfs.mi300x_host("SPX"))
    rig.driver.step()
    (published,) = rig.api.slices()
    devices = {d["name"]: d for d in published["spec"]["devices"]}
    assert sorted(devices) == ["gpu-0000-05-00-0-p0", "gpu-0000-26-00-0-p0"]
    assert devices["gpu-0000-05-00-0-p0"]["attributes"]["computePartition"] == {"string": "SPX"}
    assert published["spec"]["pool"]["generation"] == 2


def test_a_gpu_uevent_brings_the_rescan_forward(tmp_path: Path) -> None:
    """A rescan interval of an hour: the GPU's drm uevent, not an unrelated one, makes the next step rescan."""
    sysfs = Path(fakesysfs.build(str(tmp_path / "sys"), fakesysfs.seed_host()))
    api = FakeApiServer(tmp_path)
    logs: list[str] = []
    events = QueueEvents()
    driver = _driver(tmp_path, sysfs, api, logs, rescan_interval=3600, events=events, uevent_delay=0)
    try:
        driver.step()
        fakesysfs.remove_gpu(str(sysfs), fakesysfs.seed_host(), "0000:23:00.0")
        events.put({"ACTION": "add", "SUBSYSTEM": "pci", "DEVPATH": "/devices/unrelated"})
        driver._wait(0.3)
        driver.step()
        assert len(api.slices()[0]["spec"]["devices"]) == 8  # not rescanned
        events.put({"ACTION": "remove", "SUBSYSTEM": "drm", "DEVNAME": "dri/card2"})
        driver._wait(0.3)
        driver.step()
        (published,) = api.slices()
        assert "gpu-0000-23-00-0" not in [d["name"] for d in published["spec"]["devices"]]
        assert any(line.startswith("uevent remove drm dri/card2: 7 device(s); gone gpu-0000-23-00-0")
                   for line in logs), logs
    finally:
        driver.sockets.stop()
        api.close()
        shutil.rmtree(_sockets(tmp_path), ignore_errors=True)


def test_a_slice_deleted_by_someone_else_is_written_again(rig: Rig) -> None:
    rig.api.state.slices.clear()
    rig.driver.step()
    (published,) = rig.api.slices()
    assert published["spec"]["pool"]["generation"] == 2 and len(published["spec"]["devices"]) == 16


def test_an_api_server_away_is_said_once_and_retried(rig: Rig) -> None:
    fakesysfs.remove_gpu(str(rig.sysfs), fakesysfs.mi300x_host("CPX"), "0000:05:00.0")
    rig.api.state.down = True
    rig.driver.step()
    rig.driver.step()
    failures = [line for line in rig.logs if line.startswith("publishing ResourceSlices failed")]
    assert len(failures) == 1 and "503 the fake API server is down" in failures[0]
    rig.api.state.down = False
    rig.driver.step()
    (published,) = rig.api.slices()
    assert len(published["spec"]["devices"]) == 8 and rig.logs[-1] == "publishing ResourceSlices works again"


def test_a_wrong_token_is_a_clear_line(rig: Rig) -> None:
    rig.api.state.token = "another"
    rig.api.state.slices.clear()
    rig.driver.step()
    assert any(line.startswith("publishing ResourceSlices failed") and ": 401 Unauthorized" in line
               for line in rig.logs)


# --- registration, prepare, unprepare ---------------------------------------------------------------------------

@pytest.mark.parametrize("speaks", [("v1.DRAPlugin",), ("v1beta1.DRAPlugin",)])
def test_the_kubelet_registers_the_plugin_in_the_version_it_speaks(tmp_path: Path, speaks: tuple[str, ...]) -> None:
    for rig in _rig(tmp_path, fakesysfs.seed_host(), speaks=speaks):
        registered = rig.kubelet.discover()
        assert (registered.driver, registered.service) == (DRIVER, speaks[0])
        assert registered.endpoint == str(_sockets(tmp_path) / "plugins" / DRIVER / "dra.sock")
        assert list(registered.info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin",
                                                            "v1alpha1.DRAResourceHealth"]
        assert rig.driver.registration.status is not None and rig.driver.registration.status.plugin_registered
        claim = _allocated(rig, "two", "uid-two", "gpu-0000-23-00-0", "gpu-0000-63-00-0")
        answer = rig.kubelet.prepare(claim).claims["uid-two"]  # type: ignore[attr-defined]
        assert answer.error == ""
        got = [(list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids)) for d in answer.devices]
        assert got == [
            (["gpu"], NODE, "gpu-0000-23-00-0", [f"{KIND}=uid-two-gpu-0000-23-00-0"]),
            (["gpu"], NODE, "gpu-0000-63-00-0", [f"{KIND}=uid-two-gpu-0000-63-00-0"])]


def _spec(rig: Rig, uid: str) -> dict[str, object]:
    return json.loads(Path(spec_file(str(rig.cdi_dir), DRIVER, uid)).read_text())


def test_the_claims_spec_has_exactly_its_devices_and_the_shared_nodes(rig: Rig) -> None:
    rig.kubelet.discover()
    claim = _allocated(rig, "parts", "uid-1", "gpu-0000-26-00-0-p2", "gpu-0000-05-00-0-p0")
    assert rig.kubelet.prepare(claim).claims["uid-1"].error == ""  # type: ignore[attr-defined]
    spec = _spec(rig, "uid-1")
    cdi.validate(spec, "the claim's spec")
    assert spec["kind"] == KIND
    devices = {d["name"]: sorted(n["path"] for n in d["containerEdits"]["deviceNodes"])  # type: ignore[index]
               for d in spec["devices"]}  # type: ignore[union-attr]
    inventory = scan(str(rig.sysfs), strict=False)
    want = {}
    for device in inventory.devices("amd"):
        name = dra_devices.device_name(f"{device.pci_address}-p{device.partition}")
        if name in ("gpu-0000-26-00-0-p2", "gpu-0000-05-00-0-p0"):
            want[f"uid-1-{name}"] = sorted(n.path for n in device.nodes)
    assert devices == want and len(want) == 2
    assert [n["path"] for n in spec["containerEdits"]["deviceNodes"]] == ["/dev/kfd"]  # type: ignore[index]
    assert oct(os.stat(spec_file(str(rig.cdi_dir), DRIVER, "uid-1")).st_mode & 0o777) == "0o644"


def test_prepare_and_unprepare_are_idempotent(rig: Rig) -> None:
    rig.kubelet.discover()
    claim = _allocated(rig, "one", "uid-1", "gpu-0000-05-00-0-p1")
    first = rig.kubelet.prepare(claim).claims["uid-1"]  # type: ignore[attr-defined]
    again = rig.kubelet.prepare(claim).claims["uid-1"]  # type: ignore[attr-defined]
    assert first == again and first.error == ""
    path = Path(spec_file(str(rig.cdi_dir), DRIVER, "uid-1"))
    path.unlink()  # a reboot empties /var/run/cdi; the kubelet prepares again
    assert rig.kubelet.prepare(claim).claims["uid-1"] == first  # type: ignore[attr-defined]
    assert path.exists()
    for _ in range(2):
        assert rig.kubelet.unprepare(claim).claims["uid-1"].error == ""  # type: ignore[attr-defined]
        assert not path.exists()
    assert json.loads((rig.tmp / "state" / "checkpoint.json").read_text())["claims"] == {}


def test_a_claim_whose_device_is_gone_is_refused_in_one_line_and_the_others_prepared(rig: Rig) -> None:
    rig.kubelet.discover()
    gone = _allocated(rig, "gone", "uid-gone", "gpu-0000-26-00-0-p4")
    fine = _allocated(rig, "fine", "uid-fine", "gpu-0000-05-00-0-p4")
    fakesysfs.remove_gpu(str(rig.sysfs), fakesysfs.mi300x_host("CPX"), "0000:26:00.0")
    answer = rig.kubelet.prepare(gone, fine).claims  # type: ignore[attr-defined]
    error = answer["uid-gone"].error
    assert error.startswith(f"claim default/gone: device gpu-0000-26-00-0-p4 is not on node {NODE} now (gone, or "
                            "its GPU changed partition mode); here now: gpu-0000-05-00-0-p0, ")
    assert "\n" not in error and list(answer["uid-gone"].devices) == []
    assert answer["uid-fine"].error == "" and len(answer["uid-fine"].devices) == 1
    assert not Path(spec_file(str(rig.cdi_dir), DRIVER, "uid-gone")).exists()
    (published,) = rig.api.slices()  # the prepare's scan republished at once
    assert len(published["spec"]["devices"]) == 8


def test_refusals_say_what_is_wrong(rig: Rig) -> None:
    rig.kubelet.discover()
    other_pool = _allocated(rig, "elsewhere", "uid-a", "gpu-0000-05-00-0-p1", pool="node-b")
    held = _allocated(rig, "first", "uid-b", "gpu-0000-05-00-0-p2")
    assert rig.kubelet.prepare(held).claims["uid-b"].error == ""  # type: ignore[attr-defined]
    second = _allocated(rig, "second", "uid-c", "gpu-0000-05-00-0-p2")
    rig.api.add_claim("default", "renamed", "uid-new", [])
    errors = {uid: c.error for uid, c in rig.kubelet.prepare(  # type: ignore[attr-defined]
        other_pool, second, ("default", "renamed", "uid-old"), ("default", "missing", "uid-m")).claims.items()}
    assert errors == {
        "uid-a": f"claim default/elsewhere: device gpu-0000-05-00-0-p1 is in pool node-b, not this node's ({NODE})",
        "uid-c": "claim default/second: device gpu-0000-05-00-0-p2 is prepared for claim default/first (uid-b)",
        "uid-old": "claim default/renamed: its UID is uid-new, the kubelet asked for uid-old (deleted and created "
                   "again?)",
        "uid-m": "claim default/missing: cannot read it: GET /apis/resource.k8s.io/v1/namespaces/default/"
                 "resourceclaims/missing: 404 resourceclaims 'missing' not found"}


def test_a_restarted_plugin_knows_what_is_prepared(rig: Rig) -> None:
    rig.kubelet.discover()
    held = _allocated(rig, "first", "uid-b", "gpu-0000-05-00-0-p2")
    assert rig.kubelet.prepare(held).claims["uid-b"].error == ""  # type: ignore[attr-defined]
    rig.kubelet.close()
    rig.driver.sockets.stop()
    restarted = _driver(rig.tmp, rig.sysfs, rig.api, rig.logs)
    try:
        restarted.step()
        kubelet = FakeDraKubelet(str(_sockets(rig.tmp) / "registry"))
        kubelet.discover()
        second = _allocated(rig, "second", "uid-c", "gpu-0000-05-00-0-p2")
        assert "is prepared for claim default/first" in kubelet.prepare(second).claims["uid-c"].error  # type: ignore[attr-defined]
        assert kubelet.unprepare(held).claims["uid-b"].error == ""  # type: ignore[attr-defined]
        assert not Path(spec_file(str(rig.cdi_dir), DRIVER, "uid-b")).exists()
        assert kubelet.prepare(second).claims["uid-c"].error == ""  # type: ignore[attr-defined]
        kubelet.close()
    finally:
        restarted.sockets.stop()


def test_health_follows_the_devices(rig: Rig) -> None:
    from oci_gpu_hook.cluster.dra import health_v1alpha1_pb2 as health

    rig.kubelet.discover()
    stream = rig.kubelet.watch_health()
    first = next(stream)  # type: ignore[call-overload]
    assert len(first.devices) == 16 and {d.health for d in first.devices} == {health.HEALTHY}
    assert {d.device.pool_name for d in first.devices} == {NODE}
    fakesysfs.remove_gpu(str(rig.sysfs), fakesysfs.mi300x_host("CPX"), "0000:26:00.0")
    rig.driver.step()
    second = next(stream)  # type: ignore[call-overload]
    state = {d.device.device_name: (d.health, d.message) for d in second.devices}
    assert len(state) == 16
    assert state["gpu-0000-26-00-0-p5"] == (health.UNHEALTHY, "gone from the host, or its GPU changed partition mode")
    assert state["gpu-0000-05-00-0-p5"] == (health.HEALTHY, "")
    stream.cancel()  # type: ignore[attr-defined]


def test_health_is_sent_again_without_a_change(tmp_path: Path) -> None:
    """A real 1.36 kubelet counts a device whose last report is older than 30 s as Unknown (and shows that in the
    status of a pod started later): the stream repeats the devices' health while nothing changes."""
    from oci_gpu_hook.cluster.dra import health_v1alpha1_pb2 as health

    sysfs = Path(fakesysfs.build(str(tmp_path / "sys"), fakesysfs.seed_host()))
    (tmp_path / "cdi").mkdir()
    api = FakeApiServer(tmp_path)
    driver = _driver(tmp_path, sysfs, api, [], health_resend=0.05)
    kubelet = FakeDraKubelet(str(_sockets(tmp_path) / "registry"))
    try:
        driver.step()
        kubelet.discover()
        stream = kubelet.watch_health()
        first, again = next(stream), next(stream)  # type: ignore[call-overload]
        generation = driver.health_generation
        for answer in (first, again):
            assert {d.device.device_name: d.health for d in answer.devices} == {
                f"gpu-0000-{bus}-00-0": health.HEALTHY for bus in ("03", "23", "43", "63", "83", "a3", "c3", "e3")}
        assert driver.health_generation == generation  # nothing changed between the two
        stream.cancel()  # type: ignore[attr-defined]
    finally:
        kubelet.close()
        driver.sockets.stop()
        api.close()
        shutil.rmtree(_sockets(tmp_path), ignore_errors=True)


def test_a_socket_removed_is_served_again(rig: Rig) -> None:
    rig.kubelet.discover()
    os.unlink(rig.driver.registration_path)
    rig.driver.step()
    kubelet = FakeDraKubelet(str(_sockets(rig.tmp) / "registry"))
    try:
        assert kubelet.discover().driver == DRIVER
    finally:
        kubelet.close()


def test_a_broken_checkpoint_stops_the_start_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "checkpoint.json").write_text("{not json")
    with pytest.raises(Exception, match=r"checkpoint .* cannot be read .*: the prepared claims are unknown"):
        Claims(Config(), DRIVER, NODE, str(tmp_path), str(tmp_path / "state"), None,
               lambda: (None, []), print, lambda: "v1")  # type: ignore[arg-type,return-value]


# --- the command ------------------------------------------------------------------------------------------------

def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env=env)


def test_list_prints_the_devices_as_published() -> None:
    done = _cli("dra", "--list", "--sysfs-root", str(HOSTS / "mi300x-2x-cpx" / "sys"))
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert len(listed) == 18 and [d["name"] for d in listed[:2]] == ["gpu-0000-05-00-0", "gpu-0000-05-00-0-p0"]
    assert listed[0]["consumesCounters"] == [{"counterSet": "gpu-0000-05-00-0",
                                              "counters": {"partitions": {"value": "8"}}}]
    done = _cli("dra", "--list", "--shared-counters", "off", "--sysfs-root", str(HOSTS / "mi300x-2x-cpx" / "sys"))
    listed = json.loads(done.stdout)
    assert len(listed) == 16 and listed[0]["name"] == "gpu-0000-05-00-0-p0" and "consumesCounters" not in listed[0]
    assert "  dra [--driver-name NAME]" in _cli("--help").stdout
    done = _cli("dra", "--driver-name", "Not_A_Name", "--node-name", "n")
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "expected a DNS subdomain" in done.stderr
    done = _cli("dra", env={"PATH": os.environ["PATH"]})
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "no node name" in done.stderr


def test_the_command_serves_the_kubelet_and_the_api_server(tmp_path: Path) -> None:
    sysfs = fakesysfs.build(str(tmp_path / "sys"), fakesysfs.seed_host())
    (tmp_path / "cdi").mkdir(mode=0o755)
    api = FakeApiServer(tmp_path)
    socks = _sockets(tmp_path)
    config = tmp_path / "config.toml"
    config.write_text(f'sysfs_root = "{sysfs}"\n')
    process = subprocess.Popen(
        [sys.executable, "-m", "oci_gpu_hook.entry.cli", "dra", "--node-name", NODE, "--no-uevents",
         "--kubelet-registry-dir", str(socks / "registry"), "--kubelet-plugins-dir", str(socks / "plugins"),
         "--cdi-dir", str(tmp_path / "cdi"), "--kube-api-server", api.url, "--kube-token-file", str(api.token_file),
         "--kube-ca-file", str(api.cert)], cwd=REPO, stderr=subprocess.PIPE, text=True,
        env={"PATH": os.environ["PATH"], "OCI_GPU_HOOK_CONFIG": str(config)})
    kubelet = FakeDraKubelet(str(socks / "registry"))
    try:
        kubelet.discover()
        api.add_claim("ml", "gpu", "uid-9", [{"request": "r", "driver": DRIVER, "pool": NODE,
                                              "device": "gpu-0000-e3-00-0"}])
        answer = kubelet.prepare(("ml", "gpu", "uid-9")).claims["uid-9"]  # type: ignore[attr-defined]
        assert answer.error == "" and list(answer.devices[0].cdi_device_ids) == [f"{KIND}=uid-9-gpu-0000-e3-00-0"]
        assert (tmp_path / "cdi" / f"k8s.{DRIVER}-claim_uid-9.json").exists()
        (published,) = api.slices()
        assert len(published["spec"]["devices"]) == 8
    finally:
        kubelet.close()
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=30)
        api.close()
        left = (socks / "registry" / f"{DRIVER}-reg.sock").exists()
        shutil.rmtree(socks, ignore_errors=True)
    assert process.returncode == 0, err
    assert "prepared claim ml/gpu (uid-9): gpu-0000-e3-00-0" in err
    assert not left, "the registration socket outlived the plugin"


# --- NVIDIA MIG (the fake NVML of tests/test_device_plugin_nvidia.py) ---------------------------------------------

def test_mig_devices_are_devices_with_their_profile_and_gpu(tmp_path: Path, fake_nvml: Path) -> None:
    from oci_gpu_hook.inventory import nvml

    base = mig_tree(tmp_path / "host")
    inventory = scan(str(base / "sys"), strict=False, proc_root=str(base / "proc"), driver_root=str(base / "driver"))
    devices, notes = dra_devices.build(inventory)
    assert notes == [], notes
    split = next(g for g in fakesysfs.nvidia_mig_host().nvidia if g.pci == MIG_GPU)
    migs = {d.name: d for d in devices if d.attributes["type"] == ("string", "mig")}
    assert sorted(migs) == sorted(dra_devices.device_name(u) for u in MIG_UUID.values())
    big = migs[dra_devices.device_name(MIG_UUID[(1, 0)])]
    assert big.attributes["migProfile"] == ("string", "3g.40gb")
    assert big.attributes["parent"] == ("string", split.uuid)
    assert big.attributes["uuid"] == ("string", MIG_UUID[(1, 0)])
    (whole,) = [d for d in devices if d.attributes.get("uuid") == ("string", split.uuid)]  # split: whole and parts
    assert whole.attributes["partitionCount"] == ("int", 4) and {d.stable for d in migs.values()} == {
        dra_devices.stable_name(p) for p in whole.parts}
    assert not any(d.attributes.get("partitionCount") for d in dra_devices.without_counters(devices))
    assert nvml.profile(big.device) == "3g.40gb"  # type: ignore[arg-type]


def test_a_host_that_cannot_be_read_refuses_the_claim_in_one_line(tmp_path: Path) -> None:
    api = FakeApiServer(tmp_path)
    logs: list[str] = []
    driver = _driver(tmp_path, tmp_path / "no-sys", api, logs)

    def broken(_root: object = None) -> object:
        raise OSError(5, "Input/output error")

    driver.scan = broken  # type: ignore[assignment]
    kubelet = FakeDraKubelet(str(_sockets(tmp_path) / "registry"))
    try:
        driver.step()
        kubelet.discover()
        api.add_claim("default", "c", "uid-c", [{"request": "r", "driver": DRIVER, "pool": NODE, "device": "gpu-x"}])
        error = kubelet.prepare(("default", "c", "uid-c")).claims["uid-c"].error  # type: ignore[attr-defined]
        assert error == "claim default/c: cannot read this node's devices: [Errno 5] Input/output error"
        assert "rescan (start) failed, no devices known yet: [Errno 5] Input/output error" in logs
    finally:
        kubelet.close()
        driver.sockets.stop()
        api.close()
        shutil.rmtree(_sockets(tmp_path), ignore_errors=True)


def test_a_claim_of_two_vendors_gets_each_kinds_shared_edits_once(tmp_path: Path) -> None:
    """The mixed example host (two AMD, two NVIDIA GPUs): one claim with one of each; its spec's own edits are
    /dev/kfd and the NVIDIA control nodes and driver files, each device entry its own nodes only."""
    host = HOSTS / "amd-nvidia-2x2"
    config = Config(sysfs_root=str(host / "sys"), proc_root=str(host / "proc"), driver_root=str(host / "driver"))
    inventory = scan(config.sysfs_root, strict=False, proc_root=config.proc_root, driver_root=config.driver_root)
    devices, _ = dra_devices.build(inventory)
    amd = next(d for d in devices if d.kind == "amd")
    nvidia = next(d for d in devices if d.kind == "nvidia")
    api = FakeApiServer(tmp_path)
    try:
        api.add_claim("default", "both", "uid-2", [{"request": "r", "driver": DRIVER, "pool": NODE, "device": d.name}
                                                   for d in (amd, nvidia)])
        client = Client(Credentials(api.url, str(api.token_file), str(api.cert)))
        (tmp_path / "cdi").mkdir(mode=0o755)
        claims = Claims(config, DRIVER, NODE, str(tmp_path / "cdi"), str(tmp_path / "state"), client,
                        lambda: (inventory, devices), lambda _line: None, lambda: "v1")
        prepared = claims.prepare("default", "both", "uid-2")
    finally:
        api.close()
    assert [p.device for p in prepared] == [amd.name, nvidia.name]
    spec = json.loads(Path(spec_file(str(tmp_path / "cdi"), DRIVER, "uid-2")).read_text())
    cdi.validate(spec, "the claim's spec")
    own = {d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in spec["devices"]}
    assert own == {f"uid-2-{d.name}": [n.path for n in d.device.all_nodes]  # type: ignore[union-attr]
                   for d in (amd, nvidia)}
    shared = [n["path"] for n in spec["containerEdits"]["deviceNodes"]]
    assert "/dev/kfd" in shared and "/dev/nvidiactl" in shared and len(shared) == len(set(shared))
    assert spec["containerEdits"]["mounts"]  # the NVIDIA driver's files


def test_an_nvidia_claim_without_the_drivers_files_is_refused_in_one_line(tmp_path: Path) -> None:
    """The plugin's container lacks the driver's user-space (driver_root): the claim's spec cannot be written."""
    host = HOSTS / "nvidia-4x-h100"
    config = Config(sysfs_root=str(host / "sys"), proc_root=str(host / "proc"), driver_root=str(tmp_path / "none"))
    inventory = scan(config.sysfs_root, strict=False, proc_root=config.proc_root, driver_root=config.driver_root)
    devices, _ = dra_devices.build(inventory)
    api = FakeApiServer(tmp_path)
    try:
        api.add_claim("default", "nv", "uid-n", [{"request": "r", "driver": DRIVER, "pool": NODE,
                                                  "device": devices[0].name}])
        client = Client(Credentials(api.url, str(api.token_file), str(api.cert)))
        (tmp_path / "cdi").mkdir(mode=0o755)
        claims = Claims(config, DRIVER, NODE, str(tmp_path / "cdi"), str(tmp_path / "state"), client,
                        lambda: (inventory, devices), lambda _line: None, lambda: "v1")
        with pytest.raises(ClaimError) as caught:
            claims.prepare("default", "nv", "uid-n")
    finally:
        api.close()
    message = str(caught.value)
    assert message.startswith("claim default/nv: ") and "\n" not in message
    assert str(tmp_path / "none") in message, message
    assert not Path(spec_file(str(tmp_path / "cdi"), DRIVER, "uid-n")).exists()
