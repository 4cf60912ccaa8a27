"""No file a non-root user can write is believed; the log never blocks nor
follows a link; killed writers' temp files are cleaned up by the next write."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from oci_gpu_hook import atomic, trust
from tests.conftest import ROOT
from tests.helpers.clilib import clean_env, spec_text

NOBODY = 65534
root_only = pytest.mark.root  # makes files owned by another user


def run(module: str, *args: str, env: dict[str, str], stdin: str = "",
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], input=stdin, capture_output=True, text=True,
                          env=env, cwd="/", timeout=timeout, check=False)


def hook(*args: str, env: dict[str, str], stdin: str = "", timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run("oci_gpu_hook.entry.cli", *args, env=env, stdin=stdin, timeout=timeout)


def one_line(result: subprocess.CompletedProcess[str], *words: str) -> str:
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("oci-gpu-hook: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in result.stderr, result.stderr
    return result.stderr


# --- the rule ---------------------------------------------------------------------


def _config(directory: Path, text: str = 'runtime = "/bin/true"\n') -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.toml"
    path.write_text(text)
    path.chmod(0o644)
    return path


def test_a_root_owned_path_is_trusted(tmp_path: Path) -> None:
    assert trust.config_problem(str(_config(tmp_path / "etc"))) is None
    assert trust.config_problem(os.devnull) is None  # 0666, but reads as empty whoever writes it
    assert trust.config_problem(str(tmp_path / "absent" / "file")) is None  # the open that follows reports it


def spoil(path: Path, how: str | int) -> None:
    """Make ``path`` something a non-root user owns (``"owner"``) or may write (a mode)."""
    if how == "owner":
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    else:
        assert isinstance(how, int)
        path.chmod(how)


SPOILED = {"file-owner": ("file", "owner"), "file-o+w": ("file", 0o646), "file-g+w": ("file", 0o664),
           "dir-owner": ("dir", "owner"), "dir-g+w": ("dir", 0o775), "dir-o+w": ("dir", 0o757)}


@root_only
@pytest.mark.parametrize("case", [*SPOILED, "link-to-untrusted-dir", "link-owned-by-nobody", "link-loop",
                                  "sticky-dir-nobody-file", "sticky-dir-o+w-file"])
def test_untrusted_paths(tmp_path: Path, case: str) -> None:
    etc = tmp_path / "etc"
    path = _config(etc)
    if case in SPOILED:
        what, how = SPOILED[case]
        spoil(path if what == "file" else etc, how)
    elif case == "link-to-untrusted-dir":
        theirs = tmp_path / "theirs"
        _config(theirs)
        spoil(theirs, "owner")
        (tmp_path / "link").symlink_to("theirs")
        path = tmp_path / "link" / "config.toml"
    elif case == "link-owned-by-nobody":
        (tmp_path / "link").symlink_to(path)
        spoil(tmp_path / "link", "owner")
        path = tmp_path / "link"
    elif case == "link-loop":
        (tmp_path / "a").symlink_to("b")
        (tmp_path / "b").symlink_to("a")
        path = tmp_path / "a"
    else:
        sticky = tmp_path / "tmp"
        sticky.mkdir()
        sticky.chmod(0o1777)
        path = sticky / "config.toml"
        path.write_text("")
        path.chmod(0o644)
        assert trust.config_problem(str(path)) is None  # root's file in a sticky world-writable directory
        spoil(path, "owner" if case == "sticky-dir-nobody-file" else 0o666)
    assert trust.config_problem(str(path)) is not None


def test_relative_links_and_dotdot_resolve_like_the_kernel(tmp_path: Path) -> None:
    _config(tmp_path / "etc" / "sub")
    (tmp_path / "etc" / "up").symlink_to("sub/../sub")
    assert trust.config_problem(str(tmp_path / "etc" / "up" / "config.toml")) is None
    if ROOT:
        spoil(tmp_path / "etc" / "sub", "owner")
        assert "owned by uid 65534" in (trust.config_problem(str(tmp_path / "etc" / "up" / "config.toml")) or "")


# --- every entry point refuses an untrusted config ---------------------------------


ENTRY_POINTS = {
    "shim create": ("oci_gpu_hook.entry.runtime", ["create", "--bundle", "{bundle}", "c1"], ""),
    "precreate": ("oci_gpu_hook.entry.cli", ["precreate"], "{spec}"),
    "prestart": ("oci_gpu_hook.entry.cli", ["prestart"], '{"ociVersion": "1.0.2", "id": "c1", "pid": 1, '
                                                           '"bundle": "{bundle}"}'),
    "watch --once": ("oci_gpu_hook.entry.cli", ["watch", "--once", "--output", "{out}/"], ""),
    "cdi generate --output": ("oci_gpu_hook.entry.cli", ["cdi", "generate", "--output", "{out}/"], ""),
    "list": ("oci_gpu_hook.entry.cli", ["list"], ""),
}


@root_only
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("how", ["owner", "mode", "directory", "symlink"])
def test_every_entry_point_refuses_an_untrusted_config(tmp_path: Path, entry: str, how: str) -> None:
    """For a container that asks for a GPU (one that asks for nothing passes: test_cli.py, test_broken_config.py)."""
    path = _config(tmp_path / "etc", 'runtime = "/bin/true"\n')
    if how != "symlink":
        spoil(path.parent if how == "directory" else path, 0o666 if how == "mode" else "owner")
    else:
        theirs = _config(tmp_path / "theirs")
        spoil(theirs.parent, "owner")
        path = tmp_path / "config.toml"
        path.symlink_to(theirs)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    spec = spec_text(["AMD_VISIBLE_DEVICES=1"])
    (bundle / "config.json").write_text(spec)
    module, args, stdin = ENTRY_POINTS[entry]
    fill = {"bundle": str(bundle), "spec": spec, "out": str(tmp_path / "cdi")}
    env = clean_env(OCI_GPU_HOOK_CONFIG=str(path), OCI_GPU_HOOK_RUNTIME="/bin/true")
    done = run(module, *[a.format(**fill) for a in args], env=env,
               stdin=stdin.replace("{spec}", spec).replace("{bundle}", str(bundle)))
    one_line(done, f"config file {path} is not trusted")
    assert done.stdout == ""
    assert (bundle / "config.json").read_text() == spec
    assert not (tmp_path / "cdi").exists()


@root_only
@pytest.mark.parametrize("how", ["owner", "mode", "directory"])
def test_a_pass_through_command_never_execs_the_runtime_an_untrusted_config_names(tmp_path: Path, how: str) -> None:
    """``state``/``kill``/``delete`` must reach the runtime even with a broken config, but never the one an
    untrusted file names: that would exec a path of another user's choosing as root."""
    marker = tmp_path / "ran"
    evil = tmp_path / "evil"
    evil.write_text(f"#!/bin/sh\ntouch {marker}\n")
    evil.chmod(0o755)
    path = _config(tmp_path / "etc", f'runtime = "{evil}"\nnot toml at all [\n')
    spoil(path.parent if how == "directory" else path, 0o666 if how == "mode" else "owner")
    env = clean_env(OCI_GPU_HOOK_CONFIG=str(path), PATH=f"{tmp_path / 'bin'}:/usr/bin:/bin")
    (tmp_path / "bin").mkdir()
    runc = tmp_path / "bin" / "runc"  # the default runtime, found on PATH
    runc.write_text("#!/bin/sh\necho default runtime \"$@\"\n")
    runc.chmod(0o755)
    done = run("oci_gpu_hook.entry.runtime", "state", "some-id", env=env, stdin="")
    assert not marker.exists()
    assert done.stdout == "default runtime state some-id\n", done.stderr


