"""Entry points: the hooks, the runtime shim, and the operator commands."""

from __future__ import annotations


def load_start_path(entry: str, kinds: tuple[str, ...] = ()) -> None:
    """Import now every module of the package that the per-container entry point ``entry`` may need on its way
    (:data:`oci_gpu_hook.startpath.ENTRIES`; where it plans, the backend modules of ``kinds``, the config's
    backends, :data:`oci_gpu_hook.startpath.KIND_MODULES`): called as soon as the entry starts, right after the
    launcher's trust walk checked the directories they come from, so that nothing of the package is imported
    later, lazily, from a path that could have been renamed over since.  Its cost, measured (docs/security.md,
    "Nothing is used by path after its check"): ~1.3 ms more for a granting Python start with all three backends
    configured, ~3.5 ms more for a Python start that asks for nothing (the native front starts no Python for
    those)."""
    from oci_gpu_hook.startpath import BACKEND_MODULES, ENTRIES, KIND_MODULES

    names = {name for name in ENTRIES.get(entry, ()) if name.startswith("oci_gpu_hook.")}
    if "oci_gpu_hook.inventory" in names:  # it plans: the backends it may load by name, those of the config
        names -= BACKEND_MODULES
        for kind in kinds:
            names |= KIND_MODULES.get(kind, frozenset())
    for name in sorted(names):
        __import__(name)
