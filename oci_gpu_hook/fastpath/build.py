"""The native front's build: its settings baked into a header, its compile, and the name of a prebuilt one.

``oci_gpu_hook/fastpath/front.c`` (and the parts it includes) is compiled once per launcher, by ``launchers`` and
``install``, with this install's settings baked in (:func:`front_header`: the interpreter, its code paths, the
``--set`` defaults, the config file's bytes and what they say, the fast-path contract of :func:`front_contract`,
the planner's version line).  Where no compiler is there, a front prebuilt for exactly this header is taken from
``fastpath/prebuilt/<key>`` (:func:`front_key`).  What the launchers write, and when, is
:mod:`oci_gpu_hook.install.launchers`'.
"""

from __future__ import annotations

import os
import sys

from oci_gpu_hook.errors import HookError
from oci_gpu_hook.install import codepaths
from oci_gpu_hook.pins import PINS_NAME
from oci_gpu_hook.request import CDI_ANNOTATION_PREFIX

ROLES = {"oci-gpu-hook": 2, "oci-gpu-runtime": 1}  # OGH_ROLE_HOOK, OGH_ROLE_SHIM in front.c
CDI_NEEDLE = CDI_ANNOTATION_PREFIX.rstrip("/")  # without its '/': '\/' in JSON spells that slash too
FRONT_DIR = os.path.dirname(os.path.abspath(__file__))
FRONT_SOURCE = os.path.join(FRONT_DIR, "front.c")
# What front.c #includes, in its order: one compile of front.c builds them all.
FRONT_PARTS = ("journal.c", "trust.c", "json.c", "settings.c", "planner.c", "argv.c", "hooks.c")
PREBUILT_DIR = os.path.join(FRONT_DIR, "prebuilt")


def find_cc() -> str | None:
    import shutil

    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name:
            found = shutil.which(name)
            if found:
                return found
    return None


def _c_string(text: str) -> str:
    return _c_bytes(text.encode("utf-8", "surrogateescape"))


def _c_bytes(data: bytes) -> str:
    """A C string literal of exactly ``data`` (NUL bytes and all), 64 bytes a line."""
    def line(chunk: bytes) -> str:
        return '"' + "".join(chr(b) if 0x20 <= b < 0x7F and b not in b'"\\?' else f"\\{b:03o}" for b in chunk) + '"'

    return "\n    ".join(line(data[i:i + 64]) for i in range(0, len(data), 64)) if data else '""'


def _c_list(items: list[str]) -> str:
    return "{" + ", ".join([*(_c_string(i) for i in items), "NULL"]) + "}"


MAX_BAKED_CONFIG = 1 << 20  # a config file larger than this bakes no fast path


def baked_settings(defaults: dict[str, str]) -> dict[str, object]:
    """What the native front needs to know about this install's config, read as a container start reads it
    (the environment of the runtime is unknown here: only the baked defaults count).  ``content``: the bytes of
    the config file the settings were parsed from (None: no file)."""
    from oci_gpu_hook import config as cfg

    fast = True
    for key, value in defaults.items():
        field = next((name for name, f in cfg.FIELDS.items() if f.env == key), None)
        if field:
            try:
                cfg.check_value(field, value, f"environment variable {key}")
            except HookError:
                fast = False
    path = defaults.get("OCI_GPU_HOOK_CONFIG") or cfg.DEFAULT_CONFIG_PATH
    if not path.startswith("/"):
        fast = False  # Python reads it from another working directory than the front would
    values: dict[str, object] = {}
    content = None
    try:
        from oci_gpu_hook.trust import read_regular

        content = read_regular(path, cfg.check_trusted(path))  # the very file checked, through its descriptor
        values = cfg.parse_bytes(content, f"config file {path}")  # the settings of exactly the bytes baked
    except FileNotFoundError:
        if defaults.get("OCI_GPU_HOOK_CONFIG"):
            fast = False
    except (OSError, HookError):
        fast = False
    if content is not None and len(content) > MAX_BAKED_CONFIG:
        fast = False
    names = {name for names in cfg.FIELDS["request_env"].default.values() for name in names}
    for names_of_kind in dict(values.get("request_env") or {}).values():  # type: ignore[call-overload]
        names.update(names_of_kind)
    return {"fast": fast, "path": path, "content": content if fast else None,
            "runtime": values.get("runtime", cfg.FIELDS["runtime"].default),
            "syslog": values.get("syslog", cfg.FIELDS["syslog"].default),
            "needles": sorted({n.lower() for n in names} | {CDI_NEEDLE}), "request_names": sorted(names)}


