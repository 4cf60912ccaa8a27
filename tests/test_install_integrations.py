"""``install --only``: each integration on its own (docker daemon.json, containerd v2/v3, CRI-O, systemd,
podman's hooks directory), and one that cannot be done skipped without stopping the others."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest

from oci_gpu_hook.config import Config, load_config
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.install import containerd, crio, docker, items, podman
from oci_gpu_hook.install import paths as install_paths
from tests.helpers.installtrees import (
    CONTAINERD_V2,
    CONTAINERD_V3,
    DAEMON_JSON,
    at,
    build,
    containerd_binary,
    isolated_env,
    put,
    run_install,
    snapshot,
)

REPO = Path(__file__).resolve().parent.parent
LAUNCHER = f"{install_paths.LAUNCHER_DIR}/oci-gpu-hook"
RUNTIME = f"{install_paths.LAUNCHER_DIR}/oci-gpu-runtime"
__all__ = ["isolated_env"]  # the autouse fixture, imported


run = run_install


# --- docker ----------------------------------------------------------------------------------------


def test_docker_runtime_is_inserted_keeping_every_other_byte() -> None:
    text = docker.merged(DAEMON_JSON, RUNTIME)
    assert text is not None
    assert json.loads(text) == {**json.loads(DAEMON_JSON), "runtimes": {"oci-gpu": {"path": RUNTIME}}}
    assert text.replace(f'\n  "runtimes": {{"oci-gpu": {{"path": "{RUNTIME}"}}}},', "") == DAEMON_JSON
    assert docker.merged(text, RUNTIME) is None  # already there
    assert docker.unmerged(text, RUNTIME) == DAEMON_JSON
    assert docker.merged(None, RUNTIME) == docker.merged("", RUNTIME)
    assert json.loads(docker.merged("{}", RUNTIME) or "") == {"runtimes": {"oci-gpu": {"path": RUNTIME}}}


def test_docker_runtime_joins_the_operators_runtimes() -> None:
    text = '{"runtimes": {"crun": {"path": "/usr/bin/crun"}}, "debug": true}'
    merged = docker.merged(text, RUNTIME)
    assert merged is not None
    assert json.loads(merged) == {"runtimes": {"crun": {"path": "/usr/bin/crun"}, "oci-gpu": {"path": RUNTIME}},
                                  "debug": True}
    assert json.loads(docker.unmerged(merged, RUNTIME) or "") == json.loads(text)


def test_uninstall_takes_only_our_runtime_out_of_a_daemon_json_edited_since(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    build(tmp_path, "docker-v2")
    run(capsys, tmp_path, "--only", "docker")
    daemon_json = at(tmp_path, docker.DAEMON_JSON)
    edited = json.loads(daemon_json.read_text())
    edited["debug"] = True
    daemon_json.write_text(json.dumps(edited))
    out, _ = run(capsys, tmp_path, "--uninstall")
    assert f"updated: {daemon_json} (changed since install: only the oci-gpu runtime taken out)" in out
    assert json.loads(daemon_json.read_text()) == {**json.loads(DAEMON_JSON), "debug": True}
    assert not at(tmp_path, install_paths.STATE_DIR).exists()


def test_a_daemon_json_install_cannot_read_skips_docker_only(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    build(tmp_path, "docker-v2")
    put(tmp_path, docker.DAEMON_JSON, '{"log-driver": ')
    before = snapshot(tmp_path, mtimes=True)
    out, err = run(capsys, tmp_path, code=1)
    assert err.startswith(f"oci-gpu-hook: error: docker: {at(tmp_path, docker.DAEMON_JSON)} is not valid JSON")
    assert err.count("\n") == 1
    assert f"skipped: docker: {at(tmp_path, docker.DAEMON_JSON)}" in out
    assert at(tmp_path, docker.DAEMON_JSON).read_text() == '{"log-driver": '
    assert at(tmp_path, containerd.DROP_IN_PATH).is_file() and at(tmp_path, crio.DROP_IN_PATH).is_file()
    run(capsys, tmp_path, "--uninstall")
    assert snapshot(tmp_path, mtimes=True) == before


# --- containerd ------------------------------------------------------------------------------------


def test_containerd_v3_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build(tmp_path, "v3-conf")
    out, _ = run(capsys, tmp_path, "--only", "containerd")
    drop_in = tomllib.loads(at(tmp_path, containerd.DROP_IN_PATH).read_text())
    assert drop_in["version"] == 3
    assert list(drop_in["plugins"]) == ["io.containerd.cri.v1.runtime"]
    cri = drop_in["plugins"]["io.containerd.cri.v1.runtime"]
    main_cri = tomllib.loads(CONTAINERD_V3)["plugins"]["io.containerd.cri.v1.runtime"]
    assert cri["containerd"]["runtimes"]["runc"] == main_cri["containerd"]["runtimes"]["runc"]
    assert cri["containerd"]["runtimes"]["oci-gpu"] == {"runtime_type": "io.containerd.runc.v2",
                                                       "container_annotations": ["cdi.k8s.io/*"],
                                                       "options": {"BinaryName": RUNTIME}}
    assert cri["enable_cdi"] is True and cri["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    main = tomllib.loads(at(tmp_path, containerd.MAIN_CONFIG_PATH).read_text())
    assert main == {**tomllib.loads(CONTAINERD_V3), "imports": ["/etc/containerd/conf.d/*.toml"]}
    assert "note: containerd: containerd 2.x (" in out and "native CDI on (enable_cdi), drop-in config version 3" in out
    hook = at(tmp_path, "/etc/containers/oci/hooks.d/oci-gpu-hook-precreate.json")
    assert hook.read_text() == '{"the operator": "s own"}\n'  # --only containerd: podman's hooks untouched


@pytest.mark.parametrize(("cdi", "key"), [(False, None), (True, True)])
def test_containerd_v2_drop_in_turns_on_cdi_on_1_7(cdi: bool, key: bool | None) -> None:
    text = containerd.drop_in(RUNTIME, tomllib.loads(CONTAINERD_V2), cdi=cdi)
    cri = tomllib.loads(text)["plugins"][containerd.CRI]
    assert cri.get("enable_cdi") is key
    assert tomllib.loads(text)["version"] == 2
    assert containerd.has_cdi((1, 7)) and containerd.has_cdi((2, 0)) and not containerd.has_cdi((1, 6))


def test_a_version_1_containerd_config_skips_containerd_with_a_note(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    v1 = '[plugins.cri]\n  sandbox_image = "pause:3.2"\n'
    put(tmp_path, containerd.MAIN_CONFIG_PATH, v1)
    out, err = run(capsys, tmp_path)  # not an error: exit 0
    assert err == ""
    assert "note: containerd: " in out and "is a version 1 config: containerd is left as it is" in out
    assert at(tmp_path, containerd.MAIN_CONFIG_PATH).read_text() == v1
    assert not at(tmp_path, containerd.DROP_IN_PATH).exists()
    assert at(tmp_path, LAUNCHER).is_file()


# --- CRI-O, systemd, podman ------------------------------------------------------------------------


def test_crio_drop_in_uses_documented_keys_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, tmp_path, "--only", "crio")
    data = tomllib.loads(at(tmp_path, crio.DROP_IN_PATH).read_text())

    def check(table: dict[str, object], path: tuple[str, ...]) -> None:
        for key, value in table.items():
            if isinstance(value, dict) and (*path, key) not in crio.KNOWN_KEYS and path:
                check(value, (*path, key))
                continue
            if isinstance(value, dict):
                check(value, (*path, key))
            else:
                assert key in crio.KNOWN_KEYS[path], (path, key)

    check(data, ())
    assert data["crio"]["runtime"]["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    assert data["crio"]["runtime"]["runtimes"]["oci-gpu"]["runtime_path"] == RUNTIME
    assert crio.DROP_IN_PATH == "/etc/crio/crio.conf.d/99-oci-gpu-hook.conf"


def test_no_precreate_hook_where_crio_reads_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """CRI-O reads OCI hooks from podman's default directory and refuses to start on a precreate hook there
    ("unknown stage": seen with a real CRI-O 1.36.3, docs/nri.md): where /etc/crio is, install leaves podman's
    precreate hook out with a note saying what that means and what to do (the rest installed); a prestart
    hook goes in; and so does the precreate hook when CRI-O's hooks_dir (its config, then its drop-ins in name
    order) does not hold podman's directory."""
    hook_dir = "/usr/share/containers/oci/hooks.d"
    (tmp_path / "etc/crio").mkdir(parents=True)
    out, _ = run(capsys, tmp_path, "--only", "podman,crio")
    assert (f"note: podman: no precreate hook: CRI-O is configured here and reads hooks from {hook_dir} too, where "
            "it refuses to start on podman's precreate hook ('unknown stage'); podman containers get no GPU from a "
            "hook until install --hook prestart") in out, out
    assert not at(tmp_path, f"{hook_dir}/oci-gpu-hook-precreate.json").exists()
    assert at(tmp_path, crio.DROP_IN_PATH).is_file()
    run(capsys, tmp_path, "--only", "podman,crio", "--hook", "prestart")
    assert at(tmp_path, f"{hook_dir}/oci-gpu-hook-prestart.json").is_file()
    put(tmp_path, crio.MAIN_CONFIG, '[crio.runtime]\nhooks_dir = ["/etc/containers/oci/hooks.d"]\n')
    put(tmp_path, f"{crio.DROP_IN_DIR}/50-site.conf", '[crio.runtime]\nhooks_dir = ["/srv/crio-hooks"]\n')
    assert crio.hooks_dirs(lambda p: str(at(tmp_path, p))) == ["/srv/crio-hooks"]
    run(capsys, tmp_path, "--only", "podman,crio")
    assert at(tmp_path, f"{hook_dir}/oci-gpu-hook-precreate.json").is_file()
    put(tmp_path, f"{crio.DROP_IN_DIR}/50-site.conf", '[crio.runtime]\nhooks_dir = "/srv"\n')
    with pytest.raises(HookError, match=r"hooks_dir must be a list of absolute paths"):
        crio.hooks_dirs(lambda p: str(at(tmp_path, p)))


