"""weight_gradient / bias_gradient on CUDA: sum_i f_i N_i / (pop_size * sigma).

Programs own (element block, population split). Each hashes a tile of
(BLOCK_U seeds x BLOCK_E elements) per step and reduces it over the seeds in
registers. Splits exist when the block alone is too small to fill the SMs;
their partial sums are added by one fixed-order reduction afterwards, so the
result is deterministic (no atomics).
"""

import torch
import triton
import triton.language as tl

from .device_info import sm_count
from .launch_math import cdiv
from .noise_spec import counter_offset, noise_from_counter, seed_key


@triton.jit
def _noise_gradient_kernel(coef_ptr, seeds_ptr, partial_ptr, n, units, units_per_split, offset,
                           BLOCK_U: tl.constexpr, BLOCK_E: tl.constexpr):
    ee = tl.program_id(0).to(tl.int64) * BLOCK_E + tl.arange(0, BLOCK_E)
    split = tl.program_id(1)
    u_start = split * units_per_split
    u_end = tl.minimum(u_start + units_per_split, units)
    e_c = counter_offset(offset + ee)[None, :]  # shared by every seed
    acc = tl.zeros((BLOCK_E,), dtype=tl.float32)
    for u0 in range(u_start, u_end, BLOCK_U):
        uu = u0 + tl.arange(0, BLOCK_U)
        mask_u = uu < u_end
        key = seed_key(tl.load(seeds_ptr + uu, mask=mask_u, other=0))
        coef = tl.load(coef_ptr + uu, mask=mask_u, other=0.0)
        noise = noise_from_counter(key[:, None] + e_c)
        acc += tl.sum(coef[:, None] * noise, axis=0)
    tl.store(partial_ptr + split.to(tl.int64) * n + ee, acc, mask=ee < n)


def config(n: int, units: int):
    """(BLOCK_E, BLOCK_U, num_warps): a static choice (a fixed config keeps results bit-stable)."""
    return 1024, 8, 4  # best of the benchmarks/tune_cuda.py sweep on an H200


def noise_weighted_sum(fitness, seeds, n, sigma, pop_size, offset, antithetic):
    device = seeds.device
    if n == 0 or seeds.numel() == 0:
        return torch.zeros(n, dtype=torch.float32, device=device)
    f = fitness.to(torch.float64)
    coef = (f.view(-1, 2)[:, 0] - f.view(-1, 2)[:, 1] if antithetic else f).to(torch.float32).contiguous()
    seeds = seeds.to(torch.int64).contiguous()
    units = seeds.numel()
    block_e, block_u, warps = config(n, units)
    e_blocks = cdiv(n, block_e)
    target = 4 * sm_count(device)  # programs to fill the device
    splits = max(1, min(cdiv(units, 4 * block_u), cdiv(target, e_blocks)))
    per_split = cdiv(cdiv(units, splits), block_u) * block_u
    splits = cdiv(units, per_split)
    partial = torch.empty(splits, n, dtype=torch.float32, device=device)
    _noise_gradient_kernel[(e_blocks, splits)](coef, seeds, partial, n, units, per_split, offset,
                                              BLOCK_U=block_u, BLOCK_E=block_e, num_warps=warps)
    total = partial[0] if splits == 1 else partial.sum(dim=0)
    return total * (1.0 / (pop_size * sigma))


def weight_gradient(fitness, seeds, weight_shape, sigma, pop_size, offset, antithetic):
    n = weight_shape[0] * weight_shape[1]
    return noise_weighted_sum(fitness, seeds, n, sigma, pop_size, offset, antithetic).view(weight_shape)


def bias_gradient(fitness, seeds, bias_shape, sigma, pop_size, offset, antithetic):
    return noise_weighted_sum(fitness, seeds, bias_shape[0], sigma, pop_size, offset, antithetic).view(bias_shape)
