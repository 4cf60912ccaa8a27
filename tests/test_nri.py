"""The NRI plugin's parts: its generated messages and their wire names, the framing (NRI's multiplexer, ttrpc's
messages), the calls and answers on a socket pair, the plan as an adjustment, its identity and configuration.
The plugin against a runtime double with real runc containers: tests/containers/test_nri.py."""

from __future__ import annotations

import importlib.util
import os
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oci_gpu_hook.config import Config
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.serve.nri import adjust, api_pb2, plugin, ttrpc, ttrpc_pb2
from tests.helpers import nriruntime as nr
from tests.helpers.containerlib import SEED_SYSFS

PACKAGE = Path(__file__).resolve().parent.parent / "oci_gpu_hook" / "serve" / "nri"
REPO = PACKAGE.parent.parent.parent
HEADER_LINES = 3
STRING, MESSAGE, BOOL, INT64, INT32, UINT32, BYTES, ENUM = 9, 11, 8, 3, 5, 13, 12, 14


# --- the messages -------------------------------------------------------------------------------------------

@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools is not installed")
@pytest.mark.parametrize("name", ["api", "ttrpc"])
def test_generated_code_is_what_grpcio_tools_makes_of_the_proto(tmp_path: Path, name: str) -> None:
    """Regenerate from the .proto and compare with the committed module (below its 3-line header)."""
    done = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", str(REPO), f"--python_out={tmp_path}",
                           str(PACKAGE / f"{name}.proto")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    committed = (PACKAGE / f"{name}_pb2.py").read_text().splitlines(keepends=True)
    assert committed[0].startswith(f"# oci-gpu-hook: generated from {name}.proto by grpcio-tools")
    fresh = (tmp_path / "oci_gpu_hook" / "serve" / "nri" / f"{name}_pb2.py").read_text()
    assert "".join(committed[HEADER_LINES:]) == fresh, (
        f"{name}_pb2.py is not what grpcio-tools generates from {name}.proto: regenerate it (see its header)")


def _fields(module: Any, message: str) -> dict[str, tuple[int, int]]:
    return {f.name: (f.number, f.type) for f in module.DESCRIPTOR.message_types_by_name[message].fields}


