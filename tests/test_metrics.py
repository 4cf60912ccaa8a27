"""The resident processes' optional Prometheus endpoint (oci_gpu_hook/cluster/metrics.py): scraped over HTTP and parsed
with prometheus_client's own parser, its numbers checked against what the test did to a fake host (a GPU failing,
one gone, a claim prepared); the command's option, and its one-line refusal of a bad address."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from oci_gpu_hook.cluster.deviceplugin import server
from oci_gpu_hook.cluster.metrics import Collector, Endpoint, parse_address
from oci_gpu_hook.errors import HookError
from tests.helpers import fakesysfs
from tests.helpers.fakedrakubelet import FakeDraKubelet
from tests.test_dra import DRIVER, NODE, _sockets
from tests.test_health import Clock, Dra, _monitor, _seed, _wedged

prometheus = pytest.importorskip("prometheus_client")  # the test extra has it; a bare install may not

REPO = Path(__file__).resolve().parent.parent
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """Every sample at ``url``, by (name, sorted labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def devices(samples: Samples) -> dict[tuple[str, ...], float]:
    """``oci_gpu_hook_devices`` by (vendor, type, state, health)."""
    return {tuple(dict(labels)[k] for k in ("vendor", "type", "state", "health")): value
            for (name, labels), value in samples.items() if name == "oci_gpu_hook_devices"}


def healthy(samples: Samples) -> dict[str, tuple[float, str]]:
    """``oci_gpu_hook_device_healthy`` by device: (value, signal)."""
    return {dict(labels)["device"]: (value, dict(labels)["signal"])
            for (name, labels), value in samples.items() if name == "oci_gpu_hook_device_healthy"}


@pytest.fixture
def tracked(tmp_path: Path) -> Iterator[tuple[Path, fakesysfs.FakeHost, server.Tracker, str]]:
    sysfs, host = _seed(tmp_path)
    tracker = server.Tracker(str(sysfs), "single", log=lambda _line: None, monitor=_monitor(Clock()))
    manager = server.Manager(str(tmp_path / "device-plugins"), tracker, log=lambda _line: None)
    endpoint = Endpoint("127.0.0.1:0", Collector(manager.rows, manager.gauges))
    try:
        tracker.rescan("start")
        yield sysfs, host, tracker, f"http://127.0.0.1:{endpoint.port}/metrics"
    finally:
        endpoint.close()


def test_the_device_plugins_metrics_follow_its_devices(tracked: tuple) -> None:  # type: ignore[type-arg]
    sysfs, host, tracker, url = tracked
    first = scrape(url)
    assert devices(first) == {("amd", "gpu", "advertised", "Healthy"): 8}
    assert healthy(first)["0000:23:00.0"] == (1, "")
    fakesysfs.set_ras(str(sysfs), host, "0000:23:00.0", ue={"umc": 1})  # no RAS directory before: a first read
    fakesysfs.remove_gpu(str(sysfs), host, "0000:e3:00.0")
    tracker.rescan("test")
    second = scrape(url)
    assert devices(second) == {("amd", "gpu", "advertised", "Healthy"): 6,
                               ("amd", "gpu", "advertised", "Unhealthy"): 1, ("amd", "gpu", "gone", "Unhealthy"): 1}
    assert healthy(second)["0000:23:00.0"] == (0, "ras-uncorrectable")
    assert healthy(second)["0000:e3:00.0"] == (0, "gone")


def test_the_dra_drivers_metrics_count_prepared_claims_and_unhealthy_devices(tmp_path: Path) -> None:
    rig = Dra(tmp_path, fakesysfs.seed_host(), Clock())
    endpoint = Endpoint("127.0.0.1:0", Collector(rig.driver.rows, rig.driver.gauges))  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:{endpoint.port}/metrics"
    kubelet = FakeDraKubelet(str(_sockets(tmp_path) / "registry"))
    try:
        assert devices(scrape(url)) == {("amd", "gpu", "published", "Healthy"): 8}
        assert scrape(url)[("oci_gpu_hook_dra_prepared_claims", ())] == 0
        rig.api.add_claim("default", "c", "uid-1", [{"request": "gpu", "driver": DRIVER, "pool": NODE,
                                                    "device": "gpu-0000-43-00-0"}])
        kubelet.discover()
        assert kubelet.prepare(("default", "c", "uid-1")).claims["uid-1"].error == ""  # type: ignore[attr-defined]
        rig.driver.observe(_wedged("0000:43:00.0"))  # type: ignore[attr-defined]
        rig.driver.step()  # type: ignore[attr-defined]
        samples = scrape(url)
        assert samples[("oci_gpu_hook_dra_prepared_claims", ())] == 1
        assert devices(samples) == {("amd", "gpu", "published", "Healthy"): 7,
                                    ("amd", "gpu", "prepared", "Unhealthy"): 1}
        assert healthy(samples)["gpu-0000-43-00-0"] == (0, "wedged")
    finally:
        kubelet.close()
        endpoint.close()
        rig.close()


def test_an_address_is_host_and_port_and_every_address_only_when_written_out() -> None:
    assert parse_address("127.0.0.1:9400") == ("127.0.0.1", 9400)
    assert parse_address(":9400") == ("127.0.0.1", 9400)  # loopback: every address only when written out
    assert parse_address("0.0.0.0:9400") == ("0.0.0.0", 9400)
    assert parse_address("[::]:9400") == ("::", 9400)
    assert parse_address("[::1]:9400") == ("::1", 9400)
    for bad in ("9400", "host:", "host:http", "host:70000"):
        with pytest.raises(HookError, match="expected HOST:PORT"):
            parse_address(bad)


def test_the_endpoint_listens_where_the_address_says_and_calls_before_serving_first() -> None:
    """``:0`` listens on loopback alone, ``0.0.0.0:0`` on every IPv4 address (the kernel's own answer, its socket's
    name); ``before_serving`` runs with no serving thread yet, and its refusal closes the socket."""
    import threading

    threads: list[int] = []
    endpoint = Endpoint(":0", Collector(lambda: []), before_serving=lambda _registry: threads.append(
        threading.active_count()))
    try:
        assert endpoint.server.socket.getsockname()[0] == "127.0.0.1" and endpoint.address.startswith("127.0.0.1:")
        assert threads == [threading.active_count() - 1]  # the serving thread came after it
        assert devices(scrape(f"http://{endpoint.address}/metrics")) == {}
    finally:
        endpoint.close()
    every = Endpoint("0.0.0.0:0", Collector(lambda: []))
    try:
        assert every.server.socket.getsockname()[0] == "0.0.0.0"
    finally:
        every.close()

    def refuse(_registry: object) -> None:
        raise HookError("no")

    with pytest.raises(HookError, match="no"):
        Endpoint("127.0.0.1:0", Collector(lambda: []), before_serving=refuse)


def _line(stream: object, wanted: str, timeout: float = 30.0) -> str:
    """The first line of ``stream`` (a process's stderr) that contains ``wanted``, waiting at most ``timeout``."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], 0.5)
        if ready:
            line = stream.readline()  # type: ignore[attr-defined]
            if not line:
                break
            seen.append(line)
            if wanted in line:
                return str(line)
    raise AssertionError(f"no line with {wanted!r} within {timeout} s: {seen}")


def test_the_command_serves_metrics_and_refuses_a_bad_address_in_one_line(tmp_path: Path) -> None:
    sysfs, _host = _seed(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "OCI_GPU_HOOK_CONFIG": "/dev/null"}
    base = [sys.executable, "-m", "oci_gpu_hook.entry.cli", "--sysfs-root", str(sysfs), "device-plugin",
            "--kubelet-dir", str(tmp_path / "device-plugins"), "--no-uevents", "--no-cdi-specs"]
    done = subprocess.run([*base, "--metrics-address", "nowhere"], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env=env)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "expected HOST:PORT" in done.stderr
    process = subprocess.Popen([*base, "--metrics-address", "127.0.0.1:0"], cwd=REPO, env=env, text=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        line = _line(process.stderr, "metrics at http://")
        url = line.split("metrics at ", 1)[1].strip()
        _line(process.stderr, "waiting for the kubelet's socket")  # the first step (and its rescan) is done
        assert devices(scrape(url)) == {("amd", "gpu", "advertised", "Healthy"): 8}
    finally:
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "Traceback" not in err
    shutil.rmtree(tmp_path / "device-plugins", ignore_errors=True)
    assert os.path.isdir(sysfs)
