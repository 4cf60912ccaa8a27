"""The NVIDIA driver's user-space files a container gets, by driver capability, as container edits.

Found where NVIDIA's own toolkit (nvidia-container-toolkit v1.20.0, ``pkg/nvcdi/driver-nvml.go``,
``internal/discover/graphics.go``) finds them, on every layout real installs use (distribution packages, NVIDIA's
``.run`` installer, GKE/COS-style prefixes such as ``/usr/local/nvidia``, the GPU operator's driver container as
``driver_root``); the facts and the file-by-file comparison with NVIDIA's spec are in docs/hardware.md
(``#nvidia-driver-files``):

* the driver version from ``/proc/driver/nvidia/version`` (``NVRM version: ... 550.54.15 ...``);
* the driver's library directories: those of ``libcuda.so.<version>`` and ``libnvidia-ml.so.<version>`` in the
  driver root's ``etc/ld.so.cache`` (:mod:`~oci_gpu_hook.inventory.ldcache`; every symlink resolved inside the
  driver root), and their ``vdpau/``;
* libraries: every native ELF ``*.so.<version>`` in them, so a new driver's new library needs no change here;
  each is given with the capabilities :data:`LIBRARIES` names for it (one it does not name: with any
  capability but ``display``); leftovers of another version are never given.  Beside each, in the container:
  its soname link (the ``DT_SONAME`` the file itself says, :mod:`~oci_gpu_hook.inventory.elf`; for a file that
  says none, the soname the ld cache knows it by), a ``.so``
  link to that, ``libGLX_indirect.so.0`` to ``libGLX_nvidia`` and ``gbm/nvidia-drm_gbm.so`` to
  ``libnvidia-allocator``, as NVIDIA's ``create-symlinks`` makes them;
* binaries (:data:`BINARIES`): looked for in the driver installation's own ``bin`` first (``<prefix>/bin`` of
  each library directory's prefixes: ``/usr/local/nvidia/bin``), then :data:`BIN_DIRS`; the first that is an
  ELF file of this machine is given, at ``/usr/bin/<name>`` (on every image's PATH) and at its own path when
  that differs (``/usr/local/nvidia/bin``: first on a CUDA image's PATH).  A script (the wrapper a GKE-style
  install puts in ``/usr/bin``) is never given: it would run a program the container does not have;
* configuration files (:data:`CONFIG_FILES`: the GLVND EGL vendor json, the EGL external platforms, the Vulkan
  ICD and layers, OptiX's ``nvoptix.bin``, the OpenCL ICD): the first found in ``/etc``, ``/usr/local/share``,
  ``/usr/share`` and the installation's own ``<prefix>/share``, given where their loader reads them
  (:func:`config_destination`); a json or ``.icd`` naming a library the container will not have is skipped;
* the GSP firmware ``nvidia/<version>/`` in the kernel's firmware search order (``firmware_class.path``,
  ``/lib/firmware/updates/<release>``, ``/lib/firmware/updates``, ``/lib/firmware/<release>``,
  ``/lib/firmware``).

Each file is a read-only bind mount (``ro, nosuid, nodev``); the links are made and the libraries' directories
put into the container's ld cache by the ``ldcache`` hook.  ``compute`` without ``libcuda`` or ``utility``
without ``libnvidia-ml`` of the running driver is an error: a container would start without its driver.
What was left out, and why, is :attr:`Survey.skipped` (``validate`` and ``list`` say it).  Not given: 32-bit
libraries (``compat32``), the X server's driver files (``display`` gives the nodes only), IPC sockets
(persistenced, fabric manager, MPS).
"""

from __future__ import annotations

import os
import stat

from oci_gpu_hook.core import inroot
from oci_gpu_hook.core.edits import Edits, Mount
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.inventory import elf, ldcache
from oci_gpu_hook.inventory.sysfs import read

