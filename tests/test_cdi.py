"""CDI specs: golden files for the example hosts, schema, version rule, round trips, rejections, names."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from oci_gpu_hook.appliers import cdi
from oci_gpu_hook.config import Config
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.inventory import scan
from oci_gpu_hook.request import select

REPO = Path(__file__).resolve().parent.parent
HOSTS = sorted(p.parent for p in (REPO / "examples" / "hosts").glob("*/sys"))
GOLDEN = sorted((h, g.stem.replace(".com-gpu", ""), g.suffix[1:]) for h in HOSTS for g in (h / "cdi").iterdir())


def _roots(host: Path) -> list[str]:
    """The global options that point the CLI at an example host (an NVIDIA host has proc and driver roots)."""
    out = ["--sysfs-root", str(host / "sys")]
    if (host / "proc").is_dir():
        out += ["--proc-root", str(host / "proc"), "--driver-root", str(host / "driver")]
    return out


def _scan(host: Path) -> Any:
    proc = host / "proc"
    return scan(str(host / "sys"), proc_root=str(proc if proc.is_dir() else "/nonexistent"),
                driver_root=str(host / "driver"))


def _config(host: Path) -> Config:
    return Config(driver_root=str(host / "driver")) if (host / "driver").is_dir() else Config()


def _spec(host: Path, kind: str = "amd") -> dict[str, Any]:
    return cdi.generate(_scan(host), kind, _config(host))


def test_there_are_example_hosts() -> None:
    assert {h.name for h in HOSTS} >= {"seed-8x-gfx1100", "shuffled-4x-gfx942", "intel-igpu-2x-gfx1100",
                                       "mi300x-2x-cpx", "mi300x-2x-dpx-dot-naming", "intel-i915-xe"}
    kinds = {(h.name, k) for h, k, _f in GOLDEN}
    assert ("intel-igpu-2x-gfx1100", "intel") in kinds and ("intel-igpu-2x-gfx1100", "amd") in kinds
    assert ("intel-i915-xe", "amd") not in kinds  # no spec for a kind without devices


@pytest.mark.parametrize(("host", "kind", "fmt"), GOLDEN, ids=[f"{h.name}-{k}-{f}" for h, k, f in GOLDEN])
def test_golden_files(host: Path, kind: str, fmt: str) -> None:
    """`cdi generate` output for each kind of each example host is checked in; regenerate on purpose only:
    ``oci-gpu-hook --sysfs-root HOST/sys cdi generate --kind KIND --format FMT > HOST/cdi/<vendor>-<class>.FMT``
    (an NVIDIA host: also ``--proc-root HOST/proc --driver-root HOST/driver``, and the checkout's path in the
    driver files' host paths replaced by ``/REPO``)."""
    golden = host / "cdi" / f"{Config().cdi_kind(kind).replace('/', '-')}.{fmt}"
    env = {"PATH": os.environ["PATH"], "OCI_GPU_HOOK_CONFIG": "/dev/null"}
    base = [sys.executable, "-m", "oci_gpu_hook.entry.cli", *_roots(host), "cdi"]
    done = subprocess.run([*base, "generate", "--kind", kind, "--format", fmt], capture_output=True, text=True,
                          env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.replace(str(REPO), "/REPO") == golden.read_text()
    checked = subprocess.run([*base, "validate", str(golden)], capture_output=True, text=True, env=env)
    assert checked.returncode == 0 and checked.stdout == f"ok: {golden}\n", checked.stderr


@pytest.mark.parametrize(("host", "kind"), sorted({(h, k) for h, k, _f in GOLDEN}),
                         ids=sorted({f"{h.name}-{k}" for h, k, _f in GOLDEN}))
def test_generated_specs_validate_and_round_trip(host: Path, kind: str) -> None:
    spec = _spec(host, kind)
    cdi.validate(spec, "generated")
    assert json.loads(cdi.render(spec, "json")) == spec
    assert yaml.safe_load(cdi.render(spec, "yaml")) == spec
    assert "&id" not in cdi.render(spec, "yaml")  # plain YAML: no anchors/aliases for shared edits
    assert spec["cdiVersion"] == cdi.minimum_version(spec) == "0.5.0"  # the lowest the fields need
    for entry in spec.get("containerEdits", {}).get("mounts", []):  # a driver's files: read-only host files
        assert entry["options"] == ["ro", "nosuid", "nodev", "bind"] and Path(entry["hostPath"]).exists()


def test_seed_spec_content() -> None:
    spec = _spec(REPO / "examples" / "hosts" / "seed-8x-gfx1100")
    by_name = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
    assert len(by_name) == 8 * 3 + 1
    for name in ("1", "0000:23:00.0", "0x3149e0fac5157acf"):
        assert [(n["path"], n["major"], n["minor"]) for n in by_name[name]] == [
            ("/dev/dri/card2", 226, 2), ("/dev/dri/renderD129", 226, 129)]
    assert len(by_name["all"]) == 16
    assert spec["containerEdits"]["deviceNodes"] == [{
        "path": "/dev/kfd", "type": "c", "major": 234, "minor": 0, "fileMode": 0o666, "permissions": "rwm",
        "uid": 0, "gid": 0}]


def test_every_cdi_name_is_a_valid_request_for_the_same_gpu() -> None:
    """A CDI name from the spec, used in a cdi.k8s.io annotation, resolves to the same GPU's nodes."""
    for host, kind in sorted({(h, k) for h, k, _f in GOLDEN}):
        inventory = _scan(host)
        spec = cdi.generate(inventory, kind, _config(host))
        for device in spec["devices"]:
            chosen = select(kind, device["name"], inventory.devices(kind), "cdi.k8s.io annotations")
            paths = list(dict.fromkeys(n.path for d in chosen for n in d.all_nodes))
            assert paths == [n["path"] for n in device["containerEdits"]["deviceNodes"]], (host, device["name"])
            links = [f"{p}={t}" for d in chosen for p, t in d.links]
            assert device["containerEdits"].get("hooks", [{"args": [0, 0]}])[0]["args"][2:] == links


def test_every_device_has_its_stable_name_in_the_spec() -> None:
    """Every GPU and every partition (p0 of a partitioned GPU included) is a CDI device under its stable name,
    with exactly its own nodes: the name the device plugin hands out, which no GPU coming or going moves."""
    from oci_gpu_hook.inventory import stable_name

    seen = set()
    for host, kind in sorted({(h, k) for h, k, _f in GOLDEN}):
        inventory = _scan(host)
        by_name = {d["name"]: d["containerEdits"]["deviceNodes"] for d in cdi.generate(inventory, kind,
                                                                                        _config(host))["devices"]}
        for device in inventory.devices(kind):
            nodes = by_name[stable_name(device)]
            assert [(n["path"], n["major"], n["minor"]) for n in nodes] == [
                (n.path, n.major, n.minor) for n in device.all_nodes], (host.name,
                                                                                           stable_name(device))
            seen.add(stable_name(device))
    assert {"0000:05:00.0-p0", "0000:26:00.0-p7", "0000:23:00.0", "0:3"} <= seen  # 0:3: a MIG device without NVML


def _broken(change: str) -> dict[str, Any]:
    spec = copy.deepcopy(_spec(REPO / "examples" / "hosts" / "seed-8x-gfx1100"))
    node = spec["devices"][0]["containerEdits"]["deviceNodes"][0]
    if change == "unknown-field":
        spec["devices"][0]["extra"] = True
    elif change == "bad-type":
        node["type"] = "x"
    elif change == "relative-path":
        node["path"] = "dev/dri/card1"
    elif change == "bad-permissions":
        node["permissions"] = "rwx"
    elif change == "bad-name":
        spec["devices"][0]["name"] = "-0"
    elif change == "bad-kind":
        spec["kind"] = "amd.com"
    elif change == "unknown-version":
        spec["cdiVersion"] = "9.9.9"
    elif change == "version-too-low":
        spec["cdiVersion"] = "0.4.0"  # names starting with a digit need 0.5.0
    elif change == "duplicate-name":
        spec["devices"][1]["name"] = spec["devices"][0]["name"]
    elif change == "minor-as-string":
        node["minor"] = "1"
    elif change == "no-devices":
        spec["devices"] = []
    return spec


@pytest.mark.parametrize("change", ["unknown-field", "bad-type", "relative-path", "bad-permissions", "bad-name",
                                    "bad-kind", "unknown-version", "version-too-low", "duplicate-name",
                                    "minor-as-string", "no-devices"])
def test_validator_rejects_a_wrong_field(change: str) -> None:
    with pytest.raises(HookError):
        cdi.validate(_broken(change), "spec")


@pytest.mark.parametrize(("change", "version"), [
    ({"annotations": {"a": "b"}}, "0.6.0"),
    ({"kind": "amd.com/gpu.partition"}, "0.6.0"),
    ({"devices": [{"name": "gpu0", "containerEdits": {"additionalGids": [44]}}]}, "0.7.0"),
    ({"devices": [{"name": "gpu0", "containerEdits": {"mounts": [{"hostPath": "/a", "containerPath": "/b",
                                                                     "type": "bind"}]}}]}, "0.4.0"),
    ({"devices": [{"name": "gpu0", "containerEdits": {}}]}, "0.3.0"),
])
def test_minimum_version(change: dict[str, Any], version: str) -> None:
    spec = {"cdiVersion": "0.3.0", "kind": "amd.com/gpu", "devices": [{"name": "gpu0", "containerEdits": {}}]}
    spec.update(change)
    assert cdi.minimum_version(spec) == version


def test_write_is_atomic_and_only_on_change(tmp_path: Path) -> None:
    path = tmp_path / "cdi" / "amd.com-gpu.json"
    text = cdi.render(_spec(REPO / "examples" / "hosts" / "seed-8x-gfx1100"), "json")
    assert cdi.write(str(path), text) is True
    assert (path.stat().st_mode & 0o777) == 0o644 and path.read_text() == text
    inode = path.stat().st_ino
    assert cdi.write(str(path), text) is False and path.stat().st_ino == inode
    assert cdi.write(str(path), text.replace('"0.5.0"', '"0.6.0"')) is True
    assert path.stat().st_ino != inode  # replaced by rename, never rewritten in place
    assert sorted(p.name for p in path.parent.iterdir()) == ["amd.com-gpu.json"]  # no temp file left


def test_cli_writes_into_a_cdi_directory(tmp_path: Path) -> None:
    # the links hook the spec names must be there, or cdi list reports it (tests/test_cdi_commands.py)
    env = {"PATH": os.environ["PATH"], "OCI_GPU_HOOK_CONFIG": "/dev/null", "OCI_GPU_HOOK_HOOK_PATH": "/bin/sh"}
    host = REPO / "examples" / "hosts" / "seed-8x-gfx1100" / "sys"
    base = [sys.executable, "-m", "oci_gpu_hook.entry.cli", "--sysfs-root", str(host), "cdi"]
    done = subprocess.run([*base, "generate", "--output", str(tmp_path), "--format", "yaml"],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    written = tmp_path / "amd.com-gpu.yaml"
    assert yaml.safe_load(written.read_text())["kind"] == "amd.com/gpu"
    written.unlink()  # a YAML and a JSON spec of one kind side by side is a conflict that cdi list reports
    done = subprocess.run([*base, "generate", "--output", str(tmp_path)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    written = tmp_path / "amd.com-gpu.json"
    listed = subprocess.run([*base, "list", "--spec-dirs", str(tmp_path)], capture_output=True, text=True,
                            env={**env, "OCI_GPU_HOOK_CDI_DIR": str(tmp_path)})
    assert listed.returncode == 0, listed.stderr
    assert "amd.com/gpu=1 " in listed.stdout and "amd.com/gpu=0000:23:00.0" in listed.stdout
    assert f"spec file {written}: current" in listed.stdout
    other = REPO / "examples" / "hosts" / "shuffled-4x-gfx942" / "sys"
    stale = subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", "--sysfs-root", str(other), "cdi", "list"],
                           capture_output=True, text=True, env={**env, "OCI_GPU_HOOK_CDI_DIR": str(tmp_path)})
    assert "STALE" in stale.stdout
    bad = subprocess.run([*base, "validate", str(host)], capture_output=True, text=True, env=env)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
