"""Hostile config.json and state texts for the tests: what runc reads otherwise than Python (with the one line
each refusal gives), texts that are not JSON at all, and a strategy for more of them."""

from __future__ import annotations

import json

from hypothesis import strategies as st

REFUSED_SPECS = [
    ('{"root": {"path": "a"}, "Root": {"path": "b"}}', "has both 'root' and 'Root' in the top level"),
    ('{"process": {"env": ["A=1"], "Env": ["A=2"]}}', "has both 'env' and 'Env' in process"),
    ('{"process": {"env": []}, "PROCESS": {"env": []}}', "has both 'process' and 'PROCESS'"),
    ('{"Process": {"env": ["AMD_VISIBLE_DEVICES=1"]}}', "spells the top level's 'process' as 'Process'"),
    ('{"proce\u017fs": {"env": []}}', "as 'proce\u017fs'"),  # long s: Go folds it to s
    ('{"root": {"Path": "x"}}', "spells root's 'path' as 'Path'"),
    ('{"linux": {"Devices": []}}', "spells linux's 'devices' as 'Devices'"),
    ('{"linux": {"devices": [{"PATH": "/dev/x"}]}}', "spells linux.devices[...]'s 'path' as 'PATH'"),
    ('{"linux": {"resources": {"devices": [{"allow": true, "Type": "c"}]}}}', "'type' as 'Type'"),
    ('{"hooks": {"createRuntime": [{"Path": "/x"}]}}', "spells hooks.createRuntime[...]'s 'path'"),
    ('{"linux": {"resources": {"devices": [], "DEVICES": []}}}', "in linux.resources"),
    ('{"linux": {"resources": {"devices": [{"allow": true, "Allow": false}]}}}', "linux.resources.devices[0]"),
    ('{"linux": {"maskedPaths": [], "maskedpaths": []}}', "in linux"),
    ('{"hooks": {"prestart": [], "Prestart": []}}', "in hooks"),
    ('{"hooks": {"createruntime": []}}', "spells hooks's 'createRuntime'"),
    ('{"process": {"env": ["A=1"]}, "process": {"args": ["x"]}}', "repeats the key 'process'"),
    ('{"annotations": {"a": "1", "a": "2"}}', "repeats the key 'a'"),
    ('{"mounts": [{"type": "bind", "Type": "tmpfs"}]}', "mounts[0]"),
    ('{"a\u212a": 1, "ak": 2}', "has both"),  # Kelvin sign folds to k
    ('{"x": 1e400}', "holds the number 1e400, out of the range of a 64-bit float"),
    ('{"x": -1e999}', "out of the range"),
    ('{"x": ' + "7" * 5000 + "}", "holds an integer of 5000 digits"),
    ('{"x": ' + "[" * 2000 + "]" * 2000 + "}", "is nested too deeply"),
    ('{"x": ' + "[" * 100000, "is nested too deeply"),
    ('{"x": NaN}', "not valid JSON"),
    ('{"x": Infinity}', "not valid JSON"),
    ('{"x": "\udcff"}', "is not UTF-8 text"),  # a \xff byte read with surrogateescape
    ("", "not valid JSON"),
]

PRECREATE_INPUTS = [text.encode("utf-8", "surrogateescape") for text, _m in REFUSED_SPECS] + [
    b'{"process": {"env": ["A=\xff", "AMD_VISIBLE_DEVICES=1"]}, "root": {"path": "r"}}',
    b'{"process": {"env": ["AMD_VISIBLE_DEVICES=1"]}, "root": {"path": "r"}, "x": 1e308}',
    b"[" * 100000,
    b"\xff\xfe{}",
]

_valid = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
              st.text(max_size=8)),
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.sampled_from(["process", "Process", "env", "Env", "root", "path",
                                                                "id", "pid", "bundle", "annotations", "linux"]),
                                               children, max_size=4)),
    max_leaves=12,
).map(json.dumps)
_pieces = st.sampled_from([
    "1e400", "-1e400", "NaN", "Infinity", "-Infinity", "9" * 5000, "[" * 100000, "[" * 2000, "]" * 3, "{" * 1500,
    '"\udcff"', '"\\ud800"', '"process":', '"Process":{}', '"env":[]', '"Env":["AMD_VISIBLE_DEVICES=5"]',
    '"pid":1', '"pid":1,"pid":2', ",", ":", '"', "\\", "\x00", "\ufeff", " ", "0x10", "01", "1.", ".5", "tru",
])
hostile_text = st.one_of(
    _valid,
    st.builds(lambda text, piece, at: text[:at % (len(text) + 1)] + piece + text[at % (len(text) + 1):],
              _valid, _pieces, st.integers(min_value=0)),
    st.builds(lambda a, b: "{" + a + "," + b + "}", _pieces, _pieces),
    st.text(max_size=40),
)


def journal_texts(limit: int) -> list[bytes]:
    """Texts for the journal's line (log.py syslog_text, the C front's twin): every byte but NUL (which no C string
    holds) alone and between letters, runs of spaces and line breaks, ill-formed UTF-8 of each kind, C1 controls
    and characters that do pass, and long texts whose cut at ``limit`` bytes falls on each kind of piece."""
    texts = [bytes([i]) for i in range(1, 256)] + [b"a" + bytes([i]) + b"b" for i in range(1, 256)]
    texts += [b"a  b", b"  lead", b"trail  ", b"\t\n\r\x0b\x0c", b"line\nbreak\r\n", b"\x1b[31mred\x1b[0m",
              b"\xff\xfe", b"\xe2\x82", b"\xe2\x82A", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xe0\xa0\x80",
              b"\xed\xa0\x80", b"\xed\x9f\xbf", b"\xf4\x90\x80\x80", b"\xf4\x8f\xbf\xbf", b"\xf0\x80\x80\x80",
              b"\xf0\x90\x80\x80", b"\xf8\x88\x80\x80\x80", b"\x80", b"\xc2", b"\xc2\x9b[31m", b"\xc2\xa0",
              "\u00e9\u20ac\U0001f600\ufeff\u202e".encode(), b"\\x41 is not A", b"%s %n %%"]
    texts += [b"a" * 5000, "\u00e9".encode() * 5000, b"\x01" * 5000, "\u20ac".encode() * 2000, b"\xff" * 3000]
    for tail in (b"", b"\x01", "\u00e9".encode(), "\u20ac".encode(), "\U0001f600".encode(), b"\xe2\x82", b"\xff"):
        texts += [b"a" * (limit - n) + tail + b"z" for n in range(-6, 40)]
    return texts


JOURNAL_CONTAINERS = [b"", b"c1", "\u00e9".encode() * 100, "\u20ac".encode() * 50, b"\xff" * 200, b"a\nb",
                      b"x" * 300]
