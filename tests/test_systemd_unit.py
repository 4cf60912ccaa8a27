"""The prestart hook's D-Bus client of systemd (oci_gpu_hook/appliers/systemd_unit.py), against a peer of the test's
own on a Unix socket: the authentication, the message it sends (read back with an independent decoding of the
header), signals before the reply, error replies and a dead socket (each the one refusal line naming the durable
paths), which cgroups count as a systemd unit, and which unit is the container's own (its name carries the id, its
ControlGroup is the container's cgroup or crun's child's parent).  Hostile peers: one listening as another uid,
one that never answers or trickles its bytes (one deadline), deep nesting, garbage (each one line, in time).
Against the real systemd 252: tests/containers/test_systemd_cgroup_driver.py.

The fake peers run in this process, so they are root's only when the tests are: the client talks to no other
peer (``SO_PEERCRED``), and these tests need root."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oci_gpu_hook.appliers import systemd_unit as su
from oci_gpu_hook.core.devices import Rule
from oci_gpu_hook.errors import HookError

pytestmark = pytest.mark.root


def pad(data: bytes, align: int) -> bytes:
    return data + b"\0" * (-len(data) % align)


def read_message(conn: socket.socket, buffer: bytearray) -> tuple[int, int, dict[int, object], bytes]:
    """(type, serial, header fields, body) of the next message, decoded here by hand from the specification."""
    while len(buffer) < 16:
        buffer += conn.recv(4096)
    assert buffer[0:1] == b"l" and buffer[3] == 1
    kind = buffer[1]
    body_len, serial, fields_len = struct.unpack_from("<III", buffer, 4)
    total = 16 + fields_len + (-(16 + fields_len) % 8) + body_len
    while len(buffer) < total:
        buffer += conn.recv(4096)
    fields, pos = {}, 16
    while pos < 16 + fields_len:
        pos += -pos % 8
        code, siglen = buffer[pos], buffer[pos + 1]
        sig = bytes(buffer[pos + 2:pos + 2 + siglen]).decode()
        pos += 3 + siglen
        if sig in ("s", "o"):
            pos += -pos % 4
            (length,) = struct.unpack_from("<I", buffer, pos)
            fields[code] = bytes(buffer[pos + 4:pos + 4 + length]).decode()
            pos += 5 + length
        elif sig == "g":
            length = buffer[pos]
            fields[code] = bytes(buffer[pos + 1:pos + 1 + length]).decode()
            pos += 2 + length
        else:
            pos += -pos % 4
            (fields[code],) = struct.unpack_from("<I", buffer, pos)
            pos += 4
    body = bytes(buffer[total - body_len:total])
    del buffer[:total]
    return kind, serial, fields, body


def reply(kind: int, serial: int, reply_to: int, signature: str, body: bytes, error: str = "") -> bytes:
    fields: list[tuple[int, tuple[str, object]]] = [(su.F_REPLY_SERIAL, ("u", reply_to))]
    if error:
        fields.append((su.F_ERROR_NAME, ("s", error)))
    if signature:
        fields.append((su.F_SIGNATURE, ("g", signature)))
    header = su.marshal("yyyyuua(yv)", [ord("l"), kind, 0, 1, len(body), serial, fields])
    return pad(header, 8) + body


Answer = Callable[[int, dict[int, object], bytes], bytes]


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[tuple[str, list[tuple[dict[int, object], bytes]], list[Answer]]]:
    """A Unix socket speaking as systemd would: ``answers`` (one per call, in order) make each reply."""
    path = str(tmp_path / "private")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    seen: list[tuple[dict[int, object], bytes]] = []
    answers: list[Answer] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                buffer = bytearray()
                while b"BEGIN\r\n" not in buffer:
                    buffer += conn.recv(4096)
                auth, _, rest = bytes(buffer).partition(b"BEGIN\r\n")
                assert auth.startswith(b"\0AUTH EXTERNAL ") and auth.endswith(b"\r\n"), auth
                assert bytes.fromhex(auth[15:-2].decode()).decode() == str(__import__("os").geteuid())
                conn.sendall(b"OK 0123456789abcdef0123456789abcdef\r\n")
                buffer = bytearray(rest)
                try:
                    while answers:
                        kind, serial, fields, body = read_message(conn, buffer)
                        assert kind == su.METHOD_CALL
                        seen.append((fields, body))
                        conn.sendall(answers.pop(0)(serial, fields, body))
                except (OSError, AssertionError):
                    continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path, seen, answers
    server.shutdown(socket.SHUT_RDWR)  # wakes the accept()
    server.close()
    thread.join(5)
    assert not thread.is_alive()


def ok(serial: int, _fields: dict[int, object], _body: bytes) -> bytes:
    return reply(su.METHOD_RETURN, 900 + serial, serial, "", b"")


def signal_then_ok(serial: int, fields: dict[int, object], body: bytes) -> bytes:
    sig_body = su.marshal("so", ["x.scope", "/org/freedesktop/systemd1/unit/x_2escope"])
    signal = pad(su.marshal("yyyyuua(yv)", [ord("l"), su.SIGNAL, 1, 1, len(sig_body), 7, [
        (su.F_PATH, ("o", "/org/freedesktop/systemd1")), (su.F_INTERFACE, ("s", su.MANAGER)),
        (su.F_MEMBER, ("s", "UnitNew")), (su.F_SIGNATURE, ("g", "so"))]]), 8) + sig_body
    return signal + ok(serial, fields, body)


UNIT_PATH = "/org/freedesktop/systemd1/unit/cri_2dcontainerd_2dabc_2escope"
CID = "abc"
SCOPE = f"cri-containerd-{CID}.scope"
CGROUP = f"/kubepods.slice/kubepods-pod1.slice/{SCOPE}"


def unit_path(serial: int, _fields: dict[int, object], _body: bytes) -> bytes:
    return reply(su.METHOD_RETURN, 700 + serial, serial, "o", su.marshal("o", [UNIT_PATH]))


def policy(value: str) -> Answer:
    """A string property's value (Get answers a variant)."""
    def answer(serial: int, _fields: dict[int, object], _body: bytes) -> bytes:
        return reply(su.METHOD_RETURN, 800 + serial, serial, "v", su.marshal("v", [("s", value)]))
    return answer


