"""Launchers: native front or Python launcher (both tested), pass-through whatever the config file holds,
--version, the refusal to run code that a non-root user could replace, the refusal of editable installs."""

from __future__ import annotations

import os
import shutil
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


def _installed_venv(base: Path) -> Path:
    """A virtual environment with the package in its site-packages (as ``pip install .`` puts it), not editable."""
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True,
                   timeout=300)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                          capture_output=True, text=True, cwd=base, timeout=60).stdout.strip()
    shutil.copytree(cl.REPO / "oci_gpu_hook", Path(site) / "oci_gpu_hook",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return python


def test_launchers_and_install_through_an_installed_launcher(tmp_path: Path) -> None:
    """The README's route: after editing the config, run ``launchers`` (or ``install``) again, through the launcher
    it wrote, which runs Python with -I -S.  Not refused as an editable install, and it writes the very launchers
    that ``launchers`` run the usual way wrote."""
    python = _installed_venv(tmp_path)
    env = cl.hook_env()
    bin_dir = tmp_path / "bin"
    first = subprocess.run([str(python), "-m", "oci_gpu_hook.entry.cli", "launchers", str(bin_dir)],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert first.returncode == 0, first.stderr
    names = sorted(os.listdir(bin_dir))
    assert names == (["oci-gpu-hook", "oci-gpu-hook.py", "oci-gpu-runtime", "oci-gpu-runtime.py"]
                     if launchers.find_cc() else ["oci-gpu-hook", "oci-gpu-runtime"])
    before = {name: (bin_dir / name).read_bytes() for name in names}
    again = subprocess.run([str(bin_dir / "oci-gpu-hook"), "launchers", str(bin_dir)], capture_output=True,
                           text=True, env=env, cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "outside site-packages" not in again.stderr
    assert {name: (bin_dir / name).read_bytes() for name in names} == before
    plain = subprocess.run([str(bin_dir / "oci-gpu-hook"), "launchers", str(tmp_path / "py"), "--no-native"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert plain.returncode == 0, plain.stderr
    site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages())"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=60).stdout.strip()
    assert f"sys.path[:0] = {site}" in (tmp_path / "py" / "oci-gpu-hook").read_text()
    staged = subprocess.run([str(bin_dir / "oci-gpu-hook"), "install", "--dry-run", "--prefix", str(tmp_path / "root")],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert staged.returncode == 0, staged.stderr
    assert "outside site-packages" not in staged.stderr


def test_an_editable_install_is_still_refused_through_its_launcher(tmp_path: Path) -> None:
    """The same check, run under -I -S, still tells an editable checkout from an install."""
    if launchers.editable_reason() is None:
        pytest.skip("the package is installed in site-packages here")
    (tmp_path / "config.toml").write_text("")
    hook, _shim = cl.write_launchers(tmp_path / "bin", tmp_path / "config.toml")
    out = subprocess.run([str(hook), "launchers", str(tmp_path / "other")], capture_output=True, text=True,
                         env=cl.hook_env(), timeout=300)
    assert out.returncode == 1 and "outside site-packages" in out.stderr and "--allow-editable" in out.stderr
    assert not (tmp_path / "other").exists()
