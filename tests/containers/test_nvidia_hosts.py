"""The NVIDIA example hosts through every applier, in real containers: exactly the devices asked for, the driver's
files read-only, and nothing of anyone else.

Hosts (examples/hosts/, built by tests/helpers/fakesysfs.py and tests/helpers/fakenvidia.py): 4 x H100 whose device
minors do not follow PCI order; 2 x H100 with MIG instances on GPU 0 and nvidia-drm loaded; two AMD and two NVIDIA
GPUs side by side. Appliers: dry-run + runc and the runtime shim in cgroup v1 and v2, the live prestart hook in v1
and v2, podman with the precreate hook, podman with the CDI specs alone. The probe opens every ``c 195:*`` minor,
the host's nvidia-caps minors (config, monitor, every MIG instance's, an unused one), nvidia-uvm's, every DRM minor
and /dev/kfd (ENXIO = allowed, EPERM = refused); it reads the container's mount table for the driver's files, tries
to open them for writing, reads their soname links and ld cache, and runs the fake ``nvidia-smi -L``. What must come
out is computed from the fixture definitions by the toolkit's rules, not by the inventory under test."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import containerlib as cl
from tests.helpers.fakenvidia import mig_minor
from tests.helpers.fakesysfs import EXAMPLE_DIRS, HOSTS

pytestmark = pytest.mark.containers
REPO = Path(__file__).resolve().parents[2]
ALL_CAPS = frozenset({"compute", "utility", "graphics", "video", "display", "ngx"})
LIB = "/usr/lib/x86_64-linux-gnu"


@dataclass
class NvGpu:
    pci: str
    minor: int
    uuid: str
    drm: tuple[int, int] | None  # card, render (nvidia-drm loaded)


@dataclass
class NvModel:
    """What an NVIDIA example host has, from its fixture definition alone."""

    name: str
    base: Path
    version: str
    gpus: list[NvGpu]  # PCI order = index order
    migs: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # "G:M" -> (GPU index, gi minor, ci minor)
    caps_major: int = 236
    uvm_major: int = 510
    modeset: bool = True
    drm_minors: list[int] = field(default_factory=list)
    caps_minors: list[int] = field(default_factory=list)
    amd: list[cl.ModelDevice] = field(default_factory=list)
    kfd: tuple[int, int] = cl.KFD


def model(name: str) -> NvModel:
    host = HOSTS[name]()
    gpus = sorted((g for g in host.nvidia), key=lambda g: tuple(int(x, 16) for x in g.pci.replace(".", ":").split(":")))
    nv = NvModel(name, REPO / "examples" / "hosts" / EXAMPLE_DIRS[name], host.driver_version,
                 [NvGpu(g.pci, g.minor or 0, g.uuid, (g.card, g.render) if host.nvidia_drm and g.card is not None
                        and g.render is not None else None) for g in gpus],
                 caps_major=host.caps_major, uvm_major=host.uvm_major, modeset=host.nvidia_modeset)
    caps = {1, 2}
    for index, gpu in enumerate(gpus):
        assert gpu.minor is not None
        caps.add(mig_minor(gpu.minor, 0))  # an instance that does not exist
        instances = sorted((gi, ci) for gi, cis in gpu.migs for ci in cis)
        for position, (gi, ci) in enumerate(instances):
            nv.migs[f"{index}:{position}"] = (index, mig_minor(gpu.minor, gi), mig_minor(gpu.minor, gi, ci))
            caps |= {mig_minor(gpu.minor, gi), mig_minor(gpu.minor, gi, ci)}
    nv.caps_minors = sorted(caps)
    amd = cl.host_model(name)
    nv.drm_minors, nv.amd = amd.minors, amd.devices["amd"]
    nv.kfd = amd.kfd or cl.KFD
    return nv


def files(nv: NvModel) -> dict[str, str]:
    """Representative driver files -> the capability that gives them."""
    v = nv.version
    return {f"{LIB}/libcuda.so.{v}": "compute", f"{LIB}/libnvidia-ml.so.{v}": "utility",
            f"{LIB}/libGLX_nvidia.so.{v}": "graphics", f"{LIB}/libnvcuvid.so.{v}": "video",
            "/usr/bin/nvidia-smi": "utility", "/usr/bin/nvidia-cuda-mps-control": "compute",
            f"/lib/firmware/nvidia/{v}": "", "/usr/share/glvnd/egl_vendor.d/10_nvidia.json": "graphics",
            "/etc/vulkan/icd.d/nvidia_icd.json": "graphics", "/etc/OpenCL/vendors/nvidia.icd": "compute"}


SONAME_LINKS = {f"{LIB}/libcuda.so.1": "compute", f"{LIB}/libnvidia-ml.so.1": "utility",
                f"{LIB}/libGLX_nvidia.so.0": "graphics"}


def probe_script(nv: NvModel) -> str:
    head = cl.PROBE[:cl.PROBE.index("for n in")]  # the probe function and the cgroup listing
    opens = """