control_group = policy
OWN = [unit_path, control_group(CGROUP)]  # the unit, proved to be the container's
RULES = (Rule(True, "c", 226, 129, "rw"), Rule(True, "c", 234, 0, "rw"))


def register(socket_path: str, unit: str = SCOPE, cgroup: str = CGROUP, cid: str = CID) -> str:
    return su.register(unit, RULES, cgroup, cid, socket_path)


def test_register_sends_set_unit_properties_runtime_then_a_ping(peer: tuple) -> None:  # type: ignore[type-arg]
    path, seen, answers = peer
    answers += [*OWN, policy("strict"), signal_then_ok, ok]
    line = register(path)
    assert line == "cri-containerd-abc.scope: DeviceAllow /dev/char/226:129 /dev/char/234:0"
    (unit_fields, unit_body), (cg_fields, cg_body), (get_fields, get_body), (set_fields, set_body), \
        (ping_fields, ping_body) = seen
    assert unit_fields[su.F_MEMBER] == "GetUnit" and su.unmarshal("s", unit_body) == ["cri-containerd-abc.scope"]
    for fields in (cg_fields, get_fields):
        assert fields[su.F_PATH] == UNIT_PATH
        assert fields[su.F_MEMBER] == "Get" and fields[su.F_INTERFACE] == "org.freedesktop.DBus.Properties"
    assert su.unmarshal("ss", cg_body) == ["org.freedesktop.systemd1.Scope", "ControlGroup"]
    assert su.unmarshal("ss", get_body) == ["org.freedesktop.systemd1.Scope", "DevicePolicy"]
    assert set_fields[su.F_PATH] == "/org/freedesktop/systemd1" and set_fields[su.F_MEMBER] == "SetUnitProperties"
    assert set_fields[su.F_INTERFACE] == su.MANAGER and set_fields[su.F_SIGNATURE] == "sba(sv)"
    assert set_fields[su.F_DESTINATION] == "org.freedesktop.systemd1"
    # the body, by hand from the specification: s name, b true, a(sv) [("DeviceAllow", <a(ss) [(path, access)]>)]
    body = bytearray()

    def text(value: bytes) -> None:
        body.extend(b"\0" * (-len(body) % 4) + struct.pack("<I", len(value)) + value + b"\0")

    text(b"cri-containerd-abc.scope")
    body.extend(b"\0" * (-len(body) % 4) + struct.pack("<I", 1))
    body.extend(b"\0" * (-len(body) % 4))
    outer = len(body)
    body.extend(b"\0\0\0\0" + b"\0" * (-(len(body) + 4) % 8))
    outer_start = len(body)
    text(b"DeviceAllow")
    body.extend(bytes([5]) + b"a(ss)\0")
    body.extend(b"\0" * (-len(body) % 4))
    inner = len(body)
    body.extend(b"\0\0\0\0" + b"\0" * (-(len(body) + 4) % 8))
    inner_start = len(body)
    for dev, access in ((b"/dev/char/226:129", b"rw"), (b"/dev/char/234:0", b"rw")):
        body.extend(b"\0" * (-len(body) % 8))
        text(dev)
        text(access)
    struct.pack_into("<I", body, inner, len(body) - inner_start)
    struct.pack_into("<I", body, outer, len(body) - outer_start)
    assert set_body == bytes(body)
    assert su.unmarshal("sba(sv)", set_body) == ["cri-containerd-abc.scope", True, [
        ("DeviceAllow", ("a(ss)", [("/dev/char/226:129", "rw"), ("/dev/char/234:0", "rw")]))]]
    assert ping_fields[su.F_INTERFACE] == "org.freedesktop.DBus.Peer" and ping_fields[su.F_MEMBER] == "Ping"
    assert su.F_SIGNATURE not in ping_fields and ping_body == b""


