"""The operator subcommands (not on a container's start path): list, dry-run, validate, inspect, cdi, launchers."""

from __future__ import annotations

import json
import os
import sys

from oci_gpu_hook.cliparse import UsageError
from oci_gpu_hook.cliparse import parser as _parser
from oci_gpu_hook.config import KINDS
from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms per container start

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from oci_gpu_hook.config import Config
    from oci_gpu_hook.inventory import Inventory


def cmd_list(args: list[str], config: Config) -> int:
    parser = _parser("list", "List the host's GPUs and compute partitions, per kind, in each vendor's index order; "
                             "NAME is the stable CDI name (the same hardware while others come and go).")
    parser.add_argument("--json", action="store_true", help="print JSON (schemas/inventory.schema.json)")
    opts = parser.parse_args(args)
    from oci_gpu_hook.inventory import scan_host, stable_name

    inventory = scan_host(config)
    if opts.json:
        from oci_gpu_hook.models import InventoryModel

        print(InventoryModel.of(inventory).model_dump_json(indent=2))
        return 0
    rows = [("KIND", "INDEX", "NAME", "PCI ADDRESS", "PARTITION", "MODE", "CARD", "RENDER", "NUMA", "UNIQUE ID",
             "MODEL")]
    for device in inventory.all_devices:
        card, render = device.card, device.render
        mode = "/".join(m for m in (device.compute_mode, device.memory_mode) if m) or "-"
        rows.append((
            device.kind, device.label, stable_name(device), device.pci_address,
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
    from oci_gpu_hook.bundle import loads, read_text

    try:
        return loads(read_text(path))  # as the runtime reads it: the same refusals as every other entry point
    except HookError as err:
        raise HookError(f"{path}: {err}") from None


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
    ocispec.apply(rewritten, plan, config)  # the links hook as the shim would name it, or the shim's refusal
    schemas.validate(rewritten, "oci-config.schema.json", f"{path} (rewritten)")
    print(f"# {plan.summary()}", file=sys.stderr)
    new_text = json.dumps(rewritten, indent=2, allow_nan=False) + "\n"
    if opts.diff:
        import difflib

        old_text = json.dumps(original, indent=2, allow_nan=False) + "\n"
        sys.stdout.writelines(difflib.unified_diff(
            old_text.splitlines(keepends=True), new_text.splitlines(keepends=True),
            fromfile=f"{path} (as given)", tofile=f"{path} (rewritten)"))
    else:
        sys.stdout.write(new_text)
    return 0


def cmd_validate(args: list[str], config: Config) -> int:
    parser = _parser("validate", "Check the config file, and OCI config.json files against the project's schemas "
                                 "and this host: the GPUs each one asks for, as a container start would resolve "
                                 "them.")
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
        spec = _load_spec(path)
        schemas.validate(spec, "oci-config.schema.json", path)
        print(f"ok: {path}: {_check_request(spec, path, config)}")
    return 0


def _check_request(spec: object, path: str, config: Config) -> str:
    """What the spec-rewrite paths would give this container on this host (the plan's summary), after the same
    rewrite in memory; a request that would stop the container is its one-line error, naming ``path``."""
    from oci_gpu_hook.appliers import ocispec
    from oci_gpu_hook.plan import plan_for_spec

    copy = json.loads(json.dumps(spec))
    try:
        plan = plan_for_spec(copy, config)
        ocispec.apply(copy, plan, config)
    except HookError as err:
        raise HookError(f"{path}: {err}") from None
    return plan.summary()


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
    from oci_gpu_hook.inventory import scan_host

    try:
        inventory = scan_host(config)
    except HookError:
        return {}
    names = {}
    for device in inventory.all_devices:
        part = "" if device.partition is None else f" partition {device.partition}"
        for node in (*device.nodes, *device.display_nodes):
            if device.mig is None or node.number not in names:  # a MIG device shares its GPU's node
                names[node.number] = f"{device.kind} {device.label} {node.path} ({device.pci_address}{part})"
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
        from oci_gpu_hook.core.rules import Policy

        everything = Policy.of(rules).default_allow  # devices.list shows "a *:* rwm" alone in default-allow mode
        print("  every device is allowed (a *:* rwm), except what devices.deny took away (v1 does not show it)"
              if everything else "\n".join(show(r) for r in rules))
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


SPEC_EXTENSIONS = (".json", ".yaml")  # what CDI consumers read (pkg/cdi/spec-dirs.go); nothing else
SPEC_FILE_EXTENSIONS = (".json", ".yaml", ".yml")  # what `cdi generate --output` takes as a file, not a directory
DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")  # CDI's order: a later directory overrides an earlier one


def make_dirs(directory: str, what: str) -> None:
    """Create ``directory`` and any missing parent, each mode 0755 whatever the umask, only below a directory
    nobody but root (or the invoking user) can change (:mod:`oci_gpu_hook.trust`); one line on failure."""
    from oci_gpu_hook.trust import problem

    missing = []
    path = os.path.abspath(directory)
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        raise HookError(f"{what} {directory}: {path} is not a directory")
    why = problem(directory if not missing else path)
    if why:
        raise HookError(f"{what} {directory} is not trusted: {why} (CDI consumers run as root and apply what "
                        "a spec there says)")
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o755)
            os.chmod(path, 0o755)
        except FileExistsError:
            if not os.path.isdir(path):
                raise HookError(f"{what} {directory}: {path} is not a directory") from None
        except OSError as err:
            raise HookError(f"{what} {directory}: cannot create {path}: {err.strerror}") from None


def spec_dirs(text: str | None, config: Config) -> list[str]:
    """``--spec-dirs`` (comma-separated, in CDI's order), or CDI's defaults plus ``cdi_dir`` when it is
    neither of them (as a containerd ``cdi_spec_dirs`` setting would add it)."""
    if text is not None:
        dirs = [os.path.abspath(d) for d in text.split(",") if d]
        if not dirs:
            raise UsageError(f"--spec-dirs {text!r}: expected a comma-separated list of directories")
        return dirs
    dirs = list(DEFAULT_SPEC_DIRS)
    if os.path.realpath(config.cdi_dir) not in {os.path.realpath(d) for d in dirs}:
        dirs.append(config.cdi_dir)
    return dirs


def _read_spec_dirs(dirs: list[str], ours: set[str]) -> tuple[list[tuple[int, str, dict[str, Any]]], list[str]]:
    """Every spec file in ``dirs`` as CDI consumers read them: (priority, path, spec) for the loadable ones,
    and the problems: a file CDI would drop that is (or may be) of one of our kinds, an unreadable dir."""
    from oci_gpu_hook.appliers import cdi

    found: list[tuple[int, str, dict[str, Any]]] = []
    problems: list[str] = []
    for priority, directory in enumerate(dirs):
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            continue
        except OSError as err:
            problems.append(f"cannot list the spec directory {directory}: {err.strerror}")
            continue
        for name in names:
            path = os.path.join(directory, name)
            if os.path.isdir(path) or not name.endswith(SPEC_EXTENSIONS):
                continue
            try:
                spec = cdi.load(path)
                kind = spec.get("kind")
                if kind in ours or not isinstance(kind, str):
                    cdi.validate(spec, path)
            except HookError as err:
                problems.append(f"invalid spec file (CDI consumers skip it): {err}")
                continue
            found.append((priority, path, spec))
    return found, problems


def _hooks_of(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """(path, the devices that run it) for every hook a CDI spec names: spec-wide hooks run for any of its
    devices."""
    def hooks(edits: object) -> list[str]:
        found = edits.get("hooks") if isinstance(edits, dict) else None
        return [h["path"] for h in found or [] if isinstance(h, dict) and isinstance(h.get("path"), str)]

    named: dict[str, list[str]] = {}
    for path in hooks(spec.get("containerEdits")):
        named.setdefault(path, []).append("all of its devices")
    for device in spec.get("devices") or []:
        if isinstance(device, dict) and isinstance(device.get("name"), str):
            for path in hooks(device.get("containerEdits")):
                named.setdefault(path, []).append(device["name"])
    return [(path, ", ".join(users[:6]) + (" ..." if len(users) > 6 else "")) for path, users in named.items()]


def _hook_problems(file: str, spec: dict[str, Any], config: Config) -> list[str]:
    """A hook path that the runtime cannot run makes every container given one of the spec's devices fail."""
    from oci_gpu_hook.host.install import LAUNCHER_DIR

    problems = []
    for path, users in _hooks_of(spec):
        if os.path.isabs(path) and os.path.isfile(path) and os.access(path, os.X_OK):
            continue
        why = "is missing" if not os.path.lexists(path) else "is not an executable file"
        if os.path.dirname(path) == LAUNCHER_DIR:
            fix = "oci-gpu-hook install (or oci-gpu-hook launchers " + LAUNCHER_DIR + ")"
        else:
            fix = (f"oci-gpu-hook launchers {os.path.dirname(path) or '.'}, or set hook_path and "
                   f"oci-gpu-hook cdi generate --output {config.cdi_dir}/")
        problems.append(f"{file} names the hook {path}, which {why}: every container given {users} fails to "
                        f"start (fix: {fix})")
    return problems


def _device_names_of(spec: dict[str, Any]) -> list[str]:
    return [d["name"] for d in spec.get("devices") or [] if isinstance(d, dict) and isinstance(d.get("name"), str)]


def _cdi_list(config: Config, inventory: Inventory, dirs: list[str]) -> list[str]:
    """Print this host's CDI names and the state of the spec files; return the problems."""
    from oci_gpu_hook.appliers import cdi

    ours = {config.cdi_kind(k): k for k in config.backends}
    found, problems = _read_spec_dirs(dirs, set(ours))
    print(f"spec dirs (later overrides earlier): {', '.join(dirs)}")
    hook_problems = {path: _hook_problems(path, spec, config) for _p, path, spec in found if spec.get("kind") in ours}
    real_dirs = {os.path.realpath(d) for d in dirs}
    if os.path.realpath(config.cdi_dir) not in real_dirs:
        problems.append(f"cdi_dir {config.cdi_dir} is not one of the spec dirs: CDI consumers never read our specs")
    for kind in config.backends:
        cdi_kind = config.cdi_kind(kind)
        devices = inventory.devices(kind)
        for name, chosen in cdi.device_names(devices, kind):
            nodes = " ".join(os.path.basename(n.path) for d in chosen for n in d.nodes)
            print(f"{cdi_kind}={name:<20} {nodes}")
        if devices:
            print(f"{cdi_kind}=all")
        candidates = [os.path.join(config.cdi_dir, cdi.file_name(config, kind, fmt)) for fmt in ("json", "yaml")]
        mine = [p for p in candidates if os.path.exists(p)]
        if len(mine) > 1:
            problems.append(f"{mine[0]} and {mine[1]}: a JSON and a YAML spec of {cdi_kind} in one directory; "
                            "CDI consumers drop every device both name")
        installed = mine[0] if mine else candidates[0]
        if not mine:
            state = f"missing (oci-gpu-hook cdi generate --output {config.cdi_dir}/)" if devices else "none"
            if devices:
                problems.append(f"no spec file of {cdi_kind} at {installed}")
        elif not devices:
            state = "STALE: this host has no such GPU"
            problems.append(f"{installed} is stale: there are no {cdi_kind} devices on this host")
        else:
            try:
                current = cdi.load(installed) == cdi.generate(inventory, kind, config)
            except HookError as err:
                current = False
                problems.append(str(err))
            state = "current" if current else "STALE: differs from this host"
            if not current:
                problems.append(f"{installed} is stale (oci-gpu-hook cdi generate --output {config.cdi_dir}/)")
        if hook_problems.get(installed):
            state += "; BROKEN: it names a hook that cannot run"
        print(f"spec file {installed}: {state}")
        problems.extend(_conflicts(cdi_kind, installed, found))
    for found_problems in hook_problems.values():
        problems.extend(found_problems)
    return problems


def _conflicts(cdi_kind: str, installed: str, found: list[tuple[int, str, dict[str, Any]]]) -> list[str]:
    """Other spec files that name devices of ``cdi_kind``, and what CDI consumers make of each name: in the
    highest-priority directory that names it, one file wins; two files there are a conflict, and the
    device is dropped (pkg/cdi/cache.go)."""
    holders: dict[str, list[tuple[int, str]]] = {}
    for priority, path, spec in found:
        if spec.get("kind") == cdi_kind:
            for name in _device_names_of(spec):
                holders.setdefault(name, []).append((priority, path))
    real = os.path.realpath(installed)
    problems = []
    for priority, path, spec in found:
        if spec.get("kind") != cdi_kind or os.path.realpath(path) == real:
            continue
        dropped, wins, loses = [], [], []
        for name in _device_names_of(spec):
            top = max(p for p, _ in holders[name])
            at_top = [h for h in holders[name] if h[0] == top]
            if len(at_top) > 1 and (priority, path) in at_top:
                dropped.append(name)
            elif top == priority:
                wins.append(name)
            else:
                loses.append(name)
        parts = [f"{what}: {', '.join(names[:6])}{' ...' if len(names) > 6 else ''}" for what, names in (
            ("conflict, CDI consumers drop", dropped), ("it provides", wins), ("overridden", loses)) if names]
        problems.append(f"{path} also defines {cdi_kind} devices ({'; '.join(parts)})")
    return problems


def cmd_cdi(args: list[str], config: Config) -> int:
    parser = _parser("cdi", "CDI specs of this host's GPUs (one per kind), for podman, containerd and CRI-O.")
    sub = parser.add_subparsers(dest="action", required=True, metavar="generate|list|validate")
    gen = sub.add_parser("generate", help="print (or write) the CDI spec of each kind on this host")
    gen.add_argument("--output", metavar="DIR|FILE",
                     help="a directory (/etc/cdi, /var/run/cdi: a name without an extension, or ending in '/') gets "
                          "<vendor>-<class>.<format> per kind (created mode 0755 if missing, below root-owned "
                          "directories only); a FILE ending in .json or .yaml holds one kind and needs --kind; "
                          "written atomically, mode 0644; default: print (several kinds: --format yaml, one "
                          "document each)")
    gen.add_argument("--kind", choices=list(KINDS), help="only this kind (default: every kind with devices)")
    gen.add_argument("--format", choices=("json", "yaml"), default=None,
                     help="default: from the output file's extension, else json")
    listing = sub.add_parser(
        "list", help="the CDI names of this host's devices; exits 1 when the node's specs are not right "
                     "(ours missing or stale, other files defining our kinds, conflicts, invalid files)")
    listing.add_argument("--spec-dirs", metavar="DIR,DIR", default=None,
                         help="the directories CDI consumers read, in their order (later overrides earlier); "
                              "default: /etc/cdi,/var/run/cdi and cdi_dir")
    check = sub.add_parser("validate", help="check CDI spec files against schemas/cdi.schema.json (CDI 0.3.0 to "
                                            "1.1.0) and the CDI version rules")
    check.add_argument("files", nargs="+", metavar="FILE")
    opts = parser.parse_args(args)
    from oci_gpu_hook.appliers import cdi
    from oci_gpu_hook.inventory import scan_host

    if opts.action == "validate":
        for path in opts.files:
            cdi.validate(cdi.load(path), path)
            print(f"ok: {path}")
        return 0
    if opts.action == "list":
        dirs = spec_dirs(opts.spec_dirs, config)
        inventory = scan_host(config)
        problems = _cdi_list(config, inventory, dirs)
        for problem in problems:
            print(f"problem: {' '.join(problem.split())}")
        sys.stdout.flush()
        if problems:
            raise HookError(f"cdi list: {len(problems)} problem{'s' if len(problems) > 1 else ''} with this "
                            f"node's CDI specs (the 'problem:' lines above)")
        return 0
    output = opts.output
    # A path whose last component has no extension (/var/run/cdi) is a directory, made when missing.
    to_dir = bool(output) and (output.endswith("/") or os.path.isdir(output)
                               or not os.path.splitext(os.path.basename(output))[1])
    if output and not to_dir:
        if not output.endswith(SPEC_FILE_EXTENSIONS):
            raise UsageError(f"--output {output}: a CDI spec file ends in .json or .yaml "
                             "(a directory: a name without an extension, or end it with '/')")
        if not opts.kind:
            raise UsageError(f"--output {output}: a file holds one kind's spec: add --kind (or name a directory)")
    fmt = opts.format or ("yaml" if (output or "").endswith((".yaml", ".yml")) else "json")
    inventory = scan_host(config)
    kinds = [opts.kind] if opts.kind else [k for k in config.backends if inventory.devices(k)]
    if not kinds or not any(inventory.devices(k) for k in kinds):
        raise HookError(f"no GPUs under {inventory.sysfs_root}: a CDI spec needs at least one device")
    if not output and len(kinds) > 1 and fmt == "json":
        raise UsageError(f"this host has devices of {len(kinds)} kinds ({', '.join(kinds)}) and a CDI spec holds "
                         "one: add --kind KIND, --output DIR/ (one file per kind), or --format yaml (one YAML "
                         "document per kind)")
    if to_dir:
        make_dirs(output, "--output")
    for kind in kinds:
        spec = cdi.generate(inventory, kind, config)
        cdi.validate(spec, f"generated CDI spec of {kind}")
        text = cdi.render(spec, fmt)
        if not output:
            sys.stdout.write(("---\n" if len(kinds) > 1 else "") + text)  # a YAML stream: one document per kind
            continue
        path = os.path.join(output, cdi.file_name(config, kind, fmt)) if to_dir else output
        changed = cdi.write(path, text)
        print(f"{'wrote' if changed else 'unchanged'}: {path}", file=sys.stderr)
    if not (os.path.isfile(config.hook_path) and os.access(config.hook_path, os.X_OK)):
        print(f"note: hook_path {config.hook_path} is not an executable file here: a container given one of these "
              "devices fails to start until it is (oci-gpu-hook install, or oci-gpu-hook launchers "
              f"{os.path.dirname(config.hook_path)})", file=sys.stderr)
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
MODULE_COMMANDS["serve"] = "oci_gpu_hook.host.planner"


# Commands that read sysfs: a sysfs root that is not there is an error before they start (a watcher or a
# device plugin would otherwise serve nothing, quietly; inspect would drop its annotations).
SYSFS_COMMANDS = frozenset({"list", "dry-run", "inspect", "cdi", "watch", "install", "device-plugin"})


def require_sysfs(command: str, args: list[str], config: Config) -> None:
    if command not in SYSFS_COMMANDS or "-h" in args or "--help" in args:
        return
    if {"cdi": "validate", "install": "--uninstall"}.get(command) in args:  # these read no sysfs
        return
    if not os.path.isdir(config.sysfs_root):
        raise HookError(f"sysfs root {config.sysfs_root} is not a directory (from {config.source})")


def handler_for(command: str) -> Callable[[list[str], Config], int]:
    handler = COMMANDS.get(command)
    if handler is None and command in MODULE_COMMANDS:
        import importlib

        handler = importlib.import_module(MODULE_COMMANDS[command]).command
    if handler is None:
        valid = ", ".join([*COMMANDS, *MODULE_COMMANDS, "precreate", "prestart", "createRuntime", "links",
                           "ldcache"])
        raise UsageError(f"unknown command '{command}' (valid: {valid}; see oci-gpu-hook --help)")
    return handler


def run(command: str, args: list[str], config: Config) -> int:
    handler = handler_for(command)
    require_sysfs(command, args, config)
    return handler(args, config)
