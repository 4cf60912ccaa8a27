"""``oci-gpu-hook`` as operators and podman run it: a subprocess, stdout, stderr and the exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from oci_gpu_hook import models
from tests.helpers.clilib import EXAMPLE_BUNDLE, EXAMPLE_SYSFS, REPO, assert_one_error_line, clean_env, cli, spec_text

SCHEMA_DIRS = [REPO / "schemas", REPO / "oci_gpu_hook" / "schemas"]
GPU1_PATHS = ["/dev/dri/card2", "/dev/dri/renderD129", "/dev/kfd"]


def linux_device_paths(spec: dict[str, Any]) -> list[str]:
    return [d["path"] for d in spec.get("linux", {}).get("devices", [])]


# --- list -------------------------------------------------------------------------


def test_list_table() -> None:
    result = cli("list")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:6] == ["KIND", "INDEX", "NAME", "PCI", "ADDRESS", "PARTITION"]
    rows = [line.split() for line in lines[1:9]]
    assert [row[1] for row in rows] == [str(i) for i in range(8)]
    assert rows[1][:10] == ["amd", "1", "0000:23:00.0", "0000:23:00.0", "-", "-", "card2", "renderD129", "0",
                            "0x3149e0fac5157acf"]
    assert rows[7][:9] == ["amd", "7", "0000:e3:00.0", "0000:e3:00.0", "-", "-", "card8", "renderD135", "1"]
    assert lines[9] == "shared by amd GPUs: /dev/kfd (c 234:0)"
    assert lines[10].startswith("ignored: 0000:c1:00.0: ast")
    assert len(lines) == 11


def test_list_partitions_and_other_kinds() -> None:
    cpx = cli("list", "--sysfs-root", str(REPO / "examples" / "hosts" / "mi300x-2x-cpx" / "sys")).stdout.splitlines()
    # the stable name of a partition: its GPU's PCI address and its partition number
    assert cpx[10].split()[:7] == ["amd", "9", "0000:26:00.0-p1", "0000:26:00.0", "1", "(amdgpu_xcp_7)", "CPX/NPS1"]
    assert cpx[1].split()[:3] == ["amd", "0", "0000:05:00.0-p0"]
    mixed = cli("list", "--sysfs-root", str(REPO / "examples" / "hosts" / "intel-igpu-2x-gfx1100" / "sys"))
    kinds = [line.split()[:2] for line in mixed.stdout.splitlines()[1:4]]
    assert kinds == [["amd", "0"], ["amd", "1"], ["intel", "0"]]


def test_list_global_option_after_the_command(tmp_path: Path) -> None:
    (tmp_path / "class" / "drm").mkdir(parents=True)  # a sysfs tree without GPUs
    result = cli("list", "--sysfs-root", str(tmp_path), env=clean_env(OCI_GPU_HOOK_SYSFS_ROOT="/nonexistent"))
    assert result.returncode == 0, result.stderr
    assert f"(no GPUs under {tmp_path})" in result.stdout
    assert "shared by" not in result.stdout


@pytest.mark.parametrize("args", [("list",), ("list", "--json"), ("cdi", "generate")])
def test_a_host_tree_given_without_its_sys_says_what_to_try(args: tuple[str, ...], tmp_path: Path) -> None:
    host = EXAMPLE_SYSFS.parent
    line = assert_one_error_line(cli("--sysfs-root", str(host), *args))
    assert line == f"oci-gpu-hook: error: sysfs root {host}: no class/drm here; did you mean {EXAMPLE_SYSFS}?\n"
    line = assert_one_error_line(cli("--sysfs-root", str(tmp_path), *args))  # no class/, no bus/
    assert line == (f"oci-gpu-hook: error: sysfs root {tmp_path}: no class/ or bus/ here, not a sysfs tree "
                    "(try --sysfs-root /sys)\n")


def test_list_json_matches_the_schema() -> None:
    result = cli("list", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    schema = json.loads((REPO / "schemas" / "inventory.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(data)
    assert data["sysfs_root"] == str(EXAMPLE_SYSFS)
    assert len(data["devices"]) == 8
    gpu1 = data["devices"][1]
    assert (gpu1["kind"], gpu1["index"], gpu1["name"], gpu1["pci_address"]) == ("amd", 1, "0000:23:00.0",
                                                                                 "0000:23:00.0")
    assert gpu1["nodes"] == [{"path": "/dev/dri/card2", "type": "c", "major": 226, "minor": 2},
                             {"path": "/dev/dri/renderD129", "type": "c", "major": 226, "minor": 129}]
    assert gpu1["unique_id"] == "0x3149e0fac5157acf"
    assert data["shared_nodes"] == {"amd": [{"path": "/dev/kfd", "type": "c", "major": 234, "minor": 0}], "intel": [],
                                   "nvidia": []}


def test_inventory_schema_rejects_a_broken_inventory() -> None:
    data = json.loads(cli("list", "--json").stdout)
    data["devices"][0]["pci_address"] = "23:00.0"
    schema = json.loads((REPO / "schemas" / "inventory.schema.json").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate(data)


# --- dry-run ----------------------------------------------------------------------


def test_dry_run_bundle() -> None:
    before = (EXAMPLE_BUNDLE / "config.json").read_bytes()
    result = cli("dry-run", str(EXAMPLE_BUNDLE))
    assert result.returncode == 0, result.stderr
    new = json.loads(result.stdout)
    assert linux_device_paths(new) == GPU1_PATHS
    rules = new["linux"]["resources"]["devices"]
    assert rules[0] == {"allow": False, "access": "rwm"}
    assert [(r["major"], r["minor"]) for r in rules[1:]] == [(226, 2), (226, 129), (234, 0)]
    assert result.stderr == "# amd 1 (0000:23:00.0): /dev/dri/card2 /dev/dri/renderD129 /dev/kfd\n"
    assert "hooks" not in new  # the by-path links are a read-only mount of a directory dry-run prepared
    by_path = new["mounts"][-1]
    assert by_path["destination"] == "/dev/dri/by-path" and by_path["options"] == ["bind", "ro", "nosuid", "noexec",
                                                                                   "nodev"]
    assert sorted((p.name, os.readlink(p)) for p in Path(by_path["source"]).iterdir()) == [
        ("pci-0000:23:00.0-card", "../card2"), ("pci-0000:23:00.0-render", "../renderD129")]
    assert (EXAMPLE_BUNDLE / "config.json").read_bytes() == before


def test_dry_run_config_file_path() -> None:
    result = cli("dry-run", str(EXAMPLE_BUNDLE / "config.json"))
    assert result.returncode == 0, result.stderr
    assert linux_device_paths(json.loads(result.stdout)) == GPU1_PATHS


def test_dry_run_diff() -> None:
    result = cli("dry-run", "--diff", str(EXAMPLE_BUNDLE))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("--- ") and "(as given)" in lines[0]
    assert lines[1].startswith("+++ ") and "(rewritten)" in lines[1]
    added = "\n".join(line for line in lines if line.startswith("+") and not line.startswith("+++"))
    for path in GPU1_PATHS:
        assert f'"path": "{path}"' in added
    removed = [line for line in lines if line.startswith("-") and not line.startswith("---")]
    assert all('"path"' not in line for line in removed)


def test_dry_run_devices_pci_address() -> None:
    result = cli("dry-run", "--devices", "0000:23:00.0", str(EXAMPLE_BUNDLE))
    assert result.returncode == 0, result.stderr
    assert linux_device_paths(json.loads(result.stdout)) == GPU1_PATHS


def test_dry_run_devices_replaces_the_env_request(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(spec_text(["AMD_VISIBLE_DEVICES=5"]))
    result = cli("dry-run", "--devices", "0000:23:00.0", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert linux_device_paths(json.loads(result.stdout)) == GPU1_PATHS
    result = cli("dry-run", str(tmp_path))
    assert linux_device_paths(json.loads(result.stdout)) == ["/dev/dri/card6", "/dev/dri/renderD133", "/dev/kfd"]


def test_dry_run_without_request_prints_the_spec_unchanged(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(spec_text(["PATH=/bin"]))
    result = cli("dry-run", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(spec_text(["PATH=/bin"]))
    assert "no GPU requested" in result.stderr


# --- precreate --------------------------------------------------------------------


def test_precreate_rewrites_stdin() -> None:
    result = cli("precreate", stdin=(EXAMPLE_BUNDLE / "config.json").read_text())
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    new = json.loads(result.stdout)
    assert linux_device_paths(new) == GPU1_PATHS
    original = json.loads((EXAMPLE_BUNDLE / "config.json").read_text())
    assert new["process"] == original["process"]
    assert new["mounts"][:-1] == original["mounts"]  # the by-path links: one mount, after the spec's own
    assert new["mounts"][-1]["destination"] == "/dev/dri/by-path" and "hooks" not in new


@pytest.mark.parametrize("env", [["PATH=/bin"], ["AMD_VISIBLE_DEVICES=none"], ["AMD_VISIBLE_DEVICES="]])
def test_precreate_without_request_echoes_the_text(env: list[str]) -> None:
    text = spec_text(env) + "\n  \n"
    result = cli("precreate", stdin=text)
    assert result.returncode == 0, result.stderr
    assert result.stdout == text


def test_precreate_writes_the_log_file(tmp_path: Path) -> None:
    log = tmp_path / "hook.jsonl"
    result = cli("precreate", stdin=spec_text(["AMD_VISIBLE_DEVICES=1"]),
                 env=clean_env(OCI_GPU_HOOK_LOG_FILE=str(log)))
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 1
    assert records[0]["entry"] == "precreate"
    assert records[0]["outcome"] == "ok"
    assert records[0]["devices"] == GPU1_PATHS


# --- a config that cannot be used (the rule in oci_gpu_hook/config.py) --------------

BROKEN_CONFIGS = {
    "typo": ("mask_other_gpu = true\n", 0o644, "unknown key 'mask_other_gpu' (did you mean 'mask_other_gpus'?)"),
    "not-toml": ("runtime = \n", 0o644, "not valid TOML"),
    "bad-value": ("cgroup_access = 'rwx'\n", 0o644, "bad value 'rwx' for 'cgroup_access'"),
    "untrusted": ("debug = false\n", 0o646, "is not trusted"),
    "unreadable": (None, 0o644, "cannot read"),
}
NO_REQUEST = [["PATH=/bin"], ["AMD_VISIBLE_DEVICES="], ["AMD_VISIBLE_DEVICES=none", "NVIDIA_VISIBLE_DEVICES=void"],
              ["MY_GPUS=1", "amd_visible_devices=1", "NVIDIA_DRIVER_CAPABILITIES=all"]]
ASKING = [["AMD_VISIBLE_DEVICES=1"], ["NVIDIA_VISIBLE_DEVICES=all"], ["INTEL_VISIBLE_DEVICES=0"]]


def broken_config(tmp_path: Path, name: str) -> tuple[Path, str]:
    text, mode, what = BROKEN_CONFIGS[name]
    path = tmp_path / "etc" / "config.toml"
    path.parent.mkdir(exist_ok=True)
    if text is None:
        path.mkdir()  # a directory where the file should be: it cannot be read
    else:
        path.write_text(text)
        path.chmod(mode)
    return path, what


def annotated(env: list[str], annotations: dict[str, str] | None) -> str:
    spec = json.loads(spec_text(env))
    if annotations is not None:
        spec["annotations"] = annotations
    return json.dumps(spec, indent=4)


def assert_one_warning_line(result: Any, what: str) -> None:
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith("oci-gpu-hook: warning: config file ") and result.stderr.count("\n") == 1
    assert what in result.stderr and "asks for no GPU" in result.stderr


@pytest.mark.parametrize("broken", sorted(BROKEN_CONFIGS))
@pytest.mark.parametrize("env", NO_REQUEST, ids=range(len(NO_REQUEST)))
def test_precreate_with_a_broken_config_passes_what_asks_for_nothing(tmp_path: Path, broken: str,
                                                                     env: list[str]) -> None:
    config, what = broken_config(tmp_path, broken)
    text = annotated(env, {"cdi.k8s.io/x": "vendor.example/gpu=0"}) + "\n"
    result = cli("precreate", stdin=text, env=clean_env(OCI_GPU_HOOK_CONFIG=str(config)))
    assert_one_warning_line(result, what)
    assert result.stdout == text


@pytest.mark.parametrize("broken", sorted(BROKEN_CONFIGS))
@pytest.mark.parametrize("env", [*ASKING, []], ids=range(len(ASKING) + 1))
def test_precreate_with_a_broken_config_refuses_a_request(tmp_path: Path, broken: str, env: list[str]) -> None:
    config, what = broken_config(tmp_path, broken)
    annotations = None if env else {"cdi.k8s.io/x": "amd.com/gpu=0"}
    result = cli("precreate", stdin=annotated(env, annotations),
                 env=clean_env(OCI_GPU_HOOK_CONFIG=str(config)))
    line = assert_one_error_line(result)
    assert line.startswith(f"oci-gpu-hook: error: config file {config}") and what in line
    assert result.stdout == ""


def test_a_bad_variable_is_a_broken_config_too() -> None:
    result = cli("precreate", stdin=spec_text(["PATH=/bin"]), env=clean_env(OCI_GPU_HOOK_DEBUG="maybe"))
    assert result.returncode == 0 and "warning: environment variable OCI_GPU_HOOK_DEBUG" in result.stderr
    result = cli("precreate", stdin=spec_text(["AMD_VISIBLE_DEVICES=1"]), env=clean_env(OCI_GPU_HOOK_DEBUG="maybe"))
    assert "OCI_GPU_HOOK_DEBUG: bad value 'maybe'" in assert_one_error_line(result)


@pytest.mark.parametrize("broken", ["typo", "untrusted"])
def test_prestart_with_a_broken_config(tmp_path: Path, broken: str) -> None:
    """The live hook decides before it looks at the container (the state's pid is not one here)."""
    config, what = broken_config(tmp_path, broken)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    state = json.dumps({"ociVersion": "1.0.2", "id": "ctr-1", "pid": 1, "bundle": str(bundle), "status": "created"})
    (bundle / "config.json").write_text(spec_text(["AMD_VISIBLE_DEVICES=none"]))
    assert_one_warning_line(cli("prestart", stdin=state, env=clean_env(OCI_GPU_HOOK_CONFIG=str(config))), what)
    (bundle / "config.json").write_text(spec_text(["AMD_VISIBLE_DEVICES=1"]))
    line = assert_one_error_line(cli("prestart", stdin=state, env=clean_env(OCI_GPU_HOOK_CONFIG=str(config))))
    assert line.startswith(f"oci-gpu-hook: error: config file {config}") and what in line


def test_operator_commands_still_fail_on_a_broken_config(tmp_path: Path) -> None:
    config, what = broken_config(tmp_path, "typo")
    for args in (("list",), ("dry-run", str(EXAMPLE_BUNDLE)), ("validate",)):
        assert what in assert_one_error_line(cli(*args, env=clean_env(OCI_GPU_HOOK_CONFIG=str(config)))), args


# --- errors -----------------------------------------------------------------------


def test_bad_request_in_dry_run() -> None:
    line = assert_one_error_line(cli("dry-run", "--devices", "9", str(EXAMPLE_BUNDLE)))
    assert "'9'" in line and "valid:" in line


def test_bad_request_in_precreate_prints_no_spec() -> None:
    result = cli("precreate", stdin=spec_text(["AMD_VISIBLE_DEVICES=banana"]))
    line = assert_one_error_line(result)
    assert "'banana'" in line
    assert result.stdout == ""


def test_bad_request_is_logged(tmp_path: Path) -> None:
    log = tmp_path / "hook.jsonl"
    result = cli("precreate", stdin=spec_text(["AMD_VISIBLE_DEVICES=8"]), env=clean_env(OCI_GPU_HOOK_LOG_FILE=str(log)))
    line = assert_one_error_line(result)
    records = [json.loads(x) for x in log.read_text().splitlines()]
    assert records[-1]["outcome"] == "error"
    assert records[-1]["error"] == line.rstrip("\n")


def test_missing_file() -> None:
    line = assert_one_error_line(cli("dry-run", "/nonexistent/bundle/config.json"))
    assert "/nonexistent/bundle/config.json" in line


def test_invalid_json_file(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text('{"process": {"env": ["AMD_VISIBLE_DEVICES=1"]},\n')
    line = assert_one_error_line(cli("dry-run", str(bad)))
    assert str(bad) in line
    assert "JSON" in line


@pytest.mark.parametrize("text", ["{", "", "[1] [2]", '{"a": NaN}'])
def test_invalid_json_on_stdin(text: str) -> None:
    result = cli("precreate", stdin=text)
    line = assert_one_error_line(result)
    assert "not valid JSON" in line
    assert result.stdout == ""


def test_wrong_shape_on_stdin() -> None:
    result = cli("precreate", stdin='{"process": {"env": ["AMD_VISIBLE_DEVICES=1"]}, "linux": {"devices": {}}}')
    assert "linux.devices" in assert_one_error_line(result)
    assert result.stdout == ""


def test_spec_failing_the_oci_schema(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"ociVersion": 1}))
    line = assert_one_error_line(cli("dry-run", str(tmp_path)))
    assert "ociVersion" in line


