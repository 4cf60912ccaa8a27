"""The native front's ``links`` role (the createRuntime hook that makes /dev/dri/by-path) against Python's ``links``
as the oracle: on the same hostile container roots both give the same exit status, stdout and stderr and leave the
same tree, inside and outside the root; the front makes the links without starting Python where nothing is wrong;
where the kernel has no openat2 (ENOSYS, through a seccomp filter here) the front hands over to Python.

Two kinds of container: a pseudo-container (a process with a mount namespace of its own, working directory at the
root, a child of the test like the hook, which is what check_container asks of a container), for a wide corpus
of hostile roots, states and arguments; and real runc containers (``runc create``, cgroup v1 and v2), where a
createRuntime hook before ours plants the hostile entries in the container's own /dev.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from oci_gpu_hook.fastpath import build as fastbuild
from oci_gpu_hook.install import launchers
from tests.helpers import containerlib as cl

pytestmark = pytest.mark.skipif(fastbuild.find_cc() is None, reason="no C compiler")

CARD = "/dev/dri/by-path/pci-0000:03:00.0-card=../card1"
RENDER = "/dev/dri/by-path/pci-0000:03:00.0-render=../renderD128"
LINK_DIR = "dev/dri/by-path"


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    cl.need("unshare", "mount")
    base = tmp_path_factory.mktemp("links")
    config = base / "config.toml"
    config.write_text(f'sysfs_root = "{cl.SEED_SYSFS}"\nhook_path = "/bin/true"\n')
    defaults = {"OCI_GPU_HOOK_CONFIG": str(config), "OCI_GPU_HOOK_PLANNER_SOCKET": ""}
    launchers.write_launchers(str(base / "native"), defaults, native=True)
    launchers.write_launchers(str(base / "python"), defaults, native=False)
    marker = base / "python-ran"
    script = base / "native" / "oci-gpu-hook.py"
    first, rest = script.read_text().split("\n", 1)
    script.write_text(f"{first}\nopen({str(marker)!r}, 'a').write('ran\\n')\n{rest}")
    return {"base": base, "native": base / "native", "python": base / "python", "marker": marker}


def ran_python(install: dict[str, Path]) -> bool:
    ran = install["marker"].exists()
    if ran:
        install["marker"].unlink()
    return ran


def snapshot(top: Path) -> dict[str, str]:
    """Every entry below ``top`` (not followed): its type, mode and, for a symlink, target."""
    found: dict[str, str] = {}
    if not os.path.lexists(top):
        return {"": "absent"}
    for directory, subdirs, files in os.walk(top):
        for name in sorted([*subdirs, *files]):
            path = Path(directory) / name
            st = path.lstat()
            what = stat.filemode(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                what += " -> " + os.readlink(path)
            found[str(path.relative_to(top))] = what
        subdirs[:] = [d for d in subdirs if not (Path(directory) / d).is_symlink()]
    return found


class Pseudo:
    """A pseudo-container: ``setup`` (shell, in the root, inside its namespace, after /dev is mounted) then sleep."""

    def __init__(self, base: Path, setup: str, tmpfs: bool, root_path: str | None = "ROOTFS",
                 config: str | None = None) -> None:
        self.base = base
        if base.exists():
            shutil.rmtree(base)
        self.rootfs = base / "rootfs"
        (self.rootfs / "dev").mkdir(parents=True)
        (self.rootfs / "etc").mkdir()
        self.outside = base / "outside"
        self.outside.mkdir()
        self.bundle = base / "bundle"
        self.bundle.mkdir()
        spec: dict[str, object] = {"ociVersion": "1.0.2"}
        if root_path is not None:
            spec["root"] = {"path": root_path.replace("ROOTFS", str(self.rootfs))}
        text = config if config is not None else json.dumps(spec)
        text = text.replace("ESCAPED_ROOTFS", str(self.rootfs).replace("/", "\\/"))
        (self.bundle / "config.json").write_text(text.replace("ROOTFS", str(self.rootfs)))
        mount = "mount -t tmpfs -o mode=755 none dev && " if tmpfs else ""
        script = f"cd {self.rootfs} && {mount}{setup.replace('OUTSIDE', str(self.outside)) or 'true'} && " \
                 "touch .ready && exec sleep 300"
        self.process = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script])
        deadline = time.monotonic() + 30
        while not (self.rootfs / ".ready").exists():
            assert self.process.poll() is None, f"setup failed: {setup}"
            assert time.monotonic() < deadline
            time.sleep(0.01)

    @property
    def inside(self) -> Path:
        """The root as the container's mount namespace has it."""
        return Path(f"/proc/{self.process.pid}/root{self.rootfs}")

    def state(self, pid: int | None = None) -> str:
        return json.dumps({"ociVersion": "1.0.2", "id": "c1", "pid": pid or self.process.pid, "status": "creating",
                           "bundle": str(self.bundle)})

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def run_links(launcher: Path, args: list[str], state: str,
              preexec: object = None) -> tuple[int, str, str]:
    done = subprocess.run([str(launcher), "links", *args], input=state, capture_output=True, text=True,
                          env=cl.hook_env(), timeout=60, preexec_fn=preexec)  # type: ignore[arg-type]
    return done.returncode, done.stdout, done.stderr


