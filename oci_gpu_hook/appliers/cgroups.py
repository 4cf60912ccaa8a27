"""The live device cgroup applier: extend a running container's device policy by the plan.

Mode detection follows runc: cgroup2 mounted at /sys/fs/cgroup means v2.  The
container's cgroup comes from ``/proc/<pid>/cgroup`` and the mount table.

* v1: one ``TYPE MAJOR:MINOR ACCESS`` line per rule into ``devices.allow``
  (rules already granted are skipped; on a failure the lines written are
  withdrawn through ``devices.deny``).
* v2: every attached BPF_PROG_TYPE_CGROUP_DEVICE program that does not yet
  grant the plan is decoded into rules and swapped atomically
  (``BPF_F_REPLACE``) for one with the planned allow rules first and the old
  rules after them (see :mod:`devicefilter`): the policy becomes exactly old +
  planned.  Running the hook twice changes nothing.  A program that cannot be
  decoded is not replaced (the hook fails and says so); any failure leaves the
  old programs attached.
"""

from __future__ import annotations

import os

from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms per container start

if TYPE_CHECKING:
    from oci_gpu_hook.core.devices import Rule
    from oci_gpu_hook.core.rules import Policy

CGROUP_ROOT = "/sys/fs/cgroup"


def _mounts() -> list[tuple[str, str, str, str]]:
    """(mount root, mount point, fs type, super options) from /proc/self/mountinfo."""
    mounts = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            fields = line.split()
            sep = fields.index("-")
            mounts.append((_unescape(fields[3]), _unescape(fields[4]), fields[sep + 1], fields[sep + 3]))
    return mounts


def _unescape(text: str) -> str:
    return text.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def mode(mounts: list[tuple[str, str, str, str]] | None = None) -> str:
    """'v2' when cgroup2 is what is mounted at /sys/fs/cgroup (the last mount there wins), else 'v1'."""
    found = "v1"
    for _root, point, fstype, _opts in mounts if mounts is not None else _mounts():
        if point == CGROUP_ROOT:
            found = "v2" if fstype == "cgroup2" else "v1"
    return found


def container_cgroup(pid: int, cgroup_mode: str, mounts: list[tuple[str, str, str, str]] | None = None) -> str:
    """The directory of ``pid``'s device cgroup (v1 devices hierarchy, or its cgroup2 group)."""
    mounts = _mounts() if mounts is None else mounts
    try:
        with open(f"/proc/{pid}/cgroup") as handle:
            lines = handle.read().splitlines()
    except OSError as err:
        raise HookError(f"cannot read /proc/{pid}/cgroup: {err.strerror} (is the container still there?)") from None
    for line in lines:
        _hid, controllers, path = line.split(":", 2)
        wanted = controllers == "" if cgroup_mode == "v2" else "devices" in controllers.split(",")
        if not wanted:
            continue
        for root, point, fstype, opts in reversed(mounts):
            fits = fstype == "cgroup2" if cgroup_mode == "v2" else (
                fstype == "cgroup" and "devices" in opts.split(","))
            if fits and (cgroup_mode == "v1" or point == CGROUP_ROOT or point.startswith(CGROUP_ROOT)) \
                    and (path == root or path.startswith(root.rstrip("/") + "/")):
                return os.path.join(point, path[len(root.rstrip("/")):].lstrip("/"))
        raise HookError(f"process {pid} is in {cgroup_mode} cgroup {path}, but no such hierarchy is mounted here")
    raise HookError(f"process {pid} has no {'cgroup2' if cgroup_mode == 'v2' else 'devices'} cgroup "
                    "(rootless? without a device cgroup there is no isolation to extend)")


# --- cgroup v1 ----------------------------------------------------------------------------------

def v1_list(cgroup_dir: str) -> list[Rule]:
    """``devices.list`` as rules (the allowed exceptions; ``a *:* rwm`` = everything)."""
    from oci_gpu_hook.core.devices import Rule

    with open(os.path.join(cgroup_dir, "devices.list")) as handle:
        return [Rule.from_v1_line(True, line) for line in handle if line.strip()]


