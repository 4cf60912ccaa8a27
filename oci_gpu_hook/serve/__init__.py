"""The per-container servers: the planner and the NRI plugin.

They answer on a container's start path (the fronts ask the planner; containerd and CRI-O call the NRI plugin), so
the modules a start reaches here are held to the start path's import rules (oci_gpu_hook/startpath.py).
"""
