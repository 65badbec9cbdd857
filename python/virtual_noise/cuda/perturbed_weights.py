"""Per-individual x with many rows per individual: the perturbed weights hashed once, then cuBLAS.

With T rows of x per individual, the fused forward kernel hashes each noise
element once per batch tile and runs two dots per tile (x @ W^T and
x @ N^T). When T is large the product dominates: then it pays to hash each
individual's ``W + s * sigma * N_i`` exactly once, in x's dtype, into a bounded
scratch buffer (a chunk of individuals, or of one individual's rows), and let
cuBLAS run one dot per element at the tensor cores' rate. The perturbed weight
rounded to x's dtype is what ``torch.func.functional_call`` with explicitly
perturbed 16-bit parameters computes. Where it is taken: ``serves`` (measured,
docs/cuda-kernels.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops import generate_noise
from .launch_math import cdiv
from .noise_spec import counter_offset, noise_from_counter, seed_key

SCRATCH_BYTES = 48 << 20  # the perturbed-weight chunk: with the small per-call tensors, within 64 MiB beside the output
MIN_ROWS = 256  # rows of x per individual from which this path serves (docs/cuda-kernels.md)
ALIGN_ROWS = 64  # row blocks of one seed's weights come in multiples of this


@triton.jit
def _perturbed_weight_kernel(w_ptr, out_ptr, seeds_ptr, u0, row0, rows, in_f, stride_wn, stride_wk, sigma, w_offset,
                             noise_sn, noise_sk, ANTITHETIC: tl.constexpr, BLOCK: tl.constexpr):
    """out[m, r, k] = W[row0 + r, k] + s_m * sigma * noise(seed, offset + (row0 + r) * sn + k * sk)."""
    u = tl.program_id(0)
    # A chunk holds fewer than 2^31 elements (the launcher checks): int32 division, not int64's long software
    # sequence.
    e = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    n = rows * in_f
    mask = e < n
    j = (row0 + e // in_f).to(tl.int64)
    k = (e % in_f).to(tl.int64)
    key = seed_key(tl.load(seeds_ptr + u0 + u))
    nz = sigma * noise_from_counter(key + counter_offset(w_offset + j * noise_sn + k * noise_sk))
    w = tl.load(w_ptr + j * stride_wn + k * stride_wk, mask=mask, other=0.0).to(tl.float32)
    m0 = (u * 2 if ANTITHETIC else u).to(tl.int64)
    tl.store(out_ptr + m0 * n + e, (w + nz).to(out_ptr.dtype.element_ty), mask=mask)
    if ANTITHETIC:
        tl.store(out_ptr + (m0 + 1) * n + e, (w - nz).to(out_ptr.dtype.element_ty), mask=mask)


def serves(x: torch.Tensor, shared: bool) -> bool:
    return not shared and x.shape[-2] >= MIN_ROWS


def perturbed_linear(x, w_view, bias, seeds, sigma, offset, antithetic, transposed, out):
    """out[i] = x[i] @ (W + s_i sigma N_i)^T + (b + s_i sigma nb_i), x (P, T, in), w_view (out, in)."""
    pop, _, in_f = x.shape
    out_f = w_view.shape[0]
    members = 2 if antithetic else 1
    row_bytes = members * in_f * x.element_size()  # one output row of every member of a seed
    if row_bytes * out_f <= SCRATCH_BYTES:  # whole weights, for as many seeds as fit
        units_per_chunk, rows_per_chunk = SCRATCH_BYTES // (row_bytes * out_f), out_f
    else:  # one seed's weights in row blocks, in whole multiples of ALIGN_ROWS where that many fit: each block's
        # output columns then start 16-byte aligned, as cuBLAS's fastest kernels need
        units_per_chunk, rows_per_chunk = 1, max(1, SCRATCH_BYTES // row_bytes)
        if rows_per_chunk >= ALIGN_ROWS:
            rows_per_chunk -= rows_per_chunk % ALIGN_ROWS
    if rows_per_chunk * in_f >= 2**31:
        raise ValueError(f"x: {in_f} input features per row is more than the perturbed-weights path supports")
    sn, sk = (1, out_f) if transposed else (in_f, 1)
    bias_pop = None
    if bias is not None:  # the bias noise, materialized: P x out, small
        nb = generate_noise(seeds, out_f, offset + out_f * in_f)
        if antithetic:
            nb = torch.stack([nb, -nb], dim=1).flatten(0, 1)
        bias_pop = (bias.float()[None] + sigma * nb).to(x.dtype)
    scratch = torch.empty(min(units_per_chunk, seeds.numel()) * members * min(rows_per_chunk, out_f) * in_f,
                          dtype=x.dtype, device=x.device)
    block = 1024
    for u0 in range(0, seeds.numel(), units_per_chunk):
        units = min(units_per_chunk, seeds.numel() - u0)
        for r0 in range(0, out_f, rows_per_chunk):
            rows = min(rows_per_chunk, out_f - r0)
            wp = scratch[: units * members * rows * in_f].view(units * members, rows, in_f)
            _perturbed_weight_kernel[(units, cdiv(rows * in_f, block))](
                w_view, wp, seeds, u0, r0, rows, in_f, w_view.stride(0), w_view.stride(1), float(sigma), offset,
                sn, sk, ANTITHETIC=antithetic, BLOCK=block, num_warps=4)
            i0, i1 = u0 * members, (u0 + units) * members
            if rows == out_f:
                if bias_pop is None:
                    torch.bmm(x[i0:i1], wp.transpose(1, 2), out=out[i0:i1])
                else:
                    torch.baddbmm(bias_pop[i0:i1, None, :], x[i0:i1], wp.transpose(1, 2), out=out[i0:i1])
            else:
                for i in range(i0, i1):
                    dst = out[i, :, r0:r0 + rows]
                    if bias_pop is None:
                        torch.mm(x[i], wp[i - i0].t(), out=dst)
                    else:
                        torch.addmm(bias_pop[i, r0:r0 + rows], x[i], wp[i - i0].t(), out=dst)
    return out
