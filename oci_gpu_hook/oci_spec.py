"""A container's config.json, read as the runtime reads it, into one value: :class:`ContainerSpec`.

:func:`loads` refuses what runc would read otherwise than Python (Go's key folding, repeated keys);
:class:`ContainerSpec` then holds what every stage of a request needs, read once: ``process.env``,
``annotations``, the device nodes already there (``linux.devices``), ``root.path`` and runc's reading
of ``linux.resources.devices``.  The spec-rewrite applier edits :attr:`ContainerSpec.raw` in place.

With :mod:`oci_gpu_hook.oci_argv` (the runtime's command line) and :mod:`oci_gpu_hook.oci_state` (the hooks' state
JSON), the OCI input as runc reads it: three modules beside the package's others, not a package of their own,
because every container start would pay for opening one more directory (measured ~80 µs).
"""

from __future__ import annotations

import os

from oci_gpu_hook import fastjson
from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from oci_gpu_hook.core.rules import Policy


# annotations that name a container, most specific first: CRI-O's id, containerd's CRI and the kubelet's names
NAME_ANNOTATIONS = ("io.kubernetes.cri-o.ContainerID", "io.kubernetes.cri.container-name",
                    "io.kubernetes.container.name")


class ContainerSpec:
    """One config.json, checked where the request path reads it: ``env`` (``process.env``, empty when absent) and
    ``environ`` (the values its process sees, by name), ``annotations`` (empty when absent), ``present`` ((type,
    major, minor) of every well-formed ``linux.devices`` entry) and ``raw``, the parsed document itself. The
    rules and ``root.path`` are read on demand: a container that asks for nothing never needs them."""

    __slots__ = ("annotations", "env", "environ", "present", "raw")

    def __init__(self, raw: Any) -> None:
        self.raw: dict[str, Any] = check_object(raw)
        self.env: list[str] = process_env(self.raw)
        self.environ = environ_of(self.env)  # what the process sees, by name
        self.annotations: dict[str, Any] = field(self.raw, "annotations", dict, "annotations", create=False) or {}
        self.present: frozenset[tuple[str, int, int]] = _device_numbers(self.raw)

    @classmethod
    def parse(cls, text: str) -> ContainerSpec:
        """The spec of config.json text, as runc reads it (:func:`loads`)."""
        return cls(loads(text))

    @classmethod
    def read(cls, path: str) -> ContainerSpec:
        return cls.parse(read_text(path))

    def name(self) -> str | None:
        """What names the container in a spec that carries no id of its own (podman's precreate input): the first of
        :data:`NAME_ANNOTATIONS` that the spec holds, else its ``hostname`` (podman's default is the first 12
        characters of the container's id, as ``podman ps`` shows it), else None.  For log lines only."""
        for key in NAME_ANNOTATIONS:
            value = self.annotations.get(key)
            if isinstance(value, str) and value:
                return value
        hostname = self.raw.get("hostname")
        return hostname if isinstance(hostname, str) and hostname else None

    def root(self, bundle: str) -> str:
        """``root.path``, made absolute against the bundle as the runtime does."""
        root = self.raw.get("root")
        path = root.get("path") if isinstance(root, dict) else None
        if not isinstance(path, str) or not path:
            raise HookError(f"{bundle}/config.json has no root.path")
        return os.path.normpath(os.path.join(bundle, path))

    def device_rules(self, create: bool = False) -> list[Any]:
        """``linux.resources.devices`` (the list itself; made when ``create``), every entry an object."""
        linux = field(self.raw, "linux", dict, "linux", create=create)
        resources = None if linux is None else field(linux, "resources", dict, "linux.resources", create=create)
        rules = None if resources is None else field(resources, "devices", list, "linux.resources.devices",
                                                     create=create)
        if rules is None:
            return []
        if not all(isinstance(entry, dict) for entry in rules):
            raise HookError("config.json: linux.resources.devices holds a non-object entry")
        return rules

    def policy(self) -> Policy:
        """runc's reading of the container's device rules (:class:`oci_gpu_hook.core.rules.Policy`)."""
        from oci_gpu_hook.core.devices import Rule
        from oci_gpu_hook.core.rules import Policy

        return Policy.of(Rule.from_oci(entry) for entry in self.device_rules())


