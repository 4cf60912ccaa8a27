"""One outcome with or without the planner: the native front answered by the resident planner and the Python-only
launchers of the same install give the same exit status, stdout and stderr, leave the same config.json and log the
same line (but for its time and duration), byte for byte, for every text of the hostile corpus
(tests/test_fastpath_oracle.py) and the requests of the container suite, through each entry point the planner
serves (precreate, prestart, the shim's create), under the environments that change what Python does (locales,
debug, bad values, another host, another config).  Which of them the planner answered is counted: the front
falls back to Python where it must (a clean config needs neither)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from oci_gpu_hook.fastpath import build as fastbuild
from oci_gpu_hook.install import launchers
from tests.conftest import need
from tests.helpers import containerlib as cl
from tests.helpers import imageenvs, plannerlib
from tests.helpers.hostiletexts import hostile_text
from tests.test_fastpath import GRANTED
from tests.test_fastpath_oracle import CORPUS, FAKE_RUNTIME, STATES

pytestmark = pytest.mark.skipif(fastbuild.find_cc() is None, reason="no C compiler")

HOSTS = cl.REPO / "examples" / "hosts"


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    need()  # the planner runs as root
    base = tmp_path_factory.mktemp("planner-oracle")
    fake = base / "fake-runtime"
    fake.write_text(FAKE_RUNTIME)
    fake.chmod(0o755)
    config, log = base / "config.toml", base / "hook.log"
    socket_path = base / "run" / "planner.sock"
    settings_text = f'sysfs_root = "{cl.SEED_SYSFS}"\nhook_path = "/bin/true"\nruntime = "{fake}"\nlog_file = "{log}"\n'
    config.write_text(settings_text)
    (base / "masking.toml").write_text(settings_text + "mask_other_gpus = true\ndevice_file_mode = 0o660\n")
    (base / "broken.toml").write_text("runtime = \n")
    for name in ("nvidia-4x-h100", "nvidia-2x-h100-mig", "amd-nvidia-2x2"):  # NVIDIA: /proc and the driver's files
        host = HOSTS / name
        proc = f'proc_root = "{host / "proc"}"\n' if (host / "proc").is_dir() else ""
        driver = f'driver_root = "{host / "driver"}"\n' if (host / "driver").is_dir() else ""
        (base / f"{name}.toml").write_text(settings_text.replace(str(cl.SEED_SYSFS), str(host / "sys")) + proc + driver)
    defaults = {"OCI_GPU_HOOK_CONFIG": str(config), "OCI_GPU_HOOK_PLANNER_SOCKET": str(socket_path)}
    launchers.write_launchers(str(base / "planner"), defaults, native=True)
    launchers.write_launchers(str(base / "python"), defaults, native=False)
    marker = base / "python-ran"
    for name in ("oci-gpu-hook.py", "oci-gpu-runtime.py"):
        script = base / "planner" / name
        first, rest = script.read_text().split("\n", 1)
        script.write_text(f"{first}\nimport sys\nif sys.argv[1:2] != ['serve']: open({str(marker)!r}, 'a').write("
                          f"'ran\\n')\n{rest}")
    bundle = base / "bundle"
    bundle.mkdir()
    return {"base": base, "config": config, "log": log, "socket": socket_path, "planner": base / "planner",
            "python": base / "python", "bundle": bundle, "marker": marker}


@pytest.fixture(scope="module")
def planner(install: dict[str, Path]) -> plannerlib.Planner:
    running = plannerlib.Planner(install["planner"] / "oci-gpu-hook", install["socket"],
                                 {**cl.hook_env(), "OCI_GPU_HOOK_CONFIG": str(install["config"])}, 3).start()
    yield running  # type: ignore[misc]
    assert running.stop() == 0
    assert "add it to PRELOAD" not in running.log.read_text()


def answered(install: dict[str, Path]) -> bool:
    """Whether the last run of the planner's launchers was answered without Python."""
    ran = install["marker"].exists()
    if ran:
        install["marker"].unlink()
    return not ran


def _log(install: dict[str, Path]) -> list[str]:
    if not install["log"].exists():
        return []
    return [re.sub(r'"(time|duration_ms)":[^,}]+', "", line) for line in install["log"].read_text().splitlines()]


