"""``oci-gpu-hook install``: its command line (the work is :mod:`oci_gpu_hook.install.guard`'s)."""

from __future__ import annotations

import os

from oci_gpu_hook.cliparse import parser as _parser
from oci_gpu_hook.config import Config
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.install.guard import Options, install_or_uninstall, one_at_a_time
from oci_gpu_hook.install.installer import Installer
from oci_gpu_hook.install.paths import HOOK_STAGES, INTEGRATIONS, MANIFEST_PATH


def parse_only(value: str | None) -> set[str] | None:
    if value is None:
        return None
    names = {n.strip() for n in value.split(",") if n.strip()}
    unknown = names - set(INTEGRATIONS)
    if unknown or not names:
        raise HookError(f"install --only {value!r}: expected a comma list of {', '.join(INTEGRATIONS)}")
    return names


def run(args: list[str], config: Config) -> int:
    parser = _parser("install", "Install the launchers and each integration (podman hook, CDI specs, docker runtime, "
                                "containerd and CRI-O drop-ins, the systemd watch and planner units), recorded in a "
                                "manifest; or take them out again (--uninstall).  A killed run is rolled back by the "
                                "next.")
    parser.add_argument("--only", metavar="LIST", default=None,
                        help=f"only these integrations (comma list of {', '.join(INTEGRATIONS)}); each is done "
                             "even where its /etc directory is missing")
    parser.add_argument("--hook", choices=(*HOOK_STAGES, "none"), default=None,
                        help="the podman hooks.d file to install into the hooks directory podman reads "
                             "(default: precreate)")
    parser.add_argument("--set", action="append", default=[], metavar="OCI_GPU_HOOK_VAR=VALUE",
                        help="bake a default into the launchers, as `oci-gpu-hook launchers --set` does")
    parser.add_argument("--prefix", metavar="DIR", default="",
                        help="put every file under DIR, created if missing (staging, packaging, tests); the paths "
                             "written into files (hook.path, BinaryName, runtime paths) stay the real ones")
    parser.add_argument("--dry-run", action="store_true",
                        help="print what would be written (new, replaced, unchanged; content or diff); write nothing")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--native", dest="native", action="store_true", default=None,
                      help="require the native front: exit 1, writing nothing, when it cannot be built (default: "
                           "the native front when a C compiler is found, and then it must build)")
    kind.add_argument("--no-native", dest="native", action="store_false",
                      help="Python launchers only (each container start then pays a Python start)")
    parser.add_argument("--allow-editable", action="store_true",
                        help="install from an editable (development) install; root would then run code from it")
    parser.add_argument("--docker-default-runtime", action="store_true",
                        help="docker: also make oci-gpu dockerd's default-runtime, so that every docker run (and "
                             "--gpus) goes through the shim; refused when daemon.json names another default-runtime")
    parser.add_argument("--containerd-version", metavar="X.Y", default=None,
                        help="the node's containerd version (default: found under --host-root: the binary "
                             "containerd.service runs, the usual binary paths, dpkg; else the main config's version)")
    parser.add_argument("--host-root", metavar="DIR", default=None,
                        help="where this install sees the node's root file system (read only is enough; /host in a "
                             "pod with the node's / mounted there): install looks there for containerd's binary and "
                             "package (default: the --prefix, else /)")
    parser.add_argument("--uninstall", action="store_true",
                        help=f"remove what the manifest ({MANIFEST_PATH}) lists, restoring the files install "
                             "replaced; a file changed since install is kept, with what it names (exit 1, a 'left:' "
                             "line for each; run it again once resolved)")
    opts = parser.parse_args(args)
    only = parse_only(opts.only)
    if opts.containerd_version is not None:
        from oci_gpu_hook.install.containerd_detect import explicit

        explicit(opts.containerd_version)  # a bad value stops here, before anything is read or written
    if opts.host_root is not None and not os.path.isdir(opts.host_root):
        raise HookError(f"install --host-root {opts.host_root}: not a directory (the node's / as mounted here)")
    if not opts.uninstall:  # first: a broken config stops the install before anything is written, --prefix too
        from oci_gpu_hook.install.launchers import check_live_config, launcher_defaults

        check_live_config(launcher_defaults(opts.set, "install"))
    if opts.prefix and not os.path.isdir(opts.prefix):
        if os.path.lexists(opts.prefix):
            raise HookError(f"install --prefix {opts.prefix}: not a directory")
        if not opts.dry_run:
            try:
                os.makedirs(opts.prefix, 0o755)
            except OSError as err:
                raise HookError(f"install --prefix {opts.prefix}: cannot create it ({err.strerror})") from None
    installer = Installer(opts.prefix, opts.dry_run)
    options = Options(uninstall=opts.uninstall, dry_run=opts.dry_run, hook=opts.hook, set=opts.set,
                      native=opts.native, allow_editable=opts.allow_editable,
                      docker_default_runtime=opts.docker_default_runtime,
                      containerd_version=opts.containerd_version, host_root=opts.host_root)
    if opts.dry_run:
        return install_or_uninstall(options, only, installer, config)
    return one_at_a_time(installer, lambda: install_or_uninstall(options, only, installer, config))
