"""Low-rank virtual noise on CUDA: the factors hashed in registers, never the (out, in) noise.

A weight stored (rows, cols) at offset with rank r has factors A (rows, r) at
offset and B (cols, r) after them; N = sqrt(12/r) A @ B^T. For a linear weight
stored (out, in) the input factor is B and the output factor A (stored
(in, out), transposed, the other way round). The forward is

    y_i = x_i @ W^T + b  (the inference GEMM)
        + s_i sigma (c * (x_i @ fin_i) @ fout_i^T + nb_i)

``_input_factor_kernel`` reads x once and writes u_i = x_i @ fin_i (rows of x
x r, float32). For per-individual x the rest is one GEMM over all P*T rows
whose epilogue adds the rank-r product and the bias noise (lowrank_gemm.py).
Otherwise (shared x; per-individual float32 x at "highest"; a row tile
spanning more individuals than its noise dot holds: T = 1, T < 4 at rank 4) the base
comes from cuBLAS and ``_output_factor_kernel`` hashes fout_i per output tile
and adds the noise term into the output with float32 FMAs over exactly r
columns. The gradient is GEMMs over the generated factors, a bounded chunk of
seeds at a time, in a fixed order.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import lowrank_gemm as _gemm
from .device_info import fp32_dot_precision, noise_dot_precision, supports_pdl
from .launch_math import cdiv, next_power_of_2
from .noise_spec import counter_offset, noise_from_counter, seed_key
from .perturbed_linear import _cublas_base, call_operands

SCRATCH_BYTES = 64 << 20  # gradient: the factors of one chunk of seeds (at least; see lowrank_weight_gradient)
CHUNK_OF_RESULT = 3  # gradient: a chunk's factors may take up to 3 times the float32 result's bytes
# Rows of x per program of the input-factor kernel's dot form: 16 measured slower (768->3072 T = 128 0.090 ->
# 0.097 ms, 4096->11008 1.01 -> 1.18; H200, docs/lowrank.md).
INPUT_FACTOR_ROWS = 64
# From this rank the input-factor kernel hashes its (BK x RP) factor tile in one piece (RP = 16 columns at ranks
# up to 16) instead of placing R hashed columns by selects. H100, bf16, P*T = 8192 (docs/lowrank.md): rank 16
# 3.01 -> 2.34 ms at 4096->11008 T = 16, 0.46 -> 0.34 at 768->3072; rank 8 1.52 -> 1.25 and 0.21 -> 0.15. At rank 4
# it was faster at 4096 inputs (1.28 -> 1.15 at T = 16) but not at 768 (T = 512: 0.119 -> 0.124-0.128), so ranks
# under 8 keep the selects.
FACTOR_2D_FROM_RANK = 8


@triton.jit
def _factor_column(key, f_offset, idx, q, R: tl.constexpr):
    """Column q of a factor at the rows idx: noise(key, f_offset + idx * R + q)."""
    return noise_from_counter(key + counter_offset(f_offset + idx.to(tl.int64) * R + q))


@triton.jit
def _input_factor_kernel(x_ptr, u_ptr, seeds_ptr, batch, in_f, stride_xp, stride_xb, stride_xk, fin_offset,
                         SHARED: tl.constexpr, ANTITHETIC: tl.constexpr, R: tl.constexpr, RP: tl.constexpr,
                         BM: tl.constexpr, BK: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr,
                         GDC_LAUNCH: tl.constexpr, FACTOR_2D: tl.constexpr):
    """u[v] = x_v @ fin (rows x RP, float32; columns >= R zero). v: a seed for shared x, an individual
    otherwise. Each factor element is hashed once per program.

    DOT: a tensor-core dot; its (BK x RP) operand hashed in one piece (FACTOR_2D, one counter per element, the
    padding columns masked to zero) or, at low ranks, as R hashed columns placed by selects. Otherwise
    float32 FMAs with a row reduction per column, for batches under 16 rows, where a dot's 16-row tile
    would be mostly padding. Measured (H100, docs/lowrank.md): the FMA form cost ~30 us per unit of rank
    at P*T = 8192 and 4096 inputs; at T = 1 the dot form made the forward 1.7-3.3x slower.

    GDC_LAUNCH: the fused GEMM that reads u is launched programmatically dependent (PDL); allowing it at once
    lets its K loops run beside this kernel, and it waits for u only before its epilogue."""
    if GDC_LAUNCH:
        tl.extra.cuda.gdc_launch_dependents()
    v = tl.program_id(0)
    seed_index = v if SHARED else (v // 2 if ANTITHETIC else v)
    key = seed_key(tl.load(seeds_ptr + seed_index))
    offs_m = tl.program_id(1) * BM + tl.arange(0, BM)
    mask_m = offs_m < batch
    x_base = x_ptr + (0 if SHARED else v.to(tl.int64) * stride_xp) + offs_m[:, None] * stride_xb
    cols = tl.arange(0, RP)
    acc = tl.zeros((BM, RP), dtype=tl.float32)
    for k0 in range(0, in_f, BK):
        kk = k0 + tl.arange(0, BK)
        mask_k = kk < in_f
        xt = tl.load(x_base + kk[None, :] * stride_xk, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        xt = xt.to(tl.float32)
        if DOT and FACTOR_2D:
            f = tl.where(mask_k[:, None] & (cols[None, :] < R), _factor_column(key, fin_offset, kk[:, None],
                                                                               cols[None, :], R), 0.0)
            acc = tl.dot(xt, f, acc, input_precision=PRECISION)
        elif DOT:
            f = tl.zeros((BK, RP), dtype=tl.float32)
            for q in tl.static_range(R):
                col = tl.where(mask_k, _factor_column(key, fin_offset, kk, q, R), 0.0)
                f = tl.where(cols[None, :] == q, col[:, None], f)
            acc = tl.dot(xt, f, acc, input_precision=PRECISION)
        else:
            for q in tl.static_range(R):
                col = tl.where(mask_k, _factor_column(key, fin_offset, kk, q, R), 0.0)
                part = tl.sum(xt * col[None, :], axis=1)  # (BM,)
                acc += tl.where(cols[None, :] == q, part[:, None], 0.0)
    tl.store(u_ptr + (v.to(tl.int64) * batch + offs_m)[:, None] * RP + cols[None, :], acc, mask=mask_m[:, None])


@triton.jit
def _output_factor_kernel(u_ptr, base_ptr, out_ptr, seeds_ptr, batch, out_f, stride_bp, stride_bb,
                          stride_op, stride_ob, sigma, scale, fout_offset, b_offset,
                          SHARED: tl.constexpr, ANTITHETIC: tl.constexpr, HAS_BIAS: tl.constexpr,
                          R: tl.constexpr, RP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """out[i] = base[i] + s_i sigma (scale * u_i @ fout^T + nb): one program per (seed or individual,
    output tile, batch tile); with shared x an antithetic pair shares u and stores both members.
    The rank-R product is R outer-product FMAs with fout's columns hashed once each."""
    n_tiles = tl.cdiv(out_f, BN)
    v = tl.program_id(0) // n_tiles
    t = tl.program_id(0) % n_tiles
    per_seed = SHARED or not ANTITHETIC
    seed_index = v if per_seed else v // 2
    key = seed_key(tl.load(seeds_ptr + seed_index))
    offs_m = tl.program_id(1) * BM + tl.arange(0, BM)
    offs_n = t * BN + tl.arange(0, BN)
    mask_m, mask_n = offs_m < batch, offs_n < out_f
    mask = mask_m[:, None] & mask_n[None, :]
    u_rows = u_ptr + (v.to(tl.int64) * batch + offs_m) * RP
    term = tl.zeros((BM, BN), dtype=tl.float32)
    for q in tl.static_range(R):
        uq = tl.load(u_rows + q, mask=mask_m, other=0.0)
        term += uq[:, None] * _factor_column(key, fout_offset, offs_n, q, R)[None, :]
    term = scale * term
    if HAS_BIAS:
        term += noise_from_counter(key + counter_offset(b_offset + offs_n.to(tl.int64)))[None, :]
    if SHARED:
        i0 = (v * 2 if ANTITHETIC else v).to(tl.int64)
        base = tl.load(base_ptr + offs_m[:, None] * stride_bb + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
        out0 = out_ptr + i0 * stride_op + offs_m[:, None] * stride_ob + offs_n[None, :]
        tl.store(out0, (base + sigma * term).to(out_ptr.dtype.element_ty), mask=mask)
        if ANTITHETIC:
            tl.store(out0 + stride_op, (base - sigma * term).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        i = v.to(tl.int64)
        s = sigma if not ANTITHETIC else tl.where(v % 2 == 0, sigma, -sigma)
        base = tl.load(base_ptr + i * stride_bp + offs_m[:, None] * stride_bb + offs_n[None, :], mask=mask,
                       other=0.0).to(tl.float32)
        tl.store(out_ptr + i * stride_op + offs_m[:, None] * stride_ob + offs_n[None, :],
                 (base + s * term).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _factor_kmajor_kernel(seeds_ptr, coef_ptr, dst_ptr, u0, width, n_rows, f_offset, R: tl.constexpr,
                          HAS_COEF: tl.constexpr, BJ: tl.constexpr, BC: tl.constexpr):
    """dst[j, v*R + q] = coef[u0 + v] * noise(seed_{u0+v}, f_offset + j*R + q): seeds u0.. 's factors side by side
    as one (n_rows, width = units * R) row-major matrix, the layout tf32 tensor-core GEMMs read fastest (K-major).
    A row's R columns of one seed are R consecutive counters and R consecutive addresses."""
    col_tiles = tl.cdiv(width, BC)  # one grid axis: axes 1 and 2 stop at 65535 programs
    j = (tl.program_id(0) // col_tiles) * BJ + tl.arange(0, BJ)
    c = (tl.program_id(0) % col_tiles) * BC + tl.arange(0, BC)
    mask_c = c < width
    v, q = c // R, c % R
    key = seed_key(tl.load(seeds_ptr + u0 + v, mask=mask_c, other=0))
    val = noise_from_counter(key[None, :] + counter_offset(f_offset + j.to(tl.int64)[:, None] * R + q[None, :]))
    if HAS_COEF:
        val = val * tl.load(coef_ptr + u0 + v, mask=mask_c, other=0.0)[None, :]
    tl.store(dst_ptr + j.to(tl.int64)[:, None] * width + c[None, :], val, mask=(j < n_rows)[:, None] & mask_c[None, :])


def _roles(rows, cols, r, offset, transposed):
    """(fin offset, fout offset): the factor applied to x's inputs and the one over the outputs."""
    a_off, b_off = offset, offset + rows * r
    return (a_off, b_off) if transposed else (b_off, a_off)


def _input_factor(x, seeds, fin_off, rank, antithetic, shared, pdl=False):
    """u = x @ fin for every seed (shared x) or individual: (units, batch, RP) float32, columns >= rank zero;
    RP = next_pow2(rank), at least 16 (a dot's narrowest operand) where the kernel runs a dot. pdl: the next
    launch may start at once (it waits for u itself)."""
    batch, in_f = x.shape[-2], x.shape[-1]
    units = seeds.numel() if shared else x.shape[0]
    dot = batch >= 16
    rp = max(16, next_power_of_2(rank)) if dot else next_power_of_2(rank)
    u = torch.empty(units, batch, rp, dtype=torch.float32, device=x.device)
    x3 = x[None] if shared else x
    bm_in = min(INPUT_FACTOR_ROWS, next_power_of_2(batch)) if dot else next_power_of_2(batch)
    _input_factor_kernel[(units, cdiv(batch, bm_in))](
        x3, u, seeds, batch, in_f, 0 if shared else x3.stride(0), x3.stride(1), x3.stride(2), fin_off,
        SHARED=shared, ANTITHETIC=antithetic, R=rank, RP=rp, BM=bm_in, BK=64 if dot else 128, DOT=dot,
        PRECISION=noise_dot_precision(x.device), GDC_LAUNCH=pdl, FACTOR_2D=rank >= FACTOR_2D_FROM_RANK, num_warps=4)
    return u


def lowrank_perturbed_linear(x, weight, bias, seeds, sigma, offset, rank, antithetic, transposed):
    rows, cols = weight.shape
    in_f, out_f = (rows, cols) if transposed else (cols, rows)
    shared = x.dim() == 2
    batch = x.shape[-2]
    out, seeds, bias = call_operands(x, bias, seeds, antithetic, out_f)
    if out.numel() == 0:
        return out
    fin_off, fout_off = _roles(rows, cols, rank, offset, transposed)
    scale, b_off = math.sqrt(12.0 / rank), offset + rows * cols
    fused = _gemm.serves(x, shared, rank, bias is not None)
    pdl = fused and supports_pdl(x.device)  # the GEMM's K loops start while u is formed (docs/lowrank.md)
    u = _input_factor(x, seeds, fin_off, rank, antithetic, shared, pdl)
    if fused:  # one GEMM, the noise term in its epilogue
        w_view = weight.t() if transposed else weight
        return _gemm.forward(x, w_view, bias, u.view(-1, u.shape[-1]), seeds, sigma, scale, fout_off, b_off, rank,
                             antithetic, out, fp32_dot_precision(x.device), noise_dot_precision(x.device), pdl)
    # x @ W^T + b, the inference GEMM: once for shared x, over all P * batch rows otherwise.
    if shared:
        base, stride_bp, stride_bb = _cublas_base(x, weight, bias, transposed=transposed), 0, out_f
    else:
        x2 = x.reshape(-1, in_f)
        if x.dtype == torch.float32:
            _cublas_base(x2, weight, bias, out=out.view(-1, out_f), transposed=transposed)
        else:  # 16-bit: the GEMM in x's dtype, as inference runs it, straight into the output
            w = weight if transposed else weight.t()
            if bias is None:
                torch.mm(x2, w, out=out.view(-1, out_f))
            else:
                torch.addmm(bias, x2, w, out=out.view(-1, out_f))
        base, stride_bp, stride_bb = out, out.stride(0), out.stride(1)
    units = u.shape[0]
    bm, bn = min(32, next_power_of_2(batch)), 128
    _output_factor_kernel[(units * cdiv(out_f, bn), cdiv(batch, bm))](
        u, base, out, seeds, batch, out_f, stride_bp, stride_bb, out.stride(0), out.stride(1), float(sigma),
        scale, fout_off, b_off, SHARED=shared, ANTITHETIC=antithetic, HAS_BIAS=bias is not None, R=rank,
        RP=u.shape[-1], BM=bm, BN=bn, num_warps=4)
    return out


def _factor_kmajor(seeds, coef, u0, units, n_rows, rank, f_offset, device):
    width = units * rank
    dst = torch.empty(n_rows, width, dtype=torch.float32, device=device)
    bj, bc = 32, 64
    _factor_kmajor_kernel[(cdiv(n_rows, bj) * cdiv(width, bc),)](
        seeds, coef if coef is not None else seeds, dst, u0, width, n_rows, f_offset, R=rank,
        HAS_COEF=coef is not None, BJ=bj, BC=bc, num_warps=4)
    return dst


def lowrank_weight_gradient(fitness, seeds, weight_shape, sigma, pop_size, offset, rank, antithetic):
    rows, cols = weight_shape
    device = seeds.device
    if rows * cols == 0 or seeds.numel() == 0:
        return torch.zeros(rows, cols, dtype=torch.float32, device=device)
    grad = torch.empty(rows, cols, dtype=torch.float32, device=device)  # the first chunk's GEMM writes it whole
    f = fitness.to(torch.float64)
    coef = f.view(-1, 2)[:, 0] - f.view(-1, 2)[:, 1] if antithetic else f
    coef = (coef * (math.sqrt(12.0 / rank) / (pop_size * sigma))).to(torch.float32).contiguous()
    seeds = seeds.to(torch.int64).contiguous()
    # Every chunk's GEMM reads and writes the float32 result once more, and shorter GEMMs run further from
    # the tensor cores' rate, so chunks of factors up to CHUNK_OF_RESULT times the result's bytes (at least
    # SCRATCH_BYTES). At P=4096 4096x11008 r=4 (H100): 64 MiB chunks (8) ran at 45% of the rate of the GEMM
    # of the same product, chunks the result's size (3) at 58%, one chunk at 64% (docs/lowrank.md).
    per_seed = (rows + cols) * rank * 4
    chunk = max(1, max(SCRATCH_BYTES, CHUNK_OF_RESULT * grad.numel() * 4) // per_seed)
    for u0 in range(0, seeds.numel(), chunk):  # a fixed order of chunks: deterministic sums
        units = min(chunk, seeds.numel() - u0)
        # Both operands K-major, (rows, units * r) @ (cols, units * r)^T: the layout tf32 tensor-core GEMMs read
        # directly (2.96 -> 2.04 ms at P=4096 4096x11008 r=4 against (units * r, rows)^T @ (units * r, cols);
        # H200, docs/lowrank.md).
        a = _factor_kmajor(seeds, coef, u0, units, rows, rank, offset, device)
        b = _factor_kmajor(seeds, None, u0, units, cols, rank, offset + rows * rank, device).t()
        if u0 == 0:
            torch.mm(a, b, out=grad)
        else:
            grad.addmm_(a, b)
    return grad


def generate_lowrank_noise(seeds, weight_shape, rank, offset):
    rows, cols = weight_shape
    seeds = seeds.to(torch.int64).contiguous()
    s = seeds.numel()
    if s * rows * cols == 0:
        return torch.zeros(s, rows, cols, dtype=torch.float32, device=seeds.device)
    a = _factor_kmajor(seeds, None, 0, s, rows, rank, offset, seeds.device).view(rows, s, rank)
    b = _factor_kmajor(seeds, None, 0, s, cols, rank, offset + rows * rank, seeds.device).view(cols, s, rank)
    # In float64, as the CPU kernel: products of 24-bit values and their short sums are exact there.
    n = torch.bmm(a.double().permute(1, 0, 2), b.double().permute(1, 2, 0))
    return (math.sqrt(12.0 / rank) * n).to(torch.float32)
