"""Docker through the installed runtime: a real dockerd (Debian's docker.io 20.10) started by the test with its
own data-root, exec-root, pidfile, socket and the daemon.json that ``install --only docker --prefix
--docker-default-runtime`` wrote (oci-gpu is dockerd's default-runtime).

``docker run --gpus``: Docker 28.3+ turns it into ``AMD_VISIBLE_DEVICES`` when the ``amd-container-runtime``
name install writes is on its PATH; 20.10 has no such driver (a test shows it refuses ``--gpus``), so the
containers get the very values Docker 28 would set (the real CLI's request, moby's mapping: tests/helpers/dockergpus.py)
with ``-e``.  Docker 28 itself is not in Debian 12 and is not run here.

dockerd runs in a private mount namespace whose /usr/local is an overlay with the prefix's usr/local on
top: the runtime path in daemon.json is the real /usr/local/libexec/oci-gpu-hook/oci-gpu-runtime, and the
host's /usr/local is never written.  dockerd passes no environment to a runtime, so the shim's config
(the fixture host's sysfs root) is baked into the launchers with ``install --set OCI_GPU_HOOK_CONFIG=``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import containerlib as cl
from tests.helpers import dockergpus, dockersave
from tests.helpers.containerlib import INSTALL_DEV
from tests.helpers.dockerlib import DOCKER, IMAGE, OPERATOR_DAEMON_JSON, RUNTIME, Dockerd, run
from tests.helpers.imageenvs import CUDA_BASE


@pytest.fixture(scope="module")
def dockerd() -> Iterator[Dockerd]:
    cl.need("dockerd", DOCKER, "unshare", "runc")
    base = Path(tempfile.mkdtemp(prefix="ogh-dk-"))  # short: containerd's sockets live under the exec-root
    try:
        (base / "hook").mkdir()
        setup = cl.hook_setup(base / "hook")  # config (the seed host), rootfs with the probe
        prefix = base / "root"
        (prefix / "etc/docker").mkdir(parents=True)
        (prefix / "etc/docker/daemon.json").write_text(OPERATOR_DAEMON_JSON.replace("KEY", str(base / "key.json")))
        env = {**cl.hook_env(), "OCI_GPU_HOOK_CONFIG": os.devnull}
        done = subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", "install", *INSTALL_DEV,
                               "--only", "docker", "--docker-default-runtime",
                               "--prefix", str(prefix), "--set", f"OCI_GPU_HOOK_CONFIG={setup['config']}"],
                              capture_output=True, text=True, env=env, cwd=cl.REPO, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        daemon = Dockerd(base, prefix)
        daemon.start()
        try:
            tarball = dockersave.build(setup["rootfs"], base / "image.tar", IMAGE)
            loaded = daemon.docker("load", "-i", str(tarball))
            assert loaded.returncode == 0, loaded.stderr
            yield daemon
        finally:
            daemon.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_install_merged_the_runtime_into_the_operators_daemon_json(dockerd: Dockerd) -> None:
    assert dockerd.prefix is not None
    data = json.loads((dockerd.prefix / "etc/docker/daemon.json").read_text())
    assert data == {"default-runtime": "oci-gpu", "runtimes": {"oci-gpu": {"path": RUNTIME}}, "log-level": "warn",
                    "storage-driver": "vfs", "deprecated-key-path": str(dockerd.base / "key.json")}
    assert (dockerd.base / "key.json").is_file()  # dockerd read the file install merged
    info = dockerd.docker("info", "--format", "{{json .Runtimes}}")
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["oci-gpu"]["path"] == RUNTIME


@pytest.mark.parametrize(("request_env", "gpus"), [(["AMD_VISIBLE_DEVICES=1"], [1]),
                                                    (["AMD_VISIBLE_DEVICES=0,5"], [0, 5]), ([], []),
                                                    (CUDA_BASE, []), ([*CUDA_BASE, "AMD_VISIBLE_DEVICES=1"], [1])],
                         ids=["1", "0,5", "none", "cuda-image", "cuda-image-and-amd-1"])
def test_docker_run_gets_exactly_its_gpus(dockerd: Dockerd, request_env: list[str], gpus: list[int]) -> None:
    done = run(dockerd, *request_env)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, gpus)


def test_a_bad_request_fails_with_the_shims_line(dockerd: Dockerd) -> None:
    done = run(dockerd, "AMD_VISIBLE_DEVICES=0000:24:00.0")
    assert done.returncode != 0
    assert "done" not in done.stdout
    assert "0000:24:00.0" in done.stderr and "Traceback" not in done.stderr, done.stderr
    print(done.stderr)


def test_a_typo_in_the_config_stops_only_what_asks_for_a_gpu(dockerd: Dockerd) -> None:
    """oci-gpu is dockerd's default-runtime: every docker run goes through the shim.  After an edit that breaks
    the config, a container that asks for nothing still runs; one that asks is refused with the config's line."""
    config = dockerd.base / "hook" / "config.toml"
    good = config.read_text()
    config.write_text(good + "mask_other_gpu = true\n")
    try:
        done = run(dockerd, runtime=None)  # dockerd's default-runtime
        assert done.returncode == 0, done.stderr
        cl.assert_isolated(done.stdout, [])
        done = run(dockerd, "AMD_VISIBLE_DEVICES=1", runtime=None)
        assert done.returncode != 0 and "done" not in done.stdout
        assert "unknown key 'mask_other_gpu' (did you mean 'mask_other_gpus'?)" in done.stderr, done.stderr
    finally:
        config.write_text(good)