def _spec_field_names() -> list[str]:
    """Every field name of config.json whose spelling :func:`oci_gpu_hook.oci_spec.loads` checks."""
    from oci_gpu_hook.oci_spec import _FIELDS

    return sorted({name for names in _FIELDS.values() for name in names})


def front_contract() -> dict[str, str | list[str] | int]:
    """The fast-path contract: every name, word and path the front compares or uses that the Python path
    defines, each taken from where Python defines it (``oci_gpu_hook/fastpath/front.c`` names them
    ``OGH_<KEY>``; its header says which Python function each part of the front mirrors)."""
    from oci_gpu_hook import LIVE_COMMANDS, PRECREATE, config, log, oci_argv, trust
    from oci_gpu_hook.appliers.ocispec import LDCACHE_COMMAND, LINKS_COMMAND
    from oci_gpu_hook.core.edits import BY_PATH_DIR, LINK_NODES
    from oci_gpu_hook.request import NO_GPU
    from oci_gpu_hook.serve import planner

    return {
        "BOOL_WORDS": sorted(config._TRUE | config._FALSE),  # config.check_value of a bool from the environment
        "BOOL_ENV": sorted(f.env for f in config.FIELDS.values() if f.type == "bool" and f.env),
        "NO_REQUEST_WORDS": sorted(NO_GPU),  # request.py _requested: a value that asks for nothing
        "CONFIG_ENV": config.CONFIG_ENV,
        "RUNTIME_ENV": str(config.FIELDS["runtime"].env),
        "REWRITE_COMMANDS": sorted(oci_argv.REWRITE_COMMANDS),
        "VERSION_ARGS": list(oci_argv.VERSION_ARGS),
        "DEFAULT_PATH": oci_argv.DEFAULT_PATH,
        "HOOK_COMMANDS": sorted({PRECREATE, *LIVE_COMMANDS}),
        "PRECREATE": PRECREATE,
        "LINKS_COMMAND": LINKS_COMMAND,
        "LDCACHE_COMMAND": LDCACHE_COMMAND,  # served by the planner with its arguments (front.c ldcache_main)
        "BY_PATH_DIR": BY_PATH_DIR,
        "LINK_NODES": list(LINK_NODES),
        "PLANNER_ENV": planner.SOCKET_ENV,
        "PLANNER_SOCKET": planner.DEFAULT_SOCKET,
        "PLANNER_TIMEOUT_MS": planner.ANSWER_TIMEOUT_MS,
        "SYSLOG_SOCKET": log.SYSLOG_SOCKET,  # the journal's line (log.py to_syslog)
        "SYSLOG_PRI_ERR": log.SYSLOG_FACILITY * 8 + log.SEVERITY["error"],
        "SYSLOG_PRI_INFO": log.SYSLOG_FACILITY * 8 + log.SEVERITY["info"],
        "SYSLOG_MAX": log.SYSLOG_MAX,  # log.py syslog_text: the bytes of MESSAGE kept
        "PROGRAM": log.PROGRAM,
        "PINS_NAME": PINS_NAME,  # trust.load_pins: the install's pins, beside the launchers
        "MAX_PINS": trust.MAX_PINS,  # trust.read_pins: a larger pins file is not read at all
    }


def _c_definition(key: str, value: str | list[str] | int) -> str:
    if isinstance(value, int):
        return f"#define OGH_{key} {value}"
    if isinstance(value, list):
        return f"static const char *const OGH_{key}[] = {_c_list(value)};"
    return f"static const char OGH_{key}[] = {_c_string(value)};"


