#!/usr/bin/env bash
# Reproducibility check: build the image of HEAD twice and compare the two builds file by file.
#   image/check.sh [FIRST.oci.tar [SECOND.oci.tar]]   (an archive given is used, a missing one is built)
# Prints each file that differs (path, type, mode, owner, size, SHA-256, link target) and exits 1 if any does;
# else the image digests of both.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/oci-gpu-hook-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
first=${1:-$work/first.oci.tar}
second=${2:-$work/second.oci.tar}
[ -e "$first" ] || "$repo/image/build.sh" "$first"
[ -e "$second" ] || "$repo/image/build.sh" "$second"
python=${PYTHON:-$( [ -x "$repo/.venv/bin/python" ] && echo "$repo/.venv/bin/python" || echo python3)}
"$python" - "$first" "$second" <<'PYTHON'
import gzip
import hashlib
import io
import json
import sys
import tarfile


def files(archive: str) -> tuple[str, dict[str, tuple[object, ...]]]:
    with tarfile.open(archive) as outer:
        def blob(digest: str) -> bytes:
            return outer.extractfile(f"blobs/sha256/{digest.partition(':')[2]}").read()

        index = json.loads(outer.extractfile("index.json").read())
        manifest_digest = index["manifests"][0]["digest"]
        manifest = json.loads(blob(manifest_digest))
        layer = blob(manifest["layers"][0]["digest"])
    if layer[:2] == b"\x1f\x8b":
        layer = gzip.decompress(layer)
    found = {}
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        for member in tar:
            data = tar.extractfile(member).read() if member.isreg() else b""
            found[member.name] = (member.type, oct(member.mode), member.uid, member.gid, member.size,
                                  hashlib.sha256(data).hexdigest(), member.linkname, member.mtime)
    return manifest_digest, found


(digest_a, a), (digest_b, b) = files(sys.argv[1]), files(sys.argv[2])
differ = sorted(name for name in a.keys() | b.keys() if a.get(name) != b.get(name))
for name in differ:
    print(f"differs: {name}: {a.get(name)} | {b.get(name)}")
print(f"{len(a)} files, {len(differ)} differ; manifests {digest_a} {digest_b}")
sys.exit(1 if differ else 0)
PYTHON
