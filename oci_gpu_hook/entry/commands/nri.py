"""``oci-gpu-hook nri``: the NRI plugin (:mod:`oci_gpu_hook.serve.nri`)."""

from __future__ import annotations

import sys

from oci_gpu_hook.cliparse import parser as _parser
from oci_gpu_hook.config import Config


def _log(line: str) -> None:
    print(f"oci-gpu-hook nri: {line}", file=sys.stderr, flush=True)


def run(args: list[str], config: Config) -> int:
    from oci_gpu_hook.serve.nri import plugin

    parser = _parser("nri", "An NRI plugin for containerd 2.x and CRI-O: registers with the runtime's NRI socket "
                            "and returns, for each container created, the GPUs it asks for as a container "
                            "adjustment (device nodes, device cgroup rules, the /dev/dri/by-path mount, env); "
                            "a refused request fails that container with one line.")
    parser.add_argument("--socket", metavar="PATH", default=plugin.DEFAULT_SOCKET,
                        help="the runtime's NRI socket (default %(default)s; ignored when the runtime started the "
                             f"plugin and passed {plugin.SOCKET_ENV})")
    parser.add_argument("--name", metavar="NAME", default=None,
                        help=f"the plugin's name (default: {plugin.NAME_ENV}, else {plugin.DEFAULT_NAME})")
    parser.add_argument("--idx", metavar="NN", default=None,
                        help=f"its two-digit index; plugins are called in ascending order (default: "
                             f"{plugin.IDX_ENV}, else {plugin.DEFAULT_IDX})")
    options = parser.parse_args(args)
    name, idx = plugin.identity(options.name, options.idx, sys.argv[0] if sys.argv else "")
    return plugin.run(config, options.socket, name, idx, _log)
