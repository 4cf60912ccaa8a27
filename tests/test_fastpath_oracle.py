"""One outcome per config, whatever the launcher: the native front and the Python-only launchers of the same install
give the same exit status, stdout and stderr (and leave the same config.json) for every text of the hostile corpus,
through each entry point (precreate, prestart, the shim's create); and the front execs its runtime with a proper
argv when started with none at all (argc 0).

The corpus: every text that ``oci_spec.loads`` refuses or accepts in tests/helpers/hostiletexts.py, the inputs of
the precreate entry there and in tests/test_fastpath.py, texts aimed at each check the front makes before it lets a
container pass (types of process, process.env, annotations; keys in other cases, with escapes, non-ASCII; numbers
at the edge of what Python reads; nesting), request variables that ask for nothing (empty, none, void: the front
decides those itself) beside every near miss it must hand over, hostile state JSON for prestart, and hypothesis'
hostile text.  Who decided is checked too, for the empty variables, under other settings and a config that renames
the request variables.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from oci_gpu_hook.fastpath import build as fastbuild
from oci_gpu_hook.install import launchers
from tests.helpers import containerlib as cl
from tests.helpers.hostiletexts import PRECREATE_INPUTS, REFUSED_SPECS, hostile_text
from tests.test_fastpath import GRANTED, OTHER

pytestmark = pytest.mark.skipif(fastbuild.find_cc() is None, reason="no C compiler")

# Texts aimed at the front's own checks; none holds a request name, so that a front which only scans for names
# lets each of them pass.
AIMED = [
    "{}", '{"ociVersion": "1.0.2"}', '{"process": null}', '{"process": {}}', '{"process": {"env": null}}',
    '{"process": {"env": []}}', '{"annotations": null}', '{"annotations": {}}',
    '{"process": 5}', '{"process": []}', '{"process": "x"}', '{"process": {"env": "PATH=/bin"}}',
    '{"process": {"env": [1]}}', '{"process": {"env": ["A=1", null]}}', '{"process": {"env": {}}}',
    '{"annotations": []}', '{"annotations": "x"}', '{"annotations": 1}', '{"x": {"process": 5}}',
    '{"x": {"env": 5}}', '{"annotations": {"a": 1, "b": [], "c": null}}',
    '{"a": 1, "a": 2}', '{"a": 1, "A": 2}', '{"x": {"a": 1, "A": 2}}', '{"annotations": {"a": "1", "A": "2"}}',
    '{"linux": {"sysctl": {"k": "1", "K": "2"}}}', '{"Linux": {}}', '{"x": {"Process": 1}}',
    '{"root": {"PATH": "r"}}', '{"ROOT": {}}', '{"mounts": [{"Type": "tmpfs"}]}',
    '{"\u00c9": 1, "\u00e9": 2}', '{"x": {"\u00c9": 1, "\u00e9": 2}}',
    '{"annotations": {"\u00c9": "1", "\u00e9": "2"}}',
    '{"\u00e9": 1}', '{"a\u212a": 1}', '{"proce\u017fs": {}}', '{"a\\/b": 1, "a/b": 2}', '{"a\\/b": 1}',
    '{"a\\"b": 1}', '{"x": "a\\/b"}',
    '{"x": 1e308}', '{"x": 1.7976931348623157e308}', '{"x": 1.8e308}', '{"x": 1e309}', '{"x": 0.1e309}',
    '{"x": 10e307}', '{"x": -1e308}', '{"x": 1e-400}', '{"x": 1' + "0" * 310 + '.0}', '{"x": 1' + "0" * 290 + '.5}',
    '{"x": ' + "9" * 4000 + "}", '{"x": -' + "9" * 4000 + "}", '{"x": ' + "9" * 4001 + "}",
    '{"x": 0.' + "1" * 2000 + "}",
    '{"x": 1e99999999999999999999}', '{"x": 1e-99999999999999999999}',
    '{"x": ' + "[" * 99 + "]" * 99 + "}", '{"x": ' + "[" * 150 + "]" * 150 + "}",
    '{"x": ' + "[" * 999 + "]" * 999 + "}", '{"x": ' + '{"a":' * 300 + "1" + "}" * 300 + "}",
    '{"keys": {' + ", ".join(f'"k{i}": {i}' for i in range(2000)) + "}}",
    ' {"a": 1} ', '{"a": 1}\n', '\t\r\n{}\n', "{} {}", "{}x", '{"a" 1}', "\ufeff{}",
]

# State JSON for prestart; BUNDLE is a bundle whose config.json asks for nothing.
STATES = [
    '{"ociVersion": "1.0.2", "id": "c1", "pid": 1, "bundle": "BUNDLE", "status": "creating"}',
    '{"id": "c1", "pid": 1, "bundle": "BUNDLE", "pid": 2}', '{"id": "c1", "pid": 1, "bundle": "BUNDLE", "id": "c2"}',
    '{"id": "c1", "pid": 1, "bundle": "BUNDLE", "x": {"a": 1, "a": 2}}',
    '{"ID": "c0", "id": "c1", "pid": 1, "bundle": "BUNDLE"}', '{"id": "c1", "PID": 0, "pid": 1, "bundle": "BUNDLE"}',
    '{"id": "c1", "pid": 1, "bundle": "BUNDLE", "x": 1e400}', '{"id": "c1", "pid": 1, "bundle": "BUNDLE", "x": 1e300}',
    '{"id": "", "pid": 1, "bundle": "BUNDLE"}', '{"id": 5, "pid": 1, "bundle": "BUNDLE"}',
    '{"pid": 1, "bundle": "BUNDLE"}', '{"id": "c1", "pid": 0, "bundle": "BUNDLE"}',
    '{"id": "c1", "pid": -1, "bundle": "BUNDLE"}', '{"id": "c1", "pid": 1.0, "bundle": "BUNDLE"}',
    '{"id": "c1", "pid": true, "bundle": "BUNDLE"}', '{"id": "c1", "pid": "1", "bundle": "BUNDLE"}',
    '{"id": "c1", "pid": 99999999999999999999, "bundle": "BUNDLE"}', '{"id": "c1", "pid": 1e0, "bundle": "BUNDLE"}',
    '{"id": "c1", "pid": 1, "bundle": "relative"}', '{"id": "c1", "pid": 1, "bundle": "/nonexistent"}',
    '{"id": "c1", "pid": 1, "bundle": "BUNDLE/"}', '{"id": "c1", "pid": 1, "bundle": "BUNDLE", "annotations": []}',
    '{"id": "c\\u0031", "pid": 1, "bundle": "BUNDLE"}', '{"id": "c\u00e9", "pid": 1, "bundle": "BUNDLE"}',
    '{"id": "c1", "pid": 1, "bundle": "BUNDLE", "\u00e9": 1}', '[]', "", "{", '{"id": "c1", "pid": 1, "bundle": 5}',
]



def _env_spec(*env: str, **top: object) -> str:
    return json.dumps({"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin", *env]}, **top})


# A request variable that asks for nothing (request.py NO_GPU: empty, none, void, spaces around, any case): the front
# decides these itself (test_empty_requests_pass_without_python)...
EMPTY_NATIVE = [
    _env_spec("AMD_VISIBLE_DEVICES="), _env_spec("AMD_VISIBLE_DEVICES=none"), _env_spec("AMD_VISIBLE_DEVICES=NONE"),
    _env_spec("AMD_VISIBLE_DEVICES=NoNe"), _env_spec("AMD_VISIBLE_DEVICES=void"), _env_spec("AMD_VISIBLE_DEVICES=VOID"),
    _env_spec("AMD_VISIBLE_DEVICES= "), _env_spec("AMD_VISIBLE_DEVICES=  none  "), _env_spec("INTEL_VISIBLE_DEVICES="),
    _env_spec("NVIDIA_VISIBLE_DEVICES=void"), _env_spec("AMD_VISIBLE_DEVICES=", "AMD_VISIBLE_DEVICES=none"),
    _env_spec("AMD_VISIBLE_DEVICES=", "INTEL_VISIBLE_DEVICES=none", "NVIDIA_VISIBLE_DEVICES=VOID"),
    _env_spec("AMD_VISIBLE_DEVICES=", annotations={"io.kubernetes.x": "y"}),
]
# ... and hands these over, as it cannot be certain (the oracle holds either way): a later or earlier real request, a
# name without '=', the name in another case or elsewhere (annotations, a hook's env, another key), another
# vendor's request beside it, escapes and Unicode spaces (Python's strip takes them), a value with a space inside,
# an empty entry (refused), a CDI annotation that decides, more empty entries than the front sets aside.
EMPTY_HANDED_OVER = [
    _env_spec("AMD_VISIBLE_DEVICES=", "AMD_VISIBLE_DEVICES=0"),
    _env_spec("AMD_VISIBLE_DEVICES=0", "AMD_VISIBLE_DEVICES="),
    _env_spec("AMD_VISIBLE_DEVICES=none", "AMD_VISIBLE_DEVICES=all"), _env_spec("AMD_VISIBLE_DEVICES"),
    _env_spec("AMD_VISIBLE_DEVICES=0", "AMD_VISIBLE_DEVICES"), _env_spec("AMD_VISIBLE_DEVICES", "AMD_VISIBLE_DEVICES="),
    _env_spec("amd_visible_devices="), _env_spec("Amd_Visible_Devices=none"), _env_spec("AMD_VISIBLE_DEVICES=,"),
    _env_spec("AMD_VISIBLE_DEVICES=no ne"), _env_spec("AMD_VISIBLE_DEVICES=nonee"), _env_spec("AMD_VISIBLE_DEVICES=="),
    _env_spec("AMD_VISIBLE_DEVICES=\t"), _env_spec("AMD_VISIBLE_DEVICES=none\n"),
    _env_spec("AMD_VISIBLE_DEVICES=\u00a0"),
    json.dumps({"process": {"env": ["AMD_VISIBLE_DEVICES=\u00a0none\u3000"]}}, ensure_ascii=False),
    r'{"process": {"env": ["AMD_VISIBLE_DEVICES=\u0020"]}}', r'{"process": {"env": ["AMD_VISIBLE_DEVICES=n\u006fne"]}}',
    r'{"process": {"env": ["AMD_VISIBLE_DEVICES=\/"]}}', r'{"process": {"env": ["AMD_VISIBLE_DEVICES\u003d"]}}',
    _env_spec("XAMD_VISIBLE_DEVICES="), _env_spec("AMD_VISIBLE_DEVICES_=1"),
    _env_spec("AMD_VISIBLE_DEVICES=", "INTEL_VISIBLE_DEVICES=0"),
    _env_spec("AMD_VISIBLE_DEVICES=", "NVIDIA_VISIBLE_DEVICES=all"),
    _env_spec("AMD_VISIBLE_DEVICES=", "NVIDIA_VISIBLE_DEVICES=0"), _env_spec("X=AMD_VISIBLE_DEVICES="),
    _env_spec("AMD_VISIBLE_DEVICES=", annotations={"AMD_VISIBLE_DEVICES": ""}),
    _env_spec("AMD_VISIBLE_DEVICES=", annotations={"cdi.k8s.io/gpu": "amd.com/gpu=0"}),
    _env_spec("AMD_VISIBLE_DEVICES=", annotations={"cdi.k8s.io/gpu": "amd.com/gpu"}),
    _env_spec("NVIDIA_VISIBLE_DEVICES=none", annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}),
    _env_spec("NVIDIA_VISIBLE_DEVICES=", annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=none"}),
    _env_spec("AMD_VISIBLE_DEVICES=", annotations={"CDI.K8S.IO/gpu": "nvidia.com/gpu=all"}),
    _env_spec("AMD_VISIBLE_DEVICES=", hooks={"prestart": [{"path": "/x", "env": ["AMD_VISIBLE_DEVICES=0"]}]}),
    _env_spec(hooks={"prestart": [{"path": "/x", "env": ["AMD_VISIBLE_DEVICES="]}]}),
    json.dumps({"process": {"env": ["AMD_VISIBLE_DEVICES="]}, "x": {"env": ["AMD_VISIBLE_DEVICES=0"]}}),
    json.dumps({"process": {"env": ["AMD_VISIBLE_DEVICES="], "ENV": ["AMD_VISIBLE_DEVICES=0"]}}),
    json.dumps({"process": {"env": ["AMD_VISIBLE_DEVICES="]}, "Process": {"env": ["AMD_VISIBLE_DEVICES=0"]}}),
    '{"process": {"env": ["AMD_VISIBLE_DEVICES="], "env": ["AMD_VISIBLE_DEVICES=0"]}}',
    _env_spec(*["AMD_VISIBLE_DEVICES="] * 17), _env_spec(*["AMD_VISIBLE_DEVICES="] * 40, "AMD_VISIBLE_DEVICES=0"),
]


def _texts() -> list[bytes]:
    texts = [t.encode("utf-8", "surrogateescape") for t, _m in REFUSED_SPECS]
    texts += [t.encode() for t in AIMED]
    texts += list(PRECREATE_INPUTS)
    texts += [t.encode() for name, t in GRANTED.items() if name != "huge"]
    texts += [t.encode("utf-8", "surrogateescape") for t in OTHER.values()]
    texts += [t.encode() for t in EMPTY_NATIVE + EMPTY_HANDED_OVER]
    return list(dict.fromkeys(texts))


CORPUS = _texts()
FAKE_RUNTIME = '#!/bin/sh\necho "fake-runtime $#: $*"\nexit 3\n'


def _make_install(base: Path, settings: str = "") -> dict[str, Path]:
    """Native and Python launchers of one config (``settings`` added to it); the native front's Python launchers
    note in ``python-ran`` that they ran."""
    fake = base / "fake-runtime"
    fake.write_text(FAKE_RUNTIME)
    fake.chmod(0o755)
    config = base / "config.toml"
    config.write_text(f'sysfs_root = "{cl.SEED_SYSFS}"\nhook_path = "/bin/true"\nruntime = "{fake}"\n{settings}')
    defaults = {"OCI_GPU_HOOK_CONFIG": str(config)}
    launchers.write_launchers(str(base / "native"), defaults, native=True)
    launchers.write_launchers(str(base / "python"), defaults, native=False)
    for name in ("oci-gpu-hook.py", "oci-gpu-runtime.py"):
        script = base / "native" / name
        first, rest = script.read_text().split("\n", 1)
        script.write_text(f"{first}\nopen({str(base / 'python-ran')!r}, 'a').write('ran\\n')\n{rest}")
    bundle = base / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text('{"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin"]}}')
    return {"base": base, "native": base / "native", "python": base / "python", "bundle": bundle, "fake": fake,
            "ran": base / "python-ran"}


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _make_install(tmp_path_factory.mktemp("oracle"))


def _run(argv: list[str], data: bytes, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, bytes, bytes]:
    done = subprocess.run(argv, input=data, capture_output=True, env={**cl.hook_env(), **(env or {})}, cwd=cwd,
                          timeout=120)
    return done.returncode, done.stdout, done.stderr


RUNC_TIME = re.compile(rb'time="[^"]*"')


def _both(install: dict[str, Path], name: str, args: list[str], data: bytes = b"",
          prepare: object = None, env: dict[str, str] | None = None) -> list[tuple[int, bytes, bytes, bytes | None]]:
    """(status, stdout, stderr, the bundle's config.json after) for the native front and the Python launcher."""
    results = []
    for kind in ("native", "python"):
        if callable(prepare):
            prepare()
        status, out, err = _run([str(install[kind] / name), *args], data, install["base"], env)
        err = RUNC_TIME.sub(b'time="-"', err)  # runc's own lines carry the second they were written
        config = install["bundle"] / "config.json"
        results.append((status, out, err, config.read_bytes() if config.exists() else None))
    return results


ENTRIES = ("precreate", "prestart", "create")


def _entry(install: dict[str, Path], entry: str, text: bytes, env: dict[str, str] | None = None
           ) -> tuple[list[tuple[int, bytes, bytes, bytes | None]], bool]:
    """The outcomes of both launchers for the config ``text`` through ``entry``, and whether the native front handed
    over to Python."""
    config = install["bundle"] / "config.json"
    install["ran"].unlink(missing_ok=True)
    if entry == "precreate":
        outcomes = _both(install, "oci-gpu-hook", ["precreate"], text, env=env)
    elif entry == "prestart":
        state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "pid": 1, "bundle": str(install["bundle"])}).encode()
        outcomes = _both(install, "oci-gpu-hook", ["prestart"], state, lambda: config.write_bytes(text), env)
    else:
        args = ["--root", "/run/oracle", "create", "--bundle", str(install["bundle"]), "--pid-file", "/p", "c1"]
        outcomes = _both(install, "oci-gpu-runtime", args, b"", lambda: config.write_bytes(text), env)
    return outcomes, install["ran"].exists()


