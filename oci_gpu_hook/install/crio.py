"""CRI-O: a drop-in in ``/etc/crio/crio.conf.d/`` with the CDI spec directories and an ``oci-gpu`` runtime.

CRI-O reads ``/etc/crio/crio.conf`` and then every file of ``/etc/crio/crio.conf.d/`` in name order,
later files overriding single keys (not whole tables), so a drop-in never loses the host's settings.
The keys are those of crio.conf(5), all under ``[crio.runtime]``:

- ``cdi_spec_dirs``: where CRI-O's native CDI support looks for specs (the preferred path: kubelet
  and the device plugin ask for ``amd.com/gpu=N`` devices, CRI-O edits the spec);
- ``[crio.runtime.runtimes.oci-gpu]`` with ``runtime_path``, ``runtime_type = "oci"`` and
  ``runtime_root``: the RuntimeClass handler ``oci-gpu``, whose containers start through the shim.

CRI-O does not run podman's ``precreate`` hooks, so no hooks directory is configured.  Worse, it refuses to
start when a directory it reads hooks from (``hooks_dir``, by default podman's own default
``/usr/share/containers/oci/hooks.d``) holds one: it loads hooks without podman's extension stages, and a
``precreate`` stage is a fatal "unknown stage" (seen with CRI-O 1.36.3 built by hand, docs/nri.md).
:func:`hooks_dirs` tells install which directories those are.  CRI-O cannot run on the machines the tests run
on: the drop-in is checked statically against these keys.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Callable

from oci_gpu_hook.errors import HookError

DROP_IN_DIR = "/etc/crio/crio.conf.d"
DROP_IN_PATH = f"{DROP_IN_DIR}/99-oci-gpu-hook.conf"
RUNTIME_NAME = "oci-gpu"
RUNTIME_ROOT = "/run/oci-gpu-runtime"
MAIN_CONFIG = "/etc/crio/crio.conf"
DEFAULT_HOOKS_DIRS = ("/usr/share/containers/oci/hooks.d",)  # CRI-O's default hooks_dir (crio.conf(5))
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


def hooks_dirs(disk: Callable[[str], str]) -> list[str]:
    """The directories CRI-O reads OCI hooks from: ``[crio.runtime] hooks_dir`` of its main config and then its
    drop-ins in name order (a later one replaces the list), else its default."""
    paths = [MAIN_CONFIG]
    try:
        paths += [f"{DROP_IN_DIR}/{name}" for name in sorted(os.listdir(disk(DROP_IN_DIR))) if name.endswith(".conf")]
    except OSError:
        pass
    dirs = list(DEFAULT_HOOKS_DIRS)
    for path in paths:
        try:
            with open(disk(path), "rb") as handle:
                data = tomllib.load(handle)
        except FileNotFoundError:
            continue
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise HookError(f"cannot read {disk(path)} ({err}): CRI-O's hooks directories are unknown") from None
        value = ((data.get("crio") or {}).get("runtime") or {}).get("hooks_dir")
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(v, str) and v.startswith("/") for v in value):
            raise HookError(f"{disk(path)}: [crio.runtime] hooks_dir must be a list of absolute paths, not {value!r}")
        dirs = [os.path.normpath(v) for v in value]
    return dirs
