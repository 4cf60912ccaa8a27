"""This node's ResourceSlices: the published devices as ``resource.k8s.io`` objects, kept in line with the host.

One pool per node, named after the node, with the node as ``spec.nodeName``;
at most 128 devices a slice (the API's limit), so one slice on any real node
(``<node>-<driver>-0``; more only past 128 devices).  The API version is the
newest the server offers of ``v1`` (Kubernetes 1.34+), ``v1beta2`` (1.33) and
``v1beta1`` (1.32; its devices wrap attributes and capacity in ``basic``).

Shared counters (KEP-4815, partitionable devices: the ``DRAPartitionableDevices``
feature gate, alpha in 1.33 to 1.35, beta and on by default from 1.36): a split
GPU is published as its whole and its parts, all consuming the GPU's counter set
(:mod:`.devices`), in the layout the server's minor version wants
(:func:`layout`): from 1.35 the counter sets in slices of their own
(``sharedCounters`` and ``devices`` exclude each other; at most 8 sets a slice),
in 1.33 and 1.34 in the slice of the devices that consume them (a GPU's devices
kept in one slice); devices that consume counters at most 64 a slice.  Where the
server is older than 1.33, does not say its version, or drops the fields it
was given (the gate is off: an API server drops a disabled feature's fields on
write, so the answer to the first write says it), or ``--shared-counters off``,
the slices are those of :func:`~.devices.without_counters`: a split GPU as its
parts only, which needs no counters to stay correct.

:meth:`Publisher.sync` lists the node's slices of the driver and, unless they
are exactly what this process wrote last (names and resourceVersions) for the
same devices, writes them all again with the pool's generation one above the
highest it saw (the scheduler then ignores any slice of an older generation),
and deletes the slices of the pool that are no longer wanted.  A node without
devices has no slices.  Each slice is owned by the Node object (when it can be
read), so it goes when the node does.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from oci_gpu_hook.cluster.dra.devices import CounterSet, DraDevice, counter_sets, without_counters
from oci_gpu_hook.cluster.dra.kube import ApiError, Client

GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta2", "v1beta1")  # newest first
MAX_DEVICES = 128
MAX_COUNTED_DEVICES = 64  # devices a slice where any consumes counters or has taints
MAX_COUNTER_SETS = 8  # a slice
SPLIT, SAME = "split", "same"  # the counter sets' layouts: slices of their own (1.35+), the devices' slice (1.33, 1.34)

Log = Callable[[str], None]


def choose_version(client: Client, wanted: str | None = None) -> str:
    """The ResourceSlice API version to use: ``wanted`` when the server offers it, else the newest it offers."""
    group = client.get(f"/apis/{GROUP}")
    offered = [v.get("version") for v in group.get("versions", []) if isinstance(v, dict)]
    if wanted:
        if wanted not in offered:
            raise ApiError(f"the API server offers {GROUP} {', '.join(map(str, offered)) or 'in no version'}, "
                           f"not {wanted}")
        return wanted
    for version in VERSIONS:
        if version in offered:
            return version
    raise ApiError(f"the API server offers {GROUP} only in {', '.join(map(str, offered)) or 'no version'} (this "
                   f"driver speaks {', '.join(VERSIONS)}: Kubernetes 1.32 or later, DynamicResourceAllocation on)")


def _counters(counters: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    return {name: {"value": value} for name, value in counters}


def device_object(device: DraDevice, version: str, taints: bool = False) -> dict[str, Any]:
    """The device as the slice has it; ``taints``: with its taint (where the server keeps them)."""
    attributes = {name: {kind: value} for name, (kind, value) in sorted(device.attributes.items())}
    body: dict[str, Any] = {"attributes": attributes}
    if device.capacity:
        body["capacity"] = {name: {"value": value} for name, value in sorted(device.capacity.items())}
    if device.consumes:
        body["consumesCounters"] = [{"counterSet": name, "counters": _counters(counters)}
                                    for name, counters in device.consumes]
    if taints and device.taint is not None:
        taint = device.taint
        body["taints"] = [{"key": taint.key, "value": taint.value, "effect": taint.effect,
                           "timeAdded": taint.time_added}]
    if version == "v1beta1":
        return {"name": device.name, "basic": body}
    return {"name": device.name, **body}


def counter_set_object(counter_set: CounterSet) -> dict[str, Any]:
    return {"name": counter_set.name, "counters": _counters(counter_set.counters)}


def layout(kubernetes: tuple[int, int] | None) -> str | None:
    """Where the counter sets go for a server of that (major, minor) version; None: it keeps no counters."""
    if kubernetes is None or kubernetes < (1, 33):
        return None
    return SPLIT if kubernetes >= (1, 35) else SAME


def server_version(client: Client) -> tuple[int, int] | None:
    """The API server's (major, minor) from ``/version`` (``"minor": "35+"`` is 35); None when it does not say."""
    try:
        answer = client.get("/version")
    except ApiError as err:
        if err.status in (403, 404):  # not said (an away server is raised: asked again at the next sync)
            return None
        raise
    major, minor = (re.match(r"\d+", str(answer.get(key, ""))) for key in ("major", "minor"))
    return (int(major.group()), int(minor.group())) if major and minor else None


