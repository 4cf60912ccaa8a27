"""The operator commands' argument parser: errors are one HookError line, never argparse's exit."""

from __future__ import annotations

import argparse

from oci_gpu_hook.errors import HookError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise HookError(f"{self.prog}: {message} (see oci-gpu-hook {self.prog.split()[-1]} --help)")


def parser(name: str, description: str) -> _Parser:
    return _Parser(prog=f"oci-gpu-hook {name}", description=description,
                   epilog="Global options: --sysfs-root DIR, --config FILE, --debug.")
