"""What a container asked for: qualified ``kind=name`` entries, parsed strictly, resolved per backend.

Why one module: a container can ask in three places (the orchestrator's CDI annotations, the image's or the
user's env variables, the operator's ``dry-run --devices``), and several parties may already have put devices in
its spec.  Every path that plans a container (the shim, the hooks, the resident planner, the NRI plugin) asks this
module, before and after sysfs is read, so the answer is the same whoever injects: nothing asked costs nothing,
an image never widens what the operator granted, and a device the node lacks is refused in one line rather
than half granted.  The rules:

Sources, per kind (``amd``, ``intel``, ``nvidia``):

1. CDI names in ``cdi.k8s.io/<key>`` annotations (``amd.com/gpu=1,intel.com/gpu=card0``), as the
   kubelet and device plugins write them.  When they name any device of a kind, they decide for that
   kind and its env variables are ignored.  Names of kinds no backend serves are someone else's.
2. The kind's env variables (``AMD_VISIBLE_DEVICES``, ``INTEL_VISIBLE_DEVICES``, ``NVIDIA_VISIBLE_DEVICES``;
   the last entry wins, as in runc), unless ``allow_env_requests`` is off.  At most one variable of a kind
   may ask.
3. ``dry-run --devices``, which replaces both (and is the operator's: nothing in the spec holds it back).

When the spec already carries device nodes of a kind (native CDI, ``--device``, the orchestrator; a
device counts as there when one of its own nodes is, shared ones like ``/dev/kfd`` identify none),
:func:`resolve` holds that kind to one grant, whoever injects: an env request of the kind adds nothing
(an image cannot widen what the operator granted) and is noted as ignored; annotations naming devices
of the kind must name exactly the devices there (then nothing is added twice), else the container is
refused with one line naming both sets, never given their union.

Syntax of a value: ``all``; ``none``, ``void`` or empty (no device: nothing is changed at all); else
a comma list of indices (``1``), inclusive ranges (``0-3``) and the backend's own forms (AMD: PCI
addresses, unique ids; Intel: ``cardN``, PCI addresses; NVIDIA: ``GPU-<uuid>``, PCI addresses, ``<gpu>:<mig>``,
``MIG-<uuid>``; its indices count whole GPUs).  Duplicates collapse.  Anything unknown,
malformed or out of range is a :class:`HookError` naming the bad token and what is valid.

What the node cannot serve, one rule: ``all`` in an env variable means every device of the kind this node has
now, so on a node with none of the kind (it never had one, or they have all been removed) it grants nothing of it
and is noted (one log line says the container asked for it), never refused: CUDA images carry
``NVIDIA_VISIBLE_DEVICES=all`` in their image env, and they start on an AMD, Intel or GPU-less node as they
would without this tool, with what else they ask for (``AMD_VISIBLE_DEVICES=1`` beside it) granted.  A CDI name
in a ``cdi.k8s.io`` annotation is an orchestrator's explicit name, not an image's habit: it must resolve to a
device, as containerd and podman require of the CDI names they apply themselves, so ``nvidia.com/gpu=all`` there
on a node without NVIDIA GPUs is refused like any other name of a device the node lacks (``none``, ``void`` and
empty still name no device, and names of kinds not in ``backends`` are still someone else's).  A node
whose backend sees devices of the kind but can grant none of them (a GPU the driver excluded or cannot serve, an
amdgpu device without its KFD node) is not without the kind: ``all`` is then refused with what it saw.  A name
of one device (an index, a range, a UUID, a PCI address, a CDI name, a MIG device) that the node lacks is
refused, whether the kind has other devices here or none.  A kind not in ``backends`` is not this tool's at
all: its variables and annotations are someone else's (another vendor's toolkit), read by nothing here.
"""

from __future__ import annotations

from oci_gpu_hook.errors import HookError
from oci_gpu_hook.kinds import KINDS
from oci_gpu_hook.oci_spec import environ_of

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence, Set

    from oci_gpu_hook.config import Config
    from oci_gpu_hook.inventory import Backend, Device, Inventory
    from oci_gpu_hook.oci_spec import ContainerSpec

NO_GPU = frozenset({"", "none", "void"})
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
CDI_SOURCE = "cdi.k8s.io annotations"
OPTION_SOURCE = "--devices"
BY_CDI_KIND = {cdi_kind: name for name, (cdi_kind, _env) in KINDS.items()}


