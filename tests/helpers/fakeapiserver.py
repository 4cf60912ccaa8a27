"""A small fake Kubernetes API server over HTTPS (a self-signed certificate made by ``openssl`` for the test),
for the DRA driver's ResourceSlices and ResourceClaims.

It records every request (method, path, query, bearer token, body), serves
``/apis/resource.k8s.io`` (the versions given), Nodes, ResourceClaims (put in
by the test) and ResourceSlices (create, get, list with the ``spec.nodeName``
and ``spec.driver`` field selectors, replace with the resourceVersion check,
delete), and refuses, with 422 as the real server does, a ResourceSlice
whose shape the API's validation would refuse (:func:`slice_problems`: the
fields and limits of ``resource.k8s.io`` v1, v1beta2 and v1beta1; unknown
fields too, as a strict decoder would).  A wrong token is 401.

With ``kubernetes`` (``(1, 35)``) it answers ``/version`` (else 404, as a
server that does not say), and checks shared counters as that minor version
does (KEP-4815): from 1.33 ``spec.sharedCounters`` and ``consumesCounters`` on
devices (``basic.consumesCounters`` in v1beta1); in 1.33 and 1.34 a device
consumes only sets of its own slice, from 1.35 a slice has counter sets or
devices, never both; at most 8 sets a slice, 32 counters a set, 2
consumptions a device, 64 devices a slice when any consumes counters.
``partitionable=False`` is a server with the feature gate off: it drops both
fields on write, as a real one drops a disabled feature's fields.

Device taints (KEP-5055, the ``DRADeviceTaints`` gate): from 1.33 a device may carry ``taints`` (``basic.taints``
in v1beta1), each a label name as ``key``, a label value as ``value``, an ``effect`` (``NoSchedule``,
``NoExecute``; ``None`` too from 1.35) and an RFC 3339 ``timeAdded``; ``device_taints=False`` is a server with
the gate off, which drops them on write.
"""

from __future__ import annotations

import json
import re
import shutil
import ssl
import subprocess
import tempfile
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.conftest import unavailable

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[mkMGTPE]|)$")
INT64 = (-(1 << 63), (1 << 63) - 1)
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


_made: dict[str, tuple[Path, Path]] = {}


def make_certificate() -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost (an EC key: quick to make), one per test process, in
    its own temp directory; (cert, key)."""
    if "pair" not in _made:
        if shutil.which("openssl") is None:
            unavailable("missing openssl (the fake API server's certificate)")
        directory = Path(tempfile.mkdtemp(prefix="fake-api-"))
        cert, key = directory / "server.crt", directory / "server.key"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-days", "2", "-subj", "/CN=fake-api", "-addext",
                        "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                       check=True, capture_output=True, timeout=60)
        _made["pair"] = cert, key
    return _made["pair"]


def _keys(obj: dict[str, Any], allowed: set[str], where: str, problems: list[str]) -> None:
    for key in obj:
        if key not in allowed:
            problems.append(f"{where}: unknown field {key!r}")


def _qualified(name: str) -> bool:
    domain, _, ident = name.rpartition("/")
    return (not domain or (len(domain) <= 63 and bool(DNS_SUBDOMAIN.match(domain)))) and len(ident) <= 32 and bool(
        C_IDENTIFIER.match(ident))


def _label_name(name: str) -> bool:
    """A label name: an optional DNS subdomain prefix of at most 253 characters, a slash, a name of at most 63."""
    prefix, _, rest = name.rpartition("/")
    return (not prefix or (len(prefix) <= 253 and bool(DNS_SUBDOMAIN.match(prefix)))) and 0 < len(rest) <= 63 and bool(
        LABEL_VALUE.match(rest))


def _counter_problems(counters: Any, where: str, problems: list[str]) -> None:
    if not isinstance(counters, dict) or not counters or len(counters) > 32:
        problems.append(f"{where}: 1 to 32 counters")
        return
    for key, value in counters.items():
        if not isinstance(key, str) or len(key) > 63 or not DNS_LABEL.match(key):
            problems.append(f"{where}[{key!r}]: no DNS label")
        if not isinstance(value, dict) or set(value) != {"value"} or not isinstance(value["value"], str) or \
                not QUANTITY.match(value["value"]):
            problems.append(f"{where}[{key!r}]: expected {{value: QUANTITY}}, got {value!r}")


def _counted_problems(item: Any, key: str, at: str, problems: list[str]) -> None:
    """A counter set (``key`` name) or a device's consumption of one (``key`` counterSet)."""
    if not isinstance(item, dict):
        problems.append(f"{at}: not an object")
        return
    _keys(item, {key, "counters"}, at, problems)
    if not isinstance(item.get(key), str) or not DNS_LABEL.match(item[key]):
        problems.append(f"{at}.{key}: no DNS label")
    _counter_problems(item.get("counters"), f"{at}.counters", problems)


