#!/usr/bin/env python3
"""Container start-up cost of oci-gpu-hook, as installed: the runtime shim, the podman precreate hook and the
prestart hook.

Run as root, with a Python 3.11+ that has pip (e.g. this checkout's .venv)::

    python3 benchmarks/startup.py [--runs N] [--podman-runs N] [--warmup N] [--settle MS] [--only GROUPS]
                                  [--wheel FILE | --venv DIR] [--json FILE] [--check]

What is measured is the installed wheel, the operator's route: this checkout is built into a wheel
(``pip wheel``, from a clean copy; or ``--wheel FILE``), installed into a venv in a temporary directory
(``python3 -m venv`` + ``pip install``; or ``--venv DIR``, one that has it installed already), and the
script re-runs itself in a private mount namespace (``unshare -m``) whose /etc, /usr/local and
/usr/share/containers are overlays with their upper layers in the temporary directory.  There it
writes the config file at its default path (/etc/oci-gpu-hook/config.toml, naming the example 8-GPU
host) and runs ``<venv>/bin/oci-gpu-hook install --only podman``: the launchers measured are the ones
install wrote in /usr/local/libexec/oci-gpu-hook, the podman hook the one it put in podman's hooks
directory.  The Python-launcher rows use ``<venv>/bin/oci-gpu-hook launchers DIR --no-native``.
Everything else lives in the temporary directory too: a busybox rootfs, runc bundles.  The prestart group
(e) runs in cgroup v1 mode (the host's) and in cgroup v2 mode: every command of
that mode, the bare baseline included, runs in ``unshare -m`` with cgroup2
mounted over /sys/fs/cgroup.  The cases of a group
run in rounds, every case once per round and each round in its own shuffled order, so that drift
and carry-over hit every case alike; warm-up rounds are discarded.  Each sample is the wall time
of one command (``time.perf_counter`` around ``Popen`` and a blocking ``wait``); a bundle's
config.json is restored from a pristine copy before every run, outside the timed region.
Containers (ids and names prefixed ``ogh-bench-<pid>-``) and the temporary directory are removed
at the end, also on failure or interruption; the host's /etc and /usr are never written.
Stdlib only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_SYSFS = os.path.join(REPO, "examples", "hosts", "seed-8x-gfx1100", "sys")
# the private root's temp dir and venv, set when this script runs itself inside it (see main)
PRIVATE_ENV = "OGH_BENCH_PRIVATE_ROOT"
PREFIX = (json.loads(os.environ[PRIVATE_ENV])["prefix"] if PRIVATE_ENV in os.environ
          else f"ogh-bench-{os.getpid()}-")
LAUNCHER_DIR = "/usr/local/libexec/oci-gpu-hook"  # where `install` writes the launchers
HOOKS_DIR = "/usr/share/containers/oci/hooks.d"  # where `install` puts podman's hook (Debian's podman default)
CONFIG_PATH = "/etc/oci-gpu-hook/config.toml"  # the config file's default path
OVERLAID = ("/etc", "/usr/local", "/usr/share/containers")  # private in the benchmark's mount namespace
# not part of what a clean clone builds from
BUILD_SKIPPED = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".pytest_cache",
                 ".ruff_cache", ".hypothesis")
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PODMAN_GLOBAL = ["--cgroup-manager=cgroupfs", "--events-backend=none"]
PODMAN_RUN = ["run", "--rm", "--net=none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
              "-e", "AMD_VISIBLE_DEVICES=1"]
# What the plan gives AMD_VISIBLE_DEVICES=1 on the example host; used to check the shim and hook really work.
EXPECTED_NODE = "/dev/dri/renderD129"

# Targets (see benchmarks/README.md)
RUN_RATIO_TARGET = 1.4  # shim run median / bare runc run median, 1 GPU
NOGPU_RATIO_TARGET = 1.15  # shim run (no request) / bare; also the prestart hook without a request
NOGPU_ADDED_TARGET_MS = 2.0  # ... and at most this much added (shim run and create, the prestart hook)
PASS_THROUGH_TARGET_MS = 2.0  # shim state median - runc state median
PRESTART_GPU_RATIO_TARGET = {"v1": 1.5, "v2": 1.6}  # runc run with the prestart hook, 1 GPU, per cgroup mode
LIFECYCLE_ADDED_TARGET_MS = 20.0  # create + start + delete through the shim (1 GPU) - bare
# With the resident planner running (NVIDIA's Go toolkit measured +6.6 ms create, +13.5 ms lifecycle)
CREATE_PLANNER_TARGET_MS = 5.0  # shim create, 1 GPU - bare runc create (paired Δ median)
LIFECYCLE_PLANNER_TARGET_MS = 12.0  # create + start + delete through the shim, 1 GPU - bare
PRESTART_PLANNER_TARGET_MS = {"v1": 8.0, "v2": 12.0}  # runc run + prestart hook, 1 GPU - bare
AT_ONCE = 64  # group h: this many GPU containers created at once
AT_ONCE_TARGET = 2.0  # ... all of them in at most this many times one container's serial create
# Issue 22: against bare runc and NVIDIA's container toolkit in the same run (group i, the prestart hook of group e,
# group h's all-at-once row)
AT_ONCE_BARE_RATIO_TARGET = 1.5  # 64 shim creates at once / 64 bare runc creates at once
PRESTART_BARE_RATIO_TARGET = 1.25  # runc run + prestart hook, 1 GPU, planner running / bare runc run, per mode
# Group i: NVIDIA's toolkit in CDI mode, given one CDI device of deviceNodes only; as many nodes as the shim adds for
# AMD_VISIBLE_DEVICES=1 (card, render node, kfd), with type and numbers given (no host node is stat'ed; none exist).
NVIDIA_NODES = (("/dev/nvidia0", 195, 0), ("/dev/nvidiactl", 195, 255), ("/dev/nvidia-uvm", 510, 0))
PLANNER_DIR = "/run/oci-gpu-hook"  # a tmpfs of the private root's: the host's planner, if any, is never asked
NO_PLANNER = {"OCI_GPU_HOOK_PLANNER_SOCKET": ""}  # the front asks no planner: the Python launcher, as without one
# The environment runc gives the prestart hook (as in tests/containers/test_live_hook.py).
HOOK_PATH_ENV = "PATH=/usr/sbin:/usr/bin:/sbin:/bin"
GROUP_LETTERS = "abcdefghi"
CGROUP_MODES = ("v1", "v2")
# Untimed probe of group e: what the container sees in /dev/dri, and whether its device cgroup lets it open
# renderD129 (no driver behind it here: ENXIO when allowed, EPERM when denied).
DRI_PROBE = ("ls /dev/dri 2>&1; "
             "echo \"open renderD129: $(/bin/busybox head -c1 /dev/dri/renderD129 2>&1 >/dev/null)\"; echo done")


# Group h's untimed check after each sample: every container was created and its config.json names exactly the
# nodes of its GPU (i % 8) and no other GPU's, or (bare) none; then the containers are deleted and the bundles'
# config.json put back.
AT_ONCE_CHECK = r"""
import json, os, shutil, subprocess, sys
listing, runc, cid, kind = sys.argv[1:]
problems = []
for i, bundle in enumerate(json.load(open(listing))):
    spec = json.load(open(os.path.join(bundle, "config.json")))
    paths = sorted(d["path"] for d in (spec.get("linux") or {}).get("devices") or [] if "dri" in d["path"]
                   or d["path"] == "/dev/kfd")
    want = [] if kind == "bare" else sorted([f"/dev/dri/card{i % 8 + 1}", f"/dev/dri/renderD{128 + i % 8}", "/dev/kfd"])
    if paths != want:
        problems.append(f"container {i}: {paths}, not {want}")
    state = subprocess.run([runc, "state", f"{cid}-{i}"], capture_output=True, text=True)
    if state.returncode != 0:
        problems.append(f"container {i} was not created")
    subprocess.run([runc, "delete", "--force", f"{cid}-{i}"], capture_output=True)
    shutil.copyfile(os.path.join(os.path.dirname(bundle), os.path.basename(bundle) + ".pristine.json"),
                    os.path.join(bundle, "config.json"))
if problems:
    sys.exit("; ".join(problems[:5]))
