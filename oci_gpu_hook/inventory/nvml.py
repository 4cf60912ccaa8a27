"""MIG device UUIDs, read through NVML: the only place the driver says them (neither /proc nor sysfs has them).

Loaded only when something needs a MIG UUID (a ``MIG-...`` request entry, a CDI spec, ``list``), from the
driver root's ld cache (``libnvidia-ml.so.1``, the running driver's), through :mod:`ctypes`.  Per GPU with
MIG devices: ``nvmlDeviceGetHandleByPciBusId_v2``, then for each index below
``nvmlDeviceGetMaxMigDeviceCount`` the MIG handle's GPU instance id, compute instance id and UUID, matched
to the MIG devices read from /proc by (PCI address, GPU instance, compute instance).  When NVML cannot be
loaded or fails, MIG devices keep no UUID and a ``MIG-...`` request says why (``GPU:MIG`` still works).
"""

from __future__ import annotations

import os
import sys

from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms per container start

if TYPE_CHECKING:
    from typing import Any

    from oci_gpu_hook.inventory import Device

SONAME = "libnvidia-ml.so.1"
NOT_FOUND = 6  # NVML_ERROR_NOT_FOUND: no MIG device at this index
_problems: dict[str, str] = {}  # driver root -> why NVML cannot say MIG UUIDs there (once per process)
_read: dict[tuple[str, str], dict[tuple[int, int], str]] = {}  # (driver root, GPU) -> its MIG UUIDs, once read


def library_path(driver_root: str) -> str:
    """The host path of the driver root's ``libnvidia-ml.so.1`` (from its ld cache)."""
    from oci_gpu_hook.inventory import ldcache
    from oci_gpu_hook.inventory.nvdriver import LD_CACHE, in_root, resolve

    cache = in_root(driver_root, LD_CACHE)
    native = ldcache.native_flags()
    for entry in ldcache.read(cache):
        if entry.soname == SONAME and entry.flags == native and not entry.hwcap:
            real = resolve(driver_root, entry.path)
            if real is not None:
                return in_root(driver_root, real)
    raise HookError(f"{SONAME} is not in the ld cache {cache}")


def _call(lib: Any, name: str, *args: Any) -> int:
    try:
        function = getattr(lib, name)
    except AttributeError:
        raise HookError(f"{lib._name} has no {name}: not the NVIDIA management library") from None
    code = int(function(*args))
    if code not in (0, NOT_FOUND):
        import ctypes

        text = lib.nvmlErrorString
        text.restype = ctypes.c_char_p
        raise HookError(f"{name} failed: {(text(code) or b'error').decode(errors='replace')} ({code})")
    return code


def read_mig_uuids(driver_root: str, addresses: list[str], timeout: float = 20.0) -> dict[tuple[str, int, int], str]:
    """(PCI address, GPU instance id, compute instance id) -> MIG UUID for the GPUs at ``addresses``.

    NVML runs in a child process: a library that crashes or hangs (a broken driver install) costs that child,
    never the hook; its answer comes back as ``address gi ci uuid`` lines."""
    import select

    path = library_path(driver_root)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the NVML child; its outcome is checked through the pipe
        code = 1
        try:
            os.close(read_end)
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crashing library leaves no core file behind
            if "faulthandler" in sys.modules:  # nor a Python traceback on the hook's stderr
                sys.modules["faulthandler"].disable()
            try:
                found = _nvml_mig_uuids(path, addresses)
                text, code = "".join(f"{a} {gi} {ci} {u}\n" for (a, gi, ci), u in found.items()), 0
            except HookError as err:
                text = f"error {err}\n"
            os.write(write_end, text.encode())
        finally:
            os._exit(code)
    os.close(write_end)
    chunks = []
    hung = False
    try:
        while select.select([read_end], [], [], timeout)[0]:
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        else:
            hung = True
            os.kill(child, 9)
    finally:
        os.close(read_end)
        _, status = os.waitpid(child, 0)
    text = b"".join(chunks).decode(errors="replace")
    if text.startswith("error "):
        raise HookError(text[6:].strip())
    code = os.waitstatus_to_exitcode(status)
    if hung:
        raise HookError(f"NVML ({path}) did not answer within {timeout:g} s")
    if code != 0:
        raise HookError(f"NVML ({path}) crashed ({f'signal {-code}' if code < 0 else f'exit status {code}'})")
    out = {}
    for line in text.splitlines():
        address, gi, ci, uuid = line.split(" ", 3)
        out[(address, int(gi), int(ci))] = uuid
    return out


def _nvml_mig_uuids(path: str, addresses: list[str]) -> dict[tuple[str, int, int], str]:
    import ctypes

    try:
        lib = ctypes.CDLL(path)
    except OSError as err:
        raise HookError(f"cannot load {path}: {err}") from None
    _call(lib, "nvmlInit_v2")
    out = {}
    try:
        for address in addresses:
            handle = ctypes.c_void_p()
            _call(lib, "nvmlDeviceGetHandleByPciBusId_v2", address.encode(), ctypes.byref(handle))
            count = ctypes.c_uint()
            _call(lib, "nvmlDeviceGetMaxMigDeviceCount", handle, ctypes.byref(count))
            for index in range(count.value):
                mig = ctypes.c_void_p()
                if _call(lib, "nvmlDeviceGetMigDeviceHandleByIndex", handle, index, ctypes.byref(mig)) == NOT_FOUND:
                    continue
                gi, ci = ctypes.c_uint(), ctypes.c_uint()
                _call(lib, "nvmlDeviceGetGpuInstanceId", mig, ctypes.byref(gi))
                _call(lib, "nvmlDeviceGetComputeInstanceId", mig, ctypes.byref(ci))
                text = ctypes.create_string_buffer(96)
                _call(lib, "nvmlDeviceGetUUID", mig, text, ctypes.c_uint(len(text)))
                out[(address, gi.value, ci.value)] = text.value.decode(errors="replace")
    finally:
        lib.nvmlShutdown()
    return out


def fill_mig_uuids(devices: tuple[Device, ...]) -> str:
    """Set the UUID of every MIG device of ``devices`` that NVML names; return why not ('' when done)."""
    missing = [d for d in devices if d.mig is not None and d.uuid is None]
    if not missing:
        return ""
    root = os.path.abspath(missing[0].driver_root or "/")
    if root in _problems:
        return _problems[root]
    unread = list(dict.fromkeys(d.pci_address for d in missing if (root, d.pci_address) not in _read))
    if unread:
        try:
            uuids = read_mig_uuids(root, unread)
        except HookError as err:
            _problems[root] = (f"cannot be looked up: MIG UUIDs are known only to NVML, and {err} "
                               "(name MIG devices as GPU:MIG)")
            return _problems[root]
        for address in unread:
            _read[(root, address)] = {(gi, ci): u for (a, gi, ci), u in uuids.items() if a == address}
    for device in missing:
        assert device.mig is not None
        device.uuid = _read[(root, device.pci_address)].get(device.mig)
    return ""
