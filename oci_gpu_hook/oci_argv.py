"""A runtime's command line read as the runtime reads it: which command, and for ``create``/``run`` which
config file it opens and which container id it uses.

Two rule sets (the shim picks one: :func:`oci_gpu_hook.entry.runtime.dialect`): runc's (urfave/cli over Go's
flag package: ``-bundle``, ``-b=DIR``, flags after the container id) and crun's (glibc argp: ``-bDIR``, unique
prefixes such as ``--bund``, ``-f``/``--config FILE``), so that the file rewritten is the one that runtime opens.
"""

from __future__ import annotations

import os

from oci_gpu_hook.errors import HookError

REWRITE_COMMANDS = frozenset({"create", "run"})
VERSION_ARGS = ("--version", "-v")  # alone on the command line: the shim prints its version, then runs the runtime
# where a runtime named without a '/' is looked for when PATH is unset or empty (the shim's, the native front's)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# runc 1.1's command line (urfave/cli v1.22 over Go's flag package), read from ``runc --help`` and
# ``runc run --help``: name -> kind ("bool", "string", "int"); a flag's other names in _ALIASES.
_GLOBAL_FLAGS = {"debug": "bool", "log": "string", "log-format": "string", "root": "string", "criu": "string",
                 "systemd-cgroup": "bool", "rootless": "string", "help": "bool", "h": "bool", "version": "bool",
                 "v": "bool"}
_CREATE_FLAGS = {"bundle": "string", "b": "string", "console-socket": "string", "pid-file": "string",
                 "no-pivot": "bool", "no-new-keyring": "bool", "preserve-fds": "int", "help": "bool", "h": "bool"}
_RUN_FLAGS = {**_CREATE_FLAGS, "detach": "bool", "d": "bool", "keep": "bool", "no-subreaper": "bool"}
_COMMAND_FLAGS = {"create": _CREATE_FLAGS, "run": _RUN_FLAGS}
_ALIASES = (("bundle", "b"), ("detach", "d"), ("help", "h"), ("version", "v"))
_RUNC_COMMANDS = frozenset({"checkpoint", "create", "delete", "events", "exec", "init", "kill", "list", "pause",
                            "ps", "restore", "resume", "run", "spec", "start", "state", "update", "features",
                            "help", "h"})
_GO_BOOLS = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
             "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}


class ArgvError(Exception):
    """runc would refuse this command line (and print why); the shim then leaves it to runc."""


def _go_int(value: str) -> bool:
    """Whether Go's strconv.ParseInt(value, 0, 64) takes ``value`` (flag.Int's parser): a sign, then a Go integer
    literal (0x, 0b, 0o prefixes, a leading 0 for octal, underscores between digits)."""
    body = value[1:] if value[:1] in ("+", "-") else value
    if len(body) > 1 and body[0] == "0" and body[1] not in "xXbBoO":
        body = "0o" + body[1:]
    if not body.isascii() or body != body.strip():
        return False
    try:
        number = int(body, 0)  # Python's literal rules for these forms match Go's
    except ValueError:
        return False
    return number <= 2**63 if value[:1] == "-" else number < 2**63


def _go_flag_parse(args: list[str], flags: dict[str, str]) -> tuple[dict[str, str], list[str], list[str]]:
    """Go's flag.FlagSet.Parse: (values by name, names in the order set, the positional arguments)."""
    values: dict[str, str] = {}
    order: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if len(arg) < 2 or arg[0] != "-":
            break
        dashes = 2 if arg[1] == "-" else 1
        if arg == "--":
            i += 1
            break
        name = arg[dashes:]
        if not name or name[0] in "-=":
            raise ArgvError(f"bad flag syntax: {arg}")
        i += 1
        name, eq, value = name.partition("=")
        kind = flags.get(name)
        if kind is None:
            raise ArgvError(f"flag provided but not defined: -{name}")
        if kind == "bool":
            if eq and value not in _GO_BOOLS:
                raise ArgvError(f"invalid boolean value {value!r} for -{name}")
            value = str(_GO_BOOLS[value]).lower() if eq else "true"
        else:
            if not eq:
                if i >= len(args):
                    raise ArgvError(f"flag needs an argument: -{name}")
                value = args[i]
                i += 1
            if kind == "int" and not _go_int(value):
                raise ArgvError(f"invalid value {value!r} for flag -{name}")
        values[name] = value
        order.append(name)
    return values, order, args[i:]


