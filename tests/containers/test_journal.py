"""A refused container's line in the system journal, read from the syslog socket after real runs: podman's
precreate hook (whose stderr podman drops: it says ``exit status 1`` alone), the shim under podman and as runc,
and runc's prestart hook.  Each run has a private ``/dev`` whose ``/dev/log`` is the test's socket
(:mod:`tests.helpers.journallib`); the launchers are the installed kind (the native front where a compiler is
there), with no planner running: a GPU container handed to Python for want of one is no journal line."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import containerlib as cl
from tests.helpers.journallib import Listener, with_dev_log

pytestmark = pytest.mark.containers

REASON = "AMD_VISIBLE_DEVICES=gpu1: 'gpu1' is not a GPU index"
# <daemon.err>Mmm dd hh:mm:ss oci-gpu-hook[PID]: ENTRY: container NAME: error: REASON
LINE = re.compile(rb"<27>[A-Z][a-z]{2} [ 1-3][0-9] [0-2][0-9]:[0-5][0-9]:[0-6][0-9] oci-gpu-hook\[([0-9]+)\]: "
                  rb"([a-z-]+): container ([^ :]+): error: (.*)")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    cl.need("runc", "podman", "busybox", "unshare")
    base = tmp_path_factory.mktemp("journal")
    paths = cl.hook_setup(base)
    paths["hooks"] = cl.write_hooks_dir(base / "hooks", paths["hook"], paths["config"])
    paths["no-hooks"] = base / "no-hooks"
    shipped = json.loads((cl.REPO / "hooks.d" / "oci-gpu-hook-prestart.json").read_text())
    shipped["hook"]["path"] = str(paths["hook"])
    (base / "prestart-hooks").mkdir()
    (base / "prestart-hooks" / "oci-gpu-hook-prestart.json").write_text(json.dumps(shipped))
    paths["prestart-hooks"] = base / "prestart-hooks"
    return paths


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[tuple[Listener, Path]]:
    listener = Listener(tmp_path / "log.sock")
    scratch = tmp_path / "dev"
    scratch.mkdir()
    yield listener, scratch
    listener.close()


def _run(argv: list[str], journal: tuple[Listener, Path]) -> tuple[subprocess.CompletedProcess[str], list[bytes]]:
    listener, scratch = journal
    done = cl.run(with_dev_log(argv, listener.path, scratch), env=cl.hook_env())
    return done, listener.lines()


def _podman(setup: dict[str, Path], name: str, *options: str, hooks: str = "hooks",
            runtime: str = "runc") -> list[str]:
    run = [a for a in cl.PODMAN_RUN if a != "--rm"]  # kept until inspected: its id is what the line must name
    return [*cl.PODMAN, f"--runtime={runtime}", f"--hooks-dir={setup[hooks]}", *run,
            "--name", name, *options, "--rootfs", str(setup["rootfs"]), "/bin/true"]


def _podman_id(name: str) -> str:
    done = cl.run([*cl.PODMAN, "inspect", "--format", "{{.Id}}", name])
    cl.run([*cl.PODMAN, "rm", "-f", name])
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _one_refusal(lines: list[bytes], entry: str) -> tuple[str, str]:
    """(the container the one journal line names, its reason), after checking it is one line of the format."""
    assert len(lines) == 1, lines
    found = LINE.fullmatch(lines[0])
    assert found, lines[0]
    assert found.group(2).decode() == entry
    return found.group(3).decode(), found.group(4).decode()


def test_podman_precreate_refusal_is_in_the_journal(setup: dict[str, Path],
                                                    journal: tuple[Listener, Path]) -> None:
    name = cl.container_id()
    done, lines = _run(_podman(setup, name, "-e", "AMD_VISIBLE_DEVICES=gpu1"), journal)
    cid = _podman_id(name)
    assert done.returncode != 0
    assert "exit status 1" in done.stderr and REASON not in done.stderr  # podman 4.3 drops the hook's stderr
    container, reason = _one_refusal(lines, "precreate")
    # podman's precreate input carries no id: its hostname, which podman makes the id's first 12 characters
    assert container == cid[:12]
    assert reason.startswith(REASON) and "(valid: all, none, indices 0-7" in reason
    record = [line for line in setup["log"].read_text().splitlines() if container in line]
    assert record and '"id":"' + container + '"' in record[-1] and '"outcome":"error"' in record[-1]


def test_podman_precreate_names_an_explicit_hostname(setup: dict[str, Path],
                                                     journal: tuple[Listener, Path]) -> None:
    name = cl.container_id()
    done, lines = _run(_podman(setup, name, "--hostname", "web-7", "-e", "AMD_VISIBLE_DEVICES=gpu1"), journal)
    _podman_id(name)
    assert done.returncode != 0
    assert _one_refusal(lines, "precreate")[0] == "web-7"


def test_podman_granted_gpu_and_no_request_write_no_journal_line(setup: dict[str, Path],
                                                                 journal: tuple[Listener, Path]) -> None:
    """The front hands a GPU container to Python (no planner runs here): the usual path, not a line."""
    for options in (("-e", "AMD_VISIBLE_DEVICES=1"), ()):
        name = cl.container_id()
        done, lines = _run(_podman(setup, name, *options), journal)
        _podman_id(name)
        assert done.returncode == 0, done.stderr
        assert lines == []


def test_podman_shim_refusal_is_in_podman_output_and_the_journal(setup: dict[str, Path],
                                                                 journal: tuple[Listener, Path]) -> None:
    name = cl.container_id()
    done, lines = _run(_podman(setup, name, "-e", "AMD_VISIBLE_DEVICES=gpu1", hooks="no-hooks",
                               runtime=str(setup["runtime"])), journal)
    cid = _podman_id(name)
    assert done.returncode != 0
    assert REASON in done.stderr  # runc's --log, read by podman
    container, reason = _one_refusal(lines, "oci-gpu-runtime")
    assert container == cid  # the shim's argv
    assert reason.startswith(REASON)


def test_podman_prestart_refusal_is_in_podman_output_and_the_journal(setup: dict[str, Path],
                                                                     journal: tuple[Listener, Path]) -> None:
    name = cl.container_id()
    done, lines = _run(_podman(setup, name, "-e", "AMD_VISIBLE_DEVICES=gpu1", hooks="prestart-hooks"), journal)
    cid = _podman_id(name)
    assert done.returncode != 0
    # podman shows runc's error, which quotes the hook's stderr
    assert "error running hook: exit status 1, stdout: , stderr: oci-gpu-hook: error: " + REASON in done.stderr
    container, reason = _one_refusal(lines, "prestart")
    assert container == cid  # the state's id
    assert reason.startswith(REASON)


def test_shim_as_runc_refusal_names_the_id_from_argv(setup: dict[str, Path], tmp_path: Path,
                                                     journal: tuple[Listener, Path]) -> None:
    bundle = cl.make_bundle(tmp_path / "bundle", setup["rootfs"], ["AMD_VISIBLE_DEVICES=gpu1"], ["/bin/true"])
    cid = cl.container_id()
    done, lines = _run([str(setup["runtime"]), "run", "--bundle", str(bundle), cid], journal)
    assert done.returncode == 1
    assert done.stderr.startswith("oci-gpu-hook: error: " + REASON)
    container, reason = _one_refusal(lines, "oci-gpu-runtime")
    assert container == cid
    assert "oci-gpu-hook: error: " + reason == done.stderr.strip()


def test_prestart_refusal_names_the_state_id(setup: dict[str, Path], tmp_path: Path,
                                             journal: tuple[Listener, Path]) -> None:
    bundle = cl.make_bundle(tmp_path / "bundle", setup["rootfs"], ["AMD_VISIBLE_DEVICES=gpu1"], ["/bin/true"])
    cl.add_prestart(bundle, setup["hook"])
    cid = cl.container_id()
    done, lines = _run(["runc", "run", "--bundle", str(bundle), cid], journal)
    cl.run(["runc", "delete", "--force", cid])
    assert done.returncode != 0
    assert REASON in done.stderr  # runc shows the hook's stderr
    container, reason = _one_refusal(lines, "prestart")
    assert container == cid
    assert reason.startswith(REASON)


def test_syslog_false_writes_no_line(tmp_path: Path, journal: tuple[Listener, Path]) -> None:
    cl.need("runc", "busybox", "unshare")
    base = tmp_path / "off"
    base.mkdir()
    paths = cl.hook_setup(base)
    with paths["config"].open("a") as handle:
        handle.write("syslog = false\n")
    _hook, runtime = cl.write_launchers(base / "bin", paths["config"])
    bundle = cl.make_bundle(tmp_path / "bundle", paths["rootfs"], ["AMD_VISIBLE_DEVICES=gpu1"], ["/bin/true"])
    done, lines = _run([str(runtime), "run", "--bundle", str(bundle), cl.container_id()], journal)
    assert done.returncode == 1 and REASON in done.stderr
    assert lines == []
