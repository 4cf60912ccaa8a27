"""Make a live grant durable under systemd: the granted devices registered with the container's own unit.

Under the systemd cgroup driver (containerd's ``SystemdCgroup = true``, ``runc --systemd-cgroup``, podman's
``cgroup_manager = "systemd"``) the container's cgroup is a transient scope (``cri-containerd-ID.scope``,
``libpod-ID.scope``) whose device rules systemd owns: ``systemctl daemon-reload``, ``daemon-reexec`` or any
``set-property`` on it makes systemd write them again from the unit's ``DeviceAllow=`` list, and a rule added to
the cgroup behind systemd's back is gone (cgroup v1: systemd writes ``a`` to ``devices.deny`` then its allow list;
v2: its eBPF program is replaced by one built from the list).  So the prestart hook adds the plan's devices to
that list first, at runtime only (``SetUnitProperties(unit, runtime=true, DeviceAllow=...)``: it vanishes with
the transient unit), and then grants them in the cgroup itself as it always did.

Paths: systemd reads ``/dev/char/MAJ:MIN`` (and ``/dev/block/MAJ:MIN``) as the numbers they name, without a stat
(``device_path_parse_major_minor`` in systemd's bpf-devices.c; checked with Debian 12's systemd 252 on nodes with
and without udev's links), so that is the path registered, whatever the node is called on the host.

Whose unit: the deepest ``*.scope`` in the container's cgroup path is only a name, which a ``cgroupsPath`` can
give any cgroup (``/x/libpod-B.scope`` for container A; a cgroup below B's scope).  Registering A's devices with
B's scope would hand them to B at its next daemon-reload.  So the unit must prove to be the container's own
before anything is set: its name ends with ``-ID.scope`` for the container's id (runc's and crun's systemd
driver name a scope ``PREFIX-NAME.scope`` after the ``slice:prefix:name`` cgroupsPath, and every runtime's NAME
is the container's id: ``cri-containerd-ID``, ``crio-ID``, ``docker-ID``, ``libpod-ID``), and its ``ControlGroup``
is the container's cgroup, or that cgroup's parent where crun put the container in a ``container`` child of its
scope (crun's default under cgroup v2).  Anything else is refused in one line, with nothing set.

The bus: systemd's private socket (``/run/systemd/private``, root only) speaks D-Bus peer to peer, so this needs
no bus daemon and no ``Hello``: EXTERNAL authentication with the caller's uid, then one method call and its
reply.  Enough of the wire format is written out here (marshalling of the few types used, little-endian) that
the per-container path imports only ``socket``, ``struct`` and ``time``, and only for a container under systemd.
The peer is read as hostile: it must be root's (``SO_PEERCRED``), the whole exchange has one deadline however it
trickles its bytes, messages and container nesting are bounded, and each reply must have the type asked for; a
peer that breaks any of it is the one refusal line, never a traceback or a hang.
"""

from __future__ import annotations

import os

from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from typing import Any

    from oci_gpu_hook.core.devices import Rule

