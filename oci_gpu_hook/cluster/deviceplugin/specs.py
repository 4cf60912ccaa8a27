"""The CDI specs the device plugin manages: kept current, and checked before a name is handed out.

A runtime that applies CDI itself (containerd 1.7+/2.x, CRI-O, podman) resolves
the names of Allocate's answer from the spec files in its CDI directories, maybe
long after the plugin answered.  So for every directory the plugin manages
(``--cdi-dir``, default ``cdi_dir``), the spec of each kind it serves there
(``amd.com-gpu.json``, ``nvidia.com-gpu.json``: the files ``cdi generate`` and
``watch`` write) is:

- **kept current**: after every scan of the plugin (each GPU uevent, every
  rescan interval, each Allocate) it is regenerated from that scan's inventory
  with ``watch``'s own code (:func:`oci_gpu_hook.cluster.watch.update_spec`:
  generate, validate, write atomically when the text changed; removed when no
  device of the kind is left), so a node needs no separate ``watch`` for correctness;
- **checked at Allocate**: each name returned must be exactly one device of the
  spec of its kind whose device numbers (major:minor of its ``deviceNodes``, plus
  the spec-wide nodes such as ``/dev/kfd`` or ``/dev/nvidiactl``) are the ones the
  plugin sees now.  A spec that is stale, missing, unreadable or invalid is
  rewritten from the same scan and checked again; if it is still wrong, Allocate
  fails with one line rather than hand out a name the node would resolve to other
  hardware.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from oci_gpu_hook.appliers import cdi
from oci_gpu_hook.cluster.deviceplugin.devices import SERVED, Number, PluginDevice
from oci_gpu_hook.cluster.watch import Outcome, update_spec
from oci_gpu_hook.config import Config
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.inventory import Inventory


def _numbers(edits: object) -> set[Number]:
    nodes = edits.get("deviceNodes") if isinstance(edits, dict) else None
    found = set()
    for node in nodes if isinstance(nodes, list) else ():
        if isinstance(node, dict):
            found.add((str(node.get("type", "c")), node.get("major"), node.get("minor")))
    return found  # type: ignore[return-value]


def _shown(numbers: Iterable[Number]) -> str:
    return " ".join(f"{major}:{minor}" for _type, major, minor in sorted(numbers, key=str)) or "no nodes"


def mismatch(path: str, devices: Sequence[PluginDevice]) -> str | None:
    """Why the spec at ``path`` would not give each device (all of one kind) exactly its own nodes (None: it
    would)."""
    if not devices:
        return None
    kind = devices[0].cdi_kind
    try:
        spec: dict[str, Any] = cdi.load(path)
        cdi.validate(spec, path)
    except HookError as err:
        return f"is unusable ({err})"
    if spec.get("kind") != kind:
        return f"is of kind {spec.get('kind')!r}, not {kind!r}"
    shared = _numbers(spec.get("containerEdits"))
    entries = spec["devices"]
    for device in devices:
        named = [e for e in entries if e.get("name") == device.cdi_name]
        if not named:
            return f"has no device {device.qualified}"
        found = _numbers(named[0].get("containerEdits")) | shared
        wanted = set(device.numbers) | set(device.shared)
        if found != wanted:
            return (f"maps {device.qualified} to {_shown(found)}, not to its device numbers now "
                    f"({_shown(wanted)})")
    return None


class SpecKeeper:
    """The spec of each served kind (``kinds``, default: those of :data:`SERVED` among ``config.backends``) in
    each managed CDI directory."""

    def __init__(self, config: Config, directories: Sequence[str], log: Callable[[str], None],
                 kinds: Sequence[str] | None = None) -> None:
        self.config = config
        self.kinds = tuple(k for k in SERVED if k in (config.backends if kinds is None else kinds))
        self.paths = {kind: [os.path.join(os.path.abspath(d), cdi.file_name(config, kind, "json"))
                             for d in dict.fromkeys(directories)] for kind in self.kinds}
        self.log = log
        self.last: dict[str, Outcome] = {}  # path -> the last outcome (a line per change, not per rescan)

    def update(self, inventory: Inventory, reason: str) -> None:
        """Regenerate every managed spec from ``inventory``; failures are logged (once each), never raised."""
        for kind, paths in self.paths.items():
            for path in paths:
                outcome = self._write(inventory, kind, path)
                last = self.last.get(path)
                if last is None or outcome.kind in ("wrote", "removed") or (
                        "failed" in (outcome.kind, last.kind) and outcome.text != last.text):
                    self.log(f"{reason}: CDI spec {outcome.text}")
                self.last[path] = outcome

    def _write(self, inventory: Inventory, kind: str, path: str) -> Outcome:
        try:
            return update_spec(inventory, kind, path, "json", self.config, name_kind=len(self.kinds) > 1)
        except HookError as err:
            return Outcome("failed", f"failed: {err}")

    def ensure(self, inventory: Inventory, devices: Sequence[PluginDevice]) -> str | None:
        """Check each managed spec of the kind of ``devices`` (all of one kind, as ``inventory`` has them);
        rewrite a wrong one and check it again.  Returns None, or the one line saying why a spec still does not
        map them."""
        if not devices:
            return None
        kind = devices[0].kind
        for path in self.paths.get(kind, ()):
            wrong = mismatch(path, devices)
            if wrong is None:
                continue
            self.log(f"allocate: CDI spec {path} {wrong}: rewriting it")
            outcome = self._write(inventory, kind, path)
            self.last[path] = outcome
            still = mismatch(path, devices)
            if still is not None:
                names = ", ".join(d.qualified for d in devices)
                if outcome.kind == "failed":
                    problem = f"{wrong} and cannot be rewritten ({outcome.text.removeprefix('failed: ')})"
                else:
                    problem = f"still {still} after it was rewritten (is the host changing?)"
                return (f"not allocating {names}: the CDI spec {path} {problem}; a runtime reading it would not "
                        "give these devices")
            self.log(f"allocate: CDI spec {outcome.text}")
        return None
