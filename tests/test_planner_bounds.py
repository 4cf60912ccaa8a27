"""The resident planner never does more than the front that asked, does a request once or not at all, and never
serves an old build: fronts run under real ``setpriv``/``prlimit``/``capsh`` get what the Python launcher gets under
the same (a front with fewer capabilities, no-new-privs or a seccomp filter is refused and falls back; a file size
limit binds the worker as it binds Python); peers that trickle their bytes hold a worker no longer than the front's
bound, and a front that gave up is never served later; 100 creates at once with 2 workers each write their
config.json exactly once; a planner whose package files change on disk stops answering."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from oci_gpu_hook.fastpath import build as fastbuild
from oci_gpu_hook.serve import planner as planner_module
from tests.conftest import need
from tests.helpers import containerlib as cl
from tests.helpers import plannerlib
from tests.test_planner import bundle_with, make_install, python_runs, spec_text, start_planner

pytestmark = pytest.mark.skipif(fastbuild.find_cc() is None, reason="no C compiler")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], plannerlib.Planner]:
    """An install and its planner (two workers), for the module."""
    need()  # the planner runs as root
    install = make_install(tmp_path_factory.mktemp("bounds"))
    running = start_planner(install, workers=2)
    yield install, running  # type: ignore[misc]
    running.stop()


def create(install: dict[str, Path], kind: str, bundle: Path, cid: str, wrapper: list[str] | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    argv = [str(install[kind] / "oci-gpu-runtime"), "create", "--bundle", str(bundle), cid]
    return subprocess.run([*(wrapper or []), *argv], capture_output=True, env=cl.hook_env(), timeout=timeout)


def logged(install: dict[str, Path], cid: str) -> int:
    """How many log records name container ``cid``."""
    if not install["log"].exists():
        return 0
    return sum(1 for line in install["log"].read_text().splitlines() if json.loads(line).get("id") == cid)


# Install an allow-all seccomp filter (as root: no no-new-privs needed), then exec the rest of argv.
SECCOMP = """
import ctypes, os, struct, sys
program = struct.pack("HBBI", 0x06, 0, 0, 0x7fff0000)  # BPF_RET | BPF_K, SECCOMP_RET_ALLOW
buffer = ctypes.create_string_buffer(program)
fprog = struct.pack("HxxxxxxP", 1, ctypes.addressof(buffer))
if ctypes.CDLL(None, use_errno=True).prctl(22, 2, ctypes.c_char_p(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, FILTER
    sys.exit(f"seccomp: {os.strerror(ctypes.get_errno())}")
os.execv(sys.argv[1], sys.argv[1:])
"""
CAPSH_DROP = ["capsh", "--drop=cap_mknod,cap_dac_override", "--", "-c", 'exec "$0" "$@"']
WRAPPERS = {
    "no-bounding-set": (["setpriv", "--bounding-set=-all", "--inh-caps=-all"], False),
    "no-new-privs": (["setpriv", "--no-new-privs"], False),
    "capsh-drop": (CAPSH_DROP, False),
    "fsize-512": (["prlimit", "--fsize=512"], True),  # the worker takes the limit on, and fails as Python does
    "nofile-256": (["prlimit", "--nofile=256:256"], True),
    "as-limited": (["prlimit", "--as=8000000000"], False),  # a fork of the planner holds more than a fresh Python
    "groups-65534": (["setpriv", "--groups=65534"], True),  # supplementary groups: taken on
    "seccomp-filter": ([sys.executable, "-c", SECCOMP], False),
}


@pytest.mark.parametrize("name", sorted(WRAPPERS))
@pytest.mark.parametrize("owner", [0, 65534], ids=["root-bundle", "other-uid-bundle"])
def test_a_front_with_less_gets_what_python_gets(served: tuple[dict[str, Path], plannerlib.Planner], name: str,
                                                 owner: int) -> None:
    """The same shim create under the same real setpriv/prlimit/capsh, through the native front (the planner
    running) and through the Python launcher alone: the same status, stdout, stderr and config.json; the planner
    served it only where the front's credentials are the planner's (else the front fell back to Python)."""
    install, planner = served
    wrapper, by_planner = WRAPPERS[name]
    cl.need(wrapper[0])
    text = spec_text(["AMD_VISIBLE_DEVICES=1"])
    outcomes = []
    for kind in ("native", "python"):
        bundle = bundle_with(install["base"], f"{name}-{owner}", text)  # one path: the messages name it
        os.chown(bundle, owner, owner)
        os.chown(bundle / "config.json", owner, owner)
        python_runs(install)
        done = create(install, kind, bundle, name, wrapper)
        if kind == "native":
            assert python_runs(install) == (0 if by_planner else 1), (name, planner.log.read_text()[-2000:])
        outcomes.append((done.returncode, done.stdout, done.stderr, (bundle / "config.json").read_bytes()))
    assert outcomes[0] == outcomes[1]
    if name == "fsize-512":
        assert outcomes[0][0] == 1 and b"File too large" in outcomes[0][2]
    if owner and name in ("no-bounding-set", "capsh-drop"):
        assert outcomes[0][0] == 1 and outcomes[0][3] == text.encode()  # Python cannot write it: nor the planner


def test_credentials_are_read_from_the_peer(served: tuple[dict[str, Path], plannerlib.Planner]) -> None:
    """What the planner compares: its own credentials against the connecting process's, named by its pidfd (a
    child under setpriv differs in its capabilities, a child under prlimit in its limits, an ordinary child in
    nothing)."""
    install, _planner = served
    own = planner_module.credentials_of(0)
    assert own is not None and not planner_module.exec_problem(own)
    probe = ("import socket, sys, time\nfrom oci_gpu_hook.serve import planner\n"
             "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); time.sleep(30)")
    where = install["base"] / "peer.sock"
    where.unlink(missing_ok=True)
    for wrapper, differs in [([], ""), (["setpriv", "--no-new-privs"], "NoNewPrivs"),
                             (["setpriv", "--bounding-set=-all", "--inh-caps=-all"], "CapPrm"),
                             (["prlimit", "--as=8000000000"], "RLIMIT_AS")]:
        with socket.socket(socket.AF_UNIX) as listening:
            listening.bind(str(where))
            listening.listen(1)
            child = subprocess.Popen([*wrapper, sys.executable, "-c", probe, str(where)], cwd=cl.REPO)
            try:
                conn, _addr = listening.accept()
                with conn:
                    peer = planner_module.peer_credentials(conn)
                    assert not isinstance(peer, str), peer
                    why = planner_module.credentials_problem(peer, own, 0, 0)
                    assert (differs in why) if differs else why == "", (wrapper, why)
            finally:
                child.kill()
                child.wait()
            where.unlink()


# --- once or not at all -------------------------------------------------------------------------------------


def trickle(socket_path: Path, stop: threading.Event, data: bytes, every: float) -> None:
    """A peer that sends one byte every ``every`` seconds, on fresh connections, until ``stop``."""
    fds = plannerlib.namespace_fds()
    try:
        while not stop.is_set():
            with socket.socket(socket.AF_UNIX) as conn:
                try:
                    conn.connect(str(socket_path))
                    conn.sendmsg([data[:1]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, b"".join(
                        fd.to_bytes(4, sys.byteorder) for fd in fds))])
                    for byte in data[1:]:
                        if stop.wait(every):
                            break
                        conn.send(bytes([byte]))
                except OSError:
                    stop.wait(every)
    finally:
        for fd in fds:
            os.close(fd)


def test_trickling_peers_hold_a_worker_only_for_the_bound(tmp_path: Path) -> None:
    """Two peers trickle a byte every 0.3 s into a planner of two workers: each worker drops its trickler when the
    whole request's bound has passed (not per read), and a front that gave up meanwhile is never run later."""
    install = make_install(tmp_path / "install")
    running = start_planner(install, workers=2)
    data = plannerlib.request_bytes(planner_module.version_line(), "oci-gpu-hook", "/x", ["precreate"], [], b"{}")
    stop = threading.Event()
    threads = [threading.Thread(target=trickle, args=(install["socket"], stop, data, 0.3)) for _ in range(2)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(0.5)  # both workers now hold a trickler
        bundles = [bundle_with(tmp_path, f"t{i}", spec_text([f"AMD_VISIBLE_DEVICES={i}"])) for i in range(4)]
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda ib: create(install, "native", ib[1], f"t{ib[0]}"), enumerate(bundles)))
        assert all((r.returncode, r.stderr) == (0, b"") for r in results), [r.stderr for r in results]
        time.sleep(planner_module.ANSWER_TIMEOUT_MS / 1000 * 3)  # long enough for any late run to happen
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        running.stop()
    for i in range(4):
        assert logged(install, f"t{i}") == 1, install["log"].read_text()
    log = running.log.read_text()
    assert "the request took longer than its bound" in log, log


