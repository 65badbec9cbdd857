"""reduce_metric on CUDA: mean_k |c_k + sigma * noise_ik|, parallel over individuals and chunks.

A program hashes (BLOCK_U seeds x BLOCK_E elements) tiles, so each center
element it loads serves BLOCK_U individuals (both members of a pair with
antithetic). Per-(individual, chunk) sums are added in a fixed order afterwards.
"""

import torch
import triton
import triton.language as tl

from .device_info import sm_count
from .launch_math import cdiv
from .noise_spec import noise_at, seed_key


@triton.jit
def _reduce_metric_kernel(center_ptr, seeds_ptr, partial_ptr, n, units, chunk, n_chunks, sigma, offset,
                          ANTITHETIC: tl.constexpr, BLOCK_U: tl.constexpr, BLOCK_E: tl.constexpr):
    uu = tl.program_id(0) * BLOCK_U + tl.arange(0, BLOCK_U)
    mask_u = uu < units
    c_idx = tl.program_id(1)
    key = seed_key(tl.load(seeds_ptr + uu, mask=mask_u, other=0))
    start = c_idx.to(tl.int64) * chunk
    end = tl.minimum(start + chunk, n)
    acc_p = tl.zeros((BLOCK_U, BLOCK_E), dtype=tl.float32)
    acc_m = tl.zeros((BLOCK_U, BLOCK_E), dtype=tl.float32)
    for s in range(start, end, BLOCK_E):
        ee = s + tl.arange(0, BLOCK_E).to(tl.int64)
        mask_e = ee < end
        c = tl.load(center_ptr + ee, mask=mask_e, other=0.0).to(tl.float32)[None, :]
        d = sigma * noise_at(key[:, None], (offset + ee)[None, :])
        acc_p += tl.where(mask_e[None, :], tl.abs(c + d), 0.0)
        if ANTITHETIC:
            acc_m += tl.where(mask_e[None, :], tl.abs(c - d), 0.0)
    members = 2 if ANTITHETIC else 1
    row = (uu * members).to(tl.int64) * n_chunks + c_idx
    tl.store(partial_ptr + row, tl.sum(acc_p, axis=1), mask=mask_u)
    if ANTITHETIC:
        tl.store(partial_ptr + row + n_chunks, tl.sum(acc_m, axis=1), mask=mask_u)


def config(n: int, units: int):
    """(BLOCK_U, BLOCK_E, num_warps): a static choice (a fixed config keeps results bit-stable)."""
    return 8, 256, 8  # best of the benchmarks/tune_cuda.py sweep on an H200


def reduce_metric(center, seeds, sigma, n_params, offset, antithetic):
    device = center.device
    units = seeds.numel()
    pop = units * (2 if antithetic else 1)
    if pop == 0:
        return torch.empty(0, dtype=torch.float32, device=device)
    if n_params == 0:
        return torch.full((pop,), float("nan"), dtype=torch.float32, device=device)
    c = center.reshape(-1).contiguous()
    seeds = seeds.to(torch.int64).contiguous()
    block_u, block_e, warps = config(n_params, units)
    u_blocks = cdiv(units, block_u)
    n_chunks = max(1, min(cdiv(n_params, 4 * block_e), cdiv(4 * sm_count(device), u_blocks)))
    chunk = cdiv(cdiv(n_params, n_chunks), block_e) * block_e
    n_chunks = cdiv(n_params, chunk)
    partial = torch.empty(pop, n_chunks, dtype=torch.float32, device=device)
    _reduce_metric_kernel[(u_blocks, n_chunks)](c, seeds, partial, n_params, units, chunk, n_chunks, float(sigma),
                                               offset, ANTITHETIC=antithetic, BLOCK_U=block_u, BLOCK_E=block_e,
                                               num_warps=warps)
    return (partial.to(torch.float64).sum(dim=1) / n_params).to(torch.float32)