def test_unknown_command() -> None:
    line = assert_one_error_line(cli("frobnicate"), 2)
    assert "'frobnicate'" in line
    assert "valid:" in line


@pytest.mark.parametrize("args", [
    ("list", "--bogus"),
    ("dry-run",),
    ("dry-run", "--devices"),
    ("dry-run", "--nope", str(EXAMPLE_BUNDLE)),
    ("precreate", "extra"),
    ("--sysfs-root",),
    ("validate", "--config-file"),
])
def test_bad_flags(args: tuple[str, ...]) -> None:
    assert_one_error_line(cli(*args, stdin=""), 2)  # a usage error


def test_no_command_is_usage() -> None:
    result = cli()
    assert result.returncode == 2
    assert result.stdout.startswith("usage: oci-gpu-hook")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("flag", ["--help", "-h", "help"])
def test_help(flag: str) -> None:
    result = cli(flag)
    assert result.returncode == 0
    assert result.stdout.startswith("usage: oci-gpu-hook")


def test_version() -> None:
    result = cli("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("oci-gpu-hook ")


def test_unreadable_sysfs_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "drm").write_text("")
    line = assert_one_error_line(cli("list", env=clean_env(OCI_GPU_HOOK_SYSFS_ROOT=str(tmp_path))))
    assert "drm" in line


