"""The resident planner (``oci-gpu-hook serve``) behind the native front: GPU containers start through it without a
Python start, with the outcome the Python launcher gives; it survives bad requests, peers that are not root, fronts
of another version, being killed and restarted at any moment during 500 starts (every start writes exactly the
right config.json, or fails with one line, and none waits for ever), 64 starts at once, a pool of one worker;
the front falls back to Python whenever the planner is absent, refuses, is of another build, or does not answer.
Real runc containers get exactly their GPU through it: the shim (with the native links hook) and the prestart hook
in cgroup v1 and v2, and from a planner in another mount namespace (a DaemonSet pod's)."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from oci_gpu_hook.fastpath import build as fastbuild
from oci_gpu_hook.install import launchers
from oci_gpu_hook.serve import planner as planner_module
from tests.conftest import need
from tests.helpers import containerlib as cl
from tests.helpers import plannerlib

pytestmark = pytest.mark.skipif(fastbuild.find_cc() is None, reason="no C compiler")

SEED_PCI = cl.SEED_PCI


def make_install(base: Path, runtime: str = "/bin/true", extra: str = "", hook: Path | None = None,
                 host: str | None = None) -> dict[str, Path]:
    """Native launchers that ask the planner at ``base/run/planner.sock`` (their Python launchers leave a marker),
    Python-only launchers of the same settings, and a config (the seed host, a log file, the native links hook).
    ``hook``: the ``oci-gpu-hook`` command that writes them (``launchers DIR``: an installed wheel's), else this
    checkout's :func:`launchers.write_launchers`.  ``host``: the host's roots (config lines) instead of the seed's."""
    base.mkdir(parents=True, exist_ok=True)
    config, log = base / "config.toml", base / "hook.log"
    socket_path = base / "run" / "planner.sock"
    roots = host if host is not None else f'sysfs_root = "{cl.SEED_SYSFS}"\n'
    config.write_text(f'{roots}hook_path = "{base / "native" / "oci-gpu-hook"}"\n'
                      f'runtime = "{runtime}"\nlog_file = "{log}"\nby_path_dir = "{base / "by-path"}"\n{extra}')
    defaults = {"OCI_GPU_HOOK_CONFIG": str(config), "OCI_GPU_HOOK_PLANNER_SOCKET": str(socket_path)}
    for kind, native in (("native", True), ("python", False)):
        if hook is None:
            launchers.write_launchers(str(base / kind), defaults, native=native)
            continue
        sets = [word for key, value in defaults.items() for word in ("--set", f"{key}={value}")]
        done = subprocess.run([str(hook), "launchers", str(base / kind), "--native" if native else "--no-native",
                               *sets], capture_output=True, text=True, env=cl.hook_env(), timeout=300)
        assert done.returncode == 0, done.stderr
    marker = base / "python-ran"
    for name in ("oci-gpu-hook.py", "oci-gpu-runtime.py"):
        script = base / "native" / name
        first, rest = script.read_text().split("\n", 1)
        script.write_text(f"{first}\nimport sys\nif sys.argv[1:2] != ['serve']: open({str(marker)!r}, 'a')"
                          f".write(repr(sys.argv[1:2]) + '\\n')\n{rest}")
    return {"base": base, "config": config, "log": log, "socket": socket_path, "native": base / "native",
            "python": base / "python", "marker": marker}


def python_runs(install: dict[str, Path]) -> int:
    """How many times the native front started Python since the last call."""
    marker = install["marker"]
    count = len(marker.read_text().splitlines()) if marker.exists() else 0
    if marker.exists():
        marker.unlink()
    return count


def start_planner(install: dict[str, Path], workers: int = 3) -> plannerlib.Planner:
    env = {**cl.hook_env(), "OCI_GPU_HOOK_CONFIG": str(install["config"])}
    return plannerlib.Planner(install["native"] / "oci-gpu-hook", install["socket"], env, workers).start()


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    need()  # the planner runs as root
    return make_install(tmp_path_factory.mktemp("planner"))


@pytest.fixture(scope="module")
def planner(install: dict[str, Path]) -> plannerlib.Planner:
    running = start_planner(install)
    yield running  # type: ignore[misc]
    assert running.stop() == 0
    assert "add it to PRELOAD" not in running.log.read_text()  # no request imported code after the fork


def spec_text(env: list[str], root: str = "rootfs") -> str:
    return json.dumps({"ociVersion": "1.0.2", "process": {"args": ["/bin/true"], "env": ["PATH=/bin", *env]},
                       "root": {"path": root}})


def bundle_with(base: Path, name: str, text: str) -> Path:
    bundle = base / "bundles" / name
    bundle.mkdir(parents=True, exist_ok=True)
    (bundle / "config.json").write_text(text)
    return bundle


def shim(install: dict[str, Path], kind: str, bundle: Path, env: dict[str, str] | None = None,
         timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(install[kind] / "oci-gpu-runtime"), "create", "--bundle", str(bundle), "c1"],
                          capture_output=True, env=env or cl.hook_env(), timeout=timeout)


