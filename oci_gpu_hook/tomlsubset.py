"""A strict subset of TOML for the config file, so that a container start does not import tomllib
(~20 ms: re, typing, enum, datetime).  One key per line: bare keys, basic strings without escapes,
literal strings, integers (decimal, 0x, 0o, 0b, with underscores), booleans, one-line arrays of
strings, one [request_env] table or an inline table of such arrays; comments and blank lines.
Anything else returns None and goes to tomllib; tests/test_toml_subset.py proves by property test
that whatever this accepts, tomllib reads the same.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from typing import Any

_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_DIGITS = {"0x": "0123456789abcdefABCDEF", "0o": "01234567", "0b": "01"}


def parse_toml_subset(raw: bytes) -> dict[str, Any] | None:
    """The TOML document ``raw`` when it is inside the subset above, else None."""
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        return None
    root: dict[str, Any] = {}
    table = root
    lines = text.split("\n")
    for number, line in enumerate(lines):
        if line.endswith("\r") and number < len(lines) - 1:  # CRLF; a lone CR is refused below
            line = line[:-1]
        if any((c < " " and c != "\t") or c == "\x7f" for c in line):
            return None
        body = line.strip(" \t")
        if not body or body.startswith("#"):
            continue
        if body.startswith("["):
            header, close, rest = body.partition("]")
            if not close or header.strip(" \t") != "[request_env" or (rest.strip(" \t") and not rest.strip(" \t")
                                                           .startswith("#")) or "request_env" in root:
                return None
            table = root["request_env"] = {}
            continue
        key, eq, rest = body.partition("=")
        key = key.strip(" \t")
        if not eq or not key or not set(key) <= _BARE or key in table:
            return None
        parsed = _toml_value(rest.strip(" \t"), table is root and key == "request_env")
        if parsed is None:
            return None
        value, tail = parsed
        tail = tail.strip(" \t")
        if tail and not tail.startswith("#"):
            return None
        table[key] = value
    return root


def _toml_value(text: str, inline_table: bool) -> tuple[Any, str] | None:
    """(value, rest of the line) for one value at the start of ``text``; None outside the subset."""
    if text.startswith(('"', "'")):
        quote = text[0]
        end = text.find(quote, 1)
        inner = text[1:end]
        if end < 0 or text.startswith(quote * 3) or (quote == '"' and "\\" in inner):
            return None
        return inner, text[end + 1:]
    if text.startswith("["):
        items: list[str] = []
        rest = text[1:].lstrip(" \t")
        while not rest.startswith("]"):
            parsed = _toml_value(rest, False)
            if parsed is None or not isinstance(parsed[0], str):
                return None
            items.append(parsed[0])
            rest = parsed[1].lstrip(" \t")
            if rest.startswith(","):
                rest = rest[1:].lstrip(" \t")
            elif not rest.startswith("]"):
                return None
        return items, rest[1:]
    if text.startswith("{"):
        if not inline_table:
            return None
        table: dict[str, Any] = {}
        rest = text[1:].lstrip(" \t")
        if rest.startswith("}"):
            return table, rest[1:]
        while True:
            key, eq, rest = rest.partition("=")
            key = key.strip(" \t")
            if not eq or not key or not set(key) <= _BARE or key in table:
                return None
            parsed = _toml_value(rest.lstrip(" \t"), False)
            if parsed is None or not isinstance(parsed[0], list):
                return None
            table[key] = parsed[0]
            rest = parsed[1].lstrip(" \t")
            if rest.startswith("}"):
                return table, rest[1:]
            if not rest.startswith(","):
                return None
            rest = rest[1:].lstrip(" \t")
    word = text
    for stop in " \t#,]}":
        word = word.partition(stop)[0]
    rest = text[len(word):]
    if word in ("true", "false"):
        return word == "true", rest
    digits = _DIGITS.get(word[:2])
    number = word[2:] if digits else word.removeprefix("+").removeprefix("-")
    digits = digits or "0123456789"
    if (not number or len(number) > 64 or not set(number) <= set(digits) | {"_"} or number[0] == "_"
            or number[-1] == "_" or "__" in number
            or (digits == "0123456789" and len(number) > 1 and number[0] == "0")):
        return None
    value = int(number.replace("_", ""), {"0x": 16, "0o": 8, "0b": 2}.get(word[:2], 10))
    return (-value if word.startswith("-") else value), rest
