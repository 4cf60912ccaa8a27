"""MIG device UUIDs, read through NVML: the only place the driver says them (neither /proc nor sysfs has them).

Loaded only when something needs a MIG UUID (a ``MIG-...`` request entry, a CDI spec, ``list``), from the
driver root's ld cache (``libnvidia-ml.so.1``, the running driver's), through :mod:`ctypes`.  Per GPU with
MIG devices: ``nvmlDeviceGetHandleByPciBusId_v2``, then for each index below
``nvmlDeviceGetMaxMigDeviceCount`` the MIG handle's GPU instance id, compute instance id and UUID, matched
to the MIG devices read from /proc by (PCI address, GPU instance, compute instance).  When NVML cannot be
loaded or fails, MIG devices keep no UUID and a ``MIG-...`` request says why (``GPU:MIG`` still works).

A resident process (the device plugin) calls :func:`refresh` instead, on every scan: MIG instances come and go,
and one destroyed and created again keeps its instance ids but gets a new UUID.  It also reads each MIG device's
profile (``1g.10gb``, ``1c.2g.20gb``, ``1g.10gb+me``), as NVIDIA's device plugin names it: the GPU instance's
slice count ``G`` and the compute instance's ``C`` from ``nvmlDeviceGetAttributes_v2``, its memory rounded as
go-nvlib's ``getMigMemorySizeGB`` does against the GPU's total (``nvmlDeviceGetMemoryInfo``), and the suffix of
its GPU instance profile id (``nvmlGpuInstanceGetInfo``: the ``REV1``/``ALL_ME``/``GFX``/``NO_ME`` profiles),
and its memory (the profile's ``memorySizeMB``).  The DRA driver also asks, once per GPU (:func:`gpu_facts`), each
whole GPU's memory (``nvmlDeviceGetMemoryInfo``) and CUDA compute capability
(``nvmlDeviceGetCudaComputeCapability``): neither /proc nor sysfs says them.
"""

from __future__ import annotations

import os
import sys

from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from oci_gpu_hook.inventory import Device  # nvidia.NvidiaDevice (nvidia imports this module: no cycle)

SONAME = "libnvidia-ml.so.1"
NOT_FOUND = 6  # NVML_ERROR_NOT_FOUND: no MIG device at this index
_problems: dict[str, str] = {}  # driver root -> why NVML cannot say MIG UUIDs there (once per process)
_read: dict[tuple[str, str], dict[tuple[int, int], str]] = {}  # (driver root, GPU) -> its MIG UUIDs, once read
_profiles: dict[tuple[str, str], dict[tuple[int, int], str]] = {}  # (driver root, GPU) -> MIG profiles (refresh)
_mig_memory: dict[tuple[str, int, int], int] = {}  # (GPU, GPU instance, compute instance) -> MiB (refresh)
_gpus: dict[tuple[str, str, str | None], tuple[int, str]] = {}  # (root, GPU, UUID) -> (bytes, capability)
# nvmlGpuInstanceProfile ids whose profile name has a suffix (nvml.h: NVML_GPU_INSTANCE_PROFILE_*)
PROFILE_SUFFIX = {7: "+me", 8: "+me", 15: "+me.all", 16: "+me.all", 10: "+gfx", 11: "+gfx", 12: "+gfx",
                  13: "-me", 14: "-me"}


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
    """(PCI address, GPU instance id, compute instance id) -> MIG UUID for the GPUs at ``addresses``."""
    return {key: uuid for key, (uuid, _profile) in read_migs(driver_root, addresses, timeout).items()}


def read_migs(driver_root: str, addresses: list[str], timeout: float = 20.0, profiles: bool = False,
              fresh: bool = False) -> dict[tuple[str, int, int], tuple[str, str]]:
    """(PCI address, GPU instance id, compute instance id) -> (MIG UUID, profile) for the GPUs at ``addresses``;
    the profile is read only with ``profiles``, and is '' when NVML does not say it.

    NVML runs in a child process: a library that crashes or hangs (a broken driver install) costs that child,
    never the hook; its answer comes back as ``address gi ci uuid profile`` lines (``-``: no profile).  The child
    is forked (the per-container path: no interpreter start), or with ``fresh`` a new interpreter (``python -m
    oci_gpu_hook.inventory.nvml``): a process with threads (the device plugin's gRPC server) must not run Python in
    a forked child, whose copies of the other threads' locks and state may be anything."""
    path = library_path(driver_root)
    text = _child_lines(path, addresses, "profiles" if profiles else "uuids", timeout, fresh)
    out = {}
    for line in text.splitlines():
        address, gi, ci, uuid, profile, memory = line.split(" ", 5)
        out[(address, int(gi), int(ci))] = (uuid, "" if profile == "-" else profile)
        if memory.isdigit():
            _mig_memory[(address, int(gi), int(ci))] = int(memory)
    return out