def one_line_refusal(err: HookError, *parts: str) -> None:
    text = str(err)
    assert "\n" not in text
    for part in (*parts, "oci-gpu-runtime shim", "podman's precreate hook", "CDI"):
        assert part in text, text


def test_an_error_reply_is_the_one_refusal_line(peer: tuple) -> None:  # type: ignore[type-arg]
    path, _seen, answers = peer
    message = su.marshal("s", ["Access denied"])
    answers += [*OWN, policy("strict")]
    answers.append(lambda serial, _f, _b: reply(su.ERROR, 5, serial, "s", message,
                                                "org.freedesktop.DBus.Error.AccessDenied"))
    with pytest.raises(HookError) as caught:
        register(path)
    one_line_refusal(caught.value, "cri-containerd-abc.scope", "org.freedesktop.DBus.Error.AccessDenied: Access denied",
                     "daemon-reload")


def test_a_scope_systemd_does_not_have_is_not_its_to_register(peer: tuple) -> None:  # type: ignore[type-arg]
    path, seen, answers = peer
    message = su.marshal("s", ["Unit nope.scope not loaded."])
    answers.append(lambda serial, _f, _b: reply(su.ERROR, 5, serial, "s", message, su.NO_SUCH_UNIT))
    assert register(path, "nope.scope") == "nope.scope: not a unit systemd has loaded: nothing registered"
    assert [fields[su.F_MEMBER] for fields, _body in seen] == ["GetUnit"]


def test_a_unit_name_with_control_characters_is_shown_on_one_line(peer: tuple) -> None:  # type: ignore[type-arg]
    """A cgroup name may hold a newline (anything but '/'): the log's line and the refusal stay one line."""
    path, _seen, answers = peer
    message = su.marshal("s", ["Unit not loaded."])
    answers.append(lambda serial, _f, _b: reply(su.ERROR, 5, serial, "s", message, su.NO_SUCH_UNIT))
    assert register(path, "a\nb-abc.scope") == "a?b-abc.scope: not a unit systemd has loaded: nothing registered"
    answers += [unit_path]
    with pytest.raises(HookError) as caught:
        register(path, "a\nb-other.scope", cgroup="/x\n/a\nb-other.scope")
    assert "\n" not in str(caught.value) and "lies in systemd unit a?b-other.scope" in str(caught.value)


