"""The vendor table: each backend's name, its CDI kind and the container env variables that carry its requests by
default.  The backends themselves (:mod:`oci_gpu_hook.inventory`'s ``amd``, ``intel``, ``nvidia``) are imported only
when a container asks for their kind."""

from __future__ import annotations

KINDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "amd": ("amd.com/gpu", ("AMD_VISIBLE_DEVICES",)),
    "intel": ("intel.com/gpu", ("INTEL_VISIBLE_DEVICES",)),
    "nvidia": ("nvidia.com/gpu", ("NVIDIA_VISIBLE_DEVICES",)),
}
