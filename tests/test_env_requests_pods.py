"""Env requests where pods reach the launchers: ``install`` (and ``launchers``) bake ``allow_env_requests`` off
wherever they write what pods reach (containerd's CRI runtime, CRI-O's handler or hooks directory, the NRI unit),
one line either way; ``validate`` flags env requests on a node that runs a kubelet; a request set aside is a journal
line at info level.  The same requests through real containers: tests/containers/test_pods_env.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from oci_gpu_hook.config import Config, load_config
from oci_gpu_hook.install import kubelet, launchers
from oci_gpu_hook.install import paths as install_paths
from oci_gpu_hook.request import requested
from tests.helpers.installtrees import (
    CONTAINERD_V3,
    DAEMON_JSON,
    SEED_SYSFS,
    at,
    isolated_env,
    put,
    run_install,
    snapshot,
)

__all__ = ["isolated_env"]  # the autouse fixture, imported
VAR = "OCI_GPU_HOOK_ALLOW_ENV_REQUESTS"
LAUNCHER_DIR = install_paths.LAUNCHER_DIR
ON_LINE = f"note: env requests: on, as --set {VAR}=true asks, although pods reach these launchers"
OFF_LINE = "note: env requests: off, since pods reach these launchers"


def baked(prefix: Path) -> dict[str, str] | None:
    return launchers.baked_defaults(str(at(prefix, LAUNCHER_DIR)))


def env_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("note: env requests")]


def v3_node(prefix: Path, crio_hooks: str | None = None) -> None:
    """A node with containerd 2.x's config (its version given to install) and, with ``crio_hooks``, CRI-O's whose
    hooks directory is that one; systemd's unit directory."""
    put(prefix, "/etc/containerd/config.toml", CONTAINERD_V3)
    if crio_hooks is not None:
        put(prefix, "/etc/crio/crio.conf", f'[crio.runtime]\nhooks_dir = ["{crio_hooks}"]\n')
    (prefix / "etc/systemd/system").mkdir(parents=True, exist_ok=True)


@pytest.mark.parametrize(("only", "what"), [
    ("containerd", "containerd's CRI runtime oci-gpu"),
    ("crio", "CRI-O's runtime handler oci-gpu"),
    ("nri", "the NRI plugin's unit"),
    (None, "containerd's CRI runtime oci-gpu; CRI-O's runtime handler oci-gpu; the NRI plugin's unit"),
])
def test_what_pods_reach_bakes_env_requests_off(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                only: str | None, what: str) -> None:
    v3_node(tmp_path, "/etc/crio/hooks.d")
    out, _ = run_install(capsys, tmp_path, "--containerd-version", "2.1", *(["--only", only] if only else []))
    assert baked(tmp_path) == {VAR: "false"}
    lines = env_lines(out)
    assert len(lines) == 1 and lines[0].startswith(f"{OFF_LINE} ({what}): "), out
    assert f"install --set {VAR}=true turns them on" in lines[0]
    config = load_config(baked(tmp_path) or {})
    assert config.allow_env_requests is False
    asks = requested(["AMD_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=all"], None, config)
    assert [(a.kind, a.values) for a in asks] == [("amd", []), ("nvidia", [])]
    assert all("ignored: allow_env_requests is off" in a.note for a in asks)
    annotated = requested(["AMD_VISIBLE_DEVICES=all"], {"cdi.k8s.io/devplugin": "amd.com/gpu=2"}, config)
    assert [(a.kind, a.values) for a in annotated] == [("amd", ["2"])]  # the device plugin's grant is unaffected


@pytest.mark.parametrize("tree", ["podman", "docker"])
def test_a_podman_or_docker_node_keeps_env_requests(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                    tree: str) -> None:
    if tree == "docker":
        put(tmp_path, "/etc/docker/daemon.json", DAEMON_JSON)
    out, _ = run_install(capsys, tmp_path)
    assert baked(tmp_path) == {}
    assert env_lines(out) == []
    assert load_config({}).allow_env_requests is True


@pytest.mark.parametrize("disabled", ['["cri"]', '["io.containerd.grpc.v1.cri", "other"]'])
def test_a_containerd_without_its_cri_serves_no_pod(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                   disabled: str) -> None:
    """Docker's containerd.io package ships a config with the CRI off: the drop-in then reaches no pod (a Docker
    node), and a config that turns off another plugin alone is still one pods reach."""
    put(tmp_path, "/etc/containerd/config.toml", f"version = 2\ndisabled_plugins = {disabled}\n")
    out, _ = run_install(capsys, tmp_path, "--containerd-version", "1.7", "--only", "containerd")
    assert baked(tmp_path) == {} and env_lines(out) == []
    other = tmp_path / "other"
    put(other, "/etc/containerd/config.toml", 'version = 2\ndisabled_plugins = ["io.containerd.internal.v1.opt"]\n')
    out, _ = run_install(capsys, other, "--containerd-version", "1.7", "--only", "containerd")
    assert baked(other) == {VAR: "false"} and len(env_lines(out)) == 1