@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_precreate_one_outcome(install: dict[str, Path], text: bytes) -> None:
    native, python = _both(install, "oci-gpu-hook", ["precreate"], text)
    assert native == python


@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_prestart_one_outcome(install: dict[str, Path], text: bytes) -> None:
    config = install["bundle"] / "config.json"
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "pid": 1, "bundle": str(install["bundle"])}).encode()
    native, python = _both(install, "oci-gpu-hook", ["prestart"], state, lambda: config.write_bytes(text))
    assert native == python


@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_shim_create_one_outcome(install: dict[str, Path], text: bytes) -> None:
    config = install["bundle"] / "config.json"
    args = ["--root", "/run/oracle", "create", "--bundle", str(install["bundle"]), "--pid-file", "/p", "c1"]
    native, python = _both(install, "oci-gpu-runtime", args, b"", lambda: config.write_bytes(text))
    assert native == python


@pytest.mark.parametrize("state", STATES, ids=range(len(STATES)))
def test_prestart_state_one_outcome(install: dict[str, Path], state: str) -> None:
    config = install["bundle"] / "config.json"
    config.write_text('{"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin"]}}')
    data = state.replace("BUNDLE", str(install["bundle"])).encode("utf-8", "surrogateescape")
    native, python = _both(install, "oci-gpu-hook", ["prestart"], data)
    assert native == python


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(hostile_text)
def test_precreate_one_outcome_for_hostile_text(install: dict[str, Path], text: str) -> None:
    data = text.encode("utf-8", "surrogateescape")
    native, python = _both(install, "oci-gpu-hook", ["precreate"], data)
    assert native == python


