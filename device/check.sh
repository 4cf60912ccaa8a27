#!/usr/bin/env bash
# The device check: oci-gpu-hook on a real NVIDIA GPU machine, installed from the wheel as the README says, then
# GPU 0 given to a container through every path (the runtime shim, podman's precreate hook, the prestart hook, a
# CDI spec applied as a runtime applies it, the NRI plugin against the NRI test double).  In each container:
# a CUDA kernel through the driver API, `nvidia-smi -L` found through a CUDA image's PATH, an EGL and a Vulkan
# loader finding the NVIDIA ICD, and the device cgroup refusing every other NVIDIA minor.  Then the create
# latency of every path beside bare runc (benchmarks/gpu_create.py --host real).  One PASS/FAIL line each; exit 0
# only if none failed.  device/README.md says how to prepare device/carry and run it in one call.
#
#   device/check.sh                 as root, on the GPU machine (offline: everything comes from device/carry)
#   device/check.sh --fake DIR      on a machine without a GPU, the fake host DIR (examples/hosts/nvidia-4x-h100):
#                                   everything up to the GPU; the CUDA, EGL and Vulkan lines say what a fake
#                                   driver can show (libcuda.so.1 found through the ld cache) or SKIP
#   device/check.sh --no-latency    without the latency table
#
# It never changes the machine: it runs itself again in a private mount namespace whose /etc, /opt, /usr/local,
# /usr/share, /var/lib and /run are overlays with their upper layers in its temporary directory; the venv
# (/opt/oci-gpu-hook), install's files, runc where the machine has none, the CDI spec and the containers' state
# are all there, and go with it.  It reads the device's settings (nvidia-smi -L) and never changes them.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$HERE")
CARRY=${OGH_CARRY:-$HERE/carry}
FAKE=""
LATENCY=1
while [ $# -gt 0 ]; do
    case "$1" in
        --fake) FAKE=$(cd "${2:?--fake needs a host directory}" && pwd) || exit 2; shift 2 ;;
        --no-latency) LATENCY=""; shift ;;
        *) echo "usage: device/check.sh [--fake HOST_DIR] [--no-latency]" >&2; exit 2 ;;
    esac
done

PASS=0
FAIL=0
ok() { echo "PASS: $*"; PASS=$((PASS + 1)); }
bad() { echo "FAIL: $*"; FAIL=$((FAIL + 1)); }
skip() { echo "SKIP: $*"; }
summary() { echo "== $PASS passed, $FAIL failed"; [ "$FAIL" = 0 ]; }

if [ "$(id -u)" != 0 ]; then bad "not root: runc, mounts and device nodes need root"; summary; exit 1; fi
if [ -z "${OGH_CHECK_INNER:-}" ]; then
    if ! command -v unshare >/dev/null; then
        bad "no unshare (util-linux): the check installs in a private mount namespace only"; summary; exit 1
    fi
    args=()
    [ -n "$FAKE" ] && args+=(--fake "$FAKE")
    [ -z "$LATENCY" ] && args+=(--no-latency)
    OGH_CHECK_INNER=1 exec unshare -m --propagation private bash "$0" ${args[@]+"${args[@]}"}
fi

