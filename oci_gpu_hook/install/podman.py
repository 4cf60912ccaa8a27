"""Where podman reads OCI hooks: ``[engine] hooks_dir`` of containers.conf, else its built-in default.

containers.conf is read in this order, each later file overriding the keys it sets:
``/usr/share/containers/containers.conf``, ``/etc/containers/containers.conf``, then the drop-ins
``containers.conf.d/*.conf`` of both directories (sorted by name).  Without ``hooks_dir`` anywhere,
Debian 12's podman 4.3 reads hooks from ``/usr/share/containers/oci/hooks.d`` only (its debug log:
"reading hooks from ..."), which every podman version also reads, so that is where install writes.
``$CONTAINERS_CONF`` (a per-user override) is not followed: install configures the system.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable

from oci_gpu_hook.errors import HookError

DEFAULT_HOOKS_DIR = "/usr/share/containers/oci/hooks.d"
OVERRIDE_HOOKS_DIR = "/etc/containers/oci/hooks.d"
CONF_FILES = ("/usr/share/containers/containers.conf", "/etc/containers/containers.conf")
CONF_DIRS = ("/usr/share/containers/containers.conf.d", "/etc/containers/containers.conf.d")


def conf_files(disk: Callable[[str], str]) -> list[str]:
    """The containers.conf files podman reads, in the order it reads them (real paths)."""
    files = [path for path in CONF_FILES if os.path.isfile(disk(path))]
    for directory in CONF_DIRS:
        try:
            names = sorted(n for n in os.listdir(disk(directory)) if n.endswith(".conf"))
        except OSError:
            continue
        files.extend(f"{directory}/{name}" for name in names if os.path.isfile(disk(f"{directory}/{name}")))
    return files


def hooks_dirs(disk: Callable[[str], str]) -> tuple[list[str], str]:
    """The hooks directories podman reads and where that comes from (a file, or "podman's default")."""
    dirs, source = [DEFAULT_HOOKS_DIR], "podman's built-in default"
    for path in conf_files(disk):
        try:
            with open(disk(path), "rb") as handle:
                data = tomllib.load(handle)
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise HookError(f"cannot read {disk(path)} ({err}): podman's hooks directory is unknown") from None
        value = (data.get("engine") or {}).get("hooks_dir")
        if value is None:
            continue
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.startswith("/")
                                                                for v in value):
            raise HookError(f"{disk(path)}: [engine] hooks_dir must be a list of absolute paths, not {value!r}")
        dirs, source = [os.path.normpath(v) for v in value], path
    return dirs, source


def hooks_dir(disk: Callable[[str], str]) -> tuple[str, str]:
    """The one directory install writes its hook into: the site override directory when podman reads it,
    else the last directory it reads (the one whose files win)."""
    dirs, source = hooks_dirs(disk)
    return (OVERRIDE_HOOKS_DIR if OVERRIDE_HOOKS_DIR in dirs else dirs[-1]), source
