"""``docker run --gpus`` and ``default-runtime``: what ``install --only docker`` writes for them (in a private
root), and the env contract between Docker 28.3+'s AMD driver and the shim.  The containers themselves run in
tests/containers/test_docker.py (a real dockerd 20.10, which has no such driver: the variable is passed with ``-e``
there)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from oci_gpu_hook.config import Config
from oci_gpu_hook.install import docker, paths
from oci_gpu_hook.request import requested
from tests.helpers import containerlib as cl
from tests.helpers import dockergpus
from tests.helpers.installtrees import DAEMON_JSON, at, build, isolated_env, put, run_install, snapshot

RUNTIME = f"{paths.LAUNCHER_DIR}/oci-gpu-runtime"
__all__ = ["isolated_env"]  # the autouse fixture, imported


run = run_install


# --- the contract: the real docker CLI, moby's AMD driver ------------------------------------------------


GPUS = {  # --gpus FLAG -> AMD_VISIBLE_DEVICES, or why Docker refuses it
    "all": "all",
    "2": "0,1",
    "count=3": "0,1,2",
    "device=1": "1",
    '"device=1,2"': "1,2",  # the comma list needs the inner quotes: the flag is itself CSV
    "device=1,2": dockergpus.Conflict,  # without them: Count 2 and DeviceIDs [1], which moby refuses
    "0": "void",
    "capabilities=compute": dockergpus.NoDriver,  # NVIDIA's capability: no AMD driver matches it
}


def test_what_docker_run_gpus_asks_for() -> None:
    cl.need(dockergpus.DOCKER)
    requests = dockergpus.device_requests(*GPUS)
    for flag, expected in GPUS.items():
        if isinstance(expected, str):
            assert dockergpus.amd_env(requests[flag]) == expected, flag
        else:
            with pytest.raises(expected):
                dockergpus.amd_env(requests[flag])
    assert requests["all"] == [{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]],
                                "Options": {}}]


def test_the_drivers_variable_comes_last_and_wins() -> None:
    """Docker 28.3+ appends AMD_VISIBLE_DEVICES after the image's and -e's: the shim reads the last entry, as runc
    gives the process the last one."""
    env = ["PATH=/bin", "AMD_VISIBLE_DEVICES=all", "AMD_VISIBLE_DEVICES=1"]  # the image's, then --gpus device=1
    (ask,) = requested(env, None, Config())
    assert (ask.source, ask.values) == ("AMD_VISIBLE_DEVICES", ["1"])
    assert requested(["AMD_VISIBLE_DEVICES=all", "AMD_VISIBLE_DEVICES=void"], None, Config()) == []  # --gpus 0


# --- install --only docker -------------------------------------------------------------------------------


def test_install_writes_the_gpus_name_and_the_runtime(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build(tmp_path, "docker-v2")
    before = snapshot(tmp_path, mtimes=True)
    out, _ = run(capsys, tmp_path, "--only", "docker")
    name = at(tmp_path, docker.GPUS_PATH)
    assert name.read_text() == docker.gpus_script(RUNTIME)
    assert name.stat().st_mode & 0o777 == 0o755
    assert name.read_text().splitlines()[-1] == f'exec {RUNTIME} "$@"'
    assert docker.written_by_install(str(name))
    data = json.loads(at(tmp_path, docker.DAEMON_JSON).read_text())
    assert data == {**json.loads(DAEMON_JSON), "runtimes": {"oci-gpu": {"path": RUNTIME}}}
    assert "default-runtime" not in data
    assert f"new: {name} (the name Docker's --gpus looks for on dockerd's PATH; mode 0755)" in out
    assert ("note: docker: containers run through the shim only with --runtime oci-gpu; without it, runc runs them "
            "and a GPU request (--gpus, -e AMD_VISIBLE_DEVICES) gets no GPU, with no error.") in out
    assert "install --docker-default-runtime makes oci-gpu dockerd's default-runtime" in out
    assert "(it looks for amd-container-runtime only when it starts)" in out
    manifest = json.loads(at(tmp_path, paths.MANIFEST_PATH).read_text())
    assert {e["path"]: e["integration"] for e in manifest["files"]}[docker.GPUS_PATH] == "docker"
    out, _ = run(capsys, tmp_path, "--only", "docker")  # again: nothing changes
    assert f"unchanged: {name}" in out
    run(capsys, tmp_path, "--uninstall")
    assert snapshot(tmp_path, mtimes=True) == before


def test_the_gpus_name_runs_the_shim(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing runs it (dockerd only looks it up), but run it is the shim: runc's --version, through the shim."""
    cl.need("unshare", "runc")
    build(tmp_path, "empty")
    run(capsys, tmp_path, "--only", "docker")
    script = f"mount --bind {tmp_path / 'usr/local'} /usr/local && exec {docker.GPUS_PATH} --version"
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("oci-gpu-runtime ") and "\nrunc version" in done.stdout


