"""A node where a normal user runs rootless podman, with the product installed as an operator installs it; the
host's users and files stay as they were.

What :func:`rootless_node` builds, all inside one private mount namespace (``unshare -m``, propagation private,
held open by a shell: :class:`tests.helpers.wheellib.PrivateRoot`):

- **Overlays** over ``/etc``, ``/home``, ``/opt``, ``/usr``, ``/var`` and ``/run`` whose upper layers lie on a tmpfs
  of the namespace's own: ``useradd`` (``/etc/passwd``, ``/etc/subuid``, the home directory), the venv, what
  ``install`` writes (launchers in ``/usr/local/libexec``, the precreate hook in
  ``/usr/share/containers/oci/hooks.d``, the CDI spec in ``/var/run/cdi``, the by-path links under
  ``/run/oci-gpu-hook``) and the user's podman storage all vanish with the namespace.  ``/`` is then made shared
  inside the namespace (rootless podman warns otherwise); the namespace's mounts were made private first, so
  nothing of it reaches the host.
- **/dev** is an overlay too (tests/helpers/journallib.py), for two reasons: stand-in device nodes, and the journal.
  Rootless runc cannot mknod: it bind-mounts the *host's* node at each ``linux.devices`` path, so the fake host's
  nodes must exist as real char nodes (each ``class/drm/*/dev`` and ``class/kfd/kfd/dev`` major:minor of the fake
  sysfs, mode 0666 root:root, a node any user may open; a test narrows one with :meth:`Node.node_mode`).  Nothing
  drives them: an open that the kernel lets through fails with ENXIO, which is how the probe tells "granted"
  (tests/helpers/containerlib.py).  ``/dev/log`` is a socket of the test's own that takes each sender's
  credentials as journald does (``SO_PASSCRED``): a journal line sent from inside the rootless user namespace
  arrives with the user's real uid, so a test checks the line reached the journal *as that user*.
- **A user**, ``ogh-rootless``, added with ``useradd -m`` (which gives it subuid/subgid ranges; ``ogh-other``, a
  second user, is there to own what must not steer the first one's containers), with its own
  ``XDG_RUNTIME_DIR`` (``/run/user/UID``, 0700) and a busybox rootfs in its home (its own files, as a rootless
  user's are).  :meth:`Node.podman` runs ``podman`` as that user (``setpriv --reuid/--regid --init-groups``, an
  explicit environment) with the storage driver ``vfs``, the runtime ``runc`` (crun cannot start containers on
  these hybrid-cgroup machines), cgroupfs, no events, ``--net=none`` and ulimits within this machine's hard limits
  (podman's defaults exceed them) -- and **without** ``--hooks-dir``, so podman finds the hook where install put it.
- **The product, as an operator installs it** (the README's "Install on a node"): the wheel built from this checkout
  (tests/helpers/wheellib.py) ``pip install``-ed into the root-owned venv ``/opt/oci-gpu-hook`` made with the node's
  own ``/usr/bin/python3`` (this suite's interpreter may sit under /root, which the user cannot reach), the symlink
  ``/usr/local/bin/oci-gpu-hook``, a config at ``/etc/oci-gpu-hook/config.toml`` that names only the fake host
  (``sysfs_root``: the seed host of examples/hosts), and ``oci-gpu-hook install --only podman,cdi`` with no
  ``--set``, ``--prefix`` or ``--allow-editable``.

Teardown stops podman's pause process (rootless podman keeps one per user, outside any container), lets the
namespace go, and checks that nothing of it still runs and that the host's users, the files install writes and the
stand-in nodes are on the host exactly as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import select
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import containerlib as cl
from tests.helpers import journallib, wheellib

USER = "ogh-rootless"
OTHER = "ogh-other"  # another user of the node, who must never steer USER's containers
OVERLAID = ("/etc", "/home", "/opt", "/usr", "/var", "/run")
VENV = "/opt/oci-gpu-hook"
LAUNCHER_DIR = "/usr/local/libexec/oci-gpu-hook"
HOOK = f"{LAUNCHER_DIR}/oci-gpu-hook"
HOOKS_DIR = "/usr/share/containers/oci/hooks.d"  # Debian's podman 4.3 reads this one (root and rootless alike)
HOOK_FILE = f"{HOOKS_DIR}/oci-gpu-hook-precreate.json"
CONFIG = "/etc/oci-gpu-hook/config.toml"
CDI_SPEC = "/var/run/cdi/amd.com-gpu.json"
SYSFS = cl.SEED_SYSFS
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PODMAN = [*cl.PODMAN, "--runtime", "runc", "--storage-driver", "vfs"]
# What this harness makes on the "host" (inside the namespace): none of it may appear on the real host.  Not
# /run/oci-gpu-hook: other tests on the machine make and remove it (tests/conftest.py guards its by-path directory).
HOST_PATHS = ("/etc/passwd", "/etc/group", "/etc/shadow", "/etc/gshadow", "/etc/subuid", "/etc/subgid",
              f"/home/{USER}", f"/home/{OTHER}", VENV, "/usr/local/bin/oci-gpu-hook", LAUNCHER_DIR, HOOK_FILE,
              "/etc/oci-gpu-hook", CDI_SPEC, "/dev/dri", "/dev/kfd", "/dev/log")

# What a container sees, for "untouched": every mount (point, options, type, source; sorted: podman mounts /etc/hosts,
# /etc/hostname, /run/.containerenv in a Go map's order, which varies from run to run), every /dev entry, the env
# (but HOSTNAME: podman's container id).
VIEW = r"""#!/bin/sh
while read -r _id _parent _dev _root point options rest; do echo "mount $point $options ${rest#*- }"; done \
  < /proc/self/mountinfo | sort