def test_wire_names_are_nris() -> None:
    """The names ttrpc puts in each request and the field numbers and types of what the plugin reads and writes,
    as containerd/nri's pkg/api/api.proto has them (commit 8ec8b285eae3, the v0.12 line)."""
    services = api_pb2.DESCRIPTOR.services_by_name
    assert services["Runtime"].full_name == plugin.RUNTIME_SERVICE
    assert services["Plugin"].full_name == plugin.PLUGIN_SERVICE
    assert [m.name for m in services["Plugin"].methods] == ["Configure", "Synchronize", "Shutdown",
                                                            "CreateContainer"]
    assert api_pb2.CREATE_CONTAINER == 4 and api_pb2.VALIDATE_CONTAINER_ADJUSTMENT == 14 and api_pb2.LAST == 15
    assert _fields(api_pb2, "RegisterPluginRequest") == {"plugin_name": (1, STRING), "plugin_idx": (2, STRING),
                                                         "NRI_version": (3, STRING)}
    assert _fields(api_pb2, "ConfigureRequest") == {
        "config": (1, STRING), "runtime_name": (2, STRING), "runtime_version": (3, STRING),
        "registration_timeout": (4, INT64), "request_timeout": (5, INT64), "NRI_version": (6, STRING)}
    assert _fields(api_pb2, "ConfigureResponse") == {"events": (2, INT32)}
    assert _fields(api_pb2, "SynchronizeRequest") == {"pods": (1, MESSAGE), "containers": (2, MESSAGE),
                                                      "more": (3, BOOL)}
    assert _fields(api_pb2, "SynchronizeResponse") == {"update": (1, MESSAGE), "more": (2, BOOL)}
    assert _fields(api_pb2, "CreateContainerRequest") == {"pod": (1, MESSAGE), "container": (2, MESSAGE)}
    assert _fields(api_pb2, "CreateContainerResponse") == {"adjust": (1, MESSAGE), "update": (2, MESSAGE),
                                                           "evict": (3, MESSAGE)}
    assert _fields(api_pb2, "Container") == {
        "id": (1, STRING), "pod_sandbox_id": (2, STRING), "name": (3, STRING), "labels": (5, MESSAGE),
        "annotations": (6, MESSAGE), "args": (7, STRING), "env": (8, STRING), "mounts": (9, MESSAGE),
        "hooks": (10, MESSAGE), "linux": (11, MESSAGE)}
    assert _fields(api_pb2, "LinuxContainer") == {"devices": (2, MESSAGE), "resources": (3, MESSAGE)}
    assert _fields(api_pb2, "LinuxDevice") == {
        "path": (1, STRING), "type": (2, STRING), "major": (3, INT64), "minor": (4, INT64),
        "file_mode": (5, MESSAGE), "uid": (6, MESSAGE), "gid": (7, MESSAGE)}
    assert _fields(api_pb2, "LinuxDeviceCgroup") == {"allow": (1, BOOL), "type": (2, STRING), "major": (3, MESSAGE),
                                                     "minor": (4, MESSAGE), "access": (5, STRING)}
    assert _fields(api_pb2, "LinuxResources") == {"devices": (7, MESSAGE)}
    assert _fields(api_pb2, "ContainerAdjustment") == {"annotations": (2, MESSAGE), "mounts": (3, MESSAGE),
                                                       "env": (4, MESSAGE), "hooks": (5, MESSAGE),
                                                       "linux": (6, MESSAGE)}
    assert _fields(api_pb2, "LinuxContainerAdjustment") == {"devices": (1, MESSAGE), "resources": (2, MESSAGE)}
    assert _fields(api_pb2, "Mount") == {"destination": (1, STRING), "type": (2, STRING), "source": (3, STRING),
                                         "options": (4, STRING)}
    assert _fields(api_pb2, "Hooks") == {"prestart": (1, MESSAGE), "create_runtime": (2, MESSAGE),
                                         "create_container": (3, MESSAGE), "start_container": (4, MESSAGE),
                                         "poststart": (5, MESSAGE), "poststop": (6, MESSAGE)}
    assert _fields(api_pb2, "Hook") == {"path": (1, STRING), "args": (2, STRING), "env": (3, STRING),
                                        "timeout": (4, MESSAGE)}
    assert _fields(api_pb2, "KeyValue") == {"key": (1, STRING), "value": (2, STRING)}
    assert _fields(api_pb2, "OptionalFileMode") == {"value": (1, UINT32)}
    assert _fields(api_pb2, "OptionalUInt32") == {"value": (1, UINT32)}
    assert _fields(api_pb2, "OptionalInt64") == {"value": (1, INT64)}
    assert _fields(api_pb2, "OptionalInt") == {"value": (1, INT64)}
    assert _fields(ttrpc_pb2, "Request") == {"service": (1, STRING), "method": (2, STRING), "payload": (3, BYTES),
                                             "timeout_nano": (4, INT64), "metadata": (5, MESSAGE)}
    assert _fields(ttrpc_pb2, "Response") == {"status": (1, MESSAGE), "payload": (2, BYTES)}
    assert _fields(ttrpc_pb2, "Status") == {"code": (1, INT32), "message": (2, STRING), "details": (3, BYTES)}


def test_unknown_fields_from_a_newer_runtime_are_skipped() -> None:
    """A runtime sends the whole Container (state, pid, rlimits, CDI devices, user...): the fields this API
    leaves out are skipped, the ones it reads are read."""
    known = api_pb2.Container(id="c", env=["A=1"]).SerializeToString()
    state = bytes([4 << 3 | 0, 3])  # field 4 (state, an enum): CONTAINER_RUNNING
    pid = bytes([12 << 3 | 0, 0x2A])  # field 12 (pid, uint32)
    user = bytes([(21 << 3 | 2) & 0x7F | 0x80, (21 << 3 | 2) >> 7, 2, 8, 7])  # field 21 (user: uid 7), a 2-byte tag
    container = api_pb2.Container.FromString(state + known + pid + user)
    assert (container.id, list(container.env)) == ("c", ["A=1"])


# --- the framing --------------------------------------------------------------------------------------------

def test_one_message_on_the_wire() -> None:
    """Multiplexer frame (connection, length) around ttrpc's header (length, stream, type, flags) and payload."""
    wire = ttrpc.encode(1, 3, ttrpc.REQUEST, ttrpc.FLAG_REMOTE_CLOSED, b"abc")
    assert wire == bytes.fromhex("00000001" "0000000d" "00000003" "00000003" "01" "01") + b"abc"
    assert ttrpc.encode(2, 1, ttrpc.RESPONSE, 0, b"") == bytes.fromhex("00000002" "0000000a" "00000000" "00000001"
                                                                       "0200")


