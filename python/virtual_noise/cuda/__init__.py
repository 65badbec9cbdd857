"""CUDA backend: Triton kernels registered for the CUDA dispatch key.

Triton is optional (``pip install virtual-noise[triton]``). Without it, a CUDA
tensor reaching an operator raises an error naming that extra; the CPU
operators never import Triton.
"""

from __future__ import annotations

import torch

try:
    import triton  # noqa: F401

    TRITON_AVAILABLE = True
except Exception:  # ImportError, or a broken install that fails while importing
    TRITON_AVAILABLE = False

OPS = ("perturbed_linear", "weight_gradient", "bias_gradient", "reduce_metric", "generate_noise")


def _missing_triton(name: str):
    def kernel(*args, **kwargs):
        raise RuntimeError(
            f"virtual_noise.{name}: CUDA tensors need the Triton kernels, and triton is not "
            f"importable. Install the extra: pip install 'virtual-noise[triton]'"
        )

    return kernel


if TRITON_AVAILABLE:
    from . import register as _register  # noqa: F401
else:
    for _name in OPS:
        torch.library.register_kernel(f"virtual_noise::{_name}", "cuda", _missing_triton(_name))
