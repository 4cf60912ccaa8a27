"""This node's ResourceSlices: the published devices as ``resource.k8s.io`` objects, kept in line with the host.

One pool per node, named after the node, with the node as ``spec.nodeName``;
at most 128 devices a slice (the API's limit), so one slice on any real node
(``<node>-<driver>-0``; more only past 128 devices).  The API version is the
newest the server offers of ``v1`` (Kubernetes 1.34+), ``v1beta2`` (1.33) and
``v1beta1`` (1.32; its devices wrap attributes and capacity in ``basic``).

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

from oci_gpu_hook.host.dra.devices import DraDevice
from oci_gpu_hook.host.dra.kube import ApiError, Client

GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta2", "v1beta1")  # newest first
MAX_DEVICES = 128

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


def device_object(device: DraDevice, version: str) -> dict[str, Any]:
    attributes = {name: {kind: value} for name, (kind, value) in sorted(device.attributes.items())}
    body: dict[str, Any] = {"attributes": attributes}
    if device.capacity:
        body["capacity"] = {name: {"value": value} for name, value in sorted(device.capacity.items())}
    if version == "v1beta1":
        return {"name": device.name, "basic": body}
    return {"name": device.name, **body}


def slice_name(node: str, driver: str, index: int) -> str:
    """A DNS subdomain: ``<node>-<driver>-<index>`` (lower-cased, other characters as ``-``)."""
    base = re.sub(r"[^a-z0-9.-]", "-", f"{node}-{driver}".lower()).strip("-.")
    return f"{base[:240]}-{index}"


def slice_objects(devices: list[DraDevice], driver: str, node: str, generation: int, version: str,
                  owner: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    chunks = [devices[i:i + MAX_DEVICES] for i in range(0, len(devices), MAX_DEVICES)]
    out = []
    for index, chunk in enumerate(chunks):
        metadata: dict[str, Any] = {"name": slice_name(node, driver, index)}
        if owner is not None:
            metadata["ownerReferences"] = [owner]
        out.append({
            "apiVersion": f"{GROUP}/{version}", "kind": "ResourceSlice", "metadata": metadata,
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": len(chunks)},
                     "devices": [device_object(d, version) for d in chunk]},
        })
    return out


class Publisher:
    def __init__(self, client: Client, driver: str, node: str, log: Log, version: str | None = None) -> None:
        self.client = client
        self.driver = driver
        self.node = node
        self.log = log
        self.wanted_version = version
        self.version: str | None = None
        self.owner: dict[str, Any] | None = None
        self.owner_read = False
        self.generation = 0
        self.written: tuple[object, dict[str, str]] | None = None  # (devices, name -> resourceVersion) written last

    def _path(self, name: str = "") -> str:
        assert self.version is not None
        return f"/apis/{GROUP}/{self.version}/resourceslices" + (f"/{name}" if name else "")

    def _owner(self) -> dict[str, Any] | None:
        if not self.owner_read:
            self.owner_read = True
            try:
                node = self.client.get(f"/api/v1/nodes/{quote(self.node, '')}")
                uid = node.get("metadata", {}).get("uid")
                if uid:
                    self.owner = {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid,
                                  "controller": True}
            except ApiError as err:
                self.log(f"slices are not owned by node {self.node} (they stay if the node object goes): {err}")
        return self.owner

    def sync(self, devices: list[DraDevice]) -> bool:
        """Make the node's slices those of ``devices``; True when anything was written or deleted.  ApiError
        when the server cannot be reached or refuses (the caller retries)."""
        if self.version is None:
            self.version = choose_version(self.client, self.wanted_version)
        selector = f"spec.nodeName={self.node},spec.driver={self.driver}"
        listed = self.client.get(self._path(), {"fieldSelector": selector})
        existing = {item["metadata"]["name"]: item for item in listed.get("items", [])
                    if isinstance(item, dict) and item.get("spec", {}).get("driver") == self.driver
                    and item.get("spec", {}).get("nodeName") == self.node}
        fingerprint = [d.fingerprint() for d in devices]
        versions = {name: item["metadata"].get("resourceVersion", "") for name, item in existing.items()}
        if self.written is not None and self.written == (fingerprint, versions):
            return False
        seen = [int(item.get("spec", {}).get("pool", {}).get("generation") or 0) for item in existing.values()]
        self.generation = max([self.generation, *seen]) + 1
        wanted = slice_objects(devices, self.driver, self.node, self.generation, self.version, self._owner())
        written: dict[str, str] = {}
        for body in wanted:
            name = body["metadata"]["name"]
            if name in existing:
                body["metadata"]["resourceVersion"] = versions[name]
                answer = self.client.replace(self._path(name), body)
            else:
                answer = self.client.create(self._path(), body)
            written[name] = str(answer.get("metadata", {}).get("resourceVersion", ""))
        for name in sorted(set(existing) - set(written)):
            try:
                self.client.delete(self._path(name))
            except ApiError as err:
                if err.status != 404:
                    raise
        self.written = (fingerprint, written)
        self.log(f"published {len(devices)} device(s) in {len(wanted)} ResourceSlice(s) of pool {self.node}, "
                 f"generation {self.generation} ({GROUP}/{self.version})")
        return True
