"""The containerd configuration that runs pods of a Kubernetes RuntimeClass through the shim.

A runtime of containerd's CRI plugin whose runc ``BinaryName`` is
``oci-gpu-runtime``: containerd's runc shim (io.containerd.runc.v2) then calls
the shim for every create/start/delete of those pods, and the shim writes the
plan into each bundle before runc sees it.  Written as a drop-in for the main
config's ``imports`` (config version 2, containerd 1.6 and 1.7).
"""

from __future__ import annotations

RUNTIME_NAME = "oci-gpu"  # the RuntimeClass handler
DROP_IN_PATH = "/etc/containerd/conf.d/oci-gpu-hook.toml"


def drop_in(binary: str, runtime_name: str = RUNTIME_NAME) -> str:
    """The drop-in TOML text (the values are quoted as TOML basic strings)."""
    quoted = binary.replace("\\", "\\\\").replace('"', '\\"')
    table = f'plugins."io.containerd.grpc.v1.cri".containerd.runtimes.{runtime_name}'
    return (
        "# Written by oci-gpu-hook: pods of RuntimeClass handler "
        f"'{runtime_name}' run through oci-gpu-runtime.\n"
        "# The main config must import this file: imports = [\"/etc/containerd/conf.d/*.toml\"]\n"
        "version = 2\n\n"
        f"[{table}]\n"
        '  runtime_type = "io.containerd.runc.v2"\n'
        "  # CRI passes pod and container annotations into the OCI spec only when listed here;\n"
        "  # the device plugin's CDI annotations must reach the shim.\n"
        '  pod_annotations = ["cdi.k8s.io/*"]\n'
        '  container_annotations = ["cdi.k8s.io/*"]\n\n'
        f"[{table}.options]\n"
        f'  BinaryName = "{quoted}"\n'
    )