def test_systemd_unit_runs_the_installed_launcher(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, tmp_path, "--only", "systemd")
    unit = at(tmp_path, install_paths.SYSTEMD_UNIT).read_text()
    assert unit == (REPO / "examples/systemd/oci-gpu-hook-watch.service").read_text()  # the shipped example
    execs = [line for line in unit.splitlines() if line.startswith("ExecStart")]
    assert execs == [f"ExecStartPre=-{LAUNCHER} watch --once", f"ExecStart={LAUNCHER} watch"]
    assert os.access(at(tmp_path, LAUNCHER), os.X_OK)
    assert items.UNIT_FALLBACK.format(launcher=LAUNCHER).count(LAUNCHER) == 2
    planner = at(tmp_path, install_paths.PLANNER_UNIT).read_text()
    assert planner == (REPO / "examples/systemd/oci-gpu-hook-planner.service").read_text()
    assert [line for line in planner.splitlines() if line.startswith("ExecStart")] == [f"ExecStart={LAUNCHER} serve"]
    fallback = items.PLANNER_UNIT_FALLBACK.format(launcher=LAUNCHER)
    for line in ("ExecStart", "Restart", "RuntimeDirectory", "RuntimeDirectoryMode", "RuntimeDirectoryPreserve", "User",
                 "TimeoutStopSec"):
        assert [x for x in planner.splitlines() if x.startswith(line + "=")] == [
            x for x in fallback.splitlines() if x.startswith(line + "=")], line


