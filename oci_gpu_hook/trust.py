"""The one trust rule: which files may steer this process (code it runs, the config it obeys, where it writes).

A file may steer a process only when nobody with less privilege than that process could have changed it.
So every component of its path from ``/`` down, and every symlink met on the way (whose target is then walked
in turn), must be owned by a *trusted owner* and must not be writable by group or others.  Two exceptions: a
sticky directory (``/tmp``) may be world-writable, since nobody can rename or remove an entry there that they
do not own (the entries below it pass the rule themselves); ``/dev/null`` reads as empty whoever writes to it.

The trusted owners depend on what the process could do with what it reads (:func:`trusted_owners`):

- **privileged** (its effective uid is the host's root: uid 0 in a user namespace that maps the parent's uid 0,
  or any uid holding capabilities in the host's namespace): root alone.  The launchers run Python as root on
  every container start and the shim execs the config's ``runtime`` as root, so a file a user could change
  would hand that user root.
- **unprivileged** (a rootless podman's hook runs as uid 0 of a user namespace that maps the caller's own uid;
  an operator command run by a user): root and the caller.  Code and config that only the caller or root could
  change cannot raise the caller's privilege: what they make the process do, the caller could do anyway.
  In a user namespace that does not map the parent's root, the files of that root show as the kernel's
  overflow uid (``/proc/sys/kernel/overflowuid``, 65534), so that uid stands for root there.

**Pins.**  In a user namespace that does not map the host's root, root's files and those of every other unmapped
user read alike, as the overflow uid: a rootless hook cannot tell them apart by their owner.  So ``install``, as
root and after checking every path with root's rule, pins the install's own entries (those of the virtual
environment and its own directory, the site-packages that hold the package, the config file and its directory):
their inode and change time, which nobody but root can set back (a chown, a write, a rename into the place or out
of it all change the change time), in a file beside the launchers (:func:`pins_of`, read by :func:`load_pins`),
which is read whole or not at all (:data:`MAX_PINS`).  There, an entry of those that reads as the
overflow uid is trusted only while it is still the entry install saw (:func:`pin_problem`); root, whose files
read as root's, needs no pin.  After a change of the config or the environment, ``install`` runs again.

Code and config follow the same rule; they differ in one point only: code that is missing is refused (nothing
runs in its place), while a missing config is "no config" and the open that follows says so.

The block between the two ``--- the rule`` lines below is also the whole trust check of every Python launcher:
``oci_gpu_hook/install/launchers.py`` copies it there verbatim (the launcher checks the package before it may
import it), and the C front (``oci_gpu_hook/fastpath/front.c``, ``trust_problem``) is tested against it case by
case (tests/test_trust_rule.py).  Keep it to :mod:`os` and :mod:`stat` (both loaded by ``python -I -S``).
"""

from __future__ import annotations

import os
import stat

# --- the rule begins (copied verbatim into the Python launchers: os and stat only)
MAX_SYMLINKS = 40  # as the kernel's path walk (ELOOP)
_DEV_NULL = (1, 3)


def _read_proc(path: str, most: int = 65536) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(most)
    except OSError:
        return None


def id_ranges(kind: str = "uid", pid: str = "self") -> list[tuple[int, int, int]]:
    """This user namespace's uid (or ``kind`` "gid") map, or process ``pid``'s: (first id here, first id in the
    parent, count) per line."""
    ranges = []
    for line in (_read_proc(f"/proc/{pid}/{kind}_map") or b"").decode("ascii", "replace").splitlines():
        fields = line.split()
        if len(fields) == 3 and all(f.isdigit() for f in fields):
            ranges.append((int(fields[0]), int(fields[1]), int(fields[2])))
    return ranges or [(0, 0, 4294967295)]  # no /proc: the initial namespace, as far as this process can tell


def parent_id(number: int, ranges: list[tuple[int, int, int]] | None = None) -> int | None:
    """What the uid ``number`` (an id of ``ranges``' map) is in the parent user namespace (None: unmapped)."""
    found = (out + number - inside for inside, out, count in ranges or id_ranges() if inside <= number < inside + count)
    return next(found, None)


