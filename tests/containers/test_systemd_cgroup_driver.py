"""systemd as the cgroup manager, for real: the machine's own systemd 252 booted as PID 1 in a private environment
(tests/helpers/systemdenv.py), cgroup v1 as the host has it and cgroup2 alone, with the wheel installed as an
operator does (``oci-gpu-hook install`` run inside, writing the environment's real paths).

Each container is probed (ENXIO for its GPU, EPERM for the others, /dev/null open) after start, then again after
``systemctl daemon-reload``, ``daemon-reexec`` and ``set-property`` on its scope, which make systemd write the
scope's device rules again from its DeviceAllow= list:

- the live prestart hook under ``runc --systemd-cgroup``: the grant is registered with the scope, so it stays,
  with and without /dev/char links (systemd reads ``/dev/char/MAJ:MIN`` by its numbers);
- the shim (install's ``oci-gpu-runtime``) with a kubepods-style ``slice:cri-containerd:ID`` cgroupsPath, after a
  pause container in the new pod slice (a kubelet's order; in v1 the first scope of a new slice lands in the
  slice's allow-all devices cgroup): with the /dev/char links install made it keeps its GPU (``runc update``
  too); without them runc leaves the GPU out of the scope's DeviceAllow, the reload takes it away, and
  ``inspect`` says so beforehand;
- podman with ``cgroup_manager = "systemd"``, install's precreate hook and its CDI spec, with the links; and with
  ``install --hook prestart``, without them;
- a container that asks for nothing starts untouched (no log line, no DeviceAllow of a GPU);
- a cgroupsPath that names another container's scope (below it, or a cgroup elsewhere named like it) is refused
  in one line and that scope's DeviceAllow is unchanged; crun's layout (the container in a ``container`` child of
  its scope) still registers with the scope;
- install's watch unit, started by this systemd under its own hardening, makes the missing links.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import unavailable
from tests.helpers import containerlib as cl
from tests.helpers import systemdenv, wheellib

pytestmark = pytest.mark.containers

HOOK = "/usr/local/libexec/oci-gpu-hook/oci-gpu-hook"
RUNTIME = "/usr/local/libexec/oci-gpu-hook/oci-gpu-runtime"
CONFIG = "/etc/oci-gpu-hook/config.toml"
# The probe again in a running container (runc exec, podman exec): fresh nodes in a directory of its own.
PROBE_AGAIN = ["/bin/sh", "-c", 'd=$(/bin/busybox mktemp -d /tmp/p.XXXXXX) && /bin/busybox sed "s#/tmp/#$d/#g" '
               '/probe.sh > "$d.sh" && exec /bin/sh "$d.sh"']
# The seed host's nodes, made in the environment's /dev (a tmpfs of its own) for install to link.
STAND_INS = [(f"dri/card{i + 1}", 226, i + 1) for i in range(8)] + [
    (f"dri/renderD{128 + i}", 226, 128 + i) for i in range(8)] + [("kfd", 234, 0)]
AFTER = ("daemon-reload", "daemon-reexec", "set-property")


@dataclass
class Node:
    env: systemdenv.SystemdEnv
    base: Path
    rootfs: Path
    log: Path
    install_out: str

    def log_lines(self, cid: str) -> list[dict[str, object]]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [entry for entry in map(json.loads, lines) if entry.get("id") == cid]

    def ok(self, argv: list[str], **kwargs: object) -> str:
        done = self.env.run(argv, unit=False, **kwargs)  # type: ignore[arg-type]
        assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
        return done.stdout

    def links(self, present: bool) -> None:
        """The seed host's nodes and install's /dev/char links in the environment's /dev, or neither."""
        if not present:
            self.ok(["sh", "-c", "rm -rf /dev/char /dev/dri /dev/kfd /run/oci-gpu-hook-dev-char/links"])
            return
        if self.env.run(["readlink", "/dev/char/226:129"], unit=False).stdout.strip() == "../dri/renderD129":
            return  # made by an earlier test's install
        self.ok(["sh", "-c", "mkdir -p /dev/dri && " + " && ".join(
            f"{{ [ -e /dev/{name} ] || mknod -m 600 /dev/{name} c {major} {minor}; }}"
            for name, major, minor in STAND_INS)])
        out = self.ok([HOOK, "install", "--only", "podman,cdi"], env=cl.hook_env())
        assert "dev-char: /dev/char/226:129 -> ../dri/renderD129" in out.splitlines(), out


