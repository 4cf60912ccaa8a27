"""Launchers: what runtimes and hooks.d run on every container start.

Two kinds, written by ``oci-gpu-hook launchers DIR`` (and ``install``):

- **native front** (the default when a C compiler is found: ``$CC``, else ``cc``/``gcc`` on PATH; and
  with ``--native``): ``DIR/oci-gpu-hook``
  and ``DIR/oci-gpu-runtime`` are compiled from ``oci_gpu_hook/fastpath/front.c`` with this install's
  settings baked in (interpreter, sys.path, ``--set`` defaults, the config file's bytes, its runtime, every
  request variable name, the field names of config.json, the fast-path contract of :func:`front_contract`, the
  planner's version line).  When there is nothing to do (a pass-through runtime command; a container that
  certainly asks for no device) they do it without starting Python, and so do they make the ``links`` hook's
  /dev/dri/by-path links; otherwise they ask the resident planner (``oci-gpu-hook serve``,
  :mod:`oci_gpu_hook.host.planner`) and, where it does not answer, exec the Python launcher next to them
  (``DIR/oci-gpu-hook.py``, ``DIR/oci-gpu-runtime.py``).
- **Python launcher** (no compiler, or ``--no-native``): ``DIR/oci-gpu-hook`` and ``DIR/oci-gpu-runtime``
  are the ``python -I -S`` scripts themselves.

When the front is wanted (``--native``, or a compiler is there) and cannot be built, nothing is written:
one line says what is missing (the compiler, ``front.c`` in this install, the C headers) and exit 1.
Only the default without any compiler writes the Python launchers, with a note that says so.

**Prebuilt fronts.**  An install without a compiler (the container image, image/build.sh) still writes the
native front when the package holds one prebuilt for exactly this front: ``fastpath/prebuilt/<key>``, where the
key is the SHA-256 of ``front.c`` and of the baked header this install would compile it with (every setting,
path and the build's version line).  The image build compiles them (:func:`prebuild_fronts`) for the
DaemonSet's install command; any other install (another ``--set``, a config file, another interpreter path)
has no matching file and is written as without a prebuilt front.

Both refuse to run package code from a path that fails the trust rule of :mod:`oci_gpu_hook.trust` (for a
launcher run as root: anything a non-root user could change), or that is gone (one line on stderr, exit 1),
unless written with ``allow_untrusted`` (tests, editable checkouts).  The Python launcher's check is that rule's
own block, copied from ``trust.py`` (:func:`rule_text`); the C front's is tested against it.

**The front's settings stamp.**  What the front knows of the config file (its runtime, its request names) is
only right while the file holds the bytes it was baked from, so the front bakes those bytes (the file as read
once, and parsed from that same read: a file over 1 MiB bakes no fast path; one that a container start could
not use is refused before anything is written, :func:`check_live_config`) and, on every create, run and hook,
reads the file again and compares it in full with them, then checks it as trusted as
:func:`oci_gpu_hook.config.check_trusted` does.  Any difference hands over to Python.  No
clock or stat field is compared: reading a file changes its access time (``relatime``), and on a filesystem
with whole-second timestamps an edit of the same size in the same second leaves every stat field as it was;
the content cannot miss an edit.  Reading a small file costs the front a few microseconds.
"""

from __future__ import annotations

import os
import sys

from oci_gpu_hook.errors import HookError
from oci_gpu_hook.request import CDI_ANNOTATION_PREFIX

LAUNCHER = """#!{python} -IS
# Lean launcher written by `oci-gpu-hook launchers`: isolated mode (-I: no
# PYTHON* variables, no user site) and no site import (-S), which saves
# ~10 ms per container start.  The package and the site-packages of the
# environment it was installed in are put on sys.path directly.
import os
import sys
for key, value in {defaults!r}.items():
    os.environ.setdefault(key, value)
{trust}sys.path[:0] = {paths!r}
{pinned}from oci_gpu_hook.{module} import main
sys.exit(main({main_args}))
"""