_IDENTITY: list[tuple[bool, int | None]] = []  # read once: a process does not change its user namespace here


def identity() -> tuple[bool, int | None]:
    """(privileged, the uid that the parent's root shows as here when this user namespace does not map it)."""
    if _IDENTITY:
        return _IDENTITY[0]
    ranges = id_ranges()
    host = parent_id(os.geteuid(), ranges)
    root_mapped = any(out == 0 for _inside, out, _count in ranges)
    privileged = host == 0
    if not privileged and ranges == [(0, 0, 4294967295)]:  # a non-root uid with capabilities over the host
        status = _read_proc("/proc/self/status") or b""
        for line in status.splitlines():
            if line.startswith(b"CapEff:"):
                privileged = int(line.split()[1], 16) != 0
    overflow = None
    if not root_mapped:
        text = (_read_proc("/proc/sys/kernel/overflowuid") or b"65534").strip()
        overflow = int(text) if text.isdigit() else 65534
    _IDENTITY.append((privileged, overflow))
    return privileged, overflow


def trusted_owners() -> tuple[int, ...]:
    """The uids whose files may steer this process (see the module's text): root alone when it is privileged."""
    privileged, overflow = identity()
    if privileged:
        return (0,)
    owners = [0, os.geteuid()]
    if overflow is not None:
        owners.append(overflow)
    return tuple(dict.fromkeys(owners))


def _whom(owners: tuple[int, ...]) -> str:
    return "root" if owners == (0,) else "root or uid " + " or uid ".join(str(o) for o in owners[1:])


def entry_problem(path: str, st: os.stat_result, owners: tuple[int, ...]) -> str | None:
    """Why one entry (lstat'ed or fstat'ed) cannot be trusted, or None."""
    if st.st_uid not in owners:
        return f"{path} is owned by uid {st.st_uid}, not by {_whom(owners)}"
    mode = st.st_mode
    writable = mode & 0o022 and not stat.S_ISLNK(mode)  # a symlink's own mode means nothing
    if writable and not (stat.S_ISDIR(mode) and mode & stat.S_ISVTX) and not (
            stat.S_ISCHR(mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == _DEV_NULL):
        who = "group and others" if mode & 0o022 == 0o022 else "group" if mode & 0o020 else "others"
        return f"{path} is writable by {who} (mode {stat.S_IMODE(mode):04o})"
    return pin_problem(path, st)


PINS: dict[str, tuple[int, int]] = {}  # path -> (inode, change time in ns) as `install` saw it; (0, 0): absent
MAX_PINS = 65536  # bytes: a larger pins file is read not at all, never in part (install refuses to write one)
TOO_LARGE = (-1, -1)  # PINS[""]: the pins file was larger than MAX_PINS, so no entry can be vouched for


def read_pins(path: str) -> dict[str, tuple[int, int]]:
    """The pins `install` wrote at ``path``: one "INODE CTIME_NS PATH" a line (inode 0: the path was absent).  A
    file larger than :data:`MAX_PINS` is not read: ``{"": TOO_LARGE}`` (a part would leave entries unpinned)."""
    pins = {}
    data = _read_proc(path, MAX_PINS + 1) or b""
    if len(data) > MAX_PINS:
        return {"": TOO_LARGE}
    for line in data.decode("utf-8", "surrogateescape").splitlines():
        fields = line.split(" ", 2)
        if len(fields) == 3 and fields[0].isdigit() and fields[1].isdigit() and fields[2].startswith("/"):
            pins[fields[2]] = (int(fields[0]), int(fields[1]))
    return pins


def load_pins(path: str) -> None:
    """Where the parent's root shows as the overflow uid, :func:`read_pins` into :data:`PINS`.  Elsewhere nothing:
    no pin is needed where root's files read as root's."""
    if identity()[1] is not None:
        PINS.update(read_pins(path))


def pin_problem(path: str, st: os.stat_result | None) -> str | None:
    """Why ``path`` (``st`` None: absent), one of the install's own paths that reads as the overflow uid here, is
    no longer the entry `install` saw: the same inode, never changed since (a chown, a write, a rename into its
    place all change it), or still absent.  Root's file and another unmapped user's read alike in here; the
    pin is root's word on which one it is."""
    pin = PINS.get(path, PINS.get(""))
    overflow = identity()[1]
    if pin is None or overflow is None or (st is not None and st.st_uid != overflow):
        return None
    if pin == TOO_LARGE:
        return (f"{path} cannot be vouched for: the pins file of `oci-gpu-hook install` is larger than {MAX_PINS} "
                "bytes, so none of it is read; run install again")
    if pin == ((st.st_ino, st.st_ctime_ns) if st is not None else (0, 0)):
        return None
    return (f"{path} changed after `oci-gpu-hook install` ran (in this user namespace root's files and other "
            f"users' read alike, as uid {overflow}, so only what install saw is trusted); run install again")


def walk_problem(path: str, owners: tuple[int, ...], must_exist: bool,
                 seen: list[tuple[str, os.stat_result | None]] | None = None) -> str | None:
    """Why ``path`` cannot be trusted, or None: ``/`` down with lstat, each symlink followed by hand (its target's
    components go first), ``..`` from where the walk is.  A missing component (or a non-directory with more to
    come) ends the walk: trusted when not ``must_exist`` (whoever opens the path next reports it), unless it was
    pinned present.  ``seen`` collects each entry met (None: missing), for :func:`pins_of`."""
    if not path.startswith("/"):
        path = os.path.join(os.getcwd(), path)
    todo = [p for p in reversed(path.split("/")) if p and p != "."]
    current = "/"
    try:
        st = os.lstat("/")
    except OSError as err:
        return f"cannot check /: {err.strerror}"
    bad = entry_problem("/", st, owners)
    if seen is not None:
        seen.append(("/", st))
    links = 0
    while todo and bad is None:
        name = todo.pop()
        if name == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, name)
        try:
            st = os.lstat(candidate)
        except FileNotFoundError:
            if seen is not None:
                seen.append((candidate, None))
            return pin_problem(candidate, None) or (f"{path} is missing" if must_exist else None)
        except OSError as err:
            return f"cannot check {candidate}: {err.strerror}"
        bad = entry_problem(candidate, st, owners)
        if seen is not None:
            seen.append((candidate, st))
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_SYMLINKS:
                return f"{path}: too many levels of symbolic links"
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = "/"
            todo.extend(p for p in reversed(target.split("/")) if p and p != ".")
        elif todo and not stat.S_ISDIR(st.st_mode):
            return f"{candidate} is not a directory" if must_exist else None  # the open fails with ENOTDIR
        else:
            current = candidate
    return bad