# The driver's libraries by capability (libnvidia-container's src/nvc_info.c lists, and the toolkit's), by the name
# before ".so."; a library of the driver's version named by none is given with every capability but display.
LIBRARIES = {
    "utility": ("libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq", "libnvidia-api", "libnvidia-sandboxutils"),
    "compute": ("libcuda", "libcudadebugger", "libnvidia-opencl", "libnvidia-gpucomp", "libnvidia-ptxjitcompiler",
                "libnvidia-fatbinaryloader", "libnvidia-allocator", "libnvidia-compiler", "libnvidia-pkcs11",
                "libnvidia-pkcs11-openssl3", "libnvidia-nvvm"),
    "video": ("libvdpau_nvidia", "libnvidia-encode", "libnvidia-opticalflow", "libnvcuvid"),
    "graphics": ("libnvidia-eglcore", "libnvidia-glcore", "libnvidia-tls", "libnvidia-glsi", "libnvidia-fbc",
                 "libnvidia-ifr", "libnvidia-rtcore", "libnvoptix", "libGLX_nvidia", "libEGL_nvidia",
                 "libGLESv2_nvidia", "libGLESv1_CM_nvidia", "libnvidia-glvkspirv", "libnvidia-cbl",
                 "libnvidia-allocator", "libnvidia-gpucomp", "libnvidia-vksc-core", "libnvidia-present",
                 "libnvidia-wayland-client", "libnvidia-egl-gbm", "libnvidia-egl-wayland", "libnvidia-egl-wayland2",
                 "libnvidia-egl-xcb", "libnvidia-egl-xlib"),
    "ngx": ("libnvidia-ngx",),
}
LIBRARY_CAPS = ("utility", "compute", "video", "graphics", "ngx")  # what an unlisted library is given with
REQUIRED = (("compute", "libcuda"), ("utility", "libnvidia-ml"))
BINARIES = {
    "utility": ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager"),
    "compute": ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"),
}
# after the installation's own bin: GKE/COS-style prefixes (in the container, and on a COS host), then the toolkit's
# fixed list (pkg/lookup/executable.go)
BIN_DIRS = ("/usr/local/nvidia/bin", "/home/kubernetes/bin/nvidia/bin", "/usr/local/sbin", "/usr/local/bin",
            "/usr/sbin", "/usr/bin", "/sbin", "/bin")
BIN_DEST = "/usr/bin"  # on the PATH of every image (CUDA images: after /usr/local/nvidia/bin)
# (path below a data directory, the capability that gives it, how its loader names the library: "ICD", "layer"
# (json objects with a library_path), "icd" (a .icd file: the library on its one line), None: no library)
CONFIG_FILES = (
    ("glvnd/egl_vendor.d/10_nvidia.json", "graphics", "ICD"),
    ("egl/egl_external_platform.d/15_nvidia_gbm.json", "graphics", "ICD"),
    ("egl/egl_external_platform.d/10_nvidia_wayland.json", "graphics", "ICD"),
    ("egl/egl_external_platform.d/09_nvidia_wayland2.json", "graphics", "ICD"),
    ("egl/egl_external_platform.d/20_nvidia_xcb.json", "graphics", "ICD"),
    ("egl/egl_external_platform.d/20_nvidia_xlib.json", "graphics", "ICD"),
    ("vulkan/icd.d/nvidia_icd.json", "graphics", "ICD"),
    ("vulkan/icd.d/nvidia_icd.x86_64.json", "graphics", "ICD"),
    ("vulkan/implicit_layer.d/nvidia_layers.json", "graphics", "layer"),
    ("nvidia/nvoptix.bin", "graphics", None),
    ("OpenCL/vendors/nvidia.icd", "compute", "icd"),
)
DATA_DIRS = ("/etc", "/usr/local/share", "/usr/share")  # the toolkit's: /etc, then XDG_DATA_DIRS' default
FIRMWARE_CLASS_PATH = "module/firmware_class/parameters/path"  # in sysfs: the kernel's firmware_class.path
FIRMWARE_DIRS = ("/lib/firmware/updates/{release}", "/lib/firmware/updates", "/lib/firmware/{release}",
                 "/lib/firmware")
LD_CACHE = "/etc/ld.so.cache"
MAX_CONFIG = 1 << 20  # a vendor json is a few hundred bytes


