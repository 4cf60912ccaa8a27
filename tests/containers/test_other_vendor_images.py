"""Images made for another vendor's GPUs, in real containers, on nodes of every vendor mix: one rule whatever the
applier (request.py): ``all`` of a kind the node lacks grants nothing of it and the container starts; a name of one
device the node lacks stops it with one line.

Images: the full env of a CUDA base image (``NVIDIA_VISIBLE_DEVICES=all``, ``NVIDIA_DRIVER_CAPABILITIES``,
``NVIDIA_REQUIRE_CUDA``, ...) and of a ROCm image (no request variable), each also with ``AMD_VISIBLE_DEVICES=1``
beside it (tests/helpers/imageenvs.py).  Nodes: the AMD seed host, the Intel host, 4 x H100, two AMD and two NVIDIA
side by side, and a GPU-less one (an empty sysfs and /proc).  Appliers: the shim under runc in cgroup v1 and v2, the
live prestart hook in v1 and v2, podman with the precreate hook.  A copy of the seed host loses its GPUs while the
same config serves it.  The probe (tests/containers/test_nvidia_hosts.py) opens every NVIDIA, DRM and KFD minor of
the node: what must open is worked out from the fixture definitions, never by the inventory under test.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from oci_gpu_hook.install import launchers
from tests.containers.test_nvidia_hosts import NvModel, _bundle, _podman, _runc, check, expected, model
from tests.helpers import containerlib as cl
from tests.helpers import fakesysfs, imageenvs

pytestmark = pytest.mark.containers
COMPUTE = frozenset({"compute", "utility"})  # the CUDA image's NVIDIA_DRIVER_CAPABILITIES
AMD1 = "AMD_VISIBLE_DEVICES=1"
HOST_NAMES = {"amd": "seed", "intel": "intel-xe", "nvidia": "nvidia-h100", "mixed": "amd-nvidia", "none": None}
APPLIERS = ("shim-v1", "shim-v2", "prestart-v1", "prestart-v2", "podman-precreate")


def _node(base: Path, name: str, nv: NvModel, sysfs: Path, proc: Path, driver: Path,
          native: bool = False) -> dict[str, Any]:
    """Launchers (``native``: with the compiled front, as installed; else the Python ones, which the oracles hold
    to the same outcome), a precreate hooks dir and a config for one node under ``base / name``."""
    home = base / name
    home.mkdir()
    config = home / "config.toml"
    hook = home / "bin" / "oci-gpu-hook"
    config.write_text(f'sysfs_root = "{sysfs}"\nproc_root = "{proc}"\ndriver_root = "{driver}"\n'
                      f'hook_path = "{hook}"\nlog_file = "{home / "log"}"\n'
                      f'by_path_dir = "{home / "by-path"}"\n')  # the default backends and names
    if native:
        cl.write_launchers(home / "bin", config)
    else:
        launchers.write_launchers(str(home / "bin"), {"OCI_GPU_HOOK_CONFIG": str(config)}, native=False)
    return {"model": nv, "config": config, "hook": hook, "runtime": home / "bin" / "oci-gpu-runtime",
            "hooks-dir": cl.write_hooks_dir(home / "hooks.d", hook, config), "log": home / "log"}


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cl.need("runc", "podman", "busybox", "unshare")
    base = tmp_path_factory.mktemp("othervendor")
    empty = base / "empty"  # a /proc and driver root without NVIDIA: hermetic whatever this machine has
    (empty / "sys").mkdir(parents=True)
    setup: dict[str, Any] = {"base": base}
    for node, name in HOST_NAMES.items():
        if name is None:  # no GPU at all: an empty sysfs
            nv = NvModel("none", empty, "", [])
            setup[node] = _node(base, node, nv, empty / "sys", empty, empty)
            continue
        nv = model(name)
        nvidia = bool(nv.gpus)
        setup[node] = _node(base, node, nv, nv.base / "sys", nv.base / "proc" if nvidia else empty,
                            nv.base / "driver" if nvidia else empty, native=node == "amd")
    return setup


def _run(nodes: dict[str, Any], node: str, applier: str, env: list[str],
         annotations: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    mine = nodes[node]
    if applier == "podman-precreate":
        options = [o for e in env for o in ("--env", e)]
        options += [o for k, v in (annotations or {}).items() for o in ("--annotation", f"{k}={v}")]
        return _podman(nodes, node, options, mine["hooks-dir"])
    bundle = _bundle(nodes, node, env, annotations or {})
    v2 = applier.endswith("-v2")
    if applier == "dry-run":
        done = cl.run([str(mine["hook"]), "dry-run", str(bundle)], env=cl.hook_env())
        if done.returncode != 0:
            return done
        (bundle / "config.json").write_text(done.stdout)
        return _runc(bundle, v2)
    if applier.startswith("shim"):
        return _runc(bundle, v2, str(mine["runtime"]))
    cl.add_prestart(bundle, mine["hook"])
    return _runc(bundle, v2)


def _grants(node: str, nv: NvModel, amd: bool) -> dict[str, list[Any]]:
    """What the CUDA image (with ``AMD_VISIBLE_DEVICES=1`` when ``amd``) gets on ``node``: every NVIDIA GPU the
    fixture defines, and AMD GPU 1."""
    grants: dict[str, list[Any]] = {"nvidia": list(range(len(nv.gpus)))} if nv.gpus else {}
    if amd:
        assert len(nv.amd) > 1, node
        grants["amd"] = [1]
    return grants


# The CUDA image alone: every applier on the nodes without NVIDIA GPUs (AMD, GPU-less) and the mixed one, the shim,
# the hook and podman on the others; with an AMD request beside it: every applier on the AMD node, one on the mixed
# one; a ROCm image where it runs and on the GPU-less node.  The rest (every host, names, sources) is the unit tests'
# (tests/test_request.py) and the oracles' (the front and the planner: tests/test_planner_oracle.py).
CUDA_CASES = [(node, applier) for node in ("amd", "none", "mixed") for applier in APPLIERS]
CUDA_CASES += [(node, applier) for node in ("intel", "nvidia") for applier in ("shim-v1", "prestart-v2",
                                                                              "podman-precreate")]
CUDA_AMD_CASES = [("amd", applier) for applier in APPLIERS] + [("mixed", "shim-v2")]


@pytest.mark.parametrize(("node", "applier"), CUDA_CASES, ids=[f"{n}-{a}" for n, a in CUDA_CASES])
def test_a_cuda_image_starts_with_what_the_node_has(nodes: dict[str, Any], node: str, applier: str) -> None:
    done = _run(nodes, node, applier, imageenvs.CUDA_BASE)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    nv = nodes[node]["model"]
    check(done.stdout, expected(nv, _grants(node, nv, False), COMPUTE),
          cgroup_v2=applier.endswith("-v2") if applier != "podman-precreate" else None)


@pytest.mark.parametrize(("node", "applier"), CUDA_AMD_CASES, ids=[f"{n}-{a}" for n, a in CUDA_AMD_CASES])
def test_a_cuda_image_asking_for_an_amd_gpu_gets_it(nodes: dict[str, Any], node: str, applier: str) -> None:
    done = _run(nodes, node, applier, [*imageenvs.CUDA_BASE, AMD1])
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    nv = nodes[node]["model"]
    check(done.stdout, expected(nv, _grants(node, nv, True), COMPUTE),
          cgroup_v2=applier.endswith("-v2") if applier != "podman-precreate" else None)


def test_the_empty_grant_is_one_log_line_saying_what_was_asked(nodes: dict[str, Any]) -> None:
    log = nodes["intel"]["log"]
    before = log.read_text().splitlines() if log.exists() else []
    done = _run(nodes, "intel", "shim-v1", imageenvs.CUDA_BASE)
    assert done.returncode == 0, done.stderr
    new = [json.loads(line) for line in log.read_text().splitlines()[len(before):]]
    assert len(new) == 1, new
    assert (new[0]["outcome"], new[0]["request"], new[0]["devices"], new[0]["note"]) == (
        "ignored", "nvidia.com/gpu=all", [], "NVIDIA_VISIBLE_DEVICES=all: this host has no nvidia GPUs, none granted")


@pytest.mark.parametrize("node", ["intel", "nvidia", "none"])
def test_an_amd_index_on_a_node_without_amd_gpus_is_refused_in_one_line(nodes: dict[str, Any], node: str) -> None:
    done = _run(nodes, node, "shim-v1", [*imageenvs.CUDA_BASE, AMD1])
    assert done.returncode != 0 and "done" not in done.stdout
    line = "oci-gpu-hook: error: AMD_VISIBLE_DEVICES=1: '1' is out of range: this host has no amd GPUs (valid: all or "
    assert line in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len([x for x in done.stderr.splitlines() if "oci-gpu-hook" in x]) == 1, done.stderr


CDI_ALL = {"cdi.k8s.io/device-plugin": "nvidia.com/gpu=all"}
CDI_ALL_LINE = ("oci-gpu-hook: error: cdi.k8s.io annotations=all: 'all' names no device: this host has no nvidia GPUs "
                "(valid: none, which grants no nvidia GPU; a CDI name must name a device this host has)")
CDI_ALL_CASES = [("amd", a) for a in (*APPLIERS, "dry-run")] + [("none", "shim-v2"), ("none", "prestart-v1"),
                                                                 ("intel", "podman-precreate")]


@pytest.mark.parametrize(("node", "applier"), CDI_ALL_CASES, ids=[f"{n}-{a}" for n, a in CDI_ALL_CASES])
def test_a_cdi_annotation_naming_a_kind_the_node_lacks_is_refused_in_one_line(nodes: dict[str, Any], node: str,
                                                                             applier: str) -> None:
    """An orchestrator's ``nvidia.com/gpu=all`` in a cdi.k8s.io annotation on a node without NVIDIA GPUs: every
    applier stops the container with one line (as containerd and podman refuse an unresolvable CDI name), also with
    the CUDA image's env beside it; the log file keeps the line.  The AMD node's launchers carry the native front,
    which hands the annotation over."""
    log = nodes[node]["log"]
    before = len(log.read_text().splitlines()) if log.exists() else 0
    done = _run(nodes, node, applier, imageenvs.CUDA_BASE, CDI_ALL)
    assert done.returncode != 0 and "done" not in done.stdout, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    if applier != "podman-precreate":  # podman 4.3 drops a precreate hook's stderr: the log file has the line
        lines = [x for x in done.stderr.splitlines() if "oci-gpu-hook" in x]  # runc quotes a prestart hook's line
        assert len(lines) == 1 and CDI_ALL_LINE in lines[0].replace("\\n", ""), done.stderr
    new = [json.loads(line) for line in log.read_text().splitlines()[before:]]
    assert [(e["outcome"], e["error"]) for e in new] == [("error", CDI_ALL_LINE)], new


def test_a_cdi_annotation_naming_none_starts_untouched(nodes: dict[str, Any]) -> None:
    """``none`` in the annotation names no device: the CUDA image starts on the AMD node as without the tool."""
    for applier in ("shim-v1", "podman-precreate"):
        done = _run(nodes, "amd", applier, imageenvs.CUDA_BASE, {"cdi.k8s.io/x": "nvidia.com/gpu=none"})
        assert done.returncode == 0, done.stderr
        check(done.stdout, expected(nodes["amd"]["model"], {}, COMPUTE),
              cgroup_v2=False if applier == "shim-v1" else None)


def test_a_refused_request_stops_podman_too(nodes: dict[str, Any]) -> None:
    done = _run(nodes, "none", "podman-precreate", [*imageenvs.CUDA_BASE, AMD1])
    assert done.returncode != 0 and "done" not in done.stdout, done.stdout
    done = _run(nodes, "none", "prestart-v2", ["NVIDIA_VISIBLE_DEVICES=GPU-8f6e2a1c-5d1b-4c3e-9a7f-0123456789ab"])
    assert done.returncode != 0 and "is not the UUID of an NVIDIA GPU on this host" in done.stderr, done.stderr


@pytest.mark.parametrize("node", ["amd", "none"])
def test_a_rocm_image_asks_for_nothing(nodes: dict[str, Any], node: str) -> None:
    done = _run(nodes, node, "shim-v1", imageenvs.ROCM)
    assert done.returncode == 0, done.stderr
    check(done.stdout, expected(nodes[node]["model"], {}, COMPUTE), cgroup_v2=False)


def test_a_rocm_image_asking_for_an_amd_gpu_through_podman(nodes: dict[str, Any]) -> None:
    done = _run(nodes, "amd", "podman-precreate", [*imageenvs.ROCM, AMD1])
    assert done.returncode == 0, done.stderr
    check(done.stdout, expected(nodes["amd"]["model"], {"amd": [1]}, COMPUTE), cgroup_v2=None)


def test_gpus_removed_while_the_node_runs(nodes: dict[str, Any]) -> None:
    """A copy of the seed host served by one config: ``all`` follows the GPUs there, none at the end (the container
    starts with nothing); an index of a removed GPU is refused."""
    host = fakesysfs.seed_host()
    sysfs = Path(fakesysfs.build(str(nodes["base"] / "removal" / "sys"), host))
    nv = model("seed")
    nodes["removal"] = _node(nodes["base"], "removal-node", nv, sysfs, nodes["base"] / "empty",
                             nodes["base"] / "empty")
    amd_gpus = [g for g in host.gpus if g.driver == "amdgpu"]
    assert len(nv.amd) == len(amd_gpus) == 8
    asks_all = [*imageenvs.ROCM, "AMD_VISIBLE_DEVICES=all"]

    def starts(applier: str, grants: dict[str, list[Any]]) -> None:
        done = _run(nodes, "removal", applier, asks_all)
        assert done.returncode == 0, done.stderr
        check(done.stdout, expected(nv, grants, COMPUTE),
              cgroup_v2=applier.endswith("-v2") if applier != "podman-precreate" else None)

    starts("shim-v1", {"amd": list(range(8))})
    fakesysfs.remove_gpu(str(sysfs), host, amd_gpus[-1].pci)  # the last in index order: no other index moves
    starts("prestart-v2", {"amd": list(range(7))})
    done = _run(nodes, "removal", "shim-v2", [*imageenvs.ROCM, "AMD_VISIBLE_DEVICES=7"])
    assert done.returncode != 0 and "'7' is out of range (the host has 7 amd GPUs)" in done.stderr, done.stderr
    for gpu in amd_gpus[:-1]:
        fakesysfs.remove_gpu(str(sysfs), host, gpu.pci)
    starts("shim-v2", {})
    starts("podman-precreate", {})
    done = _run(nodes, "removal", "prestart-v1", [*imageenvs.ROCM, AMD1])
    assert done.returncode != 0 and "'1' is out of range: this host has no amd GPUs" in done.stderr, done.stderr


def test_all_where_the_gpus_are_there_but_none_can_be_granted_is_refused(nodes: dict[str, Any]) -> None:
    """A copy of the H100 host whose driver excludes every GPU is not a node without NVIDIA GPUs: the CUDA image's
    ``all`` stops it in one line, through the shim and the live hook alike."""
    copy = nodes["base"] / "excluded"
    shutil.copytree(model("nvidia-h100").base, copy, symlinks=True)
    for info in (copy / "proc" / "driver" / "nvidia" / "gpus").glob("*/information"):
        info.write_text(info.read_text().replace("GPU Excluded:\t No", "GPU Excluded:\t Yes"))
    nodes["excluded"] = _node(nodes["base"], "excluded-node", nodes["nvidia"]["model"], copy / "sys", copy / "proc",
                              copy / "driver")
    line = ("oci-gpu-hook: error: NVIDIA_VISIBLE_DEVICES=all: this host's nvidia GPUs cannot be granted: 0000:1b:00.0: "
            "excluded by the driver (GPU Excluded: Yes) (and 3 more)")
    for applier in ("shim-v1", "prestart-v2"):
        done = _run(nodes, "excluded", applier, imageenvs.CUDA_BASE)
        assert done.returncode != 0 and "done" not in done.stdout and line in done.stderr, (applier, done.stderr)
