"""The operator subcommands (not on a container's start path): list, dry-run, validate, inspect, cdi, launchers."""

from __future__ import annotations

import json
import os
import sys

from oci_gpu_hook.cliparse import parser as _parser
from oci_gpu_hook.config import KINDS
from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms per container start

if TYPE_CHECKING:
    from collections.abc import Callable

    from oci_gpu_hook.config import Config


def cmd_list(args: list[str], config: Config) -> int:
    parser = _parser("list", "List the host's GPUs and compute partitions, per kind, in each vendor's index order.")
    parser.add_argument("--json", action="store_true", help="print JSON (schemas/inventory.schema.json)")
    opts = parser.parse_args(args)
    from oci_gpu_hook.inventory import scan

    inventory = scan(config.sysfs_root, config.backends, strict=False)
    if opts.json:
        from oci_gpu_hook.models import InventoryModel

        print(InventoryModel.of(inventory).model_dump_json(indent=2))
        return 0
    rows = [("KIND", "INDEX", "PCI ADDRESS", "PARTITION", "MODE", "CARD", "RENDER", "NUMA", "UNIQUE ID", "MODEL")]
    for device in inventory.all_devices:
        card, render = device.card, device.render
        mode = "/".join(m for m in (device.compute_mode, device.memory_mode) if m) or "-"
        rows.append((
            device.kind, str(device.index), device.pci_address,
            "-" if device.partition is None else f"{device.partition} ({device.drm_name})",
            mode, os.path.basename(card.path) if card else "-", os.path.basename(render.path) if render else "-",
            "-" if device.numa_node is None else str(device.numa_node), device.unique_id_hex or "-",
            f"{device.model} ({device.vendor_id}:{device.device_id})",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    if not inventory.all_devices:
        print(f"(no GPUs under {inventory.sysfs_root})")
    for kind, found in inventory.kinds.items():
        if found.shared:
            shared = ", ".join(f"{n.path} ({n.type} {n.major}:{n.minor})" for n in found.shared)
            print(f"shared by {kind} GPUs: {shared}")
    for name, reason in inventory.ignored:
        print(f"ignored: {name}: {reason}")
    return 0


def _spec_path(target: str) -> str:
    return os.path.join(target, "config.json") if os.path.isdir(target) else target


def _load_spec(path: str) -> object:
    from oci_gpu_hook.bundle import read_text

    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as err:
        raise HookError(f"{path} is not valid JSON ({err})") from None


def cmd_dry_run(args: list[str], config: Config) -> int:
    parser = _parser("dry-run", "Print the config.json that the spec-rewrite paths would produce. Changes nothing.")
    parser.add_argument("--devices", metavar="SPEC", help="request these GPUs instead of the container's env")
    parser.add_argument("--diff", action="store_true", help="print a unified diff instead of the whole config")
    parser.add_argument("target", metavar="BUNDLE_DIR|CONFIG_FILE")
    opts = parser.parse_args(args)
    from oci_gpu_hook import schemas
    from oci_gpu_hook.appliers import ocispec
    from oci_gpu_hook.plan import plan_for_spec

    path = _spec_path(opts.target)
    original = _load_spec(path)
    schemas.validate(original, "oci-config.schema.json", path)
    rewritten = json.loads(json.dumps(original))
    plan = plan_for_spec(rewritten, config, opts.devices)
    ocispec.apply(rewritten, plan, config, check_hook=False)
    if plan.edits.links and not os.access(config.hook_path, os.X_OK):
        print(f"# note: hook_path {config.hook_path} is not executable here; the links hook would fail",
              file=sys.stderr)
    schemas.validate(rewritten, "oci-config.schema.json", f"{path} (rewritten)")
    print(f"# {plan.summary()}", file=sys.stderr)
    new_text = json.dumps(rewritten, indent=2) + "\n"
    if opts.diff:
        import difflib

        old_text = json.dumps(original, indent=2) + "\n"
        sys.stdout.writelines(difflib.unified_diff(
            old_text.splitlines(keepends=True), new_text.splitlines(keepends=True),
            fromfile=f"{path} (as given)", tofile=f"{path} (rewritten)"))
    else:
        sys.stdout.write(new_text)
    return 0


def cmd_validate(args: list[str], config: Config) -> int:
    parser = _parser("validate", "Check the config file and OCI config.json files against the project's schemas.")
    parser.add_argument("--config-file", metavar="FILE",
                        help="config file to check (default: OCI_GPU_HOOK_CONFIG or /etc/oci-gpu-hook/config.toml)")
    parser.add_argument("specs", nargs="*", metavar="BUNDLE_DIR|CONFIG_FILE")
    opts = parser.parse_args(args)
    from oci_gpu_hook import schemas
    from oci_gpu_hook.config import DEFAULT_CONFIG_PATH, load_file

    config_path = opts.config_file or os.environ.get("OCI_GPU_HOOK_CONFIG") or DEFAULT_CONFIG_PATH
    if os.path.exists(config_path) or opts.config_file:
        load_file(config_path)  # the very loader every container start runs
        print(f"ok: config file {config_path}")
    else:
        print(f"ok: no config file at {config_path} (defaults apply)")
    for target in opts.specs:
        path = _spec_path(target)
        schemas.validate(_load_spec(path), "oci-config.schema.json", path)
        print(f"ok: {path}")
    return 0


def cmd_launchers(args: list[str], config: Config) -> int:
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
    from oci_gpu_hook.host.launchers import editable_reason, launcher_defaults, write_launchers

    defaults = launcher_defaults(opts.set, "launchers")
    reason = editable_reason()
    if reason and not opts.allow_editable:
        raise HookError(f"launchers: {reason}")
    for path in write_launchers(opts.directory, defaults, native=opts.native):
        print(path)
    return 0


def _device_names(config: Config) -> dict[tuple[str, int, int], str]:
    """What each GPU node number is, to annotate rules (empty when sysfs cannot be read)."""
    from oci_gpu_hook.inventory import scan

    try:
        inventory = scan(config.sysfs_root, config.backends, strict=False)
    except HookError:
        return {}
    names = {}
    for device in inventory.all_devices:
        part = "" if device.partition is None else f" partition {device.partition}"
        for node in device.nodes:
            names[node.number] = f"{device.kind} {device.index} {node.path} ({device.pci_address}{part})"
    for kind, found in inventory.kinds.items():
        for node in found.shared:
            names[node.number] = f"{node.path} (all {kind} GPUs)"
    return names


def cmd_inspect(args: list[str], config: Config) -> int:
    parser = _parser("inspect", "Show what a container's device cgroup lets its processes open.")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--pid", type=int, help="a process of the container")
    target.add_argument("--cgroup", metavar="DIR", help="a cgroup directory (v1 devices or cgroup2)")
    opts = parser.parse_args(args)
    from oci_gpu_hook.appliers import cgroups

    if opts.pid is not None:
        mode = cgroups.mode()
        directory = cgroups.container_cgroup(opts.pid, mode)
    else:
        directory = os.path.abspath(opts.cgroup)
        if os.path.exists(os.path.join(directory, "devices.list")):
            mode = "v1"
        elif os.path.exists(os.path.join(directory, "cgroup.controllers")):
            mode = "v2"
        else:
            raise HookError(f"{directory} is neither a cgroup v1 devices group nor a cgroup2 group")
    names = _device_names(config)

    def show(rule: object) -> str:
        from oci_gpu_hook.core.devices import Rule

        assert isinstance(rule, Rule)
        line = f"  {'allow' if rule.allow else 'deny '} {rule.v1_line()}"
        name = names.get((rule.type, rule.major, rule.minor)) if rule.major is not None else None
        return f"{line:<28}  {name}" if name else line

    if mode == "v1":
        print(f"cgroup v1 devices: {directory}")
        try:
            rules = cgroups.v1_list(directory)
        except OSError as err:
            raise HookError(f"cannot read {directory}/devices.list: {err.strerror}") from None
        everything = any(r.type == "a" and r.major is None and r.minor is None and r.access == "rwm" for r in rules)
        print("  every device is allowed (a *:* rwm)" if everything else "\n".join(show(r) for r in rules))
        if not everything:
            print("  everything else is denied")
        return 0
    from oci_gpu_hook.appliers import bpf, devicefilter

    print(f"cgroup v2: {directory}")
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            flags, ids = bpf.prog_query(fd)
        finally:
            os.close(fd)
    except OSError as err:
        raise HookError(f"cannot query the eBPF programs of {directory}: {err.strerror}") from None
    if not ids:
        print("  no device program attached: every device is allowed (unless an ancestor restricts it)")
    kinds = [name for bit, name in ((bpf.F_ALLOW_MULTI, "multi"), (bpf.F_ALLOW_OVERRIDE, "override")) if flags & bit]
    for prog_id in ids:
        prog_fd = bpf.prog_fd_by_id(prog_id)
        try:
            info = bpf.prog_info(prog_fd)
        finally:
            os.close(prog_fd)
        print(f"program {prog_id} '{info.name}' ({', '.join(kinds) or 'exclusive'}; first match wins):")
        try:
            print("\n".join(show(r) for r in devicefilter.decode(info.insns)))
        except devicefilter.NotDecodable as err:
            print(f"  cannot decode this program ({err}); only runc's format and this project's are known")
    if len(ids) > 1:
        print("an access is allowed only if every program allows it")
    return 0


def cmd_cdi(args: list[str], config: Config) -> int:
    parser = _parser("cdi", "CDI specs of this host's GPUs (one per kind), for podman, containerd and CRI-O.")
    sub = parser.add_subparsers(dest="action", required=True, metavar="generate|list|validate")
    gen = sub.add_parser("generate", help="print (or write) the CDI spec of each kind on this host")
    gen.add_argument("--output", metavar="DIR|FILE",
                     help="write atomically (mode 0644) into DIR as <vendor>-<class>.<format> (/etc/cdi, "
                          "/var/run/cdi), or to FILE with --kind; default: print")
    gen.add_argument("--kind", choices=list(KINDS), help="only this kind (default: every kind with devices)")
    gen.add_argument("--format", choices=("json", "yaml"), default=None,
                     help="default: from the output file's extension, else json")
    sub.add_parser("list", help="the CDI names of this host's devices, and whether the installed specs are current")
    check = sub.add_parser("validate", help="check CDI spec files against schemas/cdi.schema.json")
    check.add_argument("files", nargs="+", metavar="FILE")
    opts = parser.parse_args(args)
    from oci_gpu_hook.appliers import cdi
    from oci_gpu_hook.inventory import scan

    if opts.action == "validate":
        for path in opts.files:
            cdi.validate(cdi.load(path), path)
            print(f"ok: {path}")
        return 0
    inventory = scan(config.sysfs_root, config.backends, strict=False)
    if opts.action == "list":
        for kind in config.backends:
            cdi_kind = config.cdi_kind(kind)
            devices = inventory.devices(kind)
            for name, chosen in cdi.device_names(devices, kind):
                nodes = " ".join(os.path.basename(n.path) for d in chosen for n in d.nodes)
                print(f"{cdi_kind}={name:<20} {nodes}")
            if devices:
                print(f"{cdi_kind}=all")
            installed = config.cdi_spec_path(kind)
            if not os.path.exists(installed):
                state = f"missing (oci-gpu-hook cdi generate --output {config.cdi_dir})" if devices else "none"
            else:
                spec = cdi.generate(inventory, kind, config)
                state = "current" if cdi.load(installed) == spec else "STALE: differs from this host"
            print(f"spec file {installed}: {state}")
        return 0
    kinds = [opts.kind] if opts.kind else [k for k in config.backends if inventory.devices(k)]
    if not kinds or not any(inventory.devices(k) for k in kinds):
        raise HookError(f"no GPUs under {inventory.sysfs_root}: a CDI spec needs at least one device")
    if opts.output and not opts.kind and not os.path.isdir(opts.output):
        raise HookError(f"--output {opts.output}: not a directory (a file needs --kind)")
    for kind in kinds:
        spec = cdi.generate(inventory, kind, config)
        fmt = opts.format or ("yaml" if (opts.output or "").endswith((".yaml", ".yml")) else "json")
        cdi.validate(spec, f"generated CDI spec of {kind}")
        text = cdi.render(spec, fmt)
        if not opts.output:
            sys.stdout.write(text)
            continue
        path = opts.output
        if os.path.isdir(path):
            path = os.path.join(path, cdi.file_name(config, kind, fmt))
        changed = cdi.write(path, text)
        print(f"{'wrote' if changed else 'unchanged'}: {path}", file=sys.stderr)
    return 0


COMMANDS: dict[str, Callable[[list[str], Config], int]] = {
    "list": cmd_list,
    "dry-run": cmd_dry_run,
    "validate": cmd_validate,
    "launchers": cmd_launchers,
    "inspect": cmd_inspect,
    "cdi": cmd_cdi,
}


# Commands that live in their own modules (imported only when used): name -> module with command(args, config).
MODULE_COMMANDS = {"watch": "oci_gpu_hook.host.watch", "install": "oci_gpu_hook.host.install"}
MODULE_COMMANDS["device-plugin"] = "oci_gpu_hook.host.deviceplugin"


def run(command: str, args: list[str], config: Config) -> int:
    handler = COMMANDS.get(command)
    if handler is None and command in MODULE_COMMANDS:
        import importlib

        handler = importlib.import_module(MODULE_COMMANDS[command]).command
    if handler is None:
        valid = ", ".join([*COMMANDS, *MODULE_COMMANDS, "precreate", "prestart", "createRuntime"])
        raise HookError(f"unknown command '{command}' (valid: {valid}; see oci-gpu-hook --help)")
    return handler(args, config)