@pytest.mark.parametrize(("version", "unit"), [("v2.1.9", True), ("v2.2.7", True), ("1.6.20", False)])
def test_the_nri_unit_where_containerd_has_nri(tmp_path: Path, capsys: pytest.CaptureFixture[str], version: str,
                                              unit: bool) -> None:
    """containerd 2.x (found by its binary's version) has NRI: the plugin's unit is installed; 1.x has none:
    skipped with a note.  containerd 2.0 and 2.1 (NRI v0.8.0) have no default validator: the note says what
    that means while the plugin is down (seen on a real containerd 2.1.9, docs/nri.md), and 2.2's names the
    validator.  Uninstall of the integration takes the unit out."""
    put(tmp_path, containerd.MAIN_CONFIG_PATH, CONTAINERD_V3 if unit else CONTAINERD_V2)
    containerd_binary(tmp_path, version)
    (tmp_path / "etc/systemd/system").mkdir(parents=True)
    out, _ = run(capsys, tmp_path)
    path = at(tmp_path, install_paths.NRI_UNIT)
    assert path.exists() == unit
    if not unit:
        assert "note: nri: no containerd 2.x or CRI-O found here (containerd 1.x has no NRI)" in out
        return
    text = path.read_text()
    assert [line for line in text.splitlines() if line.startswith("ExecStart")] == [f"ExecStart={LAUNCHER} nri"]
    assert "Restart=always" in text.splitlines()
    assert text == items.nri_unit(LAUNCHER, load_config(dict(os.environ)))  # the hardened unit, for this config
    shown = version[1:]
    assert f"note: nri: containerd {shown}: systemctl daemon-reload && systemctl enable --now oci-gpu-hook-nri" in out
    no_validator = f"containerd {shown} has no NRI default validator (containerd 2.2 and later have it): while the " \
        "plugin is down, a container that asks by env starts without its GPU"
    assert (no_validator in out) == (version == "v2.1.9"), out
    assert ("needs NRI's default validator" in out) == (version == "v2.2.7"), out
    run(capsys, tmp_path, "--uninstall", "--only", "nri")
    assert not path.exists() and at(tmp_path, containerd.DROP_IN_PATH).exists()