def _tree(root: Path) -> list[tuple[str, int, str | bytes]]:
    """Every entry below ``root``: (path, mode, link target or contents)."""
    out: list[tuple[str, int, str | bytes]] = []
    for here, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            path = Path(here, name)
            mode = path.lstat().st_mode
            out.append((str(path.relative_to(root)), mode, os.readlink(path) if path.is_symlink() else
                        path.read_bytes() if path.is_file() else ""))
    return sorted(out)


def _both(install: dict[str, Path], name: str, args: list[str], data: bytes = b"", config_text: bytes | None = None,
          env: dict[str, str] | None = None, rootfs: Path | None = None) -> tuple[list[object], bool]:
    """[(status, stdout, stderr, config.json after, log lines)] for the planner's front and the Python launcher,
    and whether the planner answered the first.  ``rootfs``: made afresh (an empty /etc) before each, and what
    each left in it added to its result."""
    results: list[object] = []
    planned = False
    for kind in ("planner", "python"):
        if rootfs is not None:
            shutil.rmtree(rootfs, ignore_errors=True)
            (rootfs / "etc").mkdir(parents=True)
        config = install["bundle"] / "config.json"
        if config_text is not None:
            config.write_bytes(config_text)
        install["log"].unlink(missing_ok=True)
        done = subprocess.run([str(install[kind] / name), *args], input=data, capture_output=True,
                              env={**cl.hook_env(), **(env or {})}, cwd=install["base"], timeout=120)
        if kind == "planner":
            planned = answered(install)
        results.append((done.returncode, done.stdout, done.stderr, config.read_bytes() if config.exists() else None,
                        _log(install), _tree(rootfs) if rootfs is not None else None))
    return results, planned


def precreate(install: dict[str, Path], text: bytes, env: dict[str, str] | None = None) -> tuple[list[object], bool]:
    return _both(install, "oci-gpu-hook", ["precreate"], text, env=env)


def prestart(install: dict[str, Path], text: bytes, state: str | None = None,
             env: dict[str, str] | None = None) -> tuple[list[object], bool]:
    data = (state or json.dumps({"ociVersion": "1.0.2", "id": "c1", "pid": 1, "bundle": "BUNDLE"})).replace(
        "BUNDLE", str(install["bundle"])).encode("utf-8", "surrogateescape")
    return _both(install, "oci-gpu-hook", ["prestart"], data, text, env)


def create(install: dict[str, Path], text: bytes, env: dict[str, str] | None = None) -> tuple[list[object], bool]:
    args = ["--root", "/run/oracle", "create", "--bundle", str(install["bundle"]), "--pid-file", "/p", "c1"]
    return _both(install, "oci-gpu-runtime", args, b"", text, env)


ENTRIES = {"precreate": precreate, "prestart": prestart, "create": create}
COUNTS: dict[str, int] = {}


def agree(entry: str, install: dict[str, Path], text: bytes, env: dict[str, str] | None = None) -> bool:
    (planned_result, python_result), planned = ENTRIES[entry](install, text, env=env)
    assert planned_result == python_result
    COUNTS[entry + (" answered" if planned else " fell back")] = COUNTS.get(
        entry + (" answered" if planned else " fell back"), 0) + 1
    return planned


@pytest.mark.parametrize("entry", sorted(ENTRIES))
@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_the_hostile_corpus_agrees(install: dict[str, Path], planner: plannerlib.Planner, entry: str,
                                   text: bytes) -> None:
    agree(entry, install, text)


@pytest.mark.parametrize("state", STATES, ids=range(len(STATES)))
def test_hostile_states_agree(install: dict[str, Path], planner: plannerlib.Planner, state: str) -> None:
    text = json.dumps({"ociVersion": "1.0.2", "process": {"env": ["AMD_VISIBLE_DEVICES=1"]}, "root": {"path": "r"}})
    (planned_result, python_result), _planned = prestart(install, text.encode(), state)
    assert planned_result == python_result


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(hostile_text)
def test_hostile_text_agrees(install: dict[str, Path], planner: plannerlib.Planner, text: str) -> None:
    agree("precreate", install, text.encode("utf-8", "surrogateescape"))


def spec(env: list[str], annotations: dict[str, str] | None = None, **extra: object) -> bytes:
    value: dict[str, object] = {"ociVersion": "1.0.2", "process": {"args": ["/bin/sh"], "env": ["PATH=/bin", *env]},
                                "root": {"path": "rootfs"}, **extra}
    if annotations is not None:
        value["annotations"] = annotations
    return json.dumps(value, indent=1).encode()


