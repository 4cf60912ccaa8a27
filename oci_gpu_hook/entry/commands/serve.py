"""``oci-gpu-hook serve``: the resident planner the native front asks (:mod:`oci_gpu_hook.serve.planner`, whose
command line still sits there: it moves here once the planner's own work settles).  The planner's workers run the
launchers' entry points, which this layer passes in (:func:`launch`): the host layer never imports the entry
layer."""

from __future__ import annotations

from oci_gpu_hook.config import Config


def launch(role: str, args: list[str], baked_runtime: str) -> tuple[int, str | None]:
    """What the launcher ``role`` runs for ``args``, as that launcher runs it: the shim's ``prepare`` (with the
    runtime baked into its launcher), else the command line's ``main``; (exit status, the runtime to exec or
    None)."""
    if role == "oci-gpu-runtime":
        from oci_gpu_hook.entry.runtime import prepare

        return prepare(args, baked_runtime)
    from oci_gpu_hook.entry.cli import main

    return main(args), None


def run(args: list[str], config: Config) -> int:
    from oci_gpu_hook.serve.planner import command

    return command(args, config, launch)
