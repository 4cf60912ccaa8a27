"""One grant, whoever injects: the shim under real runc (cgroup v1 and v2) when the runtime already applied CDI.

containerd 2.x with CDI on and the ``oci-gpu`` RuntimeClass both act on one
pod: containerd resolves the plugin's ``cdi_devices`` from the node's spec
file into config.json's ``linux.devices`` and device rules (and the spec's
``createRuntime`` hook), and passes the plugin's ``cdi.k8s.io`` annotation to
``oci-gpu-runtime``.  Here config.json is prepared as that injection leaves it
(from our generated spec), then the shim runs it through runc:

- the annotation names the same GPU: the container starts with exactly that GPU
  (the probe over every DRM minor), and config.json holds each node, rule and
  hook once;
- it names another GPU (a stale spec resolved the name to other hardware, or an
  orchestrator that disagrees with itself): the shim refuses in one line naming
  both, and runc never runs.  Never the union.

Needs root, runc, busybox, unshare; under CI=true a missing one fails.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from oci_gpu_hook.appliers import cdi
from oci_gpu_hook.config import Config
from oci_gpu_hook.inventory import scan
from tests.helpers import containerlib as cl

pytestmark = pytest.mark.containers

ANNOTATION = "cdi.k8s.io/oci-gpu-hook_gpu"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cl.need("runc", "busybox", "unshare")
    paths: dict[str, Any] = cl.hook_setup(tmp_path_factory.mktemp("one-grant"))
    config = Config(sysfs_root=str(cl.SEED_SYSFS), hook_path=str(paths["hook"]))
    paths["spec"] = cdi.generate(scan(str(cl.SEED_SYSFS)), "amd", config)
    return paths


def _inject(spec: dict[str, Any], cdi_spec: dict[str, Any], name: str) -> None:
    """What a runtime applying CDI itself does with ``amd.com/gpu=<name>``: the device's and the spec-wide
    deviceNodes as linux.devices with an allow rule each (their permissions), and the device's hooks."""
    (device,) = [d for d in cdi_spec["devices"] if d["name"] == name]
    nodes = device["containerEdits"]["deviceNodes"] + cdi_spec["containerEdits"]["deviceNodes"]
    linux = spec.setdefault("linux", {})
    linux.setdefault("devices", []).extend(
        {k: n[k] for k in ("path", "type", "major", "minor", "fileMode", "uid", "gid")} for n in nodes)
    linux.setdefault("resources", {}).setdefault("devices", []).extend(
        {"allow": True, "type": n["type"], "major": n["major"], "minor": n["minor"], "access": n["permissions"]}
        for n in nodes)
    for hook in device["containerEdits"].get("hooks", []):
        stage = spec.setdefault("hooks", {}).setdefault(hook["hookName"], [])
        stage.append({k: v for k, v in hook.items() if k != "hookName"})


def _bundle(setup: dict[str, Any], injected: str, annotation: str) -> Path:
    bundle = cl.make_bundle(setup["base"] / cl.container_id(), setup["rootfs"], [])

    def change(spec: dict[str, Any]) -> None:
        _inject(spec, setup["spec"], injected)
        spec.setdefault("annotations", {})[ANNOTATION] = annotation

    cl.edit_spec(bundle, change)
    return bundle


def _shim(setup: dict[str, Any], bundle: Path, v2: bool) -> Any:
    argv = [str(setup["runtime"]), "run", "--bundle", str(bundle), bundle.name]
    return cl.run(cl.cgroup2_wrap(argv) if v2 else argv, env=cl.hook_env())


V2 = pytest.mark.parametrize("v2", [False, True], ids=["cgroup-v1", "cgroup-v2"])


@V2
@pytest.mark.parametrize("annotation", ["amd.com/gpu=0000:43:00.0", "amd.com/gpu=0000:43:00.0,amd.com/gpu=2"],
                         ids=["stable-name", "stable-and-index"])
def test_agreeing_annotation_is_one_grant(setup: dict[str, Any], v2: bool, annotation: str) -> None:
    bundle = _bundle(setup, "0000:43:00.0", annotation)
    before = json.loads((bundle / "config.json").read_text())
    done = _shim(setup, bundle, v2)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [2], cgroup_v2=v2)
    after = json.loads((bundle / "config.json").read_text())
    paths = [d["path"] for d in after["linux"]["devices"]]
    assert sorted(paths) == ["/dev/dri/card3", "/dev/dri/renderD130", "/dev/kfd"]  # each node once
    rules = [(r.get("type"), r.get("major"), r.get("minor")) for r in after["linux"]["resources"]["devices"]
             if r.get("allow")]
    assert len(rules) == len(set(rules))
    assert after["linux"] == before["linux"] and after["hooks"] == before["hooks"]  # nothing added twice
    assert len(after["hooks"]["createRuntime"]) == 1


@V2
def test_disagreeing_annotation_is_refused_in_one_line(setup: dict[str, Any], v2: bool) -> None:
    """The runtime resolved the name to 0000:43:00.0 (a stale spec), the plugin allocated 0000:63:00.0."""
    bundle = _bundle(setup, "0000:43:00.0", "amd.com/gpu=0000:63:00.0")
    before = (bundle / "config.json").read_text()
    done = _shim(setup, bundle, v2)
    assert done.returncode != 0
    assert "done" not in done.stdout and "cgroup" not in done.stdout  # runc never started the container
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("oci-gpu-hook: error: cdi.k8s.io annotations name amd device 0000:63:00.0, but "
                                  "the container already has amd device 0000:43:00.0 (CDI, --device or the "
                                  "orchestrator): refused"), done.stderr
    assert "a stale CDI spec on this node" in done.stderr
    assert (bundle / "config.json").read_text() == before  # untouched
