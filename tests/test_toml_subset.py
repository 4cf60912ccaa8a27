"""The config file's fast reader (tomlsubset.parse_toml_subset) against tomllib: whatever it accepts, tomllib reads
the same; what it refuses goes to tomllib.  load_file checks the result with FIELDS either way."""

from __future__ import annotations

import tomllib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oci_gpu_hook import config, tomlsubset
from oci_gpu_hook.errors import HookError

KEYS = st.sampled_from([*config.FIELDS, "amd", "intel", "x-y", "a_b", "0", "request_env"])
PLAIN = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\"'\\\n\r"), max_size=8)
STRING = st.one_of(PLAIN.map(lambda s: f'"{s}"'), PLAIN.map(lambda s: f"'{s}'"))
INTEGER = st.one_of(
    st.integers(-10**20, 10**20).map(str),
    st.integers(0, 0o7777).map(lambda n: f"0o{n:o}"),
    st.integers(0, 2**40).map(lambda n: f"0x{n:X}"),
    st.integers(0, 255).map(lambda n: f"0b{n:b}"),
    st.sampled_from(["1_000", "0o7_7", "0xdead_beef", "+5", "-0", "007", "0x", "1__0", "_1", "1_", "0O7",
                     "1e3", "1.5", "inf", "nan", "1979-05-27", "0x_1", "+0x1"]),
)
ARRAY = st.lists(STRING, max_size=4).map(lambda items: "[" + ", ".join(items) + "]")
WS = st.sampled_from(["", " ", "  ", "\t"])
COMMENT = st.sampled_from(["", " # note", "#x", " #", " # \"quoted\" [x]"])


@st.composite
def value(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["string", "integer", "bool", "array", "table", "junk"]))
    if kind == "string":
        return draw(STRING)
    if kind == "integer":
        return draw(INTEGER)
    if kind == "bool":
        return draw(st.sampled_from(["true", "false", "True", "yes"]))
    if kind == "array":
        text = draw(ARRAY)
        return draw(st.sampled_from([text, text[:-1] + ",]", text[:-1] + ", ]", "[", "[1, 2]", "[[\"a\"]]"]))
    if kind == "table":
        entries = draw(st.lists(st.tuples(KEYS, ARRAY), max_size=3))
        body = ", ".join(f"{k} = {v}" for k, v in entries)
        return draw(st.sampled_from(["{" + body + "}", "{ " + body + " }", "{" + body + ",}"]))
    return draw(st.sampled_from(['"a\\tb"', '"""x"""', "'''x'''", '"x" "y"', "", "=", "a.b", '"\\u0041"']))


@st.composite
def document(draw: st.DrawFn) -> str:
    lines = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["pair", "pair", "pair", "blank", "comment", "header", "raw"]))
        if kind == "pair":
            lines.append(f"{draw(WS)}{draw(KEYS)}{draw(WS)}={draw(WS)}{draw(value())}{draw(COMMENT)}")
        elif kind == "blank":
            lines.append(draw(WS))
        elif kind == "comment":
            lines.append(draw(WS) + "# " + draw(PLAIN))
        elif kind == "header":
            lines.append(draw(st.sampled_from(["[request_env]", "[ request_env ]", "[[request_env]]", "[other]",
                                               "[request_env] # t", "[request_env"])))
        else:
            lines.append(draw(st.text(max_size=12)))
    ending = draw(st.sampled_from(["\n", "\r\n"]))
    return ending.join(lines) + draw(st.sampled_from(["", ending]))


def tomllib_or_error(text: str) -> object:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return "error"


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document())
def test_subset_agrees_with_tomllib(text: str) -> None:
    fast = tomlsubset.parse_toml_subset(text.encode("utf-8", "surrogatepass"))
    if fast is not None:
        assert tomllib_or_error(text) == fast


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=64))
def test_subset_on_any_bytes(raw: bytes) -> None:
    fast = tomlsubset.parse_toml_subset(raw)
    if fast is not None:
        assert tomllib_or_error(raw.decode()) == fast


@pytest.mark.parametrize("text", [
    'sysfs_root = "/sys"\nruntime = \'runc\'  # the real one\n',
    "device_file_mode = 0o660\ndevice_uid = 0x10\ndevice_gid = 1_000\ndebug = false\n",
    'backends = ["amd", "intel"]\n\n[request_env]\namd = ["AMD_VISIBLE_DEVICES", "GPUS"]\n',
    'request_env = { amd = ["X"], intel = ["Y"] }\r\nmask_other_gpus = true\r\n',
])
def test_the_usual_files_stay_in_the_subset(text: str) -> None:
    fast = tomlsubset.parse_toml_subset(text.encode())
    assert fast is not None
    assert fast == tomllib.loads(text)


def test_load_file_checks_with_fields_and_never_imports_tomllib(tmp_path) -> None:
    import subprocess
    import sys

    path = tmp_path / "config.toml"
    path.write_text('runtime = "runc"\ndevice_file_mode = 0o640\n[request_env]\namd = ["MY_GPUS"]\n')
    code = ("import sys; from oci_gpu_hook import config; v = config.load_file(sys.argv[1]); "
            "print(v['device_file_mode'], v['request_env']['amd'], 'tomllib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["416", "['MY_GPUS']", "False"]
    path.write_text("device_file_mode = 0o17777\n")  # in the subset, refused by FIELDS as before
    with pytest.raises(HookError, match="device_file_mode"):
        config.load_file(str(path))
    path.write_text("device_file_mode = 1e3\n")  # outside the subset: tomllib reads it, FIELDS refuses
    with pytest.raises(HookError, match="device_file_mode"):
        config.load_file(str(path))
    path.write_text("device_file_mode = \n")
    with pytest.raises(HookError, match="not valid TOML"):
        config.load_file(str(path))