def test_bad_config_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "config.toml"
    bad.write_text("colour = 1\n")
    line = assert_one_error_line(cli("list", env=clean_env(OCI_GPU_HOOK_CONFIG=str(bad))))
    assert "'colour'" in line
    line = assert_one_error_line(cli("--config", str(bad), "list"))
    assert "'colour'" in line


# --- validate ---------------------------------------------------------------------


def test_validate_good_config(tmp_path: Path) -> None:
    good = tmp_path / "config.toml"
    good.write_text('runtime = "crun"\nrequest_env = {amd = ["AMD_VISIBLE_DEVICES"]}\ndevice_file_mode = 0o660\n'
                    'cgroup_access = "rw"\ndebug = false\n')
    result = cli("validate", "--config-file", str(good), str(EXAMPLE_BUNDLE))
    assert result.returncode == 0, result.stderr
    assert f"ok: config file {good}" in result.stdout
    assert f"ok: {EXAMPLE_BUNDLE / 'config.json'}" in result.stdout


@pytest.mark.parametrize(("text", "key"), [
    ("colour = 'blue'\n", "colour"),
    ("device_uid = 'root'\n", "device_uid"),
    ("cgroup_access = 'rwx'\n", "cgroup_access"),
    ("request_env = {amd = []}\n", "request_env"),
    ("request_env = {amd = ['A', '']}\n", "request_env"),
    ("device_file_mode = 0o10000\n", "device_file_mode"),
    ("debug = 'yes please'\n", "debug"),
])
def test_validate_bad_config(tmp_path: Path, text: str, key: str) -> None:
    bad = tmp_path / "config.toml"
    bad.write_text(text)
    line = assert_one_error_line(cli("validate", "--config-file", str(bad)))
    assert key in line
    assert str(bad) in line


