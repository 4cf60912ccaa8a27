"""A vendor backend is a declared interface (``Backend`` in oci_gpu_hook/inventory/__init__.py): a fourth vendor is one
new module and one line in the vendor table, nothing else.

The toy vendor below exists only in this test: its module is written to a temporary directory that is added to the
``oci_gpu_hook.inventory`` package's path, and its line is added to :data:`oci_gpu_hook.kinds.KINDS` before anything
else of the package is imported, in a child interpreter (as an edit of kinds.py would be).  It subclasses
``Backend``, overrides ``discover`` and ``match`` and says ``plugin = True``; the test then sees its devices in every
listing the project makes, through the declared interface only: ``list`` (text and JSON), the precreate hook's plan
(index, range, PCI address, refusal), the CDI spec, the device plugin's devices and the DRA driver's devices."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from oci_gpu_hook.inventory import Backend
from tests.helpers import fakesysfs

REPO = Path(__file__).resolve().parent.parent
TOY_MODULE = '''"""A toy vendor: PCI devices bound to ``toygpu``, each its card and render node, in PCI order."""

from __future__ import annotations

import os

from oci_gpu_hook.inventory import Device
from oci_gpu_hook.inventory.sysfs import driver, numa_node, read
from oci_gpu_hook.inventory import Backend


class Toy(Backend):
    name = "toy"
    forms = "PCI address"
    plugin = True

    def discover(self, root, drm, proc_root, driver_root):
        seen, found = {}, []
        for device in drm:
            if device.pci is None or driver(device.directory) != "toygpu":
                continue
            if device.problem or device.render is None:
                seen[device.directory] = device.problem or "toy GPU without a render node"
                continue
            found.append(Device(kind="toy", nodes=device.nodes, links=device.links(), pci_address=device.name,
                                sysfs_dir=device.directory, drm_name=device.name,
                                numa_node=numa_node(device.directory), model="toy",
                                vendor_id=read(os.path.join(device.directory, "vendor")) or "",
                                device_id=read(os.path.join(device.directory, "device")) or "", driver="toygpu"))
            seen[device.directory] = ""
        return found, (), seen

    def match(self, token, devices):
        if ":" not in token:
            return None
        chosen = tuple(d for d in devices if d.pci_address == token.lower())
        return chosen or "is not the PCI address of a toy GPU on this host"


BACKEND = Toy()
'''
# What each child runs first: the vendor table's one line and the new module's directory, then the project as it is.
PRELUDE = """
import contextlib, io, json, os, sys
sys.path.insert(0, {repo!r})
from oci_gpu_hook.kinds import KINDS
KINDS["toy"] = ("toy.example/gpu", ("TOY_VISIBLE_DEVICES",))  # the one line in the vendor table
import oci_gpu_hook.inventory
oci_gpu_hook.inventory.__path__.append({modules!r})  # where the one new module is
from oci_gpu_hook.entry.cli import main
"""
# The precreate hook, as a runtime runs it: the spec on stdin, the rewritten spec on stdout.
PRECREATE = "sys.exit(main(['precreate']))"
# The operator's and the cluster's listings, in one child.
LISTINGS = """
def cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


result = {{"list": cli(["list"]), "json": cli(["list", "--json"])}}

from oci_gpu_hook.appliers import cdi
from oci_gpu_hook.config import Config
from oci_gpu_hook.cluster.deviceplugin import devices as plugin
from oci_gpu_hook.cluster.dra import devices as dra
from oci_gpu_hook.inventory import scan_host

