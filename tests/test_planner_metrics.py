"""The planner's Prometheus endpoint (``serve --metrics-address``, oci_gpu_hook/serve/planner/endpoint.py and the
planner's half of oci_gpu_hook/cluster/metrics.py), as an operator runs it: the wheel in a venv of its own, the native
launchers that venv's ``oci-gpu-hook launchers`` writes, ``serve`` through them.  Real starts go through the native
fronts (real runc containers for the granted ones, which the probe checks; refusals of several kinds; starts that
ask for nothing but that the front cannot vouch for; a request the planner hands back), then the endpoint is
scraped over HTTP and parsed with prometheus_client's parser: every count and every histogram count equals what
the test did, and Python never started.  No timing is asserted (the answer times are only counted).  Without
prometheus_client the option is one line."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from oci_gpu_hook.cluster.metrics import ANSWER_BUCKETS, refusal_reason, start_line
from oci_gpu_hook.fastpath import build as fastbuild
from oci_gpu_hook.serve import planner as planner_module
from tests.conftest import need
from tests.helpers import containerlib as cl
from tests.helpers import plannerlib, wheellib
from tests.test_metrics import Samples, devices, scrape
from tests.test_planner import make_install, python_runs

pytestmark = pytest.mark.skipif(fastbuild.find_cc() is None, reason="no C compiler")
prometheus = pytest.importorskip("prometheus_client")  # the suite's; the wheel's venv gets this version

STARTS = "oci_gpu_hook_planner_starts_total"
ANSWER = "oci_gpu_hook_planner_answer_seconds"
LOGS = itertools.count()


@pytest.fixture(scope="module")
def wheel() -> Iterator[tuple[Path, Path]]:
    """(a scratch directory, the venv's ``oci-gpu-hook``): the wheel installed as the README says, without extras."""
    need("runc", "busybox", "unshare")
    base = Path(tempfile.mkdtemp(prefix="ogh-pm-"))  # root's, 0700: the fronts trust what lies below it
    try:
        python = wheellib.make_venv(base / "venv", wheellib.built_wheel())
        yield base, python.parent / "oci-gpu-hook"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def install(wheel: tuple[Path, Path]) -> dict[str, Path]:
    """The wheel's launchers (native and Python) on the seed host, runc as the runtime, a busybox rootfs; the venv
    given prometheus_client (the suite's version) after the test that needs it absent."""
    base, hook = wheel
    made = make_install(base / "install", runtime="runc", hook=hook)
    made["hook"] = hook
    made["rootfs"] = cl.make_rootfs(base / "rootfs")
    return made


def _planner(install: dict[str, Path], *extra: str, socket_path: Path | None = None) -> plannerlib.Planner:
    """``serve`` through the wheel's native launcher, with a log of its own."""
    env = {**cl.hook_env(), "OCI_GPU_HOOK_CONFIG": str(install["config"])}
    argv = [str(install["native"] / "oci-gpu-hook"), "serve", *extra]
    made = plannerlib.Planner(install["native"] / "oci-gpu-hook", socket_path or install["socket"], env, 2, argv=argv)
    made.log = install["base"] / f"planner-{next(LOGS)}.log"
    return made


def _said(running: plannerlib.Planner, pattern: str, timeout: float = 60) -> re.Match[str]:
    """The first match of ``pattern`` in the planner's log, waiting for it (bounded; the planner must live)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, running.log.read_text())
        if found:
            return found
        assert running.process is not None and running.process.poll() is None, running.log.read_text()
        time.sleep(0.05)
    raise AssertionError(f"no {pattern!r} in the planner's log: {running.log.read_text()}")


def test_without_prometheus_client_the_option_is_one_line(install: dict[str, Path]) -> None:
    python = install["hook"].parent / "python"
    assert subprocess.run([str(python), "-c", "import prometheus_client"], capture_output=True,
                          timeout=60).returncode != 0, "prometheus_client came with the wheel's own dependencies"
    running = _planner(install, "--metrics-address", "127.0.0.1:0").start(wait=False)
    assert running.process is not None
    code = running.process.wait(timeout=120)
    running.stop()
    text = running.log.read_text()
    assert code == 1 and text.count("\n") == 1, text
    assert "--metrics-address needs prometheus_client" in text and "Traceback" not in text
    assert not install["socket"].exists()  # it took its socket away again
    bad = _planner(install, "--metrics-address", "nowhere").start(wait=False)
    assert bad.process is not None and bad.process.wait(timeout=120) == 1
    bad.stop()
    lines = bad.log.read_text().splitlines()
    assert len(lines) == 1 and "expected HOST:PORT" in lines[0], lines


# --- the starts -------------------------------------------------------------------------------------------------

def _bundle(install: dict[str, Path], env: list[str], args: list[str] | None = None) -> Path:
    return cl.make_bundle(install["base"] / "bundles" / cl.container_id(), install["rootfs"], env, args)


def _shim(install: dict[str, Path], command: str, bundle: Path,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return cl.run([str(install["native"] / "oci-gpu-runtime"), command, "--bundle", str(bundle), bundle.name],
                  env={**cl.hook_env(), **(env or {})})


def _refused(done: subprocess.CompletedProcess[str], words: str) -> None:
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and words in done.stderr, done.stderr


def test_the_endpoint_counts_every_start_it_answered(install: dict[str, Path]) -> None:
    done = subprocess.run([str(install["hook"].parent / "pip"), "install", "-q", "--disable-pip-version-check",
                           f"prometheus_client=={version('prometheus_client')}"],  # the suite's: no other is fetched
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    running = _planner(install, "--metrics-address", ":0").start()  # :PORT: loopback
    try:
        said = _said(running, r"metrics at (http://\S+/metrics) \(process (\d+)\)")
        url = said.group(1)
        assert url.startswith("http://127.0.0.1:"), url
        _said(running, r"planner: serving ")
        _assert_dropped(int(said.group(2)))  # and it still scans and serves, below
        before = scrape(url)
        assert devices(before) == {("amd", "gpu", "present", "Healthy"): 8}
        assert not [k for k in before if k[0].startswith(("oci_gpu_hook_planner_starts", ANSWER))]
        python_runs(install)
        did: dict[tuple[str, str, str], int] = {}

        def count(path: str, outcome: str, reason: str = "") -> None:
            did[(path, outcome, reason)] = did.get((path, outcome, reason), 0) + 1

        # granted: a real container through the shim (exactly GPU 5), and one through the prestart hook (GPU 1)
        done = _shim(install, "run", _bundle(install, ["AMD_VISIBLE_DEVICES=5"]))
        assert done.returncode == 0, done.stderr
        cl.assert_isolated(done.stdout, [5])
        count("shim", "granted")
        bundle = _bundle(install, ["AMD_VISIBLE_DEVICES=1"])
        cl.add_prestart(bundle, install["native"] / "oci-gpu-hook")
        done = cl.run(["runc", "run", "--bundle", str(bundle), bundle.name], env=cl.hook_env())
        assert done.returncode == 0, done.stderr
        cl.assert_isolated(done.stdout, [1])
        count("prestart", "granted")
        # asking for nothing, in a spec the front cannot vouch for (an escape in it): the planner answers, untouched
        plain = _bundle(install, ["GREETING=gr\u00fc\u00df dich"], ["/bin/true"])
        assert "\\u00fc" in (plain / "config.json").read_text()
        done = _shim(install, "run", plain)
        assert done.returncode == 0, done.stderr
        count("shim", "untouched")
        # the prestart hook of such a container, also untouched (its state names the bundle; no container runs)
        state = json.dumps({"ociVersion": "1.0.2", "id": plain.name, "status": "creating", "pid": 1,
                            "bundle": str(plain)})
        done = cl.run([str(install["native"] / "oci-gpu-hook"), "prestart"], env=cl.hook_env(), stdin=state)
        assert done.returncode == 0, done.stderr
        count("prestart", "untouched")
        # precreate: granted, and ignored (the environment turns env requests off: the front hands it over)
        spec = json.dumps({"ociVersion": "1.0.2", "process": {"env": ["AMD_VISIBLE_DEVICES=2"]},
                           "root": {"path": "rootfs"}})
        done = cl.run([str(install["native"] / "oci-gpu-hook"), "precreate"], env=cl.hook_env(), stdin=spec)
        assert done.returncode == 0 and "renderD130" in done.stdout, done.stderr
        count("precreate", "granted")
        done = cl.run([str(install["native"] / "oci-gpu-hook"), "precreate"], stdin=spec,
                      env={**cl.hook_env(), "OCI_GPU_HOOK_ALLOW_ENV_REQUESTS": "false"})
        assert done.returncode == 0 and "renderD130" not in done.stdout, done.stderr
        count("precreate", "ignored")
        # refused, each for its own reason: the request (no GPU 9), the spec (process.env not a list), the config
        # (a file with an unknown key, named by the environment: the front hands over, Python cannot use it)
        _refused(_shim(install, "create", _bundle(install, ["AMD_VISIBLE_DEVICES=9"])), "out of range")
        count("shim", "refused", "request")
        _refused(_shim(install, "create", _bundle(install, ["AMD_VISIBLE_DEVICES=9"])), "out of range")
        count("shim", "refused", "request")
        broken = _bundle(install, [])
        cl.edit_spec(broken, lambda s: s["process"].__setitem__("env", "AMD_VISIBLE_DEVICES=1"))
        _refused(_shim(install, "create", broken), "process.env is not a list")
        count("shim", "refused", "spec")
        bad_config = install["base"] / "bad-config.toml"
        bad_config.write_text(install["config"].read_text() + "no_such_key = 1\n")
        _refused(_shim(install, "create", _bundle(install, ["AMD_VISIBLE_DEVICES=1"]),
                       {"OCI_GPU_HOOK_CONFIG": str(bad_config)}), "unknown key 'no_such_key'")
        count("shim", "refused", "config")
        _refused(cl.run([str(install["native"] / "oci-gpu-hook"), "precreate"], env=cl.hook_env(),
                        stdin=spec.replace("=2", "=9")), "out of range")
        count("precreate", "refused", "request")
        assert python_runs(install) == 0  # the planner answered every one of them
        # handed back: a front of another version (the planner's client speaks the protocol), and a probe that
        # sends nothing (not a start: not counted)
        data = plannerlib.request_bytes("oci-gpu-hook 0.0.1 planner/2 x", "oci-gpu-hook", "/x", ["precreate"],
                                        ["PATH=/bin"], spec.encode())
        fds = plannerlib.namespace_fds()
        try:
            answer = plannerlib.ask(install["socket"], data, fds)
        finally:
            for fd in fds:
                os.close(fd)
        assert planner_module.decode_answer(answer)[1] == b"refused"
        count("precreate", "handed-back", "version")
        with socket.socket(socket.AF_UNIX) as probe:  # what wait_ready does: a connection that closes at once
            probe.connect(str(install["socket"]))

        after = scrape(url)
        starts = {tuple(dict(labels)[k] for k in ("path", "outcome", "reason")): value
                  for (name, labels), value in after.items() if name == STARTS}
        assert starts == did
        answered: dict[str, int] = {}
        for (path, outcome, _reason), n in did.items():
            if outcome != "handed-back":
                answered[path] = answered.get(path, 0) + n
        assert _answer_counts(after) == answered
        for path in answered:
            buckets = _buckets(after, path)
            assert [le for le, _n in buckets] == [*ANSWER_BUCKETS, float("inf")]
            counts = [n for _le, n in buckets]
            assert counts == sorted(counts) and counts[-1] == answered[path]
        assert devices(after) == {("amd", "gpu", "present", "Healthy"): 8}
    finally:
        code = running.stop()
    assert code == 0, running.log.read_text()
    log = running.log.read_text()
    assert "Traceback" not in log and "add it to PRELOAD" not in log and "metrics endpoint exited" not in log


def _answer_counts(samples: Samples) -> dict[str, int]:
    return {dict(labels)["path"]: int(value) for (name, labels), value in samples.items() if name == ANSWER + "_count"}


def _buckets(samples: Samples, path: str) -> list[tuple[float, float]]:
    return sorted((float(dict(labels)["le"]), value) for (name, labels), value in samples.items()
                  if name == ANSWER + "_bucket" and dict(labels)["path"] == path)


def test_an_endpoint_that_exits_is_started_again_and_a_port_in_use_is_one_line(install: dict[str, Path]) -> None:
    """The endpoint's process killed: the planner says so, keeps answering, and starts it again (its counts from
    0); a port another process holds stops ``serve`` at start with one line."""
    running = _planner(install, "--metrics-address", "127.0.0.1:0").start()
    try:
        first = _said(running, r"metrics at (http://\S+/metrics) \(process (\d+)\)")
        _said(running, r"planner: serving ")
        _assert_dropped(int(first.group(2)))
        os.kill(int(first.group(2)), signal.SIGKILL)
        _said(running, r"the metrics endpoint exited \(wait status 9\); starting it again in 10 s")
        spec = json.dumps({"ociVersion": "1.0.2", "process": {"env": ["AMD_VISIBLE_DEVICES=3"]},
                           "root": {"path": "rootfs"}})
        python_runs(install)
        done = cl.run([str(install["native"] / "oci-gpu-hook"), "precreate"], env=cl.hook_env(), stdin=spec)
        assert done.returncode == 0 and "renderD131" in done.stdout, done.stderr
        assert python_runs(install) == 0  # answered meanwhile (its start line is dropped or waits for the next one)
        again = _said(running, r"metrics at (http://\S+/metrics) \(process (\d+), started again", timeout=60)
        assert again.group(2) != first.group(2)
        _assert_dropped(int(again.group(2)))  # a restarted endpoint drops as the first did
        done = cl.run([str(install["native"] / "oci-gpu-hook"), "precreate"], env=cl.hook_env(), stdin=spec)
        assert done.returncode == 0, done.stderr
        starts = {dict(labels)["outcome"]: value for (name, labels), value in scrape(again.group(1)).items()
                  if name == STARTS}
        assert starts.get("granted", 0) >= 1 and set(starts) == {"granted"}
        held = socket.socket()
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        try:
            port = held.getsockname()[1]
            taken = _planner(install, "--metrics-address", f"127.0.0.1:{port}",
                             socket_path=install["base"] / "second" / "planner.sock").start(wait=False)
            assert taken.process is not None and taken.process.wait(timeout=120) == 1
            taken.stop()
            lines = taken.log.read_text().splitlines()
            assert len(lines) == 1 and f"--metrics-address 127.0.0.1:{port}: cannot listen there: " in lines[0], lines
        finally:
            held.close()
    finally:
        code = running.stop()
    assert code == 0, running.log.read_text()
    assert "Traceback" not in running.log.read_text()


# --- the pieces: what a worker says, how a refusal is named ----------------------------------------------------

def test_a_refusal_is_named_by_where_it_was_raised(tmp_path: Path) -> None:
    from oci_gpu_hook.config import Config, load_config
    from oci_gpu_hook.errors import HookError
    from oci_gpu_hook.oci_spec import ContainerSpec
    from oci_gpu_hook.plan import plan_for_spec

    def caught(call: object) -> BaseException:
        try:
            call()  # type: ignore[operator]
        except BaseException as err:
            return err
        raise AssertionError("no error")

    spec = ContainerSpec.parse(json.dumps({"process": {"env": ["AMD_VISIBLE_DEVICES=9"]}, "root": {"path": "r"}}))
    assert refusal_reason(caught(lambda: plan_for_spec(spec, Config(sysfs_root=str(cl.SEED_SYSFS))))) == "request"
    assert refusal_reason(caught(lambda: ContainerSpec.parse("[]"))) == "spec"
    bad = tmp_path / "config.toml"
    bad.write_text("no_such_key = 1\n")
    assert refusal_reason(caught(lambda: load_config({"OCI_GPU_HOOK_CONFIG": str(bad)}))) == "config"
    assert refusal_reason(caught(lambda: {}["x"])) == "internal"
    assert refusal_reason(HookError("never raised")) == "other"
    assert refusal_reason(None) == "other"


def test_start_lines_outside_the_closed_sets_are_not_counted() -> None:
    from oci_gpu_hook import LIVE_COMMANDS, PRECREATE
    from oci_gpu_hook.cluster.metrics import PATHS, StartCounts

    assert {"shim", PRECREATE, *LIVE_COMMANDS} <= set(PATHS)  # every path a worker names (worker.request_path)
    counts = StartCounts()
    assert counts.add(start_line("shim", "granted", "", 0.004))
    assert counts.add(start_line("prestart", "refused", "apply", 0.2))
    assert counts.add(start_line("unknown", "handed-back", "malformed", None))
    for bad in (start_line("shim", "granted", "why", 0.1), start_line("shim", "refused", "because I said", 0.1),
                start_line("cdi", "granted", "", 0.1), start_line("shim", "handed-back", "request", None),
                start_line("shim", "granted", "", float("nan")), b"shim granted", b"\xff \xff \xff \xff"):
        assert not counts.add(bad), bad
    assert dict(counts.starts) == {("shim", "granted", ""): 1, ("prestart", "refused", "apply"): 1,
                                   ("unknown", "handed-back", "malformed"): 1}
    assert counts.answers["shim"][ANSWER_BUCKETS.index(0.005)] == 1 and sum(counts.answers["prestart"]) == 1
    assert "unknown" not in counts.answers  # not answered: no answer time


# --- the endpoint's process: what it drops, what it rescans ----------------------------------------------------

STATUS_FIELDS = ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")


def _status(path: str) -> dict[str, str]:
    """The credential fields of a /proc status file, as /proc writes them (whitespace folded)."""
    with open(path, "rb") as handle:  # bytes: a process that dropped its privileges may not load a codec
        text = handle.read().decode()
    parts = (line.partition(":") for line in text.splitlines())
    fields = {key: " ".join(value.split()) for key, _colon, value in parts}
    return {name: fields[name] for name in STATUS_FIELDS}


UNPRIVILEGED_STATUS = {"Uid": "65534 65534 65534 65534", "Gid": "65534 65534 65534 65534", "Groups": "",
                       "CapInh": "0" * 16, "CapPrm": "0" * 16, "CapEff": "0" * 16, "CapBnd": "0" * 16,
                       "CapAmb": "0" * 16, "NoNewPrivs": "1"}


def _assert_dropped(pid: int) -> None:
    """Every thread of the endpoint's process (its HTTP server's included): nobody, no capability in any set, not
    even in the bounding set, no-new-privs."""
    tasks = os.listdir(f"/proc/{pid}/task")
    assert len(tasks) >= 2, tasks  # the main thread and the server's
    for task in tasks:
        assert _status(f"/proc/{pid}/task/{task}/status") == UNPRIVILEGED_STATUS, task


def _in_child(work: object) -> dict[str, object]:
    """``work()`` (a dict) in a forked child, its answer as JSON through a pipe (or the error it raised)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.close(read_end)
            try:
                answer = work()  # type: ignore[operator]
            except Exception as err:
                answer = {"error": f"{type(err).__name__}: {err}"}
            os.write(write_end, json.dumps(answer).encode())
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as handle:
        data = handle.read()
    _pid, status = os.waitpid(pid, 0)
    assert status == 0 and data, status
    return json.loads(data)  # type: ignore[no-any-return]


