"""generate_noise on CUDA: the noise of (seed, element) tiles, written out."""

import torch
import triton
import triton.language as tl

from .launch_math import cdiv
from .noise_spec import noise_at, seed_key


@triton.jit
def _generate_noise_kernel(seeds_ptr, out_ptr, n_seeds, n, offset, BLOCK_S: tl.constexpr, BLOCK_E: tl.constexpr):
    ss = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    ee = tl.program_id(0).to(tl.int64) * BLOCK_E + tl.arange(0, BLOCK_E)
    key = seed_key(tl.load(seeds_ptr + ss, mask=ss < n_seeds, other=0))
    noise = noise_at(key[:, None], (offset + ee)[None, :])
    mask = (ss[:, None] < n_seeds) & (ee[None, :] < n)
    tl.store(out_ptr + ss.to(tl.int64)[:, None] * n + ee[None, :], noise, mask=mask)


def generate_noise(seeds: torch.Tensor, n_elements: int, offset: int) -> torch.Tensor:
    seeds = seeds.to(torch.int64).contiguous()
    out = torch.empty(seeds.numel(), n_elements, dtype=torch.float32, device=seeds.device)
    if out.numel() == 0:
        return out
    block_s, block_e = 4, 1024
    grid = (cdiv(n_elements, block_e), cdiv(seeds.numel(), block_s))
    _generate_noise_kernel[grid](seeds, out, seeds.numel(), n_elements, offset, BLOCK_S=block_s, BLOCK_E=block_e)
    return out
