"""What a container asked for, parsed strictly and resolved against the inventory.

Syntax of ``AMD_VISIBLE_DEVICES`` (and of ``dry-run --devices``):

* ``all``: every GPU of the host;
* ``none``, ``void``, empty or unset: no GPU, and then nothing is changed at all;
* otherwise a comma list of: indices (``1``), inclusive ranges (``0-3``), PCI
  addresses (``0000:23:00.0`` or ``23:00.0``), unique ids (``0x3149e0fac5157acf``
  or ``GPU-3149e0fac5157acf``).  Duplicates collapse.

Anything unknown, malformed or out of range is a :class:`HookError` that names
the bad token and says what is valid: the container must not start.

CDI device names of our kind (``amd.com/gpu=NAME`` in ``cdi.k8s.io/*``
annotations) are resolved the same way: the names a generated CDI spec offers
(index, PCI address, unique id, ``all``) are all valid entries of this syntax.
"""

from __future__ import annotations

from oci_gpu_hook.errors import HookError
from oci_gpu_hook.inventory import HEX_DIGITS, parse_pci_address

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms per container start

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from oci_gpu_hook.inventory import Gpu, Inventory

NO_GPU = frozenset({"", "none", "void"})


class Request:
    """A resolved request: where it came from, its text, the GPUs it names, and a note for operators."""

    __slots__ = ("gpus", "note", "source", "value")

    def __init__(self, source: str, value: str | None, gpus: tuple[Gpu, ...], note: str = "") -> None:
        self.source = source
        self.value = value
        self.gpus = gpus
        self.note = note

    def __bool__(self) -> bool:
        return bool(self.gpus)


class Ask:
    """An unresolved request: the source that decides and its entries (sysfs not read yet)."""

    __slots__ = ("note", "source", "values")

    def __init__(self, source: str, values: list[str], note: str = "") -> None:
        self.source = source
        self.values = values
        self.note = note


CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"


def env_value(env: Sequence[str] | None, name: str) -> str | None:
    """The value the container's process will see for ``name`` (the last entry wins, as in runc)."""
    prefix = name + "="
    value = None
    for entry in env or ():
        if isinstance(entry, str) and entry.startswith(prefix):
            value = entry[len(prefix):]
    return value


def cdi_names(annotations: Mapping[str, object] | None, kind: str) -> list[str]:
    """Device names of ``kind`` in ``cdi.k8s.io/<key>`` annotations (``amd.com/gpu=1,amd.com/gpu=3``).

    Names of other kinds are someone else's and are skipped; a malformed entry of our kind is an error.
    """
    names: list[str] = []
    for key in sorted(annotations or {}):
        value = (annotations or {})[key]
        if not key.startswith(CDI_ANNOTATION_PREFIX) or not isinstance(value, str):
            continue
        for entry in value.split(","):
            qualified = entry.strip()
            device_kind, eq, name = qualified.partition("=")
            if device_kind == kind:
                if not eq or not name:
                    raise HookError(f"annotation {key}: '{qualified}' is not a CDI device name "
                                    f"(expected {kind}=NAME, e.g. {kind}=0)")
                names.append(name)
            elif qualified.startswith(kind) and not eq:
                raise HookError(f"annotation {key}: '{qualified}' is not a CDI device name "
                                f"(expected {kind}=NAME, e.g. {kind}=0)")
    return names


def requested(env: Sequence[str] | None, annotations: Mapping[str, object] | None, names: Iterable[str],
              kind: str, allow_env: bool) -> Ask | None:
    """Which source decides, without reading sysfs; None when no GPU is asked for.

    Precedence: CDI names in ``cdi.k8s.io/*`` annotations (written by the orchestrator) decide when
    there are any, and the env is then ignored.  Otherwise the env variables ``names`` (at most one
    may ask for GPUs), unless ``allow_env`` is off: then an env request is ignored (images can ship
    ``AMD_VISIBLE_DEVICES=all``) and only annotations count.
    """
    cdi = cdi_names(annotations, kind)
    found = [(name, value) for name in names if (value := env_value(env, name)) is not None]
    asking = [(name, value) for name, value in found if value.strip().lower() not in NO_GPU]
    if cdi:
        note = f"{asking[0][0]}={asking[0][1]} ignored: annotations decide" if asking else ""
        return Ask("cdi.k8s.io annotations", cdi, note)
    if len(asking) > 1:
        listed = ", ".join(name for name, _ in asking)
        raise HookError(f"the container sets more than one GPU request ({listed}); set only one")
    if not asking:
        return None
    name, value = asking[0]
    if not allow_env:
        return Ask(name, [], f"{name}={value} ignored: allow_env_requests is off, only annotations count")
    return Ask(name, [value])


