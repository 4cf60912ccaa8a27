"""An OCI image layout tarball from a rootfs directory, with the standard library only.

``ctr image import`` takes it as is: ``oci-layout``, ``index.json`` (the image
named by its ``org.opencontainers.image.ref.name`` annotation) and
``blobs/sha256/`` holding the manifest, the image config and one gzip layer.
Used to load containerlib's busybox rootfs (with ``/probe.sh``) into containerd.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
import stat
import tarfile
from pathlib import Path

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
REF_NAME = "org.opencontainers.image.ref.name"

_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le",
         "s390x": "s390x", "riscv64": "riscv64"}


def host_architecture() -> str:
    """The host's architecture in OCI (GOARCH) spelling: containerd only runs images of its platform."""
    machine = platform.machine()
    return _ARCH.get(machine, machine)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def layer_tar(rootfs: Path) -> bytes:
    """An uncompressed, reproducible tar of ``rootfs`` (root-owned, fixed mtime, sorted, no device nodes)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory, dirs, files in os.walk(rootfs):
            dirs.sort()
            for name in sorted(dirs + files):
                path = Path(directory) / name
                mode = path.lstat().st_mode
                if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                    raise ValueError(f"{path}: only directories, regular files and symlinks go into the layer")
                info = tar.gettarinfo(str(path), arcname=str(path.relative_to(rootfs)))
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mtime = 0
                if info.isreg():
                    with open(path, "rb") as handle:
                        tar.addfile(info, handle)
                else:
                    tar.addfile(info)
    return buffer.getvalue()


def build(rootfs: Path, output: Path, ref: str, *, compress: bool = True,
          cmd: list[str] | None = None, env: list[str] | None = None) -> Path:
    """Write the OCI layout tarball of ``rootfs`` to ``output``, naming the image ``ref``; return ``output``.

    ``ref`` should be a full reference (``docker.io/library/name:tag``): ``ctr image import`` keeps those
    as they are and prefixes bare tags with ``import-DATE``.
    """
    diff = layer_tar(rootfs)
    layer = gzip.compress(diff, mtime=0) if compress else diff
    config = {
        "architecture": host_architecture(),
        "os": "linux",
        "config": {"Env": env or ["PATH=/bin"], "Cmd": cmd or ["/bin/sh"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [_digest(diff)]},
        "history": [{"created_by": "tests/helpers/ocilayout.py"}],
    }
    config_blob = json.dumps(config, sort_keys=True).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, "digest": _digest(config_blob), "size": len(config_blob)},
        "layers": [{"mediaType": LAYER_GZIP if compress else LAYER_TAR, "digest": _digest(layer),
                    "size": len(layer)}],
    }
    manifest_blob = json.dumps(manifest, sort_keys=True).encode()
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": [{
            "mediaType": MANIFEST, "digest": _digest(manifest_blob), "size": len(manifest_blob),
            "platform": {"architecture": host_architecture(), "os": "linux"},
            "annotations": {REF_NAME: ref},
        }],
    }
    entries = [
        ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
        ("index.json", json.dumps(index, sort_keys=True).encode()),
    ]
    for blob in (manifest_blob, config_blob, layer):
        entries.append((f"blobs/sha256/{_digest(blob).partition(':')[2]}", blob))
    output.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(output, "w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return output


def read(archive: Path) -> dict[str, object]:
    """The layout's parts back (index, manifest, config, layer member names), for checking a tarball."""
    with tarfile.open(archive) as tar:
        def blob(digest: str) -> bytes:
            handle = tar.extractfile(f"blobs/sha256/{digest.partition(':')[2]}")
            assert handle is not None
            data = handle.read()
            assert _digest(data) == digest, f"blob {digest} does not match its digest"
            return data

        layout = json.loads(tar.extractfile("oci-layout").read())  # type: ignore[union-attr]
        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        manifest = json.loads(blob(index["manifests"][0]["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
        layer = blob(manifest["layers"][0]["digest"])
    if manifest["layers"][0]["mediaType"] == LAYER_GZIP:
        layer = gzip.decompress(layer)
    assert config["rootfs"]["diff_ids"] == [_digest(layer)], "diff_id is not the uncompressed layer's digest"
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        members = tar.getnames()
    return {"oci-layout": layout, "index": index, "manifest": manifest, "config": config, "members": members}
