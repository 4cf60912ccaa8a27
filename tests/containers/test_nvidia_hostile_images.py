"""Hostile images on the NVIDIA example host, in real containers: the ld cache lists nothing of the host, the
driver's files land inside the rootfs, and the shim, the prestart hook, podman's precreate hook and podman with the
CDI specs alone take every image the same way.

Each image is the probe's busybox rootfs of tests/containers/test_nvidia_hosts.py with one trap: an ld.so.conf.d
naming a host directory through ``/proc/1/root`` (also with the host's pid namespace, where ``/proc/self/root`` is
live too), through a symlink to ``/proc/1/root``, through a symlink to ``/`` or ``../..``; a library in a scanned
directory that is a symlink to a host library through ``/proc/1/root``; ``/etc/ld.so.conf`` itself such a symlink;
the driver's library directory or ``/lib/firmware`` a symlink out of the rootfs (through ``/proc/1/root`` or
``../..``). The host directory holds a library whose soname no image or driver has (``libhostonly.so.7``); before
the fix the first case listed it in the container's cache (and the driver's library directory through ``/proc``
was refused by the prestart hook and started by the shim and CDI). A symlink to ``/`` and ``../..`` stayed inside
(ldconfig chroots) before too: they are here so that they stay so.  Also here: CUDA forward compatibility, one
decision on every path, for a compat library whose note lists the host's branch, does not, or is malformed."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from oci_gpu_hook.appliers import mounts
from oci_gpu_hook.inventory import ldcache
from tests.containers.test_nvidia_hosts import LIB, _runc, host_setup, make_rootfs
from tests.helpers import containerlib as cl
from tests.helpers.fakenvidia import elf_shared_object

pytestmark = pytest.mark.containers
HOST_SONAME = "libhostonly.so.7"
APPLIERS = ("shim", "prestart", "podman-precreate", "podman-cdi")
Trap = Callable[[Path, Path, int], None]  # (the rootfs, the host directory it aims at, a host process's pid)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    cl.need("runc", "podman", "busybox", "unshare")
    base = tmp_path_factory.mktemp("hostile")
    host = base / "host"  # the host's directories the images aim at
    (host / "lib").mkdir(parents=True)
    (host / "lib" / HOST_SONAME).write_bytes(elf_shared_object(HOST_SONAME))
    (host / "ld.so.conf").write_text(f"/proc/1/root{host}/lib\n{host}/lib\n")
    (host / "driverlib").mkdir()
    (host / "firmware").mkdir()
    # a host process whose pid an image may name (pid 1 itself may be closed to root, as on some sandboxes)
    sleeper = subprocess.Popen(["sleep", "3600"])
    yield {"base": base, "host": host, "nv": host_setup(base / "nvidia-h100", "nvidia-h100"), "pid": sleeper.pid}
    sleeper.kill()
    sleeper.wait()


def _conf(line: str) -> Trap:
    def trap(rootfs: Path, host: Path, pid: int) -> None:
        (rootfs / "etc" / "ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
        (rootfs / "etc" / "ld.so.conf.d").mkdir(exist_ok=True)
        (rootfs / "etc" / "ld.so.conf.d" / "evil.conf").write_text(line.format(host=host, pid=pid) + "\n")
    return trap


def _link(path: str, target: str, conf: str | None = None) -> Trap:
    def trap(rootfs: Path, host: Path, pid: int) -> None:
        where = rootfs / path.lstrip("/")
        where.parent.mkdir(parents=True, exist_ok=True)
        where.symlink_to(target.format(host=host))
        if conf is not None:
            _conf(conf)(rootfs, host, pid)
    return trap


def _conf_file_link(rootfs: Path, host: Path, pid: int) -> None:
    (rootfs / "etc" / "ld.so.conf").symlink_to(f"/proc/1/root{host}/ld.so.conf")


# (id, the trap, the container in the host's pid namespace)
IMAGES: list[tuple[str, Trap, bool]] = [
    ("conf-proc-1-root", _conf("/proc/1/root{host}/lib"), False),
    ("conf-proc-host-pid", _conf("/proc/{pid}/root{host}/lib\n/proc/self/root{host}/lib\n/proc/1/root{host}/lib"),
     True),
    ("conf-symlink-to-proc", _link("/evil", "/proc/1/root", "/evil{host}/lib"), False),
    ("conf-symlink-to-slash", _link("/hostroot", "/", "/hostroot{host}/lib"), False),
    ("conf-dotdot", _conf("/../../../..{host}/lib\n/etc/../../..{host}/lib"), False),
    ("conf-file-symlink", _conf_file_link, False),
    ("library-symlink-to-proc", _link("/usr/local/lib/libsneaky.so.7", "/proc/1/root{host}/lib/" + HOST_SONAME,
                                      "/usr/local/lib"), False),
    ("driver-dir-to-proc", _link(LIB, "/proc/1/root{host}/driverlib"), False),
    ("driver-dir-dotdot", _link(LIB, "../../../../../../..{host}/driverlib"), False),
    ("firmware-to-proc", _link("/lib/firmware", "/proc/1/root{host}/firmware"), False),
    ("firmware-dotdot", _link("/lib/firmware", "../../../../../../..{host}/firmware"), False),
]


def _start(setup: dict[str, Any], applier: str, trap: Trap,
           host_pid: bool) -> tuple[Any, Path]:
    nv = setup["nv"]
    rootfs = make_rootfs(setup["base"] / f"{cl.container_id()}-rootfs", nv["model"])
    trap(rootfs, setup["host"], setup["pid"])
    if applier.startswith("podman"):
        cdi = applier == "podman-cdi"
        argv = [*cl.PODMAN, "--runtime=runc", f"--hooks-dir={setup['base'] / 'no-hooks' if cdi else nv['hooks-dir']}",
                *cl.PODMAN_RUN, *(["--pid=host"] if host_pid else []),
                *(["--device", "nvidia.com/gpu=1"] if cdi else ["--env", "NVIDIA_VISIBLE_DEVICES=1"]),
                "--rootfs", str(rootfs), "/bin/sh", "/probe.sh"]
        return cl.run(cl.private_cdi(argv, nv["cdi"]) if cdi else argv, env=cl.hook_env()), rootfs
    cid = cl.container_id()
    bundle = cl.make_bundle(setup["base"] / cid, rootfs, ["NVIDIA_VISIBLE_DEVICES=1"], ["/bin/sh", "/probe.sh"])

    def change(spec: dict[str, Any]) -> None:
        spec["root"]["readonly"] = False
        if host_pid:
            spec["linux"]["namespaces"] = [n for n in spec["linux"]["namespaces"] if n["type"] != "pid"]

    cl.edit_spec(bundle, change)
    if applier == "prestart":
        cl.add_prestart(bundle, nv["hook"])
        return _runc(bundle, False), rootfs
    return _runc(bundle, False, str(nv["runtime"])), rootfs


def _listing(host: Path) -> dict[str, str]:
    return {str(p.relative_to(host)): p.read_bytes().hex() if p.is_file() else "dir" for p in sorted(host.rglob("*"))}


@pytest.mark.parametrize(("trap", "host_pid"), [i[1:] for i in IMAGES], ids=[i[0] for i in IMAGES])
def test_a_hostile_image_gets_nothing_of_the_host_and_one_outcome(setup: dict[str, Any],
                                                                   trap: Trap,
                                                                   host_pid: bool) -> None:
    before = _listing(setup["host"])
    outcomes = {}
    for applier in APPLIERS:
        done, rootfs = _start(setup, applier, trap, host_pid)
        assert done.returncode == 0, (applier, done.stderr)
        assert "done" in done.stdout.splitlines(), (applier, done.stdout)
        entries = ldcache.read(str(rootfs / "etc" / "ld.so.cache"))
        sonames = {e.soname for e in entries}
        assert HOST_SONAME not in sonames, (applier, [e for e in entries if e.soname == HOST_SONAME])
        assert not [e.path for e in entries if e.path.startswith("/proc/")], applier
        assert "libcuda.so.1" in sonames, (applier, entries)  # the driver's own libraries are still listed
        # every library listed is a file of the rootfs or of a driver mount (gone now) in the driver's directories
        # (libcuda's, and its vdpau/)
        driver_dirs = {d for e in entries if e.soname == "libcuda.so.1" for d in (os.path.dirname(e.path),
                                                                                   os.path.dirname(e.path) + "/vdpau")}
        assert {os.path.dirname(e.path) for e in entries} <= driver_dirs, (applier, entries)
        outcomes[applier] = done.returncode
    assert len(set(outcomes.values())) == 1, outcomes
    assert _listing(setup["host"]) == before  # nothing made or changed on the host


def test_the_probe_sees_the_driver_through_the_image_symlinks(setup: dict[str, Any]) -> None:
    """The driver's library directory a symlink through /proc/1/root: every applier mounts the driver's files where
    the image's link leads inside the rootfs, and the container loads them from there."""
    for applier in APPLIERS:
        done, _ = _start(setup, applier, _link(LIB, "/proc/1/root/opt/nvlib"), False)
        assert done.returncode == 0, (applier, done.stderr)
        lines = done.stdout.splitlines()
        assert "ldcache libcuda.so.1" in lines, (applier, done.stdout)
        assert any(line.startswith(f"file {LIB}/libcuda.so.") and line.endswith(" readonly") for line in lines), \
            (applier, done.stdout)


