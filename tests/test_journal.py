"""The journal's line (oci_gpu_hook/log.py to_syslog): its format, that it never blocks nor fails a container (a full
socket, none, a file, a directory, a stream socket at the path), ``syslog = false``, the container each entry
point names (precreate: the hostname or an orchestrator's annotation; prestart: the state's id; the shim: argv's),
that operator commands write none, and the native front's own lines (a planner that is there but does not
serve: info; no planner: none).  The real runtimes' refusals: tests/containers/test_journal.py."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oci_gpu_hook import log
from oci_gpu_hook.config import Config
from oci_gpu_hook.entry import cli, runtime
from oci_gpu_hook.fastpath import build as fastbuild
from oci_gpu_hook.install import launchers
from oci_gpu_hook.serve import planner as planner_module
from tests.conftest import need
from tests.helpers import containerlib as cl
from tests.helpers import plannerlib
from tests.helpers.hostiletexts import JOURNAL_CONTAINERS, journal_texts
from tests.helpers.journallib import Listener, with_dev_log

BAD = "AMD_VISIBLE_DEVICES=gpu1"
REASON = "AMD_VISIBLE_DEVICES=gpu1: 'gpu1' is not a GPU index"


@pytest.fixture
def listener(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Listener]:
    got = Listener(tmp_path / "log.sock")
    monkeypatch.setattr(log, "SYSLOG_SOCKET", str(got.path))
    yield got
    got.close()


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_the_line_is_framed_as_glibc_syslog_frames_it(utc: None) -> None:
    at = 1741158489  # 2025-03-05 07:08:09 UTC
    assert log.syslog_line("error", "precreate: error: no", at, 42) == \
        b"<27>Mar  5 07:08:09 oci-gpu-hook[42]: precreate: error: no"
    assert log.syslog_line("info", "x", 1765000000, 7) == b"<30>Dec  6 05:46:40 oci-gpu-hook[7]: x"
    assert log.syslog_line("warning", "x", at, 7).startswith(b"<28>Mar  5 ")


def test_the_line_is_one_line_with_every_byte_that_is_no_text_escaped() -> None:
    line = log.syslog_line("error", "a\nb\tc  d\x1b[31m\x7fe\u00e9\u009b\x00", pid=1)
    assert line.endswith(b": a\\x0ab\\x09c  d\\x1b[31m\\x7fe\xc3\xa9\\xc2\\x9b\\x00")  # nothing folded
    assert log.syslog_text("\udcff \ud800") == b"\\xff \\xed\\xa0\\x80"  # argv's \xff; JSON's lone surrogate
    long = log.syslog_line("error", "\u00e9" * 5000, pid=1)
    text = long.split(b": ", 1)[1]
    assert text.endswith(b"...") and len(text) == log.SYSLOG_MAX + 3
    text[:-3].decode()  # cut on a character boundary
    escapes = log.syslog_text("\x01" * 5000)
    assert escapes == b"\\x01" * (log.SYSLOG_MAX // 4) + b"..."  # never inside an escape
    assert log.syslog_text("a" * log.SYSLOG_MAX) == b"a" * log.SYSLOG_MAX  # cut only past the limit
    assert log.syslog_text("a" * (log.SYSLOG_MAX + 1)) == b"a" * log.SYSLOG_MAX + b"..."


@pytest.fixture(scope="module")
def syslog_probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The C front's journal text alone: front.c compiled with -DOGH_SYSLOG_PROBE and an install's baked header."""
    if fastbuild.find_cc() is None:
        pytest.skip("no C compiler")
    tools = tmp_path_factory.mktemp("syslog-probe")
    header = tools / "baked.h"
    header.write_text(fastbuild.front_header("oci-gpu-hook", str(tools), {}, True))
    probe = tools / "probe"
    subprocess.run(["gcc", "-std=gnu11", "-O2", "-Wall", "-Werror", "-Wno-unused-function",
                    f'-DOGH_BAKED="{header}"', "-DOGH_SYSLOG_PROBE", "-o", str(probe), fastbuild.FRONT_SOURCE],
                   check=True, timeout=300)
    return probe