for f in /dev/* /dev/*/*; do
  case "$f" in /dev/fd/*) continue;; esac  # the listing's own descriptors
  { [ -e "$f" ] || [ -L "$f" ]; } && echo "dev $f $(stat -c '%F %t:%T %a' "$f")"
done
env | sort | while read -r line; do case "$line" in HOSTNAME=*) ;; *) echo "env $line";; esac; done
echo done
"""
APPLETS = ("stat", "env", "sort", "id")


# A POSIX ACL that gives one user rw on a node, as systemd-logind's "uaccess" does for the user at a seat (the xattr
# as the kernel takes it, no setfacl needed): version 2, then (tag, perm, id) for the owner, the named user, the
# group, the mask and others.  ``python3 -c ACL UID PATH...`` sets it; ``UID`` "-" removes it.
ACL = r"""
import os, struct, sys
name = "system.posix_acl_access"
any_id = 0xFFFFFFFF
for path in sys.argv[2:]:
    if sys.argv[1] == "-":
        os.removexattr(path, name)
        continue
    entries = [(0x01, 6, any_id), (0x02, 6, int(sys.argv[1])), (0x04, 0, any_id), (0x10, 6, any_id), (0x20, 0, any_id)]
    os.setxattr(path, name, struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries))
"""


def acl_line(who: str, paths: list[str]) -> str:
    """A shell line (as root in the namespace) that gives the user ``who`` (a name; "-": nobody, the ACL removed) rw
    on ``paths`` by an ACL."""
    uid = "-" if who == "-" else f"$(id -u {shlex.quote(who)})"
    return f"/usr/bin/python3 -c {shlex.quote(ACL)} {uid} {' '.join(map(shlex.quote, paths))}"


def node_python() -> str:
    """The node's own ``python3`` (Debian's /usr/bin/python3), as the README's ``python3 -m venv`` on a node finds
    it: not this suite's interpreter, which may live where only root can reach (a pyenv under /root), so that a
    rootless user could not even run the hook.  Its minor version must be this suite's (the venv gets the versions
    pinned here)."""
    system = "/usr/bin/python3"
    done = subprocess.run([system, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True,
                          check=False) if os.path.exists(system) else None
    if done is None or done.stdout.strip() != str(sys.version_info[:2]):
        raise AssertionError(f"{system} is not a Python {sys.version_info[0]}.{sys.version_info[1]}: "
                             "the rootless node's venv is made from the node's own python3")
    return system


def stand_in_nodes(sysfs: Path = SYSFS) -> dict[str, tuple[int, int]]:
    """``/dev`` path -> (major, minor) of every DRM node and the kfd of the fake host, from its ``dev`` files."""
    nodes = {}
    for dev in sorted((sysfs / "class" / "drm").glob("*/dev")):
        major, minor = dev.read_text().split(":")
        nodes[f"/dev/dri/{dev.parent.name}"] = (int(major), int(minor))
    kfd = sysfs / "class" / "kfd" / "kfd" / "dev"
    if kfd.is_file():
        major, minor = kfd.read_text().split(":")
        nodes["/dev/kfd"] = (int(major), int(minor))
    return nodes


