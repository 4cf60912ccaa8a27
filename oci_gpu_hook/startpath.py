"""The per-container start path, declared: which modules run on it, what each may import, and why it is so lean.

Every container start runs some of this package (the shim's ``create``/``run``, podman's ``precreate`` hook, the
live ``prestart`` hook, the ``links`` hook), each in a fresh interpreter.  What those modules import is paid
again on every start, and a Python start is already ~10 ms here, so the budget is counted in imports, not in lines
of code.  This file is the one place that says what the path may hold; nothing imports it at run time.

- :data:`MODULES`: every module of the package on the path, with the modules from outside the package (the
  standard library) it may import, at its top or inside a function, ``TYPE_CHECKING`` blocks aside.  A
  start-path module may import another start-path module; anything else of the package only through
  :data:`OFF_PATH` (routes that are not a container start).  "May ``config.py`` import ``re``?": no, it is
  not in ``config.py``'s set, and :data:`NEVER` says why.  ``tests/test_startpath.py`` reads every module
  listed here and fails on an import outside its allowance.
- :data:`SERVERS`: the per-container servers' package (``serve/``: the planner, the NRI plugin), whose modules
  import of the package only what is on the path, each other, and what :data:`SERVER_OFF_PATH` names;
  ``tests/test_startpath.py`` holds them to it.  The other operator packages (``install/``, ``cluster/``) are off
  the path: nothing on it imports them (``tests/test_layers.py``).
- :data:`ENTRIES`: what each entry point, run as the launchers run it (``python -X importtime -I -S``), imports
  beyond the interpreter's own start; ``tests/test_speed_imports.py`` runs them and fails on any module more.
  A new import on this path costs every container its time: add it here only with a measurement.

The economies, each one measured (costs are this machine's, a 2-core VM; ``python -X importtime -I -S -c
'import NAME'`` shows them):

- ``TYPE_CHECKING = False`` at the top of a module, never ``typing.TYPE_CHECKING``: importing :mod:`typing`
  costs ~15 ms per start.  Annotations stay strings (``from __future__ import annotations``), so the names under
  ``if TYPE_CHECKING:`` are read by type checkers only.  The whole package uses the one idiom, off the path too:
  a module can then move onto the path unchanged, and the launchers import ``serve/planner``'s constants when
  they bake.  Each such line points here.
- :mod:`oci_gpu_hook.fastjson`, not :mod:`json`: ``json`` brings :mod:`re` and :mod:`enum` (~14 ms, a hook's
  whole budget).  It drives the C scanner and encoder of CPython's ``_json`` extension directly (a private
  module, so ``tests/test_fastjson.py`` holds its output to ``json``'s by property tests); ``json`` itself is
  imported only to describe a parse error.
- :mod:`oci_gpu_hook.tomlsubset`, not :mod:`tomllib`: ``tomllib`` costs ~20 ms (re, typing, enum, datetime).  The
  config file is read by a strict subset of TOML (``tests/test_toml_subset.py`` proves that whatever the subset
  accepts, ``tomllib`` reads the same); a file outside it goes to ``tomllib``.
- A hand-made FNV-1a digest names the by-path directory (:func:`oci_gpu_hook.appliers.bypath.digest`), not
  :mod:`hashlib` (~6 ms): the name is neither a secret nor a guard, since an existing directory is checked entry
  by entry.
- ``try: ... except OSError: pass``, never ``contextlib.suppress``: :mod:`contextlib` brings collections,
  functools, operator, itertools and more.  ruff's SIM105, which asks for ``suppress``, is off for this reason
  (``pyproject.toml``).
- ``__import__(name)`` where a backend is loaded by name (:func:`oci_gpu_hook.inventory.backend`), not
  :mod:`importlib` (~1 ms).  The operator commands' table in :mod:`oci_gpu_hook.entry.cli` may use
  ``importlib``: a hook never reaches it, it is dispatched first, before :mod:`argparse` or anything else heavy.
- ``_socket`` for the journal's datagram (:mod:`oci_gpu_hook.log`), not :mod:`socket` (~5 ms: enum, selectors).
- ``os.read`` and ``_locale`` (built in) in :func:`oci_gpu_hook.inventory.sysfs.read`: the same text as
  ``open(path).read().strip()`` at a fifth of its cost; a scan reads ~60 files per request (~4 ms saved).
- Classes with ``__slots__`` and an ``__init__``, not :mod:`dataclasses` (which imports re and inspect).
- The hook commands' names live in ``oci_gpu_hook/__init__.py``, which every entry imports anyway: one module
  less per start.
- :mod:`ctypes` (~3 ms) only where a request needs it: ``setns`` (before Python 3.12) and ``mount`` in the live
  hook's child, bpf(2), NVML.

Outside Python: the launchers run ``python -IS`` (no ``site``: ~10 ms) and, where a C compiler was there at
install, the native front (``oci_gpu_hook/fastpath/front.c``) answers "nothing requested" and pass-through
commands without starting Python at all (:mod:`oci_gpu_hook.install.launchers`).  ``docs/speed.md`` has the
measurements of the whole start.
"""

