"""The ``createRuntime`` hook that CDI specs and the spec-rewrite paths name (CDI's ``/dev/dri/by-path`` links,
NVIDIA's ld cache) is one the runtime can run, or the container is refused in one line: never a path that is not
there.

``hook_path`` when it is executable; with the default ``hook_path`` missing (a plain ``pip install``, no
launchers), this installation's own ``oci-gpu-hook`` next to the running entry point, when nobody but root (or
the invoking user) could have changed it, its interpreter or the package; else one line naming
``oci-gpu-hook launchers``.  Proved for real: a plain ``pip install`` into a venv, then ``dry-run | runc`` and the
``oci-gpu-runtime`` shim under runc, with the default hook path absent (a private mount namespace): an AMD
container's links need no hook at all (a read-only mount).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from oci_gpu_hook.appliers import ocispec
from oci_gpu_hook.config import FIELDS, Config
from oci_gpu_hook.errors import HookError
from tests.helpers import clilib, plainvenv
from tests.helpers import containerlib as cl

DEFAULT = FIELDS["hook_path"].default


@pytest.fixture
def no_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The default hook_path, moved to a path that is certainly missing on this machine."""
    missing = str(tmp_path / "libexec" / "oci-gpu-hook" / "oci-gpu-hook")
    monkeypatch.setattr(FIELDS["hook_path"], "default", missing)
    return missing


def script(path: Path, interpreter: str = sys.executable, mode: int = 0o755) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{interpreter}\nimport sys\n")
    path.chmod(mode)
    return path


def test_an_executable_hook_path_is_used_as_it_is() -> None:
    assert ocispec.links_hook_path(Config(hook_path="/bin/sh")) == "/bin/sh"


def test_a_hook_path_set_by_the_operator_is_never_replaced(tmp_path: Path) -> None:
    stand_in = script(tmp_path / "bin" / "oci-gpu-hook")
    wanted = tmp_path / "libexec" / "oci-gpu-hook"
    with pytest.raises(HookError) as caught:
        ocispec.links_hook_path(Config(hook_path=str(wanted), source="/etc/x.toml"), argv0=str(stand_in))
    assert str(caught.value) == (
        f"hook_path {wanted} (from /etc/x.toml) is not an executable file: the createRuntime hook that makes "
        f"the driver's ld cache would fail; write the launchers there (oci-gpu-hook launchers {wanted.parent}) "
        "or fix hook_path")


def test_the_default_missing_this_installations_oci_gpu_hook_stands_in(tmp_path: Path, no_default: str) -> None:
    hook = script(tmp_path / "venv" / "bin" / "oci-gpu-hook")
    config = Config()
    assert config.hook_path == no_default
    assert ocispec.links_hook_path(config, argv0=str(hook)) == str(hook)  # the hook itself (precreate)
    runtime = tmp_path / "venv" / "bin" / "oci-gpu-runtime"
    assert ocispec.links_hook_path(config, argv0=str(runtime)) == str(hook)  # the shim: its sibling


@pytest.mark.parametrize("what", ["missing", "not-executable", "group-writable", "dir-world-writable",
                                  "untrusted-interpreter"])
def test_a_stand_in_that_cannot_be_trusted_is_refused_in_one_line(tmp_path: Path, no_default: str,
                                                                    what: str) -> None:
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    hook = bin_dir / "oci-gpu-hook"
    expected = {"missing": f"{hook} is not an executable file", "not-executable": f"{hook} is not an executable file",
                "group-writable": f"{hook} is writable by group (mode 0775)",
                "dir-world-writable": f"{bin_dir} is writable by others (mode 0757)"}
    if what == "not-executable":
        script(hook, mode=0o644)
    elif what == "group-writable":
        script(hook, mode=0o775)
    elif what == "dir-world-writable":
        script(hook)
        bin_dir.chmod(0o757)
    elif what == "untrusted-interpreter":
        shared = tmp_path / "shared"
        shared.mkdir()
        os.symlink(sys.executable, shared / "python3")
        shared.chmod(0o777)
        script(hook, interpreter=str(shared / "python3"))
        expected[what] = f"{shared} is writable by group and others (mode 0777)"
    with pytest.raises(HookError) as caught:
        ocispec.links_hook_path(Config(), argv0=str(bin_dir / "oci-gpu-runtime"))
    assert str(caught.value) == (
        f"hook_path {no_default} is not an executable file, nor can this installation's oci-gpu-hook stand in "
        f"({expected[what]}): the createRuntime hook that makes the driver's ld cache would fail; run "
        f"`oci-gpu-hook launchers {os.path.dirname(no_default)}` (or `oci-gpu-hook install`), or set hook_path")