def field(parent: dict[str, Any], key: str, kind: type, where: str, create: bool) -> Any:
    """``parent[key]`` checked to be a ``kind`` (None when absent, or made when ``create``)."""
    value = parent.get(key)
    if value is None:
        if not create:
            return None
        value = parent[key] = kind()
    if not isinstance(value, kind):
        raise HookError(f"config.json: {where} is not {'a list' if kind is list else 'an object'}")
    return value


def check_object(spec: Any) -> dict[str, Any]:
    if not isinstance(spec, dict):
        raise HookError("config.json: the top level is not a JSON object")
    return spec


def process_env(spec: Any) -> list[str]:
    """``process.env`` of the spec (empty when absent)."""
    process = field(check_object(spec), "process", dict, "process", create=False)
    env = field(process, "env", list, "process.env", create=False) if process else None
    if env and not all(isinstance(entry, str) for entry in env):
        raise HookError("config.json: process.env holds a value that is not a string")
    return env or []


def environ_of(env: Sequence[str] | None) -> dict[str, str]:
    """The environment the container's process will see, ``NAME=VALUE`` entries by name: the last entry of a name
    wins, as in runc; an entry without ``=`` sets nothing."""
    environ: dict[str, str] = {}
    for entry in env or ():
        if isinstance(entry, str):
            name, eq, value = entry.partition("=")
            if eq:
                environ[name] = value
    return environ


def env_value(env: Sequence[str] | None, name: str) -> str | None:
    """The value the container's process will see for ``name`` (the last entry wins, as in runc)."""
    return environ_of(env).get(name)


def _device_numbers(spec: dict[str, Any]) -> frozenset[tuple[str, int, int]]:
    linux = spec.get("linux")
    devices = linux.get("devices") if isinstance(linux, dict) else None
    found = set()
    for entry in devices if isinstance(devices, list) else ():
        if isinstance(entry, dict) and entry.get("type") in ("c", "b", "u") and all(
                isinstance(entry.get(k), int) and not isinstance(entry.get(k), bool) for k in ("major", "minor")):
            found.add(("c" if entry["type"] == "u" else entry["type"], entry["major"], entry["minor"]))
    return frozenset(found)


# How Go's encoding/json (runc, containerd, podman) matches an object key to a struct field: case-insensitively,
# with Unicode simple folding, under which the only non-ASCII letters equal to ASCII ones are U+017F (long s ~ s)
# and U+212A (Kelvin sign ~ k).  Two keys that fold alike both land in the same field (an object value is
# decoded into it twice: the fields of both are merged); Python would keep them apart.
def go_fold(key: str) -> str:
    return key.lower() if key.isascii() else key.lower().replace("\u017f", "s")


# The struct levels the hook reads or writes, with the spellings of the runtime spec: a key that Go would take
# for one of these fields must be spelled exactly so.
_FIELDS = {
    "": ("ociVersion", "process", "root", "hostname", "domainname", "mounts", "hooks", "annotations", "linux"),
    "process": ("terminal", "user", "cwd", "env", "args", "capabilities", "rlimits", "noNewPrivileges"),
    "root": ("path", "readonly"),
    "linux": ("devices", "resources", "maskedPaths", "readonlyPaths", "cgroupsPath", "namespaces", "sysctl",
              "seccomp", "uidMappings", "gidMappings", "rootfsPropagation", "mountLabel"),
    "linux.resources": ("devices", "memory", "cpu", "pids", "blockIO", "hugepageLimits", "network", "rdma",
                        "unified"),
    "hooks": ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"),
    "hooks.createRuntime[]": ("path", "args", "env", "timeout"),
    "linux.devices[]": ("path", "type", "major", "minor", "fileMode", "uid", "gid"),
    "linux.resources.devices[]": ("allow", "type", "major", "minor", "access"),
}
_FOLDED = {level: {go_fold(name): name for name in names} for level, names in _FIELDS.items()}
# Objects decoded into Go maps, whose keys are case-sensitive: only exact repeats are ambiguous there.
_MAP_FIELDS = frozenset({"annotations", "sysctl", "unified"})


