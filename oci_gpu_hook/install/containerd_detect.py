"""Which containerd the node runs, as ``install`` sees it: maybe from a pod, with the node's ``/`` mounted elsewhere.

``install`` must not ask the ``containerd`` on its own PATH: in the example DaemonSet's install container
there is none, and a containerd that happens to be there need not be the node's.  It looks where the node
keeps containerd, under the *host root* (``install --host-root DIR``; default the ``--prefix``, else ``/``),
in this order; the first that gives a version decides:

1. ``install --containerd-version X.Y`` (the operator's word wins);
2. the binaries: the one ``containerd.service`` runs (its ``ExecStart``, drop-ins included), then the usual
   places (``/usr/local/bin``, ``/usr/bin``, ``/usr/local/sbin``, ``/usr/sbin``, ``/bin``, ``/sbin``,
   ``/opt/containerd/bin``, ``/opt/bin``), then install's own PATH directories, all under the host root
   (symlinks resolved inside it).  A binary's version is read from its bytes, without running it (any
   architecture): containerd's Makefile sets it with ``-ldflags "-X .../version.Version=v2.1.9"``, which Go
   records in the build info; a build without that record (Debian's ``-trimpath`` build) still has the
   ``version`` package's string variables side by side in the data segment, ``Package``
   (``github.com/containerd/containerd``) next to ``Version``: :func:`binary_version` follows their (pointer,
   length) headers.  Only when the bytes say nothing is the binary run (``--version``, 10 s), and only a
   root-owned, not group/other-writable executable of this machine's architecture (or a ``#!`` script);
3. the package database: ``/var/lib/dpkg/status`` (``containerd``, ``containerd.io``).  RPM's database is
   not read (the RPM's binary carries its version: step 2 finds it);
4. the main config: ``version = 3`` or later is read by containerd 2.x only.

:func:`plan` turns what was found and the main config's version into the drop-in's config version and
whether native CDI (``enable_cdi``) is turned on, with the one note line install prints.
"""

from __future__ import annotations

import os
import re
import stat
import struct
from dataclasses import dataclass

from oci_gpu_hook.errors import HookError
from oci_gpu_hook.install.containerd import has_cdi

BINARY_DIRS = ("/usr/local/bin", "/usr/bin", "/usr/local/sbin", "/usr/sbin", "/bin", "/sbin", "/opt/containerd/bin",
               "/opt/bin")
UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system", "/usr/lib/systemd/system",
             "/lib/systemd/system")
UNIT = "containerd.service"
DPKG_STATUS = "/var/lib/dpkg/status"
DPKG_PACKAGES = ("containerd.io", "containerd")
MAX_BINARY = 512 << 20  # read no file bigger than this (containerd is ~50 MB)
MAX_DATA = 64 << 20  # nor scan a writable segment bigger than this (containerd's is ~0.6 MB)
RUN_TIMEOUT = 10

_VERSION = re.compile(r"v?(\d{1,4})\.(\d{1,4})(?:\.(\d{1,6}))?(?:[-+~.][0-9A-Za-z.~+-]*)?")
_LDFLAGS = re.compile(rb"-X[ =]?['\"]?github\.com/containerd/containerd(?:/v\d+)?/version\.Version="
                      rb"['\"]?([0-9A-Za-z.+~_-]{1,64})")
_MAIN_MODULE = re.compile(rb"\nmod\tgithub\.com/containerd/containerd(?:/v\d+)?\t(v\d[0-9A-Za-z.+~-]{0,63})\t")
_PACKAGES = (b"github.com/containerd/containerd", b"github.com/containerd/containerd/v2")


@dataclass(frozen=True)
class Found:
    """A containerd version and where it was read: ``text`` as found (``v2.1.9``, ``1.6.20~ds1``)."""

    version: tuple[int, int]
    text: str
    source: str

    @property
    def shown(self) -> str:
        return self.text[1:] if self.text.startswith("v") and self.text[1:2].isdigit() else self.text


@dataclass(frozen=True)
class Plan:
    """What install writes for containerd: the drop-in's config version, native CDI on or off, and why."""

    version: int
    cdi: bool
    note: str