def expected_config(install: dict[str, Path], text: str) -> bytes:
    """What the Python launcher writes for ``text``."""
    bundle = bundle_with(install["base"], f"expected-{abs(hash(text))}", text)
    done = shim(install, "python", bundle)
    assert done.returncode == 0, done.stderr
    return (bundle / "config.json").read_bytes()


# --- the contract -------------------------------------------------------------------------------------------


def test_the_contract_is_baked_from_python(tmp_path: Path) -> None:
    """Every name of the fast-path contract is in the front's header with Python's value, the front uses each,
    and front.c's header names the Python it mirrors."""
    from oci_gpu_hook import config
    from oci_gpu_hook.appliers.ocispec import LINKS_COMMAND
    from oci_gpu_hook.entry import cli

    top, code = Path(fastbuild.FRONT_SOURCE).read_text().split("*/", 1)
    parts = [Path(path).read_text().split("*/", 1) for path in fastbuild.front_sources()[1:]]
    assert all("Mirrors: oci_gpu_hook/" in head for head, _body in parts)  # each part names the Python it mirrors
    code += "".join(body for _head, body in parts)
    header = fastbuild.front_header("oci-gpu-hook", str(tmp_path), {}, trust=False)
    contract = fastbuild.front_contract()
    for key, value in contract.items():
        assert f"OGH_{key}" in code, key  # used in the code, not only in the comment
        if isinstance(value, list):
            assert all(fastbuild._c_string(v) in header for v in value), key
    assert set(contract["BOOL_WORDS"]) == config._TRUE | config._FALSE  # type: ignore[arg-type]
    assert contract["BOOL_ENV"] == ["OCI_GPU_HOOK_ALLOW_ENV_REQUESTS", "OCI_GPU_HOOK_DEBUG"]
    assert LINKS_COMMAND in cli.HOT_COMMANDS and contract["LINKS_COMMAND"] == LINKS_COMMAND
    assert "cdi.k8s.io" in fastbuild.baked_settings({})["needles"]  # type: ignore[operator]
    assert f"OGH_PLANNER_VERSION[] = {fastbuild._c_string(planner_module.version_line())}" in header
    for python in ("config.py load_config", "check_value", "request.py requested", "oci_state.py parse_state",
                   "live.py run_links", "check_container", "rootfs.py make_nodes", "edits.py check_link",
                   "runtime.py resolve_runtime", "planner/protocol.py", "build.py front_contract",
                   "oci_spec.py ContainerSpec.root"):
        assert python in top, python
    # no contract word is spelled in the code by hand any more
    for word in ('"OCI_GPU_HOOK_DEBUG"', '"cdi.k8s.io"', '"yes"', '"precreate"', '"createRuntime"', '"links"',
                 '"none"', '"void"', '"AMD_VISIBLE_DEVICES"'):
        assert word not in code, word


# --- through the planner ------------------------------------------------------------------------------------


@pytest.mark.parametrize("request_env", ["AMD_VISIBLE_DEVICES=1", "AMD_VISIBLE_DEVICES=all", "AMD_VISIBLE_DEVICES=9",
                                         "INTEL_VISIBLE_DEVICES=0", "AMD_VISIBLE_DEVICES=0,0000:c3:00.0"])