def test_the_front_passes_clean_configs_without_python(install: dict[str, Path], tmp_path: Path) -> None:
    """The oracle above would hold for a front that always hands over: these must not reach Python."""
    marker = tmp_path / "python-ran"
    for name in ("oci-gpu-hook.py", "oci-gpu-runtime.py"):
        script = install["native"] / name
        first, rest = script.read_text().split("\n", 1)
        script.write_text(f"{first}\nopen({str(marker)!r}, 'a').write('ran\\n')\n{rest}")
    clean = ['{"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin"], "args": ["sh"]}, "root": {"path": "r"}}',
             '{"process": null, "annotations": {"io.kubernetes.x": "y"}, "x": [1.5e300, -0, 1e-400, true, null]}',
             '{"linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}}, "hooks": {}}']
    for text in clean:
        status, out, _err = _run([str(install["native"] / "oci-gpu-hook"), "precreate"], text.encode(),
                                 install["base"])
        assert (status, out) == (0, text.encode())
        (install["bundle"] / "config.json").write_text(text)
        status, out, _err = _run([str(install["native"] / "oci-gpu-runtime"), "create", "--bundle",
                                  str(install["bundle"]), "c1"], b"", install["base"])
        assert (status, out.decode()) == (3, f"fake-runtime 4: create --bundle {install['bundle']} c1\n")
    assert not marker.exists()