"""


class BenchError(Exception):
    pass


class Interrupted(BenchError):
    pass


# Signals are only noted, and acted on between two commands: a runc or podman killed half-way through
# creating a container can leave pieces behind that outlive the cleanup.  A second Ctrl-C interrupts at once.
SIGNALS: list[int] = []


def note_signal(signum: int, _frame: object) -> None:
    if SIGNALS and signum == signal.SIGINT:
        raise KeyboardInterrupt
    SIGNALS.append(signum)


SAMPLE_TIMEOUT_S = 120.0
RUNNING: list[subprocess.Popen[bytes]] = []  # the timed command, killed by the alarm if it outlives SAMPLE_TIMEOUT_S


def on_alarm(_signum: int, _frame: object) -> None:
    for proc in RUNNING:
        proc.kill()


def check_signals() -> None:
    if SIGNALS:
        raise Interrupted(f"stopped by signal {signal.Signals(SIGNALS[0]).name}")


@dataclass
class Case:
    key: str
    label: str
    cmd: list[str]
    restore: tuple[str, str] | None = None  # (pristine copy, bundle config.json)
    reference: bool = False  # not a runtime command: no "added vs bare" for it
    env: dict[str, str] | None = None  # extra environment for this case
    base: str = ""  # key of this case's baseline when not the group's (group e: one baseline per cgroup mode)
    stdin: bytes | None = None  # fed to the command (default: /dev/null)
    env_only: bool = False  # env is the command's whole environment (as runc gives a hook), not an addition
    after: list[str] | None = None  # untimed, after each run (e.g. delete what `create` left)
    samples: list[float] = field(default_factory=list)
    warmup: list[float] = field(default_factory=list)


@dataclass
class Group:
    key: str
    title: str
    cases: list[Case]
    runs: int
    bare: str  # key of the baseline case
    letter: str = ""  # what --only selects it by
    note: str = ""


def sh(cmd: list[str], env: dict[str, str] | None = None, check: bool = True, timeout: float = 120) -> str:
    """Run an untimed helper command; return stdout."""
    # start_new_session everywhere: a Ctrl-C on the terminal reaches this script only (see note_signal)
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=timeout,
                          start_new_session=True)
    if check and proc.returncode != 0:
        raise BenchError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def loadavg() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def first_line(cmd: list[str]) -> str:
    try:
        out = sh(cmd, timeout=30)
    except (OSError, BenchError, subprocess.TimeoutExpired) as err:
        return f"unavailable ({err})"
    return out.strip().splitlines()[0] if out.strip() else "?"


class Bench:
    def __init__(self, opts: argparse.Namespace) -> None:
        self.opts = opts
        self.tmp = ""
        self.counter = 0
        self.runc = shutil.which("runc") or ""
        self.only: str = opts.only or GROUP_LETTERS
        self.podman = shutil.which("podman") if not opts.no_podman and "c" in self.only else None
        self.unshare = shutil.which("unshare") or ""
        self.env: dict[str, str] = {}
        self.meta: dict[str, Any] = {}
        self.groups: list[Group] = []
        self.sleeper = ""
        self.sleeper_bundle = ""
        self.podman_rootfs = ""
        self.lean_shim = ""
        self.lean_hook = ""
        self.console_shim: str | None = None
        self.config_file = ""
        self.native = False
        self.py_shim = self.py_hook = self.rewritten = ""
        self.empty_hooks = ""
        self.gpu_hooks = ""
        self.hook_log = ""
        self.notes: list[str] = []
        self.summary: dict[str, dict[str, dict[str, float]]] = {}
        self.rng = random.Random(opts.seed)
        self.planner: subprocess.Popen[bytes] | None = None
        self.planner_log = ""

    # ---------------------------------------------------------------- setup

    def next_id(self, case: str) -> str:
        self.counter += 1
        return f"{PREFIX}{case}-{self.counter}"

    def setup(self) -> None:
        if not self.runc:
            raise BenchError("runc not found on PATH")
        if "c" in self.only and self.opts.only and not self.podman:
            raise BenchError("--only asks for group c, but podman was not found or --no-podman was given")
        if "e" in self.only and not self.unshare:
            raise BenchError("unshare not found on PATH (group e needs it for cgroup v2 mode)")
        sysfs = os.path.abspath(self.opts.sysfs_root)
        if not os.path.isdir(sysfs):
            raise BenchError(f"fake sysfs {sysfs} not found")
        private = json.loads(os.environ[PRIVATE_ENV])
        self.tmp, venv = private["tmp"], private["venv"]
        self.mount_private_root()
        # One environment for every timed command: no OCI_GPU_HOOK_* from the caller (the config file at its
        # default path is what everyone reads), and runc found the same way by everyone.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("OCI_GPU_HOOK_") and k != PRIVATE_ENV}
        self.env.setdefault("PATH", SAFE_PATH)

        busybox = next((p for p in ("/bin/busybox", "/usr/bin/busybox") if os.access(p, os.X_OK)), None)
        if busybox is None:
            raise BenchError("busybox not found (apt-get install busybox-static)")
        rootfs = self.make_rootfs("rootfs", busybox)
        if self.podman:
            self.podman_rootfs = self.make_rootfs("podman-rootfs", busybox)  # podman writes /etc/hosts etc. into it

        # The operator's config file, at its default path (so every case has it), then `install` of the wheel.
        self.config_file = CONFIG_PATH
        os.makedirs(os.path.dirname(CONFIG_PATH), 0o755, exist_ok=True)
        with open(CONFIG_PATH, "w", encoding="utf-8") as handle:
            handle.write(f'sysfs_root = "{sysfs}"\nruntime = "runc"\ndevice_file_mode = 0o666\n'
                         'allow_env_requests = true\n\n[request_env]\namd = ["AMD_VISIBLE_DEVICES"]\n')
        ogh = os.path.join(venv, "bin", "oci-gpu-hook")
        installed = sh(self.with_state([ogh, "install", "--only", "podman"]), env=self.env)
        self.lean_shim = os.path.join(LAUNCHER_DIR, "oci-gpu-runtime")
        self.lean_hook = os.path.join(LAUNCHER_DIR, "oci-gpu-hook")
        for path in (self.lean_shim, self.lean_hook, os.path.join(HOOKS_DIR, "oci-gpu-hook-precreate.json")):
            if f"new: {path} (" not in installed:
                raise BenchError(f"oci-gpu-hook install did not write {path}:\n{installed}")
        self.native = os.access(self.lean_shim + ".py", os.F_OK)
        py_launchers = os.path.join(self.tmp, "launchers-py")
        sh([ogh, "launchers", py_launchers, "--no-native"], env=self.env)
        self.py_shim = os.path.join(py_launchers, "oci-gpu-runtime")
        self.py_hook = os.path.join(py_launchers, "oci-gpu-hook")
        self.hook_log = os.path.join(self.tmp, "prestart-sanity.log")
        # -I: not the current directory first on sys.path (run from the checkout, it would name the checkout)
        package = sh([os.path.join(venv, "bin", "python"), "-I", "-c",
                      "import oci_gpu_hook; print(oci_gpu_hook.__file__)"], env=self.env).strip()
        with open(self.py_shim, encoding="utf-8") as handle:
            launcher_python = handle.readline()[2:].strip()
        self.console_shim = shutil.which("oci-gpu-runtime", path=os.path.join(venv, "bin"))

        if not self.opts.no_planner:
            self.start_planner()

        if self.podman:
            self.empty_hooks = os.path.join(self.tmp, "hooks-empty")
            os.makedirs(self.empty_hooks)
            self.gpu_hooks = HOOKS_DIR  # the hook install put there

        kind = "native front + Python launcher" if self.native else "Python launcher (no C compiler)"
        self.meta = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "kernel": f"{platform.system()} {platform.release()} {platform.machine()}",
            "cpus": os.cpu_count(),
            "loadavg": f"at start {loadavg()}",
            "runc": first_line([self.runc, "--version"]),
            "podman": first_line([self.podman, "--version"]) if self.podman else "not used",
            "cgroups": self.cgroup_layout(),
            "install": private["install"] + "; then `oci-gpu-hook install --only podman` in a private mount namespace "
                       f"(/etc, /usr/local, /usr/share/containers overlaid): {kind} in {LAUNCHER_DIR}, the precreate "
                       f"hook in {HOOKS_DIR}",
            "python": f"{sys.executable} ({platform.python_version()})",
            "launcher_python": launcher_python,
            "package": package,
            # this checkout's, which built the wheel unless --wheel or --venv named another (package_digest tells)
            "commit": self.git_commit() + (" (this checkout; the wheel measured is the one --wheel/--venv named)"
                                           if self.opts.wheel or self.opts.venv else ""),
            "package_digest": self.package_digest(os.path.dirname(package)),
            "config_file": f"{CONFIG_PATH} (its default path, in the private root) in every case",
            "launcher_kind": kind,
            "planner": ("not started (--no-planner): every row is without it" if self.opts.no_planner else
                        f"`{self.lean_hook} serve --verbose` (as install's unit runs it) on {PLANNER_DIR}/planner.sock "
                        "(a tmpfs of the private root); the 'no planner' rows set OCI_GPU_HOOK_PLANNER_SOCKET= "
                        "(empty: the front asks none)"),
            "sysfs_root": sysfs,
            "lean_shim": self.lean_shim,
            "console_shim": self.console_shim or f"not found in {venv}/bin",
            "lean_hook": self.lean_hook,
            "groups": ",".join(self.only),
            "runs": self.opts.runs,
            "podman_runs": self.opts.podman_runs,
            "warmup": self.opts.warmup,
        }
        self.build_groups(rootfs)

    def mount_private_root(self) -> None:
        """This process runs in its own mount namespace (see main): overlay the directories install writes to, and
        a tmpfs on the planner's directory (made by outside() where the host has none)."""
        sh(["mount", "-t", "tmpfs", "-o", "mode=0700", "tmpfs", PLANNER_DIR])
        for n, target in enumerate(OVERLAID):
            upper, work = os.path.join(self.tmp, "ovl", f"u{n}"), os.path.join(self.tmp, "ovl", f"w{n}")
            os.makedirs(upper)
            os.makedirs(work)
            sh(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={target},upperdir={upper},workdir={work}",
                target])

    def with_state(self, argv: list[str]) -> list[str]:
        """``argv`` (install) in a mount namespace of its own with /var/lib overlaid, for its state directory
        (podman's storage stays on the host's /var/lib: its overlay driver refuses an overlayfs)."""
        upper, work = os.path.join(self.tmp, "ovl", "state"), os.path.join(self.tmp, "ovl", "state-work")
        os.makedirs(upper, exist_ok=True)
        os.makedirs(work, exist_ok=True)
        mount = f"mount -t overlay overlay -o lowerdir=/var/lib,upperdir={upper},workdir={work} /var/lib"
        return [self.unshare or "unshare", "-m", "sh", "-c", f"{mount} && exec {shlex.join(argv)}"]

    @staticmethod
    def cgroup_layout() -> str:
        """What is mounted at /sys/fs/cgroup (v1 mode uses it as it is), and bpf_jit_harden (v2 mode loads eBPF)."""
        found = []
        try:
            with open("/proc/self/mountinfo", encoding="utf-8") as handle:
                for line in handle:
                    fields = line.split()
                    fstype = fields[fields.index("-") + 1]
                    if fstype == "cgroup2" or fields[4] == "/sys/fs/cgroup":
                        found.append(f"{fstype} at {fields[4]}")
            with open("/proc/sys/net/core/bpf_jit_harden", encoding="utf-8") as handle:
                found.append(f"bpf_jit_harden={handle.read().strip()}")
        except (OSError, ValueError, IndexError) as err:
            found.append(f"unreadable ({err})")
        return "; ".join(found)

    def git_commit(self) -> str:
        try:
            head = sh(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], timeout=10).strip()
            dirty = sh(["git", "-C", REPO, "status", "--porcelain", "--", "oci_gpu_hook"], timeout=10).strip()
        except (OSError, BenchError, subprocess.TimeoutExpired):
            return "unknown"
        return head + (" + uncommitted changes in oci_gpu_hook/" if dirty else "")

    @staticmethod
    def package_digest(directory: str) -> str:
        """sha256 of every .py and .c file of the package, subpackages included, to tell runs apart."""
        digest = hashlib.sha256()
        found = []
        for folder, dirs, files in os.walk(directory):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            found += [os.path.join(folder, n) for n in files if n.endswith((".py", ".c"))]
        for path in sorted(found):
            digest.update(os.path.relpath(path, directory).encode() + b"\0")
            with open(path, "rb") as handle:
                digest.update(handle.read())
        return digest.hexdigest()[:12]

    def make_rootfs(self, name: str, busybox: str) -> str:
        rootfs = os.path.join(self.tmp, name)
        os.makedirs(os.path.join(rootfs, "bin"))
        shutil.copy2(busybox, os.path.join(rootfs, "bin", "busybox"))
        for applet in ("sh", "true", "sleep", "ls"):
            os.symlink("busybox", os.path.join(rootfs, "bin", applet))
        return rootfs

    def make_bundle(self, name: str, rootfs: str, args: list[str], extra_env: list[str],
                    hook_env: list[str] | None = None) -> str:
        """A bundle; with ``hook_env`` (the hook's environment) it lists ``oci-gpu-hook prestart``."""
        bundle = os.path.join(self.tmp, name)
        os.makedirs(bundle)
        sh([self.runc, "spec", "--bundle", bundle])
        path = os.path.join(bundle, "config.json")
        with open(path, encoding="utf-8") as handle:
            spec = json.load(handle)
        spec["process"]["terminal"] = False
        spec["process"]["args"] = args
        spec["process"]["env"] = [*spec["process"].get("env", []), *extra_env]
        spec["root"]["path"] = rootfs
        if hook_env is not None:
            spec["hooks"] = {"prestart": [{"path": self.lean_hook, "args": ["oci-gpu-hook", "prestart"],
                                           "env": hook_env}]}
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(spec, handle, indent=2)
        shutil.copyfile(path, os.path.join(self.tmp, f"{name}.pristine.json"))
        return bundle

    def start_planner(self) -> None:
        """`serve` through the launcher install wrote, as the systemd unit runs it; ready when its socket answers."""
        import socket

        self.planner_log = os.path.join(self.tmp, "planner.log")
        with open(self.planner_log, "wb") as log:
            self.planner = subprocess.Popen([self.lean_hook, "serve", "--verbose"], stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=log, env=self.env, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.planner.poll() is not None:
                raise BenchError(f"the planner exited {self.planner.returncode}: {self.planner_text()}")
            try:
                with socket.socket(socket.AF_UNIX) as probe:
                    probe.connect(os.path.join(PLANNER_DIR, "planner.sock"))
                return
            except OSError:
                time.sleep(0.05)
        raise BenchError(f"the planner did not start: {self.planner_text()}")

    def planner_text(self) -> str:
        try:
            with open(self.planner_log, encoding="utf-8", errors="replace") as handle:
                return handle.read()
        except OSError:
            return ""

    def planner_answered(self) -> int:
        return self.planner_text().count("planner: ok ")

    def stop_planner(self) -> str | None:
        if self.planner is None:
            return None
        if self.planner.poll() is None:
            self.planner.terminate()
        try:
            self.planner.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.planner.pid, signal.SIGKILL)
            self.planner.wait()
        try:
            os.killpg(self.planner.pid, signal.SIGKILL)  # workers still busy (none should be)
        except ProcessLookupError:
            pass
        refused = [line for line in self.planner_text().splitlines() if "planner: refused" in line
                   or "bad request" in line or "imported" in line]
        self.planner = None
        return f"the planner logged: {refused[:3]}" if refused else None

    def pristine(self, bundle: str) -> tuple[str, str]:
        return os.path.join(self.tmp, f"{os.path.basename(bundle)}.pristine.json"), os.path.join(bundle, "config.json")

    def sanity_shim(self, gpu: str) -> None:
        """Untimed: the shim must really add the GPU, or the numbers would mean nothing."""
        src, dst = self.pristine(gpu)
        shutil.copyfile(src, dst)
        before = self.planner_answered()
        sh([self.lean_shim, "run", "--bundle", gpu, self.next_id("sanity")], env=self.env)
        with open(dst, encoding="utf-8") as handle:
            if EXPECTED_NODE not in handle.read():
                raise BenchError(f"the lean shim did not add {EXPECTED_NODE} to config.json")
        if self.planner is not None and self.planner_answered() != before + 1:
            raise BenchError(f"the planner did not answer the installed shim: {self.planner_text()[-2000:]}")
        shutil.copyfile(src, dst)
        sh([self.lean_shim, "run", "--bundle", gpu, self.next_id("sanity")], env={**self.env, **NO_PLANNER})
        with open(dst, encoding="utf-8") as handle:
            if EXPECTED_NODE not in handle.read():
                raise BenchError(f"the lean shim without the planner did not add {EXPECTED_NODE} to config.json")
        if self.planner is not None and self.planner_answered() != before + 1:
            raise BenchError("the planner answered a shim told to ask none")
        # group a's reference: bare runc given the spec the shim wrote (what the granted devices cost runc itself)
        done = os.path.join(self.tmp, "bundle-gpu-done")
        os.makedirs(done)
        shutil.copyfile(dst, os.path.join(done, "config.json"))
        shutil.copyfile(dst, os.path.join(self.tmp, "bundle-gpu-done.pristine.json"))
        self.rewritten = done
        shutil.copyfile(src, dst)

    def sanity_podman(self) -> None:
        """Untimed: the precreate hook and the shim under podman must really add the GPU."""
        probe = ["/bin/busybox", "ls", EXPECTED_NODE]
        with_hook = self.podman_cmd("runc", self.gpu_hooks, self.next_id("sanity"), probe)
        sh(with_hook, env=self.env)
        via_shim = self.podman_cmd(self.lean_shim, self.empty_hooks, self.next_id("sanity"), probe)
        sh(via_shim, env=self.env)
        without = self.podman_cmd("runc", self.empty_hooks, self.next_id("sanity"), probe)
        if subprocess.run(without, capture_output=True, env=self.env, timeout=120,
                          start_new_session=True).returncode == 0:
            raise BenchError(f"{EXPECTED_NODE} exists without the hook; the podman comparison would be void")

    def sanity_prestart(self, rootfs: str) -> None:
        """Untimed, in both cgroup modes: with the prestart hook and AMD_VISIBLE_DEVICES=1 the container has
        renderD129 and its device cgroup lets it open the node (ENXIO, not EPERM); without a request, or
        without the hook, it has no renderD129.  The hook logs (only here) which cgroup mode it extended."""
        args = ["/bin/sh", "-c", DRI_PROBE]
        hook_env = [HOOK_PATH_ENV, f"OCI_GPU_HOOK_LOG_FILE={self.hook_log}"]
        probes = [
            ("bare", self.make_bundle("probe-bare", rootfs, args, ["AMD_VISIBLE_DEVICES=1"]), False),
            ("hook", self.make_bundle("probe-hook", rootfs, args, ["AMD_VISIBLE_DEVICES=1"], hook_env), True),
            ("hook-nogpu", self.make_bundle("probe-hook-nogpu", rootfs, args, [], hook_env), False),
        ]
        for mode in CGROUP_MODES:
            for name, bundle, expect_gpu in probes:
                check_signals()
                cid = self.next_id(f"{mode}-sanity-{name}")
                out = sh(self.in_mode(mode, [self.runc, "run", "--bundle", bundle, cid]), env=self.env)
                what = f"{mode} {name} probe container ({cid})"
                lines = out.splitlines()
                opened = next((line for line in lines if line.startswith("open renderD129:")), None)
                if "done" not in lines or opened is None:
                    raise BenchError(f"the {what} did not finish: {out.strip()!r}")
                listed = " ".join(lines[:lines.index(opened)]).split()  # what ls /dev/dri printed
                if expect_gpu:
                    if "renderD129" not in listed or "No such device or address" not in opened:
                        raise BenchError(f"the {what} did not get a usable {EXPECTED_NODE} "
                                         f"(ENXIO expected when opening it): {out.strip()!r}")
                    logged = []
                    if os.path.exists(self.hook_log):
                        with open(self.hook_log, encoding="utf-8") as handle:
                            logged = [json.loads(line) for line in handle if line.strip()]
                    mine = [entry for entry in logged if entry.get("id") == cid]
                    if [line.get("cgroup") for line in mine] != [mode] or mine[0].get("outcome") != "ok":
                        raise BenchError(f"the hook's log for the {what} does not say it extended a {mode} "
                                         f"device cgroup: {mine}")
                elif "renderD129" in listed or "No such file or directory" not in opened:
                    raise BenchError(f"the {what} has renderD129; the comparison would be void: {out.strip()!r}")

    def podman_cmd(self, runtime: str, hooks: str, name: str, args: list[str]) -> list[str]:
        assert self.podman
        return [self.podman, *PODMAN_GLOBAL, f"--runtime={runtime}", f"--hooks-dir={hooks}", *PODMAN_RUN,
                "--name", name, "--rootfs", self.podman_rootfs, *args]

    def in_mode(self, mode: str, argv: list[str]) -> list[str]:
        """``argv`` as group e runs it: v1 as it is; v2 in a private mount namespace with cgroup2 over
        /sys/fs/cgroup (as tests/containerlib.cgroup2_wrap), so that runc uses its cgroup v2 manager."""
        if mode == "v1":
            return argv
        command = " ".join(shlex.quote(arg) for arg in argv)
        return [self.unshare, "-m", "sh", "-c", f"mount -t cgroup2 none /sys/fs/cgroup && exec {command}"]

    def build_groups(self, rootfs: str) -> None:
        runs = self.opts.runs
        gpu = nogpu = ""
        if "a" in self.only or "d" in self.only:
            gpu = self.make_bundle("bundle-gpu", rootfs, ["/bin/true"], ["AMD_VISIBLE_DEVICES=1"])
            nogpu = self.make_bundle("bundle-nogpu", rootfs, ["/bin/true"], [])
            check_signals()
            self.sanity_shim(gpu)
        if self.podman:
            check_signals()
            self.sanity_podman()
        if "e" in self.only:
            self.sanity_prestart(rootfs)

        if "a" in self.only:
            run_args = ["run", "--bundle", gpu, "{id}"]
            cases = [
                Case("bare", "runc run (bare)", [self.runc, *run_args], self.pristine(gpu)),
                Case("lean", f"installed shim run (install's oci-gpu-runtime){self.with_planner}",
                     [self.lean_shim, *run_args], self.pristine(gpu)),
                Case("lean-noplanner", "installed shim run, no planner", [self.lean_shim, *run_args],
                     self.pristine(gpu), env=NO_PLANNER),
                Case("py", "Python launcher shim run (--no-native)", [self.py_shim, *run_args], self.pristine(gpu)),
            ]
            if self.console_shim:
                cases.append(Case("console", "console-script shim run (venv oci-gpu-runtime)",
                                  [self.console_shim, *run_args], self.pristine(gpu)))
            cases.append(self.shim_alone(run_args, gpu))
            cases.append(Case("rewritten", "(reference) bare runc run of the spec the shim wrote: the granted "
                              "devices' cost to runc itself", [self.runc, "run", "--bundle", self.rewritten, "{id}"],
                              self.pristine(self.rewritten), reference=True))
            self.groups.append(Group("run", "a. runc run, AMD_VISIBLE_DEVICES=1 (3 nodes added by the shim)",
                                     cases, runs, "bare", "a"))

        if "b" in self.only:
            # The detached container for the pass-through group is started in run(), once everything is ready.
            self.sleeper_bundle = self.make_bundle("bundle-sleeper", rootfs, ["/bin/sh", "-c", "sleep 1000"], [])
            self.sleeper = f"{PREFIX}sleeper"
            cases = [
                Case("bare", "runc state (bare)", [self.runc, "state", self.sleeper]),
                Case("lean", "installed shim state", [self.lean_shim, "state", self.sleeper]),
                Case("py", "Python launcher shim state (--no-native)", [self.py_shim, "state", self.sleeper]),
            ]
            if self.console_shim:
                cases.append(Case("console", "console-script shim state",
                                  [self.console_shim, "state", self.sleeper]))
            python = self.meta["launcher_python"].split()
            cases.append(Case("python", f"(reference) {' '.join(python)} -c pass: the launcher's interpreter floor",
                              [*python, "-c", "pass"], reference=True))
            self.groups.append(Group("state", "b. pass-through: state of a running container", cases, runs, "bare",
                                     "b"))

        if self.podman:
            true = ["/bin/true"]
            cases = [
                Case("bare", "podman run, runc, no hooks", self.podman_cmd("runc", self.empty_hooks, "{id}", true)),
                Case("hook", "podman run, runc + the precreate hook install wrote",
                     self.podman_cmd("runc", self.gpu_hooks, "{id}", true)),
                Case("shim", "podman run, --runtime=installed shim",
                     self.podman_cmd(self.lean_shim, self.empty_hooks, "{id}", true)),
            ]
            self.groups.append(Group("podman", "c. podman run --rm, AMD_VISIBLE_DEVICES=1",
                                     cases, self.opts.podman_runs, "bare", "c"))
        elif "c" in self.only:
            self.notes.append("podman not found or --no-podman: group c skipped")

        if "d" in self.only:
            run_args = ["run", "--bundle", nogpu, "{id}"]
            create_args = ["create", "--bundle", nogpu, "{id}"]
            delete = [self.runc, "delete", "--force", "{id}"]  # untimed: what create left
            cases = [
                Case("bare", "runc run (bare), no GPU request", [self.runc, *run_args], self.pristine(nogpu)),
                Case("lean", "installed shim run, no GPU request", [self.lean_shim, *run_args], self.pristine(nogpu)),
                Case("py", "Python launcher shim run, no GPU request (--no-native)", [self.py_shim, *run_args],
                     self.pristine(nogpu)),
                self.shim_alone(run_args, nogpu),
                Case("create-bare", "runc create (bare), no GPU request", [self.runc, *create_args],
                     self.pristine(nogpu), after=delete),
                Case("create-lean", "installed shim create, no GPU request", [self.lean_shim, *create_args],
                     self.pristine(nogpu), base="create-bare", after=delete),
            ]
            self.groups.append(Group("nogpu",
                                     "d. run and create, AMD_VISIBLE_DEVICES unset (shim leaves config.json alone)",
                                     cases, runs, "bare", "d"))

        if "e" in self.only:
            self.groups.append(self.prestart_group(rootfs))

        if "f" in self.only:
            self.groups.append(self.lifecycle_group(rootfs))

        if "g" in self.only:
            self.groups.append(self.create_group(rootfs))

        if "h" in self.only:
            self.groups.append(self.at_once_group(rootfs))

        if "i" in self.only:
            self.groups.append(self.versus_group(rootfs))

    @property
    def with_planner(self) -> str:
        return "" if self.opts.no_planner else ", planner running"

    def create_group(self, rootfs: str) -> Group:
        """g: runc create with one GPU, bare and through the installed shim with and without the planner."""
        gpu = self.make_bundle("bundle-g-gpu", rootfs, ["/bin/true"], ["AMD_VISIBLE_DEVICES=1"])
        create = ["create", "--bundle", gpu, "{id}"]
        delete = [self.runc, "delete", "--force", "{id}"]  # untimed: what create left
        alone = {"OCI_GPU_HOOK_RUNTIME": "/bin/true"}
        cases = [
            Case("bare", "runc create (bare), AMD_VISIBLE_DEVICES=1", [self.runc, *create], self.pristine(gpu),
                 after=delete),
            Case("lean", f"installed shim create, AMD_VISIBLE_DEVICES=1{self.with_planner}", [self.lean_shim, *create],
                 self.pristine(gpu), after=delete),
            Case("lean-noplanner", "installed shim create, AMD_VISIBLE_DEVICES=1, no planner",
                 [self.lean_shim, *create], self.pristine(gpu), env=NO_PLANNER, after=delete),
            Case("py", "Python launcher shim create (--no-native)", [self.py_shim, *create], self.pristine(gpu),
                 after=delete),
            Case("alone", f"(reference) installed shim create with OCI_GPU_HOOK_RUNTIME=/bin/true{self.with_planner}",
                 [self.lean_shim, *create], self.pristine(gpu), reference=True, env=alone),
            Case("alone-noplanner", "(reference) the same, no planner", [self.lean_shim, *create], self.pristine(gpu),
                 reference=True, env={**alone, **NO_PLANNER}),
        ]
        return Group("create", "g. runc create, AMD_VISIBLE_DEVICES=1 (the containerd and Docker call)", cases,
                     self.opts.runs, "bare", "g")

    def nvidia_setup(self) -> dict[str, str]:
        """NVIDIA's runtime in CDI mode: its config file (found through XDG_CONFIG_HOME, set only for its cases)
        and one CDI spec in a directory of the temporary one; returns the environment its cases add."""
        config_home = os.path.join(self.tmp, "nvidia-config")
        spec_dir = os.path.join(self.tmp, "nvidia-cdi")
        os.makedirs(os.path.join(config_home, "nvidia-container-runtime"))
        os.makedirs(spec_dir)
        with open(os.path.join(config_home, "nvidia-container-runtime", "config.toml"), "w", encoding="utf-8") as out:
            out.write('[nvidia-container-runtime]\nmode = "cdi"\nruntimes = ["runc"]\nlog-level = "info"\n'
                      'debug = "/dev/null"\n\n[nvidia-container-runtime.modes.cdi]\n'
                      f'default-kind = "nvidia.com/gpu"\nspec-dirs = ["{spec_dir}"]\n')
        nodes = [{"path": path, "type": "c", "major": major, "minor": minor} for path, major, minor in NVIDIA_NODES]
        spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
                "devices": [{"name": "0", "containerEdits": {"deviceNodes": nodes}}]}
        with open(os.path.join(spec_dir, "nvidia.json"), "w", encoding="utf-8") as out:
            json.dump(spec, out, indent=2)
        return {"XDG_CONFIG_HOME": config_home}

    def sanity_versus(self, runtime: str, bundle: str, env: dict[str, str] | None, want: str) -> None:
        """Untimed: a create through ``runtime`` must write ``want`` into config.json (else the row means nothing)."""
        src, dst = self.pristine(bundle)
        shutil.copyfile(src, dst)
        cid = self.next_id("sanity")
        # stdio to a file, not a pipe: the created container holds its runtime's stdio open
        with open(os.path.join(self.tmp, "stderr"), "w+b") as err:
            code = subprocess.run([runtime, "create", "--bundle", bundle, cid], stdin=subprocess.DEVNULL,
                                  stdout=err, stderr=err, env={**self.env, **(env or {})}, timeout=120,
                                  start_new_session=True).returncode
            err.seek(0)
            said = err.read().decode(errors="replace").strip()
        sh([self.runc, "delete", "--force", cid], env=self.env, check=False)
        if code != 0:
            raise BenchError(f"{runtime} create --bundle {bundle} exited {code}: {said}")
        with open(dst, encoding="utf-8") as handle:
            if want not in handle.read():
                raise BenchError(f"{runtime} create did not add {want} to config.json")
        shutil.copyfile(src, dst)

    def versus_group(self, rootfs: str) -> Group:
        """i: runc create with one GPU, cgroup v1 and v2 interleaved: bare runc, the installed shim (front +
        planner), the shim with an empty request variable, and NVIDIA's toolkit in CDI mode (``--nvidia-runtime``)."""
        gpu = self.make_bundle("bundle-i-gpu", rootfs, ["/bin/true"], ["AMD_VISIBLE_DEVICES=1"])
        empty = self.make_bundle("bundle-i-empty", rootfs, ["/bin/true"], ["AMD_VISIBLE_DEVICES="])
        self.sanity_versus(self.lean_shim, gpu, None, EXPECTED_NODE)
        nvidia = self.opts.nvidia_runtime
        nv_bundle = nv_env = None
        if nvidia:
            nv_env = self.nvidia_setup()
            nv_bundle = self.make_bundle("bundle-i-nvidia", rootfs, ["/bin/true"], ["NVIDIA_VISIBLE_DEVICES=0"])
            self.sanity_versus(nvidia, nv_bundle, nv_env, NVIDIA_NODES[0][0])
            self.meta["nvidia_runtime"] = f"{nvidia} ({first_line([nvidia, '--version'])}), CDI mode"
        else:
            self.notes.append("group i: no --nvidia-runtime given: NVIDIA's toolkit column skipped")
        cases = []
        for mode in CGROUP_MODES:
            wrap = "" if mode == "v1" else " in unshare -m + cgroup2"
            rows = [("bare", f"runc create (bare), AMD_VISIBLE_DEVICES=1{wrap}", self.runc, gpu, None),
                    ("shim", f"installed shim create, AMD_VISIBLE_DEVICES=1{self.with_planner}", self.lean_shim, gpu,
                     None),
                    ("shim-empty", "installed shim create, AMD_VISIBLE_DEVICES= (empty: no request)", self.lean_shim,
                     empty, None)]
            if nvidia and nv_bundle:
                rows.append(("nvidia", "NVIDIA toolkit v1.17.4 create, CDI, NVIDIA_VISIBLE_DEVICES=0 (3 deviceNodes)",
                             nvidia, nv_bundle, nv_env))
            for key, label, runtime, bundle, env in rows:
                cases.append(Case(f"{mode}-{key}", f"{mode}: {label}",
                                  self.in_mode(mode, [runtime, "create", "--bundle", bundle, "{id}"]),
                                  self.pristine(bundle), env=env, base=f"{mode}-bare",
                                  after=self.in_mode(mode, [self.runc, "delete", "--force", "{id}"])))
        return Group("versus", "i. create with 1 GPU beside NVIDIA's toolkit, cgroup v1 and v2 (modes interleaved)",
                     cases, self.opts.runs, "v1-bare", "i")

    def at_once_group(self, rootfs: str) -> Group:
        """h: AT_ONCE containers, GPU i % 8 each, created one after another and all at once through the installed
        shim (with and without the planner), bare runc the same; each sample the wall time of all of them.  After
        every sample (untimed): each config.json must name exactly its GPU's nodes, then the containers go."""
        bundles = [self.make_bundle(f"bundle-h-{i}", rootfs, ["/bin/true"], [f"AMD_VISIBLE_DEVICES={i % 8}"])
                   for i in range(AT_ONCE)]
        listing = os.path.join(self.tmp, "bundles-h.json")
        with open(listing, "w", encoding="utf-8") as handle:
            json.dump(bundles, handle)
        check = os.path.join(self.tmp, "check-h.py")
        with open(check, "w", encoding="utf-8") as handle:
            handle.write(AT_ONCE_CHECK)

        def line(runtime: str, together: bool) -> list[str]:
            one = f"{shlex.quote(runtime)} create --bundle {self.tmp}/bundle-h-$i {{id}}-$i"
            loop = f"for i in $(seq 0 {AT_ONCE - 1}); do "
            return ["sh", "-c", loop + (f"{one} & done; wait" if together else f"{one} || exit 1; done")]

        def after(granted: bool) -> list[str]:
            return [sys.executable, check, listing, self.runc, "{id}", "granted" if granted else "bare"]

        cases = [
            Case("bare", f"{AT_ONCE} x runc create (bare), one after another", line(self.runc, False),
                 after=after(False)),
            Case("bare-at-once", f"{AT_ONCE} x runc create (bare), all at once", line(self.runc, True),
                 after=after(False)),
            Case("serial", f"{AT_ONCE} x installed shim create, one after another{self.with_planner}",
                 line(self.lean_shim, False), after=after(True)),
            Case("at-once", f"{AT_ONCE} x installed shim create, all at once{self.with_planner}",
                 line(self.lean_shim, True), after=after(True)),
            Case("at-once-noplanner", f"{AT_ONCE} x installed shim create, all at once, no planner",
                 line(self.lean_shim, True), env=NO_PLANNER, after=after(True)),
        ]
        return Group("at-once", f"h. {AT_ONCE} GPU containers (GPU i % 8 each), one after another and all at once",
                     cases, self.opts.at_once_runs, "bare", "h")

    def lifecycle_group(self, rootfs: str) -> Group:
        """f: create + start + delete, as containerd and docker call the runtime, through one sh line."""
        gpu = self.make_bundle("bundle-f-gpu", rootfs, ["/bin/true"], ["AMD_VISIBLE_DEVICES=1"])
        nogpu = self.make_bundle("bundle-f-nogpu", rootfs, ["/bin/true"], [])

        def life(runtime: str, bundle: str) -> list[str]:
            rt, b = shlex.quote(runtime), shlex.quote(bundle)
            return ["sh", "-c", f"{rt} create --bundle {b} {{id}} && {rt} start {{id}} && "
                                f"{rt} delete --force {{id}}"]

        cases = [
            Case("bare", "runc create + start + delete (bare), AMD_VISIBLE_DEVICES=1", life(self.runc, gpu),
                 self.pristine(gpu)),
            Case("lean", f"installed shim create + start + delete, AMD_VISIBLE_DEVICES=1{self.with_planner}",
                 life(self.lean_shim, gpu), self.pristine(gpu)),
            Case("lean-noplanner", "installed shim create + start + delete, AMD_VISIBLE_DEVICES=1, no planner",
                 life(self.lean_shim, gpu), self.pristine(gpu), env=NO_PLANNER),
            Case("lean-nogpu", "installed shim create + start + delete, no GPU request", life(self.lean_shim, nogpu),
                 self.pristine(nogpu)),
            Case("py", "Python launcher shim create + start + delete, AMD_VISIBLE_DEVICES=1 (--no-native)",
                 life(self.py_shim, gpu), self.pristine(gpu)),
        ]
        return Group("lifecycle", "f. lifecycle: create + start + delete through the runtime", cases,
                     self.opts.runs, "bare", "f")

    def prestart_group(self, rootfs: str) -> Group:
        """e: bare runc run vs runc run with the prestart hook (1 GPU; no request), cgroup v1 and v2 interleaved.

        The three bundles share the rootfs and run /bin/true; only the hook entry and AMD_VISIBLE_DEVICES differ.
        Each mode has its own baseline: in v2 the bare run pays the same unshare + mount as the hooked ones."""
        hook_env = [HOOK_PATH_ENV]
        bare = self.make_bundle("bundle-e-bare", rootfs, ["/bin/true"], ["AMD_VISIBLE_DEVICES=1"])
        hook = self.make_bundle("bundle-e-hook", rootfs, ["/bin/true"], ["AMD_VISIBLE_DEVICES=1"], hook_env)
        hook_nogpu = self.make_bundle("bundle-e-hook-nogpu", rootfs, ["/bin/true"], [], hook_env)
        # runc gives a hook only the environment its entry lists: the planner is turned off there
        hook_noplanner = self.make_bundle("bundle-e-hook-noplanner", rootfs, ["/bin/true"], ["AMD_VISIBLE_DEVICES=1"],
                                          [*hook_env, "OCI_GPU_HOOK_PLANNER_SOCKET="])
        cases = []
        for mode in CGROUP_MODES:
            wrap = "" if mode == "v1" else " in unshare -m + cgroup2"
            for key, label, bundle in (
                ("bare", f"runc run (bare), AMD_VISIBLE_DEVICES=1{wrap}", bare),
                ("hook", f"runc run + prestart hook, AMD_VISIBLE_DEVICES=1 (1 GPU of 8){self.with_planner}", hook),
                ("hook-noplanner", "runc run + prestart hook, AMD_VISIBLE_DEVICES=1, no planner", hook_noplanner),
                ("hook-nogpu", "runc run + prestart hook, no GPU request", hook_nogpu),
            ):
                # the mode leads the case key, so container ids say which mode to delete them in (see cleanup)
                cases.append(Case(f"{mode}-{key}", f"{mode}: {label}",
                                  self.in_mode(mode, [self.runc, "run", "--bundle", bundle, "{id}"]),
                                  self.pristine(bundle), base=f"{mode}-bare"))
        # The hook's own no-request path without runc: Python start, imports, config.json read, no plan.
        state = json.dumps({"ociVersion": "1.0.2", "id": f"{PREFIX}alone", "status": "created", "pid": 1,
                            "bundle": hook_nogpu}).encode()
        cases.append(Case("hook-alone", "(reference) oci-gpu-hook prestart alone, no GPU request "
                          "(state on stdin, no container)", [self.lean_hook, "prestart"],
                          reference=True, env={"PATH": HOOK_PATH_ENV[5:]}, stdin=state, env_only=True))
        cases.append(Case("hook-alone-py", "(reference) the same with the Python launcher (--no-native)",
                          [self.py_hook, "prestart"], reference=True, env={"PATH": HOOK_PATH_ENV[5:]}, stdin=state,
                          env_only=True))
        return Group("prestart", "e. runc run with the prestart hook, cgroup v1 and v2 (modes interleaved)",
                     cases, self.opts.runs, "v1-bare", "e")

    def shim_alone(self, run_args: list[str], bundle: str) -> Case:
        """The lean shim with /bin/true as the real runtime: its own cost (Python start, imports, rewrite)."""
        return Case("alone", "(reference) installed shim run with OCI_GPU_HOOK_RUNTIME=/bin/true: its own work",
                    [self.lean_shim, *run_args], self.pristine(bundle), reference=True,
                    env={"OCI_GPU_HOOK_RUNTIME": "/bin/true"})

    # ---------------------------------------------------------------- measuring

    def once(self, case: Case) -> float:
        if case.restore:
            shutil.copyfile(*case.restore)
        cid = self.next_id(case.key)
        cmd = [arg.replace("{id}", cid) for arg in case.cmd]  # also inside group e's "sh -c" line
        env = self.env
        if case.env:
            env = case.env if case.env_only else {**self.env, **case.env}
        if self.opts.settle:
            time.sleep(self.opts.settle / 1000)
        # stderr to a file, not a pipe: a container that `create` left holds runc's stdio open.  The wait is a
        # blocking waitpid: with a timeout, Popen.wait polls with growing sleeps (0.5, 1, 2, 4, ... ms), which
        # rounds every sample up to 3.5, 7.5, 15.5, 31.5, 63.5 ms.  The watchdog instead is an alarm.
        with open(os.path.join(self.tmp, "stderr"), "w+b") as err:
            signal.setitimer(signal.ITIMER_REAL, SAMPLE_TIMEOUT_S)
            try:
                start = time.perf_counter()
                # stdin goes through a pipe (as runc gives a hook its state), written inside the timed region
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL if case.stdin is None else subprocess.PIPE,
                                        stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True)
                RUNNING[:] = [proc]
                if case.stdin is not None:
                    assert proc.stdin is not None
                    try:
                        proc.stdin.write(case.stdin)
                        proc.stdin.close()
                    except BrokenPipeError:
                        pass
                code = proc.wait()
                elapsed = (time.perf_counter() - start) * 1000
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                RUNNING.clear()
            if code != 0:
                err.seek(0)
                late = f" (killed after {SAMPLE_TIMEOUT_S:g} s)" if code == -signal.SIGKILL else ""
                raise BenchError(f"{case.label}: {' '.join(cmd)} exited {code}{late}: "
                                 f"{err.read().decode(errors='replace').strip()}")
        if case.after:
            sh([arg.replace("{id}", cid) for arg in case.after], env=self.env)
        return elapsed

    def measure(self, group: Group) -> None:
        total = self.opts.warmup + group.runs
        print(f"# {group.title}: {len(group.cases)} cases x ({self.opts.warmup} warm-up + {group.runs}) runs",
              file=sys.stderr, flush=True)
        for round_no in range(total):
            # Every round in its own order: what ran just before a command changes its time (caches, the
            # untimed delete after a create, a GPU case's cgroup work), so a fixed order would bias some cases.
            order = list(group.cases)
            if not self.opts.fixed_order:
                self.rng.shuffle(order)
            for case in order:
                check_signals()
                sample = self.once(case)
                (case.warmup if round_no < self.opts.warmup else case.samples).append(sample)

    def start_sleeper(self) -> None:
        # Detached, with stdio on /dev/null: the container inherits runc's stdio, so a pipe would never close.
        proc = subprocess.run([self.runc, "run", "-d", "--bundle", self.sleeper_bundle, self.sleeper],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=self.env, timeout=60, start_new_session=True)
        if proc.returncode != 0:
            raise BenchError(f"runc run -d {self.sleeper} failed ({proc.returncode})")
        state = json.loads(sh([self.runc, "state", self.sleeper]))
        if state.get("status") != "running":
            raise BenchError(f"{self.sleeper} is {state.get('status')}, not running")

    def run(self) -> None:
        for group in self.groups:
            if group.key == "state":
                self.start_sleeper()
            self.measure(group)
            if group.key == "state":
                self.stop_runc(self.sleeper)
        self.meta["loadavg"] += f", at end {loadavg()} (1, 5, 15 min; other work on this machine adds noise)"

    # ---------------------------------------------------------------- cleanup

    def stop_runc(self, cid: str) -> None:
        # A group-e container of cgroup v2 mode (id "ogh-bench-<pid>-v2-...") is known to runc by its state in
        # /run/runc, but its cgroup only inside a namespace with cgroup2 on /sys/fs/cgroup: delete it there.
        mode = "v2" if cid.startswith(f"{PREFIX}v2-") else "v1"
        subprocess.run(self.in_mode(mode, [self.runc, "kill", cid, "KILL"]), capture_output=True, timeout=30,
                       start_new_session=True)
        for _ in range(50):
            if subprocess.run(self.in_mode(mode, [self.runc, "delete", "--force", cid]), capture_output=True,
                              timeout=30, start_new_session=True).returncode == 0:
                return
            time.sleep(0.1)

    @staticmethod
    def leftover_cgroups() -> list[str]:
        """Cgroups named after our containers (runc removes them on delete): remove the empty ones, list the rest."""
        left = []
        root = "/sys/fs/cgroup"
        try:
            hierarchies = [os.path.join(root, name) for name in os.listdir(root)]
        except OSError:
            return left
        for hierarchy in hierarchies:
            try:
                names = [n for n in os.listdir(hierarchy) if n.startswith(PREFIX)]
            except OSError:
                continue
            for name in names:
                path = os.path.join(hierarchy, name)
                try:
                    os.rmdir(path)
                except OSError as err:
                    left.append(f"{path} ({err.strerror})")
        return left

    def cleanup(self) -> list[str]:
        problems: list[str] = []
        if self.runc:
            try:
                listed = sh([self.runc, "list", "--quiet"], timeout=30).split()
                for cid in listed:
                    if cid.startswith(PREFIX):
                        self.stop_runc(cid)
                left = [c for c in sh([self.runc, "list", "--quiet"], timeout=30).split() if c.startswith(PREFIX)]
                if left:
                    problems.append(f"runc containers left behind: {', '.join(left)}")
            except (OSError, BenchError, subprocess.TimeoutExpired) as err:
                problems.append(f"runc cleanup: {err}")
            cgroups = self.leftover_cgroups()
            if cgroups:
                problems.append(f"cgroups left behind: {', '.join(cgroups)}")
        problem = self.stop_planner()
        if problem:
            problems.append(problem)
        if self.podman:
            try:
                podman = [self.podman, *PODMAN_GLOBAL]
                names = sh([*podman, "ps", "--all", "--format", "{{.Names}}", "--filter", f"name=^{PREFIX}"],
                           timeout=60).split()
                names = [n for n in names if n.startswith(PREFIX)]
                if names:
                    sh([*podman, "rm", "--force", "--ignore", *names], check=False, timeout=120)
                    left = [n for n in sh([*podman, "ps", "--all", "--format", "{{.Names}}"], timeout=60).split()
                            if n.startswith(PREFIX)]
                    if left:
                        problems.append(f"podman containers left behind: {', '.join(left)}")
            except (OSError, BenchError, subprocess.TimeoutExpired) as err:
                problems.append(f"podman cleanup: {err}")
        return problems  # the temporary directory goes when the private root is gone (see outside)

    # ---------------------------------------------------------------- report

    def stats(self, samples: list[float]) -> dict[str, float]:
        ordered = sorted(samples)
        p90 = statistics.quantiles(ordered, n=10, method="inclusive")[8] if len(ordered) > 1 else ordered[0]
        return {"median": statistics.median(ordered), "p90": p90, "min": ordered[0], "max": ordered[-1]}

    def report(self) -> tuple[str, list[dict[str, Any]]]:
        out = ["# oci-gpu-hook container start-up benchmark", ""]
        for key in ("date", "kernel", "cpus", "loadavg", "runc", "podman", "install", "python", "launcher_python",
                    "package",
                    "commit", "package_digest", "config_file", "launcher_kind", "planner", "cgroups", "sysfs_root",
                    "lean_shim",
                    "console_shim", "lean_hook", "nvidia_runtime", "groups"):
            if key in self.meta:
                out.append(f"- {key}: {self.meta[key]}")
        podman_runs = f" ({self.opts.podman_runs} for podman)" if self.podman else ""
        order = "in a fixed order" if self.opts.fixed_order else f"each round shuffled (seed {self.opts.seed})"
        out.append(f"- runs: {self.opts.runs} per case{podman_runs}, after "
                   f"{self.opts.warmup} discarded warm-up rounds; cases interleaved, {order}; "
                   f"untimed pause before each run: {self.opts.settle:g} ms; times in ms")
        out.extend(f"- note: {n}" for n in self.notes)
        summary: dict[str, dict[str, dict[str, float]]] = {}
        for group in self.groups:
            medians = {c.key: statistics.median(c.samples) for c in group.cases}
            by_key = {c.key: c for c in group.cases}
            out += ["", f"## {group.title} (n={group.runs})", "",
                    "| case | median | p90 | min | added vs bare (median) | paired Δ (median) | ratio median/bare |",
                    "|---|---:|---:|---:|---:|---:|---:|"]
            summary[group.key] = {}
            for case in group.cases:
                base = case.base or group.bare
                st = self.stats(case.samples)
                added = st["median"] - medians[base]
                # each run against its baseline's run of the same round (the two ran next to each other)
                paired = statistics.median(a - b for a, b in zip(case.samples, by_key[base].samples, strict=True))
                ratio = st["median"] / medians[base]
                summary[group.key][case.key] = {**st, "added": added, "paired": paired, "ratio": ratio}
                added_text = "—" if case.key == base else f"{added:+.1f}"
                paired_text = "—" if case.key == base else f"{paired:+.1f}"
                ratio_text = f"{ratio:.2f}"
                if case.reference:
                    added_text = paired_text = ratio_text = "n/a"
                out.append(f"| {case.label} | {st['median']:.1f} | {st['p90']:.1f} | {st['min']:.1f} "
                           f"| {added_text} | {paired_text} | {ratio_text} |")
            if group.key == "prestart":
                out += ["", f"v2 rows are against the v2 bare row; v2 bare - v1 bare = "
                            f"{medians['v2-bare'] - medians['v1-bare']:+.1f} ms (unshare, mount, runc's v2 manager)."]

        targets: list[dict[str, Any]] = []

        def target(name: str, value: float, limit: float, unit: str, detail: str) -> None:
            ok = value <= limit
            targets.append({"target": name, "value": value, "limit": limit, "pass": ok})
            verdict = "PASS" if ok else f"MISS (over by {value - limit:.2f}{unit})"
            out.append(f"- {verdict}: {name}: {value:.2f}{unit}, limit {limit:g}{unit}; {detail}")

        out += ["", "## Targets", ""]
        if "run" in summary:
            run = summary["run"]["lean"]
            bare_run = summary["run"]["bare"]["median"]
            target("shim run ratio, 1 GPU (installed shim run median / bare runc run median)", run["ratio"],
                   RUN_RATIO_TARGET, "x", f"added {run['added']:+.1f} ms on bare {bare_run:.1f} ms")
        def added(row: dict[str, float], bare: float) -> str:
            return f"difference of medians {row['added']:+.1f} ms on bare {bare:.1f} ms"

        if "nogpu" in summary:
            nogpu = summary["nogpu"]["lean"]
            detail = added(nogpu, summary["nogpu"]["bare"]["median"])
            target("shim run ratio, no GPU request", nogpu["ratio"], NOGPU_RATIO_TARGET, "x", detail)
            target("shim run added, no GPU request (paired Δ median)", nogpu["paired"], NOGPU_ADDED_TARGET_MS,
                   " ms", detail)
            create = summary["nogpu"]["create-lean"]
            target("shim create added, no GPU request (paired Δ median)", create["paired"], NOGPU_ADDED_TARGET_MS,
                   " ms", added(create, summary["nogpu"]["create-bare"]["median"]))
        if "state" in summary:
            state = summary["state"]["lean"]
            target("pass-through added (installed shim state - runc state, paired Δ median)", state["paired"],
                   PASS_THROUGH_TARGET_MS, " ms", added(state, summary["state"]["bare"]["median"]))
        if "prestart" in summary:
            for mode in CGROUP_MODES:
                bare_median = summary["prestart"][f"{mode}-bare"]["median"]
                row = summary["prestart"][f"{mode}-hook"]
                limit = PRESTART_GPU_RATIO_TARGET[mode]
                target(f"prestart hook ratio, 1 GPU, cgroup {mode} (runc run + hook median / bare median)",
                       row["ratio"], limit, "x", f"added {row['added']:+.1f} ms on bare {bare_median:.1f} ms")
                row = summary["prestart"][f"{mode}-hook-nogpu"]
                detail = added(row, bare_median)
                target(f"prestart hook ratio, no GPU request, cgroup {mode}", row["ratio"], NOGPU_RATIO_TARGET,
                       "x", detail)
                target(f"prestart hook added, no GPU request, cgroup {mode} (paired Δ median)", row["paired"],
                       NOGPU_ADDED_TARGET_MS, " ms", detail)
        if "lifecycle" in summary:
            life = summary["lifecycle"]["lean"]
            target("lifecycle added (create + start + delete through the installed shim, 1 GPU)", life["added"],
                   LIFECYCLE_ADDED_TARGET_MS, " ms", f"ratio {life['ratio']:.2f}")
        planner = "" if self.opts.no_planner else ", planner running"
        if "create" in summary:
            create = summary["create"]["lean"]
            target(f"shim create added, 1 GPU{planner} (paired Δ median)", create["paired"],
                   CREATE_PLANNER_TARGET_MS, " ms", added(create, summary["create"]["bare"]["median"]))
        if "lifecycle" in summary:
            life = summary["lifecycle"]["lean"]
            target(f"lifecycle added, 1 GPU{planner} (paired Δ median)", life["paired"], LIFECYCLE_PLANNER_TARGET_MS,
                   " ms", added(life, summary["lifecycle"]["bare"]["median"]))
        if "prestart" in summary:
            for mode in CGROUP_MODES:
                row = summary["prestart"][f"{mode}-hook"]
                target(f"prestart hook added, 1 GPU, cgroup {mode}{planner} (paired Δ median)", row["paired"],
                       PRESTART_PLANNER_TARGET_MS[mode], " ms",
                       added(row, summary["prestart"][f"{mode}-bare"]["median"]))
        if "at-once" in summary:
            rows = summary["at-once"]
            one = rows["serial"]["median"] / AT_ONCE
            target(f"{AT_ONCE} GPU containers at once{planner}: their total / one container's serial time",
                   rows["at-once"]["median"] / one, AT_ONCE_TARGET, "x",
                   f"all at once {rows['at-once']['median']:.0f} ms, one after another {rows['serial']['median']:.0f} "
                   f"ms ({one:.1f} ms each); bare runc: {rows['bare-at-once']['median']:.0f} ms at once, "
                   f"{rows['bare']['median']:.0f} ms one after another; without the planner, at once: "
                   f"{rows['at-once-noplanner']['median']:.0f} ms")
        if "versus" in summary:
            rows = summary["versus"]
            for mode in CGROUP_MODES:
                shim = rows[f"{mode}-shim"]
                bare = rows[f"{mode}-bare"]["median"]
                nvidia = rows.get(f"{mode}-nvidia")
                if nvidia is not None:
                    target(f"shim create added, 1 GPU, cgroup {mode}{planner}, at most NVIDIA's (paired Δ medians)",
                           shim["paired"], nvidia["paired"], " ms",
                           f"NVIDIA's toolkit {nvidia['paired']:+.1f} ms, ours {shim['paired']:+.1f} ms on bare "
                           f"{bare:.1f} ms")
                empty = rows[f"{mode}-shim-empty"]
                target(f"shim create added, AMD_VISIBLE_DEVICES= (empty), cgroup {mode} (paired Δ median)",
                       empty["paired"], NOGPU_ADDED_TARGET_MS, " ms", added(empty, bare))
        if "prestart" in summary:
            for mode in CGROUP_MODES:
                row = summary["prestart"][f"{mode}-hook"]
                target(f"prestart hook ratio, 1 GPU, cgroup {mode}{planner}, vs bare runc run", row["ratio"],
                       PRESTART_BARE_RATIO_TARGET, "x",
                       f"added {row['added']:+.1f} ms on bare {summary['prestart'][f'{mode}-bare']['median']:.1f} ms")
        if "at-once" in summary:
            rows = summary["at-once"]
            target(f"{AT_ONCE} GPU containers at once{planner} / bare runc's {AT_ONCE} at once",
                   rows["at-once"]["median"] / rows["bare-at-once"]["median"], AT_ONCE_BARE_RATIO_TARGET, "x",
                   f"{rows['at-once']['median']:.0f} ms vs {rows['bare-at-once']['median']:.0f} ms")
        if not targets:
            out.append("- none: no group with a target was run")
        self.summary = summary
        return "\n".join(out), targets

    def dump(self, path: str, targets: list[dict[str, Any]], error: str | None) -> None:
        data = {
            "meta": self.meta,
            "notes": self.notes,
            "error": error,
            "targets": targets,
            "summary": self.summary,
            "groups": {
                group.key: {
                    "title": group.title,
                    "runs": group.runs,
                    "bare": group.bare,
                    "letter": group.letter,
                    "cases": {
                        case.key: {"label": case.label, "cmd": case.cmd, "env": case.env, "reference": case.reference,
                                   "base": case.base or group.bare,
                                   "stdin": case.stdin.decode() if case.stdin is not None else None,
                                   "samples_ms": case.samples, "warmup_ms": case.warmup}
                        for case in group.cases
                    },
                }
                for group in self.groups
            },
        }
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2)
            handle.write("\n")


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def group_letters(text: str) -> str:
    letters = [part.strip().lower() for part in text.split(",") if part.strip()]
    bad = [letter for letter in letters if letter not in GROUP_LETTERS or len(letter) != 1]
    if not letters or bad:
        raise argparse.ArgumentTypeError(f"expected comma-separated group letters out of {','.join(GROUP_LETTERS)}, "
                                         f"got {text!r}")
    return "".join(letter for letter in GROUP_LETTERS if letter in letters)  # always run in the order a..e


