"""The live applier: the ``prestart``/``createRuntime`` hook.

By the time it runs, the runtime has read config.json, made the container's
/dev and applied its device cgroup, so rewriting the spec would change nothing.
It reads the state JSON on stdin, takes the request from the bundle's
config.json exactly as the spec-rewrite paths do, and applies the same plan
live: nodes inside the container's mount namespace (:mod:`rootfs`) and rules in
its device cgroup (:mod:`cgroups`).  No GPU requested: exit at once, touch nothing.
"""

from __future__ import annotations

import os
import time

from oci_gpu_hook.errors import HookError
from oci_gpu_hook.oci_spec import ContainerSpec
from oci_gpu_hook.oci_state import parse_state

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from oci_gpu_hook.config import Config
    from oci_gpu_hook.core.devices import Rule
    from oci_gpu_hook.core.edits import Edits


def _identity(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def check_container(pid: int, rootfs: str, bundle: str) -> None:
    """Refuse unless ``pid`` is the container of ``bundle``, before anything is touched in its name.

    What holds at prestart/createRuntime (measured in runc 1.1's hooks, cgroup v1 and v2): the container's first
    process is a child of the runtime process that runs the hooks (runc's nsexec clones it with CLONE_PARENT; crun
    forks it and the hooks itself), so it has this hook's parent; it has a mount namespace of its own; and it sits
    in its rootfs: its cwd is root.path until pivot_root, its root after.  A stale or unrelated pid (a pid the
    kernel gave to someone else, the pid of a host process) fails at least one of the three.
    """
    where = f"the container state's pid {pid} is not the container of {bundle}"
    proc = f"/proc/{pid}"
    try:
        with open(f"{proc}/stat", "rb") as handle:
            data = handle.read()
        parent = int(data[data.rindex(b")") + 2:].split()[1])
        own_ns = _identity(f"{proc}/ns/mnt") != _identity("/proc/self/ns/mnt")
        places = {_identity(f"{proc}/root"), _identity(f"{proc}/cwd")}
    except (OSError, ValueError, IndexError) as err:
        raise HookError(f"container process {pid} is gone or unreadable "
                        f"({getattr(err, 'strerror', None) or err})") from None
    try:
        root = _identity(rootfs)
    except OSError as err:
        raise HookError(f"cannot stat the container's root.path {rootfs}: {err.strerror}") from None
    if parent != os.getppid():
        raise HookError(f"{where}: its parent is process {parent}, not the runtime {os.getppid()} that runs this hook")
    if not own_ns:
        raise HookError(f"{where}: it shares this hook's mount namespace")
    if root not in places:
        raise HookError(f"{where}: neither its root nor its working directory is the bundle's root.path {rootfs}")


def run(stdin_text: str, config: Config | HookError) -> int:
    """Apply the plan of the container described by the state JSON ``stdin_text`` (``config`` an error: it cannot
    be used, and :func:`oci_gpu_hook.request.on_unusable_config` decides)."""
    started = time.monotonic()
    cid, pid, bundle = parse_state(stdin_text)
    try:
        return _apply(cid, pid, bundle, config, started)
    except HookError as err:
        err.container_id = cid
        raise


def _apply(cid: str, pid: int, bundle: str, config: Config | HookError, started: float) -> int:
    from oci_gpu_hook.plan import plan_for_spec

    spec = ContainerSpec.read(os.path.join(bundle, "config.json"))
    if isinstance(config, HookError):
        from oci_gpu_hook.request import on_unusable_config

        on_unusable_config(spec, config, "prestart", cid)
        return 0
    plan = plan_for_spec(spec, config)
    if not plan:
        plan.record(config, "prestart", cid, started)
        return 0
    rootfs = spec.root(bundle)
    check_container(pid, rootfs, bundle)

    from oci_gpu_hook.appliers import cgroups
    from oci_gpu_hook.appliers import rootfs as rootfs_module

    # The same outcome as the spec-rewrite paths for the same config: runc's reading of the container's own
    # rules, with the plan's added, or the one line runc would give (a hole in an operator's wildcard deny).
    policy = spec.policy()
    policy.grant(plan.rules)
    # One live application per container at a time: a resident planner that answers the native front too late
    # may still be at work when the front's Python fallback starts (oci_gpu_hook/serve/planner/); the second
    # then finds the nodes made and the rules granted.
    lock = _lock(rootfs)
    try:
        made = rootfs_module.apply_in_container(pid, rootfs, plan.edits)
        mode = cgroups.mode()
        directory, cgroup_path = cgroups.container_cgroup_paths(pid, mode)
        unit_result = _register_with_systemd(directory, cgroup_path, cid, plan.rules, policy.default_allow)
        if mode == "v1":
            written = cgroups.v1_grant(directory, plan.rules, policy)
            cgroup_result = f"allowed {len(written)} rules" if written else "already allowed"
        else:
            cgroup_result = cgroups.v2_grant(directory, plan.rules)
    finally:
        os.close(lock)
    extra = {"systemd_unit": unit_result} if unit_result else {}
    plan.record(config, "prestart", cid, started, nodes=made, cgroup=mode, cgroup_dir=directory,
                cgroup_result=cgroup_result, **extra)
    return 0


def _register_with_systemd(directory: str, cgroup_path: str, cid: str, rules: tuple[Rule, ...],
                           default_allow: bool) -> str | None:
    """Under the systemd cgroup driver, the plan's devices added to the container's unit first (or the one-line
    refusal), so that systemd's next application of the unit's rules keeps them (:mod:`systemd_unit`, which
    first proves the unit to be container ``cid``'s own, at ``cgroup_path``); None elsewhere, at the cost of one
    substring test (cgroupfs names no ``.scope``).  A unit that restricts no device (the container's own rules
    allow all: runc gives systemd ``DevicePolicy=auto`` and no list) gets nothing: a DeviceAllow= entry would turn
    its restriction on."""
    if ".scope" not in directory or default_allow:
        return None
    from oci_gpu_hook.appliers import systemd_unit

    unit = systemd_unit.unit_of(directory)
    return systemd_unit.register(unit, rules, cgroup_path, cid) if unit else None


def _lock(rootfs: str) -> int:
    """An fd holding an exclusive flock on the container's root directory (released when closed)."""
    import fcntl

    try:
        fd = os.open(rootfs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        raise HookError(f"cannot open the container's root.path {rootfs}: {err.strerror}") from None
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _driver_through_proc(pid: int, rootfs: str, edits: Edits) -> list[str] | None:
    """A driver's soname links and ld cache (the ``ldcache`` hook's edits: no node, no mount) made from here,
    through ``/proc/PID/root``: before ``pivot_root`` that is the container's mount namespace's root, the rootfs
    below it reached by the one walk (FOLLOW, as the namespace helper opens it after setns), every step by a
    directory fd.  No process is forked for it.  What was done, or None where the ld cache needs ldconfig, which
    runs only in the
    namespace helper (:func:`oci_gpu_hook.appliers.rootfs.apply_in_container`, which then does it all again:
    the links it finds made)."""
    from oci_gpu_hook.appliers import mounts
    from oci_gpu_hook.core import inroot

    try:
        proc_root = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        raise HookError(f"cannot open the root of container process {pid}: {err.strerror}") from None
    try:
        root_fd = inroot.open_dir(proc_root, rootfs, inroot.FOLLOW)[0]
    finally:
        os.close(proc_root)
    mask = os.umask(0)  # the modes exact, as in the namespace helper
    try:
        done = mounts.links_and_cache(root_fd, rootfs, edits, in_namespace=False)
    except mounts.NeedsNamespace:
        return None
    finally:
        os.umask(mask)
        os.close(root_fd)
    return done


def _make_in_container(stdin_text: str, edits: Edits) -> int:
    """Make ``edits`` (links, symlinks, the ld cache: nothing the device cgroup governs) in the container of
    the state JSON ``stdin_text``, once it is proven to be the bundle's container."""
    from oci_gpu_hook.appliers import rootfs as rootfs_module

    cid, pid, bundle = parse_state(stdin_text)
    try:
        spec = ContainerSpec.read(os.path.join(bundle, "config.json"))
        if edits:
            rootfs = spec.root(bundle)
            check_container(pid, rootfs, bundle)
            done = None if edits.nodes or edits.links or edits.mounts else _driver_through_proc(pid, rootfs, edits)
            if done is None:
                done = rootfs_module.apply_in_container(pid, rootfs, edits)
            if edits.ldcache:  # (its module is loaded then; the links hook does without it)
                from oci_gpu_hook.appliers.mounts import warn_notes

                warn_notes(done, cid)
    except HookError as err:
        err.container_id = cid
        raise
    return 0


def run_links(stdin_text: str, args: list[str]) -> int:
    """``oci-gpu-hook links PATH=TARGET...``: the createRuntime hook that the spec-rewrite paths and the CDI
    specs add, making ``/dev/dri/by-path`` links in the container (the OCI spec has no field for them)."""
    from oci_gpu_hook.core.edits import Edits, check_link

    links = []
    for arg in args:
        path, eq, target = arg.partition("=")
        if not eq:
            raise HookError(f"links: {arg!r} is not PATH=TARGET")
        check_link(path, target)
        links.append((path, target))
    return _make_in_container(stdin_text, Edits(links=tuple(links)))


def run_ldcache(stdin_text: str, args: list[str]) -> int:
    """``oci-gpu-hook ldcache [PATH=TARGET...] [--folder=DIR...] [--lib=PATH...]``: the createRuntime hook that the
    spec-rewrite paths and the CDI specs add beside a driver's mounts (which the runtime made): the soname links,
    then the driver's libraries merged into the container's ld cache (:mod:`oci_gpu_hook.appliers.mounts`)."""
    from oci_gpu_hook.core.edits import Edits, check_container_path, check_symlink

    links, folders, libs = [], [], []
    for arg in args:
        for option, into in (("--folder=", folders), ("--lib=", libs)):
            if arg.startswith(option):
                check_container_path(arg[len(option):], "ld cache directory" if into is folders else "driver library")
                into.append(arg[len(option):])
                break
        else:
            path, eq, target = arg.partition("=")
            if not eq or arg.startswith("-"):
                raise HookError(f"ldcache: {arg!r} is not PATH=TARGET, --folder=DIR or --lib=PATH")
            check_symlink(path, target)
            links.append((path, target))
    return _make_in_container(stdin_text, Edits(symlinks=tuple(links), ldcache=tuple(folders), ldlibs=tuple(libs)))
