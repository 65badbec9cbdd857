"""perturbed_embedding on CUDA: the gathered rows of W + sigma N_i, hashed in registers.

One program takes (one seed, BT lookups, BD columns): it loads the rows'
indices, hashes noise(seed, offset + row * dim + d) for just those rows and
writes W[row, d] + s * sigma * noise, for both members of an antithetic pair
from one hash when the indices are shared. An index outside [0, num_embeddings)
(which the launcher rejects before launching, except inside a CUDA-graph
capture, where reading the indices is not possible) gives a NaN row instead
of an out-of-bounds read.
"""

import torch
import triton
import triton.language as tl

from .launch_math import cdiv, next_power_of_2
from .noise_spec import counter_offset, noise_from_counter, seed_key


@triton.jit
def _gathered_row(idx_ptr, w_ptr, tt, dd, mask_t, mask_d, num, dim):
    """Indices of the lookups tt, whether each is in range, and their W values (float32)."""
    row = tl.load(idx_ptr + tt, mask=mask_t, other=0).to(tl.int64)
    ok = (row >= 0) & (row < num)
    row = tl.where(ok, row, 0)
    w = tl.load(w_ptr + row[:, None] * dim + dd[None, :], mask=mask_t[:, None] & mask_d[None, :], other=0.0)
    return row, ok, w.to(tl.float32)


@triton.jit
def _perturbed_embedding_kernel(idx_ptr, w_ptr, out_ptr, seeds_ptr, n, num, dim, sigma, offset,
                                SHARED: tl.constexpr, ANTITHETIC: tl.constexpr,
                                BT: tl.constexpr, BD: tl.constexpr):
    n_tblocks = tl.cdiv(n, BT)
    u = tl.program_id(0) // n_tblocks
    tt = (tl.program_id(0) % n_tblocks) * BT + tl.arange(0, BT)
    dd = tl.program_id(1) * BD + tl.arange(0, BD)
    mask_t, mask_d = tt < n, dd < dim
    mask = mask_t[:, None] & mask_d[None, :]
    key = seed_key(tl.load(seeds_ptr + u))
    i0 = (u * 2 if ANTITHETIC else u).to(tl.int64)
    out0 = out_ptr + (i0 * n + tt)[:, None] * dim + dd[None, :]

    row, ok, w = _gathered_row(idx_ptr + (0 if SHARED else i0 * n), w_ptr, tt, dd, mask_t, mask_d, num, dim)
    nz = noise_from_counter(key + counter_offset(offset + row[:, None] * dim + dd[None, :]))
    y = tl.where(ok[:, None], w + sigma * nz, float("nan"))
    tl.store(out0, y.to(out_ptr.dtype.element_ty), mask=mask)
    if ANTITHETIC:
        if not SHARED:  # the mirror looks up its own rows
            row, ok, w = _gathered_row(idx_ptr + (i0 + 1) * n, w_ptr, tt, dd, mask_t, mask_d, num, dim)
            nz = noise_from_counter(key + counter_offset(offset + row[:, None] * dim + dd[None, :]))
        y = tl.where(ok[:, None], w - sigma * nz, float("nan"))
        tl.store(out0 + n * dim, y.to(out_ptr.dtype.element_ty), mask=mask)


def perturbed_embedding(indices, weight, seeds, sigma, offset, antithetic):
    pop = seeds.numel() * (2 if antithetic else 1)
    n, (num, dim) = indices.shape[-1], weight.shape
    out = torch.empty(pop, n, dim, dtype=weight.dtype, device=weight.device)
    if out.numel() == 0:
        return out
    seeds = seeds.to(torch.int64).contiguous()
    indices, weight = indices.contiguous(), weight.contiguous()
    bd = min(128, max(16, next_power_of_2(dim)))
    bt = max(1, 2048 // bd)
    grid = (seeds.numel() * cdiv(n, bt), cdiv(dim, bd))
    _perturbed_embedding_kernel[grid](indices, weight, out, seeds, n, num, dim, float(sigma), offset,
                                      SHARED=indices.dim() == 1, ANTITHETIC=antithetic, BT=bt, BD=bd, num_warps=4)
    return out
