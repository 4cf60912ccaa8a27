#!/usr/bin/env bash
# Build the oci-gpu-hook container image from this checkout's HEAD commit, offline but for Debian's archive:
#   image/build.sh [OUTPUT]      (default: image/out/oci-gpu-hook-VERSION.oci.tar)
#   image/build.sh --print       what it would build: version, image reference, environment path, --set
#   OCI_GPU_HOOK_IMAGE_VERSION=V image/build.sh ...   the image of HEAD as version V: the built source's
#                                __version__ and pyproject's version are V (the checkout is not changed), for
#                                an upgrade's test (docs/image.md, Upgrade)
# Writes an OCI image layout tarball naming localhost/oci-gpu-hook:VERSION (VERSION: oci_gpu_hook.__version__),
# for `ctr images import` and `podman load`.  Needs root, mmdebstrap and network access to the Debian mirror
# (OCI_GPU_HOOK_IMAGE_MIRROR, default http://deb.debian.org/debian; suite OCI_GPU_HOOK_IMAGE_SUITE, default
# bookworm); the Python wheels of the package's dependencies come from pip's configured index.
#
# Two roots, both made by mmdebstrap from Debian packages:
#   builder  python3, gcc, patchelf: image/stage-env.sh makes the self-contained environment ENV
#            (/usr/local/libexec/oci-gpu-hook/env-VERSION) and the prebuilt native fronts; then it is thrown away
#   image    Debian's essential packages (sh, cp, mv for the DaemonSet's copy-environment) and ENV at
#            /opt/oci-gpu-hook, with ENV's path a link to it; no compiler, no apt, no pip
# Reproducible: SOURCE_DATE_EPOCH is the commit's time (mmdebstrap and pip honour it, byte code is checked by
# hash), the layer is a sorted tar with fixed owners and times (tests/helpers/ocilayout.py).  image/check.sh
# builds twice and compares.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
suite=${OCI_GPU_HOOK_IMAGE_SUITE:-bookworm}
mirror=${OCI_GPU_HOOK_IMAGE_MIRROR:-http://deb.debian.org/debian}
python=${PYTHON:-$( [ -x "$repo/.venv/bin/python" ] && echo "$repo/.venv/bin/python" || echo python3)}  # needs pip, setuptools and wheel
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/oci_gpu_hook/__init__.py")
[ -n "$version" ] || { echo "image/build.sh: no __version__ in oci_gpu_hook/__init__.py" >&2; exit 1; }
source_version=$version
version=${OCI_GPU_HOOK_IMAGE_VERSION:-$version}
case $version in
    *[!0-9a-z.+]* | "" | .* ) echo "image/build.sh: OCI_GPU_HOOK_IMAGE_VERSION=$version is not a version (digits, letters, dots)" >&2
                      exit 1 ;;
esac
output=${1:-$repo/image/out/oci-gpu-hook-$version.oci.tar}
ref=localhost/oci-gpu-hook:$version
env_dir=/usr/local/libexec/oci-gpu-hook/env-$version
# the install command's --set arguments in examples/kubernetes/daemonset.yaml (tests/test_image.py holds them equal)
daemonset_set=(OCI_GPU_HOOK_ALLOW_ENV_REQUESTS=false)
if [ "${1:-}" = --print ]; then  # what it builds, without building (tests/test_image.py)
    printf 'version=%s\nref=%s\nenv=%s\nset=%s\n' "$version" "$ref" "$env_dir" "${daemonset_set[*]}"
    exit 0
fi

if [ "$(id -u)" != 0 ]; then
    echo "image/build.sh: run it as root (mmdebstrap makes the roots as root)" >&2
    exit 1
fi
command -v mmdebstrap >/dev/null || { echo "image/build.sh: no mmdebstrap (apt-get install mmdebstrap)" >&2; exit 1; }
SOURCE_DATE_EPOCH=$(git -C "$repo" log -1 --format=%ct)
export SOURCE_DATE_EPOCH
work=$(mktemp -d /tmp/oci-gpu-hook-image.XXXXXX)
trap 'rm -rf --one-file-system "$work"' EXIT
start=$(date +%s)

echo "== source and wheels (commit $(git -C "$repo" rev-parse --short HEAD), SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH)"
mkdir -p "$work/src" "$work/wheels"
git -C "$repo" archive --format=tar HEAD | tar -x -C "$work/src"
if [ "$version" != "$source_version" ]; then  # OCI_GPU_HOOK_IMAGE_VERSION: the two places that hold it
    sed -i "s/^__version__ = \"$source_version\"$/__version__ = \"$version\"/" "$work/src/oci_gpu_hook/__init__.py"
    sed -i "s/^version = \"$source_version\"$/version = \"$version\"/" "$work/src/pyproject.toml"
    grep -qx "__version__ = \"$version\"" "$work/src/oci_gpu_hook/__init__.py"
    grep -qx "version = \"$version\"" "$work/src/pyproject.toml"
fi
"$python" -m pip wheel -q --disable-pip-version-check --no-build-isolation -w "$work/wheels" \
    "$work/src[device-plugin]" 2>&1 | grep -v "^WARNING: Location" || true
ls "$work/wheels"/oci_gpu_hook-"$version"-*.whl >/dev/null

echo "== builder root ($suite) and the environment"
mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,gcc,libc6-dev,patchelf \
    --customize-hook="copy-in $work/wheels $repo/image/stage-env.sh /tmp" \
    --customize-hook="chroot \"\$1\" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH \
        sh /tmp/stage-env.sh $env_dir /tmp/wheels $version ${daemonset_set[*]}" \
    --customize-hook="sync-out $env_dir $work/env" \
    "$suite" "$work/builder" "$mirror"
rm -rf --one-file-system "$work/builder"

echo "== image root"
mmdebstrap --quiet --variant=essential \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --customize-hook='mkdir -p "$1/opt/oci-gpu-hook"' --customize-hook="sync-in $work/env /opt/oci-gpu-hook" \
    --customize-hook="mkdir -p \"\$1$(dirname "$env_dir")\" && ln -s /opt/oci-gpu-hook \"\$1$env_dir\"" \
    --customize-hook='rm -rf "$1"/var/log/* "$1"/var/cache/ldconfig/aux-cache "$1"/var/lib/dpkg/*-old \
        "$1"/etc/machine-id "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    "$suite" "$work/root" "$mirror"
# after mmdebstrap, which mounts device nodes and /tmp into the root while its hooks run: a container runtime
# makes /dev itself, and the layer holds no device node
find "$work/root/dev" "$work/root/tmp" -mindepth 1 -delete

echo "== OCI layout"
"$python" - "$repo" "$work/root" "$output" "$ref" <<'PYTHON'
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[1])
from tests.helpers import ocilayout  # noqa: E402

ocilayout.build(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], cmd=["/opt/oci-gpu-hook/bin/oci-gpu-hook", "--help"],
                env=["PATH=/opt/oci-gpu-hook/bin:/usr/sbin:/usr/bin:/sbin:/bin"])
PYTHON
echo "image: $output ($ref, $(du -h "$output" | cut -f1), $(( $(date +%s) - start )) s)"
