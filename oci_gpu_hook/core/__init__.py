"""The leaf of the pipeline: device nodes, cgroup rules, their one semantics, and container edits.

Nothing here imports anything else of the package but :mod:`oci_gpu_hook.errors`.
"""