def _fifo_conf(rootfs: Path, host: Path, pid: int) -> None:
    os.mkfifo(rootfs / "etc" / "ld.so.conf")


def _fifo_conf_and_cache(rootfs: Path, host: Path, pid: int) -> None:
    os.mkfifo(rootfs / "etc" / "ld.so.conf")
    os.mkfifo(rootfs / "etc" / "ld.so.cache")


def test_an_image_whose_ld_so_conf_is_a_fifo_starts_alike(setup: dict[str, Any]) -> None:
    """/etc/ld.so.conf a FIFO (ldconfig would wait for a writer forever): the driver's entries are merged into the
    cache without reading it, so every applier starts the container, the driver resolvable, the FIFO left as is."""
    for applier in APPLIERS:
        done, rootfs = _start(setup, applier, _fifo_conf, False)
        assert done.returncode == 0, (applier, done.stderr)
        assert "ldcache libcuda.so.1" in done.stdout.splitlines(), (applier, done.stdout)
        assert (rootfs / "etc" / "ld.so.conf").is_fifo()


def test_an_image_that_would_hold_ldconfig_is_refused_alike(setup: dict[str, Any]) -> None:
    """/etc/ld.so.cache a FIFO too: that cache cannot be merged, so the host's ldconfig rebuilds it (confined), and
    would wait on ld.so.conf forever. Every applier stops the container with the same one line (ldconfig's deadline,
    under the runtime's hook timeout), none holds it.  The four containers start at once: each waits out the whole
    deadline, which one after the other would add up."""
    said = {}
    with ThreadPoolExecutor(len(APPLIERS)) as pool:
        started = dict(zip(APPLIERS, pool.map(lambda a: _start(setup, a, _fifo_conf_and_cache, False), APPLIERS),
                           strict=True))
    for applier, (done, rootfs) in started.items():
        assert done.returncode != 0 and "Traceback" not in done.stderr, (applier, done.stderr)
        line = done.stderr.split("oci-gpu-hook: error: ", 1)[-1].split("\\n")[0].split("\n")[0]
        assert f"did not finish in {mounts.LDCONFIG_SECONDS} s" in line, (applier, done.stderr)
        said[applier] = line.replace(str(rootfs), "ROOTFS")
    assert len(set(said.values())) == 1, said


