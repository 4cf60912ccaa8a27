"""``oci-gpu-runtime``: a runc-compatible shim around the real OCI runtime.

On ``create`` and ``run`` it writes the plan into the config.json the real
runtime will read, then execs the real runtime with the same argv; every other
command execs straight through.  The real runtime comes from
``OCI_GPU_HOOK_RUNTIME``, the config file, or ``runc`` on PATH.  Works as
podman's ``--runtime`` and as containerd's runc ``BinaryName``.  Imports only
what the start path needs.

The command line is read with the rules of the real runtime
(:mod:`oci_gpu_hook.oci_argv`), so the file rewritten is the one that runtime
opens.
"""

from __future__ import annotations

import os
import sys
import time

from oci_gpu_hook.errors import HookError
from oci_gpu_hook.oci_argv import CRUN, DEFAULT_PATH, REWRITE_COMMANDS, RUNC, VERSION_ARGS, Reading

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from oci_gpu_hook.config import Config


def dialect(runtime: str) -> str:
    """Whose command-line rules the real runtime ``runtime`` (a path) follows: CRUN for crun by name (``crun``, a
    ``crun-HANDLER`` link, ``krun``: crun's own builds), as given or as its links resolve; else RUNC (runc and
    every runtime that reads runc's command line)."""
    for path in (runtime, os.path.realpath(runtime)):
        name = os.path.basename(path)
        if name in ("crun", "krun") or name.startswith("crun-"):
            return CRUN
    return RUNC


def resolve_runtime(name: str) -> str:
    """Absolute path of the real runtime; never this shim itself."""
    if "/" in name:
        path = name
    else:
        search = os.environ.get("PATH") or DEFAULT_PATH
        for directory in search.split(":"):
            candidate = os.path.join(directory or ".", name)
            if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
                path = candidate
                break
        else:
            raise HookError(f"runtime '{name}' not found on PATH "
                            "(set OCI_GPU_HOOK_RUNTIME or 'runtime' in the config file)")
    if not os.access(path, os.X_OK):
        raise HookError(f"runtime '{path}' is not an executable file")
    me = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if me and os.path.realpath(path) == me:
        raise HookError(f"runtime '{path}' is this shim itself; "
                        "point OCI_GPU_HOOK_RUNTIME at the real runc or crun")
    from oci_gpu_hook.trust import code_problem

    why = code_problem(path)  # the shim execs it as root: code, by the one trust rule (the front checks it too)
    if why:
        raise HookError(f"refusing to run the runtime {path}: {why} (the shim runs it with its own privilege; "
                        "install the runtime into a root-owned directory, see docs/security.md)")
    return path


def _log_for_runtime(options: dict[str, str], message: str) -> None:
    """Also put the error where podman/conmon and containerd read runc's errors: its --log file."""
    path = options.get("--log")
    if not path:
        return
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if options.get("--log-format") == "json":
        from oci_gpu_hook import fastjson

        line = fastjson.dumps({"level": "error", "msg": message, "time": stamp})
    else:
        quoted = message.replace("\\", "\\\\").replace('"', '\\"')
        line = f'time="{stamp}" level=error msg="{quoted}"'
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
    except OSError:
        pass


def rewrite_bundle(path: str, config: Config, cid: str) -> None:
    """Write the plan into the config file ``path`` (untouched when nothing is requested)."""
    from oci_gpu_hook.oci_spec import ContainerSpec
    from oci_gpu_hook.plan import plan_for_spec

    started = time.monotonic()
    spec = ContainerSpec.read(path)
    plan = plan_for_spec(spec, config)
    if plan:  # nothing asked for: the spec-rewrite applier is not even imported
        from oci_gpu_hook.appliers.ocispec import rewrite

        new_text = rewrite(spec, plan, config, os.path.dirname(os.path.abspath(path)), cid)
        if new_text is not None:
            from oci_gpu_hook.atomic import write_atomic

            write_atomic(path, new_text)
    plan.record(config, "oci-gpu-runtime", cid, started)