def _device_problems(device: Any, version: str, where: str, problems: list[str],
                     kubernetes: tuple[int, int] | None = None) -> None:
    if not isinstance(device, dict):
        problems.append(f"{where}: not an object")
        return
    name = device.get("name")
    if not isinstance(name, str) or len(name) > 63 or not DNS_LABEL.match(name):
        problems.append(f"{where}.name: {name!r} is no DNS label")
    if version == "v1beta1":
        _keys(device, {"name", "basic"}, where, problems)
        body = device.get("basic")
        if not isinstance(body, dict):
            problems.append(f"{where}.basic: required in v1beta1")
            return
        where = f"{where}.basic"
    else:
        body = device
    counted = kubernetes is not None and kubernetes >= (1, 33)
    _keys(body, ({"name"} if body is device else set()) | {"attributes", "capacity"} | (
        {"consumesCounters", "taints"} if counted else set()), where, problems)
    taints = body.get("taints") or []
    if not isinstance(taints, list) or len(taints) > 16:
        problems.append(f"{where}.taints: a list of at most 16")
        taints = []
    effects = {"NoSchedule", "NoExecute"} | ({"None"} if kubernetes is not None and kubernetes >= (1, 35) else set())
    for index, taint in enumerate(taints):
        at = f"{where}.taints[{index}]"
        if not isinstance(taint, dict):
            problems.append(f"{at}: not an object")
            continue
        _keys(taint, {"key", "value", "effect", "timeAdded"}, at, problems)
        key, value = taint.get("key"), taint.get("value", "")
        if not isinstance(key, str) or "/" not in key or not _label_name(key):
            problems.append(f"{at}.key: {key!r} is no label name")
        if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
            problems.append(f"{at}.value: {value!r} is no label value")
        if taint.get("effect") not in effects:
            problems.append(f"{at}.effect: {taint.get('effect')!r} is not one of {', '.join(sorted(effects))}")
        if "timeAdded" in taint and (not isinstance(taint["timeAdded"], str) or not RFC3339.match(taint["timeAdded"])):
            problems.append(f"{at}.timeAdded: {taint['timeAdded']!r} is no RFC 3339 time")
    consumes = body.get("consumesCounters") or []
    if not isinstance(consumes, list) or len(consumes) > 2:
        problems.append(f"{where}.consumesCounters: at most 2")
        consumes = []
    for index, item in enumerate(consumes):
        _counted_problems(item, "counterSet", f"{where}.consumesCounters[{index}]", problems)
    attributes = body.get("attributes") or {}
    capacity = body.get("capacity") or {}
    if len(attributes) + len(capacity) > 32:
        problems.append(f"{where}: more than 32 attributes and capacities")
    for key, value in attributes.items():
        if not _qualified(key):
            problems.append(f"{where}.attributes[{key!r}]: no qualified name")
        if not isinstance(value, dict) or len(value) != 1:
            problems.append(f"{where}.attributes[{key!r}]: exactly one of int, bool, string, version")
            continue
        (kind, item), = value.items()
        if kind == "int":
            if not isinstance(item, int) or isinstance(item, bool) or not INT64[0] <= item <= INT64[1]:
                problems.append(f"{where}.attributes[{key!r}].int: {item!r} is no int64")
        elif kind == "bool":
            if not isinstance(item, bool):
                problems.append(f"{where}.attributes[{key!r}].bool: {item!r}")
        elif kind == "string":
            if not isinstance(item, str) or len(item) > 64:
                problems.append(f"{where}.attributes[{key!r}].string: {item!r} (at most 64 characters)")
        elif kind == "version":
            if not isinstance(item, str) or len(item) > 64 or not SEMVER.match(item):
                problems.append(f"{where}.attributes[{key!r}].version: {item!r} is no semantic version")
        else:
            problems.append(f"{where}.attributes[{key!r}]: unknown type {kind!r}")
    for key, value in capacity.items():
        if not _qualified(key):
            problems.append(f"{where}.capacity[{key!r}]: no qualified name")
        if not isinstance(value, dict) or set(value) != {"value"} or not isinstance(value["value"], str) or \
                not QUANTITY.match(value["value"]):
            problems.append(f"{where}.capacity[{key!r}]: expected {{value: QUANTITY}}, got {value!r}")


