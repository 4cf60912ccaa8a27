"""oci-gpu-hook: give a container exactly the GPUs it asked for, and nothing else.

Here too the hook commands: the words after ``oci-gpu-hook`` that a runtime runs on a container's start (podman's
hooks.d, the hooks a spec names), read from this one place by every layer: the command line dispatches them
(:mod:`oci_gpu_hook.entry.cli`), the native front bakes them (:func:`oci_gpu_hook.fastpath.build.front_contract`),
the planner serves them (:mod:`oci_gpu_hook.serve.planner`).  Here and not in a module of their own: every entry
point imports this file anyway, and a module more on the per-container path costs every container its time."""

__version__ = "0.1.0"

PRECREATE = "precreate"  # the spec on stdin, the spec on stdout
LIVE_COMMANDS = ("prestart", "createRuntime")  # the state on stdin; the plan applied to the running container
CREATE_RUNTIME_HOOKS = ("links", "ldcache")  # what to make is in their arguments