def outcome(install: dict[str, Path], kind: str, case: dict[str, object], preexec: object = None,
            ) -> tuple[tuple[int, str, str], dict[str, dict[str, str]]]:
    """(status, stdout, stderr) of ``kind``'s links on a fresh pseudo-container of ``case``, and the trees after:
    the root's /dev as the container has it, the root on the host, the directory outside."""
    box = Pseudo(install["base"] / "box", str(case.get("setup", "")), bool(case.get("tmpfs", True)),
                 case.get("root_path", "ROOTFS"), case.get("config"))  # type: ignore[arg-type]
    try:
        pid = {"one": 1, "self": os.getpid()}.get(str(case.get("pid")), box.process.pid)
        status, out, err = run_links(install[kind] / "oci-gpu-hook", list(case.get("args", [CARD, RENDER])),
                                     box.state(pid), preexec)  # type: ignore[arg-type]
        err = err.replace(str(box.process.pid), "PID")
        trees = {"container": snapshot(box.inside / "dev"), "host": snapshot(box.rootfs),
                 "outside": snapshot(box.outside)}
    finally:
        box.close()
    return (status, out, err), trees


# name -> setup in the root (inside its namespace), links, /dev a tmpfs of its own, pid, root.path, config text
CASES: dict[str, dict[str, object]] = {
    "fresh": {},
    "fresh-one-link": {"args": [CARD]},
    "no-link": {"args": []},
    "no-dev": {"setup": "rmdir dev", "tmpfs": False},
    "dev-on-the-root": {"tmpfs": False},
    "dev-symlink-out": {"setup": "rmdir dev && ln -s OUTSIDE dev", "tmpfs": False},
    "dev-symlink-in": {"setup": "rmdir dev && mkdir realdev && ln -s realdev dev", "tmpfs": False},
    "dev-a-file": {"setup": "rmdir dev && touch dev", "tmpfs": False},
    "dri-symlink-out": {"setup": "ln -s OUTSIDE dev/dri"},
    "dri-symlink-relative-out": {"setup": "ln -s ../../outside dev/dri"},
    "dri-symlink-in": {"setup": "mkdir dev/real && ln -s /dev/real dev/dri"},
    "dri-dangling": {"setup": "ln -s /nonexistent dev/dri"},
    "dri-a-file": {"setup": "touch dev/dri"},
    "dri-a-fifo": {"setup": "mkfifo dev/dri"},
    "dri-a-device": {"setup": "mknod dev/dri c 1 3"},
    "by-path-symlink": {"setup": "mkdir dev/dri && ln -s ../../etc dev/dri/by-path"},
    "by-path-symlink-out": {"setup": "mkdir dev/dri && ln -s OUTSIDE dev/dri/by-path"},
    "by-path-a-file": {"setup": "mkdir dev/dri && touch dev/dri/by-path"},
    "link-there": {"setup": f"mkdir -p {LINK_DIR} && ln -s ../card1 {LINK_DIR}/pci-0000:03:00.0-card"},
    "link-elsewhere": {"setup": f"mkdir -p {LINK_DIR} && ln -s ../card2 {LINK_DIR}/pci-0000:03:00.0-card"},
    "link-out": {"setup": f"mkdir -p {LINK_DIR} && ln -s OUTSIDE {LINK_DIR}/pci-0000:03:00.0-card"},
    "link-a-file": {"setup": f"mkdir -p {LINK_DIR} && touch {LINK_DIR}/pci-0000:03:00.0-card"},
    "link-a-directory": {"setup": f"mkdir -p {LINK_DIR}/pci-0000:03:00.0-card"},
    "second-link-a-file": {"setup": f"mkdir -p {LINK_DIR} && touch {LINK_DIR}/pci-0000:03:00.0-render"},
    "arg-outside-by-path": {"args": ["/etc/passwd=../card1"]},
    "arg-target-escapes": {"args": ["/dev/dri/by-path/x=../../etc/passwd"]},
    "arg-target-absolute": {"args": ["/dev/dri/by-path/x=/dev/dri/card1"]},
    "arg-no-equals": {"args": ["/dev/dri/by-path/x"]},
    "arg-dot-dot": {"args": ["/dev/dri/by-path/..=../card1"]},
    "arg-nested": {"args": ["/dev/dri/by-path/a/b=../card1"]},
    "arg-not-digits": {"args": ["/dev/dri/by-path/x=../card1a"]},
    "arg-unicode-digit": {"args": ["/dev/dri/by-path/x=../card\u0661"]},
    "arg-unicode-name": {"args": ["/dev/dri/by-path/pci-\u00e9=../card1"]},
    "arg-debug": {"args": ["--debug", CARD]},
    "arg-config": {"args": ["--config", "/nonexistent", CARD]},
    "arg-dash": {"args": ["-x=../card1"]},
    "pid-one": {"pid": "one"},
    "pid-not-a-container": {"pid": "self"},
    "root-relative": {"root_path": "../rootfs"},
    "root-dot-dots": {"root_path": "../rootfs/./etc/../"},
    "root-double-slash": {"root_path": "//" + "ROOTFS"},
    "root-symlink": {"setup": "ln -s rootfs ../rootfs-link", "root_path": "../rootfs-link"},
    "root-missing": {"root_path": None},
    "root-empty": {"root_path": ""},
    "root-escaped": {"config": '{"root": {"path": "ESCAPED_ROOTFS"}}'},
    "root-not-an-object": {"config": '{"root": "ROOTFS"}'},
    "root-elsewhere": {"root_path": "/tmp"},
    "config-not-json": {"config": '{"root": '},
    "config-key-twice": {"config": '{"root": {"path": "ROOTFS"}, "root": {"path": "/tmp"}}'},
    "config-other-case": {"config": '{"Root": {"path": "ROOTFS"}}'},
}
# where nothing is wrong, the front makes the links itself
FAST = {"fresh", "fresh-one-link", "no-link", "no-dev", "dev-on-the-root", "link-there", "root-relative",
        "root-dot-dots", "root-double-slash", "root-symlink", "arg-unicode-name"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_native_links_agree_with_python(install: dict[str, Path], name: str) -> None:
    case = CASES[name]
    native = outcome(install, "native", case)
    fast = not ran_python(install)
    python = outcome(install, "python", case)
    assert native == python
    assert fast == (name in FAST), (name, native)
    if name in ("fresh", "fresh-one-link"):
        assert native[0] == (0, "", "")
        links = {k: v for k, v in native[1]["container"].items() if "->" in v}
        expect = {"dri/by-path/pci-0000:03:00.0-card": "lrwxrwxrwx -> ../card1"}
        if name == "fresh":
            expect["dri/by-path/pci-0000:03:00.0-render"] = "lrwxrwxrwx -> ../renderD128"
        assert links == expect
        assert native[1]["container"]["dri"] == native[1]["container"]["dri/by-path"] == "drwxr-xr-x"
        assert native[1]["host"] == {"dev": "drwxr-xr-x", "etc": "drwxr-xr-x", ".ready": "-rw-r--r--"}
    assert native[1]["outside"] == {}, name


# --- without openat2 -----------------------------------------------------------------------------------------


def no_openat2() -> None:
    """In the child before exec: a seccomp filter that makes openat2 fail with ENOSYS, as on a kernel before 5.6."""
    libc = ctypes.CDLL(None, use_errno=True)

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                    ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Filter))]

    instructions = (Filter * 4)(
        Filter(0x20, 0, 0, 0),  # load the syscall number
        Filter(0x15, 0, 1, 437),  # openat2?
        Filter(0x06, 0, 0, 0x00050000 | 38),  # SECCOMP_RET_ERRNO | ENOSYS
        Filter(0x06, 0, 0, 0x7FFF0000),  # SECCOMP_RET_ALLOW
    )
    program = Program(4, instructions)
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(program), 0, 0) != 0:
        os.write(2, b"seccomp failed\n")
        os._exit(99)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="openat2 is syscall 437 here")