def passthrough_runtime_name(baked: str | None = None) -> str:
    """The runtime for a command that only passes through (``state``, ``delete``, ``kill``, ...): it must reach
    the real runtime whatever the config file holds, so a broken file falls back to its ``runtime`` line,
    read leniently, and then to the default.  An untrusted file (:mod:`oci_gpu_hook.trust`) is not read at
    all (its ``runtime`` would be exec'd as root): ``baked``, the runtime the launcher was written with (from
    the file while it was trusted), stands in, as the native front's baked runtime does, else the default."""
    from oci_gpu_hook.config import DEFAULT_CONFIG_PATH, FIELDS, load_config

    name = os.environ.get("OCI_GPU_HOOK_RUNTIME")
    if name:
        return name
    try:
        return load_config().runtime
    except Exception:
        pass
    path = os.environ.get("OCI_GPU_HOOK_CONFIG") or DEFAULT_CONFIG_PATH
    from oci_gpu_hook.trust import checked, read_regular

    why, walked = checked(path)
    if why:  # a file others could change never names what root execs
        return baked or FIELDS["runtime"].default
    try:
        lines = read_regular(path, walked)[:1 << 20].decode("utf-8", "replace").splitlines()  # the file checked
    except OSError:
        lines = []
    for line in lines:
        if line.lstrip().startswith("["):
            break
        key, eq, value = line.partition("=")
        value = value.split("#", 1)[0].strip()
        if eq and key.strip() == "runtime" and len(value) > 2 and value[0] == value[-1] and value[0] in "\"'":
            inner = value[1:-1]
            if inner and "\\" not in inner and "\0" not in inner:
                return inner
    return FIELDS["runtime"].default


def main(argv: list[str] | None = None, baked_runtime: str | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    code, runtime = prepare(args, baked_runtime)
    if runtime is None:
        return code
    try:
        os.execv(runtime, [runtime, *args])
    except OSError as err:
        from oci_gpu_hook.config import load_config
        from oci_gpu_hook.log import error_line, refused

        line = error_line(f"cannot run {runtime}: {err.strerror}")
        print(line, file=sys.stderr)
        try:
            config = load_config()
        except Exception:
            config = None  # the journal's default (on)
        refused(config, "oci-gpu-runtime", Reading(args, RUNC).container_id or None, line)
        return 1
    return 1  # not reached


def prepare(args: list[str], baked_runtime: str | None = None) -> tuple[int, str | None]:
    """Everything the shim does before it execs the runtime: (0, the runtime to exec with ``args``), or (the exit
    status, None) after the one error line (``baked_runtime``: see :func:`passthrough_runtime_name`, which also
    names the runtime of a create or run when the config cannot be used: :mod:`oci_gpu_hook.config`).  The
    resident planner runs this for the native front, which then execs the runtime itself
    (:mod:`oci_gpu_hook.serve.planner`)."""
    from oci_gpu_hook.entry import load_start_path

    runc = reading = Reading(args, RUNC)
    config = None
    try:
        # A create or run as runc reads it or (else) as crun does needs the config; then the real runtime's own
        # reading decides what is rewritten.
        crun = None if runc.command in REWRITE_COMMANDS else Reading(args, CRUN)
        if runc.command in REWRITE_COMMANDS or (crun is not None and crun.command in REWRITE_COMMANDS):
            load_start_path("create")  # the code it will run, right after the launcher's trust walk
            from oci_gpu_hook.config import load_config

            try:
                config = load_config()
                load_start_path("create", config.backends)
                problem = None
            except HookError as err:  # the config cannot be used: a container that asks for nothing still starts
                problem = err
            runtime = resolve_runtime(passthrough_runtime_name(baked_runtime) if config is None else config.runtime)
            if dialect(runtime) == CRUN:
                reading = crun or Reading(args, CRUN)
            if reading.command in REWRITE_COMMANDS:
                if reading.refusal is not None:
                    raise reading.refusal
                if problem is not None:  # the rule of oci_gpu_hook.config: by the default request names alone
                    from oci_gpu_hook.oci_spec import ContainerSpec
                    from oci_gpu_hook.request import on_unusable_config

                    on_unusable_config(ContainerSpec.read(reading.config), problem, "oci-gpu-runtime",
                                       reading.container_id)
                else:
                    rewrite_bundle(reading.config, config, reading.container_id)
        else:
            load_start_path("state")
            runtime = resolve_runtime(passthrough_runtime_name(baked_runtime))
            if len(args) == 1 and args[0] in VERSION_ARGS:
                from oci_gpu_hook import __version__

                sys.stdout.write(f"oci-gpu-runtime {__version__}\n")
                sys.stdout.flush()
    except Exception as err:
        if isinstance(err, BrokenPipeError) and config is None and reading.command not in REWRITE_COMMANDS:
            from oci_gpu_hook.entry.cli import drop_stdout  # `oci-gpu-runtime --version | head -0`: as SIGPIPE would

            drop_stdout()
            return 141, None
        from oci_gpu_hook.log import debug_from_env, refused, report_failure

        line = report_failure(err, config.debug if config else debug_from_env())
        _log_for_runtime(reading.options, line)
        refused(config, "oci-gpu-runtime", reading.container_id or None, line)
        return 1, None
    return 0, runtime


if __name__ == "__main__":
    raise SystemExit(main())