@pytest.mark.parametrize(("key", "meant"), [("mask_other_gpu", "mask_other_gpus"), ("sysfsroot", "sysfs_root"),
                                            ("cgroup_acess", "cgroup_access"), ("backend", "backends")])
def test_validate_says_what_a_typo_would_have_meant(tmp_path: Path, key: str, meant: str) -> None:
    bad = tmp_path / "config.toml"
    bad.write_text(f"{key} = true\n")
    line = assert_one_error_line(cli("validate", "--config-file", str(bad)))
    assert line == f"oci-gpu-hook: error: config file {bad}: unknown key '{key}' (did you mean '{meant}'?)\n"


def test_validate_config_that_is_not_toml(tmp_path: Path) -> None:
    bad = tmp_path / "config.toml"
    bad.write_text("runtime = \n")
    assert str(bad) in assert_one_error_line(cli("validate", "--config-file", str(bad)))


def test_validate_missing_config_file(tmp_path: Path) -> None:
    missing = tmp_path / "absent.toml"
    assert str(missing) in assert_one_error_line(cli("validate", "--config-file", str(missing)))


def bundle_asking(tmp_path: Path, env: list[str]) -> Path:
    (tmp_path / "config.json").write_text(spec_text(env))
    return tmp_path


def test_validate_resolves_the_request_against_the_host() -> None:
    result = cli("validate", str(EXAMPLE_BUNDLE))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == (f"ok: {EXAMPLE_BUNDLE / 'config.json'}: amd 1 (0000:23:00.0): "
                                              "/dev/dri/card2 /dev/dri/renderD129 /dev/kfd")
    other = REPO / "examples" / "hosts" / "shuffled-4x-gfx942" / "sys"  # the same request, another host
    result = cli("validate", str(EXAMPLE_BUNDLE), env=clean_env(OCI_GPU_HOOK_SYSFS_ROOT=str(other)))
    assert result.stdout.splitlines()[-1].startswith(f"ok: {EXAMPLE_BUNDLE / 'config.json'}: amd 1 (0000:1b:00.0): ")