# The trust check of a Python launcher: the rule of oci_gpu_hook/trust.py, copied from there (rule_text), then
# every path the launcher runs code from; os and stat only (no import beyond what -I -S loads anyway).
TRUST = """import stat
{rule}
load_pins({pins!r})
for _path in {checked!r}:
    _why = code_problem(_path)
    if _why:
        if {passthrough!r} and "create" not in sys.argv[1:] and "run" not in sys.argv[1:]:
            _runtime = os.environ.get("OCI_GPU_HOOK_RUNTIME") or {runtime!r}
            for _dir in ([""] if "/" in _runtime else (os.environ.get("PATH") or "/usr/bin:/bin").split(":")):
                _exe = os.path.join(_dir, _runtime) if _dir else _runtime
                if os.access(_exe, os.X_OK) and not os.path.isdir(_exe):
                    if not code_problem(_exe):  # the runtime is code too: run only one that passes the rule
                        os.execv(_exe, [_exe, *sys.argv[1:]])
                    break
        sys.stderr.write(f"oci-gpu-hook: error: refusing to run {{_path}}: {{_why}} "
                         "(install into a root-owned prefix, see docs/security.md)\\n")
        sys.exit(1)
"""
# the package's own trust module then holds the same pins (its config checks)
PINNED = """if PINS:
    from oci_gpu_hook import trust as _trust
    _trust.PINS.update(PINS)
"""
PINS_NAME = "install.pins"  # beside the launchers: trust.pins_of, written by `launchers` and `install`
RULE_BEGINS = "# --- the rule begins"
RULE_ENDS = "# --- the rule ends"


def rule_text() -> str:
    """The trust rule's block of :mod:`oci_gpu_hook.trust`, verbatim (from its first line to its last)."""
    from oci_gpu_hook import trust

    with open(trust.__file__, encoding="utf-8") as handle:
        source = handle.read()
    start = source.index(RULE_BEGINS)
    return source[start:source.index(RULE_ENDS, start) + len(RULE_ENDS)] + "\n"


# launcher file name -> module whose main() it runs
LAUNCHERS = (("oci-gpu-hook", "entry.cli"), ("oci-gpu-runtime", "entry.runtime"))
ROLES = {"oci-gpu-hook": 2, "oci-gpu-runtime": 1}  # OGH_ROLE_HOOK, OGH_ROLE_SHIM in front.c
FRONT_SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fastpath", "front.c")
PREBUILT_DIR = os.path.join(os.path.dirname(FRONT_SOURCE), "prebuilt")
CDI_NEEDLE = CDI_ANNOTATION_PREFIX.rstrip("/")  # without its '/': '\/' in JSON spells that slash too


def launcher_defaults(items: list[str], command: str) -> dict[str, str]:
    """``--set OCI_GPU_HOOK_VAR=VALUE`` items as the defaults a launcher bakes in."""
    defaults = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.startswith("OCI_GPU_HOOK_"):
            raise HookError(f"{command} --set {item!r}: expected OCI_GPU_HOOK_NAME=VALUE")
        defaults[key] = value
    return defaults


