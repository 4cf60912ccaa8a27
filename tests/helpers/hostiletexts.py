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
