"""The DRA driver's generated gRPC code (oci_gpu_hook/cluster/dra/*_pb2*.py) and its wire names: the kubelet calls
/pluginregistration.Registration/GetInfo on the registration socket and
/k8s.io.kubelet.pkg.apis.dra.<version>.DRAPlugin/NodePrepareResources on the DRA socket; field numbers and types are
the kubelet's (k8s.io/kubelet pkg/apis/dra/v1, v1beta1, dra-health/v1alpha1 and pluginregistration/v1)."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "oci_gpu_hook" / "cluster" / "dra"
REPO = PACKAGE.parent.parent.parent
HEADER_LINES = 3
PROTOS = ("dra_v1", "dra_v1beta1", "registration", "health_v1alpha1")
STRING, MESSAGE, BOOL = 9, 11, 8


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools is not installed")
@pytest.mark.parametrize("proto", PROTOS)
def test_generated_code_is_what_grpcio_tools_makes_of_the_proto(tmp_path: Path, proto: str) -> None:
    done = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", str(REPO), f"--python_out={tmp_path}",
                           f"--grpc_python_out={tmp_path}", str(PACKAGE / f"{proto}.proto")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for name in (f"{proto}_pb2.py", f"{proto}_pb2_grpc.py"):
        committed = (PACKAGE / name).read_text().splitlines(keepends=True)
        assert committed[0].startswith(f"# oci-gpu-hook: generated from {proto}.proto by grpcio-tools")
        fresh = (tmp_path / "oci_gpu_hook" / "cluster" / "dra" / name).read_text()
        assert "".join(committed[HEADER_LINES:]) == fresh, (
            f"{name} is not what grpcio-tools generates from {proto}.proto: regenerate it (see its header)")


def _fields(module: object, message: str) -> dict[str, tuple[int, int, bool]]:
    descriptor = module.DESCRIPTOR.message_types_by_name[message]  # type: ignore[attr-defined]
    return {f.name: (f.number, f.type, f.is_repeated) for f in descriptor.fields}


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_dra_wire_names_are_the_kubelets(version: str) -> None:
    api = importlib.import_module(f"oci_gpu_hook.cluster.dra.dra_{version}_pb2")
    service = api.DESCRIPTOR.services_by_name["DRAPlugin"]
    assert service.full_name == f"k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin"
    assert [m.name for m in service.methods] == ["NodePrepareResources", "NodeUnprepareResources"]
    assert _fields(api, "Claim") == {"namespace": (1, STRING, False), "uid": (2, STRING, False),
                                     "name": (3, STRING, False)}
    assert _fields(api, "NodePrepareResourcesRequest") == {"claims": (1, MESSAGE, True)}
    assert _fields(api, "NodePrepareResourceResponse") == {"devices": (1, MESSAGE, True), "error": (2, STRING, False)}
    device = {"request_names": (1, STRING, True), "pool_name": (2, STRING, False),
              "device_name": (3, STRING, False), "cdi_device_ids": (4, STRING, True)}
    if version == "v1":
        device["share_id"] = (5, STRING, False)
    assert _fields(api, "Device") == device
    assert _fields(api, "NodeUnprepareResourceResponse") == {"error": (1, STRING, False)}
    claims = api.DESCRIPTOR.message_types_by_name["NodePrepareResourcesResponse"].fields_by_name["claims"]
    assert claims.number == 1 and claims.message_type.GetOptions().map_entry  # map<string, ...>


def test_registration_wire_names_are_the_kubelets() -> None:
    from oci_gpu_hook.cluster.dra import registration_pb2 as api

    service = api.DESCRIPTOR.services_by_name["Registration"]
    assert service.full_name == "pluginregistration.Registration"
    assert [m.name for m in service.methods] == ["GetInfo", "NotifyRegistrationStatus"]
    assert _fields(api, "PluginInfo") == {"type": (1, STRING, False), "name": (2, STRING, False),
                                          "endpoint": (3, STRING, False), "supported_versions": (4, STRING, True)}
    assert _fields(api, "RegistrationStatus") == {"plugin_registered": (1, BOOL, False), "error": (2, STRING, False)}


def test_health_wire_names_are_the_kubelets() -> None:
    from oci_gpu_hook.cluster.dra import health_v1alpha1_pb2 as api

    service = api.DESCRIPTOR.services_by_name["DRAResourceHealth"]
    assert service.full_name == "v1alpha1.DRAResourceHealth"
    (method,) = service.methods
    assert method.name == "NodeWatchResources" and method.server_streaming
    assert _fields(api, "DeviceIdentifier") == {"pool_name": (1, STRING, False), "device_name": (2, STRING, False)}
    enum, int64 = 14, 3
    assert _fields(api, "DeviceHealth") == {"device": (1, MESSAGE, False), "health": (2, enum, False),
                                            "last_updated_time": (3, int64, False),
                                            "health_check_timeout_seconds": (4, int64, False),
                                            "message": (5, STRING, False)}
    assert {v.name: v.number for v in api.DESCRIPTOR.enum_types_by_name["HealthStatus"].values} == {
        "UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
    assert _fields(api, "NodeWatchResourcesResponse") == {"devices": (1, MESSAGE, True)}


def test_grpc_and_the_driver_stay_off_the_per_container_path() -> None:
    code = ("import sys, oci_gpu_hook.entry.cli, oci_gpu_hook.entry.runtime\n"
            "print(','.join(sorted(m for m in sys.modules if m == 'grpc' or m.startswith(('grpc.', 'google.protobuf',"
            " 'oci_gpu_hook.cluster.dra')))))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
