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
from oci_gpu_hook.fastpath import build as fastbuild
from oci_gpu_hook.install import codepaths, launchers
from tests.helpers import containerlib as cl

KINDS = [pytest.param(True, id="native", marks=pytest.mark.skipif(fastbuild.find_cc() is None, reason="no cc")),
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


def test_no_compiler_falls_back_to_python_with_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(fastbuild, "find_cc", lambda: None)
    written = launchers.write_launchers(str(tmp_path), {})
    assert sorted(os.path.basename(p) for p in written) == ["install.pins", "oci-gpu-hook", "oci-gpu-runtime"]
    assert (tmp_path / "oci-gpu-hook").read_text().startswith(f"#!{sys.executable} -IS")
    err = capsys.readouterr().err
    assert err.startswith("oci-gpu-hook: note: no C compiler found") and err.count("\n") == 1, err
    with pytest.raises(HookError, match=r"^cannot build the native front: no C compiler found .*--no-native"):
        launchers.launcher_files(str(tmp_path), {}, native=True)
    launchers.launcher_files(str(tmp_path), {}, native=False)
    assert capsys.readouterr().err == ""  # asked for: no note


def fake_cc(path: Path, stderr: str) -> str:
    """A compiler that fails the way a real one does, with ``stderr``."""
    path.write_text(f"#!/bin/sh\ncat >&2 <<'EOF'\n{stderr}EOF\nexit 1\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("native", [None, True], ids=["default", "native"])
@pytest.mark.parametrize(("problem", "message"), [
    ("no-front", "no {front} in this install of oci-gpu-hook (a wheel built without its package data?)"),
    ("gcc-headers", "the C headers are missing (errno.h not found by {cc}): install them (Debian/Ubuntu: apt-get "
                    "install libc6-dev"),
    ("clang-headers", "the C headers are missing (stdio.h not found by {cc})"),
    ("error", "compiling {front} with {cc} failed: front.c:9:1: error: unknown type name 'x'"),
])
def test_a_front_that_cannot_be_built_is_an_error_not_a_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 native: bool | None, problem: str,
                                                                 message: str) -> None:
    """With a compiler there (or --native), a front that cannot be built stops: one line that says what is
    missing, and nothing written."""
    front = tmp_path / "front.c"
    front.write_text("int main(void) { return 0; }\n")
    stderr = {"gcc-headers": "In file included from x.c:1:\nfront.c:20:10: fatal error: errno.h: No such file or "
                             "directory\n   20 | #include <errno.h>\ncompilation terminated.\n",
              "clang-headers": "front.c:1:10: fatal error: 'stdio.h' file not found\n#include <stdio.h>\n",
              "error": "front.c: In function 'main':\nfront.c:9:1: error: unknown type name 'x'\n    9 | x y;\n"}
    cc = fake_cc(tmp_path / "cc", stderr.get(problem, ""))
    monkeypatch.setattr(fastbuild, "find_cc", lambda: cc)
    if problem == "no-front":
        front.unlink()
    monkeypatch.setattr(fastbuild, "FRONT_SOURCE", str(front))
    with pytest.raises(HookError) as caught:
        launchers.write_launchers(str(tmp_path / "bin"), {}, native=native)
    text = str(caught.value)
    assert text.startswith("cannot build the native front: " + message.format(front=front, cc=cc)), text
    assert text.endswith("(or pass --no-native for the Python launchers, ~+15 ms per container start)")
    assert "\n" not in text
    assert not (tmp_path / "bin" / "oci-gpu-hook").exists()


@pytest.mark.skipif(fastbuild.find_cc() is None, reason="no cc")
def test_a_stale_companion_of_a_native_install_is_removed(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "oci-gpu-hook.py").write_text("stale")
    launchers.write_launchers(str(tmp_path / "bin"), {}, native=False)
    assert not (tmp_path / "bin" / "oci-gpu-hook.py").exists()


def test_the_cli_says_what_is_missing_in_one_line(tmp_path: Path) -> None:
    """``launchers --native`` and ``install --native`` with no compiler on PATH: exit 1, one line, nothing written."""
    env = {"PATH": str(tmp_path / "empty"), "OCI_GPU_HOOK_CONFIG": os.devnull}
    for argv in (["launchers", str(tmp_path / "bin"), "--native", "--allow-editable"],
                 ["--sysfs-root", str(cl.SEED_SYSFS), "install", "--native", "--allow-editable", "--only", "cdi",
                  "--prefix", str(tmp_path / "root")]):
        done = subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", *argv], capture_output=True,
                              text=True, env=env, cwd=cl.REPO, timeout=120)
        assert done.returncode == 1, done
        assert done.stderr.startswith("oci-gpu-hook: error: ") and done.stderr.count("\n") == 1, done.stderr
        assert "no C compiler found" in done.stderr
    assert not (tmp_path / "bin").exists() and not (tmp_path / "root" / "usr").exists()


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
    real = codepaths.code_paths
    monkeypatch.setattr(codepaths, "code_paths", lambda: [*real(), str(writable)])
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
    if codepaths.editable_reason() is None:
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
    assert names == ["install.pins", *(["oci-gpu-hook", "oci-gpu-hook.py", "oci-gpu-runtime", "oci-gpu-runtime.py"]
                                       if fastbuild.find_cc() else ["oci-gpu-hook", "oci-gpu-runtime"])]
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
    if codepaths.editable_reason() is None:
        pytest.skip("the package is installed in site-packages here")
    (tmp_path / "config.toml").write_text("")
    hook, _shim = cl.write_launchers(tmp_path / "bin", tmp_path / "config.toml")
    out = subprocess.run([str(hook), "launchers", str(tmp_path / "other")], capture_output=True, text=True,
                         env=cl.hook_env(), timeout=300)
    assert out.returncode == 1 and "outside site-packages" in out.stderr and "--allow-editable" in out.stderr
    assert not (tmp_path / "other").exists()
