"""The API server, over plain HTTPS with the pod's in-cluster credentials: no client library.

In a pod the service account's token and the cluster's CA are in
``/var/run/secrets/kubernetes.io/serviceaccount`` and the API server's address
in ``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT``; every one of them
can be given instead (``--kube-api-server``, ``--kube-token-file``,
``--kube-ca-file``: tests point them at a fake API server).  The token is read
again for every request (a projected token is rotated under a running pod).
The server's certificate is always verified against the CA; there is no
"insecure" switch.  Every failure is an :class:`ApiError` with one line.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import urllib.parse
from dataclasses import dataclass
from typing import Any

from oci_gpu_hook.errors import HookError

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
TIMEOUT_S = 15.0


class ApiError(HookError):
    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Credentials:
    server: str  # https://host:port
    token_file: str
    ca_file: str

    @classmethod
    def in_cluster(cls, server: str | None = None, token_file: str | None = None,
                   ca_file: str | None = None) -> Credentials:
        if not server:
            host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
            if not host or not port:
                raise ApiError("no API server: KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are not set (not in a "
                               "pod?); give --kube-api-server https://HOST:PORT")
            server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        if not server.startswith("https://"):
            raise ApiError(f"--kube-api-server {server}: expected https://HOST[:PORT]")
        return cls(server.rstrip("/"), token_file or os.path.join(SERVICE_ACCOUNT, "token"),
                   ca_file or os.path.join(SERVICE_ACCOUNT, "ca.crt"))


class Client:
    """GET, POST, PUT, DELETE of JSON objects; one connection per request (a few requests a minute)."""

    def __init__(self, credentials: Credentials, timeout: float = TIMEOUT_S) -> None:
        self.credentials = credentials
        self.timeout = timeout
        parsed = urllib.parse.urlsplit(credentials.server)
        self.host = parsed.hostname or ""
        self.port = parsed.port or 443
        try:
            self.context = ssl.create_default_context(cafile=credentials.ca_file)
        except (OSError, ssl.SSLError) as err:
            raise ApiError(f"cannot read the cluster CA {credentials.ca_file}: {err}") from None

    def _token(self) -> str:
        try:
            with open(self.credentials.token_file, encoding="utf-8") as handle:
                return handle.read().strip()
        except OSError as err:
            raise ApiError(f"cannot read the service account token {self.credentials.token_file}: "
                           f"{err.strerror}") from None

    def request(self, method: str, path: str, body: dict[str, Any] | None = None,
                query: dict[str, str] | None = None) -> dict[str, Any]:
        url = path + ("?" + urllib.parse.urlencode(query) if query else "")
        headers = {"Authorization": f"Bearer {self._token()}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        connection = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self.context)
        try:
            connection.request(method, url, body=data, headers=headers)
            response = connection.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException) as err:
            raise ApiError(f"{method} {self.credentials.server}{path}: {err}") from None
        finally:
            connection.close()
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:
            answer = {}
        if not isinstance(answer, dict):
            answer = {}
        if response.status >= 300:
            message = answer.get("message") or raw[:200].decode(errors="replace") or response.reason
            raise ApiError(f"{method} {path}: {response.status} {' '.join(str(message).split())}", response.status)
        return answer

    def get(self, path: str, query: dict[str, str] | None = None) -> dict[str, Any]:
        return self.request("GET", path, query=query)

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", path, body)

    def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("PUT", path, body)

    def delete(self, path: str) -> dict[str, Any]:
        return self.request("DELETE", path)