def remove_tree(path: str) -> str | None:
    for _ in range(20):  # a container that was still being torn down may recreate its mount points
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            return None
        time.sleep(0.1)
    return f"could not remove {path}"


def build_wheel(tmp: str) -> str:
    """The wheel of this checkout, built from a clean copy (nothing of an earlier build/ gets in)."""
    import importlib.util

    source = os.path.join(tmp, "src")
    shutil.copytree(REPO, source, symlinks=True, ignore=shutil.ignore_patterns(*BUILD_SKIPPED))
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    sh([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w", os.path.join(tmp, "dist"), source],
       timeout=600)
    wheels = [n for n in os.listdir(os.path.join(tmp, "dist")) if n.startswith("oci_gpu_hook-")]
    if len(wheels) != 1:
        raise BenchError(f"pip wheel built {wheels}, expected one oci_gpu_hook wheel")
    shutil.rmtree(source)
    return os.path.join(tmp, "dist", wheels[0])


def prepare_venv(opts: argparse.Namespace, tmp: str, extras: str = "") -> tuple[str, str]:
    """The venv to measure, and how it was made: ``python3 -m venv`` + ``pip install`` of the wheel (with
    ``extras``, e.g. ``[nri]``; its dependencies from pip's index, pinned to what this interpreter has installed),
    or ``--venv``."""
    if opts.venv:
        venv = os.path.abspath(opts.venv)
        if not os.access(os.path.join(venv, "bin", "oci-gpu-hook"), os.X_OK):
            raise BenchError(f"--venv {venv}: no bin/oci-gpu-hook there")
        return venv, f"the venv {venv} as given (--venv)"
    wheel = os.path.abspath(opts.wheel) if opts.wheel else build_wheel(tmp)
    venv = os.path.join(tmp, "venv")
    sh([sys.executable, "-m", "venv", venv], timeout=300)
    constraints = os.path.join(tmp, "constraints.txt")
    frozen = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True,
                            text=True, timeout=120, stdin=subprocess.DEVNULL)
    with open(constraints, "w", encoding="utf-8") as handle:
        handle.writelines(line + "\n" for line in frozen.stdout.splitlines() if "==" in line)
    sh([os.path.join(venv, "bin", "pip"), "install", "-q", "--disable-pip-version-check", "-c", constraints,
        wheel + extras], timeout=900)
    with open(wheel, "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()[:12]
    origin = "as given (--wheel)" if opts.wheel else f"built by pip wheel from {REPO}"
    return venv, f"wheel {os.path.basename(wheel)} (sha256 {digest}, {origin}) pip-installed into the venv {venv}"


def outside(opts: argparse.Namespace, argv: list[str], script: str = os.path.abspath(__file__),
            extras: str = "") -> int:
    """Make the venv (the wheel with ``extras``), then run ``script`` (this one, or another benchmark built on
    it) again in a private mount namespace (see the module docstring)."""
    name = os.path.basename(script)
    unshare = shutil.which("unshare")
    if not unshare:
        print(f"{name}: error: unshare not found on PATH (util-linux): needed for the private root",
              file=sys.stderr)
        return 1
    tmp = tempfile.mkdtemp(prefix=PREFIX)
    code = 1
    made_planner_dir = not os.path.lexists(PLANNER_DIR)  # the private root's tmpfs needs a mount point
    if made_planner_dir:
        os.mkdir(PLANNER_DIR, 0o700)
    try:
        print("# building and installing the wheel (untimed)", file=sys.stderr, flush=True)
        venv, how = prepare_venv(opts, tmp, extras)
        check_signals()
        state = json.dumps({"tmp": tmp, "venv": venv, "install": how, "prefix": PREFIX})
        code = subprocess.run([unshare, "-m", sys.executable, script, *argv],
                              env={**os.environ, PRIVATE_ENV: state}).returncode
    except BenchError as err:
        print(f"{name}: error: {err}", file=sys.stderr)
    finally:
        problem = remove_tree(tmp)
        if problem:
            print(f"{name}: cleanup: {problem}", file=sys.stderr)
            code = code or 1
        if made_planner_dir:
            try:
                os.rmdir(PLANNER_DIR)  # empty outside the private root throughout
            except OSError as err:
                print(f"{name}: cleanup: {PLANNER_DIR}: {err.strerror}", file=sys.stderr)
    if SIGNALS:
        return 128 + SIGNALS[0]
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=positive, default=30, help="timed runs per runc case (default 30)")
    parser.add_argument("--podman-runs", type=positive, default=10, help="timed runs per podman case (default 10)")
    parser.add_argument("--warmup", type=int, choices=range(100), default=3, metavar="N",
                        help="discarded warm-up rounds per group (default 3)")
    parser.add_argument("--settle", type=non_negative, default=0.0, metavar="MS",
                        help="untimed pause before every timed run (default 0: back to back); "
                             "see benchmarks/README.md for why it moves the runc numbers")
    parser.add_argument("--json", metavar="FILE", help="write metadata, summary and all raw samples to FILE")
    parser.add_argument("--no-podman", action="store_true", help="skip the podman group")
    parser.add_argument("--no-planner", action="store_true",
                        help="do not start the resident planner (`oci-gpu-hook serve`): every row is without it")
    parser.add_argument("--at-once-runs", type=positive, default=5,
                        help=f"timed runs of group h ({AT_ONCE} containers each; default 5)")
    parser.add_argument("--only", type=group_letters, metavar="GROUPS",
                        help="run only these groups, e.g. 'e' or 'a,b' (letters a-h; default: all)")
    parser.add_argument("--nvidia-runtime", metavar="PATH",
                        help="NVIDIA's nvidia-container-runtime (built from its source) for group i's CDI column "
                             "(default: that column is skipped)")
    parser.add_argument("--sysfs-root", default=DEFAULT_SYSFS, help="fake sysfs (default: the example 8-GPU host)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--seed", type=int, default=0, help="seed of each round's case order (default 0)")
    parser.add_argument("--fixed-order", action="store_true",
                        help="run each round's cases in the order listed (default: shuffled; see benchmarks/README.md)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--wheel", metavar="FILE", help="install this wheel (default: build one from this checkout)")
    source.add_argument("--venv", metavar="DIR", help="measure this venv's installed oci-gpu-hook (no build)")
    opts = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("startup.py: needs root (runc and podman run real containers)", file=sys.stderr)
        return 2

    signal.signal(signal.SIGTERM, note_signal)
    signal.signal(signal.SIGINT, note_signal)
    signal.signal(signal.SIGHUP, note_signal)
    signal.signal(signal.SIGALRM, on_alarm)
    if PRIVATE_ENV not in os.environ:
        return outside(opts, sys.argv[1:] if argv is None else argv)
    bench = Bench(opts)
    error: str | None = None
    targets: list[dict[str, Any]] = []
    try:
        bench.setup()
        bench.run()
        text, targets = bench.report()
        print(text)
    except BenchError as err:
        error = str(err)
        print(f"startup.py: error: {err}", file=sys.stderr)
    finally:
        problems = bench.cleanup()
        for problem in problems:
            print(f"startup.py: cleanup: {problem}", file=sys.stderr)
        if opts.json:
            bench.dump(opts.json, targets, error)
    if SIGNALS:
        return 128 + SIGNALS[0]
    if error or problems:
        return 1
    if opts.check and not all(t["pass"] for t in targets):
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
