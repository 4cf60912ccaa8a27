#!/usr/bin/env bash
# The NVIDIA check on a lent GPU host (an H200): one container through the runtime shim and one through the CDI
# spec, each with GPU 0 only.  Inside each: `nvidia-smi -L` lists exactly one GPU, libcuda.so.1's
# cuDeviceGetCount says 1, and the device cgroup refuses every other NVIDIA minor (EPERM) while GPU 0's node,
# /dev/nvidiactl and /dev/nvidia-uvm open.  It only reads the device's settings (MIG, persistence, clocks: never
# touched) and writes only under its own temporary directory.
#
#   device/check-h200.sh              (as root, from anywhere; prints PASS/FAIL lines, exit 0 only if all pass)
#
# Needs python3 >= 3.11, a C compiler, runc (or device/carry/runc with device/carry/lib/libseccomp.so.2: copy this
# machine's /usr/sbin/runc and /lib/x86_64-linux-gnu/libseccomp.so.2 there, ignore device/carry in
# .git/info/exclude, name it in the run's carry), a kernel with cgroups (not gVisor).  podman is optional: without
# it (or with OGH_NO_PODMAN=1) the CDI spec's edits are applied to the bundle by this script (as podman would) and
# run with runc.
# OGH_DRIVER_ROOT, OGH_PROC_ROOT and OGH_SYSFS_ROOT point elsewhere than /, /proc and /sys.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
CARRY=$REPO/device/carry
W=$(mktemp -d /tmp/ogh-h200.XXXXXX)
trap 'rm -rf "$W"' EXIT
RESULTS=${OUT:-/tmp/ogh-h200-results}
mkdir -p "$RESULTS"
PASS=0
FAIL=0
ok() { echo "PASS: $*"; PASS=$((PASS + 1)); }
bad() { echo "FAIL: $*"; FAIL=$((FAIL + 1)); }
stop() { echo "STOP: $*"; echo "== $PASS passed, $((FAIL + 1)) failed"; exit 1; }

echo "== the machine (read only)"
uname -r
command -v nvidia-smi >/dev/null && nvidia-smi -L
head -n 1 "${OGH_PROC_ROOT:-/proc}/driver/nvidia/version" 2>&1
ls "${OGH_PROC_ROOT:-/proc}/driver/nvidia/gpus" 2>&1
grep -E ' nvidia' "${OGH_PROC_ROOT:-/proc}/devices"
echo "cgroup fs: $(stat -fc %T /sys/fs/cgroup 2>&1)"
ls -l /dev/nvidia* 2>&1

PY=
for candidate in python3 python3.13 python3.12 python3.11; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        PY=$(command -v "$candidate")
        break
    fi
done
[ -n "$PY" ] || stop "no python3 >= 3.11"
CC=$(command -v cc || command -v gcc) || stop "no C compiler"
mkdir -p "$W/bin"
if command -v runc >/dev/null; then
    ln -s "$(command -v runc)" "$W/bin/runc"
elif [ -x "$CARRY/runc" ]; then
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$CARRY/lib" "$CARRY/runc" >"$W/bin/runc"
    chmod 755 "$W/bin/runc"
else
    stop "no runc (install it, or carry device/carry/runc and device/carry/lib/libseccomp.so.2)"
fi
"$W/bin/runc" --version | head -n 1 || stop "runc does not run here"

cat >"$W/config.toml" <<EOF
sysfs_root = "${OGH_SYSFS_ROOT:-/sys}"
proc_root = "${OGH_PROC_ROOT:-/proc}"
driver_root = "${OGH_DRIVER_ROOT:-/}"
runtime = "$W/bin/runc"
hook_path = "$W/hook/oci-gpu-hook"
log_file = "$W/hook.log"
backends = ["nvidia"]
EOF
export OCI_GPU_HOOK_CONFIG=$W/config.toml
export PYTHONPATH=$REPO
"$PY" -m oci_gpu_hook.entry.cli launchers "$W/hook" --allow-editable --no-native \
    --set "OCI_GPU_HOOK_CONFIG=$W/config.toml" >/dev/null || stop "cannot write the launchers"
