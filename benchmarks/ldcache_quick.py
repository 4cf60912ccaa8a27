"""A quick, interleaved look at the ld-cache step (not the formal benchmark: startup.py is that).

    unshare -m --propagation private .venv/bin/python benchmarks/ldcache_quick.py step 21 OLD_TREE
    unshare -m --propagation private .venv/bin/python benchmarks/ldcache_quick.py create 15 OLD_TREE [--big]

``OLD_TREE``: a directory holding an older ``oci_gpu_hook`` package (``git archive 3e935aa oci_gpu_hook | tar -x -C
OLD_TREE``), whose ``appliers/mounts.py`` ran ``ldconfig -r``.  Run in a private mount namespace: ``--big`` and
``step`` mount an overlay of this machine's ``/usr/lib/x86_64-linux-gnu`` into a root there.

``step``: the step alone, in process (what the hook does once its interpreter is up): the old ``update_ldcache``
(``ldconfig -r``, a fork and an exec) against the merge, on a busybox-like root without a cache and on a root
holding this machine's shared objects and the cache ``ldconfig -r`` wrote for them; "again" is the merge where the
cache already lists the driver (nothing written).

``create``: ``runc create`` of a container on the fake nvidia-h100 host (GPU 1, its spec as the shim rewrites it:
nodes, the driver's mounts, the ``ldcache`` createRuntime hook), medians of interleaved runs: floor (no hook),
``/bin/true`` as the hook (what runc's running of any hook costs), the old and the new hook each as a Python start
of ``oci_gpu_hook.entry.cli`` from its tree, and this checkout's native front with the resident planner serving
the hook; for the breakdown, the front alone (a ``links`` hook with no link) and the planner serving an ``ldcache``
hook with nothing to make.  The rootfs's cache is put back before each run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
WORK = Path("/tmp/oci-gpu-hook-ldcache-quick")
LIBDIR = "/usr/lib/x86_64-linux-gnu"


def overlay(target: Path, work: Path) -> None:
    for sub in ("upper", "work"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={LIBDIR},upperdir={work / 'upper'},workdir={work / 'work'}", str(target)], check=True)


def step(runs: int, old_tree: str) -> None:
    from oci_gpu_hook.appliers import mounts as new
    from tests.test_ldcache_merge import add_driver, make_image

    spec = importlib.util.spec_from_file_location("old_mounts", f"{old_tree}/oci_gpu_hook/appliers/mounts.py")
    assert spec is not None and spec.loader is not None
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    small, big = WORK / "small", WORK / "big"
    make_image(small, "busybox", "none")
    make_image(big)
    overlay(big / LIBDIR[1:], WORK / "overlay")
    subprocess.run(["ldconfig", "-r", str(big)], check=True)
    for name, root in (("busybox-like", small), ("this machine's libraries", big)):
        libs = add_driver(root, LIBDIR)
        cache = root / "etc" / "ld.so.cache"
        pristine = cache.read_bytes() if cache.exists() else None
        count = len([p for p in (root / LIBDIR[1:]).iterdir() if ".so" in p.name])
        times: dict[str, list[float]] = {"old": [], "new": [], "again": []}
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        for _ in range(runs):
            for which in ("old", "new"):
                if pristine is None:
                    cache.unlink(missing_ok=True)
                else:
                    cache.write_bytes(pristine)
                start = time.perf_counter()
                if which == "old":
                    old.update_ldcache(fd, str(root), (LIBDIR,))
                else:
                    new.update_ldcache(fd, str(root), (LIBDIR,), libs)
                times[which].append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            new.update_ldcache(fd, str(root), (LIBDIR,), libs)
            times["again"].append((time.perf_counter() - start) * 1000)
        os.close(fd)
        print(f"{name} ({count} .so files in {LIBDIR}, a cache of {len(pristine or b'')} bytes): "
              + ", ".join(f"{k} median {statistics.median(v):.1f} ms" for k, v in times.items()))


def create(runs: int, old_tree: str, big: bool) -> None:
    os.environ.setdefault("OCI_GPU_HOOK_BY_PATH_DIR", str(WORK / "by-path"))
    from tests.containers.test_nvidia_hosts import host_setup, make_rootfs
    from tests.helpers import containerlib as cl
    from tests.test_planner import make_install, start_planner

    nv = host_setup(WORK / "nv", "nvidia-h100")
    model = nv["model"]
    rootfs = make_rootfs(WORK / "rootfs", model)
    if big:
        overlay(rootfs / LIBDIR[1:], WORK / "overlay")
        (rootfs / "etc" / "ld.so.conf").write_text(f"{LIBDIR}\n")
        subprocess.run(["ldconfig", "-r", str(rootfs)], check=True)
    cache = rootfs / "etc" / "ld.so.cache"
    pristine = cache.read_bytes() if cache.exists() else None
    bundle = cl.make_bundle(WORK / "bundle", rootfs, ["NVIDIA_VISIBLE_DEVICES=1"], ["/bin/true"])
    done = subprocess.run([str(nv["hook"]), "dry-run", str(bundle)], capture_output=True, text=True,
                          env=cl.hook_env(), check=True)
    spec = json.loads(done.stdout)
    spec["root"]["readonly"] = False
    hook = next(h for h in spec["hooks"]["createRuntime"] if h["args"][1] == "ldcache")
    others = [h for h in spec["hooks"]["createRuntime"] if h is not hook]
    install = make_install(WORK / "install", runtime="runc",
                           host=f'sysfs_root = "{model.base / "sys"}"\nproc_root = "{model.base / "proc"}"\n'
                                f'driver_root = "{model.base / "driver"}"\n')
    variants: dict[str, dict[str, object] | None] = {"floor": None, "true-hook": {**hook, "path": "/bin/true"}}
    for name, tree in (("old", old_tree), ("new", str(REPO))):
        wrapper = WORK / f"hook-{name}"
        wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={tree} exec {sys.executable} -m oci_gpu_hook.entry.cli "$@"\n')
        wrapper.chmod(0o755)
        args = [a for a in hook["args"] if name == "new" or not a.startswith("--lib=")]  # no --lib before
        variants[name] = {**hook, "path": str(wrapper), "args": args}
    front = str(install["native"] / "oci-gpu-hook")
    # the breakdown: the native front alone (a links hook with no link: no Python, no planner), the planner's round
    # trip and worker with nothing to make (ldcache without arguments: config.json read, no namespace helper)
    variants["front-alone"] = {**hook, "path": front, "args": ["oci-gpu-hook", "links"]}
    variants["planner-noop"] = {**hook, "path": front, "args": ["oci-gpu-hook", "ldcache"]}
    variants["planner"] = {**hook, "path": front}
    running = start_planner(install)
    times: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for i in range(runs + 1):  # the first round warms up
            for name, chosen in variants.items():
                hooks = [*others, *([chosen] if chosen else [])]
                spec["hooks"]["createRuntime"] = hooks
                (bundle / "config.json").write_text(json.dumps(spec))
                for leftover in (cache, rootfs / "etc" / "ld.so.conf.d" / "00-oci-gpu-hook.conf"):
                    leftover.unlink(missing_ok=True)
                if pristine is not None:
                    cache.write_bytes(pristine)
                cid = f"ldcache-quick-{os.getpid()}-{name}-{i}"
                log = WORK / "runc.log"
                start = time.perf_counter()
                done = subprocess.run(["runc", "--log", str(log), "create", "--bundle", str(bundle), cid],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      env=cl.hook_env())
                took = (time.perf_counter() - start) * 1000
                subprocess.run(["runc", "delete", "-f", cid], capture_output=True)
                assert done.returncode == 0, (name, log.read_text()[-2000:])
                if i:
                    times[name].append(took)
    finally:
        running.stop()
    for name, values in times.items():
        print(f"{name:9} median {statistics.median(values):6.1f} ms  (n={len(values)}, min {min(values):.1f}, "
              f"max {max(values):.1f})")


if __name__ == "__main__":
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    mode, count, tree = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if mode == "step":
        step(count, tree)
    else:
        create(count, tree, "--big" in sys.argv)
