"""``oci-gpu-hook``: the command line.  Thin over inventory -> request -> plan -> applier.

Global options, accepted anywhere on the line by every subcommand:
``--sysfs-root DIR``, ``--proc-root DIR``, ``--driver-root DIR``, ``--config FILE``, ``--debug``.

``precreate`` is on every container's start path, so it is dispatched before
:mod:`argparse` (and everything else heavy) is imported.
"""

from __future__ import annotations

import os
import sys

from oci_gpu_hook import CREATE_RUNTIME_HOOKS, LIVE_COMMANDS, PRECREATE

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from typing import Any

    from oci_gpu_hook.config import Config
    from oci_gpu_hook.errors import HookError

USAGE_HEAD = """usage: oci-gpu-hook [--sysfs-root DIR] [--proc-root DIR] [--driver-root DIR] [--config FILE] [--debug]
                    COMMAND ...

commands:
"""
USAGE_TAIL = """
exit status: 0 done, 1 failed (one error line on stderr), 2 a usage error
"""


_PRESTART_HELP = ("usage: oci-gpu-hook prestart (or createRuntime)\n\nThe live hook: the OCI state on stdin; creates "
                  "the GPU nodes in the container and grants them in its device cgroup.\n")
# The one table of commands, in the order of the usage: name -> (module, sysfs, help, usage lines).  ``module``: the
# module of oci_gpu_hook.entry.commands whose ``run(args, config)`` does it; ``sysfs``: whether it reads sysfs (a
# word: unless that argument is given); a hook has no module but ``help`` (its --help): it runs here, before
# anything heavy is imported.  Usage lines: (synopsis, summary) pairs.  Only constants: building it costs nothing.
COMMANDS: dict[str, tuple[str, bool | str, str, tuple[tuple[str, str], ...]]] = {
    "list": ("list", True, "", (("list [--json]", "the host's GPUs in index order"),)),
    "dry-run": ("dry_run", True, "", (("dry-run [--devices SPEC] [--diff] BUNDLE_DIR|CONFIG_FILE",
                                       "print the rewritten config.json; change nothing"),)),
    "precreate": ("", False, "usage: oci-gpu-hook precreate\n\npodman's precreate hook: the proposed config.json on "
                             "stdin, the full config (with the GPUs asked for) on stdout.\n",
                  (("precreate", "podman precreate hook: config on stdin, config on stdout"),)),
    "prestart": ("", False, _PRESTART_HELP,
                 (("prestart (or createRuntime)", "live hook: state on stdin; nodes and device cgroup rules"),)),
    "createRuntime": ("", False, _PRESTART_HELP, ()),
    "links": ("", False, "usage: oci-gpu-hook links PATH=TARGET...\n\ncreateRuntime hook: the /dev/dri/by-path links "
                         "in the container (the OCI state on stdin).\n",
              (("links PATH=TARGET...", "createRuntime hook: /dev/dri/by-path links in the container"),)),
    "ldcache": ("", False, "usage: oci-gpu-hook ldcache [PATH=TARGET...] [--folder=DIR...] [--lib=PATH...]\n\n"
                           "createRuntime hook: a driver's soname links, then its libraries (PATHs, in DIRs) merged "
                           "into the container's ld cache (no process; the OCI state on stdin).\n",
                (("ldcache [PATH=TARGET...] [--folder=DIR...] [--lib=PATH...]",
                  "createRuntime hook: a driver's soname links, the container's ld cache"),)),
    "inspect": ("inspect", True, "", (("inspect (--pid PID | --cgroup DIR)",
                                       "what a cgroup lets its processes open"),)),
    "cdi": ("cdi", "validate", "", (
        ("cdi generate [--output DIR/|FILE] [--format json|yaml]", "the CDI spec of this host's GPUs"),
        ("cdi list [--spec-dirs DIR,DIR]", "CDI names of this host; exit 1 if the node's specs are not right"),
        ("cdi validate FILE...", "check spec files (CDI 0.3.0 to 1.1.0)"))),
    "watch": ("watch", True, "", (("watch [--output FILE|DIR] [--debounce SECONDS] [--once] [--subsystems LIST]",
                                   "keep the CDI spec current on GPU/partition uevents"),)),
    "install": ("install", "--uninstall", "", (
        ("install [--only podman,docker,containerd,crio,cdi,systemd,nri] [--hook precreate|prestart|none] "
         "[--set VAR=VALUE]\n          [--prefix DIR] [--dry-run] [--uninstall] [--no-native] [--allow-editable]",
         "launchers, a hooks.d file, CDI spec, containerd drop-in"),)),
    "device-plugin": ("device_plugin", True, "", (
        ("device-plugin [--kubelet-dir DIR] [--resource-strategy single|mixed] [--device-specs]",
         "kubelet device plugin"),)),
    "dra": ("dra", True, "", (("dra [--driver-name NAME] [--node-name NAME] [--cdi-dir DIR] [--list]",
                               "Kubernetes DRA driver: ResourceSlices, claims as CDI specs"),)),
    "nri": ("nri", True, "", (("nri [--socket PATH] [--name NAME] [--idx NN]",
                               "NRI plugin (containerd 2.x, CRI-O): GPUs as container adjustments"),)),
    "serve": ("serve", False, "", (("serve [--socket PATH] [--workers N] [--verbose]",
                                    "the resident planner: GPU containers start without a Python start"),)),
    "validate": ("validate", False, "", (("validate [--config-file FILE] [SPEC ...]",
                                          "check a config file and OCI config.json files"),)),
    "launchers": ("launchers", False, "", (
        ("launchers DIR [--no-native] [--allow-editable]",
         "write the launchers for hooks and the shim (native front + python -I -S)"),)),
    "help": ("", False, "", (("help [COMMAND]", "this text, or what COMMAND --help prints"),)),
}
MODULE, SYSFS, HELP, LINES = range(4)
USAGE_WIDTH = 42  # a synopsis this long or shorter has its summary beside it, a longer one below it


