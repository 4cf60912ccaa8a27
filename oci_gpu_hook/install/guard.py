"""One run of ``oci-gpu-hook install`` (or ``--uninstall``) around the :class:`~.installer.Installer`.

The installer changes files; a run also has to decide whether it may start at all and to check what it did.
Before: the launchers must not run code someone other than a trusted owner could change (said once here, not by
every container start).  After: podman must read the hooks directory the hook file went to, and the ``/dev/char``
links runc needs under systemd are made or taken out.  Around it all: one run per prefix at a time (a second
would roll back the first's journal as if it had died), and a waiting run says who holds the lock.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from oci_gpu_hook.config import Config
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.install.installer import Installer
from oci_gpu_hook.install.items import wanted
from oci_gpu_hook.install.paths import INTEGRATIONS


@dataclass(frozen=True)
class Options:
    """What ``install`` was asked to do besides which integrations (see ``oci-gpu-hook install --help``)."""

    uninstall: bool = False
    dry_run: bool = False
    hook: str | None = None
    set: list[str] = field(default_factory=list)
    native: bool | None = None
    allow_editable: bool = False
    docker_default_runtime: bool = False
    containerd_version: str | None = None
    host_root: str | None = None


def check_podman_hook(real: str, disk: Callable[[str], str], errors: list[str]) -> None:
    """After install: the hook file is in a directory podman reads, and names an executable that is there."""
    from oci_gpu_hook.install import podman

    dirs, source = podman.hooks_dirs(disk)
    try:
        with open(disk(real), "rb") as handle:
            path = json.loads(handle.read())["hook"]["path"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        errors.append(f"podman: the installed hook {disk(real)} cannot be read back ({err})")
        return
    if os.path.dirname(real) not in dirs:
        errors.append(f"podman: {os.path.dirname(real)} is not a hooks directory podman reads ({source}: {dirs})")
    elif not os.access(disk(path), os.X_OK):
        errors.append(f"podman: the hook's path {disk(path)} is not an executable: podman refuses every container")
    else:
        print(f"checked: podman reads {os.path.dirname(disk(real))} ({source}) and runs {disk(path)}")


def untrusted_code() -> None:
    """Refuse an install whose launchers would run code that someone other than a trusted owner could change (the
    rule every launcher checks at each start, :func:`oci_gpu_hook.trust.code_problem`): said now, once, rather than
    by every container start; and a rootless user's hook, which cannot tell root's files from another user's, is
    never installed over such code."""
    from oci_gpu_hook.install.codepaths import code_paths, stdlib_paths, venv_config
    from oci_gpu_hook.trust import code_problem

    for path in [sys.executable, *code_paths(), *stdlib_paths(), *venv_config()]:
        why = code_problem(path) if os.path.exists(path) else None
        if why:
            raise HookError(f"install: the launchers would run {path}, which fails the trust rule: {why} (install "
                            "into a root-owned prefix, see docs/security.md); nothing is written")
    why = package_problem()
    if why:
        raise HookError(f"install: {why} (install into a root-owned prefix with umask 022, see docs/security.md); "
                        "nothing is written")


def package_problem() -> str | None:
    """Why some file of the package or of what it requires fails the trust rule (each walked once: a launcher only
    walks down to their site-packages at each start), or None: install and ``validate`` say it."""
    from oci_gpu_hook.install.codepaths import package_trees
    from oci_gpu_hook.trust import tree_problem, trusted_owners

    for top in package_trees():
        why, _count = tree_problem(top, trusted_owners())
        if why:
            return f"the package or one it requires, at {top}, fails the trust rule: {why}"
    return None


def install_or_uninstall(opts: Options, only: set[str] | None, installer: Installer, config: Config) -> int:
    """install or uninstall (``opts.uninstall``) the ``only`` integrations (None: all)."""
    from oci_gpu_hook.install.launchers import launcher_defaults

    if opts.uninstall:
        given = [flag for flag, value in (("--hook", opts.hook is not None), ("--set", opts.set),
                                          ("--docker-default-runtime", opts.docker_default_runtime),
                                          ("--containerd-version", opts.containerd_version is not None),
                                          ("--host-root", opts.host_root is not None)) if value]
        if given:
            raise HookError(f"install --uninstall takes no {', '.join(given)}: it removes what the manifest lists")
        left = installer.uninstall(only)
        if only is None and not opts.dry_run:
            from oci_gpu_hook.cluster import devchar

            for line in devchar.uninstall_lines(installer.disk):
                print(line)
        if left:
            files = f"{len(left)} file{'s' if len(left) != 1 else ''}"
            raise HookError(f"install --uninstall: {files} left, so the node is still integrated (each 'left:' line "
                            "above says why and what to do); the manifest and backups are kept for the next "
                            "install --uninstall")
        return 0
    from oci_gpu_hook.install.codepaths import editable_reason

    editable = editable_reason()
    if editable and not opts.allow_editable:
        raise HookError(f"install: {editable}")
    if not editable:
        untrusted_code()
    notes: list[str] = []
    errors: list[str] = []
    items = wanted(config, opts.hook or "precreate", launcher_defaults(opts.set, "install"), notes, installer.disk,
                   only, errors, native=opts.native, trust=not editable,
                   docker_default_runtime=opts.docker_default_runtime, containerd_version=opts.containerd_version,
                   host_root=os.path.abspath(opts.host_root) if opts.host_root else None)
    failed = {e.split(":", 1)[0] for e in errors}
    selected = None if only is None and not failed else (set(only or INTEGRATIONS) - failed) | {"core"}
    installer.install(items, notes, selected, errors)
    if not opts.dry_run:
        for item in items:
            if item.integration == "podman" and not any(e.startswith("podman:") for e in errors):
                check_podman_hook(item.path, installer.disk, errors)
    from oci_gpu_hook.cluster import devchar

    for line in devchar.install_lines(config, installer.disk, opts.dry_run):  # runc under systemd needs them
        print(line)
    for error in errors:
        print(f"skipped: {error}")
    if errors:
        raise HookError("; ".join(errors) + " (the other integrations are installed)")
    return 0


def one_at_a_time(installer: Installer, work: Callable[[], int]) -> int:
    """Run ``work`` holding the install lock of the prefix: a second run would roll back the first's journal
    as if it had died."""
    import fcntl

    lock = os.open(installer.prefix or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting: another install or uninstall is running on {installer.prefix or '/'}"
                  f"{lock_holder(lock)}", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        return work()
    finally:
        os.close(lock)


def lock_holder(fd: int) -> str:
    """Who holds the flock on ``fd`` (from /proc/locks): `` (pid N since HH:MM:SS UTC: COMMAND)``, or ``""``."""
    import time

    st = os.fstat(fd)
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as handle:
            pids = [f[4] for f in (line.split() for line in handle) if len(f) > 5 and f[1] == "FLOCK" and f[5] == where]
        pid = next(p for p in pids if p.isdigit() and int(p) != os.getpid())
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command = handle.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        with open(f"/proc/{pid}/stat") as handle:
            ticks = int(handle.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, in clock ticks
        with open("/proc/stat") as handle:
            boot = next(int(line.split()[1]) for line in handle if line.startswith("btime "))
    except (OSError, StopIteration, ValueError, IndexError):
        return ""
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(boot + ticks / os.sysconf("SC_CLK_TCK")))
    return f" (pid {pid} since {since}: {command[:200]})"