def _chunks(devices: list[DraDevice], how: str | None, taints: bool = False
            ) -> list[tuple[list[DraDevice], list[CounterSet]]]:
    """The slices' contents: (devices, counter sets) each."""
    tainted = taints and any(d.taint is not None for d in devices)
    if how is None:
        devices = without_counters(devices)
        size = MAX_COUNTED_DEVICES if tainted else MAX_DEVICES
        return [(devices[i:i + size], []) for i in range(0, len(devices), size)]
    sets = counter_sets(devices)
    if how == SPLIT:
        size = MAX_COUNTED_DEVICES if tainted or any(d.consumes for d in devices) else MAX_DEVICES
        return [(devices[i:i + size], []) for i in range(0, len(devices), size)] + [
            ([], sets[i:i + MAX_COUNTER_SETS]) for i in range(0, len(sets), MAX_COUNTER_SETS)]
    groups: dict[str, list[DraDevice]] = {}  # SAME: a counter set's devices stay together, with the set
    for device in devices:
        groups.setdefault(device.consumes[0][0] if device.consumes else f"/{device.name}", []).append(device)
    by_name = {c.name: c for c in sets}
    out: list[tuple[list[DraDevice], list[CounterSet]]] = []
    for key, group in groups.items():
        counted = by_name.get(key)
        if not out or len(out[-1][0]) + len(group) > MAX_COUNTED_DEVICES or (
                counted is not None and len(out[-1][1]) >= MAX_COUNTER_SETS):
            out.append(([], []))
        out[-1][0].extend(group)
        if counted is not None:
            out[-1][1].append(counted)
    return out


def slice_name(node: str, driver: str, index: int) -> str:
    """A DNS subdomain: ``<node>-<driver>-<index>`` (lower-cased, other characters as ``-``)."""
    base = re.sub(r"[^a-z0-9.-]", "-", f"{node}-{driver}".lower()).strip("-.")
    return f"{base[:240]}-{index}"


def slice_objects(devices: list[DraDevice], driver: str, node: str, generation: int, version: str,
                  owner: dict[str, Any] | None = None, counters: str | None = None,
                  taints: bool = False) -> list[dict[str, Any]]:
    """The pool's slices for ``devices``; ``counters``: the counter sets' layout (:func:`layout`), None for none;
    ``taints``: with the devices' taints."""
    chunks = _chunks(devices, counters, taints)
    out = []
    for index, (chunk, sets) in enumerate(chunks):
        metadata: dict[str, Any] = {"name": slice_name(node, driver, index)}
        if owner is not None:
            metadata["ownerReferences"] = [owner]
        spec: dict[str, Any] = {"driver": driver, "nodeName": node,
                                "pool": {"name": node, "generation": generation, "resourceSliceCount": len(chunks)}}
        if sets:
            spec["sharedCounters"] = [counter_set_object(c) for c in sets]
        if chunk or not sets:
            spec["devices"] = [device_object(d, version, taints) for d in chunk]
        out.append({"apiVersion": f"{GROUP}/{version}", "kind": "ResourceSlice", "metadata": metadata, "spec": spec})
    return out


