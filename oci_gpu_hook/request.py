"""What a container asked for, parsed strictly and resolved against the inventory.

Syntax of ``AMD_VISIBLE_DEVICES`` (and of ``dry-run --devices``):

* ``all``: every GPU of the host;
* ``none``, ``void``, empty or unset: no GPU, and then nothing is changed at all;
* otherwise a comma list of: indices (``1``), inclusive ranges (``0-3``), PCI
  addresses (``0000:23:00.0`` or ``23:00.0``), unique ids (``0x3149e0fac5157acf``
  or ``GPU-3149e0fac5157acf``).  Duplicates collapse.

Anything unknown, malformed or out of range is a :class:`HookError` that names
the bad token and says what is valid: the container must not start.
"""

from __future__ import annotations

from oci_gpu_hook.errors import HookError
from oci_gpu_hook.inventory import HEX_DIGITS, parse_pci_address

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms per container start

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from oci_gpu_hook.inventory import Gpu, Inventory

NO_GPU = frozenset({"", "none", "void"})


class Request:
    """A resolved request: where it came from, its text, and the GPUs it names."""

    __slots__ = ("gpus", "source", "value")

    def __init__(self, source: str, value: str | None, gpus: tuple[Gpu, ...]) -> None:
        self.source = source
        self.value = value
        self.gpus = gpus

    def __bool__(self) -> bool:
        return bool(self.gpus)


def env_value(env: Sequence[str] | None, name: str) -> str | None:
    """The value the container's process will see for ``name`` (the last entry wins, as in runc)."""
    prefix = name + "="
    value = None
    for entry in env or ():
        if isinstance(entry, str) and entry.startswith(prefix):
            value = entry[len(prefix):]
    return value


def from_env(env: Sequence[str] | None, names: Iterable[str], inventory: Inventory) -> Request:
    """Read the request from the container's ``process.env``."""
    found = [(name, value) for name in names if (value := env_value(env, name)) is not None]
    asking = [(name, value) for name, value in found if value.strip().lower() not in NO_GPU]
    if len(asking) > 1:
        listed = ", ".join(name for name, _ in asking)
        raise HookError(f"the container sets more than one GPU request ({listed}); set only one")
    if not asking:
        source, value = found[0] if found else ("env", None)
        return Request(source, value, ())
    name, value = asking[0]
    return Request(name, value, resolve(value, inventory, name))


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
