"""The daemon: the socket (root's alone, one planner for it), the pool of workers forked ahead, each warmed up and
then accepting one request (:class:`Planner`), what is loaded before they fork (:func:`preload`), and ``serve``'s
command line (:func:`command`)."""

from __future__ import annotations

import os
import sys

from oci_gpu_hook.errors import HookError
from oci_gpu_hook.serve.planner.build import PackageWatch, build_id
from oci_gpu_hook.serve.planner.inventory import ScanCache
from oci_gpu_hook.serve.planner.protocol import DEFAULT_SOCKET, SOCKET_ENV, BadRequest, Request, version_line
from oci_gpu_hook.serve.planner.worker import (
    Credentials,
    credentials_of,
    exec_problem,
    prepare_entry,
    run_entry,
    securebits,
    serve_one,
)

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    import socket as socket_module

    from oci_gpu_hook.config import Config
    from oci_gpu_hook.serve.planner.endpoint import Metrics
    from oci_gpu_hook.serve.planner.worker import Launch

DEFAULT_WORKERS = 8
STOP_GRACE_S = 10.0
PR_SET_PDEATHSIG = 1

# What the served entry points may import, loaded before the workers fork (a worker that entered another mount
# namespace must not look for code there): the package but its operator-only parts, and these.
PRELOAD_STDLIB = ("tomllib", "fcntl", "ctypes", "resource", "select", "traceback", "locale", "codecs", "io", "json",
                  "array", "struct", "encodings.utf_8", "encodings.latin_1", "encodings.ascii")
NOT_PRELOADED = ("oci_gpu_hook.install", "oci_gpu_hook.serve", "oci_gpu_hook.cluster", "oci_gpu_hook.fastpath",
                 "oci_gpu_hook.pins",
                 "oci_gpu_hook.models", "oci_gpu_hook.schemas", "oci_gpu_hook.entry.commands",
                 "oci_gpu_hook.appliers.cdi")


# --- the daemon ---------------------------------------------------------------------------------------------


def _say(text: str) -> None:
    import time

    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        os.write(2, f"{stamp} planner: {text}\n".encode(errors="replace"))
    except OSError:
        pass


def prepare_directory(socket_path: str) -> str:
    """The socket's directory, made (0700) where missing and checked: a real directory, root's (the planner's
    user's), mode 0700 (a wider one of ours is narrowed), on a trusted path."""
    from oci_gpu_hook.trust import config_problem

    if not socket_path.startswith("/") or socket_path.endswith("/"):
        raise HookError(f"planner socket {socket_path!r}: expected an absolute file path")
    directory = os.path.dirname(socket_path)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise HookError(f"cannot create the planner's directory {directory}: {err.strerror}") from None
    import stat

    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise HookError(f"planner directory {directory} is not a directory of uid {os.geteuid()} "
                        "(it must be root's alone, mode 0700)")
    if st.st_mode & 0o077:
        os.chmod(directory, 0o700)
    why = config_problem(directory)
    if why:
        raise HookError(f"planner directory {directory} is not trusted: {why}")
    return directory


