"""Pydantic models of the project's own config file and outputs.

Off the per-container path (pydantic costs ~200 ms to import): used by
``list --json``, ``validate`` and the tests, and to write the JSON schemas in
``schemas/`` (``python -m oci_gpu_hook.models schemas/``).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from oci_gpu_hook.core.devices import Node
from oci_gpu_hook.inventory import Gpu, Inventory


class ConfigModel(BaseModel):
    """``/etc/oci-gpu-hook/config.toml``.  Every key is optional; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", strict=True, title="oci-gpu-hook config")

    sysfs_root: str = Field("/sys", description="Where sysfs is read (a fake tree for tests).")
    runtime: str = Field("runc", description="The real OCI runtime that oci-gpu-runtime execs.")
    request_env: list[str] = Field(["AMD_VISIBLE_DEVICES"], min_length=1,
                                   description="Container env variables that carry a GPU request.")
    allow_env_requests: bool = Field(True, description="Honour GPU requests in the container's env; when off, "
                                     "only cdi.k8s.io annotations (the orchestrator's) count.")
    cdi_kind: str = Field("amd.com/gpu", pattern="^[A-Za-z][A-Za-z0-9_.-]*/[A-Za-z][A-Za-z0-9_.-]*$",
                          description="CDI kind of the generated spec and of annotation requests.")
    cdi_spec: str = Field("/var/run/cdi/amd.com-gpu.json",
                          description="The CDI spec file that `watch` keeps current and `install` writes.")
    device_file_mode: int = Field(0o666, ge=0, le=0o7777, description="Mode of the created nodes.")
    device_uid: int = Field(0, ge=0, description="Owner uid of the created nodes.")
    device_gid: int = Field(0, ge=0, description="Owner gid of the created nodes.")
    cgroup_access: str = Field("rwm", pattern="^(r|w|m|rw|rm|wm|rwm)$",
                               description="Access granted by each device cgroup rule.")
    log_file: str = Field("", description="Append one JSON line per hook run here ('' = off).")
    debug: bool = Field(False, description="Print tracebacks on internal errors.")


class DeviceNodeModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    type: Literal["c", "b"]
    major: int = Field(ge=0)
    minor: int = Field(ge=0)

    @classmethod
    def of(cls, node: Node) -> DeviceNodeModel:
        return cls(path=node.path, type=node.type, major=node.major, minor=node.minor)  # type: ignore[arg-type]


class GpuModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int = Field(ge=0)
    vendor: str
    vendor_id: str
    device_id: str
    pci_address: str = Field(pattern="^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]$")
    numa_node: int | None
    driver: str | None
    model: str
    card: DeviceNodeModel | None
    render: DeviceNodeModel
    kfd_gpu_id: int | None
    unique_id: str | None = Field(pattern="^0x[0-9a-f]{16}$")
    location_id: int | None
    partition: int | None

    @classmethod
    def of(cls, gpu: Gpu) -> GpuModel:
        return cls(
            index=gpu.index, vendor=gpu.vendor, vendor_id=gpu.vendor_id, device_id=gpu.device_id,
            pci_address=gpu.pci_address, numa_node=gpu.numa_node, driver=gpu.driver, model=gpu.model,
            card=DeviceNodeModel.of(gpu.card) if gpu.card else None, render=DeviceNodeModel.of(gpu.render),
            kfd_gpu_id=gpu.kfd_gpu_id, unique_id=gpu.unique_id_hex, location_id=gpu.location_id,
            partition=gpu.partition,
        )


class InventoryModel(BaseModel):
    """Output of ``oci-gpu-hook list --json``."""

    model_config = ConfigDict(extra="forbid", title="oci-gpu-hook inventory")

    sysfs_root: str
    gpus: list[GpuModel]
    shared_nodes: dict[str, list[DeviceNodeModel]]

    @classmethod
    def of(cls, inventory: Inventory) -> InventoryModel:
        return cls(
            sysfs_root=inventory.sysfs_root,
            gpus=[GpuModel.of(g) for g in inventory.gpus],
            shared_nodes={v: [DeviceNodeModel.of(n) for n in nodes] for v, nodes in inventory.shared_nodes.items()},
        )


GENERATED_SCHEMAS = {"config.schema.json": ConfigModel, "inventory.schema.json": InventoryModel}


def schema_text(model: type[BaseModel]) -> str:
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **model.model_json_schema()}
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write_schemas(directory: str) -> None:
    for name, model in GENERATED_SCHEMAS.items():
        with open(os.path.join(directory, name), "w") as handle:
            handle.write(schema_text(model))


if __name__ == "__main__":
    write_schemas(sys.argv[1] if len(sys.argv) > 1 else "schemas")
