#!/usr/bin/env python3
"""A GPU container's create per path, against bare runc and against its floor, as installed.

Run as root, with a Python 3.11+ that has pip (e.g. this checkout's .venv)::

    python3 benchmarks/gpu_create.py [--rounds N] [--warmup N] [--host DIR|real] [--no-planner]
                                     [--wheel FILE | --venv DIR] [--json FILE] [--check]

The wheel is built and installed as ``startup.py`` does it (its ``outside``: ``pip wheel`` of a clean copy of
this checkout, or ``--wheel``/``--venv``; a venv in a temporary directory), and the script runs itself again in a
private mount namespace whose /etc, /usr/local and /usr/share/containers are overlays: there it writes the config
file at its default path (the fake NVIDIA host ``examples/hosts/nvidia-4x-h100`` by default: its sysfs, /proc and
driver roots) and runs ``oci-gpu-hook install --only podman``; the launchers measured are the ones install wrote.

Each sample is one GPU container's ``create`` (``NVIDIA_VISIBLE_DEVICES=0``), on a fresh overlay of its image
(mounted, and after the untimed ``runc delete`` unmounted, outside the timed region, as a snapshotter does), by
one of these paths:

- ``bare runc``: ``runc create`` of the same bundle, no GPU (runc ignores the variable);
- ``shim``: the installed ``oci-gpu-runtime create`` (with the resident planner unless ``--no-planner``);
- ``precreate``: the hook install put in podman's hooks.d (its path and args), spec on stdin, spec on stdout,
  then ``runc create`` of what it wrote (what podman does);
- ``prestart``: ``runc create`` of the bundle with the installed ``oci-gpu-hook prestart`` as a prestart hook;
- ``CDI``: the CDI spec of the installed ``oci-gpu-hook cdi generate``, its device ``0``'s edits applied to the
  bundle as a runtime applies them (untimed: the engine's work, not ours), then ``runc create``;
- ``NRI``: ``oci-gpu-hook nri`` connected to the NRI test double (tests/helpers/nriruntime.py), CreateContainer
  answered and the adjustment applied as containerd applies it (timed), then ``runc create``;
- ``floor``: ``runc create`` of a path's final spec without its hooks: the same device nodes and mounts, no
  hook (one floor per distinct final spec; the prestart path's floor is the shim's).

Two images: ``small`` (busybox-static, the dynamic loader, libc, libm, libpthread, librt, libdl and their
/etc/ld.so.cache) and ``cuda`` (the same plus every ``*.so*`` of this machine's /usr/lib/x86_64-linux-gnu,
hundreds of libraries, their cache built by ``ldconfig -r``), the size of a CUDA runtime image whose ld cache a
hook rebuilds.  Every case of both images runs once per round, each round in its own shuffled order, after
discarded warm-up rounds.  Untimed first, per path and image: a created container's /dev has the GPU's node
(read through /proc/PID/root), and with a hook that updates the ld cache its /etc/ld.so.cache names
libcuda.so.1 where the floor's does not.  Stdlib only, apart from the NRI double (skipped with a note where it
cannot be imported).  The host's /etc, /usr and /run are never written; containers are named
``ogh-bench-<pid>-...`` and removed at the end, also on failure or interruption.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import startup as su  # (the private root, the wheel's venv, the planner, the cleanup)

REPO = su.REPO
DEFAULT_HOST = os.path.join(REPO, "examples", "hosts", "nvidia-4x-h100")
REQUEST = "NVIDIA_VISIBLE_DEVICES=0"
LIB_DIR = "/usr/lib/x86_64-linux-gnu"
LOADER = "/lib64/ld-linux-x86-64.so.2"
GLIBC = ("libc.so.6", "libm.so.6", "libpthread.so.0", "librt.so.1", "libdl.so.2")
DRIVER_LIBS = ("libcuda", "libnvidia", "libnvcuvid", "libnvoptix")  # a driver's own: never in the image
PATHS = ("shim", "precreate", "prestart", "cdi", "nri")
IMAGES = ("small", "cuda")
HOOK_TARGET_MS = 3.0  # a path's median over its floor (the hooks' own cost), on the fake NVIDIA host
sh = su.sh


@dataclass
class Step:
    """One timed part of a sample: a command (``{id}`` replaced; stdin/stdout files) or a call given the id."""

    argv: list[str] | None = None
    call: Callable[[str], None] | None = None
    stdin: str | None = None
    stdout: str | None = None


@dataclass
class Case:
    key: str  # e.g. "small/shim"
    path: str  # bare, floor..., shim, precreate, prestart, cdi, nri
    image: str
    bundle: str
    steps: list[Step]
    floor: str = ""  # key of this case's floor
    samples: list[float] = field(default_factory=list)
    warmup: list[float] = field(default_factory=list)


def apply_cdi(spec: dict[str, Any], cdi: dict[str, Any], device: str) -> None:
    """The CDI spec's common edits and ``device``'s applied to an OCI spec, as a runtime applies them (the
    container-device-interface library's ContainerEdits.Apply: env, device nodes with an ``rwm`` cgroup rule,
    mounts, hooks by stage); a node without type or numbers takes them from the host's node."""
    edits = [cdi.get("containerEdits") or {}]
    edits += [d.get("containerEdits") or {} for d in cdi.get("devices", []) if d.get("name") == device]
    if len(edits) == 1:
        raise su.BenchError(f"the CDI spec of kind {cdi.get('kind')} has no device {device!r}")
    linux = spec.setdefault("linux", {})
    for edit in edits:
        spec["process"]["env"] = [*spec["process"].get("env", []), *edit.get("env", [])]
        for node in edit.get("deviceNodes", []):
            entry = {"path": node["path"], "type": node.get("type"), "major": node.get("major"),
                     "minor": node.get("minor")}
            if entry["major"] is None or entry["type"] is None:
                st = os.stat(node.get("hostPath") or node["path"])
                entry.update(type="c" if (st.st_mode & 0o170000) == 0o020000 else "b",
                             major=os.major(st.st_rdev), minor=os.minor(st.st_rdev))
            entry.update({k: node[k] for k in ("fileMode", "uid", "gid") if k in node})
            linux.setdefault("devices", []).append(entry)
            linux.setdefault("resources", {}).setdefault("devices", []).append(
                {"allow": True, "type": entry["type"], "major": entry["major"], "minor": entry["minor"],
                 "access": node.get("permissions", "rwm")})
        for mount in edit.get("mounts", []):
            spec.setdefault("mounts", []).append({"destination": mount["containerPath"], "source": mount["hostPath"],
                                                  "type": mount.get("type", "bind"),
                                                  "options": mount.get("options", [])})
        for hook in edit.get("hooks", []):
            spec.setdefault("hooks", {}).setdefault(hook["hookName"], []).append(
                {k: v for k, v in hook.items() if k != "hookName"})