W=$(mktemp -d /tmp/ogh-check.XXXXXX)
RESULTS=${OUT:-$W/results}
mkdir -p "$RESULTS"
MOUNTED=()
CONTAINERS=()
cleanup() {
    local cid i
    for cid in ${CONTAINERS[@]+"${CONTAINERS[@]}"}; do runc delete --force "$cid" >/dev/null 2>&1; done
    [ -n "${PLUGIN:-}" ] && kill "$PLUGIN" 2>/dev/null
    for ((i = ${#MOUNTED[@]} - 1; i >= 0; i--)); do umount "${MOUNTED[i]}" 2>/dev/null; done
    rm -rf "$W"
}
trap cleanup EXIT

echo "== the machine (read only)"
uname -r
echo "cgroup fs: $(stat -fc %T /sys/fs/cgroup 2>&1)"
if [ -z "$FAKE" ]; then
    nvidia-smi -L 2>&1 | head -n 16
    head -n 1 /proc/driver/nvidia/version 2>&1
    ls -l /dev/nvidia* 2>&1 | head -n 20
fi

for dir in /etc /opt /usr/local /usr/share /var/lib /run; do  # the private root: what install and runc write
    [ -d "$dir" ] || continue
    n=${#MOUNTED[@]}
    mkdir -p "$W/ovl/u$n" "$W/ovl/w$n"
    if mount -t overlay overlay -o "lowerdir=$dir,upperdir=$W/ovl/u$n,workdir=$W/ovl/w$n" "$dir"; then
        MOUNTED+=("$dir")
    else
        bad "cannot overlay $dir: the check would write the machine's own"; summary; exit 1
    fi
done
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

echo "== the tools"
PY=""
for candidate in python3 python3.13 python3.12 python3.11; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys, venv; sys.exit(sys.version_info < (3, 11))' \
        2>/dev/null; then PY=$(command -v "$candidate"); break; fi
done
[ -n "$PY" ] && ok "python $("$PY" -V 2>&1) at $PY" || bad "no python3 >= 3.11 with venv"
CC=$(command -v cc || command -v gcc || true)
[ -n "$CC" ] && ok "C compiler $CC" || bad "no C compiler (cc/gcc): ogh-check cannot be built"
if ! command -v runc >/dev/null && [ -x "$CARRY/runc" ]; then  # the carried one, where an operator puts it
    cp "$CARRY/runc" /usr/local/sbin/runc
    [ -f "$CARRY/lib/libseccomp.so.2" ] && cp "$CARRY/lib/libseccomp.so.2" /usr/local/lib/ && ldconfig
fi
if command -v runc >/dev/null && runc --version >/dev/null 2>&1; then
    ok "runc: $(runc --version | head -n 1) at $(command -v runc)"
else
    bad "no runc that runs (install it, or carry device/carry/runc and device/carry/lib/libseccomp.so.2)"
fi
BUSYBOX=$(command -v busybox || true)
if [ -z "$BUSYBOX" ] && [ -x "$CARRY/busybox" ]; then cp "$CARRY/busybox" /usr/local/bin/busybox; BUSYBOX=/usr/local/bin/busybox; fi
[ -n "$BUSYBOX" ] && ok "busybox $BUSYBOX" || bad "no busybox (carry device/carry/busybox, a static one): no shell in the rootfs, no latency table"

echo "== install from the wheel (README: python3 -m venv /opt/oci-gpu-hook, pip install, oci-gpu-hook install)"
VENV=/opt/oci-gpu-hook
[ -d /opt ] || VENV=$W/venv
OGH=$VENV/bin/oci-gpu-hook
LAUNCHERS=/usr/local/libexec/oci-gpu-hook
INSTALLED=""
if [ -n "$PY" ] && "$PY" -m venv "$VENV" >"$RESULTS/venv.log" 2>&1 &&
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-index --find-links "$CARRY/wheels" \
        'oci-gpu-hook[nri]' >>"$RESULTS/venv.log" 2>&1; then
    ln -sf "$OGH" /usr/local/bin/oci-gpu-hook
    mkdir -p /etc/oci-gpu-hook
    {
        if [ -n "$FAKE" ]; then
            echo "sysfs_root = \"$FAKE/sys\""; echo "proc_root = \"$FAKE/proc\""; echo "driver_root = \"$FAKE/driver\""
        fi
        echo 'runtime = "runc"'
        echo "log_file = \"$W/hook.log\""
    } >/etc/oci-gpu-hook/config.toml
    if "$OGH" install --only podman,cdi >"$RESULTS/install.log" 2>&1; then
        INSTALLED=1
        ok "pip install --no-index of the carried wheel, then oci-gpu-hook install --only podman,cdi"
    else
        bad "oci-gpu-hook install: $(tail -n 3 "$RESULTS/install.log" | tr '\n' ' ')"
    fi
else
    bad "venv + pip install --no-index --find-links $CARRY/wheels 'oci-gpu-hook[nri]': $(tail -n 3 "$RESULTS/venv.log" 2>/dev/null | tr '\n' ' ')"
fi

OWN=none UVM=none CAPS=none
if [ -n "$INSTALLED" ]; then
    "$OGH" list >"$RESULTS/list.txt" 2>&1
    cat "$RESULTS/list.txt"
    read -r OWN UVM CAPS < <("$VENV/bin/python" - 2>/dev/null <<'EOF'
from oci_gpu_hook.config import load_config
from oci_gpu_hook.inventory import nvidia, scan_host
config = load_config()
gpus = nvidia.indexed(scan_host(config, ["nvidia"]).devices("nvidia"))
majors = nvidia.char_majors(config.proc_root)
print(gpus[0].minor if gpus else "none", majors.get("nvidia-uvm", "none"), majors.get("nvidia-caps", "none"))
EOF
    )
    OWN=${OWN:-none}
    [ "$OWN" != none ] && ok "the inventory: GPU 0 is /dev/nvidia$OWN (nvidia-uvm major $UVM, nvidia-caps $CAPS)" ||
        bad "no NVIDIA GPU in oci-gpu-hook's inventory"
fi

PROBES=""
for m in $(seq 0 31) 254 255; do PROBES="$PROBES 195:$m"; done
[ "$UVM" != none ] && PROBES="$PROBES $UVM:0 $UVM:1"
[ "$CAPS" != none ] && PROBES="$PROBES $CAPS:1 $CAPS:2 $CAPS:3 $CAPS:4"

echo "== the rootfs: ogh-check, glibc, busybox, the EGL and Vulkan loaders (never the driver's files)"
ROOTFS=$W/rootfs
BUILT=""
if [ -n "$CC" ] && "$CC" -O2 -o "$W/ogh-check" "$HERE/ogh-check.c" -ldl >"$RESULTS/cc.log" 2>&1; then
    mkdir -p "$ROOTFS"/{dev,proc,sys,tmp,etc,bin,lib64,usr/bin,usr/lib/x86_64-linux-gnu}
    ln -s usr/lib "$ROOTFS/lib"
    cp "$W/ogh-check" "$ROOTFS/ogh-check"
    # the loader and libc as ldd names them for ogh-check alone (one file: no "path:" header lines), then the
    # libraries libcuda.so.1 and nvidia-smi need beside libc, from the same directory
    LIBC=$(ldd "$W/ogh-check" | awk '$1 == "libc.so.6" {print $3}')
    LOADER=$(ldd "$W/ogh-check" | awk '$1 ~ /^\/.*ld-linux/ {print $1}')
    if [ -n "$LIBC" ] && [ -n "$LOADER" ]; then
        cp -L "$LOADER" "$ROOTFS/lib64/$(basename "$LOADER")"
        for lib in libc.so.6 libm.so.6 libpthread.so.0 librt.so.1 libdl.so.2 libgcc_s.so.1; do
            [ -e "$(dirname "$LIBC")/$lib" ] && cp -L "$(dirname "$LIBC")/$lib" "$ROOTFS/usr/lib/x86_64-linux-gnu/$lib"
        done
        BUILT=1
    fi
    if [ -n "$BUSYBOX" ]; then
        cp "$BUSYBOX" "$ROOTFS/bin/busybox"
        for applet in sh ls cat; do ln -s busybox "$ROOTFS/bin/$applet"; done
    fi
    # libglvnd0, libegl1, libvulkan1 from Debian (device/README.md: apt-get download), unpacked into the rootfs
    debs=0
    for deb in "$CARRY"/debs/*.deb; do
        [ -e "$deb" ] || continue
        if command -v dpkg-deb >/dev/null; then
            dpkg-deb -x "$deb" "$ROOTFS" && debs=$((debs + 1))
        elif "$PY" - "$deb" "$ROOTFS" <<'EOF'
import io, sys, tarfile
# a .deb is an ar archive ("!<arch>" and a newline, then per member a 60-byte header: name 16, mtime 12, uid 6,
# gid 6, mode 8, size 10, magic 2; data padded to an even length) whose data.tar.* holds the files
blob, at = open(sys.argv[1], "rb").read(), 8
while at + 60 <= len(blob):
    name, size = blob[at:at + 16].decode().strip(), int(blob[at + 48:at + 58])
    if name.rstrip("/").startswith("data.tar"):
        with tarfile.open(fileobj=io.BytesIO(blob[at + 60:at + 60 + size])) as tar:
            tar.extractall(sys.argv[2], **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))
        break
    at += 60 + size + size % 2
else:
    sys.exit(f"{sys.argv[1]}: no data.tar member")
EOF
        then
            debs=$((debs + 1))
        fi
    done
    echo "unpacked $debs loader package(s) from $CARRY/debs"
    printf '/usr/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n' >"$ROOTFS/etc/ld.so.conf"
    ldconfig -r "$ROOTFS" 2>"$RESULTS/ldconfig.log" || BUILT=""
fi
[ -n "$BUILT" ] && ok "rootfs of ogh-check with $(ls "$ROOTFS/usr/lib/x86_64-linux-gnu" | wc -l) libraries and its ld cache" ||
    bad "cannot build the rootfs: $(cat "$RESULTS/cc.log" "$RESULTS/ldconfig.log" 2>/dev/null | tail -n 3 | tr '\n' ' ')"

CUDA_PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
bundle() {  # bundle DIR [prestart]: runc's default spec running ogh-check on a fresh copy of the rootfs
    local dir=$1
    rm -rf "$dir"
    mkdir -p "$dir"
    cp -a "$ROOTFS" "$dir/rootfs"
    runc spec --bundle "$dir" &&
        "$VENV/bin/python" - "$dir" "$PROBES" "$CUDA_PATH" "${2:-}" "$LAUNCHERS/oci-gpu-hook" <<'EOF'
import json, sys
directory, probes, path, prestart, hook = sys.argv[1:]
name = directory + "/config.json"
spec = json.load(open(name))
spec["root"] = {"path": directory + "/rootfs", "readonly": False}
# A CUDA image's PATH (nvidia-smi is found through it) and no LD_LIBRARY_PATH: libraries come through the ld cache
env = [e for e in spec["process"]["env"] if not e.startswith("PATH=")]
spec["process"].update(terminal=False, args=["/ogh-check", *probes.split()],
                       env=[*env, f"PATH={path}", "NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=all"])
for kind in ("bounding", "effective", "permitted"):
    spec["process"]["capabilities"][kind].append("CAP_MKNOD")
spec["mounts"].append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=1777"]})
if prestart:
    spec["hooks"] = {"prestart": [{"path": hook, "args": ["oci-gpu-hook", "prestart"],
                                   "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]}]}
json.dump(spec, open(name, "w"), indent=2)
EOF
}

judge() {  # judge PATH_NAME OUTPUT_FILE EXIT_STATUS
    local name=$1 out=$2 code=$3 nodes number result wrong="" line
    if [ "$code" != 0 ] || ! grep -q '^done$' "$out"; then
        bad "$name: the container did not run to the end (exit $code): $(grep -v '^c ' "$out" | tail -n 4 | tr '\n' ' ')"
        return
    fi
    ok "$name: the container ran"
    nodes=$(grep -E '^node /dev/nvidia[0-9]+ ' "$out" | cut -d' ' -f2 | tr '\n' ' ')
    [ "$nodes" = "/dev/nvidia$OWN " ] && ok "$name: exactly GPU 0's node, /dev/nvidia$OWN" ||
        bad "$name: the container's GPU nodes are '$nodes', not /dev/nvidia$OWN"
    local allowed
    allowed=" $(grep '^node ' "$out" | cut -d' ' -f3 | tr '\n' ' ')"
    while read -r _ number result; do
        case "$allowed" in
            *" $number "*) case "$result" in OPEN | ENXIO) ;; *) wrong="$wrong $number=$result(has-node)" ;; esac ;;
            *) [ "$result" = EPERM ] || wrong="$wrong $number=$result" ;;
        esac
    done < <(grep '^c ' "$out")
    [ -z "$wrong" ] && ok "$name: the device cgroup allows the nodes the container has and refuses every other minor probed" ||
        bad "$name: device access not as granted:$wrong"
    local smi
    smi=$(grep -c '^smi GPU ' "$out")
    [ "$smi" = 1 ] && ok "$name: nvidia-smi -L through a CUDA image's PATH lists one GPU: $(grep '^smi GPU ' "$out" | cut -c5-)" ||
        bad "$name: nvidia-smi -L lists $smi GPUs: $(grep '^smi' "$out" | tail -n 3 | tr '\n' ' ')"
    line=$(grep '^cuda ' "$out" || echo "cuda: no line")
    if [ -n "$FAKE" ]; then  # a fake libcuda.so.1 has no cuInit: that it was found through the ld cache is the check
        case "$line" in *"has no cuInit"*) ok "$name: libcuda.so.1 found through the ld cache (fake driver: no cuInit)" ;;
            *) bad "$name: libcuda.so.1: $line" ;; esac
        skip "$name: CUDA kernel, EGL, Vulkan (fake host: no GPU)"
        return
    fi
    case "$line" in "cuda ok"*) ok "$name: CUDA kernel through the driver API: ${line#cuda ok: }" ;; *) bad "$name: $line" ;; esac
    line=$(grep '^egl ' "$out" || echo "egl: no line")
    case "$line" in "egl ok"*) ok "$name: EGL finds the NVIDIA ICD: ${line#egl ok: }" ;; *) bad "$name: $line" ;; esac
    line=$(grep '^vulkan ' "$out" || echo "vulkan: no line")
    case "$line" in "vulkan ok"*) ok "$name: Vulkan finds the NVIDIA ICD: ${line#vulkan ok: }" ;; *) bad "$name: $line" ;; esac
}

container() {  # container PATH_NAME RUNTIME BUNDLE: `RUNTIME run`, stdout to a file (never a pipe), then judge
    local name=$1 runtime=$2 dir=$3 cid="ogh-check-$$-$1" code
    CONTAINERS+=("$cid")
    timeout 120 "$runtime" run --bundle "$dir" "$cid" </dev/null >"$RESULTS/$name.out" 2>&1
    code=$?
    grep -v '^c ' "$RESULTS/$name.out" | sed "s/^/  $name| /"
    judge "$name" "$RESULTS/$name.out" "$code"
}

if [ -n "$INSTALLED" ] && [ -n "$BUILT" ] && [ "$OWN" != none ]; then
    echo "== the runtime shim ($LAUNCHERS/oci-gpu-runtime run)"
    bundle "$W/shim" && container shim "$LAUNCHERS/oci-gpu-runtime" "$W/shim" || bad "shim: cannot make the bundle"

    echo "== podman's precreate hook (as install wrote it in hooks.d), then runc"
    HOOKS_FILE=$(ls /usr/share/containers/oci/hooks.d/oci-gpu-hook-precreate.json /etc/containers/oci/hooks.d/oci-gpu-hook-precreate.json 2>/dev/null | head -n 1)
    if [ -n "$HOOKS_FILE" ] && bundle "$W/precreate"; then
        read -r -a HOOK < <("$VENV/bin/python" -c 'import json, sys; h = json.load(open(sys.argv[1]))["hook"]; print(h["path"], *h.get("args", [])[1:])' "$HOOKS_FILE")
        if "${HOOK[@]}" <"$W/precreate/config.json" >"$W/precreate/config.new" 2>"$RESULTS/precreate.err"; then
            mv "$W/precreate/config.new" "$W/precreate/config.json"
            container precreate runc "$W/precreate"
        else
            bad "precreate: the hook refused: $(tail -n 2 "$RESULTS/precreate.err" | tr '\n' ' ')"
        fi
    else
        bad "precreate: no hooks.d file from install, or no bundle"
    fi

    echo "== the prestart hook ($LAUNCHERS/oci-gpu-hook prestart), runc run"
    bundle "$W/prestart" prestart && container prestart runc "$W/prestart" || bad "prestart: cannot make the bundle"

    echo "== the CDI spec install wrote, device nvidia.com/gpu=0 applied as a runtime applies it, runc run"
    CDI_SPEC=$(ls /etc/cdi/*nvidia* /var/run/cdi/*nvidia* 2>/dev/null | head -n 1)
    if [ -n "$CDI_SPEC" ] && bundle "$W/cdi" && "$VENV/bin/python" - "$REPO/benchmarks" "$CDI_SPEC" "$W/cdi/config.json" \
        >"$RESULTS/cdi-apply.log" 2>&1 <<'EOF'
import json, sys
sys.path.insert(0, sys.argv[1])
import gpu_create  # the one CDI applier of the benchmarks (benchmarks/gpu_create.py)
import yaml
with open(sys.argv[2]) as handle:
    cdi = yaml.safe_load(handle)  # JSON or YAML
spec = json.load(open(sys.argv[3]))
gpu_create.apply_cdi(spec, cdi, "0")
json.dump(spec, open(sys.argv[3], "w"), indent=2)
EOF
    then
        echo "CDI spec: $CDI_SPEC"
        container cdi runc "$W/cdi"
    else
        bad "cdi: no spec from install in /etc/cdi or /var/run/cdi, or it does not apply: $(tail -n 2 "$RESULTS/cdi-apply.log" 2>/dev/null | tr '\n' ' ')"
    fi

    echo "== the NRI plugin (oci-gpu-hook nri) against the NRI test double, its adjustment applied, runc run"
    if command -v containerd >/dev/null; then echo "(a containerd is here: $(containerd --version 2>&1); the double is used all the same)"; fi
    if bundle "$W/nri" && PYTHONPATH=$REPO timeout 90 "$VENV/bin/python" - "$W/nri.sock" "$W/nri/config.json" \
        "$LAUNCHERS/oci-gpu-hook" >"$RESULTS/nri-adjust.log" 2>&1 <<'EOF'
import json, subprocess, sys
from pathlib import Path
from tests.helpers import nriruntime as nr
socket_path, config, hook = sys.argv[1:]
double = nr.NRIRuntime(Path(socket_path))
plugin = subprocess.Popen([hook, "nri", "--socket", socket_path])
try:
    double.accept()
    spec = json.load(open(config))
    pod = nr.api_pb2.PodSandbox(id="pod-check", name="check", namespace="default", uid="0000-check")
    nr.apply_adjustment(spec, double.create_container(pod, nr.container_of(spec, "ogh-check-nri")))
    json.dump(spec, open(config, "w"), indent=2)
finally:
    double.close()
    plugin.kill()
EOF
    then
        container nri runc "$W/nri"
    else
        bad "nri: the plugin's adjustment: $(tail -n 3 "$RESULTS/nri-adjust.log" | tr '\n' ' ')"
    fi
else
    bad "containers: skipped, as the install, the rootfs or the inventory failed above"
fi

if [ -n "$LATENCY" ]; then
    echo "== create latency per path beside bare runc and the floor (benchmarks/gpu_create.py)"
    HOST=real
    [ -n "$FAKE" ] && HOST=$FAKE
    if [ -n "$INSTALLED" ] && [ -n "$BUSYBOX" ] && PYTHONPATH="" timeout 150 "$VENV/bin/python" "$REPO/benchmarks/gpu_create.py" \
        --host "$HOST" --venv "$VENV" --rounds "${OGH_ROUNDS:-5}" --warmup 1 --cuda-libs 150 >"$RESULTS/latency.txt" 2>&1; then
        grep -E '^\||^(loadavg|install|images|note):' "$RESULTS/latency.txt"
        ok "latency: every path created ${OGH_ROUNDS:-5} times beside bare runc and its floor (the table above)"
    else
        tail -n 20 "$RESULTS/latency.txt" 2>/dev/null
        bad "latency: benchmarks/gpu_create.py did not finish (install, busybox, or the run above)"
    fi
fi
cp "$W/hook.log" "$RESULTS/hook.log" 2>/dev/null
summary