def test_a_burst_far_beyond_the_workers_writes_each_config_once(tmp_path: Path) -> None:
    """100 creates at once, 2 workers: many fronts fall back to Python, and none of their requests is run by the
    planner too: one log record per container, every config.json right."""
    install = make_install(tmp_path / "install")
    texts = [spec_text([f"AMD_VISIBLE_DEVICES={i}"]) for i in range(8)]
    bundles = [bundle_with(tmp_path, f"burst{i}", texts[i % 8]) for i in range(100)]
    wanted = [
        (b / "config.json").read_bytes() for b in
        [bundle_with(tmp_path, f"want{i}", texts[i]) for i in range(8)]
        if create(install, "python", b, f"want-{b.name}").returncode == 0
    ]
    assert len(wanted) == 8
    running = start_planner(install, workers=2)
    try:
        python_runs(install)
        with ThreadPoolExecutor(100) as pool:
            results = list(pool.map(lambda ib: create(install, "native", ib[1], f"burst{ib[0]}", timeout=300),
                                    enumerate(bundles)))
        time.sleep(planner_module.ANSWER_TIMEOUT_MS / 1000 * 2)  # any late run would come now
        fell_back = python_runs(install)
    finally:
        running.stop()
    assert all((r.returncode, r.stderr) == (0, b"") for r in results), [r.stderr for r in results if r.stderr]
    for i, bundle in enumerate(bundles):
        assert logged(install, f"burst{i}") == 1, i
        assert (bundle / "config.json").read_bytes() == wanted[i % 8]
    print(f"{fell_back} of 100 fell back to Python")
    assert fell_back < 100