def test_shim_create_through_the_planner(install: dict[str, Path], planner: plannerlib.Planner,
                                         request_env: str) -> None:
    text = spec_text([request_env])
    native = bundle_with(install["base"], "via-planner", text)
    python = bundle_with(install["base"], "via-python", text)
    python_runs(install)
    a, b = shim(install, "native", native), shim(install, "python", python)
    assert python_runs(install) == 0  # the planner answered
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)
    assert (native / "config.json").read_bytes() == (python / "config.json").read_bytes()
    if request_env.endswith("=1"):
        assert b"/dev/dri/renderD129" in (native / "config.json").read_bytes()
    if request_env.endswith("=9"):
        assert a.returncode == 1 and a.stderr.count(b"\n") == 1 and b"out of range" in a.stderr


def test_precreate_through_the_planner(install: dict[str, Path], planner: plannerlib.Planner) -> None:
    text = spec_text(["AMD_VISIBLE_DEVICES=2"]).encode()
    python_runs(install)
    a = subprocess.run([str(install["native"] / "oci-gpu-hook"), "precreate"], input=text, capture_output=True,
                       env=cl.hook_env(), timeout=60)
    b = subprocess.run([str(install["python"] / "oci-gpu-hook"), "precreate"], input=text, capture_output=True,
                       env=cl.hook_env(), timeout=60)
    assert python_runs(install) == 0
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)
    assert b"renderD130" in a.stdout


def test_bad_requests_leave_it_serving(install: dict[str, Path], planner: plannerlib.Planner) -> None:
    version = planner_module.version_line()
    good = plannerlib.request_bytes(version, "oci-gpu-hook", "/x", ["precreate"], ["PATH=/bin"], b"{}")
    refused = planner_module.encode_answer(version, "refused")
    fds = plannerlib.namespace_fds()
    try:
        for data, with_fds in [(b"", False), (b"GET / HTTP/1.0\r\n\r\n", False), (good, False),
                               (good[:20], True), (good[:-3], True), (b"OGHQ\xff\xff\xff\xff", True),
                               (good.replace(b"precreate", b"precreatX"), True),
                               (plannerlib.request_bytes("oci-gpu-hook 0.0.1 planner/1 x", "oci-gpu-hook", "/x",
                                                         ["precreate"], [], b"{}"), True),
                               (plannerlib.request_bytes(version, "sh", "/x", ["-c", "id"], [], None), True),
                               (plannerlib.request_bytes(version, "oci-gpu-hook", "/x", ["list"], [], b""), True),
                               (plannerlib.request_bytes(version, "oci-gpu-hook", "/x", ["precreate"], ["=x"], b"{}"),
                                True)]:
            try:
                answer = plannerlib.ask(install["socket"], data, fds if with_fds else None)
            except BrokenPipeError:  # it read what it needed to refuse, and closed
                answer = b""
            assert answer in (b"", refused), data[:40]
        answer = plannerlib.ask(install["socket"], good, fds)
        fields = planner_module.decode_answer(answer)
        assert fields[:3] == [version.encode(), b"ok", b"0"] and fields[5] == b"{}"
    finally:
        for fd in fds:
            os.close(fd)
    # and the front still gets its answer
    text = spec_text(["AMD_VISIBLE_DEVICES=1"])
    python_runs(install)
    assert shim(install, "native", bundle_with(install["base"], "after-bad", text)).returncode == 0
    assert python_runs(install) == 0


CLIENT = """
import socket, sys
data = bytes.fromhex(sys.argv[2])
with socket.socket(socket.AF_UNIX) as conn:
    conn.settimeout(30)
    conn.connect(sys.argv[1])
    try:
        conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
        print(len(conn.recv(1 << 20)))
    except (ConnectionResetError, BrokenPipeError):  # closed on us, our bytes unread
        print(0)
"""


