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

With a bias, one kernel writes every member's perturbed bias into all of its
rows of the output at the memory's rate, and the GEMMs add to it in place
(beta = 1): a row block of the output is a strided view, which cuBLASLt's bias
epilogue does not take, and torch's broadcast copy of the bias rows ran at
under half that rate (measured in docs/cuda-kernels.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch_math import cdiv, next_power_of_2
from .noise_spec import counter_offset, noise_from_counter, seed_key

SCRATCH_BYTES = 48 << 20  # the perturbed-weight chunk: with the small per-call tensors, within 64 MiB beside the output
MIN_ROWS = 256  # rows of x per individual from which this path serves (docs/cuda-kernels.md)
ALIGN_ROWS = 64  # row blocks of one seed's weights come in multiples of this
TILE_ELEMENTS, TILE_COLS, TILE_WARPS = 2048, 128, 4  # the hash kernel's tiles
FILL_ROWS, FILL_COLS = 32, 256  # the bias fill's tiles


@triton.jit
def _perturbed_weight_tile_kernel(w_ptr, out_ptr, seeds_ptr, u0, row0, rows, in_f, stride_wn, stride_wk, sigma,
                                  w_offset, noise_sn, noise_sk, ANTITHETIC: tl.constexpr, BR: tl.constexpr,
                                  BC: tl.constexpr):
    """out[m, r, k] = W[row0 + r, k] + s_m * sigma * noise(seed, offset + (row0 + r) * sn + k * sk), one (BR x BC)
    tile per program: a counter is its row's offset plus its column's (noise_spec.counter_offset), one 64-bit
    add per element, and no division by in_f (the flat-index form it replaced ran at about half the hash
    roof: docs/cuda-kernels.md)."""
    col_tiles = tl.cdiv(in_f, BC)
    tiles = tl.cdiv(rows, BR) * col_tiles
    u = tl.program_id(0) // tiles  # one grid axis: axes 1 and 2 stop at 65535 programs
    t = tl.program_id(0) % tiles
    r = (t // col_tiles) * BR + tl.arange(0, BR)
    k = (t % col_tiles) * BC + tl.arange(0, BC)
    mask = (r < rows)[:, None] & (k < in_f)[None, :]
    j = (row0 + r).to(tl.int64)
    key = seed_key(tl.load(seeds_ptr + u0 + u))
    c = (key + counter_offset(w_offset + j * noise_sn))[:, None] + counter_offset(k.to(tl.int64) * noise_sk)[None, :]
    nz = sigma * noise_from_counter(c)
    w = tl.load(w_ptr + j[:, None] * stride_wn + k[None, :].to(tl.int64) * stride_wk, mask=mask, other=0.0)
    w = w.to(tl.float32)
    m0 = (u * 2 if ANTITHETIC else u).to(tl.int64)
    dst = out_ptr + m0 * (rows * in_f) + (r[:, None] * in_f + k[None, :])  # a chunk holds < 2^31 elements
    tl.store(dst, (w + nz).to(out_ptr.dtype.element_ty), mask=mask)
    if ANTITHETIC:
        tl.store(dst + rows * in_f, (w - nz).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bias_fill_kernel(b_ptr, out_ptr, seeds_ptr, batch, out_f, sigma, b_offset, ANTITHETIC: tl.constexpr,
                      BT: tl.constexpr, BJ: tl.constexpr):
    """out[m, t, j] = b[j] + s_m * sigma * noise(seed, b_offset + j) for every row t, in out's dtype: each member's
    perturbed bias written straight into its rows of the output, which the GEMMs then add to (beta = 1). One
    (BT x BJ) tile per program; b contiguous (perturbed_linear.perturbed_linear makes it so for every kernel)."""
    col_tiles = tl.cdiv(out_f, BJ)
    tiles = col_tiles * tl.cdiv(batch, BT)
    u = tl.program_id(0) // tiles  # one grid axis: axes 1 and 2 stop at 65535 programs
    j = (tl.program_id(0) % col_tiles) * BJ + tl.arange(0, BJ)
    t = (tl.program_id(0) % tiles // col_tiles) * BT + tl.arange(0, BT)
    mask_j = j < out_f
    key = seed_key(tl.load(seeds_ptr + u))
    nz = sigma * noise_from_counter(key + counter_offset(b_offset + j.to(tl.int64)))
    b = tl.load(b_ptr + j, mask=mask_j, other=0.0).to(tl.float32)
    mask = (t < batch)[:, None] & mask_j[None, :]
    m0 = (u * 2 if ANTITHETIC else u).to(tl.int64)
    rows = out_ptr + (m0 * batch + t)[:, None] * out_f + j[None, :]
    tl.store(rows, tl.broadcast_to((b + nz).to(out_ptr.dtype.element_ty)[None, :], (BT, BJ)), mask=mask)
    if ANTITHETIC:
        tl.store(rows + batch * out_f, tl.broadcast_to((b - nz).to(out_ptr.dtype.element_ty)[None, :], (BT, BJ)),
                 mask=mask)


def serves(x: torch.Tensor, shared: bool) -> bool:
    return not shared and x.shape[-2] >= MIN_ROWS


def perturbed_linear(x, w_view, bias, seeds, sigma, offset, antithetic, transposed, out):
    """out[i] = x[i] @ (W + s_i sigma N_i)^T + (b + s_i sigma nb_i), x (P, T, in), w_view (out, in)."""
    _, batch, in_f = x.shape
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
    if bias is not None:  # out starts as every member's perturbed bias; the GEMMs add to it (beta = 1)
        _bias_fill_kernel[(seeds.numel() * cdiv(out_f, FILL_COLS) * cdiv(batch, FILL_ROWS),)](
            bias, out, seeds, batch, out_f, float(sigma), offset + out_f * in_f, ANTITHETIC=antithetic,
            BT=FILL_ROWS, BJ=FILL_COLS, num_warps=4)
    bc = min(TILE_COLS, max(16, next_power_of_2(in_f)))
    br = TILE_ELEMENTS // bc
    scratch = torch.empty(min(units_per_chunk, seeds.numel()) * members * min(rows_per_chunk, out_f) * in_f,
                          dtype=x.dtype, device=x.device)
    for u0 in range(0, seeds.numel(), units_per_chunk):
        units = min(units_per_chunk, seeds.numel() - u0)
        for r0 in range(0, out_f, rows_per_chunk):
            rows = min(rows_per_chunk, out_f - r0)
            wp = scratch[: units * members * rows * in_f].view(units * members, rows, in_f)
            _perturbed_weight_tile_kernel[(units * cdiv(rows, br) * cdiv(in_f, bc),)](
                w_view, wp, seeds, u0, r0, rows, in_f, w_view.stride(0), w_view.stride(1), float(sigma), offset,
                sn, sk, ANTITHETIC=antithetic, BR=br, BC=bc, num_warps=TILE_WARPS)
            i0, i1 = u0 * members, (u0 + units) * members
            if rows == out_f:
                if bias is not None:
                    out[i0:i1].baddbmm_(x[i0:i1], wp.transpose(1, 2))
                else:
                    torch.bmm(x[i0:i1], wp.transpose(1, 2), out=out[i0:i1])
            else:
                for i in range(i0, i1):
                    dst = out[i, :, r0:r0 + rows]
                    if bias is not None:
                        dst.addmm_(x[i], wp[i - i0].t())
                    else:
                        torch.mm(x[i], wp[i - i0].t(), out=dst)
    return out