PRIVATE_SOCKET = "/run/systemd/private"
BOOTED_MARKER = "/run/systemd/system"  # sd_booted(): systemd is the running manager
# Seconds for one whole exchange with systemd (connect, authentication, every call and the Ping), however the peer
# trickles its bytes.  The prestart hook install writes runs under the runtime's hook timeout of 10 s (hooks.d's
# "timeout": 10), which must also cover the interpreter's start, the plan, the nodes and the cgroup grant (tens of
# milliseconds: docs/speed.md), and systemd answers nothing while a daemon-reload runs.  5 s waits out a long
# reload and still leaves half of the 10 to the hook, so that a silent systemd gives this hook's one line, not the
# runtime's kill (tests/test_systemd_unit.py holds it to half the installed timeout).
TIMEOUT = 5.0
# The most containers (arrays, structs, variants) one value may be nested in: the D-Bus specification's 64 (32
# arrays and 32 structs in a signature; libdbus and GLib hold variants, whose signatures come with the data, to
# the same total).  Beyond it a peer could only be making this reader recurse without end.
MAX_DEPTH = 64
# The largest message read, far above any answer to these calls or any signal systemd sends a private connection
# (a unit's PropertiesChanged: a few KiB); the specification allows 128 MiB, which would be memory and seconds of
# decoding (a byte array is one value a byte), not an answer.
MAX_MESSAGE = 1 << 20
# crun's systemd driver puts the container's processes in this child of its scope (cgroup v2, as root: crun's
# run.oci.systemd.subgroup annotation, "container" unless set); runc puts them in the scope itself.
CRUN_SUBGROUP = "container"
SYSTEMD = "org.freedesktop.systemd1"
MANAGER_PATH = "/org/freedesktop/systemd1"
MANAGER = "org.freedesktop.systemd1.Manager"
DURABLE_PATHS = ("the spec-rewrite paths (the oci-gpu-runtime shim, podman's precreate hook, CDI) write the "
                 "devices into the container's config.json, which systemd is given at create")

NO_SUCH_UNIT = "org.freedesktop.systemd1.NoSuchUnit"

METHOD_CALL, METHOD_RETURN, ERROR, SIGNAL = 1, 2, 3, 4
# header field codes
F_PATH, F_INTERFACE, F_MEMBER, F_ERROR_NAME, F_REPLY_SERIAL, F_DESTINATION, F_SIGNATURE = 1, 2, 3, 4, 5, 6, 8