class Survey:
    """What a container gets of the driver for some capabilities: the edits, and for the operator (``validate``,
    ``list``) the version, the library directories, each file given (capability, container path, host path) and
    each one left out with why."""

    __slots__ = ("edits", "folders", "given", "skipped", "version")

    def __init__(self, version: str, edits: Edits, folders: tuple[str, ...], given: list[tuple[str, str, str]],
                 skipped: list[str]) -> None:
        self.version = version
        self.edits = edits
        self.folders = folders
        self.given = given
        self.skipped = skipped


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


def library_caps(name: str) -> tuple[str, ...]:
    """The capabilities that give the library file ``name`` (``libcuda.so.550.54.15``)."""
    stem = name.split(".so.", 1)[0]
    found = tuple(cap for cap, names in LIBRARIES.items() if stem in names)
    return found or LIBRARY_CAPS


def config_destination(found: str, relative: str) -> str:
    """Where a configuration file found at ``found`` (``relative`` below its data directory) is given: Vulkan's
    under ``/etc/vulkan`` and OpenCL's under ``/etc/OpenCL/vendors`` (what their loaders read, as the toolkit
    gives them), the others at their own path when it is ``/etc`` or ``/usr/share`` (GLVND and libEGL_nvidia read
    both), else below ``/usr/share`` (a prefix's own ``share`` is read by no loader)."""
    if relative.startswith(("vulkan/", "OpenCL/")) or found.startswith("/etc/"):
        return f"/etc/{relative}"
    return f"/usr/share/{relative}"


def _prefixes(folder: str) -> list[str]:
    """The directories above a library directory, nearest first, without ``/``: ``/usr/local/nvidia/lib64`` ->
    ``/usr/local/nvidia``, ``/usr/local``, ``/usr``."""
    out = []
    while True:
        folder = os.path.dirname(folder)
        if folder == "/":
            return out
        out.append(folder)


class _Finder:
    """One survey's state: the driver root, what is given so far, what was skipped."""

    def __init__(self, driver_root: str) -> None:
        self.root = driver_root
        self.real_root = os.path.realpath(driver_root)  # a driver root that is itself a symlink stays one root
        self.cache: list[ldcache.Entry] = []  # the driver root's ld cache, read once
        self.mounts: dict[str, Mount] = {}
        self.links: dict[str, str] = {}
        self.folders: dict[str, None] = {}
        self.given: list[tuple[str, str, str]] = []
        self.skipped: list[str] = []
        self.names: set[str] = set()  # the bare library names a container's ld cache will resolve

    def give(self, cap: str, real: str, destination: str) -> None:
        source = in_root(self.root, real)
        if self.mounts.setdefault(destination, Mount(source, destination)).source == source:
            self.given.append((cap, destination, source))

    def locate(self, path: str) -> str | None:
        """``path`` resolved inside the driver root (None: not there, or a symlink out of it, said).  On the host's
        own root a path that does not exist costs one stat, not a walk."""
        if self.root == "/":
            return resolve("/", path) if os.path.exists(path) else None
        return None if self.escapes(path) else resolve(self.root, path)

    def escapes(self, path: str) -> bool:
        """Whether the host's own resolution of ``path`` leaves the driver root (a symlink out of it): skipped,
        with one line, whatever the walk inside the root would find."""
        if self.root == "/" or not os.path.lexists(in_root(self.root, path)):
            return False
        host = os.path.realpath(in_root(self.root, path))
        if host == self.real_root or host.startswith(self.real_root.rstrip("/") + "/"):
            return False
        place = os.path.join(os.path.realpath(os.path.dirname(in_root(self.root, path))), os.path.basename(path))
        line = f"{place}: a symlink out of driver_root {self.root} (to {host}); not given"
        if line not in self.skipped:  # /bin/x and /usr/bin/x of a merged-/usr root: one line
            self.skipped.append(line)
        return True


