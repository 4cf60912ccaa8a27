"""``oci-gpu-runtime``: runc's argv as podman/conmon and containerd write it, and the shim end to end."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from oci_gpu_hook.oci_argv import bundle_dir, container_id, parse_argv
from tests.helpers import clilib

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_SYSFS = REPO / "examples" / "hosts" / "seed-8x-gfx1100" / "sys"
EXAMPLE_SPEC = REPO / "examples" / "bundle" / "config.json"
GPU1_PATHS = ["/dev/dri/card2", "/dev/dri/renderD129", "/dev/kfd"]
FAKE_EXIT = 7

# --- argv parsing ---------------------------------------------------------------------


def test_conmon_style_create() -> None:
    argv = ["--root", "/run/runc", "--log", "/run/x/log.json", "--log-format", "json", "--systemd-cgroup",
            "create", "--bundle", "/b", "--pid-file", "/run/x/pid", "ctr1"]
    command, options, rest = parse_argv(argv)
    assert command == "create"
    assert options == {"--root": "/run/runc", "--log": "/run/x/log.json", "--log-format": "json"}
    assert rest == ["--bundle", "/b", "--pid-file", "/run/x/pid", "ctr1"]
    assert bundle_dir(rest) == "/b"
    assert container_id(rest) == "ctr1"


def test_containerd_style_create() -> None:
    argv = ["--root", "/run/containerd/runc/k8s.io", "--log", "/run/c/log.json", "--log-format", "json",
            "--systemd-cgroup", "create", "--bundle", "/run/c/bundle", "--pid-file", "/run/c/init.pid",
            "--console-socket", "/tmp/pty.sock", "abc123"]
    command, options, rest = parse_argv(argv)
    assert command == "create"
    assert options["--log-format"] == "json"
    assert bundle_dir(rest) == "/run/c/bundle"
    assert container_id(rest) == "abc123"


def test_global_options_with_equals_and_one_dash() -> None:
    command, options, rest = parse_argv(["--root=/r", "-log", "/l", "-log-format=text", "--debug", "run", "-d",
                                         "id"])
    assert command == "run"
    assert options == {"--root": "/r", "--log": "/l", "--log-format": "text"}
    assert rest == ["-d", "id"]


def test_option_value_that_looks_like_a_command_is_a_value() -> None:
    command, options, rest = parse_argv(["--root", "create", "state", "x"])
    assert command == "state"
    assert options == {"--root": "create"}
    assert rest == ["x"]


@pytest.mark.parametrize(("rest", "bundle"), [
    (["-b", "/b1", "id"], "/b1"),
    (["--bundle=/b2", "id"], "/b2"),
    (["-bundle", "/b3", "id"], "/b3"),
    (["-bundle=/b4", "id"], "/b4"),
    (["--pid-file", "/p", "--bundle", "/b5", "id"], "/b5"),
    (["-b=/b6", "id"], "/b6"),
])
def test_bundle_spellings(rest: list[str], bundle: str) -> None:
    assert bundle_dir(rest) == bundle
    assert container_id(rest) == "id"


def test_no_bundle_is_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert bundle_dir(["--pid-file", "/p", "id"]) == str(tmp_path)
    assert bundle_dir([]) == str(tmp_path)


def test_bundle_after_double_dash_is_not_a_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert bundle_dir(["id", "--", "--bundle", "/x"]) == str(tmp_path)


@pytest.mark.parametrize(("argv", "command", "rest", "cid"), [
    (["state", "ctr"], "state", ["ctr"], "ctr"),
    (["delete", "--force", "ctr"], "delete", ["--force", "ctr"], "ctr"),
    (["--root", "/r", "kill", "ctr", "9"], "kill", ["ctr", "9"], None),
    (["start", "ctr"], "start", ["ctr"], "ctr"),
    (["features"], "features", [], ""),
])
def test_pass_through_commands(argv: list[str], command: str, rest: list[str], cid: str | None) -> None:
    got_command, _options, got_rest = parse_argv(argv)
    assert got_command == command
    assert got_rest == rest
    if cid is not None:
        assert container_id(got_rest) == cid


@pytest.mark.parametrize("argv", [["--version"], ["-v"], ["--help"], [], ["--root", "/r"]])
def test_no_command(argv: list[str]) -> None:
    command, _options, rest = parse_argv(argv)
    assert command is None
    assert rest == []


# --- the shim as a process ------------------------------------------------------------

FAKE_RUNTIME = """#!/bin/sh
out="$FAKE_RUNTIME_OUT"
for a in "$0" "$@"; do printf '%s\\0' "$a"; done > "$out/argv"
if [ -f "$FAKE_BUNDLE/config.json" ]; then cp "$FAKE_BUNDLE/config.json" "$out/config.json"; fi
exit 7
"""


class Shim:
    def __init__(self, tmp_path: Path) -> None:
        self.out = tmp_path / "out"
        self.out.mkdir()
        self.bundle = tmp_path / "bundle"
        self.bundle.mkdir()
        self.runtime = tmp_path / "fake-runc"
        self.runtime.write_text(FAKE_RUNTIME)
        self.runtime.chmod(0o755)
        self.config = self.bundle / "config.json"

    def write_spec(self, env: list[str]) -> bytes:
        spec = json.loads(EXAMPLE_SPEC.read_text())
        spec["process"]["env"] = env
        self.config.write_text(json.dumps(spec, indent=2))
        return self.config.read_bytes()

    def env(self, **extra: str) -> dict[str, str]:
        env = clilib.without_tool_vars()
        env.update({
            "OCI_GPU_HOOK_CONFIG": os.devnull,
            "OCI_GPU_HOOK_SYSFS_ROOT": str(EXAMPLE_SYSFS),
            "OCI_GPU_HOOK_HOOK_PATH": "/bin/sh",
            "OCI_GPU_HOOK_RUNTIME": str(self.runtime),
            "FAKE_RUNTIME_OUT": str(self.out),
            "FAKE_BUNDLE": str(self.bundle),
        })
        env.update(extra)
        return env

    def run(self, *args: str, cwd: Path | None = None, argv0: list[str] | None = None,
            **extra: str) -> subprocess.CompletedProcess[str]:
        command = argv0 or [sys.executable, "-m", "oci_gpu_hook.entry.runtime"]
        return subprocess.run([*command, *args], capture_output=True, text=True, env=self.env(**extra),
                              cwd=cwd or self.out, timeout=60, check=False)

    def runtime_argv(self) -> list[str] | None:
        path = self.out / "argv"
        if not path.exists():
            return None
        return path.read_text().split("\0")[:-1]

    def runtime_saw(self) -> dict:
        return json.loads((self.out / "config.json").read_text())


@pytest.fixture
def shim(tmp_path: Path) -> Shim:
    return Shim(tmp_path)


def device_paths(spec: dict) -> list[str]:
    return [d["path"] for d in spec.get("linux", {}).get("devices", [])]


def assert_one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("oci-gpu-hook: error: ")
    assert result.stderr.count("\n") == 1, result.stderr
    return result.stderr.rstrip("\n")


def test_create_rewrites_the_bundle_then_execs_the_runtime(shim: Shim) -> None:
    shim.write_spec(["PATH=/bin", "AMD_VISIBLE_DEVICES=1"])
    args = ["create", "--bundle", str(shim.bundle), "ctr1"]
    result = shim.run(*args)
    assert result.returncode == FAKE_EXIT, result.stderr
    assert result.stderr == ""
    assert shim.runtime_argv() == [str(shim.runtime), *args]
    assert device_paths(shim.runtime_saw()) == GPU1_PATHS
    assert device_paths(json.loads(shim.config.read_text())) == GPU1_PATHS


def test_conmon_argv_is_passed_on_identically(shim: Shim) -> None:
    shim.write_spec(["AMD_VISIBLE_DEVICES=0,7"])
    log = shim.out / "runc.log"
    args = ["--root", str(shim.out / "root"), "--log", str(log), "--log-format", "json", "--systemd-cgroup",
            "create", "--bundle", str(shim.bundle), "--pid-file", str(shim.out / "pid"), "--no-new-keyring",
            "ctr 2"]
    result = shim.run(*args)
    assert result.returncode == FAKE_EXIT, result.stderr
    assert shim.runtime_argv() == [str(shim.runtime), *args]
    assert device_paths(shim.runtime_saw()) == [
        "/dev/dri/card1", "/dev/dri/renderD128", "/dev/dri/card8", "/dev/dri/renderD135", "/dev/kfd"]
    assert not log.exists()


@pytest.mark.parametrize("spelling", ["-b", "--bundle=", "-bundle", "cwd"])
def test_bundle_spellings_end_to_end(shim: Shim, spelling: str) -> None:
    shim.write_spec(["AMD_VISIBLE_DEVICES=1"])
    if spelling == "cwd":
        args = ["create", "ctr"]
    elif spelling.endswith("="):
        args = ["create", spelling + str(shim.bundle), "ctr"]
    else:
        args = ["create", spelling, str(shim.bundle), "ctr"]
    result = shim.run(*args, cwd=shim.bundle)
    assert result.returncode == FAKE_EXIT, result.stderr
    assert shim.runtime_argv() == [str(shim.runtime), *args]
    assert device_paths(shim.runtime_saw()) == GPU1_PATHS


def test_run_also_rewrites(shim: Shim) -> None:
    shim.write_spec(["AMD_VISIBLE_DEVICES=0000:23:00.0"])
    result = shim.run("run", "--bundle", str(shim.bundle), "-d", "ctr")
    assert result.returncode == FAKE_EXIT, result.stderr
    assert device_paths(shim.runtime_saw()) == GPU1_PATHS


def test_create_twice_changes_nothing_the_second_time(shim: Shim) -> None:
    shim.write_spec(["AMD_VISIBLE_DEVICES=1"])
    shim.run("create", "--bundle", str(shim.bundle), "ctr")
    once = shim.config.read_bytes()
    shim.run("create", "--bundle", str(shim.bundle), "ctr")
    assert shim.config.read_bytes() == once


def test_create_keeps_the_file_mode(shim: Shim) -> None:
    shim.write_spec(["AMD_VISIBLE_DEVICES=1"])
    shim.config.chmod(0o600)
    shim.run("create", "--bundle", str(shim.bundle), "ctr")
    assert stat.S_IMODE(shim.config.stat().st_mode) == 0o600
    assert device_paths(json.loads(shim.config.read_text())) == GPU1_PATHS
    assert sorted(p.name for p in shim.bundle.iterdir()) == ["config.json"]


def test_create_without_request_leaves_the_bundle_byte_identical(shim: Shim) -> None:
    before = shim.write_spec(["PATH=/bin"])
    result = shim.run("create", "--bundle", str(shim.bundle), "ctr")
    assert result.returncode == FAKE_EXIT, result.stderr
    assert shim.config.read_bytes() == before
    assert shim.runtime_argv() == [str(shim.runtime), "create", "--bundle", str(shim.bundle), "ctr"]


@pytest.mark.parametrize("args", [["state", "ctr"], ["delete", "--force", "ctr"], ["start", "ctr"],
                                  ["kill", "ctr", "KILL"], ["features"], ["--version"]])
def test_pass_through_leaves_the_bundle_untouched(shim: Shim, args: list[str]) -> None:
    before = shim.write_spec(["AMD_VISIBLE_DEVICES=1"])
    result = shim.run(*args, cwd=shim.bundle)
    assert result.returncode == FAKE_EXIT, result.stderr
    assert shim.runtime_argv() == [str(shim.runtime), *args]
    assert shim.config.read_bytes() == before


def test_pass_through_with_a_bad_request_in_cwd_still_runs(shim: Shim) -> None:
    before = shim.write_spec(["AMD_VISIBLE_DEVICES=banana"])
    result = shim.run("state", "ctr", cwd=shim.bundle)
    assert result.returncode == FAKE_EXIT, result.stderr
    assert shim.config.read_bytes() == before


def test_bad_request_fails_before_the_runtime(shim: Shim) -> None:
    before = shim.write_spec(["AMD_VISIBLE_DEVICES=9"])
    result = shim.run("create", "--bundle", str(shim.bundle), "ctr")
    line = assert_one_error_line(result)
    assert "'9'" in line and "valid:" in line
    assert shim.runtime_argv() is None
    assert shim.config.read_bytes() == before


def test_bad_request_goes_to_the_runtime_json_log(shim: Shim) -> None:
    shim.write_spec(["AMD_VISIBLE_DEVICES=all,1"])
    log = shim.out / "runc.log"
    result = shim.run("--root", str(shim.out), "--log", str(log), "--log-format", "json", "--systemd-cgroup",
                      "create", "--bundle", str(shim.bundle), "--pid-file", str(shim.out / "pid"), "ctr")
    line = assert_one_error_line(result)
    assert shim.runtime_argv() is None
    records = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(records) == 1
    assert records[0]["level"] == "error"
    assert records[0]["msg"] == line
    assert "'all'" in records[0]["msg"]


def test_bad_request_goes_to_the_runtime_text_log(shim: Shim) -> None:
    shim.write_spec(["AMD_VISIBLE_DEVICES=banana"])
    log = shim.out / "runc.log"
    line = assert_one_error_line(shim.run("--log", str(log), "create", "--bundle", str(shim.bundle), "ctr"))
    text = log.read_text()
    assert text.count("\n") == 1
    assert "level=error" in text
    assert 'msg="oci-gpu-hook: error: AMD_VISIBLE_DEVICES=banana: ' in text
    assert line.split("'")[0] in text


def test_bad_request_is_recorded_in_the_hook_log(shim: Shim) -> None:
    shim.write_spec(["AMD_VISIBLE_DEVICES=9"])
    log = shim.out / "hook.jsonl"
    line = assert_one_error_line(shim.run("create", "--bundle", str(shim.bundle), "ctr-9",
                                          OCI_GPU_HOOK_LOG_FILE=str(log)))
    records = [json.loads(x) for x in log.read_text().splitlines()]
    assert records[-1]["outcome"] == "error"
    assert records[-1]["id"] == "ctr-9"
    assert records[-1]["error"] == line


@pytest.mark.parametrize("text", ["{", '{"process": {"env": ["AMD_VISIBLE_DEVICES=1", 5]}}'])
def test_broken_config_fails_before_the_runtime(shim: Shim, text: str) -> None:
    shim.config.write_text(text)
    line = assert_one_error_line(shim.run("create", "--bundle", str(shim.bundle), "ctr"))
    assert "config.json" in line
    assert shim.runtime_argv() is None
    assert shim.config.read_text() == text


@pytest.mark.parametrize("runtime_from", ["variable", "file"])
def test_a_settings_file_that_cannot_be_used_passes_a_container_that_asks_for_nothing(shim: Shim, tmp_path: Path,
                                                                                      runtime_from: str) -> None:
    """The rule in oci_gpu_hook/config.py: the default request names decide; the runtime is the one a pass-through
    command gets (OCI_GPU_HOOK_RUNTIME, else the broken file's runtime line, read leniently)."""
    settings = tmp_path / "config.toml"
    settings.write_text(f'runtime = "{shim.runtime}"\nmask_other_gpu = true\n')
    extra = {"OCI_GPU_HOOK_CONFIG": str(settings)}
    if runtime_from == "file":
        extra["OCI_GPU_HOOK_RUNTIME"] = ""
    before = shim.write_spec(["PATH=/bin", "AMD_VISIBLE_DEVICES="])
    log = shim.out / "runc.log"
    args = ["--log", str(log), "create", "--bundle", str(shim.bundle), "ctr"]
    result = shim.run(*args, **extra)
    assert result.returncode == FAKE_EXIT, result.stderr
    assert result.stderr.startswith("oci-gpu-hook: warning: config file ") and result.stderr.count("\n") == 1
    assert "(did you mean 'mask_other_gpus'?)" in result.stderr and "asks for no GPU" in result.stderr
    assert shim.runtime_argv() == [str(shim.runtime), *args]
    assert shim.config.read_bytes() == before
    (shim.out / "argv").unlink()
    shim.write_spec(["PATH=/bin", "AMD_VISIBLE_DEVICES=1"])
    line = assert_one_error_line(shim.run(*args, **extra))
    assert line.startswith(f"oci-gpu-hook: error: config file {settings}: unknown key 'mask_other_gpu'")
    assert shim.runtime_argv() is None
    assert "level=error" in log.read_text() and "mask_other_gpu" in log.read_text()  # where podman/conmon look


def test_missing_bundle_config_fails(shim: Shim) -> None:
    line = assert_one_error_line(shim.run("create", "--bundle", str(shim.out / "nope"), "ctr"))
    assert "config.json" in line
    assert shim.runtime_argv() is None


def test_missing_runtime_fails(shim: Shim) -> None:
    line = assert_one_error_line(shim.run("state", "ctr", OCI_GPU_HOOK_RUNTIME=str(shim.out / "no-runc")))
    assert "no-runc" in line


def test_runtime_not_on_path_fails(shim: Shim) -> None:
    line = assert_one_error_line(shim.run("state", "ctr", OCI_GPU_HOOK_RUNTIME="no-such-runc-here",
                                          PATH=str(shim.out)))
    assert "no-such-runc-here" in line


def test_runtime_found_on_path(shim: Shim) -> None:
    result = shim.run("state", "ctr", OCI_GPU_HOOK_RUNTIME="fake-runc",
                      PATH=f"{shim.runtime.parent}:{os.environ.get('PATH', '')}")
    assert result.returncode == FAKE_EXIT, result.stderr
    assert shim.runtime_argv() == [str(shim.runtime), "state", "ctr"]


def _launcher(tmp_path: Path) -> Path:
    launcher = tmp_path / "oci-gpu-runtime"
    launcher.write_text(f"#!{sys.executable}\nimport sys\n"
                        "from oci_gpu_hook.entry.runtime import main\nsys.exit(main())\n")
    launcher.chmod(0o755)
    return launcher


def test_runtime_pointing_at_the_shim_itself_is_refused(shim: Shim, tmp_path: Path) -> None:
    launcher = _launcher(tmp_path)
    shim.write_spec(["AMD_VISIBLE_DEVICES=1"])
    result = shim.run("create", "--bundle", str(shim.bundle), "ctr", argv0=[str(launcher)],
                      OCI_GPU_HOOK_RUNTIME=str(launcher))
    line = assert_one_error_line(result)
    assert "shim itself" in line


def test_runtime_pointing_at_the_shim_through_a_link_is_refused(shim: Shim, tmp_path: Path) -> None:
    launcher = _launcher(tmp_path)
    link = tmp_path / "runc"
    link.symlink_to(launcher)
    result = shim.run("state", "ctr", argv0=[str(launcher)], OCI_GPU_HOOK_RUNTIME=str(link))
    assert "shim itself" in assert_one_error_line(result)


def test_launcher_with_a_real_runtime_works(shim: Shim, tmp_path: Path) -> None:
    launcher = _launcher(tmp_path)
    shim.write_spec(["AMD_VISIBLE_DEVICES=1"])
    result = shim.run("create", "--bundle", str(shim.bundle), "ctr", argv0=[str(launcher)])
    assert result.returncode == FAKE_EXIT, result.stderr
    assert device_paths(shim.runtime_saw()) == GPU1_PATHS
