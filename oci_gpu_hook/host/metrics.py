"""An optional Prometheus endpoint of a resident process (``device-plugin``, ``dra``: ``--metrics-address``).

The numbers are read from the process's own state at each scrape (a collector, no second copy of it to keep in
step): every device it knows, by vendor, type, state and health, each device's health with its signal, and what
the process adds (the DRA driver: its prepared claims).  The exposition is ``prometheus_client``'s (a well-kept,
dependency-free package: text and OpenMetrics formats, escaping, content negotiation), imported only when an
address is given; docs/health.md#metrics has the names, labels and example alerts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from oci_gpu_hook.errors import HookError

DEVICES = "oci_gpu_hook_devices"
DEVICE_HEALTHY = "oci_gpu_hook_device_healthy"
HEALTH_VALUES = ("Healthy", "Unhealthy")


@dataclass(frozen=True)
class DeviceRow:
    """One device as the metrics show it."""

    name: str  # the device plugin's device ID, the DRA device name
    vendor: str  # amd, intel, nvidia
    type: str  # gpu, partition, mig
    state: str  # device plugin: advertised, gone; DRA: published, prepared, gone
    healthy: bool
    signal: str = ""  # while Unhealthy: the health signal, or "gone"


Gauges = Callable[[], dict[str, tuple[str, float]]]  # name -> (help, value)


class Collector:
    """A ``prometheus_client`` collector over a resident process's devices (and its own gauges)."""

    def __init__(self, devices: Callable[[], Iterable[DeviceRow]], gauges: Gauges | None = None) -> None:
        self.devices = devices
        self.gauges = gauges

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        rows = sorted(self.devices(), key=lambda r: r.name)
        counts = Counter((r.vendor, r.type, r.state, HEALTH_VALUES[not r.healthy]) for r in rows)
        devices = GaugeMetricFamily(DEVICES, "Devices this process knows, by vendor, type, state and health.",
                                    labels=["vendor", "type", "state", "health"])
        for labels, count in sorted(counts.items()):
            devices.add_metric(list(labels), count)
        yield devices
        healthy = GaugeMetricFamily(DEVICE_HEALTHY, "1 while the device is Healthy, 0 while not (signal: why).",
                                    labels=["device", "vendor", "type", "signal"])
        for row in rows:
            healthy.add_metric([row.name, row.vendor, row.type, "" if row.healthy else row.signal],
                               1 if row.healthy else 0)
        yield healthy
        for name, (text, value) in sorted((self.gauges() if self.gauges else {}).items()):
            yield GaugeMetricFamily(name, text, value=value)


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT`` or ``:PORT`` (every address) as (host, port); else the one line saying so."""
    host, colon, port = text.rpartition(":")
    host = host.strip("[]")
    if not colon or not port.isdigit() or not port.isascii() or not 0 <= int(port) <= 65535:
        raise HookError(f"--metrics-address {text!r}: expected HOST:PORT (127.0.0.1:9400, :9400 for every address)")
    return host or "0.0.0.0", int(port)


class Endpoint:
    """The HTTP server of ``/metrics``, serving in a thread of its own until :meth:`close`."""

    def __init__(self, address: str, collector: Collector) -> None:
        host, port = parse_address(address)
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError as err:
            raise HookError(f"--metrics-address needs prometheus_client ({err}): "
                            "pip install 'oci-gpu-hook[device-plugin]'") from None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)  # type: ignore[arg-type]
        try:
            self.server, self.thread = start_http_server(port, host, registry)
        except OSError as err:
            raise HookError(f"--metrics-address {address}: cannot listen there: {err.strerror}") from None
        self.port = int(self.server.server_address[1])
        self.address = f"{host}:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