def slice_problems(obj: Any, version: str, kubernetes: tuple[int, int] | None = None) -> list[str]:
    """What the API's validation would refuse in this ResourceSlice (the fields this driver may use), on a server
    of that (major, minor) version with partitionable devices on (None: one without them)."""
    problems: list[str] = []
    if not isinstance(obj, dict):
        return ["not an object"]
    _keys(obj, {"apiVersion", "kind", "metadata", "spec"}, "slice", problems)
    if obj.get("apiVersion") != f"resource.k8s.io/{version}" or obj.get("kind") != "ResourceSlice":
        problems.append(f"apiVersion/kind {obj.get('apiVersion')}/{obj.get('kind')}")
    metadata = obj.get("metadata") or {}
    _keys(metadata, {"name", "resourceVersion", "ownerReferences", "labels", "uid", "generateName"}, "metadata",
          problems)
    name = metadata.get("name", "")
    if not isinstance(name, str) or len(name) > 253 or not DNS_SUBDOMAIN.match(name):
        problems.append(f"metadata.name {name!r} is no DNS subdomain")
    for owner in metadata.get("ownerReferences") or []:
        if not {"apiVersion", "kind", "name", "uid"} <= set(owner):
            problems.append(f"ownerReference {owner!r} lacks a field")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [*problems, "spec: required"]
    counted = kubernetes is not None and kubernetes >= (1, 33)
    _keys(spec, {"driver", "pool", "nodeName", "nodeSelector", "allNodes", "devices"} | (
        {"sharedCounters"} if counted else set()), "spec", problems)
    sets = spec.get("sharedCounters") or []
    if not isinstance(sets, list) or len(sets) > 8:
        problems.append("spec.sharedCounters: at most 8")
        sets = []
    for index, item in enumerate(sets):
        _counted_problems(item, "name", f"spec.sharedCounters[{index}]", problems)
    set_names = [item.get("name") for item in sets if isinstance(item, dict)]
    if len(set_names) != len(set(set_names)):
        problems.append("spec.sharedCounters: a name twice")
    driver = spec.get("driver", "")
    if not isinstance(driver, str) or len(driver) > 63 or not DNS_SUBDOMAIN.match(driver):
        problems.append(f"spec.driver {driver!r} is no DNS subdomain of at most 63 characters")
    pool = spec.get("pool")
    if not isinstance(pool, dict):
        problems.append("spec.pool: required")
    else:
        _keys(pool, {"name", "generation", "resourceSliceCount"}, "spec.pool", problems)
        if not isinstance(pool.get("name"), str) or not pool["name"]:
            problems.append("spec.pool.name: required")
        if not isinstance(pool.get("generation"), int) or pool["generation"] < 0:
            problems.append("spec.pool.generation: an int >= 0")
        if not isinstance(pool.get("resourceSliceCount"), int) or pool["resourceSliceCount"] < 1:
            problems.append("spec.pool.resourceSliceCount: an int >= 1")
    if sum(1 for key in ("nodeName", "nodeSelector", "allNodes") if spec.get(key)) != 1:
        problems.append("spec: exactly one of nodeName, nodeSelector, allNodes")
    devices = spec.get("devices") or []
    if len(devices) > 128:
        problems.append("spec.devices: more than 128")
    names = [d.get("name") for d in devices if isinstance(d, dict)]
    if len(names) != len(set(names)):
        problems.append("spec.devices: a name twice")
    for index, device in enumerate(devices):
        _device_problems(device, version, f"spec.devices[{index}]", problems, kubernetes)
    consumed = [c for d in devices if isinstance(d, dict) for c in (d.get("basic", d).get("consumesCounters") or [])
                if isinstance(c, dict)]
    tainted = [d for d in devices if isinstance(d, dict) and d.get("basic", d).get("taints")]
    if (consumed or tainted) and len(devices) > 64:
        problems.append("spec.devices: more than 64 where devices consume counters or have taints")
    if kubernetes is not None and kubernetes >= (1, 35):
        if sets and devices:
            problems.append("spec: only one of sharedCounters or devices is allowed")
    elif counted:
        for item in consumed:
            if item.get("counterSet") not in set_names:
                problems.append(f"counterSet {item.get('counterSet')!r} is not in this slice's sharedCounters")
    return problems


