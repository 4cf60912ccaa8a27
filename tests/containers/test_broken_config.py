"""A config that cannot be used never stops a container that asks for nothing (the rule in oci_gpu_hook/config.py).

The launchers are written while the config is good (as ``install`` leaves a node), then the file is broken as an
operator's edit would break it: a typo'd key, or made writable by others (untrusted) and naming another runtime.
Real containers then start through each launcher (the native front, which hands such a file over to Python, and
the Python launcher): podman's precreate hook, the shim under runc (cgroup v1 and v2), the prestart hook under
runc (v1 and v2).  A container that asks for nothing starts untouched; one that asks for a GPU is refused with
the config's line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from oci_gpu_hook.fastpath import build as fastbuild
from oci_gpu_hook.install import launchers
from tests.helpers import containerlib as cl

pytestmark = pytest.mark.containers

TYPO = "mask_other_gpu = true\n"
TYPO_LINE = "unknown key 'mask_other_gpu' (did you mean 'mask_other_gpus'?)"
KINDS = ["native", "python"]
ASKING = ["AMD_VISIBLE_DEVICES=1"]
NOTHING = ["AMD_VISIBLE_DEVICES=", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]  # empty: no request
LIST = ["/bin/sh", "-c", "ls /dev/dri 2>&1; echo done"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    cl.need("runc", "unshare")
    base = tmp_path_factory.mktemp("broken-config")
    config = base / "etc" / "config.toml"
    config.parent.mkdir()
    runc = shutil.which("runc")
    good = f'sysfs_root = "{cl.SEED_SYSFS}"\nhook_path = "/bin/true"\nruntime = "{runc}"\n'
    config.write_text(good)
    config.chmod(0o644)
    defaults = {"OCI_GPU_HOOK_CONFIG": str(config), "OCI_GPU_HOOK_PLANNER_SOCKET": ""}
    paths = {"base": base, "config": config, "rootfs": cl.make_rootfs(base / "rootfs")}
    if fastbuild.find_cc() is not None:
        launchers.write_launchers(str(base / "native"), defaults, native=True)
    launchers.write_launchers(str(base / "python"), defaults, native=False)
    for kind in KINDS:
        paths[f"{kind}-hooks"] = cl.write_hooks_dir(base / f"hooks-{kind}", base / kind / "oci-gpu-hook", config)
    evil = base / "evil-runtime"
    evil.write_text(f"#!/bin/sh\ntouch {base / 'evil-ran'}\nexit 1\n")
    evil.chmod(0o755)
    paths["good"] = base / "good.toml"
    paths["good"].write_text(good)
    paths["typo"] = base / "typo.toml"
    paths["typo"].write_text(good + TYPO)
    paths["untrusted"] = base / "untrusted.toml"
    paths["untrusted"].write_text(good.replace(str(runc), str(evil)))
    yield paths


@pytest.fixture(params=["typo", "untrusted"])
def broken(setup: dict[str, Path], request: pytest.FixtureRequest) -> Iterator[str]:
    """The config file broken after the launchers were written; put back after the test."""
    setup["config"].write_bytes(setup[request.param].read_bytes())
    setup["config"].chmod(0o646 if request.param == "untrusted" else 0o644)
    yield request.param
    setup["config"].write_bytes(setup["good"].read_bytes())
    setup["config"].chmod(0o644)
    assert not (setup["base"] / "evil-ran").exists(), "the untrusted file's runtime was run"


def launcher(setup: dict[str, Path], kind: str) -> Path:
    if kind == "native" and fastbuild.find_cc() is None:
        cl.unavailable("no C compiler for the native front")
    return setup["base"] / kind


def why(broken: str) -> str:
    return TYPO_LINE if broken == "typo" else "is not trusted"


def bundle(setup: dict[str, Path], env: list[str]) -> Path:
    return cl.make_bundle(setup["base"] / "bundles" / cl.container_id(), setup["rootfs"], env, LIST)


def start(setup: dict[str, Path], how: str, kind: str, cgroup: str,
          env: list[str]) -> tuple[Path, bytes, subprocess.CompletedProcess[str]]:
    """A runc container of ``env`` through the shim (``oci-gpu-runtime run``) or runc with the prestart hook:
    its bundle, its config.json before, the run."""
    path = bundle(setup, env)
    if how == "shim":
        argv = [str(launcher(setup, kind) / "oci-gpu-runtime"), "run", "--bundle", str(path), cl.container_id()]
    else:
        cl.add_prestart(path, launcher(setup, kind) / "oci-gpu-hook")
        argv = ["runc", "run", "--bundle", str(path), cl.container_id()]
    before = (path / "config.json").read_bytes()
    return path, before, cl.run(cl.cgroup2_wrap(argv) if cgroup == "v2" else argv, env=cl.hook_env())


@pytest.mark.parametrize("cgroup", ["v1", "v2"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["shim", "prestart"])
def test_runc(setup: dict[str, Path], broken: str, how: str, kind: str, cgroup: str) -> None:
    path, before, done = start(setup, how, kind, cgroup, NOTHING)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "done" and "renderD" not in done.stdout
    assert (path / "config.json").read_bytes() == before  # untouched
    if how == "shim":  # runc keeps a successful hook's output to itself
        warnings = [line for line in done.stderr.splitlines() if line.startswith("oci-gpu-hook: warning:")]
        assert len(warnings) == 1 and why(broken) in warnings[0] and "asks for no GPU" in warnings[0], done.stderr
    _path, _before, done = start(setup, how, kind, cgroup, ASKING)
    assert done.returncode != 0 and "done" not in done.stdout
    errors = [line for line in done.stderr.splitlines() if "oci-gpu-hook: error:" in line]
    assert len(errors) == 1 and f"oci-gpu-hook: error: config file {setup['config']}" in errors[0], done.stderr
    assert why(broken) in errors[0]


@pytest.mark.parametrize("kind", KINDS)
def test_podman_precreate(setup: dict[str, Path], broken: str, kind: str) -> None:
    cl.need("podman")
    launcher(setup, kind)
    podman = [*cl.PODMAN, "--runtime=runc", f"--hooks-dir={setup[f'{kind}-hooks']}", *cl.PODMAN_RUN]
    done = cl.run([*podman, "--rootfs", str(setup["rootfs"]), "/bin/true"], env=cl.hook_env())
    assert done.returncode == 0, done.stderr  # podman run --rm IMAGE true
    done = cl.run([*podman, "-e", "AMD_VISIBLE_DEVICES=", "--rootfs", str(setup["rootfs"]), *LIST],
                  env=cl.hook_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "done" and "renderD" not in done.stdout
    done = cl.run([*podman, *(f"-e={e}" for e in ASKING), "--rootfs", str(setup["rootfs"]), *LIST],
                  env=cl.hook_env())
    assert done.returncode != 0 and "done" not in done.stdout
    assert "precreate" in done.stderr  # podman says no more than that the hook failed


def test_good_config_again_grants(setup: dict[str, Path]) -> None:
    """Not the rule: proof that the launchers above work, so that a refusal there is the config's."""
    for kind in KINDS:
        if kind == "native" and fastbuild.find_cc() is None:
            continue
        asking = bundle(setup, ASKING)
        done = cl.run([str(setup["base"] / kind / "oci-gpu-runtime"), "run", "--bundle", str(asking),
                       cl.container_id()], env=cl.hook_env())
        assert done.returncode == 0, done.stderr
        assert "renderD129" in done.stdout.split(), kind
        assert json.loads((asking / "config.json").read_text())["linux"]["devices"]