def _child_lines(path: str, addresses: list[str], mode: str, timeout: float, fresh: bool) -> str:
    """What the NVML child answers in ``mode`` (uuids, profiles, gpus); HookError when it fails."""
    text, code, hung = (_exec_child if fresh else _fork_child)(path, addresses, mode, timeout)
    if text.startswith("error "):
        raise HookError(text[6:].strip())
    if hung:
        raise HookError(f"NVML ({path}) did not answer within {timeout:g} s")
    if code != 0:
        raise HookError(f"NVML ({path}) crashed ({f'signal {-code}' if code < 0 else f'exit status {code}'})")
    return text


def read_gpus(driver_root: str, addresses: list[str], timeout: float = 20.0) -> dict[str, tuple[int, str]]:
    """PCI address -> (memory in bytes, CUDA compute capability ``9.0``) of the GPUs at ``addresses`` (0 and ''
    where NVML does not say), from a fresh interpreter (the callers are resident processes with threads)."""
    out = {}
    for line in _child_lines(library_path(driver_root), addresses, "gpus", timeout, True).splitlines():
        address, memory, capability = line.split(" ", 2)
        out[address] = (int(memory), "" if capability == "-" else capability)
    return out


def _answer(path: str, addresses: list[str], mode: str) -> tuple[str, int]:
    """What the NVML child says: its lines and exit status."""
    try:
        if mode == "gpus":
            gpus = _nvml_gpus(path, addresses)
            return "".join(f"{a} {m} {c or '-'}\n" for a, (m, c) in gpus.items()), 0
        found = _nvml_mig_uuids(path, addresses, mode == "profiles")
    except HookError as err:
        return f"error {err}\n", 1
    return "".join(f"{a} {gi} {ci} {u} {p or '-'} {m if m else '-'}\n" for (a, gi, ci), (u, p, m) in found.items()), 0


def _fork_child(path: str, addresses: list[str], mode: str, timeout: float) -> tuple[str, int, bool]:
    import select

    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the NVML child; its outcome is checked through the pipe
        code = 1
        try:
            os.close(read_end)
            _quiet_crash()
            text, code = _answer(path, addresses, mode)
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
    return b"".join(chunks).decode(errors="replace"), os.waitstatus_to_exitcode(status), hung


def _exec_child(path: str, addresses: list[str], mode: str, timeout: float) -> tuple[str, int, bool]:
    import subprocess

    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package, os.environ.get("PYTHONPATH")) if p)}
    argv = [sys.executable, "-m", "oci_gpu_hook.inventory.nvml", path, mode, *addresses]
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        return "", 0, True
    except OSError as err:
        return f"error cannot start {sys.executable} for NVML: {err.strerror}\n", 1, False
    return done.stdout.decode(errors="replace"), done.returncode, False


