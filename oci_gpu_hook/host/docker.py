"""Docker: the ``oci-gpu`` runtime in ``/etc/docker/daemon.json``, merged into the operator's file.

``docker run --runtime oci-gpu`` then starts containers through ``oci-gpu-runtime`` (dockerd hands
the path to containerd's runc shim as its ``BinaryName``; the shim is called with runc's global flags,
``--root /run/docker/runtime-runc/moby`` and the like).  dockerd passes no environment of its own to
a runtime: the shim's settings come from the config file baked into the launcher
(``install --set OCI_GPU_HOOK_CONFIG=...``) or /etc/oci-gpu-hook/config.toml.

Docker 20.10 (Debian 12's docker.io) has no CDI; Docker 25+ does with ``"features": {"cdi": true}``
and ``docker run --device amd.com/gpu=1``.

Adding the runtime keeps every other byte of the file where it can: with no ``runtimes`` key yet,
the entry is inserted as one line after the opening brace; otherwise the file is written again from
its parsed value (key order kept).  Removing it undoes exactly that insertion when the line is
still there.
"""

from __future__ import annotations

import json
from typing import Any

from oci_gpu_hook.errors import HookError

DAEMON_JSON = "/etc/docker/daemon.json"
RUNTIME_NAME = "oci-gpu"


def _parse(text: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError as err:
        raise HookError(f"{where} is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise HookError(f"{where}: expected a JSON object")
    runtimes = data.get("runtimes", {})
    if not isinstance(runtimes, dict):
        raise HookError(f"{where}: \"runtimes\" is not an object")
    return data


def _line(path: str) -> str:
    return f'"runtimes": {{{json.dumps(RUNTIME_NAME)}: {{"path": {json.dumps(path)}}}}}'


def merged(text: str | None, path: str, where: str = DAEMON_JSON) -> str | None:
    """``text`` (None: no file) with our runtime; None when it has exactly that entry already."""
    if text is None or not text.strip():
        return "{\n  " + _line(path) + "\n}\n"
    data = _parse(text, where)
    runtimes = data.get("runtimes")
    if runtimes is not None and runtimes.get(RUNTIME_NAME) == {"path": path}:
        return None
    if runtimes is None:
        start = text.index("{") + 1
        rest = text[start:]
        comma = "," if data else ""
        result = text[:start] + "\n  " + _line(path) + comma + rest
    else:
        data["runtimes"] = {**runtimes, RUNTIME_NAME: {"path": path}}
        result = json.dumps(data, indent=2) + "\n"
    if _parse(result, where).get("runtimes", {}).get(RUNTIME_NAME) != {"path": path}:
        raise HookError(f"could not add the runtime to {where}; add it by hand")
    return result


def unmerged(text: str, path: str, where: str = DAEMON_JSON) -> str | None:
    """``text`` without our runtime entry; None when it has none."""
    data = _parse(text, where)
    runtimes = data.get("runtimes")
    if not runtimes or RUNTIME_NAME not in runtimes:
        return None
    for comma in (",", ""):
        inserted = "\n  " + _line(path) + comma
        if inserted in text:
            result = text.replace(inserted, "", 1)
            try:
                if _parse(result, where) == {k: v for k, v in data.items() if k != "runtimes"}:
                    return result
            except HookError:
                pass
    rest = {k: v for k, v in runtimes.items() if k != RUNTIME_NAME}
    if rest:
        data["runtimes"] = rest
    else:
        del data["runtimes"]
    return json.dumps(data, indent=2) + "\n"