def host_state() -> dict[str, tuple[object, ...]]:
    """What the real host has at :data:`HOST_PATHS`: type, mode, owner and a digest of the content (or listing)."""
    state: dict[str, tuple[object, ...]] = {}
    for path in HOST_PATHS:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            state[path] = ("absent",)
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            content = "\0".join(sorted(os.listdir(path))).encode()
        elif os.path.isfile(path) and not os.path.islink(path):
            content = Path(path).read_bytes()
        else:
            content = os.readlink(path).encode() if os.path.islink(path) else b""
        state[path] = (st.st_mode, st.st_uid, st.st_gid, st.st_rdev, hashlib.sha256(content).hexdigest())
    return state


@dataclass
class Node:
    """The namespace, its user and what install printed; see the top of this module."""

    base: Path
    root: wheellib.PrivateRoot
    journal: journallib.Listener
    uid: int = 0
    gid: int = 0
    install_out: str = ""
    planners: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def home(self) -> str:
        return f"/home/{USER}"

    @property
    def rootfs(self) -> str:
        return f"{self.home}/rootfs"

    @property
    def runtime_dir(self) -> str:
        return f"/run/user/{self.uid}"

    def as_root(self, argv: list[str], *, stdin: str = "", timeout: int = 300) -> subprocess.CompletedProcess[str]:
        """``argv`` as root in the namespace, with only PATH in its environment."""
        return subprocess.run(self.root.enter(["env", "-i", f"PATH={PATH}", *argv]), capture_output=True, text=True,
                              input=stdin, timeout=timeout, check=False, cwd="/")

    def must(self, argv: list[str], *, stdin: str = "") -> str:
        done = self.as_root(argv, stdin=stdin)
        assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
        return done.stdout

    def read(self, real: str) -> str:
        return self.must(["cat", real])

    def write(self, real: str, text: str) -> None:
        self.must(["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", real], stdin=text)

    def as_user(self, argv: list[str], *, timeout: int = 180, session: bool = True) -> subprocess.CompletedProcess[str]:
        """``argv`` as the rootless user: its uid, gid and groups, an explicit environment, cwd its home.
        ``session=False``: as ``su`` or a service user without linger gives it, without ``XDG_RUNTIME_DIR`` (and
        ``TMPDIR`` in its home, where podman then keeps its runtime files: never the host's /tmp)."""
        where = f"XDG_RUNTIME_DIR={self.runtime_dir}" if session else f"TMPDIR={self.home}/tmp"
        env = [f"HOME={self.home}", f"USER={USER}", f"LOGNAME={USER}", where, f"PATH={PATH}"]
        inner = ["setpriv", "--reuid", str(self.uid), "--regid", str(self.gid), "--init-groups",
                 "env", "-i", *env, "sh", "-c", 'cd "$HOME" && exec "$@"', "sh", *argv]
        return subprocess.run(self.root.enter(inner), capture_output=True, text=True, timeout=timeout, check=False,
                              cwd="/", stdin=subprocess.DEVNULL)

    def podman(self, *options: str, args: tuple[str, ...] = ("/bin/sh", "/probe.sh"),
               hooks: bool = True) -> subprocess.CompletedProcess[str]:
        """``podman run`` as the user (see the top); ``hooks=False``: with an empty ``--hooks-dir``, i.e. what podman
        gives without the tool (to compare against)."""
        no_hooks = [] if hooks else ["--hooks-dir", f"{self.home}/no-hooks"]
        return self.as_user([*PODMAN, *no_hooks, *cl.PODMAN_RUN, *options, "--rootfs", self.rootfs, *args])

    def root_podman(self, *options: str, args: tuple[str, ...] = ("/bin/sh", "/probe.sh")
                    ) -> subprocess.CompletedProcess[str]:
        """``podman run`` as root on the same node (its own storage in the namespace), to compare with the user's."""
        return self.as_root([*PODMAN, "--root", "/var/lib/ogh-root", "--runroot", "/run/ogh-root", *cl.PODMAN_RUN,
                             *options, "--rootfs", self.rootfs, *args])

    def podman_other(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Another podman command (``inspect``, ``rm``, ...) as the user, with the same global options."""
        return self.as_user([*PODMAN, *args])

    def journal_lines(self) -> list[tuple[str, journallib.Sender | None]]:
        """The tool's journal lines (``journalctl -t oci-gpu-hook``: not useradd's and the like) that arrived since the
        last call, each with its sender's credentials."""
        lines = [(data.decode(errors="replace"), sender) for data, sender in self.journal.received()]
        return [(text, sender) for text, sender in lines if re.match(r"<\d+>.{15} oci-gpu-hook\[\d+\]: ", text)]

    def node_mode(self, path: str, mode: int) -> None:
        self.must(["chmod", f"{mode:o}", path])

    def set_config(self, text: str) -> None:
        self.write(CONFIG, text)

    def reinstall(self) -> None:
        """``install`` again, as root after a change to the config or the virtual environment: a rootless hook trusts
        only the entries install pinned (docs/security.md), and the change moved their change times."""
        self.must(["oci-gpu-hook", "install", "--only", "podman,cdi"])
        self.journal_lines()  # whatever install sent

    def serve(self, log: Path) -> subprocess.Popen[bytes]:
        """``oci-gpu-hook serve --verbose`` as root in the namespace, on its default socket (as install's unit
        starts it; this machine's PID 1 is no systemd): the planner the front asks.  Stopped at teardown."""
        with open(log, "ab") as out:
            process = subprocess.Popen(self.root.enter(["env", "-i", f"PATH={PATH}", HOOK, "serve", "--verbose"]),
                                       stdout=out, stderr=out, stdin=subprocess.DEVNULL, cwd="/",
                                       start_new_session=True)
        self.planners.append(process)
        return process

    def stop_planners(self) -> None:
        for process in self.planners:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, 9)
                    process.wait(timeout=60)
        self.planners.clear()


