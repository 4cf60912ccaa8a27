"""The shim under crun: the config file it rewrites is the one crun opens, for every way crun's argp lets a
command line name it (``-bDIR``, ``--bund DIR``, ``--bundle=DIR``, ``-f``/``--config FILE``, options ending at the
container id, ...), and the native front either reads the same form or hands over to Python.

crun's choice is measured, not assumed: Debian's crun 1.8 cannot start containers on these machines (hybrid
cgroups; it raises resource limits the sandbox refuses), but it opens the config file before any of that, and
``strace`` shows which one.  Every config file here is "not json", so crun stops right after opening it.  A stub
named ``crun`` on PATH then shows the shim's end of it: the GPU request lands in the file crun would read.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from oci_gpu_hook.entry.runtime import dialect
from oci_gpu_hook.fastpath import build as fastbuild
from oci_gpu_hook.install import launchers
from oci_gpu_hook.oci_argv import CRUN, REWRITE_COMMANDS, RUNC, config_path, container_id, parse_argv
from tests.helpers import containerlib as cl

REFUSED = None
# (argv with placeholders, the config file crun opens: "A", "B", "C" for that directory's config.json (C is the
# working directory), "C/other.json" for another file, or REFUSED where crun opens none and parses no container)
CASES: list[tuple[str, str | None]] = [
    ("create --bundle {A} {ID}", "A"),
    ("create --bundle={A} {ID}", "A"),
    ("create -b {A} {ID}", "A"),
    ("create -b{A} {ID}", "A"),
    ("create --bund {A} {ID}", "A"),
    ("create --b={A} {ID}", "A"),
    ("create -b ../A {ID}", "A"),
    ("create --bundle {A} --bundle {B} {ID}", "B"),
    ("create -b {A} --bundle={B} {ID}", "B"),  # runc refuses two forms; crun takes the last
    ("create {ID}", "C"),
    ("create -- {ID}", "C"),
    ("create -b {A} -- {ID}", "A"),
    ("create -f {B}/config.json {ID}", "B"),
    ("create -f{B}/config.json -b {A} {ID}", "B"),
    ("create -b {A} --config {B}/config.json {ID}", "B"),
    ("create -b {A} --conf={B}/config.json {ID}", "B"),
    ("create -b {A} -f config.json {ID}", "A"),  # that very name: the bundle's
    ("create -b {A} -f ./config.json {ID}", "C"),  # any other name: from the working directory
    ("create -b {A} -f other.json {ID}", "C/other.json"),
    ("create -b {A} -f ../B/config.json {ID}", "B"),
    ("create -f {B}/config.json -f {A}/config.json {ID}", "A"),
    ("create -b ../A -f config.json {ID}", "A"),
    ("create -fconfig.json -b {B} {ID}", "B"),
    ("create -b {A} --conf other.json {ID}", "C/other.json"),
    ("create --no-p -b {A} {ID}", "A"),  # a prefix of --no-pivot alone
    ("create --pid-file=/p --pre 0 -b {A} {ID}", "A"),
    ("create --console-socket {A}/s -b {B} {ID}", "B"),
    ("create --program-name x -b {A} {ID}", "A"),
    ("create --HANG=0 -b {A} {ID}", "A"),
    ("create -b {A} {EMPTY}", "A"),  # an empty id still reads the config
    ("run -db {A} {ID}", "A"),
    ("run --bund {A} -d {ID}", "A"),
    ("run -d -f {B}/config.json {ID}", "B"),
    ("create -db {A} {ID}", REFUSED),  # create has no -d
    ("create --c {A} {ID}", REFUSED),  # ambiguous: --config, --console-socket
    ("create --no -b {A} {ID}", REFUSED),
    ("create --p x -b {A} {ID}", REFUSED),
    ("create --no-pivot=1 -b {A} {ID}", REFUSED),
    ("create --bundlex {A} {ID}", REFUSED),
    ("create -x -b {A} {ID}", REFUSED),
    ("create -b {A} {ID} extra", REFUSED),
    ("create {ID} -b {A}", REFUSED),  # the options end at the id
    ("create -- -b {A} {ID}", REFUSED),
    ("create -b", REFUSED),
    ("create", REFUSED),
    ("create -b {A} --help {ID}", REFUSED),
    ("create -? {ID}", REFUSED),
    ("create --usage -b {A} {ID}", REFUSED),
    ("create --bundle= {ID}", REFUSED),
    ("create -b {A} --config= {ID}", REFUSED),
    ("run --detach=1 -b {A} {ID}", REFUSED),
    ("--root {ROOT} create -b {A} {ID}", "A"),
    ("--r {ROOT} create -b {A} {ID}", "A"),
    ("--debug --systemd-cgroup create -b {A} {ID}", "A"),
    ("--cgroup-manager=disabled create -b {A} {ID}", "A"),
    ("--cgroup-manager bogus create -b {A} {ID}", REFUSED),
    ("--log-format=json --log={LOG} create -b {A} {ID}", "A"),
    ("--log=file:{LOG} create -b {B} {ID}", "B"),
    ("--log-format=xml create -b {A} {ID}", REFUSED),
    ("--log=bogus:x create -b {A} {ID}", REFUSED),
    ("--l {LOG} create -b {A} {ID}", REFUSED),  # ambiguous: --log, --log-format
    ("--rootless=true create -b {A} {ID}", "A"),
    ("--root create -b {A} {ID}", REFUSED),  # the root is "create"; then -b is no global option
    ("-- create -b {A} {ID}", "A"),
    ("--version create -b {A} {ID}", REFUSED),
    ("bogus -b {A} {ID}", REFUSED),
]


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("crun")
    paths = {"base": base, "ROOT": base / "root", "LOG": base / "crun.log"}
    for label in ("A", "B", "C"):
        (base / label).mkdir()
        (base / label / "config.json").write_text("not json")
        paths[label] = base / label
    (base / "C" / "other.json").write_text("not json")
    return paths


def _argv(shape: str, place: dict[str, Path], cid: str) -> list[str]:
    values = {k: str(v) for k, v in place.items()} | {"ID": cid, "EMPTY": ""}
    return [word.format(**values) for word in shape.split(" ")]


def _expected(label: str | None, place: dict[str, Path]) -> str | None:
    if label is None:
        return None
    directory, _slash, name = label.partition("/")
    return str(place[directory] / (name or "config.json"))


def shim_choice(argv: list[str]) -> str | None:
    """The config file the shim rewrites for ``crun ARGV``, in the working directory; None: it rewrites nothing."""
    command, _options, rest = parse_argv(argv, CRUN)
    if command not in REWRITE_COMMANDS:
        return None
    return os.path.normpath(config_path(rest, command, CRUN))


def crun_choice(argv: list[str], place: dict[str, Path], tmp_path: Path) -> str | None:
    """The config file that real crun opens for ``crun ARGV``, from strace; None when it opens none."""
    trace = tmp_path / "trace"
    subprocess.run(["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=openat,chdir", "crun", *argv],
                   stdin=subprocess.DEVNULL, capture_output=True, cwd=place["C"], timeout=60)
    cwd = str(place["C"])
    opened = []
    for line in trace.read_text().splitlines():
        chdir = re.search(r'chdir\("(.*)"\) += 0', line)
        if chdir:
            cwd = os.path.join(cwd, chdir.group(1))
        config = re.search(r'openat\(AT_FDCWD, "([^"]*\.json)"', line)
        if config:
            opened.append(os.path.normpath(os.path.join(cwd, config.group(1))))
    assert len(opened) <= 1, opened
    return opened[0] if opened else None


@pytest.mark.parametrize(("shape", "expected"), CASES, ids=[c[0] for c in CASES])
def test_shim_and_crun_choose_the_same_config(place: dict[str, Path], shape: str, expected: str | None,
                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not (shutil.which("crun") and shutil.which("strace")):
        pytest.skip("needs crun and strace (apt-get install crun strace)")
    argv = _argv(shape, place, f"ogh-crun-{os.getpid()}")
    want = _expected(expected, place)
    assert crun_choice(argv, place, tmp_path) == want, "crun itself did otherwise than the table says"
    monkeypatch.chdir(place["C"])
    assert shim_choice(argv) == want, "the shim would rewrite another file than crun opens"


@pytest.mark.parametrize(("shape", "expected"), CASES, ids=[c[0] for c in CASES])
def test_the_table_without_crun(place: dict[str, Path], shape: str, expected: str | None,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The shim's reading of the same table, where crun is not installed."""
    monkeypatch.chdir(place["C"])
    assert shim_choice(_argv(shape, place, "c1")) == _expected(expected, place)