# What the container suite asks for (tests/test_containers.py, containers/test_live_hook.py, test_hosts_containers.py,
# test_one_grant_containers.py, test_policy_consistency.py), each through every entry point.
REQUESTS = {
    "one": spec(["AMD_VISIBLE_DEVICES=1"]),
    "two": spec(["AMD_VISIBLE_DEVICES=0,5"]),
    "all": spec(["AMD_VISIBLE_DEVICES=all"]),
    "range": spec(["AMD_VISIBLE_DEVICES=2-4"]),
    "pci-and-index": spec(["AMD_VISIBLE_DEVICES=0000:c3:00.0,0"]),
    "last-entry-wins": spec(["AMD_VISIBLE_DEVICES=1", "AMD_VISIBLE_DEVICES=3"]),
    "none": spec(["AMD_VISIBLE_DEVICES=none"]),
    "empty": spec(["AMD_VISIBLE_DEVICES="]),
    "out-of-range": spec(["AMD_VISIBLE_DEVICES=8"]),
    "backwards": spec(["AMD_VISIBLE_DEVICES=5-2"]),
    "garbage": spec(["AMD_VISIBLE_DEVICES=gpu0"]),
    "intel-on-an-amd-host": spec(["INTEL_VISIBLE_DEVICES=0"]),
    "nvidia-on-an-amd-host": spec(["NVIDIA_VISIBLE_DEVICES=0"]),
    "nvidia-two": spec(["NVIDIA_VISIBLE_DEVICES=0,1", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]),
    "nvidia-all": spec(["NVIDIA_VISIBLE_DEVICES=all"]),
    "cuda-image": spec(imageenvs.CUDA_BASE),
    "cuda-image-and-amd": spec([*imageenvs.CUDA_BASE, "AMD_VISIBLE_DEVICES=1"]),
    "rocm-image": spec(imageenvs.ROCM),
    "two-kinds": spec(["AMD_VISIBLE_DEVICES=1", "INTEL_VISIBLE_DEVICES=all"]),
    "annotation": spec([], {"cdi.k8s.io/oci-gpu-hook_gpu": "amd.com/gpu=0000:23:00.0"}),
    "annotation-wins": spec(["AMD_VISIBLE_DEVICES=all"], {"cdi.k8s.io/x": "amd.com/gpu=2"}),
    "annotation-malformed": spec([], {"cdi.k8s.io/x": "amd.com/gpu"}),
    "annotation-other-vendor": spec([], {"cdi.k8s.io/x": "vendor.example/gpu=0"}),
    "annotation-nvidia-all": spec([], {"cdi.k8s.io/x": "nvidia.com/gpu=all"}),  # refused where the node has none
    "annotation-nvidia-none": spec(imageenvs.CUDA_BASE, {"cdi.k8s.io/x": "nvidia.com/gpu=none"}),
    "annotation-nvidia-all-and-amd": spec(imageenvs.CUDA_BASE, {"cdi.k8s.io/x": "amd.com/gpu=1,nvidia.com/gpu=all"}),
    "already-there": spec(["AMD_VISIBLE_DEVICES=1"], linux={"devices": [
        {"path": "/dev/dri/renderD129", "type": "c", "major": 226, "minor": 129}]}),
    "already-there-other": spec([], {"cdi.k8s.io/x": "amd.com/gpu=3"}, linux={"devices": [
        {"path": "/dev/dri/renderD129", "type": "c", "major": 226, "minor": 129}]}),
    "wildcard-deny": spec(["AMD_VISIBLE_DEVICES=1"], linux={"resources": {"devices": [
        {"allow": False, "access": "rwm"}, {"allow": False, "type": "c", "major": 226, "access": "rwm"}]}}),
    "hook-there": spec(["AMD_VISIBLE_DEVICES=1"], hooks={"createRuntime": [{"path": "/bin/true"}]}),
    "non-ascii": spec(["AMD_VISIBLE_DEVICES=1", "GREETING=gr\u00fc\u00df dich \u2603"]),
    "escaped-request": GRANTED["all-escaped"].encode(),
    "lone-surrogate-escape": spec(["AMD_VISIBLE_DEVICES=1"]).replace(b'"PATH=/bin"', b'"X=\\udcff"'),
}