def usage() -> str:
    lines = [USAGE_HEAD]
    for synopsis, summary in (line for c in COMMANDS.values() for line in c[LINES]):
        last = synopsis.rsplit("\n", 1)[-1]
        if len(last) <= USAGE_WIDTH:
            lines.append(f"  {synopsis}{' ' * (USAGE_WIDTH - len(last))} {summary}\n")
        else:
            lines.append(f"  {synopsis}\n{' ' * (USAGE_WIDTH + 3)}{summary}\n")
    return "".join(lines) + USAGE_TAIL


HOT_COMMANDS = frozenset({PRECREATE, *LIVE_COMMANDS, *CREATE_RUNTIME_HOOKS})  # the table's hooks (those with help)


def is_hook(command: str | None) -> bool:
    """Whether ``command`` is one of the hooks (on every container's start path)."""
    return command in HOT_COMMANDS


def split_globals(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Take ``--sysfs-root``, ``--proc-root``, ``--driver-root``, ``--config`` and ``--debug`` out of argv,
    wherever they stand."""
    overrides: dict[str, Any] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in ("--sysfs-root", "--proc-root", "--driver-root", "--config"):
            if not eq:
                if i + 1 >= len(argv):
                    raise _usage_error(f"{name} needs a value")
                value = argv[i + 1]
                i += 1
            overrides[name[2:].replace("-", "_")] = value
        elif arg == "--debug":
            overrides["debug"] = True
        elif arg == "--":
            rest.extend(argv[i:])
            break
        else:
            rest.append(arg)
        i += 1
    return overrides, rest


def _usage_error(message: str) -> Exception:
    from oci_gpu_hook.cliparse import UsageError  # argparse too, but only on this error path

    return UsageError(f"{message} (see oci-gpu-hook --help)")


def cmd_help(rest: list[str], overrides: dict[str, Any]) -> int:
    """``help``: the usage; ``help CMD``: what ``CMD --help`` prints."""
    if not rest:
        sys.stdout.write(usage())
        return 0
    if is_hook(rest[0]):
        sys.stdout.write(COMMANDS[rest[0]][HELP])
        return 0
    return command_module(rest[0]).run([*rest[1:], "--help"], load(overrides))


def command_module(name: str) -> Any:
    """The module of :mod:`oci_gpu_hook.entry.commands` that runs the operator command ``name``."""
    entry = COMMANDS.get(name)
    if entry is None or not entry[MODULE]:
        valid = ", ".join([*(n for n, c in COMMANDS.items() if c[MODULE]),
                           *(n for n, c in COMMANDS.items() if c[HELP])])
        from oci_gpu_hook.cliparse import UsageError

        raise UsageError(f"unknown command '{name}' (valid: {valid}; see oci-gpu-hook --help)")
    import importlib

    return importlib.import_module(f"oci_gpu_hook.entry.commands.{entry[MODULE]}")


def run_command(name: str, args: list[str], config: Config) -> int:
    """An operator command: its module's ``run``, after the check that a command reading sysfs has one (a watcher
    or a device plugin would otherwise serve nothing, quietly; inspect would drop its annotations)."""
    module = command_module(name)
    sysfs = COMMANDS[name][SYSFS]
    reads = sysfs and "-h" not in args and "--help" not in args and not (isinstance(sysfs, str) and sysfs in args)
    if reads and not os.path.isdir(config.sysfs_root):
        from oci_gpu_hook.errors import HookError

        raise HookError(f"sysfs root {config.sysfs_root} is not a directory (from {config.source})")
    return module.run(args, config)  # type: ignore[no-any-return]


def drop_stdout() -> None:
    """The reader of stdout went away: point fd 1 at /dev/null, so that what a failed write left in the buffer
    (block-buffered unless PYTHONUNBUFFERED) is not flushed again at exit (``Exception ignored``, status 120)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _quiet_broken_pipe() -> int:
    """The reader of stdout went away (``| head``): end as a command killed by SIGPIPE would, silently."""
    drop_stdout()
    return 141