class KindAsk:
    """An unresolved request of one kind: the source that decides and its entries (sysfs not read yet)."""

    __slots__ = ("kind", "note", "source", "values")

    def __init__(self, kind: str, source: str, values: list[str], note: str = "") -> None:
        self.kind = kind
        self.source = source
        self.values = values
        self.note = note

    def __repr__(self) -> str:
        return f"KindAsk({self.kind}: {self.source}={','.join(self.values)!r})"


class Request:
    """The asks of a container that count and, once resolved, the devices each kind's backend chose; ``notes``
    say what resolution set aside."""

    __slots__ = ("asks", "devices", "notes")

    def __init__(self, asks: list[KindAsk], devices: dict[str, tuple[Device, ...]] | None = None,
                 notes: tuple[str, ...] = ()) -> None:
        self.asks = asks
        self.devices = devices or {}
        self.notes = notes

    def __bool__(self) -> bool:
        return any(self.devices.values())

    @property
    def note(self) -> str:
        return "; ".join([*(a.note for a in self.asks if a.note), *self.notes])

    @property
    def source(self) -> str:
        return ", ".join(dict.fromkeys(a.source for a in self.asks if a.values)) or "none"

    @property
    def value(self) -> str | None:
        entries = [f"{KINDS[a.kind][0]}={v}" for a in self.asks for v in a.values]
        return ",".join(entries) or None


def annotation_names(annotations: Mapping[str, object] | None, kinds: Sequence[str]) -> dict[str, list[str]]:
    """Device names per backend in ``cdi.k8s.io/<key>`` annotations; a malformed entry of a served kind is an
    error, other kinds are skipped."""
    served = {KINDS[k][0]: k for k in kinds}
    names: dict[str, list[str]] = {}
    for key in sorted(annotations or {}):
        value = (annotations or {})[key]
        if not key.startswith(CDI_ANNOTATION_PREFIX) or not isinstance(value, str):
            continue
        for entry in value.split(","):
            qualified = entry.strip()
            device_kind, eq, name = qualified.partition("=")
            kind = served.get(device_kind) or next((k for c, k in served.items() if qualified.startswith(c)), None)
            if kind is None:
                continue
            if device_kind not in served or not eq or not name:
                cdi_kind = KINDS[kind][0]
                raise HookError(f"annotation {key}: '{qualified}' is not a CDI device name "
                                f"(expected {cdi_kind}=NAME, e.g. {cdi_kind}=0)")
            names.setdefault(kind, []).append(name)
    return names


def requested(env: Sequence[str] | None, annotations: Mapping[str, object] | None, config: Config) -> list[KindAsk]:
    """Which source decides for each kind, without reading sysfs; [] when nothing is asked for."""
    return _requested(environ_of(env), annotations, config)


def _requested(environ: Mapping[str, str], annotations: Mapping[str, object] | None, config: Config) -> list[KindAsk]:
    from_annotations = annotation_names(annotations, config.backends)
    asks = []
    for kind in config.backends:
        found = [(n, v) for n in config.request_env[kind] if (v := environ.get(n)) is not None]
        asking = [(n, v) for n, v in found if v.strip().lower() not in NO_GPU]
        names = from_annotations.get(kind)
        if names:
            note = f"{asking[0][0]}={asking[0][1]} ignored: annotations decide" if asking else ""
            asks.append(KindAsk(kind, CDI_SOURCE, names, note))
            continue
        if len(asking) > 1:
            raise HookError(f"the container sets more than one {kind} GPU request "
                            f"({', '.join(n for n, _ in asking)}); set only one")
        if not asking:
            continue
        name, value = asking[0]
        if not config.allow_env_requests:
            asks.append(KindAsk(kind, name, [], f"{name}={value} ignored: allow_env_requests is off, "
                                                "only annotations count"))
        else:
            asks.append(KindAsk(kind, name, [value]))
    return asks


def asks_by_default(spec: ContainerSpec) -> bool:
    """Whether ``spec`` carries a request under the default names (the default ``request_env`` variables of every
    kind, ``cdi.k8s.io`` annotations naming a known kind): :func:`requested` with the default settings.  One
    these names would refuse (two variables of a kind, a malformed annotation) counts as a request."""
    from oci_gpu_hook.config import Config

    try:
        return any(a.values for a in _requested(spec.environ, spec.annotations, Config()))
    except HookError:
        return True


