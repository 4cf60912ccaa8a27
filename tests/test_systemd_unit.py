"""The prestart hook's D-Bus client of systemd (oci_gpu_hook/appliers/systemd_unit.py), against a peer of the test's
own on a Unix socket: the authentication, the message it sends (read back with an independent decoding of the
header), signals before the reply, error replies and a dead socket (each the one refusal line naming the durable
paths), and which cgroups count as a systemd unit.  Against the real systemd 252:
tests/containers/test_systemd_live.py."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from oci_gpu_hook.appliers import systemd_unit as su
from oci_gpu_hook.core.devices import Rule
from oci_gpu_hook.errors import HookError


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


def unit_path(serial: int, _fields: dict[int, object], _body: bytes) -> bytes:
    return reply(su.METHOD_RETURN, 700 + serial, serial, "o", su.marshal("o", [UNIT_PATH]))


def policy(value: str) -> Answer:
    def answer(serial: int, _fields: dict[int, object], _body: bytes) -> bytes:
        return reply(su.METHOD_RETURN, 800 + serial, serial, "v", su.marshal("v", [("s", value)]))
    return answer


RULES = (Rule(True, "c", 226, 129, "rw"), Rule(True, "c", 234, 0, "rw"))


def test_register_sends_set_unit_properties_runtime_then_a_ping(peer: tuple) -> None:  # type: ignore[type-arg]
    path, seen, answers = peer
    answers += [unit_path, policy("strict"), signal_then_ok, ok]
    line = su.register("cri-containerd-abc.scope", RULES, path)
    assert line == "cri-containerd-abc.scope: DeviceAllow /dev/char/226:129 /dev/char/234:0"
    (unit_fields, unit_body), (get_fields, get_body), (set_fields, set_body), (ping_fields, ping_body) = seen
    assert unit_fields[su.F_MEMBER] == "GetUnit" and su.unmarshal("s", unit_body) == ["cri-containerd-abc.scope"]
    assert get_fields[su.F_PATH] == UNIT_PATH
    assert get_fields[su.F_MEMBER] == "Get" and get_fields[su.F_INTERFACE] == "org.freedesktop.DBus.Properties"
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
    answers += [unit_path, policy("strict")]
    answers.append(lambda serial, _f, _b: reply(su.ERROR, 5, serial, "s", message,
                                                "org.freedesktop.DBus.Error.AccessDenied"))
    with pytest.raises(HookError) as caught:
        su.register("cri-containerd-abc.scope", RULES, path)
    one_line_refusal(caught.value, "cri-containerd-abc.scope", "org.freedesktop.DBus.Error.AccessDenied: Access denied",
                     "daemon-reload")


def test_a_scope_systemd_does_not_have_is_not_its_to_register(peer: tuple) -> None:  # type: ignore[type-arg]
    path, seen, answers = peer
    message = su.marshal("s", ["Unit nope.scope not loaded."])
    answers.append(lambda serial, _f, _b: reply(su.ERROR, 5, serial, "s", message, su.NO_SUCH_UNIT))
    assert su.register("nope.scope", RULES, path) == "nope.scope: not a unit systemd has loaded: nothing registered"
    assert [fields[su.F_MEMBER] for fields, _body in seen] == ["GetUnit"]


def test_no_systemd_socket_is_the_one_refusal_line(tmp_path: Path) -> None:
    with pytest.raises(HookError) as caught:
        su.register("libpod-abc.scope", RULES, str(tmp_path / "absent"))
    one_line_refusal(caught.value, "libpod-abc.scope", f"cannot talk to systemd at {tmp_path / 'absent'}")


def test_a_peer_that_hangs_up_is_refused(peer: tuple) -> None:  # type: ignore[type-arg]
    path, _seen, answers = peer
    answers += [unit_path, policy("strict")]
    answers.append(lambda _s, _f, _b: b"")  # the server closes without a reply
    with pytest.raises(HookError) as caught:
        su.register("x.scope", RULES, path)
    one_line_refusal(caught.value, "x.scope", "systemd closed the connection")


@pytest.mark.parametrize("value", ["auto", "closed"])
def test_a_unit_that_is_not_a_restricted_container_scope_is_refused(peer: tuple, value: str) -> None:  # type: ignore[type-arg]
    path, seen, answers = peer
    answers += [unit_path, policy(value)]
    with pytest.raises(HookError) as caught:
        su.register("session-1.scope", RULES, path)
    one_line_refusal(caught.value, "session-1.scope", f"its DevicePolicy is '{value}', not the 'strict'")
    assert [fields[su.F_MEMBER] for fields, _body in seen] == ["GetUnit", "Get"]  # nothing set


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
        su.register("x.scope", (Rule(True, "c", 226, None, "rw"),), "/nonexistent")
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