def v1_grant(cgroup_dir: str, rules: tuple[Rule, ...], spec_policy: Policy) -> list[str]:
    """Write the missing allow lines; return them.

    ``devices.list`` is exact in default-deny mode (runc's normal case), but in default-allow mode it shows
    ``a *:* rwm`` alone and hides every deny exception: what is missing is then taken from the container's
    own rules (``spec_policy``, runc's reading of ``linux.resources.devices``), and a cgroup whose mode
    disagrees with them is refused.  In default-deny mode the result is read back: a grant the kernel did
    not take is an error, never reported as done.
    """
    from oci_gpu_hook.core.rules import Policy, grants

    current = Policy.of(v1_list(cgroup_dir))
    if current.default_allow != spec_policy.default_allow:
        raise HookError(f"the devices cgroup {cgroup_dir} is {'allow' if current.default_allow else 'deny'}-by-default "
                        "but the container's config.json says otherwise; refusing to guess its policy")
    known = spec_policy if current.default_allow else current
    missing = [r for r in rules if not grants(known.allows, r)]
    written: list[str] = []
    try:
        for rule in missing:
            _write_line(os.path.join(cgroup_dir, "devices.allow"), rule.v1_line())
            written.append(rule.v1_line())
    except OSError as err:
        for line in written:
            try:
                _write_line(os.path.join(cgroup_dir, "devices.deny"), line)
            except OSError:
                pass
        raise HookError(f"cannot allow devices in {cgroup_dir}: {err.strerror}") from None
    if not current.default_allow:
        after = Policy.of(v1_list(cgroup_dir))
        refused = [r.v1_line() for r in rules if not grants(after.allows, r)]
        if refused:
            raise HookError(f"the kernel did not grant {', '.join(refused)} in {cgroup_dir} "
                            "(does a parent cgroup deny it?)")
    return written


def _write_line(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


# --- cgroup v2 ----------------------------------------------------------------------------------

def v2_grant(cgroup_dir: str, rules: tuple[Rule, ...]) -> str:
    """Swap each attached device program for old + ``rules``; return what was done."""
    from oci_gpu_hook.appliers import bpf, devicefilter
    from oci_gpu_hook.core.rules import first_match, grants

    try:
        cgroup_fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        raise HookError(f"cannot open cgroup {cgroup_dir}: {err.strerror}") from None
    fds = [cgroup_fd]
    swapped: list[tuple[int, int, int]] = []  # (new fd, old fd, flags) to undo on failure
    try:
        flags, ids = bpf.prog_query(cgroup_fd)
        if not ids:
            return "no device program attached: the cgroup allows every device already"
        done = []
        for prog_id in ids:
            old_fd = bpf.prog_fd_by_id(prog_id)
            fds.append(old_fd)
            info = bpf.prog_info(old_fd)
            try:
                old_rules = devicefilter.decode(info.insns)
            except devicefilter.NotDecodable as err:
                raise HookError(f"cannot read the device policy of eBPF program {prog_id} "
                                f"('{info.name}') on {cgroup_dir}: {err}; it was left in place") from None
            def old_policy(kind: str, major: int, minor: int, access: str, rules: list[Rule] = old_rules) -> bool:
                return first_match(rules, kind, major, minor, access)

            if all(grants(old_policy, r) for r in rules):
                done.append(f"program {prog_id} already grants the plan")
                continue
            new_fd = bpf.prog_load(devicefilter.build([*rules, *old_rules]), devicefilter.PROGRAM_NAME)
            fds.append(new_fd)
            if flags & bpf.F_ALLOW_MULTI:
                bpf.prog_attach(cgroup_fd, new_fd, flags | bpf.F_REPLACE, old_fd)
            else:
                bpf.prog_attach(cgroup_fd, new_fd, flags)  # a single program is replaced by attaching
            swapped.append((new_fd, old_fd, flags))
            done.append(f"program {prog_id} replaced by {bpf.prog_info(new_fd).id}")
        return "; ".join(done)
    except OSError as err:
        for new_fd, old_fd, flags in reversed(swapped):
            try:
                if flags & bpf.F_ALLOW_MULTI:
                    bpf.prog_attach(cgroup_fd, old_fd, flags | bpf.F_REPLACE, new_fd)
                else:
                    bpf.prog_attach(cgroup_fd, old_fd, flags)
            except OSError:
                pass
        raise HookError(f"cannot extend the eBPF device filter of {cgroup_dir}: {err} "
                        "(the cgroup keeps its old program)") from None
    finally:
        for fd in fds:
            os.close(fd)