def survey(proc_root: str, driver_root: str, caps: frozenset[str], sysfs_root: str = "/sys") -> Survey:
    """What the driver gives a container asking for ``caps`` (module docstring); a HookError when the driver root
    cannot serve them."""
    if not os.path.isdir(driver_root):
        raise HookError(f"driver_root {driver_root} is not a directory (the root the NVIDIA driver's user-space "
                        "files are installed under: / or, for a driver container, e.g. /run/nvidia/driver)")
    version = driver_version(proc_root)
    finder = _Finder(driver_root)
    folders = _libraries(finder, version, caps) if caps & set(LIBRARY_CAPS) else []
    _binaries(finder, folders, caps)
    _config_files(finder, folders, caps)
    _firmware(finder, version, proc_root, sysfs_root)
    edits = Edits(mounts=tuple(sorted(finder.mounts.values(), key=lambda m: m.destination)),
                  symlinks=tuple(sorted(finder.links.items())), ldcache=tuple(sorted(finder.folders)))
    return Survey(version, edits, tuple(folders), finder.given, finder.skipped)


def driver_files(proc_root: str, driver_root: str, caps: frozenset[str], sysfs_root: str = "/sys") -> Edits:
    """The mounts, links and ld cache directories that give a container the driver for ``caps``."""
    return survey(proc_root, driver_root, caps, sysfs_root).edits


def _library_folders(finder: _Finder, version: str) -> tuple[list[str], set[str]]:
    """The directories holding ``libcuda.so.<version>`` or ``libnvidia-ml.so.<version>`` by the driver root's ld
    cache (each with its ``vdpau/`` when there is one), and which of the two were found."""
    entries = finder.cache = ldcache.read(in_root(finder.root, LD_CACHE))
    native = ldcache.native_flags() if entries else 0
    folders: dict[str, None] = {}
    found: set[str] = set()
    for entry in entries:
        if entry.flags != native or entry.hwcap:
            continue
        lib = next((name for name in ("libcuda", "libnvidia-ml") if entry.soname.startswith(name + ".so.")), None)
        real = resolve(finder.root, entry.path) if lib else None
        if lib is None or real is None or os.path.basename(real) != f"{lib}.so.{version}":
            continue
        folders[os.path.dirname(real)] = None
        found.add(lib)
    for folder in list(folders):
        vdpau = resolve(finder.root, f"{folder}/vdpau")
        if vdpau is not None and os.path.isdir(in_root(finder.root, vdpau)):
            folders[vdpau] = None
    return list(folders), found


def _libraries(finder: _Finder, version: str, caps: frozenset[str]) -> list[str]:
    folders, found = _library_folders(finder, version)
    for cap, lib in REQUIRED:
        if cap in caps and lib not in found:
            raise HookError(f"{cap}: the NVIDIA driver's {lib}.so.{version} (the running driver's version) is not in "
                            f"the ld cache {in_root(finder.root, LD_CACHE)}; is its user-space installed under "
                            f"driver_root {finder.root}?")
    suffix = f".so.{version}"
    for folder in folders:
        try:
            names = sorted(n for n in os.listdir(in_root(finder.root, folder)) if n.endswith(suffix))
        except OSError as err:
            finder.skipped.append(f"{in_root(finder.root, folder)}: {err.strerror}; its libraries are not given")
            continue
        for name in names:
            wanted = [cap for cap in library_caps(name) if cap in caps]
            if not wanted:
                continue
            try:  # a file of the (resolved) directory is itself; a symlink is walked inside the root
                plain = stat.S_ISREG(os.lstat(in_root(finder.root, f"{folder}/{name}")).st_mode)
            except OSError:
                plain = False
            real = f"{folder}/{name}" if plain else resolve(finder.root, f"{folder}/{name}")
            kind, soname = (elf.inspect(in_root(finder.root, real), want_soname=True) if real is not None
                            and os.path.isfile(in_root(finder.root, real)) else (elf.MISSING, None))
            if real is None or kind != elf.NATIVE:
                finder.skipped.append(f"{in_root(finder.root, folder)}/{name}: "
                                      f"{elf.WHAT.get(kind, kind) if real else 'a dangling symlink'}; not given")
                continue
            stem = name[:-len(suffix)]
            if soname is None:  # a file that names no soname: the one the host's ld cache knows it by, if any
                soname = _cached_soname(finder, stem, real)
            destination = f"{folder}/{name}"
            finder.give(wanted[0], real, destination)
            finder.folders[folder] = None
            finder.names.add(name)
            if soname and soname != name:
                finder.links[f"{folder}/{soname}"] = name
                finder.names.add(soname)
            finder.links[f"{folder}/{stem}.so"] = soname or name  # the name programs link against
            finder.names.add(f"{stem}.so")
            if stem == "libGLX_nvidia":  # GLVND's indirect rendering: the vendor library itself
                finder.links[f"{folder}/libGLX_indirect.so.0"] = name
                finder.names.add("libGLX_indirect.so.0")
            if stem == "libnvidia-allocator" and "graphics" in caps:  # Mesa's GBM loads <dir>/gbm/<driver>_gbm.so
                finder.links[f"{folder}/gbm/nvidia-drm_gbm.so"] = f"../{soname or name}"
    return folders


