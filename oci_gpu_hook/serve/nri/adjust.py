"""A container's plan as NRI's ContainerAdjustment: the same request, rules and refusals as every other path.

The NRI container (its env, annotations, device nodes, device cgroup rules, mounts and hooks, as the runtime
describes it in CreateContainer) becomes an OCI-like document (:func:`oci_view`); :func:`oci_gpu_hook.plan.
plan_for_spec` plans it and the spec-rewrite applier (:func:`oci_gpu_hook.appliers.ocispec.apply`) writes the plan
into that document, with every check it makes there (a node the container already lists as another device, a
grant runc's device rules would refuse, a mount at a destination taken by another source, the by-path directory
prepared and checked under ``by_path_dir``).  The applier only appends, so what it appended is the adjustment
(:func:`adjustment`):

- new ``linux.devices`` entries: ``adjust.linux.devices`` (path, type, major, minor, file mode, uid, gid);
- new ``linux.resources.devices`` rules: ``adjust.linux.resources.devices`` (the runtime also adds an ``rw``
  allow rule of its own for each device node it adds: :func:`check_config` refuses a ``cgroup_access`` narrower
  than that, which NRI could not honour);
- new mounts (the driver's files, the ``/dev/dri/by-path`` directory): ``adjust.mounts``;
- new ``createRuntime`` hooks (a driver's ld cache): ``adjust.hooks.create_runtime``;
- new env entries: ``adjust.env``;
- ``linux.maskedPaths`` (``mask_other_gpus``): NRI's adjustment has no masked paths, so each becomes the mount
  runc itself makes for a masked path (:func:`mask_mount`): a read-only, empty tmpfs over a directory, ``/dev/null``
  bound read-only over a file; a path the host does not have is left out, as runc leaves it.

A container that asks for nothing is answered at once: no sysfs read, an empty adjustment.
"""

from __future__ import annotations

import os

from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from typing import Any

    from oci_gpu_hook.config import Config
    from oci_gpu_hook.plan import Plan
    from oci_gpu_hook.serve.nri import api_pb2

RUNTIME_DEVICE_ACCESS = "rw"  # what NRI's runtime side grants each device node it adds (LinuxDevice.AccessString)
MASK_DIR_OPTIONS = ("ro", "nosuid", "nodev", "noexec")
MASK_FILE_OPTIONS = ("bind", "ro", "nosuid", "nodev", "noexec")


def check_config(config: Config) -> None:
    """What this configuration asks that NRI cannot give, refused before the plugin registers."""
    if not set(RUNTIME_DEVICE_ACCESS) <= set(config.cgroup_access):
        raise HookError(f"cgroup_access {config.cgroup_access!r} (from {config.source}) cannot be honoured by NRI: "
                        f"the runtime grants every device node a plugin adds {RUNTIME_DEVICE_ACCESS!r} itself; set "
                        "cgroup_access to rw or rwm, or use the RuntimeClass shim")


def warm_up(config: Config) -> None:
    """Import what planning a request takes and read the node's GPUs once, before the plugin registers: the
    first container that asks is then answered like the next one, not after a cold import (on a real containerd
    2.1.9 on the project's loaded 2-core test machine the first answer took 86 ms, the next ones 6-7 ms).  Nothing
    is written.  GPUs that cannot be read now are no reason to stop: each request reads them again and refuses on
    its own, with its one line."""
    from oci_gpu_hook import oci_spec, plan, request, trust  # noqa: F401 (imported for their cost, now)
    from oci_gpu_hook.appliers import bypath, ocispec  # noqa: F401
    from oci_gpu_hook.core import rules  # noqa: F401
    from oci_gpu_hook.inventory import scan_host

    try:
        scan_host(config)
    except Exception:  # a HookError or OSError here is the first request's to report
        return


def oci_view(container: api_pb2.Container) -> dict[str, Any]:
    """The parts of an OCI config.json that planning and the spec rewrite read, from the NRI container."""
    linux = container.linux
    devices = []
    for device in linux.devices:
        entry: dict[str, Any] = {"path": device.path, "type": device.type, "major": device.major,
                                 "minor": device.minor}
        if device.HasField("file_mode"):
            entry["fileMode"] = device.file_mode.value
        if device.HasField("uid"):
            entry["uid"] = device.uid.value
        if device.HasField("gid"):
            entry["gid"] = device.gid.value
        devices.append(entry)
    rules = []
    for rule in linux.resources.devices:
        entry = {"allow": rule.allow, "access": rule.access}
        if rule.type:
            entry["type"] = rule.type
        if rule.HasField("major"):
            entry["major"] = rule.major.value
        if rule.HasField("minor"):
            entry["minor"] = rule.minor.value
        rules.append(entry)
    hooks = [{"path": h.path, "args": list(h.args)} for h in container.hooks.create_runtime]
    return {"process": {"env": list(container.env)},
            "annotations": dict(container.annotations),
            "mounts": [{"destination": m.destination, "type": m.type, "source": m.source,
                        "options": list(m.options)} for m in container.mounts],
            "hooks": {"createRuntime": hooks},
            "linux": {"devices": devices, "resources": {"devices": rules}}}


