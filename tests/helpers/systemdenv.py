"""The machine's own systemd booted as PID 1 in a private environment, for the tests that need a real cgroup manager.

The host never changes: the environment is new pid, mount, cgroup, uts, ipc and net namespaces (``unshare``) whose
root is an overlay with the host's ``/`` below and a tmpfs above (entered with ``pivot_root``); ``/proc/sys`` and
``/sys`` are read-only, ``/dev``, ``/run``, ``/tmp`` and ``/var/lib/containers`` fresh tmpfs, and the cgroups are a
subtree of its own (a directory per hierarchy, the cgroup namespace's root): the host's hybrid v1 layout
(``cgroup="v1"``: every v1 controller, ``name=systemd`` and cgroup2 at ``unified``) or cgroup2 alone at
``/sys/fs/cgroup`` (``cgroup="v2"``, systemd's unified mode, runc's eBPF device filters).  ``setpriv`` drops the
capabilities a test has no business with (loading modules, the audit and kernel logs, the clocks) before systemd
starts into a minimal target (:data:`TARGET`).

``binds`` are host directories that appear at the same path inside (the test's own files: bundles, the installed
wheel's venv, logs); the checkout and the running venv are bound in too when a fresh tmpfs inside would hide them
(a clone under ``/tmp``).  ``run(argv)`` runs a command as a transient unit (``systemd-run --wait --pipe``: in the
manager's cgroup tree, as a container runtime started by a unit is); ``enter(argv)`` runs it in the namespaces
directly.  ``stop()`` kills the environment's init (the whole pid namespace goes with it) and removes its cgroups;
a test that fails still stops it (use :func:`booted` as a context manager or a fixture).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Capabilities the environment's systemd starts without (it needs none of them; a test must not touch them).
DROPPED_CAPS = ("sys_module", "audit_control", "audit_read", "audit_write", "syslog", "sys_time", "wake_alarm")
HOST_CGROUP = "/sys/fs/cgroup"
TARGET = "ogh-test.target"
BOOT_TIMEOUT = 60.0  # seconds: a boot here takes well under one; a hung one fails with systemd's own output

# The unit the environment boots into: nothing but the manager, D-Bus (podman asks systemd over it) and one
# service whose devices are restricted, as a real host's journald and logind are: in cgroup v1, systemd realizes
# a slice's devices cgroup only once a unit in it restricts devices, and until then runc's first scope in the
# slice lands in the slice's allow-all devices cgroup (start a pause container first in a new slice, as a
# kubelet does).
TARGET_UNIT = """\
[Unit]
Description=oci-gpu-hook test environment
Requires=dbus.socket ogh-devices.service
After=dbus.socket ogh-devices.service
AllowIsolate=yes
"""
ANCHOR_UNIT = """\
[Unit]
Description=a system.slice service with restricted devices, as every real host has
DefaultDependencies=no

