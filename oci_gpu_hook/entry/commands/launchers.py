"""``oci-gpu-hook launchers DIR``: the lean launchers for the hooks and the runtime shim."""

from __future__ import annotations

import os

from oci_gpu_hook.cliparse import parser as _parser
from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from oci_gpu_hook.config import Config


def run(args: list[str], config: Config) -> int:
    parser = _parser("launchers", "Write lean launchers for the hooks and the runtime shim into DIR.")
    parser.add_argument("directory", metavar="DIR")
    parser.add_argument("--set", action="append", default=[], metavar="OCI_GPU_HOOK_VAR=VALUE",
                        help="bake a default for an OCI_GPU_HOOK_* variable into the launchers "
                             "(runtimes such as podman do not pass their environment on to the shim)")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--native", dest="native", action="store_true", default=None,
                      help="require the native front (a C compiler); default: native when cc is found")
    kind.add_argument("--no-native", dest="native", action="store_false", help="write Python launchers only")
    parser.add_argument("--allow-editable", action="store_true",
                        help="allow a package outside site-packages (a development checkout)")
    opts = parser.parse_args(args)
    from oci_gpu_hook.install.codepaths import editable_reason
    from oci_gpu_hook.install.launchers import for_pods, launcher_defaults, write_launchers
    from oci_gpu_hook.install.paths import LAUNCHER_DIR

    defaults = launcher_defaults(opts.set, "launchers")
    line = None
    reason = editable_reason()
    if reason and not opts.allow_editable:
        raise HookError(f"launchers: {reason}")
    if os.path.abspath(opts.directory) == LAUNCHER_DIR:  # install's: what its manifest lists may serve pods
        from oci_gpu_hook.install.items import kubernetes_facing

        defaults, line = for_pods(defaults, kubernetes_facing(lambda real: real, []), "launchers")
    for path in write_launchers(opts.directory, defaults, native=opts.native):
        print(path)
    if line:
        print(f"note: {line}")
    return 0