def mask_mount(path: str, config: Config) -> dict[str, Any] | None:
    """The mount that masks the container path ``path`` (``/sys/...`` or ``/proc/...``) as runc masks it, judged
    by what the host has there (``sysfs_root``, ``proc_root``); None when the host has nothing there."""
    for prefix, root in (("/sys/", config.sysfs_root), ("/proc/", config.proc_root)):
        if path.startswith(prefix):
            host = os.path.join(root, path[len(prefix):])
            break
    else:
        raise HookError(f"refusing to mask {path!r}: only paths under /sys and /proc are masked")
    try:
        st = os.stat(host)
    except OSError:
        return None
    if os.path.isdir(host) and (st.st_mode & 0o170000) == 0o040000:
        return {"destination": path, "type": "tmpfs", "source": "tmpfs", "options": list(MASK_DIR_OPTIONS)}
    return {"destination": path, "type": "bind", "source": "/dev/null", "options": list(MASK_FILE_OPTIONS)}


def plan_container(container: api_pb2.Container, config: Config) -> tuple[Plan, dict[str, Any], dict[str, Any]]:
    """The plan for the NRI container, and its OCI view before and after the spec rewrite (the same document
    when the plan is empty)."""
    import copy

    from oci_gpu_hook.appliers.ocispec import apply
    from oci_gpu_hook.oci_spec import ContainerSpec
    from oci_gpu_hook.plan import plan_for_spec

    before = oci_view(container)
    spec = ContainerSpec(copy.deepcopy(before))
    plan = plan_for_spec(spec, config)
    if plan:
        apply(spec, plan, config)
    return plan, before, spec.raw


def adjustment(before: dict[str, Any], after: dict[str, Any], config: Config) -> api_pb2.ContainerAdjustment:
    """What the spec rewrite appended to ``before`` (giving ``after``), as a ContainerAdjustment."""
    from oci_gpu_hook.serve.nri import api_pb2

    adjust = api_pb2.ContainerAdjustment()

    def added(document: dict[str, Any], *path: str) -> list[Any]:
        old: Any = before
        new: Any = document
        for key in path:
            old = old.get(key) or {} if isinstance(old, dict) else {}
            new = new.get(key) or {} if isinstance(new, dict) else {}
        old_list = old if isinstance(old, list) else []
        new_list = new if isinstance(new, list) else []
        if new_list[:len(old_list)] != old_list:
            raise HookError(f"internal error: the spec rewrite changed {'.'.join(path)} instead of appending to it")
        return new_list[len(old_list):]

    for entry in added(after, "linux", "devices"):
        device = adjust.linux.devices.add(path=entry["path"], type=entry["type"], major=entry["major"],
                                          minor=entry["minor"])
        if "fileMode" in entry:
            device.file_mode.value = entry["fileMode"]
        if "uid" in entry:
            device.uid.value = entry["uid"]
        if "gid" in entry:
            device.gid.value = entry["gid"]
    for entry in added(after, "linux", "resources", "devices"):
        rule = adjust.linux.resources.devices.add(allow=bool(entry.get("allow")), type=entry.get("type", ""),
                                                  access=entry.get("access", ""))
        if entry.get("major") is not None:
            rule.major.value = entry["major"]
        if entry.get("minor") is not None:
            rule.minor.value = entry["minor"]
    for entry in added(after, "mounts"):
        adjust.mounts.add(destination=entry["destination"], type=entry["type"], source=entry["source"],
                          options=entry.get("options", []))
    for path in added(after, "linux", "maskedPaths"):
        mount = mask_mount(path, config)
        if mount is not None:
            adjust.mounts.add(**mount)
    for entry in added(after, "hooks", "createRuntime"):
        hook = adjust.hooks.create_runtime.add(path=entry["path"], args=entry.get("args", []),
                                               env=entry.get("env", []))
        if entry.get("timeout") is not None:
            hook.timeout.value = entry["timeout"]
    for entry in added(after, "process", "env"):
        key, _, value = entry.partition("=")
        adjust.env.add(key=key, value=value)
    return adjust


def create_container(container: api_pb2.Container, config: Config) -> tuple[api_pb2.ContainerAdjustment | None,
                                                                            Plan]:
    """The adjustment for a container being created (None: it asked for nothing, or its request grants
    nothing), and its plan; a HookError (one line) refuses it."""
    plan, before, after = plan_container(container, config)
    if not plan:
        return None, plan
    return adjustment(before, after, config), plan