def test_a_front_that_is_not_told_ready_in_time_is_never_served(
        served: tuple[dict[str, Path], plannerlib.Planner]) -> None:
    """A client that never says GO: the worker that said READY does nothing (the precreate's log record never
    comes), and the next request is served."""
    install, _planner = served
    text = spec_text(["AMD_VISIBLE_DEVICES=3"]).encode()
    data = plannerlib.request_bytes(planner_module.version_line(), "oci-gpu-hook", "/x", ["precreate"],
                                    [f"OCI_GPU_HOOK_CONFIG={install['config']}", "PATH=/bin"], text)
    install["log"].unlink(missing_ok=True)
    fds = plannerlib.namespace_fds()
    try:
        assert plannerlib.ask(install["socket"], data, fds, go=False) == planner_module.READY
        time.sleep(planner_module.ANSWER_TIMEOUT_MS / 1000 + 0.5)
        assert not install["log"].exists() or install["log"].read_text() == ""
        fields = planner_module.decode_answer(plannerlib.ask(install["socket"], data, fds))
    finally:
        for fd in fds:
            os.close(fd)
    assert fields[1:3] == [b"ok", b"0"] and b"renderD131" in fields[5]
    assert len(install["log"].read_text().splitlines()) == 1


# --- never a stale build ------------------------------------------------------------------------------------