@pytest.mark.parametrize("name", ["fresh", "link-elsewhere", "dri-symlink-out"])
def test_without_openat2_python_makes_the_links(install: dict[str, Path], name: str) -> None:
    native = outcome(install, "native", CASES[name], no_openat2)
    assert ran_python(install)
    assert native == outcome(install, "python", CASES[name])
    if name == "fresh":
        assert native[0] == (0, "", "")


# --- real runc containers ------------------------------------------------------------------------------------

PREPARE = """#!/bin/sh
pid=$(sed -n 's/.*"pid": *\\([0-9]*\\).*/\\1/p')
exec nsenter --mount=/proc/$pid/ns/mnt -- sh -c 'cd ROOTFS && SETUP'
"""
SNAPSHOT = """
import json, os, stat, subprocess, sys
state = json.loads(subprocess.run(["runc", "state", sys.argv[1]], capture_output=True, text=True, check=True).stdout)
top = f"/proc/{state['pid']}/root/dev"
found = {}
for directory, subdirs, files in os.walk(top):
    for name in sorted(subdirs + files):
        path = os.path.join(directory, name)
        st = os.lstat(path)
        found[os.path.relpath(path, top)] = stat.filemode(st.st_mode) + (
            " -> " + os.readlink(path) if stat.S_ISLNK(st.st_mode) else "")
    subdirs[:] = [d for d in subdirs if not os.path.islink(os.path.join(directory, d))]
print(json.dumps(found))
"""
RUNC_CASES = {
    "fresh": "true",
    "link-there": f"mkdir -p {LINK_DIR} && ln -s ../card1 {LINK_DIR}/pci-0000:03:00.0-card",
    "dri-symlink-out": "ln -s OUTSIDE dev/dri",
    "dev-dri-symlink-to-host-root": "ln -s / dev/dri",
    "by-path-symlink": "mkdir dev/dri && ln -s ../../etc dev/dri/by-path",
    "dri-a-file": "touch dev/dri",
    "link-elsewhere": f"mkdir -p {LINK_DIR} && ln -s ../card2 {LINK_DIR}/pci-0000:03:00.0-card",
}


