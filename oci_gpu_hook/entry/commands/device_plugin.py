"""``oci-gpu-hook device-plugin``: the kubelet device plugin (:mod:`oci_gpu_hook.cluster.deviceplugin`, whose
command line still sits there: it moves here once the device plugin's own work settles)."""

from __future__ import annotations

from oci_gpu_hook.config import Config


def run(args: list[str], config: Config) -> int:
    from oci_gpu_hook.cluster.deviceplugin import command

    return command(args, config)