def test_validate_a_bundle_without_a_request(tmp_path: Path) -> None:
    result = cli("validate", str(bundle_asking(tmp_path, ["PATH=/bin"])))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == f"ok: {tmp_path / 'config.json'}: no GPU requested"


@pytest.mark.parametrize(("env", "sysfs", "expected"), [
    (["AMD_VISIBLE_DEVICES=1,9"], EXAMPLE_SYSFS, "'9' is out of range (the host has 8 amd GPUs)"),
    (["AMD_VISIBLE_DEVICES=gpu1"], EXAMPLE_SYSFS, "'gpu1'"),
    (["AMD_VISIBLE_DEVICES=0"], REPO / "examples" / "hosts" / "intel-i915-xe" / "sys", "AMD_VISIBLE_DEVICES=0"),
], ids=["out-of-range", "malformed", "no-such-gpu-on-this-host"])
def test_validate_refuses_what_a_container_start_would_refuse(tmp_path: Path, env: list[str], sysfs: Path,
                                                              expected: str) -> None:
    bundle = bundle_asking(tmp_path, env)
    line = assert_one_error_line(cli("validate", str(bundle), env=clean_env(OCI_GPU_HOOK_SYSFS_ROOT=str(sysfs))))
    assert line.startswith(f"oci-gpu-hook: error: {bundle / 'config.json'}: ")
    assert expected in line
    started = cli("dry-run", str(bundle), env=clean_env(OCI_GPU_HOOK_SYSFS_ROOT=str(sysfs)))  # the same refusal
    assert started.returncode == 1 and line.split(": ", 3)[-1] in started.stderr


