"""Preparing a ResourceClaim: a CDI spec of the claim's own, and a checkpoint of what is prepared.

The kubelet names a claim (namespace, name, UID); its allocation is in the
claim's status on the API server (``status.allocation.devices.results``: the
request, driver, pool and device the scheduler chose).  Prepare reads it, takes
the results of this driver, and refuses the claim with one line when one is
not for this node's pool, or names a device this node does not publish now
(gone, or its GPU changed partition mode since the scheduler chose), or a
device another prepared claim holds, or one that shares hardware with a device
another claim holds (a split GPU's whole and its part: the counters keep the
scheduler from choosing both; this keeps a stale allocation from getting them),
unless the result asks for admin access.

Prepared, the claim has its own CDI spec, ``k8s.<driver>-claim_<uid>.json`` in
the claim CDI directory, of kind ``k8s.<driver>/claim``: one CDI device per
allocated device, ``<uid>-<device>``, with exactly that device's edits (the
plan's :func:`~oci_gpu_hook.plan.device_edits`, as in the node's own specs; a
split GPU's whole: those of all its parts),
and the shared edits of the kinds among them (``/dev/kfd``, the NVIDIA control
nodes and driver files) as the spec's own.  The kubelet passes the returned
names to the runtime (the CRI's CDI devices), which applies them; no other
claim's spec names those devices under its kind.

The checkpoint (``checkpoint.json`` in the state directory, written
atomically) records each prepared claim before its spec is written; unprepare
removes the spec, then the record.  Both are idempotent: preparing a prepared
claim writes its spec again from the host as it is now (a reboot empties
``/var/run/cdi``) and answers the same names; unpreparing a claim not prepared
succeeds.  A restarted plugin reads the checkpoint, so it still knows which
devices are held.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from oci_gpu_hook.appliers import cdi
from oci_gpu_hook.atomic import remove_file, write_atomic
from oci_gpu_hook.cluster.dra.devices import DraDevice, find
from oci_gpu_hook.cluster.dra.kube import ApiError, Client
from oci_gpu_hook.config import Config
from oci_gpu_hook.core.edits import Edits
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.inventory import Inventory
from oci_gpu_hook.plan import device_edits, shared_edits

CHECKPOINT = "checkpoint.json"
CHECKPOINT_VERSION = 1
UID = re.compile(r"^[0-9a-zA-Z][-0-9a-zA-Z]{0,62}$")
SHOWN = 6  # devices named in a refusal's list of what this node has

Current = Callable[[], tuple[Inventory, list[DraDevice]]]  # a fresh scan: the inventory and what it publishes
Log = Callable[[str], None]


@dataclass(frozen=True)
class Prepared:
    request: str
    pool: str
    device: str
    cdi_name: str  # fully qualified


def cdi_kind(driver: str) -> str:
    return f"k8s.{driver}/claim"


def spec_file(directory: str, driver: str, uid: str) -> str:
    return os.path.join(directory, f"k8s.{driver}-claim_{uid}.json")


class ClaimError(Exception):
    """One claim cannot be prepared: the message is its per-claim error line."""


class Claims:
    def __init__(self, config: Config, driver: str, node: str, cdi_dir: str, state_dir: str, client: Client | None,
                 current: Current, log: Log, api_version: Callable[[], str]) -> None:
        self.config = config
        self.driver = driver
        self.node = node
        self.cdi_dir = cdi_dir
        self.state_dir = state_dir
        self.client = client
        self.current = current
        self.log = log
        self.api_version = api_version
        self.lock = threading.Lock()
        self.path = os.path.join(state_dir, CHECKPOINT)
        self.prepared: dict[str, dict[str, Any]] = self._load()

    # --- the checkpoint ---------------------------------------------------------------------------------------

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            with open(self.path, encoding="utf-8") as handle:
                data = json.load(handle)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            raise HookError(f"checkpoint {self.path} cannot be read ({err}): the prepared claims are unknown; "
                            "move it away only once no pod on this node uses a claim of this driver") from None
        claims = data.get("claims") if isinstance(data, dict) else None
        if not isinstance(data, dict) or data.get("version") != CHECKPOINT_VERSION or not isinstance(claims, dict):
            raise HookError(f"checkpoint {self.path} is not a version {CHECKPOINT_VERSION} checkpoint of this driver")
        return claims

    def _save(self) -> None:
        os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
        text = json.dumps({"version": CHECKPOINT_VERSION, "driver": self.driver, "claims": self.prepared},
                          indent=1, sort_keys=True) + "\n"
        write_atomic(self.path, text, 0o600, durable=True)

    # --- prepare ----------------------------------------------------------------------------------------------

    def _allocation(self, namespace: str, name: str, uid: str) -> list[dict[str, Any]]:
        what = f"claim {namespace}/{name}"
        if self.client is None:
            raise ClaimError(f"{what}: no API server to read its allocation from")
        try:
            claim = self.client.get(f"/apis/resource.k8s.io/{self.api_version()}/namespaces/{quote(namespace, '')}/"
                                    f"resourceclaims/{quote(name, '')}")
        except ApiError as err:
            raise ClaimError(f"{what}: cannot read it: {err}") from None
        found = claim.get("metadata", {}).get("uid")
        if found != uid:
            raise ClaimError(f"{what}: its UID is {found}, the kubelet asked for {uid} (deleted and created again?)")
        allocation = (claim.get("status") or {}).get("allocation")
        if not isinstance(allocation, dict):
            raise ClaimError(f"{what}: not allocated")
        devices = allocation.get("devices") or {}
        for config in devices.get("config") or []:
            opaque = config.get("opaque") if isinstance(config, dict) else None
            if isinstance(opaque, dict) and opaque.get("driver") == self.driver:
                raise ClaimError(f"{what}: has opaque parameters for {self.driver}, which takes none (select devices "
                                 "by their attributes instead)")
        return [r for r in devices.get("results") or [] if isinstance(r, dict) and r.get("driver") == self.driver]

    def prepare(self, namespace: str, name: str, uid: str) -> list[Prepared]:
        """The CDI names of the claim's devices on this node; ClaimError with the claim's one error line."""
        if not UID.match(uid):
            raise ClaimError(f"claim {namespace}/{name}: UID {uid!r} is no UID")
        results = self._allocation(namespace, name, uid)
        with self.lock:
            try:
                inventory, published = self.current()
            except HookError as err:
                raise ClaimError(f"claim {namespace}/{name}: {err}") from None
            chosen: list[tuple[dict[str, Any], DraDevice]] = []
            for result in results:
                pool, device = str(result.get("pool", "")), str(result.get("device", ""))
                if pool != self.node:
                    raise ClaimError(f"claim {namespace}/{name}: device {device} is in pool {pool}, not this node's "
                                     f"({self.node})")
                here = find(published, device)
                if here is None:
                    names = [d.name for d in published]
                    listed = ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN
                                                         else "")
                    raise ClaimError(f"claim {namespace}/{name}: device {device} is not on node {self.node} now (gone, "
                                     f"or its GPU changed partition mode); here now: {listed or 'no devices'}")
                holder = self._holder(here, uid, published)
                if holder and not result.get("adminAccess"):
                    raise ClaimError(f"claim {namespace}/{name}: device {device} is prepared for claim {holder}")
                chosen.append((result, here))
            out = [Prepared(str(r.get("request", "")), self.node, d.name, f"{cdi_kind(self.driver)}={uid}-{d.name}")
                   for r, d in chosen]
            self.prepared[uid] = {"namespace": namespace, "name": name,
                                  "devices": [{"request": p.request, "device": p.device, "cdi": p.cdi_name}
                                              for p in out]}
            try:
                self._save()
                self._write_spec(uid, inventory, [d for _r, d in chosen])
            except HookError as err:
                raise ClaimError(f"claim {namespace}/{name}: {err}") from None
            self.log(f"prepared claim {namespace}/{name} ({uid}): "
                     f"{', '.join(p.device for p in out) or 'no devices of this driver'}")
            return out

    def _holder(self, device: DraDevice, uid: str, published: list[DraDevice]) -> str | None:
        """The other prepared claim that holds ``device``, or a device sharing its hardware (a split GPU's whole
        and its part), if any."""
        for other, record in self.prepared.items():
            if other == uid:
                continue
            for held in record.get("devices", []):
                name = str(held.get("device", ""))
                found = find(published, name)
                if name == device.name or (found is not None and found.shares_hardware(device)):
                    return f"{record.get('namespace')}/{record.get('name')} ({other})" + (
                        "" if name == device.name else f" as {name}")
        return None

    def spec(self, uid: str, inventory: Inventory, devices: list[DraDevice]) -> dict[str, Any]:
        """The claim's CDI spec: its devices' own edits, the shared edits of their kinds spec-wide."""
        entries = []
        for device in devices:
            assert device.parts
            edits = Edits.merged([device_edits(part, self.config) for part in device.parts])
            entries.append({"name": f"{uid}-{device.name}", "containerEdits": cdi.container_edits(edits, self.config)})
        spec: dict[str, Any] = {"cdiVersion": cdi.CDI_VERSION, "kind": cdi_kind(self.driver), "devices": entries}
        kinds = list(dict.fromkeys(d.kind for d in devices))
        shared = Edits.merged([shared_edits(inventory, kind, self.config) for kind in kinds])
        if shared.nodes or shared.mounts:
            spec["containerEdits"] = cdi.container_edits(shared, self.config)
        return spec

    def _write_spec(self, uid: str, inventory: Inventory, devices: list[DraDevice]) -> None:
        path = spec_file(self.cdi_dir, self.driver, uid)
        if not devices:  # nothing of this driver in the claim: no spec (and no stale one)
            remove_file(path)
            return
        spec = self.spec(uid, inventory, devices)
        cdi.validate(spec, path)
        cdi.write(path, cdi.render(spec, "json"))

    # --- unprepare --------------------------------------------------------------------------------------------

    def unprepare(self, namespace: str, name: str, uid: str) -> None:
        if not UID.match(uid):
            raise ClaimError(f"claim {namespace}/{name}: UID {uid!r} is no UID")
        with self.lock:
            try:
                remove_file(spec_file(self.cdi_dir, self.driver, uid))
                if self.prepared.pop(uid, None) is not None:
                    self._save()
                    self.log(f"unprepared claim {namespace}/{name} ({uid})")
            except HookError as err:
                raise ClaimError(f"claim {namespace}/{name}: {err}") from None
