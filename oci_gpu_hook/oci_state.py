"""The OCI state JSON a runtime gives its hooks on stdin, read strictly: the container's id, pid and bundle."""

from __future__ import annotations

from oci_gpu_hook import fastjson
from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from typing import Any


def _unique_keys(items: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(items)
    if len(obj) != len(items):
        raise fastjson.Refused("repeats a key in one object")
    return obj


def parse_state(text: str) -> tuple[str, int, str]:
    """(id, pid, bundle) from the OCI state JSON; HookError naming what is wrong."""
    if not text.strip():
        raise HookError("no container state on stdin (expected the OCI state JSON from the runtime)")
    try:
        state = fastjson.loads(text, _unique_keys)
    except ValueError as err:
        verb = "" if isinstance(err, fastjson.Refused) else "is "
        raise HookError(f"the container state on stdin {verb}{err}") from None
    if not isinstance(state, dict):
        raise HookError("the container state on stdin is not a JSON object")
    cid, pid, bundle = state.get("id"), state.get("pid"), state.get("bundle")
    if not isinstance(cid, str) or not cid:
        raise HookError("the container state has no 'id' string")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        raise HookError(f"the container state has no valid 'pid' (got {pid!r}); is this a prestart hook?")
    if not isinstance(bundle, str) or not bundle.startswith("/"):
        raise HookError(f"the container state has no absolute 'bundle' path (got {bundle!r})")
    return cid, pid, bundle
