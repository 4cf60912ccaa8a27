"""``install`` detects the node's containerd, never the one on its own PATH: the binary containerd.service runs
or the usual paths under the host root (version read from the binary's bytes), dpkg's record, the main config's
``version``, or ``--containerd-version``; the drop-in's config version and native CDI follow it.

Every install here runs with PATH scrubbed to an empty directory (as in the DaemonSet's install container,
which has no containerd), into a private prefix that looks like a containerd 1.6, 1.7 or 2.x node."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest

from oci_gpu_hook.entry import cli
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.install import containerd, items
from oci_gpu_hook.install import containerd_detect as detect
from tests.conftest import unavailable
from tests.helpers.containerlib import INSTALL_DEV
from tests.helpers.installtrees import (
    CONTAINERD_V2,
    CONTAINERD_V3,
    DEBIAN_1_6,
    containerd_binary,
    go_build_info,
    go_string_variables,
    isolated_env,
    put,
)

REPO = Path(__file__).resolve().parent.parent
SYSFS = REPO / "examples" / "hosts" / "seed-8x-gfx1100" / "sys"
__all__ = ["isolated_env"]  # the autouse fixture, imported


@pytest.fixture(autouse=True)
def no_containerd_on_path(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """install's own PATH has no containerd (this machine's /usr/bin/containerd is 1.6.20: never to be asked)."""
    monkeypatch.setenv("PATH", str(tmp_path_factory.mktemp("empty-path")))


def install(capsys: pytest.CaptureFixture[str], prefix: Path, *args: str, code: int = 0) -> tuple[str, str]:
    got = cli.main(["--sysfs-root", str(SYSFS), "install", *INSTALL_DEV, "--prefix", str(prefix), "--only",
                    "containerd", *args])
    out, err = capsys.readouterr()
    assert got == code, (out, err)
    return out, err


def drop_in(prefix: Path) -> tuple[int, dict[str, object]]:
    """The drop-in's config version and its CRI table."""
    data = tomllib.loads((prefix / containerd.DROP_IN_PATH.lstrip("/")).read_text())
    assert list(data["plugins"]) == [containerd.CRI_PLUGIN[data["version"]]]
    return data["version"], data["plugins"][containerd.CRI_PLUGIN[data["version"]]]


def note(out: str) -> str:
    unchanged = f"note: {items.CONTAINERD_UNCHANGED}"  # the reinstall's own note, not the version's
    (line,) = [line for line in out.splitlines() if line.startswith("note: containerd: ") and line != unchanged]
    return line


# --- the three kinds of node, nothing on PATH ------------------------------------------------------


NODES = {
    # Debian 12: containerd 1.6.20 (-trimpath: no build-info flags), a version 2 config
    "1.6": ("1.6.20~ds1", "variables", "/usr/bin/containerd", CONTAINERD_V2, 2, False),
    # containerd's release tarball in /usr/local/bin, a version 2 config
    "1.7": ("v1.7.24", "build-info", "/usr/local/bin/containerd", CONTAINERD_V2, 2, True),
    # containerd 2.x with the version 3 config `containerd config default` wrote
    "2.x": ("v2.1.9", "build-info", "/usr/bin/containerd", CONTAINERD_V3, 3, True),
    # containerd 2.x with no main config at all (it runs on its defaults): install writes a version 3 one
    "2.x-no-config": ("v2.1.9", "build-info", "/usr/bin/containerd", None, 3, True),
    # a node upgraded to 2.x that kept its version 2 config (2.x migrates it)
    "2.x-v2-config": ("v2.1.9", "build-info", "/usr/bin/containerd", CONTAINERD_V2, 2, True),
}


