"""The live device cgroup applier: extend a running container's device policy by the plan.

Mode detection follows runc: cgroup2 mounted at /sys/fs/cgroup means v2.  The
container's cgroup comes from ``/proc/<pid>/cgroup`` and the mount table.

* v1: one ``TYPE MAJOR:MINOR ACCESS`` line per rule into ``devices.allow``
  (rules already granted are skipped; on a failure the lines written are
  withdrawn through ``devices.deny``).
* v2: every attached BPF_PROG_TYPE_CGROUP_DEVICE program that does not yet
  grant the plan is decoded into rules and swapped atomically
  (``BPF_F_REPLACE``) for one with the planned allow rules first and the old
  rules after them (see :mod:`devicefilter_decode`, which proves each decoding and
  each new program by executing both): the policy becomes exactly old +
  planned.  Running the hook twice changes nothing.  Every program is read,
  checked, built and loaded before the first swap; a program that cannot be
  decoded, a planned device behind a wildcard deny (see :func:`_v2_grants`),
  or any failure leaves the cgroup exactly as it was (swaps already made are
  undone).
"""

from __future__ import annotations

import os

from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from typing import Any

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
    return container_cgroup_paths(pid, cgroup_mode, mounts)[0]


def container_cgroup_paths(pid: int, cgroup_mode: str,
                           mounts: list[tuple[str, str, str, str]] | None = None) -> tuple[str, str]:
    """(the directory of ``pid``'s device cgroup, that cgroup's path in its hierarchy as ``/proc/PID/cgroup``
    names it: what systemd calls a unit's ``ControlGroup``)."""
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
                return os.path.join(point, path[len(root.rstrip("/")):].lstrip("/")), path
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
    """Swap every attached device program that does not grant ``rules`` yet for old + ``rules``: all of them,
    or (on any failure) none; return what was done."""
    from oci_gpu_hook.appliers import bpf, devicefilter, devicefilter_decode

    try:
        cgroup_fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        raise HookError(f"cannot open cgroup {cgroup_dir}: {err.strerror}") from None
    fds = [cgroup_fd]
    try:
        flags, ids = bpf.prog_query(cgroup_fd)
        if not ids:
            return "no device program attached: the cgroup allows every device already"
        # 1. Read, decode, check and build every replacement before anything on the cgroup changes.
        done, planned = [], []
        for prog_id in ids:
            old_fd = bpf.prog_fd_by_id(prog_id)
            fds.append(old_fd)
            info = bpf.prog_info(old_fd)
            where = f"eBPF program {prog_id} ('{info.name}') on {cgroup_dir}"
            try:
                old_rules = devicefilter_decode.decode(info.insns)
                if _v2_grants(old_rules, rules, where):
                    done.append(f"program {prog_id} already grants the plan")
                    continue
                new = devicefilter_decode.extend(info.insns, old_rules, rules)
            except devicefilter_decode.NotDecodable as err:
                raise HookError(f"cannot read the device policy of {where}: {err}; "
                                "every program was left in place") from None
            planned.append((prog_id, old_fd, new))
        # 2. Load them all (the verifier may still refuse one).
        loaded = []
        for prog_id, old_fd, new in planned:
            new_fd = bpf.prog_load(new, devicefilter.PROGRAM_NAME)
            fds.append(new_fd)
            loaded.append((prog_id, old_fd, new_fd))
        # 3. Swap them; on a failure, put back the ones already swapped.
        swapped: list[tuple[int, int]] = []
        try:
            for prog_id, old_fd, new_fd in loaded:
                _v2_swap(bpf, cgroup_fd, flags, new_fd, old_fd)
                swapped.append((old_fd, new_fd))
                done.append(f"program {prog_id} replaced by {bpf.prog_info(new_fd).id}")
        except OSError:
            for old_fd, new_fd in reversed(swapped):
                try:
                    _v2_swap(bpf, cgroup_fd, flags, old_fd, new_fd)
                except OSError:
                    pass
            raise
        return "; ".join(done)
    except OSError as err:
        raise HookError(f"cannot extend the eBPF device filter of {cgroup_dir}: {err} "
                        "(the cgroup keeps its old programs)") from None
    finally:
        for fd in fds:
            os.close(fd)


def _v2_swap(bpf: Any, cgroup_fd: int, flags: int, new_fd: int, old_fd: int) -> None:
    if flags & bpf.F_ALLOW_MULTI:
        bpf.prog_attach(cgroup_fd, new_fd, flags | bpf.F_REPLACE, old_fd)  # atomic: the old one goes
    else:
        bpf.prog_attach(cgroup_fd, new_fd, flags)  # a single program is replaced by attaching


def _v2_grants(old: list[Rule], plan: tuple[Rule, ...], where: str) -> bool:
    """Does the decoded program ``old`` (first match, ending with its catch-all default) grant the plan already?

    A HookError when the plan would be granted *over an operator's deny*: a planned rule that ``old`` does
    not grant yet is covered by a deny rule of ``old`` other than its final default that is a wildcard (it
    covers other devices too) and shares an access letter with it.  That is runc's emulator's refusal to punch
    a hole in a wildcard exception (``Policy.apply``), which the spec-rewrite paths get for the same config;
    on the lists runc generates (exceptions, then the default) the two conditions are the same.  A deny of
    exactly the planned device is overridden by the planned allow rule, as the emulator does it.  Only over
    the default deny (runc's epilogue) and such exact denies is prepending allow rules the right move."""
    from oci_gpu_hook.core.rules import first_match, grants

    def allows(kind: str, major: int, minor: int, access: str) -> bool:
        return first_match(old, kind, major, minor, access)

    missing = [rule for rule in plan if not grants(allows, rule)]
    for rule in missing:
        for deny in old[:-1]:
            if (not deny.allow and deny.wildcard and deny.covers(rule.type, rule.major, rule.minor)  # type: ignore[arg-type]
                    and set(deny.access) & set(rule.access)):
                raise HookError(f"the device policy of {where} has the rule 'deny {deny.v1_line()}', which covers "
                                f"the planned '{rule.v1_line()}': refusing to punch a hole in a wildcard deny "
                                "(runc refuses that config too); allow the device in the container's config or "
                                "narrow the deny")
    return not missing
