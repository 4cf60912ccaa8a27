"""The container's ld cache written without a process (:mod:`oci_gpu_hook.appliers.mounts` ``update_ldcache``,
:mod:`oci_gpu_hook.inventory.ldcache` ``build``) held to glibc itself: the host's ``ldconfig -p`` reads what we
write as it reads its own; for each kind of image, the first entry of each soname in our merged cache names the
same file as a cache the host's ``ldconfig -r`` rebuilds over the same root, and the image's own loader
(``ld.so --list`` chrooted into the root) resolves ``libcuda.so.1``, ``libnvidia-ml.so.1`` and the image's
libraries where that cache would have.  Image roots are assembled here from this machine's own glibc and
libraries in the layouts of each distribution (Debian/Ubuntu multiarch, UBI's ``/usr/lib64``, none at all):
the layouts are emulated, the glibc is Debian 12's.  CUDA forward compatibility with compat libraries that carry
NVIDIA's note of each kind; hostile caches end in one line and touch nothing outside the root."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from oci_gpu_hook.appliers import mounts
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.inventory import ldcache
from tests.helpers.fakenvidia import elf_shared_object

MULTIARCH = "/usr/lib/x86_64-linux-gnu"
HOST_LIBS = ("libc.so.6", "libz.so.1", "libm.so.6")
LDCONFIG = shutil.which("ldconfig") or "/sbin/ldconfig"
LOADER = "/lib64/ld-linux-x86-64.so.2"
VERSION = "550.54.15"
DRIVER = (("libcuda.so", "libcuda.so.1"), ("libnvidia-ml.so", "libnvidia-ml.so.1"),
          ("libnvidia-glcore.so", f"libnvidia-glcore.so.{VERSION}"))
NOTE = ".note.cuda.fwd_compatibility"

pytestmark = [pytest.mark.skipif(os.geteuid() != 0 or not os.access(LDCONFIG, os.X_OK) or not shutil.which("cc")
                                 or not os.path.exists(LOADER),
                                 reason="needs root, ldconfig, cc and the x86-64 loader")]


def _so(owner: str) -> str:
    """The host's file of a library (Debian 12: the multiarch directory)."""
    return os.path.realpath(f"{MULTIARCH}/{owner}")


def with_note(data: bytes, desc: bytes, owner: bytes = b"NVIDIA Corporation", namesz: int | None = None) -> bytes:
    """``data`` (an ELF from elf_shared_object) with section headers added: a null section, ``NOTE`` (SHT_NOTE,
    4-aligned) holding one note of ``owner`` with descriptor ``desc``, and the section-name table."""
    name = owner + b"\0"
    pad = lambda b: b + bytes(-len(b) % 4)  # noqa: E731
    note = ((namesz if namesz is not None else len(name)).to_bytes(4, "little") + len(desc).to_bytes(4, "little")
            + (1).to_bytes(4, "little") + pad(name) + pad(desc))
    names = b"\0" + NOTE.encode() + b"\0.shstrtab\0"
    note_at = len(data) + (-len(data) % 8)
    names_at = note_at + len(note)
    shoff = names_at + len(names) + (-(names_at + len(names)) % 8)

    def section(name_at: int, kind: int, at: int, size: int, align: int) -> bytes:
        return (name_at.to_bytes(4, "little") + kind.to_bytes(4, "little") + bytes(16) + at.to_bytes(8, "little")
                + size.to_bytes(8, "little") + bytes(8) + align.to_bytes(8, "little") + bytes(8))

    table = bytes(64) + section(1, 7, note_at, len(note), 4) + section(len(NOTE) + 2, 3, names_at, len(names), 1)
    out = bytearray(data + bytes(note_at - len(data)) + note + names + bytes(shoff - names_at - len(names)) + table)
    out[40:48] = shoff.to_bytes(8, "little")
    out[58:64] = (64).to_bytes(2, "little") + (3).to_bytes(2, "little") + (2).to_bytes(2, "little")
    return bytes(out)


