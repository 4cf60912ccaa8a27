"""``oci-gpu-runtime``: a runc-compatible shim around the real OCI runtime.

On ``create`` and ``run`` it writes the plan into the bundle's config.json,
then execs the real runtime with the same argv; every other command execs
straight through.  The real runtime comes from ``OCI_GPU_HOOK_RUNTIME``, the
config file, or ``runc`` on PATH.  Works as podman's ``--runtime`` and as
containerd's runc ``BinaryName``.  Imports only what the start path needs.
"""

from __future__ import annotations

import os
import sys
import time

from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms per container start

if TYPE_CHECKING:
    from oci_gpu_hook.config import Config

# runc's global options that take a value (urfave/cli also accepts one dash)
_GLOBAL_WITH_VALUE = frozenset({"--root", "--log", "--log-format", "--criu", "--rootless"})
REWRITE_COMMANDS = frozenset({"create", "run"})


def _option_name(arg: str) -> str:
    name = arg.partition("=")[0]
    return "-" + name if name.startswith("-") and not name.startswith("--") and len(name) > 2 else name


def parse_argv(args: list[str]) -> tuple[str | None, dict[str, str], list[str]]:
    """Split runc's argv (without argv[0]) into command, global options, command args."""
    options: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-") or arg == "-":
            return arg, options, args[i + 1:]
        name = _option_name(arg)
        if name in _GLOBAL_WITH_VALUE:
            if "=" in arg:
                options[name] = arg.partition("=")[2]
            elif i + 1 < len(args):
                options[name] = args[i + 1]
                i += 1
        i += 1
    return None, options, []


def bundle_dir(command_args: list[str]) -> str:
    """The bundle from ``--bundle``/``-b`` (any of runc's spellings), else the working directory."""
    for i, arg in enumerate(command_args):
        if arg == "--":
            break
        name = _option_name(arg)
        if name in ("--bundle", "-b"):
            if "=" in arg:
                return arg.partition("=")[2]
            if i + 1 < len(command_args):
                return command_args[i + 1]
    return os.getcwd()


def container_id(command_args: list[str]) -> str:
    positional = [a for a in command_args if not a.startswith("-")]
    return positional[-1] if positional else ""


def resolve_runtime(name: str) -> str:
    """Absolute path of the real runtime; never this shim itself."""
    if "/" in name:
        path = name
    else:
        search = os.environ.get("PATH") or "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
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


def rewrite_bundle(bundle: str, config: Config, cid: str) -> None:
    """Write the plan into ``bundle``/config.json (untouched when nothing is requested)."""
    from oci_gpu_hook.appliers.ocispec import rewrite_text
    from oci_gpu_hook.atomic import write_atomic
    from oci_gpu_hook.bundle import read_text
    from oci_gpu_hook.log import record_plan

    started = time.monotonic()
    path = os.path.join(bundle, "config.json")
    new_text, plan = rewrite_text(read_text(path), config)
    if new_text is not None:
        write_atomic(path, new_text)
    record_plan(config, "oci-gpu-runtime", cid, plan, started)


def passthrough_runtime_name() -> str:
    """The runtime for a command that only passes through (``state``, ``delete``, ``kill``, ...): it must reach
    the real runtime whatever the config file holds, so a broken file falls back to its ``runtime`` line,
    read leniently, and then to the default."""
    from oci_gpu_hook.config import DEFAULT_CONFIG_PATH, FIELDS, load_config

    name = os.environ.get("OCI_GPU_HOOK_RUNTIME")
    if name:
        return name
    try:
        return load_config().runtime
    except Exception:
        pass
    path = os.environ.get("OCI_GPU_HOOK_CONFIG") or DEFAULT_CONFIG_PATH
    try:
        with open(path, "rb") as handle:
            lines = handle.read(1 << 20).decode("utf-8", "replace").splitlines()
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


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command, options, command_args = parse_argv(args)
    config = None
    try:
        if command in REWRITE_COMMANDS:
            from oci_gpu_hook.config import load_config

            config = load_config()  # create/run fail closed on a broken config file
            runtime = resolve_runtime(config.runtime)
            rewrite_bundle(bundle_dir(command_args), config, container_id(command_args))
        else:
            runtime = resolve_runtime(passthrough_runtime_name())
            if args in (["--version"], ["-v"]):
                from oci_gpu_hook import __version__

                sys.stdout.write(f"oci-gpu-runtime {__version__}\n")
                sys.stdout.flush()
    except Exception as err:
        from oci_gpu_hook.log import debug_from_env, record, report_failure

        line = report_failure(err, config.debug if config else debug_from_env())
        _log_for_runtime(options, line)
        record(config, entry="oci-gpu-runtime", id=container_id(command_args), outcome="error", error=line)
        return 1
    try:
        os.execv(runtime, [runtime, *args])
    except OSError as err:
        print(f"oci-gpu-hook: error: cannot run {runtime}: {err.strerror}", file=sys.stderr)
        return 1
    return 1  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
