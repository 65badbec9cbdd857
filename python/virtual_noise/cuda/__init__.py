"""CUDA backend: Triton kernels registered for the CUDA dispatch key.

Triton is optional (``pip install virtual-noise[triton]``) and is imported only
where CUDA is available, so CPU-only machines never load it. Without it, a
CUDA tensor reaching an operator raises an error naming that extra.
"""

from __future__ import annotations

import torch

OPS = ("perturbed_linear", "perturbed_embedding", "lowrank_perturbed_linear", "lowrank_weight_gradient",
       "generate_lowrank_noise", "weight_gradient", "bias_gradient", "reduce_metric", "generate_noise")


def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:  # ImportError, or a broken install failing while importing
        return False
    return True


def _missing_triton(name: str, reason: str):
    def kernel(*args, **kwargs):
        raise RuntimeError(
            f"virtual_noise.{name}: CUDA tensors need the Triton kernels, which were not loaded "
            f"because {reason}. Install the extra (pip install 'virtual-noise[triton]') and "
            f"import virtual_noise where CUDA is available."
        )

    return kernel


_CUDA_AT_IMPORT = torch.cuda.is_available()

#: True when the Triton kernels serve CUDA tensors in this process.
TRITON_AVAILABLE = _CUDA_AT_IMPORT and _triton_importable()

if TRITON_AVAILABLE:
    from . import register as _register  # noqa: F401
else:
    # Why the kernels are missing is decided here, once: on a CPU-only machine triton
    # is never imported, so it cannot be asked whether it would have imported.
    _reason = ("triton is not importable" if _CUDA_AT_IMPORT
               else "CUDA was not available when virtual_noise was imported")
    for _name in OPS:
        torch.library.register_kernel(f"virtual_noise::{_name}", "cuda", _missing_triton(_name, _reason))
