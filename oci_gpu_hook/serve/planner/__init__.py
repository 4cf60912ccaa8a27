"""``oci-gpu-hook serve``: the resident planner, which answers the native front's GPU requests without a Python start.

A container that asks for a GPU makes the native front (``oci_gpu_hook/fastpath/front.c``) hand over to Python: a
Python start and the imports cost more than everything else the request needs.  The planner is that Python,
started once: the imports loaded, every first-call cost paid.  The front sends it what it would have given the
Python launcher (the launcher's name and argv, the environment, stdin, the umask and parent pid; its mount,
pid, cgroup and user namespaces, root and working directory as file descriptors) and applies the answer: the
stdout and stderr bytes, then the exit status or the runtime to exec.

**One outcome either way.**  Each request runs in a process of its own, forked from the planner beforehand (a pool
of ``--workers``, each serving one request and then replaced), which *becomes* the launcher process the front would
have started: it enters the front's mount namespace, root and working directory (so every path, config file, sysfs,
bundle and log file is the one the front sees), takes its environment, umask, argv and stdin, the parent pid that
``check_container`` compares, and the stdio encoding CPython would have picked for that environment
(:func:`python_stdio`; a front whose Python would not write UTF-8 is sent back), and then runs the launcher's own
entry point, ``entry.cli.main`` or ``entry.runtime.prepare`` (which ``serve``'s command passes in: the planner imports
nothing of the entry layer) -- the same code on the same inputs.  It writes
config.json itself, as Python does (:func:`oci_gpu_hook.atomic.write_atomic`: a rename, so a planner killed
mid-request leaves the old file or the new one, never half of one).  **Once or not at all** (the protocol, below):
nothing outside the worker changes before the front's GO, which comes only inside the front's bound; after it, the
front never runs the request again.  A live hook (``prestart``, and the ``links`` and ``ldcache`` createRuntime
hooks, served with their arguments) is served only in the front's pid and cgroup namespaces, where the pids and
cgroup paths it reads mean the same; the front's user namespace always.

**The inventory.**  A worker scans sysfs in the front's mount namespace as the Python path does, but serves the
daemon's last scan of that kind instead where replaying every filesystem call that scan made gives every answer
the same (:mod:`.inventory`): the scan would then give the same inventory, so the answer is byte for byte a fresh
scan's, at the cost of the calls alone.

**Trust.**  The socket lives in a directory that is root's alone (mode 0700, created so, on a path only root can
change); the planner answers only uid 0 peers (``SO_PEERCRED``), and the front talks only to a uid 0 server in such
a directory; a worker acts only for a front whose credentials are the planner's (the front's credentials, below).
**Versions.**  The front bakes :func:`version_line` (package version, protocol, a hash of the package's files and
the interpreter's version); the planner computes its own at start and answers only requests that carry the same
line, and the front checks the answer's; the planner watches its package's files (:class:`PackageWatch`) and, once
one changes on disk, refuses every request and exits, for its unit to start the new build (which the old fronts
refuse by its hash until ``install`` rebuilds them).  **Robustness.**  Workers exit after one request; a bad request
ends its worker alone; SIGTERM lets busy workers finish, idle ones go at once; a killed planner's idle workers
follow it (``PR_SET_PDEATHSIG``); one planner per socket (a lock beside it).

**The modules**, one concern each (each imports only those before it): :mod:`.build` (the package on disk: the
build's hash, the watch on its files), :mod:`.protocol` (the wire format: the request and the answer, READY, GO and
STARTED, the bounds, the version line), :mod:`.inventory` (the scan cache and its exact replay), :mod:`.worker`
(what serves one request: the front's credentials, becoming the launcher, running its entry point, the answer),
:mod:`.server` (the daemon: the socket, the pool of workers, the scan cache's priming, the preload, ``serve``'s
command line), :mod:`.endpoint` (``--metrics-address``: the Prometheus endpoint's process, which the workers tell
each request's path, outcome and reason).  This file keeps the names the rest of the package and the tests use.
"""

from oci_gpu_hook.serve.planner.build import PackageWatch, build_id
from oci_gpu_hook.serve.planner.protocol import (
    ANSWER_MAGIC,
    ANSWER_TIMEOUT_MS,
    DEFAULT_SOCKET,
    FD_NAMES,
    GO,
    MAX_ITEMS,
    MAX_REQUEST,
    PROTOCOL,
    READY,
    REQUEST_MAGIC,
    REQUEST_TIMEOUT_S,
    ROLES,
    SOCKET_ENV,
    STARTED,
    BadRequest,
    GaveUp,
    NoRequest,
    Request,
    decode_answer,
    encode_answer,
    read_request,
    version_line,
)
from oci_gpu_hook.serve.planner.server import (
    DEFAULT_WORKERS,
    Planner,
    command,
    preload,
    preload_names,
    prepare_directory,
)
from oci_gpu_hook.serve.planner.worker import (
    Credentials,
    credentials_of,
    credentials_problem,
    enter,
    exec_problem,
    peer_credentials,
    prepare_entry,
    python_stdio,
    run_entry,
    securebits,
    serve_one,
    set_environ,
    take_limits,
)

__all__ = [
    "ANSWER_MAGIC", "ANSWER_TIMEOUT_MS", "DEFAULT_SOCKET", "DEFAULT_WORKERS", "FD_NAMES", "GO", "MAX_ITEMS",
    "MAX_REQUEST", "PROTOCOL", "READY", "REQUEST_MAGIC", "REQUEST_TIMEOUT_S", "ROLES", "SOCKET_ENV", "STARTED",
    "BadRequest", "Credentials", "GaveUp", "NoRequest", "PackageWatch", "Planner", "Request", "build_id",
    "command", "credentials_of", "credentials_problem", "decode_answer", "encode_answer", "enter", "exec_problem",
    "peer_credentials", "preload", "preload_names", "prepare_directory", "prepare_entry", "python_stdio",
    "read_request", "run_entry", "securebits", "serve_one", "set_environ", "take_limits", "version_line",
]