def load(overrides: dict[str, Any]) -> Config:
    from oci_gpu_hook.config import load_config

    environ: Any = os.environ
    if overrides.get("config"):
        environ = {**os.environ, "OCI_GPU_HOOK_CONFIG": overrides["config"]}
    return load_config(environ, {k: v for k, v in overrides.items() if k != "config"})


def load_for_container(overrides: dict[str, Any]) -> Config | HookError:
    """:func:`load` for a hook that a container's start runs: the config, or why it cannot be used (then
    :func:`oci_gpu_hook.request.on_unusable_config` decides: the rule in :mod:`oci_gpu_hook.config`)."""
    from oci_gpu_hook.errors import HookError

    try:
        return load(overrides)
    except HookError as err:
        return err


def needs_no_config(command: str, args: list[str]) -> str | None:
    """What an operator command does without the config's values, when it is its way out of a broken config:
    ``install --uninstall`` (it removes what the manifest lists) and ``validate --config-file FILE`` (it checks
    another file); None for every other command."""
    if command == "install" and "--uninstall" in args:
        return "install --uninstall goes on: it removes what the manifest lists"
    if command == "validate" and any(a == "--config-file" or a.startswith("--config-file=") for a in args):
        return "validate goes on with the defaults to check --config-file"
    return None


def load_for_command(command: str, args: list[str], overrides: dict[str, Any]) -> Config:
    """The config of an operator command; a config that cannot be used stops it, with its one line, unless the
    command needs none of it (:func:`needs_no_config`): then one warning and the defaults."""
    from oci_gpu_hook.errors import HookError

    try:
        return load(overrides)
    except HookError as err:
        why = needs_no_config(command, args)
        if why is None:
            raise
        from oci_gpu_hook.config import Config

        print(f"oci-gpu-hook: warning: {' '.join(str(err).split())}; {why}", file=sys.stderr)
        return Config()


def read_stdin() -> str:
    """The runtime's JSON on stdin as UTF-8, whatever the locale: anything else is one clear line."""
    from oci_gpu_hook.errors import HookError

    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise HookError(f"the JSON on stdin is not UTF-8 text (byte {err.start})") from None


