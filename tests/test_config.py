"""Settings: defaults, then the TOML file, then OCI_GPU_HOOK_* variables, then overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from oci_gpu_hook import config as config_module
from oci_gpu_hook.config import FIELDS, Config, load_config, load_file
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.models import ConfigModel

EXPECTED_DEFAULTS = {
    "sysfs_root": "/sys",
    "proc_root": "/proc",
    "driver_root": "/",
    "runtime": "runc",
    "backends": ("amd", "intel", "nvidia"),
    "request_env": {"amd": ["AMD_VISIBLE_DEVICES"], "intel": ["INTEL_VISIBLE_DEVICES"],
                    "nvidia": ["NVIDIA_VISIBLE_DEVICES"]},
    "allow_env_requests": True,
    "cdi_dir": "/var/run/cdi",
    "hook_path": "/usr/local/libexec/oci-gpu-hook/oci-gpu-hook",
    "by_path_dir": "/run/oci-gpu-hook/by-path",
    "mask_other_gpus": False,
    "device_file_mode": 0o666,
    "device_uid": 0,
    "device_gid": 0,
    "cgroup_access": "rwm",
    "log_file": "",
    "syslog": True,
    "debug": False,
    "health_ue_start": 0,
    "health_ue_rise": 0,
    "health_hold": 300,
    "health_noexecute": (),
}


@pytest.fixture(autouse=True)
def no_system_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never let the host's /etc/oci-gpu-hook/config.toml leak into a test, nor the session's by_path_dir (these
    tests only load settings)."""
    monkeypatch.setattr(config_module, "DEFAULT_CONFIG_PATH", str(tmp_path / "absent" / "config.toml"))
    monkeypatch.delenv("OCI_GPU_HOOK_BY_PATH_DIR", raising=False)


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return str(path)


def test_defaults() -> None:
    cfg = load_config({})
    assert cfg.as_dict() == EXPECTED_DEFAULTS
    assert cfg.source == "defaults"


def test_config_object_defaults() -> None:
    assert Config().as_dict() == EXPECTED_DEFAULTS


def test_default_path_is_read_when_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, 'runtime = "crun"\n')
    monkeypatch.setattr(config_module, "DEFAULT_CONFIG_PATH", path)
    cfg = load_config({})
    assert cfg.runtime == "crun"
    assert cfg.source == path


FULL_FILE = """
sysfs_root = "/srv/fake/sys"
runtime = "/usr/bin/crun"
backends = ["amd"]
allow_env_requests = false
cdi_dir = "/etc/cdi"
hook_path = "/opt/ogh/oci-gpu-hook"
by_path_dir = "/run/ogh/by-path"
mask_other_gpus = true
device_file_mode = 0o660
device_uid = 0
device_gid = 44
cgroup_access = "rw"
log_file = "/var/log/oci-gpu-hook.jsonl"
syslog = false
debug = true
health_ue_rise = 3
health_hold = 60
health_noexecute = ["wedged", "ras-uncorrectable"]

[request_env]
amd = ["AMD_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"]
"""


def test_file_values(tmp_path: Path) -> None:
    path = write(tmp_path, FULL_FILE)
    cfg = load_config({"OCI_GPU_HOOK_CONFIG": path})
    assert cfg.as_dict() == {
        "sysfs_root": "/srv/fake/sys",
        "proc_root": "/proc",
        "driver_root": "/",
        "runtime": "/usr/bin/crun",
        "backends": ("amd",),
        "request_env": {"amd": ["AMD_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"], "intel": ["INTEL_VISIBLE_DEVICES"],
                        "nvidia": ["NVIDIA_VISIBLE_DEVICES"]},
        "allow_env_requests": False,
        "cdi_dir": "/etc/cdi",
        "hook_path": "/opt/ogh/oci-gpu-hook",
        "by_path_dir": "/run/ogh/by-path",
        "mask_other_gpus": True,
        "device_file_mode": 0o660,
        "device_uid": 0,
        "device_gid": 44,
        "cgroup_access": "rw",
        "log_file": "/var/log/oci-gpu-hook.jsonl",
        "syslog": False,
        "debug": True,
        "health_ue_start": 0,
        "health_ue_rise": 3,
        "health_hold": 60,
        "health_noexecute": ("wedged", "ras-uncorrectable"),
    }
    assert cfg.source == path


