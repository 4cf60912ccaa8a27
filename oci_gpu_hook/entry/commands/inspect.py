"""``oci-gpu-hook inspect``: what a container's device cgroup (v1 or v2) lets its processes open."""

from __future__ import annotations

import os

from oci_gpu_hook.cliparse import parser as _parser
from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from collections.abc import Callable

    from oci_gpu_hook.config import Config


def device_names(config: Config) -> dict[tuple[str, int, int], str]:
    """What each GPU node number is, to annotate rules (empty when sysfs cannot be read); an Unhealthy GPU's with
    its health and reason (one read, as ``list`` shows it)."""
    from oci_gpu_hook.cluster.health import one_sample
    from oci_gpu_hook.inventory import scan_host

    try:
        inventory = scan_host(config)
    except HookError:
        return {}
    verdicts = one_sample(config, inventory)
    names = {}
    for device in inventory.all_devices:
        part = "" if device.partition is None else f" partition {device.partition}"
        verdict = verdicts.get(device.pci_address)
        health = f"; {verdict.status_line}" if verdict is not None and not verdict.healthy else ""
        for node in device.all_nodes:
            if device.partition is None or node.number not in names:  # a part never renames its GPU's node
                names[node.number] = (f"{device.kind} {device.label} {node.path} ({device.pci_address}{part})"
                                      f"{health}")
    for kind, found in inventory.kinds.items():
        for node in found.shared:
            names[node.number] = f"{node.path} (all {kind} GPUs)"
    return names


def run(args: list[str], config: Config) -> int:
    parser = _parser("inspect", "Show what a container's device cgroup lets its processes open.")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--pid", type=int, help="a process of the container")
    target.add_argument("--cgroup", metavar="DIR", help="a cgroup directory (v1 devices or cgroup2)")
    opts = parser.parse_args(args)
    from oci_gpu_hook.appliers import cgroups

    if opts.pid is not None:
        mode = cgroups.mode()
        directory = cgroups.container_cgroup(opts.pid, mode)
    else:
        directory = os.path.abspath(opts.cgroup)
        if os.path.exists(os.path.join(directory, "devices.list")):
            mode = "v1"
        elif os.path.exists(os.path.join(directory, "cgroup.controllers")):
            mode = "v2"
        else:
            raise HookError(f"{directory} is neither a cgroup v1 devices group nor a cgroup2 group")
    names = device_names(config)
    from oci_gpu_hook.install.kubelet import env_requests_line

    pods = env_requests_line()
    if pods and pods.startswith("warning:"):  # why a pod may hold GPUs the scheduler never gave it
        print(pods)
    if opts.pid is not None:
        for line in rootless_view(opts.pid, names):
            print(line)

    def show(rule: object) -> str:
        from oci_gpu_hook.core.devices import Rule

        assert isinstance(rule, Rule)
        line = f"  {'allow' if rule.allow else 'deny '} {rule.v1_line()}"
        name = names.get((rule.type, rule.major, rule.minor)) if rule.major is not None else None
        return f"{line:<28}  {name}" if name else line

    if mode == "v1":
        print(f"cgroup v1 devices: {directory}")
        try:
            rules = cgroups.v1_list(directory)
        except OSError as err:
            raise HookError(f"cannot read {directory}/devices.list: {err.strerror}") from None
        from oci_gpu_hook.core.rules import Policy

        everything = Policy.of(rules).default_allow  # devices.list shows "a *:* rwm" alone in default-allow mode
        print("  every device is allowed (a *:* rwm), except what devices.deny took away (v1 does not show it)"
              if everything else "\n".join(show(r) for r in rules))
        if not everything:
            print("  everything else is denied")
            print_unit_check(directory, rules, show)
        return 0
    from oci_gpu_hook.appliers import bpf, devicefilter_decode

    print(f"cgroup v2: {directory}")
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            flags, ids = bpf.prog_query(fd)
        finally:
            os.close(fd)
    except OSError as err:
        raise HookError(f"cannot query the eBPF programs of {directory}: {err.strerror}") from None
    if not ids:
        print("  no device program attached: every device is allowed (unless an ancestor restricts it)")
    allowed: list[object] = []
    kinds = [name for bit, name in ((bpf.F_ALLOW_MULTI, "multi"), (bpf.F_ALLOW_OVERRIDE, "override")) if flags & bit]
    for prog_id in ids:
        prog_fd = bpf.prog_fd_by_id(prog_id)
        try:
            info = bpf.prog_info(prog_fd)
        finally:
            os.close(prog_fd)
        print(f"program {prog_id} '{info.name}' ({', '.join(kinds) or 'exclusive'}; first match wins):")
        try:
            decoded = devicefilter_decode.decode(info.insns)
            print("\n".join(show(r) for r in decoded))
            allowed += decoded
        except devicefilter_decode.NotDecodable as err:
            print(f"  cannot decode this program ({err}); only runc's format and this project's are known")
    if len(ids) > 1:
        print("an access is allowed only if every program allows it")
    if ids:
        print_unit_check(directory, allowed, show)
    return 0