# ------------------------------------------------------------------ a request variable that asks for nothing


@pytest.mark.parametrize("entry", ENTRIES)
def test_empty_requests_pass_without_python(install: dict[str, Path], entry: str) -> None:
    """The front decides a request variable that asks for nothing itself (the outcome Python's, untouched), and
    hands over every text of EMPTY_HANDED_OVER (the oracle above holds for both)."""
    for text in EMPTY_NATIVE:
        (native, python), ran = _entry(install, entry, text.encode())
        assert native == python and not ran, text
        assert native[0] == (3 if entry == "create" else 0) and native[1] == (text.encode() if entry == "precreate"
                                                                             else native[1]), text
    for text in EMPTY_HANDED_OVER:
        (native, python), ran = _entry(install, entry, text.encode())
        assert native == python and ran, text


CDI_ALL_REFUSED = (b"oci-gpu-hook: error: cdi.k8s.io annotations=all: 'all' names no device: this host has no nvidia "
                   b"GPUs (valid: none, which grants no nvidia GPU; a CDI name must name a device this host has)\n")


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("env", [[], ["NVIDIA_VISIBLE_DEVICES=all"], ["NVIDIA_VISIBLE_DEVICES=void"]])
def test_a_cdi_name_of_a_kind_the_node_lacks_is_handed_over_and_refused(install: dict[str, Path], entry: str,
                                                                      env: list[str]) -> None:
    """``nvidia.com/gpu=all`` in an annotation on this node without NVIDIA GPUs: the front hands it over (it holds
    "cdi.k8s.io"), and the container is refused in the one line Python gives, whatever the env beside it says."""
    text = _env_spec(*env, annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}).encode()
    (native, python), ran = _entry(install, entry, text)
    assert native == python and ran
    assert (native[0], native[2]) == (1, CDI_ALL_REFUSED)
    assert native[1] == b"" and native[3] == (text if entry != "precreate" else native[3])  # config.json untouched


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("env, native", [({"OCI_GPU_HOOK_ALLOW_ENV_REQUESTS": "maybe"}, False),
                                         ({"OCI_GPU_HOOK_ALLOW_ENV_REQUESTS": "off"}, True),
                                         ({"OCI_GPU_HOOK_DEBUG": "1"}, True),
                                         ({"OCI_GPU_HOOK_CONFIG": "/nonexistent/config.toml"}, False)])