def test_no_systemd_socket_is_the_one_refusal_line(tmp_path: Path) -> None:
    with pytest.raises(HookError) as caught:
        register(str(tmp_path / "absent"), "libpod-abc.scope")
    one_line_refusal(caught.value, "libpod-abc.scope", f"cannot talk to systemd at {tmp_path / 'absent'}")


def test_a_peer_that_hangs_up_is_refused(peer: tuple) -> None:  # type: ignore[type-arg]
    path, _seen, answers = peer
    answers += [*OWN, policy("strict")]
    answers.append(lambda _s, _f, _b: b"")  # the server closes without a reply
    with pytest.raises(HookError) as caught:
        register(path)
    one_line_refusal(caught.value, SCOPE, "systemd closed the connection")


@pytest.mark.parametrize("value", ["auto", "closed"])
def test_a_unit_that_is_not_a_restricted_container_scope_is_refused(peer: tuple, value: str) -> None:  # type: ignore[type-arg]
    path, seen, answers = peer
    answers += [*OWN, policy(value)]
    with pytest.raises(HookError) as caught:
        register(path)
    one_line_refusal(caught.value, SCOPE, f"its DevicePolicy is '{value}', not the 'strict'")
    assert [fields[su.F_MEMBER] for fields, _body in seen] == ["GetUnit", "Get", "Get"]  # nothing set


def test_device_allow_reads_the_property(peer: tuple) -> None:  # type: ignore[type-arg]
    path, seen, answers = peer
    value = su.marshal("v", [("a(ss)", [("/dev/char/1:3", "rwm"), ("char-pts", "rwm")])])
    answers.append(unit_path)
    answers.append(lambda serial, _f, _b: reply(su.METHOD_RETURN, 2, serial, "v", value))
    assert su.device_allow("x.scope", path) == [("/dev/char/1:3", "rwm"), ("char-pts", "rwm")]
    assert seen[1][0][su.F_PATH] == UNIT_PATH
    assert su.unmarshal("ss", seen[1][1]) == ["org.freedesktop.systemd1.Scope", "DeviceAllow"]