def _rows(sysfs_root: str) -> list[list[object]]:
    from oci_gpu_hook.config import Config
    from oci_gpu_hook.serve.planner.endpoint import Devices

    return [[r.name, r.vendor, r.type, r.state, r.healthy, r.signal]
            for r in Devices(Config(sysfs_root=sysfs_root)).rows()]


@pytest.mark.root
def test_the_drop_leaves_nothing_of_roots_and_the_scans_read_the_same_unprivileged() -> None:
    """As root: after :func:`drop_privileges` the process is uid and gid 65534 with no capability in any set and
    no-new-privs (each thread it starts after too), and a scan reads what root's reads: the seed host's sysfs and
    this host's /sys."""
    from oci_gpu_hook.serve.planner.endpoint import drop_privileges

    if os.geteuid() != 0:
        pytest.skip("needs root")

    def dropped() -> dict[str, object]:
        import threading

        drop_privileges()
        later: dict[str, str] = {}
        thread = threading.Thread(target=lambda: later.update(_status("/proc/thread-self/status")))
        thread.start()
        thread.join()
        return {"status": _status("/proc/thread-self/status"), "thread": later,
                "seed": _rows(str(cl.SEED_SYSFS)), "sys": _rows("/sys")}

    answer = _in_child(dropped)
    assert answer["status"] == UNPRIVILEGED_STATUS and answer["thread"] == UNPRIVILEGED_STATUS, answer
    seed = answer["seed"]
    assert isinstance(seed, list) and len(seed) == 8 and all(row[3:5] == ["present", True] for row in seed), seed
    assert seed == _rows(str(cl.SEED_SYSFS)) and answer["sys"] == _rows("/sys")