@pytest.fixture(scope="module")
def venv() -> Iterator[tuple[Path, Path]]:
    cl.need("runc", "podman", "busybox", "unshare", "nsenter", "setpriv", "/lib/systemd/systemd", "systemd-run")
    base = Path(tempfile.mkdtemp(prefix="ogh-sd-"))  # short: podman's runroot and sockets live below it
    try:
        python = wheellib.make_venv(base / "venv", wheellib.built_wheel())
        cl.make_rootfs(base / "rootfs")
        yield base, python
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module", params=["v1", "v2"], ids=["cgroup-v1", "cgroup-v2"])
def node(request: pytest.FixtureRequest, venv: tuple[Path, Path]) -> Iterator[Node]:
    base, _python = venv
    mode = request.param
    if mode == "v1" and systemdenv.v1_problem():
        unavailable(str(systemdenv.v1_problem()))
    log = base / f"hook-{mode}.log"
    with systemdenv.booted(mode, binds=(base,), base=Path(tempfile.mkdtemp(prefix=f"ogh-sd-{mode}-"))) as env:
        write = (f"mkdir -p /etc/oci-gpu-hook && cat > {CONFIG} <<'EOF'\nsysfs_root = \"{cl.SEED_SYSFS}\"\n"
                 f"log_file = \"{log}\"\ncdi_dir = \"/etc/cdi\"\nby_path_dir = \"{base / ('by-path-' + mode)}\"\nEOF")
        done = env.run(["sh", "-c", write], unit=False)
        assert done.returncode == 0, done.stderr
        done = env.run([str(base / "venv" / "bin" / "oci-gpu-hook"), "install", "--only", "podman,cdi"],
                       env=cl.hook_env(), unit=False, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        yield Node(env, base, base / "rootfs", log, done.stdout)
        shutil.rmtree(env.base, ignore_errors=True)


def _bundle(node: Node, env: list[str], cgroups_path: str, *, prestart: bool = False) -> Path:
    cid = f"ogh-{uuid.uuid4().hex[:10]}"
    bundle = cl.make_bundle(node.base / "bundles" / cid, node.rootfs, env, ["/bin/sleep", "1000"])
    if prestart:
        cl.add_prestart(bundle, Path(HOOK))
    cl.edit_spec(bundle, lambda spec: spec["linux"].__setitem__("cgroupsPath", cgroups_path.replace("ID", cid)))
    return bundle


def _start(node: Node, bundle: Path, runtime: str = "runc") -> str:
    """``RUNTIME --systemd-cgroup run -d``; the container's id (its stdio goes to a file: a detached container
    keeps it open)."""
    out = bundle / "stdio"
    done = node.env.run(["sh", "-c", f"{runtime} --systemd-cgroup run -d --bundle {bundle} {bundle.name} "
                                     f"</dev/null >{out} 2>&1; rc=$?; cat {out} >&2; exit $rc"],
                        env=cl.hook_env(), unit=False)
    assert done.returncode == 0, done.stderr
    return bundle.name


def _disturb(node: Node, what: str, scope: str) -> None:
    argv = {"daemon-reload": ["daemon-reload"], "daemon-reexec": ["daemon-reexec"],
            "set-property": ["set-property", "--runtime", scope, "CPUWeight=50"]}[what]
    done = node.env.systemctl(*argv)
    assert done.returncode == 0, done.stderr
    # a reexec answers before the new manager serves: wait until it does (bounded)
    done = node.env.systemctl("is-system-running", "--wait", timeout=60)
    assert done.stdout.strip() in ("running", "degraded"), done.stdout + done.stderr


def _device_allow(node: Node, scope: str) -> list[str]:
    return node.ok(["systemctl", "show", "-p", "DeviceAllow", scope]).split()


def _assert_kept(node: Node, argv: list[str], gpus: list[int], scope: str, v2: bool) -> None:
    cl.assert_isolated(node.env.run(argv, unit=False).stdout, gpus, cgroup_v2=v2)
    for what in AFTER:
        _disturb(node, what, scope)
        cl.assert_isolated(node.env.run(argv, unit=False).stdout, gpus, cgroup_v2=v2)


@pytest.mark.parametrize("links", [False, True], ids=["no-dev-char-links", "dev-char-links"])
def test_prestart_grant_survives_reload_reexec_set_property(node: Node, links: bool) -> None:
    node.links(links)
    v2 = node.env.cgroup == "v2"
    cid = _start(node, _bundle(node, ["AMD_VISIBLE_DEVICES=1"], "system.slice:ogh:ID", prestart=True))
    try:
        scope = f"ogh-{cid}.scope"
        _assert_kept(node, ["runc", "exec", cid, *PROBE_AGAIN], [1], scope, v2)
        (line,) = node.log_lines(cid)
        assert line["outcome"] == "ok" and line["systemd_unit"] == (
            f"{scope}: DeviceAllow /dev/char/226:2 /dev/char/226:129 /dev/char/234:0"), line
        assert {"/dev/char/226:2", "/dev/char/226:129", "/dev/char/234:0"} <= {
            entry.removeprefix("DeviceAllow=") for entry in _device_allow(node, scope)}
        inspect = node.ok([HOOK, "inspect", "--pid", _pid(node, cid)], env=cl.hook_env())
        assert f"systemd unit {scope}: its DeviceAllow has every device allowed here" in inspect, inspect
    finally:
        node.env.run(["runc", "delete", "-f", cid], unit=False)


def _pid(node: Node, cid: str) -> str:
    return str(json.loads(node.ok(["runc", "state", cid]))["pid"])


def test_prestart_no_request_starts_untouched(node: Node) -> None:
    cid = _start(node, _bundle(node, [], "system.slice:ogh:ID", prestart=True))
    try:
        cl.assert_isolated(node.env.run(["runc", "exec", cid, *PROBE_AGAIN], unit=False).stdout, [],
                           cgroup_v2=node.env.cgroup == "v2")
        assert node.log_lines(cid) == []
        assert not any(":226:" in e or "/226:" in e or "234:" in e for e in _device_allow(node, f"ogh-{cid}.scope"))
    finally:
        node.env.run(["runc", "delete", "-f", cid], unit=False)


def _start_cgroupfs(node: Node, bundle: Path) -> subprocess.CompletedProcess[str]:
    """plain ``runc run -d`` (the cgroupfs driver, under the running systemd)."""
    out = bundle / "stdio"
    return node.env.run(["sh", "-c", f"runc run -d --bundle {bundle} {bundle.name} </dev/null >{out} 2>&1; rc=$?; "
                                     f"cat {out} >&2; exit $rc"], env=cl.hook_env(), unit=False)


def _hold_scope(node: Node, name: str, *properties: str) -> str:
    """A transient scope ``NAME.scope`` made by ``systemd-run --scope`` around a sleep (DevicePolicy auto, no
    DeviceAllow, unless ``properties`` say otherwise); its name."""
    options = " ".join(shlex.quote(p) for p in properties)
    node.ok(["sh", "-c", f"systemd-run --scope --quiet --unit={name} {options} sleep 1000 </dev/null >/dev/null "
                         "2>&1 &"])
    # systemd-run --scope runs its command in the foreground: poll (bounded) until the scope is there
    node.ok(["sh", "-c", f"i=0; until systemctl -q is-active {name}.scope; do i=$((i+1)); [ $i -lt 300 ] || exit 1; "
                         "sleep 0.1; done"])
    return f"{name}.scope"


def test_prestart_refused_where_it_cannot_register(node: Node) -> None:
    """A container in the ``container`` child of a scope that carries its id but restricts no device (not its
    runtime's: made by systemd-run): registering would restrict the whole scope, so the hook refuses in one line
    naming the durable paths, and changes nothing."""
    bundle = _bundle(node, ["AMD_VISIBLE_DEVICES=1"], "/system.slice/ogh-hold-ID.scope/container", prestart=True)
    hold = _hold_scope(node, f"ogh-hold-{bundle.name}").removesuffix(".scope")
    try:
        done = _start_cgroupfs(node, bundle)
        assert done.returncode != 0
        assert (f"oci-gpu-hook: error: the container's cgroup is systemd unit {hold}.scope, but its devices cannot be "
                "registered with systemd (its DevicePolicy is 'auto', not the 'strict' of a container runtime's scope "
                "with restricted devices), so the next daemon-reload would take them away: refusing the live grant; "
                "the spec-rewrite paths (the oci-gpu-runtime shim, podman's precreate hook, CDI) write the devices "
                "into the container's config.json, which systemd is given at create") in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        assert node.env.run(["runc", "state", bundle.name], unit=False).returncode != 0  # not left running
        assert _device_allow(node, f"{hold}.scope") == []  # nothing registered (systemctl show prints nothing)
    finally:
        node.env.systemctl("stop", f"{hold}.scope")


def test_prestart_in_a_scope_named_cgroup_systemd_does_not_have(node: Node) -> None:
    """cgroupfs with a cgroup named like a scope: systemd has no such unit and no rules to apply there."""
    bundle = _bundle(node, ["AMD_VISIBLE_DEVICES=1"], "/system.slice/ogh-cgroupfs-ID.scope", prestart=True)
    done = _start_cgroupfs(node, bundle)
    assert done.returncode == 0, done.stderr
    cid = bundle.name
    try:
        cl.assert_isolated(node.env.run(["runc", "exec", cid, *PROBE_AGAIN], unit=False).stdout, [1],
                           cgroup_v2=node.env.cgroup == "v2")
        (line,) = node.log_lines(cid)
        assert line["systemd_unit"] == f"ogh-cgroupfs-{cid}.scope: not a unit systemd has loaded: nothing registered"
    finally:
        node.env.run(["runc", "delete", "-f", cid], unit=False)


def _gpu_entries(node: Node, scope: str) -> list[str]:
    """The GPU entries (DRM, KFD) of ``scope``'s DeviceAllow."""
    return [e for e in _device_allow(node, scope) if "226:" in e or "234:" in e or "/dri/" in e or "kfd" in e]


def _assert_not_its_own(node: Node, bundle: Path, unit: str, why: str) -> None:
    """``bundle`` (a container asking for GPU 1 under cgroupfs) is refused in one line: ``unit`` is not its own."""
    cgroup = json.loads((bundle / "config.json").read_text())["linux"]["cgroupsPath"]
    done = _start_cgroupfs(node, bundle)
    assert done.returncode != 0
    # runc quotes the hook's whole stderr ("stderr: ...\n" in its own message): that one line
    assert (f"stderr: oci-gpu-hook: error: the container's cgroup {cgroup!r} lies in systemd unit {unit}, which is "
            f"not the container's own: {why}; registering its devices there would give them to that unit at the next "
            'daemon-reload: refusing the live grant\\n"') in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert node.env.run(["runc", "state", bundle.name], unit=False).returncode != 0  # not left running
    (line,) = node.log_lines(bundle.name)
    assert line["outcome"] != "ok" and "systemd_unit" not in line, line


def test_prestart_never_registers_with_another_container_s_scope(node: Node) -> None:
    """Container B's scope (runc's systemd driver), and containers whose cgroupsPath names it: one below B's scope,
    one at ``/ogh-x/ogh-B.scope`` (each refused: the scope's name does not carry its id), and one at
    ``/ogh-y/ogh-A.scope`` where a scope ``ogh-A.scope`` of another container X exists (refused: that unit's
    ControlGroup is not its cgroup).  B's and X's DeviceAllow are unchanged, B still has no GPU after a
    daemon-reload; then B's own scope still gets B's registration (B's twin asking for a GPU)."""
    v2 = node.env.cgroup == "v2"
    b = _start(node, _bundle(node, [], "system.slice:ogh:ID", prestart=True))
    a = _bundle(node, ["AMD_VISIBLE_DEVICES=1"], "/ogh-y/ogh-ID.scope", prestart=True)
    x = _bundle(node, [], f"system.slice:ogh:{a.name}", prestart=True)  # a scope named after a's id, not a's
    x_id = _start(node, x)
    started = [b, x_id]
    try:
        scope_b, scope_x = f"ogh-{b}.scope", f"ogh-{a.name}.scope"
        before = {scope: _device_allow(node, scope) for scope in (scope_b, scope_x)}
        assert "DevicePolicy=strict" in node.ok(["systemctl", "show", "-p", "DevicePolicy", scope_b])
        for path in (f"/system.slice/{scope_b}/ID", f"/ogh-x/{scope_b}"):
            bundle = _bundle(node, ["AMD_VISIBLE_DEVICES=1"], path, prestart=True)
            _assert_not_its_own(node, bundle, scope_b,
                                f"its name does not end with '-{bundle.name}.scope' (the container's id)")
        _assert_not_its_own(node, a, scope_x, f"its ControlGroup is '/system.slice/{scope_x}', and the container's "
                                              "cgroup is neither it nor its 'container' child (crun's)")
        assert {scope: _device_allow(node, scope) for scope in (scope_b, scope_x)} == before
        assert _gpu_entries(node, scope_b) == []
        _disturb(node, "daemon-reload", scope_b)
        cl.assert_isolated(node.env.run(["runc", "exec", b, *PROBE_AGAIN], unit=False).stdout, [], cgroup_v2=v2)
        # the container's own scope is still registered with
        own = _start(node, _bundle(node, ["AMD_VISIBLE_DEVICES=1"], "system.slice:ogh:ID", prestart=True))
        started.append(own)
        (line,) = node.log_lines(own)
        assert line["outcome"] == "ok" and str(line["systemd_unit"]).startswith(f"ogh-{own}.scope: DeviceAllow "), line
        assert _gpu_entries(node, f"ogh-{own}.scope") != []
        _assert_kept(node, ["runc", "exec", own, *PROBE_AGAIN], [1], f"ogh-{own}.scope", v2)
    finally:
        for name in started:
            node.env.run(["runc", "delete", "-f", name], unit=False)


# What runc's spec (containerlib's bundle) allows besides a GPU, as runc's systemd driver lists it (``c *:* m`` is
# ``char-* m``): the restricted scope below has it too.
BASE_DEVICES = ("char-* m", "block-* m", *(f"{path} rwm" for path in (
    "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "char-pts")))


def test_prestart_registers_with_the_scope_above_crun_s_container_child(node: Node) -> None:
    """crun's layout under cgroup v2, a restricted scope named after the container (``PREFIX-ID.scope``,
    DevicePolicy=strict) with the container in its ``container`` child: the hook proves the unit by that parent
    and registers with it, and the grant survives a reload, a reexec and a set-property.  The layout is made here
    by systemd-run (the scope) and runc under cgroupfs (the child), as crun 1.8 cannot run without
    CAP_SYS_RESOURCE under a limited RLIMIT_MEMLOCK (it sets the limit to unlimited before loading its eBPF
    filter), which test machines may lack."""
    if node.env.cgroup == "v1":
        pytest.skip("crun makes a container child only under cgroup v2 (and refuses the hybrid v1 layout)")
    bundle = _bundle(node, ["AMD_VISIBLE_DEVICES=1"], "/system.slice/ogh-ID.scope/container", prestart=True)
    cid = bundle.name
    scope = _hold_scope(node, f"ogh-{cid}", "-p", "DevicePolicy=strict",
                        *(f"--property=DeviceAllow={entry}" for entry in BASE_DEVICES))
    try:
        assert "DevicePolicy=strict" in node.ok(["systemctl", "show", "-p", "DevicePolicy", scope])
        done = _start_cgroupfs(node, bundle)
        assert done.returncode == 0, done.stderr
        (line,) = node.log_lines(cid)
        assert line["outcome"] == "ok" and str(line["systemd_unit"]).startswith(f"{scope}: DeviceAllow "), line
        assert str(line["cgroup_dir"]).endswith(f"/{scope}/container"), line
        assert _gpu_entries(node, scope) != []
        _assert_kept(node, ["runc", "exec", cid, *PROBE_AGAIN], [1], scope, True)
    finally:
        node.env.run(["runc", "delete", "-f", cid], unit=False)
        node.env.systemctl("stop", scope)


@pytest.mark.parametrize("links", [True, False], ids=["dev-char-links", "no-dev-char-links"])
def test_shim_in_a_kubepods_slice(node: Node, links: bool) -> None:
    node.links(links)
    v2 = node.env.cgroup == "v2"
    pod = f"kubepods-besteffort-pod{uuid.uuid4().hex[:8]}.slice:cri-containerd:ID"
    pause = _start(node, _bundle(node, [], pod), RUNTIME)  # a pod's sandbox comes first
    cid = _start(node, _bundle(node, ["AMD_VISIBLE_DEVICES=1"], pod), RUNTIME)
    try:
        scope = f"cri-containerd-{cid}.scope"
        argv = ["runc", "exec", cid, *PROBE_AGAIN]
        cl.assert_isolated(node.env.run(argv, unit=False).stdout, [1], cgroup_v2=v2)
        inspect = node.ok([HOOK, "inspect", "--pid", _pid(node, cid)], env=cl.hook_env())
        if links:
            assert f"systemd unit {scope}: its DeviceAllow has every device allowed here" in inspect, inspect
            for what in AFTER:
                _disturb(node, what, scope)
                cl.assert_isolated(node.env.run(argv, unit=False).stdout, [1], cgroup_v2=v2)
            # runc update sets every resource again (the scope's properties, its own device rules) even when
            # asked to change nothing: the cgroup2 environment has no controller to change
            node.ok(["runc", "--systemd-cgroup", "update", "-r", "-", cid], stdin="{}")
            cl.assert_isolated(node.env.run(argv, unit=False).stdout, [1], cgroup_v2=v2)
        else:
            # runc left the GPU out of the scope's DeviceAllow (no /dev/char link, no /sys/dev/char entry for a
            # number no driver registered): inspect says so, and the reload takes it away
            assert f"systemd unit {scope}: its DeviceAllow lacks 3 device(s)" in inspect, inspect
            assert "c 226:129 rw" in inspect and "renderD129" in inspect, inspect
            _disturb(node, "daemon-reload", scope)
            after = cl.ProbeResult.parse(node.env.run(argv, unit=False).stdout)
            assert after.access[(226, 129)] == "EPERM" and after.nodes["/dev/null"] == "OPEN"
        nothing = _start(node, _bundle(node, [], pod), RUNTIME)
        cl.assert_isolated(node.env.run(["runc", "exec", nothing, *PROBE_AGAIN], unit=False).stdout, [],
                           cgroup_v2=v2)
        node.env.run(["runc", "delete", "-f", nothing], unit=False)
    finally:
        for name in (cid, pause):
            node.env.run(["runc", "delete", "-f", name], unit=False)


PODMAN = ["podman", "--cgroup-manager=systemd", "--events-backend=none", "--runtime=runc"]


def test_podman_systemd_cgroup_manager_precreate(node: Node) -> None:
    node.links(True)
    run = [*PODMAN, "run", "-d", "--net=none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
           "--cap-add", "MKNOD", "--tmpfs", "/tmp:rw,dev,exec", "--pids-limit", "0"]
    gpu = node.ok([*run, "-e", "AMD_VISIBLE_DEVICES=1", "--rootfs", str(node.rootfs), "/bin/sleep", "1000"],
                  env=cl.hook_env()).strip()
    cdi = node.ok([*run, "--device", "amd.com/gpu=4", "--rootfs", str(node.rootfs), "/bin/sleep", "1000"],
                  env=cl.hook_env()).strip()  # install's CDI spec in /etc/cdi, applied by podman itself
    plain = node.ok([*run, "--rootfs", str(node.rootfs), "/bin/sleep", "1000"], env=cl.hook_env()).strip()
    try:
        scope = f"libpod-{gpu}.scope"
        assert node.ok(["systemctl", "show", "-p", "ActiveState", scope]).strip() == "ActiveState=active"
        v1 = False if node.env.cgroup == "v1" else None  # cgroup2: podman gives the container a cgroup namespace
        for name, gpus in ((gpu, [1]), (cdi, [4])):
            cl.assert_isolated(node.ok([*PODMAN, "exec", name, *PROBE_AGAIN]), gpus, cgroup_v2=v1)
        for what in AFTER:
            _disturb(node, what, scope)
            for name, gpus in ((gpu, [1]), (cdi, [4])):
                cl.assert_isolated(node.ok([*PODMAN, "exec", name, *PROBE_AGAIN]), gpus, cgroup_v2=v1)
        cl.assert_isolated(node.ok([*PODMAN, "exec", plain, *PROBE_AGAIN]), [], cgroup_v2=v1)
        assert node.log_lines(plain) == []
    finally:
        node.env.run([*PODMAN, "rm", "-f", "-t", "0", gpu, cdi, plain], unit=False)


def test_podman_systemd_cgroup_manager_prestart(node: Node) -> None:
    """``install --hook prestart``: podman runs the live hook, which registers the grant with libpod-ID.scope (no
    /dev/char links needed); then install as it was."""
    node.links(False)
    out = node.ok([HOOK, "install", "--only", "podman,cdi", "--hook", "prestart"], env=cl.hook_env())
    assert "oci-gpu-hook-prestart.json" in out, out
    try:
        gpu = node.ok([*PODMAN, "run", "-d", "--net=none", "--ulimit", "nofile=1024:1024", "--ulimit",
                       "nproc=1024:1024", "--cap-add", "MKNOD", "--tmpfs", "/tmp:rw,dev,exec", "--pids-limit", "0",
                       "-e", "AMD_VISIBLE_DEVICES=1", "--rootfs", str(node.rootfs), "/bin/sleep", "1000"],
                      env=cl.hook_env()).strip()
        try:
            scope = f"libpod-{gpu}.scope"
            (line,) = node.log_lines(gpu)
            assert line["entry"] == "prestart" and str(line["systemd_unit"]).startswith(f"{scope}: DeviceAllow ")
            argv = [*PODMAN, "exec", gpu, *PROBE_AGAIN]
            v1 = False if node.env.cgroup == "v1" else None
            cl.assert_isolated(node.ok(argv), [1], cgroup_v2=v1)
            for what in AFTER:
                _disturb(node, what, scope)
                cl.assert_isolated(node.ok(argv), [1], cgroup_v2=v1)
        finally:
            node.env.run([*PODMAN, "rm", "-f", "-t", "0", gpu], unit=False)
    finally:
        node.ok([HOOK, "install", "--only", "podman,cdi"], env=cl.hook_env())


WATCH_DROP_IN = """\
# The test's interpreter and venv live under /root and /tmp, which the shipped unit hides; the config here names
# cdi_dir = /etc/cdi, for which the unit's own comment says to add ReadWritePaths=/etc/cdi.
[Service]
ProtectHome=no
PrivateTmp=no
ReadWritePaths=/etc/cdi
"""


def test_the_watch_unit_makes_the_links_under_its_hardening(node: Node) -> None:
    """install's watch unit, started by systemd with its sandbox (no capabilities, ProtectSystem=strict,
    DevicePolicy=closed), makes the missing links and their record, and nothing else in /dev/char."""
    node.links(False)
    node.ok(["sh", "-c", "mkdir -p /dev/dri /dev/char && mknod /dev/dri/renderD130 c 226 130 && "
                         "mknod /dev/kfd c 234 0 && ln -s ../somewhere /dev/char/226:3"])
    out = node.ok([HOOK, "install", "--only", "systemd"], env=cl.hook_env())
    assert "/etc/systemd/system/oci-gpu-hook-watch.service" in out, out
    drop_in = "/etc/systemd/system/oci-gpu-hook-watch.service.d"
    node.ok(["sh", "-c", f"mkdir -p {drop_in} && cat > {drop_in}/test.conf"], stdin=WATCH_DROP_IN)
    try:
        node.ok(["systemctl", "daemon-reload"])
        started = node.env.systemctl("start", "oci-gpu-hook-watch.service", timeout=120)
        journal = node.env.systemctl("status", "--no-pager", "-l", "oci-gpu-hook-watch.service").stdout
        assert started.returncode == 0, started.stderr + journal
        assert node.ok(["systemctl", "is-active", "oci-gpu-hook-watch.service"]).strip() == "active"
        links = node.ok(["sh", "-c", "for l in /dev/char/*; do echo \"$l $(readlink $l)\"; done"]).splitlines()
        assert sorted(links) == ["/dev/char/226:130 ../dri/renderD130", "/dev/char/226:3 ../somewhere",
                                 "/dev/char/234:0 ../kfd"], links
        record = node.ok(["cat", "/run/oci-gpu-hook-dev-char/links"]).splitlines()
        assert sorted(record) == ["/dev/char/226:130 ../dri/renderD130", "/dev/char/234:0 ../kfd"]
    finally:
        node.env.systemctl("stop", "oci-gpu-hook-watch.service")
        node.links(False)