def _cached_soname(finder: _Finder, stem: str, real: str) -> str | None:
    """The soname of a native entry of the driver root's ld cache that resolves to ``real`` (``stem.so.N``)."""
    native = ldcache.native_flags() if finder.cache else 0
    return next((e.soname for e in finder.cache if e.flags == native and not e.hwcap
                 and e.soname.startswith(stem + ".so.") and resolve(finder.root, e.path) == real), None)


def _binaries(finder: _Finder, folders: list[str], caps: frozenset[str]) -> None:
    own = [f"{prefix}/bin" for folder in folders for prefix in _prefixes(folder)]
    order = list(dict.fromkeys([*own, *BIN_DIRS]))
    for cap, names in BINARIES.items():
        if cap not in caps:
            continue
        for name in names:
            met: set[str] = set()  # /bin/x is /usr/bin/x on a merged-/usr root: said once
            for directory in order:
                path = f"{directory}/{name}"
                real = finder.locate(path)
                host = in_root(finder.root, real) if real is not None else ""
                if real is None or real in met or not os.path.isfile(host) or not os.access(host, os.X_OK):
                    continue
                met.add(real)
                kind = elf.inspect(host)[0]
                if kind != elf.NATIVE:
                    finder.skipped.append(f"{in_root(finder.root, path)}: {elf.WHAT.get(kind, kind)}; not given")
                    continue
                finder.give(cap, real, f"{BIN_DEST}/{name}")
                if directory != BIN_DEST:
                    finder.give(cap, real, path)
                break


def _config_library(data: bytes, how: str) -> str | None:
    """The library a configuration file's loader would load, read as that loader reads it."""
    text = data.decode(errors="replace")
    if how == "icd":  # the OpenCL ICD loader: the file's first line is the library
        return text.splitlines()[0].strip() if text.strip() else None
    from oci_gpu_hook import fastjson

    try:
        document = fastjson.loads(text)
    except ValueError:
        return None
    section = document.get(how) if isinstance(document, dict) else None
    if how == "layer" and section is None and isinstance(document, dict):
        layers = document.get("layers")
        section = layers[0] if isinstance(layers, list) and layers else None
    value = section.get("library_path") if isinstance(section, dict) else None
    return value.strip() if isinstance(value, str) and value.strip() else None