CONFIG_TEXT = f'sysfs_root = "{SYSFS}"\n'


def _setup_lines(base: Path) -> list[str]:
    lines = journallib.dev_overlay_lines(base / "dev", base / "log.sock")
    lines += [f"useradd -m -s /bin/sh {OTHER}", f"useradd -m -s /bin/sh {USER}",
              f"uid=$(id -u {USER})", f"gid=$(id -g {USER})",
              'mkdir -p /run/user/$uid && chown $uid:$gid /run/user/$uid && chmod 0700 /run/user/$uid',
              f"cp -a {base / 'rootfs'} /home/{USER}/rootfs", f"mkdir /home/{USER}/no-hooks",
              f"chown -R $uid:$gid /home/{USER}"]
    for path, (major, minor) in stand_in_nodes().items():
        lines += [f"mkdir -p {os.path.dirname(path)}", f"rm -f {path}", f"mknod -m 0666 {path} c {major} {minor}"]
    return [*lines, "mount --make-rshared /"]  # last: a mount under a shared one cannot be moved


def _make_rootfs(path: Path) -> None:
    cl.make_rootfs(path)
    for applet in APPLETS:
        if not (path / "bin" / applet).exists():
            (path / "bin" / applet).symlink_to("busybox")
    (path / "view.sh").write_text(VIEW)
    (path / "view.sh").chmod(0o755)


def assert_isolated(output: str, gpus: list[int]) -> cl.ProbeResult:
    """The probe's output (tests/helpers/containerlib.py) in a rootless container holding exactly ``gpus`` of the seed
    host: their card and render nodes and /dev/kfd in /dev and open to the driver (ENXIO), no other GPU node, their
    ``/dev/dri/by-path`` links as root's containers get them, and no node made in the container (rootless, mknod is
    refused whatever the capabilities: the bind-mounted host nodes are the only way to a device)."""
    result = cl.ProbeResult.parse(output)
    nodes, _access = cl.expected(gpus)
    assert result.nodes == nodes, f"nodes in the container: {result.nodes}, expected {nodes}"
    assert result.access == {}, f"nodes made in the container opened: {result.access}"
    links = cl.expected_links(gpus)
    assert result.links == links, f"by-path links: {result.links}, expected {links}"
    return result