"$W/hook/oci-gpu-hook" list || stop "the inventory failed"

# GPU 0's minor, and what to probe: every NVIDIA minor 0..31, modeset, ctl, uvm's and the first nvidia-caps minors
read -r OWN UVM CAPS < <("$PY" - <<'EOF'
from oci_gpu_hook.config import load_config
from oci_gpu_hook.inventory import nvidia, scan_host
config = load_config()
gpus = nvidia.indexed(scan_host(config, ["nvidia"]).devices("nvidia"))
majors = nvidia.char_majors(config.proc_root)
print(gpus[0].minor if gpus else "none", majors.get("nvidia-uvm", "none"), majors.get("nvidia-caps", "none"))
EOF
)
[ "$OWN" != none ] || stop "no NVIDIA GPU in the inventory"
FRONT=195
PROBES="$(for m in $(seq 0 31) 254 255; do printf '%s:%s ' $FRONT "$m"; done)"
[ "$UVM" != none ] && PROBES="$PROBES $UVM:0 $UVM:1"
[ "$CAPS" != none ] && PROBES="$PROBES $CAPS:1 $CAPS:2 $CAPS:3 $CAPS:4"
echo "GPU 0 is minor $OWN; nvidia-uvm major $UVM, nvidia-caps major $CAPS"

"$CC" -O2 -o "$W/ogh-check" "$REPO/device/ogh-check.c" -ldl || stop "cannot build ogh-check"

rootfs() {  # a rootfs of ogh-check and the C library it and the host's nvidia-smi need (never the driver's files)
    local root=$1 lib
    mkdir -p "$root"/{dev,proc,sys,tmp,etc,bin}
    cp "$W/ogh-check" "$root/ogh-check"
    for lib in $(ldd "$W/ogh-check" $(command -v nvidia-smi || true) 2>/dev/null | grep -o '/[^ ]*' | sort -u); do
        case "$(basename "$lib")" in libnvidia*|libcuda*) continue ;; esac
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done
}

bundle() {  # bundle DIR [ENV...]: runc's default spec running ogh-check, with CAP_MKNOD and a dev tmpfs on /tmp
    local dir=$1
    shift
    mkdir -p "$dir"
    rootfs "$dir/rootfs"
    "$W/bin/runc" spec --bundle "$dir"
    "$PY" - "$dir" "$PROBES" "$@" <<'EOF'
import json, sys
path = sys.argv[1] + "/config.json"
spec = json.load(open(path))
spec["root"] = {"path": sys.argv[1] + "/rootfs", "readonly": False}
spec["process"].update(terminal=False, args=["/ogh-check", *sys.argv[2].split()])
spec["process"]["env"] += sys.argv[3:]
for kind in ("bounding", "effective", "permitted"):
    spec["process"]["capabilities"][kind].append("CAP_MKNOD")
spec["mounts"].append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=1777"]})
json.dump(spec, open(path, "w"), indent=2)
EOF
}

judge() {  # judge NAME OUTPUT [MAJOR:MINOR also allowed]
    local name=$1 out=$2 extra=${3:-none} number result wrong=""
    grep -q '^done$' "$out" || { bad "$name: the container did not finish: $(tail -n 3 "$out" | tr '\n' ' ')"; return; }
    local gpus
    gpus=$(grep -c '^smi GPU ' "$out")
    [ "$gpus" = 1 ] && ok "$name: nvidia-smi -L lists exactly one GPU" || bad "$name: nvidia-smi -L lists $gpus GPUs"
    grep -q '^cuda init=0 count=1 ' "$out" && ok "$name: cuDeviceGetCount = 1" ||
        bad "$name: CUDA says $(grep '^cuda' "$out")"
    while read -r _ number result; do
        case "$number" in
            "$FRONT:$OWN" | "$FRONT:255" | "$UVM:0" | "$UVM:1" | "$extra")  # allowed: OPEN (ENXIO: no device behind)
                case "$result" in OPEN | ENXIO) ;; *) wrong="$wrong $number=$result" ;; esac ;;
            *) [ "$result" = EPERM ] || wrong="$wrong $number=$result" ;;
        esac
    done < <(grep '^c ' "$out")
    [ -z "$wrong" ] && ok "$name: the device cgroup allows GPU 0, nvidiactl, nvidia-uvm and refuses every other minor" ||
        bad "$name: device access not as granted:$wrong"
}

