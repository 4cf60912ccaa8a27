"""JSON-schema validation of the OCI inputs and the project's outputs (off the per-container path)."""

from __future__ import annotations

import json
import os
from functools import cache
from typing import Any

from oci_gpu_hook.errors import HookError

SCHEMA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schemas")


@cache
def load(name: str) -> dict[str, Any]:
    path = os.path.join(SCHEMA_DIR, name)
    with open(path) as handle:
        return json.load(handle)


def validate(instance: Any, name: str, what: str) -> None:
    """Raise HookError naming the first place where ``instance`` breaks schema ``name``."""
    import jsonschema

    schema = load(name)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = ".".join(str(p) for p in first.absolute_path) or "(top level)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise HookError(f"{what}: {where}: {first.message}{more}")
