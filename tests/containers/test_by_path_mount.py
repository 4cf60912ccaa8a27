"""The by-path links of a rewritten spec in real containers: one read-only bind mount, no createRuntime hook.

runc through the shim (cgroup v1 and v2) and after ``dry-run``, podman through the precreate hook and through the
shim: inside the container ``/dev/dri/by-path`` holds exactly the granted GPUs' ``-card`` and ``-render`` links,
each resolving to the container's own node of that GPU, a write there fails, and the isolation probe passes.
Hostile hosts and images: a by_path_dir or a digest path that root alone did not write is refused with one line
(the container never runs); an image whose ``/dev/dri`` is a symlink out of its root gets the mount inside its
root (runc resolves mount destinations in the rootfs), nothing on the host.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from oci_gpu_hook.appliers import bypath
from tests.helpers import containerlib as cl

pytestmark = pytest.mark.containers

CHECK = r"""#!/bin/sh
for l in /dev/dri/by-path/*; do [ -L "$l" ] && echo "resolves $l $(stat -L -c '%t:%T' "$l" 2>&1)"; done
for n in /dev/dri/card* /dev/dri/renderD*; do [ -c "$n" ] && echo "devnode $n $(stat -c '%t:%T' "$n")"; done
if ln -s ../card1 /dev/dri/by-path/planted 2>/dev/null; then echo "write ln ok"; else echo "write ln refused"; fi
if rm /dev/dri/by-path/* 2>/dev/null; then echo "write rm ok"; else echo "write rm refused"; fi
if touch /dev/dri/by-path/x 2>/dev/null; then echo "write touch ok"; else echo "write touch refused"; fi
while read -r _ _ _ _ point options _; do
  case "$point" in */by-path) echo "mount $point $options";; esac