def for_pods(defaults: dict[str, str], facing: list[str], command: str) -> tuple[dict[str, str], str | None]:
    """The defaults to bake into launchers that pods reach through ``facing`` (what, in words; empty: none), and the
    one line that says what becomes of env requests there; (``defaults``, None) where no pod reaches them.

    An image or a pod spec sets the container's env (every CUDA image carries ``NVIDIA_VISIBLE_DEVICES=all``), so
    where pods reach the launchers, an env request would give a pod every GPU whatever the scheduler gave it:
    ``allow_env_requests`` is baked off there, unless ``--set`` names it (the operator's explicit word, either way).
    It beats the config file's key (a baked default is an environment variable), so a file copied from
    examples/config.toml cannot turn them back on."""
    from oci_gpu_hook.config import FIELDS, check_value

    if not facing:
        return defaults, None
    var = str(FIELDS["allow_env_requests"].env)
    reach = f"pods reach these launchers ({'; '.join(facing)})"
    if var in defaults:
        if check_value("allow_env_requests", defaults[var], f"environment variable {var} ({command} --set)"):
            return defaults, (f"env requests: on, as --set {var}={defaults[var]} asks, although {reach}: a pod whose "
                              "image or spec sets AMD_VISIBLE_DEVICES=all or NVIDIA_VISIBLE_DEVICES=all gets every "
                              "GPU of the node, whatever the scheduler gave it (docs/security.md)")
        return defaults, f"env requests: off, as --set {var}={defaults[var]} asks ({reach})"
    return {**defaults, var: "false"}, (
        f"env requests: off, since {reach}: only the orchestrator's cdi.k8s.io annotations and CDI names grant GPUs, "
        "never AMD_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES or INTEL_VISIBLE_DEVICES in an image or a pod spec "
        f"(podman and Docker on this node too: ask with --device amd.com/gpu=N); {command} --set {var}=true turns "
        "them on for every container (docs/security.md)")


# "for key, value in ": how the line of LAUNCHER that holds the defaults begins
_DEFAULTS_LINE = next(line for line in LAUNCHER.splitlines() if "{defaults!r}" in line).split("{")[0]


def baked_defaults(directory: str) -> dict[str, str] | None:
    """The ``--set`` defaults baked into the launchers in ``directory``, read back from the Python launcher (beside a
    native front, which bakes the same ones); None where there is none, or it is not one of :data:`LAUNCHER`."""
    import ast

    for name in ("oci-gpu-hook.py", "oci-gpu-hook"):
        try:
            with open(os.path.join(directory, name), "rb") as handle:
                text = handle.read(1 << 20)
        except OSError:
            continue
        for line in text.decode("utf-8", "replace").splitlines():
            if line.startswith(_DEFAULTS_LINE) and line.endswith(".items():"):
                try:
                    value = ast.literal_eval(line[len(_DEFAULTS_LINE):-len(".items():")])
                except (ValueError, SyntaxError):
                    return None
                ok = isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in value.items())
                return value if ok else None
    return None


# What site-packages and stdlib directories the interpreter has when ``site`` runs at its start-up.
_STARTUP_PATHS = ("import site, sysconfig; print(repr((site.getsitepackages(), "
                  "[sysconfig.get_path(n) for n in ('stdlib', 'platstdlib')])))")
_PATHS: list[list[str]] = []


def _startup_paths() -> list[list[str]]:
    """[site-packages, stdlib directories] of this interpreter's environment as ``site`` sets them up.  Under
    ``python -S`` (an installed launcher runs so) ``site`` did not run and ``sys.prefix`` is the base interpreter's,
    not the virtual environment's: then the interpreter itself is asked, with ``site``."""
    if not _PATHS:
        if sys.flags.no_site:
            import ast
            import subprocess

            done = subprocess.run([sys.executable, "-I", "-c", _STARTUP_PATHS], capture_output=True, text=True,
                                  timeout=120)
            if done.returncode != 0:
                raise HookError(f"cannot ask {sys.executable} for its site-packages: {done.stderr.strip()[:500]}")
            _PATHS.extend(ast.literal_eval(done.stdout.strip()))
        else:
            import site
            import sysconfig

            _PATHS.extend([site.getsitepackages(), [sysconfig.get_path(n) for n in ("stdlib", "platstdlib")]])
    return _PATHS


def site_packages() -> list[str]:
    """The site-packages directories of this interpreter's environment, whether or not ``site`` ran here."""
    return list(_startup_paths()[0])


def _package_parent() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def code_paths() -> list[str]:
    """Where a launcher loads code from: this package's parent and the environment's site-packages."""
    return list(dict.fromkeys([_package_parent(), *site_packages()]))


