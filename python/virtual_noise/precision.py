"""The precision of the noise term on CUDA for float32 inputs.

The forward computes ``x @ W^T + b`` at torch's float32 matmul precision
(``torch.set_float32_matmul_precision``: float32 at "highest", PyTorch's
default) and adds ``sigma * (x @ N_i^T + nb_i)``. The noise is random; its
product with x runs by default at tf32 (11 significant bits of x, the noise
itself exact), whatever torch's setting, which is what lets the forward run on
tensor cores under PyTorch's defaults (docs/precision.md). Users who want the
noise term at float32 accuracy opt in with ``set_noise_precision("highest")``.
CPU kernels and 16-bit inputs are not affected (they are exact in float32 sums).
"""

from __future__ import annotations

_CHOICES = ("high", "highest", "matmul")
_setting = "high"


def set_noise_precision(precision: str) -> None:
    """``"high"`` (default): the noise term's dots at tf32. ``"highest"``: at float32 accuracy
    (three tf32 products, tf32x3). ``"matmul"``: whatever torch.get_float32_matmul_precision() says
    ("highest" -> tf32x3, else tf32)."""
    global _setting
    if precision not in _CHOICES:
        raise ValueError(f"set_noise_precision: `precision` must be one of {', '.join(_CHOICES)}; got {precision!r}")
    _setting = precision


def get_noise_precision() -> str:
    return _setting
