"""The /proc and driver roots of a fake host with NVIDIA GPUs (its sysfs is tests/helpers/fakesysfs.py's).

Facts from docs/hardware.md#nvidia: ``/proc/devices`` (``nvidia`` 195 or
``nvidia-frontend``, dynamic ``nvidia-uvm`` and ``nvidia-caps``), ``/proc/driver/nvidia/version``,
``params``, ``gpus/<pci>/information``, ``/proc/driver/nvidia-caps/mig-minors`` and the capability access
files of each MIG instance.  mig-minors numbers as observed on a real node: ``config 1``, ``monitor 2``,
then 9 minors per GPU instance (its ``access`` and ``ci0..ci7``) of 15 GPU instances per GPU minor, from 3.
A real file lists every possible GPU minor; this one lists the host's minors only [A].

The driver root is a merged-/usr tree, as a host driver install leaves it, in one of the layouts real installs
use (:data:`LAYOUTS`): ``distro`` (Debian/Ubuntu packages, the default and the checked-in examples': libraries in
``/usr/lib/x86_64-linux-gnu``, ``libvdpau_nvidia`` in its ``vdpau/``, binaries in ``/usr/bin``, the vendor jsons
in ``/usr/share``, the OpenCL ICD in ``/etc/OpenCL/vendors``), ``runfile`` (NVIDIA's ``.run`` installer:
``/usr/lib64``, the Vulkan ICD in ``/etc/vulkan/icd.d``) and ``gke`` (a GKE-style prefix ``/usr/local/nvidia``
with ``lib64/``, ``bin/``, ``share/`` and ``firmware/``, and ``#!/bin/sh`` wrappers in ``/usr/bin`` that exec its
binaries, as on a real H200 host).  The libraries of each capability are minimal real ELF shared objects with a
``DT_SONAME``, so that ``ldconfig`` reads them as it reads the real ones, with their soname links; 32-bit copies
in ``/usr/lib/i386-linux-gnu``; one leftover of an older driver (``libnvidia-opencl.so.470.223.02``, its link
still pointing at it); ``libnvidia-egl-gbm`` and ``libnvidia-egl-wayland``, versioned apart from the driver as
the real ones are; ``/etc/ld.so.cache`` in glibc's new format (written here; tests read it back with the real
``ldconfig -p``); binaries that are tiny static ELF executables for x86-64 (:func:`elf_executable`: they exec
``/bin/sh`` with a script of their own; ``nvidia-smi -L`` lists the GPUs whose ``/dev/nvidia<minor>`` the
container has, with their UUIDs); GSP firmware in ``<firmware>/nvidia/<version>/``.
"""

from __future__ import annotations

import functools
import os
import struct

from tests.helpers.fakesysfs import FakeHost

