"""CDI commands an operator can trust.  ``cdi generate --output DIR/`` makes the
directory or fails in one line; ``cdi list`` reads the spec directories as CDI consumers do
(pkg/cdi/spec-dirs.go, cache.go: a later directory overrides an earlier one per device name; two files in
one directory naming the same device are a conflict, and the device is dropped) and exits 1 when the node is
not right; ``cdi validate`` knows CDI up to 1.1.0 (specs-go/version.go).  Never the host's /etc/cdi."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from oci_gpu_hook.appliers import cdi
from oci_gpu_hook.install.paths import LAUNCHER_DIR
from tests.helpers.clilib import REPO, assert_one_error_line, clean_env

SEED = REPO / "examples" / "hosts" / "seed-8x-gfx1100" / "sys"
OTHER = REPO / "examples" / "hosts" / "shuffled-4x-gfx942" / "sys"


def hook(*args: str, cdi_dir: Path | None = None, sysfs: Path = SEED, umask: int | None = None,
         hook_path: str | None = None, hide_launchers: bool = False) -> subprocess.CompletedProcess[str]:
    """``oci-gpu-hook ARGS``; ``hide_launchers``: in a private mount namespace where the installed launchers'
    directory is empty (on a machine that is an installed node)."""
    env = clean_env(OCI_GPU_HOOK_SYSFS_ROOT=str(sysfs))
    if cdi_dir is not None:
        env["OCI_GPU_HOOK_CDI_DIR"] = str(cdi_dir)
    if hook_path is not None:
        env["OCI_GPU_HOOK_HOOK_PATH"] = hook_path

    def set_umask() -> None:
        if umask is not None:
            os.umask(umask)

    argv = [sys.executable, "-m", "oci_gpu_hook.entry.cli", *args]
    if hide_launchers:
        argv = ["unshare", "-m", "sh", "-c", f'mount -t tmpfs tmpfs {LAUNCHER_DIR} && exec "$@"', "sh", *argv]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=60, check=False,
                          preexec_fn=set_umask)


def generated(sysfs: Path = SEED) -> dict[str, Any]:
    done = hook("cdi", "generate", "--kind", "amd", sysfs=sysfs)
    assert done.returncode == 0, done.stderr
    spec: dict[str, Any] = json.loads(done.stdout)
    return spec


# --- generate --output ----------------------------------------------------------------------


def test_output_dir_is_created_0755_whatever_the_umask(tmp_path: Path) -> None:
    out = tmp_path / "new" / "cdi"
    done = hook("cdi", "generate", "--output", f"{out}/", umask=0o077)
    assert done.returncode == 0, done.stderr
    for directory in (tmp_path / "new", out):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o755
    assert os.listdir(out) == ["amd.com-gpu.json"]
    assert stat.S_IMODE((out / "amd.com-gpu.json").stat().st_mode) == 0o644


def test_output_dir_with_kind_is_never_made_a_file(tmp_path: Path) -> None:
    out = tmp_path / "nonexistent-dir"
    done = hook("cdi", "generate", "--kind", "amd", "--output", f"{out}/")
    assert done.returncode == 0, done.stderr
    assert out.is_dir() and os.listdir(out) == ["amd.com-gpu.json"]


def test_output_dir_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    line = assert_one_error_line(hook("cdi", "generate", "--output", f"{tmp_path}/file/sub/"))
    assert f"{tmp_path}/file is not a directory" in line
    line = assert_one_error_line(hook("cdi", "generate", "--output", f"{tmp_path}/file/"))
    assert f"{tmp_path}/file is not a directory" in line
    assert (tmp_path / "file").read_text() == ""


def test_output_file_needs_a_spec_extension_and_a_kind(tmp_path: Path) -> None:
    assert "ends in .json or .yaml" in assert_one_error_line(
        hook("cdi", "generate", "--kind", "amd", "--output", f"{tmp_path}/spec.txt"), 2)
    assert "--kind" in assert_one_error_line(hook("cdi", "generate", "--output", f"{tmp_path}/spec.json"), 2)
    assert os.listdir(tmp_path) == []
    done = hook("cdi", "generate", "--kind", "amd", "--output", f"{tmp_path}/sub/spec.yaml")
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load((tmp_path / "sub" / "spec.yaml").read_text())["kind"] == "amd.com/gpu"


def test_output_dir_without_a_slash_is_created(tmp_path: Path) -> None:
    """`cdi generate --output /var/run/cdi` on a fresh host: a name without an extension is a directory."""
    out = tmp_path / "var" / "run" / "cdi"
    done = hook("cdi", "generate", "--output", str(out), cdi_dir=out)  # the cdi_dir a consumer was told to read
    assert done.returncode == 0, done.stderr
    assert done.stderr == f"wrote: {out}/amd.com-gpu.json\n"
    assert os.listdir(out) == ["amd.com-gpu.json"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert json.loads((out / "amd.com-gpu.json").read_text()) == generated()
    again = hook("cdi", "generate", "--output", str(out), cdi_dir=out)
    assert again.returncode == 0 and again.stderr == f"unchanged: {out}/amd.com-gpu.json\n"


def test_mask_other_gpus_on_the_cdi_path_is_a_warning(tmp_path: Path) -> None:
    """validate and cdi generate say that CDI cannot mask (install: tests/test_install.py)."""
    config = tmp_path / "config.toml"
    config.write_text("mask_other_gpus = true\n")
    warning = f"warning: {cdi.mask_ignored(True)}"
    validated = hook("validate", "--config-file", str(config))
    assert validated.returncode == 0 and warning in validated.stdout.splitlines(), validated.stdout
    generated = hook("--config", str(config), "cdi", "generate", "--kind", "amd")
    assert generated.returncode == 0 and warning in generated.stderr.splitlines(), generated.stderr
    config.write_text("mask_other_gpus = false\n")
    assert "ignored on the CDI path" not in hook("validate", "--config-file", str(config)).stdout
    assert "ignored on the CDI path" not in hook("--config", str(config), "cdi", "generate", "--kind", "amd").stderr


@pytest.mark.parametrize("where", ["dir", "file"])
def test_output_where_no_cdi_consumer_reads_says_so(tmp_path: Path, where: str) -> None:
    """`cdi generate --output /var/rnu/cdi`: written, and a warning naming the directories consumers read."""
    out = tmp_path / "var" / "rnu" / "cdi"
    args = ("--output", str(out)) if where == "dir" else ("--kind", "amd", "--output", f"{out}/amd.json")
    done = hook("cdi", "generate", *args, cdi_dir=tmp_path / "cdi")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[1] == (
        f"warning: {out} is not a directory CDI consumers read (podman, containerd, CRI-O read /etc/cdi, "
        f"/var/run/cdi, {tmp_path / 'cdi'}, a later one winning; cdi_dir is {tmp_path / 'cdi'}): nothing uses "
        "these specs unless a runtime's cdi_spec_dirs names it")
    assert len(done.stderr.splitlines()) == 2 and os.listdir(out)


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_output_dir_is_never_made_below_a_directory_others_can_write(tmp_path: Path, mode: int) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)  # no sticky bit: anyone in the group (or anyone) could swap what is made below
    line = assert_one_error_line(hook("cdi", "generate", "--output", f"{shared}/cdi"))
    assert line.startswith(f"oci-gpu-hook: error: --output {shared}/cdi is not trusted: {shared} is writable by ")
    assert os.listdir(shared) == []
    existing = tmp_path / "existing"
    existing.mkdir()
    existing.chmod(mode)
    line = assert_one_error_line(hook("cdi", "generate", "--output", str(existing)))
    assert f"{existing} is writable by " in line
    assert os.listdir(existing) == []


@pytest.mark.root  # chown
def test_output_dir_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 1234, 1234)
    line = assert_one_error_line(hook("cdi", "generate", "--output", f"{theirs}/cdi/"))
    assert f"{theirs} is owned by uid 1234, not by root" in line
    assert os.listdir(theirs) == []


INTEL_AMD = REPO / "examples" / "hosts" / "intel-igpu-2x-gfx1100" / "sys"


def test_two_kinds_to_stdout_json_is_refused_with_what_to_do() -> None:
    line = assert_one_error_line(hook("cdi", "generate", sysfs=INTEL_AMD), 2)
    assert "2 kinds (amd, intel)" in line and "--kind" in line and "--output DIR/" in line
    assert "--format yaml" in line


def test_two_kinds_to_stdout_yaml_is_one_valid_document_per_kind(tmp_path: Path) -> None:
    done = hook("cdi", "generate", "--format", "yaml", sysfs=INTEL_AMD)
    assert done.returncode == 0, done.stderr
    documents = list(yaml.safe_load_all(done.stdout))
    assert [d["kind"] for d in documents] == ["amd.com/gpu", "intel.com/gpu"]
    for document, kind in zip(documents, ("amd", "intel"), strict=True):
        one = hook("cdi", "generate", "--kind", kind, "--format", "yaml", sysfs=INTEL_AMD)
        assert document == yaml.safe_load(one.stdout)
        path = tmp_path / f"{kind}.yaml"
        path.write_text(yaml.safe_dump(document))
        assert hook("cdi", "validate", str(path)).returncode == 0
    single = hook("cdi", "generate", "--format", "yaml")  # one kind: a plain document, as before
    assert not single.stdout.startswith("---") and yaml.safe_load(single.stdout)["kind"] == "amd.com/gpu"


def test_generate_notes_a_hook_path_that_is_not_there(tmp_path: Path) -> None:
    missing = str(tmp_path / "libexec" / "oci-gpu-hook")
    done = hook("cdi", "generate", "--output", str(tmp_path / "cdi"), hook_path=missing)
    assert done.returncode == 0
    assert done.stderr.splitlines()[-1] == (
        f"note: hook_path {missing} is not an executable file here: a container given one of these devices fails "
        f"to start until it is (oci-gpu-hook install, or oci-gpu-hook launchers {tmp_path / 'libexec'})")


# --- list: the node's spec directories ------------------------------------------------------


def write_spec(path: Path, spec: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec) if path.suffix == ".yaml" else json.dumps(spec))


def listing(etc: Path, run: Path, cdi_dir: Path | None = None, sysfs: Path = SEED, hook_path: str | None = None,
            hide_launchers: bool = False) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    done = hook("cdi", "list", "--spec-dirs", f"{etc},{run}", cdi_dir=cdi_dir or run, sysfs=sysfs,
                hook_path=hook_path, hide_launchers=hide_launchers)
    problems = [line[len("problem: "):] for line in done.stdout.splitlines() if line.startswith("problem: ")]
    if problems:
        assert done.returncode == 1
        assert done.stderr == (f"oci-gpu-hook: error: cdi list: {len(problems)} problem"
                               f"{'s' if len(problems) > 1 else ''} with this node's CDI specs "
                               "(the 'problem:' lines above)\n")
    else:
        assert done.returncode == 0, done.stdout + done.stderr
    return done, problems


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    """A private /etc/cdi and /var/run/cdi, ours in the second, current."""
    etc, run = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    etc.mkdir()
    write_spec(run / "amd.com-gpu.json", generated())
    return etc, run


def test_a_right_node_lists_clean_and_exits_0(dirs: tuple[Path, Path]) -> None:
    done, problems = listing(*dirs)
    assert problems == []
    assert f"spec file {dirs[1]}/amd.com-gpu.json: current" in done.stdout
    assert f"spec dirs (later overrides earlier): {dirs[0]}, {dirs[1]}" in done.stdout


def test_other_vendors_specs_are_fine(dirs: tuple[Path, Path]) -> None:
    write_spec(dirs[0] / "example.yaml", {"cdiVersion": "0.5.0", "kind": "example.com/gpu",
                                          "devices": [{"name": "0", "containerEdits": {}}]})
    write_spec(dirs[1] / "notes.txt", {"not": "a spec"})  # CDI reads only .json and .yaml
    assert listing(*dirs)[1] == []


def test_missing_and_stale(dirs: tuple[Path, Path]) -> None:
    etc, run = dirs
    _, problems = listing(etc, run, sysfs=OTHER)
    assert problems == [f"{run}/amd.com-gpu.json is stale (oci-gpu-hook cdi generate --output {run}/)"]
    (run / "amd.com-gpu.json").unlink()
    _, problems = listing(etc, run)
    assert problems == [f"no spec file of amd.com/gpu at {run}/amd.com-gpu.json"]
    write_spec(run / "amd.com-gpu.json", generated())
    _, problems = listing(etc, run, sysfs=etc)  # an empty sysfs: no GPUs, yet a spec
    assert problems == [f"{run}/amd.com-gpu.json is stale: there are no amd.com/gpu devices on this host"]


def test_a_json_and_a_yaml_spec_of_our_kind(dirs: tuple[Path, Path]) -> None:
    etc, run = dirs
    write_spec(run / "amd.com-gpu.yaml", generated())
    _, problems = listing(etc, run)
    assert problems[0] == (f"{run}/amd.com-gpu.json and {run}/amd.com-gpu.yaml: a JSON and a YAML spec of "
                           "amd.com/gpu in one directory; CDI consumers drop every device both name")
    assert problems[1].startswith(f"{run}/amd.com-gpu.yaml also defines amd.com/gpu devices (conflict, CDI "
                                  "consumers drop: 0, 1, 2, 3, 4, 5 ...)")


def test_amds_own_spec_in_etc_cdi(dirs: tuple[Path, Path]) -> None:
    etc, run = dirs
    write_spec(etc / "amd.json", {"cdiVersion": "0.5.0", "kind": "amd.com/gpu", "devices": [
        {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/dri/renderD128"}]}},
        {"name": "gpu0", "containerEdits": {"deviceNodes": [{"path": "/dev/dri/renderD128"}]}}]})
    _, problems = listing(etc, run)
    assert problems == [f"{etc}/amd.json also defines amd.com/gpu devices (it provides: gpu0; overridden: 0)"]


def test_another_vendors_spec_naming_our_devices_in_the_same_directory(dirs: tuple[Path, Path]) -> None:
    etc, run = dirs
    write_spec(run / "vendor-x.yaml", {"cdiVersion": "0.6.0", "kind": "amd.com/gpu", "devices": [
        {"name": "1", "containerEdits": {"deviceNodes": [{"path": "/dev/dri/renderD129"}]}}]})
    _, problems = listing(etc, run)
    assert problems == [f"{run}/vendor-x.yaml also defines amd.com/gpu devices (conflict, CDI consumers drop: 1)"]


def test_a_later_directory_overrides_ours(dirs: tuple[Path, Path]) -> None:
    etc, run = dirs
    later = run.parent / "later"
    write_spec(later / "mine.json", {"cdiVersion": "0.5.0", "kind": "amd.com/gpu", "devices": [
        {"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/dri/renderD128"}]}}]})
    done = hook("cdi", "list", "--spec-dirs", f"{etc},{run},{later}", cdi_dir=run)
    assert done.returncode == 1
    assert f"problem: {later}/mine.json also defines amd.com/gpu devices (it provides: all)" in done.stdout


def test_an_invalid_spec_of_our_kind(dirs: tuple[Path, Path]) -> None:
    etc, run = dirs
    write_spec(etc / "broken.json", {"cdiVersion": "0.5.0", "kind": "amd.com/gpu", "devices": [],
                                     "colour": "blue"})
    (etc / "garbage.yaml").write_text("kind: [\n")
    _, problems = listing(etc, run)
    assert len(problems) == 2
    assert all(p.startswith("invalid spec file (CDI consumers skip it): ") for p in problems)
    assert f"{etc}/broken.json" in problems[0] and f"{etc}/garbage.yaml" in problems[1]


def test_our_cdi_dir_outside_the_spec_dirs(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    etc, run = dirs
    elsewhere = tmp_path / "elsewhere"
    write_spec(elsewhere / "amd.com-gpu.json", generated())
    _, problems = listing(etc, run, cdi_dir=elsewhere)
    assert f"cdi_dir {elsewhere} is not one of the spec dirs: CDI consumers never read our specs" in problems


def test_default_spec_dirs_add_cdi_dir(tmp_path: Path) -> None:
    from oci_gpu_hook.config import Config
    from oci_gpu_hook.entry.commands.cdi import spec_dirs

    assert spec_dirs(None, Config(cdi_dir="/var/run/cdi")) == ["/etc/cdi", "/var/run/cdi"]
    assert spec_dirs(None, Config(cdi_dir=str(tmp_path))) == ["/etc/cdi", "/var/run/cdi", str(tmp_path)]
    assert spec_dirs(f"{tmp_path}/a,{tmp_path}/b", Config()) == [f"{tmp_path}/a", f"{tmp_path}/b"]


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def test_list_checks_every_hook_a_spec_names(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    """A spec whose hook is gone is not "current": every CDI container given its devices would fail."""
    etc, run = dirs
    hook_file = executable(tmp_path / "libexec" / "oci-gpu-hook")
    done = hook("cdi", "generate", "--output", str(run), hook_path=str(hook_file))
    assert done.returncode == 0, done.stderr
    listed, problems = listing(etc, run, hook_path=str(hook_file))
    assert problems == [] and f"spec file {run}/amd.com-gpu.json: current\n" in listed.stdout
    hook_file.unlink()
    listed, problems = listing(etc, run, hook_path=str(hook_file))
    assert f"spec file {run}/amd.com-gpu.json: current; BROKEN: it names a hook that cannot run" in listed.stdout
    assert problems == [
        f"{run}/amd.com-gpu.json names the hook {hook_file}, which is missing: every container given 0, 1, 2, 3, "
        f"4, 5 ... fails to start (fix: oci-gpu-hook launchers {tmp_path / 'libexec'}, or set hook_path and "
        f"oci-gpu-hook cdi generate --output {run}/)"]
    executable(hook_file).chmod(0o644)
    _, problems = listing(etc, run, hook_path=str(hook_file))
    assert len(problems) == 1 and f"{hook_file}, which is not an executable file" in problems[0]


def test_list_names_install_as_the_fix_for_the_launcher_path(dirs: tuple[Path, Path]) -> None:
    etc, run = dirs
    launcher = f"{LAUNCHER_DIR}/oci-gpu-hook"
    installed = os.path.exists(launcher)  # an installed node: the launchers hidden in a namespace of its own
    if installed and os.geteuid() != 0:
        pytest.skip(f"{launcher} is installed on this machine, and hiding it needs root")
    spec = generated()
    for device in spec["devices"]:
        for entry in device["containerEdits"].get("hooks", []):
            entry["path"] = launcher
    write_spec(run / "amd.com-gpu.json", spec)
    _, problems = listing(etc, run, hook_path=launcher, hide_launchers=installed)
    assert problems == [f"{run}/amd.com-gpu.json names the hook {launcher}, which is missing: every container given "
                        f"0, 1, 2, 3, 4, 5 ... fails to start (fix: oci-gpu-hook install (or oci-gpu-hook launchers "
                        f"{LAUNCHER_DIR}))"]


def test_list_checks_the_hooks_of_another_spec_of_our_kind(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    etc, run = dirs
    gone = tmp_path / "gone" / "hook"
    write_spec(etc / "amd.json", {"cdiVersion": "0.5.0", "kind": "amd.com/gpu", "devices": [
        {"name": "gpu0", "containerEdits": {"deviceNodes": [{"path": "/dev/dri/renderD128"}]}}],
        "containerEdits": {"hooks": [{"hookName": "createContainer", "path": str(gone)}]}})
    write_spec(etc / "example.json", {"cdiVersion": "0.5.0", "kind": "example.com/gpu", "devices": [
        {"name": "0", "containerEdits": {"hooks": [{"hookName": "createContainer", "path": str(gone)}]}}]})
    _, problems = listing(etc, run)
    assert problems == [f"{etc}/amd.json also defines amd.com/gpu devices (it provides: gpu0)",
                        f"{etc}/amd.json names the hook {gone}, which is missing: every container given all of its "
                        f"devices fails to start (fix: oci-gpu-hook launchers {gone.parent}, or set hook_path and "
                        f"oci-gpu-hook cdi generate --output {run}/)"]  # another vendor's kind is not ours to judge


# --- validate: CDI versions ------------------------------------------------------------------


def _validate(tmp_path: Path, spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return hook("cdi", "validate", str(path))


@pytest.mark.parametrize("version", ["0.3.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0"])
def test_validate_accepts_every_cdi_release(tmp_path: Path, version: str) -> None:
    spec = {"cdiVersion": version, "kind": "amd.com/gpu", "devices": [{"name": "gpu0", "containerEdits": {}}]}
    done = _validate(tmp_path, spec)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("version", ["1.2.0", "2.0.0", "0.2.0", "1.1"])
def test_validate_refuses_unknown_versions(tmp_path: Path, version: str) -> None:
    spec = {"cdiVersion": version, "kind": "amd.com/gpu", "devices": [{"name": "gpu0", "containerEdits": {}}]}
    assert "cdiVersion" in assert_one_error_line(_validate(tmp_path, spec))


def test_net_devices_need_1_1_0(tmp_path: Path) -> None:
    spec: dict[str, Any] = {"cdiVersion": "1.1.0", "kind": "example.com/net", "devices": [
        {"name": "nic0", "containerEdits": {"netDevices": [{"hostInterfaceName": "eth1", "name": "net0"}]}}]}
    assert _validate(tmp_path, spec).returncode == 0
    spec["cdiVersion"] = "1.0.0"
    assert "needs 1.1.0" in assert_one_error_line(_validate(tmp_path, spec))
    spec["devices"][0]["containerEdits"] = {"intelRdt": {"schemata": ["L3:0=f"]}}
    assert "needs 1.1.0" in assert_one_error_line(_validate(tmp_path, spec))