def test_empty_request_under_other_settings(install: dict[str, Path], entry: str, env: dict[str, str],
                                            native: bool) -> None:
    """A setting the front cannot vouch for (a bad bool, another config file) hands the empty variable over, and
    Python decides (a warning line: the config cannot be used, the container asks for nothing)."""
    (front, python), ran = _entry(install, entry, _env_spec("AMD_VISIBLE_DEVICES=").encode(), env)
    assert front == python and ran is not native


@pytest.mark.parametrize("entry", ENTRIES)
def test_an_env_request_with_env_requests_off_is_handed_over_and_left_alone(install: dict[str, Path],
                                                                            entry: str) -> None:
    """Where pods reach the launchers, install bakes env requests off: the front cannot know that a request variable
    counts for nothing, so it hands the container over (Python writes the journal's line of the request set aside),
    and both leave it as it was."""
    text = _env_spec("AMD_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=all").encode()
    (native, python), ran = _entry(install, entry, text, {"OCI_GPU_HOOK_ALLOW_ENV_REQUESTS": "false"})
    assert native == python and ran
    assert native[0] == (3 if entry == "create" else 0) and native[2] == b"", native
    assert native[1] == (text if entry == "precreate" else native[1]) and native[3] == (
        text if entry != "precreate" else native[3])