def make_image(root: Path, layout: str = "debian", cache: str = "new", extra: int = 0) -> str:
    """An image root: this machine's glibc and a few libraries in ``layout``'s directories, an ld.so.conf as that
    distribution ships it, ``extra`` more (minimal) libraries, the cache ``ldconfig -r`` writes (``cache``: new,
    compat (old + new) or none), and /probe, linked against libcuda.so.1 and libnvidia-ml.so.1.  The driver's
    directory in the container."""
    libdir = {"debian": MULTIARCH, "ubi": "/usr/lib64", "busybox": MULTIARCH}[layout]
    (root / libdir[1:]).mkdir(parents=True)
    (root / "usr/lib64").mkdir(parents=True, exist_ok=True)
    (root / "etc").mkdir()
    os.symlink("usr/lib", root / "lib")
    os.symlink("usr/lib64", root / "lib64")
    for name in HOST_LIBS:
        shutil.copy2(_so(name), root / libdir[1:] / name)
    shutil.copy2(os.path.realpath(LOADER), root / "usr/lib64" / os.path.basename(LOADER))
    for i in range(extra):
        (root / libdir[1:] / f"libextra{i}.so.{i % 7}").write_bytes(elf_shared_object(f"libextra{i}.so.{i % 7}"))
    if layout == "debian":
        (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
        (root / "etc/ld.so.conf.d").mkdir()
        (root / "etc/ld.so.conf.d/x86_64-linux-gnu.conf").write_text(
            f"/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n{MULTIARCH}\n")
    elif layout == "ubi":
        (root / "etc/ld.so.conf").write_text("include ld.so.conf.d/*.conf\n")
        (root / "etc/ld.so.conf.d").mkdir()
        # RHEL's glibc trusts /usr/lib64 by itself; Debian's (the one here) is told so
        (root / "etc/ld.so.conf.d/lib64.conf").write_text("/usr/lib64\n")
    if cache != "none":
        subprocess.run([LDCONFIG, "-r", str(root), *(("-c", "compat") if cache == "compat" else ())], check=True)
    return libdir


@functools.cache
def real_library(soname: str) -> bytes:
    """A shared object built by the system's compiler with ``soname`` (what the loader and the linker take)."""
    with tempfile.TemporaryDirectory() as work:
        Path(work, "x.c").write_text("int oci_gpu_hook_probe(void) { return 0; }\n")
        subprocess.run(["cc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", f"{work}/x.so", f"{work}/x.c"],
                       check=True)
        return Path(work, "x.so").read_bytes()


def add_driver(root: Path, libdir: str) -> tuple[str, ...]:
    """The driver's files where the runtime mounts them, and their soname links (the hook's first step)."""
    paths = []
    for lib, soname in DRIVER:
        real = root / libdir[1:] / f"{lib}.{VERSION}"
        real.write_bytes(real_library(soname))
        if soname != real.name:
            os.symlink(real.name, root / libdir[1:] / soname)
        paths.append(f"{libdir}/{real.name}")
    return tuple(paths)


def build_probe(root: Path, libdir: str, tmp: Path) -> None:
    """/probe in the root: an executable that needs libcuda.so.1 and libnvidia-ml.so.1 (and libc)."""
    (tmp / "probe.c").write_text("int main(void) { return 0; }\n")
    here = root / libdir[1:]
    subprocess.run(["cc", "-o", str(root / "probe"), str(tmp / "probe.c"), "-Wl,--no-as-needed",
                    str(here / f"libcuda.so.{VERSION}"), str(here / f"libnvidia-ml.so.{VERSION}"), "-Wl,--as-needed"],
                   check=True)


def update(root: Path, libdir: str, libs: tuple[str, ...]) -> str:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return mounts.update_ldcache(fd, str(root), (libdir,), libs)
    finally:
        os.close(fd)


def first(root: Path, entries: list[ldcache.Entry]) -> dict[str, str]:
    """soname -> the file the loader takes for it (the first native entry; its real path inside the root)."""
    out: dict[str, str] = {}
    for e in entries:
        if e.flags == 0x0303 and not e.hwcap and e.soname not in out:
            out[e.soname] = os.path.realpath(root / e.path.lstrip("/"))
    return out


def ldconfig_reference(root: Path) -> dict[str, str]:
    """What the host's ldconfig -r makes of the same root (the drop-in lists the driver's directory)."""
    subprocess.run([LDCONFIG, "-r", str(root), "-X", "-C", "/etc/reference.cache"], check=True)
    return first(root, ldcache.read(str(root / "etc/reference.cache")))


def loader_says(root: Path) -> dict[str, str]:
    """``ld.so --list /probe`` chrooted into the root: soname -> the path the image's loader resolved."""
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    done = subprocess.run([chroot, str(root), LOADER, "--list", "/probe"], capture_output=True, text=True,
                          check=True, env={"PATH": "/usr/bin:/bin"})
    said = {}
    for line in done.stdout.splitlines():
        name, arrow, rest = line.strip().partition(" => ")
        if arrow:
            said[name] = os.path.realpath(root / rest.split(" (")[0].lstrip("/"))
    return said


def test_what_we_write_is_what_ldconfig_reads() -> None:
    """The host's own cache, read, put in our order from any order, written: ``ldconfig -p`` says the same of both
    (but the generator's line)."""
    entries, hwcaps = ldcache.parse_cache(Path("/etc/ld.so.cache").read_bytes())
    assert [e.same() for e in ldcache.order(entries[::-1], hwcaps)] == [e.same() for e in entries]
    built = Path("/tmp") / f"ldcache-test-{os.getpid()}"
    try:
        built.write_bytes(ldcache.build(ldcache.order(entries[::-1], hwcaps), hwcaps))
        ours = subprocess.run([LDCONFIG, "-p", "-C", str(built)], capture_output=True, text=True, check=True).stdout
    finally:
        built.unlink()
    theirs = subprocess.run([LDCONFIG, "-p", "-C", "/etc/ld.so.cache"], capture_output=True, text=True).stdout
    assert ours.splitlines()[1:-1] == theirs.splitlines()[1:-1]


def test_order_is_libcmp_then_flags_then_hwcaps_then_given() -> None:
    e = ldcache.Entry
    given = [e("libfoo.so.9", "/a", 0x0303, 0), e("libfoo.so.10", "/b", 0x0303, 0), e("libfoo.so.10", "/c", 0x0303, 0),
             e("libfoo.so.10", "/d", 0x0003, 0), e("libfoo.so.10", "/e", 0x0303, ldcache.HWCAP_EXTENSION),
             e("libbar.so", "/f", 0x0303, 0)]
    assert [x.path for x in ldcache.order(given, ["x86-64-v3"])] == ["/e", "/b", "/c", "/d", "/a", "/f"]


@pytest.mark.parametrize(("layout", "cache", "extra"), [("debian", "new", 0), ("ubi", "new", 0), ("busybox", "none", 0),
                                                        ("debian", "compat", 0), ("debian", "new", 300)],
                         ids=["debian12-ubuntu", "ubi-lib64", "no-cache", "old-format-cache", "cuda-runtime-like"])
def test_each_image_resolves_as_ldconfig_would(tmp_path: Path, layout: str, cache: str, extra: int) -> None:
    root = tmp_path / "root"
    libdir = make_image(root, layout, cache, extra)
    libs = add_driver(root, libdir)
    build_probe(root, libdir, tmp_path)
    said = update(root, libdir, libs)
    assert "merged" in said, said
    assert (root / "etc/ld.so.conf.d/00-oci-gpu-hook.conf").read_text() == f"{libdir}\n"
    if layout == "busybox":
        assert (root / "etc/ld.so.conf").read_text() == mounts.INCLUDE_LINE
    ours = first(root, ldcache.read(str(root / "etc/ld.so.cache")))
    reference = ldconfig_reference(root)
    for soname in [s for _, s in DRIVER]:
        assert ours[soname] == reference[soname], soname
    # the image's own, as its cache lists them
    for soname in ("libz.so.1", "libc.so.6") if cache != "none" else ():
        assert ours.get(soname) == reference.get(soname), soname
    if extra:
        assert all(ours[f"libextra{i}.so.{i % 7}"] == reference[f"libextra{i}.so.{i % 7}"] for i in range(extra))
    loaded = loader_says(root)
    for soname in ("libcuda.so.1", "libnvidia-ml.so.1", "libc.so.6"):
        assert loaded[soname] == reference[soname], (soname, loaded)
    assert "already resolves" in update(root, libdir, libs)  # the second time: nothing written


def test_the_drivers_libnvidia_ml_comes_before_the_images_own(tmp_path: Path) -> None:
    """An image whose cache names a libnvidia-ml.so.1 of its own (another directory): the driver's comes first,
    then the image's stays listed after it."""
    root = tmp_path / "root"
    libdir = make_image(root)
    (root / "opt/own").mkdir(parents=True)
    (root / "opt/own/libnvidia-ml.so.1").write_bytes(elf_shared_object("libnvidia-ml.so.1"))
    (root / "etc/ld.so.conf.d/own.conf").write_text("/opt/own\n")
    subprocess.run([LDCONFIG, "-r", str(root)], check=True)
    libs = add_driver(root, libdir)
    build_probe(root, libdir, tmp_path)
    update(root, libdir, libs)
    entries = [e.path for e in ldcache.read(str(root / "etc/ld.so.cache")) if e.soname == "libnvidia-ml.so.1"]
    assert entries == [f"{libdir}/libnvidia-ml.so.1", "/opt/own/libnvidia-ml.so.1"]
    assert loader_says(root)["libnvidia-ml.so.1"] == str(root / libdir[1:] / f"libnvidia-ml.so.{VERSION}")


def _compat(root: Path, version: str | None, note: bytes | None) -> None:
    if version is None:
        return
    compat = root / "usr/local/cuda/compat"
    compat.mkdir(parents=True)
    data = real_library("libcuda.so.1")
    (compat / f"libcuda.so.{version}").write_bytes(with_note(data, note) if note is not None else data)
    os.symlink(f"libcuda.so.{version}", compat / "libcuda.so.1")


@pytest.mark.parametrize(("version", "note", "used"), [
    ("570.124.06", b'{"Format": 1, "CUDA Version": "12.8", "Driver": [535, 550, 560, 570], "Device": [1]}', True),
    ("570.124.06", b'{"Format": 1, "CUDA Version": "12.8", "Driver": [535, 560, 570], "Device": [1]}', False),
    ("535.104.05", b'{"Format": 1, "CUDA Version": "12.2", "Driver": [535, 550]}', False),
    ("570.124.06", None, True),  # no note: majors compared
    (None, None, False),
    ("570.124.06", b'{"CUDA Version": "12.8", "Driver": "550"}', False),
    ("570.124.06", b'{not json', False),
], ids=["newer-listed", "newer-not-listed", "older", "newer-no-note", "absent", "note-without-driver-list",
        "note-not-json"])
def test_cuda_forward_compatibility(tmp_path: Path, version: str | None, note: bytes | None, used: bool) -> None:
    root = tmp_path / "root"
    libdir = make_image(root)
    libs = add_driver(root, libdir)
    _compat(root, version, note)
    build_probe(root, libdir, tmp_path)
    said = update(root, libdir, libs)
    assert said.count("\n") == 0
    compat_conf = root / "etc/ld.so.conf.d/00-compat-oci-gpu-hook.conf"
    want = "/usr/local/cuda/compat" if used else libdir
    assert loader_says(root)["libcuda.so.1"] == os.path.realpath(root / want.lstrip("/") / "libcuda.so.1"), said
    assert compat_conf.exists() == used
    if note is not None and b'"Driver": [' not in note:
        assert "the host's libcuda is used" in said, said
    if used:  # a later ldconfig in the container keeps the compat library first (the drop-in sorts first)
        assert ldconfig_reference(root)["libcuda.so.1"] == os.path.realpath(root / "usr/local/cuda/compat/libcuda.so.1")


def _symlink_out(root: Path) -> None:
    (root / "etc/ld.so.cache").unlink()
    os.symlink("../../../../../../../etc/ld.so.cache", root / "etc/ld.so.cache")


def _rewrite(change: Callable[[bytearray], bytes]) -> Callable[[Path], None]:
    def trap(root: Path) -> None:
        path = root / "etc/ld.so.cache"
        path.write_bytes(change(bytearray(path.read_bytes())))
    return trap


def _huge(root: Path) -> None:
    with open(root / "etc/ld.so.cache", "r+b") as handle:
        handle.truncate(1 << 30)


def _lie(data: bytearray) -> bytes:
    data[20:24] = (10**6).to_bytes(4, "little")
    return bytes(data)


def _past_end(data: bytearray) -> bytes:
    data[48 + 4:48 + 8] = (len(data) + 100).to_bytes(4, "little")
    return bytes(data)


@pytest.mark.parametrize("trap", [_symlink_out, lambda r: (os.unlink(r / "etc/ld.so.cache"),
                                                           os.mkfifo(r / "etc/ld.so.cache")),
                                  _rewrite(lambda d: bytes(d[:100])), _rewrite(_lie), _rewrite(_past_end), _huge],
                         ids=["symlink-out-of-root", "fifo", "truncated", "lying-header", "offset-past-end", "1GB"])
def test_a_hostile_cache_is_rebuilt_confined_and_nothing_outside_is_touched(tmp_path: Path,
                                                                           trap: Callable[[Path], None]) -> None:
    root = tmp_path / "root"
    libdir = make_image(root)
    libs = add_driver(root, libdir)
    build_probe(root, libdir, tmp_path)
    trap(root)
    host_cache = Path("/etc/ld.so.cache").read_bytes()
    said = update(root, libdir, libs)
    assert "rebuilt by the host's ldconfig, chrooted, without capabilities" in said and "\n" not in said, said
    assert Path("/etc/ld.so.cache").read_bytes() == host_cache
    assert not (root / "etc/ld.so.cache").is_symlink()
    assert loader_says(root)["libcuda.so.1"] == str(root / libdir[1:] / f"libcuda.so.{VERSION}")


def test_the_confined_ldconfig_has_no_capability(tmp_path: Path) -> None:
    """What the fallback's child runs under: a stand-in for ldconfig (a static busybox where the host has one)
    reports its capabilities and no-new-privs from /proc inside the chroot."""
    busybox = shutil.which("busybox")
    if busybox is None or "static" not in subprocess.run(["file", "-L", busybox], capture_output=True,
                                                         text=True).stdout:
        pytest.skip("no static busybox")
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "bin").mkdir()
    shutil.copy2(busybox, root / "bin/busybox")
    script = (f"import os, subprocess\nfrom oci_gpu_hook.appliers import mounts\n"
              f"subprocess.run(['mount', '-t', 'proc', 'proc', {str(root / 'proc')!r}], check=True)\n"
              f"mounts._confine({str(root)!r})\n"
              "os.execv('/bin/busybox', ['busybox', 'grep', '-E', '^(Cap|NoNewPrivs)', '/proc/self/status'])\n")
    # a mount namespace of its own: the procfs mounted for the probe is never the host's
    done = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", script],
                          capture_output=True, text=True)
    assert done.returncode == 0 and "NoNewPrivs:\t1" in done.stdout, done.stderr
    caps = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("Cap")]
    assert caps == ["0" * 16] * 5, done.stdout


