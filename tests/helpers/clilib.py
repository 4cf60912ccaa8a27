"""Running ``oci-gpu-hook`` as operators and podman do (a subprocess, never the host's config) and what its answers
must look like."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_SYSFS = REPO / "examples" / "hosts" / "seed-8x-gfx1100" / "sys"
EXAMPLE_BUNDLE = REPO / "examples" / "bundle"


BY_PATH_VAR = "OCI_GPU_HOOK_BY_PATH_DIR"  # the session's by-path directory (tests/conftest.py): kept everywhere


def without_tool_vars() -> dict[str, str]:
    """This process's environment without the caller's OCI_GPU_HOOK_* variables, but with the session's own
    by-path directory: a run of the package never prepares /dev/dri/by-path directories on the host."""
    return {k: v for k, v in os.environ.items() if not k.startswith("OCI_GPU_HOOK_") or k == BY_PATH_VAR}


def clean_env(**extra: str) -> dict[str, str]:
    env = without_tool_vars()
    env["OCI_GPU_HOOK_CONFIG"] = os.devnull  # an empty config file: never the host's /etc one
    env["OCI_GPU_HOOK_SYSFS_ROOT"] = str(EXAMPLE_SYSFS)
    env["OCI_GPU_HOOK_HOOK_PATH"] = "/bin/sh"  # an executable for the hooks it names
    env["OCI_GPU_HOOK_CDI_DIR"] = "/nonexistent/oci-gpu-hook-tests/cdi"  # a test that writes specs names its own
    env.update(extra)
    return env


def cli(*args: str, stdin: str | None = None, env: dict[str, str] | None = None,
        cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", *args], input=stdin, capture_output=True,
                          text=True, env=env or clean_env(), cwd=cwd, timeout=60, check=False)


def assert_one_error_line(result: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("oci-gpu-hook: error: ")
    assert result.stderr.endswith("\n")
    assert result.stderr.count("\n") == 1, result.stderr
    return result.stderr


def spec_text(env: list[str]) -> str:
    spec = json.loads((EXAMPLE_BUNDLE / "config.json").read_text())
    spec["process"]["env"] = env
    return json.dumps(spec, indent=4)