@pytest.mark.parametrize("entry", sorted(ENTRIES))
@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_container_suite_requests_agree(install: dict[str, Path], planner: plannerlib.Planner, entry: str,
                                        name: str) -> None:
    planned = agree(entry, install, REQUESTS[name])
    if entry != "prestart" and name in ("one", "all", "annotation", "out-of-range", "non-ascii", "cuda-image-and-amd",
                                        "annotation-nvidia-all"):
        assert planned, (entry, name)  # granted, or refused, by the planner: no Python start


@pytest.mark.parametrize("entry", sorted(ENTRIES))
@pytest.mark.parametrize(("name", "host", "refused"), [
    ("annotation-nvidia-all", "", True), ("annotation-nvidia-all-and-amd", "", True),
    ("annotation-nvidia-all", "nvidia-host", False), ("annotation-nvidia-all-and-amd", "amd-nvidia-host", False),
    ("annotation-nvidia-none", "", False), ("cuda-image", "", False)])
def test_a_cdi_name_of_a_kind_the_node_lacks_is_refused_by_the_planner(install: dict[str, Path],
                                                                      planner: plannerlib.Planner, entry: str,
                                                                      name: str, host: str, refused: bool) -> None:
    """An annotation's ``nvidia.com/gpu=all`` on the AMD node: one refusal line through the planner as through
    Python; on a node with NVIDIA GPUs it grants them; ``none`` in it and the CUDA image's env start the container."""
    env = {k: v.replace("BASE", str(install["base"])) for k, v in ENVIRONMENTS[host].items()} if host else None
    (planned_result, python_result), _planned = ENTRIES[entry](install, REQUESTS[name], env=env)
    assert planned_result == python_result
    status, _stdout, stderr = python_result[:3]  # type: ignore[index]
    if refused:
        assert status == 1 and stderr == (b"oci-gpu-hook: error: cdi.k8s.io annotations=all: 'all' names no device: "
                                          b"this host has no nvidia GPUs (valid: none, which grants no nvidia GPU; a "
                                          b"CDI name must name a device this host has)\n"), stderr
    elif entry != "prestart" or not host:  # a grant through prestart then enters the state's pid 1: refused there
        assert status == (3 if entry == "create" else 0) and b"error" not in stderr, stderr
    else:
        assert b"names no device" not in stderr and b"container process 1" in stderr, stderr


# environments that change what Python does: its locale (stdio, C locale coercion), debug (tracebacks), values it
# refuses, another host, another config (masked paths, modes), a broken config, a runtime not there
ENVIRONMENTS = {
    "lang-c": {"LANG": "C"},
    "lc-all-c": {"LC_ALL": "C"},
    "lc-all-c-utf8": {"LC_ALL": "C.UTF-8"},
    "lang-posix": {"LANG": "POSIX"},
    "lc-ctype-missing-locale": {"LC_CTYPE": "xx_XX.UTF-8"},
    "debug": {"OCI_GPU_HOOK_DEBUG": "1"},
    "bad-bool": {"OCI_GPU_HOOK_DEBUG": "maybe"},
    "env-requests-off": {"OCI_GPU_HOOK_ALLOW_ENV_REQUESTS": "false"},
    "runtime-missing": {"OCI_GPU_HOOK_RUNTIME": "/nonexistent/runc"},
    "intel-amd-host": {"OCI_GPU_HOOK_SYSFS_ROOT": str(HOSTS / "intel-igpu-2x-gfx1100" / "sys")},
    "mi300x-cpx-host": {"OCI_GPU_HOOK_SYSFS_ROOT": str(HOSTS / "mi300x-2x-cpx" / "sys")},
    "masking-config": {"OCI_GPU_HOOK_CONFIG": "BASE/masking.toml"},
    "broken-config": {"OCI_GPU_HOOK_CONFIG": "BASE/broken.toml"},
    "missing-config": {"OCI_GPU_HOOK_CONFIG": "BASE/missing.toml"},
    "nvidia-host": {"OCI_GPU_HOOK_CONFIG": "BASE/nvidia-4x-h100.toml"},
    "nvidia-mig-host": {"OCI_GPU_HOOK_CONFIG": "BASE/nvidia-2x-h100-mig.toml"},
    "amd-nvidia-host": {"OCI_GPU_HOOK_CONFIG": "BASE/amd-nvidia-2x2.toml"},
    "no-path": {"PATH": ""},
    "odd-entries": {"A": "=", "B": "", "OCI_GPU_HOOK_X": "\u00e9"},
}