@pytest.mark.parametrize(("directory", "unit"), [
    ("/sys/fs/cgroup/devices/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope", "cri-containerd-abc.scope"),
    ("/sys/fs/cgroup/machine.slice/libpod-abc.scope/container", "libpod-abc.scope"),
    ("/sys/fs/cgroup/devices/system.slice/ogh-c1.scope", "ogh-c1.scope"),
    ("/sys/fs/cgroup/devices/kubepods/besteffort/pod1/abc", None),  # cgroupfs
    ("/sys/fs/cgroup/devices/system.slice", None),  # a slice is never registered with
    ("/sys/fs/cgroup/devices/.scope", None),
])
def test_unit_of(directory: str, unit: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(su, "BOOTED_MARKER", str(tmp_path))
    assert su.unit_of(directory) == unit
    monkeypatch.setattr(su, "BOOTED_MARKER", str(tmp_path / "absent"))  # systemd is not the manager
    assert su.unit_of(directory) is None


def test_a_rule_for_many_devices_is_refused() -> None:
    with pytest.raises(HookError) as caught:
        su.register("x.scope", (Rule(True, "c", 226, None, "rw"),), "/x.scope", "x", "/nonexistent")
    one_line_refusal(caught.value, "c 226:* rw", "cannot be registered with systemd")


def test_marshal_round_trip() -> None:
    signature = "yyba(sv)ua(yv)sog"
    values = [1, 200, False, [("A", ("s", "x")), ("B", ("a(ss)", [("p", "rw")])), ("C", ("u", 7))], 2 ** 32 - 1,
              [(1, ("o", "/a")), (8, ("g", "a(ss)"))], "", "/o/p", "sv"]
    assert su.unmarshal(signature, su.marshal(signature, values)) == values
    with pytest.raises(su.BusError):
        su.unmarshal("s", b"\x10\0\0\0abc")  # truncated
    with pytest.raises(su.BusError):
        su.split_types("a{sv}")  # a dict: not a type this client reads


# --- whose unit: the container's own, or a refusal before anything is set ------------------------------------

def test_a_unit_whose_name_lacks_the_container_id_is_refused(peer: tuple) -> None:  # type: ignore[type-arg]
    """A cgroupsPath of ``/x/cri-containerd-B.scope`` for container abc names B's unit."""
    path, seen, answers = peer
    answers += [unit_path]
    with pytest.raises(HookError) as caught:
        register(path, unit="cri-containerd-b.scope", cgroup="/x/cri-containerd-b.scope")
    text = str(caught.value)
    assert text == ("the container's cgroup '/x/cri-containerd-b.scope' lies in systemd unit cri-containerd-b.scope, "
                    "which is not the container's own: its name does not end with '-abc.scope' (the container's id); "
                    "registering its devices there would give them to that unit at the next daemon-reload: refusing "
                    "the live grant")
    assert [fields[su.F_MEMBER] for fields, _body in seen] == ["GetUnit"]  # nothing read further, nothing set


@pytest.mark.parametrize(("cgroup", "control"), [
    ("/x/cri-containerd-abc.scope", CGROUP),  # named like the container's scope, elsewhere
    (f"{CGROUP}/abc", CGROUP),  # below the scope, not crun's child
    (f"{CGROUP}/container/more", CGROUP),
    (f"{CGROUP}/container", f"{CGROUP}/container"[:-1]),
    ("/container", ""),  # a unit whose cgroup systemd has not made
    (CGROUP, f"{CGROUP}/"),
], ids=["elsewhere", "below", "below-crun-child", "prefix", "unrealized", "trailing-slash"])
def test_a_unit_whose_cgroup_is_not_the_containers_is_refused(peer: tuple, cgroup: str,  # type: ignore[type-arg]
                                                               control: str) -> None:
    path, seen, answers = peer
    answers += [unit_path, control_group(control)]
    with pytest.raises(HookError) as caught:
        register(path, cgroup=cgroup)
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith(f"the container's cgroup {cgroup!r} lies in systemd unit {SCOPE}, which is not the "
                           f"container's own: its ControlGroup is {control!r}, and the container's cgroup is neither "
                           "it nor its 'container' child (crun's); "), text
    assert [fields[su.F_MEMBER] for fields, _body in seen] == ["GetUnit", "Get"]  # nothing set


def test_crun_s_container_child_is_the_scope_s(peer: tuple) -> None:  # type: ignore[type-arg]
    path, seen, answers = peer
    answers += [*OWN, policy("strict"), ok, ok]
    assert register(path, cgroup=f"{CGROUP}/container") == f"{SCOPE}: DeviceAllow /dev/char/226:129 /dev/char/234:0"
    assert [fields[su.F_MEMBER] for fields, _body in seen] == ["GetUnit", "Get", "Get", "SetUnitProperties", "Ping"]


# --- hostile peers: one line, within the deadline --------------------------------------------------------------

FAST = 1.0  # seconds: the deadline these tests set (the shipped one: test_the_deadline_fits_the_hook_timeout)
SLACK = 4.0  # seconds a loaded machine may add
OK_LINE = b"OK 0123456789abcdef0123456789abcdef\r\n"
Script = Callable[[socket.socket, threading.Event], None]


@contextmanager
def serving(script: Script) -> Iterator[str]:
    """A Unix socket whose first connection ``script`` serves (with an event set when the block ends); its path."""
    directory = tempfile.mkdtemp(prefix="ogh-bus-")
    path = os.path.join(directory, "private")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    stop = threading.Event()

    def serve() -> None:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn:
            try:
                script(conn, stop)
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        stop.set()
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(10)
        shutil.rmtree(directory, ignore_errors=True)
        assert not thread.is_alive()


def read_auth(conn: socket.socket) -> None:
    data = b""
    while b"BEGIN\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            raise OSError("the client left")
        data += chunk


def silent(conn: socket.socket, stop: threading.Event) -> None:
    stop.wait()


def silent_after_auth(conn: socket.socket, stop: threading.Event) -> None:
    read_auth(conn)
    conn.sendall(OK_LINE)
    stop.wait()


def a_signal(header_extra: bytes = b"") -> bytes:
    body = su.marshal("so", ["x.scope", "/org/freedesktop/systemd1/unit/x_2escope"])
    return pad(su.marshal("yyyyuua(yv)", [ord("l"), su.SIGNAL, 1, 1, len(body), 7, [
        (su.F_PATH, ("o", "/org/freedesktop/systemd1")), (su.F_INTERFACE, ("s", su.MANAGER)),
        (su.F_MEMBER, ("s", "UnitNew")), (su.F_SIGNATURE, ("g", "so"))]]), 8) + body


def trickling_signals(conn: socket.socket, stop: threading.Event) -> None:
    """Valid signals forever, one byte every 20 ms: each recv gets something, the reply never comes."""
    read_auth(conn)
    conn.sendall(OK_LINE)
    while not stop.is_set():
        for byte in a_signal():
            if stop.wait(0.02):
                return
            conn.sendall(bytes([byte]))


def flooding_signals(conn: socket.socket, stop: threading.Event) -> None:
    read_auth(conn)
    conn.sendall(OK_LINE)
    burst = a_signal() * 200
    while not stop.is_set():
        conn.sendall(burst)


def refused_in_time(path: str, monkeypatch: pytest.MonkeyPatch, *parts: str) -> float:
    """register() against ``path`` under the FAST deadline: the one refusal line (with ``parts``); its seconds."""
    monkeypatch.setattr(su, "TIMEOUT", FAST)
    started = time.monotonic()
    with pytest.raises(HookError) as caught:
        register(path)
    took = time.monotonic() - started
    one_line_refusal(caught.value, SCOPE, *parts)
    assert took < FAST + SLACK, took
    return took


@pytest.mark.parametrize("script", [silent, silent_after_auth, trickling_signals, flooding_signals],
                         ids=["silent", "silent-after-auth", "trickling-signals", "flooding-signals"])
def test_a_peer_that_never_answers_is_refused_at_the_deadline(script: Script, monkeypatch: pytest.MonkeyPatch) -> None:
    with serving(script) as path:
        took = refused_in_time(path, monkeypatch, f"within {FAST:g} s")
    assert took >= FAST * 0.9, took  # it waited for the deadline, not less


def test_the_deadline_fits_the_hook_timeout() -> None:
    """The shipped deadline leaves at least half of the installed prestart hook's timeout to the rest of the hook."""
    hook = json.loads((Path(__file__).parent.parent / "hooks.d" / "oci-gpu-hook-prestart.json").read_text())
    assert 0 < su.TIMEOUT <= hook["hook"]["timeout"] / 2


def test_a_peer_that_is_not_root_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    """A socket whose listener is uid 65534 (the kernel records the listener's credentials at listen()): refused
    on its credentials alone; it is sent not one byte."""
    path = tmp_path / "private"
    script = ("import os, socket, sys\n"
              "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
              f"s.bind({str(path)!r})\n"
              "os.setresgid(65534, 65534, 65534)\n"
              "os.setresuid(65534, 65534, 65534)\n"
              "s.listen(4)\n"
              "print('listening', flush=True)\n"
              "sys.stdin.read()\n"
              "s.settimeout(10)\n"
              "conn, _ = s.accept()\n"
              "print(repr(conn.recv(4096)), flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "listening\n"
        with pytest.raises(HookError) as caught:
            register(str(path))
        one_line_refusal(caught.value, SCOPE, f"{path} is served by uid 65534, not by root: it is not systemd")
        out, _err = proc.communicate("", timeout=30)
        assert out == "b''\n"  # the connection the client made and closed: nothing written on it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def nested_variants(depth: int, start: int = 0) -> bytes:
    """``depth`` variants, each holding the next, the last a string (``start``: the offset in the message)."""
    data = b"\x01v\x00" * (depth - 1) + b"\x01s\x00"
    data += b"\0" * (-(start + len(data)) % 4)
    return data + struct.pack("<I", 1) + b"x\0"


def test_nesting_up_to_the_specification_s_64_and_no_deeper() -> None:
    value: object = ("s", "x")
    for _ in range(su.MAX_DEPTH - 1):
        value = ("v", value)
    assert su.unmarshal("v", nested_variants(su.MAX_DEPTH)) == [value]
    for data in (nested_variants(su.MAX_DEPTH + 1), nested_variants(100_000)):
        with pytest.raises(su.BusError, match="nested deeper than the 64 containers D-Bus allows"):
            su.unmarshal("v", data)
    # arrays count too: each holding the next, the innermost one byte
    data = struct.pack("<I", 1) + b"\x07"
    for depth in range(2, su.MAX_DEPTH + 2):
        data = struct.pack("<I", len(data)) + data
        if depth == su.MAX_DEPTH:
            (value,) = su.unmarshal("a" * depth + "y", data)
            for _ in range(depth - 1):
                (value,) = value
            assert value == [7]
    with pytest.raises(su.BusError, match="nested deeper"):
        su.unmarshal("a" * (su.MAX_DEPTH + 1) + "y", data)


def deep_signal() -> bytes:
    """A signal with an unknown header field that holds 100,000 nested variants."""
    field = bytes([200]) + nested_variants(100_000, start=17)
    fixed = b"l" + bytes([su.SIGNAL, 1, 1]) + struct.pack("<III", 0, 9, len(field))
    return pad(fixed + field, 8)


def deep_property(serial: int, _fields: dict[int, object], _body: bytes) -> bytes:
    return reply(su.METHOD_RETURN, 800 + serial, serial, "v", nested_variants(100_000))


def deep_signal_then_unit(serial: int, fields: dict[int, object], body: bytes) -> bytes:
    return deep_signal() + unit_path(serial, fields, body)


@pytest.mark.parametrize("answers", [[unit_path, deep_property], [deep_signal_then_unit]],
                         ids=["in-a-reply", "in-a-signal-header"])
def test_a_peer_that_nests_too_deep_is_refused(peer: tuple, answers: list[Answer]) -> None:  # type: ignore[type-arg]
    path, _seen, queue = peer
    queue += answers
    started = time.monotonic()
    with pytest.raises(HookError) as caught:
        register(path)
    one_line_refusal(caught.value, SCOPE, "nested deeper than the 64 containers D-Bus allows")
    assert time.monotonic() - started < su.TIMEOUT


def answers_with(payload: bytes) -> Script:
    """A peer that authenticates and sends ``payload`` whatever it is asked, reads the calls, and hangs up once
    the client has been quiet for 0.1 s."""
    def script(conn: socket.socket, stop: threading.Event) -> None:
        read_auth(conn)
        conn.sendall(OK_LINE + payload)
        conn.settimeout(0.1)
        while not stop.is_set():
            try:
                if not conn.recv(65536):
                    return
            except TimeoutError:
                return
    return script


def message(kind: int, reply_to: int, signature: str, body: bytes, **extra: tuple[int, tuple[str, object]]) -> bytes:
    fields: list[tuple[int, tuple[str, object]]] = [(su.F_REPLY_SERIAL, ("u", reply_to)), *extra.values()]
    if signature:
        fields.append((su.F_SIGNATURE, ("g", signature)))
    return pad(su.marshal("yyyyuua(yv)", [ord("l"), kind, 0, 1, len(body), 99, fields]), 8) + body


GOOD_UNIT = message(su.METHOD_RETURN, 1, "o", su.marshal("o", [UNIT_PATH]))
GARBAGE = {
    "text": (b"HTTP/1.1 400 Bad Request\r\n\r\n" * 3, "big-endian message"),
    "big-endian": (b"B" + bytes(15), "big-endian message"),
    "protocol-2": (b"l\x02\x00\x02" + bytes(12), "protocol version 2"),
    "huge": (b"l\x02\x00\x01" + struct.pack("<III", 2 ** 31, 1, 16), "more than any answer"),
    "wrong-reply-type": (message(su.METHOD_RETURN, 1, "s", su.marshal("s", ["/x"])),
                         "answered GetUnit with values of type 's', not 'o'"),
    "signature-field-of-another-type": (
        pad(su.marshal("yyyyuua(yv)", [ord("l"), su.METHOD_RETURN, 0, 1, 0, 9, [
            (su.F_REPLY_SERIAL, ("u", 1)), (su.F_SIGNATURE, ("u", 5))]]), 8), "header field 8 of type 'u', not 'g'"),
    "empty-body": (message(su.METHOD_RETURN, 1, "o", b""), "truncated message"),
    "truncated-then-gone": (GOOD_UNIT[:-3], "systemd closed the connection"),
    "empty-struct": (message(su.ERROR, 1, "a()", struct.pack("<I", 2 ** 20) + bytes(4),
                             name=(su.F_ERROR_NAME, ("s", "x.Error"))), "empty struct"),
    "dict": (GOOD_UNIT + message(su.METHOD_RETURN, 2, "v", b"\x05a{sv}\x00" + bytes(4)), "does not handle: '{'"),
    "multi-line-error": (message(su.ERROR, 1, "s", su.marshal("s", ["line one\nline two\r\n" * 1000]),
                                 name=(su.F_ERROR_NAME, ("s", "org.Evil\nError"))),
                         "org.Evil?Error: line one?line two"),
    "rejected": (b"", ""),
}


@pytest.mark.parametrize("name", list(GARBAGE))
def test_a_peer_that_sends_garbage_is_refused(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    payload, part = GARBAGE[name]
    script = answers_with(payload)
    if name == "rejected":
        def script(conn: socket.socket, stop: threading.Event) -> None:
            read_auth(conn)
            conn.sendall(b"REJECTED EXTERNAL\r\n")
        part = "refused authentication: 'REJECTED EXTERNAL'"
    with serving(script) as path:
        refused_in_time(path, monkeypatch, part)


def test_an_endless_authentication_answer_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def script(conn: socket.socket, stop: threading.Event) -> None:
        read_auth(conn)
        conn.sendall(b"OK" * 5000)
        stop.wait()
    with serving(script) as path:
        refused_in_time(path, monkeypatch, "authentication answer is too long")


EXCHANGE = (GOOD_UNIT + message(su.METHOD_RETURN, 2, "v", su.marshal("v", [("s", CGROUP)]))
            + message(su.METHOD_RETURN, 3, "v", su.marshal("v", [("s", "strict")])) + a_signal()
            + message(su.METHOD_RETURN, 4, "", b"") + message(su.METHOD_RETURN, 5, "", b""))


def test_the_exchange_the_fuzzing_mutates_registers(monkeypatch: pytest.MonkeyPatch) -> None:
    with serving(answers_with(EXCHANGE)) as path:
        assert register(path) == f"{SCOPE}: DeviceAllow /dev/char/226:129 /dev/char/234:0"


def fuzzed(payload: bytes) -> None:
    """register() against a peer that sends ``payload`` and hangs up: a result, or the one line (nothing else)."""
    with serving(answers_with(payload)) as path:
        started = time.monotonic()
        try:
            register(path)
        except HookError as err:
            assert "\n" not in str(err) and "\r" not in str(err) and len(str(err)) < 2000, str(err)
        assert time.monotonic() - started < su.TIMEOUT + SLACK


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(EXCHANGE) - 1), st.integers(0, 255)), min_size=1, max_size=6),
       st.integers(0, len(EXCHANGE)))
def test_a_mutated_exchange_is_a_result_or_one_line(changes: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(EXCHANGE)
    for at, value in changes:
        data[at] = value
    fuzzed(bytes(data[:cut]) if cut else bytes(data))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_random_bytes_are_one_line(payload: bytes) -> None:
    fuzzed(payload)