def test_a_trusted_config_still_works(tmp_path: Path) -> None:
    path = _config(tmp_path / "etc", "debug = false\n")
    done = hook("precreate", env=clean_env(OCI_GPU_HOOK_CONFIG=str(path)), stdin=spec_text(["AMD_VISIBLE_DEVICES=1"]))
    assert done.returncode == 0, done.stderr
    assert "/dev/dri/renderD129" in done.stdout


# --- CDI output directories --------------------------------------------------------


@root_only
@pytest.mark.parametrize("command", [("cdi", "generate"), ("watch", "--once")])
@pytest.mark.parametrize("how", ["owner", "g+w", "o+w", "symlink"])
def test_cdi_output_into_an_untrusted_directory_is_refused(tmp_path: Path, command: tuple[str, ...],
                                                           how: str) -> None:
    out = tmp_path / "cdi"
    out.mkdir()
    if how != "symlink":
        spoil(out, {"owner": "owner", "g+w": 0o775, "o+w": 0o757}[how])
    else:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        spoil(theirs, "owner")
        out.rmdir()
        out.symlink_to(theirs)
    done = hook(*command, "--output", f"{out}/", env=clean_env())
    one_line(done, str(out), "is not trusted")
    assert os.listdir(out) == []


def test_cdi_output_into_a_trusted_directory(tmp_path: Path) -> None:
    done = hook("cdi", "generate", "--output", f"{tmp_path}/cdi/", env=clean_env())
    assert done.returncode == 0, done.stderr
    assert os.listdir(tmp_path / "cdi") == ["amd.com-gpu.json"]


