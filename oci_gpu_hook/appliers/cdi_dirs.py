"""The CDI spec directories as CDI consumers read them (podman, containerd, CRI-O: ``pkg/cdi``'s ``spec-dirs.go``
and ``cache.go``): which files they load, in which priority, and which device names they drop.

A later directory overrides an earlier one; in the highest-priority directory that names a device, one file
wins, and two files there are a conflict: the device is dropped.  A file that does not load is skipped, the
others still count (each problem is collected, never the whole set refused).
"""

from __future__ import annotations

import os
from typing import Any

from oci_gpu_hook.appliers import cdi
from oci_gpu_hook.config import Config
from oci_gpu_hook.errors import HookError

SPEC_EXTENSIONS = (".json", ".yaml")  # what CDI consumers read (pkg/cdi/spec-dirs.go); nothing else
DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")  # CDI's order: a later directory overrides an earlier one


def consumer_dirs(config: Config) -> list[str]:
    """CDI's default spec directories, plus ``cdi_dir`` when it is neither of them (as a containerd
    ``cdi_spec_dirs`` setting would add it)."""
    dirs = list(DEFAULT_SPEC_DIRS)
    if os.path.realpath(config.cdi_dir) not in {os.path.realpath(d) for d in dirs}:
        dirs.append(config.cdi_dir)
    return dirs


def read_spec_dirs(dirs: list[str], ours: set[str]) -> tuple[list[tuple[int, str, dict[str, Any]]], list[str]]:
    """Every spec file in ``dirs`` as CDI consumers read them: (priority, path, spec) for the loadable ones,
    and the problems: a file CDI would drop that is (or may be) of one of our kinds, an unreadable dir."""
    found: list[tuple[int, str, dict[str, Any]]] = []
    problems: list[str] = []
    for priority, directory in enumerate(dirs):
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            continue
        except OSError as err:
            problems.append(f"cannot list the spec directory {directory}: {err.strerror}")
            continue
        for name in names:
            path = os.path.join(directory, name)
            if os.path.isdir(path) or not name.endswith(SPEC_EXTENSIONS):
                continue
            try:
                spec = cdi.load(path)
                kind = spec.get("kind")
                if kind in ours or not isinstance(kind, str):
                    cdi.validate(spec, path)
            except HookError as err:
                problems.append(f"invalid spec file (CDI consumers skip it): {err}")
                continue
            found.append((priority, path, spec))
    return found, problems


def hooks_of(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """(path, the devices that run it) for every hook a CDI spec names: spec-wide hooks run for any of its
    devices."""
    def hooks(edits: object) -> list[str]:
        found = edits.get("hooks") if isinstance(edits, dict) else None
        return [h["path"] for h in found or [] if isinstance(h, dict) and isinstance(h.get("path"), str)]

    named: dict[str, list[str]] = {}
    for path in hooks(spec.get("containerEdits")):
        named.setdefault(path, []).append("all of its devices")
    for device in spec.get("devices") or []:
        if isinstance(device, dict) and isinstance(device.get("name"), str):
            for path in hooks(device.get("containerEdits")):
                named.setdefault(path, []).append(device["name"])
    return [(path, ", ".join(users[:6]) + (" ..." if len(users) > 6 else "")) for path, users in named.items()]


def device_names_of(spec: dict[str, Any]) -> list[str]:
    return [d["name"] for d in spec.get("devices") or [] if isinstance(d, dict) and isinstance(d.get("name"), str)]


def conflicts(cdi_kind: str, installed: str, found: list[tuple[int, str, dict[str, Any]]]) -> list[str]:
    """Other spec files that name devices of ``cdi_kind``, and what CDI consumers make of each name: in the
    highest-priority directory that names it, one file wins; two files there are a conflict, and the
    device is dropped (pkg/cdi/cache.go)."""
    holders: dict[str, list[tuple[int, str]]] = {}
    for priority, path, spec in found:
        if spec.get("kind") == cdi_kind:
            for name in device_names_of(spec):
                holders.setdefault(name, []).append((priority, path))
    real = os.path.realpath(installed)
    problems = []
    for priority, path, spec in found:
        if spec.get("kind") != cdi_kind or os.path.realpath(path) == real:
            continue
        dropped, wins, loses = [], [], []
        for name in device_names_of(spec):
            top = max(p for p, _ in holders[name])
            at_top = [h for h in holders[name] if h[0] == top]
            if len(at_top) > 1 and (priority, path) in at_top:
                dropped.append(name)
            elif top == priority:
                wins.append(name)
            else:
                loses.append(name)
        parts = [f"{what}: {', '.join(names[:6])}{' ...' if len(names) > 6 else ''}" for what, names in (
            ("conflict, CDI consumers drop", dropped), ("it provides", wins), ("overridden", loses)) if names]
        problems.append(f"{path} also defines {cdi_kind} devices ({'; '.join(parts)})")
    return problems