def test_the_largest_message_is_one_frame_and_a_larger_one_refused() -> None:
    wire = ttrpc.encode(1, 1, ttrpc.REQUEST, 0, bytes(ttrpc.MAX_MESSAGE))
    assert struct.unpack(">II", wire[:8]) == (1, ttrpc.MAX_MUX_PAYLOAD) and len(wire) == 8 + ttrpc.MAX_MUX_PAYLOAD
    with pytest.raises(ttrpc.ProtocolError, match="over ttrpc's limit"):
        ttrpc.encode(1, 1, ttrpc.REQUEST, 0, bytes(ttrpc.MAX_MESSAGE + 1))


def _frame(conn: int, data: bytes) -> bytes:
    return struct.pack(">II", conn, len(data)) + data


def _message(stream: int, type_: int, payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">IIBB", len(payload), stream, type_, flags) + payload


def test_demux_reassembles_any_cut() -> None:
    """Messages of both connections, the ttrpc message of one cut across two frames, fed one byte at a time or
    all at once: the same messages in the same order; frames of connection 0 or of one nobody opened dropped."""
    first = _message(1, ttrpc.REQUEST, b"configure", 1)
    wire = (_frame(1, first[:7]) + _frame(0, b"reserved") + _frame(2, _message(1, ttrpc.RESPONSE, b"ok"))
            + _frame(7, b"nobody") + _frame(1, first[7:]) + _frame(1, _message(3, ttrpc.REQUEST, b"") * 2))
    whole = ttrpc.Demux().feed(wire)
    demux = ttrpc.Demux()
    bytewise = [m for i in range(len(wire)) for m in demux.feed(wire[i:i + 1])]
    assert demux.idle
    for got in (whole, bytewise):
        assert [(m.conn, m.stream, m.type, m.flags, m.payload) for m in got] == [
            (2, 1, ttrpc.RESPONSE, 0, b"ok"), (1, 1, ttrpc.REQUEST, 1, b"configure"),
            (1, 3, ttrpc.REQUEST, 0, b""), (1, 3, ttrpc.REQUEST, 0, b"")]


def test_demux_refuses_what_breaks_the_limits() -> None:
    with pytest.raises(ttrpc.ProtocolError, match="multiplexer frame"):
        ttrpc.Demux().feed(struct.pack(">II", 1, ttrpc.MAX_MUX_PAYLOAD + 1))
    with pytest.raises(ttrpc.ProtocolError, match="over ttrpc's limit"):
        ttrpc.Demux().feed(_frame(1, struct.pack(">IIBB", ttrpc.MAX_MESSAGE + 1, 1, 1, 0)))
    with pytest.raises(ttrpc.ProtocolError, match="unknown type 9"):
        ttrpc.Demux().feed(_frame(1, _message(1, 9, b"")))
    half = ttrpc.Demux()
    half.feed(_frame(1, _message(1, 1, b"abcdef")[:12]))
    assert not half.idle


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_a_call_keeps_requests_that_come_before_its_answer(pair: tuple[socket.socket, socket.socket]) -> None:
    """NRI's runtime may call Configure before it answers RegisterPlugin: the call's answer is taken, the
    request kept for the serve loop, in order."""
    mine, theirs = pair
    channel = ttrpc.Channel(mine)
    reply = ttrpc_pb2.Response(payload=api_pb2.Empty().SerializeToString())
    theirs.sendall(_frame(1, _message(1, ttrpc.REQUEST, b"early", 1)) + _frame(2, _message(1, ttrpc.RESPONSE,
                                                                                           reply.SerializeToString())))
    answer = channel.call(plugin.RUNTIME_SERVICE, "RegisterPlugin", api_pb2.RegisterPluginRequest(plugin_name="x"),
                          api_pb2.Empty, timeout=10)
    assert isinstance(answer, api_pb2.Empty)
    early = channel.receive(timeout=10)
    assert early is not None and (early.conn, early.payload) == (1, b"early")
    sent = ttrpc.Demux().feed(theirs.recv(65536))
    assert [(m.conn, m.stream, m.type, m.flags) for m in sent] == [(2, 1, ttrpc.REQUEST, 1)]
    envelope = ttrpc_pb2.Request.FromString(sent[0].payload)
    assert (envelope.service, envelope.method) == (plugin.RUNTIME_SERVICE, "RegisterPlugin")
    assert api_pb2.RegisterPluginRequest.FromString(envelope.payload).plugin_name == "x"
    assert envelope.timeout_nano == 10 * 10**9