LIB_DIR = "/usr/lib/x86_64-linux-gnu"
LIB32_DIR = "/usr/lib/i386-linux-gnu"
# soname version per library (NVIDIA's: most are .1; libnvidia-opencl is .1 too, libGLX_nvidia .0)
LIBRARIES = {
    "libnvidia-ml.so": "1", "libnvidia-cfg.so": "1", "libcuda.so": "1", "libcudadebugger.so": "1",
    "libnvidia-opencl.so": "1", "libnvidia-gpucomp.so": None, "libnvidia-ptxjitcompiler.so": "1",
    "libnvidia-allocator.so": "1", "libnvidia-pkcs11-openssl3.so": None, "libnvidia-nvvm.so": "4",
    "libvdpau_nvidia.so": "1", "libnvidia-encode.so": "1", "libnvidia-opticalflow.so": "1", "libnvcuvid.so": "1",
    "libnvidia-eglcore.so": None, "libnvidia-glcore.so": None, "libnvidia-tls.so": None, "libnvidia-glsi.so": None,
    "libnvidia-fbc.so": "1", "libnvidia-rtcore.so": None, "libnvoptix.so": "1", "libGLX_nvidia.so": "0",
    "libEGL_nvidia.so": "0", "libGLESv2_nvidia.so": "2", "libGLESv1_CM_nvidia.so": "1",
    "libnvidia-glvkspirv.so": None, "libnvidia-ngx.so": "1",
}
# libraries versioned apart from the driver (real file version, soname), named by the EGL external platform jsons
SIDE_LIBRARIES = {"libnvidia-egl-gbm.so": ("1.1.2", "1"), "libnvidia-egl-wayland.so": ("1.1.13", "1")}
LIB32 = ("libcuda.so", "libnvidia-ml.so")  # 32-bit copies: never given (compat32 is not served)
OLD_VERSION = "470.223.02"
BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
            "nvidia-cuda-mps-server")
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")
KERNEL_RELEASE = "6.8.0-1028-gcp"
# layout -> (library directory, its ld cache path prefix, binary directory, data directory of the GLVND/EGL/OptiX
# files, Vulkan's, firmware directory, wrapper script directory or None)
LAYOUTS = {
    "distro": ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/bin", "/usr/share", "/usr/share",
               "/usr/lib/firmware", None),
    "runfile": ("/usr/lib64", "/usr/lib64", "/usr/bin", "/usr/share", "/etc", "/usr/lib/firmware", None),
    "gke": ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib64", "/usr/local/nvidia/bin", "/usr/local/nvidia/share",
            "/usr/local/nvidia/share", "/usr/local/nvidia/firmware", "/usr/bin"),
}
# path below a data directory -> its text (what the real driver's files say, less the fields no loader here reads)
def _icd_json(library: str, version: str = "1.0.0") -> str:
    return (f'{{\n    "file_format_version" : "{version}",\n    "ICD" : {{\n        "library_path" : "{library}"\n'
            '    }\n}\n')


VENDOR_FILES = {
    "glvnd/egl_vendor.d/10_nvidia.json": _icd_json("libEGL_nvidia.so.0"),
    "egl/egl_external_platform.d/15_nvidia_gbm.json": _icd_json("libnvidia-egl-gbm.so.1"),
    "egl/egl_external_platform.d/10_nvidia_wayland.json": _icd_json("libnvidia-egl-wayland.so.1"),
    "vulkan/icd.d/nvidia_icd.json":
        '{\n    "file_format_version" : "1.0.1",\n    "ICD": {\n        "library_path": "libGLX_nvidia.so.0",\n'
        '        "api_version" : "1.4.312"\n    }\n}\n',
    "vulkan/implicit_layer.d/nvidia_layers.json":
        '{\n    "file_format_version" : "1.0.1",\n    "layer": {\n        "name": "VK_LAYER_NV_optimus",\n'
        '        "type": "INSTANCE",\n        "library_path": "libGLX_nvidia.so.0",\n'
        '        "api_version" : "1.4.312",\n        "implementation_version" : "1"\n    }\n}\n',
    "nvidia/nvoptix.bin": "fake OptiX data\n",
    "OpenCL/vendors/nvidia.icd": "libnvidia-opencl.so.1\n",
}
FRONTEND_MAJOR = 195


def _write(path: str, data: str | bytes, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data.encode() if isinstance(data, str) else data)
    os.chmod(path, mode)