def test_a_library_without_a_soname_is_left_out_and_said(tmp_path: Path) -> None:
    """A driver file that is no library with a soname gets no entry (ldconfig lists none either), in one line; a
    library whose file is missing (its mount is not there) stops the container with one line."""
    root = tmp_path / "root"
    libdir = make_image(root)
    libs = add_driver(root, libdir)
    (root / libdir[1:] / "libnvidia-odd.so.1").write_text("not ELF\n")
    said = update(root, libdir, (*libs, f"{libdir}/libnvidia-odd.so.1"))
    assert said.endswith(f"not listed (no soname): {libdir}/libnvidia-odd.so.1") and "\n" not in said, said
    assert "libnvidia-odd.so.1" not in {e.soname for e in ldcache.read(str(root / "etc/ld.so.cache"))}
    with pytest.raises(HookError, match=r"libnvidia-gone\.so\.1 is missing in the container"):
        update(root, libdir, (f"{libdir}/libnvidia-gone.so.1",))


def _ldconfig_p(root: Path, cache: str) -> list[tuple[str, str]]:
    """``ldconfig -p`` of a cache in the root: (soname and its ABI and hwcaps words, the real file) in order."""
    said = subprocess.run([LDCONFIG, "-p", "-C", str(root / cache.lstrip("/"))], capture_output=True, text=True,
                          check=True).stdout.splitlines()
    return [(line.split(" => ")[0].strip(), os.path.realpath(root / line.split(" => ")[1].lstrip("/")))
            for line in said if " => " in line]