[Service]
ExecStart=/bin/sleep infinity
DevicePolicy=closed
DeviceAllow=/dev/null rw
"""


# Units the environment never starts, masked in its /etc (the overlay's upper layer): a real boot's set-up, which
# a private root needs none of and which must never reach a host directory bound in.  systemd-tmpfiles in
# particular empties /tmp at boot (tmp.conf's "D /tmp"), bound directories included.  Everything these targets
# want on the host is masked as well (computed at start), besides the D-Bus socket podman talks to systemd over.
MASKED = ("systemd-tmpfiles-setup.service", "systemd-tmpfiles-setup-dev.service", "systemd-tmpfiles-clean.service",
          "systemd-tmpfiles-clean.timer", "systemd-journald.service", "systemd-journal-flush.service",
          "getty.target", "console-getty.service", "systemd-logind.service", "systemd-udevd.service",
          "systemd-udev-trigger.service")
MASKED_WANTS_OF = ("sysinit.target", "sockets.target", "timers.target", "paths.target", "basic.target",
                   "local-fs.target", "multi-user.target", "default.target")
KEEP = ("dbus.socket", "dbus.service")
UNIT_DIRS = ("/etc/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system")
# Bound directories must be a test's own: never a directory whose whole content a boot's set-up may manage.
SHARED_DIRS = ("/", "/tmp", "/var", "/var/tmp", "/run", "/dev", "/etc", "/usr", "/home", "/root", "/work")


def masked_units() -> list[str]:
    """The names masked in the environment (see :data:`MASKED`)."""
    names = set(MASKED)
    for target in MASKED_WANTS_OF:
        for directory in UNIT_DIRS:
            try:
                names.update(os.listdir(os.path.join(directory, target + ".wants")))
            except OSError:
                continue
    return sorted(names - set(KEEP))


class BootError(AssertionError):
    """The environment did not come up (the message has systemd's output)."""


def _v1_hierarchies() -> list[tuple[str, str]]:
    """(directory under /sys/fs/cgroup, mount options) of every cgroup v1 hierarchy the host has mounted there."""
    found = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            fields = line.split()
            sep = fields.index("-")
            point, fstype, options = fields[4], fields[sep + 1], fields[sep + 3]
            if fstype == "cgroup" and os.path.dirname(point) == HOST_CGROUP:
                wanted = [o for o in options.split(",") if o not in ("rw", "ro") and not o.startswith("release_agent")]
                found.append((os.path.basename(point), ",".join(wanted)))
    return found


def v1_problem() -> str | None:
    """Why the cgroup v1 environment cannot be built on this host (None: it can): it mounts the host's own v1
    hierarchies, and a host whose controllers are all on cgroup2 has no devices hierarchy to give it."""
    if not any("devices" in options.split(",") for _dir, options in _v1_hierarchies()):
        return f"no cgroup v1 devices hierarchy under {HOST_CGROUP} on this host (cgroup2 only)"
    return None


def _own_path(controller: str) -> str:
    """This process's cgroup in the hierarchy of ``controller`` ('' for cgroup2)."""
    with open("/proc/self/cgroup") as handle:
        for line in handle:
            _hid, controllers, path = line.rstrip("\n").split(":", 2)
            names = controllers.split(",") if controllers else [""]
            if controller in names:
                return path
    return "/"


# Fresh inside (tmpfs): a checkout or venv below one would be invisible there, so it is bound in (never the directory
# itself: see SHARED_DIRS)
FRESH_DIRS = ("/tmp", "/run", "/dev", "/var/lib/containers")
CHECKOUT = Path(__file__).resolve().parents[2]


def hidden_checkout(binds: tuple[Path, ...], places: tuple[Path, ...] | None = None) -> tuple[Path, ...]:
    """The checkout and the running venv (``places``) where a fresh tmpfs inside would hide them (a clone under
    ``/tmp``, as the README allows), less those ``binds`` already bring in."""
    import sys

    out: list[Path] = []
    for place in places if places is not None else (CHECKOUT, Path(sys.prefix).resolve()):
        inside = any(str(place).startswith(fresh + "/") for fresh in FRESH_DIRS)
        covered = any(place == b or b in place.parents for b in (*binds, *out))
        if inside and not covered and str(place) not in SHARED_DIRS:
            out = [o for o in out if place not in o.parents] + [place]
    return tuple(out)


class SystemdEnv:
    """One booted systemd (see the module's text)."""

    def __init__(self, base: Path, cgroup: str = "v1", binds: tuple[Path, ...] = ()) -> None:
        if cgroup not in ("v1", "v2"):
            raise ValueError(f"cgroup must be 'v1' or 'v2', not {cgroup!r}")
        self.base = base
        self.cgroup = cgroup
        self.binds = tuple(Path(b) for b in binds)
        for bind in self.binds:
            if not bind.is_absolute() or str(bind.resolve()).rstrip("/") in SHARED_DIRS or str(bind) in SHARED_DIRS:
                raise ValueError(f"{bind}: bind a test's own directory into the environment, not a shared one")
        self.binds += hidden_checkout(self.binds)
        self.name = f"ogh-systemd-{uuid.uuid4().hex[:8]}"
        self.cgroup_dirs: list[Path] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.init_pid: int | None = None
        self.console = base / "console.log"

    # --- start ---------------------------------------------------------------------------------------------

    def _make_cgroups(self) -> list[Path]:
        problem = v1_problem() if self.cgroup == "v1" else None
        if problem:
            raise BootError(problem)
        """One directory per hierarchy (the environment's cgroup root), made before anything joins them."""
        dirs: list[tuple[str, Path]] = []
        if self.cgroup == "v1":
            for directory, options in _v1_hierarchies():
                key = "name=systemd" if "name=systemd" in options.split(",") else options.split(",")[0]
                dirs.append((key, Path(HOST_CGROUP, directory) / _own_path(key).lstrip("/") / self.name))
        unified = Path(HOST_CGROUP, "unified") if os.path.isdir(f"{HOST_CGROUP}/unified") else Path(HOST_CGROUP)
        dirs.append(("", unified / _own_path("").lstrip("/") / self.name))
        for key, path in dirs:
            path.mkdir()
            self.cgroup_dirs.append(path)
            if key == "cpuset":  # a v1 cpuset takes no task before it has cpus and mems
                for name in ("cpuset.cpus", "cpuset.mems"):
                    (path / name).write_text((path.parent / name).read_text())
        return self.cgroup_dirs

    def _stage2(self) -> str:
        """The script the namespace's first process runs: build the root, pivot into it, exec systemd."""
        root, upper = self.base / "root", self.base / "upper"
        lines = [
            "set -eu",
            "mount --make-rprivate /",
            f"mount -t tmpfs -o mode=0755 ogh-upper {shlex.quote(str(upper))}",
            f"mkdir -p {upper}/u {upper}/w {root}",
            f"mount -t overlay -o lowerdir=/,upperdir={upper}/u,workdir={upper}/w ogh-root {root}",
            f"mount -t proc proc {root}/proc",
            f"mount --bind {root}/proc/sys {root}/proc/sys",
            f"mount -o remount,bind,ro {root}/proc/sys",
            f"mount -t sysfs -o ro sysfs {root}/sys",
            f"mount -t tmpfs -o mode=0755 cgroup {root}/sys/fs/cgroup",
        ]
        if self.cgroup == "v1":
            for directory, options in _v1_hierarchies():
                lines += [f"mkdir -p {root}/sys/fs/cgroup/{directory}",
                          f"mount -t cgroup -o {options} cgroup {root}/sys/fs/cgroup/{directory}"]
            lines += [f"mkdir -p {root}/sys/fs/cgroup/unified",
                      f"mount -t cgroup2 cgroup2 {root}/sys/fs/cgroup/unified"]
        else:
            lines += [f"umount {root}/sys/fs/cgroup", f"mount -t cgroup2 cgroup2 {root}/sys/fs/cgroup"]
        lines += [
            f"mount -o remount,ro {root}/sys/fs/cgroup" if self.cgroup == "v1" else ":",
            f"mount -t tmpfs -o mode=0755,nosuid dev {root}/dev",
            f"cd {root}/dev",
            "mknod -m 666 null c 1 3; mknod -m 666 zero c 1 5; mknod -m 666 full c 1 7",
            "mknod -m 666 random c 1 8; mknod -m 666 urandom c 1 9; mknod -m 666 tty c 5 0",
            "mkdir -m 755 pts shm; mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts pts",
            "ln -s pts/ptmx ptmx; ln -s /proc/self/fd fd; ln -s /proc/self/fd/0 stdin",
            "ln -s /proc/self/fd/1 stdout; ln -s /proc/self/fd/2 stderr",
            "mount -t tmpfs -o mode=1777,nosuid,nodev shm shm",
            "cd /",
            f"mount -t tmpfs -o mode=0755,nosuid,nodev run {root}/run",
            f"mount -t tmpfs -o mode=1777 tmp {root}/tmp",
            f"mkdir -p {root}/var/lib/containers && mount -t tmpfs -o mode=0700 containers {root}/var/lib/containers",
        ]
        for bind in self.binds:
            lines += [f"mkdir -p {shlex.quote(str(root) + str(bind))}",
                      f"mount --rbind {shlex.quote(str(bind))} {shlex.quote(str(root) + str(bind))}"]
        units = f"{root}/etc/systemd/system"
        lines += [
            f"mkdir -p {units}",
            f"printf '%s' {shlex.quote(TARGET_UNIT)} > {units}/{TARGET}",
            f"printf '%s' {shlex.quote(ANCHOR_UNIT)} > {units}/ogh-devices.service",
            *(f"ln -sfn /dev/null {units}/{name}" for name in masked_units()),
            f"mkdir -p {root}/oldroot",
            f"cd {root}",
            "pivot_root . oldroot",
            "cd /",
            "umount -l /oldroot",
            "rmdir /oldroot",
            ": > /etc/machine-id",  # systemd writes a transient one onto the tmpfs upper
            "echo booting",
            "drop=" + ",".join(f"-{cap}" for cap in DROPPED_CAPS),
            f"exec setpriv --bounding-set \"$drop\" --inh-caps \"$drop\" env -i container=oci-gpu-hook-test "
            f"/lib/systemd/systemd --unit={TARGET} --log-target=console --show-status=no",
        ]
        return "\n".join(lines)

    def start(self) -> None:
        if self.proc is not None:
            raise RuntimeError("already started")
        for name in ("root", "upper"):
            (self.base / name).mkdir(parents=True, exist_ok=True)
        try:
            dirs = self._make_cgroups()
            join = "; ".join(f"echo $$ > {shlex.quote(str(d / 'cgroup.procs'))}" for d in dirs)
            script = self._stage2()
            argv = ["sh", "-c", f"{join}; exec unshare --fork --kill-child --pid --mount --cgroup --uts --ipc --net "
                                f"sh -c {shlex.quote(script)}"]
            with open(self.console, "wb") as console:
                self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                                             cwd="/", start_new_session=True)
            self.init_pid = self._find_init()
            self._wait_running()
        except BaseException:
            self.stop()
            raise

    def _find_init(self) -> int:
        """The host pid of the namespace's init (unshare's child), once it has execed systemd."""
        assert self.proc is not None
        deadline = time.monotonic() + BOOT_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BootError(f"the environment's init exited with {self.proc.returncode}: {self._console()}")
            try:
                children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
            except OSError:
                children = []
            for child in children:
                try:
                    if Path(f"/proc/{child}/comm").read_text().strip() == "systemd":
                        return int(child)
                except OSError:
                    continue
            time.sleep(0.02)
        raise BootError(f"systemd did not start within {BOOT_TIMEOUT:.0f} s: {self._console()}")

    def _wait_running(self) -> None:
        """Until the manager answers and its start-up is done ('running' or 'degraded'), at most BOOT_TIMEOUT."""
        deadline = time.monotonic() + BOOT_TIMEOUT
        state = ""
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise BootError(f"systemd exited with {self.proc.returncode}: {self._console()}")
            done = subprocess.run(self.enter(["systemctl", "is-system-running", "--wait"]), capture_output=True,
                                  text=True, timeout=max(1.0, deadline - time.monotonic()), check=False)
            state = done.stdout.strip()
            if state in ("running", "degraded"):
                return
            if state not in ("", "offline", "initializing", "starting"):
                raise BootError(f"systemd is {state!r} after boot: {self._console()}")
            time.sleep(0.05)  # "offline": the manager's private socket is not there yet
        raise BootError(f"systemd was not up within {BOOT_TIMEOUT:.0f} s (last state {state!r}): {self._console()}")

    def _console(self) -> str:
        try:
            return self.console.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no output)"

    # --- use -----------------------------------------------------------------------------------------------

    def enter(self, argv: list[str]) -> list[str]:
        """``argv`` run in the environment's namespaces (root, cwd /), outside its units."""
        assert self.init_pid is not None
        return ["nsenter", "-t", str(self.init_pid), "-m", "-p", "-u", "-i", "-n", "-C", "-r", "-w", "--", *argv]

    def run(self, argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 120,
            unit: bool = True, stdin: str | None = "") -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside, as a transient service of the manager (``unit=False``: in the namespaces only)."""
        command = list(argv)
        if env is not None:
            command = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), *command]
        if unit:
            command = ["systemd-run", "--quiet", "--wait", "--pipe", "--collect", "--service-type=exec",
                       "-p", "DefaultDependencies=no", *command]
        return subprocess.run(self.enter(command), capture_output=True, text=True, input=stdin, timeout=timeout,
                              check=False)

    def systemctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return self.run(["systemctl", *args], unit=False, timeout=timeout)

    def check(self, argv: list[str], **kwargs: object) -> str:
        """``run`` that must succeed; its stdout."""
        done = self.run(argv, **kwargs)  # type: ignore[arg-type]
        if done.returncode != 0:
            raise AssertionError(f"{argv} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done.stdout

    # --- stop ----------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Kill the environment (its whole pid namespace) and remove its cgroups; safe to call twice."""
        if self.init_pid is not None:
            try:
                os.kill(self.init_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc is not None:
            try:  # unshare reaps its child (the environment's init) and exits: let it, or nobody reaps it soon
                self.proc.wait(timeout=30 if self.init_pid is not None else 0.1)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=60)
        errors = [f"{d}: {e}" for d in self.cgroup_dirs for e in _remove_cgroup_tree(d)]
        self.cgroup_dirs = []
        self.init_pid = None
        if errors:
            raise AssertionError("the environment's cgroups could not all be removed: " + "; ".join(errors))


def _remove_cgroup_tree(top: Path, timeout: float = 30.0) -> list[str]:
    """rmdir every cgroup under ``top`` (deepest first), waiting (bounded) for dying processes to leave them."""
    if not top.exists():
        return []
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for directory, _dirs, _files in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
            try:
                os.rmdir(directory)
            except FileNotFoundError:
                continue
            except OSError as err:
                left.append(f"{directory}: {err.strerror}")
        if not left:
            return []
        if time.monotonic() > deadline:
            return left
        time.sleep(0.05)  # processes of a killed pid namespace are still being reaped


@contextmanager
def booted(cgroup: str = "v1", binds: tuple[Path, ...] = (), base: Path | None = None) -> Iterator[SystemdEnv]:
    """A booted :class:`SystemdEnv`, stopped (and its files removed) however the block ends."""
    own = base is None
    base = Path(tempfile.mkdtemp(prefix="ogh-systemd-")) if base is None else base
    env = SystemdEnv(base, cgroup, binds)
    try:
        env.start()
        yield env
    finally:
        try:
            env.stop()
        finally:
            if own:
                shutil.rmtree(base, ignore_errors=True)
