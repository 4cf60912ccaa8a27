"""``oci-gpu-hook``: the command line.  Thin over inventory -> request -> plan -> applier.

Global options, accepted anywhere on the line by every subcommand:
``--sysfs-root DIR``, ``--config FILE``, ``--debug``.

``precreate`` is on every container's start path, so it is dispatched before
:mod:`argparse` (and everything else heavy) is imported.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms per container start

if TYPE_CHECKING:
    from typing import Any

    from oci_gpu_hook.config import Config

USAGE = """usage: oci-gpu-hook [--sysfs-root DIR] [--config FILE] [--debug] COMMAND ...

commands:
  list [--json]                              the host's GPUs in index order
  dry-run [--devices SPEC] [--diff] BUNDLE_DIR|CONFIG_FILE
                                             print the rewritten config.json; change nothing
  precreate                                  podman precreate hook: config on stdin, config on stdout
  prestart (or createRuntime)                live hook: state on stdin; nodes and device cgroup rules
  links PATH=TARGET...                       createRuntime hook: /dev/dri/by-path links in the container
  inspect (--pid PID | --cgroup DIR)         what a cgroup lets its processes open
  cdi generate [--output FILE|DIR] [--format json|yaml]
                                             the CDI spec of this host's GPUs
  cdi list | cdi validate FILE...            CDI names of this host; check spec files
  watch [--output FILE|DIR] [--debounce SECONDS] [--once] [--subsystems LIST]
                                             keep the CDI spec current on GPU/partition uevents
  install [--hook precreate|prestart|none] [--set VAR=VALUE] [--prefix DIR] [--dry-run] [--uninstall]
                                             launchers, a hooks.d file, CDI spec, containerd drop-in
  device-plugin [--kubelet-dir DIR] [--resource-strategy single|mixed] [--device-specs]  kubelet device plugin
  validate [--config-file FILE] [SPEC ...]   check a config file and OCI config.json files
  launchers DIR [--no-native] [--allow-editable]
                                             write the launchers for hooks and the shim (native front + python -I -S)
"""

HOT_COMMANDS = frozenset({"precreate", "prestart", "createRuntime", "links"})


def split_globals(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Take ``--sysfs-root``, ``--config`` and ``--debug`` out of argv, wherever they stand."""
    overrides: dict[str, Any] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in ("--sysfs-root", "--config"):
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
    from oci_gpu_hook.errors import HookError

    return HookError(f"{message} (see oci-gpu-hook --help)")


def load(overrides: dict[str, Any]) -> Config:
    from oci_gpu_hook.config import load_config

    environ: Any = os.environ
    if overrides.get("config"):
        environ = {**os.environ, "OCI_GPU_HOOK_CONFIG": overrides["config"]}
    return load_config(environ, {k: v for k, v in overrides.items() if k != "config"})


def cmd_precreate(config: Config) -> int:
    """podman's precreate stage: the proposed config on stdin, the full config on stdout."""
    import time

    from oci_gpu_hook.appliers.ocispec import rewrite_text
    from oci_gpu_hook.log import record_plan

    started = time.monotonic()
    text = sys.stdin.read()
    new_text, plan = rewrite_text(text, config)
    sys.stdout.write(text if new_text is None else new_text)
    sys.stdout.flush()
    record_plan(config, "precreate", None, plan, started)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    config = None
    debug = "--debug" in args
    command = None
    try:
        overrides, rest = split_globals(args)
        command = rest[0] if rest else None
        if command in HOT_COMMANDS:
            if len(rest) > 1 and command != "links":
                raise _usage_error(f"{command} takes no arguments")
            os.chdir("/")  # never work relative to a directory the container may control
            if command == "links":  # needs no config: the links are its arguments
                from oci_gpu_hook.appliers import live

                return live.run_links(sys.stdin.read(), rest[1:])
            config = load(overrides)
            if command == "precreate":
                return cmd_precreate(config)
            from oci_gpu_hook.appliers import live

            return live.run(sys.stdin.read(), config)
        from oci_gpu_hook.entry import commands

        if command in (None, "-h", "--help", "help"):
            sys.stdout.write(USAGE)
            return 0 if command else 2
        if command in ("--version", "version"):
            from oci_gpu_hook import __version__

            print(f"oci-gpu-hook {__version__}")
            return 0
        config = load(overrides)
        return commands.run(command, rest[1:], config)
    except SystemExit:
        raise
    except BaseException as err:
        from oci_gpu_hook.log import debug_from_env, record, report_failure

        if isinstance(err, KeyboardInterrupt):
            return 130
        line = report_failure(err, debug or (config.debug if config else debug_from_env()))
        record(config, entry=command or "oci-gpu-hook", id=getattr(err, "container_id", None), outcome="error",
               error=line)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