class Planner:
    """The pool: a listening socket and up to ``workers`` forked workers, each serving one request."""

    def __init__(self, socket_path: str, workers: int, version: str, verbose: bool = False,
                 own: Credentials | None = None, watch: PackageWatch | None = None, *, launch: Launch) -> None:
        self.socket_path = socket_path
        self.launch = launch
        self.own = own
        self.own_securebits = securebits() if own is not None else 0
        self.watch = watch
        self.verbose = verbose
        self.workers = workers
        self.version = version
        self.children: set[int] = set()
        self.stopping = ""
        self.listener: socket_module.socket | None = None
        self.lock_fd = -1
        self.served = 0
        self.bound = (0, 0)
        self.warm_dir = ""
        self.warm_spec = ""
        self.parent = os.getpid()
        self.preloaded: set[str] = set()
        self.cache: ScanCache | None = None
        self.cache_in: socket_module.socket | None = None  # the daemon's end: entries workers scanned afresh
        self.cache_out: socket_module.socket | None = None  # the workers' end
        self.metrics: Metrics | None = None  # --metrics-address: the endpoint's process and what workers tell it

    def keep_inventory(self, config: Config | None) -> None:
        """The scan cache (:mod:`.inventory`): primed with a strict scan of each backend the config serves, of all
        of them and of every kind (what a request scans), and the socket workers send their fresh scans on."""
        import socket

        from oci_gpu_hook import inventory

        self.cache = ScanCache(inventory.scan)
        self.cache_in, self.cache_out = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.cache_in.setblocking(False)
        if config is not None:
            backends = list(config.backends)
            self.cache.prime(config.sysfs_root, [*([k] for k in backends), backends, None], config.proc_root,
                             config.driver_root)

    def start_metrics(self, address: str, config: Config) -> None:
        """The Prometheus endpoint's process (:mod:`.endpoint`), listening at ``address`` before the first worker
        forks; HookError with its one line where it cannot."""
        from oci_gpu_hook.serve.planner.endpoint import Metrics

        self.metrics = Metrics(address, config, _say)
        where = self.metrics.start(self.close_in_child)
        _say(f"metrics at http://{where}/metrics (process {self.metrics.pid})")

    def close_in_child(self) -> None:
        """In a child that is not a worker (the metrics endpoint's): let go of the socket, its lock and the scan
        cache's sockets, so that nothing of the planner's outlives it there."""
        for sock in (self.listener, self.cache_in, self.cache_out):
            if sock is not None:
                sock.close()
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1

    def bind(self) -> None:
        import fcntl
        import socket

        directory = prepare_directory(self.socket_path)
        lock = os.path.join(directory, os.path.basename(self.socket_path) + ".lock")
        self.lock_fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise HookError(f"another planner is serving {self.socket_path}") from None
        temp = os.path.join(directory, f".{os.path.basename(self.socket_path)}.{os.getpid()}")
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        listener.bind(temp)
        os.chmod(temp, 0o600)
        listener.listen(256)
        os.rename(temp, self.socket_path)  # one step: the old socket (a stopped planner's) or this one
        st = os.stat(self.socket_path)
        self.bound = (st.st_dev, st.st_ino)
        self.listener = listener

    def spawn(self) -> None:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the worker; tests see what it answers
            code = 1
            try:
                code = self._worker()
            except BaseException as err:  # the front sees the connection close, and falls back
                import traceback

                _say(f"a worker failed: {''.join(traceback.format_exception_only(err)).strip()}")
            finally:
                os._exit(code)
        self.children.add(pid)

    def _worker(self) -> int:
        import gc
        import signal

        assert self.listener is not None
        gc.disable()
        os.close(self.lock_fd)  # a worker finishing a request never holds the next planner back
        busy = False

        def on_term(_number: int, _frame: object) -> None:
            if not busy:
                os._exit(0)

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass
        if os.getppid() != self.parent:
            return 0
        if self.cache is not None:
            from oci_gpu_hook import inventory

            inventory.scan = self.cache.scan  # this fork's scans: from the cache where a replay allows
            assert self.cache_in is not None
            self.cache_in.close()
            self.cache.used = set(self.cache.entries)  # the warm-up gets copies
        self.warm_up()
        if self.cache is not None:
            self.cache.used = set()
            self.cache.hits = self.cache.misses = 0
        conn, _addr = self.listener.accept()
        busy = True
        import time

        started = time.monotonic()
        self.listener.close()
        if self.metrics is not None:
            self.metrics.in_worker()
        with conn:
            outcome = serve_one(conn, self.version, self.own, self.own_securebits, self.watch, launch=self.launch,
                                report=self.metrics.report if self.metrics is not None else None)
        if self.cache is not None and self.cache_out is not None:
            self.cache.send_fresh(self.cache_out)  # after the answer: the next forks inherit it
        if outcome.startswith("refused: stale"):
            os.kill(self.parent, signal.SIGTERM)  # where no inotify wakes it
        if (self.verbose and outcome != "ok: no request") or not outcome.startswith("ok"):  # before the time is added
            took = (time.monotonic() - started) * 1000
            scans = f"; inventory {self.cache.hits} cached, {self.cache.misses} scanned" if self.cache else ""
            _say(outcome + (f" ({took:.2f} ms from accept to answer{scans})" if self.verbose else ""))
        new = [m for m in sys.modules if m not in self.preloaded and m.startswith("oci_gpu_hook")]
        if new:
            _say(f"a request imported {', '.join(sorted(new))}: add it to PRELOAD")
        return 0

    def prepare_warm_up(self, config: Config | None) -> None:
        """A private directory (beside the socket, root's alone) with a config of its own (the daemon's sysfs, no log,
        /bin/true for runtime and hook, its by-path directories in here) and the spec of a request for the first device
        found there."""
        directory = os.path.join(os.path.dirname(self.socket_path), "warm")
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
        sysfs = config.sysfs_root if config is not None else "/sys"
        request = []
        try:
            from oci_gpu_hook.inventory import scan

            inventory = scan(sysfs, strict=False)
            kind = next(k for k in (config.backends if config else ()) if inventory.devices(k))
            request = [f"{config.request_env[kind][0]}=0"]  # type: ignore[union-attr]
        except (HookError, OSError, StopIteration):
            pass  # the no-request path is warmed then
        from oci_gpu_hook import fastjson

        with open(os.path.join(directory, "config.toml"), "w", encoding="utf-8") as handle:
            handle.write(f'sysfs_root = "{sysfs}"\nruntime = "/bin/true"\nhook_path = "/bin/true"\nlog_file = ""\n'
                         f'by_path_dir = "{directory}/by-path"\n')  # the warm-up's by-path directory stays in here
        self.warm_spec = fastjson.dumps({"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin", *request]},
                                         "root": {"path": "rootfs"}})
        self.warm_dir = directory

    def warm_up(self) -> None:
        """Serve a request of our own, in the warm directory, before the real one: the first run in a fresh fork
        pays for the pages it copies and the bytecode it specializes (about 1.5 ms here), and then it has been paid.
        What a request sets (environment, stdio, working directory, umask) the real one sets again."""
        if not self.warm_dir or '"' in self.warm_dir:
            return
        bundle = os.path.join(self.warm_dir, f"b{os.getpid()}")
        saved = (dict(os.environ), sys.stdin, sys.stdout, sys.stderr, os.umask(0o022))
        try:
            os.mkdir(bundle, 0o700)
            with open(os.path.join(bundle, "config.json"), "w", encoding="utf-8") as handle:
                handle.write(self.warm_spec)
            env = [b"PATH=/usr/bin:/bin", b"OCI_GPU_HOOK_CONFIG=" + os.fsencode(self.warm_dir) + b"/config.toml"]
            request = Request(self.version, "oci-gpu-runtime", b"/", b"/bin/true", os.getppid(), 0o022,
                              [b"create", b"--bundle", os.fsencode(bundle), b"warm-up"], env, None, [])
            run_entry(request, prepare_entry(request), self.launch)
        except (BadRequest, OSError, HookError):
            pass
        finally:
            os.environ.clear()
            os.environ.update(saved[0])
            sys.stdin, sys.stdout, sys.stderr = saved[1:4]
            os.umask(saved[4])
            try:
                for name in os.listdir(bundle):
                    os.unlink(os.path.join(bundle, name))
                os.rmdir(bundle)
            except OSError:
                pass

    def reap(self) -> None:
        while self.children or (self.metrics is not None and self.metrics.pid):
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            if pid in self.children:
                self.children.discard(pid)
                self.served += 1
            elif self.metrics is not None:
                self.metrics.exited(pid, status)

    def run(self) -> int:
        import gc
        import select
        import signal
        import time

        self.parent = os.getpid()
        self.preloaded = set(sys.modules)
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

        def on_stop(number: int, _frame: object) -> None:
            self.stopping = signal.Signals(number).name

        previous = {s: signal.signal(s, on_stop) for s in (signal.SIGTERM, signal.SIGINT)}
        previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda *_: None)
        old_wakeup = signal.set_wakeup_fd(wake_w)
        gc.collect()
        gc.freeze()  # the workers share these pages instead of copying them at their first collection
        try:
            _say(f"serving {self.socket_path} ({self.workers} workers, {self.version})")
            watched = [self.watch.fd] if self.watch is not None and self.watch.fd >= 0 else []
            if self.cache_in is not None:
                watched.append(self.cache_in.fileno())
            while not self.stopping:
                if self.watch is not None and self.watch.changed():
                    self.stopping = "the package's files changed on disk; the unit starts the new build"
                    break
                self.reap()
                if self.metrics is not None:
                    self.metrics.keep(self.close_in_child)
                while len(self.children) < self.workers and not self.stopping:
                    self.spawn()
                try:
                    select.select([wake_r, *watched], [], [], 5.0)
                    if self.cache is not None and self.cache_in is not None:
                        self.cache.take(self.cache_in)
                    os.read(wake_r, 4096)
                except (BlockingIOError, InterruptedError):
                    pass
            _say(f"stopping ({self.stopping})")
            self.close_socket()
            if self.metrics is not None:
                self.metrics.stop()
            for pid in list(self.children):
                try:
                    os.kill(pid, signal.SIGTERM)  # idle ones exit now, busy ones after their request
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + STOP_GRACE_S
            while self.children and time.monotonic() < deadline:
                self.reap()
                time.sleep(0.02)
            for pid in self.children:
                os.kill(pid, signal.SIGKILL)
            return 0
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(wake_r)
            os.close(wake_w)

    def close_socket(self) -> None:
        """Take the socket away (only ours: a newer planner's stays) and stop listening."""
        if self.listener is None:
            return
        try:
            st = os.stat(self.socket_path)
            if (st.st_dev, st.st_ino) == self.bound:
                os.unlink(self.socket_path)
        except OSError:
            pass
        self.listener.close()
        self.listener = None


