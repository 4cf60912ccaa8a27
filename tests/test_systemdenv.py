"""The booted-systemd harness itself (tests/helpers/systemdenv.py): systemd is PID 1 of its own environment and its
manager runs, a bound directory is used and never emptied (systemd-tmpfiles is masked), the cgroup layout is the
one asked for, and stopping leaves no process and no cgroup behind, also after a test's failure."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import need, unavailable
from tests.helpers import systemdenv

pytestmark = pytest.mark.root


@pytest.fixture(autouse=True)
def _tools() -> None:
    need("unshare", "nsenter", "setpriv", "/lib/systemd/systemd", "systemd-run")


@pytest.mark.parametrize("mode", ["v1", "v2"])
def test_boots_runs_units_and_leaves_nothing(tmp_path: Path, mode: str) -> None:
    if mode == "v1" and systemdenv.v1_problem():
        unavailable(str(systemdenv.v1_problem()))
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "canary").write_text("kept\n")
    with systemdenv.booted(mode, binds=(shared,)) as env:
        assert env.run(["cat", "/proc/1/comm"], unit=False).stdout.strip() == "systemd"
        assert env.systemctl("is-system-running").stdout.strip() in ("running", "degraded")
        done = env.run(["sh", "-c", f"cat {shared}/canary; cat /proc/self/cgroup; echo made > {shared}/out"])
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("kept\n")
        unified = [line for line in done.stdout.splitlines() if line.startswith("0::")]
        assert unified == ["0::/system.slice/" + unified[0].rsplit("/", 1)[1]], done.stdout  # a unit of its own
        assert unified[0].endswith(".service")
        (devices,) = [line.rsplit(":", 1)[1] for line in done.stdout.splitlines() if ":devices:" in line]
        assert devices == (unified[0][3:] if mode == "v1" else "/"), done.stdout  # v2: no v1 hierarchy inside
        mounts = env.run(["findmnt", "-n", "-o", "FSTYPE", "/sys/fs/cgroup"], unit=False).stdout.split()
        assert mounts[-1] == ("tmpfs" if mode == "v1" else "cgroup2")
        masked = env.systemctl("is-enabled", "systemd-tmpfiles-setup.service").stdout.strip()
        assert masked == "masked"
        dirs = list(env.cgroup_dirs)
        init = env.init_pid
    assert (shared / "canary").read_text() == "kept\n" and (shared / "out").read_text() == "made\n"
    assert dirs and not any(d.exists() for d in dirs)
    assert init is not None and not os.path.exists(f"/proc/{init}")


def test_a_failing_test_still_stops_it(tmp_path: Path) -> None:
    seen = {}
    with pytest.raises(RuntimeError, match="the test failed"), systemdenv.booted("v2") as env:
        seen["dirs"], seen["init"] = list(env.cgroup_dirs), env.init_pid
        raise RuntimeError("the test failed")
    assert not any(d.exists() for d in seen["dirs"])  # type: ignore[attr-defined]
    assert not os.path.exists(f"/proc/{seen['init']}")


@pytest.mark.parametrize("shared", ["/tmp", "/", "/var/tmp/", "relative"])
def test_shared_directories_are_never_bound(shared: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="a test's own directory"):
        systemdenv.SystemdEnv(tmp_path, "v1", (Path(shared),))


def test_a_checkout_under_a_fresh_tmpfs_is_bound_in() -> None:
    """A clone under /tmp (or a venv there) would be invisible inside, where /tmp is a fresh tmpfs: it is bound."""
    hidden = systemdenv.hidden_checkout
    assert hidden((), (Path("/tmp/clone"), Path("/tmp/clone/.venv"))) == (Path("/tmp/clone"),)
    assert hidden((), (Path("/tmp/clone"), Path("/tmp/venv"))) == (Path("/tmp/clone"), Path("/tmp/venv"))
    assert hidden((Path("/tmp/clone"),), (Path("/tmp/clone"),)) == ()  # a test's own bind brings it already
    assert hidden((), (Path("/work/main"), Path("/usr"))) == ()  # visible through the overlay
    assert hidden((), (Path("/tmp"),)) == ()  # never a shared directory itself
