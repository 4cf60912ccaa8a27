"""``list --json``, ``inspect`` and ``mask_other_gpus`` on a host with AMD and NVIDIA GPUs side by side
(examples/hosts/amd-nvidia-2x2: two W7900D and two L40S with nvidia-drm loaded, probed alternately, so that the
DRM minors of the two kinds interleave).  The AMD-only cases are in tests/test_cli.py,
tests/containers/test_live_hook.py and test_plan_spec.py; the NVIDIA-only ones in tests/test_nvidia.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from oci_gpu_hook.config import Config
from oci_gpu_hook.entry.commands.inspect import device_names
from oci_gpu_hook.oci_spec import ContainerSpec
from oci_gpu_hook.plan import plan_for_spec
from tests.helpers import containerlib as cl

REPO = Path(__file__).resolve().parent.parent
HOST = REPO / "examples" / "hosts" / "amd-nvidia-2x2"
AMD = {"0000:03:00.0": "/sys/devices/pci0000:01/0000:01:00.0/0000:02:00.0/0000:03:00.0",
       "0000:41:00.0": "/sys/devices/pci0000:3f/0000:3f:00.0/0000:40:00.0/0000:41:00.0"}
NVIDIA = {"0000:21:00.0": "/sys/devices/pci0000:21/0000:21:00.0",
          "0000:61:00.0": "/sys/devices/pci0000:61/0000:61:00.0"}


def config(**values: Any) -> Config:
    return Config(sysfs_root=str(HOST / "sys"), proc_root=str(HOST / "proc"), driver_root=str(HOST / "driver"),
                  hook_path="/bin/sh", **values)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", "--sysfs-root", str(HOST / "sys"),
                           "--proc-root", str(HOST / "proc"), "--driver-root", str(HOST / "driver"), *args],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"], "OCI_GPU_HOOK_CONFIG": os.devnull})


def spec(env: list[str]) -> dict[str, Any]:
    return {"ociVersion": "1.0.2", "process": {"env": env}, "root": {"path": "rootfs"}, "linux": {}}


def test_list_json_of_the_mixed_host_matches_the_schema() -> None:
    done = cli("list", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    jsonschema.Draft202012Validator(json.loads((REPO / "schemas" / "inventory.schema.json").read_text())).validate(data)
    rows = [(d["kind"], d["index"], d["pci_address"], d["minor"]) for d in data["devices"]]
    assert rows == [("amd", 0, "0000:03:00.0", None), ("amd", 1, "0000:41:00.0", None),
                    ("nvidia", 0, "0000:21:00.0", 1), ("nvidia", 1, "0000:61:00.0", 0)]
    nvidia = data["devices"][3]
    assert nvidia["name"] == nvidia["uuid"] and nvidia["uuid"].startswith("GPU-")  # its stable name
    assert [n["path"] for n in nvidia["nodes"]] == ["/dev/nvidia0"]
    assert [n["path"] for n in nvidia["display_nodes"]] == ["/dev/dri/card3", "/dev/dri/renderD131"]
    assert [n["path"] for n in data["devices"][1]["nodes"]] == ["/dev/dri/card2", "/dev/dri/renderD130"]
    assert {kind: [n["path"] for n in nodes] for kind, nodes in data["shared_nodes"].items()} == {
        "amd": ["/dev/kfd"], "intel": [], "nvidia": ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]}
    text = cli("list")
    assert text.returncode == 0 and [line.split()[:2] for line in text.stdout.splitlines()[1:5]] == [
        ["amd", "0"], ["amd", "1"], ["nvidia", "0"], ["nvidia", "1"]]


def test_inspect_names_each_kinds_nodes_on_the_mixed_host() -> None:
    names = device_names(config())
    assert names[("c", 226, 128)] == "amd 0 /dev/dri/renderD128 (0000:03:00.0)"
    assert names[("c", 226, 129)] == "nvidia 0 /dev/dri/renderD129 (0000:21:00.0)"  # interleaved with AMD's
    assert names[("c", 226, 130)] == "amd 1 /dev/dri/renderD130 (0000:41:00.0)"
    assert names[("c", 226, 3)] == "nvidia 1 /dev/dri/card3 (0000:61:00.0)"
    assert names[("c", 195, 1)] == "nvidia 0 /dev/nvidia1 (0000:21:00.0)"
    assert names[("c", 195, 0)] == "nvidia 1 /dev/nvidia0 (0000:61:00.0)"
    assert names[("c", 234, 0)] == "/dev/kfd (all amd GPUs)"
    assert names[("c", 195, 255)] == "/dev/nvidiactl (all nvidia GPUs)"
    assert names[("c", 510, 0)] == "/dev/nvidia-uvm (all nvidia GPUs)"


@pytest.mark.parametrize(("env", "masked"), [
    (["AMD_VISIBLE_DEVICES=1", "NVIDIA_VISIBLE_DEVICES=1"],
     [AMD["0000:03:00.0"], NVIDIA["0000:21:00.0"], "/proc/driver/nvidia/gpus/0000:21:00.0"]),
    (["NVIDIA_VISIBLE_DEVICES=0"],
     [*AMD.values(), NVIDIA["0000:61:00.0"], "/proc/driver/nvidia/gpus/0000:61:00.0"]),
    (["AMD_VISIBLE_DEVICES=0"],
     [AMD["0000:41:00.0"], *NVIDIA.values(), *(f"/proc/driver/nvidia/gpus/{pci}" for pci in NVIDIA)]),
], ids=["one-of-each", "nvidia-only", "amd-only"])
def test_mask_other_gpus_hides_every_other_gpu_of_both_kinds(env: list[str], masked: list[str]) -> None:
    """Whichever kinds a container asks for, the other GPUs of every kind are masked: their sysfs devices and,
    for NVIDIA, their /proc/driver/nvidia/gpus directory."""
    plan = plan_for_spec(ContainerSpec(spec(env)), config(mask_other_gpus=True))
    assert plan.edits.masked == tuple(sorted(masked))
    assert plan_for_spec(ContainerSpec(spec(env)), config()).edits.masked == ()


# --- in a real container ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    cl.need("runc", "busybox", "unshare")
    base = tmp_path_factory.mktemp("mixed-host")
    conf = base / "config.toml"
    conf.write_text(f'sysfs_root = "{HOST / "sys"}"\nproc_root = "{HOST / "proc"}"\ndriver_root = "{HOST / "driver"}"\n'
                    f'hook_path = "{base / "bin" / "oci-gpu-hook"}"\nmask_other_gpus = true\n')
    hook, _runtime = cl.write_launchers(base / "bin", conf)
    return {"base": base, "hook": hook, "rootfs": cl.make_rootfs(base / "rootfs")}


@pytest.fixture
def running(setup: dict[str, Path], request: pytest.FixtureRequest) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """A detached container asking for AMD GPU 1 and NVIDIA GPU 1, its config.json rewritten by dry-run (cgroup v1
    or v2: ``request.param``); yields its name, that config and whether it runs under cgroup2."""
    v2 = request.param
    bundle = cl.make_bundle(setup["base"] / cl.container_id(), setup["rootfs"],
                            ["AMD_VISIBLE_DEVICES=1", "NVIDIA_VISIBLE_DEVICES=1"], ["/bin/sleep", "600"])
    cl.edit_spec(bundle, lambda s: s["root"].update(readonly=False))  # room for the driver files' mount points
    done = cl.run([str(setup["hook"]), "dry-run", str(bundle)], env=cl.hook_env())
    assert done.returncode == 0, done.stderr
    (bundle / "config.json").write_text(done.stdout)
    start = ["runc", "run", "--detach", "--bundle", str(bundle), bundle.name]
    errors = bundle.parent / f"{bundle.name}.stderr"
    with errors.open("w") as stderr:  # a detached container keeps runc's stdio: no pipes here
        started = subprocess.run(cl.cgroup2_wrap(start) if v2 else start, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=stderr, timeout=60)
    assert started.returncode == 0, errors.read_text()
    delete = ["runc", "delete", "--force", bundle.name]
    try:
        yield bundle.name, json.loads(done.stdout), v2
    finally:
        cl.run(cl.cgroup2_wrap(delete) if v2 else delete)


@pytest.mark.parametrize("running", [False, True], indirect=True, ids=["cgroup-v1", "cgroup-v2"])
def test_inspect_a_container_with_an_amd_and_an_nvidia_gpu(setup: dict[str, Path],
                                                           running: tuple[str, dict[str, Any], bool]) -> None:
    """The container got AMD GPU 1 and NVIDIA GPU 1 (with the others masked, and started so): ``inspect`` shows
    exactly their nodes and their kinds' shared nodes allowed, each named, and no other GPU minor."""
    name, config_json, v2 = running
    masks = {AMD["0000:03:00.0"], NVIDIA["0000:21:00.0"], "/proc/driver/nvidia/gpus/0000:21:00.0"}
    assert masks <= set(config_json["linux"]["maskedPaths"])
    assert not {AMD["0000:41:00.0"], NVIDIA["0000:61:00.0"]} & set(config_json["linux"]["maskedPaths"])
    if v2:
        target = ["--cgroup", f"/sys/fs/cgroup/unified/{name}"]
    else:
        state = json.loads(cl.run(["runc", "state", name]).stdout)
        target = ["--pid", str(state["pid"])]
    shown = cl.run([str(setup["hook"]), "inspect", *target], env=cl.hook_env())
    assert shown.returncode == 0, shown.stderr
    allowed = {w[2] for w in (line.split() for line in shown.stdout.splitlines()) if w and w[0] == "allow"}
    gpu_majors = ("226:", "195:", "234:", "236:", "510:")
    assert {a for a in allowed if a.startswith(gpu_majors)} == {
        "226:2", "226:130", "234:0",  # AMD GPU 1 and /dev/kfd
        "195:0", "195:255", "510:0", "510:1"}  # NVIDIA GPU 1 (minor 0), nvidiactl, nvidia-uvm*; no DRM: no graphics
    for text in ("amd 1 /dev/dri/renderD130 (0000:41:00.0)", "/dev/kfd (all amd GPUs)",
                 "nvidia 1 /dev/nvidia0 (0000:61:00.0)", "/dev/nvidiactl (all nvidia GPUs)",
                 "/dev/nvidia-uvm-tools (all nvidia GPUs)"):
        assert text in shown.stdout, shown.stdout