def parse_version(text: str) -> tuple[int, int] | None:
    """(major, minor) of ``2.1.9``, ``v1.7.24``, ``1.6.20~ds1``, ``1.7.24-0ubuntu1``, ``1:1.7.2`` (a dpkg epoch),
    ``1.7``; None for anything else."""
    body = text.strip()
    epoch, colon, rest = body.partition(":")
    if colon and epoch.isdigit():
        body = rest
    match = _VERSION.fullmatch(body)
    return (int(match.group(1)), int(match.group(2))) if match else None


def explicit(text: str) -> Found:
    """``install --containerd-version``: MAJOR.MINOR[.PATCH]."""
    version = parse_version(text)
    if version is None or version[0] < 1:
        raise HookError(f"install --containerd-version {text!r}: expected the node's containerd version as "
                        "MAJOR.MINOR, e.g. 1.6, 1.7 or 2.1")
    return Found(version, text.strip(), "--containerd-version")


# --- paths under the host root ---------------------------------------------------------------------


def under(root: str, path: str, hops: int = 40) -> str | None:
    """``path`` of the tree at ``root`` as a path here, every symlink resolved inside that tree (as a chroot
    would); None when it leads nowhere."""
    parts = [p for p in path.split("/") if p and p != "."]
    real: list[str] = []
    while parts:
        part = parts.pop(0)
        if part == "..":
            if real:
                real.pop()
            continue
        here = os.path.join(root, *real, part)
        try:
            st = os.lstat(here)
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode):
            hops -= 1
            if hops < 0:
                return None
            try:
                target = os.readlink(here)
            except OSError:
                return None
            if target.startswith("/"):
                real = []
            parts = [p for p in target.split("/") if p and p != "."] + parts
            continue
        real.append(part)
    return os.path.join(root, *real)


def unit_binary(root: str) -> str | None:
    """The absolute program of containerd.service's last ``ExecStart`` (the unit, then its drop-ins)."""
    files: list[str] = []
    for directory in UNIT_DIRS:
        unit = under(root, f"{directory}/{UNIT}")
        if unit and os.path.isfile(unit):
            files.append(unit)
            break
    for directory in UNIT_DIRS:
        drop_ins = under(root, f"{directory}/{UNIT}.d")
        if drop_ins and os.path.isdir(drop_ins):
            files.extend(os.path.join(drop_ins, n) for n in sorted(os.listdir(drop_ins)) if n.endswith(".conf"))
    program = None
    for path in files:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                lines = handle.read(1 << 20).splitlines()
        except OSError:
            continue
        for line in lines:
            key, eq, value = line.partition("=")
            if eq and key.strip() == "ExecStart":
                words = value.strip().split()
                program = words[0].lstrip("-@:+!") if words else None  # an empty ExecStart= resets the list
    return program if program and program.startswith("/") else None


def candidates(root: str, path_env: str | None) -> list[str]:
    """The binary paths (real paths of the node) to look at, in order, without repeats."""
    names = []
    unit = unit_binary(root)
    if unit:
        names.append(unit)
    names.extend(f"{d}/containerd" for d in BINARY_DIRS)
    names.extend(f"{d}/containerd" for d in (path_env or "").split(":") if d.startswith("/"))
    return list(dict.fromkeys(os.path.normpath(n) for n in names))


# --- a binary's version ----------------------------------------------------------------------------


def _elf(data: bytes) -> tuple[str, int, list[tuple[int, int, int, int]]] | None:
    """(struct byte order, pointer size, PT_LOAD segments as (offset, vaddr, filesz, flags)) of an ELF file."""
    if data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        return None
    order = "<" if data[5] == 1 else ">"
    wide = data[4] == 2
    try:
        if wide:
            phoff, = struct.unpack_from(order + "Q", data, 32)
            phentsize, phnum = struct.unpack_from(order + "HH", data, 54)
        else:
            phoff, = struct.unpack_from(order + "I", data, 28)
            phentsize, phnum = struct.unpack_from(order + "HH", data, 42)
        segments = []
        for i in range(min(phnum, 256)):
            at = phoff + i * phentsize
            if wide:
                kind, flags, offset, vaddr, _p, filesz = struct.unpack_from(order + "IIQQQQ", data, at)
            else:
                kind, offset, vaddr, _p, filesz, _m, flags = struct.unpack_from(order + "IIIIIII", data, at)
            if kind == 1 and offset + filesz <= len(data):  # PT_LOAD
                segments.append((offset, vaddr, filesz, flags))
    except struct.error:
        return None
    return order, 8 if wide else 4, segments


