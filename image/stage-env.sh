#!/bin/sh
# Runs inside the builder root (image/build.sh): makes ENV, a self-contained Python environment with
# oci-gpu-hook installed, that runs at its own path on any Linux host without the host's libraries.
#   ENV/base        the interpreter: Debian's python3.11, its standard library, every shared library it and
#                   the installed extension modules load (ENV/base/lib/native, with the dynamic loader)
#   ENV             a venv of ENV/base with the wheel and its dependencies (from WHEELS only, no index)
# Every ELF file names ENV/base/lib/native as its loader and library path (absolute: ENV is the same path in
# the image and on the host, see image/build.sh), so the host's /lib is never read.
# Then the native fronts of the DaemonSet's install are compiled into the package (launchers.prebuild_fronts),
# static, so that install picks them without a compiler.
# usage: stage-env.sh ENV WHEELS VERSION SET...
set -eu
env_dir=$1 wheels=$2 version=$3
shift 3
base=$env_dir/base
native=$base/lib/native
py=python3.11
loader=/lib64/ld-linux-x86-64.so.2

mkdir -p "$base/bin" "$native"
cp /usr/bin/$py "$base/bin/$py"
# the standard library without what no command of the package imports, and without Debian's byte code
tar -C /usr/lib -cf - --exclude=__pycache__ --exclude="$py/test" --exclude="$py/idlelib" --exclude="$py/tkinter" \
    --exclude="$py/turtledemo" --exclude="$py/lib2to3" --exclude="$py/ensurepip" --exclude="$py/pydoc_data" \
    --exclude="$py/config-3.11-x86_64-linux-gnu" "$py" | tar -C "$base/lib" -xf -
# Debian links sitecustomize.py to /etc/python3.11/sitecustomize.py: on a node that would run the node's file (or
# name a missing one) at every start with site.  Nothing in ENV may name a path outside it.
find "$base/lib/$py" -type l -lname '/*' -print -delete

# pip runs from a throw-away venv of the builder; the environment gets no pip
python3 -m venv /tmp/tools

libraries() {  # the shared libraries (resolved paths) that the ELF files given load, outside ENV
    for file in "$@"; do
        ldd "$file" 2>/dev/null | sed -n 's/.*=> \(\/[^ ]*\) .*/\1/p'
    done | sort -u | grep -v "^$env_dir/" || true
}

copy_libraries() {
    for lib in $(libraries "$@"); do
        name=$(basename "$lib")
        [ -e "$native/$name" ] || cp -L "$lib" "$native/$name"
    done
}

elf_files() {
    find "$@" -type f \( -name '*.so' -o -name '*.so.*' -o -perm -0100 \) -print | sort | while read -r f; do
        [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = "177ELF" ] && echo "$f"
    done
}

copy_libraries /usr/bin/$py $(elf_files "$base/lib/$py/lib-dynload")
cp -L $loader "$native/$(basename $loader)"
patchelf --set-interpreter "$native/$(basename $loader)" --set-rpath "$native" "$base/bin/$py"

"$base/bin/$py" -m venv --without-pip "$env_dir"
/tmp/tools/bin/python -m pip --python "$env_dir/bin/python3" install -q --disable-pip-version-check --no-index \
    --no-compile --find-links "$wheels" "oci-gpu-hook[device-plugin]==$version"
site=$env_dir/lib/$py/site-packages

# the libraries of the installed extension modules (a manylinux wheel's own libraries stay where it put them)
copy_libraries $(elf_files "$site")
copy_libraries $(elf_files "$native")
# every ELF object looks in ENV/base/lib/native first (RUNPATH, after a wheel's own $ORIGIN paths)
for file in $(elf_files "$base/lib/$py/lib-dynload" "$site" "$native"); do
    case $file in */ld-linux-*) continue ;; esac
    old=$(patchelf --print-rpath "$file")
    patchelf --set-rpath "${old:+$old:}$native" "$file"
done

# byte code for every module, checked by source hash (no time stamps: SOURCE_DATE_EPOCH is set)
"$env_dir/bin/python3" -m compileall -q -j 1 --invalidation-mode checked-hash "$base/lib/$py" "$site" >/dev/null

# the native fronts of the DaemonSet's install (its --set arguments are SET...), static
"$env_dir/bin/python3" -c 'import sys; from oci_gpu_hook.install.launchers import prebuild_fronts
for path in prebuild_fronts(sys.argv[1:], ["-static"]): print("prebuilt:", path)' "$@"
"$env_dir/bin/python3" -m compileall -q --invalidation-mode checked-hash "$site/oci_gpu_hook" >/dev/null
rm -rf /tmp/tools
