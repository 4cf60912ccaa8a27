"""Device nodes and device cgroup rules: the model every other part speaks.

As in runc's ``devices`` package, a node *is* its rule plus where and how to make
it: :meth:`Node.rule` is the only place a cgroup rule is derived from a node.
``None`` as a major or minor means any (``*``).
"""

from __future__ import annotations

from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from typing import Any

ACCESS_ORDER = "rwm"


def normalize_access(access: str) -> str:
    """``"mwr"`` -> ``"rwm"``: each letter once, in the kernel's order; a HookError for anything else."""
    if not isinstance(access, str) or not set(access) <= set(ACCESS_ORDER):
        raise HookError(f"device access {access!r} is not made of r, w and m")
    return "".join(letter for letter in ACCESS_ORDER if letter in access)


class Rule:
    """A device cgroup rule: allow or deny ``type major:minor access`` (type ``a`` = any)."""

    __slots__ = ("access", "allow", "major", "minor", "type")

    def __init__(self, allow: bool, type: str, major: int | None, minor: int | None, access: str) -> None:
        self.allow = allow
        self.type = type
        self.major = major
        self.minor = minor
        self.access = normalize_access(access)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Rule) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    def __repr__(self) -> str:
        return f"Rule({'allow' if self.allow else 'deny'} {self.v1_line()})"

    def key(self) -> tuple[bool, str, int | None, int | None, str]:
        return (self.allow, self.type, self.major, self.minor, self.access)

    @property
    def wildcard(self) -> bool:
        """Does this rule cover more than one device?"""
        return self.type == "a" or self.major is None or self.minor is None

    def v1_line(self) -> str:
        """``c 226:128 rwm``, the cgroup v1 ``devices.allow``/``devices.deny`` format."""
        major = "*" if self.major is None else str(self.major)
        minor = "*" if self.minor is None else str(self.minor)
        return f"{self.type} {major}:{minor} {self.access}"

    def to_oci(self) -> dict[str, Any]:
        """The ``linux.resources.devices`` entry."""
        rule: dict[str, Any] = {"allow": self.allow, "type": self.type}
        if self.major is not None:
            rule["major"] = self.major
        if self.minor is not None:
            rule["minor"] = self.minor
        rule["access"] = self.access
        return rule

    @classmethod
    def from_oci(cls, entry: Any) -> Rule:
        """A ``linux.resources.devices`` entry as runc reads it: type and access default to all; a
        missing or -1 major/minor means any.  Anything runc would refuse is a HookError."""
        if not isinstance(entry, dict):
            raise HookError(f"config.json: linux.resources.devices has a non-object entry {entry!r}")
        kind, access = entry.get("type") or "a", entry.get("access") or "rwm"
        numbers = [entry.get("major"), entry.get("minor")]
        if (not isinstance(entry.get("allow", False), bool) or kind not in ("a", "b", "c")
                or not isinstance(access, str) or not set(access) <= set(ACCESS_ORDER)
                or not all(n is None or (isinstance(n, int) and not isinstance(n, bool) and -1 <= n < 1 << 32)
                           for n in numbers)):
            raise HookError(f"config.json: linux.resources.devices has a malformed entry {entry!r}")
        major, minor = (None if n is None or n == -1 else n for n in numbers)
        if kind == "a":  # runc: type a means every device, whatever numbers are given
            major = minor = None
        return cls(bool(entry.get("allow")), kind, major, minor, access)

    @classmethod
    def from_v1_line(cls, allow: bool, line: str) -> Rule:
        """Parse ``c 226:128 rwm`` (a ``devices.list`` line)."""
        parts = line.split()
        if len(parts) != 3 or parts[0] not in ("a", "b", "c") or ":" not in parts[1]:
            raise HookError(f"not a device cgroup line: {line!r}")
        major, _, minor = parts[1].partition(":")
        try:
            numbers = [None if n == "*" else int(n) for n in (major, minor)]
        except ValueError:
            raise HookError(f"not a device cgroup line: {line!r}") from None
        return cls(allow, parts[0], numbers[0], numbers[1], parts[2])

    def covers(self, type: str, major: int, minor: int) -> bool:
        """Does this rule match device ``type major:minor``?"""
        return ((self.type == "a" or self.type == type)
                and (self.major is None or self.major == major)
                and (self.minor is None or self.minor == minor))

    def contains(self, other: Rule) -> bool:
        """Does every device ``other`` matches also match this rule (whatever the access)?"""
        return ((self.type == "a" or self.type == other.type)
                and (self.major is None or self.major == other.major)
                and (self.minor is None or self.minor == other.minor))


class Node:
    """A device node a container may be given: where, which device, and the mode and owner it is made with."""

    __slots__ = ("file_mode", "gid", "major", "minor", "path", "type", "uid")

    def __init__(self, path: str, type: str, major: int, minor: int, file_mode: int = 0o666, uid: int = 0,
                 gid: int = 0) -> None:
        self.path = path
        self.type = type
        self.major = major
        self.minor = minor
        self.file_mode = file_mode
        self.uid = uid
        self.gid = gid

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Node) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    def __repr__(self) -> str:
        return f"Node({self.path!r}, {self.type} {self.major}:{self.minor})"

    def key(self) -> tuple[str, str, int, int, int, int, int]:
        return (self.path, self.type, self.major, self.minor, self.file_mode, self.uid, self.gid)

    @property
    def number(self) -> tuple[str, int, int]:
        return (self.type, self.major, self.minor)

    def made(self, file_mode: int, uid: int, gid: int) -> Node:
        """The same device with the mode and owner the container gets it with."""
        return Node(self.path, self.type, self.major, self.minor, file_mode, uid, gid)

    def rule(self, access: str) -> Rule:
        """The cgroup rule that lets a container use this node: the one place a node becomes a rule."""
        return Rule(True, self.type, self.major, self.minor, access)

    def to_oci(self) -> dict[str, Any]:
        """The ``linux.devices`` entry (fileMode is a decimal number in JSON)."""
        return {"path": self.path, "type": self.type, "major": self.major, "minor": self.minor,
                "fileMode": self.file_mode, "uid": self.uid, "gid": self.gid}

    def to_cdi(self, access: str) -> dict[str, Any]:
        """The CDI ``deviceNodes`` entry."""
        return {"path": self.path, "type": self.type, "major": self.major, "minor": self.minor,
                "fileMode": self.file_mode, "permissions": access, "uid": self.uid, "gid": self.gid}
