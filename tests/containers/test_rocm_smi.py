"""A real ROCm client in real containers: Debian's ``rocm-smi`` 5.2.3 sees exactly the GPUs the container got.

Each container runs ``rocm-smi --showbus --json`` under runc, started through the runtime shim
(``oci-gpu-runtime``), which rewrites the spec as on a node: device nodes, cgroup rules and, with
``mask_other_gpus = true``, ``linux.maskedPaths`` for the sysfs directories of every GPU not granted.

The container is built the way a runtime builds one on a GPU node, with the example host standing in for the
host: where runc would mount the host's sysfs at /sys, the spec bind-mounts the example host's tree (read-only)
instead, and runc applies the masked paths over it.  rocm-smi and its Python come from this machine's /usr and
/etc, bound read-only into an otherwise empty rootfs; /dev/shm (where rocm-smi writes ``rocm_smi_*``) is the
container's own tmpfs.

rocm-smi numbers GPUs in DRM card order (``/sys/class/drm/cardN`` with a ``device/vendor`` of 0x1002), not in
the toolkits' PCI order, so the GPUs are compared by PCI bus id.  rocm-smi 5.2.3 predates compute partitions:
on the MI300X host it lists the PCI GPUs (partition 0's DRM device), so a container holding a partition sees
that partition's GPU.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import containerlib as cl
from tests.helpers.fakesysfs import HOSTS

pytestmark = pytest.mark.containers

ROCM_SMI = ["rocm-smi", "--showbus", "--json"]


def _pci_order(host: str) -> list[str]:
    """The host's AMD GPUs in the toolkit's index order (PCI order), by bus id, from the fixture definition."""
    return sorted(g.pci for g in HOSTS[host]().gpus if g.driver == "amdgpu" and g.render is not None)


def _host_rootfs(path: Path) -> tuple[Path, list[dict[str, Any]]]:
    """An empty rootfs and the read-only binds that put this machine's /usr and /etc (rocm-smi, python3, the
    dynamic linker's cache) into it; /bin, /lib... are the same symlinks as here on a merged-/usr system."""
    for name in ("usr", "etc", "dev", "proc", "sys", "tmp"):
        (path / name).mkdir(parents=True)
    binds = ["/usr", "/etc"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / name
        if host.is_symlink():
            (path / name).symlink_to(os.readlink(host))
        elif host.is_dir():
            (path / name).mkdir()
            binds.append(str(host))
    return path, [{"destination": b, "type": "bind", "source": b, "options": ["rbind", "ro", "nosuid", "nodev"]}
                  for b in binds]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cl.need("runc", "rocm-smi")
    base = tmp_path_factory.mktemp("rocm-smi")
    rootfs, binds = _host_rootfs(base / "rootfs")
    runtimes = {}
    for host in ("seed", "mi300x-cpx", "shuffled"):
        for mask in (True, False):
            home = base / f"{host}-{'mask' if mask else 'nomask'}"
            home.mkdir()
            config = home / "config.toml"
            config.write_text(f'sysfs_root = "{cl.host_model(host).sysfs}"\n'
                              f'hook_path = "{home / "bin" / "oci-gpu-hook"}"\nlog_file = "{home / "log"}"\n'
                              f"mask_other_gpus = {'true' if mask else 'false'}\n")
            runtimes[(host, mask)] = cl.write_launchers(home / "bin", config)[1]
    return {"base": base, "rootfs": rootfs, "binds": binds, "runtimes": runtimes}


def _bundle(setup: dict[str, Any], host: str, env: list[str]) -> Path:
    bundle = cl.make_bundle(setup["base"] / cl.container_id(), setup["rootfs"], env, ROCM_SMI)
    sysfs = str(cl.host_model(host).sysfs)

    def change(spec: dict[str, Any]) -> None:
        process = spec["process"]
        process["env"] = [e for e in process["env"] if not e.startswith("PATH=")] + ["PATH=/usr/bin:/bin"]
        mounts = []
        for mount in spec["mounts"]:
            if mount["destination"] == "/sys":  # the host's sysfs, as runc would mount it: here the fake host's
                mount = {"destination": "/sys", "type": "bind", "source": sysfs,
                         "options": ["rbind", "ro", "nosuid", "noexec", "nodev"]}
            elif mount["destination"].startswith("/sys/"):
                continue  # /sys/fs/cgroup: nothing under the fake tree may be created
            mounts.append(mount)
        assert any(m["destination"] == "/dev/shm" and m["type"] == "tmpfs" for m in mounts)
        spec["mounts"] = mounts + setup["binds"]

    cl.edit_spec(bundle, change)
    return bundle


def _rocm_smi_buses(setup: dict[str, Any], host: str, mask: bool, request: str) -> set[str]:
    bundle = _bundle(setup, host, [f"AMD_VISIBLE_DEVICES={request}"])
    runtime = setup["runtimes"][(host, mask)]
    done = cl.run([str(runtime), "run", "--bundle", str(bundle), bundle.name], env=cl.hook_env())
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, f"no JSON from rocm-smi:\n{done.stdout}\n{done.stderr}"
    shown: dict[str, dict[str, str]] = json.loads(lines[0])
    assert all(key.startswith("card") for key in shown), shown
    return {entry["PCI Bus"].lower() for entry in shown.values()}


# (id, host, AMD_VISIBLE_DEVICES, the PCI order indices rocm-smi must show with the mask)
CASES = [
    ("seed-gpu1", "seed", "1", [1]),
    ("seed-two", "seed", "6,2", [2, 6]),
    ("seed-all", "seed", "all", list(range(8))),
    ("shuffled-gpu1", "shuffled", "1", [1]),
    ("cpx-partition-of-gpu1", "mi300x-cpx", "9", [1]),
    ("cpx-partition0-of-gpu0", "mi300x-cpx", "0", [0]),
]


@pytest.mark.parametrize(("host", "request_value", "seen"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rocm_smi_sees_exactly_the_granted_gpus_with_the_mask(setup: dict[str, Any], host: str,
                                                              request_value: str, seen: list[int]) -> None:
    pci = _pci_order(host)
    assert _rocm_smi_buses(setup, host, True, request_value) == {pci[i] for i in seen}


@pytest.mark.parametrize("host", ["seed", "mi300x-cpx"])
def test_rocm_smi_sees_every_gpu_without_the_mask(setup: dict[str, Any], host: str) -> None:
    """The device cgroup alone does not hide sysfs: with ``mask_other_gpus = false`` every GPU is listed."""
    assert _rocm_smi_buses(setup, host, False, "1" if host == "seed" else "9") == set(_pci_order(host))
