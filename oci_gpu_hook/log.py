"""Operator-facing output: one line on stderr for a failure, one JSON line per run in the log file."""

from __future__ import annotations

import os
import sys
import time

from oci_gpu_hook import fastjson

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms per container start

if TYPE_CHECKING:
    from typing import Any

    from oci_gpu_hook.config import Config
    from oci_gpu_hook.plan import Plan

PROGRAM = "oci-gpu-hook"


def error_line(message: str) -> str:
    """Collapse a message to the single line operators see."""
    return f"{PROGRAM}: error: " + " ".join(str(message).split())


def record(config: Config | None, **fields: Any) -> None:
    """Append one structured line to ``config.log_file``; never fail the container for it."""
    path = config.log_file if config else ""
    if not path:
        return
    line = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **fields}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
        try:
            os.write(fd, (fastjson.dumps(line) + "\n").encode())
        finally:
            os.close(fd)
    except OSError as err:
        print(f"{PROGRAM}: warning: cannot write log file {path}: {err.strerror}", file=sys.stderr)


def record_plan(config: Config, entry: str, cid: str | None, plan: Plan, started: float, **extra: Any) -> None:
    """The line of a run that granted GPUs, or ignored a request (``allow_env_requests``, annotations won);
    none for a container that asked for nothing."""
    if not plan and not plan.request.note:
        return
    fields: dict[str, Any] = {"entry": entry, "id": cid, "source": plan.request.source,
                              "request": plan.request.value, "devices": [n.path for n in plan.nodes]}
    if plan.request.note:
        fields["note"] = plan.request.note
    record(config, **fields, **extra, outcome="ok" if plan else "ignored",
           duration_ms=round((time.monotonic() - started) * 1000, 2))


def report_failure(err: BaseException, debug: bool) -> str:
    """Print the one stderr line for ``err`` (a traceback too when debugging); return the line."""
    from oci_gpu_hook.errors import HookError

    if isinstance(err, HookError):
        message = str(err)
    else:
        message = (f"internal error: {type(err).__name__}: {err} "
                   "(set OCI_GPU_HOOK_DEBUG=1 or pass --debug for a traceback)")
    if debug:
        import traceback

        traceback.print_exception(err, file=sys.stderr)
    line = error_line(message)
    print(line, file=sys.stderr)
    return line


def debug_from_env() -> bool:
    return os.environ.get("OCI_GPU_HOOK_DEBUG", "").lower() in ("1", "true", "yes", "on")
