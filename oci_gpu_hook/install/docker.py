"""Docker: the ``oci-gpu`` runtime in ``/etc/docker/daemon.json``, merged into the operator's file, and the
name ``docker run --gpus`` looks for.

``docker run --runtime oci-gpu`` then starts containers through ``oci-gpu-runtime`` (dockerd hands
the path to containerd's runc shim as its ``BinaryName``; the shim is called with runc's global flags,
``--root /run/docker/runtime-runc/moby`` and the like).  dockerd passes no environment of its own to
a runtime: the shim's settings come from the config file baked into the launcher
(``install --set OCI_GPU_HOOK_CONFIG=...``) or /etc/oci-gpu-hook/config.toml.

**default-runtime.**  Without ``--runtime oci-gpu`` dockerd runs runc, which knows nothing of
``AMD_VISIBLE_DEVICES``: the container starts without its GPU and nothing says so.
``install --docker-default-runtime`` also writes ``"default-runtime": "oci-gpu"``, so every container
goes through the shim (one without a GPU request goes straight on to runc); it is refused when the file
names another default-runtime (``nvidia``, AMD's ``amd``), which it would silently replace.

**docker run --gpus** (Docker 28.3+, moby ``daemon/devices_amd_linux.go``, ``devices_linux.go``).  When
dockerd starts, it registers a device driver for ``--gpus``: NVIDIA's if ``nvidia-container-runtime-hook``
(29.2+: or ``nvidia-cdi-hook``) is on its PATH, else AMD's if ``amd-container-runtime`` is (from 29.3 also
when CDI is on, the default since 28.2).  AMD's driver only adds ``AMD_VISIBLE_DEVICES`` to the
container's environment, after the image's and ``-e``'s (the last one wins, here as in runc):
``--gpus all`` -> ``all``, ``--gpus 2`` -> ``0,1``, ``--gpus '"device=1,2"'`` -> ``1,2``, no count ->
``void`` (no GPU).  It adds no runtime and no hook, and never runs ``amd-container-runtime``: the
container's runtime (``--runtime`` or ``default-runtime``) does the rest, here the shim.  From 29.3 it
first tries CDI: with an ``amd.com`` spec (and no ``nvidia.com`` one, which it prefers), dockerd itself
injects ``amd.com/gpu=<id>`` from this project's CDI spec and sets no variable; but an id the spec lacks
then falls back to the variable where ``amd-container-runtime`` is on its PATH, and runc ignores it (seen on
a real 29.7.2: a container without its GPU, exit 0).  So install puts a small ``amd-container-runtime``
script (:data:`GPUS_PATH`, on systemd's default PATH; run, it execs the shim) only for a dockerd older than
29.3 (:func:`dockerd_version`), and unless a file of that name that is not ours is on dockerd's PATH (AMD's
toolkit): that one registers the same driver, and is left alone.

Docker 20.10 (Debian 12's docker.io) has no such driver (``--gpus`` fails: "could not select device
driver") and no CDI; Docker 25+ has CDI (``docker run --device amd.com/gpu=1``; on by default from 28.2).

Adding the runtime keeps every other byte of the file where it can: with no ``runtimes`` key yet,
the entry is inserted as one line after the opening brace; otherwise the file is written again from
its parsed value (key order kept).  Removing it undoes exactly that insertion when the line is
still there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from oci_gpu_hook.errors import HookError

DAEMON_JSON = "/etc/docker/daemon.json"
RUNTIME_NAME = "oci-gpu"
GPUS_NAME = "amd-container-runtime"  # moby daemon/devices_amd_linux.go: amdContainerRuntimeExecutableName
GPUS_PATH = f"/usr/local/bin/{GPUS_NAME}"
# systemd's default PATH, which docker.service keeps; dockerd looks the name up there when it starts
DOCKERD_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
NVIDIA_NAMES = ("nvidia-container-runtime-hook", "nvidia-cdi-hook")  # moby registers NVIDIA's driver first
MARK = "# Written by oci-gpu-hook install (docker): the name Docker's --gpus looks for"


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


def _runtimes_line(path: str) -> str:
    """The ``runtimes`` entry install writes into daemon.json: the oci-gpu runtime at ``path``."""
    return f'"runtimes": {{{json.dumps(RUNTIME_NAME)}: {{"path": {json.dumps(path)}}}}}'


def _insertions(path: str, default_runtime: bool) -> list[str]:
    """What install inserts after the opening brace of a file with neither key (without its trailing comma)."""
    default = f'\n  "default-runtime": {json.dumps(RUNTIME_NAME)},'
    return [f"{default if default_runtime else ''}\n  {_runtimes_line(path)}"]


def _has(data: dict[str, Any], path: str, default_runtime: bool) -> bool:
    return ((data.get("runtimes") or {}).get(RUNTIME_NAME) == {"path": path}
            and (not default_runtime or data.get("default-runtime") == RUNTIME_NAME))


def merged(text: str | None, path: str, where: str = DAEMON_JSON, default_runtime: bool = False) -> str | None:
    """``text`` (None: no file) with our runtime (and, with ``default_runtime``, ``"default-runtime": "oci-gpu"``);
    None when it has exactly that already.  A default-runtime other than runc or ours is not replaced."""
    if text is None or not text.strip():
        return "{" + _insertions(path, default_runtime)[0] + "\n}\n"
    data = _parse(text, where)
    if _has(data, path, default_runtime):
        return None
    current = data.get("default-runtime")
    if default_runtime and current not in (None, "runc", RUNTIME_NAME):
        raise HookError(f"{where} has \"default-runtime\": {json.dumps(current)}; --docker-default-runtime would "
                        f"replace it: set it to {json.dumps(RUNTIME_NAME)} yourself, or leave the option out")
    runtimes = data.get("runtimes")
    if runtimes is None and (not default_runtime or "default-runtime" not in data):
        start = text.index("{") + 1
        comma = "," if data else ""
        result = text[:start] + _insertions(path, default_runtime)[0] + comma + text[start:]
    else:
        data["runtimes"] = {**(runtimes or {}), RUNTIME_NAME: {"path": path}}
        if default_runtime:
            data["default-runtime"] = RUNTIME_NAME
        result = json.dumps(data, indent=2) + "\n"
    if not _has(_parse(result, where), path, default_runtime):
        raise HookError(f"could not add the runtime to {where}; add it by hand")
    return result


def unmerged(text: str, path: str, where: str = DAEMON_JSON) -> str | None:
    """``text`` without our runtime entry (and without ``"default-runtime": "oci-gpu"``, which would stop dockerd
    from starting once the runtime is gone); None when it has neither."""
    data = _parse(text, where)
    runtimes = data.get("runtimes")
    ours_default = data.get("default-runtime") == RUNTIME_NAME
    if not (runtimes and RUNTIME_NAME in runtimes) and not ours_default:
        return None
    rest = {k: v for k, v in data.items() if k != "runtimes" and not (k == "default-runtime" and ours_default)}
    for default_runtime in (True, False):
        for comma in (",", ""):
            inserted = _insertions(path, default_runtime)[0] + comma
            if inserted in text:
                result = text.replace(inserted, "", 1)
                try:
                    if _parse(result, where) == rest:
                        return result
                except HookError:
                    pass
    others = {k: v for k, v in (runtimes or {}).items() if k != RUNTIME_NAME}
    if others:
        rest["runtimes"] = others
    ordered = {k: rest[k] for k in data if k in rest}
    return json.dumps(ordered, indent=2) + "\n"


# --- docker run --gpus -----------------------------------------------------------------------------


def gpus_script(runtime: str) -> str:
    """The ``amd-container-runtime`` install puts on dockerd's PATH: Docker only looks for the name; run, it is
    the shim."""
    return (f"#!/bin/sh\n{MARK}.\n"
            "# Docker 28.3+ registers its AMD driver for `docker run --gpus` when a program of this name is on\n"
            "# dockerd's PATH (and NVIDIA's nvidia-container-runtime-hook is not): --gpus all, --gpus 2,\n"
            "# --gpus '\"device=1,2\"' become AMD_VISIBLE_DEVICES=all, 0,1, 1,2 in the container's environment.\n"
            "# dockerd never runs this file; the container's runtime (--runtime oci-gpu, or default-runtime)\n"
            "# reads that variable.  Run anyway, it is that runtime.\n"
            f'exec {runtime} "$@"\n')


def written_by_install(disk_path: str) -> bool:
    """A file install wrote as :data:`GPUS_NAME` (never a symlink: whatever it points at is someone else's)."""
    try:
        if os.path.islink(disk_path):
            return False
        with open(disk_path, "rb") as handle:
            return MARK.encode() in handle.read(256)
    except OSError:
        return False


CDI_GPUS = (29, 3)  # from this release dockerd serves --gpus from an amd.com CDI spec (CDI on: the default)


def dockerd_version(disk: Callable[[str], str]) -> tuple[int, int] | None:
    """The (major, minor) release of the dockerd on dockerd's PATH (as seen through ``disk``), as its
    ``--version`` prints it (moby's build info carries none); None when there is none or it does not say."""
    import re
    import subprocess

    for path in on_dockerd_path(disk, "dockerd"):
        try:
            done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20, check=False,
                                  env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            continue
        found = re.search(r"version v?(\d+)\.(\d+)", done.stdout)
        if done.returncode == 0 and found:
            return int(found.group(1)), int(found.group(2))
    return None


def on_dockerd_path(disk: Callable[[str], str], name: str) -> list[str]:
    """The files called ``name`` in dockerd's PATH directories (as seen through ``disk``), one per real file."""
    found: dict[str, str] = {}
    for directory in DOCKERD_PATH:
        candidate = disk(f"{directory}/{name}")
        if os.path.lexists(candidate):
            found.setdefault(os.path.realpath(candidate), candidate)
    return list(found.values())