def difference(first: dict[str, Any], second: dict[str, Any]) -> str:
    """Where two specs differ: top-level keys, ``linux`` keys, mount destinations and device paths."""
    said = [key for key in sorted(set(first) | set(second)) if key not in ("linux", "mounts")
            and first.get(key) != second.get(key)]
    one, two = first.get("linux", {}), second.get("linux", {})
    said += [f"linux.{key}" for key in sorted(set(one) | set(two)) if key != "devices" and one.get(key) != two.get(key)]
    for what, a, b in (("mounts", first.get("mounts", []), second.get("mounts", [])),
                       ("devices", one.get("devices", []), two.get("devices", []))):
        name = "destination" if what == "mounts" else "path"
        left, right = {m[name]: m for m in a}, {m[name]: m for m in b}
        for side, only in (("first", sorted(set(left) - set(right))), ("second", sorted(set(right) - set(left)))):
            if only:
                said.append(f"{len(only)} {what} only in the {side} ({', '.join(only[:3])}{', ...' * (len(only) > 3)})")
        changed = [p for p in sorted(set(left) & set(right)) if left[p] != right[p]]
        if changed:
            said.append(f"{len(changed)} {what} otherwise ({', '.join(changed[:3])}{', ...' * (len(changed) > 3)})")
        if not said and [m[name] for m in a] != [m[name] for m in b]:
            said.append(f"the order of its {what}")
    return "; ".join(said) or "nothing (an equal spec)"