def test_the_images_glibc_hwcaps_entries_stay_first(tmp_path: Path) -> None:
    """An image with a glibc-hwcaps copy of libz: its extension (the subdirectory names) is carried over, the
    hwcaps entry stays before the plain one, and ``ldconfig -p`` of our cache lists what the host's ldconfig
    lists, in the same order, each naming the same file."""
    root = tmp_path / "root"
    libdir = make_image(root)
    hwcaps = root / libdir[1:] / "glibc-hwcaps" / "x86-64-v2"
    hwcaps.mkdir(parents=True)
    shutil.copy2(root / libdir[1:] / "libz.so.1", hwcaps / "libz.so.1")
    subprocess.run([LDCONFIG, "-r", str(root)], check=True)
    assert ldcache.parse_cache((root / "etc/ld.so.cache").read_bytes())[1] == ["x86-64-v2"]
    update(root, libdir, add_driver(root, libdir))
    subprocess.run([LDCONFIG, "-r", str(root), "-X", "-C", "/etc/reference.cache"], check=True)
    ours = _ldconfig_p(root, "/etc/ld.so.cache")
    assert ours == _ldconfig_p(root, "/etc/reference.cache")
    assert ours[0][0] == 'libz.so.1 (libc6,x86-64, hwcap: "x86-64-v2")'


