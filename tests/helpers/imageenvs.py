"""The env that real images carry in their image config, for containers that ask for nothing of this node's kind.

``CUDA_BASE``: ``nvidia/cuda:12.4.1-base-ubuntu22.04`` (x86_64), whose Dockerfile sets each of these with ``ENV``;
every PyTorch, TensorFlow or vLLM image built on a CUDA base carries the same.  ``ROCM``: a ROCm development image
(``rocm/dev-ubuntu-22.04``): ROCm on PATH, no request variable.
"""

from __future__ import annotations

# NVIDIA_REQUIRE_CUDA as that image spells it: one constraint per driver branch and brand (shortened to the 470 and
# 535 branches' first brands; the rest repeat the pattern)
NVIDIA_REQUIRE_CUDA = ("cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471 "
                       "brand=nvidia,driver>=470,driver<471 brand=geforce,driver>=470,driver<471 "
                       "brand=tesla,driver>=535,driver<536 brand=titanrtx,driver>=535,driver<536")

CUDA_BASE = [
    "PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "NVARCH=x86_64",
    f"NVIDIA_REQUIRE_CUDA={NVIDIA_REQUIRE_CUDA}",
    "NV_CUDA_CUDART_VERSION=12.4.127-1",
    "NV_CUDA_COMPAT_PACKAGE=cuda-compat-12-4",
    "CUDA_VERSION=12.4.1",
    "LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
    "NVIDIA_VISIBLE_DEVICES=all",
    "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
    "NVIDIA_PRODUCT_NAME=CUDA",
]

ROCM = [
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/rocm/bin:/opt/rocm/opencl/bin",
    "LC_ALL=C.UTF-8",
    "LANG=C.UTF-8",
    "ROCM_PATH=/opt/rocm",
    "HIP_PATH=/opt/rocm",
    "DEBIAN_FRONTEND=noninteractive",
]