# --- the log file ------------------------------------------------------------------


def _precreate_with_log(log: Path) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    done = hook("precreate", env=clean_env(OCI_GPU_HOOK_LOG_FILE=str(log)),
                stdin=spec_text(["AMD_VISIBLE_DEVICES=1"]), timeout=5)
    assert time.monotonic() - started < 3
    assert done.returncode == 0, done.stderr
    assert "/dev/dri/renderD129" in done.stdout  # the container starts all the same
    return done


def _warned(done: subprocess.CompletedProcess[str], log: Path, why: str) -> None:
    assert done.stderr.startswith(f"oci-gpu-hook: warning: log file {log} not written: ")
    assert done.stderr.count("\n") == 1 and why in done.stderr, done.stderr


def test_the_log_gets_one_line(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "hook.log"
    log.parent.mkdir()
    for _ in range(2):
        assert _precreate_with_log(log).stderr == ""
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["entry"] for line in lines] == ["precreate", "precreate"]
    assert stat.S_IMODE(log.stat().st_mode) & 0o022 == 0


def test_a_fifo_never_blocks(tmp_path: Path) -> None:
    log = tmp_path / "hook.log"
    os.mkfifo(log)
    started = time.monotonic()
    done = _precreate_with_log(log)
    assert time.monotonic() - started < 1.5  # the interpreter's start included; a blocked open never returns
    _warned(done, log, "not a regular file")


def test_a_fifo_with_a_reader_gets_nothing(tmp_path: Path) -> None:
    log = tmp_path / "hook.log"
    os.mkfifo(log)
    reader = os.open(log, os.O_RDONLY | os.O_NONBLOCK)
    try:
        _warned(_precreate_with_log(log), log, "not a regular file")
        assert os.read(reader, 100) == b""  # no writer ever had it open: nothing, and end of file
    finally:
        os.close(reader)


def test_a_symlinked_directory_is_not_followed(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "hook.log").write_text("victim\n")
    (tmp_path / "logs").symlink_to(real)
    log = tmp_path / "logs" / "hook.log"
    _warned(_precreate_with_log(log), log, f"{tmp_path}/logs is a symlink")
    assert (real / "hook.log").read_text() == "victim\n"


def test_a_symlink_at_the_path_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("victim\n")
    log = tmp_path / "hook.log"
    log.symlink_to(victim)
    _warned(_precreate_with_log(log), log, "symlink")
    assert victim.read_text() == "victim\n"


def test_a_directory_at_the_path(tmp_path: Path) -> None:
    log = tmp_path / "hook.log"
    log.mkdir()
    _warned(_precreate_with_log(log), log, "not a regular file")