def test_podmans_hook_where_crio_reads_it_serves_pods(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``--hook prestart`` into a hooks directory CRI-O reads too (its default is podman's): pods reach it."""
    hooks = "/usr/share/containers/oci/hooks.d"
    put(tmp_path, "/etc/crio/crio.conf", f'[crio.runtime]\nhooks_dir = ["{hooks}"]\n')
    out, _ = run_install(capsys, tmp_path, "--only", "podman", "--hook", "prestart")
    assert baked(tmp_path) == {VAR: "false"}
    assert env_lines(out)[0].startswith(f"{OFF_LINE} (a hook in {hooks}, which CRI-O reads): "), out
    other = tmp_path / "other"
    put(other, "/etc/crio/crio.conf", '[crio.runtime]\nhooks_dir = ["/etc/crio/hooks.d"]\n')
    out, _ = run_install(capsys, other, "--only", "podman", "--hook", "prestart")
    assert baked(other) == {} and env_lines(out) == []  # CRI-O reads another directory: podman's alone


@pytest.mark.parametrize(("value", "on"), [("true", True), ("1", True), ("false", False), ("off", False)])
def test_the_operators_word_decides_and_is_said(capsys: pytest.CaptureFixture[str], tmp_path: Path, value: str,
                                                on: bool) -> None:
    v3_node(tmp_path)
    out, _ = run_install(capsys, tmp_path, "--containerd-version", "2.1", "--only", "containerd",
                         "--set", f"{VAR}={value}")
    assert baked(tmp_path) == {VAR: value}
    (line,) = env_lines(out)
    if on:
        assert line.startswith(ON_LINE.replace("=true", f"={value}")) and "gets every GPU of the node" in line
    else:
        assert line.startswith(f"note: env requests: off, as --set {VAR}={value} asks (pods reach")
    assert load_config(baked(tmp_path) or {}).allow_env_requests is on


def test_a_bad_value_is_one_line_and_nothing_written(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    v3_node(tmp_path)
    before = snapshot(tmp_path)
    _, err = run_install(capsys, tmp_path, "--containerd-version", "2.1", "--set", f"{VAR}=maybe", code=1)
    assert err.count("\n") == 1 and "bad value 'maybe' for 'allow_env_requests'" in err, err
    assert snapshot(tmp_path) == before


def test_the_config_files_key_does_not_turn_them_on(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/config.toml spells ``allow_env_requests = true``: copied onto a Kubernetes node, the baked default
    (an environment variable, which beats the file) still keeps env requests off."""
    config = tmp_path / "config.toml"
    config.write_text("allow_env_requests = true\n")
    monkeypatch.setenv("OCI_GPU_HOOK_CONFIG", str(config))
    v3_node(tmp_path / "root")
    run_install(capsys, tmp_path / "root", "--containerd-version", "2.1", "--only", "containerd")
    assert load_config(baked(tmp_path / "root") or {}).allow_env_requests is False
    assert load_config().allow_env_requests is True  # the file alone says on


def test_what_an_earlier_install_left_still_counts(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``install --only podman`` after a containerd install rewrites the launchers the drop-in still names."""
    v3_node(tmp_path)
    run_install(capsys, tmp_path, "--containerd-version", "2.1", "--only", "containerd")
    out, _ = run_install(capsys, tmp_path, "--only", "podman")
    assert baked(tmp_path) == {VAR: "false"}
    assert env_lines(out)[0].startswith(f"{OFF_LINE} (containerd's CRI runtime oci-gpu (an earlier install's)): ")
    run_install(capsys, tmp_path, "--uninstall", "--only", "containerd")
    out, _ = run_install(capsys, tmp_path, "--only", "podman")
    assert baked(tmp_path) == {} and env_lines(out) == []


def test_the_dry_run_says_it_too(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    v3_node(tmp_path)
    out, _ = run_install(capsys, tmp_path, "--containerd-version", "2.1", "--only", "containerd", "--dry-run")
    assert len(env_lines(out)) == 1 and not at(tmp_path, LAUNCHER_DIR).exists()


def test_baked_defaults_read_back_what_launchers_wrote(tmp_path: Path) -> None:
    for defaults in ({}, {VAR: "false", "OCI_GPU_HOOK_LOG_FILE": "/var/log/x y'z\"}.log"}):
        launchers.write_launchers(str(tmp_path), defaults, native=False, trust=False)
        assert launchers.baked_defaults(str(tmp_path)) == defaults
    assert launchers.baked_defaults(str(tmp_path / "none")) is None
    (tmp_path / "oci-gpu-hook").write_text("#!/bin/sh\nexec true\n")
    assert launchers.baked_defaults(str(tmp_path)) is None


# --- validate and inspect: a node that runs a kubelet ---------------------------------------------------------


def test_the_kubelet_rule(tmp_path: Path) -> None:
    root, proc = tmp_path / "root", tmp_path / "proc"
    (proc / "17").mkdir(parents=True)
    (proc / "17" / "comm").write_text("containerd\n")
    (proc / "self").mkdir()
    root.mkdir()
    assert kubelet.kubelet_evidence(str(root), str(proc)) is None
    (root / "var/lib/kubelet").mkdir(parents=True)
    assert kubelet.kubelet_evidence(str(root), str(proc)) == "/var/lib/kubelet is there"
    (root / "var/lib/kubelet").rmdir()
    (root / "var/lib/kubelet").write_text("")  # a file is no kubelet's root directory
    assert kubelet.kubelet_evidence(str(root), str(proc)) is None
    for comm in kubelet.KUBELET_PROCESSES:
        (proc / "42").mkdir(exist_ok=True)
        (proc / "42" / "comm").write_text(comm + "\n")
        assert kubelet.kubelet_evidence(str(root), str(proc)) == f"process 42 is {comm}"
    assert kubelet.kubelet_evidence(str(root), str(tmp_path / "no-proc")) is None


def test_the_line_validate_prints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, launched = tmp_path / "root", tmp_path / "bin"
    (root / "var/lib/kubelet").mkdir(parents=True)
    assert kubelet.env_requests_line(str(tmp_path / "none"), str(tmp_path / "none"), str(launched)) is None
    line = kubelet.env_requests_line(str(root), str(tmp_path / "none"), str(launched))
    assert line is not None and line.startswith(f"warning: env requests are on (no launchers in {launched}: the "
                                                 "config file's) on a node that runs a kubelet (/var/lib/kubelet "
                                                 "is there): a pod whose image or spec sets one of "
                                                 "AMD_VISIBLE_DEVICES, INTEL_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES")
    assert f"oci-gpu-hook install --set {VAR}=false" in line
    launchers.write_launchers(str(launched), {VAR: "false"}, native=False, trust=False)
    line = kubelet.env_requests_line(str(root), str(tmp_path / "none"), str(launched))
    assert line is not None and line.startswith(f"ok: env requests are off (the launchers in {launched}) on this node")
    (tmp_path / "later.toml").write_text("")
    launchers.write_launchers(str(launched), {"OCI_GPU_HOOK_CONFIG": str(tmp_path / "later.toml")}, native=False,
                              trust=False)
    (tmp_path / "later.toml").write_text("nonsense = 1\n")  # broken after the launchers were written
    assert kubelet.env_requests_line(str(root), str(tmp_path / "none"), str(launched)) is None  # validate says why


@pytest.mark.root("unshare")
@pytest.mark.parametrize("command", ["validate", "inspect"])
def test_validate_and_inspect_on_a_kubelet_node(tmp_path: Path, command: str) -> None:
    """The commands as an operator runs them, in a private mount namespace whose /var/lib holds a kubelet's
    directory (the host's is left alone): env requests on (no launchers, the defaults) are flagged."""
    scratch = tmp_path / "varlib"
    scratch.mkdir()
    argv = [sys.executable, "-m", "oci_gpu_hook.entry.cli", "--sysfs-root", str(SEED_SYSFS), command]
    argv += ["--pid", "$$"] if command == "inspect" else []  # its own process (sh execs it)
    script = (f"mount -t tmpfs none {scratch} && mkdir {scratch}/kubelet && mount --bind {scratch} /var/lib && "
              f"exec {' '.join(argv)}")
    env = {"PATH": os.environ["PATH"], "OCI_GPU_HOOK_CONFIG": os.devnull}
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], capture_output=True,
                          text=True, env=env, timeout=120, check=False)
    warnings = [line for line in done.stdout.splitlines() if line.startswith("warning: env requests are on")]
    assert len(warnings) == 1, (done.stdout, done.stderr)
    assert "(/var/lib/kubelet is there)" in warnings[0]
    if command == "validate":
        assert done.returncode == 0, done.stderr


# --- the journal's line of a request set aside --------------------------------------------------------------


def test_an_ignored_request_is_a_journal_line_at_info(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from oci_gpu_hook import log
    from oci_gpu_hook.oci_spec import ContainerSpec
    from oci_gpu_hook.plan import plan_for_spec

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(tmp_path / "log.sock"))
    listener.setblocking(False)
    monkeypatch.setattr(log, "SYSLOG_SOCKET", str(tmp_path / "log.sock"))
    try:
        spec = ContainerSpec({"ociVersion": "1.0.2", "process": {"env": ["AMD_VISIBLE_DEVICES=all"]}})
        for allow, syslog in ((False, True), (True, True), (False, False)):
            config = Config(sysfs_root=str(SEED_SYSFS), allow_env_requests=allow, syslog=syslog)
            plan_for_spec(spec, config).record(config, "nri", "c1", 0.0)
        got = []
        while True:
            try:
                got.append(listener.recv(1 << 16).decode())
            except BlockingIOError:
                break
    finally:
        listener.close()
    assert len(got) == 1, got  # granted: no line; syslog off: no line
    assert got[0].startswith("<30>")  # facility daemon, severity info
    assert got[0].endswith("nri: container c1: no GPU granted (AMD_VISIBLE_DEVICES=all ignored: allow_env_requests "
                           "is off, only annotations count)")
    assert json.dumps(got)  # one datagram of text