def _wait_gone(pid: int, timeout: float = 30) -> bool:
    """Wait for ``pid`` (not a child) to end, by its pidfd; False if it still runs after ``timeout`` seconds."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        poll = select.poll()
        poll.register(fd, select.POLLIN)
        return bool(poll.poll(int(timeout * 1000)))
    finally:
        os.close(fd)


def _in_namespace(holder: int) -> list[int]:
    """The pids in the mount namespace of ``holder`` (itself left out)."""
    namespace = os.stat(f"/proc/{holder}/ns/mnt").st_ino
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(pid) != holder and os.stat(f"/proc/{pid}/ns/mnt").st_ino == namespace:
                pids.append(int(pid))
        except OSError:
            continue
    return pids


def _let_finish(holder: int, timeout: float = 20) -> list[str]:
    """Wait (bounded, each by its pidfd) for what still runs in the namespace to end by itself: a container's
    ``runc init`` or conmon may still be exiting when ``podman run --rm`` has returned.  What is left then is
    killed, and named."""
    left = []
    for pid in _in_namespace(holder):
        if _wait_gone(pid, timeout):
            continue
        try:
            left.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            os.kill(pid, 9)
        except OSError:
            continue
    return [f"still running in the namespace after {timeout} s (killed): {cmd}" for cmd in left]


def _stop_pause(node: Node) -> list[str]:
    """Stop rootless podman's pause process (it holds the user's namespaces between podman calls)."""
    done = node.as_root(["cat", f"{node.runtime_dir}/libpod/tmp/pause.pid"])
    if done.returncode != 0 or not done.stdout.strip().isdigit():
        return []
    pid = int(done.stdout.strip())
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 15)
    return [] if _wait_gone(pid) else [f"podman's pause process {pid} did not end"]


@contextlib.contextmanager
def rootless_node() -> Iterator[Node]:
    """The node of the top of this module, installed; torn down (and the host checked) on exit."""
    cl.need("podman", "runc", "conmon", "unshare", "nsenter", "setpriv", "useradd", "newuidmap", "busybox")
    before = host_state()
    base = Path(tempfile.mkdtemp(prefix="ogh-rl-"))  # short: podman's socket paths under it stay short
    base.chmod(0o755)  # the user reaches /dev/log's socket through its bind mount only; the rootfs is copied
    journal = journallib.Listener(base / "log.sock", credentials=True, mode=0o666)
    _make_rootfs(base / "rootfs")
    (base / "dev").mkdir()
    root = wheellib.PrivateRoot(base, OVERLAID, in_memory=True, setup=tuple(_setup_lines(base)))
    node = Node(base, root, journal)
    problems: list[str] = []
    try:
        root.start()
        node.uid, node.gid = (int(node.must(["id", flag, USER])) for flag in ("-u", "-g"))
        wheellib.make_venv(Path(VENV), wheellib.built_wheel(), enter=root.enter([]), python=node_python())
        node.must(["ln", "-s", f"{VENV}/bin/oci-gpu-hook", "/usr/local/bin/oci-gpu-hook"])
        node.set_config(CONFIG_TEXT)
        node.install_out = node.must(["oci-gpu-hook", "install", "--only", "podman,cdi"])
        node.journal_lines()  # whatever install sent
        yield node
    finally:
        node.stop_planners()
        if root.proc is not None and root.proc.poll() is None:
            problems += _stop_pause(node)
            problems += _let_finish(root.proc.pid)
        left = root.stop()
        journal.close()
        shutil.rmtree(base, ignore_errors=True)
        problems += [f"still running in the namespace: {cmd}" for cmd in left]
        after = host_state()
        problems += [f"the host's {path} changed: {before[path]} -> {after[path]}" for path in HOST_PATHS
                     if before[path] != after[path]]
    assert not problems, "; ".join(problems)
