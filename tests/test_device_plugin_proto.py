"""The device plugin's generated gRPC code, its wire names, and what stays off the per-container path."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "oci_gpu_hook" / "cluster" / "deviceplugin"
REPO = PACKAGE.parent.parent.parent
HEADER_LINES = 3


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools is not installed")
def test_generated_code_is_what_grpcio_tools_makes_of_api_proto(tmp_path: Path) -> None:
    """Regenerate from api.proto and compare with the committed modules (below their 3-line header)."""
    done = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", str(REPO), f"--python_out={tmp_path}",
                           f"--grpc_python_out={tmp_path}", str(PACKAGE / "api.proto")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for name in ("api_pb2.py", "api_pb2_grpc.py"):
        committed = (PACKAGE / name).read_text().splitlines(keepends=True)
        assert committed[0].startswith("# oci-gpu-hook: generated from api.proto by grpcio-tools")
        fresh = (tmp_path / "oci_gpu_hook" / "cluster" / "deviceplugin" / name).read_text()
        assert "".join(committed[HEADER_LINES:]) == fresh, (
            f"{name} is not what grpcio-tools generates from api.proto: regenerate it (see its header)")


def test_wire_names_are_the_kubelets() -> None:
    """The kubelet calls /v1beta1.Registration/Register and /v1beta1.DevicePlugin/<method>; field numbers
    and types are the published API's."""
    from oci_gpu_hook.cluster.deviceplugin import api_pb2 as api

    services = api.DESCRIPTOR.services_by_name
    assert services["Registration"].full_name == "v1beta1.Registration"
    assert [m.name for m in services["DevicePlugin"].methods] == [
        "GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate", "PreStartContainer"]
    assert services["DevicePlugin"].methods_by_name["ListAndWatch"].server_streaming

    def fields(message: str) -> dict[str, tuple[int, int]]:
        return {f.name: (f.number, f.type) for f in api.DESCRIPTOR.message_types_by_name[message].fields}

    string, message, boolean, int64, int32 = 9, 11, 8, 3, 5
    assert fields("RegisterRequest") == {"version": (1, string), "endpoint": (2, string),
                                         "resource_name": (3, string), "options": (4, message)}
    assert fields("DevicePluginOptions") == {"pre_start_required": (1, boolean),
                                             "get_preferred_allocation_available": (2, boolean)}
    assert fields("Device") == {"ID": (1, string), "health": (2, string), "topology": (3, message)}
    assert fields("NUMANode") == {"ID": (1, int64)}
    assert fields("ContainerPreferredAllocationRequest") == {
        "available_deviceIDs": (1, string), "must_include_deviceIDs": (2, string), "allocation_size": (3, int32)}
    assert fields("ContainerAllocateResponse") == {"envs": (1, message), "mounts": (2, message),
                                                   "devices": (3, message), "annotations": (4, message),
                                                   "cdi_devices": (5, message)}
    assert fields("CDIDevice") == {"name": (1, string)}
    assert fields("DeviceSpec") == {"container_path": (1, string), "host_path": (2, string),
                                    "permissions": (3, string)}


@pytest.mark.parametrize("module", ["oci_gpu_hook.entry.cli", "oci_gpu_hook.entry.runtime",
                                    "oci_gpu_hook.appliers.live"])
def test_grpc_is_never_imported_on_the_per_container_path(module: str) -> None:
    code = (f"import sys, {module}\n"
            "bad = sorted(m for m in sys.modules if m == 'grpc' or m.startswith(('grpc.', 'google.protobuf'))"
            " or m.startswith('oci_gpu_hook.cluster.deviceplugin'))\n"
            "print(','.join(bad))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"{module} imports {done.stdout.strip()}"


def test_the_command_is_in_the_usage_and_lists_devices() -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", *args], capture_output=True,
                              text=True, timeout=60, cwd=REPO)

    assert "  device-plugin [--kubelet-dir DIR] [--resource-strategy single|mixed]" in cli("--help").stdout
    seed = REPO / "examples" / "hosts" / "seed-8x-gfx1100" / "sys"
    done = cli("device-plugin", "--list", "--sysfs-root", str(seed))  # a global option, anywhere on the line
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1] == "amd.com/gpu  0000:23:00.0  amd.com/gpu=0000:23:00.0  numa 0  hive -  Healthy"
    done = cli("device-plugin", "--resource-strategy", "odd")
    assert done.returncode != 0 and done.stderr.count("\n") == 1 and "invalid choice: 'odd'" in done.stderr
    done = cli("device-plugin", "--rescan-interval", "0")
    assert done.returncode == 1 and "--rescan-interval '0': expected seconds" in done.stderr