def test_partial_file_keeps_other_defaults(tmp_path: Path) -> None:
    cfg = load_config({"OCI_GPU_HOOK_CONFIG": write(tmp_path, "device_gid = 44\n")})
    assert cfg.device_gid == 44
    assert {k: v for k, v in cfg.as_dict().items() if k != "device_gid"} == {
        k: v for k, v in EXPECTED_DEFAULTS.items() if k != "device_gid"}


def test_relative_sysfs_root_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config({"OCI_GPU_HOOK_SYSFS_ROOT": "fake/sys"})
    assert cfg.sysfs_root == str(tmp_path / "fake" / "sys")


def test_env_beats_file(tmp_path: Path) -> None:
    path = write(tmp_path, FULL_FILE)
    cfg = load_config({
        "OCI_GPU_HOOK_CONFIG": path,
        "OCI_GPU_HOOK_SYSFS_ROOT": "/other/sys",
        "OCI_GPU_HOOK_RUNTIME": "runc",
        "OCI_GPU_HOOK_LOG_FILE": "/tmp/x.log",
        "OCI_GPU_HOOK_DEBUG": "off",
    })
    assert cfg.sysfs_root == "/other/sys"
    assert cfg.runtime == "runc"
    assert cfg.log_file == "/tmp/x.log"
    assert cfg.debug is False
    assert cfg.device_gid == 44  # no variable for it: the file's value stands
    assert path in cfg.source and "OCI_GPU_HOOK_SYSFS_ROOT" in cfg.source


def test_empty_log_file_variable_turns_logging_off(tmp_path: Path) -> None:
    cfg = load_config({"OCI_GPU_HOOK_CONFIG": write(tmp_path, FULL_FILE), "OCI_GPU_HOOK_LOG_FILE": ""})
    assert cfg.log_file == ""


def test_empty_variable_is_ignored(tmp_path: Path) -> None:
    cfg = load_config({"OCI_GPU_HOOK_CONFIG": write(tmp_path, FULL_FILE), "OCI_GPU_HOOK_SYSFS_ROOT": "",
                       "OCI_GPU_HOOK_RUNTIME": ""})
    assert cfg.sysfs_root == "/srv/fake/sys"
    assert cfg.runtime == "/usr/bin/crun"


@pytest.mark.parametrize(("text", "expected"), [
    ("1", True), ("true", True), ("YES", True), ("on", True),
    ("0", False), ("false", False), ("No", False), ("off", False),
])
def test_debug_variable(text: str, expected: bool) -> None:
    assert load_config({"OCI_GPU_HOOK_DEBUG": text}).debug is expected


def test_overrides_beat_env(tmp_path: Path) -> None:
    cfg = load_config({"OCI_GPU_HOOK_SYSFS_ROOT": "/env/sys"}, {"sysfs_root": "/flag/sys", "debug": None})
    assert cfg.sysfs_root == "/flag/sys"
    assert cfg.debug is False
    assert "--sysfs-root" in cfg.source


def test_unknown_key_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, 'runtime = "runc"\ncolour = "blue"\n')
    with pytest.raises(HookError) as info:
        load_config({"OCI_GPU_HOOK_CONFIG": path})
    assert "'colour'" in str(info.value)
    assert path in str(info.value)


def test_table_is_an_unknown_key(tmp_path: Path) -> None:
    with pytest.raises(HookError, match="'hook'"):
        load_file(write(tmp_path, '[hook]\nruntime = "runc"\n'))


def test_renamed_key_says_its_new_name(tmp_path: Path) -> None:
    with pytest.raises(HookError, match=r"'cdi_spec'.*now 'cdi_dir'"):
        load_file(write(tmp_path, 'cdi_spec = "/etc/cdi/amd.json"\n'))


