"""podman WITHOUT ``--hooks-dir`` after ``install --only podman`` gets its GPU: install wrote the hook where
this podman reads hooks (its built-in default, or ``hooks_dir`` of containers.conf).

Everything runs in a private mount namespace whose /usr/local, /usr/share/containers and /etc/containers are
overlays with an upper layer in the test's directory: install writes the real paths (no --prefix) and the
host never changes.  install's state directory (/var/lib) is overlaid in a namespace of install's own (the
same layers each time), so podman itself runs with the host's /var/lib.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import containerlib as cl
from tests.helpers import pristinenode
from tests.helpers.containerlib import INSTALL_DEV

OVERLAID = ("/usr/local", "/usr/share/containers", "/etc/containers")


@pytest.fixture
def base() -> Iterator[Path]:
    cl.need("podman", "runc", "unshare")
    path = Path(tempfile.mkdtemp(prefix="ogh-pm-"))  # short: podman's --runroot must stay under 50 characters
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def with_state(base: Path, argv: list[str]) -> list[str]:
    """``argv`` (install) in a mount namespace of its own with /var/lib overlaid (the same layers each time)."""
    upper, work = base / "ovl" / "state", base / "ovl" / "state-work"
    upper.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    mount = f"mount -t overlay overlay -o lowerdir=/var/lib,upperdir={upper},workdir={work} /var/lib"
    return ["unshare", "-m", "sh", "-c", f"{mount} && exec {cl._quoted(argv)}"]


def in_namespace(base: Path, commands: list[list[str]], conf: str | None) -> str:
    """A shell script for ``unshare -m``: the overlays, then ``commands`` (each line's output to base/out.N)."""
    lines = ["set -e"]
    for n, target in enumerate(OVERLAID):
        upper, work = base / "ovl" / f"u{n}", base / "ovl" / f"w{n}"
        upper.mkdir(parents=True)
        work.mkdir(parents=True)
        lines.append(f"mount -t overlay overlay -o lowerdir={target},upperdir={upper},workdir={work} {target}")
    if conf is not None:
        lines.append(f"printf '%s' {cl._quoted([conf])} > /etc/containers/containers.conf")
    for n, argv in enumerate(commands):
        lines.append(f"{cl._quoted(argv)} > {base}/out.{n} 2> {base}/err.{n} || echo $? > {base}/rc.{n}")
    return "\n".join(lines)


@pytest.mark.parametrize(("conf", "hooks_dir"), [
    (None, "/usr/share/containers/oci/hooks.d"),
    ('[engine]\nhooks_dir = ["/etc/containers/oci/hooks.d"]\n', "/etc/containers/oci/hooks.d"),
], ids=["podman-default", "containers.conf"])
def test_podman_without_hooks_dir_runs_the_installed_hook(base: Path, conf: str | None, hooks_dir: str) -> None:
    (base / "hook").mkdir()
    setup = cl.hook_setup(base / "hook")
    host_paths = ["/usr/local/libexec/oci-gpu-hook", "/var/lib/oci-gpu-hook",
                  f"{hooks_dir}/oci-gpu-hook-precreate.json", "/etc/containers/containers.conf"]
    host_before = {path: os.path.lexists(path) for path in host_paths}
    oci_gpu_hook = [sys.executable, "-m", "oci_gpu_hook.entry.cli"]
    # podman's debug log names the hooks it reads; with it, conmon makes each run wait 20 s: one case only
    debug = ["--log-level=debug"] if conf is None else []
    podman = [*cl.PODMAN, "--root", str(base / "root"), "--runroot", str(base / "rr"), "--runtime", "runc", *debug]
    undo = pristinenode.take_back_lines((*OVERLAID, "/var/lib"))  # where this machine is an installed node
    commands = [
        with_state(base, ["sh", "-ec", "\n".join(["true", *undo])]),
        with_state(base, [*oci_gpu_hook, "install", *INSTALL_DEV, "--only", "podman", "--set",
                          f"OCI_GPU_HOOK_CONFIG={setup['config']}"]),
        [*podman, *cl.PODMAN_RUN, "-e", "AMD_VISIBLE_DEVICES=1", "--rootfs", str(setup["rootfs"]), "/bin/sh",
         "/probe.sh"],
        with_state(base, [*oci_gpu_hook, "install", *INSTALL_DEV, "--uninstall"]),
        [*podman[:len(podman) - len(debug)], *cl.PODMAN_RUN, "-e", "AMD_VISIBLE_DEVICES=1", "--rootfs",
         str(setup["rootfs"]), "/bin/sh", "/probe.sh"],
    ]
    script = in_namespace(base, commands, conf)
    env = {**cl.hook_env(), "OCI_GPU_HOOK_CONFIG": os.devnull, "PYTHONPATH": str(cl.REPO)}
    done = cl.run(["unshare", "-m", "sh", "-c", script], env=env, timeout=300)
    assert done.returncode == 0, done.stderr

    def out(n: int) -> str:
        assert not (base / f"rc.{n}").exists(), (base / f"err.{n}").read_text()
        return (base / f"out.{n}").read_text()

    installed = out(1)
    assert f"new: {hooks_dir}/oci-gpu-hook-precreate.json (podman precreate hook" in installed
    cl.assert_isolated(out(2), [1])  # podman ran the hook from where install put it
    log = (base / "err.2").read_text()
    if debug:
        assert f"reading hooks from {hooks_dir}" in log
        assert f"added hook {hooks_dir}/oci-gpu-hook-precreate.json" in log
    assert f"removed: {hooks_dir}/oci-gpu-hook-precreate.json" in out(3)
    cl.assert_isolated(out(4), [])  # uninstalled: no hook, and podman gives the container no GPU
    assert {path: os.path.lexists(path) for path in host_paths} == host_before  # the host never changed
