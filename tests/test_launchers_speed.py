"""Launchers: native front or Python launcher (both tested), pass-through whatever the config file holds,
--version, the refusal to run code that a non-root user could replace, the refusal of editable installs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from oci_gpu_hook.errors import HookError
from oci_gpu_hook.host import launchers
from tests import containerlib as cl

KINDS = [pytest.param(True, id="native", marks=pytest.mark.skipif(launchers.find_cc() is None, reason="no cc")),
         pytest.param(False, id="python")]
PASS_THROUGH = [["state", "c1"], ["start", "c1"], ["delete", "--force", "c1"], ["kill", "c1", "KILL"], ["features"],
                ["--root", "/run/x", "state", "c1"]]


def setup(base: Path, native: bool) -> tuple[Path, Path, Path]:
    fake = base / "fake-runc"
    fake.write_text('#!/bin/sh\necho "fake-runc $*"\n')
    fake.chmod(0o755)
    config = base / "config.toml"
    config.write_text(f'runtime = "{fake}"\nsysfs_root = "{cl.SEED_SYSFS}"\n')
    launchers.write_launchers(str(base / "bin"), {"OCI_GPU_HOOK_CONFIG": str(config)}, native=native)
    return base / "bin" / "oci-gpu-runtime", config, fake


@pytest.mark.parametrize("native", KINDS)
def test_kind_written(tmp_path: Path, native: bool) -> None:
    shim, _config, _fake = setup(tmp_path, native)
    head = shim.read_bytes()[:4]
    assert (head == b"\x7fELF") is native
    assert (tmp_path / "bin" / "oci-gpu-runtime.py").exists() is native


def test_no_compiler_falls_back_to_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launchers, "find_cc", lambda: None)
    written = launchers.write_launchers(str(tmp_path), {})
    assert sorted(os.path.basename(p) for p in written) == ["oci-gpu-hook", "oci-gpu-runtime"]
    assert (tmp_path / "oci-gpu-hook").read_text().startswith(f"#!{sys.executable} -IS")
    with pytest.raises(HookError, match="no C compiler"):
        launchers.launcher_files(str(tmp_path), {}, native=True)


@pytest.mark.skipif(launchers.find_cc() is None, reason="no cc")
def test_compile_failure_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "front.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(launchers, "FRONT_SOURCE", str(broken))
    files = launchers.launcher_files(str(tmp_path), {})
    assert [os.path.basename(p) for p, _ in files] == ["oci-gpu-hook", "oci-gpu-runtime"]
    with pytest.raises(HookError, match="compiling the native front"):
        launchers.launcher_files(str(tmp_path), {}, native=True)
    # a stale companion of an earlier native install is removed
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "oci-gpu-hook.py").write_text("stale")
    launchers.write_launchers(str(tmp_path / "bin"), {})
    assert not (tmp_path / "bin" / "oci-gpu-hook.py").exists()


@pytest.mark.parametrize("native", KINDS)
def test_pass_through_whatever_the_config_holds(tmp_path: Path, native: bool) -> None:
    shim, config, _fake = setup(tmp_path, native)
    env = cl.hook_env()
    texts = [config.read_text(), config.read_text() + "this is not [toml\n", "runtime = 5\n"]
    for text in texts:
        config.write_text(text)
        for args in PASS_THROUGH:
            out = subprocess.run([str(shim), *args], capture_output=True, text=True, env=env, timeout=60)
            if text == "runtime = 5\n":  # no runtime line to read: the default, runc, answers
                assert "fake-runc" not in out.stdout
                continue
            assert out.returncode == 0, (args, out.stderr)
            assert out.stdout.strip() == "fake-runc " + " ".join(args)
        if text != texts[0]:  # broken: create and run fail closed
            for command in ("create", "run"):
                out = subprocess.run([str(shim), command, "--bundle", str(tmp_path), "c1"], capture_output=True,
                                     text=True, env=env, timeout=60)
                assert out.returncode == 1 and "fake-runc" not in out.stdout, (text, command)
                assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("native", KINDS)
def test_version_line_then_the_runtime(tmp_path: Path, native: bool) -> None:
    from oci_gpu_hook import __version__

    shim, _config, _fake = setup(tmp_path, native)
    out = subprocess.run([str(shim), "--version"], capture_output=True, text=True, env=cl.hook_env(), timeout=60)
    assert out.stdout.splitlines() == [f"oci-gpu-runtime {__version__}", "fake-runc --version"]


@pytest.mark.parametrize("native", KINDS)
def test_refuses_code_a_user_could_replace(tmp_path: Path, native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    writable = tmp_path / "writable"
    writable.mkdir()
    writable.chmod(0o777)
    real = launchers.code_paths
    monkeypatch.setattr(launchers, "code_paths", lambda: [*real(), str(writable)])
    shim, _config, _fake = setup(tmp_path, native)
    hook = tmp_path / "bin" / "oci-gpu-hook"
    env = cl.hook_env()
    out = subprocess.run([str(hook), "precreate"], input='{"process": {"env": ["AMD_VISIBLE_DEVICES=1"]}}',
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "refusing to run" in out.stderr and str(writable) in out.stderr
    out = subprocess.run([str(shim), "state", "c1"], capture_output=True, text=True, env=env, timeout=60)
    assert (out.returncode, out.stdout.strip()) == (0, "fake-runc state c1")  # pass-through still reaches runc
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text('{"process": {"env": ["AMD_VISIBLE_DEVICES=1"]}}')
    out = subprocess.run([str(shim), "create", "--bundle", str(bundle), "c1"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 1 and "refusing to run" in out.stderr and out.stdout == ""
    writable.rmdir()  # gone is refused too
    out = subprocess.run([str(hook), "links"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 1 and "refusing to run" in out.stderr


def test_editable_install_refused_unless_allowed(tmp_path: Path) -> None:
    if launchers.editable_reason() is None:
        pytest.skip("the package is installed in site-packages here")
    cmd = [sys.executable, "-m", "oci_gpu_hook.entry.cli", "launchers", str(tmp_path / "bin")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "--allow-editable" in out.stderr
    assert not (tmp_path / "bin").exists()
    out = subprocess.run([*cmd, "--allow-editable"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
