"""JSON for the per-container path without importing :mod:`json`.

``import json`` pulls in ``re`` and ``enum`` and costs about 14 ms on these
machines, which is as much as the whole start-up budget of a hook.  The C
scanner and encoder behind :mod:`json` live in the ``_json`` extension and
need none of that, so the hot path drives them directly.  Output is compact
(``,`` and ``:`` separators); pretty printing is left to the non-hot commands,
which use :mod:`json` itself.
"""

from __future__ import annotations

import _json

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, ClassVar

_WHITESPACE = " \t\n\r"


def _reject_constant(name: str) -> float:
    raise ValueError(f"JSON constant {name} is not allowed")


class Refused(ValueError):
    """Valid JSON that this reader will not take (numbers out of range, too deep, a hook's objection):
    the message says why, with no second parse to explain it."""


_INT_DIGITS = 4000  # below CPython's int-conversion limit (4300 digits), which raises a bare ValueError


def _parse_int(text: str) -> int:
    if len(text) > _INT_DIGITS:
        raise Refused(f"holds an integer of {len(text)} digits (at most {_INT_DIGITS} are read)")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if value - value != 0.0:  # inf: no JSON and no Go float64 holds it
        raise Refused(f"holds the number {text[:40]}, out of the range of a 64-bit float")
    return value


class _ScanContext:
    """The attributes ``_json.make_scanner`` reads from a JSONDecoder."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = staticmethod(_parse_float)
    parse_int = staticmethod(_parse_int)
    parse_constant = staticmethod(_reject_constant)
    memo: ClassVar[dict[str, str]] = {}


_scan = _json.make_scanner(_ScanContext())
_encode = _json.make_encoder(
    None,  # markers: no cycle check needed for data we parsed ourselves
    None,  # default: anything not JSON-native is a bug; the encoder raises
    _json.encode_basestring_ascii,
    None,  # indent
    ":",
    ",",
    False,  # sort_keys
    False,  # skipkeys
    False,  # allow_nan
)


def loads(text: str, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """Parse one JSON document; raise ValueError with the offset when it is not one.

    ``object_pairs_hook`` is called with every object's (key, value) pairs in document order, as
    :func:`json.loads` does; it may raise :class:`Refused`.  Numbers a 64-bit float or CPython's int
    conversion cannot hold and nesting deeper than the interpreter's recursion limit raise
    :class:`Refused` (a ValueError) with a message, never RecursionError or a bare ValueError.
    """
    scan = _scan
    if object_pairs_hook is not None:
        context = _ScanContext()
        context.object_pairs_hook = object_pairs_hook
        context.memo = {}
        scan = _json.make_scanner(context)
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = scan(text, start)
    except Refused:
        raise
    except RecursionError:
        raise Refused("is nested too deeply (arrays and objects inside each other)") from None
    except (StopIteration, ValueError, SystemError):
        # The C scanner reports most errors through json.decoder, which is not
        # imported here; let the full module parse again for a precise message.
        raise ValueError(f"not valid JSON ({_describe_error(text)})") from None
    if text[end:].strip(_WHITESPACE):
        raise ValueError(f"not valid JSON (extra data at offset {end})")
    return value


def _describe_error(text: str) -> str:
    import json  # error path only

    try:
        json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        return "nested too deeply"
    except ValueError as err:
        return str(err)
    return "unexpected parse failure"


def dumps(value: Any) -> str:
    """Serialise compactly, ASCII only, keys in their existing order."""
    return "".join(_encode(value, 0))