def test_the_nri_unit_is_hardened_and_writes_where_the_config_says() -> None:
    """The NRI plugin's unit, as the DaemonSet's container runs it: no capability (an empty bounding set), no new
    privileges, the system read-only but /run/oci-gpu-hook (its RuntimeDirectory, kept) and, for a config that
    has the plugin write elsewhere, the by-path directory and the log file's directory (quoted for systemd).  It
    starts and serves under a real systemd in tests/containers/test_nri.py."""
    lines = items.nri_unit(LAUNCHER, Config()).splitlines()
    for line in ("User=root", "CapabilityBoundingSet=", "AmbientCapabilities=", "NoNewPrivileges=yes",
                 "ProtectSystem=strict", "RuntimeDirectory=oci-gpu-hook", "RuntimeDirectoryMode=0700",
                 "RuntimeDirectoryPreserve=yes", "RestrictAddressFamilies=AF_UNIX"):
        assert line in lines, line
    assert not [line for line in lines if line.startswith("ReadWritePaths")]
    inside = items.nri_unit(LAUNCHER, Config(by_path_dir="/run/oci-gpu-hook/links", log_file="/run/oci-gpu-hook/x.log"))
    assert not [line for line in inside.splitlines() if line.startswith("ReadWritePaths")]
    elsewhere = items.nri_unit(LAUNCHER, Config(by_path_dir="/srv/gpu links/", log_file="/var/log/ogh%1.log"))
    assert [line for line in elsewhere.splitlines() if line.startswith("ReadWritePaths")] == [
        'ReadWritePaths="-/srv/gpu links"', 'ReadWritePaths="-/var/log"']


def test_the_nri_unit_for_crio_and_when_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """CRI-O (its /etc/crio) gets the unit; ``--only nri`` writes it wherever asked, saying no runtime was found."""
    (tmp_path / "crio" / "etc/crio").mkdir(parents=True)
    (tmp_path / "crio" / "etc/systemd/system").mkdir(parents=True)
    out, _ = run(capsys, tmp_path / "crio", "--hook", "prestart")  # CRI-O reads podman's default hooks dir
    assert at(tmp_path / "crio", install_paths.NRI_UNIT).is_file() and "note: nri: CRI-O: " in out
    out, _ = run(capsys, tmp_path / "asked", "--only", "nri")
    assert at(tmp_path / "asked", install_paths.NRI_UNIT).is_file()
    assert "note: nri: no containerd 2.x or CRI-O found: systemctl daemon-reload" in out