@pytest.fixture(scope="module")
def runc_root(install: dict[str, Path]) -> Iterator[Path]:
    cl.need("runc", "nsenter", "busybox")
    yield cl.make_rootfs(install["base"] / "runc-rootfs")


def runc_outcome(install: dict[str, Path], rootfs: Path, kind: str, setup: str, v2: bool, cid: str,
                 ) -> tuple[int, str, object, dict[str, str]]:
    """runc create with a preparing createRuntime hook, then ours; (runc's status, its stderr, the container's
    /dev after create, the directory outside)."""
    base = install["base"] / f"runc-{kind}"
    if base.exists():
        shutil.rmtree(base)
    base.mkdir()
    outside = base / "outside"
    outside.mkdir()
    bundle = cl.make_bundle(base / "bundle", rootfs, [], ["/bin/true"])
    prepare = base / "prepare.sh"
    prepare.write_text(PREPARE.replace("ROOTFS", str(rootfs)).replace("SETUP", setup.replace("OUTSIDE", str(outside))))
    prepare.chmod(0o755)
    snapshot_script = base / "snapshot.py"
    snapshot_script.write_text(SNAPSHOT)
    spec = json.loads((bundle / "config.json").read_text())
    spec["hooks"] = {"createRuntime": [
        {"path": str(prepare), "args": ["prepare"], "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]},
        {"path": str(install[kind] / "oci-gpu-hook"), "args": ["oci-gpu-hook", "links", CARD, RENDER],
         "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"], "timeout": 30}]}
    (bundle / "config.json").write_text(json.dumps(spec))
    script = (f"runc create --bundle {bundle} {cid} >/dev/null 2>{base}/stderr; rc=$?; "
              f"[ $rc = 0 ] && {sys.executable} {snapshot_script} {cid}; runc delete --force {cid} 2>/dev/null; "
              "exit $rc")
    argv = ["sh", "-c", script]
    done = subprocess.run(cl.cgroup2_wrap(argv) if v2 else argv, capture_output=True, text=True, timeout=120,
                          env=cl.hook_env())
    stderr = (base / "stderr").read_text().replace(cid, "ID")
    stderr = " ".join(part for part in stderr.split() if not part.startswith("time="))
    return done.returncode, stderr, json.loads(done.stdout) if done.stdout.strip() else None, snapshot(outside)


@pytest.mark.containers
@pytest.mark.parametrize("v2", [False, True], ids=["cgroup-v1", "cgroup-v2"])
@pytest.mark.parametrize("name", sorted(RUNC_CASES))
def test_native_links_agree_with_python_in_runc(install: dict[str, Path], runc_root: Path, name: str,
                                                v2: bool) -> None:
    cid = cl.container_id()
    native = runc_outcome(install, runc_root, "native", RUNC_CASES[name], v2, cid)
    fast = not ran_python(install)
    python = runc_outcome(install, runc_root, "python", RUNC_CASES[name], v2, cid)
    assert native == python
    assert native[3] == {}  # nothing outside the root, ever
    assert fast == (name in ("fresh", "link-there")), native
    if name in ("fresh", "link-there"):
        assert native[0] == 0, native
        assert native[2]["dri/by-path/pci-0000:03:00.0-card"] == "lrwxrwxrwx -> ../card1"  # type: ignore[index]
        assert native[2]["dri/by-path/pci-0000:03:00.0-render"] == "lrwxrwxrwx -> ../renderD128"  # type: ignore[index]
    else:
        assert native[0] != 0 and "oci-gpu-hook: error:" in native[1], native