def code_problem(path: str) -> str | None:
    """Why the code at ``path`` (an interpreter, a launcher, a directory code is loaded from) may not run."""
    return walk_problem(path, trusted_owners(), True)
# --- the rule ends


def pins_of(paths: list[str], roots: list[str], skip: list[str]) -> dict[str, tuple[int, int]]:
    """The pins of every entry that the walks of ``paths`` meet at or below one of ``roots``, except ``skip`` and
    the directories above them (what install is about to write into), as :func:`load_pins` reads them back."""
    def below(path: str, top: str) -> bool:
        return path == top or path.startswith(top.rstrip("/") + "/")

    seen: list[tuple[str, os.stat_result | None]] = []
    for path in paths:
        walk_problem(path, (0,), False, seen)
    return {path: (0, 0) if st is None else (st.st_ino, st.st_ctime_ns) for path, st in seen
            if any(below(path, top) for top in roots) and not any(below(s, path) for s in skip)}


def unpinned(path: str) -> list[str]:
    """The entries pinned in the pins file at ``path`` that are no longer what install pinned, whoever owns them
    now: those a rootless hook refuses while they read as the overflow uid (``validate --rootless``)."""
    changed = []
    for entry, pin in read_pins(path).items():
        try:
            st = os.lstat(entry)
        except FileNotFoundError:
            now = (0, 0)
        except OSError:
            now = (-1, -1)
        else:
            now = (st.st_ino, st.st_ctime_ns)
        if now != pin:
            changed.append(entry)
    return changed


