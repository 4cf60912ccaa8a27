"""The shim reads runc's argv as runc 1.1 does: every shape is run through the real runc and through the shim's
parser, and both must name the same bundle and container id, or both refuse the command line.

runc's choice is measured, not assumed: bundles A and B and the working directory C are real bundles whose
prestart hook writes the state (id, bundle) to a file; ``/nA``, ``/nB`` do not exist and runc says which one it
tried to enter ("chdir /nA: no such file").  The expected column is what runc 1.1.5 did here.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from oci_gpu_hook.oci_argv import REWRITE_COMMANDS, bundle_dir, container_id, parse_argv
from tests.helpers import containerlib as cl

pytestmark = pytest.mark.containers

REFUSED = None
# (argv with placeholders, what runc uses: a bundle label A/B/C(working dir), "chdir:PATH" for a bundle runc
# tried to enter and could not, "A@ID" for another container id than {ID}, or REFUSED where runc's argument
# parsing fails or it only prints help)
CASES: list[tuple[str, str | None]] = [
    ("run --bundle {A} --bundle {B} {ID}", "B"),
    ("run -b {A} -b {B} {ID}", "B"),
    ("run -b {A} --bundle={B} {ID}", REFUSED),
    ("run --bundle={A} -b {B} {ID}", REFUSED),
    ("run -bundle {A} {ID}", "A"),
    ("run -bundle={B} {ID}", "B"),
    ("run --b {A} {ID}", "A"),
    ("run -b={A} {ID}", "A"),
    ("run {ID} --bundle {A}", "A"),
    ("run {ID} -b {B} --detach", "B"),
    ("run --bundle {A} -- {ID}", "A"),
    ("run -- --bundle {A} {ID}", REFUSED),
    ("run {ID} -- --bundle {A}", REFUSED),
    ("run -b {A} -b {B} -- {ID}", "B"),
    ("run --bundle {A} {ID} --bundle {B}", "B"),
    ("run {ID}", "C"),
    ("run --bundle= {ID}", "C"),
    ("run --bundle {A} --bundle= {ID}", "C"),
    ("run ---bundle {A} {ID}", REFUSED),
    ("run --bundle", REFUSED),
    ("run --bundle {A} -x {ID}", REFUSED),
    ("run -db {A} {ID}", REFUSED),
    ("run -d -b {A} {ID}", "A"),
    ("run --detach=true --bundle {B} {ID}", "B"),
    ("run --detach=yes -b {A} {ID}", REFUSED),
    ("run --keep -b {A} {ID}", "A"),
    ("run --keep {ID} -b {A}", REFUSED),
    ("run --no-pivot --no-new-keyring -b {A} {ID}", "A"),
    ("run --no-pivot=false -b {B} {ID}", "B"),
    ("run --no-subreaper -b {A} {ID}", "A"),
    ("run --preserve-fds 0 -b {A} {ID}", "A"),
    ("run --preserve-fds=0x0 -b {B} {ID}", "B"),
    ("run --preserve-fds {ID} -b {A}", REFUSED),
    ("run --preserve-fds=zero -b {A} {ID}", REFUSED),
    ("run --preserve-fds=0_0 -b {A} {ID}", "A"),
    ("run --preserve-fds 08 -b {A} {ID}", REFUSED),
    ("run --preserve-fds=0b0 -b {B} {ID}", "B"),
    ("run --preserve-fds=+00 -b {A} {ID}", "A"),
    ("run --preserve-fds=_0 -b {A} {ID}", REFUSED),
    ("run --pid-file {PID} --bundle {A} {ID}", "A"),
    ("run --pid-file --bundle {A} {ID}", REFUSED),
    ("run --bundle -weird {ID}", "chdir:-weird"),
    ("run --bundle -- {ID}", "chdir:--"),
    ("run --bundle /nA --bundle /nB {ID}", "chdir:/nB"),
    ("run {ID} -b /nA -b {A}", "A"),
    ("run -b {A} {ID} extra", REFUSED),
    ("run -b {A}", REFUSED),
    ("run -h", REFUSED),
    ("run --bundle {A} --help {ID}", REFUSED),
    ("run --help=false -b {A} {ID}", "A"),
    ("create --bundle {A} --bundle {B} {ID}", "B"),
    ("create -b {A} {ID} -b {B}", "B"),
    ("create --pid-file={PID} {ID} --bundle {B}", "B"),
    ("create --detach -b {A} {ID}", REFUSED),
    ("create {ID} --keep", REFUSED),
    ("create --no-pivot -b {A} -- {ID}", "A"),
    ("--root {ROOT2} run -b {A} {ID}", "A"),
    ("--root={ROOT2} --root {ROOT} run -b {B} {ID}", "B"),
    ("--debug run -b {A} {ID}", "A"),
    ("--debug=false run -b {A} {ID}", "A"),
    ("--debug false run -b {A} {ID}", REFUSED),
    ("--log {LOG} --log-format json run -b {B} {ID}", "B"),
    ("-log={LOG} -log-format=text run {ID} -b {A}", "A"),
    ("--log-format=xml run -b {A} {ID}", REFUSED),
    ("--criu /nonexistent/criu run -b {A} {ID}", "A"),
    ("--help run -b {A} {ID}", REFUSED),
    ("-v run -b {A} {ID}", REFUSED),
    ("--nonsense run -b {A} {ID}", REFUSED),
    ("- run -b {A} {ID}", REFUSED),
    ("-- run -b {B} {ID}", "B"),
    ("--root run -b {A} {ID}", REFUSED),
    ("run --root {ROOT2} -b {A} {ID}", REFUSED),
    ("--rootless=false run -b {B} {ID}", "B"),
    ("--systemd-cgroup run -b /nA {ID}", "chdir:/nA"),
    ("--systemd-cgroup=false --debug=1 run -b {A} {ID}", "A"),
    ("run -b {A} -d=false --keep=0 {ID}", "A"),
    ("run -b {A} - ", REFUSED),
    ("run -b {A} -", "A@-"),  # the container id is "-"
]

PARSE_ERRORS = ("flag provided but not defined", "Cannot use two forms", "requires exactly", "bad flag syntax",
                "flag needs an argument", "invalid value", "invalid boolean", "Incorrect Usage", "No help topic",
                "invalid log-format", "container id cannot be empty")


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    cl.need("runc", "busybox")
    base = tmp_path_factory.mktemp("argv")
    rootfs = cl.make_rootfs(base / "rootfs")
    record = base / "state.json"
    paths = {"base": base, "record": record, "ROOT": base / "root", "ROOT2": base / "root2",
             "LOG": base / "runc.log", "PID": base / "pid"}
    for label in ("A", "B", "C"):
        bundle = cl.make_bundle(base / label, rootfs, [], ["/bin/true"])
        cl.edit_spec(bundle, lambda spec: spec.update(hooks={"prestart": [
            {"path": "/bin/sh", "args": ["sh", "-c", f"cat > {record}"]}]}))
        paths[label] = bundle
    return paths


def _argv(shape: str, place: dict[str, Path], cid: str) -> list[str]:
    words = shape.split(" ")
    return [w.format(ID=cid, **{k: str(v) for k, v in place.items()}) for w in words]


def runc_choice(argv: list[str], place: dict[str, Path], cid: str) -> tuple[str, str] | None:
    """(bundle, id) that runc used: from the prestart hook's state, or the bundle runc could not enter."""
    place["record"].unlink(missing_ok=True)
    out, err = place["base"] / "out", place["base"] / "err"
    try:  # files, not pipes: a created container holds its stdio open until it is deleted
        with out.open("w") as stdout, err.open("w") as stderr:
            code = subprocess.run(["runc", "--root", str(place["ROOT"]), *argv], stdin=subprocess.DEVNULL,
                                  stdout=stdout, stderr=stderr, cwd=place["C"], timeout=60).returncode
    finally:
        for root in (place["ROOT"], place["ROOT2"]):
            subprocess.run(["runc", "--root", str(root), "delete", "-f", cid], capture_output=True)
    done = subprocess.CompletedProcess(argv, code, out.read_text(), err.read_text())
    if place["record"].exists():
        state = json.loads(place["record"].read_text())
        return state["bundle"], state["id"]
    entered = re.search(r"chdir (.*?): no such file", done.stderr)
    if entered:
        return entered.group(1), cid
    assert done.returncode != 0 or "USAGE" in done.stdout or "runc version" in done.stdout, (argv, done.stdout)
    assert done.returncode == 0 or any(e in done.stderr for e in PARSE_ERRORS), (argv, done.stderr)
    return None


