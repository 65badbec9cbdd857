"""float32 x at tf32 precision, held as float16 scaled by a power of two per row.

Shared float32 x reaches the Hopper kernels this way where it pays (serves,
serves_tl_dot): the Gluon kernels for batches over 128 (a copy by
_row_scaled_fp16_kernel) and the tl.dot kernel for batches up to 128 (a copy
made beside the base GEMM by perturbed_linear._shared_base_kernel, with
scale_row).

Why: wgmma's tf32 operands are float32 values truncated to their top 11
significant bits (the Gluon kernels' float32 route matches tl.dot's tf32 bit
for bit, GPU tests), which is float16's significand. Float16 wgmma runs at twice tf32's
rate, and its operands take half the shared memory and half the bytes through
L2. What float16 lacks is tf32's exponent range; one power of two per row of x
restores it: the row's largest magnitude is moved into float16's top binade,
and every element is truncated (round toward zero, as wgmma's tf32 does).

So, for a row whose largest magnitude is m:
- every element of magnitude >= m * 2^-29 becomes exactly its tf32 value times
  the row's scale, so each product with the noise is exact in float32 as
  before (the noise, in [-0.5, 0.5) and a multiple of 2^-24, truncated to 11
  significant bits, is a float16 exactly); the epilogue multiplies the row's
  float32 sums by the inverse scale, exactly;
- smaller elements lose low bits in float16's subnormals (flushing to zero
  under about m * 2^-39): each product then loses under m * 2^-40, far below
  the rounding tf32 makes in the row's largest element (up to m * 2^-12).
The sums are not the tf32 wgmma's bit for bit (float16 wgmma takes 16 products
per instruction where tf32 takes 8, and the tensor cores sum them otherwise):
the outputs differ from the tf32 route's in their low bits. Against float64 the
error is the tf32 route's within 0.05% (16 cases on an H100, docs/precision.md; the GPU
tests allow 2%).
Rows holding Inf or NaN keep the scale 1; their outputs are Inf or NaN as with
tf32 (round toward zero never turns a finite value into Inf).

The scale is clamped to 2^126 so that its inverse stays a normal float32:
rows whose largest magnitude is under 2^-111 (where tf32's own products are
near float32's subnormals) are scaled less than fully.
"""

import torch
import triton
import triton.language as tl

from .launch_math import cdiv, next_power_of_2

MAX_BYTES = 64 << 20  # the float16 copy of x is extra memory: the budget beside the output
# The copy pays where the K loops are long next to the epilogues: on an H100 side by side
# (docs/cuda-kernels.md, "Row-scaled float16 copy") 512 inputs gained 11-20% plain and lost 6-22%
# antithetic (two output tiles to store per accumulator), 4096 gained 33% both ways, 256 lost.
MIN_IN_F = 512  # inputs per output tile stored: antithetic calls need twice as many
# The tl.dot kernel (batches up to 128) gets the copy from _shared_base_kernel in the same launch as
# the base GEMM, and must wait for both before its first K step (float32 x overlaps that GEMM instead).
# GPU time (CUDA graph replay) on an H100 side by side (docs/cuda-kernels.md): P=1024 B=64
# 784->256 +6.4%, antithetic +6.5%; B=128 +21-22%; P=16384 B=64 512->2048 +12-14%; B=16 -3% to -4%
# (the wait is a larger share of its shorter K loops), B=32 within +-1%. Narrower x gains GPU time too
# (256 inputs +5%), but such calls are short enough to be bound by the host, to which the copy adds
# ~20 us per call (its two allocations and arguments).
TL_DOT_MIN_BATCH = 32  # the copy from 33 rows
TL_DOT_MIN_IN_F = 512