def go_version_string(data: bytes) -> str | None:
    """The version string that containerd's ``version`` package holds, found through the Go string headers
    (pointer, length) of its variables in the data segment: the one pointing at ``Package``
    (``github.com/containerd/containerd[/v2]``) and, within three variables of it, ``Version`` (and in
    distribution builds ``Revision``, which may look like a version too: the shortest is taken).  None unless
    every version-like neighbour names the same major.minor."""
    elf = _elf(data)
    if elf is None:
        return None
    order, size, segments = elf
    code = "Q" if size == 8 else "I"

    def target(pointer: int, length: int) -> bytes | None:
        for offset, vaddr, filesz, _flags in segments:
            if vaddr <= pointer and pointer + length <= vaddr + filesz:
                start = offset + pointer - vaddr
                return data[start:start + length]
        return None

    lengths = {len(p) for p in _PACKAGES}
    found: list[str] = []
    for offset, _vaddr, filesz, flags in segments:
        if not flags & 2 or filesz > MAX_DATA:  # PF_W: the variables live in the writable segment
            continue
        count = filesz // size
        words = struct.unpack_from(f"{order}{count}{code}", data, offset)
        for i in range(count - 1):
            if words[i + 1] not in lengths or target(words[i], words[i + 1]) not in _PACKAGES:
                continue
            for step in (1, 2, 3, -1, -2, -3):
                j = i + 2 * step
                if 0 <= j < count - 1 and 0 < words[j + 1] <= 64:
                    text = target(words[j], words[j + 1])
                    if text is not None:
                        value = text.decode("ascii", "replace")
                        if parse_version(value) is not None and ":" not in value:
                            found.append(value)
    if not found or len({parse_version(v) for v in found}) != 1:
        return None
    return min(found, key=len)


def binary_version(path: str) -> tuple[str, str] | None:
    """(version text, how it was read) from a containerd binary's bytes; None if they do not say."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BINARY)
    except OSError:
        return None
    for pattern, how in ((_LDFLAGS, "its build info"), (_MAIN_MODULE, "its build info")):
        versions = {m.group(1).decode() for m in pattern.finditer(data)}
        if len(versions) == 1:
            (text,) = versions
            if parse_version(text):
                return text, how
    text = go_version_string(data)
    return (text, "its version variable") if text else None


def _machine(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            head = handle.read(20)
    except OSError:
        return None
    return head[18:20] + head[4:6] if head[:4] == b"\x7fELF" and len(head) == 20 else None


def runnable(path: str) -> bool:
    """A root-owned (or our own), not group/other-writable executable: an ELF file of this machine's
    architecture, or a ``#!`` script."""
    try:
        st = os.stat(path)
        with open(path, "rb") as handle:
            head = handle.read(2)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o022 or st.st_uid not in (0, os.geteuid()):
        return False
    if not st.st_mode & 0o111:
        return False
    if head == b"#!":
        return True
    mine = _machine("/proc/self/exe")
    return mine is not None and _machine(path) == mine


def run_version(path: str) -> str | None:
    """The version ``PATH --version`` prints (``containerd github.com/containerd/containerd v1.7.24 <rev>``)."""
    import subprocess

    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False,
                              stdin=subprocess.DEVNULL, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, errors="replace")
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return next((w for w in done.stdout.split() if parse_version(w) and ":" not in w), None)