done < /proc/self/mountinfo
exit 0
"""
ARGS = ["/bin/sh", "-c", "/bin/sh /probe.sh; /bin/sh /check.sh"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    cl.need("runc", "podman", "busybox", "unshare")
    paths = cl.hook_setup(tmp_path_factory.mktemp("bypath"))
    for applet in ("stat", "ln", "rm", "touch"):
        (paths["rootfs"] / "bin" / applet).symlink_to("busybox")
    (paths["rootfs"] / "check.sh").write_text(CHECK)
    paths["hooks_dir"] = cl.write_hooks_dir(paths["base"] / "hooks.d", paths["hook"], paths["config"])
    paths["empty_hooks"] = (paths["base"] / "no-hooks").resolve()
    return paths


def env(by_path_dir: Path | None = None) -> dict[str, str]:
    out = cl.hook_env()
    if by_path_dir is not None:
        out["OCI_GPU_HOOK_BY_PATH_DIR"] = str(by_path_dir)
    return out


def links_of(gpus: list[int]) -> dict[str, str]:
    return {path.rsplit("/", 1)[1]: target for path, target in cl.expected_links(gpus).items()}


def assert_links(output: str, gpus: list[int], v2: bool | None, point: str = "/dev/dri/by-path") -> None:
    """The probe's isolation, exactly these GPUs' links, each on the container's own node, and read-only: one
    mount, at ``point`` (the container's path, as its mountinfo says)."""
    probe = cl.assert_isolated(output, gpus, cgroup_v2=v2)
    assert probe.links == cl.expected_links(gpus), probe.links
    lines = output.splitlines()
    nodes = dict(line.split(" ", 2)[1:] for line in lines if line.startswith("devnode "))
    resolved = dict(line.split(" ", 2)[1:] for line in lines if line.startswith("resolves "))
    assert resolved == {link: nodes["/dev/dri/" + target[3:]] for link, target in probe.links.items()}, \
        (resolved, nodes)
    assert [line for line in lines if line.startswith("write ")] == [
        "write ln refused", "write rm refused", "write touch refused"]
    mounts = [line.split(" ")[1:] for line in lines if line.startswith("mount ")]
    assert len(mounts) == 1 and mounts[0][0] == point, mounts
    assert {"ro", "nosuid", "nodev", "noexec"} <= set(mounts[0][1].split(",")), mounts


def bundle(setup: dict[str, Path], env_vars: list[str], rootfs: Path | None = None) -> Path:
    return cl.make_bundle(setup["base"] / cl.container_id(), rootfs or setup["rootfs"], env_vars, list(ARGS))


def the_directory(setup: dict[str, Path], gpus: list[int]) -> Path:
    """The prepared directory of ``gpus`` on the host: exactly their links, root's, 0755 (under the session's
    by_path_dir, or the config's where the caller's environment did not reach: podman's precreate hook)."""
    name = bypath.digest(links_of(gpus))
    path, *_ = [root / name for root in (Path(os.environ["OCI_GPU_HOOK_BY_PATH_DIR"]), setup["base"] / "by-path")
                if (root / name).is_dir()]
    assert {p.name: os.readlink(p) for p in path.iterdir()} == links_of(gpus)
    assert (path.stat().st_uid, path.stat().st_mode & 0o7777) == (0, 0o755)
    return path


@pytest.mark.parametrize("v2", [False, True], ids=["cgroup-v1", "cgroup-v2"])
@pytest.mark.parametrize(("request_env", "gpus"), [("AMD_VISIBLE_DEVICES=2", [2]), ("AMD_VISIBLE_DEVICES=1,6", [1, 6])])
def test_shim_run(setup: dict[str, Path], v2: bool, request_env: str, gpus: list[int]) -> None:
    path = bundle(setup, [request_env])
    argv = [str(setup["runtime"]), "run", "--bundle", str(path), path.name]
    done = cl.run(cl.cgroup2_wrap(argv) if v2 else argv, env=env())
    assert done.returncode == 0, done.stderr
    assert_links(done.stdout, gpus, v2)
    spec = json.loads((path / "config.json").read_text())
    assert "createRuntime" not in spec.get("hooks", {})  # no hook: one mount, last
    assert spec["mounts"][-1] == bypath.mount(str(the_directory(setup, gpus)))


@pytest.mark.parametrize("v2", [False, True], ids=["cgroup-v1", "cgroup-v2"])
def test_dry_run_then_runc(setup: dict[str, Path], v2: bool) -> None:
    path = bundle(setup, ["AMD_VISIBLE_DEVICES=5"])
    done = cl.run([str(setup["hook"]), "dry-run", str(path)], env=env())
    assert done.returncode == 0, done.stderr
    (path / "config.json").write_text(done.stdout)
    argv = ["runc", "run", "--bundle", str(path), path.name]
    done = cl.run(cl.cgroup2_wrap(argv) if v2 else argv)
    assert done.returncode == 0, done.stderr
    assert_links(done.stdout, [5], v2)


def test_a_cdi_links_hook_beside_the_mount_still_runs(setup: dict[str, Path]) -> None:
    """A spec that also carries the CDI spec's links hook for the same GPU (containerd injected it, then the shim
    rewrote): the hook finds every link already there and right under the read-only mount, and succeeds."""
    path = bundle(setup, ["AMD_VISIBLE_DEVICES=3"])
    spec = json.loads((path / "config.json").read_text())
    spec["hooks"] = {"createRuntime": [{"path": str(setup["hook"]), "args": [
        "oci-gpu-hook", "links", *(f"{p}={t}" for p, t in cl.expected_links([3]).items())],
        "env": ["PATH=/usr/bin:/bin"], "timeout": 10}]}
    (path / "config.json").write_text(json.dumps(spec))
    done = cl.run([str(setup["runtime"]), "run", "--bundle", str(path), path.name], env=env())
    assert done.returncode == 0, done.stderr
    assert_links(done.stdout, [3], None)


def podman(setup: dict[str, Path], *, runtime: str = "runc", hooks: Path | None = None,
           env_vars: list[str]) -> cl.subprocess.CompletedProcess[str]:
    argv = [*cl.PODMAN, f"--runtime={runtime}", f"--hooks-dir={hooks or setup['empty_hooks']}", *cl.PODMAN_RUN]
    for entry in env_vars:
        argv += ["-e", entry]
    return cl.run([*argv, "--rootfs", str(setup["rootfs"]), *ARGS], env=env())


@pytest.mark.parametrize("how", ["precreate", "shim"])
def test_podman(setup: dict[str, Path], how: str) -> None:
    if how == "precreate":
        done = podman(setup, hooks=setup["hooks_dir"], env_vars=["AMD_VISIBLE_DEVICES=4"])
    else:
        done = podman(setup, runtime=str(setup["runtime"]), env_vars=["AMD_VISIBLE_DEVICES=4"])
    assert done.returncode == 0, done.stderr
    assert_links(done.stdout, [4], False)
    the_directory(setup, [4])


# --- hostile hosts ------------------------------------------------------------------------------

def refused(setup: dict[str, Path], by_path_dir: Path, says: str) -> None:
    path = bundle(setup, ["AMD_VISIBLE_DEVICES=2"])
    before = (path / "config.json").read_bytes()
    done = cl.run([str(setup["runtime"]), "run", "--bundle", str(path), path.name], env=env(by_path_dir))
    assert done.returncode == 1 and "done" not in done.stdout, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert (path / "config.json").read_bytes() == before
    assert cl.run(["runc", "state", path.name]).returncode != 0


@pytest.mark.parametrize("how", ["symlink", "not-root"])
def test_a_hostile_by_path_dir_stops_the_container(setup: dict[str, Path], tmp_path: Path, how: str) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "by-path"
    if how == "symlink":
        root.symlink_to(elsewhere)
        says = "is a symlink or not a directory"
    else:
        root.mkdir()
        os.chown(root, 65534, 65534)
        says = "is owned by uid 65534"
    refused(setup, root, says)
    assert list(elsewhere.iterdir()) == [] and (how == "symlink" or list(root.iterdir()) == [])


@pytest.mark.parametrize("how", ["symlink", "not-root"])
def test_a_planted_digest_path_stops_the_container(setup: dict[str, Path], tmp_path: Path, how: str) -> None:
    root = tmp_path / "by-path"
    root.mkdir()
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o755)
    for name, target in links_of([2]).items():
        (planted / name).symlink_to(target)
    digest = root / bypath.digest(links_of([2]))
    if how == "symlink":
        digest.symlink_to(planted)  # exactly the right content, behind a symlink
        says = "is a symlink or not a directory"
    else:
        os.rename(planted, digest)
        os.chown(digest, 65534, 65534)
        says = "is owned by uid 65534"
    refused(setup, root, says)
    assert os.path.lexists(digest)  # refused, never replaced or followed