def test_dry_run_from_python_m_names_no_hook_that_is_not_there(tmp_path: Path) -> None:
    """``python -m`` has no oci-gpu-hook next to it: dry-run of a container that needs the hook (NVIDIA's driver
    files: the ld cache) refuses as the shim would, in one line; one that needs none (AMD: its by-path links are a
    mount) is rewritten."""
    env = clilib.without_tool_vars()
    env.update(OCI_GPU_HOOK_CONFIG=os.devnull, OCI_GPU_HOOK_SYSFS_ROOT=str(cl.SEED_SYSFS),
               OCI_GPU_HOOK_BY_PATH_DIR=os.environ["OCI_GPU_HOOK_BY_PATH_DIR"])
    amd = [sys.executable, "-m", "oci_gpu_hook.entry.cli", "dry-run", str(cl.REPO / "examples" / "bundle")]
    done = subprocess.run(hidden_default(amd) if os.geteuid() == 0 else amd, capture_output=True, text=True,
                          env=env, timeout=60, check=False, cwd=cl.REPO)
    assert done.returncode == 0 and "hooks" not in json.loads(done.stdout), done.stderr
    host = cl.REPO / "examples" / "hosts" / "nvidia-4x-h100"
    env.update(OCI_GPU_HOOK_SYSFS_ROOT=str(host / "sys"), OCI_GPU_HOOK_PROC_ROOT=str(host / "proc"),
               OCI_GPU_HOOK_DRIVER_ROOT=str(host / "driver"))
    (tmp_path / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2", "root": {"path": "rootfs"},
        "process": {"args": ["/bin/true"], "cwd": "/", "env": ["NVIDIA_VISIBLE_DEVICES=0",
                                                               "NVIDIA_DRIVER_CAPABILITIES=utility"]}}))
    argv = [sys.executable, "-m", "oci_gpu_hook.entry.cli", "dry-run", str(tmp_path)]
    if os.access(DEFAULT, os.X_OK):  # an installed node: the default hook_path hidden in a namespace of its own
        if os.geteuid() != 0:
            pytest.skip(f"{DEFAULT} is installed on this machine, and hiding it needs root")
        argv = hidden_default(argv)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False, cwd=cl.REPO)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and f"run `oci-gpu-hook launchers {os.path.dirname(DEFAULT)}`" in done.stderr


# --- for real: a plain pip install, no launchers ----------------------------------------------------------


def hidden_default(argv: list[str]) -> list[str]:
    """``argv`` in a private mount namespace where the default hook_path's directory is empty (when it exists)."""
    top = "/usr/local/libexec"
    return ["unshare", "-m", "sh", "-c", f"if [ -d {top} ]; then mount -t tmpfs tmpfs {top}; fi; "
            f"exec {cl._quoted(argv)}"]


@pytest.mark.containers
def test_plain_pip_install_dry_run_into_runc_and_the_shim(tmp_path: Path) -> None:
    cl.need("runc", "unshare")
    bin_dir = plainvenv.pip_install(tmp_path / "venv", plainvenv.copy_tree(tmp_path / "src"))
    rootfs = cl.make_rootfs(tmp_path / "rootfs")
    env = {**cl.hook_env(), "OCI_GPU_HOOK_CONFIG": os.devnull, "OCI_GPU_HOOK_SYSFS_ROOT": str(cl.SEED_SYSFS)}

    # dry-run | runc: the README's "runc without a shim"
    bundle = cl.make_bundle(tmp_path / "dry", rootfs, ["AMD_VISIBLE_DEVICES=1"])
    done = cl.run(hidden_default([str(bin_dir / "oci-gpu-hook"), "dry-run", str(bundle)]), env=env)
    assert done.returncode == 0, done.stderr
    spec = json.loads(done.stdout)
    assert "hooks" not in spec  # the by-path links are a read-only mount: no hook to name for them
    (bundle / "config.json").write_text(done.stdout)
    ran = cl.run(hidden_default(["runc", "run", "--bundle", str(bundle), cl.container_id()]), env=env)
    assert ran.returncode == 0, ran.stderr
    assert cl.assert_isolated(ran.stdout, [1]).links == cl.expected_links([1])

    # the shim, in place of runc
    bundle = cl.make_bundle(tmp_path / "shim", rootfs, ["AMD_VISIBLE_DEVICES=2"])
    ran = cl.run(hidden_default([str(bin_dir / "oci-gpu-runtime"), "run", "--bundle", str(bundle),
                                 cl.container_id()]), env=env)
    assert ran.returncode == 0, ran.stderr
    assert cl.assert_isolated(ran.stdout, [2]).links == cl.expected_links([2])