def _file_at(path: str, directory: bool = False) -> Trap:
    def trap(rootfs: Path, host: Path, pid: int) -> None:
        where = rootfs / path.lstrip("/")
        where.parent.mkdir(parents=True, exist_ok=True)
        if directory:
            where.mkdir()
        else:
            where.write_text("not a directory\n")
    return trap


@pytest.mark.parametrize(("trap", "named"), [(_file_at(LIB), LIB), (_file_at("/lib/firmware"), "/lib/firmware"),
                                             (_file_at("/usr/bin/nvidia-smi", directory=True), "/usr/bin/nvidia-smi")],
                         ids=["driver-dir-a-file", "firmware-a-file", "smi-a-directory"])
def test_an_image_with_a_file_where_the_driver_goes_is_refused_everywhere(setup: dict[str, Any], trap: Trap,
                                                                          named: str) -> None:
    """Where the image has a file in place of a directory the driver's files go to (or a directory in place of
    one): every applier refuses, in one line naming the place. The words differ: on the shim and CDI paths
    runc itself mounts, before any hook, and says it in its own."""
    for applier in APPLIERS:
        done, _ = _start(setup, applier, trap, False)
        assert done.returncode != 0 and "Traceback" not in done.stderr, (applier, done.stderr)
        assert named in done.stderr and ("not a directory" in done.stderr or "directory or special file there"
                                         in done.stderr), (applier, done.stderr)


NOTES = {"host-branch-listed": b'{"Format": 1, "CUDA Version": "12.8", "Driver": [535, 550, 570], "Device": [1]}',
         "host-branch-not-listed": b'{"Format": 1, "CUDA Version": "12.8", "Driver": [535, 570], "Device": [1]}',
         "malformed-note": b'{"CUDA Version": "12.8", "Driver": '}


def _compat(note: bytes) -> Trap:
    """A CUDA image newer than the host's driver (550): /usr/local/cuda/compat holds libcuda.so.570.124.06 with
    NVIDIA's note ``note``."""
    def trap(rootfs: Path, host: Path, pid: int) -> None:
        from tests.test_ldcache_merge import real_library, with_note

        compat = rootfs / "usr" / "local" / "cuda" / "compat"
        compat.mkdir(parents=True)
        (compat / "libcuda.so.570.124.06").write_bytes(with_note(real_library("libcuda.so.1"), note))
        (compat / "libcuda.so.1").symlink_to("libcuda.so.570.124.06")
    return trap


@pytest.mark.parametrize("kind", sorted(NOTES))
def test_cuda_forward_compatibility_on_every_path(setup: dict[str, Any], kind: str) -> None:
    """Every applier takes NVIDIA's decision alike: the compat libcuda first in the container's cache (and its
    drop-in written) where the note lists the host's branch, the driver's libcuda first where it does not or where
    the note is malformed (the container starts with what is valid)."""
    listed = kind == "host-branch-listed"
    for applier in APPLIERS:
        done, rootfs = _start(setup, applier, _compat(NOTES[kind]), False)
        assert done.returncode == 0, (applier, done.stderr)
        first = next(e.path for e in ldcache.read(str(rootfs / "etc" / "ld.so.cache")) if e.soname == "libcuda.so.1")
        assert first == ("/usr/local/cuda/compat/libcuda.so.1" if listed else f"{LIB}/libcuda.so.1"), applier
        assert (rootfs / "etc/ld.so.conf.d/00-compat-oci-gpu-hook.conf").exists() == listed, applier