def _both_journal_texts(probe: Path, triples: list[tuple[bytes, bytes, bytes]]) -> tuple[list[bytes], list[bytes]]:
    """MESSAGE for each (entry, container, text) as the C front writes it and as Python does (its argv decoded as
    Python decodes argv)."""
    out = subprocess.run([probe, *(arg for triple in triples for arg in triple)], capture_output=True, check=True,
                         timeout=120).stdout
    python = [log.syslog_text(log.syslog_message(os.fsdecode(entry), os.fsdecode(text), os.fsdecode(container)))
              for entry, container, text in triples]
    return out.split(b"\n")[:-1], python


def test_the_front_and_python_write_the_same_journal_text(syslog_probe: Path) -> None:
    """One rule, two writers: for every hostile text of the corpus (each byte, line breaks and runs of spaces,
    ill-formed UTF-8 of each kind, texts cut at every kind of piece), in each kind of container name and entry,
    the C front's MESSAGE is Python's byte for byte."""
    triples = [(b"precreate", b"", text) for text in journal_texts(log.SYSLOG_MAX - len("precreate: "))]
    triples += [(b"prestart", container, text) for container in JOURNAL_CONTAINERS
                for text in (b"error: x", b"a\nb", b"\xff" * 10, b"e" * 5000)]
    triples += [(entry, b"c1", b"error: no") for entry in (b"oci-gpu-runtime", b"x\x1by", b"\xe2\x82", b"")]
    front, python = _both_journal_texts(syslog_probe, triples)
    assert len(front) == len(triples)
    for triple, c_text, py_text in zip(triples, front, python, strict=True):
        assert c_text == py_text, triple
    assert b"\n" not in b"".join(python) and all(len(t) <= log.SYSLOG_MAX + 3 for t in python)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.binary(min_size=0, max_size=6000).map(lambda b: b.replace(b"\0", b"")),
       container=st.binary(max_size=200).map(lambda b: b.replace(b"\0", b"")))
def test_the_front_and_python_agree_on_any_bytes(syslog_probe: Path, text: bytes, container: bytes) -> None:
    front, python = _both_journal_texts(syslog_probe, [(b"precreate", container, text)])
    assert front == python


def test_journal_sends_one_datagram(listener: Listener) -> None:
    log.to_syslog(None, "error", "precreate", "oci-gpu-hook: error: no such GPU", "b6326e1d7a5c")
    log.to_syslog(Config(), "info", "oci-gpu-runtime", "handed over")
    first, second = listener.lines()
    assert first.split(b"]: ", 1)[1] == b"precreate: container b6326e1d7a5c: error: no such GPU"
    assert first.startswith(b"<27>") and f"oci-gpu-hook[{os.getpid()}]: ".encode() in first
    assert second.startswith(b"<30>") and second.endswith(b"]: oci-gpu-runtime: handed over")


def test_syslog_false_sends_nothing(listener: Listener, capsys: pytest.CaptureFixture[str]) -> None:
    log.to_syslog(Config(syslog=False), "error", "precreate", "no")
    log.refused(Config(syslog=False), "precreate", "c1", "no")
    log.warn("no", entry="precreate", config=Config(syslog=False))
    assert listener.lines() == []
    log.warn("config file broken:\n passed through", entry="precreate", id="c1")
    (line,) = listener.lines()
    assert line.startswith(b"<28>") and _message(line) == "precreate: container c1: warning: config file broken: " \
        "passed through"
    assert capsys.readouterr().err == ("oci-gpu-hook: warning: no\n"
                                       "oci-gpu-hook: warning: config file broken: passed through\n")


@pytest.mark.parametrize("what", ["missing", "file", "directory", "stream-socket", "fifo"])
def test_nothing_at_the_path_that_takes_a_datagram_is_silently_no_line(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capfd: pytest.CaptureFixture[str],
                                                                       what: str) -> None:
    path = tmp_path / "log"
    keep = None
    if what == "file":
        path.write_text("")
    elif what == "directory":
        path.mkdir()
    elif what == "fifo":
        os.mkfifo(path)
    elif what == "stream-socket":
        keep = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        keep.bind(str(path))
        keep.listen(1)
    monkeypatch.setattr(log, "SYSLOG_SOCKET", str(path))
    log.to_syslog(None, "error", "precreate", "no")
    log.refused(None, "precreate", "c1", "no")
    assert capfd.readouterr() == ("", "")
    if what == "file":
        assert path.read_text() == ""
    if keep is not None:
        keep.close()