def test_a_planner_whose_package_changed_on_disk_stops_answering(tmp_path: Path) -> None:
    """A planner run from a copy of the package (the same build as the front): it serves; then one file of the copy
    changes on disk (an upgrade before install ran again) and the next request falls back to Python, and the
    planner exits (its unit starts the new build)."""
    install = make_install(tmp_path / "install")
    copy = tmp_path / "copy"
    shutil.copytree(cl.REPO / "oci_gpu_hook", copy / "oci_gpu_hook", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**cl.hook_env(), "OCI_GPU_HOOK_CONFIG": str(install["config"])}
    argv = [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(copy)!r}); "
            "from oci_gpu_hook.entry.cli import main; sys.exit(main(sys.argv[1:]))", "serve"]
    running = plannerlib.Planner(Path(), install["socket"], env, 2, argv=argv).start()
    text = spec_text(["AMD_VISIBLE_DEVICES=2"])
    try:
        python_runs(install)
        assert create(install, "native", bundle_with(tmp_path, "before", text), "before").returncode == 0
        assert python_runs(install) == 0  # the copy is the front's build: served
        errors = copy / "oci_gpu_hook" / "errors.py"
        errors.write_text(errors.read_text() + "# upgraded\n")
        done = create(install, "native", bundle_with(tmp_path, "after", text), "after")
        assert (done.returncode, done.stderr) == (0, b"")
        assert python_runs(install) == 1
        assert running.process is not None
        assert running.process.wait(timeout=30) == 0
        assert "the package's files changed on disk" in running.log.read_text()
    finally:
        running.kill_group()


def test_the_stamp_without_inotify_sees_a_change(tmp_path: Path) -> None:
    """The watch's other way (where inotify cannot be had): a stamp of every file, which a rewrite changes."""
    tree = tmp_path / "pkg"
    shutil.copytree(cl.REPO / "oci_gpu_hook", tree, ignore=shutil.ignore_patterns("__pycache__"))
    watch = planner_module.PackageWatch(str(tree))
    assert watch.fd >= 0 and not watch.changed()
    stamp = planner_module.PackageWatch.__new__(planner_module.PackageWatch)
    stamp.root, stamp.fd = str(tree), -1
    stamp.stamp = stamp._stamp()
    assert not stamp.changed()
    (tree / "plan.py").write_text((tree / "plan.py").read_text())  # the same bytes, written again
    assert stamp.changed() and watch.changed()


@pytest.mark.parametrize("change", ["rename-over", "remove", "chmod", "rename-away"])
def test_the_watch_sees_what_an_upgrade_does(tmp_path: Path, change: str) -> None:
    """What pip does to an installed file: a new one renamed over it, removed, its mode changed, moved away."""
    tree = tmp_path / "pkg"
    shutil.copytree(cl.REPO / "oci_gpu_hook", tree, ignore=shutil.ignore_patterns("__pycache__"))
    watch = planner_module.PackageWatch(str(tree))
    (tree / "__pycache__").mkdir(exist_ok=True)  # Python's own writes are no change
    (tree / "__pycache__" / "x.pyc").write_bytes(b"")
    assert not watch.changed()
    target = tree / "request.py"
    if change == "rename-over":
        (tree / ".new").write_text(target.read_text())
        os.replace(tree / ".new", target)
    elif change == "remove":
        target.unlink()
    elif change == "chmod":
        target.chmod(0o600)
    else:
        target.rename(tmp_path / "away.py")
    assert watch.changed()


# --- real containers ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runc_served(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], Path]:
    """An install whose shim runs runc, and a rootfs."""
    need()
    cl.need("runc", "busybox", "unshare", "setpriv")
    install = make_install(tmp_path_factory.mktemp("bounds-runc"), runtime="runc")
    return install, cl.make_rootfs(install["base"] / "rootfs")


def _without_pids(text: str) -> str:
    import re

    return re.sub(r"\d+", "N", text)


