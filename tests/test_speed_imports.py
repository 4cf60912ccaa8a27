"""The per-container path's imports, pinned: every entry point, with a config file present, run under
``python -X importtime -I -S`` as the launchers run it; what it imports beyond the interpreter's own start
must be in its set of :data:`oci_gpu_hook.startpath.ENTRIES`.  A new import on this path costs every container
its time: add it there only with a measurement (tests/test_startpath.py holds each module's own imports)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from oci_gpu_hook import startpath
from tests.helpers import containerlib as cl

REPO = Path(__file__).resolve().parent.parent
ALLOWED = startpath.ENTRIES
NEVER = startpath.NEVER


def imports(module: str, argv: list[str], env: dict[str, str], stdin: str = "") -> set[str]:
    code = (f"import sys; sys.path[:0] = [{str(REPO)!r}]; sys.argv = ['x', *sys.argv[1:]]; "
            f"from oci_gpu_hook.{module} import main; sys.exit(main())")
    out = subprocess.run([sys.executable, "-X", "importtime", "-I", "-S", "-c", code, *argv], input=stdin,
                         capture_output=True, text=True, env=env, timeout=120, cwd="/")
    names = {line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    return names - {"package"}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    base = tmp_path_factory.mktemp("imports")
    config = base / "config.toml"
    config.write_text(f'sysfs_root = "{cl.SEED_SYSFS}"\nruntime = "/bin/true"\nhook_path = "/bin/true"\n'
                      f'by_path_dir = "{base / "by-path"}"\n'
                      'device_file_mode = 0o666\n[request_env]\namd = ["AMD_VISIBLE_DEVICES"]\n')
    specs = {}
    for name, env in (("gpu", ["AMD_VISIBLE_DEVICES=1"]), ("nogpu", [])):
        bundle = base / name
        bundle.mkdir()
        spec = {"ociVersion": "1.0.2", "process": {"args": ["/bin/true"], "env": ["PATH=/bin", *env]},
                "root": {"path": "/"}}
        (bundle / "config.json").write_text(json.dumps(spec))
        specs[name] = bundle
    env = {"PATH": "/usr/bin:/bin", "OCI_GPU_HOOK_CONFIG": str(config)}
    baseline = imports("errors", [], env) - {"oci_gpu_hook", "oci_gpu_hook.errors"}
    return {"env": env, "specs": specs, "baseline": baseline}


def cases(setup: dict[str, object]) -> list[tuple[str, str, list[str], str]]:
    specs: dict[str, Path] = setup["specs"]  # type: ignore[assignment]
    state = json.dumps({"ociVersion": "1.0.2", "id": "x", "pid": 1, "status": "created",
                        "bundle": str(specs["nogpu"])})
    return [
        ("precreate", "entry.cli", ["precreate"], (specs["gpu"] / "config.json").read_text()),
        ("precreate", "entry.cli", ["precreate"], (specs["nogpu"] / "config.json").read_text()),
        ("prestart", "entry.cli", ["prestart"], state),
        ("createRuntime", "entry.cli", ["createRuntime"], state),
        ("links", "entry.cli", ["links"], state),
        ("create", "entry.runtime", ["create", "--bundle", str(specs["gpu"]), "x"], ""),
        ("run", "entry.runtime", ["run", "--bundle", str(specs["nogpu"]), "x"], ""),
        ("state", "entry.runtime", ["state", "x"], ""),
    ]


def test_per_container_imports_are_pinned(setup: dict[str, object]) -> None:
    baseline: set[str] = setup["baseline"]  # type: ignore[assignment]
    for entry, module, argv, stdin in cases(setup):
        got = imports(module, argv, setup["env"], stdin) - baseline  # type: ignore[arg-type]
        assert f"oci_gpu_hook.{module}" in got, (entry, got)  # it really ran
        assert not got & NEVER, (entry, sorted(got & NEVER))
        assert got <= ALLOWED[entry], (entry, sorted(got - ALLOWED[entry]))
        ours = {name for name in got if name.split(".")[0] == "oci_gpu_hook"}
        assert ours <= set(startpath.MODULES), (entry, sorted(ours - set(startpath.MODULES)))


NVIDIA = startpath.NVIDIA


def test_nvidia_request_imports_are_pinned(setup: dict[str, object], tmp_path: Path) -> None:
    """An NVIDIA request (the driver's files included) imports its backend, the driver-files reader and the ld
    cache reader, and nothing else beyond an AMD request's path: no NVML (ctypes) unless a MIG UUID is asked for."""
    host = REPO / "examples" / "hosts" / "nvidia-4x-h100"
    config = tmp_path / "config.toml"
    config.write_text(f'sysfs_root = "{host / "sys"}"\nproc_root = "{host / "proc"}"\n'
                      f'driver_root = "{host / "driver"}"\nruntime = "/bin/true"\nhook_path = "/bin/true"\n'
                      f'by_path_dir = "{tmp_path / "by-path"}"\n')
    bundle = tmp_path / "gpu"
    bundle.mkdir()
    spec = {"ociVersion": "1.0.2", "process": {"args": ["/bin/true"], "env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=1"]},
            "root": {"path": "/"}}
    (bundle / "config.json").write_text(json.dumps(spec))
    env = {"PATH": "/usr/bin:/bin", "OCI_GPU_HOOK_CONFIG": str(config)}
    baseline: set[str] = setup["baseline"]  # type: ignore[assignment]
    for entry, module, argv, stdin in (("create", "entry.runtime", ["create", "--bundle", str(bundle), "x"], ""),
                                       ("precreate", "entry.cli", ["precreate"], json.dumps(spec))):
        got = imports(module, argv, env, stdin) - baseline
        assert got >= NVIDIA, (entry, got)
        assert not got & (NEVER | {"ctypes", "oci_gpu_hook.inventory.nvml"}), (entry, sorted(got & NEVER))
        assert got <= ALLOWED[entry], (entry, sorted(got - ALLOWED[entry]))  # the config's backends: all three


def test_the_start_path_is_imported_as_the_entry_begins(setup: dict[str, object]) -> None:
    """Right after the launcher's trust walk, before the entry reads its input, every module of the package the
    entry may need is imported (entry.load_start_path): whatever the container asks, nothing of the package is
    imported later from a path that could have been renamed over since (docs/security.md).  A container that asks
    for nothing imports the same set as one granted a GPU; the config's backends' modules are there for both."""
    baseline: set[str] = setup["baseline"]  # type: ignore[assignment]
    sets = {}
    for entry, module, argv, stdin in cases(setup):
        got = imports(module, argv, setup["env"], stdin) - baseline  # type: ignore[arg-type]
        ours = {name for name in got if name.startswith("oci_gpu_hook.")}
        sets.setdefault(entry, []).append(ours)
        declared = {name for name in ALLOWED[entry] if name.startswith("oci_gpu_hook.")}
        assert declared <= ours, (entry, sorted(declared - ours))
    gpu, nogpu = sets["precreate"]
    assert gpu == nogpu, sorted(gpu ^ nogpu)