@pytest.mark.root("unshare")
def test_a_read_only_root_is_one_line_unless_nothing_is_to_write(tmp_path: Path) -> None:
    """The rootfs a read-only mount (a private namespace): the container is refused with one line naming what
    could not be written; an image whose cache and drop-in already give the driver needs no write and passes."""
    root = tmp_path / "root"
    libdir = make_image(root)
    libs = add_driver(root, libdir)
    ready = tmp_path / "ready"
    shutil.copytree(root, ready, symlinks=True)
    update(ready, libdir, libs)
    code = f"""
import subprocess, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from oci_gpu_hook.errors import HookError
from tests.test_ldcache_merge import update
for root in ({str(root)!r}, {str(ready)!r}):
    subprocess.run(["mount", "--bind", "-o", "ro", root, root], check=True)
    try:
        print(update(__import__("pathlib").Path(root), {libdir!r}, {libs!r}))
    except HookError as err:
        print("refused:", err)
"""
    done = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    refused, passed = done.stdout.splitlines()
    assert refused.startswith("refused: cannot write /etc/ld.so.conf.d/00-oci-gpu-hook.conf in the container"), refused
    assert "Read-only file system" in refused
    assert "already resolves the driver" in passed, passed


def test_merged_places_ours_as_a_full_sort_would() -> None:
    """Into the host's own cache (in order: binary search) and into the same entries shuffled (not in order:
    sorted whole), entries of new and existing sonames land where :func:`ldcache.order` of all would put them."""
    import random

    image, hwcaps = ldcache.parse_cache(Path("/etc/ld.so.cache").read_bytes())
    e = ldcache.Entry
    ours = [e("libcuda.so.1", "/drv/libcuda.so.1", 0x0303, 0), e("libz.so.1", "/drv/libz.so.1", 0x0303, 0),
            e("libc.so.6", "/drv/libc.so.6", 0x0003, 0), e("libzzz.so.10", "/drv/libzzz.so.10", 0x0303, 0),
            e("libzzz.so.9", "/drv/libzzz.so.9", 0x0303, 0), e("a", "/drv/a", 0x0303, 0)]
    want = [x.same() for x in ldcache.order(ours + image, hwcaps)]
    assert [x.same() for x in ldcache.merged(image, ours, hwcaps)] == want
    shuffled = image[:]
    random.Random(7).shuffle(shuffled)
    assert [x.same() for x in ldcache.merged(shuffled, ours, hwcaps)] == [
        x.same() for x in ldcache.order(ours + shuffled, hwcaps)]