def on_unusable_config(spec: ContainerSpec, problem: HookError, entry: str, cid: str | None = None) -> None:
    """The rule for a config that cannot be used (:mod:`oci_gpu_hook.config`): return after one warning line
    when ``spec`` asks for nothing under the default names (the caller then changes nothing), else raise
    ``problem``, the config's error."""
    if asks_by_default(spec):
        raise problem
    from oci_gpu_hook.log import warn

    warn(f"{problem}; the container asks for no GPU, so it starts untouched (oci-gpu-hook validate checks the "
         "config)", entry=entry, id=cid)


def parse_devices_option(text: str, kinds: Sequence[str]) -> list[KindAsk]:
    """``dry-run --devices``: ``1,3`` (the first backend's kind), or qualified ``amd.com/gpu=1,intel.com/gpu=0``
    entries (a bare entry after a qualified one belongs to the same kind)."""
    values: dict[str, list[str]] = {}
    kind = kinds[0]
    for raw in text.split(","):
        entry = raw.strip()
        prefix, eq, rest = entry.partition("=")
        if eq and (prefix in BY_CDI_KIND or prefix in KINDS):
            kind = BY_CDI_KIND.get(prefix, prefix)
            if kind not in kinds:
                raise HookError(f"--devices: the {kind} backend is not in use (backends = {list(kinds)})")
            entry = rest.strip()
        values.setdefault(kind, []).append(entry)
    return [KindAsk(k, OPTION_SOURCE, [",".join(v)]) for k, v in values.items()
            if ",".join(v).strip().lower() not in NO_GPU]


def asks_for(spec: ContainerSpec, config: Config, devices: str | None = None) -> list[KindAsk]:
    """What the container of ``spec`` asks for (:func:`requested`), or ``devices`` (``dry-run --devices``)."""
    if devices is not None:
        return parse_devices_option(devices, config.backends)
    return _requested(spec.environ, spec.annotations, config)


def resolve(asks: list[KindAsk], inventory: Inventory, present: Set[tuple[str, int, int]] = frozenset()) -> Request:
    """The devices each ask names, per kind in index order.

    ``present``: (type, major, minor) of the device nodes the spec already carries.  Per kind with devices
    there, one grant (module docstring): an env ask is set aside with a note (an image cannot widen what the
    operator granted); annotations must name exactly those devices, else a HookError naming both sets; the
    operator's ``--devices`` is not held back.
    """
    devices: dict[str, tuple[Device, ...]] = {}
    counted: list[KindAsk] = []
    notes: list[str] = []
    for ask in asks:
        held = present and ask.values and ask.source != OPTION_SOURCE
        there = _present(ask.kind, inventory.devices(ask.kind), present) if held else ()
        if there and ask.source != CDI_SOURCE:
            notes.append(f"{ask.source}={','.join(ask.values)} ignored: the container already has {ask.kind} GPUs "
                         "(CDI, --device or the orchestrator); an image's env cannot add to them")
            continue
        counted.append(ask)
        if not inventory.devices(ask.kind) and any(v.strip().lower() == "all" for v in ask.values):
            notes.append(_all_of_an_absent_kind(ask, inventory.set_aside(ask.kind)))
        named: dict[int, Device] = {}
        for value in ask.values:
            for device in select(ask.kind, value, inventory.devices(ask.kind), ask.source):
                named[device.index] = device
        if there and named and set(named) != {d.index for d in there}:
            raise HookError(
                f"{ask.source} name {_listed(ask.kind, [named[i] for i in sorted(named)])}, but the container "
                f"already has {_listed(ask.kind, there)} (CDI, --device or the orchestrator): refused, one grant "
                "whoever injects and never their union (a stale CDI spec on this node, or an orchestrator that "
                "disagrees with itself)")
        chosen = {d.index: d for d in devices.get(ask.kind, ())}
        chosen.update(named)
        devices[ask.kind] = tuple(chosen[i] for i in sorted(chosen))
    return Request(counted, devices, tuple(notes))


def _all_of_an_absent_kind(ask: KindAsk, set_aside: Sequence[tuple[str, str]]) -> str:
    """The note of an env's ``all`` of a kind the host has no device of; a HookError where it has some that cannot be
    granted (the node is not without the kind: its driver or partitions are not right), and for a CDI name in an
    annotation, which must name a device this node has (module docstring)."""
    if set_aside:
        name, why = set_aside[0]
        more = f" (and {len(set_aside) - 1} more)" if len(set_aside) > 1 else ""
        raise HookError(f"{ask.source}=all: this host's {ask.kind} GPUs cannot be granted: {name}: {why}{more}")
    if ask.source == CDI_SOURCE:
        raise HookError(f"{ask.source}=all: 'all' names no device: this host has no {ask.kind} GPUs "
                        f"({valid_values(ask.kind, (), ask.source)})")
    return f"{ask.source}=all: this host has no {ask.kind} GPUs, none granted"