def test_a_peer_that_is_not_root_gets_nothing(install: dict[str, Path], planner: plannerlib.Planner) -> None:
    cl.need("setpriv")
    data = plannerlib.request_bytes(planner_module.version_line(), "oci-gpu-hook", "/x", ["precreate"], [], b"{}")
    done = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "--inh-caps",
                           "+dac_override,+dac_read_search", "--ambient-caps", "+dac_override,+dac_read_search",
                           sys.executable, "-c", CLIENT, str(install["socket"]), data.hex()],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"  # connected (DAC overridden), answered nothing
    deadline = time.monotonic() + 30  # the worker logs after it closed the connection
    while "refused a peer that is not root" not in planner.log.read_text():
        assert time.monotonic() < deadline, planner.log.read_text()
        time.sleep(0.05)


def test_falls_back_when_there_is_no_planner(tmp_path: Path) -> None:
    """No socket, a stale socket (a killed planner's), a socket directory others could enter, a planner of another
    build (an upgrade not yet restarted), a planner that never answers: Python, and the same outcome."""
    install = make_install(tmp_path / "install")
    text = spec_text(["AMD_VISIBLE_DEVICES=3"])
    want = expected_config(install, text)

    def check(what: str, planned: bool = False) -> None:
        bundle = bundle_with(tmp_path, what, text)
        python_runs(install)
        done = shim(install, "native", bundle)
        assert (done.returncode, done.stderr) == (0, b""), what
        assert (bundle / "config.json").read_bytes() == want, what
        assert python_runs(install) == (0 if planned else 1), what

    check("no-socket")
    running = start_planner(install)
    check("planned", planned=True)
    os.killpg(running.process.pid, 9)  # type: ignore[union-attr]
    running.process.wait()  # type: ignore[union-attr]
    assert install["socket"].exists()
    check("stale-socket")
    running = start_planner(install)
    install["socket"].parent.chmod(0o755)
    check("wide-directory")
    install["socket"].parent.chmod(0o700)
    check("narrow-again", planned=True)
    running.stop()

    # a planner of another build: the package copied, one comment changed
    copy = tmp_path / "copy"
    shutil.copytree(cl.REPO / "oci_gpu_hook", copy / "oci_gpu_hook", ignore=shutil.ignore_patterns("__pycache__"))
    errors = copy / "oci_gpu_hook" / "errors.py"
    errors.write_text(errors.read_text() + "# another build\n")
    other = plannerlib.Planner(Path(), install["socket"], {**cl.hook_env(), "OCI_GPU_HOOK_CONFIG": str(
        install["config"])}, 2, argv=[sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(copy)!r}); "
                                      "from oci_gpu_hook.entry.cli import main; sys.exit(main(sys.argv[1:]))",
                                      "serve"]).start()
    try:
        check("another-build")
    finally:
        other.stop()

    # a planner that accepts and never answers: the front gives up after its bound
    silent = socket.socket(socket.AF_UNIX)
    silent.bind(str(install["socket"]))
    silent.listen(8)
    started = time.monotonic()
    try:
        check("never-answers")
    finally:
        silent.close()
        install["socket"].unlink()
    assert time.monotonic() - started >= planner_module.ANSWER_TIMEOUT_MS / 1000