def _flag_name(arg: str, flags: dict[str, str]) -> bool:
    """urfave/cli v1's argIsFlag: ``arg`` names one of ``flags`` (after up to three leading dashes, before '=')."""
    if arg == "-" or not arg.startswith("-"):
        return False
    name = arg.replace("-", "", 2) if arg.startswith("--") else arg
    name = name.replace("-", "", 1) if name.startswith("-") else name
    return name.partition("=")[0] in flags


def _reorder(args: list[str], flags: dict[str, str]) -> list[str]:
    """urfave/cli v1.22's reorderArgs (as built into runc 1.1): flags found after the positional arguments move
    in front of them, each with the argument after it when that argument is no flag; ``--`` ends the moving."""
    moved: list[str] = []
    rest: list[str] = []
    value_next = False
    for i, arg in enumerate(args):
        if value_next and not _flag_name(arg, flags):
            value_next = False
            moved.append(arg)
        elif arg == "--":
            rest = ["--", *rest, *args[i + 1:]]
            break
        elif _flag_name(arg, flags):
            moved.append(arg)
            value_next = "=" not in arg
        else:
            rest.append(arg)
    return moved + rest


def _read_command(command: str, command_args: list[str]) -> tuple[str, list[str], dict[str, str]]:
    """(bundle, positional arguments, flag values) as runc 1.1 parses them; ArgvError where its flag parsing fails."""
    flags = _COMMAND_FLAGS[command]
    values, order, positional = _go_flag_parse(_reorder(command_args, flags), flags)
    for names in _ALIASES:
        if len(set(names) & set(order)) > 1:
            raise ArgvError(f"Cannot use two forms of the same flag: {' '.join(reversed(names))}")
    bundle = next((values[name] for name in reversed(order) if name in ("bundle", "b")), "")
    return bundle, positional, values


def parse_command(command: str, command_args: list[str]) -> tuple[str, str]:
    """(bundle, container id) exactly as runc 1.1 reads ``runc COMMAND ARGS...`` for create and run;
    ArgvError where runc would refuse the command line or only print its help."""
    bundle, positional, values = _read_command(command, command_args)
    if "true" in (values.get("help"), values.get("h")):
        raise ArgvError("help requested")
    if len(positional) != 1:
        raise ArgvError(f'"{command}" requires exactly 1 argument(s)')
    if not positional[0]:
        raise ArgvError("container id cannot be empty")
    return bundle, positional[0]


def _runc_parse_argv(args: list[str]) -> tuple[str | None, dict[str, str], list[str]]:
    options: dict[str, str] = {}
    try:
        values, _order, rest = _go_flag_parse(args, _GLOBAL_FLAGS)
    except ArgvError:
        return None, options, []
    options = {f"--{name}": value for name, value in values.items() if _GLOBAL_FLAGS[name] == "string"}
    if "true" in (values.get("help"), values.get("h"), values.get("version"), values.get("v")) or not rest:
        return None, options, []
    if values.get("log-format", "text") not in ("text", "json"):
        return None, options, rest[1:]  # runc: invalid log-format
    command = rest[0] if rest[0] in _RUNC_COMMANDS else None
    if command in _COMMAND_FLAGS:
        try:
            chosen = parse_command(command, rest[1:])
            if command == "create" and chosen != parse_command("run", rest[1:]):
                raise ArgvError("create read differently from run")  # bundle_dir reads with run's flags
        except ArgvError:
            return None, options, rest[1:]
    return command, options, rest[1:]


# --- crun ------------------------------------------------------------------------------------------------------

# crun (src/crun.c, src/create.c, src/run.c) reads its command line with glibc's argp, that is getopt_long in
# order: the options end at the first argument that is no option (the command, the container id) or after "--";
# a short option takes its value from the rest of its word or from the next word ("-bDIR", "-b DIR"); a long one
# from after "=" or from the next word, under its name or any prefix that names one option ("--bund DIR").  Each
# table: option -> (what it sets, its argument: 0 none, 1 required, 2 optional).  argp adds --help/-?, --usage
# (both print and exit), --program-name and the hidden --HANG (sleeps, then goes on) to every parser.
_ARGP_OPTIONS = {"help": ("help", 0), "usage": ("usage", 0), "program-name": ("program-name", 1),
                 "HANG": ("HANG", 2)}