def cmd_precreate(config: Config | HookError) -> int:
    """podman's precreate stage: the proposed config on stdin, the full config on stdout (``config`` an error: it
    cannot be used; the spec passes unchanged or the container is refused)."""
    import time

    from oci_gpu_hook.errors import HookError
    from oci_gpu_hook.oci_spec import ContainerSpec
    from oci_gpu_hook.plan import plan_for_spec

    started = time.monotonic()
    text = read_stdin()
    spec = ContainerSpec.parse(text)
    try:
        if isinstance(config, Exception):
            from oci_gpu_hook.request import on_unusable_config

            on_unusable_config(spec, config, "precreate", spec.name())
            sys.stdout.write(text)
            sys.stdout.flush()
            return 0
        plan = plan_for_spec(spec, config)
        if spec.present:
            from oci_gpu_hook.trust import rootless

            if rootless():  # GPU nodes a rootless podman put there itself (CDI) must open for its user
                from oci_gpu_hook.appliers.rootless import check_given

                check_given(spec, config)
        new_text = None
        if plan:  # nothing asked for: the spec-rewrite applier is not even imported
            from oci_gpu_hook.appliers.ocispec import rewrite

            new_text = rewrite(spec, plan, config)
    except HookError as err:
        err.container_id = spec.name()  # the input has no id: what names it (the log's and the journal's lines)
        raise
    sys.stdout.write(text if new_text is None else new_text)
    sys.stdout.flush()
    plan.record(config, "precreate", spec.name(), started)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    config = None
    debug = "--debug" in args
    command = None
    try:
        overrides, rest = split_globals(args)
        command = rest[0] if rest else None
        if is_hook(command):
            from oci_gpu_hook.entry import load_start_path

            load_start_path(command)  # the code it will run, right after the launcher's trust walk
            if len(rest) > 1 and command not in CREATE_RUNTIME_HOOKS:
                raise _usage_error(f"{command} takes no arguments")
            if command in CREATE_RUNTIME_HOOKS:  # need no config: what to make is in their arguments
                from oci_gpu_hook.appliers import live

                os.chdir("/")
                run = live.run_links if command == "links" else live.run_ldcache
                return run(read_stdin(), rest[1:])
            loaded = load_for_container(overrides)
            config = None if isinstance(loaded, Exception) else loaded
            if config is not None:
                load_start_path(command, config.backends)  # and its backends' modules, before stdin is read
            os.chdir("/")  # never work relative to a directory the container may control
            if command == "precreate":
                return cmd_precreate(loaded)
            from oci_gpu_hook.appliers import live

            return live.run(read_stdin(), loaded)
        if command is None:
            sys.stdout.write(usage())
            sys.stdout.flush()
            return 2
        if command in ("-h", "--help", "help"):
            code = cmd_help(rest[1:], overrides)
        elif command in ("--version", "-V", "version"):
            from oci_gpu_hook import __version__

            print(f"oci-gpu-hook {__version__}")
            code = 0
        else:
            config = load_for_command(command, rest[1:], overrides)
            code = run_command(command, rest[1:], config)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
        return code
    except SystemExit as done:
        if done.code == 0:
            try:
                sys.stdout.flush()
            except BrokenPipeError:
                return _quiet_broken_pipe()
        raise
    except BaseException as err:
        from oci_gpu_hook.log import debug_from_env, record, refused, report_failure

        if isinstance(err, BrokenPipeError):
            if not is_hook(command):
                return _quiet_broken_pipe()
            drop_stdout()  # a hook's reader is its runtime (podman): say it, once
            from oci_gpu_hook.errors import HookError

            err = HookError(f"{command}: stdout closed before the hook's output was written (BrokenPipeError): "
                            "its reader, the runtime (podman), went away; the container does not start")
        if isinstance(err, KeyboardInterrupt):
            return 130
        if not is_hook(command):  # what the command printed comes before its error line, also into one pipe
            try:
                sys.stdout.flush()
            except (BrokenPipeError, ValueError):
                drop_stdout()
        line = report_failure(err, debug or (config.debug if config else debug_from_env()))
        if is_hook(command):  # a refused container: the journal too, where podman's user looks
            refused(config, command, getattr(err, "container_id", None), line)
        else:  # an operator's command: its user reads the line on the terminal
            record(config, entry=command or "oci-gpu-hook", id=getattr(err, "container_id", None),
                   outcome="error", error=line)
        return getattr(err, "exit_code", 1)


if __name__ == "__main__":
    raise SystemExit(main())