def pins_text(pins: dict[str, tuple[int, int]]) -> str:
    """:func:`pins_of` as the file :func:`load_pins` reads (a path with a line break cannot be pinned: left out)."""
    return "".join(f"{ino} {ctime} {path}\n" for path, (ino, ctime) in sorted(pins.items()) if "\n" not in path)


def config_problem(path: str) -> str | None:
    """Why the config, log or output file at ``path`` cannot be trusted, or None (a missing one is trusted: the
    open that follows reports it)."""
    return walk_problem(path, trusted_owners(), False)


def tree_problem(top: str, owners: tuple[int, ...]) -> tuple[str | None, int]:
    """Why ``top`` or some entry below it cannot be trusted (None), and how many entries were checked: ``top`` is
    walked from ``/`` (:func:`walk_problem`), then every entry below it once, by lstat; a symlink met there is
    walked as a path of its own (its target's every component), and a directory it names is gone through as well.
    What install and ``validate`` say of the code the launchers only walk down to (its site-packages): the package
    and what it requires, checked once rather than at each start."""
    why = walk_problem(top, owners, False)
    count = 1
    todo = [os.path.realpath(top)] if why is None and os.path.isdir(top) else []
    done: set[tuple[int, int]] = set()
    while todo and why is None:
        directory = todo.pop()
        try:
            st = os.stat(directory)
            if (st.st_dev, st.st_ino) in done:
                continue
            done.add((st.st_dev, st.st_ino))
            entries = list(os.scandir(directory))
        except OSError as err:
            return f"cannot check {directory}: {err.strerror}", count
        for entry in entries:
            count += 1
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as err:
                return f"cannot check {entry.path}: {err.strerror}", count
            why = entry_problem(entry.path, st, owners)
            if why is None and stat.S_ISLNK(st.st_mode):
                why = walk_problem(entry.path, owners, False)
                if why is None and os.path.isdir(entry.path):
                    todo.append(os.path.realpath(entry.path))
            elif stat.S_ISDIR(st.st_mode):
                todo.append(entry.path)
            if why:
                break
    return why, count


def checked(path: str) -> tuple[str | None, tuple[int, int]]:
    """:func:`config_problem` of ``path``, and the (device, inode) of the entry its walk ended on ((0, 0):
    missing): what :func:`read_regular` must then find on the descriptor it reads, so that the file read is the
    file checked."""
    seen: list[tuple[str, os.stat_result | None]] = []
    why = walk_problem(path, trusted_owners(), False, seen)
    st = seen[-1][1] if seen else None
    return why, (st.st_dev, st.st_ino) if st is not None else (0, 0)


def privileged() -> bool:
    """Whether this process acts as the host's root (see the module's text)."""
    return bool(identity()[0])


def rootless() -> bool:
    """Whether this process runs as a rootless runtime's hook does: unprivileged, in a user namespace that does not
    map the host's root (:mod:`oci_gpu_hook.appliers.rootless` says what such a runtime makes of a plan)."""
    privileged, overflow = identity()
    return not privileged and overflow is not None


def host_uid() -> int:
    """This process's effective uid in the parent user namespace (the host's, unless nested deeper)."""
    uid = parent_id(os.geteuid())
    return os.geteuid() if uid is None else uid


def read_regular(path: str, walked: tuple[int, int] | None = None) -> bytes:
    """The bytes of the file at ``path``; a FIFO, socket or device is refused unopened (its open could block or
    act), and again on the fd (replaced in between: the open was non-blocking, so it never hung): an OSError whose
    ``strerror`` is "it is not a regular file".  A directory is the OSError its read gives ("Is a directory").
    ``walked``: the (device, inode) that the trust walk of ``path`` ended on (:func:`checked`); a descriptor on
    another file (the path was renamed over after the walk) is the OSError :data:`REPLACED`, nothing read."""
    def special(mode: int) -> bool:
        return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode)

    if special(os.stat(path).st_mode):
        raise OSError(0, NOT_REGULAR, path)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if special(st.st_mode):
            raise OSError(0, NOT_REGULAR, path)
        if walked is not None and (st.st_dev, st.st_ino) != walked:
            raise OSError(0, REPLACED, path)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


NOT_REGULAR = "it is not a regular file"
REPLACED = "it was replaced between its trust check and its read"
