"""``oci-gpu-hook dra``: the Kubernetes DRA driver (:mod:`oci_gpu_hook.cluster.dra`, where its command line is)."""

from __future__ import annotations

from oci_gpu_hook.config import Config


def run(args: list[str], config: Config) -> int:
    from oci_gpu_hook.cluster.dra import command

    return command(args, config)
