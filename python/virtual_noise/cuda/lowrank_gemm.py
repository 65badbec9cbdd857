"""Low-rank forward for per-individual x: the inference GEMM with the rank-r term in its epilogue.

For x of shape (P, T, in) every output row m belongs to individual m // T, and

    y[m] = x[m] @ W^T + b + s_i sigma (c * u[m] @ fout_i^T + nb_i),   u = x @ fin_i (input_factor kernel)

One program computes a (BM rows x BN outputs) tile of the GEMM over all P*T
rows, as inference does, and before its only store adds the noise term of the
G individuals its rows span as one more small dot, accumulated into the same
float32 accumulator:

    U (BM x KQ):  U[m, g*S + q] = s_g sigma c u[m, q]  (q < r),  s_g sigma  (q = r, the bias noise)
                  where row m belongs to the tile's individual g, else 0
    F (KQ x BN):  F[g*S + q, n] = fout_g[n, q]  (q < r),  nb_g[n]  (q = r)

with S = r + 1 slots per individual (r without bias) and KQ >= 16 (tl.dot's
minimum), the unused slots zero. F is hashed once per tile: about (r + 1) / T
hashes per output element, against the in * 2 flops of the GEMM. Against the
three-pass form it replaces (cuBLAS base, then a kernel reading and rewriting
the output), the output is written once and never read back (docs/lowrank.md).

The GEMM's operands are x's dtype (float32 at tf32), accumulated in float32;
the noise term's operands enter the small dot at tf32 (u and the factor
values, 11 significant bits; u itself is a tf32 dot), as fine as float16's
own rounding of terms that size. It serves 16-bit x, and float32 x when torch's matmul
precision allows tf32 (at "highest" the three-pass form keeps its float32
cuBLAS GEMM). The noise dot runs in chunks of KQ_CHUNK columns, unrolled, or in
a loop from LOOP_FROM_SLOTS columns (measured); where it would pass MAX_SLOTS
columns (T = 1; T < 4 at rank 4) the three-pass form serves (``serves``,
measured). The GEMM is launched programmatically dependent (PDL)
on the kernel that forms u and waits for it only before the noise dot.

On Hopper, calls of at least TMA_MIN_FLOPS load the x and W tiles through
tensor descriptors (TMA) where the strides allow: 4096->11008 at T = 128 ran
1.37 -> 1.12 ms (docs/lowrank.md).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .device_info import supports_tma
from .launch_math import cdiv, next_power_of_2
from .noise_spec import counter_offset, noise_from_counter, seed_key

# The noise dot's chunks of slot columns, and the most columns for which this GEMM serves. Chunks of 16 (tl.dot's
# narrowest) against 32 at T = 16, bf16, two rounds (H100, eager ms, the same output bits): rank 16 768->3072
# 0.304 -> 0.272, 4096->11008 2.36 -> 2.25; rank 4 768->3072 0.181 / 0.151 -> 0.163 / 0.147, 4096->11008 level
# (40 slot columns: 48 in three chunks, not 64 in two). At T = 1, rank 1 (256 columns) the fused call was 1.5-1.8x
# slower than the three-pass form (H200; docs/lowrank.md).
KQ_CHUNK = 16
MAX_SLOTS = 160
# From this many slot columns the chunks run in a loop rather than unrolled: rank 16 at T = 16 (136 columns, 9
# chunks) took 2.22 ms unrolled against 1.57-1.60 looped at 4096->11008 (GEMM kernel 2.29 ms in the profile
# unrolled, epilogue included), 0.272 against 0.254 at 768->3072; unrolled was faster at 72 columns and fewer
# (rank 8 at T = 16: 1.22 against 1.30). H200, bf16, eager ms, the same output bits (docs/lowrank.md).
LOOP_FROM_SLOTS = 136
# Building the descriptors and encoding them at launch adds ~25 us of host time per call: at 768->3072, P*T =
# 8192 (4e10 flops) the eager call ran 0.123 ms against 0.098-0.109 with pointer loads, though replayed from a
# graph it was faster (docs/lowrank.md). From 1e11 flops (~0.15 ms of GEMM) the GPU's time hides it.
TMA_MIN_FLOPS = 1e11


@triton.jit
def _noise_chunk(acc, c0, u_ptr, seeds_ptr, offs_m, offs_n, ind, mask_m, ind0, pop, sigma, scale, fout_offset,
                 b_offset, ANTITHETIC: tl.constexpr, HAS_BIAS: tl.constexpr, R: tl.constexpr, RP: tl.constexpr,
                 G: tl.constexpr, KQ: tl.constexpr, NOISE_PRECISION: tl.constexpr):
    """acc + U[:, c0:c0+KQ] @ F[c0:c0+KQ, :] (module docstring): slot columns c0.. of the tile's G individuals
    (ind0 the first), S = r + 1 slots each (r without bias)."""
    S: tl.constexpr = R + 1 if HAS_BIAS else R
    cols = c0 + tl.arange(0, KQ)
    g, q = cols // S, cols % S
    slot_ind = ind0 + g
    live = (g < G) & (slot_ind < pop)
    if ANTITHETIC:  # individuals 2j and 2j + 1: seed j, +noise and -noise
        sign = tl.where(slot_ind % 2 == 1, -sigma, sigma)
    else:
        sign = tl.full((KQ,), sigma, tl.float32)
    # U: each row's own individual's slots only; u in float32, (rows, RP), columns >= R unused.
    mine = (ind[:, None] == slot_ind[None, :]) & live[None, :] & mask_m[:, None]
    uq = tl.load(u_ptr + offs_m.to(tl.int64)[:, None] * RP + tl.minimum(q, R - 1)[None, :],
                 mask=mine & (q < R)[None, :], other=0.0)
    u_blk = tl.where(q[None, :] < R, uq * scale, 1.0) * sign[None, :]
    u_blk = tl.where(mine, u_blk, 0.0)
    # F: the individuals' output-factor columns and bias noise, hashed once per tile.
    key = seed_key(tl.load(seeds_ptr + (slot_ind // 2 if ANTITHETIC else slot_ind), mask=live, other=0))
    n64 = offs_n.to(tl.int64)
    e = tl.where(q[:, None] < R, fout_offset + n64[None, :] * R + q[:, None], b_offset + n64[None, :])
    f_blk = tl.where(live[:, None], noise_from_counter(key[:, None] + counter_offset(e)), 0.0)
    return tl.dot(u_blk, f_blk, acc, input_precision=NOISE_PRECISION)


@triton.jit
def _lowrank_gemm_kernel(
    x_ptr, w_ptr, x_desc, w_desc, b_ptr, u_ptr, out_ptr, seeds_ptr,
    rows, in_f, out_f, batch, pop,
    stride_xp, stride_xb, stride_xk, stride_wn, stride_wk,
    sigma, scale, fout_offset, b_offset,
    ANTITHETIC: tl.constexpr, HAS_BIAS: tl.constexpr, R: tl.constexpr, RP: tl.constexpr,
    G: tl.constexpr, KQ: tl.constexpr, NQ: tl.constexpr, LOOPED: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr, PRECISION: tl.constexpr, NOISE_PRECISION: tl.constexpr, TMA: tl.constexpr,
    W_K_INNER: tl.constexpr, GDC_WAIT: tl.constexpr,
):
    # Grouped order: GROUP_M row tiles share each W column stripe while it is in L2.
    pid = tl.program_id(0)
    m_tiles, n_tiles = tl.cdiv(rows, BM), tl.cdiv(out_f, BN)
    per_group = GROUP_M * n_tiles
    first_m = (pid // per_group) * GROUP_M
    group_m = tl.minimum(m_tiles - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m

    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    mask_m, mask_n = offs_m < rows, offs_n < out_f
    ind = offs_m // batch  # each row's individual

    acc = tl.zeros((BM, BN), dtype=tl.float32)
    x_rows = x_ptr + ind.to(tl.int64) * stride_xp + (offs_m % batch).to(tl.int64) * stride_xb
    w_cols = w_ptr + offs_n.to(tl.int64) * stride_wn
    for k0 in range(0, in_f, BK):
        if TMA:  # x as (rows, in) and W through tensor descriptors: the copy engine fills the tiles (zeros past
            # the ends)
            xt = x_desc.load([pid_m * BM, k0])
            if W_K_INNER:  # W (out, in) as nn.Linear keeps it
                wt = w_desc.load([pid_n * BN, k0]).T
            else:  # W stored (in, out)
                wt = w_desc.load([k0, pid_n * BN])
        else:
            kk = k0 + tl.arange(0, BK)
            mask_k = kk < in_f
            xt = tl.load(x_rows[:, None] + kk[None, :] * stride_xk, mask=mask_m[:, None] & mask_k[None, :],
                         other=0.0)
            wt = tl.load(w_cols[None, :] + kk[:, None] * stride_wk, mask=mask_n[None, :] & mask_k[:, None],
                         other=0.0)
        acc = tl.dot(xt, wt, acc, input_precision=PRECISION)
    if GDC_WAIT:  # launched while the input-factor kernel may still run (PDL): u complete and visible from here
        tl.extra.cuda.gdc_wait()
    # The noise dot in chunks of KQ slot columns, a fixed order: unrolled, or from LOOP_FROM_SLOTS columns a loop
    # (the same chunks in the same order, so the same bits).
    if LOOPED:
        for c in tl.range(0, NQ, num_stages=1):
            acc = _noise_chunk(acc, c * KQ, u_ptr, seeds_ptr, offs_m, offs_n, ind, mask_m, pid_m * BM // batch, pop,
                               sigma, scale, fout_offset, b_offset, ANTITHETIC, HAS_BIAS, R, RP, G, KQ,
                               NOISE_PRECISION)
    else:
        for c in tl.static_range(NQ):
            acc = _noise_chunk(acc, c * KQ, u_ptr, seeds_ptr, offs_m, offs_n, ind, mask_m, pid_m * BM // batch, pop,
                               sigma, scale, fout_offset, b_offset, ANTITHETIC, HAS_BIAS, R, RP, G, KQ,
                               NOISE_PRECISION)

    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    out_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * out_f + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@functools.lru_cache(maxsize=1024)  # on every call's host path
def tiles(rows: int, out_f: int, in_f: int, dtype_bytes: int):
    """(BM, BN, BK, num_warps, num_stages, GROUP_M): static per shape, so results are bit-stable. 128 x 256 x 64
    tiles, 8 warps, 3 stages from a sweep on an H100 (bf16, 768->3072 and 4096->11008, T = 16-512): 128 x 128
    tiles, 4 warps, 64-row or 256-row tiles measured 4-46% slower (docs/lowrank.md)."""
    bn = 256 if out_f >= 2048 else (128 if out_f >= 128 else max(16, next_power_of_2(out_f)))
    bk = 64 if dtype_bytes == 2 else 32
    bk = min(bk, max(16, next_power_of_2(in_f)))
    bm = row_tile(rows)
    warps = 8 if bm * bn >= 128 * 256 else 4
    return bm, bn, bk, warps, 3, 8


def row_tile(rows: int) -> int:
    """BM: the rows of x one program covers."""
    return 128 if rows >= 128 else max(16, next_power_of_2(rows))


def groups_per_tile(batch: int, bm: int) -> int:
    """Individuals one BM-row tile can span: BM / T when T divides BM, one when BM divides T,
    else every individual that a tile starting anywhere can touch."""
    if bm % batch == 0:
        return bm // batch
    if batch % bm == 0:
        return 1
    return cdiv(bm - 1, batch) + 1


def serves(x: torch.Tensor, shared: bool, rank: int, has_bias: bool) -> bool:
    """Per-individual x whose tiles' noise dot has at most MAX_SLOTS columns; float32 x only where torch's matmul
    precision is not "highest" (this GEMM has no float32-exact form as fast as cuBLAS's)."""
    if shared or (x.dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest"):
        return False
    g = groups_per_tile(x.shape[1], row_tile(x.shape[0] * x.shape[1]))
    return g * (rank + has_bias) <= MAX_SLOTS


def forward(x, w_view, bias, u, seeds, sigma, scale, fout_offset, b_offset, rank, antithetic, out, precision,
            noise_precision, pdl=False):
    """out (P, T, out_f) = x @ W^T + b + the rank-r noise term, u = x @ fin (P*T, RP float32). pdl: launched
    programmatically dependent on the kernel that writes u, which it waits for before its epilogue."""
    pop, batch, in_f = x.shape
    out_f = w_view.shape[0]
    rows = pop * batch
    bm, bn, bk, warps, stages, group_m = tiles(rows, out_f, in_f, x.element_size())
    g = groups_per_tile(batch, bm)
    slots = g * (rank + (bias is not None))
    kq = min(KQ_CHUNK, max(16, next_power_of_2(slots)))  # tl.dot's narrowest operand is 16
    descs = tma_descriptors(x, w_view, bm, bn, bk)
    _lowrank_gemm_kernel[(cdiv(rows, bm) * cdiv(out_f, bn),)](
        x, w_view, *(descs or (None, None)), bias if bias is not None else w_view, u, out, seeds,
        rows, in_f, out_f, batch, pop,
        x.stride(0), x.stride(1), x.stride(2), w_view.stride(0), w_view.stride(1),
        float(sigma), scale, fout_offset, b_offset,
        ANTITHETIC=antithetic, HAS_BIAS=bias is not None, R=rank, RP=u.shape[-1], G=g, KQ=kq, NQ=cdiv(slots, kq),
        LOOPED=slots >= LOOP_FROM_SLOTS, BM=bm, BN=bn, BK=bk, GROUP_M=group_m, PRECISION=precision,
        NOISE_PRECISION=noise_precision,
        TMA=descs is not None, W_K_INNER=w_view.stride(1) == 1, GDC_WAIT=pdl, num_warps=warps, num_stages=stages,
        **({"launch_pdl": True} if pdl else {}))
    return out


def tma_descriptors(x, w_view, bm, bn, bk):
    """(x as (rows, in), W) tensor descriptors where the copy engine can load the tiles (Hopper and later; x's
    rows evenly strided; unit inner strides and 16-byte aligned bases and strides, TMA's rules), else None."""
    pop, batch, in_f = x.shape
    if not supports_tma(x.device) or 2 * pop * batch * in_f * w_view.shape[0] < TMA_MIN_FLOPS:
        return None
    size = x.element_size()
    x_rows_even = x.stride(1) >= in_f and (pop == 1 or x.stride(0) == batch * x.stride(1))  # expanded x: pointers
    if not (x_rows_even and x.stride(2) == 1 and (x.stride(1) * size) % 16 == 0 and x.data_ptr() % 16 == 0):
        return None
    w_inner = 1 if w_view.stride(1) == 1 else (0 if w_view.stride(0) == 1 else None)
    if w_inner is None:
        return None
    w_outer_stride = w_view.stride(1 - w_inner)
    if w_outer_stride < w_view.shape[w_inner] or (w_outer_stride * size) % 16 or w_view.data_ptr() % 16:
        return None
    xd = TensorDescriptor(x, [pop * batch, in_f], [x.stride(1), 1], [bm, bk])
    if w_inner == 1:  # (out, in)
        wd = TensorDescriptor(w_view, [w_view.shape[0], in_f], [w_view.stride(0), 1], [bn, bk])
    else:  # the (in, out) storage of a transposed view
        wd = TensorDescriptor(w_view, [in_f, w_view.shape[0]], [w_view.stride(1), 1], [bk, bn])
    return xd, wd