def preload_names() -> list[str]:
    """Every module of the package that a container start may import (all but NOT_PRELOADED), and the stdlib
    modules they load lazily."""
    import pkgutil

    import oci_gpu_hook

    names = [m.name for m in pkgutil.walk_packages(oci_gpu_hook.__path__, "oci_gpu_hook.")
             if not m.name.startswith(NOT_PRELOADED)]
    return [*sorted(names), *PRELOAD_STDLIB]


def preload(config: Config | None) -> None:
    """Import everything a request may need, and pay the first-call costs (a scan of the configured sysfs)."""
    import importlib

    for name in preload_names():
        importlib.import_module(name)
    if config is not None:
        try:
            from oci_gpu_hook.inventory import scan

            scan(config.sysfs_root, strict=False)
        except (HookError, OSError):
            pass


def command(args: list[str], config: Config, launch: Launch) -> int:
    """``serve``'s command line; ``launch`` runs the launchers' entry points (which only the entry layer imports)."""
    from oci_gpu_hook.cliparse import parser as _parser

    parser = _parser("serve", "The resident planner: answer the native front's GPU requests over a Unix socket "
                              "(root's alone), so that a container asking for a GPU starts without a Python "
                              "start; where it is not running the front starts Python, with the same outcome.")
    parser.add_argument("--socket", metavar="PATH", default=os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET,
                        help=f"where to listen (default ${SOCKET_ENV}, else {DEFAULT_SOCKET}); its directory is "
                             "made root's alone, mode 0700")
    parser.add_argument("--workers", metavar="N", default=str(DEFAULT_WORKERS),
                        help="requests served at once, each by a process forked ahead (default %(default)s)")
    parser.add_argument("--verbose", action="store_true", help="one line for every request, not only the refused")
    parser.add_argument("--metrics-address", metavar="HOST:PORT", default=None,
                        help="serve Prometheus metrics at http://HOST:PORT/metrics: the container starts it answered "
                             "by path, outcome and reason, its answer time, the host's devices (:PORT: loopback, "
                             "127.0.0.1; 0.0.0.0:PORT or [::]:PORT: every address; served by a process of uid 65534 "
                             "without capabilities; needs prometheus_client; default: none)")
    opts = parser.parse_args(args)
    if not opts.workers.isdigit() or not 1 <= int(opts.workers) <= 256:
        raise HookError(f"--workers {opts.workers!r}: expected a number, 1 to 256 (default {DEFAULT_WORKERS})")
    if os.geteuid() != 0:
        raise HookError("serve runs as root: the fronts it answers are root's, and it enters their namespaces")
    own = credentials_of(0)
    why = "its /proc/self files cannot be read" if own is None else exec_problem(own)
    if why:
        raise HookError(f"serve cannot answer for the fronts: {why}")
    watch = PackageWatch()  # before the build is hashed: a change from here on is seen
    build = build_id()
    preload(config)
    version = version_line(build)
    if build_id() != build or watch.changed():
        raise HookError("the package changed while the planner was starting; start it again")
    planner = Planner(opts.socket, int(opts.workers), version, opts.verbose, own, watch, launch=launch)
    planner.keep_inventory(config)  # before the socket is there: a front that finds it finds workers soon
    planner.bind()
    if opts.metrics_address is not None:
        try:
            planner.start_metrics(opts.metrics_address, config)
        except HookError:
            planner.close_socket()
            raise
    planner.prepare_warm_up(config)
    return planner.run()
