"""The operator subcommands (not on a container's start path): list, dry-run, validate, inspect, cdi, launchers."""

from __future__ import annotations

import json
import os
import sys

from oci_gpu_hook.cliparse import parser as _parser
from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms per container start

if TYPE_CHECKING:
    from collections.abc import Callable

    from oci_gpu_hook.config import Config


def cmd_list(args: list[str], config: Config) -> int:
    parser = _parser("list", "List the host's GPUs in index order (PCI address order).")
    parser.add_argument("--json", action="store_true", help="print JSON (schemas/inventory.schema.json)")
    opts = parser.parse_args(args)
    from oci_gpu_hook.inventory import scan

    inventory = scan(config.sysfs_root)
    if opts.json:
        from oci_gpu_hook.models import InventoryModel

        print(InventoryModel.of(inventory).model_dump_json(indent=2))
        return 0
    rows = [("INDEX", "PCI ADDRESS", "CARD", "RENDER", "NUMA", "UNIQUE ID", "MODEL")]
    for gpu in inventory.gpus:
        rows.append((
            str(gpu.index), gpu.pci_address,
            os.path.basename(gpu.card.path) if gpu.card else "-",
            os.path.basename(gpu.render.path),
            "-" if gpu.numa_node is None else str(gpu.numa_node),
            gpu.unique_id_hex or "-",
            f"{gpu.model} ({gpu.vendor} {gpu.device_id})",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    if not inventory.gpus:
        print(f"(no GPUs under {inventory.sysfs_root})")
    for vendor, nodes in sorted(inventory.shared_nodes.items()):
        shared = ", ".join(f"{n.path} ({n.type} {n.major}:{n.minor})" for n in nodes)
        print(f"shared by {vendor} GPUs: {shared}")
    return 0


def _spec_path(target: str) -> str:
    return os.path.join(target, "config.json") if os.path.isdir(target) else target


def _load_spec(path: str) -> object:
    from oci_gpu_hook.appliers.ocispec import read_text

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
    from oci_gpu_hook.appliers import ocispec as spec
    from oci_gpu_hook.plan import plan_for_spec

    path = _spec_path(opts.target)
    original = _load_spec(path)
    schemas.validate(original, "oci-config.schema.json", path)
    rewritten = json.loads(json.dumps(original))
    plan = plan_for_spec(rewritten, config, opts.devices)
    spec.apply(rewritten, plan)
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
    from pydantic import ValidationError

    from oci_gpu_hook import schemas
    from oci_gpu_hook.config import DEFAULT_CONFIG_PATH
    from oci_gpu_hook.models import ConfigModel

    config_path = opts.config_file or os.environ.get("OCI_GPU_HOOK_CONFIG") or DEFAULT_CONFIG_PATH
    if os.path.exists(config_path) or opts.config_file:
        import tomllib

        try:
            with open(config_path, "rb") as handle:
                ConfigModel.model_validate(tomllib.load(handle))
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise HookError(f"config file {config_path}: {err}") from None
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise HookError(f"config file {config_path}: {where}: {first['msg']}") from None
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
    opts = parser.parse_args(args)
    from oci_gpu_hook.host.launchers import LAUNCHERS, launcher_defaults, launcher_text

    defaults = launcher_defaults(opts.set, "launchers")
    os.makedirs(opts.directory, exist_ok=True)
    from oci_gpu_hook.atomic import write_atomic

    for name, module in LAUNCHERS:
        path = os.path.join(opts.directory, name)
        write_atomic(path, launcher_text(module, defaults), 0o755)
        print(path)
    return 0


def _device_names(config: Config) -> dict[tuple[str, int, int], str]:
    """What each GPU node number is, to annotate rules (empty when sysfs cannot be read)."""
    from oci_gpu_hook.inventory import scan

    try:
        inventory = scan(config.sysfs_root)
    except HookError:
        return {}
    names = {}
    for gpu in inventory.gpus:
        for node in gpu.nodes:
            names[(node.type, node.major, node.minor)] = f"GPU {gpu.index} {node.path} ({gpu.pci_address})"
    for vendor, nodes in inventory.shared_nodes.items():
        for node in nodes:
            names[(node.type, node.major, node.minor)] = f"{node.path} (all {vendor} GPUs)"
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
    parser = _parser("cdi", "CDI specs of this host's GPUs, for podman, containerd and CRI-O.")
    sub = parser.add_subparsers(dest="action", required=True, metavar="generate|list|validate")
    gen = sub.add_parser("generate", help="print (or write) the CDI spec of this host")
    gen.add_argument("--output", metavar="FILE|DIR",
                     help="write it atomically (mode 0644) to FILE, or to DIR/<vendor>-<class>.<format> "
                          "(/etc/cdi, /var/run/cdi); default: print it")
    gen.add_argument("--format", choices=("json", "yaml"), default=None,
                     help="default: from the output file's extension, else json")
    sub.add_parser("list", help="the CDI names of this host's GPUs, and whether the installed spec is current")
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
    inventory = scan(config.sysfs_root)
    spec = cdi.generate(inventory, config)
    if opts.action == "list":
        for gpu in inventory.gpus:
            names = cdi.device_names(gpu)
            nodes = " ".join(os.path.basename(n.path) for n in gpu.nodes)
            print(f"{config.cdi_kind}={names[0]:<3} {nodes:<22} also: "
                  + ", ".join(f"{config.cdi_kind}={n}" for n in names[1:]))
        if inventory.gpus:
            print(f"{config.cdi_kind}=all")
        else:
            print(f"(no GPUs under {inventory.sysfs_root}: the spec would have no devices)")
        installed = config.cdi_spec
        if not os.path.exists(installed):
            print(f"spec file {installed}: missing (oci-gpu-hook cdi generate --output {installed})")
        else:
            current = cdi.load(installed) == spec
            print(f"spec file {installed}: {'current' if current else 'STALE: differs from this host'}")
        return 0
    if not inventory.gpus:
        raise HookError(f"no GPUs under {inventory.sysfs_root}: a CDI spec needs at least one device")
    fmt = opts.format or ("yaml" if (opts.output or "").endswith((".yaml", ".yml")) else "json")
    cdi.validate(spec, "generated CDI spec")
    text = cdi.render(spec, fmt)
    if not opts.output:
        sys.stdout.write(text)
        return 0
    path = cdi.output_path(opts.output, config, fmt)
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