RENAMED_SETTINGS = 'backends = ["amd", "intel"]\n[request_env]\namd = ["GPU_REQUEST", "OTHER_GPU"]\n'
# (text, the front decides it itself) under RENAMED_SETTINGS: the AMD request is GPU_REQUEST or OTHER_GPU; the default
# name is then no request at all; NVIDIA's backend is off (its variable is someone else's)
RENAMED_TEXTS = [
    (_env_spec("GPU_REQUEST="), True), (_env_spec("GPU_REQUEST=None", "OTHER_GPU=void"), True),
    (_env_spec("AMD_VISIBLE_DEVICES="), True), (_env_spec("NVIDIA_VISIBLE_DEVICES=none"), True),
    (_env_spec("GPU_REQUEST=0"), False), (_env_spec("GPU_REQUEST=", "OTHER_GPU=0"), False),
    (_env_spec("GPU_REQUEST=0", "OTHER_GPU=0"), False), (_env_spec("GPU_REQUEST=", "GPU_REQUEST=0"), False),
    (_env_spec("AMD_VISIBLE_DEVICES=0"), False), (_env_spec("GPU_REQUEST=", "NVIDIA_VISIBLE_DEVICES=0"), False),
    (_env_spec("gpu_request="), False), (_env_spec("GPU_REQUEST"), False), (_env_spec("GPU_REQUEST=,"), False),
]


