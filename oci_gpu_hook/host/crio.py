"""CRI-O: a drop-in in ``/etc/crio/crio.conf.d/`` with the CDI spec directories and an ``oci-gpu`` runtime.

CRI-O reads ``/etc/crio/crio.conf`` and then every file of ``/etc/crio/crio.conf.d/`` in name order,
later files overriding single keys (not whole tables), so a drop-in never loses the host's settings.
The keys are those of crio.conf(5), all under ``[crio.runtime]``:

- ``cdi_spec_dirs``: where CRI-O's native CDI support looks for specs (the preferred path: kubelet
  and the device plugin ask for ``amd.com/gpu=N`` devices, CRI-O edits the spec);
- ``[crio.runtime.runtimes.oci-gpu]`` with ``runtime_path``, ``runtime_type = "oci"`` and
  ``runtime_root``: the RuntimeClass handler ``oci-gpu``, whose containers start through the shim.

CRI-O does not run podman's ``precreate`` hooks, so no hooks directory is configured.  CRI-O cannot
run on the machines the tests run on: the drop-in is checked statically against these keys.
"""

from __future__ import annotations

import json

DROP_IN_DIR = "/etc/crio/crio.conf.d"
DROP_IN_PATH = f"{DROP_IN_DIR}/99-oci-gpu-hook.conf"
RUNTIME_NAME = "oci-gpu"
RUNTIME_ROOT = "/run/oci-gpu-runtime"
# crio.conf(5) keys the drop-in may use, by table.
KNOWN_KEYS = {
    ("crio", "runtime"): {"cdi_spec_dirs", "hooks_dir", "default_runtime", "runtimes"},
    ("crio", "runtime", "runtimes", RUNTIME_NAME): {"runtime_path", "runtime_type", "runtime_root",
                                                   "monitor_path", "allowed_annotations"},
}


def drop_in(binary: str, cdi_dirs: list[str]) -> str:
    """The drop-in text: CDI spec directories and the runtime handler running ``binary``."""
    dirs = json.dumps(cdi_dirs)
    return (
        "# Written by oci-gpu-hook install: CDI specs for CRI-O's native CDI, and the RuntimeClass\n"
        f"# handler '{RUNTIME_NAME}' whose containers start through oci-gpu-runtime.\n"
        "[crio.runtime]\n"
        f"cdi_spec_dirs = {dirs}\n\n"
        f"[crio.runtime.runtimes.{RUNTIME_NAME}]\n"
        f"runtime_path = {json.dumps(binary)}\n"
        'runtime_type = "oci"\n'
        f"runtime_root = {json.dumps(RUNTIME_ROOT)}\n"
    )
