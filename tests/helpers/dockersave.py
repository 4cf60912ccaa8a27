"""A ``docker load`` tarball in the docker-save format, built with tarfile: ``manifest.json``, the image
config ``<id>.json`` and ``<layer>/layer.tar``."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

from tests.helpers.ocilayout import host_architecture, layer_tar


def build(rootfs: Path, output: Path, tag: str) -> Path:
    layer = layer_tar(rootfs)
    diff_id = hashlib.sha256(layer).hexdigest()
    config = json.dumps({"architecture": host_architecture(), "os": "linux",
                         "config": {"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]},
                         "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
                         "history": [{"created_by": "tests/helpers/dockersave.py"}]}).encode()
    config_id = hashlib.sha256(config).hexdigest()
    manifest = json.dumps([{"Config": f"{config_id}.json", "RepoTags": [tag],
                            "Layers": [f"{diff_id}/layer.tar"]}]).encode()
    with tarfile.open(output, "w") as tar:
        for name, data in ((f"{diff_id}/layer.tar", layer), (f"{config_id}.json", config),
                           ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return output
