"""Host trees for the install tests: what a node already has where install writes (under a prefix)."""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

MTIME = 1_500_000_000_000_000_000

DAEMON_JSON = '{\n    "log-driver": "journald",\n    "storage-driver": "overlay2"\n}\n'
CONTAINERD_V2 = """\
version = 2
root = "/var/lib/containerd"

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.9"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = true
"""
# containerd 2.x (`containerd config default | head`, trimmed): version 3, the CRI runtime plugin.
CONTAINERD_V3 = """\
version = 3
root = '/var/lib/containerd'
state = '/run/containerd'

[grpc]
  address = '/run/containerd/containerd.sock'

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'

  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    enable_cdi = true
    cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']

    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'

      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
          runtime_type = 'io.containerd.runc.v2'

          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
            SystemdCgroup = true
            BinaryName = ''
"""
CONTAINERS_CONF = '[engine]\nhooks_dir = ["/usr/share/containers/oci/hooks.d", "/etc/containers/oci/hooks.d"]\n'


# --- containerd binaries as a node has them (install reads their version from their bytes) ---------------


def go_build_info(version: str) -> bytes:
    """A containerd binary as containerd's Makefile builds it (official releases, Docker's containerd.io;
    checked against v1.7.24 and v2.1.9 built from their tags): Go's build info records the ``-ldflags`` that set
    ``version.Version``.  Not an ELF file this machine runs, so install must read it, not run it."""
    module = "github.com/containerd/containerd" + ("/v2" if version.lstrip("v").startswith("2") else "")
    info = (f"path\t{module}/cmd/containerd\nmod\t{module}\t(devel)\t\n"
            "dep\tgithub.com/containerd/ttrpc\tv1.2.7\t\n"  # a dependency's version is not containerd's
            f'build\t-ldflags="-X {module}/version.Version={version} -X {module}/version.Revision={"8" * 40} '
            f'-X {module}/version.Package={module} -s -w "\nbuild\tGOOS=linux\n')
    return b"\x7fELF\x02\x01\x01" + bytes(57) + b"\xff Go buildinf:\x08\x02" + bytes(16) + info.encode() + bytes(64)


def go_string_variables(strings: list[str], *, wide: bool = True, little: bool = True, machine: int = 183) -> bytes:
    """A minimal ELF file whose writable segment holds the Go string headers (pointer, length) of ``strings``, in
    order, pointing into a read-only segment: how a Go binary built without build-info flags (Debian's
    ``-trimpath`` build) keeps a package's string variables.  ``machine`` 183 is aarch64: not run here."""
    order, word = ("<" if little else ">"), ("Q" if wide else "I")
    size = 8 if wide else 4
    rodata = b"".join(s.encode() for s in strings)
    ro_off, ro_va, rw_off, rw_va = 0x1000, 0x401000, 0x2000, 0x602000
    headers, at = b"", ro_va
    for text in ["garbage", *strings, "tail"]:  # a header either side that points nowhere useful
        length = len(text.encode())
        headers += struct.pack(order + word * 2, at if text in strings else 0x7fff0000, length)
        at += length if text in strings else 0
    if wide:
        head = struct.pack(order + "16sHHIQQQIHHHHHH", b"\x7fELF\x02" + (b"\x01" if little else b"\x02") + b"\x01",
                           2, machine, 1, 0, 64, 0, 0, 64, 56, 2, 0, 0, 0)
        phdrs = b"".join(struct.pack(order + "IIQQQQQQ", 1, flags, off, va, va, n, n, 0x1000)
                         for flags, off, va, n in ((4, ro_off, ro_va, len(rodata)), (6, rw_off, rw_va, len(headers))))
    else:
        head = struct.pack(order + "16sHHIIIIIHHHHHH", b"\x7fELF\x01" + (b"\x01" if little else b"\x02") + b"\x01",
                           2, machine, 1, 0, 52, 0, 0, 52, 32, 2, 0, 0, 0)
        phdrs = b"".join(struct.pack(order + "IIIIIIII", 1, off, va, va, n, n, flags, 0x1000)
                         for flags, off, va, n in ((4, ro_off, ro_va, len(rodata)), (6, rw_off, rw_va, len(headers))))
    assert len(headers) % size == 0
    image = bytearray(head + phdrs)
    image += bytes(ro_off - len(image)) + rodata
    image += bytes(rw_off - len(image)) + headers
    return bytes(image)


# Debian 12's containerd 1.6.20 (-trimpath, no -ldflags record): the version package's variables side by side,
# Package, Revision, Version, as in /usr/bin/containerd there
DEBIAN_1_6 = ["api.proto", "github.com/containerd/containerd", "1.6.20~ds1-1+deb12u3", "1.6.20~ds1", "/var/lib/cni"]