class GpuCreate(su.Bench):
    def __init__(self, opts: argparse.Namespace) -> None:
        opts.only, opts.no_podman = "", True  # what su.Bench reads of startup.py's options
        super().__init__(opts)
        self.cases: list[Case] = []
        self.images: dict[str, str] = {}
        self.host = ""
        self.nri: Any = None  # the NRI double (tests/helpers/nriruntime.py)
        self.nri_module: Any = None
        self.nri_plugin: subprocess.Popen[bytes] | None = None
        self.mounted: list[str] = []

    # ---------------------------------------------------------------- setup

    def setup(self) -> None:
        if not self.runc:
            raise su.BenchError("runc not found on PATH")
        private = json.loads(os.environ[su.PRIVATE_ENV])
        self.tmp, venv = private["tmp"], private["venv"]
        self.mount_private_root()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("OCI_GPU_HOOK_") and k != su.PRIVATE_ENV}
        self.env.setdefault("PATH", su.SAFE_PATH)
        roots = ""
        if self.opts.host != "real":
            self.host = os.path.abspath(self.opts.host)
            for part in ("sys", "proc", "driver"):
                if not os.path.isdir(os.path.join(self.host, part)):
                    raise su.BenchError(f"--host {self.host}: no {part}/ there (an example host has sys, proc, driver)")
            roots = (f'sysfs_root = "{self.host}/sys"\nproc_root = "{self.host}/proc"\n'
                     f'driver_root = "{self.host}/driver"\n')
        os.makedirs(os.path.dirname(su.CONFIG_PATH), 0o755, exist_ok=True)
        with open(su.CONFIG_PATH, "w", encoding="utf-8") as handle:
            handle.write(f'{roots}runtime = "runc"\n')
        ogh = os.path.join(venv, "bin", "oci-gpu-hook")
        installed = sh(self.with_state([ogh, "install", "--only", "podman"]), env=self.env)
        self.lean_shim = os.path.join(su.LAUNCHER_DIR, "oci-gpu-runtime")
        self.lean_hook = os.path.join(su.LAUNCHER_DIR, "oci-gpu-hook")
        hooks_file = os.path.join(su.HOOKS_DIR, "oci-gpu-hook-precreate.json")
        for path in (self.lean_shim, self.lean_hook, hooks_file):  # new, or as an install already there had it
            if not any(f"{what}: {path} (" in installed for what in ("new", "updated", "unchanged")):
                raise su.BenchError(f"oci-gpu-hook install did not write {path}:\n{installed}")
        self.native = os.access(self.lean_shim + ".py", os.F_OK)
        with open(hooks_file, encoding="utf-8") as handle:
            precreate = json.load(handle)["hook"]
        if not self.opts.no_planner:
            self.start_planner()
        cdi_file = os.path.join(self.tmp, "nvidia.com-gpu.json")
        sh([self.lean_hook, "cdi", "generate", "--kind", "nvidia", "--output", cdi_file, "--format", "json"],
           env=self.env)
        with open(cdi_file, encoding="utf-8") as handle:
            cdi = json.load(handle)
        self.start_nri()

        print("# building the images (untimed)", file=sys.stderr, flush=True)
        for image in IMAGES:
            self.images[image] = self.make_image(image)
        kind = "native front + Python launcher" if self.native else "Python launcher (no C compiler)"
        self.meta = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "kernel": f"{platform.system()} {platform.release()} {platform.machine()}",
            "cpus": os.cpu_count(),
            "loadavg": f"at start {su.loadavg()}",
            "runc": su.first_line([self.runc, "--version"]),
            "cgroups": self.cgroup_layout(),
            "host": self.host or "this machine's /sys, /proc and / (--host real)",
            "install": private["install"] + "; then `oci-gpu-hook install --only podman` in a private mount "
                       f"namespace: {kind} in {su.LAUNCHER_DIR}",
            "commit": self.git_commit() + (" (this checkout; the wheel measured is the one --wheel/--venv named)"
                                           if self.opts.wheel or self.opts.venv else ""),
            "planner": "not started (--no-planner)" if self.opts.no_planner else
                       f"`{self.lean_hook} serve --verbose` on {su.PLANNER_DIR}/planner.sock (a tmpfs of the private "
                       "root)",
            "nri": "the NRI test double (tests/helpers/nriruntime.py), `oci-gpu-hook nri --socket` connected"
                   if self.nri else "skipped",
            "images": ", ".join(f"{name}: {self.describe(path)}" for name, path in self.images.items()),
            "rounds": self.opts.rounds,
            "warmup": self.opts.warmup,
        }
        for image, rootfs in self.images.items():
            self.build_cases(image, rootfs, precreate, cdi)

    def start_nri(self) -> None:
        """The NRI double on a socket of the temporary directory, the installed plugin connected to it."""
        if REPO not in sys.path:
            sys.path.insert(0, REPO)
        try:
            from tests.helpers import nriruntime
        except ImportError as err:
            self.notes.append(f"NRI: the test double cannot be imported ({err}): its rows are skipped")
            return
        self.nri_module = nriruntime
        socket_path = os.path.join(self.tmp, "nri.sock")
        double = nriruntime.NRIRuntime(__import__("pathlib").Path(socket_path))
        log = open(os.path.join(self.tmp, "nri.log"), "wb")  # noqa: SIM115 - held by the plugin
        self.nri_plugin = subprocess.Popen([self.lean_hook, "nri", "--socket", socket_path], stdin=subprocess.DEVNULL,
                                           stdout=log, stderr=log, env=self.env, start_new_session=True)
        log.close()
        try:
            double.accept()
        except (OSError, AssertionError) as err:
            with open(os.path.join(self.tmp, "nri.log"), encoding="utf-8", errors="replace") as handle:
                said = handle.read().strip()[-2000:]
            raise su.BenchError(f"the NRI plugin did not register with the double ({err}): {said}") from err
        self.nri = double

    def stop_nri(self) -> None:
        if self.nri is not None:
            self.nri.close()
        if self.nri_plugin is not None:
            if self.nri_plugin.poll() is None:
                self.nri_plugin.kill()
            self.nri_plugin.wait(timeout=30)

    @staticmethod
    def describe(rootfs: str) -> str:
        libs = [n for _, _, files in os.walk(rootfs) for n in files if ".so" in n]
        size = sum(os.lstat(os.path.join(d, n)).st_size for d, _, files in os.walk(rootfs) for n in files)
        return f"{len(libs)} .so files, {size / 1e6:.0f} MB"

    def make_image(self, name: str) -> str:
        """An image directory: busybox and glibc's bits; ``cuda`` also every library of this machine's LIB_DIR."""
        root = os.path.join(self.tmp, "images", name)
        busybox = next((p for p in ("/bin/busybox", "/usr/bin/busybox") if os.access(p, os.X_OK)),
                       shutil.which("busybox"))
        if busybox is None:
            raise su.BenchError("busybox not found (apt-get install busybox-static)")
        for folder in ("bin", "etc", "lib64", "usr/bin", LIB_DIR[1:], "dev", "proc", "sys", "tmp"):
            os.makedirs(os.path.join(root, folder), exist_ok=True)
        os.symlink("usr/lib", os.path.join(root, "lib"))
        shutil.copy2(busybox, os.path.join(root, "bin", "busybox"))
        for applet in ("sh", "true", "ls", "cat"):
            os.symlink("busybox", os.path.join(root, "bin", applet))
        shutil.copy2(os.path.realpath(LOADER), os.path.join(root, LOADER[1:]))
        names = list(GLIBC)
        if name == "cuda":
            found = sorted(n for n in os.listdir(LIB_DIR) if ".so" in n and not os.path.isdir(os.path.join(LIB_DIR, n))
                           and not n.startswith(DRIVER_LIBS) and "_nvidia.so" not in n)
            files = [n for n in found if not os.path.islink(os.path.join(LIB_DIR, n))][:self.opts.cuda_libs]
            kept = set(files)  # and the links to them (a link to a file left out would dangle)
            names = sorted({*GLIBC, *files, *(n for n in found if os.path.islink(os.path.join(LIB_DIR, n))
                                               and os.path.basename(os.readlink(os.path.join(LIB_DIR, n))) in kept)})
        for lib in names:
            source = os.path.join(LIB_DIR, lib)
            target = os.path.join(root, LIB_DIR[1:], lib)
            if lib in GLIBC or not os.path.islink(source):
                shutil.copy2(source, target)  # glibc's by content, whatever its links (the cache lists the names)
            else:
                os.symlink(os.readlink(source), target)
        with open(os.path.join(root, "etc", "ld.so.conf"), "w", encoding="utf-8") as handle:
            handle.write(f"{LIB_DIR}\n")
        ldconfig = next((p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.access(p, os.X_OK)), "ldconfig")
        sh([ldconfig, "-r", root, "-X"], env=self.env, timeout=300)
        if not os.path.getsize(os.path.join(root, "etc", "ld.so.cache")):
            raise su.BenchError(f"ldconfig -r {root} wrote no cache")
        return root

    def make_bundle(self, name: str, rootfs: str, args: list[str], extra_env: list[str],  # type: ignore[override]
                    hook_env: list[str] | None = None) -> str:
        """A bundle whose rootfs is mounted fresh for every sample (an overlay of the image: see ``fresh_root``)."""
        bundle = os.path.join(self.tmp, "bundles", name)
        os.makedirs(os.path.join(bundle, "rootfs"))
        sh([self.runc, "spec", "--bundle", bundle])
        path = os.path.join(bundle, "config.json")
        with open(path, encoding="utf-8") as handle:
            spec = json.load(handle)
        spec["process"].update(terminal=False, args=args)
        spec["process"]["env"] = [*spec["process"].get("env", []), *extra_env]
        spec["root"] = {"path": os.path.join(bundle, "rootfs"), "readonly": False}  # as containerd and podman
        if hook_env is not None:
            spec["hooks"] = {"prestart": [{"path": self.lean_hook, "args": ["oci-gpu-hook", "prestart"],
                                           "env": hook_env}]}
        self.write_spec(bundle, spec, pristine=True)
        return bundle

    def write_spec(self, bundle: str, spec: dict[str, Any], pristine: bool = False) -> None:
        with open(os.path.join(bundle, "config.json"), "w", encoding="utf-8") as handle:
            json.dump(spec, handle, indent=2)
        if pristine:
            shutil.copyfile(os.path.join(bundle, "config.json"), bundle + ".pristine.json")

    def build_cases(self, image: str, rootfs: str, precreate: dict[str, Any], cdi: dict[str, Any]) -> None:
        args = ["/bin/true"]
        create = [self.runc, "create", "--bundle", "{bundle}", "{id}"]
        cases: dict[str, Case] = {}

        def case(path: str, bundle: str, steps: list[Step]) -> Case:
            made = Case(f"{image}/{path}", path, image, bundle,
                        [Step(s.argv and [a.replace("{bundle}", bundle) for a in s.argv], s.call,
                              s.stdin and s.stdin.replace("{bundle}", bundle),
                              s.stdout and s.stdout.replace("{bundle}", bundle)) for s in steps])
            cases[path] = made
            return made

        config = "{bundle}/config.json"
        pristine = "{bundle}.pristine.json"
        case("bare", self.make_bundle(f"{image}-bare", rootfs, args, [REQUEST]), [Step(create)])
        case("shim", self.make_bundle(f"{image}-shim", rootfs, args, [REQUEST]),
             [Step([self.lean_shim, "create", "--bundle", "{bundle}", "{id}"])])
        case("precreate", self.make_bundle(f"{image}-precreate", rootfs, args, [REQUEST]),
             [Step([precreate["path"], *precreate.get("args", [])[1:]], stdin=pristine, stdout=config),
              Step(create)])
        case("prestart", self.make_bundle(f"{image}-prestart", rootfs, args, [REQUEST], [su.HOOK_PATH_ENV]),
             [Step(create)])
        cdi_bundle = self.make_bundle(f"{image}-cdi", rootfs, args, [REQUEST])
        with open(cdi_bundle + ".pristine.json", encoding="utf-8") as handle:
            spec = json.load(handle)
        apply_cdi(spec, cdi, "0")
        self.write_spec(cdi_bundle, spec, pristine=True)
        case("cdi", cdi_bundle, [Step(create)])
        if self.nri is not None:
            nri_bundle = self.make_bundle(f"{image}-nri", rootfs, args, [REQUEST])
            case("nri", nri_bundle, [Step(call=lambda cid, b=nri_bundle: self.nri_adjust(b, cid)), Step(create)])

        # Untimed: what each path makes of the container; its final spec without hooks is its floor.
        floors: dict[str, str] = {}
        shim_node = ""
        for path, made in list(cases.items()):
            if path == "bare":
                continue
            spec, seen = self.sanity(made, shim_node if path == "prestart" else None)
            if path == "shim":
                shim_node = seen
            if path == "prestart":  # the same container as the shim's: its floor
                made.floor = cases["shim"].floor
                continue
            spec.pop("hooks", None)
            text = json.dumps({**spec, "root": None}, sort_keys=True)  # the same spec in another bundle
            if text not in floors:
                name = "floor" if not floors else f"floor ({path})"
                if floors:
                    self.notes.append(f"{image}/{name} differs from the shim's floor in "
                                      f"{difference({**json.loads(next(iter(floors))), 'root': spec['root']}, spec)}")
                floor_bundle = self.make_bundle(f"{image}-floor-{len(floors)}", rootfs, args, [])
                self.write_spec(floor_bundle, {**spec, "root": {"path": os.path.join(floor_bundle, "rootfs"),
                                                                "readonly": False}}, pristine=True)
                floors[text] = case(name, floor_bundle, [Step(create)]).key
                self.sanity(cases[name], seen)
            made.floor = floors[text]
        order = ["bare", *[p for p in cases if p.startswith("floor")], *[p for p in PATHS if p in cases]]
        self.cases += [cases[p] for p in order]

    def nri_adjust(self, bundle: str, cid: str) -> None:
        """containerd's part: the spec to the plugin as an NRI Container, the adjustment applied, config.json
        written."""
        nr = self.nri_module
        with open(bundle + ".pristine.json", encoding="utf-8") as handle:
            spec = json.load(handle)
        pod = nr.api_pb2.PodSandbox(id="pod-bench", name="bench", namespace="default", uid="0000-bench")
        nr.apply_adjustment(spec, self.nri.create_container(pod, nr.container_of(spec, cid)))
        with open(os.path.join(bundle, "config.json"), "w", encoding="utf-8") as handle:
            json.dump(spec, handle)

    def sanity(self, case: Case, expect: str | None = None) -> tuple[dict[str, Any], str]:
        """Create ``case``'s container once: its final spec, and the one GPU node its /dev has (``expect``: the node
        it must be).  A floor's ld cache must not name libcuda.so.1 (a fresh image); a hooked path's should."""
        cid = self.next_id("sanity")
        self.once(case, cid, keep=True)
        try:
            with open(os.path.join(case.bundle, "config.json"), encoding="utf-8") as handle:
                spec = json.load(handle)
            pid = json.loads(sh([self.runc, "state", cid], env=self.env))["pid"]
            root = f"/proc/{pid}/root"
            present = [n for n in os.listdir(f"{root}/dev") if n.startswith("nvidia") and n[6:].isdigit()]
            with open(f"{root}/etc/ld.so.cache", "rb") as handle:
                cached = b"libcuda.so.1" in handle.read()
        finally:
            self.delete(case, cid)
        what = f"{case.image} image, {case.path}"
        if len(present) != 1 or (expect and f"/dev/{present[0]}" != expect):
            raise su.BenchError(f"{what}: the container's /dev has the GPU nodes {present}, not one"
                                f"{f' ({expect})' if expect else ''}")
        node = f"/dev/{present[0]}"
        in_spec = [d["path"] for d in spec.get("linux", {}).get("devices", [])
                   if d["path"].startswith("/dev/nvidia") and d["path"][11:].isdigit()]
        if case.path != "prestart" and in_spec != [node]:  # the live hook makes the node, the spec stays as it is
            raise su.BenchError(f"{what}: the spec names {in_spec}, the container has {node}")
        if case.path.startswith("floor") and cached:
            raise su.BenchError(f"{what}: the floor's ld cache names libcuda.so.1 (the image's rootfs is not fresh)")
        # the shim and precreate write the cache before create (no hook left in their spec), prestart from its hook
        if (spec.get("hooks") or case.path in ("prestart", "shim", "precreate")) and not cached:
            self.notes.append(f"{what}: the container's /etc/ld.so.cache does not name libcuda.so.1")
        return spec, node

    # ---------------------------------------------------------------- measure

    def fresh_root(self, case: Case) -> None:
        """The image as an overlay (a fresh upper layer) on the bundle's rootfs, as a snapshotter gives it."""
        layer = os.path.join(self.tmp, "layers", os.path.basename(case.bundle))
        shutil.rmtree(layer, ignore_errors=True)
        os.makedirs(os.path.join(layer, "upper"))
        os.makedirs(os.path.join(layer, "work"))
        rootfs = os.path.join(case.bundle, "rootfs")
        sh(["mount", "-t", "overlay", "overlay", "-o",
            f"lowerdir={self.images[case.image]},upperdir={layer}/upper,workdir={layer}/work", rootfs])
        self.mounted.append(rootfs)

    def delete(self, case: Case, cid: str) -> None:
        self.stop_runc(cid)
        rootfs = os.path.join(case.bundle, "rootfs")
        if rootfs in self.mounted:
            sh(["umount", rootfs], env=self.env)
            self.mounted.remove(rootfs)

    def once(self, case: Case, cid: str, keep: bool = False) -> float:
        shutil.copyfile(case.bundle + ".pristine.json", os.path.join(case.bundle, "config.json"))
        self.fresh_root(case)
        try:
            elapsed = self.timed(case, cid)
        except BaseException:
            self.delete(case, cid)
            raise
        if not keep:
            self.delete(case, cid)
        return elapsed

    def timed(self, case: Case, cid: str) -> float:
        """The steps' wall time: each command a Popen and a blocking wait (startup.py's ``once`` says why)."""
        opened: list[Any] = []
        with open(os.path.join(self.tmp, "stderr"), "w+b") as err:
            signal.setitimer(signal.ITIMER_REAL, su.SAMPLE_TIMEOUT_S)
            try:
                start = time.perf_counter()
                for step in case.steps:
                    if step.call is not None:
                        step.call(cid)
                        continue
                    assert step.argv is not None
                    argv = [a.replace("{id}", cid) for a in step.argv]
                    # stdout to a file, never a pipe: a created container holds its runtime's stdio open
                    stdin = open(step.stdin, "rb") if step.stdin else subprocess.DEVNULL  # noqa: SIM115
                    stdout = open(step.stdout, "wb") if step.stdout else subprocess.DEVNULL  # noqa: SIM115
                    opened = [f for f in (stdin, stdout) if f is not subprocess.DEVNULL]
                    proc = subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=err, env=self.env,
                                            start_new_session=True)
                    su.RUNNING[:] = [proc]
                    code = proc.wait()
                    for handle in opened:
                        handle.close()
                    if code != 0:
                        err.seek(0)
                        raise su.BenchError(f"{case.key}: {' '.join(argv)} exited {code}: "
                                            f"{err.read().decode(errors='replace').strip()}")
                return (time.perf_counter() - start) * 1000
            except (OSError, AssertionError) as error:  # the NRI double's errors are AssertionErrors
                raise su.BenchError(f"{case.key}: {error}") from error
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                su.RUNNING.clear()
                for handle in opened:
                    handle.close()

    def run(self) -> None:
        total = self.opts.warmup + self.opts.rounds
        print(f"# {len(self.cases)} cases x ({self.opts.warmup} warm-up + {self.opts.rounds}) rounds",
              file=sys.stderr, flush=True)
        for round_no in range(total):
            order = list(self.cases)
            self.rng.shuffle(order)
            for case in order:
                su.check_signals()
                sample = self.once(case, self.next_id(case.path.split()[0]))
                (case.warmup if round_no < self.opts.warmup else case.samples).append(sample)
        self.meta["loadavg"] += f", at end {su.loadavg()} (1, 5, 15 min; other work on this machine adds noise)"

    def cleanup(self) -> list[str]:
        problems = super().cleanup()
        self.stop_nri()
        for rootfs in list(self.mounted):
            if subprocess.run(["umount", rootfs], capture_output=True).returncode != 0:
                problems.append(f"cannot unmount {rootfs}")
        return problems

    # ---------------------------------------------------------------- report

    @staticmethod
    def stats(samples: list[float]) -> dict[str, float]:
        ordered = sorted(samples)
        if len(ordered) > 1:
            deciles = statistics.quantiles(ordered, n=10, method="inclusive")
            p10, p90 = deciles[0], deciles[8]
        else:
            p10 = p90 = ordered[0]
        return {"median": statistics.median(ordered), "p10": p10, "p90": p90, "n": len(ordered)}

    def report(self) -> tuple[str, list[dict[str, Any]]]:
        out = ["# oci-gpu-hook: a GPU container's create per path, against bare runc and its floor", ""]
        out += [f"{key}: {value}" for key, value in self.meta.items()]
        out += ["", "| path | image | median ms | p10 | p90 | over bare runc | over floor | ratio to floor |",
                "|---|---|---:|---:|---:|---:|---:|---:|"]
        keyed = {c.key: c for c in self.cases}
        targets: list[dict[str, Any]] = []
        for case in self.cases:
            row = self.stats(case.samples)
            bare = self.stats(keyed[f"{case.image}/bare"].samples)["median"]
            over_bare = f"{row['median'] - bare:+.1f} ms"
            if case.floor:
                floor = self.stats(keyed[case.floor].samples)["median"]
                over_floor, ratio = f"{row['median'] - floor:+.1f} ms", f"{row['median'] / floor:.2f}x"
                if self.host:
                    targets.append({"name": f"{case.key}: over its floor", "value": row["median"] - floor,
                                    "limit": HOOK_TARGET_MS, "pass": row["median"] - floor <= HOOK_TARGET_MS})
            else:
                over_floor = ratio = ""
            if case.path == "bare":
                over_bare = ""
            label = {"bare": "bare runc", "shim": "shim (oci-gpu-runtime create)", "precreate": "precreate hook",
                     "prestart": "prestart hook", "cdi": "CDI (applied by the runtime)",
                     "nri": "NRI (test double)"}.get(case.path, case.path)
            out.append(f"| {label} | {case.image} | {row['median']:.1f} | {row['p10']:.1f} | {row['p90']:.1f} | "
                       f"{over_bare} | {over_floor} | {ratio} |")
        out += ["", "floor: runc create of the path's final spec without its hooks (same device nodes and mounts); "
                "'over' columns are differences of medians."]
        if targets:
            out.append(f"target (fake NVIDIA host): every path at most +{HOOK_TARGET_MS:g} ms over its floor")
            out += [f"  {'PASS' if t['pass'] else 'MISS'} {t['name']}: {t['value']:+.1f} ms" for t in targets]
        out += [f"note: {note}" for note in self.notes]
        return "\n".join(out), targets

    def dump(self, path: str, targets: list[dict[str, Any]], error: str | None) -> None:
        data = {"meta": self.meta, "error": error, "notes": self.notes, "targets": targets,
                "cases": [{"key": c.key, "path": c.path, "image": c.image, "floor": c.floor, "samples": c.samples,
                           "warmup": c.warmup, **(self.stats(c.samples) if c.samples else {})} for c in self.cases]}
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2)
            handle.write("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=su.positive, default=20,
                        help="timed rounds, every case once per round (default 20: 2-4 minutes on 2 loaded "
                             "vCPUs)")
    parser.add_argument("--warmup", type=int, choices=range(100), default=2, metavar="N",
                        help="discarded warm-up rounds (default 2)")
    parser.add_argument("--host", default=DEFAULT_HOST,
                        help="an example host directory (sys, proc, driver; default the fake 4x H100), or 'real' for "
                             "this machine's GPUs and driver")
    parser.add_argument("--cuda-libs", type=su.positive, default=None, metavar="N",
                        help=f"the cuda image takes only the first N libraries of {LIB_DIR} (default: all)")
    parser.add_argument("--no-planner", action="store_true", help="do not start the resident planner")
    parser.add_argument("--json", metavar="FILE", help="also write metadata and every raw sample to FILE")
    parser.add_argument("--check", action="store_true", help="exit 1 when a path misses its target")
    parser.add_argument("--seed", type=int, default=0, help="seed of each round's case order (default 0)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--wheel", metavar="FILE", help="install this wheel (default: build one from this checkout)")
    source.add_argument("--venv", metavar="DIR", help="measure this venv's installed oci-gpu-hook (no build)")
    opts = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("gpu_create.py: needs root (runc runs real containers)", file=sys.stderr)
        return 2
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, su.note_signal)
    signal.signal(signal.SIGALRM, su.on_alarm)
    if su.PRIVATE_ENV not in os.environ:
        return su.outside(opts, sys.argv[1:] if argv is None else argv, os.path.abspath(__file__), "[nri]")
    bench = GpuCreate(opts)
    error: str | None = None
    targets: list[dict[str, Any]] = []
    try:
        bench.setup()
        bench.run()
        text, targets = bench.report()
        print(text)
    except su.BenchError as err:
        error = str(err)
        print(f"gpu_create.py: error: {err}", file=sys.stderr)
    finally:
        problems = bench.cleanup()
        for problem in problems:
            print(f"gpu_create.py: cleanup: {problem}", file=sys.stderr)
        if opts.json:
            bench.dump(opts.json, targets, error)
    if su.SIGNALS:
        return 128 + su.SIGNALS[0]
    if error or problems:
        return 1
    if opts.check and not all(t["pass"] for t in targets):
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
