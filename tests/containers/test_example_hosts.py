"""Every example host through every applier, in real containers: exactly the devices asked for, and nothing else.

Hosts (examples/hosts/, built by tests/helpers/fakesysfs.py): an Intel iGPU probed before two AMD GPUs; two MI300X
in CPX mode (amdgpu_xcp_N) behind a BMC's VGA; the same in DPX mode with amdgpu_xcp.N naming (12 render nodes
without a KFD node); an i915 iGPU beside an xe dGPU. Appliers: dry-run + runc and the runtime shim in cgroup v1 and
v2, the live prestart hook in v1 and v2, podman with the precreate hook, podman with the CDI specs alone. The probe
opens every DRM minor of the host and /dev/kfd (ENXIO = allowed, EPERM = refused) and lists the /dev/dri/by-path
links; what must come out is computed from the fixture definition by the toolkits' rules (containerlib.host_model),
not by the inventory under test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import containerlib as cl

pytestmark = pytest.mark.containers

# (id, host, env, annotations, CDI device names for the CDI path, expected grants)
CASES: list[tuple[str, str, list[str], dict[str, str], list[str], dict[str, list[int]]]] = [
    ("igpu-amd0", "intel-amd", ["AMD_VISIBLE_DEVICES=0"], {}, ["amd.com/gpu=0"], {"amd": [0]}),
    ("igpu-amd-all", "intel-amd", ["AMD_VISIBLE_DEVICES=all"], {}, ["amd.com/gpu=all"], {"amd": [0, 1]}),
    ("igpu-both-kinds", "intel-amd", ["AMD_VISIBLE_DEVICES=1", "INTEL_VISIBLE_DEVICES=0"], {},
     ["amd.com/gpu=1", "intel.com/gpu=card0"], {"amd": [1], "intel": [0]}),
    ("cpx-index", "mi300x-cpx", ["AMD_VISIBLE_DEVICES=9"], {}, ["amd.com/gpu=9"], {"amd": [9]}),
    ("cpx-range-across-gpus", "mi300x-cpx", ["AMD_VISIBLE_DEVICES=6-9"], {},
     [f"amd.com/gpu={i}" for i in range(6, 10)], {"amd": [6, 7, 8, 9]}),
    ("cpx-unique-id", "mi300x-cpx", ["AMD_VISIBLE_DEVICES=0xe3a9b1d2c4f56071"], {},
     ["amd.com/gpu=0xe3a9b1d2c4f56071"], {"amd": list(range(8, 16))}),
    ("dpx-dot-all", "mi300x-dpx-dot", ["AMD_VISIBLE_DEVICES=all"], {}, ["amd.com/gpu=all"], {"amd": [0, 1, 2, 3]}),
    ("xe-by-cdi-name", "intel-xe", [], {"cdi.k8s.io/test": "intel.com/gpu=card1"}, ["intel.com/gpu=card1"],
     {"intel": [1]}),
]
APPLIERS = ["dry-run-v1", "dry-run-v2", "shim-v1", "shim-v2", "prestart-v1", "prestart-v2", "podman-precreate",
            "podman-cdi"]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cl.need("runc", "podman", "busybox", "unshare")
    base = tmp_path_factory.mktemp("hosts")
    setup: dict[str, Any] = {"rootfs": cl.make_rootfs(base / "rootfs"), "base": base}
    models = {name: cl.host_model(name) for name in sorted({case[1] for case in CASES})}
    homes = cl.at_once(lambda name: cl.host_home(base / name, f'sysfs_root = "{models[name].sysfs}"\n'), models)
    for name, model in models.items():
        setup[name] = {"model": model, **homes[name]}
    return setup


def _bundle(hosts: dict[str, Any], host: str, env: list[str], annotations: dict[str, str]) -> Path:
    bundle = cl.make_bundle(hosts["base"] / cl.container_id(), hosts["rootfs"], env,
                            ["/bin/sh", f"/probe-{host}.sh"])

    def change(spec: dict[str, Any]) -> None:
        spec["annotations"] = annotations

    cl.edit_spec(bundle, change)
    return bundle


def _runc(bundle: Path, v2: bool, runtime: str = "runc") -> subprocess.CompletedProcess[str]:
    argv = [runtime, "run", "--bundle", str(bundle), bundle.name]
    return cl.run(cl.cgroup2_wrap(argv) if v2 else argv, env=cl.hook_env())


def _podman(hosts: dict[str, Any], host: str, options: list[str], hooks: Path | None,
            cdi: Path | None = None) -> subprocess.CompletedProcess[str]:
    argv = [*cl.PODMAN, "--runtime=runc", f"--hooks-dir={hooks or hosts['base'] / 'no-hooks'}", *cl.PODMAN_RUN,
            *options, "--rootfs", str(hosts["rootfs"]), "/bin/sh", f"/probe-{host}.sh"]
    return cl.run(argv if cdi is None else cl.private_cdi(argv, cdi), env=cl.hook_env())


@pytest.mark.parametrize("applier", APPLIERS)
@pytest.mark.parametrize(("host", "env", "annotations", "cdi_names", "granted"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_exactly_the_devices_asked_for(hosts: dict[str, Any], applier: str, host: str, env: list[str],
                                       annotations: dict[str, str], cdi_names: list[str],
                                       granted: dict[str, list[int]]) -> None:
    mine = hosts[host]
    v2 = applier.endswith("-v2")
    if applier.startswith("dry-run"):
        bundle = _bundle(hosts, host, env, annotations)
        done = cl.run([str(mine["hook"]), "dry-run", str(bundle)], env=cl.hook_env())
        assert done.returncode == 0, done.stderr
        (bundle / "config.json").write_text(done.stdout)
        done = _runc(bundle, v2)
    elif applier.startswith("shim"):
        done = _runc(_bundle(hosts, host, env, annotations), v2, str(mine["runtime"]))
    elif applier.startswith("prestart"):
        bundle = _bundle(hosts, host, env, annotations)
        cl.add_prestart(bundle, mine["hook"])
        done = _runc(bundle, v2)
    elif applier == "podman-precreate":
        options = [o for e in env for o in ("--env", e)]
        options += [o for k, v in annotations.items() for o in ("--annotation", f"{k}={v}")]
        done = _podman(hosts, host, options, mine["hooks-dir"])
    else:
        done = _podman(hosts, host, [o for n in cdi_names for o in ("--device", n)], None, mine["cdi"])
    assert done.returncode == 0, done.stderr
    cl.assert_granted(done.stdout, mine["model"], granted, cgroup_v2=v2 if applier[-3:] in ("-v1", "-v2") else None)


def test_no_amd_request_ever_opens_an_intel_minor(hosts: dict[str, Any]) -> None:
    """Every AMD request form on the iGPU host, through the shim: the Intel card0/renderD128 stay refused."""
    mine = hosts["intel-amd"]
    for value in ("0", "1", "0-1", "all", "0000:03:00.0", "23:00.0", "0x3149e0fac5157acf", "3149e0fac5157ac8"):
        done = _runc(_bundle(hosts, "intel-amd", [f"AMD_VISIBLE_DEVICES={value}"], {}), False, str(mine["runtime"]))
        assert done.returncode == 0, (value, done.stderr)
        result = cl.ProbeResult.parse(done.stdout)
        assert result.access[(226, 0)] == result.access[(226, 128)] == "EPERM", value


def test_an_invalid_partition_is_never_granted(hosts: dict[str, Any]) -> None:
    """DPX: render nodes 130-135 and 138-143 exist without a KFD node; no request reaches them."""
    mine = hosts["mi300x-dpx-dot"]
    done = _runc(_bundle(hosts, "mi300x-dpx-dot", ["AMD_VISIBLE_DEVICES=4"], {}), False, str(mine["runtime"]))
    assert done.returncode != 0
    assert "'4' is out of range (the host has 4 amd GPUs)" in done.stderr
    assert "Traceback" not in done.stderr


def test_cdi_specs_of_the_hosts_are_per_kind(hosts: dict[str, Any]) -> None:
    for name in ("intel-amd", "intel-xe"):
        files = sorted(p.name for p in Path(hosts[name]["cdi"]).iterdir())
        wanted = ["amd.com-gpu.json", "intel.com-gpu.json"] if name == "intel-amd" else ["intel.com-gpu.json"]
        assert files == wanted
        for path in Path(hosts[name]["cdi"]).iterdir():
            spec = json.loads(path.read_text())
            done = subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", "cdi", "validate", str(path)],
                                  capture_output=True, text=True,
                                  env={**cl.hook_env(), "OCI_GPU_HOOK_CONFIG": "/dev/null"})
            assert done.returncode == 0, done.stderr
            assert spec["kind"] == {"amd.com-gpu.json": "amd.com/gpu", "intel.com-gpu.json": "intel.com/gpu"}[path.name]