def _present(kind: str, devices: tuple[Device, ...], present: Set[tuple[str, int, int]]) -> tuple[Device, ...]:
    """The devices one of whose own nodes (never a shared one) the spec already carries (the backend's
    ``present`` where its devices share nodes: an NVIDIA MIG device and its GPU)."""
    from oci_gpu_hook.inventory import backend

    return backend(kind).present(devices, present)


def _listed(kind: str, devices: Sequence[Device]) -> str:
    """``amd device 0000:23:00.0`` / ``amd devices 0000:05:00.0-p0, 0000:05:00.0-p1``: by stable name."""
    from oci_gpu_hook.inventory import stable_name

    return f"{kind} device{'s' if len(devices) != 1 else ''} {', '.join(stable_name(d) for d in devices)}"


def select(kind: str, value: str, devices: tuple[Device, ...], source: str = "request") -> tuple[Device, ...]:
    """The devices of ``kind`` that ``value`` names, in index order; () for no device (and for ``all`` where the
    host has none of the kind)."""
    from oci_gpu_hook.inventory import backend

    text = (value or "").strip()
    if text.lower() in NO_GPU:
        return ()
    module = backend(kind)
    if text.lower() == "all":
        return devices  # every one this host has: none on a host without the kind (module docstring)
    chosen: dict[int, Device] = {}
    try:
        for raw in text.split(","):
            for device in _match(raw.strip(), devices, module, kind):
                chosen[device.index] = device
    except _Bad as bad:
        token, why = bad.args
        shown = f"'{token}'" if token else "an empty entry"
        raise HookError(f"{source}={text}: {shown} {why} ({valid_values(kind, devices, source)})") from None
    return tuple(chosen[i] for i in sorted(chosen))


class _Bad(Exception):
    pass


def _match(token: str, devices: tuple[Device, ...], module: Backend, kind: str) -> tuple[Device, ...]:
    lower = token.lower()
    if lower in ("all", *NO_GPU) and token:
        raise _Bad(token, "cannot be combined with other entries")
    found = module.match(token, devices)
    if isinstance(found, str):
        raise _Bad(token, found)
    if found is not None:
        return found
    if token.isdigit() and token.isascii():
        return (devices[_index(token, devices, kind)],)
    first, dash, last = token.partition("-")
    if dash:
        if not first or not last:
            raise _Bad(token, "is not a valid range (expected FIRST-LAST, e.g. 0-3)")
        start, stop = _index(first, devices, kind), _index(last, devices, kind)
        if start > stop:
            raise _Bad(token, "is a range that runs backwards")
        return devices[start:stop + 1]
    raise _Bad(token, f"is not a GPU index, range, {module.forms}")


def _index(token: str, devices: tuple[Device, ...], kind: str) -> int:
    if not token.isdigit() or not token.isascii():
        raise _Bad(token, f"is not a {kind} GPU index")
    digits = token.lstrip("0") or "0"
    if not devices:
        raise _Bad(token, f"is out of range: this host has no {kind} GPUs")
    if len(digits) > 9 or int(digits) >= len(devices):  # length first: int() refuses 4300+ digits
        raise _Bad(token, f"is out of range (the host has {len(devices)} {kind} GPUs)")
    return int(digits)


def valid_values(kind: str, devices: tuple[Device, ...], source: str = "request") -> str:
    """What ``source`` may name of ``kind`` here: on a host without the kind, ``all`` too for an env variable (it
    grants nothing), but not for a CDI name in an annotation (it must resolve to a device)."""
    from oci_gpu_hook.inventory import backend

    if not devices:
        if source == CDI_SOURCE:
            return f"valid: none, which grants no {kind} GPU; a CDI name must name a device this host has"
        return f"valid: all or none, which grant no {kind} GPU on this host"
    last = len(backend(kind).indexed(devices)) - 1  # NVIDIA: indices count GPUs, not MIG devices
    parts = ["all", "none", f"indices 0-{last}" if last else "index 0"]
    if last:
        parts.append(f"ranges like 0-{last}")
    parts.extend(backend(kind).examples(devices))
    return "valid: " + ", ".join(parts)