@pytest.mark.containers
@pytest.mark.parametrize("v2", [False, True], ids=["cgroup-v1", "cgroup-v2"])
def test_a_prestart_hook_without_capabilities_in_runc(runc_served: tuple[dict[str, Path], Path], v2: bool) -> None:
    """A prestart hook entry run under ``setpriv --bounding-set=-all --inh-caps=-all`` in a real runc container: with
    the planner running, the native front is refused by it and falls back, and the container fails as it does with
    the Python launcher alone (the hook cannot enter the container); neither makes a node or opens the cgroup."""
    install, rootfs = runc_served
    running = start_planner(install, workers=2)
    outcomes = []
    try:
        for kind in ("native", "python"):
            wrapper = install["base"] / f"capless-{kind}"
            wrapper.write_text(f'#!/bin/sh\nexec setpriv --bounding-set=-all --inh-caps=-all '
                               f'{install[kind] / "oci-gpu-hook"} "$@"\n')
            wrapper.chmod(0o755)
            bundle = cl.make_bundle(install["base"] / cl.container_id(), rootfs, ["AMD_VISIBLE_DEVICES=1"])
            cl.add_prestart(bundle, wrapper)
            python_runs(install)
            argv = ["runc", "run", "--bundle", str(bundle), bundle.name]
            result = cl.run(cl.cgroup2_wrap(argv) if v2 else argv, env=cl.hook_env())
            if kind == "native":
                assert python_runs(install) == 1, running.log.read_text()[-2000:]
            hook_lines = [line for line in result.stderr.splitlines() if "oci-gpu-hook" in line]
            outcomes.append((result.returncode, _without_pids("\n".join(hook_lines)), "renderD" in result.stdout))
    finally:
        running.stop()
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] != 0 and not outcomes[0][2], outcomes
    assert "credentials" in running.log.read_text()


def _fake_planner(socket_path: Path, steps: str) -> threading.Thread:
    """A server on ``socket_path`` that reads one request and then plays ``steps``: "ready" (say READY and read
    GO), "started" (say STARTED), then closes: a worker killed at that step."""
    socket_path.parent.mkdir(mode=0o700, exist_ok=True)  # as the planner makes it: root's alone
    listening = socket.socket(socket.AF_UNIX)
    socket_path.unlink(missing_ok=True)
    listening.bind(str(socket_path))
    listening.listen(1)

    def serve() -> None:
        with listening:
            conn, _addr = listening.accept()
            with conn:
                conn.settimeout(30)
                _data, _fds, _flags, _addr2 = socket.recv_fds(conn, 8, 8)
                size = int.from_bytes(_data[4:8], "big")
                while size > 0:
                    size -= len(conn.recv(size))
                if "ready" in steps:
                    conn.sendall(planner_module.READY)
                    assert conn.recv(4, socket.MSG_WAITALL) == planner_module.GO
                if "started" in steps:
                    conn.sendall(planner_module.STARTED)
                for fd in _fds:
                    os.close(fd)

    thread = threading.Thread(target=serve)
    thread.start()
    return thread


@pytest.fixture(scope="module")
def unserved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An install whose socket no planner of its own serves (each test binds its fake one there); its log
    records are told apart by container id."""
    need()
    return make_install(tmp_path_factory.mktemp("bounds-fake"))


@pytest.mark.parametrize("steps", ["", "ready", "ready started"], ids=["before-ready", "after-go", "after-started"])
def test_a_worker_killed_at_each_step(unserved: dict[str, Path], tmp_path: Path, steps: str) -> None:
    """The front against a planner that dies after reading the request, after GO, after STARTED: the first two
    fall back to Python (nothing was done), the last stops with one line and does not run the request again."""
    install, cid = unserved, f"k-{steps.replace(' ', '-') or 'none'}"
    text = spec_text(["AMD_VISIBLE_DEVICES=4"])
    bundle = bundle_with(tmp_path, "b", text)
    python_runs(install)
    assert logged(install, cid) == 0
    thread = _fake_planner(install["socket"], steps)
    try:
        done = create(install, "native", bundle, cid)
    finally:
        thread.join(timeout=60)
        install["socket"].unlink(missing_ok=True)
    if "started" in steps:
        assert done.returncode == 1 and done.stderr.count(b"\n") == 1, done.stderr
        assert b"the resident planner did not finish this request" in done.stderr
        assert python_runs(install) == 0 and (bundle / "config.json").read_text() == text
    else:
        assert (done.returncode, done.stderr) == (0, b"")
        assert python_runs(install) == 1 and logged(install, cid) == 1
