"""One outcome per config, whatever the launcher: the native front and the Python-only launchers of the same install
give the same exit status, stdout and stderr (and leave the same config.json) for every text of the hostile corpus,
through each entry point (precreate, prestart, the shim's create); and the front execs its runtime with a proper
argv when started with none at all (argc 0).

The corpus: every text that ``oci_spec.loads`` refuses or accepts in tests/helpers/hostiletexts.py, the inputs of
the precreate entry there and in tests/test_fastpath.py, texts aimed at each check the front makes before it lets a
container pass (types of process, process.env, annotations; keys in other cases, with escapes, non-ASCII; numbers
at the edge of what Python reads; nesting), hostile state JSON for prestart, and hypothesis' hostile text.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from oci_gpu_hook.host import launchers
from tests.helpers import containerlib as cl
from tests.helpers.hostiletexts import PRECREATE_INPUTS, REFUSED_SPECS, hostile_text
from tests.test_fastpath import GRANTED, OTHER

pytestmark = pytest.mark.skipif(launchers.find_cc() is None, reason="no C compiler")

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


def _texts() -> list[bytes]:
    texts = [t.encode("utf-8", "surrogateescape") for t, _m in REFUSED_SPECS]
    texts += [t.encode() for t in AIMED]
    texts += list(PRECREATE_INPUTS)
    texts += [t.encode() for name, t in GRANTED.items() if name != "huge"]
    texts += [t.encode("utf-8", "surrogateescape") for t in OTHER.values()]
    return list(dict.fromkeys(texts))


CORPUS = _texts()
FAKE_RUNTIME = '#!/bin/sh\necho "fake-runtime $#: $*"\nexit 3\n'


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("oracle")
    fake = base / "fake-runtime"
    fake.write_text(FAKE_RUNTIME)
    fake.chmod(0o755)
    config = base / "config.toml"
    config.write_text(f'sysfs_root = "{cl.SEED_SYSFS}"\nhook_path = "/bin/true"\nruntime = "{fake}"\n')
    defaults = {"OCI_GPU_HOOK_CONFIG": str(config)}
    launchers.write_launchers(str(base / "native"), defaults, native=True)
    launchers.write_launchers(str(base / "python"), defaults, native=False)
    bundle = base / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text('{"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin"]}}')
    return {"base": base, "native": base / "native", "python": base / "python", "bundle": bundle, "fake": fake}


def _run(argv: list[str], data: bytes, cwd: Path) -> tuple[int, bytes, bytes]:
    done = subprocess.run(argv, input=data, capture_output=True, env=cl.hook_env(), cwd=cwd, timeout=120)
    return done.returncode, done.stdout, done.stderr


def _both(install: dict[str, Path], name: str, args: list[str], data: bytes = b"",
          prepare: object = None) -> list[tuple[int, bytes, bytes, bytes | None]]:
    """(status, stdout, stderr, the bundle's config.json after) for the native front and the Python launcher."""
    results = []
    for kind in ("native", "python"):
        if callable(prepare):
            prepare()
        status, out, err = _run([str(install[kind] / name), *args], data, install["base"])
        config = install["bundle"] / "config.json"
        results.append((status, out, err, config.read_bytes() if config.exists() else None))
    return results


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
    header.write_text(launchers.front_header(name, str(install["native"]), {
        "OCI_GPU_HOOK_CONFIG": str(install["base"] / "config.toml")}, trust=True))
    driver = tmp_path / "driver.c"
    driver.write_text(DRIVER)
    binary, cc = tmp_path / "argc0", str(launchers.find_cc())
    subprocess.run([cc, "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", f'-DOGH_BAKED="{header}"',
                    "-Dmain=ogh_front_main", "-c", "-o", str(tmp_path / "front.o"), launchers.FRONT_SOURCE],
                   check=True, capture_output=True)
    subprocess.run([cc, "-o", str(binary), str(driver), str(tmp_path / "front.o")], check=True, capture_output=True)
    done = subprocess.run([str(binary)], capture_output=True, text=True, env=cl.hook_env(), timeout=60)
    if name == "oci-gpu-runtime":
        assert (done.returncode, done.stdout) == (3, "fake-runtime 0: \n"), done.stderr
    else:
        assert done.returncode == 2 and "usage" in done.stdout.lower(), (done.stdout, done.stderr)