# --- the entries, as tests/test_speed_imports.py runs them -------------------------------------------------------

# What os and the package's first lines bring (with -S the interpreter itself has not imported os).
COMMON = frozenset({"__future__", "os", "stat", "_stat", "posixpath", "genericpath", "_collections_abc", "time",
                    "oci_gpu_hook", "oci_gpu_hook.config", "oci_gpu_hook.kinds", "oci_gpu_hook.tomlsubset",
                    "oci_gpu_hook.entry", "oci_gpu_hook.errors", "oci_gpu_hook.trust",
                    # this file: what entry.load_start_path imports as a start begins (its sets, ~0.1 ms)
                    "oci_gpu_hook.startpath"})
# Reading the spec and planning.
PLAN = frozenset({"_json", "oci_gpu_hook.fastjson", "oci_gpu_hook.oci_spec", "oci_gpu_hook.log", "oci_gpu_hook.plan",
                  "oci_gpu_hook.request", "oci_gpu_hook.core", "oci_gpu_hook.core.edits", "oci_gpu_hook.appliers"})
# An NVIDIA request (the driver's files included): its backend, the driver-files reader and the ld cache reader
# instead of the AMD backend; no NVML (ctypes) unless a MIG UUID is asked for.
NVIDIA = frozenset({"oci_gpu_hook.inventory.nvidia", "oci_gpu_hook.inventory.nvdriver",
                    "oci_gpu_hook.inventory.ldcache", "oci_gpu_hook.inventory.elf",
                    "oci_gpu_hook.core.inroot"})  # nvdriver finds the driver's files in its root by the one walk
# Each backend's modules (loaded by name, oci_gpu_hook.inventory.backend): a start that plans imports those of the
# config's backends as it begins (oci_gpu_hook.entry.load_start_path), whichever kind the container asks for;
# ~1.3 ms for the two of the three default backends that an AMD request would not load (docs/security.md).
KIND_MODULES: dict[str, frozenset[str]] = {"amd": frozenset({"oci_gpu_hook.inventory.amd"}),
                                           "intel": frozenset({"oci_gpu_hook.inventory.intel"}), "nvidia": NVIDIA}
BACKEND_MODULES = frozenset(name for names in KIND_MODULES.values() for name in names)
# A spec rewrite that grants a device: the AMD seed host, with the config's backends (all three by default).
GRANT = BACKEND_MODULES | frozenset({"oci_gpu_hook.core.devices", "oci_gpu_hook.core.rules", "oci_gpu_hook.inventory",
                   "oci_gpu_hook.inventory.sysfs", "oci_gpu_hook.inventory.amd", "oci_gpu_hook.appliers.ocispec",
                   "importlib", "warnings",  # pinned when inventory.backend used importlib; it no longer does
                   "oci_gpu_hook.appliers.bypath", "errno",  # the by-path directory; errno is built in (0.1 ms)
                   # an NVIDIA driver's links and ld cache written into the rootfs before create (ocispec.prewrite)
                   "oci_gpu_hook.appliers.mounts", "oci_gpu_hook.atomic",
                   "_locale"})  # built in, 0.3 ms measured under load: sysfs.read decodes as open() would (saves ~4 ms)
