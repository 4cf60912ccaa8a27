#!/usr/bin/env bash
# Fill device/carry (git-ignored, device/.gitignore) with what device/check.sh needs on an offline GPU machine:
#
#   wheels/   this checkout's wheel and its dependencies (the nri extra's protobuf too) as CPython 3.12
#             manylinux x86_64 wheels, for `pip install --no-index --find-links`
#   runc, lib/libseccomp.so.2   this machine's runc and the libseccomp it links (the GPU machine has no runc)
#   busybox   a static busybox (a shell in the rootfs; the benchmark's images)
#   debs/     Debian's libglvnd0, libegl1 and libvulkan1 (apt-get download): the EGL and Vulkan loaders that
#             check.sh unpacks into the container's rootfs, never into the machine's /; and the X client
#             libraries NVIDIA's libGLX_nvidia.so.0 (its Vulkan ICD) links, libx11-6 and what it needs, as a
#             CUDA image with Vulkan installs them
#
#   device/prepare-carry.sh [WHEEL]     (root not needed; PyPI and Debian's archive reached; WHEEL: use that wheel)
#
# PYTHON_VERSION (default 3.12) names the GPU machine's Python.  Everything lands in device/carry (or OGH_CARRY),
# replaced.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$HERE")
CARRY=${OGH_CARRY:-$HERE/carry}  # another folder (OGH_CARRY), e.g. for a dry run with another Python
PYTHON=${PYTHON:-python3}
rm -rf "$CARRY"
mkdir -p "$CARRY/wheels" "$CARRY/lib" "$CARRY/debs"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ $# -ge 1 ]; then
    cp "$1" "$CARRY/wheels/"
else  # the files a clone has (tracked, and untracked that git does not ignore), built into a wheel
    (cd "$REPO" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) | tar -xf - -C "$work"
    "$PYTHON" -m pip wheel -q --no-deps --disable-pip-version-check -w "$CARRY/wheels" "$work"
fi
wheel=$(ls "$CARRY"/wheels/oci_gpu_hook-*.whl)
"$PYTHON" -m pip download -q --disable-pip-version-check --only-binary=:all: -d "$CARRY/wheels" \
    --python-version "${PYTHON_VERSION:-3.12}" --implementation cp --abi "cp$(echo "${PYTHON_VERSION:-3.12}" | tr -d .)" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    "$wheel[nri]"

runc=$(command -v runc)
cp "$runc" "$CARRY/runc"
seccomp=$(ldd "$runc" | awk '$1 ~ /^libseccomp\.so/ {print $3}')
[ -n "$seccomp" ] && cp -L "$seccomp" "$CARRY/lib/libseccomp.so.2"
busybox=$(command -v busybox)
file -L "$busybox" 2>/dev/null | grep -q 'statically linked' || echo "note: $busybox is not static" >&2
cp "$busybox" "$CARRY/busybox"
(cd "$CARRY/debs" && apt-get download libglvnd0 libegl1 libvulkan1 libx11-6 libxext6 libxcb1 libxau6 libxdmcp6 libbsd0 \
    libmd0)
du -sh "$CARRY"
ls "$CARRY" "$CARRY/wheels" "$CARRY/debs"
