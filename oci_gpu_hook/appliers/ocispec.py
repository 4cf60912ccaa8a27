"""The spec-rewrite applier: a plan's edits written into an OCI config.json.

Nodes go to ``linux.devices`` and one allow rule per node to
``linux.resources.devices``; runc or crun then create the nodes and program
the device cgroup themselves (v1 or v2), and the rules survive ``runc update``
and systemd reloads.  The ``/dev/dri/by-path`` links, which the OCI spec cannot
express, are one read-only bind mount of a host directory prepared with exactly them
(:mod:`oci_gpu_hook.appliers.bypath`), appended after the spec's own mounts (so above its ``/dev`` tmpfs);
CDI specs make them with a ``createRuntime`` hook instead (``oci-gpu-hook links``, :func:`links_hook`, the
configured ``hook_path``, see :func:`links_hook_path`); masked paths go to
``linux.maskedPaths``.  A driver's files (NVIDIA) are read-only bind ``mounts``
(``ro, nosuid, nodev``) that the runtime makes; their soname links and the
container's ld cache, which the spec cannot express either, are written into
the root directory here, before the runtime creates the container
(:func:`prewrite`), or where that cannot be, a second ``createRuntime`` hook
(``oci-gpu-hook ldcache``).  The rewrite is idempotent, never removes or widens an
existing entry, and leaves every field it does not own as it was.  Rules are
checked with runc's own emulator (:mod:`oci_gpu_hook.core.rules`): a grant runc
would refuse (a hole in an operator's wildcard deny) is refused here, first.
"""

from __future__ import annotations

import os

from oci_gpu_hook import fastjson
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.oci_spec import ContainerSpec, field
from oci_gpu_hook.plan import plan_for_spec

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from typing import Any

    from oci_gpu_hook.config import Config
    from oci_gpu_hook.core.edits import Edits
    from oci_gpu_hook.plan import Plan

LINKS_COMMAND = "links"
LDCACHE_COMMAND = "ldcache"
HOOK_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]


def links_hook(links: tuple[tuple[str, str], ...], hook_path: str) -> dict[str, Any]:
    """The ``createRuntime`` hook that makes ``links`` inside the container (also used in CDI specs)."""
    return {"path": hook_path, "args": ["oci-gpu-hook", LINKS_COMMAND, *(f"{p}={t}" for p, t in links)],
            "env": list(HOOK_ENV), "timeout": 10}


def ldcache_hook(edits: Edits, hook_path: str) -> dict[str, Any]:
    """The ``createRuntime`` hook that makes a driver's soname links and updates the container's ld cache."""
    return {"path": hook_path, "args": ["oci-gpu-hook", LDCACHE_COMMAND, *edits.driver_hook_args],
            "env": list(HOOK_ENV), "timeout": 30}


def hooks(edits: Edits, hook_path: str, links: bool = True) -> list[dict[str, Any]]:
    """Every ``createRuntime`` hook ``edits`` need: in CDI specs the links hook too, in a rewritten spec
    (``links=False``) only the driver's (the links are a bind mount there)."""
    out = [links_hook(edits.links, hook_path)] if edits.links and links else []
    if edits.symlinks or edits.ldcache:
        out.append(ldcache_hook(edits, hook_path))
    return out


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _stand_in_problem(candidate: str) -> str | None:
    """Why this installation's own ``oci-gpu-hook`` at ``candidate`` may not be named as the links hook, or
    None: it must be an executable file that nobody but root (or the invoking user) can have changed, and so
    must the interpreter of a script and the package it runs (:mod:`oci_gpu_hook.trust`)."""
    from oci_gpu_hook.trust import config_problem

    if not _executable(candidate):
        return f"{candidate} is not an executable file"
    checked = [candidate]
    try:
        with open(candidate, "rb") as handle:
            head = handle.read(256)
    except OSError as err:
        return f"cannot read {candidate}: {err.strerror}"
    if head.startswith(b"#!"):
        words = head[2:].split(b"\n", 1)[0].split()
        if not words:
            return f"{candidate} is a script without an interpreter"
        checked.append(os.fsdecode(words[0]))
        checked.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the package it imports
    for path in checked:
        why = config_problem(path) if os.path.exists(path) else f"{path} is missing"
        if why:
            return why
    return None