config = Config(sysfs_root={sysfs!r}, proc_root={proc!r})
inventory = scan_host(config)
spec = cdi.generate(inventory, "toy", config)
result["cdi"] = [spec["kind"], [d["name"] for d in spec["devices"]]]
advertised, notes = plugin.plan(inventory)
result["served"] = list(plugin.SERVED)
result["plugin"] = [[d.kind, d.id, d.resource, d.type, d.qualified, list(d.host_nodes)] for d in advertised]
published, notes = dra.build(inventory)
result["dra"] = [[d.name, d.kind, d.stable, sorted((k, v[1]) for k, v in d.attributes.items())] for d in published]
print(repr(result))
"""
REQUESTS = {"index": "1", "range": "0-1", "address": "0000:00:05.0", "bad": "7", "all": "all"}


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    base = tmp_path_factory.mktemp("toy")
    modules = base / "modules"
    modules.mkdir()
    (modules / "toy.py").write_text(TOY_MODULE)
    host = fakesysfs.FakeHost(gpus=[
        fakesysfs.FakeGpu("0000:00:05.0", 1, 129, vendor="0x1234", device="0x1111", driver="toygpu", numa_node=1),
        fakesysfs.FakeGpu("0000:00:04.0", 0, 128, vendor="0x1234", device="0x1111", driver="toygpu"),
    ], kfd=False)
    sysfs = fakesysfs.build(str(base / "sys"), host)
    proc = base / "proc"
    proc.mkdir()
    env = {"PATH": "/usr/bin:/bin", "OCI_GPU_HOOK_CONFIG": "/dev/null", "OCI_GPU_HOOK_SYSFS_ROOT": sysfs,
           "OCI_GPU_HOOK_PROC_ROOT": str(proc), "OCI_GPU_HOOK_HOOK_PATH": "/bin/sh",
           "OCI_GPU_HOOK_BY_PATH_DIR": os.environ["OCI_GPU_HOOK_BY_PATH_DIR"]}
    prelude = PRELUDE.format(repo=str(REPO), modules=str(modules))

    def child(code: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-I", "-c", prelude + code], input=stdin, capture_output=True,
                              text=True, env=env, cwd="/", timeout=120)

    done = child(LISTINGS.format(sysfs=sysfs, proc=str(proc)))
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    for name, value in REQUESTS.items():
        spec = {"ociVersion": "1.0.2", "process": {"args": ["/bin/true"], "env": [f"TOY_VISIBLE_DEVICES={value}"]},
                "root": {"path": "/"}}
        done = child(PRECREATE, json.dumps(spec))
        result[name] = (done.returncode, done.stdout, done.stderr)
    return result


def test_the_toy_vendor_is_listed(toy: dict[str, object]) -> None:
    rc, out, _err = toy["list"]  # type: ignore[misc]
    assert rc == 0
    rows = [line.split() for line in out.splitlines() if line.startswith("toy ")]
    assert [row[:4] for row in rows] == [["toy", "0", "0000:00:04.0", "0000:00:04.0"],
                                         ["toy", "1", "0000:00:05.0", "0000:00:05.0"]]
    rc, out, _err = toy["json"]  # type: ignore[misc]
    assert rc == 0
    devices = json.loads(out)["devices"]
    assert [(d["kind"], d["index"], d["name"], d["numa_node"], d["uuid"], d["compute_mode"]) for d in devices] == [
        ("toy", 0, "0000:00:04.0", 0, None, None), ("toy", 1, "0000:00:05.0", 1, None, None)]
    assert [n["path"] for n in devices[1]["nodes"]] == ["/dev/dri/card1", "/dev/dri/renderD129"]


def _granted(outcome: object) -> list[str]:
    rc, out, err = outcome  # type: ignore[misc]
    assert rc == 0, err
    return [d["path"] for d in json.loads(out)["linux"]["devices"]]


def test_the_toy_vendor_is_planned_on_the_start_path(toy: dict[str, object]) -> None:
    assert _granted(toy["index"]) == ["/dev/dri/card1", "/dev/dri/renderD129"]
    assert _granted(toy["address"]) == ["/dev/dri/card1", "/dev/dri/renderD129"]  # the backend's own form
    assert _granted(toy["range"]) == _granted(toy["all"]) == ["/dev/dri/card0", "/dev/dri/renderD128",
                                                               "/dev/dri/card1", "/dev/dri/renderD129"]
    rc, out, err = toy["bad"]  # type: ignore[misc]
    assert rc != 0 and not out and len(err.strip().splitlines()) == 1
    assert "'7' is out of range (the host has 2 toy GPUs)" in err and "PCI addresses" not in err
    assert "valid: all, none, indices 0-1" in err


def test_the_toy_vendor_has_a_cdi_spec(toy: dict[str, object]) -> None:
    assert toy["cdi"] == ["toy.example/gpu", ["0", "1", "0000:00:04.0", "0000:00:05.0", "all"]]


def test_the_toy_vendor_is_advertised_by_the_device_plugin(toy: dict[str, object]) -> None:
    assert toy["served"] == ["amd", "nvidia", "toy"]
    assert toy["plugin"] == [
        ["toy", "0000:00:04.0", "toy.example/gpu", "gpu", "toy.example/gpu=0000:00:04.0",
         ["/dev/dri/card0", "/dev/dri/renderD128"]],
        ["toy", "0000:00:05.0", "toy.example/gpu", "gpu", "toy.example/gpu=0000:00:05.0",
         ["/dev/dri/card1", "/dev/dri/renderD129"]]]


def test_the_toy_vendor_is_published_by_the_dra_driver(toy: dict[str, object]) -> None:
    assert [(name, kind, stable) for name, kind, stable, _a in toy["dra"]] == [  # type: ignore[attr-defined]
        ("gpu-0000-00-04-0", "toy", "0000:00:04.0"), ("gpu-0000-00-05-0", "toy", "0000:00:05.0")]
    attributes = dict(toy["dra"][1][3])  # type: ignore[index]
    assert attributes == {"vendor": "toy", "type": "gpu", "model": "toy", "pciAddress": "0000:00:05.0",
                          "pciDeviceId": "0x1111", "stableName": "0000:00:05.0", "numaNode": 1, "driver": "toygpu"}


def test_every_backend_operation_has_its_default_on_the_base_class() -> None:
    """The shipped backends override only what Backend declares: no operation exists outside the interface."""
    from oci_gpu_hook.inventory import KINDS, backend

    declared = {name for name in vars(Backend) if not name.startswith("_")}
    for kind in KINDS:
        own = type(backend(kind))
        assert issubclass(own, Backend)
        extra = {name for name in vars(own) if not name.startswith("_")} - declared
        assert not extra, f"{kind}: {sorted(extra)} are not operations of Backend"
