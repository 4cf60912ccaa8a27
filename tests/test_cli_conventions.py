"""What operators expect of a command line: a missing sysfs root is an error everywhere,
a closed pipe ends quietly, ``help CMD`` is ``CMD --help``, usage errors exit 2 and failures 1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.clilib import EXAMPLE_BUNDLE, REPO, assert_one_error_line, clean_env, cli, spec_text

MISSING = "/nonexistent/oci-gpu-hook-tests/sys"


# --- a sysfs root that is not there --------------------------------------------------


@pytest.mark.parametrize("args", [
    ("list",), ("list", "--json"), ("dry-run", str(EXAMPLE_BUNDLE)), ("inspect", "--pid", str(os.getpid())),
    ("cdi", "generate"), ("cdi", "list", "--spec-dirs", "{tmp}"), ("watch", "--once", "--output", "{tmp}/"),
    ("watch", "--output", "{tmp}/"), ("install", "--dry-run", "--prefix", "{tmp}"),
    ("device-plugin", "--kubelet-dir", "{tmp}"), ("device-plugin", "--list"),
])
@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_missing_sysfs_root_is_one_error_line(tmp_path: Path, args: tuple[str, ...], how: str) -> None:
    args = tuple(a.format(tmp=tmp_path) for a in args)
    if how == "flag":
        done = cli("--sysfs-root", MISSING, *args)
    else:
        done = cli(*args, env=clean_env(OCI_GPU_HOOK_SYSFS_ROOT=MISSING))
    assert f"sysfs root {MISSING} is not a directory" in assert_one_error_line(done)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("args", [("validate",), ("cdi", "validate", str(REPO / "examples" / "cdi-missing.json")),
                                  ("launchers", "{tmp}/bin"), ("list", "--help"), ("help", "list")])
def test_commands_that_read_no_sysfs_do_not_need_it(tmp_path: Path, args: tuple[str, ...]) -> None:
    done = cli("--sysfs-root", MISSING, *(a.format(tmp=tmp_path) for a in args))
    assert "sysfs root" not in done.stderr


# --- a closed pipe ---------------------------------------------------------------------


def closed_stdout_run(argv: list[str], unbuffered: bool, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``argv`` with a stdout whose reader is gone before anything is written (`... | head -0`), in an env that has
    PYTHONUNBUFFERED or not whatever the test's own env has: buffered, a write fails only at the flush."""
    env = {k: v for k, v in clean_env().items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(argv, stdout=write, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO, timeout=60,
                              input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL, check=False)
    finally:
        os.close(write)


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("args", [
    ("list",), ("list", "--json"), ("cdi", "generate"), ("cdi", "list", "--spec-dirs", "/nonexistent/cdi"),
    ("dry-run", str(EXAMPLE_BUNDLE)), ("--help",), ("help", "cdi"), ("list", "--help"), ("--version",),
    ("help", "precreate"),
])
def test_a_closed_pipe_ends_quietly(args: tuple[str, ...], unbuffered: bool) -> None:
    done = closed_stdout_run([sys.executable, "-m", "oci_gpu_hook.entry.cli", *args], unbuffered)
    assert "rror" not in done.stderr and "Traceback" not in done.stderr, done.stderr  # dry-run's summary may stay
    assert done.returncode == 141, done.stderr  # as a shell reports a command killed by SIGPIPE, argparse's help too


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
def test_the_shim_asked_its_version_into_a_closed_pipe_ends_quietly(unbuffered: bool) -> None:
    done = closed_stdout_run([sys.executable, "-m", "oci_gpu_hook.entry.runtime", "--version"], unbuffered)
    assert (done.returncode, done.stderr) == (141, "")


def test_list_into_head() -> None:
    done = subprocess.run(f"{sys.executable} -m oci_gpu_hook.entry.cli list | head -1; exit ${{PIPESTATUS[0]}}",
                          shell=True, executable="/bin/bash", capture_output=True, text=True, env=clean_env(),
                          cwd=REPO, timeout=60, check=False)
    assert done.stdout.startswith("KIND") and done.stdout.count("\n") == 1
    assert done.stderr == "" and done.returncode in (0, 141)


# --- help CMD ----------------------------------------------------------------------------


@pytest.mark.parametrize("command", [("list",), ("dry-run",), ("validate",), ("inspect",), ("cdi",),
                                     ("cdi", "generate"), ("cdi", "list"), ("watch",), ("install",),
                                     ("launchers",), ("device-plugin",)])
def test_help_cmd_is_cmd_dash_dash_help(command: tuple[str, ...]) -> None:
    helped, dashed = cli("help", *command), cli(*command, "--help")
    assert helped.returncode == dashed.returncode == 0, helped.stderr + dashed.stderr
    assert helped.stdout == dashed.stdout
    assert helped.stdout.startswith(f"usage: oci-gpu-hook {command[0]}")


@pytest.mark.parametrize("command", ["precreate", "prestart", "createRuntime", "links"])
def test_help_for_the_hooks(command: str) -> None:
    done = cli("help", command)
    assert done.returncode == 0 and done.stdout.startswith("usage: oci-gpu-hook ")


def test_help_alone_and_for_an_unknown_command() -> None:
    assert cli("help").stdout == cli("--help").stdout
    assert "'frobnicate'" in assert_one_error_line(cli("help", "frobnicate"), 2)


# --- exit codes: 2 for usage, 1 for failures ------------------------------------------------


@pytest.mark.parametrize("args", [
    ("frobnicate",), ("list", "--bogus"), ("--sysfs-root",), ("--config",), ("precreate", "extra"),
    ("prestart", "extra"), ("dry-run",), ("cdi",), ("cdi", "explode"), ("cdi", "generate", "--format", "xml"),
    ("cdi", "generate", "--output", "/nonexistent/oci-gpu-hook-tests/spec.txt"),
    ("cdi", "generate", "--output", "/nonexistent/oci-gpu-hook-tests/spec.json"),
    ("cdi", "list", "--spec-dirs", ","), ("inspect",), ("watch", "--bogus"), ("install", "--hook", "sideways"),
    ("device-plugin", "--resource-strategy", "odd"), ("cdi", "generate", "--kind", "amdd"),
])
def test_usage_errors_exit_2(args: tuple[str, ...]) -> None:
    line = assert_one_error_line(cli(*args, stdin=""), 2)
    if "(see oci-gpu-hook" not in line:
        return
    pointer = line.rsplit("(see ", 1)[-1].removesuffix(")\n")
    assert pointer.endswith(" --help"), line
    shown = cli(*pointer.split()[1:])  # the command the line points at exists and prints its usage
    assert shown.returncode == 0 and shown.stdout.startswith("usage: "), (line, shown.stderr)


@pytest.mark.parametrize("args", [("dry-run", "/nonexistent/oci-gpu-hook-tests/config.json"),
                                  ("cdi", "validate", "/nonexistent/oci-gpu-hook-tests/spec.json"),
                                  ("validate", "--config-file", "/nonexistent/oci-gpu-hook-tests/c.toml")])
def test_failures_exit_1(args: tuple[str, ...]) -> None:
    assert_one_error_line(cli(*args), 1)


def test_no_command_prints_the_usage_and_exits_2() -> None:
    done = cli()
    assert done.returncode == 2 and done.stdout.startswith("usage: oci-gpu-hook")
    assert "exit status: 0 done, 1 failed (one error line on stderr), 2 a usage error" in done.stdout


@pytest.mark.parametrize("flag", ["--version", "-V", "version"])
def test_version(flag: str) -> None:
    from oci_gpu_hook import __version__

    broken = clean_env(OCI_GPU_HOOK_CONFIG="/nonexistent/oci-gpu-hook-tests/config.toml")
    done = cli(flag, env=broken)  # works whatever the config
    assert done.returncode == 0 and done.stdout == f"oci-gpu-hook {__version__}\n" and done.stderr == ""


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
def test_a_hook_whose_reader_is_gone_still_says_so(unbuffered: bool) -> None:
    # podman stopped reading: the container must not start on a silent 141, nor on Python's "Exception ignored"
    done = closed_stdout_run([sys.executable, "-m", "oci_gpu_hook.entry.cli", "precreate"], unbuffered,
                             stdin=spec_text([]))
    line = assert_one_error_line(done)
    assert "precreate: stdout closed" in line and "BrokenPipeError" in line and "podman" in line
