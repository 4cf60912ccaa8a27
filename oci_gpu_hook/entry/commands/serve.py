"""``oci-gpu-hook serve``: the resident planner the native front asks (:mod:`oci_gpu_hook.host.planner`, whose
command line still sits there: it moves here once the planner's own work settles)."""

from __future__ import annotations

from oci_gpu_hook.config import Config


def run(args: list[str], config: Config) -> int:
    from oci_gpu_hook.host.planner import command

    return command(args, config)
