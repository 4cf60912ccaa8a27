#!/usr/bin/env bash
# Build the oci-gpu-hook container image from this checkout's HEAD commit, offline but for Debian's archive:
#   image/build.sh [OUTPUT]      (default: image/out/oci-gpu-hook-VERSION.oci.tar)
#   image/build.sh --print       what it would build: version, image reference, environment path, --set
#   OCI_GPU_HOOK_IMAGE_VERSION=V image/build.sh ...   the image of HEAD as version V: the built source's
#                                __version__ and pyproject's version are V (the checkout is not changed), for
#                                an upgrade's test (docs/image.md, Upgrade)
#   image/build.sh [OUTPUT] --also V OUTPUT_V ...      besides, the image of HEAD as version V (as above), from the
#                                same two roots: one build's time and a builder's run of stage-env.sh more, not
#                                a second build (the two images an upgrade's test needs: .ci/run)
# Writes an OCI image layout tarball naming localhost/oci-gpu-hook:VERSION (VERSION: oci_gpu_hook.__version__),
# for `ctr images import` and `podman load`.  Needs root, mmdebstrap and network access to the Debian mirror
# (OCI_GPU_HOOK_IMAGE_MIRROR, default http://deb.debian.org/debian; suite OCI_GPU_HOOK_IMAGE_SUITE, default
# bookworm); the Python wheels of the package's dependencies come from pip's configured index.
#
# Two roots, both made by mmdebstrap from Debian packages:
#   builder  python3, gcc, patchelf: image/stage-env.sh makes the self-contained environment ENV
#            (/usr/local/libexec/oci-gpu-hook/env-VERSION) and the prebuilt native fronts, once per version;
#            then it is thrown away
#   image    Debian's essential packages (sh, cp, mv for the DaemonSet's copy-environment); each version's image
#            is a copy of it with that version's ENV at /opt/oci-gpu-hook, ENV's path a link to it; no compiler,
#            no apt, no pip
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
ref=localhost/oci-gpu-hook:$version
env_dir=/usr/local/libexec/oci-gpu-hook/env-$version
launcher_dir=$(dirname "$env_dir")
# the install command's --set arguments in examples/kubernetes/daemonset.yaml (tests/test_image.py holds them equal)
daemonset_set=(OCI_GPU_HOOK_ALLOW_ENV_REQUESTS=false)
if [ "${1:-}" = --print ]; then  # what it builds, without building (tests/test_image.py)
    printf 'version=%s\nref=%s\nenv=%s\nset=%s\n' "$version" "$ref" "$env_dir" "${daemonset_set[*]}"
    exit 0