def links_hook_path(config: Config, argv0: str | None = None) -> str:
    """The executable that the ``createRuntime`` hooks (links in CDI specs, the driver's ld cache) name.

    ``hook_path`` when the runtime can run it.  When ``hook_path`` is the default and missing (a plain
    ``pip install`` without ``oci-gpu-hook launchers`` or ``install``), this installation's own
    ``oci-gpu-hook`` stands in: the one next to the running entry point (``sys.argv[0]``), provided nobody but
    root could have changed it, its interpreter or the package.  Otherwise one line says what to do: a
    container is never given a hook that would fail, or a path that is not there."""
    path = config.hook_path
    if _executable(path):
        return path
    from oci_gpu_hook.config import FIELDS

    default = FIELDS["hook_path"].default
    if path != default:
        raise HookError(f"hook_path {path} (from {config.source}) is not an executable file: the createRuntime "
                        "hook that makes the driver's ld cache would fail; write the launchers there "
                        f"(oci-gpu-hook launchers {os.path.dirname(path) or '.'}) or fix hook_path")
    import sys

    start = os.path.abspath(argv0 if argv0 is not None else sys.argv[0])
    candidate = start if os.path.basename(start) == "oci-gpu-hook" else os.path.join(os.path.dirname(start),
                                                                                    "oci-gpu-hook")
    why = _stand_in_problem(candidate)
    if why is None:
        return candidate
    raise HookError(f"hook_path {path} is not an executable file, nor can this installation's oci-gpu-hook "
                    f"stand in ({why}): the createRuntime hook that makes the driver's ld cache would fail; run "
                    f"`oci-gpu-hook launchers {os.path.dirname(default)}` (or `oci-gpu-hook install`), "
                    "or set hook_path")


def _written_paths(edits: Edits) -> list[str]:
    """The container paths the driver's links and ld cache write or read (and the directories they sit in)."""
    from oci_gpu_hook.appliers import mounts

    return [*(p for p, _ in edits.symlinks), *edits.ldcache, *edits.library_paths, mounts.CACHE, mounts.CONF_FILE,
            mounts.COMPAT_CONF_FILE, mounts.LD_SO_CONF, mounts.COMPAT_DIR]


def _resolved(root_fd: int, path: str) -> str:
    """Where ``path`` leads in the rootfs as it is now, by the one walk (FOLLOW; nothing made): its deepest
    existing directory resolved, a symlink after it followed by its text, the missing rest as written (the walk
    makes plain directories there)."""
    from oci_gpu_hook.core import inroot

    for _ in range(inroot.MAX_LINKS):
        parts = [p for p in path.split("/") if p]
        for cut in range(len(parts), -1, -1):
            try:
                fd, real = inroot.open_dir(root_fd, "/" + "/".join(parts[:cut]), inroot.FOLLOW)
            except HookError:
                continue
            break
        else:
            return path
        try:
            if cut == len(parts):
                return real
            try:
                target = os.readlink(parts[cut], dir_fd=fd)
            except OSError:  # missing (or no symlink, where the walk stopped: kept as written)
                return "/".join([real.rstrip("/"), *parts[cut:]])
        finally:
            os.close(fd)
        path = "/".join(["" if target.startswith("/") else real.rstrip("/"), target, *parts[cut + 1:]])
    return path


def _hidden(raw: dict[str, Any], edits: Edits, root_fd: int) -> str | None:
    """A mount of the spec (not a driver file's own) that would cover what is written before ``runc create``: its
    destination at or above one of those paths, each taken as written and as the walk resolves it in the rootfs
    now (an image's ``/usr/lib/x86_64-linux-gnu -> /proc/1/root/x`` leads under the procfs runc mounts first,
    which hides what a walk before it made there); else None.  Each directory is walked once (a path's last
    component is ours: a link made, a file mounted)."""
    walked: dict[str, str] = {}

    def resolved(path: str, whole: bool = False) -> str:
        directory, _, name = path.rstrip("/").rpartition("/")
        if whole:  # a directory (or a mount destination): its own last component followed too
            directory, name = path, ""
        if directory not in walked:
            walked[directory] = _resolved(root_fd, directory or "/")
        return f"{walked[directory].rstrip('/')}/{name}".rstrip("/") or "/"

    ours = {m.destination for m in edits.mounts}
    paths = _written_paths(edits)
    from oci_gpu_hook.appliers.mounts import COMPAT_DIR

    directories = {*edits.ldcache, COMPAT_DIR}
    paths += [resolved(p, p in directories) for p in paths]
    if any(".." in p.split("/") for p in paths):
        return ".."  # where it leads depends on what the runtime mounts first: the hook decides
    for mount in raw.get("mounts") or []:
        dest = mount.get("destination") if isinstance(mount, dict) else None
        if not isinstance(dest, str):
            continue
        for place in {dest, resolved(dest, whole=dest not in ours)}:
            place = "/" + "/".join(p for p in place.split("/") if p not in ("", "."))
            if place == "/" or ".." in place.split("/") or any(p.startswith(place + "/") for p in paths):
                return dest  # (a driver's own directory mount above what is written hides it too)
            if dest not in ours and place in paths:  # a driver file's own mount lands on its library's path
                return dest
    return None