@pytest.mark.root
def test_a_daemon_that_is_not_root_keeps_its_uid_and_a_drop_that_does_not_hold_is_one_line() -> None:
    """Not root (a test's planner): the ids stay, every capability set but the bounding set (which takes a capability
    to change) is emptied, no-new-privs is set.  A uid change the kernel leaves undone (-1: unchanged) is caught by
    the check that reads /proc after the drop: the one line, naming what is still held."""
    from oci_gpu_hook.serve.planner.endpoint import drop_privileges

    if os.geteuid() != 0:
        pytest.skip("needs root")

    def as_user() -> dict[str, object]:
        import ctypes  # noqa: F401 (loaded while root: this interpreter's own files may be root's alone)

        os.setgroups([])
        os.setresgid(1000, 1000, 1000)
        os.setresuid(1000, 1000, 1000)
        drop_privileges()
        return {"status": _status("/proc/thread-self/status")}

    answer = _in_child(as_user)
    status = answer.get("status")
    assert isinstance(status, dict), answer
    assert status["Uid"] == "1000 1000 1000 1000" and status["NoNewPrivs"] == "1", status
    assert {status[name] for name in ("CapInh", "CapPrm", "CapEff", "CapAmb")} == {"0" * 16}, status

    def undone() -> dict[str, object]:
        drop_privileges(uid=-1)
        return {}

    error = _in_child(undone)["error"]
    assert isinstance(error, str) and error.count("\n") == 0, error
    assert error == ("HookError: the metrics endpoint still holds ids other than uid -1 gid 65534 after dropping "
                     "its privileges"), error


def test_a_scans_rows_serve_every_scrape_for_a_second() -> None:
    """A storm of scrapes rescans sysfs once a second at most: the scans counted on a stepped clock."""
    from oci_gpu_hook.config import Config
    from oci_gpu_hook.serve.planner.endpoint import ROWS_FRESH_S, Devices

    now = [100.0]
    made = Devices(Config(sysfs_root=str(cl.SEED_SYSFS)), clock=lambda: now[0])
    first = made.rows()
    assert len(first) == 8 and made.scans == 1
    for _ in range(50):
        assert made.rows() is first
    now[0] += ROWS_FRESH_S - 0.001
    assert made.rows() is first and made.scans == 1
    now[0] += 0.002
    assert made.rows() == first and made.scans == 2
    now[0] -= 10  # a clock that went back: a scan, not rows held forever
    made.rows()
    assert made.scans == 3
    assert ROWS_FRESH_S >= 1.0
