"""The leaf of the pipeline: device nodes, cgroup rules, their one semantics, container edits, and the one walk
inside a container root (:mod:`oci_gpu_hook.core.inroot`).

Nothing here imports anything else of the package but :mod:`oci_gpu_hook.errors`.
"""
