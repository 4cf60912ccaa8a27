"""config.json and the state JSON read as runc reads them, and a clean answer for every hostile text.

Go's encoding/json (runc) matches keys to struct fields case-insensitively and decodes a repeated key into the
same field again (for an object, merging the second into the first: measured below with runc itself).  The hook
refuses such a config.json with one line instead of guessing.  Numbers no float64 holds, integers of thousands of
digits, nesting deeper than Python reads and non-UTF-8 text get one line too (runc accepts some of them in fields
it ignores: 1e400, 5,000-digit integers, 2,000-deep arrays, a \\xff byte in env; it refuses NaN and nesting past
10,000).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oci_gpu_hook import oci_spec, oci_state
from oci_gpu_hook.errors import HookError
from tests.helpers import containerlib as cl
from tests.helpers.hostiletexts import PRECREATE_INPUTS, REFUSED_SPECS, hostile_text

# --- oci_spec.loads ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "message"), REFUSED_SPECS, ids=[m for _t, m in REFUSED_SPECS])
def test_refused_with_one_line(text: str, message: str) -> None:
    with pytest.raises(HookError) as caught:
        oci_spec.loads(text)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("text", [
    '{"annotations": {"a": "1", "A": "2"}}',  # a Go map: keys are case-sensitive
    '{"linux": {"sysctl": {"net.a": "1", "NET.A": "2"}, "resources": {"unified": {"x": "1", "X": "2"}}}}',
    '{"ociVersion": "1.0.2", "process": {"env": ["A=1"]}, "root": {"path": "rootfs"}, "x-Unknown": 1}',
    '{"x": 1e308, "y": ' + "9" * 4000 + ', "z": ' + "[" * 500 + "]" * 500 + "}",
    '{"x": "\\ud800", "\u00e9": "\u65e5\u672c"}',
])
def test_accepted(text: str) -> None:
    assert oci_spec.loads(text) == json.loads(text)


def test_example_bundle_reads_as_before() -> None:
    text = (cl.REPO / "examples" / "bundle" / "config.json").read_text()
    assert oci_spec.loads(text) == json.loads(text)


# --- hostile text: oci_spec.loads, oci_state.parse_state, the precreate entry ----------------------------------------

@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_text)
def test_spec_loads_answers_cleanly(text: str) -> None:
    try:
        spec = oci_spec.loads(text)
    except HookError as err:
        assert str(err).startswith("config.json") and "\n" not in str(err)
        return
    assert json.loads(text) == spec or spec != spec  # what it accepts is what json reads


def _go_would_agree(text: str) -> bool:
    """An independent model: Go and Python read ``text`` alike when no object repeats a key and no object that
    Go decodes into a struct (anything but annotations, sysctl, unified) holds two keys that fold alike."""
    def fold(key: str) -> str:
        return key.lower().replace("\u017f", "s")

    tree = json.loads(text, object_pairs_hook=lambda pairs: ("obj", pairs))
    stack: list[tuple[Any, str]] = [(tree, "")]
    while stack:
        value, parent = stack.pop()
        if isinstance(value, tuple):
            keys = [k for k, _v in value[1]]
            if len(set(keys)) != len(keys):
                return False
            if fold(parent) not in ("annotations", "sysctl", "unified") and len({fold(k) for k in keys}) != len(keys):
                return False
            stack.extend((v, k) for k, v in value[1])
        elif isinstance(value, list):
            stack.extend((v, parent) for v in value)
    return True


_keys = st.sampled_from(["process", "Process", "PROCESS", "proce\u017fs", "env", "Env", "root", "Root", "path",
                         "Path", "annotations", "a", "A", "linux", "devices", "Devices", "x"])
class _Pairs(list):  # type: ignore[type-arg]
    """An object written as its (key, value) pairs, repeats and all."""


def _dump(value: Any) -> str:
    if isinstance(value, _Pairs):
        return "{" + ",".join(f"{json.dumps(k)}:{_dump(v)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_dump(v) for v in value) + "]"
    return json.dumps(value)


_objects = st.recursive(
    st.one_of(st.none(), st.integers(), st.text(max_size=4)),
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.lists(st.tuples(_keys, children), max_size=4).map(_Pairs)),
    max_leaves=10,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_objects.map(_dump))
def test_what_spec_loads_accepts_go_reads_alike(text: str) -> None:
    """Objects written with repeated and case-folded keys: accepted exactly when Go would read them alike (or
    refused for a known field spelled in another case at a level the hook reads)."""
    try:
        oci_spec.loads(text)
    except HookError as err:
        assert "\n" not in str(err)
        assert not _go_would_agree(text) or "spells" in str(err), (text, str(err))
        return
    assert _go_would_agree(text), text


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_text)
def test_parse_state_answers_cleanly(text: str) -> None:
    try:
        cid, pid, path = oci_state.parse_state(text)
    except HookError as err:
        assert "\n" not in str(err)
        return
    assert isinstance(cid, str) and isinstance(pid, int) and path.startswith("/")


def _precreate(data: bytes, config: Path) -> subprocess.CompletedProcess[bytes]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OCI_GPU_HOOK_CONFIG": str(config),
           "OCI_GPU_HOOK_BY_PATH_DIR": os.environ["OCI_GPU_HOOK_BY_PATH_DIR"]}
    return subprocess.run([sys.executable, "-I", "-m", "oci_gpu_hook.entry.cli", "precreate"], input=data,
                          capture_output=True, env=env, cwd=cl.REPO, timeout=60)


def _reject_constant(name: str) -> Any:
    raise ValueError(name)


def _assert_clean(done: subprocess.CompletedProcess[bytes]) -> None:
    err = done.stderr.decode("utf-8", "replace")
    if done.returncode == 0:
        json.loads(done.stdout.decode("utf-8"), parse_constant=_reject_constant)  # JSON: no NaN, no Infinity
        return
    assert done.returncode == 1, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("oci-gpu-hook: error:"), err
    assert "internal error" not in err and "Traceback" not in err, err


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("precreate") / "config.toml"
    path.write_text(f'sysfs_root = "{cl.SEED_SYSFS}"\n')
    return path


@pytest.mark.parametrize("data", PRECREATE_INPUTS, ids=range(len(PRECREATE_INPUTS)))
def test_precreate_answers_cleanly(config: Path, data: bytes) -> None:
    _assert_clean(_precreate(data, config))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(hostile_text)
def test_precreate_answers_hostile_text_cleanly(config: Path, text: str) -> None:
    _assert_clean(_precreate(text.encode("utf-8", "surrogateescape"), config))
