"""``oci-gpu-hook validate``: the config file, and OCI config.json files as a container start would resolve them."""

from __future__ import annotations

import json
import os

from oci_gpu_hook.cliparse import parser as _parser
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.oci_spec import ContainerSpec, config_file, load_document

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from oci_gpu_hook.config import Config


def run(args: list[str], config: Config) -> int:
    parser = _parser("validate", "Check the config file, and OCI config.json files against the project's schemas "
                                 "and this host: the GPUs each one asks for, as a container start would resolve "
                                 "them.")
    parser.add_argument("--config-file", metavar="FILE",
                        help="config file to check (default: OCI_GPU_HOOK_CONFIG or /etc/oci-gpu-hook/config.toml)")
    parser.add_argument("--rootless", metavar="USER",
                        help="also check each spec as USER's rootless podman would run it: every device node it gets "
                             "must be the host's node of that device, openable by USER without supplementary groups")
    parser.add_argument("specs", nargs="*", metavar="BUNDLE_DIR|CONFIG_FILE")
    opts = parser.parse_args(args)
    from oci_gpu_hook import schemas
    from oci_gpu_hook.config import DEFAULT_CONFIG_PATH, load_file

    config_path = opts.config_file or os.environ.get("OCI_GPU_HOOK_CONFIG") or DEFAULT_CONFIG_PATH
    mask = config.mask_other_gpus
    if os.path.exists(config_path) or opts.config_file:
        mask = load_file(config_path).get("mask_other_gpus")  # the very loader every container start runs
        print(f"ok: config file {config_path}")
    else:
        print(f"ok: no config file at {config_path} (defaults apply)")
    from oci_gpu_hook.install.guard import package_problem

    why = package_problem()  # every file once: the launchers walk only down to site-packages at each start
    if why:
        raise HookError(why)
    from oci_gpu_hook.appliers.cdi import mask_ignored

    if mask_ignored(mask):
        print(f"warning: {mask_ignored(mask)}")
    if "nvidia" in config.backends:  # what a GPU container will get of the driver, and what it will not
        from oci_gpu_hook.inventory import nvdriver

        for line in nvdriver.report(config.proc_root, config.driver_root, config.sysfs_root):
            print(line)
    from oci_gpu_hook.install.kubelet import env_requests_line

    pods = env_requests_line()
    if pods:
        print(pods)
    user = _user(opts.rootless) if opts.rootless is not None else None
    if user is not None:
        print(_check_pins())
    for target in opts.specs:
        path = config_file(target)
        spec = load_document(path)
        schemas.validate(spec, "oci-config.schema.json", path)
        print(f"ok: {path}: {_check_request(spec, path, config, user)}")
    return 0


def _check_pins() -> str:
    """What a rootless hook makes of the install's pins (docs/security.md): one line, or the error that every
    rootless GPU request would meet."""
    from oci_gpu_hook import trust
    from oci_gpu_hook.install.paths import LAUNCHER_DIR
    from oci_gpu_hook.pins import PINS_NAME

    path = os.path.join(LAUNCHER_DIR, PINS_NAME)
    if not os.path.exists(path):
        return f"warning: no {path}: rootless hooks here check no pins (run oci-gpu-hook install)"
    if trust.read_pins(path).get("") == trust.TOO_LARGE:
        raise HookError(f"{path} is larger than {trust.MAX_PINS} bytes, so a rootless hook reads none of it and "
                        "refuses every GPU request: run oci-gpu-hook install again")
    changed = trust.unpinned(path)
    if changed:
        raise HookError(f"{changed[0]} changed after `oci-gpu-hook install` ran ({len(changed)} pinned entries in "
                        f"all): a rootless hook refuses every GPU request until install runs again")
    return f"ok: {path}: every pinned entry is as install saw it"


def _user(text: str) -> tuple[int, int]:
    """``--rootless USER``: (uid, primary gid) of a user name or number (a number without an entry: its own gid)."""
    import pwd

    try:
        entry = pwd.getpwuid(int(text)) if text.isdigit() else pwd.getpwnam(text)
    except KeyError:
        if text.isdigit():
            return int(text), int(text)
        raise HookError(f"--rootless {text!r}: no such user (give a user name or uid)") from None
    return entry.pw_uid, entry.pw_gid


def _check_request(spec: object, path: str, config: Config, user: tuple[int, int] | None = None) -> str:
    """What the spec-rewrite paths would give this container on this host (the plan's summary), after the same
    rewrite in memory; a request that would stop the container is its one-line error, naming ``path``.  ``user``:
    (uid, gid) of a rootless runtime, whose hook refuses what that user could not be given
    (:mod:`oci_gpu_hook.appliers.rootless`)."""
    from oci_gpu_hook.appliers import ocispec
    from oci_gpu_hook.plan import plan_for_spec

    try:
        copy = ContainerSpec(json.loads(json.dumps(spec)))
        plan = plan_for_spec(copy, config)
        ocispec.apply(copy, plan, config, prepare=False)  # writes nothing: not even the by-path directory
        if user is not None:
            from oci_gpu_hook.appliers import rootless

            rootless.check_nodes(plan.edits.nodes, *user, who=f"rootless container of uid {user[0]}")
    except HookError as err:
        raise HookError(f"{path}: {err}") from None
    if user is not None and plan.edits.nodes:
        return f"{plan.summary()}; rootless as uid {user[0]}: every node is the host's and opens for that user"
    return plan.summary()