def _config_files(finder: _Finder, folders: list[str], caps: frozenset[str]) -> None:
    own = [f"{prefix}/share" for folder in folders for prefix in _prefixes(folder)]
    data_dirs = list(dict.fromkeys([*DATA_DIRS, *own]))
    given_paths = set(finder.mounts) | set(finder.links)
    for relative, cap, how in CONFIG_FILES:
        if cap not in caps:
            continue
        for directory in data_dirs:
            path = f"{directory}/{relative}"
            real = finder.locate(path)
            if real is None or not os.path.isfile(in_root(finder.root, real)):
                continue
            destination = config_destination(path, relative)
            if how is not None:
                try:
                    with open(in_root(finder.root, real), "rb") as handle:
                        data = handle.read(MAX_CONFIG)
                except OSError as err:
                    finder.skipped.append(f"{in_root(finder.root, path)}: {err.strerror}; not given")
                    break
                library = _config_library(data, how)
                if library is None:
                    finder.skipped.append(f"{in_root(finder.root, path)}: names no library (not the "
                                          f"{'.icd line' if how == 'icd' else how + '.library_path'} its loader "
                                          "reads); not given")
                    break
                if "/" in library:  # a path: absolute, or relative to the file's own directory (Vulkan's loader)
                    wanted = library if library.startswith("/") else os.path.normpath(
                        f"{os.path.dirname(destination)}/{library}")
                    ok = wanted in given_paths
                else:  # a bare name: dlopen, through the container's ld cache
                    ok = library in finder.names or _give_named(finder, folders, library, cap)
                if not ok:
                    finder.skipped.append(f"{in_root(finder.root, path)}: names {library}, which the container will "
                                          "not have; not given")
                    break
            finder.give(cap, real, destination)
            break


def _give_named(finder: _Finder, folders: list[str], name: str, cap: str) -> bool:
    """Give the library a vendor json names by soname when the driver root's ld cache resolves it into one of the
    driver's own library directories (``libnvidia-egl-gbm.so.1``, versioned apart from the driver)."""
    native = ldcache.native_flags() if finder.cache else 0
    for entry in finder.cache:
        if entry.soname != name or entry.flags != native or entry.hwcap:
            continue
        real = resolve(finder.root, entry.path)
        if real is None or os.path.dirname(real) not in folders:
            continue
        if elf.inspect(in_root(finder.root, real))[0] != elf.NATIVE:
            continue
        folder, base = os.path.dirname(real), os.path.basename(real)
        finder.give(cap, real, real)
        if base != name:
            finder.links[f"{folder}/{name}"] = base
        finder.folders[folder] = None
        finder.names.add(name)
        return True
    return False


def _firmware(finder: _Finder, version: str, proc_root: str, sysfs_root: str) -> None:
    """The GSP firmware directory, first in the kernel's search order, at its own path."""
    release = (read(os.path.join(proc_root, "sys", "kernel", "osrelease")) or os.uname().release).strip()
    custom = (read(os.path.join(sysfs_root, FIRMWARE_CLASS_PATH)) or "").strip()
    candidates = [custom] if custom.startswith("/") else []
    candidates += [d.format(release=release) for d in FIRMWARE_DIRS]
    for directory in dict.fromkeys(os.path.normpath(c) for c in candidates):
        path = f"{directory}/nvidia/{version}"
        real = finder.locate(path)
        if real is not None and os.path.isdir(in_root(finder.root, real)):
            finder.give("", real, path)
            return


def report(proc_root: str, driver_root: str, sysfs_root: str, detail: bool = True) -> list[str]:
    """What a GPU container will get of the driver, for ``validate`` (``detail``: each file given, per capability)
    and ``list`` (a count): ``ok:`` lines, then a ``warning:`` line per file left out with why; [] where the nvidia
    module is not loaded; a HookError where the driver root cannot serve a container."""
    if read(os.path.join(proc_root, "driver", "nvidia", "version")) is None:
        return []
    found = survey(proc_root, driver_root, frozenset(LIBRARY_CAPS) | {"display"}, sysfs_root)
    head = (f"nvidia driver {found.version}, driver_root {driver_root}: libraries in "
            f"{', '.join(found.folders) or 'no directory'}")
    lines = [f"ok: {head}"]
    if detail:
        for cap in (*LIBRARY_CAPS, ""):
            paths = [dest for given, dest, _source in found.given if given == cap]
            if paths:
                lines.append(f"ok:   {cap or 'firmware'}: {len(paths)} files: {', '.join(paths)}")
    else:
        lines[0] += f"; {len(found.given)} files for a container asking for every capability"
    lines += [f"warning: {line}" for line in found.skipped]
    return lines
