"""virtual_noise: evolution-strategy operators with virtual per-individual noise.

Importing the package loads the compiled operators library (CPU and Meta
kernels, torch.ops.virtual_noise) and, where a CUDA device and Triton are
available, registers the Triton kernels for CUDA tensors.
"""

from __future__ import annotations

import os

from . import _library

_library.load()

from . import cuda as _cuda  # noqa: E402  (registers the CUDA kernels or their error)
from .offsets import compute_offsets  # noqa: E402
from .precision import get_noise_precision, set_noise_precision  # noqa: E402
from .ops import (  # noqa: E402
    generate_lowrank_noise,
    generate_noise,
    virtual_bias_gradient,
    virtual_lowrank_perturbed_linear,
    virtual_lowrank_weight_gradient,
    virtual_perturbed_embedding,
    virtual_perturbed_linear,
    virtual_reduce_metric,
    virtual_weight_gradient,
)

__version__ = "0.1.0"

#: Prefix for CMake's find_package(virtual_noise) in C++ consumers.
cmake_prefix_path = os.path.dirname(os.path.abspath(__file__))


def build_info() -> dict:
    """How the operators library was built and what it runs here.

    Keys: torch_version (built against), openmp, simd (the build of the CPU
    hot loops this machine uses), compiler, triton (Triton kernels serve CUDA
    tensors in this process).
    """
    from . import _C

    info = dict(_C.build_info())
    info["triton"] = _cuda.TRITON_AVAILABLE
    return info


__all__ = [
    "build_info",
    "cmake_prefix_path",
    "compute_offsets",
    "generate_lowrank_noise",
    "generate_noise",
    "get_noise_precision",
    "set_noise_precision",
    "virtual_bias_gradient",
    "virtual_lowrank_perturbed_linear",
    "virtual_lowrank_weight_gradient",
    "virtual_perturbed_embedding",
    "virtual_perturbed_linear",
    "virtual_reduce_metric",
    "virtual_weight_gradient",
]