def test_serve_refuses_what_it_cannot_do(install: dict[str, Path], planner: plannerlib.Planner,
                                         tmp_path: Path) -> None:
    env = {**cl.hook_env(), "OCI_GPU_HOOK_CONFIG": str(install["config"])}
    launcher = str(install["native"] / "oci-gpu-hook")
    for argv, message in [(["--socket", str(install["socket"])], "another planner is serving"),
                          (["--socket", "relative.sock"], "expected an absolute file path"),
                          (["--workers", "0"], "--workers '0'"),
                          (["--socket", str(tmp_path / "missing" / "deeper" / "p.sock")], "cannot create")]:
        done = subprocess.run([launcher, "serve", *argv], capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode in (1, 2) and message in done.stderr, (argv, done.stderr)
        assert done.stderr.count("\n") == 1, done.stderr


# --- killed and restarted during 500 starts ------------------------------------------------------------------


def test_killed_at_random_moments_during_500_starts(tmp_path: Path) -> None:
    """At least 500 starts, four at a time, while the planner is killed (the whole group, the parent alone, or
    SIGTERM) at chosen steps of its life: while Python starts, once its socket is bound (the workers warming up),
    and after it has answered a request (mid-request or between requests, at a random moment).  Every start writes
    exactly the right config.json and logs once, or fails with one line and logs at most once; the planner answers
    in every round that waits for it (kills never leave it unable to serve), and again once it is back for good."""
    install = make_install(tmp_path / "install")
    texts = [spec_text([f"AMD_VISIBLE_DEVICES={i}"]) for i in range(8)]
    wanted = [expected_config(install, t) for t in texts]
    launcher = install["native"] / "oci-gpu-hook"
    env = {**cl.hook_env(), "OCI_GPU_HOOK_CONFIG": str(install["config"])}
    running = plannerlib.Planner(launcher, install["socket"], env, 4, argv=[str(launcher), "serve", "--verbose"])
    rounds, least = 16, 500
    rng = random.Random(17)
    plan = [("serving", "group")] + [(rng.choice(["starting", "bound", "serving", "serving"]),
                                      rng.choice(["group", "group", "parent", "term"])) for _ in range(rounds - 1)]
    rounds_done = threading.Event()  # every round of the plan done: the starts may end once there are enough
    stop = threading.Event()  # every start done: the rounds end
    kills: list[tuple[str, str]] = []
    problems: list[BaseException] = []

    def killer() -> None:
        try:
            done = 0
            while done < rounds or not stop.is_set():
                step, how = plan[done % rounds]
                running.kill_group()  # the last one's workers too
                running.log = tmp_path / f"planner-{done}.log"  # this one's alone: a straggler never speaks for it
                running.start(wait=False)
                if step == "starting":
                    time.sleep(rng.uniform(0.005, 0.25))  # Python starting, or just bound
                elif step == "bound":
                    running.wait_ready()
                    time.sleep(rng.uniform(0, 0.05))  # its workers warming up, connections in its backlog
                elif not running.wait_answered(stop):  # set before the plan is done only where the starts broke
                    break
                else:
                    time.sleep(rng.uniform(0.005, 0.25))  # mid-request or between requests
                process = running.process
                assert process is not None
                if how == "group":
                    os.killpg(process.pid, 9)  # the planner and every worker, mid-request or not
                elif how == "parent":
                    os.kill(process.pid, 9)  # the workers follow it; a busy one finishes its request
                else:
                    os.kill(process.pid, 15)
                process.wait()
                if how == "parent":
                    time.sleep(0.01)
                kills.append((step, how))
                if rng.random() < 0.3:
                    running.kill_group()
                    time.sleep(rng.uniform(0.01, 0.2))  # a while without any planner
                done += 1
                if done == rounds:
                    rounds_done.set()
        except BaseException as err:
            problems.append(err)
        finally:
            rounds_done.set()
            running.kill_group()

    results: dict[int, tuple[int, bytes, bool]] = {}
    counter = iter(range(1 << 30))
    take = threading.Lock()

    def one(i: int) -> tuple[int, bytes, bool]:
        bundle = bundle_with(tmp_path, f"b{i}", texts[i % 8])
        done = subprocess.run([str(install["native"] / "oci-gpu-runtime"), "create", "--bundle", str(bundle), f"k{i}"],
                              capture_output=True, env=cl.hook_env(), timeout=30)  # nothing waits for ever
        written = (bundle / "config.json").read_bytes()
        return done.returncode, done.stderr, written == wanted[i % 8]

    def starts() -> None:
        while True:
            with take:
                i = next(counter)
            if i >= least and rounds_done.is_set():
                return
            results[i] = one(i)

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            for future in [pool.submit(starts) for _ in range(4)]:
                future.result()
    finally:
        stop.set()
        thread.join()
        running.kill_group()
    assert not problems, problems
    during = sum(1 for s, _e, _r in results.values() if s == 0) - python_runs(install)  # answered by the planner
    # back for good: it answers again (the first starts may find its workers still warming up)
    running.log = tmp_path / "planner-back.log"
    running.start()
    try:
        back = len(results)
        for i in range(back, back + 20):
            results[i] = one(i)
            if python_runs(install) == 0:
                break
        else:
            raise AssertionError(f"the restarted planner answered none of 20 starts: {running.log.read_text()[-4000:]}")
    finally:
        assert running.stop() == 0
    records = [json.loads(line).get("id") for line in install["log"].read_text().splitlines()]
    for i, (status, stderr, right) in results.items():
        if status == 0:
            assert right and stderr == b""
            assert records.count(f"k{i}") == 1, i  # once: the planner's or Python's, never both
        else:  # a worker killed after it said STARTED: one line, and the request not run again
            assert stderr.count(b"\n") == 1 and b"the resident planner did not finish this request" in stderr, stderr
            assert records.count(f"k{i}") <= 1, i
    failed = sum(1 for s, _e, _r in results.values() if s != 0)
    assert failed <= 4 * len(kills)  # only the starts in flight when a kill came, four at most each time
    assert len(kills) >= rounds and len(results) >= least
    assert results[max(results)][0] == 0  # the last, through the planner back for good
    print(f"kills: {len(kills)} ({', '.join(f'{s}/{h} {kills.count((s, h))}' for s, h in sorted(set(kills)))}); "
          f"{during} of {back} starts answered by the planner while it was killed, {failed} failed")
    assert during >= sum(1 for s, _h in kills if s == "serving")  # each waited-for round answered one at least


# --- at once --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("starts", "workers"), [(64, 8), (16, 1)])
def test_starts_at_once_each_get_exactly_their_gpu(tmp_path: Path, starts: int, workers: int) -> None:
    install = make_install(tmp_path / "install")
    running = start_planner(install, workers=workers)
    try:
        bundles = [bundle_with(tmp_path, f"b{i}", spec_text([f"AMD_VISIBLE_DEVICES={i % 8}"])) for i in range(starts)]
        with ThreadPoolExecutor(starts) as pool:
            results = list(pool.map(lambda b: shim(install, "native", b, timeout=120), bundles))
    finally:
        running.stop()
    assert all((r.returncode, r.stderr) == (0, b"") for r in results), [r.stderr for r in results]
    for i, bundle in enumerate(bundles):
        spec = json.loads((bundle / "config.json").read_text())
        gpu = i % 8
        paths = sorted(d["path"] for d in spec["linux"]["devices"])
        assert paths == sorted([f"/dev/dri/card{cl.CARD_MINORS[gpu]}", f"/dev/dri/renderD{cl.RENDER_MINORS[gpu]}",
                                "/dev/kfd"])
        assert "hooks" not in spec  # the by-path links: the last mount, a directory of exactly this GPU's links
        source = Path(spec["mounts"][-1]["source"])
        assert {p.name: os.readlink(p) for p in source.iterdir()} == {
            f"pci-0000:{SEED_PCI[gpu]}:00.0-card": f"../card{gpu + 1}",
            f"pci-0000:{SEED_PCI[gpu]}:00.0-render": f"../renderD{128 + gpu}"}
    assert python_runs(install) < starts  # the planner answered (how many fall back depends on the load)


# --- real containers ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rootfs(install: dict[str, Path]) -> Path:
    cl.need("runc", "busybox", "unshare")
    return cl.make_rootfs(install["base"] / "rootfs")


@pytest.fixture(scope="module")
def runc_install(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    need()  # the planner runs as root
    return make_install(tmp_path_factory.mktemp("planner-runc"), runtime="runc")


@pytest.mark.containers
@pytest.mark.parametrize("v2", [False, True], ids=["cgroup-v1", "cgroup-v2"])
def test_a_gpu_container_starts_without_python(runc_install: dict[str, Path], rootfs: Path, v2: bool) -> None:
    """The shim's run (config.json through the planner, the by-path links a read-only mount it prepared, no hook):
    exactly GPU 5, its links, and Python never started."""
    running = start_planner(runc_install)
    try:
        bundle = cl.make_bundle(runc_install["base"] / cl.container_id(), rootfs, ["AMD_VISIBLE_DEVICES=5"])
        python_runs(runc_install)
        argv = [str(runc_install["native"] / "oci-gpu-runtime"), "run", "--bundle", str(bundle), bundle.name]
        result = cl.run(cl.cgroup2_wrap(argv) if v2 else argv, env=cl.hook_env())
        assert result.returncode == 0, result.stderr
        probe = cl.assert_isolated(result.stdout, [5], cgroup_v2=v2)
        assert probe.links == cl.expected_links([5])
        assert python_runs(runc_install) == 0
        spec = json.loads((bundle / "config.json").read_text())
        assert "hooks" not in spec and spec["mounts"][-1]["destination"] == "/dev/dri/by-path"
        assert "ro" in spec["mounts"][-1]["options"]
    finally:
        running.stop()


@pytest.mark.containers
@pytest.mark.parametrize("v2", [False, True], ids=["cgroup-v1", "cgroup-v2"])
def test_the_prestart_hook_through_the_planner(runc_install: dict[str, Path], rootfs: Path, v2: bool) -> None:
    """The live hook through the planner (check_container's parent is the front's, the cgroup the container's,
    the eBPF program replaced in v2): exactly GPUs 1 and 6, and Python never started."""
    running = start_planner(runc_install)
    try:
        bundle = cl.make_bundle(runc_install["base"] / cl.container_id(), rootfs, ["AMD_VISIBLE_DEVICES=1,6"])
        cl.add_prestart(bundle, runc_install["native"] / "oci-gpu-hook")
        python_runs(runc_install)
        argv = ["runc", "run", "--bundle", str(bundle), bundle.name]
        result = cl.run(cl.cgroup2_wrap(argv) if v2 else argv, env=cl.hook_env())
        assert result.returncode == 0, result.stderr
        probe = cl.assert_isolated(result.stdout, [1, 6], cgroup_v2=v2)
        assert probe.links == cl.expected_links([1, 6])
        assert python_runs(runc_install) == 0
    finally:
        running.stop()


@pytest.mark.containers
def test_the_ldcache_hook_through_the_planner(tmp_path: Path) -> None:
    """An NVIDIA GPU by the shim (the fake nvidia-h100 host), the native front handing the rewrite to the planner:
    the planner's worker makes the driver's soname links and ld cache in the writable rootfs before create (no
    ``ldcache`` hook in the spec); where a spec mount would hide them (a tmpfs over /usr/local/cuda, where the CUDA
    compat libraries are read), the ``ldcache`` createRuntime hook, which the front hands to the planner with its
    arguments.  Each container resolves libcuda.so.1 from its cache, and Python never started."""
    from tests.containers.test_nvidia_hosts import make_rootfs, model

    cl.need("runc", "busybox", "unshare")
    nv = model("nvidia-h100")
    install = make_install(tmp_path / "install", runtime="runc",
                           host=f'sysfs_root = "{nv.base / "sys"}"\nproc_root = "{nv.base / "proc"}"\n'
                                f'driver_root = "{nv.base / "driver"}"\n')
    running = start_planner(install)
    try:
        python_runs(install)
        for hooked in (False, True):
            rootfs = make_rootfs(tmp_path / f"rootfs-{hooked}", nv)
            bundle = cl.make_bundle(tmp_path / cl.container_id(), rootfs, ["NVIDIA_VISIBLE_DEVICES=1"])

            def change(spec: dict[str, Any], hooked: bool = hooked) -> None:
                spec["root"].update(readonly=False)
                if hooked:
                    spec["mounts"].append({"destination": "/usr/local/cuda", "type": "tmpfs", "source": "tmpfs"})

            cl.edit_spec(bundle, change)
            argv = [str(install["native"] / "oci-gpu-runtime"), "run", "--bundle", str(bundle), bundle.name]
            result = cl.run(argv, env=cl.hook_env())
            assert result.returncode == 0, result.stderr
            assert "ldcache libcuda.so.1" in result.stdout.splitlines(), result.stdout
            spec = json.loads((bundle / "config.json").read_text())
            assert [h["args"][1] for h in spec.get("hooks", {}).get("createRuntime", [])] == (
                ["ldcache"] if hooked else []), spec.get("hooks")
        assert python_runs(install) == 0
    finally:
        running.stop()


@pytest.mark.containers
def test_a_planner_in_another_mount_namespace_sees_what_the_front_sees(runc_install: dict[str, Path],
                                                                       rootfs: Path) -> None:
    """As in a DaemonSet pod: the planner runs where the node's config file and the bundles are hidden (a tmpfs
    over their directory); each request enters the front's mount namespace, so the container still gets GPU 2."""
    base = runc_install["base"]
    hidden = base / "bundles-here"
    hidden.mkdir(exist_ok=True)
    env = {**cl.hook_env(), "OCI_GPU_HOOK_CONFIG": str(runc_install["config"])}
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c",
            f"mount -t tmpfs none {hidden} && mount -t tmpfs none {cl.SEED_SYSFS.parent} && exec \"$0\" \"$@\"",
            str(runc_install["native"] / "oci-gpu-hook"), "serve"]
    running = plannerlib.Planner(Path(), runc_install["socket"], env, 2, argv=argv).start()
    try:
        bundle = cl.make_bundle(hidden / cl.container_id(), rootfs, ["AMD_VISIBLE_DEVICES=2"])
        python_runs(runc_install)
        result = cl.run([str(runc_install["native"] / "oci-gpu-runtime"), "run", "--bundle", str(bundle),
                         bundle.name], env=cl.hook_env())
        assert result.returncode == 0, result.stderr
        cl.assert_isolated(result.stdout, [2])
        assert python_runs(runc_install) == 0
    finally:
        running.stop()


def test_log_lines_say_the_same(install: dict[str, Path], planner: plannerlib.Planner) -> None:
    """The log line of a grant through the planner is the Python launcher's (but for its time and duration)."""
    text = spec_text(["AMD_VISIBLE_DEVICES=4"])
    lines = []
    for kind in ("native", "python"):
        install["log"].unlink(missing_ok=True)
        assert shim(install, kind, bundle_with(install["base"], f"log-{kind}", text)).returncode == 0
        (line,) = install["log"].read_text().splitlines()
        lines.append(re.sub(r'"(time|duration_ms)": ?[^,}]+', "", line))
    assert lines[0] == lines[1]


STDIO_PROBE = "import os, sys; print(sys.stdout.errors, sys.stdout.encoding, os.environ.get('LC_CTYPE', '-'))"
MIRROR = """
import json, os, sys
from oci_gpu_hook.serve import planner
env = json.loads(sys.argv[1])
planner.set_environ([f"{k}={v}".encode() for k, v in env.items()])
try:
    errors, coerced = planner.python_stdio()
except planner.BadRequest:
    print("refused")
else:
    print(errors, "utf-8", coerced or env.get("LC_CTYPE", "-"))
"""


@pytest.mark.parametrize("env", [{}, {"LANG": "C"}, {"LC_ALL": "C"}, {"LC_ALL": "C.UTF-8"}, {"LANG": "POSIX"},
                                 {"LC_ALL": "POSIX"}, {"LANG": "C.UTF-8"}, {"LC_CTYPE": "xx_XX.UTF-8"},
                                 {"LC_CTYPE": "C", "LC_ALL": "C.UTF-8"}, {"LC_ALL": "", "LANG": "C"},
                                 {"LC_CTYPE": "C.utf8"}, {"LANG": "en_US.UTF-8"}], ids=str)
def test_stdio_as_cpython_picks_it(env: dict[str, str]) -> None:
    """python_stdio gives the error handler and the C locale coercion that CPython's own start-up (-I -S) gives
    for the same environment."""
    full = {"PATH": "/usr/bin:/bin", **env}
    real = subprocess.run([sys.executable, "-I", "-S", "-c", STDIO_PROBE], env=full, capture_output=True, text=True,
                          timeout=60)
    mirror = subprocess.run([sys.executable, "-c", MIRROR, json.dumps(full)], capture_output=True, text=True,
                            timeout=60, cwd=cl.REPO, env={"PATH": "/usr/bin:/bin"})
    assert mirror.returncode == 0, mirror.stderr
    if mirror.stdout.strip() != "refused":  # a front whose Python would not write UTF-8 goes to Python
        assert mirror.stdout.split() == real.stdout.split(), (real.stdout, mirror.stdout)
    else:
        assert real.stdout.split()[1] != "utf-8"