def _quiet_crash() -> None:
    """In the NVML child: a crashing library leaves no core file, nor a Python traceback on stderr."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if "faulthandler" in sys.modules:
        sys.modules["faulthandler"].disable()


def mig_memory_gb(total_bytes: int, mig_mb: int) -> int:
    """A MIG device's memory as its profile names it (go-nvlib's getMigMemorySizeGB): its share of the GPU's
    memory, rounded up to eighths, times the GPU's memory in whole GiB (rounded up), rounded to the nearest."""
    if total_bytes <= 0:
        return 0
    eighths = -(-(mig_mb * 2**20 * 8) // total_bytes)  # ceil(share * 8)
    total_gb = -(-total_bytes // 2**30)
    return (eighths * total_gb + 4) // 8  # round(eighths / 8 * total_gb), halves up


def profile_name(compute_slices: int, gpu_slices: int, memory_gb: int, gi_profile_id: int) -> str:
    """``1g.10gb``, ``1c.2g.20gb`` (a compute instance smaller than its GPU instance), ``1g.10gb+me``."""
    suffix = PROFILE_SUFFIX.get(gi_profile_id, "")
    compute = "" if compute_slices == gpu_slices else f"{compute_slices}c."
    return f"{compute}{gpu_slices}g.{memory_gb}gb{suffix}"


def _profile(lib: Any, gpu: Any, mig: Any, gi_id: int) -> tuple[str, int]:
    """A MIG device's profile name ('' when NVML does not say all of it) and its memory in MiB (0: not said)."""
    import ctypes

    class Attributes(ctypes.Structure):  # nvmlDeviceAttributes_t
        _fields_ = [(name, ctypes.c_uint) for name in (
            "multiprocessorCount", "sharedCopyEngineCount", "sharedDecoderCount", "sharedEncoderCount",
            "sharedJpegCount", "sharedOfaCount", "gpuInstanceSliceCount", "computeInstanceSliceCount")] + [
            ("memorySizeMB", ctypes.c_ulonglong)]

    class Memory(ctypes.Structure):  # nvmlMemory_t
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    class GpuInstanceInfo(ctypes.Structure):  # nvmlGpuInstanceInfo_t
        _fields_ = [("device", ctypes.c_void_p), ("id", ctypes.c_uint), ("profileId", ctypes.c_uint),
                    ("start", ctypes.c_uint), ("size", ctypes.c_uint)]

    attributes, memory, info, instance = Attributes(), Memory(), GpuInstanceInfo(), ctypes.c_void_p()
    calls = (("nvmlDeviceGetAttributes_v2", mig, ctypes.byref(attributes)),
             ("nvmlDeviceGetMemoryInfo", gpu, ctypes.byref(memory)),
             ("nvmlDeviceGetGpuInstanceById", gpu, ctypes.c_uint(gi_id), ctypes.byref(instance)),
             ("nvmlGpuInstanceGetInfo", instance, ctypes.byref(info)))
    for name, *args in calls:
        function = getattr(lib, name, None)
        if function is None and name.endswith("_v2"):  # drivers before the _v2 entry point
            function = getattr(lib, name[:-3], None)
        if function is None or int(function(*args)) != 0:
            return "", int(attributes.memorySizeMB)
    if not attributes.gpuInstanceSliceCount or not attributes.computeInstanceSliceCount:
        return "", int(attributes.memorySizeMB)
    return profile_name(attributes.computeInstanceSliceCount, attributes.gpuInstanceSliceCount,
                        mig_memory_gb(memory.total, attributes.memorySizeMB), info.profileId), int(
        attributes.memorySizeMB)


def _each_gpu(path: str, addresses: list[str], visit: Callable[[Any, str, Any], None], skip_missing: bool) -> None:
    """Load NVML from ``path``, call ``visit(lib, address, handle)`` for each GPU of ``addresses`` (those NVML does
    not find are skipped with ``skip_missing``), shut NVML down."""
    import ctypes

    try:
        lib = ctypes.CDLL(path)
    except OSError as err:
        raise HookError(f"cannot load {path}: {err}") from None
    _call(lib, "nvmlInit_v2")
    try:
        for address in addresses:
            handle = ctypes.c_void_p()
            found = _call(lib, "nvmlDeviceGetHandleByPciBusId_v2", address.encode(), ctypes.byref(handle))
            if found != NOT_FOUND or not skip_missing:
                visit(lib, address, handle)
    finally:
        lib.nvmlShutdown()


def _nvml_mig_uuids(path: str, addresses: list[str], profiles: bool = False) -> dict[tuple[str, int, int],
                                                                                   tuple[str, str, int]]:
    import ctypes

    out = {}

    def visit(lib: Any, address: str, handle: Any) -> None:
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
            uuid = text.value.decode(errors="replace")
            out[(address, gi.value, ci.value)] = (uuid, *(_profile(lib, handle, mig, gi.value) if profiles
                                                          else ("", 0)))

    _each_gpu(path, addresses, visit, skip_missing=False)
    return out


def _nvml_gpus(path: str, addresses: list[str]) -> dict[str, tuple[int, str]]:
    """Each GPU's total memory (``nvmlDeviceGetMemoryInfo``) and CUDA compute capability
    (``nvmlDeviceGetCudaComputeCapability``), 0 and '' where NVML does not say them."""
    import ctypes

    class Memory(ctypes.Structure):  # nvmlMemory_t
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    out = {}

    def visit(lib: Any, address: str, handle: Any) -> None:
        memory, major, minor = Memory(), ctypes.c_int(), ctypes.c_int()
        got = getattr(lib, "nvmlDeviceGetMemoryInfo", None)
        total = int(memory.total) if got is not None and int(got(handle, ctypes.byref(memory))) == 0 else 0
        got = getattr(lib, "nvmlDeviceGetCudaComputeCapability", None)
        said = got is not None and int(got(handle, ctypes.byref(major), ctypes.byref(minor))) == 0
        out[address] = (total, f"{major.value}.{minor.value}" if said and major.value > 0 else "")

    _each_gpu(path, addresses, visit, skip_missing=True)
    return out


def gpu_facts(devices: tuple[Device, ...] | list[Device]) -> str:
    """Read the memory and compute capability of the whole GPUs of ``devices`` that NVML was not asked about
    yet (a GPU's never change while it stays: by PCI address and UUID); '' or why NVML cannot say them."""
    gpus = [d for d in devices if d.mig is None]
    if not gpus:
        return ""
    root = os.path.abspath(gpus[0].driver_root or "/")
    unread = list(dict.fromkeys(d.pci_address for d in gpus if (root, d.pci_address, d.uuid) not in _gpus))
    if not unread:
        return ""
    try:
        found = read_gpus(root, unread)
    except HookError as err:
        return str(err)
    for device in gpus:
        if device.pci_address in unread:
            _gpus[(root, device.pci_address, device.uuid)] = found.get(device.pci_address, (0, ""))
    return ""


def gpu_memory(device: Device) -> int:
    """A GPU's memory in bytes, a MIG device's in bytes (its profile's, as the last :func:`refresh` read it);
    0 when not read."""
    if device.mig is not None:
        return _mig_memory.get((device.pci_address, *device.mig), 0) * 2**20
    return _gpus.get((os.path.abspath(device.driver_root or "/"), device.pci_address, device.uuid), (0, ""))[0]


def compute_capability(device: Device) -> str:
    """A GPU's (or a MIG device's GPU's) CUDA compute capability, ``9.0`` ('' when not read)."""
    root = os.path.abspath(device.driver_root or "/")
    found = [v for (r, a, _u), v in _gpus.items() if r == root and a == device.pci_address and v[1]]
    if device.mig is None:
        return _gpus.get((root, device.pci_address, device.uuid), (0, ""))[1]
    return found[-1][1] if found else ""


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


def refresh(devices: tuple[Device, ...] | list[Device]) -> str:
    """Read the UUIDs and profiles of the MIG devices of ``devices`` from NVML now, whatever was read before (a
    resident process: instances come and go); set their UUIDs.  Returns '' or why NVML cannot say them."""
    migs = [d for d in devices if d.mig is not None]
    if not migs:
        return ""
    root = os.path.abspath(migs[0].driver_root or "/")
    _problems.pop(root, None)
    addresses = list(dict.fromkeys(d.pci_address for d in migs))
    try:
        found = read_migs(root, addresses, profiles=True, fresh=True)
    except HookError as err:
        _problems[root] = (f"cannot be looked up: MIG UUIDs are known only to NVML, and {err} "
                           "(name MIG devices as GPU:MIG)")
        for address in addresses:
            _read.pop((root, address), None)
            _profiles.pop((root, address), None)
        return str(err)
    for address in addresses:
        mine = {(gi, ci): value for (a, gi, ci), value in found.items() if a == address}
        _read[(root, address)] = {key: uuid for key, (uuid, _p) in mine.items()}
        _profiles[(root, address)] = {key: profile for key, (_u, profile) in mine.items() if profile}
    for device in migs:
        assert device.mig is not None
        device.uuid = _read[(root, device.pci_address)].get(device.mig)
    return ""


def profile(device: Device) -> str | None:
    """The MIG profile of ``device`` as the last :func:`refresh` read it (None: not read, or NVML did not say)."""
    if device.mig is None:
        return None
    root = os.path.abspath(device.driver_root or "/")
    return _profiles.get((root, device.pci_address), {}).get(device.mig)


def main(argv: list[str]) -> int:  # pragma: no cover - run as the NVML child of read_migs(fresh=True)
    """``python -m oci_gpu_hook.inventory.nvml LIBRARY uuids|profiles|gpus PCI...``: the child's lines on stdout."""
    _quiet_crash()
    text, code = _answer(argv[0], argv[2:], argv[1])
    sys.stdout.write(text)
    sys.stdout.flush()
    return code


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
