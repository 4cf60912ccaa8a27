"""The inventory a worker serves from: the last scan of each kind kept by the daemon, inherited by every worker it
forks, and used only where sysfs still answers exactly as it did (:class:`ScanCache`).

**Exact, not recent.**  A scan (:func:`oci_gpu_hook.inventory.scan`) is a function of its arguments, the locale's
encoding (which decodes what it reads) and the answers of the filesystem calls it makes: it keeps nothing between
calls and reads no clock, environment or counter.  So the cache records, while a scan runs, every call it makes
(TRACED: ``listdir``, ``readlink``, ``stat``, ``lstat``, ``open``, ``read``, ``close``, with their answers:
the names in their order, the link's text, the file type, inode, device and size, the bytes read, the errno of
a failure) and serves the inventory again only after replaying those same calls, in the same order, where the
request runs (the front's mount namespace and root) and getting every answer the same: the scan would then make
the same calls, get the same answers and build the same inventory.  Any other answer is a miss, and the worker
scans afresh (and records that scan).  No time, uevent or generation number decides anything: a GPU that left,
came back, changed its partition mode or was renumbered changes a directory listing, a link or a file the scan
read, and a replay reads them all.  A scan that makes a call the cache cannot replay (UNTRACEABLE: a scandir, a
Python file object, a call on a descriptor it did not open) is never kept.

**Cheaper because it only compares.**  A replay makes the scan's system calls without its parsing, its path
arithmetic and its object building: 40-45 % of a scan's time on the 8-GPU seed host (1.2 against 2.8 ms of CPU on a
loaded machine).

**Where it lives.**  The daemon primes one entry for each kind its config serves (and one for all of them) at
start, before it forks; a worker that scanned afresh sends its entry (the key, the calls, the inventory pickled
before the request touched it) to the daemon over a datagram socket only the daemon's forks hold, after its
answer is sent; workers forked from then on inherit it.  A worker serves the inherited inventory object itself
the first time (it is single-use: nothing else ever sees that copy) and a fresh unpickled copy after that."""

from __future__ import annotations

import _locale
import builtins
import os
import pickle

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    import socket as socket_module
    from collections.abc import Callable, Iterable

    from oci_gpu_hook.inventory import Inventory

    Key = tuple[str, tuple[str, ...], bool, str, str, str]
    Op = tuple[str, tuple[object, ...], tuple[str, object]]

TRACED = ("listdir", "readlink", "stat", "lstat", "open", "read", "close")
UNTRACEABLE = ("scandir", "fstat", "access", "pread", "readv", "preadv", "fwalk", "statvfs")
MAX_ENTRIES = 16
MAX_MESSAGE = 1 << 20


class Untraceable(Exception):
    """A scan made a call the cache cannot replay."""