@pytest.fixture(scope="module")
def renamed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _make_install(tmp_path_factory.mktemp("renamed"), RENAMED_SETTINGS)


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("text, native", RENAMED_TEXTS, ids=range(len(RENAMED_TEXTS)))
def test_empty_request_under_a_config_that_renames_requests(renamed: dict[str, Path], entry: str, text: str,
                                                            native: bool) -> None:
    (front, python), ran = _entry(renamed, entry, text.encode())
    assert front == python and ran is not native, (front, python)


def test_the_request_names_and_words_are_baked_from_python(tmp_path: Path) -> None:
    """The front's request names are the config's (default and renamed), its words request.py's NO_GPU."""
    from oci_gpu_hook.request import NO_GPU

    config = tmp_path / "config.toml"
    config.write_text(RENAMED_SETTINGS)
    header = fastbuild.front_header("oci-gpu-hook", str(tmp_path), {"OCI_GPU_HOOK_CONFIG": str(config)}, trust=False)
    names = fastbuild._c_list(["AMD_VISIBLE_DEVICES", "GPU_REQUEST", "INTEL_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
                               "OTHER_GPU"])
    assert f"OGH_REQUEST_NAMES[] = {names};" in header
    assert f"OGH_NO_REQUEST_WORDS[] = {fastbuild._c_list(sorted(NO_GPU))};" in header


# ------------------------------------------------------------------ config.json that is not a regular file


def _not_a_file(where: Path, kind: str) -> socket.socket | None:
    """``where`` made a ``kind`` (a FIFO no one writes, a listening socket, a symlink to /dev/null or /dev/zero, a
    directory); the socket to close after, for "socket"."""
    if where.is_dir() and not where.is_symlink():
        where.rmdir()
    else:
        where.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(where)
    elif kind == "socket":
        listening = socket.socket(socket.AF_UNIX)
        listening.bind(str(where))
        listening.listen(1)
        return listening
    elif kind in ("devnull", "devzero"):
        where.symlink_to(f"/dev/{kind[3:]}")
    else:
        where.mkdir()
    return None