@pytest.mark.parametrize("entry", sorted(ENTRIES))
@pytest.mark.parametrize("request_name", ["one", "out-of-range", "lone-surrogate-escape", "non-ascii", "nvidia-two",
                                          "nvidia-all", "cuda-image-and-amd"])
@pytest.mark.parametrize("environment", sorted(ENVIRONMENTS))
def test_environments_agree(install: dict[str, Path], planner: plannerlib.Planner, entry: str, request_name: str,
                            environment: str) -> None:
    env = {k: v.replace("BASE", str(install["base"])) for k, v in ENVIRONMENTS[environment].items()}
    agree(entry, install, REQUESTS[request_name], env)


@pytest.mark.parametrize("entry", sorted(ENTRIES))
@pytest.mark.parametrize("request_name", ["none", "empty", "one", "nvidia-all", "annotation"])
@pytest.mark.parametrize("config", ["broken", "missing", "typo"])
def test_a_config_that_cannot_be_used_agrees(install: dict[str, Path], planner: plannerlib.Planner, entry: str,
                                             request_name: str, config: str) -> None:
    """The rule of oci_gpu_hook/config.py through the planner as through Python: what asks for nothing passes
    (the shim: to the runtime a pass-through command gets, here the variable's), the rest is refused alike."""
    typo = install["base"] / "typo.toml"
    typo.write_text(install["config"].read_text() + "mask_other_gpu = true\n")
    env = {"OCI_GPU_HOOK_CONFIG": str(install["base"] / f"{config}.toml"),
           "OCI_GPU_HOOK_RUNTIME": str(install["base"] / "fake-runtime")}
    (planned_result, python_result), planned = ENTRIES[entry](install, REQUESTS[request_name], env=env)
    assert planned_result == python_result
    assert planned or entry == "prestart"  # the front hands the file over; the planner, not Python, answers
    status, stdout, stderr = python_result[:3]  # type: ignore[index]
    if request_name in ("none", "empty"):
        assert b"oci-gpu-hook: warning: config file" in stderr and b"asks for no GPU" in stderr
        assert (status, stdout.startswith(b"fake-runtime ")) == ((3, True) if entry == "create" else (0, False))
    else:
        assert status == 1 and b"oci-gpu-hook: error: config file" in stderr


def test_zz_the_planner_answered_most(planner: plannerlib.Planner) -> None:
    """Not an oracle: the counts, so that a planner that always refuses cannot pass the tests above."""
    print(COUNTS)
    if COUNTS:
        assert sum(v for k, v in COUNTS.items() if k.endswith("answered")) > 0


@pytest.mark.parametrize("entry", ["create", "precreate"])
def test_the_ld_cache_written_before_create_agrees(install: dict[str, Path], planner: plannerlib.Planner,
                                                   entry: str) -> None:
    """An NVIDIA GPU where the root is a writable directory (the bundle's ``rootfs``; precreate's absolute): the
    planner's worker writes the driver's soname links and ld cache into it as the Python launcher does, byte for
    byte, and both hand on a spec without the ``ldcache`` hook."""
    rootfs = install["bundle"] / "rootfs"
    env = {"OCI_GPU_HOOK_CONFIG": str(install["base"] / "nvidia-4x-h100.toml")}
    try:
        if entry == "create":
            args = ["--root", "/run/oracle", "create", "--bundle", str(install["bundle"]), "--pid-file", "/p", "c1"]
            text = spec(["NVIDIA_VISIBLE_DEVICES=0"])
            (planned_result, python_result), planned = _both(install, "oci-gpu-runtime", args, b"", text, env,
                                                             rootfs)
        else:
            text = spec(["NVIDIA_VISIBLE_DEVICES=0"], root={"path": str(rootfs)})
            (planned_result, python_result), planned = _both(install, "oci-gpu-hook", ["precreate"], text,
                                                             env=env, rootfs=rootfs)
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
    assert planned and planned_result == python_result
    status, stdout, stderr, after, _log_lines, tree = python_result  # type: ignore[misc]
    assert status == (3 if entry == "create" else 0), stderr  # the fake runtime's status
    final = json.loads(after if entry == "create" else stdout)
    assert "ldcache" not in json.dumps(final.get("hooks", {})), final.get("hooks")
    made = {path: what for path, _mode, what in tree}
    assert made["usr/lib/x86_64-linux-gnu/libcuda.so.1"].startswith("libcuda.so."), made
    assert b"libcuda.so.1" in made["etc/ld.so.cache"]