def containerd_binary(root: Path, version: str, style: str = "build-info", real: str = "/usr/bin/containerd") -> Path:
    """A containerd binary at ``real`` under ``root`` that says ``version``: ``build-info`` (Makefile build),
    ``variables`` (a distribution's build, laid out as Debian's: Package, Revision, Version), or
    ``script`` (a ``#!/bin/sh`` that prints what ``containerd --version`` prints: install may run it)."""
    path = root / real.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    if style == "build-info":
        path.write_bytes(go_build_info(version))
    elif style == "variables":
        path.write_bytes(go_string_variables([*DEBIAN_1_6[:2], f"{version}-1+deb12u3", version, DEBIAN_1_6[-1]]))
    elif style == "script":
        path.write_text(f"#!/bin/sh\necho containerd github.com/containerd/containerd {version} {'8' * 40}\n")
    else:
        raise ValueError(style)
    path.chmod(0o755)
    return path


def put(root: Path, real: str, text: str, mode: int = 0o644, owner: tuple[int, int] = (0, 0)) -> Path:
    path = root / real.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    if ROOT:
        os.chown(path, *owner)
    os.utime(path, ns=(MTIME, MTIME))
    return path


def build(root: Path, tree: str) -> None:
    """``tree``: "empty"; "docker-v2" (daemon.json, a v2 containerd config, podman's default hooks dir with
    another hook, /etc/crio whose crio.conf gives CRI-O a hooks directory of its own (CRI-O's default is podman's,
    where install refuses a precreate hook), and systemd); "v3-conf" (a v3 containerd config, containers.conf naming
    /etc/containers/oci/hooks.d, our hook file there with other content, a symlink where a launcher goes)."""
    root.mkdir(parents=True, exist_ok=True)
    if tree == "docker-v2":
        put(root, "/etc/docker/daemon.json", DAEMON_JSON, 0o600, (1234, 5678))
        put(root, "/etc/containerd/config.toml", CONTAINERD_V2, 0o640, (4321, 8765))
        put(root, "/usr/share/containers/oci/hooks.d/other-hook.json", '{"version": "1.0.0"}\n', 0o640)
        (root / "etc/crio/crio.conf.d").mkdir(parents=True)
        put(root, "/etc/crio/crio.conf", '[crio.runtime]\nhooks_dir = ["/etc/crio/hooks.d"]\n')
        (root / "etc/systemd/system").mkdir(parents=True)
    elif tree == "v3-conf":
        put(root, "/etc/containerd/config.toml", CONTAINERD_V3, 0o600)
        put(root, "/etc/containers/containers.conf", CONTAINERS_CONF)
        put(root, "/etc/containers/oci/hooks.d/oci-gpu-hook-precreate.json", '{"the operator": "s own"}\n', 0o600)
        (root / "usr/local/libexec/oci-gpu-hook").mkdir(parents=True)
        (root / "usr/local/libexec/oci-gpu-hook/oci-gpu-runtime").symlink_to("/usr/bin/runc")
        (root / "var/lib").mkdir(parents=True)
    elif tree != "empty":
        raise ValueError(tree)


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No OCI_GPU_HOOK_* of the caller, and never the host's /etc/oci-gpu-hook/config.toml (import it into a test
    module to use it there)."""
    for key in list(os.environ):
        if key.startswith("OCI_GPU_HOOK_") and key != "OCI_GPU_HOOK_BY_PATH_DIR":  # the session's (conftest.py)
            monkeypatch.delenv(key)
    monkeypatch.setenv("OCI_GPU_HOOK_CONFIG", os.devnull)


def snapshot(root: Path, mtimes: bool = False, identity: bool = False) -> dict[str, tuple[Any, ...]]:
    """Every path under root: type, mode, owner, and content or symlink target (and a file's mtime if asked; each
    entry's inode and mtime with ``identity``)."""
    tree: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                what: tuple[Any, ...] = ("symlink", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                what = ("dir",)
            else:
                assert stat.S_ISREG(st.st_mode), path
                what = ("file", Path(path).read_bytes(), *((st.st_mtime_ns,) if mtimes else ()))
            entry = (*what, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
            tree[os.path.relpath(path, root)] = (*entry, st.st_ino, st.st_mtime_ns) if identity else entry
    return tree


SEED_SYSFS = Path(__file__).resolve().parents[2] / "examples" / "hosts" / "seed-8x-gfx1100" / "sys"


def run_install(capsys: pytest.CaptureFixture[str], prefix: Path, *args: str, code: int = 0) -> tuple[str, str]:
    """``oci-gpu-hook install`` of the development tree into ``prefix`` on the seed host, in this process."""
    from oci_gpu_hook.entry import cli

    got = cli.main(["--sysfs-root", str(SEED_SYSFS), "install", "--allow-editable", "--no-native",
                    "--prefix", str(prefix), *args])
    out, err = capsys.readouterr()
    assert got == code, (out, err)
    return out, err


def at(prefix: Path, real: str) -> Path:
    """Where the real path ``real`` lies under ``prefix``."""
    return prefix / real.lstrip("/")