open_probe() {
  mknod "$3" c "$1" "$2" 2>/dev/null || { echo "c $1:$2 MKNOD-FAILED"; return; }
  out=$( (: < "$3") 2>&1 )
  case "$out" in
    *"No such device or address"*) echo "c $1:$2 ENXIO";;
    *"Operation not permitted"*) echo "c $1:$2 EPERM";;
    "") echo "c $1:$2 OPEN";;
    *) echo "c $1:$2 OTHER $out";;
  esac
}
"""
    checks = "".join(f"file_check {f}\n" for f in files(nv)) + "".join(
        f'[ -L {p} ] && echo "solink {p} $(readlink {p})"\n' for p in SONAME_LINKS)
    return head + opens + f"""
file_check() {{
  if [ ! -e "$1" ]; then echo "file $1 absent"; return; fi
  opts=$(grep " $1 " /proc/self/mountinfo | head -n 1 | {{ read -r a b c d e o rest; echo "$o"; }})
  if [ -d "$1" ]; then w=dir; elif (: >> "$1") 2>/dev/null; then w=writable; else w=readonly; fi
  echo "file $1 ${{opts:-unmounted}} $w"
}}
for n in /dev/nvidia* /dev/nvidia-caps/* /dev/dri/* /dev/kfd /dev/null; do
  [ -e "$n" ] && [ ! -d "$n" ] && probe "node $n" "$n"
done
for l in /dev/dri/by-path/*; do [ -L "$l" ] && echo "link $l $(readlink "$l")"; done
m=0
while [ $m -le 255 ]; do open_probe 195 $m /tmp/n$m; m=$((m+1)); done
for m in {' '.join(map(str, nv.caps_minors))}; do open_probe {nv.caps_major} $m /tmp/c$m; done
for m in 0 1; do open_probe {nv.uvm_major} $m /tmp/u$m; done
for m in {' '.join(map(str, nv.drm_minors))}; do open_probe 226 $m /tmp/d$m; done
open_probe {nv.kfd[0]} {nv.kfd[1]} /tmp/kfd
{checks}grep -q libcuda.so.1 /etc/ld.so.cache 2>/dev/null && echo "ldcache libcuda.so.1"
if [ -x /usr/bin/nvidia-smi ]; then nvidia-smi -L | while read -r line; do echo "smi $line"; done; fi
echo done
"""


def make_rootfs(path: Path, nv: NvModel) -> Path:
    """A fresh busybox rootfs (what runc creates for the driver's mounts must not leak into the next container)."""
    rootfs = cl.make_rootfs(path)
    for applet in ("grep", "rm"):
        (rootfs / "bin" / applet).symlink_to("busybox")
    (rootfs / "probe.sh").write_text(probe_script(nv))
    return rootfs


@dataclass
class Expected:
    nodes: dict[str, str]
    access: dict[tuple[int, int], str]
    links: dict[str, str]
    files: dict[str, str]
    solinks: dict[str, str]
    ldcache: bool
    smi: set[str]


def expected(nv: NvModel, grants: dict[str, list[Any]], caps: frozenset[str]) -> Expected:
    nvidia = [str(x) for x in grants.get("nvidia", [])]
    whole = [nv.gpus[int(x)] for x in nvidia if ":" not in x]
    migs = [nv.migs[x] for x in nvidia if ":" in x]
    with_gpu = {g.minor for g in whole} | {nv.gpus[i].minor for i, _gi, _ci in migs}
    display = bool(caps & {"graphics", "display"})
    nodes = {"/dev/null": "OPEN"}
    allowed: set[tuple[int, int]] = set()
    links: dict[str, str] = {}
    for minor in with_gpu:
        nodes[f"/dev/nvidia{minor}"] = "ENXIO"
        allowed.add((195, minor))
    for _index, gi, ci in migs:
        for m in (gi, ci):
            nodes[f"/dev/nvidia-caps/nvidia-cap{m}"] = "ENXIO"
            allowed.add((nv.caps_major, m))
    if nvidia:
        for path, number in (("/dev/nvidiactl", (195, 255)), ("/dev/nvidia-uvm", (nv.uvm_major, 0)),
                             ("/dev/nvidia-uvm-tools", (nv.uvm_major, 1))):
            nodes[path] = "ENXIO"
            allowed.add(number)
        if "display" in caps and nv.modeset:
            nodes["/dev/nvidia-modeset"] = "ENXIO"
            allowed.add((195, 254))
    for gpu in whole:
        if display and gpu.drm:
            card, render = gpu.drm
            nodes[f"/dev/dri/card{card}"] = nodes[f"/dev/dri/renderD{render}"] = "ENXIO"
            allowed |= {(226, card), (226, render)}
            links[f"/dev/dri/by-path/pci-{gpu.pci}-card"] = f"../card{card}"
            links[f"/dev/dri/by-path/pci-{gpu.pci}-render"] = f"../renderD{render}"
    for index in grants.get("amd", []):
        device = nv.amd[int(index)]
        nodes[f"/dev/dri/card{device.card}"] = nodes[f"/dev/dri/renderD{device.render}"] = "ENXIO"
        allowed |= {(226, device.card), (226, device.render)}
        links[f"{'/dev/dri/by-path/'}{device.link}-card"] = f"../card{device.card}"
        links[f"{'/dev/dri/by-path/'}{device.link}-render"] = f"../renderD{device.render}"
    if grants.get("amd"):
        nodes["/dev/kfd"] = "ENXIO"
        allowed.add(nv.kfd)
    probed = [(195, m) for m in range(256)] + [(nv.caps_major, m) for m in nv.caps_minors]
    probed += [(nv.uvm_major, 0), (nv.uvm_major, 1)] + [(226, m) for m in nv.drm_minors] + [nv.kfd]
    access = {number: "ENXIO" if number in allowed else "EPERM" for number in probed}
    given = {path: cap for path, cap in files(nv).items() if nvidia and (not cap or cap in caps)}
    file_states = {path: (("ro,nosuid,nodev dir" if not cap else "ro,nosuid,nodev readonly") if path in given
                          else "absent") for path, cap in files(nv).items()}
    solinks = {path: os.path.basename(path).rsplit(".so.", 1)[0] + f".so.{nv.version}"
               for path, cap in SONAME_LINKS.items() if nvidia and cap in caps}
    smi = {g.uuid for g in nv.gpus if g.minor in with_gpu} if nvidia and "utility" in caps else set()
    return Expected(nodes, access, links, file_states, solinks, bool(nvidia) and "compute" in caps, smi)


def check(output: str, want: Expected, *, cgroup_v2: bool | None) -> None:
    result = cl.ProbeResult.parse(output)
    assert result.nodes == want.nodes, f"nodes in the container: {result.nodes}, expected {want.nodes}"
    assert result.access == want.access, {k: (v, want.access.get(k)) for k, v in result.access.items()
                                          if v != want.access.get(k)}
    assert result.links == want.links, f"by-path links: {result.links}, expected {want.links}"
    lines = output.splitlines()
    got_files = {}
    for line in lines:
        if line.startswith("file "):
            _, path, state = line.split(" ", 2)
            got_files[path] = state if state == "absent" else " ".join(
                [state.split()[0].split(",relatime")[0].split(",noatime")[0], state.split()[1]])
    assert got_files == want.files, output
    solinks = dict(line.split(" ", 2)[1:] for line in lines if line.startswith("solink "))
    assert solinks == want.solinks
    assert ("ldcache libcuda.so.1" in lines) == want.ldcache
    smi = {line.rpartition("(UUID: ")[2].rstrip(")") for line in lines if line.startswith("smi GPU ")}
    assert smi == want.smi, [line for line in lines if line.startswith("smi")]
    if cgroup_v2 is not None:
        assert result.cgroup_v2 == cgroup_v2, f"/proc/self/cgroup: {result.cgroups}"


def _uuid(name: str, index: int) -> str:
    return model(name).gpus[index].uuid


# (id, host, env, annotations, CDI device names, grants, capabilities the hooks give)
CASES: list[tuple[str, str, list[str], dict[str, str], list[str], dict[str, list[Any]], frozenset[str]]] = [
    ("h100-index", "nvidia-h100", ["NVIDIA_VISIBLE_DEVICES=1"], {}, ["nvidia.com/gpu=1"], {"nvidia": [1]},
     frozenset({"utility", "compute"})),
    ("h100-uuid-and-index", "nvidia-h100", [f"NVIDIA_VISIBLE_DEVICES={_uuid('nvidia-h100', 3)},0"], {},
     [f"nvidia.com/gpu={_uuid('nvidia-h100', 3)}", "nvidia.com/gpu=0"], {"nvidia": [0, 3]},
     frozenset({"utility", "compute"})),
    ("mig-device", "nvidia-mig", ["NVIDIA_VISIBLE_DEVICES=0:3", "NVIDIA_DRIVER_CAPABILITIES=compute"], {},
     ["nvidia.com/gpu=0:3"], {"nvidia": ["0:3"]}, frozenset({"compute"})),
    ("mig-gpu-graphics", "nvidia-mig",
     ["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=graphics,display,utility"], {}, ["nvidia.com/gpu=1"],
     {"nvidia": [1]}, frozenset({"graphics", "display", "utility"})),
    ("mixed-both-vendors", "amd-nvidia", ["AMD_VISIBLE_DEVICES=1", "NVIDIA_VISIBLE_DEVICES=0"], {},
     ["amd.com/gpu=1", "nvidia.com/gpu=0"], {"amd": [1], "nvidia": [0]}, frozenset({"utility", "compute"})),
    ("mixed-nvidia-all-by-annotation", "amd-nvidia", [], {"cdi.k8s.io/test": "nvidia.com/gpu=all"},
     ["nvidia.com/gpu=all"], {"nvidia": [0, 1]}, frozenset({"utility", "compute"})),
]
APPLIERS = ["dry-run-v1", "dry-run-v2", "shim-v1", "shim-v2", "prestart-v1", "prestart-v2", "podman-precreate",
            "podman-cdi"]


def host_setup(home: Path, name: str) -> dict[str, Any]:
    """The example host ``name`` under ``home``: its model, config, launchers, hooks dir and generated CDI specs."""
    nv = model(name)
    return {"model": nv, **cl.host_home(home, f'sysfs_root = "{nv.base / "sys"}"\nproc_root = "{nv.base / "proc"}"\n'
                                               f'driver_root = "{nv.base / "driver"}"\n')}


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cl.need("runc", "podman", "busybox", "unshare")
    base = tmp_path_factory.mktemp("nvhosts")
    setup: dict[str, Any] = {"base": base}
    setup.update(cl.at_once(lambda name: host_setup(base / name, name), sorted({case[1] for case in CASES})))
    return setup


def _bundle(hosts: dict[str, Any], host: str, env: list[str], annotations: dict[str, str]) -> Path:
    cid = cl.container_id()
    rootfs = make_rootfs(hosts["base"] / f"{cid}-rootfs", hosts[host]["model"])
    bundle = cl.make_bundle(hosts["base"] / cid, rootfs, env, ["/bin/sh", "/probe.sh"])

    def change(spec: dict[str, Any]) -> None:
        spec["annotations"] = annotations
        spec["root"]["readonly"] = False  # so that a write refused on a driver file is its own mount's doing

    cl.edit_spec(bundle, change)
    return bundle


def _runc(bundle: Path, v2: bool, runtime: str = "runc") -> subprocess.CompletedProcess[str]:
    argv = [runtime, "run", "--bundle", str(bundle), bundle.name]
    return cl.run(cl.cgroup2_wrap(argv) if v2 else argv, env=cl.hook_env())


def _podman(hosts: dict[str, Any], host: str, options: list[str], hooks: Path | None,
            cdi: Path | None = None) -> subprocess.CompletedProcess[str]:
    rootfs = make_rootfs(hosts["base"] / f"{cl.container_id()}-rootfs", hosts[host]["model"])
    argv = [*cl.PODMAN, "--runtime=runc", f"--hooks-dir={hooks or hosts['base'] / 'no-hooks'}", *cl.PODMAN_RUN,
            *options, "--rootfs", str(rootfs), "/bin/sh", "/probe.sh"]
    return cl.run(argv if cdi is None else cl.private_cdi(argv, cdi), env=cl.hook_env())


@pytest.mark.parametrize("applier", APPLIERS)
@pytest.mark.parametrize(("host", "env", "annotations", "cdi_names", "grants", "caps"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_exactly_the_devices_and_driver_files_asked_for(hosts: dict[str, Any], applier: str, host: str,
                                                       env: list[str], annotations: dict[str, str],
                                                       cdi_names: list[str], grants: dict[str, list[Any]],
                                                       caps: frozenset[str]) -> None:
    mine = hosts[host]
    v2 = applier.endswith("-v2")
    if applier.startswith("dry-run"):
        bundle = _bundle(hosts, host, env, annotations)
        done = cl.run([str(mine["hook"]), "dry-run", str(bundle)], env=cl.hook_env())
        assert done.returncode == 0, done.stderr
        (bundle / "config.json").write_text(done.stdout)
        done = _runc(bundle, v2)
    elif applier.startswith("shim"):
        done = _runc(_bundle(hosts, host, env, annotations), v2, str(mine["runtime"]))
    elif applier.startswith("prestart"):
        bundle = _bundle(hosts, host, env, annotations)
        cl.add_prestart(bundle, mine["hook"])
        done = _runc(bundle, v2)
    elif applier == "podman-precreate":
        options = [o for e in env for o in ("--env", e)]
        options += [o for k, v in annotations.items() for o in ("--annotation", f"{k}={v}")]
        done = _podman(hosts, host, options, mine["hooks-dir"])
    else:
        caps = ALL_CAPS  # a CDI spec cannot read the container's NVIDIA_DRIVER_CAPABILITIES: it gives everything
        done = _podman(hosts, host, [o for n in cdi_names for o in ("--device", n)], None, mine["cdi"])
    assert done.returncode == 0, done.stderr
    check(done.stdout, expected(mine["model"], grants, caps),
          cgroup_v2=v2 if applier[-3:] in ("-v1", "-v2") else None)


def test_a_bad_request_or_capability_stops_the_container_with_one_line(hosts: dict[str, Any]) -> None:
    mine = hosts["nvidia-mig"]
    for env, why in ((["NVIDIA_VISIBLE_DEVICES=0:4"], "'0:4' is out of range (GPU 0 has 4 MIG devices)"),
                     (["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute,gpu"],
                      "'gpu' is not a driver capability")):
        done = _runc(_bundle(hosts, "nvidia-mig", env, {}), False, str(mine["runtime"]))
        assert done.returncode != 0 and why in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_no_amd_request_opens_an_nvidia_minor_and_back(hosts: dict[str, Any]) -> None:
    """Every request form of one vendor on the mixed host, through the shim: the other vendor's minors stay refused."""
    mine = hosts["amd-nvidia"]
    nv = mine["model"]
    nvidia_drm = {m for g in nv.gpus if g.drm for m in g.drm}
    amd_drm = {m for d in nv.amd for m in (d.card, d.render)}
    for env in (["AMD_VISIBLE_DEVICES=all"], ["AMD_VISIBLE_DEVICES=0000:41:00.0"],
                ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=all"],
                [f"NVIDIA_VISIBLE_DEVICES={nv.gpus[1].uuid}", "NVIDIA_DRIVER_CAPABILITIES=graphics"]):
        done = _runc(_bundle(hosts, "amd-nvidia", env, {}), False, str(mine["runtime"]))
        assert done.returncode == 0, (env, done.stderr)
        access = cl.ProbeResult.parse(done.stdout).access
        others = nvidia_drm if env[0].startswith("AMD") else amd_drm | {nv.kfd}
        assert all(access[(226, m) if isinstance(m, int) else m] == "EPERM" for m in others), (env, access)
        if env[0].startswith("AMD"):
            assert {access[(195, m)] for m in range(256)} == {"EPERM"}
            assert access[(nv.uvm_major, 0)] == access[(nv.uvm_major, 1)] == "EPERM"


# The vendor files of the driver, each read as its loader reads it: GLVND's libEGL (egl_vendor.d), libEGL_nvidia
# (egl_external_platform.d), the Vulkan loader (icd.d, implicit_layer.d: ICD or layer .library_path) and the
# OpenCL ICD loader (vendors/*.icd: the library on its one line); OptiX's libnvoptix reads nvoptix.bin.
LOADER_FILES = {"/usr/share/glvnd/egl_vendor.d/10_nvidia.json": "ICD",
                "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json": "ICD",
                "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json": "ICD",
                "/etc/vulkan/icd.d/nvidia_icd.json": "ICD", "/etc/vulkan/implicit_layer.d/nvidia_layers.json": "layer",
                "/etc/OpenCL/vendors/nvidia.icd": "icd"}
OPTIX = "/usr/share/nvidia/nvoptix.bin"
LOADER_PROBE = "".join(f'if [ -f {f} ]; then echo "BEGIN {f}"; cat {f}; echo; echo "END {f}"; '
                       f'else echo "MISSING {f}"; fi\n' for f in LOADER_FILES)
LOADER_PROBE += f"""[ -s {OPTIX} ] && echo "optix present"
while read -r a b c d point rest; do echo "mnt $point"; done < /proc/self/mountinfo
"""


def _loaded_library(text: str, how: str) -> str:
    """The library a vendor file names, parsed as its loader parses it."""
    import json

    if how == "icd":
        return text.strip().splitlines()[0].strip()
    return str(json.loads(text)[how]["library_path"])


def _ld_cache(rootfs: Path) -> dict[str, str]:
    """soname -> path of the container's ld cache as ld.so reads it (the real ldconfig -p on the cache file)."""
    ldconfig = next(p for p in ("/sbin/ldconfig.real", "/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p))
    out = subprocess.run([ldconfig, "-p", "-C", str(rootfs / "etc" / "ld.so.cache")], capture_output=True, text=True,
                         check=True).stdout
    found: dict[str, str] = {}
    for line in out.splitlines():
        if "(libc6,x86-64" in line and " => " in line:
            found.setdefault(line.split()[0], line.rsplit(" => ", 1)[1])
    return found


@pytest.mark.parametrize("applier", ["shim-v2", "prestart-v1", "podman-cdi"])
def test_each_loader_finds_the_library_its_vendor_file_names(hosts: dict[str, Any], applier: str) -> None:
    """EGL, Vulkan, OpenCL and OptiX in a container given every capability: each vendor file is where its loader
    reads it, and the library it names resolves through the container's own ld cache (a bare soname: as dlopen
    does) to a driver file mounted in the container.  The links and the cache stay in the rootfs after the run;
    the container's mount table says which paths were the driver's files."""
    from oci_gpu_hook.inventory.nvdriver import resolve

    mine = hosts["nvidia-h100"]
    nv = mine["model"]
    env = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=all"]
    if applier == "podman-cdi":
        rootfs = make_rootfs(hosts["base"] / f"{cl.container_id()}-rootfs", nv)
        (rootfs / "loaders.sh").write_text(LOADER_PROBE)
        argv = [*cl.PODMAN, "--runtime=runc", f"--hooks-dir={hosts['base'] / 'no-hooks'}", *cl.PODMAN_RUN,
                "--device", "nvidia.com/gpu=0", "--rootfs", str(rootfs), "/bin/sh", "/loaders.sh"]
        done = cl.run(cl.private_cdi(argv, mine["cdi"]), env=cl.hook_env())
    else:
        bundle = _bundle(hosts, "nvidia-h100", env, {})
        rootfs = Path(json.loads((bundle / "config.json").read_text())["root"]["path"])
        (rootfs / "loaders.sh").write_text(LOADER_PROBE)
        cl.edit_spec(bundle, lambda spec: spec["process"].update(args=["/bin/sh", "/loaders.sh"]))
        if applier.startswith("prestart"):
            cl.add_prestart(bundle, mine["hook"])
            done = _runc(bundle, False)
        else:
            done = _runc(bundle, True, str(mine["runtime"]))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert not [line for line in lines if line.startswith("MISSING")], done.stdout
    assert "optix present" in lines
    mounted = {line[4:] for line in lines if line.startswith("mnt ")}
    cache = _ld_cache(rootfs)
    for path, how in LOADER_FILES.items():
        text = done.stdout.split(f"BEGIN {path}\n", 1)[1].split(f"\nEND {path}", 1)[0]
        library = _loaded_library(text, how)
        assert "/" not in library, (path, library)  # the driver's files name bare sonames: dlopen's search
        assert library in cache, f"{path} names {library}, which the container's ld cache lacks"
        final = resolve(str(rootfs), cache[library])  # the soname links the hook left in the rootfs
        assert final is not None and final in mounted, (path, library, cache[library], final)
        assert os.path.basename(final).startswith(library.split(".so", 1)[0] + ".so."), final
    assert f"/usr/lib/x86_64-linux-gnu/libGLX_nvidia.so.{nv.version}" in mounted


@pytest.mark.parametrize("layout", ["gke", "runfile"])
@pytest.mark.parametrize("applier", ["shim-v1", "podman-cdi"])
def test_nvidia_smi_runs_from_every_layout_on_every_path(tmp_path: Path, layout: str, applier: str) -> None:
    """A GKE-style driver (ELF binaries in /usr/local/nvidia/bin, #!/bin/sh wrappers that exec them in /usr/bin) and
    NVIDIA's .run layout: the container gets the ELF nvidia-smi, which runs from a plain image's PATH and from a
    CUDA image's (/usr/local/nvidia/bin first), never the wrapper whose target it would lack."""
    from tests.helpers.fakenvidia import build_driver

    cl.need("runc", "podman", "busybox", "unshare")
    nv = model("nvidia-h100")
    driver = Path(build_driver(str(tmp_path / "driver"), HOSTS["nvidia-h100"](), layout))
    mine = cl.host_home(tmp_path / "home", f'sysfs_root = "{nv.base / "sys"}"\nproc_root = "{nv.base / "proc"}"\n'
                                           f'driver_root = "{driver}"\n')
    rootfs = make_rootfs(tmp_path / "rootfs", nv)
    cuda_path = "/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    (rootfs / "smi.sh").write_text(
        'head -c 4 /usr/bin/nvidia-smi | grep -q ELF && echo "elf /usr/bin/nvidia-smi"\n'
        'nvidia-smi -L | while read -r line; do echo "plain $line"; done\n'
        f'PATH={cuda_path} nvidia-smi -L | while read -r line; do echo "cuda $line"; done\n')
    if applier == "podman-cdi":
        argv = [*cl.PODMAN, "--runtime=runc", f"--hooks-dir={tmp_path / 'no-hooks'}", *cl.PODMAN_RUN,
                "--device", "nvidia.com/gpu=1", "--rootfs", str(rootfs), "/bin/sh", "/smi.sh"]
        done = cl.run(cl.private_cdi(argv, mine["cdi"]), env=cl.hook_env())
    else:
        bundle = cl.make_bundle(tmp_path / cl.container_id(), rootfs, ["NVIDIA_VISIBLE_DEVICES=1"],
                                ["/bin/sh", "/smi.sh"])
        done = _runc(bundle, False, str(mine["runtime"]))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    uuid = nv.gpus[1].uuid
    assert "elf /usr/bin/nvidia-smi" in lines, done.stdout
    for where in ("plain", "cuda"):
        assert [line for line in lines if line.startswith(where)] == [
            f"{where} GPU 0: NVIDIA H100 80GB HBM3 (UUID: {uuid})"], done.stdout


@pytest.mark.parametrize("applier", ["shim-v1", "podman-precreate", "podman-precreate-overlay"])
def test_the_spec_rewrite_writes_the_ld_cache_before_create_and_adds_no_hook(hosts: dict[str, Any], applier: str,
                                                                              tmp_path: Path) -> None:
    """The shim and podman's precreate make the driver's soname links and merge its ld cache into the writable
    root directory themselves, before runc creates the container: the config.json runc gets has no ``ldcache``
    hook, the driver's files are still mounts, and the container's ld cache (read by the real ldconfig) resolves
    libcuda.so.1 to the image's CUDA compat library (newer than the host's driver: chosen) and libnvidia-ml.so.1
    to the driver's, whose soname link the probe reads inside the container.  ``podman-precreate-overlay``:
    ``--rootfs DIR:O``, the root podman hands precreate is its overlay, mounted by then: written there (the
    container reads the cache), the image's directory below it untouched."""
    from tests.helpers.fakenvidia import elf_shared_object

    mine = hosts["nvidia-h100"]
    nv = mine["model"]
    env = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
    compat_version = f"{int(nv.version.split('.')[0]) + 1}.10.01"
    if applier.startswith("podman-precreate"):
        rootfs = make_rootfs(tmp_path / "rootfs", nv)
        final = tmp_path / "final.json"
        capture = tmp_path / "capture.sh"  # the hook after ours: what podman then hands runc, kept
        capture.write_text(f"#!/bin/sh\nexec /usr/bin/tee {final}\n")
        capture.chmod(0o755)
        hooks = tmp_path / "hooks.d"
        hooks.mkdir()
        for entry in mine["hooks-dir"].iterdir():
            (hooks / entry.name).write_text(entry.read_text())
        (hooks / "zz-capture.json").write_text(json.dumps(
            {"version": "1.0.0", "hook": {"path": str(capture), "args": ["capture"]}, "when": {"always": True},
             "stages": ["precreate"]}))
    else:
        bundle = _bundle(hosts, "nvidia-h100", env, {})
        rootfs = Path(json.loads((bundle / "config.json").read_text())["root"]["path"])
        final = bundle / "config.json"
    compat = rootfs / "usr/local/cuda/compat"
    compat.mkdir(parents=True)
    (compat / f"libcuda.so.{compat_version}").write_bytes(elf_shared_object("libcuda.so.1"))
    (compat / "libcuda.so.1").symlink_to(f"libcuda.so.{compat_version}")
    with open(rootfs / "probe.sh", "a") as probe:
        probe.write('grep -q /usr/local/cuda/compat/libcuda.so.1 /etc/ld.so.cache && echo "ldcache compat"\n')
    overlay = applier.endswith("-overlay")
    if applier.startswith("podman-precreate"):
        argv = [*cl.PODMAN, "--runtime=runc", f"--hooks-dir={hooks}", *cl.PODMAN_RUN,
                *(o for e in env for o in ("--env", e)), "--rootfs", f"{rootfs}{':O' if overlay else ''}",
                "/bin/sh", "/probe.sh"]
        done = cl.run(argv, env=cl.hook_env())
    else:
        done = _runc(bundle, False, str(mine["runtime"]))
    assert done.returncode == 0, done.stderr
    spec = json.loads(final.read_text())
    hooks_run = [h["args"][1] for h in spec.get("hooks", {}).get("createRuntime", []) if len(h.get("args", [])) > 1]
    assert "ldcache" not in hooks_run, spec.get("hooks")
    assert f"{LIB}/libcuda.so.{nv.version}" in {m["destination"] for m in spec["mounts"]}
    lines = done.stdout.splitlines()
    assert "ldcache libcuda.so.1" in lines and "ldcache compat" in lines, done.stdout
    assert f"solink {LIB}/libnvidia-ml.so.1 libnvidia-ml.so.{nv.version}" in lines, done.stdout
    if overlay:
        assert spec["root"]["path"] != str(rootfs), spec["root"]
        assert not (rootfs / "etc/ld.so.cache").exists() and not (rootfs / LIB.lstrip("/")).exists()
        return
    cache = _ld_cache(rootfs)
    assert cache["libcuda.so.1"] == "/usr/local/cuda/compat/libcuda.so.1", cache
    assert cache["libnvidia-ml.so.1"] == f"{LIB}/libnvidia-ml.so.1", cache
    assert (rootfs / "etc/ld.so.conf.d/00-compat-oci-gpu-hook.conf").read_text() == "/usr/local/cuda/compat\n"