@triton.jit
def scale_row(x_row, stride_xk, in_f, x16_row, inv_at, BK: tl.constexpr):
    """One row: its scale exponent from the largest magnitude, then the float16 row and 2^-shift."""
    # The largest |x| as integer bits: for non-negative floats, integer order is value order,
    # and NaN's bits sort above Inf's, so one max finds both and the exponent field says which.
    top = tl.zeros((BK,), dtype=tl.int32)
    for k0 in range(0, in_f, BK):
        kk = k0 + tl.arange(0, BK)
        v = tl.load(x_row + kk * stride_xk, mask=kk < in_f, other=0.0)
        top = tl.maximum(top, v.to(tl.int32, bitcast=True) & 0x7FFFFFFF)
    biased = tl.max(top, axis=0) >> 23  # m's exponent + 127 (0 for zero and subnormal m)
    # 2^shift moves m into [2^15, 2^16), float16's top binade: shift = 15 - (biased - 127).
    shift = tl.where(biased == 255, 0, tl.minimum(142 - biased, 126))
    scale = ((shift + 127) << 23).to(tl.float32, bitcast=True)
    tl.store(inv_at, ((127 - shift) << 23).to(tl.float32, bitcast=True))
    for k0 in range(0, in_f, BK):
        kk = k0 + tl.arange(0, BK)
        v = tl.load(x_row + kk * stride_xk, mask=kk < in_f, other=0.0)
        tl.store(x16_row + kk, (v * scale).to(tl.float16, fp_downcast_rounding="rtz"), mask=kk < in_f)


@triton.jit
def _row_scaled_fp16_kernel(x_ptr, x16_ptr, inv_ptr, in_f, stride_xb, stride_xk, stride_hb, BK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    scale_row(x_ptr + row * stride_xb, stride_xk, in_f, x16_ptr + row * stride_hb, inv_ptr + row, BK)


def serves_tl_dot(x: torch.Tensor) -> bool:
    """Whether the tl.dot kernel (batches up to 128) takes 2-D float32 x at tf32 as its copy: x at least
    TL_DOT_MIN_IN_F wide, over TL_DOT_MIN_BATCH rows."""
    return TL_DOT_MIN_BATCH < x.shape[0] and x.shape[1] >= TL_DOT_MIN_IN_F and _copy_bytes(x) <= MAX_BYTES


def serves(x: torch.Tensor, antithetic: bool) -> bool:
    """Whether the Hopper Gluon kernels take 2-D float32 x at tf32 as its row-scaled float16 copy: x at
    least MIN_IN_F wide per output stored, and the copy within MAX_BYTES."""
    return x.shape[1] >= MIN_IN_F * (2 if antithetic else 1) and _copy_bytes(x) <= MAX_BYTES


def _copy_bytes(x: torch.Tensor) -> int:
    return x.shape[0] * _row_stride(x.shape[1]) * 2


def _row_stride(in_f: int) -> int:
    return cdiv(in_f, 8) * 8  # 16-byte rows, as TMA descriptors need


def row_block(in_f: int) -> int:
    """scale_row's block: one pass over rows up to 1024 wide."""
    return min(1024, max(16, next_power_of_2(in_f)))


def empty_copy(x: torch.Tensor):
    """Uninitialized (x16, inv_scale) for 2-D x: float16 rows of _row_stride(in_f) elements (16-byte
    aligned; the first in_f are the row), and one float32 per row."""
    batch, in_f = x.shape
    x16 = torch.empty(batch, _row_stride(in_f), dtype=torch.float16, device=x.device)
    return x16, torch.empty(batch, dtype=torch.float32, device=x.device)


def row_scaled_fp16(x: torch.Tensor):
    """(x16, inv_scale) for 2-D float32 x: x16[r] = truncate_fp16(x[r] * 2^s_r), a (batch, in_f)
    view with 16-byte aligned rows, and inv_scale[r] = 2^-s_r (float32), so that
    x[r] @ v == inv_scale[r] * (x16[r] @ v) for tf32-truncated v, as the module docstring bounds."""
    x16, inv = empty_copy(x)
    _row_scaled_fp16_kernel[(x.shape[0],)](x, x16, inv, x.shape[1], x.stride(0), x.stride(1), x16.stride(0),
                                           BK=row_block(x.shape[1]), num_warps=4)
    return x16[:, :x.shape[1]], inv