@root_only
def test_a_device_node_at_the_path_is_never_opened(tmp_path: Path) -> None:
    log = tmp_path / "hook.log"
    os.mknod(log, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    _warned(_precreate_with_log(log), log, "not a regular file")


@root_only
@pytest.mark.parametrize("how", ["file-owner", "dir-owner", "dir-o+w", "hard-link"])
def test_an_untrusted_log_is_not_written(tmp_path: Path, how: str) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "hook.log"
    log.write_text("")
    if how == "hard-link":
        os.link(log, tmp_path / "other-name")
    else:
        spoil(log if how == "file-owner" else logs, 0o777 if how == "dir-o+w" else "owner")
    done = _precreate_with_log(log)
    _warned(done, log, "hard links" if how == "hard-link" else "uid 65534" if "owner" in how else "writable")
    assert log.read_text() == ""


def test_a_relative_or_missing_directory_log_is_one_warning(tmp_path: Path) -> None:
    _warned(_precreate_with_log(Path("relative.log")), Path("relative.log"), "absolute")
    missing = tmp_path / "absent" / "hook.log"
    _warned(_precreate_with_log(missing), missing, "No such file")


# --- temp files of killed writers ----------------------------------------------------


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def test_stale_temp_files_are_removed_and_nothing_else(tmp_path: Path) -> None:
    target = tmp_path / "amd.com-gpu.json"
    dead, alive = _dead_pid(), os.getppid()
    names = {
        "dead": f".amd.com-gpu.json.oci-gpu-hook.{dead}.0badcafe",
        "alive-old": f".amd.com-gpu.json.oci-gpu-hook.{alive}.00000001",
        "alive-young": f".amd.com-gpu.json.oci-gpu-hook.{alive}.00000002",
        "dead-young": f".amd.com-gpu.json.oci-gpu-hook.{dead}.00000003",
        "other-target": f".intel.com-gpu.json.oci-gpu-hook.{dead}.00000004",
        "bad-random": f".amd.com-gpu.json.oci-gpu-hook.{dead}.xyz",
        "bad-pid": ".amd.com-gpu.json.oci-gpu-hook.12a.00000005",
        "symlink": f".amd.com-gpu.json.oci-gpu-hook.{dead}.00000006",
        "directory": f".amd.com-gpu.json.oci-gpu-hook.{dead}.00000007",
    }
    outside = tmp_path / "outside"
    outside.write_text("keep")
    for key, name in names.items():
        path = tmp_path / name
        if key == "symlink":
            path.symlink_to(outside)
        elif key == "directory":
            path.mkdir()
        else:
            path.write_text("partial")
        if "young" not in key:
            _age(path, 10)
    _age(tmp_path / names["alive-old"], atomic.STALE_AFTER_S + 60)
    atomic.write_atomic(str(target), "{}\n", 0o644)
    left = set(os.listdir(tmp_path))
    gone = {key for key, name in names.items() if name not in left}
    assert gone == {"dead", "alive-old"}
    assert outside.read_text() == "keep" and target.read_text() == "{}\n"


WRITER = """
import os, sys, time
from oci_gpu_hook import atomic
real_rename = os.rename
def stuck(src, dst):
    print("temp", src, flush=True)
    time.sleep(60)
os.rename = stuck
atomic.write_atomic(sys.argv[1], "partial\\n", 0o644)
"""


NEXT_RUN = {
    "cdi generate": ("oci_gpu_hook.entry.cli", ["cdi", "generate", "--output", "{dir}/"], "amd.com-gpu.json"),
    "watch --once": ("oci_gpu_hook.entry.cli", ["watch", "--once", "--kind", "amd", "--output", "{dir}/"],
                     "amd.com-gpu.json"),
    "shim create": ("oci_gpu_hook.entry.runtime", ["create", "--bundle", "{dir}", "c1"], "config.json"),
}


@pytest.mark.parametrize("writer_of", list(NEXT_RUN))
def test_a_killed_writer_s_temp_file_goes_on_the_next_run(tmp_path: Path, writer_of: str) -> None:
    module, args, name = NEXT_RUN[writer_of]
    out = tmp_path / "out"
    out.mkdir()
    target = out / name
    # a temp file is left only where a name is replaced (the writer links a new name whole): a file there
    target.write_text(spec_text(["AMD_VISIBLE_DEVICES=1"]) if name == "config.json" else "{}\n")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parent.parent)
    assert writer.stdout is not None
    temp = Path(writer.stdout.readline().split()[1])
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    assert temp.exists() and temp.parent == out
    _age(temp, atomic.GRACE_S + 1)
    env = clean_env(OCI_GPU_HOOK_RUNTIME="/bin/true")
    done = run(module, *[a.format(dir=out) for a in args], env=env)
    assert done.returncode == 0, done.stderr
    assert os.listdir(out) == [name]
    assert "/dev/dri/renderD129" in target.read_text()