@pytest.mark.parametrize(("line", "key"), [
    ("device_uid = '0'", "device_uid"),
    ("device_uid = -1", "device_uid"),
    ("device_gid = true", "device_gid"),
    ("device_file_mode = 1.5", "device_file_mode"),
    ("debug = 1", "debug"),
    ("debug = 'maybe'", "debug"),
    ("sysfs_root = 5", "sysfs_root"),
    ("runtime = ['runc']", "runtime"),
    ("request_env = 'AMD_VISIBLE_DEVICES'", "request_env"),
    ("request_env = ['AMD_VISIBLE_DEVICES']", "request_env"),
    ("request_env = {amd = []}", "request_env"),
    ("request_env = {amd = ['']}", "request_env"),
    ("request_env = {amd = ['A', '']}", "request_env"),
    ("request_env = {amd = [1]}", "request_env"),
    ("request_env = {amd = ['A=B']}", "request_env"),
    ("request_env = {example = ['EXAMPLE_VISIBLE_DEVICES']}", "request_env"),
    ("request_env = {amd = ['X'], intel = ['X']}", "request_env"),
    ("backends = []", "backends"),
    ("backends = ['amd', 'amd']", "backends"),
    ("backends = ['example']", "backends"),
    ("debug = 'yes'", "debug"),
    ("runtime = ''", "runtime"),
    ("hook_path = ''", "hook_path"),
    ("device_uid = 4294967295", "device_uid"),
    ("log_file = false", "log_file"),
    ("cgroup_access = 'rwx'", "cgroup_access"),
    ("cgroup_access = ''", "cgroup_access"),
    ("device_file_mode = 0o10000", "device_file_mode"),
])
def test_wrong_type_or_value_names_the_key(tmp_path: Path, line: str, key: str) -> None:
    path = write(tmp_path, line + "\n")
    with pytest.raises(HookError) as info:
        load_config({"OCI_GPU_HOOK_CONFIG": path})
    assert key in str(info.value)


def test_bad_variable_names_the_variable_and_key() -> None:
    with pytest.raises(HookError) as info:
        load_config({"OCI_GPU_HOOK_DEBUG": "maybe"})
    assert "OCI_GPU_HOOK_DEBUG" in str(info.value)
    assert "'debug'" in str(info.value)


def test_missing_config_file_named_by_variable_is_an_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.toml")
    with pytest.raises(HookError) as info:
        load_config({"OCI_GPU_HOOK_CONFIG": missing})
    assert missing in str(info.value)


def test_invalid_toml_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "runtime = \n")
    with pytest.raises(HookError, match="not valid TOML"):
        load_config({"OCI_GPU_HOOK_CONFIG": path})


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    cfg = load_config({"OCI_GPU_HOOK_CONFIG": write(tmp_path, "")})
    assert cfg.as_dict() == EXPECTED_DEFAULTS


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def test_model_is_generated_from_the_fields() -> None:
    model_fields = ConfigModel.model_fields
    assert list(model_fields) == list(FIELDS)
    for name, field in FIELDS.items():
        assert _plain(model_fields[name].default) == _plain(field.default), name
    assert ConfigModel().model_dump() == {k: _plain(v) for k, v in Config().as_dict().items()}


SAMPLES = [line for line, _key in [
    ("device_uid = '0'", 0), ("device_uid = -1", 0), ("debug = 'yes'", 0), ("debug = 1", 0),
    ("request_env = {amd = ['A', '']}", 0), ("request_env = {amd = []}", 0), ("backends = []", 0),
    ("backends = ['example']", 0), ("cgroup_access = 'rwx'", 0), ("device_file_mode = 0o10000", 0),
    ("runtime = ''", 0), ("log_file = ''", 0), ("debug = true", 0), ("request_env = {intel = ['GPU_X']}", 0),
    ("backends = ['intel']", 0), ("device_gid = 4294967294", 0), ("cdi_dir = '/etc/cdi'", 0),
    ("health_hold = 0", 0), ("health_hold = -1", 0), ("health_ue_rise = 2.5", 0), ("health_noexecute = []", 0),
    ("health_noexecute = ['wedged', 'vanished']", 0), ("health_noexecute = ['wedged', 'wedged']", 0),
    ("health_noexecute = ['gone']", 0), ("health_noexecute = 'wedged'", 0),
]]


@pytest.mark.parametrize("line", SAMPLES)
def test_schema_and_loader_accept_the_same_files(tmp_path: Path, line: str) -> None:
    """The published JSON schema (generated from FIELDS) and the loader agree on what a config file may say."""
    import json
    import tomllib

    import jsonschema

    schema = json.loads((Path(__file__).resolve().parent.parent / "schemas" / "config.schema.json").read_text())
    by_schema = jsonschema.Draft202012Validator(schema).is_valid(tomllib.loads(line))
    try:
        load_file(write(tmp_path, line + "\n"))
        by_loader = True
    except HookError:
        by_loader = False
    assert by_schema == by_loader, line


