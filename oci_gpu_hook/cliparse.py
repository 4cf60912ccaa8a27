"""The operator commands' argument parser: errors are one line (a UsageError, exit 2), never argparse's exit."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from oci_gpu_hook.errors import HookError


class UsageError(HookError):
    """A command line that cannot be run as given: exit status 2, as argparse and most tools use, apart
    from the 1 of a command that ran and failed."""

    exit_code = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")  # `oci-gpu-hook cdi generate`

    def _print_message(self, message: str, file: Any = None) -> None:
        # argparse swallows a write error here, so with PYTHONUNBUFFERED a closed pipe would pass unseen while a
        # buffered stdout fails at the flush after: let it through, so that `--help | head -0` ends one way
        if message:
            (file or sys.stderr).write(message)


def parser(name: str, description: str) -> _Parser:
    return _Parser(prog=f"oci-gpu-hook {name}", description=description,
                   epilog="Global options: --sysfs-root DIR, --config FILE, --debug.")
