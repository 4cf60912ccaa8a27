"""Lean launchers: the scripts that runtimes and hooks.d run on every container start."""

from __future__ import annotations

import os
import sys

from oci_gpu_hook.errors import HookError

LAUNCHER = """#!{python} -IS
# Lean launcher written by `oci-gpu-hook launchers`: isolated mode (-I: no
# PYTHON* variables, no user site) and no site import (-S), which saves
# ~10 ms per container start.  The package and the site-packages of the
# environment it was installed in are put on sys.path directly.
import os
import sys
for key, value in {defaults!r}.items():
    os.environ.setdefault(key, value)
sys.path[:0] = {paths!r}
from oci_gpu_hook.{module} import main
sys.exit(main())
"""

# launcher file name -> module whose main() it runs
LAUNCHERS = (("oci-gpu-hook", "entry.cli"), ("oci-gpu-runtime", "entry.runtime"))


def launcher_defaults(items: list[str], command: str) -> dict[str, str]:
    """``--set OCI_GPU_HOOK_VAR=VALUE`` items as the defaults a launcher bakes in."""
    defaults = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.startswith("OCI_GPU_HOOK_"):
            raise HookError(f"{command} --set {item!r}: expected OCI_GPU_HOOK_NAME=VALUE")
        defaults[key] = value
    return defaults


def launcher_text(module: str, defaults: dict[str, str]) -> str:
    """The lean launcher that runs ``oci_gpu_hook.<module>.main`` (shared by `launchers` and `install`)."""
    import site

    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = list(dict.fromkeys([package_parent, *site.getsitepackages()]))
    return LAUNCHER.format(python=sys.executable, paths=paths, module=module, defaults=defaults)