def taints_kept(kubernetes: tuple[int, int] | None) -> bool:
    """Whether a server of that (major, minor) version may keep device taints (1.33 and later, where the
    DRADeviceTaints gate exists: alpha, off by default, in 1.33 to 1.35; beta from 1.36).  Whether the gate is on
    shows only in the answer to a write (:func:`kept_taints`)."""
    return kubernetes is not None and kubernetes >= (1, 33)


def kept_taints(sent: dict[str, Any], answer: dict[str, Any]) -> bool:
    """Whether the server kept the taints of a slice it was sent (one with DRADeviceTaints off drops them)."""
    def has(body: dict[str, Any]) -> bool:
        return any((d.get("basic", d) if isinstance(d, dict) else {}).get("taints")
                   for d in (body.get("spec") or {}).get("devices", []))

    return has(answer) or not has(sent)


def kept_counters(sent: dict[str, Any], answer: dict[str, Any]) -> bool:
    """Whether the server kept the counters of a slice it was sent (one with the gate off drops them)."""
    def has(body: dict[str, Any]) -> bool:
        spec = body.get("spec") or {}
        return bool(spec.get("sharedCounters")) or any(
            (d.get("basic", d) if isinstance(d, dict) else {}).get("consumesCounters") for d in spec.get("devices", []))

    return has(answer) or not has(sent)