ENTRIES: dict[str, frozenset[str]] = {
    "precreate": COMMON | PLAN | GRANT | {"oci_gpu_hook.entry.cli"},
    "prestart": COMMON | PLAN | {"oci_gpu_hook.entry.cli", "oci_gpu_hook.appliers.live", "oci_gpu_hook.oci_state"},
    "createRuntime": COMMON | PLAN | {"oci_gpu_hook.entry.cli", "oci_gpu_hook.appliers.live",
                                      "oci_gpu_hook.oci_state"},
    "links": COMMON | {"_json", "oci_gpu_hook.fastjson", "oci_gpu_hook.entry.cli", "oci_gpu_hook.appliers",
                       "oci_gpu_hook.appliers.live", "oci_gpu_hook.appliers.rootfs",
                       # the one walk inside a container root (rootfs.py's walk moved there): its body 0.15 ms
                       # (marshal and exec of the cached bytecode, median of 2000), docs/development.md
                       "oci_gpu_hook.core.inroot",
                       "oci_gpu_hook.oci_spec", "oci_gpu_hook.oci_state", "oci_gpu_hook.core",
                       "oci_gpu_hook.core.edits"},
    "create": COMMON | PLAN | GRANT | {"oci_gpu_hook.entry.runtime", "oci_gpu_hook.oci_argv", "oci_gpu_hook.atomic"},
    "run": COMMON | PLAN | GRANT | {"oci_gpu_hook.entry.runtime", "oci_gpu_hook.oci_argv", "oci_gpu_hook.atomic"},
    "state": COMMON | {"oci_gpu_hook.entry.runtime", "oci_gpu_hook.oci_argv"},
}
# Never imported by an entry above.  Each costs more than a start may spend: typing ~15 ms, json (re, enum) ~14 ms,
# tomllib (re, typing, enum, datetime) ~20 ms, argparse (re, gettext) and the operator commands' libraries far more.
NEVER = frozenset({"tomllib", "re", "typing", "enum", "datetime", "json", "argparse", "pydantic", "jsonschema",
                   "yaml"})

# --- every module on the path, and what each may import from outside the package ----------------------------------