def test_validate_writes_no_by_path_directory_and_refuses_a_symlinked_one(tmp_path: Path) -> None:
    """validate rewrites in memory: the by-path directory is checked where it is there, never made; a symlink on
    the way to by_path_dir is refused as the shim refuses it, never followed."""
    fresh = tmp_path / "fresh" / "by-path"
    done = cli("validate", str(EXAMPLE_BUNDLE), env=clean_env(OCI_GPU_HOOK_BY_PATH_DIR=str(fresh)))
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "fresh").exists()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    if os.geteuid() == 0:  # dry-run as another user: its output runc could not run; it writes nothing either
        (tmp_path / "fresh").mkdir(mode=0o777)
        done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                               "oci_gpu_hook.entry.cli", "dry-run", str(EXAMPLE_BUNDLE)], capture_output=True,
                              text=True, env=clean_env(OCI_GPU_HOOK_BY_PATH_DIR=str(fresh)), cwd=REPO, timeout=60,
                              check=False)
        assert done.returncode == 0 and json.loads(done.stdout)["mounts"][-1]["source"].startswith(str(fresh)), \
            done.stderr
        assert list((tmp_path / "fresh").iterdir()) == []
    for command in ("validate", "dry-run"):
        line = assert_one_error_line(cli(command, str(EXAMPLE_BUNDLE),
                                         env=clean_env(OCI_GPU_HOOK_BY_PATH_DIR=str(tmp_path / "link" / "by-path"))))
        assert f"{tmp_path / 'link'} is a symlink or not a directory" in line, line
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_validate_bad_spec(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "process": {"env": "x"}}))
    line = assert_one_error_line(cli("validate", str(tmp_path)))
    assert "process" in line


# --- checked-in schemas -----------------------------------------------------------


@pytest.mark.parametrize("directory", SCHEMA_DIRS, ids=lambda d: str(d.relative_to(REPO)))
@pytest.mark.parametrize("name", sorted(models.GENERATED_SCHEMAS))
def test_checked_in_schemas_are_up_to_date(directory: Path, name: str) -> None:
    expected = models.schema_text(models.GENERATED_SCHEMAS[name])
    assert (directory / name).read_text() == expected, f"regenerate: python -m oci_gpu_hook.models {directory}"


def test_generated_schemas_cover_both_files() -> None:
    assert set(models.GENERATED_SCHEMAS) == {"config.schema.json", "inventory.schema.json"}


def test_config_schema_checks_what_validate_checks() -> None:
    schema = json.loads((REPO / "schemas" / "config.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid({"runtime": "crun", "device_file_mode": 432})
    assert not validator.is_valid({"colour": "blue"})
    assert not validator.is_valid({"device_file_mode": 0o10000})
    assert not validator.is_valid({"cgroup_access": "rwx"})