def prewrite(spec: ContainerSpec, edits: Edits, bundle: str | None, cid: str = "") -> bool:
    """The driver's soname links and ld cache made in the container's root directory now, before the runtime
    creates the container (no ``ldcache`` hook then); whether they were.  The same functions as the hook's
    (:func:`oci_gpu_hook.appliers.mounts.links_and_cache`), each library's soname read from its mount's host
    file (the runtime has not mounted it yet), the rootfs walked by the one walk (FOLLOW, as runc resolves the
    mounts' destinations), the cache written by the one atomic writer.  ``root.readonly`` does not stop it: runc
    remounts the root read-only after its mounts and the createRuntime hooks, so the hook wrote that root too,
    and what is written here is what it wrote.  Not done (False: the hook stays in the spec, as before, and
    decides): ``root.path`` not a directory this process may write (a read-only mount: the hook refuses it with
    one line unless nothing is to write; relative and no bundle known), a spec mount over a path written here
    (it would hide it), a cache only the confined ldconfig can rebuild (that needs the container's mount
    namespace), or any failure."""
    root = spec.raw.get("root")
    if not isinstance(root, dict):
        return False
    path = root.get("path")
    if not isinstance(path, str) or not path or (bundle is None and not path.startswith("/")):
        return False
    rootfs = spec.root(bundle or "/")
    from oci_gpu_hook.appliers import mounts

    try:
        root_fd = os.open(rootfs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    mask = os.umask(0)  # the modes exact, as the hook makes them
    try:
        if not os.access(f"/proc/self/fd/{root_fd}", os.W_OK) or _hidden(spec.raw, edits, root_fd) is not None:
            return False
        sources = {m.destination: m.source for m in edits.mounts}
        done = mounts.links_and_cache(root_fd, rootfs, edits, in_namespace=False, sources=sources)
    except (HookError, OSError):
        return False  # nothing half-done that matters: the hook redoes it all (its links found made)
    finally:
        os.umask(mask)
        os.close(root_fd)
    if edits.ldcache:
        mounts.warn_notes(done, cid or spec.name() or "")
    return True


def apply(spec: ContainerSpec, plan: Plan, config: Config, hook_path: str | None = None, prepare: bool = True,
          bundle: str | None = None, cid: str = "", write_root: bool = False) -> bool:
    """Write ``plan`` into ``spec`` (its :attr:`~ContainerSpec.raw` document) in place; return whether anything
    changed.  With ``write_root`` (the shim and precreate, just before the runtime creates the container) the
    driver's links and ld cache are made in the rootfs now where they can be (:func:`prewrite`: ``root.path``
    absolute, or relative to ``bundle``); else (``dry-run``, ``validate``, NRI, where no root is to be written)
    its hook names ``hook_path``, by default :func:`links_hook_path` (which refuses a hook the runtime could not
    run); the by-path links are a directory prepared under ``by_path_dir`` (with ``prepare`` false, as
    ``validate`` rewrites in memory, only checked where it is already there)."""
    if not plan:
        return False
    driver = plan.edits.symlinks or plan.edits.ldcache
    raw = spec.raw
    rules = spec.device_rules(create=True)
    linux = raw["linux"]
    devices = field(linux, "devices", list, "linux.devices", create=True)
    if not all(isinstance(entry, dict) for entry in devices):
        raise HookError("config.json: linux.devices holds a non-object entry")
    if not all(isinstance(entry.get("path"), str) for entry in devices):
        raise HookError("config.json: linux.devices has an entry without a string 'path'")

    existing = {entry.get("path"): entry for entry in devices}
    new_devices = []
    for node in plan.edits.nodes:
        entry = existing.get(node.path)
        if entry is None:
            new_devices.append(node.to_oci())
        elif (entry.get("type"), entry.get("major"), entry.get("minor")) != (node.type, node.major, node.minor):
            raise HookError(
                f"config.json already lists {node.path} as {entry.get('type')} "
                f"{entry.get('major')}:{entry.get('minor')}, not {node.type} {node.major}:{node.minor}; "
                "refusing to replace it")

    missing = spec.policy().grant(plan.rules)  # a HookError where runc would refuse the list with them
    from oci_gpu_hook.trust import rootless as in_rootless_namespace

    if plan.edits.nodes and in_rootless_namespace():  # the runtime will bind-mount the host's nodes, as this user
        from oci_gpu_hook.appliers import rootless

        rootless.check_nodes(plan.edits.nodes, os.geteuid(), os.getegid())
    changed = bool(new_devices or missing)
    devices.extend(new_devices)
    rules.extend(rule.to_oci() for rule in missing)
    changed |= _add_mounts(raw, plan.edits)
    changed |= _add_by_path(raw, plan.edits, config, prepare)
    if driver and not (write_root and prepare and prewrite(spec, plan.edits, bundle, cid)):
        changed |= _add_hooks(raw, plan.edits, hook_path or links_hook_path(config))
    changed |= _add_masked(linux, plan.edits.masked)
    changed |= _add_env(raw, plan.edits.env)
    return changed


def _add_hooks(spec: dict[str, Any], edits: Edits, hook_path: str) -> bool:
    wanted = hooks(edits, hook_path, links=False)
    if not wanted:
        return False
    spec_hooks = field(spec, "hooks", dict, "hooks", create=True)
    stage = field(spec_hooks, "createRuntime", list, "hooks.createRuntime", create=True)
    changed = False
    for hook in wanted:
        if not any(isinstance(h, dict) and h.get("path") == hook["path"] and h.get("args") == hook["args"]
                   for h in stage):
            stage.append(hook)
            changed = True
    return changed


def _add_mounts(spec: dict[str, Any], edits: Edits) -> bool:
    """Read-only bind mounts of the driver's files; one already there with the same source is kept, any other
    mount at the same destination is refused (the container would get someone else's file)."""
    if not edits.mounts:
        return False
    from oci_gpu_hook.core.edits import check_container_path

    mounts = field(spec, "mounts", list, "mounts", create=True)
    existing = {m.get("destination"): m for m in mounts if isinstance(m, dict)}
    new = []
    for mount in edits.mounts:
        check_container_path(mount.destination, "mount destination")
        entry = existing.get(mount.destination)
        if entry is None:
            new.append(mount.to_oci())
        elif entry.get("source") != mount.source:
            raise HookError(f"config.json already mounts {entry.get('source')!r} at {mount.destination}, not the "
                            f"driver's {mount.source}; refusing to replace it")
    mounts.extend(new)
    return bool(new)


def _add_by_path(spec: dict[str, Any], edits: Edits, config: Config, prepare: bool) -> bool:
    """The by-path links: one read-only bind mount of their prepared directory, after every mount of the spec.
    One already there from the same directory is kept (a spec rewritten twice); any other mount at
    ``/dev/dri/by-path`` is refused."""
    if not edits.links:
        return False
    from oci_gpu_hook.appliers import bypath

    root = config.by_path_dir
    from oci_gpu_hook.trust import rootless as in_rootless_namespace

    if in_rootless_namespace():
        from oci_gpu_hook.appliers import rootless
        from oci_gpu_hook.config import FIELDS

        rootless_root = rootless.by_path_root(root, str(FIELDS["by_path_dir"].default))
        if rootless_root is None:  # nowhere of the user's to put them: the GPUs without their links
            return False
        root = rootless_root
    source = bypath.prepare(edits.links, root, prepare)
    mounts = field(spec, "mounts", list, "mounts", create=True)
    for entry in mounts:
        if isinstance(entry, dict) and entry.get("destination") == bypath.DESTINATION:
            if entry.get("source") == source:
                return False
            raise HookError(f"config.json already mounts {entry.get('source')!r} at {bypath.DESTINATION}, not "
                            f"the directory of the granted GPUs' links {source}; refusing to replace it")
    mounts.append(bypath.mount(source))
    return True


def _add_masked(linux: dict[str, Any], masked: tuple[str, ...]) -> bool:
    if not masked:
        return False
    paths = field(linux, "maskedPaths", list, "linux.maskedPaths", create=True)
    new = [m for m in masked if m not in paths]
    paths.extend(new)
    return bool(new)


def _add_env(spec: dict[str, Any], env: tuple[str, ...]) -> bool:
    if not env:
        return False
    process = field(spec, "process", dict, "process", create=True)
    current = field(process, "env", list, "process.env", create=True)
    names = {e.partition("=")[0] for e in current if isinstance(e, str)}
    new = [e for e in env if e.partition("=")[0] not in names]
    current.extend(new)
    return bool(new)


def rewrite(spec: ContainerSpec, plan: Plan, config: Config, bundle: str | None = None, cid: str = "") -> str | None:
    """The config.json text with ``plan`` written in, for the runtime to create the container from next (the shim,
    precreate: the driver's ld cache written into the root now where it can be); None when nothing changed.
    ``bundle``: the directory a relative ``root.path`` is under (the shim's)."""
    return fastjson.dumps(spec.raw) if apply(spec, plan, config, bundle=bundle, cid=cid, write_root=True) else None


def rewrite_text(text: str, config: Config, devices: str | None = None) -> tuple[str | None, Plan]:
    """Parse a config.json, apply its plan; return the new text (None if unchanged) and the plan."""
    spec = ContainerSpec.parse(text)
    plan = plan_for_spec(spec, config, devices)
    return rewrite(spec, plan, config), plan