def test_docker_default_runtime(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build(tmp_path, "docker-v2")
    daemon_json = at(tmp_path, docker.DAEMON_JSON)
    out, _ = run(capsys, tmp_path, "--only", "docker", "--docker-default-runtime")
    text = daemon_json.read_text()
    assert json.loads(text) == {**json.loads(DAEMON_JSON), "default-runtime": "oci-gpu",
                                "runtimes": {"oci-gpu": {"path": RUNTIME}}}
    assert text.replace(f'\n  "default-runtime": "oci-gpu",\n  "runtimes": {{"oci-gpu": {{"path": "{RUNTIME}"}}}},',
                        "") == DAEMON_JSON  # every other byte kept
    assert "note: docker: default-runtime is oci-gpu: every container goes through the shim" in out
    out, _ = run(capsys, tmp_path, "--only", "docker")  # a later run without the option keeps it
    assert json.loads(daemon_json.read_text())["default-runtime"] == "oci-gpu"
    edited = json.loads(daemon_json.read_text())
    edited["debug"] = True
    daemon_json.write_text(json.dumps(edited))
    out, _ = run(capsys, tmp_path, "--uninstall", "--only", "docker")
    # dockerd would not start with a default-runtime that names no runtime: both go, the operator's edit stays
    assert json.loads(daemon_json.read_text()) == {**json.loads(DAEMON_JSON), "debug": True}


@pytest.mark.parametrize("current", ["nvidia", "amd"])
def test_another_default_runtime_is_not_replaced(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 current: str) -> None:
    build(tmp_path, "docker-v2")
    text = json.dumps({"default-runtime": current, "runtimes": {current: {"path": f"/usr/bin/{current}-rt"}}})
    put(tmp_path, docker.DAEMON_JSON, text)
    _, err = run(capsys, tmp_path, "--only", "docker,cdi", "--docker-default-runtime", code=1)
    assert err.count("\n") == 1
    assert f'has "default-runtime": "{current}"; --docker-default-runtime would replace it' in err
    assert at(tmp_path, docker.DAEMON_JSON).read_text() == text
    assert not at(tmp_path, docker.GPUS_PATH).exists()  # docker is skipped whole
    assert at(tmp_path, "/var/run/cdi/amd.com-gpu.json").is_file()  # the others are done
    assert docker.merged('{"default-runtime": "runc"}', RUNTIME, default_runtime=True) == (
        '{\n  "default-runtime": "oci-gpu",\n  "runtimes": {\n    "oci-gpu": {\n      "path": "' + RUNTIME
        + '"\n    }\n  }\n}\n')  # runc is the default anyway: replaced


@pytest.mark.parametrize("where", ["/usr/bin/amd-container-runtime", "/usr/local/bin/amd-container-runtime", "link"])
def test_amds_own_runtime_is_left_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str) -> None:
    build(tmp_path, "docker-v2")
    if where == "link":
        (tmp_path / "usr/local/bin").mkdir(parents=True)
        at(tmp_path, docker.GPUS_PATH).symlink_to("/opt/rocm/bin/amd-container-runtime")
        theirs = at(tmp_path, docker.GPUS_PATH)
    else:
        theirs = put(tmp_path, where, "\x7fELF AMD's amd-container-runtime\n", 0o755)
    before = snapshot(tmp_path)[str(theirs.relative_to(tmp_path))]
    out, _ = run(capsys, tmp_path, "--only", "docker")
    assert (f"note: docker: {theirs} is not this install's (AMD's container toolkit?): left as it is, and "
            f"{docker.GPUS_PATH} is not written;") in out
    assert snapshot(tmp_path)[str(theirs.relative_to(tmp_path))] == before
    if where != "/usr/local/bin/amd-container-runtime" and where != "link":
        assert not at(tmp_path, docker.GPUS_PATH).exists()  # never shadows theirs on dockerd's PATH
    assert "runtimes" in json.loads(at(tmp_path, docker.DAEMON_JSON).read_text())  # the runtime is still added
    run(capsys, tmp_path, "--uninstall")
    assert snapshot(tmp_path)[str(theirs.relative_to(tmp_path))] == before


def test_nvidias_hook_takes_gpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build(tmp_path, "docker-v2")
    hook = put(tmp_path, "/usr/bin/nvidia-container-runtime-hook", "#!/bin/sh\n", 0o755)
    out, _ = run(capsys, tmp_path, "--only", "docker")
    assert (f"note: docker: NVIDIA's {hook} is on dockerd's PATH: Docker then registers its NVIDIA driver for --gpus "
            "instead of AMD's") in out
    assert at(tmp_path, docker.GPUS_PATH).is_file()


def test_merged_and_unmerged_with_the_default_runtime() -> None:
    text = docker.merged(DAEMON_JSON, RUNTIME, default_runtime=True)
    assert text is not None and docker.merged(text, RUNTIME, default_runtime=True) is None
    assert docker.merged(text, RUNTIME) is None  # without the option: an existing default-runtime is fine
    assert docker.unmerged(text, RUNTIME) == DAEMON_JSON  # the exact insertion, undone
    other = '{"runtimes": {"crun": {"path": "/usr/bin/crun"}}, "debug": true}'
    both = docker.merged(other, RUNTIME, default_runtime=True) or ""
    assert json.loads(both) == {"runtimes": {"crun": {"path": "/usr/bin/crun"}, "oci-gpu": {"path": RUNTIME}},
                                "debug": True, "default-runtime": "oci-gpu"}
    assert json.loads(docker.unmerged(both, RUNTIME) or "") == json.loads(other)
    assert docker.unmerged(json.dumps({"default-runtime": "oci-gpu", "debug": True}), RUNTIME) == (
        '{\n  "debug": true\n}\n')
    assert docker.unmerged(other, RUNTIME) is None
    assert docker.merged(None, RUNTIME, default_runtime=True) == (
        '{\n  "default-runtime": "oci-gpu",\n  "runtimes": {"oci-gpu": {"path": "' + RUNTIME + '"}}\n}\n')


def test_dockerd_path_is_systemds_default() -> None:
    """docker.service sets no PATH: dockerd gets systemd's default one, and /usr/local/bin is on it."""
    assert docker.GPUS_PATH == "/usr/local/bin/amd-container-runtime"
    assert os.path.dirname(docker.GPUS_PATH) in docker.DOCKERD_PATH
    assert docker.DOCKERD_PATH[:4] == ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin")
