"""oci-gpu-hook: give a container exactly the GPUs it asked for, and nothing else."""

__version__ = "0.1.0"