# Command lines that crun 1.8 refuses and later releases read (options added since): the shim rewrites the file
# those read (harmless where the crun at hand refuses; a missed rewrite would not be).
LATER_RELEASES = [
    ("run --keep -b {A} {ID}", "A"),  # 1.16
    ("run --k -d -b {A} {ID}", "A"),
    ("--log-level=debug create -b {A} {ID}", "A"),  # 1.18
    ("--log- json create -b {A} {ID}", "A"),  # 1.8 to 1.16: --log-format; ambiguous since
    ("--r {ROOT} create -b {B} {ID}", "B"),  # --root until --rootless got its own key
    ("create --keep -b {A} {ID}", REFUSED),  # never an option of create
]


@pytest.mark.parametrize(("shape", "expected"), LATER_RELEASES, ids=[c[0] for c in LATER_RELEASES])
def test_what_later_crun_releases_read(place: dict[str, Path], shape: str, expected: str | None,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(place["C"])
    assert shim_choice(_argv(shape, place, "c1")) == _expected(expected, place)


def test_container_id_and_options() -> None:
    argv = ["--log", "file:/l", "--log-format", "json", "--root=/r", "run", "-db/b", "--pid-file", "/p", "c9"]
    command, options, rest = parse_argv(argv, CRUN)
    assert (command, options, rest) == ("run", {"--log": "/l", "--log-format": "json", "--root": "/r"}, argv[6:])
    assert container_id(rest, "run", CRUN) == "c9"
    assert parse_argv(["--log=journald:x", "state", "c1"], CRUN)[1] == {}  # no file to put an error in
    assert parse_argv(["state", "c1"], CRUN) == ("state", {}, ["c1"])
    assert parse_argv(["-v"], CRUN)[0] is None


# The forms podman (conmon), containerd and Docker write: runc and crun read them alike, and the native front
# reads them itself.
COMMON = [
    "--root /run/r --log /run/l --log-format json --systemd-cgroup create --bundle {A} --pid-file /p {ID}",
    "--root=/run/r --log=/run/l --log-format=json create --bundle {A} --pid-file /p --console-socket /s {ID}",
    "--debug create -b {A} --no-pivot --no-new-keyring --preserve-fds 3 {ID}",
    "create --bundle={A} {ID}",
    "run -d --bundle {A} {ID}",
    "run --detach -b {A} --pid-file=/p {ID}",
    "create {ID}",
]


@pytest.mark.parametrize("shape", COMMON)
def test_common_forms_read_alike(place: dict[str, Path], shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(place["C"])
    argv = _argv(shape, place, "c1")
    readings = set()
    for kind in (RUNC, CRUN):
        command, _options, rest = parse_argv(argv, kind)
        assert command in REWRITE_COMMANDS
        readings.add((os.path.normpath(config_path(rest, command, kind)), container_id(rest, command, kind)))
    assert len(readings) == 1


def test_dialect(tmp_path: Path) -> None:
    for name in ("crun", "crun-wasm", "krun"):
        assert dialect(f"/usr/bin/{name}") == CRUN
    for name in ("runc", "youki", "runsc", "crunch", "oci-gpu-runtime"):
        assert dialect(f"/usr/bin/{name}") == RUNC
    (tmp_path / "crun").write_text("")
    (tmp_path / "my-runtime").symlink_to(tmp_path / "crun")
    assert dialect(str(tmp_path / "my-runtime")) == CRUN  # as its links resolve


# ------------------------------------------------------------------ a stub named crun

STUB = """#!/bin/sh
for a in "$@"; do printf '%s\\0' "$a"; done > "$STUB_OUT/argv"
echo "crun stub"
"""
GPU1 = "/dev/dri/renderD129"
KINDS = [pytest.param(True, id="native", marks=pytest.mark.skipif(fastbuild.find_cc() is None, reason="no cc")),
         pytest.param(False, id="python")]


def _spec(env: list[str]) -> str:
    spec = json.loads((cl.REPO / "examples" / "bundle" / "config.json").read_text())
    spec["process"]["env"] = ["PATH=/bin", *env]
    return json.dumps(spec, indent=2)


def _stub_setup(base: Path, native: bool) -> tuple[Path, dict[str, str]]:
    stub_dir = base / "stub"
    stub_dir.mkdir()
    stub = stub_dir / "crun"
    stub.write_text(STUB)
    stub.chmod(0o755)
    config = base / "config.toml"
    config.write_text(f'runtime = "crun"\nsysfs_root = "{cl.SEED_SYSFS}"\nhook_path = "/bin/true"\n'
                      f'by_path_dir = "{base / "by-path"}"\n')
    launchers.write_launchers(str(base / "bin"), {"OCI_GPU_HOOK_CONFIG": str(config)}, native=native)
    env = {"PATH": f"{stub_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", "STUB_OUT": str(base)}
    return base / "bin" / "oci-gpu-runtime", env


# (argv, the file crun reads): a GPU request in that file must be granted there, every other file left alone
STUB_CASES = [
    ("create -b{A} {ID}", "A"),
    ("create --bund {A} {ID}", "A"),
    ("create -b {A} -f {B}/config.json {ID}", "B"),
    ("create --conf {B}/config.json --bundle {A} {ID}", "B"),
    ("create -b {A} -f other.json {ID}", "C/other.json"),
    ("run -db {A} {ID}", "A"),
    ("create --bundle {A} {ID}", "A"),  # the common form
]


@pytest.mark.parametrize("native", KINDS)
@pytest.mark.parametrize(("shape", "target"), STUB_CASES, ids=[c[0] for c in STUB_CASES])
def test_a_gpu_request_reaches_the_file_crun_reads(tmp_path: Path, native: bool, shape: str, target: str) -> None:
    shim, env = _stub_setup(tmp_path, native)
    files = {"A": tmp_path / "A" / "config.json", "B": tmp_path / "B" / "config.json",
             "C": tmp_path / "C" / "config.json", "C/other.json": tmp_path / "C" / "other.json"}
    for path in files.values():
        path.parent.mkdir(exist_ok=True)
        path.write_text(_spec(["AMD_VISIBLE_DEVICES=1"]))
    untouched = _spec(["AMD_VISIBLE_DEVICES=1"])
    place = {"A": tmp_path / "A", "B": tmp_path / "B", "C": tmp_path / "C"}
    argv = _argv(shape, place, "c1")
    done = subprocess.run([str(shim), *argv], capture_output=True, text=True, env=env, cwd=tmp_path / "C",
                          timeout=120)
    assert (done.returncode, done.stdout) == (0, "crun stub\n"), done.stderr
    assert (tmp_path / "argv").read_text().split("\0")[:-1] == argv  # crun gets the argv as it was
    for label, path in files.items():
        spec = json.loads(path.read_text())
        nodes = [d["path"] for d in spec.get("linux", {}).get("devices", [])]
        if label == target:
            assert GPU1 in nodes, (label, nodes)
        else:
            assert path.read_text() == untouched, label


@pytest.mark.parametrize("native", KINDS)
def test_a_clean_config_in_a_crun_form(tmp_path: Path, native: bool) -> None:
    """No request, a form only crun reads (``-bDIR``): the front hands over, Python passes it on untouched."""
    shim, env = _stub_setup(tmp_path, native)
    bundle = tmp_path / "A"
    bundle.mkdir()
    (bundle / "config.json").write_text(_spec(["FOO=1"]))
    done = subprocess.run([str(shim), "create", f"-b{bundle}", "c1"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, "crun stub\n", "")
    assert (bundle / "config.json").read_text() == _spec(["FOO=1"])


@pytest.mark.parametrize("native", KINDS)
def test_crun_refusals_are_left_to_crun(tmp_path: Path, native: bool) -> None:
    """A command line crun refuses before it opens a config: nothing rewritten, crun says why."""
    shim, env = _stub_setup(tmp_path, native)
    bundle = tmp_path / "A"
    bundle.mkdir()
    (bundle / "config.json").write_text(_spec(["AMD_VISIBLE_DEVICES=1"]))
    for argv in (["create", "c1", "-b", str(bundle)], ["create", "--c", str(bundle), "c1"]):
        done = subprocess.run([str(shim), *argv], capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=120)
        assert (done.returncode, done.stdout) == (0, "crun stub\n"), done.stderr
        assert (bundle / "config.json").read_text() == _spec(["AMD_VISIBLE_DEVICES=1"])


# ------------------------------------------------------------------ one outcome per command line

RUNC_SHAPES = ["create --b {A} {ID}", "create --b={A} {ID}", "create -b={A} {ID}", "create -bundle {A} {ID}",
               "create -bundle={A} {ID}", "create {ID} --bundle {A}", "create {ID} -b {A}",
               "create -b {A} --bundle={B} {ID}", "create --bundle {A} --bundle {B} {ID}", "run -d -b {A} {ID}",
               "run --detach=true -b {A} {ID}", "create --no-pivot=false -b {A} {ID}", "--root={ROOT} create {ID}",
               "create --preserve-fds 08 -b {A} {ID}", "create --preserve-fds=0x1 -b {A} {ID}",
               "create --bundle -x {ID}", "--log-format json create -b {A} {ID}", "create -b {A}/ {ID}"]
SHAPES = list(dict.fromkeys([c[0] for c in CASES] + COMMON + RUNC_SHAPES))


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if fastbuild.find_cc() is None:
        pytest.skip("no cc")
    base = tmp_path_factory.mktemp("argv-oracle")
    paths = {"base": base, "ROOT": base / "root", "LOG": base / "log"}
    for runtime in ("runc", "crun"):
        stub_dir = base / f"stub-{runtime}"
        stub_dir.mkdir()
        (stub_dir / runtime).write_text(STUB)
        (stub_dir / runtime).chmod(0o755)
        config = base / f"{runtime}.toml"
        config.write_text(f'runtime = "{runtime}"\nsysfs_root = "{cl.SEED_SYSFS}"\nhook_path = "/bin/true"\n'
                          f'by_path_dir = "{base / "by-path"}"\n')
        for native in (True, False):
            launchers.write_launchers(str(base / f"{runtime}-{native}"), {"OCI_GPU_HOOK_CONFIG": str(config)},
                                      native=native)
    for label in ("A", "B", "C"):
        (base / label).mkdir()
        paths[label] = base / label
    return paths


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("where", ["A", "B", "C", "C/other.json", None])
@pytest.mark.parametrize("shape", SHAPES)
def test_native_and_python_shims_agree(both: dict[str, Path], runtime: str, where: str | None, shape: str) -> None:
    """For every command line, with the one GPU request in any one of the files a runtime could open (or in none):
    the native front and the Python launcher give the same status and output and leave the same files, under runc's
    rules and under crun's."""
    files = [both["A"] / "config.json", both["B"] / "config.json", both["C"] / "config.json",
             both["C"] / "other.json"]
    target = _expected(where, both) if where else None
    argv = _argv(shape, both, "c1")
    env = {"PATH": f"{both['base'] / f'stub-{runtime}'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
           "STUB_OUT": str(both["base"])}
    results = []
    for native in (True, False):
        for path in files:
            path.write_text(_spec(["AMD_VISIBLE_DEVICES=1"] if str(path) == target else ["FOO=1"]))
        done = subprocess.run([str(both["base"] / f"{runtime}-{native}" / "oci-gpu-runtime"), *argv],
                              capture_output=True, text=True, env=env, cwd=both["C"], timeout=120)
        results.append((done.returncode, done.stdout, done.stderr, [p.read_text() for p in files]))
    assert results[0] == results[1]


# ------------------------------------------------------------------ real crun containers

CONTAINER_FORMS = {"-bDIR": ["-b{bundle}"], "--bund DIR": ["--bund", "{bundle}"],
                   "-f FILE": ["--bundle", "{bundle}", "-f", "{elsewhere}"]}


@pytest.mark.containers
@pytest.mark.parametrize("native", KINDS)
@pytest.mark.parametrize("form", list(CONTAINER_FORMS))
def test_real_crun_container_gets_the_gpu(tmp_path: Path, native: bool, form: str) -> None:
    """crun 1.8 runs containers here only without cgroups (``--cgroup-manager=disabled``, cgroup2 mounted in a
    private mount namespace: with hybrid cgroups it refuses, and its eBPF device filter needs an RLIMIT_MEMLOCK the
    sandbox will not raise), so this shows the node of the request in the container crun starts, not the device
    cgroup; runc's tests show that."""
    if not shutil.which("crun"):
        pytest.skip("needs crun (apt-get install crun)")
    cl.need("unshare", "busybox", "runc")
    rootfs = cl.make_rootfs(tmp_path / "rootfs")
    bundle = cl.make_bundle(tmp_path / "bundle", rootfs, [], ["/bin/sh", "-c", "ls /dev/dri; echo done"])
    spec = json.loads((bundle / "config.json").read_text())
    elsewhere = tmp_path / "elsewhere.json"
    if form == "-f FILE":  # the request only in the file crun reads
        process = {**spec["process"], "env": [*spec["process"]["env"], "AMD_VISIBLE_DEVICES=1"]}
        elsewhere.write_text(json.dumps({**spec, "process": process}))
    else:
        spec["process"]["env"].append("AMD_VISIBLE_DEVICES=1")
        (bundle / "config.json").write_text(json.dumps(spec))
    # The links hook's stand-in reads the state crun writes to it: /bin/true may exit before crun 1.8 has written
    # it, and crun then fails the container ("writing to pipe: Broken pipe"), a race of the stand-in, not the shim.
    hook = tmp_path / "links-hook"
    hook.write_text("#!/bin/sh\nexec cat >/dev/null\n")
    hook.chmod(0o755)
    config = tmp_path / "config.toml"
    config.write_text(f'runtime = "crun"\nsysfs_root = "{cl.SEED_SYSFS}"\nhook_path = "{hook}"\n')
    launchers.write_launchers(str(tmp_path / "bin"), {"OCI_GPU_HOOK_CONFIG": str(config)}, native=native)
    words = [w.format(bundle=bundle, elsewhere=elsewhere) for w in CONTAINER_FORMS[form]]
    shim = [str(tmp_path / "bin" / "oci-gpu-runtime"), "--root", str(tmp_path / "state"), "--cgroup-manager=disabled",
            "run", *words, cl.container_id()]
    done = cl.run(["unshare", "-m", "sh", "-c", 'mount -t cgroup2 none /sys/fs/cgroup && exec "$@"', "sh", *shim],
                  env=cl.hook_env())
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "renderD129" in done.stdout.split() and "done" in done.stdout, (done.stdout, done.stderr)