# --- the file read is the file checked; the pins' reach; every file of the package --------------------------------


def test_the_config_read_is_the_file_its_trust_walk_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file renamed over the config between its trust walk and its read (whoever could: a user given its
    directory) is never read: the read goes through the descriptor and must find the inode the walk ended on."""
    from oci_gpu_hook import config as cfg
    from oci_gpu_hook.errors import HookError

    path = _config(tmp_path / "etc", 'runtime = "/bin/true"\n')
    assert cfg.load_file(str(path)) == {"runtime": "/bin/true"}
    real = trust.checked

    def walk_then_swap(checked_path: str) -> tuple[str | None, tuple[int, int]]:
        found = real(checked_path)
        swap = path.parent / "swap"
        swap.write_text('runtime = "/tmp/theirs"\n')
        swap.rename(path)  # after the walk, before the read
        return found

    monkeypatch.setattr(trust, "checked", walk_then_swap)
    with pytest.raises(HookError) as err:
        cfg.load_file(str(path))
    assert str(err.value) == (f"config file {path}: cannot read (it was replaced between its trust check and its "
                              "read)")


def test_the_pins_hold_the_environment_and_the_configs_own_directory(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """install pins the virtual environment's own directory (no lock comes and goes in it any more) and the
    config file's directory (a user given it could rename a file over the config), but not a sticky directory,
    where any user may add a file; beside the launchers, whose own directory install writes into."""
    from oci_gpu_hook.install import launchers

    etc = tmp_path / "etc"
    config = _config(etc)
    text = launchers.install_pins(str(tmp_path / "libexec"), {"OCI_GPU_HOOK_CONFIG": str(config)})
    pinned = {line.split(" ", 2)[2] for line in text.splitlines()}
    prefix = os.path.dirname(os.path.dirname(sys.executable))
    assert {prefix, os.path.join(prefix, "pyvenv.cfg"), str(etc), str(config)} <= pinned, text
    assert str(tmp_path / "libexec") not in pinned and str(tmp_path) not in pinned
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    config = _config(sticky / "x")  # its own directory: pinned; the sticky one above it: not
    text = launchers.install_pins(str(tmp_path / "libexec"), {"OCI_GPU_HOOK_CONFIG": str(config)})
    pinned = {line.split(" ", 2)[2] for line in text.splitlines()}
    assert str(sticky / "x") in pinned and str(sticky) not in pinned
    loose = tmp_path / "loose.toml"  # in a sticky directory itself
    monkeypatch.chdir(tmp_path)
    os.rename(config, loose)
    tmp_path.chmod(0o1777)
    try:
        text = launchers.install_pins(str(tmp_path / "libexec"), {"OCI_GPU_HOOK_CONFIG": str(loose)})
    finally:
        tmp_path.chmod(0o700)
    pinned = {line.split(" ", 2)[2] for line in text.splitlines()}
    assert str(loose) in pinned and str(tmp_path) not in pinned


def test_install_refuses_pins_over_the_limit_and_writes_nothing(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Pins over what the readers take (trust.MAX_PINS, 64 KiB) are never written in part or at all: one line
    saying why, and no launcher (paths that long cannot come from a real install here, so the limit is lowered)."""
    from oci_gpu_hook.errors import HookError
    from oci_gpu_hook.install import launchers

    monkeypatch.setattr(trust, "MAX_PINS", 200)
    with pytest.raises(HookError) as err:
        launchers.write_launchers(str(tmp_path / "libexec"), {}, native=False)
    assert "would take" in str(err.value) and "more than the 200 a rootless hook reads" in str(err.value)
    assert "\n" not in str(err.value) and str(err.value).endswith("nothing is written")
    assert not (tmp_path / "libexec").exists()


