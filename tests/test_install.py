"""``oci-gpu-hook install``: into a prefix, and ``--uninstall`` gives back exactly the tree that was there."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

import oci_gpu_hook
from oci_gpu_hook.appliers import cdi
from oci_gpu_hook.config import Config
from oci_gpu_hook.entry import cli
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.install import containerd, items, paths, undo
from oci_gpu_hook.inventory import scan
from tests.conftest import ROOT, unavailable
from tests.helpers import clilib
from tests.helpers.containerlib import INSTALL_DEV
from tests.helpers.installtrees import containerd_binary, isolated_env, snapshot

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_SYSFS = REPO / "examples" / "hosts" / "seed-8x-gfx1100" / "sys"
LAUNCHER = "/usr/local/libexec/oci-gpu-hook/oci-gpu-hook"
RUNTIME = "/usr/local/libexec/oci-gpu-hook/oci-gpu-runtime"
HOOKS_DIR = "/usr/share/containers/oci/hooks.d"  # podman 4.3: no hooks_dir in containers.conf
PRECREATE = "/usr/share/containers/oci/hooks.d/oci-gpu-hook-precreate.json"
PRESTART = "/usr/share/containers/oci/hooks.d/oci-gpu-hook-prestart.json"
CDI_SPEC = "/var/run/cdi/amd.com-gpu.json"
MANIFEST = "/var/lib/oci-gpu-hook/install.json"
MAIN = containerd.MAIN_CONFIG_PATH
CRI = "io.containerd.grpc.v1.cri"
__all__ = ["isolated_env"]  # the autouse fixture, imported

IMPORTS_LINE = 'imports = ["/etc/containerd/conf.d/*.toml"]  # added by oci-gpu-hook install\n'
# What install writes to /etc/containerd/config.toml on a host with /etc/containerd but no main config.
NEW_MAIN = 'version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]  # added by oci-gpu-hook install\n'
# A kubeadm node's main config: CRI settings that containerd 1.x would lose to a drop-in without them.
MAIN_CONFIG = """\
# containerd config of a kubeadm node
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
oom_score = -999

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.9"
    enable_unprivileged_ports = true
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      snapshotter = "overlayfs"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = true
          BinaryName = "/usr/sbin/runc"
    [plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]
      endpoint = ["https://mirror.registry.example", "https://registry-1.docker.io"]
    [plugins."io.containerd.grpc.v1.cri".registry.configs."mirror.registry.example".tls]
      insecure_skip_verify = false
  [plugins."io.containerd.internal.v1.opt"]
    path = "/opt/containerd"
