"""The native front: ``front.c`` and its parts, the C that answers a container start without Python where it can
(run per container, before Python), and :mod:`~oci_gpu_hook.fastpath.build`, which bakes and compiles it (at install).
"""
