"""Real containers for the tests: a busybox rootfs, runc bundles, podman, and the isolation probe.

The probe (docs/hardware.md#the-isolation-probe) proves isolation without a GPU:
a node the device cgroup allows opens with ENXIO (no driver behind it here), a
denied one with EPERM.  Inside the container it lists the nodes the runtime
made, then mknods every GPU minor of the seed host on a ``dev`` tmpfs and opens
each one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tests.conftest import need as need  # the one rule (root and tools; a failure under CI=true), for cl.need

REPO = Path(__file__).resolve().parents[2]
SEED_SYSFS = REPO / "examples" / "hosts" / "seed-8x-gfx1100" / "sys"
CARD_MINORS = list(range(1, 9))  # GPU i: card(i+1), renderD(128+i)
RENDER_MINORS = list(range(128, 136))
KFD = (234, 0)

PROBE = r"""#!/bin/sh
probe() {
  out=$(head -c1 "$2" 2>&1 >/dev/null)
  case "$out" in
    *"No such device or address"*) echo "$1 ENXIO";;
    *"Operation not permitted"*) echo "$1 EPERM";;
    "") echo "$1 OPEN";;
    *) echo "$1 OTHER $out";;
  esac
}
while read -r line; do echo "cgroup $line"; done < /proc/self/cgroup
for n in /dev/dri/* /dev/kfd /dev/null; do [ -e "$n" ] && [ ! -d "$n" ] && probe "node $n" "$n"; done
for l in /dev/dri/by-path/*; do [ -L "$l" ] && echo "link $l $(readlink "$l")"; done
for m in MINORS; do
  mknod /tmp/p$m c 226 $m && probe "c 226:$m" /tmp/p$m
done
mknod /tmp/kfd c KFDMAJOR KFDMINOR && probe "c KFDMAJOR:KFDMINOR" /tmp/kfd
echo done
""".replace("MINORS", " ".join(map(str, CARD_MINORS + RENDER_MINORS))).replace(
    "KFDMAJOR", str(KFD[0])).replace("KFDMINOR", str(KFD[1]))

# `install` in tests: this checkout is an editable install, and the tests need no compiled front
INSTALL_DEV = ("--allow-editable", "--no-native")

PODMAN = ["podman", "--cgroup-manager=cgroupfs", "--events-backend=none"]
PODMAN_RUN = ["run", "--rm", "--net=none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
              "--cap-add", "MKNOD", "--tmpfs", "/tmp:rw,dev,exec"]


def hook_setup(base: Path) -> dict[str, Path]:
    """A config (the seed host, a log file) and lean launchers that read it, under ``base``."""
    config, log = base / "config.toml", base / "hook.log"
    hook_path = base / "bin" / "oci-gpu-hook"
    config.write_text(f'sysfs_root = "{SEED_SYSFS}"\nlog_file = "{log}"\nhook_path = "{hook_path}"\n'
                      f'by_path_dir = "{base / "by-path"}"\n')
    hook, runtime = write_launchers(base / "bin", config)
    return {"base": base, "config": config, "log": log, "hook": hook, "runtime": runtime,
            "rootfs": make_rootfs(base / "rootfs")}


def make_rootfs(path: Path) -> Path:
    """A busybox rootfs with the probe of the seed host at /probe.sh, and one per example host at
    /probe-<host>.sh (every DRM minor of that host, and its kfd)."""
    (path / "bin").mkdir(parents=True)
    for name in ("dev", "proc", "sys", "tmp", "etc"):
        (path / name).mkdir()
    busybox = shutil.which("busybox") or "/bin/busybox"
    shutil.copy(busybox, path / "bin" / "busybox")
    for applet in ("sh", "head", "cat", "ls", "mknod", "echo", "true", "sleep", "readlink"):
        (path / "bin" / applet).symlink_to("busybox")
    scripts = [("probe.sh", PROBE), ("wide.sh", WIDE_PROBE)]
    scripts += [(f"probe-{name}.sh", probe_script(host_model(name))) for name in HOST_NAMES]
    for name, script in scripts:
        (path / name).write_text(script)
        (path / name).chmod(0o755)
    return path


def make_bundle(path: Path, rootfs: Path, env: list[str], args: list[str] | None = None) -> Path:
    """A runc bundle running the probe, with CAP_MKNOD and a ``dev`` tmpfs on /tmp."""
    path.mkdir(parents=True)
    subprocess.run(["runc", "spec", "--bundle", str(path)], check=True)
    spec = json.loads((path / "config.json").read_text())
    spec["root"] = {"path": str(rootfs), "readonly": True}
    spec["process"]["terminal"] = False
    spec["process"]["args"] = args or ["/bin/sh", "/probe.sh"]
    spec["process"]["env"] = [*spec["process"]["env"], *env]
    for kind in ("bounding", "effective", "permitted"):
        spec["process"]["capabilities"][kind].append("CAP_MKNOD")
    spec["mounts"].append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                           "options": ["nosuid", "mode=1777"]})
    (path / "config.json").write_text(json.dumps(spec, indent=2))
    return path


def container_id() -> str:
    return f"ogh-test-{uuid.uuid4().hex[:12]}"


def _quoted(argv: list[str]) -> str:
    return " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)


def cgroup2_wrap(argv: list[str]) -> list[str]:
    """Run ``argv`` in a private mount namespace with cgroup2 over /sys/fs/cgroup: runc then uses eBPF."""
    return ["unshare", "-m", "sh", "-c", f"mount -t cgroup2 none /sys/fs/cgroup && exec {_quoted(argv)}"]


def private_cdi(argv: list[str], cdi_dir: Path) -> list[str]:
    """Run ``argv`` (podman) in a private mount namespace whose /run/cdi (= /var/run/cdi) is a tmpfs holding the
    specs of ``cdi_dir``: podman 4.3 reads specs only from /etc/cdi and /var/run/cdi, and tests never write there."""
    # A host without /run/cdi gets the (empty) mount point, and keeps it: removing it after the run would take the
    # tmpfs of a run beside this one away with it (since Linux 3.18 rmdir detaches a mount point of another mount
    # namespace), and that run's podman would find no spec (seen with two test sessions on one host).
    script = (f"mkdir -p /run/cdi && mount -t tmpfs none /run/cdi && cp {cdi_dir}/*.json /run/cdi/ && "
              f"{_quoted(argv)}; rc=$?; umount /run/cdi; exit $rc")
    return ["unshare", "-m", "sh", "-c", script]


def run(argv: list[str], *, env: dict[str, str] | None = None, stdin: str | None = None,
        timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env, input=stdin, timeout=timeout)


@dataclass
class ProbeResult:
    cgroups: dict[str, str]  # controller ('' for cgroup2) -> path, from /proc/self/cgroup
    nodes: dict[str, str]  # path in the container -> ENXIO / EPERM / OPEN
    links: dict[str, str]  # /dev/dri/by-path symlinks -> their targets
    access: dict[tuple[int, int], str]  # (major, minor) opened through a fresh mknod

    @classmethod
    def parse(cls, output: str) -> ProbeResult:
        lines = output.splitlines()
        if "done" not in lines:
            raise AssertionError(f"probe did not finish:\n{output}")
        cgroups, nodes, links, access = {}, {}, {}, {}
        for line in lines:
            if line.startswith("cgroup "):
                _, controller, path = line[7:].split(":", 2)
                cgroups[controller] = path
            elif line.startswith("node "):
                _, path, result = line.split(" ", 2)
                nodes[path] = result
            elif line.startswith("link "):
                _, path, target = line.split(" ", 2)
                links[path] = target
            elif line.startswith("c "):
                _, number, result = line.split(" ", 2)
                major, minor = number.split(":")
                access[(int(major), int(minor))] = result
        return cls(cgroups, nodes, links, access)

    @property
    def cgroup_v2(self) -> bool:
        """runc put the container in a cgroup2 group and in no v1 devices group (eBPF filter mode)."""
        return self.cgroups.get("devices", "/") == "/" and self.cgroups.get("", "/") != "/"


def expected(gpus: list[int]) -> tuple[dict[str, str], dict[tuple[int, int], str]]:
    """What the probe must show when the container holds exactly ``gpus`` of the seed host."""
    nodes = {"/dev/null": "OPEN"}
    access: dict[tuple[int, int], str] = {}
    for index in range(8):
        mine = index in gpus
        card, render = CARD_MINORS[index], RENDER_MINORS[index]
        access[(226, card)] = access[(226, render)] = "ENXIO" if mine else "EPERM"
        if mine:
            nodes[f"/dev/dri/card{card}"] = nodes[f"/dev/dri/renderD{render}"] = "ENXIO"
    access[KFD] = "ENXIO" if gpus else "EPERM"
    if gpus:
        nodes["/dev/kfd"] = "ENXIO"
    return nodes, access


def assert_isolated(output: str, gpus: list[int], *, cgroup_v2: bool | None = None) -> ProbeResult:
    result = ProbeResult.parse(output)
    nodes, access = expected(gpus)
    assert result.nodes == nodes, f"nodes in the container: {result.nodes}, expected {nodes}"
    assert result.access == access, f"device access: {result.access}, expected {access}"
    if cgroup_v2 is not None:
        assert result.cgroup_v2 == cgroup_v2, f"/proc/self/cgroup: {result.cgroups}"
    return result


def hook_env() -> dict[str, str]:
    """A clean environment for the tools under test: no OCI_GPU_HOOK_* from the caller.

    The launchers carry the test's config file (``write_launchers``); the by-path directories go to the
    session's own ``by_path_dir`` (tests/conftest.py), never the host's.
    """
    return {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "OCI_GPU_HOOK_BY_PATH_DIR": os.environ["OCI_GPU_HOOK_BY_PATH_DIR"]}


def write_launchers(directory: Path, config: Path) -> tuple[Path, Path]:
    """Lean launchers (as installed) that read ``config``."""
    subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", "launchers", str(directory), "--allow-editable",
                    "--set", f"OCI_GPU_HOOK_CONFIG={config}"], check=True, capture_output=True)
    return directory / "oci-gpu-hook", directory / "oci-gpu-runtime"


def write_hooks_dir(directory: Path, hook: Path, config: Path) -> Path:
    """The shipped hooks.d precreate file with its path pointed at ``hook``."""
    shipped = json.loads((REPO / "hooks.d" / "oci-gpu-hook-precreate.json").read_text())
    shipped["hook"]["path"] = str(hook)
    shipped["hook"]["env"] = [*shipped["hook"]["env"], f"OCI_GPU_HOOK_CONFIG={config}"]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "oci-gpu-hook-precreate.json").write_text(json.dumps(shipped))
    return directory


def host_home(home: Path, settings: str) -> dict[str, Path]:
    """A fake host's directory for container tests: config.toml (``settings``, then its hook_path and log_file),
    lean launchers, a hooks dir and the CDI specs ``cdi generate`` writes for it."""
    home.mkdir()
    config = home / "config.toml"
    hook = home / "bin" / "oci-gpu-hook"
    config.write_text(f'{settings}hook_path = "{hook}"\nlog_file = "{home / "log"}"\n'
                      f'by_path_dir = "{home / "by-path"}"\n')
    write_launchers(home / "bin", config)
    cdi = home / "cdi"
    cdi.mkdir()
    done = subprocess.run([str(hook), "cdi", "generate", "--output", str(cdi)], capture_output=True,
                          text=True, env={"PATH": os.environ["PATH"], "OCI_GPU_HOOK_CONFIG": str(config)})
    assert done.returncode == 0, done.stderr
    return {"config": config, "hook": hook, "runtime": home / "bin" / "oci-gpu-runtime",
            "hooks-dir": write_hooks_dir(home / "hooks.d", hook, config), "cdi": cdi}


T = TypeVar("T")


def at_once(make: Callable[[str], T], names: Iterable[str]) -> dict[str, T]:
    """``{name: make(name)}``, two at a time: a fixture's homes each build two native fronts (a C compiler's
    work each), which one after the other leave the second core of a 2-core CI machine idle."""
    names = list(names)
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(names, pool.map(make, names), strict=True))


SEED_PCI = ("03", "23", "43", "63", "83", "a3", "c3", "e3")


def expected_links(gpus: list[int]) -> dict[str, str]:
    """The by-path symlinks the prestart hook makes, as udev names them on the host."""
    links = {}
    for index in gpus:
        pci = f"0000:{SEED_PCI[index]}:00.0"
        links[f"/dev/dri/by-path/pci-{pci}-card"] = f"../card{CARD_MINORS[index]}"
        links[f"/dev/dri/by-path/pci-{pci}-render"] = f"../renderD{RENDER_MINORS[index]}"
    return links


def add_prestart(bundle: Path, hook: Path, times: int = 1, stage: str = "prestart") -> None:
    """List ``oci-gpu-hook prestart`` (explicit env, absolute path) in the bundle's hooks."""
    spec = json.loads((bundle / "config.json").read_text())
    entry = {"path": str(hook), "args": ["oci-gpu-hook", stage], "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
             "timeout": 30}
    spec.setdefault("hooks", {})[stage] = [entry] * times
    (bundle / "config.json").write_text(json.dumps(spec, indent=2))


def edit_spec(bundle: Path, change: Callable[[dict[str, Any]], None]) -> None:
    spec = json.loads((bundle / "config.json").read_text())
    change(spec)
    (bundle / "config.json").write_text(json.dumps(spec, indent=2))


# Devices probed by the equivalence tests: runc's defaults, other majors, block devices, every GPU minor.
WIDE_DEVICES: list[tuple[str, int, int]] = [
    *[("c", 1, m) for m in (1, 3, 5, 7, 8, 9)], ("c", 4, 0), ("c", 4, 64), ("c", 5, 0), ("c", 5, 1), ("c", 5, 2),
    ("c", 7, 0), ("c", 10, 200), ("c", 10, 229), ("c", 10, 232), ("c", 13, 64), ("c", 29, 0),
    ("c", 136, 0), ("c", 136, 7), ("c", 180, 0), ("c", 189, 0), ("c", 195, 0), ("c", 195, 255), ("c", 238, 0),
    ("b", 7, 0), ("b", 8, 0), ("b", 254, 0), ("b", 259, 0),
    *[("c", 226, m) for m in range(0, 10)], *[("c", 226, m) for m in range(128, 137)],
    ("c", 234, 0), ("c", 234, 1),
]

WIDE_PROBE = r"""#!/bin/sh
i=0
for d in DEVICES; do
  t=${d%%:*}; rest=${d#*:}; ma=${rest%%:*}; mi=${rest#*:}
  i=$((i+1)); p=/tmp/w$i
  if ! mknod $p $t $ma $mi 2>/dev/null; then echo "$d MKNOD-EPERM"; continue; fi
  out=$( (: < $p) 2>&1 )
  case "$out" in
    *"Operation not permitted"*) echo "$d EPERM";;
    "") echo "$d OPEN";;
    *) echo "$d ${out##*: }";;
  esac
done
echo done
""".replace("DEVICES", " ".join(f"{t}:{ma}:{mi}" for t, ma, mi in WIDE_DEVICES))


def parse_wide(output: str) -> dict[tuple[str, int, int], str]:
    lines = output.splitlines()
    assert "done" in lines, output
    results = {}
    for line in lines:
        if line == "done" or " " not in line:
            continue
        device, result = line.split(" ", 1)
        kind, major, minor = device.split(":")
        results[(kind, int(major), int(minor))] = result
    return results


# --- every example host: an independent model of what each request must give -----------------------

HOST_NAMES = ("seed", "shuffled", "intel-amd", "mi300x-cpx", "mi300x-dpx-dot", "intel-xe")


@dataclass
class ModelDevice:
    card: int
    render: int
    link: str  # the by-path prefix: pci-<address> or platform-<name>


@dataclass
class HostModel:
    """What a fake host has, worked out from the fixture definition (tests/helpers/fakesysfs.py) alone, by the rules
    of the vendors' toolkits, without the inventory code under test."""

    name: str
    sysfs: Path
    minors: list[int]  # every DRM minor on the host, valid or not
    kfd: tuple[int, int] | None
    devices: dict[str, list[ModelDevice]]


def host_model(name: str) -> HostModel:
    from tests.helpers.fakesysfs import EXAMPLE_DIRS, HOSTS

    host = HOSTS[name]()
    minors: list[int] = []
    amd: list[tuple[tuple[int, ...], int, ModelDevice]] = []
    intel: list[tuple[tuple[int, ...], ModelDevice]] = []
    for gpu in host.gpus:
        minors += [m for m in (gpu.card, gpu.render) if m is not None]
        minors += [m + 1 + k for m in (gpu.card, gpu.render) if m is not None for k in range(gpu.xcps)]
        if gpu.render is None or gpu.card is None:
            continue
        pci = tuple(int(x, 16) for x in gpu.pci.replace(".", ":").split(":"))
        if gpu.driver == "amdgpu" and host.kfd:
            for part in range(gpu.valid_partitions):
                link = f"pci-{gpu.pci}" if part == 0 else f"platform-amdgpu_xcp{gpu.xcp_sep}{gpu.xcp_first + part - 1}"
                amd.append((pci, gpu.render + part, ModelDevice(gpu.card + part, gpu.render + part, link)))
        elif gpu.driver in ("i915", "xe"):
            intel.append((pci, ModelDevice(gpu.card, gpu.render, f"pci-{gpu.pci}")))
    devices = {"amd": [d for _p, _r, d in sorted(amd, key=lambda x: (x[0], x[1]))],
               "intel": [d for _p, d in sorted(intel, key=lambda x: x[0])]}
    return HostModel(name, REPO / "examples" / "hosts" / EXAMPLE_DIRS[name] / "sys", sorted(minors),
                     (host.kfd_major, 0) if host.kfd and devices["amd"] else None, devices)


def probe_script(model: HostModel) -> str:
    kfd = model.kfd or (KFD[0], KFD[1])
    head = PROBE[:PROBE.index("for m in")]  # the probe function, the cgroup, node and link listings
    minors = " ".join(map(str, model.minors))
    return head + f"""for m in {minors}; do
  mknod /tmp/p$m c 226 $m && probe "c 226:$m" /tmp/p$m
done
mknod /tmp/kfd c {kfd[0]} {kfd[1]} && probe "c {kfd[0]}:{kfd[1]}" /tmp/kfd
echo done
"""


def assert_granted(output: str, model: HostModel, granted: dict[str, list[int]], *, links: bool = True,
                   cgroup_v2: bool | None = None) -> ProbeResult:
    """Exactly the devices ``granted`` (kind -> indices) are in the container and open (ENXIO); every other DRM
    minor of the host, valid or not, is refused (EPERM); /dev/kfd goes with any AMD device; by-path links."""
    result = ProbeResult.parse(output)
    mine = [model.devices[kind][i] for kind, indices in granted.items() for i in indices]
    nodes = {"/dev/null": "OPEN"}
    expect_links = {}
    for device in mine:
        nodes[f"/dev/dri/card{device.card}"] = nodes[f"/dev/dri/renderD{device.render}"] = "ENXIO"
        expect_links[f"/dev/dri/by-path/{device.link}-card"] = f"../card{device.card}"
        expect_links[f"/dev/dri/by-path/{device.link}-render"] = f"../renderD{device.render}"
    amd = bool(granted.get("amd"))
    if amd:
        nodes["/dev/kfd"] = "ENXIO"
    allowed = {m for d in mine for m in (d.card, d.render)}
    access = {(226, m): ("ENXIO" if m in allowed else "EPERM") for m in model.minors}
    kfd = model.kfd or KFD
    access[kfd] = "ENXIO" if amd else "EPERM"
    assert result.nodes == nodes, f"nodes in the container: {result.nodes}, expected {nodes}"
    assert result.access == access, f"device access: {result.access}, expected {access}"
    if links:
        assert result.links == expect_links, f"by-path links: {result.links}, expected {expect_links}"
    if cgroup_v2 is not None:
        assert result.cgroup_v2 == cgroup_v2, f"/proc/self/cgroup: {result.cgroups}"
    return result