echo "== the runtime shim, NVIDIA_VISIBLE_DEVICES=0"
bundle "$W/shim" NVIDIA_VISIBLE_DEVICES=0
timeout 180 "$W/hook/oci-gpu-runtime" run --bundle "$W/shim" "ogh-h200-shim-$$" >"$RESULTS/shim.out" 2>&1
echo "exit $?"
cat "$RESULTS/shim.out" | grep -v '^c '
judge shim "$RESULTS/shim.out"

echo "== the CDI spec, nvidia.com/gpu=0"
mkdir -p "$W/cdi"
"$PY" - "$W/cdi/nvidia.com-gpu.json" <<'EOF' || stop "cannot generate the CDI spec"
import sys
from oci_gpu_hook.appliers import cdi
from oci_gpu_hook.config import load_config
from oci_gpu_hook.inventory import scan_host
config = load_config()
spec = cdi.generate(scan_host(config, ["nvidia"]), "nvidia", config)
open(sys.argv[1], "w").write(cdi.render(spec, "json"))
EOF
if command -v podman >/dev/null && [ -z "${OGH_NO_PODMAN:-}" ]; then
    mkdir -p "$W/nohooks"
    rootfs "$W/podman-rootfs"
    unshare -m sh -c "mkdir -p /run/cdi && mount -t tmpfs none /run/cdi && cp $W/cdi/*.json /run/cdi/ &&
        exec timeout 180 podman --cgroup-manager=cgroupfs --events-backend=none --runtime=$W/bin/runc \
        run --rm --net=none --hooks-dir=$W/nohooks --cap-add MKNOD --tmpfs /tmp:rw,dev,exec \
        --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
        --device nvidia.com/gpu=0 --rootfs $W/podman-rootfs /ogh-check $PROBES" >"$RESULTS/cdi.out" 2>&1
    echo "exit $? (podman)"
else
    echo "(no podman: the spec's edits applied to the bundle by this script, run with runc)"
    bundle "$W/cdi-bundle"
    "$PY" - "$W/cdi/nvidia.com-gpu.json" "$W/cdi-bundle/config.json" <<'EOF'
import json, sys
spec, path = json.load(open(sys.argv[1])), sys.argv[2]
oci = json.load(open(path))
edits = [spec.get("containerEdits", {})] + [d["containerEdits"] for d in spec["devices"] if d["name"] == "0"]
linux = oci.setdefault("linux", {})
for e in edits:
    for n in e.get("deviceNodes", []):
        linux.setdefault("devices", []).append({k: n[k] for k in ("path", "type", "major", "minor", "fileMode", "uid", "gid")})
        linux.setdefault("resources", {}).setdefault("devices", []).append(
            {"allow": True, "type": n["type"], "major": n["major"], "minor": n["minor"], "access": n["permissions"]})
    for m in e.get("mounts", []):
        oci["mounts"].append({"destination": m["containerPath"], "type": m.get("type", "bind"), "source": m["hostPath"],
                              "options": m.get("options", [])})
    for h in e.get("hooks", []):
        oci.setdefault("hooks", {}).setdefault(h["hookName"], []).append({k: v for k, v in h.items() if k != "hookName"})
json.dump(oci, open(path, "w"), indent=2)
EOF
    timeout 180 "$W/bin/runc" run --bundle "$W/cdi-bundle" "ogh-h200-cdi-$$" >"$RESULTS/cdi.out" 2>&1
    echo "exit $? (runc)"
fi
grep -v '^c ' "$RESULTS/cdi.out"
# a CDI spec cannot read NVIDIA_DRIVER_CAPABILITIES: it gives every capability, display's /dev/nvidia-modeset too
judge cdi "$RESULTS/cdi.out" "$(grep -q '"/dev/nvidia-modeset"' "$W/cdi/nvidia.com-gpu.json" && echo "$FRONT:254")"

cp "$W/hook.log" "$RESULTS/hook.log" 2>/dev/null
echo "== $PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]