def test_a_full_socket_never_blocks(tmp_path: Path) -> None:
    """A journal that reads nothing: the sends fail at once (a hang here would be the subprocess's timeout)."""
    code = f"""
import socket, sys
sys.path.insert(0, {str(cl.REPO)!r})
from oci_gpu_hook import log
path = {str(tmp_path / "full.sock")!r}
reader = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
reader.bind(path)
filler = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
filler.setblocking(False)
sent = 0
try:
    while True:
        filler.sendto(b"x" * 1024, path)
        sent += 1
except BlockingIOError:
    pass
log.SYSLOG_SOCKET = path
for _ in range(3):
    log.to_syslog(None, "error", "precreate", "no")
    log.refused(None, "precreate", "c1", "no")
print(sent)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 0 and done.stderr == ""


# --- what each entry point names ----------------------------------------------------------------------------


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(f'sysfs_root = "{cl.SEED_SYSFS}"\nlog_file = "{tmp_path / "hook.log"}"\nhook_path = "/bin/true"\n')
    monkeypatch.setenv("OCI_GPU_HOOK_CONFIG", str(path))
    return path


def _stdin(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))


def _spec(env: list[str], **extra: object) -> str:
    return json.dumps({"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin", *env]}, "root": {"path": "rootfs"},
                       **extra})


def _message(line: bytes) -> str:
    return line.split(b"]: ", 1)[1].decode()


def _records(config_file: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (config_file.parent / "hook.log").read_text().splitlines()]


@pytest.mark.parametrize(("extra", "name"), [
    ({"hostname": "b6326e1d7a5c"}, "b6326e1d7a5c"),
    ({"hostname": "web", "annotations": {"io.kubernetes.cri-o.ContainerID": "f00d", "io.container.manager": "x"}},
     "f00d"),
    ({"annotations": {"io.kubernetes.container.name": "trainer"}}, "trainer"),
    ({}, None),
])
def test_precreate_names_what_its_input_carries(listener: Listener, config_file: Path,
                                                monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                extra: dict[str, object], name: str | None) -> None:
    _stdin(monkeypatch, _spec([BAD], **extra))
    assert cli.main(["precreate"]) == 1
    err = capsys.readouterr().err
    (line,) = listener.lines()
    where = f"container {name}: " if name else ""
    assert _message(line) == f"precreate: {where}" + err.strip().removeprefix("oci-gpu-hook: ")
    assert _message(line).startswith(f"precreate: {where}error: {REASON}")
    (record,) = _records(config_file)
    assert (record["entry"], record["id"], record["outcome"]) == ("precreate", name, "error")


def test_precreate_that_grants_logs_its_name_and_no_journal_line(listener: Listener, config_file: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _stdin(monkeypatch, _spec(["AMD_VISIBLE_DEVICES=1"], hostname="b6326e1d7a5c"))
    assert cli.main(["precreate"]) == 0
    assert listener.lines() == []
    (record,) = _records(config_file)
    assert (record["id"], record["outcome"]) == ("b6326e1d7a5c", "ok")


def test_prestart_names_the_state_id(listener: Listener, config_file: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(_spec([BAD]))
    _stdin(monkeypatch, json.dumps({"ociVersion": "1.0.2", "id": "ctr-7", "status": "created", "pid": os.getpid(),
                                    "bundle": str(bundle)}))
    assert cli.main(["prestart"]) == 1
    (line,) = listener.lines()
    assert _message(line).startswith(f"prestart: container ctr-7: error: {REASON}")
    assert _records(config_file)[0]["id"] == "ctr-7"


def test_the_shim_names_the_id_of_its_argv(listener: Listener, config_file: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(_spec([BAD]))
    assert runtime.prepare(["--root", "/run/x", "create", "--bundle", str(bundle), "ctr-9"]) == (1, None)
    (line,) = listener.lines()
    assert _message(line).startswith(f"oci-gpu-runtime: container ctr-9: error: {REASON}")
    assert _records(config_file)[0]["id"] == "ctr-9"


@pytest.mark.parametrize(("env", "code", "level"), [([BAD], 1, "<27>"), ([], 0, "<28>")], ids=["refused", "passed"])
def test_a_config_that_cannot_be_used_still_reaches_the_journal(listener: Listener, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch, env: list[str],
                                                                code: int, level: str) -> None:
    """The container that asks for a GPU is refused with the config's error, the one that asks for nothing passes
    with a warning (oci_gpu_hook.config's rule): both lines name it, whatever the unread file says of syslog."""
    broken = tmp_path / "broken.toml"
    broken.write_text("syslog = false\nmask_other_gpu = true\n")  # unread: the default (on) holds
    monkeypatch.setenv("OCI_GPU_HOOK_CONFIG", str(broken))
    _stdin(monkeypatch, _spec(env, hostname="h1"))
    assert cli.main(["precreate"]) == code
    (line,) = listener.lines()
    word = "error" if code else "warning"
    assert line.startswith(level.encode()) and _message(line).startswith(f"precreate: container h1: {word}: ")
    assert "unknown key 'mask_other_gpu'" in _message(line)


def test_operator_commands_write_no_journal_line(listener: Listener, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--sysfs-root", "/nonexistent-ogh", "list"]) == 1
    assert "is not a directory" in capsys.readouterr().err
    assert listener.lines() == []


def test_the_runtime_that_cannot_be_run_is_a_journal_line(listener: Listener, config_file: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "prepare", lambda args, baked=None: (0, "/nonexistent-ogh/runc"))
    assert runtime.main(["state", "ctr-3"]) == 1
    (line,) = listener.lines()
    assert _message(line) == ("oci-gpu-runtime: container ctr-3: error: cannot run /nonexistent-ogh/runc: "
                              "No such file or directory")


# --- the native front's own lines ---------------------------------------------------------------------------


@pytest.fixture
def front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Path]]:
    """A native shim baked with the test's syslog socket, asking a planner at ``run/planner.sock``."""
    if fastbuild.find_cc() is None:
        pytest.skip("no C compiler")
    need()  # the planner's directory must be root's
    got = Listener(tmp_path / "log.sock")
    monkeypatch.setattr(log, "SYSLOG_SOCKET", str(got.path))
    yield {**_native(tmp_path, ["AMD_VISIBLE_DEVICES=1"]), "listener": got}  # type: ignore[dict-item]
    got.close()


