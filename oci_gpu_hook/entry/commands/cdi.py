"""``oci-gpu-hook cdi generate|list|validate``: CDI specs of this host's GPUs, and the node's spec directories
as CDI consumers read them (:mod:`oci_gpu_hook.appliers.cdi_dirs`)."""

from __future__ import annotations

import os
import sys

from oci_gpu_hook.appliers.cdi_dirs import conflicts, consumer_dirs, hooks_of, read_spec_dirs
from oci_gpu_hook.cliparse import UsageError
from oci_gpu_hook.cliparse import parser as _parser
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.kinds import KINDS

SPEC_FILE_EXTENSIONS = (".json", ".yaml", ".yml")  # what `cdi generate --output` takes as a file, not a directory

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from typing import Any

    from oci_gpu_hook.config import Config
    from oci_gpu_hook.inventory import Inventory


def spec_dirs(text: str | None, config: Config) -> list[str]:
    """``--spec-dirs`` (comma-separated, in CDI's order), or CDI's defaults plus ``cdi_dir`` when it is
    neither of them (as a containerd ``cdi_spec_dirs`` setting would add it)."""
    if text is not None:
        dirs = [os.path.abspath(d) for d in text.split(",") if d]
        if not dirs:
            raise UsageError(f"--spec-dirs {text!r}: expected a comma-separated list of directories")
        return dirs
    return consumer_dirs(config)


def _cdi_list(config: Config, inventory: Inventory, dirs: list[str]) -> list[str]:
    """Print this host's CDI names and the state of the spec files; return the problems."""
    from oci_gpu_hook.appliers import cdi

    ours = {config.cdi_kind(k): k for k in config.backends}
    found, problems = read_spec_dirs(dirs, set(ours))
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
        problems.extend(conflicts(cdi_kind, installed, found))
    for found_problems in hook_problems.values():
        problems.extend(found_problems)
    return problems


def _hook_problems(file: str, spec: dict[str, Any], config: Config) -> list[str]:
    """A hook path that the runtime cannot run makes every container given one of the spec's devices fail."""
    from oci_gpu_hook.install.paths import LAUNCHER_DIR

    problems = []
    for path, users in hooks_of(spec):
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


def run(args: list[str], config: Config) -> int:
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
        from oci_gpu_hook.inventory.sysfs import wrong_root

        raise HookError(wrong_root(inventory.sysfs_root)
                        or f"no GPUs under {inventory.sysfs_root}: a CDI spec needs at least one device")
    if not output and len(kinds) > 1 and fmt == "json":
        raise UsageError(f"this host has devices of {len(kinds)} kinds ({', '.join(kinds)}) and a CDI spec holds "
                         "one: add --kind KIND, --output DIR/ (one file per kind), or --format yaml (one YAML "
                         "document per kind)")
    if to_dir:
        cdi.make_dirs(output, "--output")
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
    masked = cdi.mask_ignored(config.mask_other_gpus)
    if masked:
        print(f"warning: {masked}", file=sys.stderr)
    if output:
        where, read = output if to_dir else os.path.dirname(os.path.abspath(output)), consumer_dirs(config)
        if os.path.realpath(where) not in {os.path.realpath(d) for d in read}:
            print(f"warning: {where} is not a directory CDI consumers read (podman, containerd, CRI-O read "
                  f"{', '.join(read)}, a later one winning; cdi_dir is {config.cdi_dir}): nothing uses these specs "
                  "unless a runtime's cdi_spec_dirs names it", file=sys.stderr)
    if not (os.path.isfile(config.hook_path) and os.access(config.hook_path, os.X_OK)):
        print(f"note: hook_path {config.hook_path} is not an executable file here: a container given one of these "
              "devices fails to start until it is (oci-gpu-hook install, or oci-gpu-hook launchers "
              f"{os.path.dirname(config.hook_path)})", file=sys.stderr)
    return 0