def test_a_musl_image_gets_the_glibc_cache_and_nothing_of_musls(tmp_path: Path) -> None:
    """Alpine: musl's loader reads /etc/ld-musl-<arch>.path, never a glibc cache. The driver's entries go to a glibc
    cache all the same (harmless there), the drop-in and ld.so.conf as for any image; musl's path file is neither
    made nor changed."""
    root = tmp_path / "root"
    for sub in ("lib", "etc/apk", "usr/lib"):
        (root / sub).mkdir(parents=True)
    (root / "lib/ld-musl-x86_64.so.1").write_bytes(b"\x7fELF musl stand-in\n")
    (root / "etc/ld-musl-x86_64.path").write_text("/lib\n/usr/lib\n")
    libs = add_driver(root, "/usr/lib")
    said = update(root, "/usr/lib", libs)
    assert "merged (3 libraries of /usr/lib; 0 of the image)" in said, said
    assert (root / "etc/ld-musl-x86_64.path").read_text() == "/lib\n/usr/lib\n"
    assert {e.soname for e in ldcache.read(str(root / "etc/ld.so.cache"))} == {s for _, s in DRIVER}


def test_what_went_wrong_is_one_warning_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A malformed compat note: the result line carries it as a warning, which the hook says in one line (its
    journal line goes to a socket path where nothing listens: never the host's journal)."""
    from oci_gpu_hook import log

    monkeypatch.setattr(log, "SYSLOG_SOCKET", str(tmp_path / "no-journal"))

    root = tmp_path / "root"
    libdir = make_image(root)
    libs = add_driver(root, libdir)
    _compat(root, "570.124.06", b"{not json")
    said = update(root, libdir, libs)
    assert mounts.WARNING in said and said.count("\n") == 0, said
    mounts.warn_notes([said], "c1")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("oci-gpu-hook: warning: compat libcuda.so.570.124.06: "), err
    assert err.rstrip().endswith("the host's libcuda is used"), err


# --- before ``runc create``: the spec rewrite writes the links and the cache itself (ocispec.prewrite) ----------


def prewrite_bundle(tmp_path: Path, **root: Any) -> tuple[Path, str, Any, Any]:
    """A bundle (``tmp_path``) whose ``rootfs`` is an image, the driver's libraries on the "host" (``host/lib``),
    and the Edits the plan gives for them: (rootfs, libdir, spec, edits).  Nothing of the driver is in the rootfs:
    the runtime has not mounted it yet."""
    from oci_gpu_hook.core.edits import Edits, Mount
    from oci_gpu_hook.oci_spec import ContainerSpec

    rootfs = tmp_path / "rootfs"
    libdir = make_image(rootfs)
    host = tmp_path / "host/lib"
    host.mkdir(parents=True)
    mounted, links = [], []
    for lib, soname in DRIVER:
        (host / f"{lib}.{VERSION}").write_bytes(real_library(soname))
        mounted.append(Mount(str(host / f"{lib}.{VERSION}"), f"{libdir}/{lib}.{VERSION}"))
        if soname != f"{lib}.{VERSION}":
            links.append((f"{libdir}/{soname}", f"{lib}.{VERSION}"))
    edits = Edits(mounts=tuple(mounted), symlinks=tuple(links), ldcache=(libdir,))
    spec = ContainerSpec({"ociVersion": "1.0.2", "root": {"path": "rootfs", **root}, "process": {"env": []},
                          "mounts": [m.to_oci() for m in mounted]})
    return rootfs, libdir, spec, edits


def mount_driver(rootfs: Path, edits: Any) -> None:
    """What runc's bind mounts then show in the container, copied (a test changes no mount of the host)."""
    for mount in edits.mounts:
        shutil.copy2(mount.source, rootfs / mount.destination.lstrip("/"))


def tree(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every entry below ``root``: (mode, size, link target) by path."""
    out = {}
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(here, name)
            st = os.lstat(path)
            out[path] = (st.st_mode, st.st_size, os.readlink(path) if os.path.islink(path) else "")
    return out


def test_before_create_the_rootfs_gets_the_links_and_cache_from_the_host_files(tmp_path: Path) -> None:
    """The sonames come from the mounts' host files; the cache lists their container paths; runc's mounts then
    land where the cache points, and the image's loader resolves the driver as the hook's cache resolves it."""
    from oci_gpu_hook.appliers import ocispec

    rootfs, libdir, spec, edits = prewrite_bundle(tmp_path)
    assert ocispec.prewrite(spec, edits, str(tmp_path)) is True
    assert not (rootfs / libdir[1:] / f"libcuda.so.{VERSION}").exists()  # runc makes the mount target itself
    assert os.readlink(rootfs / libdir[1:] / "libcuda.so.1") == f"libcuda.so.{VERSION}"
    listed = {e.soname: e.path for e in ldcache.read(str(rootfs / "etc/ld.so.cache"))}
    assert listed["libcuda.so.1"] == f"{libdir}/libcuda.so.1" and listed["libnvidia-ml.so.1"] == (
        f"{libdir}/libnvidia-ml.so.1")
    mount_driver(rootfs, edits)
    build_probe(rootfs, libdir, tmp_path)
    said = loader_says(rootfs)
    assert said["libcuda.so.1"] == str(rootfs / libdir[1:] / f"libcuda.so.{VERSION}")
    assert said["libnvidia-ml.so.1"] == str(rootfs / libdir[1:] / f"libnvidia-ml.so.{VERSION}")
    assert ldconfig_reference(rootfs)["libcuda.so.1"] == said["libcuda.so.1"]
    before = tree(rootfs)
    assert ocispec.prewrite(spec, edits, str(tmp_path)) is True  # a second rewrite: nothing more to write
    assert tree(rootfs) == before


def test_before_create_cuda_compat_is_chosen_from_the_host_files_version(tmp_path: Path) -> None:
    from oci_gpu_hook.appliers import ocispec

    rootfs, libdir, spec, edits = prewrite_bundle(tmp_path)
    _compat(rootfs, "570.124.06", b'{"Format": 1, "Driver": [535, 550, 570]}')
    assert ocispec.prewrite(spec, edits, str(tmp_path)) is True
    mount_driver(rootfs, edits)
    build_probe(rootfs, libdir, tmp_path)
    assert loader_says(rootfs)["libcuda.so.1"] == os.path.realpath(rootfs / "usr/local/cuda/compat/libcuda.so.1")
    assert (rootfs / "etc/ld.so.conf.d/00-compat-oci-gpu-hook.conf").read_text() == "/usr/local/cuda/compat\n"


def _dir_mounted_over_libdir(spec: Any, rootfs: Path, libdir: str) -> None:
    spec.raw["mounts"].append({"destination": libdir + "/", "type": "bind", "source": "/tmp", "options": ["bind"]})


def _etc_mounted(spec: Any, rootfs: Path, libdir: str) -> None:
    spec.raw["mounts"].insert(0, {"destination": "/etc", "type": "tmpfs", "source": "tmpfs"})


def _cache_symlinked_out(spec: Any, rootfs: Path, libdir: str) -> None:
    _symlink_out(rootfs)


def _driver_dir_through_proc(spec: Any, rootfs: Path, libdir: str) -> None:
    """The image's driver directory a link through /proc/1/root: runc mounts procfs there first, which would hide
    whatever a walk now made below the rootfs's empty /proc."""
    spec.raw["mounts"].insert(0, {"destination": "/proc", "type": "proc", "source": "proc"})
    (rootfs / "proc").mkdir()
    shutil.rmtree(rootfs / libdir[1:])
    os.symlink("/proc/1/root/opt/driver", rootfs / libdir[1:])


def _no_root_dir(spec: Any, rootfs: Path, libdir: str) -> None:
    spec.raw["root"]["path"] = "elsewhere"


@pytest.mark.parametrize("change", [_dir_mounted_over_libdir, _etc_mounted, _cache_symlinked_out,
                                    _driver_dir_through_proc, _no_root_dir],
                         ids=["directory-mount-over-the-links", "mount-over-etc",
                              "cache-only-ldconfig-can-rebuild", "driver-dir-through-proc", "root-path-missing"])
def test_before_create_what_cannot_be_written_now_is_left_to_the_hook(tmp_path: Path,
                                                                     change: Callable[..., None]) -> None:
    """A mount that would hide what is written, a cache only the confined ldconfig can rebuild
    (the container's namespace is needed), a root that is not there: False, the hook stays; the cache and
    every file outside the rootfs as they were."""
    from oci_gpu_hook.appliers import ocispec

    rootfs, libdir, spec, edits = prewrite_bundle(tmp_path)
    change(spec, rootfs, libdir)
    cache = (rootfs / "etc/ld.so.cache").read_bytes() if not (rootfs / "etc/ld.so.cache").is_symlink() else None
    host_cache = Path("/etc/ld.so.cache").read_bytes()
    outside = tree(tmp_path / "host")
    assert ocispec.prewrite(spec, edits, str(tmp_path)) is False
    if cache is not None:
        assert (rootfs / "etc/ld.so.cache").read_bytes() == cache
    assert Path("/etc/ld.so.cache").read_bytes() == host_cache and tree(tmp_path / "host") == outside
    assert not (rootfs / "proc").exists() or list((rootfs / "proc").iterdir()) == []


@pytest.mark.parametrize("where", ["/etc", "libdir"])
def test_before_create_a_symlink_out_of_the_root_is_followed_inside_it(tmp_path: Path, where: str) -> None:
    """An image whose /etc or driver directory is an absolute symlink naming a host directory: resolved inside
    the rootfs as runc resolves it (the one walk), the host's directory never written."""
    from oci_gpu_hook.appliers import ocispec

    rootfs, libdir, spec, edits = prewrite_bundle(tmp_path)
    bait = tmp_path / "host-side"
    bait.mkdir()
    place = rootfs / ("etc" if where == "/etc" else libdir[1:])
    shutil.move(str(place), str(rootfs / "moved"))
    os.symlink(str(bait), place)
    assert ocispec.prewrite(spec, edits, str(tmp_path)) is True
    assert list(bait.iterdir()) == []
    inside = rootfs / str(bait).lstrip("/")
    assert os.path.lexists(inside / ("ld.so.cache" if where == "/etc" else "libcuda.so.1"))


@pytest.mark.root("unshare")
def test_before_create_a_root_mounted_read_only_is_left_to_the_hook_and_root_readonly_is_not(tmp_path: Path) -> None:
    """``root.readonly`` (runc remounts the root read-only after the createRuntime hooks, which wrote it): written.
    A root that is a read-only mount (a private namespace here): not written, the hook stays and decides."""
    code = f"""
import subprocess, sys
from pathlib import Path
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from oci_gpu_hook.appliers import ocispec
from tests.test_ldcache_merge import prewrite_bundle
for name, mount in (("flag", False), ("mounted", True)):
    bundle = Path({str(tmp_path)!r}) / name
    bundle.mkdir()
    rootfs, libdir, spec, edits = prewrite_bundle(bundle, readonly=True)
    if mount:
        subprocess.run(["mount", "--bind", "-o", "ro", rootfs, rootfs], check=True)
    print(name, ocispec.prewrite(spec, edits, str(bundle)), (rootfs / "etc/ld.so.cache").exists())
"""
    done = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["flag True True", "mounted False True"], done.stdout