class Publisher:
    def __init__(self, client: Client, driver: str, node: str, log: Log, version: str | None = None,
                 counters: bool = True) -> None:
        self.client = client
        self.counters: str | None = None  # the counter sets' layout, once known (None: none)
        self.counters_known = not counters  # --shared-counters off: none, without asking
        self.taints: bool | None = None  # whether the slices carry device taints, once known
        self.driver = driver
        self.node = node
        self.log = log
        self.wanted_version = version
        self.version: str | None = None
        self.owner: dict[str, Any] | None = None  # the Node's reference, once read
        self.owner_said = False
        self.generation = 0
        # (devices, name -> resourceVersion, whether owned) written last
        self.written: tuple[object, dict[str, str], bool] | None = None

    def _path(self, name: str = "") -> str:
        assert self.version is not None
        return f"/apis/{GROUP}/{self.version}/resourceslices" + (f"/{name}" if name else "")

    def _owner(self) -> dict[str, Any] | None:
        """The Node's owner reference; until it is read, asked again at each sync (the driver may start before its
        kubelet registers the node: the slices then get their owner once the node is there)."""
        if self.owner is None:
            try:
                node = self.client.get(f"/api/v1/nodes/{quote(self.node, '')}")
                uid = node.get("metadata", {}).get("uid")
                if uid:
                    self.owner = {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid,
                                  "controller": True}
            except ApiError as err:
                if not self.owner_said:
                    self.owner_said = True
                    self.log(f"slices are not owned by node {self.node} until it can be read (they stay if the "
                             f"node object goes): {err}")
        return self.owner

    def _learn(self) -> None:
        """The API version, where the counter sets go, and whether taints can be published (once each)."""
        if self.version is None:
            self.version = choose_version(self.client, self.wanted_version)
        kubernetes: tuple[int, int] | None = None
        if self.taints is None or not self.counters_known:
            kubernetes = server_version(self.client)
        if self.taints is None:
            self.taints = taints_kept(kubernetes)
            if not self.taints:
                said = (f"Kubernetes {kubernetes[0]}.{kubernetes[1]}" if kubernetes
                        else "an API server of no known version")
                self.log(f"{said}: no device taints in the slices (they need 1.33 or later with DRADeviceTaints); "
                         "an unhealthy device is reported in the health stream only")
        if not self.counters_known:
            self.counters_known = True
            self.counters = layout(kubernetes)
            said = f"Kubernetes {kubernetes[0]}.{kubernetes[1]}" if kubernetes else "an API server of no known version"
            where = "in slices of their own" if self.counters == SPLIT else "in their devices' slice"
            self.log(f"{said}: split GPUs are published whole and as their parts, with shared counters {where}"
                     if self.counters else f"{said}: split GPUs are published as their parts only (shared counters "
                     "need 1.33 or later)")

    def offered(self, devices: list[DraDevice]) -> list[DraDevice]:
        """What of :func:`~.devices.build`'s devices this node publishes, so what a claim may name: all where the
        API keeps counters, else :func:`~.devices.without_counters` (also while that is not known yet)."""
        if not self.counters_known:
            try:
                self._learn()
            except ApiError:
                pass  # the server away: parts only until it says (sync says why)
        return devices if self.counters_known and self.counters else without_counters(devices)

    def sync(self, devices: list[DraDevice]) -> bool:
        """Make the node's slices those of ``devices``; True when anything was written or deleted.  ApiError
        when the server cannot be reached or refuses (the caller retries)."""
        self._learn()
        devices = self.offered(devices)
        selector = f"spec.nodeName={self.node},spec.driver={self.driver}"
        listed = self.client.get(self._path(), {"fieldSelector": selector})
        existing = {item["metadata"]["name"]: item for item in listed.get("items", [])
                    if isinstance(item, dict) and item.get("spec", {}).get("driver") == self.driver
                    and item.get("spec", {}).get("nodeName") == self.node}
        fingerprint = [d.fingerprint() for d in devices]
        versions = {name: item["metadata"].get("resourceVersion", "") for name, item in existing.items()}
        owner = self._owner()
        if self.written is not None and self.written == (fingerprint, versions, owner is not None):
            return False
        seen = [int(item.get("spec", {}).get("pool", {}).get("generation") or 0) for item in existing.values()]
        self.generation = max([self.generation, *seen]) + 1
        wanted = slice_objects(devices, self.driver, self.node, self.generation, self.version, owner, self.counters,
                               bool(self.taints))
        written: dict[str, str] = {}
        dropped = untainted = False
        for body in wanted:
            name = body["metadata"]["name"]
            if name in existing:
                body["metadata"]["resourceVersion"] = versions[name]
                answer = self.client.replace(self._path(name), body)
            else:
                answer = self.client.create(self._path(), body)
            written[name] = str(answer.get("metadata", {}).get("resourceVersion", ""))
            dropped = dropped or not kept_counters(body, answer)
            untainted = untainted or not kept_taints(body, answer)
        if untainted:  # DRADeviceTaints is off: the health stream is all there is
            self.taints = False
            self.written = None
            self.log("the API server dropped the device taints (DRADeviceTaints is off): an unhealthy device is "
                     "reported in the health stream only")
            return self.sync(devices)
        if dropped:  # the gate is off: whole and parts would both be allocatable; publish the parts only, now
            self.counters = None
            self.written = None
            self.log("the API server dropped the shared counters (DRAPartitionableDevices is off): split GPUs are "
                     "published as their parts only")
            return self.sync(devices)
        for name in sorted(set(existing) - set(written)):
            try:
                self.client.delete(self._path(name))
            except ApiError as err:
                if err.status != 404:
                    raise
        self.written = (fingerprint, written, owner is not None)
        self.log(f"published {len(devices)} device(s) in {len(wanted)} ResourceSlice(s) of pool {self.node}, "
                 f"generation {self.generation} ({GROUP}/{self.version})")
        return True