def test_the_nri_unit_needs_protobuf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without protobuf the plugin could not start: skipped with the extra to install, an error when asked."""
    import importlib.util

    from oci_gpu_hook.errors import HookError

    (tmp_path / "etc/crio").mkdir(parents=True)
    (tmp_path / "etc/systemd/system").mkdir(parents=True)
    real = importlib.util.find_spec

    def no_google(name: str, *args: object) -> object:
        if name.startswith("google"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", no_google)
    notes: list[str] = []
    with pytest.raises(items.Skip, match=r"pip install 'oci-gpu-hook\[nri\]'"):
        items.nri_items(lambda p: str(at(tmp_path, p)), notes, False)
    with pytest.raises(HookError, match="the NRI plugin needs protobuf"):
        items.nri_items(lambda p: str(at(tmp_path, p)), notes, True)
    assert notes == []


def test_podman_hooks_dir_from_containers_conf(tmp_path: Path) -> None:
    def disk(real: str) -> str:
        return str(at(tmp_path, real))

    assert podman.hooks_dir(disk) == ("/usr/share/containers/oci/hooks.d", "podman's built-in default")
    put(tmp_path, "/usr/share/containers/containers.conf", '[engine]\n#hooks_dir = ["/x"]\n')
    assert podman.hooks_dir(disk)[0] == "/usr/share/containers/oci/hooks.d"
    put(tmp_path, "/etc/containers/containers.conf", '[engine]\nhooks_dir = ["/opt/hooks", "/srv/hooks"]\n')
    assert podman.hooks_dir(disk) == ("/srv/hooks", "/etc/containers/containers.conf")
    put(tmp_path, "/etc/containers/containers.conf.d/50-site.conf",
        '[engine]\nhooks_dir = ["/usr/share/containers/oci/hooks.d", "/etc/containers/oci/hooks.d"]\n')
    assert podman.hooks_dir(disk) == ("/etc/containers/oci/hooks.d", "/etc/containers/containers.conf.d/50-site.conf")


# --- --only, --prefix ------------------------------------------------------------------------------


def test_only_installs_and_uninstalls_one_integration_at_a_time(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    prefix = tmp_path / "new" / "root"  # --prefix makes what it needs
    build(prefix, "docker-v2")
    original = snapshot(prefix, mtimes=True)
    run(capsys, prefix, "--only", "docker")
    manifest = json.loads(at(prefix, install_paths.MANIFEST_PATH).read_text())
    assert [(e["path"], e["integration"]) for e in manifest["files"]] == [
        (LAUNCHER, "core"), (RUNTIME, "core"), (docker.DAEMON_JSON, "docker"), (docker.GPUS_PATH, "docker")]
    run(capsys, prefix, "--only", "containerd,crio")  # adds, never takes docker's out
    paths = {e["path"] for e in json.loads(at(prefix, install_paths.MANIFEST_PATH).read_text())["files"]}
    assert {docker.DAEMON_JSON, containerd.DROP_IN_PATH, containerd.MAIN_CONFIG_PATH, crio.DROP_IN_PATH} <= paths
    out, _ = run(capsys, prefix, "--uninstall", "--only", "docker")
    assert f"restored: {at(prefix, docker.DAEMON_JSON)}" in out
    assert at(prefix, docker.DAEMON_JSON).read_text() == DAEMON_JSON
    assert not at(prefix, docker.GPUS_PATH).exists()
    assert at(prefix, containerd.DROP_IN_PATH).is_file()
    run(capsys, prefix, "--uninstall")
    assert snapshot(prefix, mtimes=True) == original


def test_prefix_is_created(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = tmp_path / "a" / "b"
    run(capsys, prefix, "--only", "cdi")
    assert at(prefix, "/var/run/cdi/amd.com-gpu.json").is_file()
    run(capsys, prefix, "--uninstall")
    assert list(prefix.iterdir()) == []


@pytest.mark.parametrize("release, writes", [("28.5.2", True), ("29.7.2", False), ("", True)])
def test_docker_gpus_name_only_where_dockerd_has_no_cdi_gpus(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              release: str, writes: bool) -> None:
    """From Docker 29.3 dockerd serves ``--gpus`` from the amd.com CDI spec, and with ``amd-container-runtime`` on
    its PATH it falls back to AMD_VISIBLE_DEVICES for an id the spec lacks, which runc ignores: seen on a real
    dockerd 29.7.2 (docs/runtimes.md), ``--gpus device=8`` started a container without a GPU and no error.  So
    install writes that name only for an older dockerd, or one that does not say its release (as before)."""
    prefix = tmp_path / "root"
    build(prefix, "docker-v2")
    if release:
        put(prefix, "/usr/bin/dockerd", f"#!/bin/sh\necho 'Docker version {release}, build 0123456'\n", 0o755)
    out, _ = run(capsys, prefix, "--only", "docker")
    manifest = json.loads(at(prefix, install_paths.MANIFEST_PATH).read_text())
    assert (docker.GPUS_PATH in {e["path"] for e in manifest["files"]}) is writes
    assert at(prefix, docker.GPUS_PATH).exists() is writes
    assert ("is not written: with it, a --gpus id the spec lacks would fall back" in out) is not writes
    if release == "29.7.2":  # an upgrade from 28: the name written then is taken out
        put(prefix, "/usr/bin/dockerd", "#!/bin/sh\necho 'Docker version 28.5.2, build 0123456'\n", 0o755)
        run(capsys, prefix, "--only", "docker")
        assert at(prefix, docker.GPUS_PATH).exists()
        put(prefix, "/usr/bin/dockerd", "#!/bin/sh\necho 'Docker version 29.7.2, build 0123456'\n", 0o755)
        run(capsys, prefix, "--only", "docker")
        assert not at(prefix, docker.GPUS_PATH).exists()