def dpkg_version(root: str) -> Found | None:
    """The installed containerd package in dpkg's status file under ``root``."""
    status = under(root, DPKG_STATUS)
    if status is None:
        return None
    try:
        with open(status, encoding="utf-8", errors="replace") as handle:
            text = handle.read(64 << 20)
    except OSError:
        return None
    for paragraph in text.split("\n\n"):
        fields = {}
        for line in paragraph.splitlines():
            key, colon, value = line.partition(":")
            if colon and not line.startswith((" ", "\t")):
                fields[key.strip()] = value.strip()
        if fields.get("Package") in DPKG_PACKAGES and fields.get("Status", "").endswith(" installed"):
            version = parse_version(fields.get("Version", ""))
            if version:
                return Found(version, fields["Version"], f"{status}, package {fields['Package']}")
    return None


@dataclass
class Detection:
    """What :func:`detect` found, and what it looked at (for the note when it found nothing)."""

    found: Found | None
    unreadable: list[str]  # binaries there whose version could not be read
    root: str


def detect(root: str, *, option: str | None = None, path_env: str | None = None) -> Detection:
    """The node's containerd under ``root`` (see the module's docstring for the order)."""
    root = os.path.normpath(root)
    if option is not None:
        return Detection(explicit(option), [], root)
    unreadable = []
    for real in candidates(root, path_env):
        disk = under(root, real)
        if disk is None or not os.path.isfile(disk):
            continue
        read = binary_version(disk)
        if read is None and runnable(disk):
            text = run_version(disk)
            read = (text, "its --version") if text else None
        if read is not None:
            version = parse_version(read[0])
            if version is not None:
                return Detection(Found(version, read[0], f"{disk}, {read[1]}"), unreadable, root)
        unreadable.append(disk)
    return Detection(dpkg_version(root), unreadable, root)


def plan(detection: Detection, main_version: int | None, main_path: str) -> Plan:
    """The drop-in's config version and native CDI for the node, and the note that says what was found.

    ``main_version``: the main config's ``version`` (None: there is no main config).  The drop-in takes the
    main config's version (containerd 1.x merges imports plugin table by plugin table, so they must agree);
    with no main config, 3 for 2.x and 2 for 1.x.  Native CDI: on for 1.7+ and 2.x, off for 1.6 and older.
    Nothing found: version 2 (every containerd reads it; 2.x migrates it) and CDI on (1.7+ uses it; 1.6
    ignores the key, as Debian's 1.6.20 does), unless the main config's version says 2.x."""
    found = detection.found
    if found is not None and main_version is not None and main_version >= 3 and found.version[0] < 2:
        if found.source == "--containerd-version":
            raise HookError(f"install --containerd-version {found.text}: {main_path} is a version {main_version} "
                            "config, which only containerd 2.x reads; give the node's real version")
        conflict = (f"; {found.source} says {found.shown}, but only containerd 2.x reads a version {main_version} "
                    "config: the config decides")
        found = None
    else:
        conflict = ""
    if found is not None:
        version = main_version if main_version is not None else (3 if found.version[0] >= 2 else 2)
        cdi = has_cdi(found.version)
        what = f"containerd {found.shown} ({found.source}{conflict})"
        why = ""
    elif main_version is not None and main_version >= 3:
        version, cdi = main_version, True
        what = f"containerd 2.x ({main_path} is version {main_version}{conflict})"
        why = ""
    else:
        version, cdi = (main_version if main_version is not None else 2), True
        looked = (f"no version readable in {', '.join(detection.unreadable)}" if detection.unreadable
                  else f"no containerd binary under {detection.root}")
        config = f"{main_path} is version {main_version}" if main_version is not None else f"no {main_path}"
        what = f"containerd version unknown ({looked}, no dpkg record, {config})"
        why = ("; that is the safe choice: containerd 1.7+ uses enable_cdi and 1.6 ignores it"
               + ("" if main_version is not None else ", every containerd reads version 2")
               + "; pass --containerd-version X.Y to be sure")
    cdi_text = "native CDI on (enable_cdi)" if cdi else "no native CDI before 1.7 (pods use the oci-gpu RuntimeClass)"
    migrated = " (containerd 2.x migrates it)" if version == 2 and (found is None or found.version[0] >= 2) else ""
    return Plan(version, cdi, f"{what}: {cdi_text}, drop-in config version {version}{migrated}{why}")