@pytest.mark.parametrize("node", NODES)
def test_install_finds_the_nodes_containerd(tmp_path: Path, capsys: pytest.CaptureFixture[str], node: str) -> None:
    version, style, real, main, config_version, cdi = NODES[node]
    binary = containerd_binary(tmp_path, version, style, real)
    (tmp_path / "etc/containerd").mkdir(parents=True, exist_ok=True)
    if main is not None:
        put(tmp_path, containerd.MAIN_CONFIG_PATH, main)
    out, _ = install(capsys, tmp_path)
    got_version, cri = drop_in(tmp_path)
    assert got_version == config_version
    assert cri.get("enable_cdi", False) is cdi
    main_config = tomllib.loads((tmp_path / containerd.MAIN_CONFIG_PATH.lstrip("/")).read_text())
    assert main_config["version"] == config_version
    assert main_config["imports"] == ["/etc/containerd/conf.d/*.toml"]
    how = "its build info" if style == "build-info" else "its version variable"
    line = note(out)
    assert line.startswith(f"note: containerd: containerd {version.lstrip('v')} ({binary}, {how}): "), line
    assert ("): native CDI on (enable_cdi)," if cdi else "): no native CDI before 1.7") in line
    assert line.endswith(f"drop-in config version {config_version}"
                         + (" (containerd 2.x migrates it)" if node == "2.x-v2-config" else ""))