"""
# Debian's /etc/containerd/config.toml: a CRI table without runtimes.
DEBIAN_MAIN_CONFIG = """\
version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
"""
OUR_RUNTIME = {"runtime_type": "io.containerd.runc.v2", "container_annotations": ["cdi.k8s.io/*"],
               "options": {"BinaryName": RUNTIME}}


def clean_env(**extra: str) -> dict[str, str]:
    env = clilib.without_tool_vars()
    env["OCI_GPU_HOOK_CONFIG"] = os.devnull  # never the host's /etc/oci-gpu-hook/config.toml
    env.update(extra)
    return env


@pytest.fixture
def prefix(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    return root


def run(capsys: pytest.CaptureFixture[str], *args: str, sysfs: Path = EXAMPLE_SYSFS) -> tuple[int, str, str]:
    """``oci-gpu-hook --sysfs-root SYSFS install ARGS`` in this process: (exit code, stdout, stderr)."""
    code = cli.main(["--sysfs-root", str(sysfs), "install", *INSTALL_DEV, *args])
    out, err = capsys.readouterr()
    return code, out, err


def ok(capsys: pytest.CaptureFixture[str], *args: str, sysfs: Path = EXAMPLE_SYSFS) -> str:
    code, out, err = run(capsys, *args, sysfs=sysfs)
    assert code == 0, err
    assert err == ""
    return out


def cli_subprocess(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", *args], capture_output=True, text=True,
                          env=clean_env(), cwd=REPO, timeout=60, check=False)


def at(prefix: Path, real: str) -> Path:
    return prefix / real.lstrip("/")


def containerd_host(prefix: Path, main: str | None = None) -> None:
    """/etc/containerd, and the main config ``main`` (mode 0640, its own owner and mtime) if given; Debian 12's
    containerd 1.6 (no native CDI), in /opt/bin: not where install writes."""
    at(prefix, "/etc/containerd").mkdir(parents=True, exist_ok=True)
    containerd_binary(prefix, "1.6.20~ds1", "variables", "/opt/bin/containerd")
    if main is not None:
        config = at(prefix, MAIN)
        config.write_text(main)
        config.chmod(0o640)
        if ROOT:
            os.chown(config, 4321, 8765)
        os.utime(config, ns=(2_000_000_000, 2_000_000_000))


def with_imports_line(main: str) -> str:
    """``main`` as install must leave it: the imports line just before the first table header."""
    head, sep, tail = main.partition("\n[")
    return head + "\n" + IMPORTS_LINE + sep.lstrip("\n") + tail


def drop_in_cri(prefix: Path) -> dict[str, Any]:
    """The installed drop-in, parsed: only ``version = 2`` and the CRI table; return that table."""
    data = tomllib.loads(at(prefix, containerd.DROP_IN_PATH).read_text())
    assert data.keys() == {"version", "plugins"}
    assert data["version"] == 2
    assert list(data["plugins"]) == [CRI]
    return data["plugins"][CRI]


def main_cri_with_ours(main: str) -> dict[str, Any]:
    """The CRI table of ``main`` with a runc runtime (when it has none) and our runtime added."""
    cri = tomllib.loads(main)["plugins"][CRI]
    runtimes = cri.setdefault("containerd", {}).setdefault("runtimes", {})
    runtimes.setdefault("runc", {"runtime_type": "io.containerd.runc.v2"})
    runtimes["oci-gpu"] = OUR_RUNTIME
    return cri


def populate(prefix: Path) -> None:
    """A host that already has things where install writes: all of it must come back after uninstall.
    It has /etc/containerd (with the operator's own file where the drop-in goes) but no main config."""
    hooks = at(prefix, HOOKS_DIR)
    hooks.mkdir(parents=True)
    (hooks / "other-hook.json").write_text('{"version": "1.0.0"}\n')
    (hooks / "other-hook.json").chmod(0o640)
    drop_in = at(prefix, containerd.DROP_IN_PATH)
    drop_in.parent.mkdir(parents=True)
    drop_in.write_text("# the operator's own runtime\nversion = 2\n")
    drop_in.chmod(0o600)
    if ROOT:
        os.chown(drop_in, 1234, 5678)
    os.utime(drop_in, ns=(1_000_000_000, 1_000_000_000))
    # /var/run -> ../run, as on most hosts: the CDI spec goes through the symlink.
    at(prefix, "/run").mkdir()
    at(prefix, "/var").mkdir()
    at(prefix, "/var/run").symlink_to("../run")
    # A symlink where a launcher goes: replaced by the file, and put back by uninstall.
    at(prefix, "/usr/local/libexec/oci-gpu-hook").mkdir(parents=True)
    at(prefix, RUNTIME).symlink_to("/usr/bin/runc")


# --- install, then uninstall ----------------------------------------------------------------------


HOSTS = ["empty-prefix", "containerd-dir", "populated-prefix", "main-config"]


def make_host(prefix: Path, host: str) -> None:
    if host == "containerd-dir":
        containerd_host(prefix)
    elif host == "populated-prefix":
        populate(prefix)
    elif host == "main-config":
        containerd_host(prefix, MAIN_CONFIG)


@pytest.mark.parametrize("host", HOSTS)
def test_uninstall_gives_back_the_tree_exactly(prefix: Path, capsys: pytest.CaptureFixture[str], host: str) -> None:
    make_host(prefix, host)
    before = snapshot(prefix)
    out = ok(capsys, "--prefix", str(prefix))
    written = (LAUNCHER, RUNTIME, PRECREATE, CDI_SPEC) + ((containerd.DROP_IN_PATH, MAIN) if host != "empty-prefix"
                                                          else ())
    for real in written:
        assert at(prefix, real).is_file() and not at(prefix, real).is_symlink(), real
        assert f"{at(prefix, real)} (" in out
    assert snapshot(prefix) != before
    if host == "empty-prefix":  # no containerd on this host: nothing of it is written, and install says so
        assert not at(prefix, "/etc/containerd").exists()
        assert "\nnote: containerd: no /etc/containerd here: containerd is not configured\n" in out
        assert "restart containerd" not in out
    else:
        assert "\nnote: restart containerd to load its new configuration\n" in out
    if host in ("containerd-dir", "populated-prefix"):  # no main config: a new one that imports conf.d
        assert at(prefix, MAIN).read_text() == NEW_MAIN
        assert f"new: {at(prefix, MAIN)} (containerd config (imports); mode 0644)" in out
        # containerd-dir: 1.6, no native CDI; populated-prefix: no binary at all: native CDI on, which 1.6 ignores
        cdi = {} if host == "containerd-dir" else {"enable_cdi": True, "cdi_spec_dirs": ["/etc/cdi", "/var/run/cdi"]}
        assert drop_in_cri(prefix) == {"containerd": {"runtimes": {
            "runc": {"runtime_type": "io.containerd.runc.v2"}, "oci-gpu": OUR_RUNTIME}}, **cdi}
        assert ("containerd 1.6.20~ds1 (" if host == "containerd-dir" else "containerd version unknown (") in out
    if host == "populated-prefix":
        assert f"replaced: {at(prefix, containerd.DROP_IN_PATH)} (" in out
        assert f"replaced: {at(prefix, RUNTIME)} (" in out
        assert (at(prefix, HOOKS_DIR + "/other-hook.json")).read_text() == '{"version": "1.0.0"}\n'
        assert at(prefix, "/run/cdi/amd.com-gpu.json").is_file()
        backups = list(at(prefix, paths.BACKUP_DIR).iterdir())
        assert [b.read_text() for b in backups] == ["# the operator's own runtime\nversion = 2\n"]
    if host == "main-config":  # the host's main config: saved, and the imports line added
        assert f"replaced: {at(prefix, MAIN)} (containerd config (imports); what was there is saved to " in out
        assert at(prefix, MAIN).read_text() == with_imports_line(MAIN_CONFIG)
        assert stat.S_IMODE(os.stat(at(prefix, MAIN)).st_mode) == 0o640
        assert drop_in_cri(prefix) == main_cri_with_ours(MAIN_CONFIG)
        backups = list(at(prefix, paths.BACKUP_DIR).iterdir())
        assert [b.read_text() for b in backups] == [MAIN_CONFIG]
    out = ok(capsys, "--prefix", str(prefix), "--uninstall")
    assert snapshot(prefix) == before
    if host == "populated-prefix":
        assert f"restored: {at(prefix, containerd.DROP_IN_PATH)} (" in out
        assert f"restored: {at(prefix, RUNTIME)} (the symlink to /usr/bin/runc" in out
        assert os.stat(at(prefix, containerd.DROP_IN_PATH)).st_mtime_ns == 1_000_000_000
    if host in ("containerd-dir", "populated-prefix"):
        assert f"removed: {at(prefix, MAIN)} (installed)" in out
    if host == "main-config":
        assert f"restored: {at(prefix, MAIN)} (the file install replaced, from " in out
        assert at(prefix, MAIN).read_bytes() == MAIN_CONFIG.encode()  # byte for byte, mode 0640, its owner
        assert os.stat(at(prefix, MAIN)).st_mtime_ns == 2_000_000_000
    assert "kept" not in out


def test_the_installed_files(prefix: Path, capsys: pytest.CaptureFixture[str]) -> None:
    containerd_host(prefix)
    ok(capsys, "--prefix", str(prefix))
    hook = json.loads(at(prefix, PRECREATE).read_text())
    assert hook["hook"]["path"] == LAUNCHER  # the real path: --prefix never leaks into a file
    assert hook["hook"]["args"] == ["oci-gpu-hook", "precreate"]
    assert hook["stages"] == ["precreate"]
    shipped = json.loads((REPO / "hooks.d" / "oci-gpu-hook-precreate.json").read_text())
    assert {**hook, "hook": {**hook["hook"], "path": shipped["hook"]["path"]}} == shipped
    assert os.access(at(prefix, hook["hook"]["path"]), os.X_OK)

    spec = cdi.load(str(at(prefix, CDI_SPEC)))
    cdi.validate(spec, "installed spec")
    assert spec == cdi.generate(scan(str(EXAMPLE_SYSFS)), "amd", Config())

    assert at(prefix, containerd.DROP_IN_PATH).read_text() == containerd.drop_in(RUNTIME, None)
    runtimes = drop_in_cri(prefix)["containerd"]["runtimes"]
    assert runtimes == {"runc": {"runtime_type": "io.containerd.runc.v2"}, "oci-gpu": OUR_RUNTIME}
    assert "pod_annotations" not in at(prefix, containerd.DROP_IN_PATH).read_text()
    assert at(prefix, MAIN).read_text() == NEW_MAIN

    for real, mode in ((LAUNCHER, 0o755), (RUNTIME, 0o755), (PRECREATE, 0o644), (CDI_SPEC, 0o644),
                       (containerd.DROP_IN_PATH, 0o644), (MAIN, 0o644), (MANIFEST, 0o644)):
        assert stat.S_IMODE(os.stat(at(prefix, real)).st_mode) == mode, real
    for path in prefix.rglob("*"):
        if path.is_file():
            assert str(prefix).encode() not in path.read_bytes(), path


def test_the_manifest_records_every_file_and_directory(prefix: Path, capsys: pytest.CaptureFixture[str]) -> None:
    populate(prefix)
    before = set(snapshot(prefix))
    ok(capsys, "--prefix", str(prefix))
    manifest = json.loads(at(prefix, MANIFEST).read_text())

    assert [e["path"] for e in manifest["files"]] == [LAUNCHER, RUNTIME, PRECREATE, CDI_SPEC,
                                                      containerd.DROP_IN_PATH, MAIN]
    for entry in manifest["files"]:
        data = at(prefix, entry["path"]).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
        assert int(entry["mode"], 8) == stat.S_IMODE(os.stat(at(prefix, entry["path"])).st_mode)
    by_path = {e["path"]: e for e in manifest["files"]}
    assert by_path[RUNTIME]["backup"] == {"symlink": "/usr/bin/runc"}
    backup = by_path[containerd.DROP_IN_PATH]["backup"]
    assert backup["mode"] == "0600"
    assert at(prefix, backup["path"]).read_text() == "# the operator's own runtime\nversion = 2\n"
    assert (by_path[MAIN]["backup"], by_path[MAIN]["mode"]) == (None, "0644")  # a new main config
    # Everything new on disk is a file of the manifest, a backup, the manifest, or a directory it lists.
    new = set(snapshot(prefix)) - before
    listed = {e["path"] for e in manifest["files"]} | set(manifest["directories"]) | {MANIFEST, backup["path"]}
    via_symlink = {"/run/cdi/amd.com-gpu.json": CDI_SPEC, "/run/cdi": "/var/run/cdi"}
    assert {via_symlink.get("/" + p, "/" + p) for p in new} == listed - {RUNTIME, containerd.DROP_IN_PATH}
    assert manifest["directories"] == ["/var/lib", "/var/lib/oci-gpu-hook", "/var/run/cdi",
                                       "/var/lib/oci-gpu-hook/backup"]


def test_launchers_run(prefix: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The installed launchers start (they embed this checkout's package path and this Python)."""
    ok(capsys, "--prefix", str(prefix), "--set", "OCI_GPU_HOOK_RUNTIME=/bin/echo")
    text = at(prefix, LAUNCHER).read_text()
    assert text.startswith(f"#!{sys.executable} -IS\n")
    assert repr(os.path.dirname(os.path.dirname(oci_gpu_hook.__file__))) in text  # this checkout
    result = subprocess.run([str(at(prefix, LAUNCHER)), "--help"], capture_output=True, text=True,
                            env=clean_env(), timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: oci-gpu-hook")
    # The runtime shim execs the baked-in runtime (here echo) for a command it does not rewrite.
    result = subprocess.run([str(at(prefix, RUNTIME)), "state", "ctr1"], capture_output=True, text=True,
                            env=clean_env(), timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "state ctr1\n"


# --- dry run, idempotence -------------------------------------------------------------------------


@pytest.mark.parametrize("mask", [True, False])
def test_mask_other_gpus_ignored_on_the_cdi_path_is_said(prefix: Path, capsys: pytest.CaptureFixture[str],
                                                         mask: bool) -> None:
    config = prefix.parent / "config.toml"
    config.write_text(f"mask_other_gpus = {str(mask).lower()}\n")
    code = cli.main(["--config", str(config), "--sysfs-root", str(EXAMPLE_SYSFS), "install", *INSTALL_DEV,
                     "--prefix", str(prefix), "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0, err
    said = [line for line in out.splitlines() if "ignored on the CDI path" in line]
    assert said == ([f"note: {cdi.mask_ignored(True)}"] if mask else [])


def test_a_waiting_install_says_which_run_holds_the_node(prefix: Path) -> None:
    import fcntl

    lock = os.open(prefix, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(lock, fcntl.LOCK_EX)  # this test stands for the other install
    try:
        waiting = subprocess.Popen([sys.executable, "-m", "oci_gpu_hook.entry.cli", "--sysfs-root", str(EXAMPLE_SYSFS),
                                    "install", *INSTALL_DEV, "--prefix", str(prefix)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(), cwd=REPO)
        assert waiting.stdout is not None
        line = waiting.stdout.readline()
    finally:
        os.close(lock)
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, err
    with open(f"/proc/{os.getpid()}/cmdline", "rb") as handle:
        command = handle.read().replace(b"\0", b" ").decode().strip()[:200]
    head, since = f"waiting: another install or uninstall is running on {prefix} (pid {os.getpid()} since ", line
    assert since.startswith(head) and since.endswith(f" UTC: {command})\n"), line
    assert f"manifest: {prefix}/var/lib/oci-gpu-hook/install.json (new)" in out  # then it ran


def test_dry_run_writes_nothing(prefix: Path, capsys: pytest.CaptureFixture[str]) -> None:
    containerd_host(prefix)
    before = snapshot(prefix, identity=True)
    out = ok(capsys, "--prefix", str(prefix), "--dry-run")
    assert snapshot(prefix, identity=True) == before
    assert out.startswith("dry run: nothing is written\n")
    for real in (LAUNCHER, RUNTIME, PRECREATE, CDI_SPEC, containerd.DROP_IN_PATH, MAIN):
        assert f"new: {at(prefix, real)} (" in out
    assert f"    {containerd.drop_in(RUNTIME).splitlines()[-1]}\n" in out  # small files: their content
    assert f"new: {at(prefix, MAIN)} (containerd config (imports); mode 0644)\n" + "".join(
        f"    {line}\n" for line in NEW_MAIN.splitlines()) in out
    assert f'    "path": "{LAUNCHER}",\n' in out
    assert "(CDI spec (amd); mode 0644)\n    (" in out  # a large one: its size and sha256
    assert f"manifest: {at(prefix, MANIFEST)} (new)" in out
    # The dry run said what the install then does.
    real = ok(capsys, "--prefix", str(prefix))
    assert [line for line in out.splitlines() if line.startswith(("new:", "directory:"))] == \
        [line for line in real.splitlines() if line.startswith(("new:", "directory:"))]


def test_dry_run_over_existing_files_shows_a_diff(prefix: Path, capsys: pytest.CaptureFixture[str]) -> None:
    populate(prefix)
    containerd_host(prefix, MAIN_CONFIG)
    before = snapshot(prefix, identity=True)
    out = ok(capsys, "--prefix", str(prefix), "--dry-run")
    assert snapshot(prefix, identity=True) == before
    drop_in = at(prefix, containerd.DROP_IN_PATH)
    assert f"replaced: {drop_in} (" in out
    assert "    mode 0600 -> 0644\n" in out
    assert f"--- {drop_in} (now)\n+++ {drop_in} (install)\n" in out
    assert "-# the operator's own runtime\n" in out
    assert f'+BinaryName = "{RUNTIME}"\n' in out
    assert '+sandbox_image = "registry.k8s.io/pause:3.9"\n' in out  # carried over from the main config
    main = at(prefix, MAIN)
    assert f"replaced: {main} (containerd config (imports); " in out
    assert f"--- {main} (now)\n+++ {main} (install)\n" in out
    assert f"+{IMPORTS_LINE}" in out
    assert f"replaced: {at(prefix, RUNTIME)} (" in out
    assert "    now a symlink to /usr/bin/runc\n" in out
    # And after an install, an uninstall dry run changes nothing either.
    ok(capsys, "--prefix", str(prefix))
    installed = snapshot(prefix, identity=True)
    out = ok(capsys, "--prefix", str(prefix), "--uninstall", "--dry-run")
    assert f"restored: {drop_in} (" in out
    assert f"restored: {main} (" in out
    assert snapshot(prefix, identity=True) == installed



@pytest.mark.parametrize("host", [
    "no-containerd",
    "populated-prefix",
    "main-config",
])
def test_reinstall_is_idempotent(prefix: Path, capsys: pytest.CaptureFixture[str], host: str) -> None:
    populate(prefix)
    if host == "no-containerd":
        shutil.rmtree(at(prefix, "/etc/containerd"))
    elif host == "main-config":
        containerd_host(prefix, MAIN_CONFIG)
    ok(capsys, "--prefix", str(prefix))
    first = snapshot(prefix, identity=True)
    out = ok(capsys, "--prefix", str(prefix), "--dry-run")  # says it would change nothing
    assert snapshot(prefix, identity=True) == first
    assert out.startswith("dry run: nothing is written\n")
    assert {line.split(":")[0] for line in out.splitlines()[1:]} == {"unchanged", "manifest", "note"}, out
    assert f"manifest: {at(prefix, MANIFEST)} (unchanged)" in out
    out = ok(capsys, "--prefix", str(prefix))
    assert snapshot(prefix, identity=True) == first  # not even rewritten: same inodes and mtimes
    statuses = {line.split(":")[0] for line in out.splitlines()}
    assert statuses == {"unchanged", "manifest", "note", "checked"}, out
    assert (f"checked: podman reads {at(prefix, HOOKS_DIR)} (podman's built-in default) and runs "
            f"{at(prefix, LAUNCHER)}\n") in out
    assert f"manifest: {at(prefix, MANIFEST)} (unchanged)" in out
    assert "does not import" not in out


def test_reinstall_updates_what_changed(prefix: Path, capsys: pytest.CaptureFixture[str]) -> None:
    original = snapshot(prefix)
    ok(capsys, "--prefix", str(prefix))
    out = ok(capsys, "--prefix", str(prefix), "--set", "OCI_GPU_HOOK_LOG_FILE=/var/log/oci-gpu-hook.log")
    assert f"updated: {at(prefix, LAUNCHER)} (" in out
    assert f"unchanged: {at(prefix, PRECREATE)} (" in out
    assert "OCI_GPU_HOOK_LOG_FILE" in at(prefix, LAUNCHER).read_text()
    assert f"manifest: {at(prefix, MANIFEST)} (updated)" in out
    ok(capsys, "--prefix", str(prefix), "--uninstall")
    assert snapshot(prefix) == original


def test_a_reinstall_that_leaves_containerd_as_it_was_asks_for_no_restart(prefix: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """An upgrade's install (new launchers, the same drop-in and main config) and a pod restart's: containerd has
    nothing new to load, so install does not ask for its restart (seen on a real node: every DaemonSet pod start
    said "restart containerd"); a run that changes the drop-in asks again."""
    containerd_host(prefix, MAIN_CONFIG)
    restart = "\nnote: restart containerd to load its new configuration\n"
    unchanged = "\nnote: containerd: its drop-in and main config are as they were: nothing new for containerd to load\n"
    out = ok(capsys, "--prefix", str(prefix))
    assert restart in out and unchanged not in out
    out = ok(capsys, "--prefix", str(prefix), "--set", "OCI_GPU_HOOK_LOG_FILE=/var/log/oci-gpu-hook.log")
    assert f"updated: {at(prefix, LAUNCHER)} (" in out
    assert f"unchanged: {at(prefix, containerd.DROP_IN_PATH)} (" in out
    assert unchanged in out and "restart containerd" not in out, out
    out = ok(capsys, "--prefix", str(prefix), "--set", "OCI_GPU_HOOK_LOG_FILE=/var/log/oci-gpu-hook.log")
    assert unchanged in out and "restart containerd" not in out, out
    at(prefix, containerd.DROP_IN_PATH).unlink()  # containerd's files changed: the restart is asked for again
    out = ok(capsys, "--prefix", str(prefix), "--set", "OCI_GPU_HOOK_LOG_FILE=/var/log/oci-gpu-hook.log")
    assert f"new: {at(prefix, containerd.DROP_IN_PATH)} (" in out
    assert restart in out and unchanged not in out, out


def test_switching_the_hook_stage(prefix: Path, capsys: pytest.CaptureFixture[str]) -> None:
    populate(prefix)
    original = snapshot(prefix)
    ok(capsys, "--prefix", str(prefix))
    out = ok(capsys, "--prefix", str(prefix), "--hook", "prestart")
    assert f"removed: {at(prefix, PRECREATE)} (no longer installed)" in out
    assert json.loads(at(prefix, PRESTART).read_text())["stages"] == ["prestart"]
    assert not at(prefix, PRECREATE).exists()
    out = ok(capsys, "--prefix", str(prefix), "--hook", "none")
    assert not at(prefix, PRESTART).exists()
    assert [p.name for p in at(prefix, HOOKS_DIR).iterdir()] == ["other-hook.json"]
    manifest = json.loads(at(prefix, MANIFEST).read_text())
    assert PRESTART not in {e["path"] for e in manifest["files"]}
    ok(capsys, "--prefix", str(prefix), "--uninstall")
    assert snapshot(prefix) == original


def test_a_host_without_gpus_gets_no_cdi_spec(prefix: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "sys"
    empty.mkdir()
    containerd_host(prefix)
    before = snapshot(prefix)
    out = ok(capsys, "--prefix", str(prefix), sysfs=empty)
    assert f"note: no amd GPUs under {empty}: the CDI spec {CDI_SPEC} is not written" in out
    assert not at(prefix, CDI_SPEC).exists()
    assert at(prefix, containerd.DROP_IN_PATH).is_file()  # containerd still gets its runtime
    ok(capsys, "--prefix", str(prefix), "--uninstall")
    assert snapshot(prefix) == before
    assert set(before) == {"etc", "etc/containerd", "opt", "opt/bin", "opt/bin/containerd"}


def test_a_file_already_as_install_wants_it_is_left_in_place(prefix: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    drop_in = at(prefix, containerd.DROP_IN_PATH)
    drop_in.parent.mkdir(parents=True)
    drop_in.write_text(containerd.drop_in(RUNTIME, cdi=True))  # no containerd found: native CDI on
    drop_in.chmod(0o644)
    original, identity = snapshot(prefix), (drop_in.stat().st_ino, drop_in.stat().st_mtime_ns)
    out = ok(capsys, "--prefix", str(prefix))
    assert f"unchanged: {drop_in} (containerd drop-in; it was already there and will be left by uninstall)" in out
    out = ok(capsys, "--prefix", str(prefix), "--uninstall")
    assert f"left: {drop_in} (" in out
    assert snapshot(prefix) == original
    assert (drop_in.stat().st_ino, drop_in.stat().st_mtime_ns) == identity  # never rewritten


# --- files changed since install ------------------------------------------------------------------


def test_uninstall_keeps_an_edited_file_and_says_so(prefix: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    ok(capsys, "--prefix", str(prefix))
    hook = at(prefix, PRECREATE)
    hook.write_text(hook.read_text().replace('"timeout": 10', '"timeout": 30'))
    edited = hook.read_text()
    out = ok(capsys, "--prefix", str(prefix))  # install does not overwrite it either
    assert f"kept: {hook} (podman precreate hook: changed since install; not overwritten" in out
    assert hook.read_text() == edited
    code, out, err = run(capsys, "--prefix", str(prefix), "--uninstall")
    assert code == 1 and err.startswith("oci-gpu-hook: error: install --uninstall: 2 files left, so the node is "
                                        "still integrated"), err
    assert f"left: {hook} (changed since install, and it names {LAUNCHER}: revert your edit" in out
    assert f"left: {at(prefix, LAUNCHER)} (named by {hook}, which is left: " in out  # podman still finds it
    assert hook.read_text() == edited
    assert sorted(str(p.relative_to(prefix)) for p in prefix.rglob("*") if p.is_file()) == [
        "usr/local/libexec/oci-gpu-hook/oci-gpu-hook", "usr/share/containers/oci/hooks.d/oci-gpu-hook-precreate.json",
        "var/lib/oci-gpu-hook/install.json"]
    hook.rename(tmp_path / "mine.json")  # the operator moves theirs away: the next uninstall finishes
    out = ok(capsys, "--prefix", str(prefix), "--uninstall")
    assert f"gone: {hook} (already removed)" in out
    assert snapshot(prefix) == {}


def test_an_edited_file_that_replaced_one_keeps_the_original_too(prefix: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    populate(prefix)
    original = snapshot(prefix)
    ok(capsys, "--prefix", str(prefix))
    drop_in = at(prefix, containerd.DROP_IN_PATH)
    drop_in.write_text(drop_in.read_text() + "# tuned by hand\n")
    code, out, _ = run(capsys, "--prefix", str(prefix), "--uninstall")
    assert code == 1
    saved = at(prefix, paths.BACKUP_DIR) / "etc%2Fcontainerd%2Fconf.d%2Foci-gpu-hook.toml"
    assert (f"left: {drop_in} (changed since install, and it names {RUNTIME}: revert your edit, take out what names "
            "this install, or move the file away; then run install --uninstall again (what install replaced is saved "
            f"at {saved}))") in out
    assert drop_in.read_text().endswith("# tuned by hand\n")
    assert saved.read_text() == "# the operator's own runtime\nversion = 2\n"
    assert at(prefix, MANIFEST).exists()
    # A later install and uninstall never overwrite that saved original.
    ok(capsys, "--prefix", str(prefix))
    assert saved.read_text() == "# the operator's own runtime\nversion = 2\n"
    assert run(capsys, "--prefix", str(prefix), "--uninstall")[0] == 1
    assert drop_in.read_text().endswith("# tuned by hand\n")
    assert saved.read_text() == "# the operator's own runtime\nversion = 2\n"
    drop_in.rename(tmp_path / "mine.toml")  # the operator keeps their copy elsewhere: the original comes back
    ok(capsys, "--prefix", str(prefix), "--uninstall")
    assert snapshot(prefix) == original


def test_an_installed_file_removed_by_hand(prefix: Path, capsys: pytest.CaptureFixture[str]) -> None:
    populate(prefix)
    original = snapshot(prefix)
    ok(capsys, "--prefix", str(prefix))
    at(prefix, containerd.DROP_IN_PATH).unlink()
    at(prefix, PRECREATE).unlink()
    out = ok(capsys, "--prefix", str(prefix), "--uninstall")
    assert f"gone: {at(prefix, PRECREATE)} (already removed)" in out
    assert snapshot(prefix) == original  # the replaced drop-in still comes back


def test_a_failed_install_leaves_a_manifest_of_what_it_wrote(prefix: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    populate(prefix)
    original = snapshot(prefix)
    real_write = undo.write_file

    def failing_write(path: str, *args: Any, **kwargs: Any) -> None:
        if path == str(at(prefix, containerd.DROP_IN_PATH)):  # after its backup was made
            raise HookError(f"cannot write {path}: No space left on device")
        real_write(path, *args, **kwargs)

    monkeypatch.setattr(undo, "write_file", failing_write)
    code, _out, err = run(capsys, "--prefix", str(prefix))
    assert code == 1
    assert err == f"oci-gpu-hook: error: cannot write {at(prefix, containerd.DROP_IN_PATH)}: No space left on device\n"
    monkeypatch.setattr(undo, "write_file", real_write)
    ok(capsys, "--prefix", str(prefix), "--uninstall")
    assert snapshot(prefix) == original


# --- the template, errors -------------------------------------------------------------------------


@pytest.mark.parametrize("stage", paths.HOOK_STAGES)
def test_the_built_in_template_is_the_shipped_file(stage: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = json.loads((REPO / "hooks.d" / f"oci-gpu-hook-{stage}.json").read_text())
    assert items.hook_template(stage) == shipped
    monkeypatch.setattr(items, "PACKAGE_PARENT", str(tmp_path))  # as installed from a wheel: no hooks.d/
    assert items.hook_template(stage) == shipped


def assert_one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("oci-gpu-hook: error: ")
    assert result.stderr.count("\n") == 1, result.stderr
    return result.stderr


def test_errors_are_one_line_and_write_nothing(prefix: Path) -> None:
    at(prefix, containerd.DROP_IN_PATH).mkdir(parents=True)  # a directory where the drop-in goes
    before = snapshot(prefix)
    line = assert_one_error_line(cli_subprocess("--sysfs-root", str(EXAMPLE_SYSFS), "install", *INSTALL_DEV, "--prefix",
                                                str(prefix)))
    assert line.startswith(f"oci-gpu-hook: error: containerd: {at(prefix, containerd.DROP_IN_PATH)} is a directory")
    assert line.endswith("(the other integrations are installed)\n")
    assert at(prefix, containerd.DROP_IN_PATH).is_dir() and not at(prefix, MAIN).exists()  # containerd: untouched
    assert at(prefix, PRECREATE).is_file() and at(prefix, LAUNCHER).is_file()  # the others: installed
    assert cli_subprocess("install", *INSTALL_DEV, "--prefix", str(prefix), "--uninstall").returncode == 0
    assert snapshot(prefix) == before

    at(prefix, MANIFEST).parent.mkdir(parents=True)
    at(prefix, MANIFEST).write_text("{not json")
    line = assert_one_error_line(cli_subprocess("install", *INSTALL_DEV, "--prefix", str(prefix), "--uninstall"))
    assert f"manifest {at(prefix, MANIFEST)} is not valid JSON" in line
    at(prefix, MANIFEST).write_text(json.dumps({"format": 1, "files": [
        {"path": "/etc/../etc/passwd", "sha256": "0" * 64, "mode": "0644", "backup": None}], "directories": []}))
    line = assert_one_error_line(cli_subprocess("install", *INSTALL_DEV, "--prefix", str(prefix), "--uninstall"))
    assert "'/etc/../etc/passwd' is not a normalized absolute path" in line

    for args, message in ((["--uninstall", "--hook", "prestart"], "takes no --hook: it removes"),
                          (["--uninstall", "--set", "OCI_GPU_HOOK_LOG_FILE=/x", "--host-root", "/"],
                           "takes no --set, --host-root: it removes"),
                          (["--uninstall", "--docker-default-runtime"], "takes no --docker-default-runtime"),
                          (["--containerd-version", "latest"], "--containerd-version 'latest': expected the node's"),
                          (["--host-root", str(at(prefix, MANIFEST))], "not a directory (the node's / as mounted"),
                          (["--hook", "poststop"], "invalid choice: 'poststop'"),
                          (["--set", "PATH=/bin"], "expected OCI_GPU_HOOK_NAME=VALUE"),
                          (["--only", "podman,lxc"], "expected a comma list of podman, docker"),
                          (["--prefix", str(at(prefix, MANIFEST) / "x")], "cannot create it")):
        result = cli_subprocess("--sysfs-root", str(EXAMPLE_SYSFS), "install", *INSTALL_DEV, *args)
        if "invalid choice" in message:  # argparse's own errors are usage errors: exit 2
            assert result.returncode == 2 and message in result.stderr and result.stderr.count("\n") == 1
        else:
            assert message in assert_one_error_line(result), args


def test_uninstall_without_a_manifest(prefix: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = ok(capsys, "--prefix", str(prefix), "--uninstall")
    assert out == f"nothing to uninstall: no manifest at {at(prefix, MANIFEST)}\n"
    assert snapshot(prefix) == {}


def test_a_lost_backup_still_takes_the_installed_file_out(prefix: Path, capsys: pytest.CaptureFixture[str]) -> None:
    populate(prefix)
    ok(capsys, "--prefix", str(prefix))
    saved = at(prefix, paths.BACKUP_DIR) / "etc%2Fcontainerd%2Fconf.d%2Foci-gpu-hook.toml"
    saved.unlink()
    out = ok(capsys, "--prefix", str(prefix), "--uninstall")
    drop_in = at(prefix, containerd.DROP_IN_PATH)
    assert f"warning: cannot restore {drop_in}: its backup {saved} is unreadable (No such file or directory)" in out
    assert f"removed: {drop_in} (installed)" in out
    assert not drop_in.exists()
    assert not at(prefix, paths.STATE_DIR).exists()


def test_install_adds_the_imports_line_and_notes_a_main_config_without_it(prefix: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    containerd_host(prefix, "version = 2\n")
    config = at(prefix, MAIN)
    out = ok(capsys, "--prefix", str(prefix))
    assert config.read_text() == "version = 2\n" + IMPORTS_LINE
    assert "does not import" not in out
    # The operator takes the line out again: install keeps their file (edited since) and says what it lacks.
    config.write_text("version = 2\n")
    out = ok(capsys, "--prefix", str(prefix))
    assert f"kept: {config} (containerd config (imports): changed since install; not overwritten" in out
    assert config.read_text() == "version = 2\n"
    assert f'note: {config} does not import the drop-in: add imports = ["/etc/containerd/conf.d/*.toml"] to it\n' in out


@pytest.mark.parametrize("main", [DEBIAN_MAIN_CONFIG, MAIN_CONFIG], ids=["debian", "kubeadm"])
def test_the_drop_in_carries_the_main_configs_cri_table(prefix: Path, capsys: pytest.CaptureFixture[str],
                                                        main: str) -> None:
    containerd_host(prefix, main)
    ok(capsys, "--prefix", str(prefix))
    cri = drop_in_cri(prefix)
    assert cri == main_cri_with_ours(main)
    assert cri["cni"] == {"bin_dir": "/usr/lib/cni", "conf_dir": "/etc/cni/net.d"}
    assert cri["containerd"]["runtimes"]["oci-gpu"] == OUR_RUNTIME  # container annotations only, never pod ones
    if main is MAIN_CONFIG:
        assert cri["sandbox_image"] == "registry.k8s.io/pause:3.9"
        assert cri["registry"]["mirrors"]["docker.io"]["endpoint"][0] == "https://mirror.registry.example"
        assert cri["containerd"]["runtimes"]["runc"]["options"] == {"SystemdCgroup": True,
                                                                    "BinaryName": "/usr/sbin/runc"}
    else:  # a CRI table without runtimes: runc, which default_runtime_name needs, is added
        assert cri["containerd"]["runtimes"]["runc"] == {"runtime_type": "io.containerd.runc.v2"}
    installed = at(prefix, MAIN).read_text()
    assert installed == with_imports_line(main)
    assert tomllib.loads(installed) == {**tomllib.loads(main), "imports": ["/etc/containerd/conf.d/*.toml"]}


@pytest.mark.parametrize("imports", [
    '["/etc/containerd/conf.d/*.toml"]',
    '["/etc/containerd/conf.d/oci-gpu-hook.toml"]',
    '["/etc/containerd/site.toml", "/etc/containerd/conf.d/*.toml"]',
], ids=["conf.d-glob", "the-drop-in", "among-others"])
def test_a_main_config_that_imports_the_drop_in_is_left_untouched(prefix: Path, capsys: pytest.CaptureFixture[str],
                                                                  imports: str) -> None:
    main = MAIN_CONFIG.replace("version = 2\n", f"version = 2\nimports = {imports}\n", 1)
    containerd_host(prefix, main)
    config = at(prefix, MAIN)
    identity = (config.stat().st_ino, config.stat().st_mtime_ns)
    before = snapshot(prefix)
    out = ok(capsys, "--prefix", str(prefix))
    assert config.read_bytes() == main.encode()
    assert (config.stat().st_ino, config.stat().st_mtime_ns) == identity  # never rewritten
    assert stat.S_IMODE(config.stat().st_mode) == 0o640
    assert f"replaced: {config}" not in out and f"updated: {config}" not in out
    assert not at(prefix, paths.BACKUP_DIR).exists()
    assert "does not import" not in out
    assert drop_in_cri(prefix) == main_cri_with_ours(main)  # the drop-in is still built from it
    ok(capsys, "--prefix", str(prefix), "--uninstall")
    assert snapshot(prefix) == before
    assert (config.stat().st_ino, config.stat().st_mtime_ns) == identity


@pytest.mark.parametrize(("main", "message"), [
    (MAIN_CONFIG + '[plugins."io.containerd.grpc.v1.cri"\n', "{config} is not valid TOML ("),
    (MAIN_CONFIG + '[grpc]\n  uid = 0\n', "{config} is not valid TOML ("),  # a table declared twice
    ('version = 2\nimports = [\n  "/etc/containerd/site.toml",\n]\n',
     "{config}: a multi-line imports list; add /etc/containerd/conf.d/*.toml to it by hand"),
], ids=["unclosed-table", "table-twice", "multi-line-imports"])
def test_a_main_config_install_cannot_use_skips_containerd_only(prefix: Path, main: str, message: str) -> None:
    containerd_host(prefix, main)
    before = snapshot(prefix, identity=True)
    containerd_files = {k: v for k, v in before.items() if k.startswith("etc")}
    for dry_run in (["--dry-run"], []):
        line = assert_one_error_line(cli_subprocess("--sysfs-root", str(EXAMPLE_SYSFS), "install", *INSTALL_DEV,
        "--prefix",
                                                    str(prefix), *dry_run))
        assert line.startswith("oci-gpu-hook: error: containerd: " + message.format(config=at(prefix, MAIN))), line
        after = snapshot(prefix, identity=True)
        assert {k: v for k, v in after.items() if k.startswith("etc")} == containerd_files  # containerd: untouched
        if dry_run:
            assert after == before
        else:
            assert at(prefix, PRECREATE).is_file()  # the others are installed all the same
    assert cli_subprocess("install", *INSTALL_DEV, "--prefix", str(prefix), "--uninstall").returncode == 0
    assert snapshot(prefix, identity=True) == before


def test_a_dry_run_does_not_ask_for_the_imports_line_install_adds(prefix: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    containerd_host(prefix, MAIN_CONFIG)
    out = ok(capsys, "--prefix", str(prefix), "--dry-run")
    assert f"+{IMPORTS_LINE}" in out
    assert "does not import the drop-in" not in out



def test_reinstall_after_editing_the_main_configs_cri_section(prefix: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    containerd_host(prefix, MAIN_CONFIG)
    ok(capsys, "--prefix", str(prefix))
    config = at(prefix, MAIN)
    config.write_text(config.read_text().replace("pause:3.9", "pause:3.10"))
    edited = config.read_text()
    out = ok(capsys, "--prefix", str(prefix))  # what the drop-in's header asks for after such an edit
    assert f"updated: {at(prefix, containerd.DROP_IN_PATH)} (" in out
    assert drop_in_cri(prefix)["sandbox_image"] == "registry.k8s.io/pause:3.10"
    assert config.read_text() == edited  # the operator's edit, and the imports line, stay
    by_path = {e["path"]: e for e in json.loads(at(prefix, MANIFEST).read_text())["files"]}
    assert MAIN in by_path  # the original is still accounted for ...
    assert at(prefix, by_path[MAIN]["backup"]["path"]).read_text() == MAIN_CONFIG
    out = ok(capsys, "--prefix", str(prefix), "--uninstall")
    assert f"{config} (" in out  # ... and uninstall says what became of the main config


def test_an_editable_install_is_refused_unless_told(capsys: pytest.CaptureFixture[str], prefix: Path) -> None:
    """Root would run code from this checkout on every container start: install says so and stops."""
    code = cli.main(["--sysfs-root", str(EXAMPLE_SYSFS), "install", "--prefix", str(prefix), "--no-native"])
    _out, err = capsys.readouterr()
    assert code == 1 and "editable install" in err and err.count("\n") == 1
    assert not at(prefix, MANIFEST).exists()


def test_install_writes_the_native_front_when_a_compiler_is_there(capsys: pytest.CaptureFixture[str],
                                                                  prefix: Path) -> None:
    import shutil

    if not (shutil.which("cc") or shutil.which("gcc")):
        unavailable("no C compiler (CI installs gcc)")
    code = cli.main(["--sysfs-root", str(EXAMPLE_SYSFS), "install", "--prefix", str(prefix), "--allow-editable"])
    _out, err = capsys.readouterr()
    assert code == 0 and err == "", err
    assert at(prefix, LAUNCHER).read_bytes()[:4] == b"\x7fELF"  # the native front
    assert at(prefix, LAUNCHER + ".py").read_text().startswith(f"#!{sys.executable} -IS")


@pytest.mark.parametrize(("text", "what"), [
    ("mask_other_gpu = true\n", "unknown key 'mask_other_gpu' (did you mean 'mask_other_gpus'?)"),
    ("runtime = \n", "not valid TOML"),
    ("device_file_mode = 9999999\n", "bad value 9999999 for 'device_file_mode'"),
    (None, "is not trusted"),
])
def test_a_broken_config_is_never_made_live(prefix: Path, tmp_path: Path, text: str | None, what: str) -> None:
    """install (and its dry run) and launchers stop with the config's one line before anything is written: the
    file the launchers would read (the baked OCI_GPU_HOOK_CONFIG here), not only the one this run read."""
    config = tmp_path / "etc" / "config.toml"
    config.parent.mkdir()
    config.write_text(text or "debug = false\n")
    config.chmod(0o644 if text else 0o646)
    before = snapshot(prefix)
    for args in (["install", *INSTALL_DEV, "--prefix", str(prefix)],
                 ["install", *INSTALL_DEV, "--prefix", str(prefix), "--dry-run"],
                 ["install", *INSTALL_DEV, "--prefix", str(prefix / "new")],
                 ["launchers", str(prefix / "bin"), "--allow-editable", "--no-native"]):
        result = cli_subprocess(*args, "--set", f"OCI_GPU_HOOK_CONFIG={config}")
        line = assert_one_error_line(result)
        assert line.startswith(f"oci-gpu-hook: error: config file {config}") and what in line, args
        assert "refusing to make this config live, nothing is written" in line
        assert result.stdout == ""
        assert snapshot(prefix) == before, args
    result = cli_subprocess("install", *INSTALL_DEV, "--prefix", str(prefix), "--set", "OCI_GPU_HOOK_DEBUG=maybe")
    assert "OCI_GPU_HOOK_DEBUG: bad value 'maybe'" in assert_one_error_line(result)
    assert snapshot(prefix) == before
    config.chmod(0o644)
    config.write_text("debug = false\n")  # fixed: installed
    result = cli_subprocess("install", *INSTALL_DEV, "--prefix", str(prefix), "--set", f"OCI_GPU_HOOK_CONFIG={config}")
    assert result.returncode == 0, result.stderr
    assert at(prefix, LAUNCHER).is_file()


# --- uninstall is whole or says why not: hand edits of each kind of file ---------------------------

DROP_IN = containerd.DROP_IN_PATH
WATCH_UNIT, PLANNER_UNIT = paths.SYSTEMD_UNIT, paths.PLANNER_UNIT
CRIO_DROP_IN = "/etc/crio/crio.conf.d/99-oci-gpu-hook.conf"
GPUS = "/usr/local/bin/amd-container-runtime"
DAEMON = "/etc/docker/daemon.json"


def edit_append(text: str) -> str:
    return text + "# tuned by hand\n"


def edit_imports_line(text: str) -> str:  # the operator rewrites the imports line install added
    assert containerd.IMPORT_MARK in text
    return text.replace(containerd.IMPORT_MARK, "  # ours now", 1)


# The file edited, how, and what uninstall must leave (the file and all it names) ...
LEFT_BY_EDIT = {
    "containerd-drop-in": (DROP_IN, edit_append, {DROP_IN, RUNTIME, LAUNCHER}),
    "containerd-imports-line": (MAIN, edit_imports_line, {MAIN, DROP_IN, RUNTIME, LAUNCHER}),
    "podman-hook": (PRECREATE, lambda t: t.replace('"timeout": 10', '"timeout": 30'), {PRECREATE, LAUNCHER}),
    "cdi-spec": (CDI_SPEC, lambda t: t + "\n", {CDI_SPEC, LAUNCHER}),
    "watch-unit": (WATCH_UNIT, edit_append, {WATCH_UNIT, LAUNCHER}),
    "planner-unit": (PLANNER_UNIT, lambda t: t.replace("RestartSec=1s", "RestartSec=3s"), {PLANNER_UNIT, LAUNCHER}),
    "crio-drop-in": (CRIO_DROP_IN, edit_append, {CRIO_DROP_IN, RUNTIME, LAUNCHER}),
    "gpus-name": (GPUS, edit_append, {GPUS, RUNTIME, LAUNCHER}),
    "daemon-json-not-json": (DAEMON, lambda t: t + "# not JSON\n", {DAEMON, RUNTIME, LAUNCHER}),
}
# ... and the edits uninstall resolves itself: it takes out only what install put in, or the file names nothing
# of this install any more (then it is the operator's: kept, its backup deleted).
RESOLVED_EDITS = {
    "daemon-json-key": (DAEMON, lambda t: t.replace("{\n", '{\n  "debug": true,\n', 1)),
    "containerd-main-config": (MAIN, edit_append),
    "podman-hook-runs-another": (PRECREATE, lambda t: t.replace(LAUNCHER, "/usr/bin/true")),
}


def installed_tree(capsys: pytest.CaptureFixture[str], prefix: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The docker-v2 host (daemon.json, a containerd v2 config, podman, CRI-O, systemd) before and after install."""
    from tests.helpers.installtrees import build

    build(prefix, "docker-v2")
    before = snapshot(prefix)
    out = ok(capsys, "--prefix", str(prefix))
    assert f"replaced: {at(prefix, MAIN)} (" in out and f"new: {at(prefix, CRIO_DROP_IN)} (" in out
    return before, snapshot(prefix)


def hand_edit(prefix: Path, real: str, how: Any) -> bytes:
    path = at(prefix, real)
    path.write_text(how(path.read_text()))
    return path.read_bytes()


def key(real: str) -> str:
    return real.lstrip("/")


def without_state(tree: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in tree.items() if not k.startswith(key(paths.STATE_DIR))}


@pytest.mark.parametrize("resolution", ["revert", "move-away", "install-again"])
@pytest.mark.parametrize("edit", sorted(LEFT_BY_EDIT))
def test_uninstall_leaves_an_edited_file_with_all_it_names_and_exits_1(prefix: Path, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str],
                                                                       edit: str, resolution: str) -> None:
    real, how, left = LEFT_BY_EDIT[edit]
    before, installed = installed_tree(capsys, prefix)
    pristine = at(prefix, real).read_bytes()
    edited = hand_edit(prefix, real, how)
    ready = snapshot(prefix, identity=True)
    code, dry, _ = run(capsys, "--prefix", str(prefix), "--uninstall", "--dry-run")  # says the same, writes nothing
    assert code == 1 and snapshot(prefix, identity=True) == ready
    code, out, err = run(capsys, "--prefix", str(prefix), "--uninstall")
    assert code == 1, out
    assert [line for line in dry.splitlines() if line.startswith("left: ")] == [
        line for line in out.splitlines() if line.startswith("left: ")]
    assert err == (f"oci-gpu-hook: error: install --uninstall: {len(left)} files left, so the node is still "
                   "integrated (each 'left:' line above says why and what to do); the manifest and backups are kept "
                   "for the next install --uninstall\n")
    lines = [line for line in out.splitlines() if line.startswith("left: ")]
    assert sorted(line.split(" ", 2)[1] for line in lines) == sorted(str(at(prefix, p)) for p in left), out

    def real_of(line: str) -> str:
        return "/" + os.path.relpath(line.split(" ", 2)[1], prefix)

    for line in lines:  # one line each: what is left, why, what to do
        if line.startswith(f"left: {at(prefix, real)} "):
            assert "(changed since install, and it names /" in line
            todo = "revert your edit, take out what names this install, or move the file away; then run install " \
                   "--uninstall again"
            saved = f" (what install replaced is saved at {at(prefix, paths.BACKUP_DIR)}/"
            assert line.endswith(todo + ")") if real not in (MAIN, DAEMON) else f"{todo}{saved}" in line, line
        elif real_of(line) == LAUNCHER and RUNTIME in left:  # the shim's GPU containers run it (hook_path)
            assert f"(needed by {at(prefix, RUNTIME)} (the by-path links hook of GPU containers), which is left: " \
                   "removed by the next install --uninstall" in line, line
        else:
            assert "(named by " in line and "removed by the next install --uninstall" in line, line
    # Every other file is as before install; the left ones as installed (the edited one as edited), so nothing
    # names a file that is gone; the directories install made stay until the last uninstall; the manifest lists
    # exactly what is left.
    after = snapshot(prefix)
    expected = dict(before)
    for name, value in installed.items():
        if value[0] == "dir" or name in {key(p) for p in left}:
            expected[name] = value
    expected[key(real)] = (*installed[key(real)][:1], edited, *installed[key(real)][2:])
    assert without_state(after) == without_state(expected)
    manifest = json.loads(at(prefix, MANIFEST).read_text())
    assert sorted(e["path"] for e in manifest["files"]) == sorted(left)
    for entry in manifest["files"]:
        if entry["backup"] and "path" in entry["backup"]:
            assert at(prefix, entry["backup"]["path"]).is_file()  # the backups of what is left, kept
    # The operator resolves it; the next uninstall finishes the job, and the tree is the one before install.
    if resolution == "revert":
        at(prefix, real).write_bytes(pristine)
    elif resolution == "move-away":
        at(prefix, real).rename(tmp_path / "mine")
    else:  # install again first: it sees the manifest and backups, keeps the edited file, and installs the rest
        code, out, err = run(capsys, "--prefix", str(prefix))
        assert code == 0 or (real == DAEMON and "daemon.json is not valid JSON" in err), err  # docker: skipped
        assert real == DAEMON or any(f"{word}: {at(prefix, real)} (" in out for word in ("kept", "unchanged"))
        again = {**installed, key(real): expected[key(real)]}
        if real == DAEMON:
            del again[key(GPUS)]  # docker skipped: its --gpus name is not written again
        assert without_state(snapshot(prefix)) == without_state(again)
        at(prefix, real).write_bytes(pristine)
    out = ok(capsys, "--prefix", str(prefix), "--uninstall")
    assert "left: " not in out
    assert snapshot(prefix) == before


@pytest.mark.parametrize("edit", sorted(RESOLVED_EDITS))
def test_uninstall_takes_out_only_what_install_put_in_an_edited_file(prefix: Path,
                                                                    capsys: pytest.CaptureFixture[str],
                                                                    edit: str) -> None:
    real, how = RESOLVED_EDITS[edit]
    before, _ = installed_tree(capsys, prefix)
    hand_edit(prefix, real, how)
    out = ok(capsys, "--prefix", str(prefix), "--uninstall")
    assert "left: " not in out
    after = snapshot(prefix)
    assert not at(prefix, paths.STATE_DIR).exists()  # the manifest and every backup: gone
    assert {k: v for k, v in after.items() if k != key(real)} == {k: v for k, v in before.items() if k != key(real)}
    text = at(prefix, real).read_text()
    if key(real) in before:
        original = before[key(real)][1].decode()
        assert text == how(original)  # the operator's edit on the file install had replaced: nothing of ours
        assert f"updated: {at(prefix, real)} (changed since install: only the " in out
        assert f"removed: {at(prefix, paths.BACKUP_DIR)}/" in out
    else:
        assert f"kept: {at(prefix, real)} (changed since install, and names nothing of this install: kept as " \
               "yours)" in out
        assert LAUNCHER not in text


def test_an_edited_file_an_install_no_longer_wants_stays_listed(prefix: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Switching the hook stage after editing the precreate hook: install keeps that file and its manifest entry,
    so that a later uninstall still leaves the launcher it names."""
    populate(prefix)
    original = snapshot(prefix)
    ok(capsys, "--prefix", str(prefix))
    hand_edit(prefix, PRECREATE, lambda t: t.replace('"timeout": 10', '"timeout": 30'))
    out = ok(capsys, "--prefix", str(prefix), "--hook", "prestart")
    assert (f"kept: {at(prefix, PRECREATE)} (no longer installed, but changed since install, and it names {LAUNCHER}: "
            "still listed for install --uninstall)") in out
    assert PRECREATE in {e["path"] for e in json.loads(at(prefix, MANIFEST).read_text())["files"]}
    code, out, _ = run(capsys, "--prefix", str(prefix), "--uninstall")
    assert code == 1
    assert sorted(line.split(" ", 2)[1] for line in out.splitlines() if line.startswith("left: ")) == sorted(
        [str(at(prefix, PRECREATE)), str(at(prefix, LAUNCHER))])
    assert not at(prefix, PRESTART).exists()
    at(prefix, PRECREATE).rename(tmp_path / "mine.json")
    ok(capsys, "--prefix", str(prefix), "--uninstall")
    assert snapshot(prefix) == original


def test_uninstall_only_one_integration_keeps_what_a_later_one_must_leave(prefix: Path, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """``--uninstall --only containerd`` with the drop-in edited: the launchers stay anyway, but the drop-in stays
    listed (and the run says so, exit 1), so that the full uninstall later leaves the launcher it names."""
    before, _ = installed_tree(capsys, prefix)
    hand_edit(prefix, DROP_IN, edit_append)
    code, out, _ = run(capsys, "--prefix", str(prefix), "--uninstall", "--only", "containerd")
    assert code == 1
    assert [line.split(" ", 2)[1] for line in out.splitlines() if line.startswith("left: ")] == [
        str(at(prefix, DROP_IN))]
    assert f"restored: {at(prefix, MAIN)} (" in out
    assert DROP_IN in {e["path"] for e in json.loads(at(prefix, MANIFEST).read_text())["files"]}
    code, out, _ = run(capsys, "--prefix", str(prefix), "--uninstall")
    assert code == 1
    assert sorted(line.split(" ", 2)[1] for line in out.splitlines() if line.startswith("left: ")) == sorted(
        [str(at(prefix, DROP_IN)), str(at(prefix, RUNTIME)), str(at(prefix, LAUNCHER))])
    at(prefix, DROP_IN).rename(tmp_path / "mine.toml")
    ok(capsys, "--prefix", str(prefix), "--uninstall")
    assert snapshot(prefix) == before


@pytest.mark.parametrize("own_imports", [None, '["/etc/containerd/site.toml"]'], ids=["no-imports", "own-imports"])
def test_uninstall_puts_back_the_main_configs_imports_line_and_keeps_the_operators_edit(
        prefix: Path, capsys: pytest.CaptureFixture[str], own_imports: str | None) -> None:
    main = MAIN_CONFIG if own_imports is None else MAIN_CONFIG.replace(
        "version = 2\n", f"version = 2\nimports = {own_imports}\n", 1)
    containerd_host(prefix, main)
    before = snapshot(prefix)
    ok(capsys, "--prefix", str(prefix))
    config = at(prefix, MAIN)
    assert containerd.IMPORT_MARK in config.read_text()
    config.write_text(config.read_text().replace("oom_score = -999", "oom_score = -500"))
    if ROOT:
        os.chown(config, 1111, 2222)  # whoever the operator made it
    owner = (config.stat().st_uid, config.stat().st_gid)
    out = ok(capsys, "--prefix", str(prefix), "--uninstall")
    assert f"updated: {config} (changed since install: only the imports line install added taken out)" in out
    assert config.read_text() == main.replace("oom_score = -999", "oom_score = -500")
    assert stat.S_IMODE(config.stat().st_mode) == 0o640
    assert (config.stat().st_uid, config.stat().st_gid) == owner
    assert {k: v for k, v in snapshot(prefix).items() if k != key(MAIN)} == {
        k: v for k, v in before.items() if k != key(MAIN)}  # the drop-in, the launchers, the backup: all gone


def test_uninstall_is_the_way_out_of_a_broken_config(prefix: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A typo'd config stops every operator command that uses it, in one line; ``install --uninstall`` uses none of
    it (it removes what the manifest lists), so it goes on after one warning and gives the tree back, and
    ``validate --config-file`` checks a new file while the live one is broken."""
    before = snapshot(prefix)
    ok(capsys, "--prefix", str(prefix))
    broken = tmp_path / "config.toml"
    broken.write_text("mask_other_gpu = true\n")
    monkeypatch.setenv("OCI_GPU_HOOK_CONFIG", str(broken))
    code, _out, err = run(capsys, "--prefix", str(prefix))
    assert code == 1 and err.count("\n") == 1 and "did you mean 'mask_other_gpus'" in err, err
    code, _out, err = run(capsys, "--prefix", str(prefix), "--uninstall")
    assert code == 0, err
    assert err.startswith("oci-gpu-hook: warning: config file ") and err.count("\n") == 1, err
    assert "install --uninstall goes on" in err
    assert snapshot(prefix) == before
    fixed = tmp_path / "fixed.toml"
    fixed.write_text("mask_other_gpus = true\n")
    assert cli.main(["validate", "--config-file", str(fixed)]) == 0
    out, err = capsys.readouterr()
    ok_line, cdi_warning = out.splitlines()  # the fixed key, and that the CDI path does not mask (validate says so)
    assert ok_line == f"ok: config file {fixed}" and "validate goes on with the defaults" in err
    assert cdi_warning.startswith("warning: mask_other_gpus = true is ignored on the CDI path"), out
    assert cli.main(["list"]) == 1
    assert "did you mean 'mask_other_gpus'" in capsys.readouterr().err


def test_uninstalls_error_line_comes_after_its_left_lines_in_one_pipe(prefix: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``install --uninstall 2>&1 | tee log``: the error line that says "each 'left:' line above" is the last line,
    also where stdout is a pipe (block-buffered) and stderr the same pipe."""
    populate(prefix)
    ok(capsys, "--prefix", str(prefix))
    hand_edit(prefix, PRECREATE, lambda t: t.replace('"timeout": 10', '"timeout": 30'))
    done = subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", "--sysfs-root", str(EXAMPLE_SYSFS),
                           "install", *INSTALL_DEV, "--prefix", str(prefix), "--uninstall"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, cwd=REPO, timeout=120, check=False,
                          env={k: v for k, v in clean_env().items() if k != "PYTHONUNBUFFERED"})
    lines = done.stdout.splitlines()
    assert done.returncode == 1, done.stdout
    assert [line for line in lines if line.startswith("left: ")], done.stdout
    assert lines[-1].startswith("oci-gpu-hook: error: install --uninstall: "), done.stdout
    assert sum(line.startswith("oci-gpu-hook: error: ") for line in lines) == 1, done.stdout
