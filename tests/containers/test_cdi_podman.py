"""CDI in real containers: podman consuming the generated spec, and CDI-name requests in annotations
through the shim and the precreate hook (the orchestrator's path), with the env-request switch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import containerlib as cl

pytestmark = pytest.mark.containers



@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    cl.need("runc", "podman", "busybox")
    base = tmp_path_factory.mktemp("cdi")
    paths: dict[str, Path] = {"base": base, "rootfs": cl.make_rootfs(base / "rootfs")}
    for name, extra in (("open", ""), ("closed", "allow_env_requests = false\n")):
        config = base / f"{name}.toml"
        paths[f"{name}-log"] = base / f"{name}.log"
        config.write_text(f'sysfs_root = "{cl.SEED_SYSFS}"\nlog_file = "{base / f"{name}.log"}"\n'
                          f'by_path_dir = "{base / "by-path"}"\n'
                          f'hook_path = "{base / f"bin-{name}" / "oci-gpu-hook"}"\n{extra}')
        hook, runtime = cl.write_launchers(base / f"bin-{name}", config)
        paths[f"{name}-hook"], paths[f"{name}-runtime"] = hook, runtime
        paths[f"{name}-hooks-dir"] = cl.write_hooks_dir(base / f"hooks-{name}", hook, config)
    paths["no-hooks"] = base / "no-hooks"
    # The spec podman reads: generated for the seed host by the CLI, into the CDI directory.
    # podman 4.3 reads specs only from /etc/cdi and /var/run/cdi: each podman call below runs in a private
    # mount namespace with a tmpfs over /run/cdi holding this spec, so the host's directories are never touched.
    paths["cdi"] = base / "cdi"
    paths["cdi"].mkdir()
    done = subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", "cdi", "generate", "--output",
                           str(paths["cdi"])], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "OCI_GPU_HOOK_CONFIG": str(base / "open.toml")})
    assert done.returncode == 0, done.stderr
    yield paths


def _podman(setup: dict[str, Path], *options: str, runtime: str = "runc",
            hooks: Path | None = None) -> subprocess.CompletedProcess[str]:
    argv = [*cl.PODMAN, f"--runtime={runtime}", f"--hooks-dir={hooks or setup['no-hooks']}", *cl.PODMAN_RUN,
            *options, "--rootfs", str(setup["rootfs"]), "/bin/sh", "/probe.sh"]
    return cl.run(cl.private_cdi(argv, setup["cdi"]), env=cl.hook_env())


@pytest.mark.parametrize(("device", "gpus"), [
    ("amd.com/gpu=1", [1]),
    ("amd.com/gpu=0000:63:00.0", [3]),
    ("amd.com/gpu=0x3149e0fac5157acf", [1]),
    ("amd.com/gpu=all", list(range(8))),
])
def test_podman_device_from_the_generated_spec(setup: dict[str, Path], device: str, gpus: list[int]) -> None:
    """podman --device with the CDI spec alone (no hook) gives the same view as the hook paths."""
    done = _podman(setup, "--device", device)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, gpus, cgroup_v2=False)


PATHS = pytest.mark.parametrize("path", ["shim", "precreate"])


def _via(setup: dict[str, Path], path: str, policy: str, *options: str) -> subprocess.CompletedProcess[str]:
    if path == "shim":
        return _podman(setup, *options, runtime=str(setup[f"{policy}-runtime"]))
    return _podman(setup, *options, hooks=setup[f"{policy}-hooks-dir"])


@PATHS
def test_cdi_annotation_request(setup: dict[str, Path], path: str) -> None:
    # podman's --annotation splits its value on commas, so two keys here (comma lists: unit tests, containerd)
    done = _via(setup, path, "open", "--annotation", "cdi.k8s.io/a=amd.com/gpu=2",
                "--annotation", "cdi.k8s.io/b=amd.com/gpu=0000:e3:00.0")
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [2, 7], cgroup_v2=False)


@PATHS
def test_annotation_wins_over_the_env(setup: dict[str, Path], path: str) -> None:
    done = _via(setup, path, "open", "-e", "AMD_VISIBLE_DEVICES=all", "--annotation", "cdi.k8s.io/test=amd.com/gpu=5")
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [5], cgroup_v2=False)


@PATHS
def test_env_requests_refused_by_config(setup: dict[str, Path], path: str) -> None:
    """allow_env_requests = false: an image's AMD_VISIBLE_DEVICES=all gets nothing; annotations still work."""
    setup["closed-log"].unlink(missing_ok=True)
    done = _via(setup, path, "closed", "-e", "AMD_VISIBLE_DEVICES=all")
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [], cgroup_v2=False)
    lines = [json.loads(line) for line in setup["closed-log"].read_text().splitlines()]
    assert [line["outcome"] for line in lines] == ["ignored"]  # said, not silently dropped
    assert "AMD_VISIBLE_DEVICES=all ignored: allow_env_requests is off" in lines[0]["note"]
    done = _via(setup, path, "closed", "-e", "AMD_VISIBLE_DEVICES=all", "--annotation", "cdi.k8s.io/x=amd.com/gpu=4")
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [4], cgroup_v2=False)


@PATHS
def test_unknown_cdi_device_stops_the_container(setup: dict[str, Path], path: str) -> None:
    done = _via(setup, path, "open", "--annotation", "cdi.k8s.io/test=amd.com/gpu=8")
    assert done.returncode != 0
    assert "done" not in done.stdout
    if path == "shim":
        assert "'8' is out of range" in done.stderr


@PATHS
def test_image_env_cannot_widen_a_cdi_grant(setup: dict[str, Path], path: str) -> None:
    """The default install (podman hook or shim + CDI spec): `--device amd.com/gpu=1` from an image whose env says
    AMD_VISIBLE_DEVICES=all gives GPU 1 only; the env request is logged as ignored."""
    done = _via(setup, path, "open", "--device", "amd.com/gpu=1", "--env", "AMD_VISIBLE_DEVICES=all")
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [1], cgroup_v2=False)
    lines = [json.loads(line) for line in setup["open-log"].read_text().splitlines()]
    assert any("an image's env cannot add to them" in line.get("note", "") for line in lines)
