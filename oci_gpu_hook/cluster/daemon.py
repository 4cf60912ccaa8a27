"""What the resident operator processes (``device-plugin``, ``dra``) share from start-up to exit: the one-line log,
the seconds option, the GPU uevent listener, the loop of steps with its rescan and its wait, the signals that end it.

A resident process is a :class:`Resident`: its ``step()`` does one round of its
work (:meth:`Resident.rescan_due` says when a rescan of the host is due, and
why: at start, every ``rescan_interval`` seconds, soon after a GPU uevent), and
:meth:`Resident.run` steps until :meth:`Resident.stop`, sleeping
``poll_interval`` between steps in :func:`wait_for_rescan`.  Its command starts
the uevent listener with :func:`uevents` and runs it with :func:`serve`, which
turns SIGTERM and SIGINT into :meth:`Resident.stop` and closes the listener on
the way out.  Every line a resident process says goes through a
:func:`log_writer`: a UTC timestamp, the program, the message on one line.
With ``--metrics-address`` it also serves its :meth:`Resident.rows` and :meth:`Resident.gauges` to Prometheus
(:func:`metrics_endpoint`, :mod:`oci_gpu_hook.cluster.metrics`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from oci_gpu_hook.cluster.watch import RESYNC, EventSource, gpu_uevent
from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from oci_gpu_hook.cluster.metrics import DeviceRow, Endpoint

Log = Callable[[str], None]


def log_writer(program: str) -> Log:
    """A log function: ``2026-12-01T21:42:30.123Z <program>: <message, whitespace runs as one space>`` on stderr."""

    def log_line(message: str) -> None:
        now = time.time()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
        sys.stderr.write(f"{stamp} {program}: {' '.join(message.split())}\n")
        sys.stderr.flush()

    return log_line


def seconds(text: str, what: str, low: float, high: float) -> float:
    """An option's seconds (``--rescan-interval 10``), from ``low`` to ``high``; else the one line saying so."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not low <= value <= high:
        raise HookError(f"{what} {text!r}: expected seconds, {low:g} to {high:g}")
    return value


def uevents(enabled: bool, interval: float, log: Log) -> EventSource | None:
    """The kernel's uevents, listening (None when not ``enabled``, or when they cannot be had: then said in one
    line, and the process rescans every ``interval`` seconds only)."""
    if not enabled:
        return None
    from oci_gpu_hook.cluster.watch import KernelUevents

    events = KernelUevents()
    try:
        events.start()
    except HookError as err:  # e.g. no netlink here: the periodic rescan still notices everything
        log(f"{err}; rescanning every {interval:g} s only")
        events.close()
        return None
    return events


def wait_for_rescan(events: EventSource | None, seconds: float, stopping: Callable[[], bool], delay: float,
                    next_rescan: float, reason: str,
                    observe: Callable[[Mapping[str, Any]], object] | None = None) -> tuple[float, str]:
    """A resident process's sleep between its steps: ``seconds``, 0.1 s at a time while not ``stopping()``; each
    GPU uevent (or resync) brings the next rescan (``next_rescan``, monotonic) forward to ``delay`` after it, a
    quiet moment, so a burst makes one rescan, and is given to ``observe`` first (the health monitor: a
    ``WEDGED=`` uevent).  The next rescan and its reason."""
    deadline = time.monotonic() + seconds
    while not stopping():
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if events is None:
            time.sleep(min(0.1, left))
            continue
        event = events.poll(min(0.1, left))
        if event is None or not (RESYNC in event or gpu_uevent(event)):
            continue
        if observe is not None and RESYNC not in event:
            observe(event)
        soon = time.monotonic() + delay
        if soon < next_rescan:
            next_rescan = soon
            name = event.get("DEVNAME") or event.get("DEVPATH") or ""
            reason = f"uevent {event.get('ACTION', 'resync')} {event.get('SUBSYSTEM', '')} {name}"
    return next_rescan, reason


class Resident:
    """The loop of a resident process.  A subclass sets these in its ``__init__`` and defines :meth:`step`,
    :meth:`started` (its first log line) and :meth:`close` (what ends with the loop)."""

    log: Log
    events: EventSource | None  # GPU uevents: a rescan soon after each
    uevent_delay: float
    rescan_interval: float
    poll_interval: float
    next_rescan: float  # monotonic
    rescan_reason: str  # what the next rescan is for (said in its log lines)
    stopping: bool

    def step(self) -> None:
        raise NotImplementedError

    def started(self) -> str:
        raise NotImplementedError

    def close(self) -> None:
        """Stop serving (after the last step)."""

    def observe(self, event: Mapping[str, Any]) -> object:
        """A GPU uevent, as it comes (before the rescan it brings forward): the health monitor's."""
        return None

    def rows(self) -> list[DeviceRow]:
        """Every device the process knows, as its metrics show them."""
        return []

    def gauges(self) -> dict[str, tuple[str, float]]:
        """The process's own gauges: name -> (help, value)."""
        return {}

    def rescan_due(self) -> str | None:
        """The reason of the rescan that is due now (then the next is ``rescan_interval`` from now), else None."""
        now = time.monotonic()
        if now < self.next_rescan:
            return None
        reason = self.rescan_reason
        self.rescan_reason = "rescan"
        self.next_rescan = now + self.rescan_interval
        return reason

    def run(self) -> int:
        self.log(self.started())
        try:
            while not self.stopping:
                self.step()
                self._wait(self.poll_interval)
        finally:
            self.close()
        return 0

    def _wait(self, seconds: float) -> None:
        """Sleep until the next step; a GPU's uevent brings the next rescan forward."""
        self.next_rescan, self.rescan_reason = wait_for_rescan(
            self.events, seconds, lambda: self.stopping, self.uevent_delay, self.next_rescan, self.rescan_reason,
            self.observe)

    def stop(self) -> None:
        """End :meth:`run` within 0.1 s; safe to call from a signal handler (a flag, no lock)."""
        self.stopping = True


def metrics_endpoint(address: str | None, process: Resident) -> Endpoint | None:
    """The process's Prometheus endpoint at ``address`` (None: none); its first line says where."""
    if address is None:
        return None
    from oci_gpu_hook.cluster.metrics import Collector, Endpoint

    endpoint = Endpoint(address, Collector(process.rows, process.gauges))
    process.log(f"metrics at http://{endpoint.address}/metrics")
    return endpoint


def serve(process: Resident, events: EventSource | None, metrics_address: str | None = None) -> int:
    """Run ``process`` until SIGTERM or SIGINT (the handlers before are put back after), with its metrics at
    ``metrics_address`` (None: none), then close ``events`` and the metrics endpoint."""
    import signal

    try:
        metrics = metrics_endpoint(metrics_address, process)
    except HookError:
        if events is not None:
            events.close()
        raise

    def on_signal(number: int, _frame: object) -> None:
        process.stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return process.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if events is not None:
            events.close()
        if metrics is not None:
            metrics.close()