def drop_taints(obj: dict[str, Any]) -> dict[str, Any]:
    """The slice as a server with DRADeviceTaints off stores it: without the devices' taints."""
    for device in (obj.get("spec") or {}).get("devices") or []:
        if isinstance(device, dict):
            device.get("basic", device).pop("taints", None)
    return obj


def drop_counters(obj: dict[str, Any]) -> dict[str, Any]:
    """The slice as a server with DRAPartitionableDevices off stores it: without the feature's fields."""
    spec = obj.get("spec") or {}
    spec.pop("sharedCounters", None)
    for device in spec.get("devices") or []:
        if isinstance(device, dict):
            device.get("basic", device).pop("consumesCounters", None)
    return obj


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    token: str
    body: Any


@dataclass
class State:
    versions: tuple[str, ...]
    token: str
    kubernetes: tuple[int, int] | None = None  # what /version says (None: 404)
    partitionable: bool = True  # the DRAPartitionableDevices gate (off: its fields dropped on write)
    device_taints: bool = True  # the DRADeviceTaints gate (off: the devices' taints dropped on write)
    slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    claims: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    counter: int = 0
    down: bool = False  # answer 503 to everything (an API server that is away)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    state: State  # set on the class made per server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, code: int, message: str) -> None:
        self._answer(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                            "code": code})

    def _handle(self) -> None:
        parsed = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
        state = self.state
        with state.lock:
            state.requests.append(Request(self.command, parsed.path, query, token, body))
            if state.down:
                return self._status(503, "the fake API server is down")
            if token != state.token:
                return self._status(401, "Unauthorized")
            self._route(parsed.path, query, body)
        return None

    def _route(self, path: str, query: dict[str, str], body: Any) -> None:
        state = self.state
        parts = path.strip("/").split("/")
        if path == "/version" and self.command == "GET":
            if state.kubernetes is None:
                return self._status(404, "the page could not be found")
            major, minor = state.kubernetes
            return self._answer(200, {"major": str(major), "minor": f"{minor}+", "gitVersion": f"v{major}.{minor}.0"})
        if path == "/apis/resource.k8s.io":
            return self._answer(200, {"kind": "APIGroup", "name": "resource.k8s.io", "versions": [
                {"groupVersion": f"resource.k8s.io/{v}", "version": v} for v in state.versions]})
        if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4 and self.command == "GET":
            node = state.nodes.get(parts[3])
            return self._answer(200, node) if node else self._status(404, f"nodes {parts[3]!r} not found")
        if len(parts) < 3 or parts[:2] != ["apis", "resource.k8s.io"] or parts[2] not in state.versions:
            return self._status(404, f"no such path {path}")
        version, rest = parts[2], parts[3:]
        if len(rest) == 4 and rest[0] == "namespaces" and rest[2] == "resourceclaims" and self.command == "GET":
            claim = state.claims.get((rest[1], rest[3]))
            return self._answer(200, claim) if claim else self._status(404, f"resourceclaims {rest[3]!r} not found")
        if not rest or rest[0] != "resourceslices":
            return self._status(404, f"no such path {path}")
        name = rest[1] if len(rest) > 1 else None
        if self.command == "GET" and name is None:
            wanted = dict(item.split("=", 1) for item in query.get("fieldSelector", "").split(",") if item)
            assert set(wanted) <= {"spec.nodeName", "spec.driver"}, wanted
            items = [s for s in state.slices.values() if all(
                s["spec"].get(k.split(".")[1]) == v for k, v in wanted.items())]
            return self._answer(200, {"kind": "ResourceSliceList", "items": sorted(
                items, key=lambda s: s["metadata"]["name"])})
        if self.command == "GET":
            found = state.slices.get(name or "")
            return self._answer(200, found) if found else self._status(404, f"resourceslices {name!r} not found")
        if self.command == "DELETE":
            if state.slices.pop(name or "", None) is None:
                return self._status(404, f"resourceslices {name!r} not found")
            return self._answer(200, {"kind": "Status", "status": "Success"})
        if self.command in ("POST", "PUT"):
            if not state.partitionable:  # the gate off: its fields go before validation, as in a real server
                body = drop_counters(body)
            if not state.device_taints:
                body = drop_taints(body)
            problems = slice_problems(body, version, state.kubernetes)
            if problems:
                return self._status(422, f"ResourceSlice is invalid: {'; '.join(problems)}")
            new_name = body["metadata"]["name"]
            if self.command == "POST":
                if name is not None or new_name in state.slices:
                    return self._status(409, f"resourceslices {new_name!r} already exists")
            else:
                old = state.slices.get(name or "")
                if old is None or new_name != name:
                    return self._status(404, f"resourceslices {name!r} not found")
                if body["metadata"].get("resourceVersion") != old["metadata"]["resourceVersion"]:
                    return self._status(409, "the object has been modified; please apply your changes to the latest "
                                             "version and try again")
            state.counter += 1
            stored = json.loads(json.dumps(body))
            stored["metadata"]["resourceVersion"] = str(state.counter)
            state.slices[new_name] = stored
            return self._answer(201 if self.command == "POST" else 200, stored)
        return self._status(405, "method not allowed")

    do_GET = do_POST = do_PUT = do_DELETE = _handle  # BaseHTTPRequestHandler's names


class FakeApiServer:
    def __init__(self, directory: Path, versions: tuple[str, ...] = ("v1", "v1beta2", "v1beta1"),
                 token: str = "test-token", kubernetes: tuple[int, int] | None = None,
                 partitionable: bool = True, device_taints: bool = True) -> None:
        self.cert, self.key = make_certificate()
        self.token_file = directory / "token"
        self.token_file.write_text(token + "\n")
        self.state = State(versions, token, kubernetes, partitionable, device_taints)
        handler = type("Handler", (_Handler,), {"state": self.state})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(self.cert), str(self.key))
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def add_claim(self, namespace: str, name: str, uid: str, results: list[dict[str, Any]],
                  **devices: Any) -> None:
        with self.state.lock:
            self.state.claims[(namespace, name)] = {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"namespace": namespace, "name": name, "uid": uid},
                "status": {"allocation": {"devices": {"results": results, **devices}}}}

    def slices(self) -> list[dict[str, Any]]:
        with self.state.lock:
            return [json.loads(json.dumps(s)) for _n, s in sorted(self.state.slices.items())]

    def writes(self) -> list[Request]:
        with self.state.lock:
            return [r for r in self.state.requests if r.method != "GET"]
