"""Host trees for the install tests: what a node already has where install writes (under a prefix)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

ROOT = os.geteuid() == 0
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
    another hook, /etc/crio and systemd); "v3-conf" (a v3 containerd config, containers.conf naming
    /etc/containers/oci/hooks.d, our hook file there with other content, a symlink where a launcher goes)."""
    root.mkdir(parents=True, exist_ok=True)
    if tree == "docker-v2":
        put(root, "/etc/docker/daemon.json", DAEMON_JSON, 0o600, (1234, 5678))
        put(root, "/etc/containerd/config.toml", CONTAINERD_V2, 0o640, (4321, 8765))
        put(root, "/usr/share/containers/oci/hooks.d/other-hook.json", '{"version": "1.0.0"}\n', 0o640)
        (root / "etc/crio/crio.conf.d").mkdir(parents=True)
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
        if key.startswith("OCI_GPU_HOOK_"):
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