def _native(base: Path, env: list[str]) -> dict[str, Path]:
    """Native launchers in ``base/bin`` (a config of the seed host; the planner at ``base/run/planner.sock``) and
    a bundle whose container has ``env``."""
    config = base / "config.toml"
    config.write_text(f'sysfs_root = "{cl.SEED_SYSFS}"\nruntime = "/bin/true"\nhook_path = "/bin/true"\n')
    socket_path = base / "run" / "planner.sock"
    launchers.write_launchers(str(base / "bin"), {"OCI_GPU_HOOK_CONFIG": str(config),
                                                  "OCI_GPU_HOOK_PLANNER_SOCKET": str(socket_path)}, native=True)
    bundle = base / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(_spec(env))
    return {"shim": base / "bin" / "oci-gpu-runtime", "hook": base / "bin" / "oci-gpu-hook", "socket": socket_path,
            "bundle": bundle, "config": config}


def _create(front: dict[str, Path]) -> list[bytes]:
    done = subprocess.run([str(front["shim"]), "create", "--bundle", str(front["bundle"]), "c1"],
                          capture_output=True, env=cl.hook_env(), timeout=120)
    assert (done.returncode, done.stderr) == (0, b"")
    return front["listener"].lines()  # type: ignore[attr-defined, no-any-return]


def test_the_front_says_when_a_planner_is_there_but_does_not_serve(front: dict[str, Path]) -> None:
    assert _create(front) == []  # no planner directory: no planner runs here, the usual case
    front["socket"].parent.mkdir(mode=0o700)
    assert _create(front) == []  # its directory, no socket: stopped
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(front["socket"]))
    stale.close()  # a killed planner's socket: nobody listens
    (line,) = _create(front)
    assert line.startswith(b"<30>") and _message(line) == (
        f"oci-gpu-runtime: container c1: the planner at {front['socket']} cannot be reached (Connection refused); "
        "handing over to Python")
    front["socket"].unlink()
    silent = socket.socket(socket.AF_UNIX)
    silent.bind(str(front["socket"]))
    silent.listen(8)  # accepts, never answers
    try:
        (line,) = _create(front)
    finally:
        silent.close()
    assert _message(line) == (f"oci-gpu-runtime: container c1: the planner at {front['socket']} did not answer in "
                              "time; handing over to Python")
    front["socket"].unlink()