_NONE: frozenset[str] = frozenset()
MODULES: dict[str, frozenset[str]] = {
    # every entry
    "oci_gpu_hook": _NONE,
    "oci_gpu_hook.entry": _NONE,
    "oci_gpu_hook.errors": _NONE,
    "oci_gpu_hook.kinds": _NONE,
    "oci_gpu_hook.trust": frozenset({"os", "stat"}),  # its rule block runs in the launchers too: os and stat only
    "oci_gpu_hook.tomlsubset": _NONE,
    "oci_gpu_hook.startpath": _NONE,  # read at run time by entry.load_start_path: its sets only
    # difflib: an unknown key's "did you mean" (a refusal only); tomllib: a config file outside the subset
    "oci_gpu_hook.config": frozenset({"os", "difflib", "tomllib"}),
    "oci_gpu_hook.entry.cli": frozenset({"os", "sys", "time", "importlib"}),  # importlib: operator commands only
    "oci_gpu_hook.entry.runtime": frozenset({"os", "sys", "time"}),
    "oci_gpu_hook.oci_argv": frozenset({"os"}),
    "oci_gpu_hook.oci_state": _NONE,
    # the spec and the plan
    "oci_gpu_hook.fastjson": frozenset({"_json", "json"}),  # json: only to describe a parse error
    "oci_gpu_hook.oci_spec": frozenset({"os"}),
    # _socket: the journal's datagram; traceback: a failure's traceback under --debug (the start has failed by then)
    "oci_gpu_hook.log": frozenset({"os", "stat", "sys", "time", "_socket", "traceback"}),
    "oci_gpu_hook.plan": frozenset({"time"}),
    "oci_gpu_hook.request": _NONE,
    "oci_gpu_hook.core": _NONE,
    "oci_gpu_hook.core.devices": _NONE,
    "oci_gpu_hook.core.edits": _NONE,
    "oci_gpu_hook.core.rules": _NONE,
    # the one walk inside a container root; ctypes (openat2) only where a caller has loaded it already
    "oci_gpu_hook.core.inroot": frozenset({"os", "stat", "sys", "ctypes"}),
    "oci_gpu_hook.atomic": frozenset({"errno", "os", "stat", "time"}),
    # the inventory: only the kinds a container asked for are scanned
    "oci_gpu_hook.inventory": frozenset({"os", "sys"}),
    "oci_gpu_hook.inventory.sysfs": frozenset({"_locale", "os"}),
    "oci_gpu_hook.inventory.amd": frozenset({"os"}),
    "oci_gpu_hook.inventory.intel": frozenset({"os"}),
    "oci_gpu_hook.inventory.nvidia": frozenset({"os"}),
    "oci_gpu_hook.inventory.nvdriver": frozenset({"os", "stat"}),
    "oci_gpu_hook.inventory.ldcache": frozenset({"os"}),
    "oci_gpu_hook.inventory.elf": frozenset({"os"}),  # a driver file's ELF header and soname, read, never run
    # NVML only for a MIG UUID, in a child process (forked; or a fresh interpreter)
    "oci_gpu_hook.inventory.nvml": frozenset({"os", "sys", "ctypes", "select", "subprocess", "resource"}),
    # the spec rewrite (shim, precreate)
    "oci_gpu_hook.appliers": _NONE,
    "oci_gpu_hook.appliers.ocispec": frozenset({"os", "sys"}),
    "oci_gpu_hook.appliers.bypath": frozenset({"errno", "os"}),
    "oci_gpu_hook.appliers.rootless": frozenset({"os", "stat"}),
    # the live hook (prestart, createRuntime, links); with a request: nodes by fd in the container (ctypes for
    # setns, fcntl), the driver's files, the device cgroup (v1 file, v2 eBPF), the systemd scope's D-Bus
    "oci_gpu_hook.appliers.live": frozenset({"os", "time", "fcntl"}),
    "oci_gpu_hook.appliers.rootfs": frozenset({"os", "stat", "ctypes"}),
    "oci_gpu_hook.appliers.mounts": frozenset({"os", "stat", "ctypes", "select", "time"}),
    "oci_gpu_hook.appliers.cgroups": frozenset({"os"}),
    "oci_gpu_hook.appliers.bpf": frozenset({"ctypes", "os", "struct"}),
    "oci_gpu_hook.appliers.devicefilter": frozenset({"struct"}),
    "oci_gpu_hook.appliers.devicefilter_decode": frozenset({"struct", "sys"}),
    "oci_gpu_hook.appliers.systemd_unit": frozenset({"os", "socket", "struct", "time"}),  # only under systemd
}
# --- the per-container servers ---------------------------------------------------------------------------------

# The planner (``serve``) and the NRI plugin (``nri``) answer on a container's start path: a front asks the planner,
# containerd and CRI-O call the NRI plugin as they create a container.  Their workers run the modules above; what
# else of the package they may import is this package and what SERVER_OFF_PATH names, each on a route no request
# waits for.  tests/test_startpath.py reads every module of SERVERS and fails on any other import of the package.
SERVERS = "oci_gpu_hook.serve"
SERVER_OFF_PATH: dict[str, dict[str, str]] = {
    "oci_gpu_hook.serve.planner.server": {"oci_gpu_hook.cliparse": "a usage error (argparse), never a request's"},
    "oci_gpu_hook.serve.planner.endpoint": {
        "oci_gpu_hook.cluster.metrics": "the metrics endpoint, a process of its own forked before any request",
        "oci_gpu_hook.cluster.health": "the metrics endpoint's health samples, in that process"},
    "oci_gpu_hook.serve.planner.worker": {"oci_gpu_hook.cluster.metrics": "a refused request's reason, in the "
                                          "metrics' closed set (after the refusal is decided)"},
}

# Modules of the package off the path that a start-path module may reach, each on a route no container start takes.
OFF_PATH: dict[str, dict[str, str]] = {
    "oci_gpu_hook.entry.cli": {"oci_gpu_hook.cliparse": "a usage error (argparse), never a hook's"},
    "oci_gpu_hook.inventory.nvidia": {"oci_gpu_hook.inventory.nvcluster": "the device plugin's and DRA driver's "
                                      "side of the NVIDIA backend (resident processes), never a container start"},
}