def _site(base: Path) -> Path:
    """A site-packages holding a distribution named oci-gpu-hook that requires 'dep', and dep, as pip leaves them."""
    site = base / "site-packages"
    for name, requires in (("oci_gpu_hook", "Requires-Dist: dep>=1\n"), ("dep", "")):
        info = site / f"{name}-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: 1.0\n"
                                       f"{requires}")
        (site / name).mkdir()
        (site / name / "__init__.py").write_text("")
        (info / "RECORD").write_text(f"{name}/__init__.py,,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    for path in [site, *site.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return site


@root_only
@pytest.mark.parametrize("how", ["package-dir-g+w", "dependency-file-o+w", "dependency-owner", "link-out",
                                 "link-to-a-directory"])
def test_install_and_validate_walk_every_file_of_the_package_and_what_it_requires(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], how: str) -> None:
    """A launcher walks only down to site-packages at each start; install and validate walk everything below, once:
    a group-writable package directory (pip under umask 002), a file of a dependency, a symlink out to what another
    user could change are each one line naming the entry, and install writes nothing."""
    from oci_gpu_hook.entry import cli
    from oci_gpu_hook.errors import HookError
    from oci_gpu_hook.install import codepaths
    from oci_gpu_hook.install import guard as install_run

    site = _site(tmp_path)
    monkeypatch.setattr(codepaths, "code_paths", lambda: [str(site)])
    assert str(site / "oci_gpu_hook") in codepaths.package_trees() and str(site / "dep") in codepaths.package_trees()
    install_run.untrusted_code()  # all root's: nothing to say
    bad = {"package-dir-g+w": site / "oci_gpu_hook", "dependency-file-o+w": site / "dep" / "__init__.py",
           "dependency-owner": site / "dep" / "__init__.py", "link-out": site / "dep" / "mod.py",
           "link-to-a-directory": site / "dep" / "sub"}[how]
    if how == "package-dir-g+w":
        bad.chmod(0o775)
    elif how == "dependency-file-o+w":
        bad.chmod(0o646)
    elif how == "dependency-owner":
        os.chown(bad, NOBODY, NOBODY)
    elif how == "link-to-a-directory":  # root's directory, and the way to it: what lies in it is walked too
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir(mode=0o755)
        (elsewhere / "m.py").write_text("")
        os.chown(elsewhere / "m.py", NOBODY, NOBODY)
        (site / "dep" / "sub").symlink_to(elsewhere)
        bad = elsewhere / "m.py"
    else:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, NOBODY, NOBODY)
        (theirs / "mod.py").write_text("")
        bad.symlink_to(theirs / "mod.py")
        bad = theirs
    with pytest.raises(HookError) as err:
        install_run.untrusted_code()
    assert str(bad) in str(err.value) and str(err.value).endswith("nothing is written"), err.value
    assert "\n" not in str(err.value)
    assert cli.main(["validate", "--config-file", os.devnull]) == 1
    _out, errors = capsys.readouterr()
    assert errors.count("\n") == 1 and str(bad) in errors and "fails the trust rule" in errors, errors


def test_validate_rootless_says_a_pins_file_over_the_limit_is_not_read(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """What every rootless hook would do with a pins file over the limit (refuse every GPU request: none of it is
    read), validate --rootless says to root in one line; at the limit, the file is checked entry by entry."""
    from oci_gpu_hook.entry.commands import validate
    from oci_gpu_hook.errors import HookError
    from oci_gpu_hook.install import paths

    monkeypatch.setattr(paths, "LAUNCHER_DIR", str(tmp_path))
    pins = tmp_path / "install.pins"
    pins.write_text("#" * (trust.MAX_PINS - 1) + "\n")
    assert validate._check_pins().startswith("ok: ")
    pins.write_text("#" * trust.MAX_PINS + "\n")
    with pytest.raises(HookError) as err:
        validate._check_pins()
    assert str(err.value) == (f"{pins} is larger than 65536 bytes, so a rootless hook reads none of it and refuses "
                              "every GPU request: run oci-gpu-hook install again")