def test_the_front_says_when_the_planner_hands_the_request_back(front: dict[str, Path]) -> None:
    """A planner that reads the request and answers "refused" (as one of another version does)."""
    front["socket"].parent.mkdir(mode=0o700)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(front["socket"]))
    server.listen(1)
    server.settimeout(60)  # a front that never asks fails the test, not hangs it

    def answer() -> None:
        conn, _addr = server.accept()
        with conn:
            request = planner_module.read_request(conn, time.monotonic() + 30)
            for fd in request.fds:
                os.close(fd)
            conn.sendall(planner_module.encode_answer(request.version, "refused"))

    thread = threading.Thread(target=answer)
    thread.start()
    try:
        (line,) = _create(front)
    finally:
        thread.join()
        server.close()
    assert _message(line) == (f"oci-gpu-runtime: container c1: the planner at {front['socket']} handed the request "
                              "back (a "
                              "planner of another version, or a request it does not serve: see its log); "
                              "handing over to Python")


def test_a_refusal_the_planner_serves_is_one_line_from_the_front_s_dev_log(tmp_path: Path) -> None:
    """The planner's worker runs the shim's code in the front's mount namespace: the line goes to the front's
    /dev/log (here the test's socket, in a namespace of its own), once, and the front falls back to nothing."""
    if fastbuild.find_cc() is None:
        pytest.skip("no C compiler")
    need("unshare")
    made = _native(tmp_path, [BAD])
    launcher, env = made["hook"], {**cl.hook_env(), "OCI_GPU_HOOK_CONFIG": str(made["config"])}
    running = plannerlib.Planner(launcher, made["socket"], env, 2, argv=[str(launcher), "serve", "--verbose"]).start()
    got = Listener(tmp_path / "log.sock")
    try:
        (tmp_path / "dev").mkdir()
        done = subprocess.run(with_dev_log([str(made["shim"]), "create", "--bundle", str(made["bundle"]), "c1"],
                                           got.path, tmp_path / "dev"),
                              capture_output=True, text=True, env=cl.hook_env(), timeout=120)
        lines = got.lines()
    finally:
        got.close()
        assert running.stop() == 0
    assert done.returncode == 1 and done.stderr.startswith("oci-gpu-hook: error: " + REASON), done.stderr
    (line,) = lines
    assert _message(line) == "oci-gpu-runtime: container c1: " + done.stderr.strip().removeprefix("oci-gpu-hook: ")
    assert "ok 1" in running.log.read_text()  # the planner served it (exit status 1), no Python start


def test_the_front_says_when_its_config_changed_since_it_was_built(front: dict[str, Path]) -> None:
    """After an edit of the config file, until the launchers are written again, every container starts Python:
    one info line each time (none before the edit: the GPU container goes to Python, as usual)."""
    assert _create(front) == []
    front["config"].write_text(front["config"].read_text() + "mask_other_gpus = false\n")
    (line,) = _create(front)
    assert line.startswith(b"<30>") and _message(line) == (
        "oci-gpu-runtime: container c1: the config file changed since this launcher was built: every create, run and "
        "hook starts Python until `oci-gpu-hook launchers` (or install) is run again; handing over to Python")
    # the hook on the bundle the shim rewrote (its GPU is in the spec: nothing left to do live); a pid no process has
    gone = 4194303
    state = json.dumps({"ociVersion": "1.0.2", "id": "web-7", "pid": gone, "bundle": str(front["bundle"])})
    done = subprocess.run([str(front["hook"]), "prestart"], input=state.encode(), capture_output=True,
                          env=cl.hook_env(), timeout=120)
    (line,) = front["listener"].lines()  # type: ignore[attr-defined]  (Python's refusal: the real /dev/log)
    assert (done.returncode, done.stderr) == (0, b"")
    assert _message(line).startswith("prestart: container web-7: the config file changed since"), line


def test_a_full_journal_never_holds_the_front(front: dict[str, Path]) -> None:
    """The front's line to a socket whose queue is full is dropped at once (a hang: the run's timeout)."""
    filler = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    filler.setblocking(False)
    try:
        while True:
            filler.sendto(b"x" * 1024, str(front["listener"].path))  # type: ignore[attr-defined]
    except BlockingIOError:
        pass
    finally:
        filler.close()
    front["config"].write_text(front["config"].read_text() + "mask_other_gpus = false\n")  # a line to send
    lines = _create(front)
    assert lines and all(line == b"x" * 1024 for line in lines)  # only the filler's: the front's was dropped