_CRUN_GLOBAL_1_8 = {"debug": ("debug", 0), "cgroup-manager": ("cgroup-manager", 1),
                    "systemd-cgroup": ("systemd-cgroup", 0), "log": ("log", 1), "log-format": ("log-format", 1),
                    "root": ("root", 1), "rootless": ("root", 1),  # files --rootless under --root's key
                    "version": ("version", 0)}
_CRUN_GLOBAL_SHORT = {"v": ("version", 0), "V": ("version", 0), "?": ("help", 0)}
_CRUN_CREATE = {"bundle": ("bundle", 1), "config": ("config", 1), "console-socket": ("console-socket", 1),
                "preserve-fds": ("preserve-fds", 1), "no-pivot": ("no-pivot", 0), "pid-file": ("pid-file", 1),
                "no-subreaper": ("no-subreaper", 0), "no-new-keyring": ("no-new-keyring", 0)}
_CRUN_CREATE_SHORT = {"b": ("bundle", 1), "f": ("config", 1), "?": ("help", 0)}
_CRUN_RUN_1_8 = {**_CRUN_CREATE, "detach": ("detach", 0)}
_CRUN_RUN_SHORT = {**_CRUN_CREATE_SHORT, "d": ("detach", 0)}


def _crun_version(global_long: dict[str, tuple[str, int]], run_long: dict[str, tuple[str, int]],
                  ) -> tuple[tuple[dict[str, tuple[str, int]], dict[str, tuple[str, int]]],
                             dict[str, tuple[dict[str, tuple[str, int]], dict[str, tuple[str, int]]]]]:
    return ({**global_long, **_ARGP_OPTIONS}, _CRUN_GLOBAL_SHORT), {
        "create": ({**_CRUN_CREATE, **_ARGP_OPTIONS}, _CRUN_CREATE_SHORT),
        "run": ({**run_long, **_ARGP_OPTIONS}, _CRUN_RUN_SHORT)}


# The option tables of every crun release whose command line differs from the one before (options added or
# re-keyed change what a prefix names).  The options that name the config file are the same in all of them.
_CRUN_RELEASES = {
    "1.8": _crun_version(_CRUN_GLOBAL_1_8, _CRUN_RUN_1_8),
    "1.16": _crun_version(_CRUN_GLOBAL_1_8, {**_CRUN_RUN_1_8, "keep": ("keep", 0)}),
    "1.18": _crun_version({**_CRUN_GLOBAL_1_8, "log-level": ("log-level", 1)}, {**_CRUN_RUN_1_8, "keep": ("keep", 0)}),
    "1.29": _crun_version({**_CRUN_GLOBAL_1_8, "log-level": ("log-level", 1), "rootless": ("rootless", 1)},
                          {**_CRUN_RUN_1_8, "keep": ("keep", 0)}),
}
_CRUN_COMMANDS = frozenset({"create", "delete", "exec", "list", "kill", "ps", "run", "spec", "start", "state",
                            "update", "pause", "resume", "checkpoint", "restore"})
_CRUN_DEFAULT_CONFIG = "config.json"  # crun: this very name is opened in the bundle; any other -f FILE as given