@pytest.mark.parametrize("kind", ["fifo", "socket", "devnull", "devzero", "directory"])
@pytest.mark.parametrize("entry", ["prestart", "create"])
def test_a_config_json_that_is_not_a_file(install: dict[str, Path], tmp_path: Path, kind: str, entry: str) -> None:
    """Neither the front nor Python opens a FIFO, socket or device as config.json (an open that blocks for ever, a
    read that never ends): both refuse it with the same line, a directory as before."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    listening = _not_a_file(bundle / "config.json", kind)
    try:
        outcomes = []
        for launcher in ("native", "python"):
            if entry == "prestart":
                state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "pid": 1, "bundle": str(bundle)}).encode()
                argv = [str(install[launcher] / "oci-gpu-hook"), "prestart"]
            else:
                state, argv = b"", [str(install[launcher] / "oci-gpu-runtime"), "create", "--bundle", str(bundle), "c1"]
            done = subprocess.run(argv, input=state, capture_output=True, env=cl.hook_env(), timeout=30)
            outcomes.append((done.returncode, done.stdout, done.stderr))
    finally:
        if listening is not None:
            listening.close()
    assert outcomes[0] == outcomes[1]
    status, _out, err = outcomes[0]
    assert status == 1 and err.count(b"\n") == 1, err
    assert (b"Is a directory" if kind == "directory" else b"it is not a regular file") in err


# ------------------------------------------------------------------ argc 0

EXECVE = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
env = [f"{k}={v}".encode() for k, v in os.environ.items()]
libc.execve(sys.argv[1].encode(), (ctypes.c_char_p * 1)(None), (ctypes.c_char_p * (len(env) + 1))(*env, None))
sys.exit(f"execve: {os.strerror(ctypes.get_errno())}")
"""


def test_execve_with_an_empty_argv(install: dict[str, Path]) -> None:
    """Through the kernel: execve(front, {NULL}, env).  (Linux 5.18 and later start the program with the argv
    [""]; earlier kernels with none at all.)  The runtime gets an argv that starts with its own path."""
    assert ctypes.CDLL(None).execve  # libc is there
    done = subprocess.run([sys.executable, "-c", EXECVE, str(install["native"] / "oci-gpu-runtime")],
                          capture_output=True, text=True, env=cl.hook_env(), timeout=60)
    assert (done.returncode, done.stdout) == (3, "fake-runtime 0: \n"), done.stderr


DRIVER = """
int ogh_front_main(int argc, char **argv);
int main(void)
{
    char *argv[] = {0};
    return ogh_front_main(0, argv);
}
"""


@pytest.mark.parametrize("name", ["oci-gpu-runtime", "oci-gpu-hook"])
def test_main_with_argc_zero(install: dict[str, Path], tmp_path: Path, name: str) -> None:
    """The front's own main(0, {NULL}), whatever the kernel does: the shim passes through to the runtime with the
    argv [runtime, NULL]; the hook hands over to Python, which prints its usage."""
    header = tmp_path / "baked.h"
    header.write_text(fastbuild.front_header(name, str(install["native"]), {
        "OCI_GPU_HOOK_CONFIG": str(install["base"] / "config.toml")}, trust=True))
    driver = tmp_path / "driver.c"
    driver.write_text(DRIVER)
    binary, cc = tmp_path / "argc0", str(fastbuild.find_cc())
    subprocess.run([cc, "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", f'-DOGH_BAKED="{header}"',
                    "-Dmain=ogh_front_main", "-c", "-o", str(tmp_path / "front.o"), fastbuild.FRONT_SOURCE],
                   check=True, capture_output=True)
    subprocess.run([cc, "-o", str(binary), str(driver), str(tmp_path / "front.o")], check=True, capture_output=True)
    done = subprocess.run([str(binary)], capture_output=True, text=True, env=cl.hook_env(), timeout=60)
    if name == "oci-gpu-runtime":
        assert (done.returncode, done.stdout) == (3, "fake-runtime 0: \n"), done.stderr
    else:
        assert done.returncode == 2 and "usage" in done.stdout.lower(), (done.stdout, done.stderr)