def test_example_config_lists_every_key_with_its_default() -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "config.toml"
    values = load_file(str(example))
    assert list(values) == list(FIELDS) or set(values) == set(FIELDS)
    assert {k: _plain(v) for k, v in values.items()} == {k: _plain(f.default) for k, f in FIELDS.items()}


def test_a_typo_says_what_it_would_have_meant(tmp_path: Path) -> None:
    path = write(tmp_path, "mask_other_gpu = true\n")
    with pytest.raises(HookError) as info:
        load_config({"OCI_GPU_HOOK_CONFIG": path})
    assert str(info.value) == f"config file {path}: unknown key 'mask_other_gpu' (did you mean 'mask_other_gpus'?)"


def test_a_key_like_none_lists_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(HookError) as info:
        load_file(write(tmp_path, "colour = 1\n"))
    assert "did you mean" not in str(info.value) and f"(valid: {', '.join(FIELDS)})" in str(info.value)


# --- the rule for a config that cannot be used: the default request names alone decide ------------------------

@pytest.mark.parametrize(("env", "annotations", "asks"), [
    (["PATH=/bin"], None, False),
    (["AMD_VISIBLE_DEVICES="], None, False),
    (["AMD_VISIBLE_DEVICES=none", "INTEL_VISIBLE_DEVICES=void", "NVIDIA_VISIBLE_DEVICES= None "], None, False),
    (["AMD_VISIBLE_DEVICES=1", "AMD_VISIBLE_DEVICES="], None, False),  # the last entry wins, as in runc
    (["MY_GPUS=1", "amd_visible_devices=1", "NVIDIA_DRIVER_CAPABILITIES=all"], None, False),
    ([], {"cdi.k8s.io/x": "vendor.example/gpu=0", "other": "amd.com/gpu=1"}, False),
    (["AMD_VISIBLE_DEVICES=1"], None, True),
    (["AMD_VISIBLE_DEVICES=", "AMD_VISIBLE_DEVICES=0"], None, True),
    (["NVIDIA_VISIBLE_DEVICES=all"], None, True),
    (["INTEL_VISIBLE_DEVICES=card0"], None, True),
    (["AMD_VISIBLE_DEVICES=banana"], None, True),  # malformed: still a request
    ([], {"cdi.k8s.io/x": "nvidia.com/gpu=0"}, True),
    ([], {"cdi.k8s.io/x": "amd.com/gpu"}, True),  # malformed annotation of a known kind
])
def test_asks_by_default(env: list[str], annotations: dict[str, str] | None, asks: bool) -> None:
    from oci_gpu_hook.oci_spec import ContainerSpec
    from oci_gpu_hook.request import asks_by_default

    raw: dict[str, Any] = {"process": {"env": env}}
    if annotations is not None:
        raw["annotations"] = annotations
    assert asks_by_default(ContainerSpec(raw)) is asks


def test_without_config_raises_the_configs_own_error(capsys: pytest.CaptureFixture[str]) -> None:
    from oci_gpu_hook.oci_spec import ContainerSpec
    from oci_gpu_hook.request import on_unusable_config

    problem = HookError("config file /x: unknown key 'mask_other_gpu' (did you mean 'mask_other_gpus'?)")
    with pytest.raises(HookError) as info:
        on_unusable_config(ContainerSpec({"process": {"env": ["AMD_VISIBLE_DEVICES=0"]}}), problem, "precreate")
    assert info.value is problem
    assert capsys.readouterr().err == ""
    on_unusable_config(ContainerSpec({"process": {"env": ["AMD_VISIBLE_DEVICES=none"]}}), problem, "precreate")
    err = capsys.readouterr().err
    assert err.startswith(f"oci-gpu-hook: warning: {problem}; the container asks for no GPU") and err.count("\n") == 1


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_a_config_path_that_is_no_file_is_refused_unopened(tmp_path: Path, kind: str) -> None:
    """A FIFO at the config path would block the read of every container's start (no writer ever comes): it is
    refused, as a socket is, before any open could block; ``/dev/null`` stays the empty config."""
    import os
    import socket

    path = tmp_path / "config.toml"
    listening = None
    if kind == "fifo":
        os.mkfifo(path)
    else:
        listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listening.bind(str(path))
    try:
        with pytest.raises(HookError, match=r"cannot read \(it is not a regular file\)"):
            load_file(str(path))
    finally:
        if listening is not None:
            listening.close()
    assert load_config({"OCI_GPU_HOOK_CONFIG": os.devnull}).source == os.devnull