def _getopt(args: list[str], tables: tuple[dict[str, tuple[str, int]], dict[str, tuple[str, int]]],
            ) -> tuple[list[tuple[str, str | None]], int]:
    """glibc's getopt_long in argp's order mode over ``args`` (no program name): the (option, value) pairs in
    order and the index of the first argument that is no option; ArgvError where getopt reports an error."""
    long_options, short_options = tables
    found: list[tuple[str, str | None]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return found, i + 1
        if not arg.startswith("-") or arg == "-":
            return found, i
        i += 1
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            option = long_options.get(name)
            if option is None:
                matches = {long_options[n] for n in long_options if n.startswith(name)}
                if len(matches) != 1:
                    raise ArgvError(f"option '--{name}' is {'ambiguous' if matches else 'unrecognized'}")
                option = matches.pop()
            key, takes = option
            if eq and not takes:
                raise ArgvError(f"option '--{name}' doesn't allow an argument")
            if not eq and takes == 1:
                if i >= len(args):
                    raise ArgvError(f"option '--{name}' requires an argument")
                value, i = args[i], i + 1
            found.append((key, value if eq or takes == 1 else None))
            continue
        for at in range(1, len(arg)):
            option = short_options.get(arg[at])
            if option is None:
                raise ArgvError(f"invalid option -- '{arg[at]}'")
            key, takes = option
            if not takes:
                found.append((key, None))
                continue
            value = arg[at + 1:] or None
            if value is None and takes == 1:
                if i >= len(args):
                    raise ArgvError(f"option requires an argument -- '{arg[at]}'")
                value, i = args[i], i + 1
            found.append((key, value))
            break
    return found, i


def _crun_parse_release(args: list[str], release: str) -> tuple[str | None, dict[str, str], list[str]]:
    """parse_argv for crun ``release``."""
    global_tables, command_tables = _CRUN_RELEASES[release]
    options: dict[str, str] = {}
    try:
        found, at = _getopt(args, global_tables)
    except ArgvError:
        return None, options, []
    values = {key: value or "" for key, value in found}
    for key in ("root", "log", "log-format"):
        if key in values:
            options[f"--{key}"] = values[key]
    log_kind, colon, log_path = options.get("--log", "").partition(":")  # crun: PATH, file:PATH, syslog:..., ...
    if colon:
        del options["--log"]
        if log_kind == "file":
            options["--log"] = log_path
    if {"version", "help", "usage"} & values.keys() or at >= len(args):
        return None, options, []
    rest = args[at + 1:]
    if values.get("cgroup-manager", "cgroupfs") not in ("systemd", "cgroupfs", "disabled"):
        return None, options, rest  # crun: unknown cgroup manager specified
    command = args[at] if args[at] in _CRUN_COMMANDS else None
    if command in command_tables:
        if values.get("log-format", "text") not in ("text", "json") or (
                colon and log_kind not in ("file", "syslog", "journald")):
            return None, options, rest  # crun: unknown log format type, unknown log type
        try:
            _crun_read_release(command, rest, command_tables[command])
        except ArgvError:
            return None, options, rest
    return command, options, rest


def _crun_parse_argv(args: list[str]) -> tuple[str | None, dict[str, str], list[str]]:
    """The reading of every crun release: a create or run that any of them would run (where another refuses, a
    rewrite is harmless; a missed one would not be), else crun 1.8's."""
    readings = [_crun_parse_release(args, release) for release in _CRUN_RELEASES]
    rewriting = [r for r in readings if r[0] in REWRITE_COMMANDS]
    if any(r[0] != rewriting[0][0] or r[2] != rewriting[0][2] for r in rewriting):
        raise HookError("crun releases read this command line differently; nothing rewritten, nothing run")
    return rewriting[0] if rewriting else readings[0]


def _crun_read_release(command: str, command_args: list[str],
                       tables: tuple[dict[str, tuple[str, int]], dict[str, tuple[str, int]]]) -> tuple[str, str]:
    """(the config file crun opens, the container id) for ``crun create|run ARGS...``; ArgvError where crun refuses
    the command line before it opens one (its argp, argument count, an empty bundle or config name)."""
    found, at = _getopt(command_args, tables)
    if any(key in ("help", "usage") for key, _value in found):
        raise ArgvError("help requested")
    positional = command_args[at:]
    if len(positional) != 1:
        raise ArgvError(f"`{command}` requires a {'minimum' if not positional else 'maximum'} of 1 arguments")
    bundle = next((value for key, value in reversed(found) if key == "bundle"), None)
    config = next((value for key, value in reversed(found) if key == "config"), _CRUN_DEFAULT_CONFIG)
    if bundle == "" or not config:
        raise ArgvError("realpath `` failed")
    if config != _CRUN_DEFAULT_CONFIG and not config.startswith("/"):
        config = os.path.realpath(config)  # crun: made absolute before it enters the bundle
    if bundle is None:
        bundle = os.getcwd()
    elif not bundle.startswith("/"):
        bundle = os.path.realpath(bundle)
    return (os.path.join(bundle, config) if config == _CRUN_DEFAULT_CONFIG else config), positional[0]


def _crun_read(command: str, command_args: list[str]) -> tuple[str, str]:
    """:func:`_crun_read_release` for every crun release that reads the command line (all of them agree)."""
    readings, refusals = set(), []
    for _global_tables, command_tables in _CRUN_RELEASES.values():
        try:
            readings.add(_crun_read_release(command, command_args, command_tables[command]))
        except ArgvError as err:
            refusals.append(err)
    if not readings:
        raise refusals[0]
    if len(readings) > 1:
        raise HookError("crun releases read this command line differently; nothing rewritten, nothing run")
    return readings.pop()


# --- either ----------------------------------------------------------------------------------------------------

RUNC, CRUN = "runc", "crun"


def parse_argv(args: list[str], kind: str = RUNC) -> tuple[str | None, dict[str, str], list[str]]:
    """Split the runtime's argv (without argv[0]) into command, global options (``--name`` -> value: ``--root``,
    ``--log``, ``--log-format`` and the like), command args, as runtime ``kind`` (RUNC: runc 1.1, CRUN: crun 1.8)
    parses them.  The command is None where the runtime would run no command (a bad global option, help,
    version) and, for create and run, where it would refuse the command line: the shim then rewrites nothing and
    the runtime prints its own error."""
    return (_crun_parse_argv if kind == CRUN else _runc_parse_argv)(args)


def bundle_dir(command_args: list[str], command: str = "run", kind: str = RUNC) -> str:
    """The bundle the runtime uses: for runc ``--bundle``/``-b`` in any of its spellings (the last one given), else
    the working directory; for crun the directory of the config file it opens.  HookError where its flag parsing
    would fail."""
    if kind == CRUN:
        return os.path.dirname(config_path(command_args, command, kind))
    try:
        bundle = _read_command(command, command_args)[0]
    except ArgvError as err:
        raise HookError(f"runc would refuse this command line ({err}); nothing rewritten") from None
    return bundle or os.getcwd()


def config_path(command_args: list[str], command: str = "run", kind: str = RUNC) -> str:
    """The config file the runtime opens for ``create``/``run`` ``command_args``: the bundle's config.json, or for
    crun its ``-f``/``--config FILE`` (a name other than config.json is taken from the working directory).
    HookError where the runtime would refuse the command line."""
    if kind != CRUN:
        return os.path.join(bundle_dir(command_args, command), "config.json")
    try:
        return _crun_read(command, command_args)[0]
    except ArgvError as err:
        raise HookError(f"crun would refuse this command line ({err}); nothing rewritten") from None


def container_id(command_args: list[str], command: str = "run", kind: str = RUNC) -> str:
    """The container id the runtime uses for create and run; for the log of other commands (whose flags differ),
    and where the runtime would refuse the command line, the last argument that is no flag."""
    try:
        return _crun_read(command, command_args)[1] if kind == CRUN else parse_command(command, command_args)[1]
    except (ArgvError, HookError, KeyError):
        positional = [a for a in command_args if not a.startswith("-")]
        return positional[-1] if positional else ""


class Reading:
    """A command line as runtime ``kind`` reads it, in one value: ``command`` (None where it would run none),
    its global ``options`` and the command's ``args``; for create and run ``config``, the file the runtime opens
    (or ``refusal``, the error that it would refuse the command line with) and ``container_id`` (for other
    commands, and refused command lines, the best guess for the log)."""

    __slots__ = ("args", "command", "config", "container_id", "kind", "options", "refusal")

    def __init__(self, argv: list[str], kind: str = RUNC) -> None:
        self.kind = kind
        self.command, self.options, self.args = parse_argv(argv, kind)
        self.config = ""
        self.refusal: Exception | None = None
        if self.command in REWRITE_COMMANDS:
            try:
                self.config = config_path(self.args, self.command, kind)
            except (HookError, OSError) as err:  # OSError: a working directory that is gone
                self.refusal = err
        self.container_id = container_id(self.args, self.command or "run", kind)

