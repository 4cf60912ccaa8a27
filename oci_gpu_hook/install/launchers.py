"""Launchers: what runtimes and hooks.d run on every container start, and the files ``launchers`` and ``install``
write for them: the Python launchers' text (here), the native front (baked and compiled by
:mod:`oci_gpu_hook.fastpath.build`), the install's pins (:mod:`oci_gpu_hook.pins`).

Two kinds, written by ``oci-gpu-hook launchers DIR`` (and ``install``):

- **native front** (the default when a C compiler is found: ``$CC``, else ``cc``/``gcc`` on PATH; and
  with ``--native``): ``DIR/oci-gpu-hook``
  and ``DIR/oci-gpu-runtime`` are compiled from ``oci_gpu_hook/fastpath/front.c`` with this install's
  settings baked in (interpreter, sys.path, ``--set`` defaults, the config file's bytes, its runtime, every
  request variable name, the field names of config.json, the fast-path contract of
  :func:`oci_gpu_hook.fastpath.build.front_contract`, the
  planner's version line).  When there is nothing to do (a pass-through runtime command; a container that
  certainly asks for no device) they do it without starting Python, and so do they make the ``links`` hook's
  /dev/dri/by-path links; otherwise they ask the resident planner (``oci-gpu-hook serve``,
  :mod:`oci_gpu_hook.serve.planner`) and, where it does not answer, exec the Python launcher next to them
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
from oci_gpu_hook.fastpath import build
from oci_gpu_hook.install import codepaths
from oci_gpu_hook.pins import PINS_NAME

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


def launcher_text(module: str, defaults: dict[str, str], *, trust: bool = False, runtime: str = "runc",
                  argv0: str | None = None, pins: str = "") -> str:
    """The Python launcher that runs ``oci_gpu_hook.<module>.main`` (shared by `launchers` and `install`).

    ``trust``: refuse to run when the interpreter or a code path is missing or writable by a non-root
    user (the shim still execs ``runtime`` for a pass-through command).  ``argv0``: the native front
    this launcher stands behind, so that the shim knows itself.  ``pins``: the install's pins file
    (:data:`PINS_NAME`), read where root shows as the overflow uid (:func:`oci_gpu_hook.trust.load_pins`)."""
    paths = [p for p in codepaths.code_paths() if os.path.isdir(p)]
    trust_text = ""
    if trust:
        checked = [sys.executable, *paths, *codepaths.stdlib_paths(), *codepaths.venv_config()]
        trust_text = TRUST.format(rule=rule_text(), checked=checked, passthrough=module == "entry.runtime",
                                  runtime=runtime, pins=pins)
    if argv0:
        trust_text += f"sys.argv[0] = {argv0!r}\n"
    # the shim's pass-through commands fall back to the runtime baked here when the config file is untrusted
    main_args = f"baked_runtime={runtime!r}" if module == "entry.runtime" else ""
    return LAUNCHER.format(python=sys.executable, paths=paths, module=module, defaults=defaults, trust=trust_text,
                           main_args=main_args, pinned=PINNED if trust else "")


def prebuilt_fronts(directory: str, defaults: dict[str, str], trust: bool) -> dict[str, bytes] | None:
    """Every launcher's prebuilt front for this install (:data:`PREBUILT_DIR`), or None where one is missing."""
    fronts = {}
    for name, _module in LAUNCHERS:
        path = os.path.join(build.PREBUILT_DIR, build.front_key(build.front_header(name, directory, defaults, trust)))
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
    from oci_gpu_hook.install.paths import LAUNCHER_DIR

    cc = build.find_cc()
    if cc is None:
        raise HookError("prebuild_fronts: no C compiler found (set CC, or install gcc)")
    defaults = launcher_defaults(items, "install")
    check_live_config(defaults)
    os.makedirs(build.PREBUILT_DIR, exist_ok=True)
    written = []
    for name, _module in LAUNCHERS:
        path = os.path.join(build.PREBUILT_DIR, build.front_key(build.front_header(name, LAUNCHER_DIR, defaults, True)))
        write_atomic(path, build.compile_front(name, LAUNCHER_DIR, defaults, True, cc, tuple(flags)), 0o755)
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
    cc = build.find_cc() if native is not False else None
    prebuilt = None
    if native is not False and not cc and not build.front_problem():
        prebuilt = prebuilt_fronts(directory, defaults, trust)
    if native and not cc and not prebuilt:
        raise HookError("cannot build the native front: no C compiler found (set CC, or install gcc)"
                        f"{build.NATIVE_FIX}")
    if cc:
        problem = build.front_problem()
        if problem:
            raise HookError(f"cannot build the native front: {problem}{build.NATIVE_FIX}")
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
        files.append((front, prebuilt[name] if prebuilt else build.compile_front(name, directory, defaults, trust,
                                                                            str(cc))))
        files.append((front + ".py", launcher_text(module, defaults, trust=trust, runtime=_runtime(defaults),
                                                   argv0=front, pins=pins).encode()))
    if trust:
        files.append((pins, install_pins(directory, defaults).encode("utf-8", "surrogateescape")))
    return files


def install_pins(directory: str, defaults: dict[str, str]) -> str:
    """The pins file (:data:`~oci_gpu_hook.pins.PINS_NAME`) of launchers written into ``directory``, from what this
    install runs code from and its config file (:func:`oci_gpu_hook.pins.pins_file_text`)."""
    from oci_gpu_hook import pins

    return pins.pins_file_text(directory, str(build.baked_settings(defaults)["path"]),
                               [p for p in codepaths.code_paths() if os.path.isdir(p)], codepaths.stdlib_paths(),
                               codepaths.venv_config())


def _runtime(defaults: dict[str, str]) -> str:
    runtime = build.baked_settings(defaults)["runtime"]
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