def front_header(name: str, directory: str, defaults: dict[str, str], trust: bool) -> str:
    from oci_gpu_hook import __version__
    from oci_gpu_hook.config import DEFAULT_CONFIG_PATH
    from oci_gpu_hook.serve.planner import version_line

    baked = baked_settings(defaults)
    content = baked["content"]
    assert content is None or isinstance(content, bytes)
    pairs = [x for item in defaults.items() for x in item]
    code = [p for p in codepaths.code_paths() if os.path.isdir(p)] + codepaths.stdlib_paths() + codepaths.venv_config()
    lines = [
        f"#define OGH_ROLE {ROLES[name]}",
        f"#define OGH_FAST_PATH_BAKED {int(bool(baked['fast']))}",
        f"#define OGH_CHECK_TRUST {int(trust)}",
        f"static const char OGH_PYTHON[] = {_c_string(sys.executable)};",
        f"static const char OGH_SCRIPT[] = {_c_string(os.path.join(directory, name + '.py'))};",
        f"static const char *const OGH_CODE_PATHS[] = {_c_list(code)};",
        f"static const char *const OGH_DEFAULTS[] = {_c_list(pairs)};",
        f"static const char OGH_DEFAULT_CONFIG[] = {_c_string(DEFAULT_CONFIG_PATH)};",
        f"static const char OGH_CONFIG_PATH[] = {_c_string(str(baked['path']))};",
        f"static const char OGH_RUNTIME[] = {_c_string(str(baked['runtime']))};",
        f"#define OGH_SYSLOG {int(bool(baked['syslog']))}",
        f"static const char *const OGH_NEEDLES[] = {_c_list(list(baked['needles']))};",  # type: ignore[call-overload]
        f"static const char *const OGH_REQUEST_NAMES[] = "
        f"{_c_list(list(baked['request_names']))};",  # type: ignore[call-overload]
        f"static const char *const OGH_FIELD_NAMES[] = {_c_list(_spec_field_names())};",
        f"static const char OGH_VERSION_LINE[] = {_c_string(f'oci-gpu-runtime {__version__}')};",
        f"#define OGH_CONFIG_EXISTS {int(content is not None)}",
        f"#define OGH_CONFIG_LEN {len(content or b'')}",
        f"static const char OGH_CONFIG_BYTES[] = {_c_bytes(content or b'')};",
        f"static const char OGH_ROLE_NAME[] = {_c_string(name)};",
        f"static const char OGH_SELF[] = {_c_string(os.path.join(directory, name))};",
        f"static const char OGH_PLANNER_VERSION[] = {_c_string(version_line())};",
        *(_c_definition(key, value) for key, value in front_contract().items()),
    ]
    return "\n".join(lines) + "\n"


NATIVE_FIX = " (or pass --no-native for the Python launchers, ~+15 ms per container start)"


def front_problem() -> str | None:
    """Why the native front cannot be built from this install, before trying: its source is not there."""
    if not os.path.isfile(FRONT_SOURCE):
        return (f"no {FRONT_SOURCE} in this install of oci-gpu-hook (a wheel built without its package data?); "
                "reinstall the package from a complete wheel or source tree")
    return None


def compile_problem(cc: str, stderr: str) -> str:
    """One line for a failed compile: a missing header says which and how to get it; else the first error."""
    import re

    # gcc: "fatal error: stdio.h: No such file or directory"; clang: "fatal error: 'stdio.h' file not found"
    missing = re.search(r"fatal error: (?:([^\s:']+): No such file or directory|'([^']+)' file not found)", stderr)
    if missing:
        return (f"the C headers are missing ({missing.group(1) or missing.group(2)} not found by {cc}): install them "
                "(Debian/Ubuntu: apt-get install libc6-dev; Fedora/RHEL: dnf install glibc-devel)")
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    first = next((line for line in lines if "error" in line), lines[0] if lines else "no output")
    return f"compiling {FRONT_SOURCE} with {cc} failed: {first[:300]}"


def front_sources() -> list[str]:
    """``front.c`` and its parts (:data:`FRONT_PARTS`, beside it), in that order."""
    return [FRONT_SOURCE, *(os.path.join(os.path.dirname(FRONT_SOURCE), part) for part in FRONT_PARTS)]


def front_key(header: str) -> str:
    """The name of a prebuilt front: the SHA-256 of ``front.c``, of each of its parts in :data:`FRONT_PARTS`'
    order, and of its baked header."""
    import hashlib

    digest = hashlib.sha256()
    for path in front_sources():
        with open(path, "rb") as handle:
            digest.update(handle.read() + b"\0")
    digest.update(header.encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def compile_front(name: str, directory: str, defaults: dict[str, str], trust: bool, cc: str,
                  flags: tuple[str, ...] = ()) -> bytes:
    """The native front of launcher ``name`` for ``directory``, compiled with ``cc`` (and ``flags``)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="oci-gpu-hook-front-") as tmp:
        header = os.path.join(tmp, "baked.h")
        with open(header, "w", encoding="utf-8") as handle:
            handle.write(front_header(name, directory, defaults, trust))
        out = os.path.join(tmp, name)
        cmd = [cc, "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", f'-DOGH_BAKED="{header}"', *flags,
               "-o", out, FRONT_SOURCE]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as err:
            raise HookError(f"cannot build the native front: running the C compiler {cc} failed "
                            f"({err.strerror}){NATIVE_FIX}") from None
        if proc.returncode != 0:
            raise HookError(f"cannot build the native front: {compile_problem(cc, proc.stderr)}{NATIVE_FIX}")
        with open(out, "rb") as handle:
            return handle.read()
