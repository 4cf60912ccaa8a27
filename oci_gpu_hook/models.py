"""Pydantic models of the project's config file and outputs, for JSON schemas and ``list --json``.

Off the per-container path (pydantic costs ~200 ms to import).  The config
model is *generated* from :data:`oci_gpu_hook.config.FIELDS`, the one
definition of the keys: it exists to write ``schemas/config.schema.json`` for
editors and other tools; validating a file is the loader's job
(``oci-gpu-hook validate`` runs :func:`oci_gpu_hook.config.load_file`), so the
two can never disagree on what is accepted.  Regenerate the schemas with
``python -m oci_gpu_hook.models schemas/``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from oci_gpu_hook.config import ACCESS_VALUES, FIELDS, HEALTH_SIGNALS
from oci_gpu_hook.core.devices import Node
from oci_gpu_hook.inventory import Device, Inventory, stable_name
from oci_gpu_hook.kinds import KINDS

_ENV_NAME = "^[A-Za-z_][A-Za-z0-9_]*$"
_KIND = Literal[tuple(KINDS)]  # type: ignore[valid-type]


def _annotation(kind: str) -> Any:
    from typing import Annotated

    return {
        "str": str,
        "path": Annotated[str, Field(min_length=1)],
        "bool": bool,
        "mode": Annotated[int, Field(ge=0, le=0o7777)],
        "id": Annotated[int, Field(ge=0, le=4294967294)],
        "count": Annotated[int, Field(ge=0, le=4294967294)],
        "signals": Annotated[list[Literal[HEALTH_SIGNALS]], Field(json_schema_extra={"uniqueItems": True})],  # type: ignore[valid-type]
        "access": Literal[ACCESS_VALUES],  # type: ignore[valid-type]
        "kinds": Annotated[list[_KIND], Field(min_length=1)],  # type: ignore[valid-type]
        "env_table": dict[_KIND, Annotated[list[Annotated[str, Field(pattern=_ENV_NAME)]],  # type: ignore[valid-type]
                                           Field(min_length=1)]],
    }[kind]


def _default(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


ConfigModel: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "ConfigModel",
    __config__=ConfigDict(extra="forbid", strict=True, title="oci-gpu-hook config"),
    **{name: (_annotation(f.type), Field(_default(f.default), description=f.doc)) for name, f in FIELDS.items()},
)


class NodeModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    type: Literal["c", "b"]
    major: int = Field(ge=0)
    minor: int = Field(ge=0)

    @classmethod
    def of(cls, node: Node) -> NodeModel:
        return cls(path=node.path, type=node.type, major=node.major, minor=node.minor)  # type: ignore[arg-type]


class DeviceModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: _KIND  # type: ignore[valid-type]
    index: int = Field(ge=0)
    name: str = Field(description="the stable CDI device name: a GPU's PCI address, a partition's <pci>-p<N>")
    pci_address: str = Field(pattern="^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]$")
    partition: int | None = Field(ge=0, le=7)
    drm_name: str
    compute_mode: str | None
    memory_mode: str | None
    vendor_id: str
    device_id: str
    driver: str | None
    model: str
    numa_node: int | None
    nodes: list[NodeModel]
    links: list[tuple[str, str]]
    unique_id: str | None = Field(pattern="^0x[0-9a-f]{16}$")
    hive_id: int | None
    kfd_gpu_id: int | None
    label: str = Field(description="the index as the vendor spells it: '3', or '1:0' for NVIDIA MIG device 0 of GPU 1")
    uuid: str | None = Field(description="NVIDIA: GPU-... or MIG-... (None for a MIG device when NVML is unavailable)")
    minor: int | None = Field(description="NVIDIA: the device minor of the GPU (of the parent GPU for MIG)")
    mig: tuple[int, int] | None = Field(description="NVIDIA MIG device: (GPU instance id, compute instance id)")
    parent: int | None = Field(description="NVIDIA MIG device: the index of its GPU")
    display_nodes: list[NodeModel] = Field(description="NVIDIA: DRM nodes, given with graphics or display")

    @classmethod
    def of(cls, device: Device) -> DeviceModel:
        vendor: dict[str, Any] = dict.fromkeys(VENDOR_FACTS)  # a vendor's facts, None where it has none
        vendor.update(device.facts())
        return cls(
            **vendor, label=device.label,
            display_nodes=[NodeModel.of(n) for n in device.all_nodes if n not in device.nodes],
            kind=device.kind, index=device.index, name=stable_name(device), pci_address=device.pci_address,
            partition=device.partition, drm_name=device.drm_name,
            vendor_id=device.vendor_id, device_id=device.device_id, driver=device.driver, model=device.model,
            numa_node=device.numa_node, nodes=[NodeModel.of(n) for n in device.nodes], links=list(device.links),
        )


# The fields of DeviceModel that are one vendor's (Device.facts()): None for every other vendor's device.
VENDOR_FACTS = ("compute_mode", "memory_mode", "unique_id", "hive_id", "kfd_gpu_id", "uuid", "minor", "mig", "parent")


class InventoryModel(BaseModel):
    """Output of ``oci-gpu-hook list --json``."""

    model_config = ConfigDict(extra="forbid", title="oci-gpu-hook inventory")

    sysfs_root: str
    devices: list[DeviceModel]
    shared_nodes: dict[str, list[NodeModel]]
    ignored: list[tuple[str, str]]

    @classmethod
    def of(cls, inventory: Inventory) -> InventoryModel:
        return cls(
            sysfs_root=inventory.sysfs_root,
            devices=[DeviceModel.of(d) for d in inventory.all_devices],
            shared_nodes={k: [NodeModel.of(n) for n in found.shared] for k, found in inventory.kinds.items()},
            ignored=list(inventory.ignored),
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