def _stat_summary(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_mode, st.st_ino, st.st_dev, st.st_size


class _Recorder:
    """The patched ``os`` functions while one scan runs, and the calls they saw."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.tokens: dict[int, int] = {}  # a descriptor the scan opened -> its open's number
        self.opened = 0
        self.traceable = True
        self.real: dict[str, Callable[..., object]] = {}

    def wrapper(self, name: str) -> Callable[..., object]:
        real = self.real[name]

        def traced(*args: object, **kwargs: object) -> object:
            plain = not kwargs and bool(args) and isinstance(args[0], (str, bytes))
            if name in ("read", "close"):
                plain = not kwargs and bool(args) and args[0] in self.tokens
            if not plain:
                self.traceable = False
                return real(*args, **kwargs)
            shown: tuple[object, ...] = args
            if name in ("read", "close"):
                shown = (self.tokens[args[0]], *args[1:])  # type: ignore[index]
            try:
                result = real(*args)
            except OSError as err:
                self.ops.append((name, shown, ("err", err.errno)))
                raise
            answer: object = result
            if name == "open":
                assert isinstance(result, int)
                self.tokens[result] = answer = self.opened
                self.opened += 1
            elif name == "close":
                del self.tokens[args[0]]  # type: ignore[arg-type]
            elif name in ("stat", "lstat"):
                answer = _stat_summary(result)  # type: ignore[arg-type]
            self.ops.append((name, shown, ("ok", answer)))
            return result

        return traced

    def untraceable(self, name: str) -> Callable[..., object]:
        real = self.real[name]

        def refused(*args: object, **kwargs: object) -> object:
            self.traceable = False
            return real(*args, **kwargs)

        return refused

    def __enter__(self) -> _Recorder:
        for name in (*TRACED, *UNTRACEABLE):
            if hasattr(os, name):
                self.real[name] = getattr(os, name)
        self.real["builtins.open"] = builtins.open
        for name in TRACED:
            setattr(os, name, self.wrapper(name))
        for name in UNTRACEABLE:
            if name in self.real:
                setattr(os, name, self.untraceable(name))
        builtins.open = self.untraceable("builtins.open")  # type: ignore[assignment]
        return self

    def __exit__(self, *_exc: object) -> None:
        for name, real in self.real.items():
            if name == "builtins.open":
                builtins.open = real  # type: ignore[assignment]
            else:
                setattr(os, name, real)


def replay(ops: Iterable[Op]) -> bool:
    """Whether every call of ``ops`` answers here exactly as it did when recorded."""
    listdir, readlink, stat, lstat, open_, read, close = (getattr(os, n) for n in TRACED)
    fds: dict[int, int] = {}
    try:
        for name, args, want in ops:
            try:
                if name == "read":
                    got: tuple[str, object] = ("ok", read(fds[args[0]], args[1]))  # type: ignore[index]
                elif name == "listdir":
                    got = ("ok", listdir(args[0]))
                elif name == "readlink":
                    got = ("ok", readlink(args[0]))
                elif name == "open":
                    fd = open_(*args)
                    token = want[1] if want[0] == "ok" else -1 - len(fds)  # a failed open that now opens: unequal
                    fds[token] = fd  # type: ignore[index]
                    got = ("ok", token)
                elif name == "close":
                    close(fds.pop(args[0]))  # type: ignore[arg-type]
                    got = ("ok", None)
                elif name in ("stat", "lstat"):
                    got = ("ok", _stat_summary((stat if name == "stat" else lstat)(args[0])))
                else:
                    return False
            except OSError as err:
                got = ("err", err.errno)
            except (KeyError, IndexError, TypeError):
                return False
            if got != want:
                return False
        return True
    finally:
        for fd in fds.values():
            try:
                os.close(fd)
            except OSError:
                pass


def key_of(sysfs_root: str, kinds: Iterable[str] | None, strict: bool, proc_root: str, driver_root: str) -> Key:
    """What a scan's result depends on besides its calls' answers: the roots as it resolves them, the kinds in the
    order it scans them, strictness, and the encoding it decodes with."""
    from oci_gpu_hook.kinds import KINDS

    wanted = tuple(KINDS) if kinds is None else tuple(k for k in KINDS if k in set(kinds))
    return (os.path.abspath(sysfs_root), wanted, strict, os.path.abspath(proc_root), os.path.abspath(driver_root),
            _locale.getencoding())


class ScanCache:
    """Recorded scans by key (at most MAX_ENTRIES, the newest kept): ``scan`` serves from them, records misses."""

    def __init__(self, real_scan: Callable[..., Inventory]) -> None:
        self.real_scan = real_scan
        self.entries: dict[Key, tuple[list[Op], Inventory, bytes]] = {}
        self.used: set[Key] = set()  # keys whose inherited inventory object this process has handed out
        self.fresh: list[bytes] = []  # entries scanned here, to send to the daemon
        self.hits = self.misses = 0

    def record(self, key: Key, call: Callable[[], Inventory]) -> Inventory:
        with _Recorder() as recorder:
            inventory = call()
        if recorder.traceable:
            blob = pickle.dumps(inventory, protocol=pickle.HIGHEST_PROTOCOL)  # before the request touches it
            self.keep(key, recorder.ops, pickle.loads(blob), blob)
            self.fresh.append(pickle.dumps((key, recorder.ops, blob), protocol=pickle.HIGHEST_PROTOCOL))
        return inventory

    def keep(self, key: Key, ops: list[Op], inventory: Inventory, blob: bytes) -> None:
        self.entries.pop(key, None)
        self.entries[key] = (ops, inventory, blob)
        self.used.discard(key)
        while len(self.entries) > MAX_ENTRIES:
            del self.entries[next(iter(self.entries))]

    def scan(self, sysfs_root: str = "/sys", kinds: Iterable[str] | None = None, *, strict: bool = True,
             proc_root: str = "/proc", driver_root: str = "/") -> Inventory:
        """:func:`oci_gpu_hook.inventory.scan`, the same answer, from the cache where a replay allows it."""
        kinds = None if kinds is None else list(kinds)
        key = key_of(sysfs_root, kinds, strict, proc_root, driver_root)
        entry = self.entries.get(key)
        if entry is not None and replay(entry[0]):
            self.hits += 1
            if key not in self.used:
                self.used.add(key)
                return entry[1]
            return pickle.loads(entry[2])  # our own pickle of our own scan
        self.misses += 1
        return self.record(key, lambda: self.real_scan(sysfs_root, kinds, strict=strict, proc_root=proc_root,
                                                       driver_root=driver_root))

    def prime(self, sysfs_root: str, kind_sets: Iterable[Iterable[str] | None], proc_root: str,
              driver_root: str) -> None:
        """Scan (recording) each of ``kind_sets`` strictly, as a request would; a scan that fails is not kept."""
        from oci_gpu_hook.errors import HookError

        for kinds in kind_sets:
            listed = None if kinds is None else list(kinds)
            key = key_of(sysfs_root, listed, True, proc_root, driver_root)
            try:
                self.record(key, lambda listed=listed: self.real_scan(  # type: ignore[misc]
                    sysfs_root, listed, strict=True, proc_root=proc_root, driver_root=driver_root))
            except (HookError, OSError):
                pass
        self.fresh.clear()  # the daemon's own: nothing to send

    def send_fresh(self, sock: socket_module.socket) -> None:
        """Hand what this worker scanned afresh to the daemon (never blocking; dropped where it does not fit)."""
        import socket

        for message in self.fresh:
            if len(message) <= MAX_MESSAGE:
                try:
                    sock.send(message, socket.MSG_DONTWAIT)
                except OSError:
                    pass
        self.fresh.clear()

    def take(self, sock: socket_module.socket) -> int:
        """The entries workers sent (the daemon, when its socket is readable): how many were kept."""
        import socket

        kept = 0
        while True:
            try:
                message = sock.recv(MAX_MESSAGE, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return kept
            except OSError:
                return kept
            try:
                key, ops, blob = pickle.loads(message)  # only this daemon's forks hold the other end
                self.keep(tuple(key), list(ops), pickle.loads(blob), blob)
                kept += 1
            except Exception:  # a message that is not an entry is dropped
                continue
