"""An optional Prometheus endpoint of a resident process (``device-plugin``, ``dra``, ``serve``:
``--metrics-address``), and every metric's name and label values (here alone).

The numbers are read from the process's own state at each scrape (a collector, no second copy of it to keep in
step): every device it knows, by vendor, type, state and health, each device's health with its signal, and what
the process adds (the DRA driver: its prepared claims; the planner: the container starts it answered, by path,
outcome and reason, and its answer time, :class:`StartCounts`).  The exposition is ``prometheus_client``'s (a
well-kept, dependency-free package: text and OpenMetrics formats, escaping, content negotiation), imported only
when an address is given; docs/health.md#metrics has the names, labels and example alerts.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from oci_gpu_hook.errors import HookError

DEVICES = "oci_gpu_hook_devices"
DEVICE_HEALTHY = "oci_gpu_hook_device_healthy"
HEALTH_VALUES = ("Healthy", "Unhealthy")
DRA_PREPARED_CLAIMS = "oci_gpu_hook_dra_prepared_claims"
PLANNER_STARTS = "oci_gpu_hook_planner_starts"  # a counter: exposed as ..._total
PLANNER_ANSWER = "oci_gpu_hook_planner_answer_seconds"  # a histogram

# The planner's label values, each a closed set (never free text: a label value is a time series of its own).
# path: how the request reached the planner (the launcher's role and hook command).
PATHS = ("shim", "precreate", "prestart", "createRuntime", "unknown")
# outcome: granted (GPUs given), ignored (asked, and the config or the host ignores the ask: allow_env_requests,
# annotations won, `all` of a kind the host lacks), untouched (asked for nothing), refused (the one error line,
# the container does not start), handed-back (the planner did not serve it: the front ran Python, same outcome).
OUTCOMES = ("granted", "ignored", "untouched", "refused", "handed-back")
# reason, of a refusal: the part of the tool that refused (the module the error was raised in, REFUSED_IN);
# internal: not a HookError (a bug); planner: the planner failed after it began (the front says so, status 1).
REFUSAL_REASONS = ("request", "config", "spec", "host", "apply", "runtime", "internal", "planner", "other")
REFUSED_IN = (  # (module prefix, reason): the first that matches the innermost frame's module
    ("oci_gpu_hook.request", "request"), ("oci_gpu_hook.plan", "request"),
    ("oci_gpu_hook.config", "config"), ("oci_gpu_hook.tomlsubset", "config"), ("oci_gpu_hook.trust", "config"),
    ("oci_gpu_hook.oci_spec", "spec"), ("oci_gpu_hook.oci_state", "spec"), ("oci_gpu_hook.oci_argv", "spec"),
    ("oci_gpu_hook.fastjson", "spec"), ("oci_gpu_hook.core.devices", "spec"),
    ("oci_gpu_hook.inventory", "host"),
    ("oci_gpu_hook.appliers", "apply"), ("oci_gpu_hook.core", "apply"), ("oci_gpu_hook.atomic", "apply"),
    ("oci_gpu_hook.entry.runtime", "runtime"),
)
# reason, of a hand-back: the check the request did not pass (planner/worker.py serve_one's stages).
HANDED_BACK_REASONS = ("malformed", "version", "stale", "credentials", "namespace", "environment", "gave-up",
                       "not-root")
LOOPBACK = "127.0.0.1"  # what ``:PORT`` listens on: every address only when written out (0.0.0.0, ::)
ANSWER_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)  # the front waits 2 s at most


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


def refusal_reason(err: BaseException | None) -> str:
    """The :data:`REFUSAL_REASONS` label of a refusal: where in the tool ``err`` was raised (:data:`REFUSED_IN`,
    by the module of its innermost frame), ``internal`` for an error that is not a HookError, ``other`` for
    anything else (None: a non-zero status without an error seen)."""
    if err is None:
        return "other"
    if not isinstance(err, HookError):
        return "internal"
    module, frame = "", err.__traceback__
    while frame is not None:
        module = str(frame.tb_frame.f_globals.get("__name__", ""))
        frame = frame.tb_next
    for prefix, reason in REFUSED_IN:
        if module == prefix or module.startswith(prefix + "."):
            return reason
    return "other"


def start_line(path: str, outcome: str, reason: str, seconds: float | None) -> bytes:
    """What a planner worker tells the metrics process of one request (one datagram; ``seconds`` None: not
    answered, no answer time)."""
    return f"{path} {outcome} {reason or '-'} {'-' if seconds is None else f'{seconds:.9f}'}".encode()


class StartCounts:
    """The planner's container starts by (path, outcome, reason) and its answer times by path, as its workers
    report them (:func:`start_line` datagrams on ``sock``).  The datagrams are taken under one lock, by the
    metrics process's loop (:meth:`take` every half second) and by each scrape before it counts: a worker sends
    before it answers, so a scrape after a start's answer always counts that start."""

    def __init__(self, sock: Any = None) -> None:
        self.sock = sock  # a non-blocking datagram socket
        self.lock = threading.Lock()
        self.starts: Counter[tuple[str, str, str]] = Counter()
        self.answers: dict[str, list[int]] = {}  # path -> answers per bucket of ANSWER_BUCKETS, then above them
        self.sums: dict[str, float] = {}
        self.dropped = 0  # datagrams that were not a start line of this version

    def add(self, line: bytes) -> bool:
        """Count one :func:`start_line`; False (and nothing counted) for anything else."""
        words = line.decode("ascii", "replace").split(" ")
        if len(words) != 4:
            return False
        path, outcome, reason, seconds = words
        reason = "" if reason == "-" else reason
        allowed = {"refused": REFUSAL_REASONS, "handed-back": HANDED_BACK_REASONS}.get(outcome, ("",))
        if path not in PATHS or outcome not in OUTCOMES or reason not in allowed:
            return False
        if seconds != "-":
            try:
                value = float(seconds)
            except ValueError:
                return False
            if not 0 <= value < float("inf"):
                return False
            counts = self.answers.setdefault(path, [0] * (len(ANSWER_BUCKETS) + 1))
            counts[next((n for n, le in enumerate(ANSWER_BUCKETS) if value <= le), len(ANSWER_BUCKETS))] += 1
            self.sums[path] = self.sums.get(path, 0.0) + value
        self.starts[(path, outcome, reason)] += 1
        return True

    def take(self) -> int:
        """Count every datagram waiting on the socket; how many."""
        taken = 0
        with self.lock:
            while self.sock is not None:
                try:
                    line = self.sock.recv(256)
                except (BlockingIOError, InterruptedError):
                    break
                taken += 1
                if not self.add(line):
                    self.dropped += 1
        return taken

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
        from prometheus_client.utils import floatToGoString

        self.take()
        with self.lock:
            starts = sorted(self.starts.items())
            answers = {path: (list(counts), self.sums[path]) for path, counts in self.answers.items()}
        family = CounterMetricFamily(PLANNER_STARTS, "Container starts the planner was asked for, by path, outcome "
                                     "and (refused, handed-back) reason.", labels=["path", "outcome", "reason"])
        for labels, count in starts:
            family.add_metric(list(labels), count)
        yield family
        histogram = HistogramMetricFamily(PLANNER_ANSWER, "The planner's time from a request's accept to its "
                                          "answer, by path (requests it answered).", labels=["path"])
        for path, (counts, total) in sorted(answers.items()):
            cumulative, buckets = 0, []
            for le, count in zip([*ANSWER_BUCKETS, float("inf")], counts, strict=True):
                cumulative += count
                buckets.append((floatToGoString(le), cumulative))
            histogram.add_metric([path], buckets, total)
        yield histogram


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT`` or ``:PORT`` (loopback: 127.0.0.1) as (host, port); else the one line saying so.
    Every address only when written out: ``0.0.0.0:PORT``, ``[::]:PORT``."""
    host, colon, port = text.rpartition(":")
    host = host.strip("[]")
    if not colon or not port.isdigit() or not port.isascii() or not 0 <= int(port) <= 65535:
        raise HookError(f"--metrics-address {text!r}: expected HOST:PORT (127.0.0.1:9400; :9400 is loopback, "
                        "0.0.0.0:9400 or [::]:9400 every address)")
    return host or LOOPBACK, int(port)


class Endpoint:
    """The HTTP server of ``/metrics``, serving in a thread of its own until :meth:`close`.

    ``before_serving``: called with the registry once the socket is bound and before any thread starts (a process
    that drops its privileges there drops them for the threads that serve too: capabilities and no-new-privs are per
    thread); a HookError from it closes the socket and is raised."""

    def __init__(self, address: str, *collectors: Any, before_serving: Callable[[Any], None] | None = None) -> None:
        import socket
        import socketserver
        from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

        host, port = parse_address(address)
        try:
            from prometheus_client import CollectorRegistry, make_wsgi_app
        except ImportError as err:
            raise HookError(f"--metrics-address needs prometheus_client ({err}): "
                            "pip install 'oci-gpu-hook[device-plugin]'") from None
        self.registry = CollectorRegistry(auto_describe=False)
        for collector in collectors:
            self.registry.register(collector)
        try:  # the family of the address (IPv4, IPv6, a name), as prometheus_client's own server finds it
            family, *_rest, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
        except (OSError, UnicodeError) as err:
            raise HookError(f"--metrics-address {address}: no such address: {err}") from None

        class Server(socketserver.ThreadingMixIn, WSGIServer):
            address_family = family
            daemon_threads = True

        class Quiet(WSGIRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass  # one line per scrape is not the journal's business

        try:
            self.server = make_server(str(sockaddr[0]), port, make_wsgi_app(self.registry), Server, Quiet)
        except OSError as err:
            raise HookError(f"--metrics-address {address}: cannot listen there: {err.strerror}") from None
        self.port = int(self.server.server_address[1])
        self.host = str(self.server.server_address[0])
        self.address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        if before_serving is not None:
            try:
                before_serving(self.registry)
            except BaseException:
                self.server.server_close()
                raise
        self.thread = threading.Thread(target=self.server.serve_forever, name="metrics", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