def rootless_view(pid: int, names: dict[tuple[str, int, int], str]) -> list[str]:
    """For a process in a user namespace that does not map the host's root (a rootless container): what isolates
    it (the device nodes in its /dev, bind-mounted from the host, each opened as its user may; no device cgroup of
    its own) and those nodes.  Nothing for any other process."""
    import stat

    from oci_gpu_hook.trust import id_ranges, parent_id

    if not os.access(f"/proc/{pid}/uid_map", os.R_OK):  # id_ranges reads an unreadable map as the host's own
        raise HookError(f"cannot read the user namespace of process {pid}: no such process, or not readable")
    ranges = id_ranges("uid", str(pid))
    if any(out == 0 for _inside, out, _count in ranges):
        return []
    user = parent_id(0, ranges) if ranges else None  # its root on the host, as trust maps ids
    lines = [f"rootless: process {pid} runs in a user namespace that maps its root to host uid {user}: no device "
             "cgroup of its own isolates it; it can open the host's nodes bind-mounted into its /dev, as that uid "
             "may (the rules below are its runtime's, not a grant):"]
    found = []
    for where in ("dev", "dev/dri"):
        try:
            entries = sorted(os.scandir(f"/proc/{pid}/root/{where}"), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            number = ("c", os.major(st.st_rdev), os.minor(st.st_rdev))
            if stat.S_ISCHR(st.st_mode) and number in names:
                found.append(f"  /{where}/{entry.name}  c {number[1]}:{number[2]}  {names[number]}")
    return [*lines, *(found or ["  no GPU node in its /dev"])]


def print_unit_check(directory: str, allowed: list[object], show: Callable[[object], str]) -> None:
    """Under systemd, the devices the cgroup allows now that its unit's DeviceAllow= lacks: the next
    ``systemctl daemon-reload`` (or ``daemon-reexec``, or a ``set-property`` on the unit) takes them away."""
    from oci_gpu_hook.appliers import systemd_unit
    from oci_gpu_hook.core.devices import Rule

    unit = systemd_unit.unit_of(directory)
    if unit is None:
        return
    try:
        entries = systemd_unit.device_allow(unit)
    except systemd_unit.BusError as err:
        print(f"systemd unit {unit}: cannot read its DeviceAllow ({err})")
        return
    numbers, majors = listed_devices(entries)
    exact = [r for r in allowed if isinstance(r, Rule) and r.allow and r.type == "c" and not r.wildcard]
    lacking = list(dict.fromkeys(r for r in exact if (r.major, r.minor) not in numbers and r.major not in majors))
    if not lacking:
        print(f"systemd unit {unit}: its DeviceAllow has every device allowed here: a daemon-reload keeps them")
        return
    print(f"systemd unit {unit}: its DeviceAllow lacks {len(lacking)} device(s) allowed here; the next "
          "daemon-reload, daemon-reexec or set-property on it takes them away (docs/troubleshooting.md):")
    print("\n".join(show(r) for r in lacking))


def listed_devices(entries: list[tuple[str, str]]) -> tuple[set[tuple[int, int]], set[int]]:
    """The char devices a DeviceAllow= list names, as systemd reads it: ``/dev/char/MAJ:MIN`` by its numbers,
    another path by what it is now, ``char-NAME`` (a glob) as every major /proc/devices gives that name."""
    import fnmatch
    import stat

    numbers: set[tuple[int, int]] = set()
    names: set[str] = set()
    for path, _access in entries:
        if path.startswith("/dev/char/"):
            major, _sep, minor = path[len("/dev/char/"):].partition(":")
            if major.isdigit() and minor.isdigit():
                numbers.add((int(major), int(minor)))
        elif path.startswith("char-"):
            names.add(path[len("char-"):])
        elif path.startswith("/"):
            try:
                st = os.stat(path)
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode):
                numbers.add((os.major(st.st_rdev), os.minor(st.st_rdev)))
    majors: set[int] = set()
    try:
        with open("/proc/devices") as handle:
            section = ""
            for line in handle:
                if line.endswith(":\n"):
                    section = line.strip()
                    continue
                fields = line.split()
                if section == "Character devices:" and len(fields) == 2 and fields[0].isdigit() and \
                        any(fnmatch.fnmatchcase(fields[1], name) for name in names):
                    majors.add(int(fields[0]))
    except OSError:
        pass
    return numbers, majors