def _pairs(collisions: list[tuple[dict[str, Any], list[str]]]) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(items)
        if len(obj) != len(items):
            seen: set[str] = set()
            for key, _ in items:
                if key in seen:
                    break
                seen.add(key)
            raise fastjson.Refused(f"repeats the key {key!r} in one object "
                                   "(runc would merge or override the two; refusing the ambiguity)")
        if len(obj) > 1:
            folded = {go_fold(key) for key in obj}
            if len(folded) != len(obj):
                collisions.append((obj, list(obj)))
        return obj
    return pairs


def _where(path: list[str]) -> str:
    return ".".join(path).replace(".[", "[") or "the top level"


def _check_case(spec: Any, collisions: list[tuple[dict[str, Any], list[str]]]) -> None:
    """Refuse keys that runc reads as another: two keys of one struct that fold alike, or a known field spelled
    in another case.  Raises fastjson.Refused."""
    if collisions:
        suspects = {id(obj): keys for obj, keys in collisions}
        stack: list[tuple[Any, list[str]]] = [(spec, [])]
        while stack:
            value, path = stack.pop()
            if isinstance(value, dict):
                keys = suspects.get(id(value))
                if keys is not None and not (path and go_fold(path[-1]) in _MAP_FIELDS):
                    first: dict[str, str] = {}
                    for key in keys:
                        other = first.setdefault(go_fold(key), key)
                        if other != key:
                            raise fastjson.Refused(
                                f"has both {other!r} and {key!r} in {_where(path)}: runc reads them as one field "
                                "(Go matches keys without regard to case); refusing the ambiguity")
                stack.extend((child, [*path, key]) for key, child in value.items())
            elif isinstance(value, list):
                stack.extend((child, [*path, f"[{i}]"]) for i, child in enumerate(value))
    for level, known in _FOLDED.items():
        for obj in _objects(spec, level):
            for key in obj:
                canonical = known.get(go_fold(key))
                if canonical is not None and canonical != key:
                    where = level.replace("[]", "[...]") or "the top level"
                    raise fastjson.Refused(f"spells {where}'s {canonical!r} as {key!r}: runc reads it as "
                                           f"{canonical!r}; refusing the ambiguity")


def _objects(spec: Any, level: str) -> list[dict[str, Any]]:
    """The objects at ``level`` ("linux.resources", "linux.devices[]": each object of that list)."""
    objects = [spec]
    for name in level.split(".") if level else ():
        each = name.endswith("[]")
        found = [obj.get(name.removesuffix("[]")) for obj in objects if isinstance(obj, dict)]
        objects = [item for value in found if isinstance(value, list) for item in value] if each else found
    return [obj for obj in objects if isinstance(obj, dict)]


def loads(text: str) -> Any:
    """Parse config.json text as runc reads it, or a HookError saying why not.

    Refused, each with one line: a key repeated in one object (Go merges the two values of a struct field, Python
    keeps the last), two keys of one struct that differ only in case or that name a field in another case (Go
    matches field names case-insensitively), text that is not UTF-8, numbers no 64-bit float holds and integers
    of thousands of digits, nesting deeper than the interpreter can read.
    """
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: bytes that were not UTF-8, decoded with surrogateescape
            raise HookError("config.json is not UTF-8 text") from None
    collisions: list[tuple[dict[str, Any], list[str]]] = []
    try:
        spec = fastjson.loads(text, _pairs(collisions))
        _check_case(spec, collisions)
    except ValueError as err:
        raise HookError(f"config.json {err}" if isinstance(err, fastjson.Refused) else f"config.json is {err}") \
            from None
    return spec


def read_text(path: str) -> str:
    """The text of the file at ``path``; a FIFO, socket or device is refused unopened (its open could block or
    act), as the native front hands it over unopened (:func:`oci_gpu_hook.trust.read_regular`)."""
    from oci_gpu_hook.trust import read_regular

    try:
        return read_regular(path).decode("utf-8")
    except OSError as err:
        raise HookError(f"cannot read {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise HookError(f"{path} is not UTF-8 text") from None


def config_file(target: str) -> str:
    """The config.json of a bundle directory, or ``target`` itself (a config file)."""
    return os.path.join(target, "config.json") if os.path.isdir(target) else target


def load_document(path: str) -> Any:
    """The parsed config.json at ``path``, with the same refusals as every other entry point, naming ``path``."""
    try:
        return loads(read_text(path))
    except HookError as err:
        raise HookError(f"{path}: {err}") from None