def shim_choice(argv: list[str], place: dict[str, Path]) -> tuple[str, str] | None:
    """(bundle, id) that the shim would rewrite, in runc's working directory; None: the shim rewrites nothing."""
    command, _options, rest = parse_argv(["--root", str(place["ROOT"]), *argv])
    if command not in REWRITE_COMMANDS:
        return None
    return bundle_dir(rest, command), container_id(rest, command)


@pytest.mark.parametrize(("shape", "expected"), CASES, ids=[c[0] for c in CASES])
def test_shim_and_runc_choose_the_same_bundle(place: dict[str, Path], shape: str, expected: str | None,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    cid = f"ogh-argv-{uuid.uuid4().hex[:10]}"
    argv = _argv(shape, place, cid)
    if expected is None:
        want = None
    elif expected.startswith("chdir:"):
        want = (expected[6:], cid)
    else:
        label, _at, named = expected.partition("@")
        want = (str(place[label]), named or cid)
    assert runc_choice(argv, place, cid) == want, "runc 1.1 itself did otherwise than the table says"
    monkeypatch.chdir(place["C"])
    assert shim_choice(argv, place) == want, "the shim would rewrite another bundle than runc uses"


def test_shim_rewrites_the_bundle_runc_runs(place: dict[str, Path], tmp_path: Path) -> None:
    """End to end: ``oci-gpu-runtime run --bundle A --bundle B`` grants the GPU in B, the container runc runs,
    and leaves A alone."""
    paths = cl.hook_setup(tmp_path)
    a = cl.make_bundle(tmp_path / "a", paths["rootfs"], ["AMD_VISIBLE_DEVICES=1"])
    b = cl.make_bundle(tmp_path / "b", paths["rootfs"], ["AMD_VISIBLE_DEVICES=5"])
    before = a.joinpath("config.json").read_text()
    cid = cl.container_id()
    done = cl.run([str(paths["runtime"]), "run", "--bundle", str(a), "--bundle", str(b), cid], env=cl.hook_env())
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [5])
    assert a.joinpath("config.json").read_text() == before


def test_shim_leaves_two_forms_to_runc(place: dict[str, Path], tmp_path: Path) -> None:
    """``-b A --bundle=B``: runc refuses; the shim rewrites neither bundle and runc prints its own error."""
    paths = cl.hook_setup(tmp_path)
    a = cl.make_bundle(tmp_path / "a", paths["rootfs"], ["AMD_VISIBLE_DEVICES=1"])
    b = cl.make_bundle(tmp_path / "b", paths["rootfs"], ["AMD_VISIBLE_DEVICES=5"])
    texts = [p.joinpath("config.json").read_text() for p in (a, b)]
    done = cl.run([str(paths["runtime"]), "run", "-b", str(a), f"--bundle={b}", cl.container_id()],
                  env=cl.hook_env())
    assert done.returncode != 0
    assert "Cannot use two forms of the same flag" in done.stderr
    assert [p.joinpath("config.json").read_text() for p in (a, b)] == texts