def _link(target: str, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(target, path)


def soname(lib: str, version: str) -> str:
    """The soname of ``lib`` (the file name itself when it has no shorter one)."""
    short = LIBRARIES.get(lib)
    return f"{lib}.{short}" if short else f"{lib}.{version}"


# --- /proc ----------------------------------------------------------------------------------------


def mig_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """The nvidia-cap minor of ``gpu<gpu_minor>/gi<gi>/access`` (ci None) or ``.../ci<ci>/access``."""
    return 3 + gpu_minor * 15 * 9 + gi * 9 + (0 if ci is None else 1 + ci)


def build_proc(root: str, host: FakeHost) -> str:
    """Write ``host``'s NVIDIA /proc files under ``root``; return ``root``."""
    chars = [(1, "mem"), (4, "/dev/vc/0"), (4, "tty"), (5, "/dev/tty"), (5, "/dev/console"), (10, "misc"),
             (FRONTEND_MAJOR, host.frontend_name), (226, "drm")]
    if host.kfd and any(g.driver == "amdgpu" for g in host.gpus):
        chars.append((host.kfd_major, "kfd"))
    chars.append((host.caps_major, "nvidia-caps"))
    if host.nvidia_uvm:
        chars.append((host.uvm_major, "nvidia-uvm"))
    chars.append((511, "nvidia-caps-imex-channels"))
    blocks = [(7, "loop"), (8, "sd"), (259, "blkext")]
    _write(os.path.join(root, "devices"), "Character devices:\n" + "".join(f"{m:3d} {n}\n" for m, n in chars)
           + "\nBlock devices:\n" + "".join(f"{m:3d} {n}\n" for m, n in blocks))
    nv = os.path.join(root, "driver", "nvidia")
    _write(os.path.join(nv, "version"),
           f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {host.driver_version}  Release Build  "
           "(dvs-builder@U16-I3-C03-4-3)  Tue Mar  5 22:16:22 UTC 2024\nGCC version:  gcc version 12.2.0 "
           "(Debian 12.2.0-14)\n")
    _write(os.path.join(root, "sys", "kernel", "osrelease"), KERNEL_RELEASE + "\n")
    _write(os.path.join(nv, "params"), "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n"
                                       "DeviceFileGID: 0\nDeviceFileMode: 438\n")
    for gpu in host.nvidia:
        assert gpu.minor is not None
        _write(os.path.join(nv, "gpus", gpu.pci, "information"),
               f"Model: \t\t {gpu.model}\nIRQ:   \t\t {160 + gpu.minor}\nGPU UUID: \t {gpu.uuid}\n"
               "Video BIOS: \t 96.00.74.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
               f"DMA Mask: \t 0xfffffffffffff\nBus Location: \t {gpu.pci}\nDevice Minor: \t {gpu.minor}\n"
               f"GPU Firmware: \t {host.driver_version}\nGPU Excluded:\t {'Yes' if gpu.excluded else 'No'}\n")
    caps = os.path.join(nv, "capabilities")
    if any(g.migs for g in host.nvidia):
        _write(os.path.join(caps, "mig", "config"), "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
        _write(os.path.join(caps, "mig", "monitor"), "DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    lines = ["config 1", "monitor 2"]
    for minor in range(max((g.minor or 0 for g in host.nvidia), default=-1) + 1):
        for gi in range(15):
            lines.append(f"gpu{minor}/gi{gi}/access {mig_minor(minor, gi)}")
            lines += [f"gpu{minor}/gi{gi}/ci{ci}/access {mig_minor(minor, gi, ci)}" for ci in range(8)]
    _write(os.path.join(root, "driver", "nvidia-caps", "mig-minors"), "\n".join(lines) + "\n")
    for gpu in host.nvidia:
        assert gpu.minor is not None
        for gi, cis in gpu.migs:
            gi_dir = os.path.join(caps, f"gpu{gpu.minor}", "mig", f"gi{gi}")
            _write(os.path.join(gi_dir, "access"),
                   f"DeviceFileMinor: {mig_minor(gpu.minor, gi)}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
            for ci in cis:
                _write(os.path.join(gi_dir, f"ci{ci}", "access"),
                       f"DeviceFileMinor: {mig_minor(gpu.minor, gi, ci)}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    return root


# --- the driver root ------------------------------------------------------------------------------


def elf_shared_object(name: str, needed: tuple[str, ...] = ("libc.so.6",), machine: int = 62,
                      elf64: bool = True) -> bytes:
    """A minimal ELF shared object that ldconfig reads and ld.so loads: one PT_LOAD, a PT_DYNAMIC with DT_NEEDED,
    DT_SONAME, a one-symbol (null) DT_SYMTAB and its DT_HASH, DT_STRTAB.  ``machine`` 62 is x86-64, 3 is i386
    (with ``elf64`` False)."""
    strings = b"\0" + b"".join(n.encode() + b"\0" for n in (*needed, name))
    offsets, at = [], 1
    for n in (*needed, name):
        offsets.append(at)
        at += len(n) + 1
    if elf64:
        header, phent, dyn_entry, sym_size = 64, 56, "<qQ", 24
    else:
        header, phent, dyn_entry, sym_size = 52, 32, "<iI", 16
    dyn_off = header + 2 * phent
    entries = [(1, off) for off in offsets[:-1]] + [(14, offsets[-1])]
    # then DT_HASH, DT_SYMTAB, DT_SYMENT, DT_STRTAB, DT_STRSZ, DT_NULL: a loader can dlopen it (one null symbol)
    hash_off = dyn_off + (len(entries) + 6) * struct.calcsize(dyn_entry)
    symtab = hash_off + 16  # nbucket 1, nchain 1, bucket[0] 0, chain[0] 0
    strtab = symtab + sym_size
    entries += [(4, hash_off), (6, symtab), (11, sym_size), (5, strtab), (10, len(strings)), (0, 0)]
    dynamic = b"".join(struct.pack(dyn_entry, tag, value) for tag, value in entries)
    tables = struct.pack("<4I", 1, 1, 0, 0) + bytes(sym_size)
    total = strtab + len(strings)
    ident = b"\x7fELF" + bytes([2 if elf64 else 1, 1, 1, 0]) + bytes(8)
    if elf64:
        ehdr = ident + struct.pack("<HHIQQQIHHHHHH", 3, machine, 1, 0, header, 0, 0, header, phent, 2, 64, 0, 0)
        phdrs = (struct.pack("<IIQQQQQQ", 1, 6, 0, 0, 0, total, total, 0x1000)
                 + struct.pack("<IIQQQQQQ", 2, 6, dyn_off, dyn_off, dyn_off, len(dynamic), len(dynamic), 8))
    else:
        ehdr = ident + struct.pack("<HHIIIIIHHHHHH", 3, machine, 1, 0, header, 0, 0, header, phent, 2, 40, 0, 0)
        phdrs = (struct.pack("<IIIIIIII", 1, 0, 0, 0, total, total, 6, 0x1000)
                 + struct.pack("<IIIIIIII", 2, dyn_off, dyn_off, dyn_off, len(dynamic), len(dynamic), 6, 4))
    return ehdr + phdrs + dynamic + tables + strings


def elf_executable(script: str) -> bytes:
    """A static x86-64 ELF executable (one PT_LOAD, no libraries) that execs ``/bin/sh -c SCRIPT ARGV0 ARGS...``:
    a real program for the kernel and the loaders' checks (an ELF of this machine, not a ``#!`` script) that runs
    wherever ``/bin/sh`` does.  Its code: argc from the stack, envp past argv; the three new argv entries written
    below argv[0] (over argc); execve; exit 127 if that returns."""
    base, code_at = 0x400000, 64 + 56
    strings = [b"/bin/sh\0", b"-c\0", script.encode() + b"\0"]
    size = 68  # the code below, in bytes

    def lea(prefix: str, at: int, target: int) -> bytes:  # rip-relative: from the end of the 7-byte instruction
        return bytes.fromhex(prefix) + struct.pack("<i", target - (at + 7))

    sh = code_at + size
    dash_c, body = sh + len(strings[0]), sh + len(strings[0]) + len(strings[1])
    code = bytes.fromhex("488b0c24" "488d54cc10")  # mov rcx,[rsp]; lea rdx,[rsp+rcx*8+16]
    code += lea("488d3d", code_at + len(code), sh) + bytes.fromhex("48897c24f0")  # lea rdi,sh; mov [rsp-16],rdi
    code += lea("488d05", code_at + len(code), dash_c) + bytes.fromhex("48894424f8")  # lea rax,-c; mov [rsp-8],rax
    code += lea("488d05", code_at + len(code), body) + bytes.fromhex("48890424")  # lea rax,script; mov [rsp],rax
    # lea rsi,[rsp-16]; mov eax,59 (execve); syscall; mov edi,127; mov eax,60 (exit); syscall
    code += bytes.fromhex("488d7424f0" "b83b000000" "0f05" "bf7f000000" "b83c000000" "0f05")
    assert len(code) == size
    total = sh + sum(map(len, strings))
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    ehdr = ident + struct.pack("<HHIQQQIHHHHHH", 2, 62, 1, base + code_at, 64, 0, 0, 64, 56, 1, 64, 0, 0)
    phdr = struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, total, total, 0x1000)
    return ehdr + phdr + code + b"".join(strings)


def _libcmp(a: str, b: str) -> int:
    """glibc's _dl_cache_libcmp: runs of digits compare as numbers and sort after other characters."""
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i].isdigit() and b[j].isdigit():
            ei, ej = i, j
            while ei < len(a) and a[ei].isdigit():
                ei += 1
            while ej < len(b) and b[ej].isdigit():
                ej += 1
            if int(a[i:ei]) != int(b[j:ej]):
                return int(a[i:ei]) - int(b[j:ej])
            i, j = ei, ej
        elif a[i].isdigit() or b[j].isdigit():
            return 1 if a[i].isdigit() else -1
        elif a[i] != b[j]:
            return ord(a[i]) - ord(b[j])
        else:
            i, j = i + 1, j + 1
    return (len(a) - i) - (len(b) - j)


def ld_cache(entries: list[tuple[str, str, int]]) -> bytes:
    """An ld.so.cache in glibc's new format (``glibc-ld.so.cache1.1``) of (soname, path, flags), sorted as
    ldconfig sorts it (by soname, descending, in _dl_cache_libcmp's order; then flags)."""
    ordered = sorted(entries, key=functools.cmp_to_key(lambda x, y: _libcmp(y[0], x[0]) or y[2] - x[2]))
    header = 48
    strings = bytearray()
    offsets: dict[str, int] = {}
    base = header + 24 * len(ordered)
    for name in [n for e in ordered for n in e[:2]]:
        if name not in offsets:
            offsets[name] = base + len(strings)
            strings += name.encode() + b"\0"
    out = bytearray(b"glibc-ld.so.cache1.1" + struct.pack("<IIB3xI3I", len(ordered), len(strings), 2, 0, 0, 0, 0))
    for name, path, flags in ordered:
        out += struct.pack("<iIIIQ", flags, offsets[name], offsets[path], 0, 0)
    return bytes(out + strings)


def nvidia_smi(host: FakeHost) -> str:
    """A shell script (run by the ELF :func:`elf_executable` makes): ``nvidia-smi -L`` lists the GPUs whose nodes
    the container has, as the real one would."""
    cases = "".join(f"    {g.minor}) echo \"GPU $i: {g.model} (UUID: {g.uuid})\";;\n" for g in host.nvidia)
    return f"""# oci-gpu-hook's fake nvidia-smi (driver {host.driver_version}): the GPUs this container has nodes of
if [ "$1" != "-L" ]; then echo "fake nvidia-smi {host.driver_version}"; exit 0; fi
i=0
for n in /dev/nvidia[0-9]*; do
  [ -c "$n" ] || continue
  case "${{n#/dev/nvidia}}" in
{cases}    *) continue;;
  esac
  i=$((i+1))
done
[ $i -gt 0 ] || echo "No devices were found"
"""


def build_driver(root: str, host: FakeHost, layout: str = "distro") -> str:
    """Write ``host``'s NVIDIA driver files under ``root`` (a merged-/usr tree) in ``layout`` (:data:`LAYOUTS`);
    return ``root``."""
    version = host.driver_version
    lib_dir, cache_dir, bin_dir, share, vulkan_share, firmware, wrappers = LAYOUTS[layout]
    for name in ("lib", "bin", "sbin"):
        _link(f"usr/{name}", os.path.join(root, name))
    cache: list[tuple[str, str, int]] = []
    for lib in LIBRARIES:
        real = f"{lib}.{version}"
        name = soname(lib, version)
        folder = f"{lib_dir}/vdpau" if lib == "libvdpau_nvidia.so" and layout == "distro" else lib_dir
        _write(os.path.join(root, folder[1:], real), elf_shared_object(name))
        if folder == lib_dir:
            cache.append((name, f"{cache_dir}/{name}", 0x0303))
        if name != real:
            _link(real, os.path.join(root, folder[1:], name))
    for lib, (real_version, short) in SIDE_LIBRARIES.items():
        name = f"{lib}.{short}"
        _write(os.path.join(root, lib_dir[1:], f"{lib}.{real_version}"), elf_shared_object(name))
        _link(f"{lib}.{real_version}", os.path.join(root, lib_dir[1:], name))
        cache.append((name, f"{cache_dir}/{name}", 0x0303))
    _link("libcuda.so.1", os.path.join(root, lib_dir[1:], "libcuda.so"))
    cache.append(("libcuda.so", f"{cache_dir}/libcuda.so", 0x0303))
    for lib in LIB32:
        name = soname(lib, version)
        _write(os.path.join(root, LIB32_DIR[1:], f"{lib}.{version}"), elf_shared_object(name, machine=3, elf64=False))
        _link(f"{lib}.{version}", os.path.join(root, LIB32_DIR[1:], name))
        cache.append((name, f"/lib/i386-linux-gnu/{name}", 0x0003))
    old = os.path.join(root, lib_dir[1:], f"libnvidia-opencl.so.{OLD_VERSION}")
    _write(old, elf_shared_object("libnvidia-opencl.so.1"))
    os.remove(os.path.join(root, lib_dir[1:], "libnvidia-opencl.so.1"))
    _link(f"libnvidia-opencl.so.{OLD_VERSION}", os.path.join(root, lib_dir[1:], "libnvidia-opencl.so.1"))
    cache.append(("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6", 0x0303))  # the host's own libraries
    _write(os.path.join(root, LIB_DIR[1:], "libc.so.6"), elf_shared_object("libc.so.6", needed=()))
    _write(os.path.join(root, "etc", "ld.so.cache"), ld_cache(cache))
    _write(os.path.join(root, "etc", "ld.so.conf"), "include /etc/ld.so.conf.d/*.conf\n")
    _write(os.path.join(root, "etc", "ld.so.conf.d", "x86_64-linux-gnu.conf"),
           "/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n")
    if lib_dir != LIB_DIR:
        _write(os.path.join(root, "etc", "ld.so.conf.d", "nvidia.conf"), f"{lib_dir}\n")
    for name in BINARIES:
        text = nvidia_smi(host) if name == "nvidia-smi" else f"echo 'fake {name} {version}'\n"
        _write(os.path.join(root, bin_dir[1:], name), elf_executable(text), 0o755)
        if wrappers:  # what a GKE-style install puts on the host's PATH: a script that runs the prefix's binary
            prefix = os.path.dirname(bin_dir)
            _write(os.path.join(root, wrappers[1:], name),
                   f"#!/bin/sh\nLD_LIBRARY_PATH={prefix}/lib64:{prefix}/lib${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}} "
                   f"exec {bin_dir}/{name} \"$@\"\n", 0o755)
    for relative, text in VENDOR_FILES.items():
        directory = "/etc" if relative.startswith("OpenCL/") else vulkan_share if relative.startswith(
            "vulkan/") else share
        _write(os.path.join(root, directory[1:], relative), text)
    for name in FIRMWARE:
        _write(os.path.join(root, firmware[1:], "nvidia", version, name), f"fake GSP firmware {name}\n")
    return root


# --- a fake libnvidia-ml --------------------------------------------------------------------------

FAKE_NVML = r"""
/* A fake libnvidia-ml for tests.  Its MIG devices come from the file OGH_FAKE_NVML names, read at nvmlInit_v2, one
   per line: "pci gi ci uuid [gpu-slices compute-slices memory-MiB gpu-instance-profile-id]" (without the last four,
   nvmlDeviceGetAttributes_v2 answers NOT_SUPPORTED); a line of a PCI address alone is a GPU without MIG devices.
   Every GPU has GPU_MEMORY bytes of memory and compute capability 9.0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define GPU_MEMORY 85520809984ULL /* an H100 80GB: 81559 MiB */
struct mig { int gpu; unsigned gi, ci, g, c, profile; unsigned long long mb; int attrs; char uuid[96]; };
struct attributes { unsigned sm, ce, dec, enc, jpeg, ofa, gi_slices, ci_slices; unsigned long long mb; };
struct memory { unsigned long long total, free, used; };
struct gi_info { void *device; unsigned id, profile, start, size; };
static char gpus[8][32]; static int ngpus; static struct mig migs[64]; static int nmigs;
int nvmlInit_v2(void) {
    const char *name = getenv("OGH_FAKE_NVML"); FILE *f = name ? fopen(name, "r") : NULL; char line[256];
    if (!f) return 999;
    ngpus = nmigs = 0;
    while (fgets(line, sizeof line, f) && nmigs < 64) {
        char pci[32]; struct mig m; int g, n;
        memset(&m, 0, sizeof m);
        n = sscanf(line, "%31s %u %u %95s %u %u %llu %u", pci, &m.gi, &m.ci, m.uuid, &m.g, &m.c, &m.mb, &m.profile);
        if (n < 1) continue;
        for (g = 0; g < ngpus && strcmp(gpus[g], pci); g++) {}
        if (g == ngpus && ngpus < 8) strcpy(gpus[ngpus++], pci);
        if (n < 4 || g == 8) continue; /* a line of a PCI address alone: a GPU without MIG devices */
        m.attrs = n == 8;
        m.gpu = g; migs[nmigs++] = m;
    }
    fclose(f); return 0;
}
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int code) { return code == 999 ? "Driver Not Loaded" : "Unknown Error"; }
int nvmlDeviceGetHandleByPciBusId_v2(const char *pci, void **h) {
    for (int g = 0; g < ngpus; g++) if (!strcmp(gpus[g], pci)) { *h = gpus[g]; return 0; }
    return 6;
}
int nvmlDeviceGetMaxMigDeviceCount(void *h, unsigned *n) { (void)h; *n = 7; return 0; }
int nvmlDeviceGetMigDeviceHandleByIndex(void *h, unsigned i, void **m) {
    unsigned k = 0;
    for (int j = 0; j < nmigs; j++) if (gpus[migs[j].gpu] == h && k++ == i) { *m = &migs[j]; return 0; }
    return 6;
}
int nvmlDeviceGetGpuInstanceId(void *m, unsigned *gi) { *gi = ((struct mig *)m)->gi; return 0; }
int nvmlDeviceGetComputeInstanceId(void *m, unsigned *ci) { *ci = ((struct mig *)m)->ci; return 0; }
int nvmlDeviceGetUUID(void *m, char *out, unsigned n) { snprintf(out, n, "%s", ((struct mig *)m)->uuid); return 0; }
int nvmlDeviceGetAttributes_v2(void *m, struct attributes *a) {
    struct mig *x = m;
    if (!x->attrs) return 3;
    memset(a, 0, sizeof *a); a->gi_slices = x->g; a->ci_slices = x->c; a->mb = x->mb; return 0;
}
int nvmlDeviceGetMemoryInfo(void *h, struct memory *mem) {
    (void)h; mem->total = GPU_MEMORY; mem->free = GPU_MEMORY; mem->used = 0; return 0;
}
int nvmlDeviceGetCudaComputeCapability(void *h, int *major, int *minor) { (void)h; *major = 9; *minor = 0; return 0; }
int nvmlDeviceGetGpuInstanceById(void *h, unsigned id, void **gi) {
    for (int j = 0; j < nmigs; j++) if (gpus[migs[j].gpu] == h && migs[j].gi == id) { *gi = &migs[j]; return 0; }
    return 6;
}
int nvmlGpuInstanceGetInfo(void *gi, struct gi_info *info) {
    struct mig *x = gi;
    info->device = gpus[x->gpu]; info->id = x->gi; info->profile = x->profile; info->start = 0; info->size = x->g;
    return 0;
}
"""


def build_fake_nvml(driver_root: str, version: str, work: str) -> str | None:
    """Replace ``driver_root``'s ``libnvidia-ml.so.<version>`` with :data:`FAKE_NVML`, compiled with the host's C
    compiler (None when there is none); returns the library's path."""
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    source = os.path.join(work, "fake-nvml.c")
    _write(source, FAKE_NVML)
    lib = os.path.join(driver_root, LIB_DIR[1:], f"libnvidia-ml.so.{version}")
    if os.path.lexists(lib):
        os.unlink(lib)
    subprocess.run([cc, "-shared", "-fPIC", "-o", lib, source], check=True)
    return lib