def test_a_call_answered_with_an_error(pair: tuple[socket.socket, socket.socket]) -> None:
    mine, theirs = pair
    refused = ttrpc_pb2.Response()
    refused.status.code, refused.status.message = 3, "invalid plugin index"
    theirs.sendall(_frame(2, _message(1, ttrpc.RESPONSE, refused.SerializeToString())))
    with pytest.raises(ttrpc.RemoteError, match="invalid plugin index") as err:
        ttrpc.Channel(mine).call(plugin.RUNTIME_SERVICE, "RegisterPlugin", api_pb2.RegisterPluginRequest(),
                                 api_pb2.Empty, timeout=10)
    assert err.value.code == 3


def test_silence_and_closes(pair: tuple[socket.socket, socket.socket]) -> None:
    mine, theirs = pair
    channel = ttrpc.Channel(mine)
    with pytest.raises(ttrpc.ProtocolError, match=r"no answer from the peer within 0\.05 s"):
        channel.call(plugin.RUNTIME_SERVICE, "RegisterPlugin", api_pb2.RegisterPluginRequest(), api_pb2.Empty,
                     timeout=0.05)
    theirs.sendall(_frame(1, _message(1, ttrpc.REQUEST, b"cut short")[:9]))
    theirs.shutdown(socket.SHUT_WR)
    with pytest.raises(ttrpc.ProtocolError, match="in the middle of a message"):
        channel.receive(timeout=10)


def test_a_send_to_a_closed_peer(pair: tuple[socket.socket, socket.socket]) -> None:
    mine, theirs = pair
    theirs.close()
    with pytest.raises(ttrpc.ProtocolError, match="the connection failed"):
        ttrpc.Channel(mine).send(1, 1, ttrpc.RESPONSE, 0, b"late")


def test_a_close_between_messages_is_the_end(pair: tuple[socket.socket, socket.socket]) -> None:
    mine, theirs = pair
    theirs.shutdown(socket.SHUT_WR)
    assert ttrpc.Channel(mine).receive(timeout=10) is None


# --- the plugin's answers -----------------------------------------------------------------------------------

def _config(tmp_path: Path, **values: Any) -> Config:
    return Config(**{"sysfs_root": str(SEED_SYSFS), "by_path_dir": str(tmp_path / "by-path"),
                     "hook_path": "/usr/local/bin/oci-gpu-hook", **values})


@pytest.fixture
def served(tmp_path: Path, pair: tuple[socket.socket, socket.socket]) -> Iterator[tuple[nr.Peer, list[str]]]:
    """The plugin serving one end of a socket pair in a thread, the double's peer on the other, registered."""
    mine, theirs = pair
    lines: list[str] = []
    it = plugin.Plugin(ttrpc.Channel(mine), _config(tmp_path), "gpu", "42", lines.append)
    result: list[int] = []

    def serve() -> None:
        it.register()
        result.append(it.serve())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    peer = nr.Peer(theirs)
    peer.handshake(runtime_name="double", runtime_version="9.9", request_timeout_ms=1500)
    yield peer, lines
    peer.shutdown()
    thread.join(timeout=30)
    assert result == [0]


def test_registration_and_configuration(served: tuple[nr.Peer, list[str]]) -> None:
    peer, lines = served
    assert (peer.name, peer.idx) == ("gpu", "42")
    assert peer.events == 1 << 3  # CREATE_CONTAINER only
    assert lines == ["registered as 42-gpu with double 9.9 (NRI v0.12.0, request timeout 1.5 s)"]


def test_what_the_plugin_does_not_serve(served: tuple[nr.Peer, list[str]]) -> None:
    peer, _ = served
    with pytest.raises(nr.PluginError) as err:
        peer.call("StopContainer", api_pb2.Empty(), api_pb2.Empty)
    assert err.value.code == ttrpc.UNIMPLEMENTED
    more = peer.call("Synchronize", api_pb2.SynchronizeRequest(more=True), api_pb2.SynchronizeResponse)
    assert more.more and not more.update