def resolve_ask(ask: Ask, inventory: Inventory) -> Request:
    """The GPUs ``ask`` names, in index order; each entry follows the syntax of :func:`resolve`."""
    chosen: dict[int, Gpu] = {}
    for value in ask.values:
        for gpu in resolve(value, inventory, ask.source):
            chosen[gpu.index] = gpu
    return Request(ask.source, ",".join(ask.values), tuple(chosen[i] for i in sorted(chosen)), ask.note)


def resolve(value: str | None, inventory: Inventory, source: str = "request") -> tuple[Gpu, ...]:
    """The GPUs that ``value`` names, in index order; () for no GPU."""
    text = (value or "").strip()
    if text.lower() in NO_GPU:
        return ()
    gpus = inventory.gpus
    if text.lower() == "all":
        if not gpus:
            raise HookError(f"{source}=all: this host has no GPUs (valid: none)")
        return gpus
    chosen: dict[int, Gpu] = {}
    for raw in text.split(","):
        token = raw.strip()
        for gpu in _match(token, inventory, source, text):
            chosen[gpu.index] = gpu
    return tuple(chosen[i] for i in sorted(chosen))


def valid_values(inventory: Inventory) -> str:
    gpus = inventory.gpus
    if not gpus:
        return "this host has no GPUs; valid: none"
    last = len(gpus) - 1
    parts = ["all", "none", f"indices 0-{last}" if last else "index 0"]
    if last:
        parts.append(f"ranges like 0-{last}")
    parts.append(f"PCI addresses like {gpus[0].pci_address}")
    if gpus[0].unique_id is not None:
        parts.append(f"unique ids like {gpus[0].unique_id_hex}")
    return "valid: " + ", ".join(parts)


def _fail(source: str, text: str, token: str, why: str, inventory: Inventory) -> HookError:
    shown = f"'{token}'" if token else "an empty entry"
    return HookError(f"{source}={text}: {shown} {why} ({valid_values(inventory)})")


def _index(token: str, inventory: Inventory, source: str, text: str) -> int:
    if not token.isdigit() or not token.isascii():
        raise _fail(source, text, token, "is not a GPU index, range, PCI address or unique id", inventory)
    digits = token.lstrip("0") or "0"
    if len(digits) > 9 or int(digits) >= len(inventory.gpus):  # length first: int() refuses 4300+ digits
        raise _fail(source, text, token, f"is out of range (the host has {len(inventory.gpus)} GPUs)", inventory)
    return int(digits)


def _match(token: str, inventory: Inventory, source: str, text: str) -> Iterable[Gpu]:
    gpus = inventory.gpus
    lower = token.lower()
    if lower in ("all", *NO_GPU) and token:
        raise _fail(source, text, token, "cannot be combined with other entries", inventory)
    if token.isdigit():
        return (gpus[_index(token, inventory, source, text)],)
    if "-" in token and not lower.startswith("gpu-"):
        first, _, last = token.partition("-")
        if not first or not last:
            raise _fail(source, text, token, "is not a valid range (expected FIRST-LAST, e.g. 0-3)", inventory)
        start = _index(first, inventory, source, text)
        stop = _index(last, inventory, source, text)
        if start > stop:
            raise _fail(source, text, token, "is a range that runs backwards", inventory)
        return gpus[start:stop + 1]
    if ":" in token:
        address = lower if lower.count(":") == 2 else "0000:" + lower
        if parse_pci_address(address) is None:
            raise _fail(source, text, token, "is not a valid PCI address", inventory)
        for gpu in gpus:
            if gpu.pci_address.lower() == address:
                return (gpu,)
        raise _fail(source, text, token, "is not the PCI address of a GPU on this host", inventory)
    if lower.startswith(("0x", "gpu-")):
        digits = lower.partition("x")[2] if lower.startswith("0x") else lower[4:]
        if not digits or not set(digits) <= HEX_DIGITS:
            raise _fail(source, text, token, "is not a valid hex unique id", inventory)
        wanted = int(digits, 16)
        for gpu in gpus:
            if gpu.unique_id == wanted:
                return (gpu,)
        raise _fail(source, text, token, "is not the unique id of a GPU on this host", inventory)
    raise _fail(source, text, token, "is not a GPU index, range, PCI address or unique id", inventory)
