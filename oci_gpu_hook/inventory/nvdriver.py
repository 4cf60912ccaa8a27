"""The NVIDIA driver's user-space files a container gets, by driver capability, as container edits.

What libnvidia-container gives (``src/nvc_info.c``: ``utility_libs``, ``compute_libs``, ``video_libs``,
``graphics_libs`` with the GLVND ones, ``ngx_libs``, ``utility_bins``, ``compute_bins`` and the GSP
firmware), found the way it finds them:

* the driver version from ``/proc/driver/nvidia/version`` (``NVRM version: ... 550.54.15 ...``);
* libraries from the driver root's ``etc/ld.so.cache`` (:mod:`~oci_gpu_hook.inventory.ldcache`): each
  native-ABI entry whose soname is one of a capability's libraries (``libcuda.so.1``) and whose file,
  every symlink resolved inside the driver root, is that library of exactly this version
  (``libcuda.so.550.54.15``); leftovers of other versions are never given;
* binaries in the driver root's ``/usr/bin``, ``/usr/sbin``, ``/bin``, ``/sbin``, ``/usr/local/bin``,
  ``/usr/local/sbin`` and ``/usr/local/nvidia/bin`` (where GKE-style installs put them); firmware
  ``/lib/firmware/nvidia/<version>/`` when it is there.

Each file is a read-only bind mount (``ro, nosuid, nodev``) at its resolved host path; each soname
(``libcuda.so.1``, and ``libcuda.so`` as the toolkit adds it) is a symlink beside it; the libraries'
directories go into the container's ld cache.  ``compute`` without ``libcuda`` or ``utility`` without
``libnvidia-ml`` of the running driver is an error: a container would start without its driver.
Not given: 32-bit libraries (``compat32``), the X server's driver files (``display`` gives the nodes
only), IPC sockets (persistenced, fabric manager, MPS).
"""

from __future__ import annotations

import os

from oci_gpu_hook.core import inroot
from oci_gpu_hook.core.edits import Edits, Mount
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.inventory import ldcache
from oci_gpu_hook.inventory.sysfs import read

LIBRARIES = {
    "utility": ("libnvidia-ml.so", "libnvidia-cfg.so", "libnvidia-nscq.so"),
    "compute": ("libcuda.so", "libcudadebugger.so", "libnvidia-opencl.so", "libnvidia-gpucomp.so",
                "libnvidia-ptxjitcompiler.so", "libnvidia-fatbinaryloader.so", "libnvidia-allocator.so",
                "libnvidia-compiler.so", "libnvidia-pkcs11.so", "libnvidia-pkcs11-openssl3.so", "libnvidia-nvvm.so"),
    "video": ("libvdpau_nvidia.so", "libnvidia-encode.so", "libnvidia-opticalflow.so", "libnvcuvid.so"),
    "graphics": ("libnvidia-eglcore.so", "libnvidia-glcore.so", "libnvidia-tls.so", "libnvidia-glsi.so",
                 "libnvidia-fbc.so", "libnvidia-ifr.so", "libnvidia-rtcore.so", "libnvoptix.so", "libGLX_nvidia.so",
                 "libEGL_nvidia.so", "libGLESv2_nvidia.so", "libGLESv1_CM_nvidia.so", "libnvidia-glvkspirv.so",
                 "libnvidia-cbl.so"),
    "ngx": ("libnvidia-ngx.so",),
}
REQUIRED = (("compute", "libcuda.so"), ("utility", "libnvidia-ml.so"))
BINARIES = {
    "utility": ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager"),
    "compute": ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"),
}
BIN_DIRS = ("/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin", "/usr/local/sbin", "/usr/local/nvidia/bin")
FIRMWARE_DIR = "/lib/firmware/nvidia"
LD_CACHE = "/etc/ld.so.cache"


def driver_version(proc_root: str) -> str:
    """The loaded kernel module's version from ``/proc/driver/nvidia/version``."""
    path = os.path.join(proc_root, "driver", "nvidia", "version")
    text = read(path)
    if text is None:
        raise HookError(f"cannot read the NVIDIA driver version from {path} (is the nvidia module loaded?)")
    for line in text.splitlines():
        if line.startswith("NVRM version:"):
            for word in line.split():
                pieces = word.split(".")
                if len(pieces) >= 2 and all(p.isdigit() and p.isascii() for p in pieces):
                    return word
    raise HookError(f"{path}: no 'NVRM version: ... <version>' line")


def in_root(root: str, path: str) -> str:
    """The host path of ``path`` (absolute, as seen from ``root``)."""
    return path if root == "/" else root.rstrip("/") + path


def resolve(root: str, path: str) -> str | None:
    """``path`` as seen from ``root`` with every symlink resolved inside ``root`` (absolute targets start at
    ``root``, ``..`` stops there: the one walk's FOLLOW mode, :mod:`oci_gpu_hook.core.inroot`), as the root's own
    processes would see it; None when it does not exist."""
    return inroot.real_path(root, path)


def driver_files(proc_root: str, driver_root: str, caps: frozenset[str]) -> Edits:
    """The mounts, soname links and ld cache directories that give a container the driver for ``caps``."""
    version = driver_version(proc_root)
    cache_path = in_root(driver_root, LD_CACHE)
    wanted = [lib for cap, libs in LIBRARIES.items() if cap in caps for lib in libs]
    mounts: dict[str, Mount] = {}
    links: dict[str, str] = {}
    folders: dict[str, None] = {}
    found: set[str] = set()
    entries = ldcache.read(cache_path) if wanted else []
    native = ldcache.native_flags() if entries else 0
    for entry in entries:
        if entry.flags != native or entry.hwcap:
            continue
        lib = next((name for name in wanted if entry.soname.startswith(name + ".")), None)
        real = resolve(driver_root, entry.path) if lib else None
        if lib is None or real is None or os.path.basename(real) != f"{lib}.{version}":
            continue
        folder, base = os.path.dirname(real), os.path.basename(real)
        mounts[real] = Mount(in_root(driver_root, real), real)
        if entry.soname != base:
            links[f"{folder}/{entry.soname}"] = base
        if lib == "libcuda.so":  # the name programs link against, as the toolkit makes it
            links[f"{folder}/libcuda.so"] = entry.soname
        folders[folder] = None
        found.add(lib)
    for cap, lib in REQUIRED:
        if cap in caps and lib not in found:
            raise HookError(f"{cap}: the NVIDIA driver's {lib}.{version} (the running driver's version) is not in "
                            f"the ld cache {cache_path}; is its user-space installed under driver_root {driver_root}?")
    for cap, names in BINARIES.items():
        if cap not in caps:
            continue
        for name in names:
            for directory in BIN_DIRS:
                real = resolve(driver_root, f"{directory}/{name}")
                if real is not None and os.path.isfile(in_root(driver_root, real)):
                    mounts.setdefault(f"{directory}/{name}", Mount(in_root(driver_root, real), f"{directory}/{name}"))
                    break
    firmware = resolve(driver_root, f"{FIRMWARE_DIR}/{version}")
    if firmware is not None and os.path.isdir(in_root(driver_root, firmware)):
        mounts[f"{FIRMWARE_DIR}/{version}"] = Mount(in_root(driver_root, firmware), f"{FIRMWARE_DIR}/{version}")
    return Edits(mounts=tuple(sorted(mounts.values(), key=lambda m: m.destination)),
                 symlinks=tuple(sorted(links.items())), ldcache=tuple(sorted(folders)))