def package_trees() -> list[str]:
    """What the package and every distribution it requires (recursively, its extras' too: whatever of them is
    installed) put on disk: the top-level files and directories of each in its site-packages, and each file it put
    elsewhere (a script in bin/), from their installed records (``RECORD``); and the package's own directory (an
    editable install's records do not name it).  What install and ``validate`` walk
    in full (:func:`oci_gpu_hook.trust.tree_problem`): a launcher walks only down to site-packages at each start."""
    import importlib.metadata
    import re

    search = code_paths()
    todo, seen, trees = ["oci-gpu-hook"], set(), {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        found = next(iter(importlib.metadata.distributions(name=name, path=search)), None)
        if name in seen or found is None:
            continue
        seen.add(name)
        for file in found.files or []:
            top = file.parts[0] if file.parts and file.parts[0] != ".." else file
            trees.add(os.path.normpath(os.path.abspath(str(found.locate_file(top)))))
        todo.extend(m.group() for m in (re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", r) for r in found.requires or [])
                    if m)
    return sorted(trees)


def stdlib_paths() -> list[str]:
    return [p for p in dict.fromkeys(_startup_paths()[1]) if p and os.path.isdir(p)]


def editable_reason() -> str | None:
    """Why this is an editable (development) install, or None: the package must live in a site-packages
    directory of the interpreter."""
    package_parent = _package_parent()
    inside = [p for p in site_packages() if package_parent == os.path.normpath(p)]
    if not inside:
        return (f"the package is loaded from {package_parent}, outside site-packages (an editable install?); "
                "install it into a root-owned environment (python3 -m venv /opt/oci-gpu-hook && "
                "/opt/oci-gpu-hook/bin/pip install .), or pass --allow-editable")
    return None


def launcher_text(module: str, defaults: dict[str, str], *, trust: bool = False, runtime: str = "runc",
                  argv0: str | None = None, pins: str = "") -> str:
    """The Python launcher that runs ``oci_gpu_hook.<module>.main`` (shared by `launchers` and `install`).

    ``trust``: refuse to run when the interpreter or a code path is missing or writable by a non-root
    user (the shim still execs ``runtime`` for a pass-through command).  ``argv0``: the native front
    this launcher stands behind, so that the shim knows itself.  ``pins``: the install's pins file
    (:data:`PINS_NAME`), read where root shows as the overflow uid (:func:`oci_gpu_hook.trust.load_pins`)."""
    paths = [p for p in code_paths() if os.path.isdir(p)]
    trust_text = ""
    if trust:
        checked = [sys.executable, *paths, *stdlib_paths(), *venv_config()]
        trust_text = TRUST.format(rule=rule_text(), checked=checked, passthrough=module == "entry.runtime",
                                  runtime=runtime, pins=pins)
    if argv0:
        trust_text += f"sys.argv[0] = {argv0!r}\n"
    # the shim's pass-through commands fall back to the runtime baked here when the config file is untrusted
    main_args = f"baked_runtime={runtime!r}" if module == "entry.runtime" else ""
    return LAUNCHER.format(python=sys.executable, paths=paths, module=module, defaults=defaults, trust=trust_text,
                           main_args=main_args, pinned=PINNED if trust else "")


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
    from oci_gpu_hook.host import planner
    from oci_gpu_hook.request import NO_GPU

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
    from oci_gpu_hook.host.planner import version_line

    baked = baked_settings(defaults)
    content = baked["content"]
    assert content is None or isinstance(content, bytes)
    pairs = [x for item in defaults.items() for x in item]
    lines = [
        f"#define OGH_ROLE {ROLES[name]}",
        f"#define OGH_FAST {int(bool(baked['fast']))}",
        f"#define OGH_CHECK_TRUST {int(trust)}",
        f"static const char OGH_PYTHON[] = {_c_string(sys.executable)};",
        f"static const char OGH_SCRIPT[] = {_c_string(os.path.join(directory, name + '.py'))};",
        f"static const char *const OGH_CODE_PATHS[] = "
        f"{_c_list([p for p in code_paths() if os.path.isdir(p)] + stdlib_paths() + venv_config())};",
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


def front_key(header: str) -> str:
    """The name of a prebuilt front: the SHA-256 of ``front.c`` and of its baked header."""
    import hashlib

    with open(FRONT_SOURCE, "rb") as handle:
        source = handle.read()
    return hashlib.sha256(source + b"\0" + header.encode("utf-8", "surrogateescape")).hexdigest()


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


def prebuilt_fronts(directory: str, defaults: dict[str, str], trust: bool) -> dict[str, bytes] | None:
    """Every launcher's prebuilt front for this install (:data:`PREBUILT_DIR`), or None where one is missing."""
    fronts = {}
    for name, _module in LAUNCHERS:
        path = os.path.join(PREBUILT_DIR, front_key(front_header(name, directory, defaults, trust)))
        try:
            with open(path, "rb") as handle:
                fronts[name] = handle.read()
        except FileNotFoundError:
            return None
    return fronts


def prebuild_fronts(items: list[str], flags: list[str]) -> list[str]:
    """Compile the fronts that ``install --set ITEMS`` of this (non-editable) environment writes into
    :data:`PREBUILT_DIR` (the image build, with ``flags`` such as ``-static``); the paths written."""
    from oci_gpu_hook.atomic import write_atomic
    from oci_gpu_hook.host.install.paths import LAUNCHER_DIR

    cc = find_cc()
    if cc is None:
        raise HookError("prebuild_fronts: no C compiler found (set CC, or install gcc)")
    defaults = launcher_defaults(items, "install")
    check_live_config(defaults)
    os.makedirs(PREBUILT_DIR, exist_ok=True)
    written = []
    for name, _module in LAUNCHERS:
        path = os.path.join(PREBUILT_DIR, front_key(front_header(name, LAUNCHER_DIR, defaults, True)))
        write_atomic(path, compile_front(name, LAUNCHER_DIR, defaults, True, cc, tuple(flags)), 0o755)
        written.append(path)
    return written


def check_live_config(defaults: dict[str, str]) -> None:
    """Refuse to make live a config that a container start could not use (:mod:`oci_gpu_hook.config`): the
    config file the launchers will read (the baked ``OCI_GPU_HOOK_CONFIG``, else the default path) and the baked
    ``--set`` values, loaded as a start loads them (the runtime's own environment is not known here)."""
    from oci_gpu_hook.config import load_config

    try:
        load_config(defaults)
    except HookError as err:
        raise HookError(f"{err}: refusing to make this config live, nothing is written (fix it; "
                        "oci-gpu-hook validate checks it)") from None


def launcher_files(directory: str, defaults: dict[str, str], *, native: bool | None = None,
                   trust: bool = True) -> list[tuple[str, bytes]]:
    """Every launcher file for ``directory`` as ``(path, content)``, each mode 0755, after
    :func:`check_live_config`.

    ``native``: None = a native front when a compiler is found (then it must build), else the Python
    launchers with a note on stderr; True = a native front or an error; False = Python launchers only.
    ``trust``: the launchers check that what they run is root's (off for tests and editable installs)."""
    check_live_config(defaults)
    cc = find_cc() if native is not False else None
    prebuilt = None
    if native is not False and not cc and not front_problem():
        prebuilt = prebuilt_fronts(directory, defaults, trust)
    if native and not cc and not prebuilt:
        raise HookError(f"cannot build the native front: no C compiler found (set CC, or install gcc){NATIVE_FIX}")
    if cc:
        problem = front_problem()
        if problem:
            raise HookError(f"cannot build the native front: {problem}{NATIVE_FIX}")
    elif native is None and not prebuilt:
        sys.stderr.write("oci-gpu-hook: note: no C compiler found (CC, cc, gcc): writing the Python launchers, "
                         "which start Python on every container (install gcc and run again for the native front; "
                         "--no-native silences this)\n")
    files = []
    pins = os.path.join(directory, PINS_NAME) if trust else ""
    for name, module in LAUNCHERS:
        if cc is None and prebuilt is None:
            files.append((os.path.join(directory, name), launcher_text(module, defaults, trust=trust,
                                                                        runtime=_runtime(defaults),
                                                                        pins=pins).encode()))
            continue
        front = os.path.join(directory, name)
        files.append((front, prebuilt[name] if prebuilt else compile_front(name, directory, defaults, trust,
                                                                            str(cc))))
        files.append((front + ".py", launcher_text(module, defaults, trust=trust, runtime=_runtime(defaults),
                                                   argv0=front, pins=pins).encode()))
    if trust:
        files.append((pins, install_pins(directory, defaults).encode("utf-8", "surrogateescape")))
    return files


def install_pins(directory: str, defaults: dict[str, str]) -> str:
    """The pins file (:data:`PINS_NAME`) of launchers written into ``directory``: every entry of the install's own
    that their trust checks walk (the virtual environment and everything in it they meet, the site-packages holding
    the package, the config file and its directory unless that is sticky, as /tmp is, where any user may add a
    file), except ``directory`` and what lies above it, which the write itself changes (docs/security.md).  Nothing
    comes and goes in them: the DaemonSet's lock of an environment lies beside it, not in it.  Over
    :data:`oci_gpu_hook.trust.MAX_PINS` bytes, which no reader would take: a HookError, nothing written."""
    import stat

    from oci_gpu_hook import trust

    config = str(baked_settings(defaults)["path"])
    prefix = os.path.dirname(os.path.dirname(sys.executable))
    paths = [p for p in code_paths() if os.path.isdir(p)]
    roots = [*paths, config, *([prefix] if venv_config() else [])]
    try:
        if not os.stat(os.path.dirname(config)).st_mode & stat.S_ISVTX:
            roots.append(os.path.dirname(config))
    except OSError:
        roots.append(os.path.dirname(config))  # pinned absent: its making changes what a rootless hook trusts
    walked = [sys.executable, *paths, *stdlib_paths(), *venv_config(), config]
    text = trust.pins_text(trust.pins_of(walked, roots, [os.path.abspath(directory)]))
    size = len(text.encode("utf-8", "surrogateescape"))
    if size > trust.MAX_PINS:
        raise HookError(f"the pins of this install ({os.path.join(directory, PINS_NAME)}) would take {size} bytes, "
                        f"more than the {trust.MAX_PINS} a rootless hook reads (paths this long or this many "
                        "symlinks on the way to the environment or the config?); nothing is written")
    return text


def venv_config() -> list[str]:
    """The virtual environment's ``pyvenv.cfg`` (which names the interpreter's home, its standard library: read by
    every start of the interpreter), or nothing outside a virtual environment."""
    path = os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "pyvenv.cfg")
    return [path] if os.path.isfile(path) else []


def _runtime(defaults: dict[str, str]) -> str:
    runtime = baked_settings(defaults)["runtime"]
    return str(runtime)


def write_launchers(directory: str, defaults: dict[str, str], *, native: bool | None = None,
                    trust: bool = True) -> list[str]:
    """Write :func:`launcher_files` into ``directory`` (atomically, mode 0755); the paths written.  A stale
    ``NAME.py`` of an earlier native install is removed when the Python launchers are written."""
    from oci_gpu_hook.atomic import write_atomic

    files = launcher_files(directory, defaults, native=native, trust=trust)  # first: a failure writes nothing
    os.makedirs(directory, exist_ok=True)
    for path, data in files:
        write_atomic(path, data, 0o755)
    written = {p for p, _ in files}
    for name, _module in LAUNCHERS:
        stale = os.path.join(directory, name + ".py")
        if stale not in written and os.path.exists(stale):
            os.unlink(stale)
    return [p for p, _ in files]