def test_nothing_asked_nothing_adjusted(served: tuple[nr.Peer, list[str]]) -> None:
    peer, lines = served
    for env in ([], ["AMD_VISIBLE_DEVICES="], ["AMD_VISIBLE_DEVICES=void", "NVIDIA_VISIBLE_DEVICES=none"]):
        reply = peer.create_container(api_pb2.PodSandbox(), api_pb2.Container(id="c", env=env))
        assert not reply.HasField("adjust") and not reply.update and not reply.evict
    assert len(lines) == 1


def test_an_internal_error_fails_the_container_not_the_plugin(served: tuple[nr.Peer, list[str]],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    peer, _ = served

    def broken(container: Any, config: Any) -> Any:
        raise ValueError("a bug\nwith two lines")

    monkeypatch.setattr(adjust, "create_container", broken)
    with pytest.raises(nr.PluginError) as err:
        peer.create_container(api_pb2.PodSandbox(), api_pb2.Container(id="c", env=["AMD_VISIBLE_DEVICES=1"]))
    assert err.value.code == ttrpc.INTERNAL
    assert err.value.message == "oci-gpu-hook: internal error: ValueError: a bug"
    monkeypatch.undo()
    reply = peer.create_container(api_pb2.PodSandbox(), api_pb2.Container(id="c", env=["AMD_VISIBLE_DEVICES=1"]))
    assert [d.path for d in reply.adjust.linux.devices] == ["/dev/dri/card2", "/dev/dri/renderD129", "/dev/kfd"]


def test_a_create_container_past_half_the_request_timeout_is_said(served: tuple[nr.Peer, list[str]],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime's request timeout (Configure: 1.5 s here) honoured in the log: a CreateContainer that took more
    than half of it is one line, one past it says the runtime gave up; a quick one says nothing.  The plugin's
    clock is stepped by the work itself, no sleep."""
    peer, lines = served
    now = [1000.0]
    took = [0.0]
    real = adjust.create_container

    class Clock:
        @staticmethod
        def monotonic() -> float:
            return now[0]

    def slow(container: Any, config: Any) -> Any:
        now[0] += took[0]
        return real(container, config)

    monkeypatch.setattr(plugin, "time", Clock)
    monkeypatch.setattr(adjust, "create_container", slow)
    pod = api_pb2.PodSandbox(name="p", namespace="ns")
    for seconds in (0.75, 0.2):  # half, and below it: nothing said
        took[0] = seconds
        peer.create_container(pod, api_pb2.Container(id="c", name="quick", env=["AMD_VISIBLE_DEVICES=1"]))
    assert not [line for line in lines if "CreateContainer took" in line], lines
    took[0] = 0.9
    peer.create_container(pod, api_pb2.Container(id="c", name="slow", env=["AMD_VISIBLE_DEVICES=1"]))
    took[0] = 1.6
    with pytest.raises(nr.PluginError):  # refused late: said all the same
        peer.create_container(pod, api_pb2.Container(id="c", name="late", env=["AMD_VISIBLE_DEVICES=9"]))
    said = [line for line in lines if "CreateContainer took" in line]
    assert said == ["ns/p/slow: CreateContainer took 0.900 s of the runtime's request timeout of 1.5 s (more than "
                    "half)",
                    "ns/p/late: CreateContainer took 1.600 s of the runtime's request timeout of 1.5 s (past it: the "
                    "runtime has failed the container)"], lines


def test_a_peer_of_this_process_own_uid_passes(pair: tuple[socket.socket, socket.socket]) -> None:
    """A socket pair of this process (root, or a test's own uid) passes the peer check; another uid: below."""
    plugin.check_peer(pair[0], "the pair")


@pytest.mark.root
def test_a_runtime_socket_of_another_uid_is_refused_in_one_line(tmp_path: Path) -> None:
    """The plugin (root) connects to a socket another uid listens on (SO_PEERCRED: the listener's credentials, as
    of its listen): one line naming the peer's uid, exit 1, nothing sent; the same through ``NRI_PLUGIN_SOCKET``
    (a socket pair the other uid made)."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    path = tmp_path / "nri.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    mine, theirs = socket.socketpair()
    ready_r, ready_w = os.pipe()
    stop_r, stop_w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the stand-in runtime: uid 1000 listens and makes a pair, then waits
        try:
            os.setresgid(1000, 1000, 1000)
            os.setresuid(1000, 1000, 1000)
            listener.listen(4)
            _kept, given = socket.socketpair()
            socket.send_fds(theirs, [b"x"], [given.fileno()])
            os.write(ready_w, b"1")
            os.read(stop_r, 1)
        finally:
            os._exit(0)
    try:
        assert os.read(ready_r, 1) == b"1"
        _msg, fds, _flags, _addr = socket.recv_fds(mine, 1, 1)
        done = _cli("--sysfs-root", str(SEED_SYSFS), "nri", "--socket", str(path))
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
        assert (f"the NRI socket {path}: refused: its peer (pid {child}) is uid 1000, not root: only the runtime, "
                "root, may send this plugin container specs") in done.stderr
        listener.settimeout(0)
        conn, _ = listener.accept()  # the plugin's connection waited in the backlog: nothing was sent on it
        conn.settimeout(10)
        assert conn.recv(1) == b""
        conn.close()
        inherited = subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", "--sysfs-root", str(SEED_SYSFS),
                                    "nri"], capture_output=True, text=True, timeout=60, cwd=REPO, pass_fds=fds,
                                   env={"PATH": "/usr/bin:/bin", "OCI_GPU_HOOK_CONFIG": "/dev/null",
                                        "NRI_PLUGIN_SOCKET": str(fds[0])})
        assert inherited.returncode == 1 and inherited.stderr.count("\n") == 1, inherited.stderr
        assert f"the NRI socket of NRI_PLUGIN_SOCKET={fds[0]}: refused: its peer (pid {child}) is uid 1000" in \
            inherited.stderr
    finally:
        os.write(stop_w, b"1")
        os.waitpid(child, 0)
        for fd in (ready_r, ready_w, stop_r, stop_w):
            os.close(fd)
        listener.close()
        mine.close()
        theirs.close()


# --- the plan as an adjustment ------------------------------------------------------------------------------

def test_after_the_warm_up_a_first_request_imports_nothing(tmp_path: Path) -> None:
    """What the plugin does before it registers: the first container that asks (here GPU 1 and the masking of the
    others, every kind scanned) imports no module the warm-up had not, and the warm-up writes nothing."""
    by_path = tmp_path / "by-path"
    script = f"""
import sys
from oci_gpu_hook.config import load_config
from oci_gpu_hook.serve.nri import adjust, api_pb2, plugin
config = load_config(environ={{}}, overrides={{"sysfs_root": {str(SEED_SYSFS)!r}, "by_path_dir": {str(by_path)!r},
                                              "mask_other_gpus": True, "log_file": ""}})
adjust.warm_up(config)
import os
print("written" if os.path.exists({str(by_path)!r}) else "nothing written")
before = set(sys.modules)
adjustment, _ = adjust.create_container(api_pb2.Container(id="c", env=["AMD_VISIBLE_DEVICES=1"]), config)
print(len(adjustment.linux.devices), sorted(set(sys.modules) - before))
"""
    done = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["nothing written", "3 []"], done.stdout


def test_the_adjustment_of_a_request(tmp_path: Path) -> None:
    """Devices with mode and owner, one rule each with the configured access, the by-path mount of the prepared
    directory; an existing rule that already grants a node is not given again."""
    config = _config(tmp_path, device_file_mode=0o660, device_gid=44, cgroup_access="rw")
    container = api_pb2.Container(id="c", env=["AMD_VISIBLE_DEVICES=1"])
    container.linux.resources.devices.add(allow=False, access="rwm")
    container.linux.resources.devices.add(allow=True, type="c", access="rw").major.value = 234  # c 234:* rw
    adjustment, plan = adjust.create_container(container, config)
    assert adjustment is not None and plan
    devices = [(d.path, d.type, d.major, d.minor, d.file_mode.value, d.uid.value, d.gid.value)
               for d in adjustment.linux.devices]
    assert devices == [("/dev/dri/card2", "c", 226, 2, 0o660, 0, 44), ("/dev/dri/renderD129", "c", 226, 129, 0o660,
                                                                       0, 44), ("/dev/kfd", "c", 234, 0, 0o660, 0, 44)]
    rules = [(r.allow, r.type, r.major.value, r.minor.value, r.access) for r in adjustment.linux.resources.devices]
    assert rules == [(True, "c", 226, 2, "rw"), (True, "c", 226, 129, "rw")]
    [mount] = adjustment.mounts
    assert (mount.destination, mount.type, list(mount.options)) == (
        "/dev/dri/by-path", "bind", ["bind", "ro", "nosuid", "noexec", "nodev"])
    assert sorted(os.listdir(mount.source)) == ["pci-0000:23:00.0-card", "pci-0000:23:00.0-render"]
    assert not adjustment.env and not adjustment.hooks.create_runtime


def test_an_nvidia_request_brings_the_drivers_files_and_ld_cache_hook(tmp_path: Path) -> None:
    """NVIDIA: the GPU's and the control nodes, the driver's files as read-only mounts, the createRuntime hook
    that makes their soname links and the ld cache, as in a rewritten spec."""
    host = REPO / "examples" / "hosts" / "nvidia-4x-h100"
    config = Config(sysfs_root=str(host / "sys"), proc_root=str(host / "proc"), driver_root=str(host / "driver"),
                    hook_path="/bin/sh", by_path_dir=str(tmp_path / "by-path"))
    container = api_pb2.Container(id="c", env=["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=compute"])
    adjustment, plan = adjust.create_container(container, config)
    assert adjustment is not None
    paths = [d.path for d in adjustment.linux.devices]
    assert paths == [n.path for n in plan.nodes] and "/dev/nvidiactl" in paths
    assert len([p for p in paths if p.removeprefix("/dev/nvidia").isdigit()]) == 1  # one GPU of the four
    drivers = [m for m in adjustment.mounts if m.destination != "/dev/dri/by-path"]
    assert drivers and all(m.type == "bind" and "ro" in m.options for m in drivers)
    assert [(m.source, m.destination) for m in drivers] == [(m.source, m.destination) for m in plan.edits.mounts]
    [hook] = adjustment.hooks.create_runtime
    assert hook.path == "/bin/sh" and hook.args[:2] == ["oci-gpu-hook", "ldcache"]
    assert hook.args[2:] == plan.edits.driver_hook_args and hook.timeout.value == 30


def test_what_the_rewrite_appended_is_the_adjustment(tmp_path: Path) -> None:
    """Each appended part of the OCI view maps to its field of the adjustment; a part changed other than by
    appending is an internal error, never a wrong adjustment."""
    before = {"process": {"env": ["A=1"]}, "mounts": [{"destination": "/x", "type": "bind", "source": "/y"}],
              "linux": {"devices": [], "resources": {"devices": [{"allow": False, "access": "rwm"}]}}}
    after = {"process": {"env": ["A=1", "B=2=3"]},
             "mounts": [{"destination": "/x", "type": "bind", "source": "/y"},
                        {"destination": "/z", "type": "bind", "source": "/w", "options": ["ro"]}],
             "hooks": {"createRuntime": [{"path": "/h", "args": ["h", "x"], "env": ["P=1"], "timeout": 7}]},
             "linux": {"devices": [{"path": "/dev/b", "type": "b", "major": 8, "minor": 0}],
                       "resources": {"devices": [{"allow": False, "access": "rwm"},
                                                 {"allow": True, "type": "c", "access": "rw"}]}}}
    got = adjust.adjustment(before, after, _config(tmp_path))
    assert [(e.key, e.value) for e in got.env] == [("B", "2=3")]
    assert [(m.destination, m.source, list(m.options)) for m in got.mounts] == [("/z", "/w", ["ro"])]
    [hook] = got.hooks.create_runtime
    assert (hook.path, list(hook.args), list(hook.env), hook.timeout.value) == ("/h", ["h", "x"], ["P=1"], 7)
    [device] = got.linux.devices
    assert (device.path, device.type, device.HasField("file_mode")) == ("/dev/b", "b", False)
    [rule] = got.linux.resources.devices
    assert (rule.allow, rule.type, rule.HasField("major"), rule.HasField("minor"), rule.access) == (
        True, "c", False, False, "rw")
    after["process"]["env"] = ["A=2"]
    with pytest.raises(HookError, match=r"internal error: the spec rewrite changed process\.env"):
        adjust.adjustment(before, after, _config(tmp_path))


def test_a_conflicting_node_is_refused(tmp_path: Path) -> None:
    container = api_pb2.Container(id="c", env=["AMD_VISIBLE_DEVICES=1"])
    container.linux.devices.add(path="/dev/kfd", type="c", major=1, minor=3)
    with pytest.raises(HookError, match="already lists /dev/kfd as c 1:3"):
        adjust.create_container(container, _config(tmp_path))


def test_masked_paths_become_the_mounts_runc_makes(tmp_path: Path) -> None:
    """NRI's adjustment has no masked paths: each becomes a read-only tmpfs over a directory (what runc mounts
    for a masked directory), /dev/null over a file, nothing where the host has nothing."""
    sysfs = tmp_path / "sys"
    (sysfs / "devices" / "gpu0").mkdir(parents=True)
    (sysfs / "devices" / "gpu0" / "file").write_text("")
    config = _config(tmp_path, sysfs_root=str(sysfs), proc_root=str(tmp_path / "proc"))
    assert adjust.mask_mount("/sys/devices/gpu0", config) == {
        "destination": "/sys/devices/gpu0", "type": "tmpfs", "source": "tmpfs",
        "options": ["ro", "nosuid", "nodev", "noexec"]}
    assert adjust.mask_mount("/sys/devices/gpu0/file", config) == {
        "destination": "/sys/devices/gpu0/file", "type": "bind", "source": "/dev/null",
        "options": ["bind", "ro", "nosuid", "nodev", "noexec"]}
    assert adjust.mask_mount("/sys/devices/gpu1", config) is None
    assert adjust.mask_mount("/proc/driver/nvidia/gpus/0000:01:00.0", config) is None
    with pytest.raises(HookError, match="only paths under /sys and /proc"):
        adjust.mask_mount("/dev/x", config)


def test_mask_other_gpus_through_nri(tmp_path: Path) -> None:
    """With ``mask_other_gpus`` every other GPU's sysfs directory is masked by a mount."""
    config = _config(tmp_path, mask_other_gpus=True)
    adjustment, _ = adjust.create_container(api_pb2.Container(id="c", env=["AMD_VISIBLE_DEVICES=1"]), config)
    assert adjustment is not None
    masks = [m for m in adjustment.mounts if m.destination.startswith("/sys/")]
    assert len(masks) == 7 and all(m.type == "tmpfs" and "ro" in m.options for m in masks)
    assert not any("0000:23:00.0" in m.destination for m in masks)


def test_a_cgroup_access_nri_cannot_honour_is_refused(tmp_path: Path) -> None:
    adjust.check_config(_config(tmp_path, cgroup_access="rwm"))
    adjust.check_config(_config(tmp_path, cgroup_access="rw"))
    with pytest.raises(HookError, match=r"cgroup_access 'r' .* cannot be honoured by NRI"):
        adjust.check_config(_config(tmp_path, cgroup_access="r"))


# --- identity, command line, import weight ------------------------------------------------------------------

def test_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(plugin.NAME_ENV, raising=False)
    monkeypatch.delenv(plugin.IDX_ENV, raising=False)
    assert plugin.identity(None, None, "/usr/bin/oci-gpu-hook") == ("oci-gpu-hook", "10")
    assert plugin.identity(None, None, "/opt/nri/plugins/20-gpus") == ("gpus", "20")
    assert plugin.identity("mine", "05", "/opt/nri/plugins/20-gpus") == ("mine", "05")
    monkeypatch.setenv(plugin.NAME_ENV, "from-env")
    monkeypatch.setenv(plugin.IDX_ENV, "30")
    assert plugin.identity(None, None, "oci-gpu-hook") == ("from-env", "30")
    with pytest.raises(HookError, match="two digits"):
        plugin.identity(None, "7", "oci-gpu-hook")
    with pytest.raises(HookError, match="letters, digits"):
        plugin.identity("a b", None, "oci-gpu-hook")


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env=env)


def test_the_command(tmp_path: Path) -> None:
    assert "  nri [--socket PATH] [--name NAME] [--idx NN]" in _cli("--help").stdout
    done = _cli("--sysfs-root", str(SEED_SYSFS), "nri", "--socket", str(tmp_path / "absent.sock"))
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert f"cannot connect to the NRI socket {tmp_path / 'absent.sock'}" in done.stderr
    config = tmp_path / "config.toml"
    config.write_text('cgroup_access = "r"\n')
    done = _cli("--sysfs-root", str(SEED_SYSFS), "--config", str(config), "nri")
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "cannot be honoured by NRI" in done.stderr


def test_the_per_container_path_never_imports_it() -> None:
    code = ("import sys, oci_gpu_hook.entry.cli, oci_gpu_hook.entry.runtime, oci_gpu_hook.appliers.live\n"
            "print(','.join(sorted(m for m in sys.modules if m.startswith('oci_gpu_hook.serve.nri'))))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