fi
output=$repo/image/out/oci-gpu-hook-$version.oci.tar
case ${1:-} in --also | "") ;; *) output=$1; shift ;; esac
versions=("$version") outputs=("$output")
while [ $# -gt 0 ]; do
    if [ "$1" != --also ] || [ $# -lt 3 ]; then
        echo "image/build.sh: usage: image/build.sh [OUTPUT] [--also VERSION OUTPUT]... (or --print)" >&2
        exit 1
    fi
    versions+=("$2") outputs+=("$3")
    shift 3
done
for v in "${versions[@]}"; do
    case $v in
        *[!0-9a-z.+]* | "" | .* ) echo "image/build.sh: $v is not a version (digits, letters, dots)" >&2
                                  exit 1 ;;
    esac
done
if [ "$(printf '%s\n' "${versions[@]}" | sort | uniq -d)" ]; then
    echo "image/build.sh: a version given twice: ${versions[*]}" >&2
    exit 1
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
builder_hooks=(--customize-hook="copy-in $repo/image/stage-env.sh /tmp")
for v in "${versions[@]}"; do
    mkdir -p "$work/src-$v" "$work/wheels-$v"
    git -C "$repo" archive --format=tar HEAD | tar -x -C "$work/src-$v"
    if [ "$v" != "$source_version" ]; then  # another version: the two places that hold it
        sed -i "s/^__version__ = \"$source_version\"$/__version__ = \"$v\"/" "$work/src-$v/oci_gpu_hook/__init__.py"
        sed -i "s/^version = \"$source_version\"$/version = \"$v\"/" "$work/src-$v/pyproject.toml"
        grep -qx "__version__ = \"$v\"" "$work/src-$v/oci_gpu_hook/__init__.py"
        grep -qx "version = \"$v\"" "$work/src-$v/pyproject.toml"
    fi
    if [ "$v" = "$version" ]; then  # the package and its dependencies' wheels
        "$python" -m pip wheel -q --disable-pip-version-check --no-build-isolation -w "$work/wheels-$v" \
            "$work/src-$v[device-plugin]" 2>&1 | grep -v "^WARNING: Location" || true
    else  # another version of the same source: its package's wheel, the same dependencies' (the first's)
        "$python" -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps -w "$work/wheels-$v" \
            "$work/src-$v" 2>&1 | grep -v "^WARNING: Location" || true
        find "$work/wheels-$version" -name '*.whl' ! -name "oci_gpu_hook-$version-*" -exec cp {} "$work/wheels-$v/" \;
    fi
    ls "$work/wheels-$v"/oci_gpu_hook-"$v"-*.whl >/dev/null
    # in the builder, one after the other: each version's environment at its own path (stage-env.sh)
    builder_hooks+=(--customize-hook="copy-in $work/wheels-$v /tmp"
        --customize-hook="chroot \"\$1\" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH \
            sh /tmp/stage-env.sh $launcher_dir/env-$v /tmp/wheels-$v $v ${daemonset_set[*]}"
        --customize-hook="sync-out $launcher_dir/env-$v $work/env-$v")
done

echo "== builder root ($suite) and the environment (${versions[*]})"
mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,gcc,libc6-dev,patchelf \
    "${builder_hooks[@]}" "$suite" "$work/builder" "$mirror"
rm -rf --one-file-system "$work/builder"

echo "== image root"
mmdebstrap --quiet --variant=essential \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --customize-hook='rm -rf "$1"/var/log/* "$1"/var/cache/ldconfig/aux-cache "$1"/var/lib/dpkg/*-old \
        "$1"/etc/machine-id "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    "$suite" "$work/root" "$mirror"
# after mmdebstrap, which mounts device nodes and /tmp into the root while its hooks run: a container runtime
# makes /dev itself, and the layer holds no device node
find "$work/root/dev" "$work/root/tmp" -mindepth 1 -delete

layout() {  # VERSION OUTPUT: the image root with VERSION's environment at /opt/oci-gpu-hook, its path a link there
    local v=$1 output=$2 root=$work/root-$1
    cp -a "$work/root" "$root"
    mkdir -p "$root/opt/oci-gpu-hook" "$root$launcher_dir"
    cp -a "$work/env-$v/." "$root/opt/oci-gpu-hook/"
    ln -s /opt/oci-gpu-hook "$root$launcher_dir/env-$v"
    "$python" - "$repo" "$root" "$output" "localhost/oci-gpu-hook:$v" <<'PYTHON'
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[1])
from tests.helpers import ocilayout  # noqa: E402

ocilayout.build(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], cmd=["/opt/oci-gpu-hook/bin/oci-gpu-hook", "--help"],
                env=["PATH=/opt/oci-gpu-hook/bin:/usr/sbin:/usr/bin:/sbin:/bin"])
PYTHON
    echo "image: $output (localhost/oci-gpu-hook:$v, $(du -h "$output" | cut -f1), $(( $(date +%s) - start )) s)"
}

echo "== OCI layout (${versions[*]}, at once: each a tar and a gzip of its own)"
pids=()
for i in "${!versions[@]}"; do
    layout "${versions[$i]}" "${outputs[$i]}" &
    pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do
    wait "$pid" || failed=1
done
[ "$failed" = 0 ] || { echo "image/build.sh: an OCI layout failed (above)" >&2; exit 1; }