class BusError(Exception):
    """A failed exchange with systemd: ``name`` is the D-Bus error name, or '' when the connection failed."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}" if name else message)
        self.name = name


# --- which unit -----------------------------------------------------------------------------------------------

def unit_of(cgroup_dir: str) -> str | None:
    """The systemd scope whose device rules govern ``cgroup_dir``: the deepest path component named ``*.scope``
    (a sub-cgroup of a delegated scope is governed by that scope's rules too), when systemd is the running
    manager; None otherwise (cgroupfs: nothing re-applies the rules, nothing to register)."""
    scope = None
    for part in cgroup_dir.split("/"):
        if part.endswith(".scope") and len(part) > len(".scope"):
            scope = part
    if scope is None or not os.path.isdir(BOOTED_MARKER):
        return None
    return scope


def device_path(rule: Rule) -> str:
    """The DeviceAllow= path of an exact rule (see the module's text)."""
    if rule.wildcard or rule.type not in ("c", "b"):
        raise HookError(f"the device rule '{rule.v1_line()}' covers more than one device: it cannot be registered "
                        "with systemd; " + DURABLE_PATHS)
    return f"/dev/{'char' if rule.type == 'c' else 'block'}/{rule.major}:{rule.minor}"


def register(unit: str, rules: tuple[Rule, ...], cgroup: str, container_id: str,
             socket_path: str = PRIVATE_SOCKET) -> str:
    """Add ``rules`` to ``unit``'s DeviceAllow= (runtime only; only to the unit of container ``container_id``
    whose ControlGroup is ``cgroup``, the container's cgroup as ``/proc/PID/cgroup`` names it, or its parent for
    crun's ``container`` child (see the module's text); only to a unit whose DevicePolicy is ``strict``, as container
    runtimes make a restricted container's scope) and wait until systemd has applied its rules again (a ``Ping``
    sent after the call is answered only after systemd's next pass over the cgroups it must realize); one line for
    the log.  A HookError (one line: what was refused and why) when it cannot."""
    entries = [(device_path(rule), rule.access) for rule in rules if rule.allow]
    if not entries:
        return "nothing to register"
    name = one_line(unit)  # a cgroup name may hold any character but '/'
    try:
        with Connection(socket_path) as bus:
            try:
                (path,) = bus.call(MANAGER_PATH, MANAGER, "GetUnit", "s", [unit], "o")
            except BusError as err:
                if err.name != NO_SUCH_UNIT:
                    raise
                # A cgroup named like a scope that systemd does not have (a cgroupfs runtime's choice of name):
                # systemd has no rules of its own to apply there, so there is nothing to register.
                return f"{name}: not a unit systemd has loaded: nothing registered"
            # Another container's unit is not this one's to extend (see the module's text).
            if not unit.endswith(f"-{container_id}.scope"):
                raise NotTheContainers(f"its name does not end with '-{container_id}.scope' (the container's id)")
            control = _string_property(bus, path, "ControlGroup")
            if not control.startswith("/") or cgroup not in (control, f"{control}/{CRUN_SUBGROUP}"):
                raise NotTheContainers(f"its ControlGroup is {shown(control)}, and the container's cgroup is neither "
                                       f"it nor its '{CRUN_SUBGROUP}' child (crun's)")
            # The unit must be what runc (or crun) made for a container with restricted devices: one DeviceAllow=
            # entry would restrict a unit that restricts nothing (DevicePolicy=auto and no list).
            policy = _string_property(bus, path, "DevicePolicy")
            if policy != "strict":
                raise BusError("", f"its DevicePolicy is {shown(policy)}, not the 'strict' of a container runtime's "
                                   "scope with restricted devices")
            bus.call(MANAGER_PATH, MANAGER, "SetUnitProperties", "sba(sv)",
                     [unit, True, [("DeviceAllow", ("a(ss)", entries))]], "")
            bus.call(MANAGER_PATH, "org.freedesktop.DBus.Peer", "Ping", "", [], "")
    except NotTheContainers as err:
        raise HookError(f"the container's cgroup {shown(cgroup)} lies in systemd unit {name}, which is not the "
                        f"container's own: {err}; registering its devices there would give them to that unit at "
                        "the next daemon-reload: refusing the live grant") from None
    except BusError as err:
        raise HookError(f"the container's cgroup is systemd unit {name}, but its devices cannot be registered with "
                        f"systemd ({err}), so the next daemon-reload would take them away: refusing the live "
                        f"grant; {DURABLE_PATHS}") from None
    return f"{name}: DeviceAllow {' '.join(path for path, _access in entries)}"


class NotTheContainers(Exception):
    """The unit named by the container's cgroup path is not provably the container's (why, in one line)."""


def shown(text: str, limit: int = 120) -> str:
    """A string from the peer, quoted on one line and cut to ``limit`` characters."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def one_line(text: str, limit: int = 200) -> str:
    """A string from the peer as it may go into the one line: no control characters, cut to ``limit``."""
    return "".join(c if c.isprintable() else "?" for c in text[:limit]) + ("..." if len(text) > limit else "")


def _string_property(bus: Connection, path: str, name: str) -> str:
    """The scope property ``name``, which must be a string."""
    ((signature, value),) = bus.call(path, "org.freedesktop.DBus.Properties", "Get", "ss",
                                     [SYSTEMD + ".Scope", name], "v")
    if signature != "s":
        raise BusError("", f"the unit's {name} has the type {shown(signature)}, not a string")
    return str(value)


def device_allow(unit: str, socket_path: str = PRIVATE_SOCKET) -> list[tuple[str, str]]:
    """``unit``'s DeviceAllow= list as systemd has it (a BusError when systemd cannot say)."""
    with Connection(socket_path) as bus:
        (path,) = bus.call(MANAGER_PATH, MANAGER, "GetUnit", "s", [unit], "o")
        interface = SYSTEMD + (".Scope" if unit.endswith(".scope") else
                               ".Slice" if unit.endswith(".slice") else ".Service")
        (value,) = bus.call(path, "org.freedesktop.DBus.Properties", "Get", "ss", [interface, "DeviceAllow"], "v")
    signature, entries = value
    if signature != "a(ss)":
        raise BusError("", f"DeviceAllow of {unit} has the type {shown(signature)}, not a(ss)")
    return [tuple(entry) for entry in entries]  # type: ignore[misc]


# --- the connection ------------------------------------------------------------------------------------------

class Connection:
    """A peer-to-peer D-Bus connection to systemd's private socket (a context manager); everything on it, from the
    connect to the last reply, within one deadline ``timeout`` seconds away."""

    def __init__(self, socket_path: str = PRIVATE_SOCKET, timeout: float | None = None) -> None:
        import socket
        import struct
        import time

        self.serial = 0
        self.buffer = bytearray()
        self.timeout = TIMEOUT if timeout is None else timeout
        self.deadline = time.monotonic() + self.timeout
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self._within()
            self.sock.connect(socket_path)
            # systemd (PID 1) is root; a socket another uid listens on is not systemd, whatever it answers (the
            # credentials are the listener's, recorded by the kernel when it called listen()).
            _pid, uid, _gid = struct.unpack("3i", self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                       struct.calcsize("3i")))
            if uid != 0:
                raise BusError("", f"{socket_path} is served by uid {uid}, not by root: it is not systemd")
            # EXTERNAL authentication by the uid the kernel vouches for; BEGIN right after it (the server takes
            # what follows BEGIN as the message stream), so that the whole exchange is one round trip per call.
            uid_hex = str(os.geteuid()).encode().hex().encode()
            self._send(b"\0AUTH EXTERNAL " + uid_hex + b"\r\nBEGIN\r\n")
            line = self._line()
            if not line.startswith(b"OK "):
                raise BusError("", f"{socket_path} refused authentication: {shown(line.decode(errors='replace'))}")
        except OSError as err:
            self.sock.close()
            raise BusError("", f"cannot talk to systemd at {socket_path}: {self._why(err)}") from None
        except BusError:
            self.sock.close()
            raise

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.sock.close()

    def _within(self) -> None:
        """The socket's timeout set to what is left of the deadline; a BusError once it has passed."""
        import time

        left = self.deadline - time.monotonic()
        if left <= 0:
            raise BusError("", f"systemd did not answer within {self.timeout:g} s")
        self.sock.settimeout(left)

    def _why(self, err: OSError) -> str:
        if isinstance(err, TimeoutError):
            return f"no answer within {self.timeout:g} s"
        return err.strerror or str(err)

    def _send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            self._within()
            try:
                sent = self.sock.send(view)
            except OSError as err:
                raise BusError("", f"cannot send to systemd: {self._why(err)}") from None
            view = view[sent:]

    def _recv(self) -> None:
        self._within()
        try:
            data = self.sock.recv(65536)
        except OSError as err:  # a timeout too
            raise BusError("", f"no answer from systemd: {self._why(err)}") from None
        if not data:
            raise BusError("", "systemd closed the connection")
        self.buffer += data

    def _line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            if len(self.buffer) > 4096:
                raise BusError("", "systemd's authentication answer is too long")
            self._recv()
        line, _sep, rest = bytes(self.buffer).partition(b"\r\n")
        self.buffer = bytearray(rest)
        return line

    def _take(self, count: int) -> bytes:
        while len(self.buffer) < count:
            self._recv()
        data = bytes(self.buffer[:count])
        del self.buffer[:count]
        return data

    def call(self, path: str, interface: str, member: str, signature: str, args: list[Any],
             reply_signature: str) -> list[Any]:
        """One method call; its reply's values, which must be of ``reply_signature`` (a BusError for an error
        reply, or for a reply of another type)."""
        self.serial += 1
        serial = self.serial
        body = marshal(signature, args) if signature else b""
        fields = [(F_PATH, ("o", path)), (F_INTERFACE, ("s", interface)), (F_MEMBER, ("s", member)),
                  (F_DESTINATION, ("s", SYSTEMD))]
        if signature:
            fields.append((F_SIGNATURE, ("g", signature)))
        header = marshal("yyyyuua(yv)", [ord("l"), METHOD_CALL, 0, 1, len(body), serial, fields])
        header += b"\0" * (-len(header) % 8)
        self._send(header + body)
        while True:
            kind, fields_got, body_got = self._message()
            if fields_got.get(F_REPLY_SERIAL) != serial or kind not in (METHOD_RETURN, ERROR):
                continue  # a signal (systemd sends them to every private connection) or another reply
            got = fields_got.get(F_SIGNATURE, "")
            if kind == METHOD_RETURN and got != reply_signature:
                raise BusError("", f"systemd answered {member} with values of type {shown(got)}, not "
                                   f"{reply_signature!r}")
            values = unmarshal(got, body_got) if got else []
            if kind == ERROR:
                message = values[0] if values and isinstance(values[0], str) else "(no message)"
                raise BusError(one_line(str(fields_got.get(F_ERROR_NAME, "?"))), one_line(message))
            return values

    def _message(self) -> tuple[int, dict[int, Any], bytes]:
        """The next message: its type, its header fields (those this client reads, of their types) and body."""
        import struct

        fixed = self._take(16)
        if fixed[:1] != b"l":
            raise BusError("", "systemd sent a big-endian message, which this client does not read")
        if fixed[3] != 1:
            raise BusError("", f"systemd sent a message of protocol version {fixed[3]}, not 1")
        kind, body_len, _serial, fields_len = fixed[1], *struct.unpack_from("<III", fixed, 4)
        if 16 + fields_len + body_len > MAX_MESSAGE:
            raise BusError("", f"systemd sent a message of {16 + fields_len + body_len} bytes, more than any "
                               f"answer ({MAX_MESSAGE})")
        rest = self._take(fields_len + (-(16 + fields_len) % 8) + body_len)
        (fields,) = unmarshal("a(yv)", fixed[12:16] + rest[:fields_len], start=12)
        got = {}
        for code, (signature, value) in fields:
            wanted = HEADER_TYPES.get(code)
            if wanted is not None and signature != wanted:
                raise BusError("", f"systemd sent header field {code} of type {shown(signature)}, not {wanted!r}")
            got[code] = value
        return kind, got, rest[len(rest) - body_len:]


HEADER_TYPES = {F_PATH: "o", F_INTERFACE: "s", F_MEMBER: "s", F_ERROR_NAME: "s", F_REPLY_SERIAL: "u",
                F_DESTINATION: "s", F_SIGNATURE: "g"}


# --- the wire format (the types used here, little-endian) -----------------------------------------------------

ALIGN = {"y": 1, "b": 4, "n": 2, "q": 2, "i": 4, "u": 4, "x": 8, "t": 8, "s": 4, "o": 4, "g": 1, "a": 4, "(": 8,
         "v": 1}
FIXED = {"y": "B", "b": "I", "n": "h", "q": "H", "i": "i", "u": "I", "x": "q", "t": "Q"}


def split_types(signature: str) -> list[str]:
    """``"sba(sv)"`` -> ``["s", "b", "a(sv)"]``."""
    types, i = [], 0
    while i < len(signature):
        j = _type_end(signature, i)
        types.append(signature[i:j])
        i = j
    return types


def _type_end(signature: str, i: int) -> int:
    if i >= len(signature):
        raise BusError("", f"truncated signature {signature!r}")
    char = signature[i]
    if char == "a":
        return _type_end(signature, i + 1)
    if char == "(":
        if signature[i + 1:i + 2] == ")":
            raise BusError("", f"signature {signature!r} has an empty struct, which D-Bus does not allow")
        i += 1
        while signature[i:i + 1] != ")":
            i = _type_end(signature, i)
        return i + 1
    if char in ALIGN:
        return i + 1
    raise BusError("", f"signature {signature!r} has a type this client does not handle: {char!r}")


def marshal(signature: str, values: list[Any]) -> bytes:
    out = bytearray()
    for kind, value in zip(split_types(signature), values, strict=True):
        _put(out, kind, value)
    return bytes(out)


def _put(out: bytearray, kind: str, value: Any) -> None:
    import struct

    out += b"\0" * (-len(out) % ALIGN[kind[0]])
    code = kind[0]
    if code in FIXED:
        out += struct.pack("<" + FIXED[code], int(value))
    elif code in "so":
        data = value.encode()
        out += struct.pack("<I", len(data)) + data + b"\0"
    elif code == "g":
        data = value.encode()
        out += bytes([len(data)]) + data + b"\0"
    elif code == "v":
        inner, inner_value = value
        _put(out, "g", inner)
        _put(out, inner, inner_value)
    elif code == "(":
        for member, member_value in zip(split_types(kind[1:-1]), value, strict=True):
            _put(out, member, member_value)
    elif code == "a":
        element = kind[1:]
        at = len(out)
        out += b"\0\0\0\0"
        out += b"\0" * (-len(out) % ALIGN[element[0]])
        start = len(out)
        for item in value:
            _put(out, element, item)
        struct.pack_into("<I", out, at, len(out) - start)


def unmarshal(signature: str, data: bytes, start: int = 0) -> list[Any]:
    """The values of ``signature`` in ``data`` (``start``: the offset ``data[0]`` has in its message, for
    alignment)."""
    reader = _Reader(data, start)
    return [reader.get(kind) for kind in split_types(signature)]


class _Reader:
    def __init__(self, data: bytes, start: int) -> None:
        self.data, self.start, self.pos = data, start, 0
        self.depth = 0  # the containers around the value being read, variants included

    def _align(self, size: int) -> None:
        self.pos += -(self.start + self.pos) % size

    def _bytes(self, count: int) -> bytes:
        if self.pos + count > len(self.data):
            raise BusError("", "systemd sent a truncated message")
        chunk = self.data[self.pos:self.pos + count]
        self.pos += count
        return chunk

    def get(self, kind: str) -> Any:
        code = kind[0]
        if code not in "a(v":
            return self._get_basic(code)
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise BusError("", f"systemd sent a value nested deeper than the {MAX_DEPTH} containers D-Bus allows")
        try:
            return self._get_container(kind)
        finally:
            self.depth -= 1

    def _get_basic(self, code: str) -> Any:
        import struct

        self._align(ALIGN[code])
        if code in FIXED:
            size = struct.calcsize("<" + FIXED[code])
            (value,) = struct.unpack("<" + FIXED[code], self._bytes(size))
            return bool(value) if code == "b" else value
        if code in "so":
            (length,) = struct.unpack("<I", self._bytes(4))
            text = self._bytes(length + 1)[:-1]
            return text.decode(errors="replace")
        # "g"
        length = self._bytes(1)[0]
        return self._bytes(length + 1)[:-1].decode(errors="replace")

    def _get_container(self, kind: str) -> Any:
        import struct

        code = kind[0]
        self._align(ALIGN[code])
        if code == "v":
            inner = self.get("g")
            types = split_types(inner)
            if len(types) != 1:
                raise BusError("", f"a variant holds {shown(inner)}, not one type")
            return (inner, self.get(inner))
        if code == "(":
            return tuple(self.get(member) for member in split_types(kind[1:-1]))
        # an array: its byte length, then (aligned to the element) the elements
        (length,) = struct.unpack("<I", self._bytes(4))
        self._align(ALIGN[kind[1]])
        end = self.pos + length
        if end > len(self.data):
            raise BusError("", "systemd sent a truncated array")
        items = []
        while self.pos < end:
            items.append(self.get(kind[1:]))
        if self.pos != end:
            raise BusError("", "systemd sent an array whose last element overruns it")
        return items