# --- a hostile image ----------------------------------------------------------------------------

@pytest.mark.parametrize("v2", [False, True], ids=["cgroup-v1", "cgroup-v2"])
@pytest.mark.parametrize("kind", ["absolute", "relative"])
def test_an_image_whose_dev_dri_leaves_its_root(setup: dict[str, Path], tmp_path: Path, v2: bool, kind: str) -> None:
    """The image's own /dev (no /dev tmpfs in the spec) with ``dev/dri`` a symlink to a host directory: runc puts
    the mount inside the rootfs (its resolution stays in the root: here under the container's /tmp tmpfs), the
    host directory stays empty and unmounted, and in the container the links are there and read-only."""
    outside = tmp_path / "outside"
    outside.mkdir()
    rootfs = tmp_path / "rootfs"
    shutil.copytree(setup["rootfs"], rootfs, symlinks=True)
    hops = "../" * (len(rootfs.parts) + 2)
    (rootfs / "dev" / "dri").symlink_to(str(outside) if kind == "absolute" else f"{hops}{str(outside)[1:]}")
    path = bundle(setup, ["AMD_VISIBLE_DEVICES=2"], rootfs)
    spec = json.loads((path / "config.json").read_text())
    spec["mounts"] = [m for m in spec["mounts"] if not m["destination"].startswith("/dev")]
    spec["root"]["readonly"] = False
    (path / "config.json").write_text(json.dumps(spec))
    argv = [str(setup["runtime"]), "run", "--bundle", str(path), path.name]
    done = cl.run(cl.cgroup2_wrap(argv) if v2 else argv, env=env())
    assert list(outside.iterdir()) == [], list(outside.iterdir())
    assert str(outside) not in Path("/proc/self/mountinfo").read_text()
    assert done.returncode == 0, done.stderr
    assert_links(done.stdout, [2], v2, point=f"{outside}/by-path")