# --- docker run --gpus (Docker 28.3+), default-runtime ----------------------------------------------------


@pytest.fixture(scope="module")
def gpus_values() -> dict[str, str]:
    """AMD_VISIBLE_DEVICES for each --gpus form, as Docker 28.3+ sets it: the real CLI's request, moby's mapping."""
    cl.need(dockergpus.DOCKER)
    flags = ("all", '"device=1,2"', "2", "0")
    return {flag: dockergpus.amd_env(request) for flag, request in dockergpus.device_requests(*flags).items()}


@pytest.mark.parametrize(("gpus", "value", "granted"), [("all", "all", list(range(8))), ('"device=1,2"', "1,2", [1, 2]),
                                                        ("2", "0,1", [0, 1]), ("0", "void", [])])
def test_what_docker_run_gpus_sets_gets_exactly_those_gpus(dockerd: Dockerd, gpus_values: dict[str, str], gpus: str,
                                                          value: str, granted: list[int]) -> None:
    assert gpus_values[gpus] == value
    done = run(dockerd, f"AMD_VISIBLE_DEVICES={value}")
    assert done.returncode == 0, done.stderr
    result = cl.assert_isolated(done.stdout, granted)
    if value == "void":  # nothing touched: exactly what a container that asks for nothing sees
        plain = cl.ProbeResult.parse(run(dockerd).stdout)
        assert (result.nodes, result.access) == (plain.nodes, plain.access)


def test_docker_20_10_has_no_gpus_driver(dockerd: Dockerd) -> None:
    """Even with install's amd-container-runtime on its PATH: the driver came with Docker 28.3."""
    done = dockerd.docker("run", "--rm", "--network", "none", "--gpus", "all", IMAGE, "/bin/true")
    assert done.returncode != 0
    assert 'could not select device driver "" with capabilities: [[gpu]]' in done.stderr, done.stderr
    assert (dockerd.prefix / "usr/local/bin/amd-container-runtime").is_file()


def test_the_default_runtime_runs_every_container_through_the_shim(dockerd: Dockerd) -> None:
    info = dockerd.docker("info", "--format", "{{.DefaultRuntime}}")
    assert info.stdout.strip() == "oci-gpu", info.stderr
    done = run(dockerd, "AMD_VISIBLE_DEVICES=3", runtime=None)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [3])


def test_plain_runc_silently_gives_no_gpu(dockerd: Dockerd) -> None:
    """Why default-runtime matters: runc ignores the request; the container starts, exit 0, no GPU."""
    done = run(dockerd, "AMD_VISIBLE_DEVICES=3", runtime="runc")
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [])