def test_the_binary_containerd_service_runs_comes_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A distribution's 1.6 in /usr/bin and a 1.7 release in /opt: the unit's ExecStart (its drop-in's) decides."""
    containerd_binary(tmp_path, "1.6.20~ds1", "variables", "/usr/bin/containerd")
    newer = containerd_binary(tmp_path, "v1.7.24", "build-info", "/opt/containerd-1.7/containerd")
    put(tmp_path, "/lib/systemd/system/containerd.service", "[Service]\nExecStart=/usr/bin/containerd\n")
    put(tmp_path, "/etc/systemd/system/containerd.service.d/10-newer.conf",
        "[Service]\nExecStart=\nExecStart=-/opt/containerd-1.7/containerd --log-level warn\n")
    put(tmp_path, containerd.MAIN_CONFIG_PATH, CONTAINERD_V2)
    out, _ = install(capsys, tmp_path)
    assert drop_in(tmp_path)[1]["enable_cdi"] is True
    assert f"containerd 1.7.24 ({newer}, its build info)" in note(out)


def test_symlinks_resolve_inside_the_host_root(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """/usr/local/bin/containerd -> /usr/lib/containerd/bin/containerd (absolute): the node's file, not this
    machine's /usr/lib."""
    target = containerd_binary(tmp_path, "v2.0.2", "build-info", "/usr/lib/containerd/bin/containerd")
    (tmp_path / "usr/local/bin").mkdir(parents=True)
    (tmp_path / "usr/local/bin/containerd").symlink_to("/usr/lib/containerd/bin/containerd")
    (tmp_path / "etc/containerd").mkdir(parents=True)
    out, _ = install(capsys, tmp_path)
    assert drop_in(tmp_path)[0] == 3
    assert f"containerd 2.0.2 ({target}, its build info)" in note(out)
    assert detect.under(str(tmp_path), "/usr/local/bin/../bin/containerd") == str(target)
    (tmp_path / "loop").symlink_to("/loop")
    assert detect.under(str(tmp_path), "/loop/x") is None


def test_dpkg_says_when_the_binary_does_not(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    put(tmp_path, "/usr/bin/containerd", "not a binary install can read\n", 0o644)
    put(tmp_path, "/var/lib/dpkg/status",
        "Package: containerd\nStatus: deinstall ok config-files\nVersion: 1.6.20~ds1-1\n\n"
        "Package: containerd.io\nStatus: install ok installed\nArchitecture: amd64\nVersion: 1.7.24-1\n"
        "Description: An open and reliable container runtime\n multi-line\n")
    put(tmp_path, containerd.MAIN_CONFIG_PATH, CONTAINERD_V2)
    out, _ = install(capsys, tmp_path)
    assert drop_in(tmp_path) == (2, drop_in(tmp_path)[1]) and drop_in(tmp_path)[1]["enable_cdi"] is True
    status = tmp_path / "var/lib/dpkg/status"
    assert f"containerd 1.7.24-1 ({status}, package containerd.io)" in note(out)


def test_a_version_3_main_config_means_2_x(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    put(tmp_path, containerd.MAIN_CONFIG_PATH, CONTAINERD_V3)
    out, _ = install(capsys, tmp_path)
    assert drop_in(tmp_path)[0] == 3 and drop_in(tmp_path)[1]["enable_cdi"] is True
    assert f"containerd 2.x ({tmp_path}/etc/containerd/config.toml is version 3)" in note(out)


def test_a_version_4_main_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """containerd 2.3+ writes version 4 (server settings moved into plugins; the CRI runtime plugin as in 3)."""
    put(tmp_path, containerd.MAIN_CONFIG_PATH, CONTAINERD_V3.replace("version = 3", "version = 4"))
    install(capsys, tmp_path)
    version, cri = drop_in(tmp_path)
    assert version == 4 and cri["enable_cdi"] is True
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True  # the node's table carried


def test_a_1_x_binary_beside_a_version_3_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Only 2.x reads a version 3 config: a stale 1.7 binary does not decide, and the note says so."""
    binary = containerd_binary(tmp_path, "v1.7.24", "build-info", "/usr/local/bin/containerd")
    put(tmp_path, containerd.MAIN_CONFIG_PATH, CONTAINERD_V3)
    out, _ = install(capsys, tmp_path)
    assert drop_in(tmp_path)[0] == 3
    assert (f"containerd 2.x ({tmp_path}/etc/containerd/config.toml is version 3; {binary}, its build info says "
            "1.7.24, but only containerd 2.x reads a version 3 config: the config decides)") in note(out)


def test_nothing_found_and_no_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The safe choice, said so: version 2 (every containerd reads it) with enable_cdi (1.6 ignores it: checked
    against a real containerd 1.6 in tests/containers/test_containerd.py)."""
    (tmp_path / "etc/containerd").mkdir(parents=True)
    out, _ = install(capsys, tmp_path)
    version, cri = drop_in(tmp_path)
    assert version == 2 and cri["enable_cdi"] is True
    assert note(out) == (
        f"note: containerd: containerd version unknown (no containerd binary under {tmp_path}, no dpkg record, no "
        f"{tmp_path}/etc/containerd/config.toml): native CDI on (enable_cdi), drop-in config version 2 (containerd "
        "2.x migrates it); that is the safe choice: containerd 1.7+ uses enable_cdi and 1.6 ignores it, every "
        "containerd reads version 2; pass --containerd-version X.Y to be sure")


def test_an_unreadable_binary_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    odd = put(tmp_path, "/usr/bin/containerd", "\x7fELF but nothing a version can be read from\n", 0o755)
    put(tmp_path, containerd.MAIN_CONFIG_PATH, CONTAINERD_V2)
    out, _ = install(capsys, tmp_path)
    assert drop_in(tmp_path)[1]["enable_cdi"] is True
    assert f"containerd version unknown (no version readable in {odd}, no dpkg record, " in note(out)


# --- the operator's word, and where the node is --------------------------------------------------------


def test_the_explicit_option_wins(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    containerd_binary(tmp_path, "v2.1.9", "build-info")
    put(tmp_path, containerd.MAIN_CONFIG_PATH, CONTAINERD_V2)
    out, _ = install(capsys, tmp_path, "--containerd-version", "1.6")
    assert "enable_cdi" not in drop_in(tmp_path)[1]
    assert note(out).startswith("note: containerd: containerd 1.6 (--containerd-version): no native CDI before 1.7")
    out, _ = install(capsys, tmp_path, "--containerd-version", "v1.7.2")
    assert drop_in(tmp_path)[1]["enable_cdi"] is True


def test_an_explicit_1_x_against_a_version_3_config_is_refused(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    put(tmp_path, containerd.MAIN_CONFIG_PATH, CONTAINERD_V3)
    _, err = install(capsys, tmp_path, "--containerd-version", "1.7", code=1)
    assert err.count("\n") == 1 and "--containerd-version 1.7: " in err
    assert "is a version 3 config, which only containerd 2.x reads; give the node's real version" in err
    assert not (tmp_path / containerd.DROP_IN_PATH.lstrip("/")).exists()


def test_host_root_apart_from_the_prefix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As in the DaemonSet: files land where the pod mounted the node's directories, the node's / is at /host."""
    prefix, node = tmp_path / "pod", tmp_path / "host"
    (prefix / "etc/containerd").mkdir(parents=True)
    binary = containerd_binary(node, "v2.1.9", "build-info")
    out, _ = install(capsys, prefix, "--host-root", str(node))
    assert drop_in(prefix)[0] == 3
    assert f"containerd 2.1.9 ({binary}, its build info)" in note(out)
    assert not (node / "etc").exists()  # the host root is only read


def test_a_script_is_run_only_when_nobody_else_could_have_written_it(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    script = containerd_binary(tmp_path, "v1.7.3", "script")
    put(tmp_path, containerd.MAIN_CONFIG_PATH, CONTAINERD_V2)
    out, _ = install(capsys, tmp_path)
    assert f"containerd 1.7.3 ({script}, its --version)" in note(out)
    script.chmod(0o777)  # group/other-writable: install never runs it
    out, _ = install(capsys, tmp_path)
    assert f"no version readable in {script}" in note(out)


# --- the reader, on its own -------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["2.1.9", "v1.7.24", "1.6.20~ds1", "1.7.24-0ubuntu1~22.04.1", "1:1.7.2-1", "1.7",
                                  "2.0.0-rc.1", "v2.1.9+unknown"])
def test_parse_version(text: str) -> None:
    expected = {"2.1.9": (2, 1), "v1.7.24": (1, 7), "1.6.20~ds1": (1, 6)}.get(text)
    got = detect.parse_version(text)
    assert got is not None and (expected is None or got == expected)


@pytest.mark.parametrize("text", ["", "latest", "v", "1", "1.x", "one.two", "go1.22.1", "(devel)", "1.7.24 extra"])
def test_parse_version_refuses(text: str) -> None:
    assert detect.parse_version(text) is None


def test_explicit_option_is_checked() -> None:
    with pytest.raises(HookError, match=r"--containerd-version '0\.9': expected the node's containerd version"):
        detect.explicit("0.9")


@pytest.mark.parametrize("version", ["v1.7.24", "v2.1.9", "v2.0.0-rc.3"])
def test_build_info(tmp_path: Path, version: str) -> None:
    path = tmp_path / "containerd"
    path.write_bytes(go_build_info(version))
    assert detect.binary_version(str(path)) == (version, "its build info")


@pytest.mark.parametrize(("wide", "little"), [(True, True), (True, False), (False, True), (False, False)])
def test_version_variables_in_any_elf_class_and_byte_order(tmp_path: Path, wide: bool, little: bool) -> None:
    """Debian's layout (Package, Revision 1.6.20~ds1-1+deb12u3, Version 1.6.20~ds1): the shortest is Version."""
    path = tmp_path / "containerd"
    path.write_bytes(go_string_variables(DEBIAN_1_6, wide=wide, little=little))
    assert detect.binary_version(str(path)) == ("1.6.20~ds1", "its version variable")


def test_disagreeing_neighbours_say_nothing(tmp_path: Path) -> None:
    path = tmp_path / "containerd"
    path.write_bytes(go_string_variables(["github.com/containerd/containerd", "1.7.24", "2.0.1"]))
    assert detect.binary_version(str(path)) is None
    path.write_bytes(go_string_variables(["github.com/containerd/containerdX", "1.7.24"]))
    assert detect.binary_version(str(path)) is None


def test_debian_s_real_containerd_binary(tmp_path: Path) -> None:
    """This machine's Debian 12 containerd (1.6.20, built -trimpath: no ldflags in its build info), copied and
    made non-executable: its version comes from its bytes alone."""
    real = Path("/usr/bin/containerd")
    if not real.is_file():
        unavailable("no /usr/bin/containerd (.ci/run installs it)")
    copy = tmp_path / "containerd"
    shutil.copyfile(real, copy)
    copy.chmod(0o644)
    text, how = detect.binary_version(str(copy)) or ("", "")
    assert detect.parse_version(text) == (1, 6) and how == "its version variable"
    assert "1.6.20" in text
