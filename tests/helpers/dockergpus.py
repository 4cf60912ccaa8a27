"""``docker run --gpus``: what the real docker CLI sends, and what Docker 28.3+'s AMD driver makes of it.

The CLI half is the real thing: this machine's docker client (20.10) is pointed at a stand-in API server on a
unix socket that records the container-create request and refuses it.  The daemon half, which Docker 20.10
does not have, is transcribed from moby (``daemon/devices_amd_linux.go`` ``setAMDGPUs``, the capability match
of ``daemon/devices.go``): the driver's capabilities are ``gpu`` and ``amd``; a request whose capabilities
are not among them (``--gpus capabilities=compute``) finds no driver; Count and DeviceIDs together are refused;
else ``AMD_VISIBLE_DEVICES`` is the ids, ``0..Count-1``, ``all`` (Count -1) or ``void`` (Count 0).
"""

from __future__ import annotations

import http.server
import json
import os
import socketserver
import subprocess
import tempfile
import threading
from typing import Any

DOCKER = "/usr/bin/docker"
AMD_CAPABILITIES = {"gpu", "amd"}


class NoDriver(Exception):
    """moby: could not select device driver "" with capabilities: ..."""


class Conflict(Exception):
    """moby: cannot set both Count and DeviceIDs on device request"""


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def _reply(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Api-Version", "1.41")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except BrokenPipeError:
            pass

    def do_HEAD(self) -> None:
        self._reply(200, {})

    def do_GET(self) -> None:
        self._reply(200, {"ApiVersion": "1.41", "Version": "20.10"} if "version" in self.path else "OK")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if "/containers/create" in self.path:
            self.server.created.append(json.loads(body or b"{}"))
        self._reply(500, {"message": "recorded, not created"})

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    created: list[dict[str, Any]]

    def get_request(self) -> tuple[Any, Any]:
        request, _ = super().get_request()
        return request, ("unix", 0)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the client hangs up early on some requests: nothing to report


def device_requests(*flags: str) -> dict[str, list[dict[str, Any]]]:
    """``DeviceRequests`` of ``docker run --gpus FLAG`` as the real client sends them, per flag."""
    results = {}
    with tempfile.TemporaryDirectory(prefix="ogh-api-") as base:
        socket = os.path.join(base, "docker.sock")
        server = _Server(socket, _Handler)
        server.created = []
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            for flag in flags:
                server.created.clear()
                subprocess.run([DOCKER, "-H", f"unix://{socket}", "run", "--gpus", flag, "image"], capture_output=True,
                               text=True, timeout=60, check=False, env={"PATH": "/usr/bin:/bin", "HOME": base})
                (created,) = server.created
                results[flag] = created["HostConfig"]["DeviceRequests"]
        finally:
            server.shutdown()
            server.server_close()
    return results


def amd_env(requests: list[dict[str, Any]]) -> str:
    """The ``AMD_VISIBLE_DEVICES`` value Docker 28.3+'s AMD driver appends for one ``--gpus`` request."""
    (request,) = requests
    if not any(set(group) <= AMD_CAPABILITIES for group in request["Capabilities"]):
        raise NoDriver(request["Capabilities"])
    count, ids = request["Count"], request["DeviceIDs"] or []
    if count != 0 and ids:
        raise Conflict(request)
    if ids:
        return ",".join(ids)
    if count > 0:
        return ",".join(str(i) for i in range(count))
    return "all" if count < 0 else "void"
