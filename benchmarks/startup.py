#!/usr/bin/env python3
"""Container start-up cost of oci-gpu-hook: the runtime shim and the podman precreate hook vs bare runc.

Run as root, with the Python of the environment that has ``oci_gpu_hook`` installed::

    python3 benchmarks/startup.py [--runs N] [--podman-runs N] [--warmup N] [--settle MS] [--json FILE] [--check]

Everything lives in a temporary directory: a busybox rootfs, runc bundles, lean
launchers written by ``oci-gpu-hook launchers`` (with ``OCI_GPU_HOOK_SYSFS_ROOT``
baked to the example 8-GPU host) and a podman hooks dir.  The cases of a group
run interleaved round-robin (A, B, C, A, B, C, ...) so that drift hits every
case alike; warm-up rounds are discarded.  Each sample is the wall time of one
``subprocess.run`` (``time.perf_counter``); a bundle's config.json is restored
from a pristine copy before every run, outside the timed region.  Containers
(ids and names prefixed ``ogh-bench-<pid>-``) and the temporary directory are
removed at the end, also on failure or interruption.  Stdlib only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
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
PREFIX = f"ogh-bench-{os.getpid()}-"
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PODMAN_GLOBAL = ["--cgroup-manager=cgroupfs", "--events-backend=none"]
PODMAN_RUN = ["run", "--rm", "--net=none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
              "-e", "AMD_VISIBLE_DEVICES=1"]
# What the plan gives AMD_VISIBLE_DEVICES=1 on the example host; used to check the shim and hook really work.
EXPECTED_NODE = "/dev/dri/renderD129"

# Targets (see benchmarks/README.md)
RUN_RATIO_TARGET = 1.5  # shim run median / bare runc run median
PASS_THROUGH_TARGET_MS = 20.0  # shim state median - runc state median


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
    samples: list[float] = field(default_factory=list)
    warmup: list[float] = field(default_factory=list)


@dataclass
class Group:
    key: str
    title: str
    cases: list[Case]
    runs: int
    bare: str  # key of the baseline case
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
        self.podman = shutil.which("podman") if not opts.no_podman else None
        self.env: dict[str, str] = {}
        self.meta: dict[str, Any] = {}
        self.groups: list[Group] = []
        self.sleeper = ""
        self.sleeper_bundle = ""
        self.podman_rootfs = ""
        self.lean_shim = ""
        self.lean_hook = ""
        self.console_shim: str | None = None
        self.empty_hooks = ""
        self.gpu_hooks = ""
        self.notes: list[str] = []
        self.summary: dict[str, dict[str, dict[str, float]]] = {}

    # ---------------------------------------------------------------- setup

    def next_id(self, case: str) -> str:
        self.counter += 1
        return f"{PREFIX}{case}-{self.counter}"

    def setup(self) -> None:
        if not self.runc:
            raise BenchError("runc not found on PATH")
        sysfs = os.path.abspath(self.opts.sysfs_root)
        if not os.path.isdir(sysfs):
            raise BenchError(f"fake sysfs {sysfs} not found")
        self.tmp = tempfile.mkdtemp(prefix=PREFIX)
        # One environment for every timed command: no OCI_GPU_HOOK_* from the caller, the fake host baked in
        # (the console-script shim has no baked defaults), and runc found the same way by everyone.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("OCI_GPU_HOOK_")}
        self.env["OCI_GPU_HOOK_SYSFS_ROOT"] = sysfs
        self.env.setdefault("PATH", SAFE_PATH)

        busybox = next((p for p in ("/bin/busybox", "/usr/bin/busybox") if os.access(p, os.X_OK)), None)
        if busybox is None:
            raise BenchError("busybox not found (apt-get install busybox-static)")
        rootfs = self.make_rootfs("rootfs", busybox)
        self.podman_rootfs = self.make_rootfs("podman-rootfs", busybox)  # podman writes /etc/hosts etc. into it

        gpu = self.make_bundle("bundle-gpu", rootfs, ["/bin/true"], ["AMD_VISIBLE_DEVICES=1"])
        nogpu = self.make_bundle("bundle-nogpu", rootfs, ["/bin/true"], [])
        sleeper = self.make_bundle("bundle-sleeper", rootfs, ["/bin/sh", "-c", "sleep 1000"], [])

        # Lean launchers from the same environment as this interpreter.
        launch_env = dict(self.env)
        probe = subprocess.run([sys.executable, "-c", "import oci_gpu_hook, sys; print(oci_gpu_hook.__file__)"],
                               capture_output=True, text=True, cwd=self.tmp, env=launch_env)
        if probe.returncode != 0:
            launch_env["PYTHONPATH"] = REPO
            self.notes.append(f"oci_gpu_hook is not installed for {sys.executable}; used the checkout at {REPO}")
        launchers = os.path.join(self.tmp, "launchers")
        sh([sys.executable, "-m", "oci_gpu_hook.cli", "launchers", launchers,
            "--set", f"OCI_GPU_HOOK_SYSFS_ROOT={sysfs}"], env=launch_env)
        self.lean_shim = os.path.join(launchers, "oci-gpu-runtime")
        self.lean_hook = os.path.join(launchers, "oci-gpu-hook")
        package = sh([sys.executable, "-c", "import oci_gpu_hook; print(oci_gpu_hook.__file__)"],
                     env=launch_env).strip()
        with open(self.lean_shim, encoding="utf-8") as handle:
            launcher_python = handle.readline()[2:].strip()
        self.console_shim = shutil.which("oci-gpu-runtime", path=os.path.dirname(sys.executable))

        self.empty_hooks = os.path.join(self.tmp, "hooks-empty")
        self.gpu_hooks = os.path.join(self.tmp, "hooks-gpu")
        os.makedirs(self.empty_hooks)
        os.makedirs(self.gpu_hooks)
        hook = {
            "version": "1.0.0",
            "hook": {"path": self.lean_hook, "args": ["oci-gpu-hook", "precreate"], "env": [f"PATH={SAFE_PATH}"]},
            "when": {"always": True},
            "stages": ["precreate"],
        }
        with open(os.path.join(self.gpu_hooks, "oci-gpu-hook.json"), "w", encoding="utf-8") as handle:
            json.dump(hook, handle, indent=2)

        self.meta = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "kernel": f"{platform.system()} {platform.release()} {platform.machine()}",
            "cpus": os.cpu_count(),
            "loadavg": f"at start {loadavg()}",
            "runc": first_line([self.runc, "--version"]),
            "podman": first_line([self.podman, "--version"]) if self.podman else "not used",
            "python": f"{sys.executable} ({platform.python_version()})",
            "launcher_python": launcher_python,
            "package": package,
            "commit": self.git_commit(),
            "package_digest": self.package_digest(os.path.dirname(package)),
            "config_file": "/etc/oci-gpu-hook/config.toml exists (read by every shim/hook run)"
            if os.path.exists("/etc/oci-gpu-hook/config.toml") else "none",
            "sysfs_root": sysfs,
            "lean_shim": self.lean_shim,
            "console_shim": self.console_shim or "not found next to sys.executable",
            "runs": self.opts.runs,
            "podman_runs": self.opts.podman_runs,
            "warmup": self.opts.warmup,
        }
        check_signals()
        self.sanity(gpu)
        self.build_groups(gpu, nogpu, sleeper)

    def git_commit(self) -> str:
        try:
            head = sh(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], timeout=10).strip()
            dirty = sh(["git", "-C", REPO, "status", "--porcelain", "--", "oci_gpu_hook"], timeout=10).strip()
        except (OSError, BenchError, subprocess.TimeoutExpired):
            return "unknown"
        return head + (" + uncommitted changes in oci_gpu_hook/" if dirty else "")

    @staticmethod
    def package_digest(directory: str) -> str:
        """sha256 of the package's .py files, to tell apart runs of a tree that others are editing."""
        digest = hashlib.sha256()
        for name in sorted(os.listdir(directory)):
            if name.endswith(".py"):
                digest.update(name.encode() + b"\0")
                with open(os.path.join(directory, name), "rb") as handle:
                    digest.update(handle.read())
        return digest.hexdigest()[:12]

    def make_rootfs(self, name: str, busybox: str) -> str:
        rootfs = os.path.join(self.tmp, name)
        os.makedirs(os.path.join(rootfs, "bin"))
        shutil.copy2(busybox, os.path.join(rootfs, "bin", "busybox"))
        for applet in ("sh", "true", "sleep", "ls"):
            os.symlink("busybox", os.path.join(rootfs, "bin", applet))
        return rootfs

    def make_bundle(self, name: str, rootfs: str, args: list[str], extra_env: list[str]) -> str:
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
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(spec, handle, indent=2)
        shutil.copyfile(path, os.path.join(self.tmp, f"{name}.pristine.json"))
        return bundle

    def pristine(self, bundle: str) -> tuple[str, str]:
        return os.path.join(self.tmp, f"{os.path.basename(bundle)}.pristine.json"), os.path.join(bundle, "config.json")

    def sanity(self, gpu: str) -> None:
        """Untimed: the shim and the hook must really add the GPU, or the numbers would mean nothing."""
        src, dst = self.pristine(gpu)
        shutil.copyfile(src, dst)
        sh([self.lean_shim, "run", "--bundle", gpu, self.next_id("sanity")], env=self.env)
        with open(dst, encoding="utf-8") as handle:
            if EXPECTED_NODE not in handle.read():
                raise BenchError(f"the lean shim did not add {EXPECTED_NODE} to config.json")
        shutil.copyfile(src, dst)
        if not self.podman:
            return
        probe = ["/bin/busybox", "ls", EXPECTED_NODE]
        with_hook = self.podman_cmd("runc", self.gpu_hooks, self.next_id("sanity"), probe)
        sh(with_hook, env=self.env)
        via_shim = self.podman_cmd(self.lean_shim, self.empty_hooks, self.next_id("sanity"), probe)
        sh(via_shim, env=self.env)
        without = self.podman_cmd("runc", self.empty_hooks, self.next_id("sanity"), probe)
        if subprocess.run(without, capture_output=True, env=self.env, timeout=120,
                          start_new_session=True).returncode == 0:
            raise BenchError(f"{EXPECTED_NODE} exists without the hook; the podman comparison would be void")

    def podman_cmd(self, runtime: str, hooks: str, name: str, args: list[str]) -> list[str]:
        assert self.podman
        return [self.podman, *PODMAN_GLOBAL, f"--runtime={runtime}", f"--hooks-dir={hooks}", *PODMAN_RUN,
                "--name", name, "--rootfs", self.podman_rootfs, *args]

    def build_groups(self, gpu: str, nogpu: str, sleeper: str) -> None:
        runs = self.opts.runs
        run_args = ["run", "--bundle", gpu, "{id}"]
        cases = [
            Case("bare", "runc run (bare)", [self.runc, *run_args], self.pristine(gpu)),
            Case("lean", "lean shim run (launchers/oci-gpu-runtime)", [self.lean_shim, *run_args], self.pristine(gpu)),
        ]
        if self.console_shim:
            cases.append(Case("console", "console-script shim run (venv oci-gpu-runtime)",
                              [self.console_shim, *run_args], self.pristine(gpu)))
        cases.append(self.shim_alone(run_args, gpu))
        self.groups.append(Group("run", "a. runc run, AMD_VISIBLE_DEVICES=1 (3 nodes added by the shim)",
                                 cases, runs, "bare"))

        # The detached container for the pass-through group is started in run(), once everything is ready.
        self.sleeper_bundle = sleeper
        self.sleeper = f"{PREFIX}sleeper"
        cases = [
            Case("bare", "runc state (bare)", [self.runc, "state", self.sleeper]),
            Case("lean", "lean shim state", [self.lean_shim, "state", self.sleeper]),
        ]
        if self.console_shim:
            cases.append(Case("console", "console-script shim state", [self.console_shim, "state", self.sleeper]))
        python = self.meta["launcher_python"].split()
        cases.append(Case("python", f"(reference) {' '.join(python)} -c pass: the launcher's interpreter floor",
                          [*python, "-c", "pass"], reference=True))
        self.groups.append(Group("state", "b. pass-through: state of a running container", cases, runs, "bare"))

        if self.podman:
            true = ["/bin/true"]
            cases = [
                Case("bare", "podman run, runc, no hooks", self.podman_cmd("runc", self.empty_hooks, "{id}", true)),
                Case("hook", "podman run, runc + precreate hook (lean)",
                     self.podman_cmd("runc", self.gpu_hooks, "{id}", true)),
                Case("shim", "podman run, --runtime=lean shim",
                     self.podman_cmd(self.lean_shim, self.empty_hooks, "{id}", true)),
            ]
            self.groups.append(Group("podman", "c. podman run --rm, AMD_VISIBLE_DEVICES=1",
                                     cases, self.opts.podman_runs, "bare"))
        else:
            self.notes.append("podman not found or --no-podman: group c skipped")

        run_args = ["run", "--bundle", nogpu, "{id}"]
        cases = [
            Case("bare", "runc run (bare), no GPU request", [self.runc, *run_args], self.pristine(nogpu)),
            Case("lean", "lean shim run, no GPU request", [self.lean_shim, *run_args], self.pristine(nogpu)),
            self.shim_alone(run_args, nogpu),
        ]
        self.groups.append(Group("nogpu", "d. runc run, AMD_VISIBLE_DEVICES unset (shim leaves config.json alone)",
                                 cases, runs, "bare"))

    def shim_alone(self, run_args: list[str], bundle: str) -> Case:
        """The lean shim with /bin/true as the real runtime: its own cost (Python start, imports, rewrite)."""
        return Case("alone", "(reference) lean shim run with OCI_GPU_HOOK_RUNTIME=/bin/true: the shim's own work",
                    [self.lean_shim, *run_args], self.pristine(bundle), reference=True,
                    env={"OCI_GPU_HOOK_RUNTIME": "/bin/true"})

    # ---------------------------------------------------------------- measuring

    def once(self, case: Case) -> float:
        if case.restore:
            shutil.copyfile(*case.restore)
        cmd = [self.next_id(case.key) if arg == "{id}" else arg for arg in case.cmd]
        if self.opts.settle:
            time.sleep(self.opts.settle / 1000)
        start = time.perf_counter()
        env = {**self.env, **case.env} if case.env else self.env
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env=env, timeout=120, start_new_session=True)
        elapsed = (time.perf_counter() - start) * 1000
        if proc.returncode != 0:
            raise BenchError(f"{case.label}: {' '.join(cmd)} exited {proc.returncode}: "
                             f"{proc.stderr.decode(errors='replace').strip()}")
        return elapsed

    def measure(self, group: Group) -> None:
        total = self.opts.warmup + group.runs
        print(f"# {group.title}: {len(group.cases)} cases x ({self.opts.warmup} warm-up + {group.runs}) runs",
              file=sys.stderr, flush=True)
        for round_no in range(total):
            for case in group.cases:
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
        subprocess.run([self.runc, "kill", cid, "KILL"], capture_output=True, timeout=30, start_new_session=True)
        for _ in range(50):
            if subprocess.run([self.runc, "delete", "--force", cid], capture_output=True, timeout=30,
                              start_new_session=True).returncode == 0:
                return
            time.sleep(0.1)

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
        if self.tmp:
            for _ in range(20):  # a container that was still being torn down may recreate its mount points
                shutil.rmtree(self.tmp, ignore_errors=True)
                if not os.path.exists(self.tmp):
                    break
                time.sleep(0.1)
            else:
                problems.append(f"could not remove {self.tmp}")
        return problems

    # ---------------------------------------------------------------- report

    def stats(self, samples: list[float]) -> dict[str, float]:
        ordered = sorted(samples)
        p90 = statistics.quantiles(ordered, n=10, method="inclusive")[8] if len(ordered) > 1 else ordered[0]
        return {"median": statistics.median(ordered), "p90": p90, "min": ordered[0], "max": ordered[-1]}

    def report(self) -> tuple[str, list[dict[str, Any]]]:
        out = ["# oci-gpu-hook container start-up benchmark", ""]
        for key in ("date", "kernel", "cpus", "loadavg", "runc", "podman", "python", "launcher_python", "package",
                    "commit", "package_digest", "config_file", "sysfs_root", "lean_shim", "console_shim"):
            out.append(f"- {key}: {self.meta[key]}")
        out.append(f"- runs: {self.opts.runs} per case ({self.opts.podman_runs} for podman), after "
                   f"{self.opts.warmup} discarded warm-up rounds; cases interleaved round-robin; "
                   f"untimed pause before each run: {self.opts.settle:g} ms; times in ms")
        out.extend(f"- note: {n}" for n in self.notes)
        summary: dict[str, dict[str, dict[str, float]]] = {}
        for group in self.groups:
            bare = self.stats(next(c for c in group.cases if c.key == group.bare).samples)
            out += ["", f"## {group.title} (n={group.runs})", "",
                    "| case | median | p90 | min | added vs bare (median) | ratio median/bare |",
                    "|---|---:|---:|---:|---:|---:|"]
            summary[group.key] = {}
            for case in group.cases:
                st = self.stats(case.samples)
                added = st["median"] - bare["median"]
                ratio = st["median"] / bare["median"]
                summary[group.key][case.key] = {**st, "added": added, "ratio": ratio}
                added_text = "—" if case.key == group.bare else f"{added:+.1f}"
                ratio_text = f"{ratio:.2f}"
                if case.reference:
                    added_text = ratio_text = "n/a"
                out.append(f"| {case.label} | {st['median']:.1f} | {st['p90']:.1f} | {st['min']:.1f} "
                           f"| {added_text} | {ratio_text} |")

        targets: list[dict[str, Any]] = []

        def target(name: str, value: float, limit: float, unit: str, detail: str) -> None:
            ok = value <= limit
            targets.append({"target": name, "value": value, "limit": limit, "pass": ok})
            verdict = "PASS" if ok else f"MISS (over by {value - limit:.2f}{unit})"
            out.append(f"- {verdict}: {name}: {value:.2f}{unit}, limit {limit:g}{unit}; {detail}")

        out += ["", "## Targets", ""]
        run = summary["run"]["lean"]
        bare_run = summary["run"]["bare"]["median"]
        target("shim run ratio (lean shim run median / bare runc run median)", run["ratio"], RUN_RATIO_TARGET, "x",
               f"added {run['added']:+.1f} ms on bare {bare_run:.1f} ms; allowed +{0.5 * bare_run:.1f} ms")
        nogpu = summary["nogpu"]["lean"]
        target("shim run ratio, no GPU request", nogpu["ratio"], RUN_RATIO_TARGET, "x",
               f"added {nogpu['added']:+.1f} ms on bare {summary['nogpu']['bare']['median']:.1f} ms")
        state = summary["state"]["lean"]
        target("pass-through added (lean shim state - runc state, medians)", state["added"], PASS_THROUGH_TARGET_MS,
               " ms", f"ratio {state['ratio']:.2f}")
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
                    "cases": {
                        case.key: {"label": case.label, "cmd": case.cmd, "env": case.env, "reference": case.reference,
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
    parser.add_argument("--sysfs-root", default=DEFAULT_SYSFS, help="fake sysfs (default: the example 8-GPU host)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    opts = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("startup.py: needs root (runc and podman run real containers)", file=sys.stderr)
        return 2

    signal.signal(signal.SIGTERM, note_signal)
    signal.signal(signal.SIGINT, note_signal)
    signal.signal(signal.SIGHUP, note_signal)
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
