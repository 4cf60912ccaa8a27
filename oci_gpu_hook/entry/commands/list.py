"""``oci-gpu-hook list``: the host's GPUs and compute partitions, per kind, in index order."""

from __future__ import annotations

import os
import sys

from oci_gpu_hook.cliparse import parser as _parser

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from oci_gpu_hook.config import Config


def run(args: list[str], config: Config) -> int:
    parser = _parser("list", "List the host's GPUs and compute partitions, per kind, in each vendor's index order; "
                             "NAME is the stable CDI name (the same hardware while others come and go); HEALTH is "
                             "what the GPU's drivers say of it now (docs/health.md).")
    parser.add_argument("--json", action="store_true", help="print JSON (schemas/inventory.schema.json)")
    opts = parser.parse_args(args)
    from oci_gpu_hook.inventory import scan_host, stable_name

    inventory = scan_host(config)
    if not inventory.all_devices:
        from oci_gpu_hook.errors import HookError
        from oci_gpu_hook.inventory.sysfs import wrong_root

        problem = wrong_root(inventory.sysfs_root)  # nothing found, and no wonder: say where to look instead
        if problem:
            raise HookError(problem)
    if opts.json:
        from oci_gpu_hook.models import InventoryModel

        print(InventoryModel.of(inventory).model_dump_json(indent=2))
        return 0
    from oci_gpu_hook.cluster.health import GOOD, one_sample

    verdicts = one_sample(config, inventory, lambda line: print(f"warning: {line}", file=sys.stderr))  # one read
    rows = [("KIND", "INDEX", "NAME", "PCI ADDRESS", "PARTITION", "MODE", "CARD", "RENDER", "NUMA", "UNIQUE ID",
             "MODEL", "HEALTH")]
    for device in inventory.all_devices:
        card, render = device.card, device.render
        rows.append((
            device.kind, device.label, stable_name(device), device.pci_address,
            "-" if device.partition is None else f"{device.partition} ({device.drm_name})",
            device.mode or "-", os.path.basename(card.path) if card else "-",
            os.path.basename(render.path) if render else "-",
            "-" if device.numa_node is None else str(device.numa_node), str(device.facts().get("unique_id") or "-"),
            f"{device.model} ({device.vendor_id}:{device.device_id})",
            verdicts.get(device.pci_address, GOOD).status_line,
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    if not inventory.all_devices:
        print(f"(no GPUs under {inventory.sysfs_root})")
    for kind, found in inventory.kinds.items():
        if found.shared:
            shared = ", ".join(f"{n.path} ({n.type} {n.major}:{n.minor})" for n in found.shared)
            print(f"shared by {kind} GPUs: {shared}")
    for name, reason in inventory.ignored:
        print(f"ignored: {name}: {reason}")
    if inventory.devices("nvidia"):  # the driver's files a container gets, and any left out (validate: each file)
        from oci_gpu_hook.errors import HookError
        from oci_gpu_hook.inventory import nvdriver

        try:
            lines = nvdriver.report(config.proc_root, config.driver_root, config.sysfs_root, detail=False)
        except HookError as err:  # the GPUs are listed all the same; a container asking for them would stop here
            lines = [f"warning: driver of nvidia GPUs: {err}"]
        for line in lines:
            print(line.replace("ok: nvidia driver", "driver of nvidia GPUs:", 1))
    return 0
