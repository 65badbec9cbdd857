"""perturbed_linear on CUDA: noise tiles generated in registers and fed to tl.dot.

One program computes a (batch tile x output tile) block for one individual, or
for both members of an antithetic pair from the same noise tile. The noise
tile (BK inputs x BN outputs) is hashed once per batch tile and never written
to memory; batches up to 128 fit one batch tile, so each noise element is
hashed once.

Shared x: the shared part x @ W^T + b is one float32 GEMM (for batches up to
128 on Hopper _shared_base_kernel, which the forward kernel overlaps through a
programmatic dependent launch; otherwise cuBLAS); the kernel adds
sigma * (x @ N_i^T + nb_i), once per pair with antithetic (+/-).
Batches over 128 go to perturbed_linear_large_batch.py on Hopper GPUs.
Per-individual x: float32 x @ W^T + b is one cuBLAS GEMM over all
P * batch rows, written into the output, which the kernel then reads as its
base; for 16-bit x (whose output dtype cannot hold a float32 base) and x that
does not flatten without a copy, the kernel computes x_i @ W^T from W tiles in
the same K loop as x_i @ N_i^T.

Precision contract (docs/precision.md): accumulation is float32. The W part of
the product has x's precision (float32 dots follow torch.get_float32_matmul_precision:
"highest" -> float32 in the base GEMMs and tf32x3 where the kernel computes it
from W tiles, else tf32); the noise enters the dot rounded to x's dtype
(bf16/fp16 inputs) or, for float32 x, at tf32 unless virtual_noise.set_noise_precision
asks for more, so the sigma-scaled noise term's rounding is the only
difference from the noise the gradient sees. (On Hopper, wide shared float32
x at tf32 enters the kernels as a row-scaled float16 copy holding the same tf32
values, at batches over 32: row_scaled_fp16.py states what that changes. For
batches up to 128, on Hopper and later, _shared_base_kernel makes the copy
beside the base GEMM, and the forward kernel follows it without PDL: it reads
the copy from its first K step.)
"""

import functools

import torch
import triton
import triton.language as tl

from . import perturbed_linear_large_batch as _large_batch
from . import perturbed_weights as _perturbed_weights
from . import row_scaled_fp16
from .device_info import fp32_dot_precision, noise_dot_precision, supports_pdl
from .launch_math import cdiv, next_power_of_2
from .noise_spec import counter_offset, noise_from_counter, seed_key
from .row_scaled_fp16 import row_block, scale_row


@triton.jit
def _k_step(x0_ptrs, w_ptr, offs_n, kk, c, lane_k, mask_x, mask_w, stride_xp, stride_xk, stride_wn, stride_wk,
            noise0, noise1, lin0, lin1, sigma,
            SHARED_X: tl.constexpr, W_IN_KERNEL: tl.constexpr, ANTITHETIC: tl.constexpr, PRECISION: tl.constexpr,
            LIN_PRECISION: tl.constexpr, ROW_SCALED: tl.constexpr, MERGED: tl.constexpr):
    """One K step: the (len(kk) x BN) noise tile from counters c[n] + lane_k[k], dotted with x."""
    x0 = tl.load(x0_ptrs + kk[None, :] * stride_xk, mask=mask_x, other=0.0)
    if not SHARED_X and ANTITHETIC:  # the second member's rows (shared x: one x for both)
        x1 = tl.load(x0_ptrs + stride_xp + kk[None, :] * stride_xk, mask=mask_x, other=0.0)
    if W_IN_KERNEL:  # x @ W^T from W tiles (per-individual x only, so x1 is loaded wherever it is used)
        wt = tl.load(w_ptr + offs_n[None, :] * stride_wn + kk[:, None] * stride_wk, mask=mask_w, other=0.0)
    nt = noise_from_counter(c[None, :] + lane_k[:, None])  # (BK, BN): N_u^T
    if MERGED:  # one dot per member with its perturbed weight tile W + s sigma N, rounded to x's dtype
        wf = wt.to(tl.float32)
        lin0 = tl.dot(x0, (wf + sigma * nt).to(x0.dtype), lin0)
        if ANTITHETIC:
            lin1 = tl.dot(x1, (wf - sigma * nt).to(x0.dtype), lin1)
        return noise0, noise1, lin0, lin1
    if ROW_SCALED:  # tf32's truncation of the noise, exactly (row_scaled_fp16.py)
        nt = nt.to(tl.float16, fp_downcast_rounding="rtz")
    else:
        nt = nt.to(x0.dtype)
    noise0 = tl.dot(x0, nt, noise0, input_precision=PRECISION)
    if not SHARED_X and ANTITHETIC:
        noise1 = tl.dot(x1, nt, noise1, input_precision=PRECISION)
    if W_IN_KERNEL:
        lin0 = tl.dot(x0, wt, lin0, input_precision=LIN_PRECISION)
        if ANTITHETIC:
            lin1 = tl.dot(x1, wt, lin1, input_precision=LIN_PRECISION)
    return noise0, noise1, lin0, lin1


@triton.jit
def _perturbed_linear_kernel(
    x_ptr, w_ptr, b_ptr, base_ptr, out_ptr, seeds_ptr, inv_ptr,
    batch, in_f, out_f,
    stride_xp, stride_xb, stride_xk,
    stride_wn, stride_wk,
    stride_op, stride_ob, stride_bp, stride_bb,
    sigma, w_offset, b_offset, noise_sn, noise_sk,
    SHARED_X: tl.constexpr, W_IN_KERNEL: tl.constexpr, HAS_BIAS: tl.constexpr, ANTITHETIC: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr, LIN_PRECISION: tl.constexpr,
    K_TAIL: tl.constexpr, TAIL_FULL: tl.constexpr, GDC_WAIT: tl.constexpr, ROW_SCALED: tl.constexpr,
    MERGED: tl.constexpr,
):
    n_tiles = tl.cdiv(out_f, BN)
    u = tl.program_id(0) // n_tiles
    t = tl.program_id(0) % n_tiles
    key = seed_key(tl.load(seeds_ptr + u))
    i0 = (u * 2 if ANTITHETIC else u).to(tl.int64)

    offs_m = tl.program_id(1) * BM + tl.arange(0, BM)
    offs_n = t * BN + tl.arange(0, BN)
    mask_m, mask_n = offs_m < batch, offs_n < out_f
    # Counters of (n, k0 + j) = c[n] + lane_k[j], with c the counter of (n, k0), carried
    # across K steps: one 64-bit add per element (written as counter_offset(kk), the
    # compiler multiplied each k by GAMMA per element, as the PTX showed). Element (n, k)
    # has noise index w_offset + n * noise_sn + k * noise_sk: (in_f, 1) for a weight stored
    # (out, in), (1, out_f) for one stored (in, out) (transposed). Triton specializes the
    # strides equal to 1, so the usual layout pays nothing for them.
    c = key + counter_offset(w_offset + offs_n.to(tl.int64) * noise_sn)
    c_step = counter_offset(tl.full((1,), BK, tl.int64) * noise_sk)

    x0_ptrs = x_ptr + (0 if SHARED_X else i0 * stride_xp) + offs_m[:, None] * stride_xb
    noise0 = tl.zeros((BM, BN), dtype=tl.float32)
    noise1 = tl.zeros((BM, BN), dtype=tl.float32)  # second member, per-individual antithetic
    lin0 = tl.zeros((BM, BN), dtype=tl.float32)
    lin1 = tl.zeros((BM, BN), dtype=tl.float32)
    # Full K steps without K masks, then one narrower step (K_TAIL = next_pow2(in_f % BK))
    # for the remainder: at 784 inputs that hashes 784 columns instead of 800. The zero
    # columns a masked step would add are exact zeros, so the outputs are the same bits.
    k_main = in_f if K_TAIL == 0 else in_f // BK * BK  # in_f itself: a tighter per-individual loop
    lane_k = counter_offset(tl.arange(0, BK).to(tl.int64) * noise_sk)
    for k0 in range(0, k_main, BK):
        noise0, noise1, lin0, lin1 = _k_step(
            x0_ptrs, w_ptr, offs_n, k0 + tl.arange(0, BK), c, lane_k, mask_m[:, None], mask_n[None, :],
            stride_xp, stride_xk, stride_wn, stride_wk, noise0, noise1, lin0, lin1, sigma, SHARED_X, W_IN_KERNEL,
            ANTITHETIC, PRECISION, LIN_PRECISION, ROW_SCALED, MERGED)
        c += c_step
    if K_TAIL > 0:
        kt = k_main + tl.arange(0, K_TAIL)
        mask_t = (kt < in_f) | TAIL_FULL  # TAIL_FULL: in_f % BK == K_TAIL, no mask to compute
        noise0, noise1, lin0, lin1 = _k_step(
            x0_ptrs, w_ptr, offs_n, kt, c, counter_offset(tl.arange(0, K_TAIL).to(tl.int64) * noise_sk),
            mask_m[:, None] & mask_t[None, :], mask_n[None, :] & mask_t[:, None],
            stride_xp, stride_xk, stride_wn, stride_wk, noise0, noise1, lin0, lin1, sigma, SHARED_X, W_IN_KERNEL,
            ANTITHETIC, PRECISION, LIN_PRECISION, ROW_SCALED, MERGED)

    if HAS_BIAS:
        # Bias counters key + counter_offset(b_offset + n), derived from the loop's c
        # (= key + counter_offset(w_offset + n * noise_sn + k_main * noise_sk)); offsets add mod 2^64,
        # negative ones too. Starting from c keeps these hashes in the noise tile's layout
        # (about one per thread); from key and n the compiler rematerialized them in the
        # accumulator layout, 16 per thread (sm_90 SASS: 1392 -> 1064 instructions per
        # thread at 1024 inputs, shared x; 1496 -> 1336 for per-individual x at B=1).
        d = (tl.full((1,), b_offset, tl.int64) - w_offset - k_main * noise_sk) + offs_n.to(tl.int64) * (1 - noise_sn)
        nb = noise_from_counter(c + counter_offset(d))[None, :]
    else:
        nb = tl.zeros((1, BN), dtype=tl.float32)
    mask = mask_m[:, None] & mask_n[None, :]
    if W_IN_KERNEL:
        if HAS_BIAS:
            bias = tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        else:
            bias = tl.zeros((1, BN), dtype=tl.float32)
        base = lin0 + bias
        base1 = lin1 + bias
    else:  # x @ W^T + b from cuBLAS or _shared_base_kernel: shared (stride_bp 0) or per individual, in out
        if GDC_WAIT:  # launched while _shared_base_kernel may still run: wait for its base (and its flush)
            tl.extra.cuda.gdc_wait()
        base_ptrs = base_ptr + offs_m[:, None] * stride_bb + offs_n[None, :]
        base = tl.load(base_ptrs + i0 * stride_bp, mask=mask, other=0.0).to(tl.float32)
        base1 = base
        if not SHARED_X and ANTITHETIC:
            base1 = tl.load(base_ptrs + (i0 + 1) * stride_bp, mask=mask, other=0.0).to(tl.float32)
    if ROW_SCALED:  # undo the rows' powers of two, exactly
        noise0 = noise0 * tl.load(inv_ptr + offs_m, mask=mask_m, other=1.0)[:, None]
    if SHARED_X:
        noise1 = noise0
    out_ptrs = out_ptr + offs_m[:, None] * stride_ob + offs_n[None, :]
    y0 = base + sigma * (noise0 + nb)
    tl.store(out_ptrs + i0 * stride_op, y0.to(out_ptr.dtype.element_ty), mask=mask)
    if ANTITHETIC:
        y1 = base1 - sigma * (noise1 + nb)
        tl.store(out_ptrs + (i0 + 1) * stride_op, y1.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _shared_base_kernel(x_ptr, w_ptr, b_ptr, base_ptr, x16_ptr, inv_ptr, batch, in_f, out_f,
                        stride_xb, stride_xk, stride_wn, stride_wk, stride_hb,
                        HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                        PRECISION: tl.constexpr, GDC_LAUNCH: tl.constexpr, ROW_SCALED: tl.constexpr,
                        ROW_BK: tl.constexpr):
    """base = x @ W^T + b in float32 for shared x with batch <= BM, one program per BN outputs.

    With GDC_LAUNCH each program first allows the dependent launch, so the
    forward kernel (launched with PDL) starts while this GEMM runs; the forward
    waits for it (griddepcontrol.wait) before it reads the base.
    With ROW_SCALED, batch more programs follow the GEMM's, one per row of x,
    writing x's row-scaled float16 copy (row_scaled_fp16.scale_row) for the
    forward kernel's x operand.
    """
    if GDC_LAUNCH:
        tl.extra.cuda.gdc_launch_dependents()
    n_tiles = tl.cdiv(out_f, BN)
    if ROW_SCALED and tl.program_id(0) >= n_tiles:  # one program per row of x's float16 copy
        row = (tl.program_id(0) - n_tiles).to(tl.int64)
        scale_row(x_ptr + row * stride_xb, stride_xk, in_f, x16_ptr + row * stride_hb, inv_ptr + row, ROW_BK)
    else:
        offs_m = tl.arange(0, BM)
        offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
        mask_m, mask_n = offs_m < batch, offs_n < out_f
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, in_f, BK):
            kk = k0 + tl.arange(0, BK)
            xt = tl.load(x_ptr + offs_m[:, None] * stride_xb + kk[None, :] * stride_xk,
                         mask=mask_m[:, None] & (kk < in_f)[None, :], other=0.0)
            wt = tl.load(w_ptr + offs_n[None, :] * stride_wn + kk[:, None] * stride_wk,
                         mask=mask_n[None, :] & (kk < in_f)[:, None], other=0.0)
            acc = tl.dot(xt, wt, acc, input_precision=PRECISION)
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        tl.store(base_ptr + offs_m[:, None] * out_f + offs_n[None, :], acc, mask=mask_m[:, None] & mask_n[None, :])


@functools.lru_cache(maxsize=1024)  # on every call's host path, which bounds the small calls' rate
def tiles(batch: int, out_f: int, in_f: int, shared: bool):
    """(BM, BN, BK, num_warps, num_stages, maxnreg): a static choice, from the sweeps of
    benchmarks/tune_cuda.py on an H200 (a fixed config keeps results bit-stable).

    Batches up to 128 take one batch tile (each noise element hashed once);
    larger ones take tiles of 256 rows (when perturbed_linear_large_batch does
    not apply: per-individual x, "highest" fp32 precision, not Hopper).
    Per-individual x with batch <= 16 runs 2 warps, where Triton uses mma.sync
    with register operands (best on the B=1 row); wider tiles use wgmma.
    Shared x at batch <= 128 caps registers at 96, 5 programs per SM. Uncapped,
    ptxas takes 116 (4 per SM), which measured no faster than the bias hashed in
    the accumulator layout at 80 registers (6 per SM); the cap at 96 measured
    +2-7% over that on the B=64 rows, at 88 within +-2% (H200, side by side,
    docs/cuda-kernels.md, "The tl.dot kernel"). Shared x at batches of 65-128 (128-row tiles) is
    uncapped: at 96 its 64-register accumulator spilled 0.7-1.5 KiB per thread (offline ptxas),
    and uncapped measured +9% to +94% at B=100 and 128 (H100; the same
    bits: the warps and registers do not change the order of the sums).
    """
    bn = 64 if out_f >= 64 else max(16, next_power_of_2(out_f))
    if batch > 128:
        return 256, bn, 32, 4, 3, None
    bm = max(16, next_power_of_2(batch))
    bk = min(32, max(16, next_power_of_2(in_f)))
    if shared:  # 3 stages: x prefetched two K steps ahead (~+5% at in >= 1024)
        return bm, bn, bk, 4, 3, 96 if bm <= 64 else None
    return bm, bn, bk, 2 if bm == 16 else (4 if bm == 32 else 8), 2, None


BASE_BN, BASE_BK = 32, 32  # _shared_base_kernel's tiles


def _cublas_base(x2, weight, bias, out=None, transposed=False):
    """x2 @ W^T + b for 2-D x2 as one cuBLAS GEMM in float32 (a fresh row-major tensor, or into out);
    with transposed, weight is stored (in, out) and this is x2 @ W + b.

    16-bit CUDA operands (weight and bias have x's dtype: validated) go to cuBLAS as they are, with
    a float32 result (out_dtype): the products of 16-bit values are exact in float32 and accumulate
    in float32 either way, and the two casts it saves measured +2.4% to +7.2% per call on the
    16-bit shared-x rows (H200, docs/cuda-kernels.md). torch supports out_dtype on CUDA
    only, so CPU tensors (the interpreter tests) take the casts. Strided operands are made
    contiguous first, as the casts did: cuBLAS picks its kernel, and so its summation order, by
    layout, and the same values must give the same bits whatever their strides.
    """
    if out is None and x2.is_cuda and x2.dtype in (torch.float16, torch.bfloat16):
        wt = weight.contiguous() if transposed else weight.contiguous().t()
        x2, result = x2.contiguous(), {"out_dtype": torch.float32}
    else:
        wt = weight.float() if transposed else weight.float().t()
        x2, result = x2.float(), {"out": out}
        bias = bias.float() if bias is not None else None
    if bias is not None:
        return torch.addmm(bias, x2, wt, **result)
    return torch.mm(x2, wt, **result)


def _shared_base(x, weight, bias, precision, row_scaled=False, transposed=False):
    """(x @ W^T + b in float32 for shared x, whether the forward kernel may follow programmatically
    dependent on the kernel that computed it, x's row-scaled float16 copy (x16, inv_scale) or None).

    Batches up to 128 on Hopper and later: _shared_base_kernel, which lets the forward kernel
    launch at once (PDL), so the forward's K loops run beside this small GEMM instead of after
    it, and the forward waits for the base only in its epilogue. Measured on an H200 side by
    side against the cuBLAS GEMM it replaces (docs/cuda-kernels.md, PDL): +1.7% to +4.4% on
    the float32 B=64 rows but P=16384 512->2048 (-0.1%, a 27 ms call), +2.5% to +5.0% bf16.
    Its float32 precision follows the forward's: tf32 at "high", float32 products and sums at
    "highest" (as cuBLAS). The interpreter runs it too (without PDL), so CI covers it. Larger
    batches, where this GEMM is a smaller part of the call, and older GPUs take cuBLAS.
    With row_scaled, the kernel's launch also writes x's copy (row_scaled_fp16.py) for the forward
    kernel, which then reads it from its first K step and so launches after it, without PDL.
    """
    batch, in_f = x.shape
    pdl = supports_pdl(x.device)
    if batch > 128 or (x.is_cuda and not pdl):
        return _cublas_base(x, weight, bias, transposed=transposed), False, None
    if transposed:
        weight = weight.t()  # the (out, in) view: the kernel reads W through its strides
    out_f = weight.shape[0]
    base = torch.empty(batch, out_f, dtype=torch.float32, device=x.device)
    x16, inv = row_scaled_fp16.empty_copy(x) if row_scaled else (base, base)
    pdl = pdl and not row_scaled  # the forward reads the copy from its first K step: nothing to overlap
    n_tiles = cdiv(out_f, BASE_BN)
    _shared_base_kernel[(n_tiles + (batch if row_scaled else 0),)](
        x, weight, bias if bias is not None else weight, base, x16, inv, batch, in_f, out_f,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), x16.stride(0),
        HAS_BIAS=bias is not None, BM=max(16, next_power_of_2(batch)), BN=BASE_BN, BK=BASE_BK,
        PRECISION="ieee" if precision == "tf32x3" else precision, GDC_LAUNCH=pdl, ROW_SCALED=row_scaled,
        ROW_BK=row_block(in_f), num_warps=4)
    return base, pdl, (x16, inv) if row_scaled else None


def _base_in_out(x, out) -> bool:
    """Whether x_i @ W^T + b for per-individual x is one cuBLAS GEMM over all P * batch rows, written
    into out: needs a float32 out (the base stays float32 until the noise term is added) and an x
    that flattens to (P * batch, in) without a copy (a copy could exceed the memory budget).
    Otherwise the kernel computes it from W tiles. Measured side by side on an H200
    (docs/cuda-kernels.md): P=4096 B=1 256->256 +12% (antithetic +20%), 1024->256 +13% (+22%)."""
    if out.dtype != torch.float32:
        return False
    try:
        x.view(-1, x.shape[-1])
    except RuntimeError:
        return False
    return True


MERGE_FROM_ROWS = 64  # batch tiles from which per-individual 16-bit x takes one dot per perturbed tile


def _merges(x, bm) -> bool:
    """Whether the kernel forms each individual's perturbed weight tile W + s sigma N in registers, rounded to
    x's dtype, and runs one dot with it instead of x @ W^T and x @ N^T (per-individual 16-bit x with W tiles
    in the K loop): half the tensor-core work, the precision of the perturbed-weights path
    (perturbed_weights.py) and of functional_call with perturbed 16-bit parameters. Measured:
    docs/cuda-kernels.md, "Per-individual x with many rows"."""
    return x.dim() == 3 and x.dtype != torch.float32 and bm >= MERGE_FROM_ROWS


def _takes_copy(x, precision) -> bool:
    """Whether shared float32 x at tf32 enters the kernel as its row-scaled float16 copy (made by
    _shared_base_kernel, so batches up to 128 on Hopper and later): see row_scaled_fp16.serves_tl_dot."""
    return precision == "tf32" and row_scaled_fp16.serves_tl_dot(x)


def call_operands(x, bias, seeds, antithetic, out_f):
    """What both CUDA linear launchers (this one and lowrank.py) start from: the (P, batch, out_f) output in x's
    dtype, the seeds as contiguous int64, and the bias contiguous: the kernels index it densely, and a strided
    one (a view such as b[::2], which validation accepts) costs a copy of out_f elements."""
    pop = seeds.numel() * (2 if antithetic else 1)
    out = torch.empty(pop, x.shape[-2], out_f, dtype=x.dtype, device=x.device)
    return out, seeds.to(torch.int64).contiguous(), bias.contiguous() if bias is not None else None


def perturbed_linear(x, weight, bias, seeds, sigma, offset, antithetic, transposed=False):
    w_view = weight.t() if transposed else weight  # (out, in), read through its strides
    out_f, in_f = w_view.shape
    shared = x.dim() == 2
    batch = x.shape[-2]
    out, seeds, bias = call_operands(x, bias, seeds, antithetic, out_f)
    if out.numel() == 0:
        return out
    fp32 = x.dtype == torch.float32
    precision = noise_dot_precision(x.device) if fp32 else "ieee"  # the noise term's (virtual_noise.precision)
    lin_precision = fp32_dot_precision(x.device) if fp32 else "ieee"  # x @ W^T: torch's
    pdl = False  # whether the forward kernel launches programmatically dependent on the base kernel
    copy = None  # (x16, inv): x's row-scaled float16 copy, for the kernel's x operand
    if shared:  # the shared part, once
        base, pdl, copy = _shared_base(x, weight, bias, lin_precision, _takes_copy(x, precision), transposed)
        stride_bp, stride_bb, w_in_kernel = 0, out_f, False
    elif _perturbed_weights.serves(x, shared):  # many rows per individual: hash once, then cuBLAS
        return _perturbed_weights.perturbed_linear(x, w_view, bias, seeds, sigma, offset, antithetic, transposed, out)
    elif _base_in_out(x, out):  # x_i @ W^T + b, for all individuals at once, written into out
        base = out
        _cublas_base(x.view(-1, in_f), weight, bias, out=out.view(-1, out_f), transposed=transposed)
        stride_bp, stride_bb, w_in_kernel = out.stride(0), out.stride(1), False
    else:
        base, stride_bp, stride_bb, w_in_kernel = out, 0, 0, True  # base unused: x_i @ W^T from W tiles
    # The Gluon kernels hash the usual (out, in) noise layout only.
    if shared and not transposed and _large_batch.applies(x, precision, antithetic) and _large_batch.launch(
            x, base, out, seeds, sigma, offset, offset + out_f * in_f, bias is not None, antithetic):
        return out
    x3 = x if not shared else (x if copy is None else copy[0])[None]
    bm, bn, bk, warps, stages, maxnreg = tiles(batch, out_f, in_f, shared)
    rem = in_f % bk
    k_tail = max(16, next_power_of_2(rem)) if rem else 0
    grid = (seeds.numel() * cdiv(out_f, bn), cdiv(batch, bm))
    _perturbed_linear_kernel[grid](
        x3, w_view, bias if bias is not None else w_view, base, out, seeds,
        copy[1] if copy else seeds,  # inv_ptr, read only with ROW_SCALED
        batch, in_f, out_f,
        0 if shared else x3.stride(0), x3.stride(1), x3.stride(2),
        w_view.stride(0), w_view.stride(1),
        out.stride(0), out.stride(1), stride_bp, stride_bb,
        float(sigma), offset, offset + out_f * in_f, 1 if transposed else in_f, out_f if transposed else 1,
        SHARED_X=shared, W_IN_KERNEL=w_in_kernel, HAS_BIAS=bias is not None, ANTITHETIC=antithetic,
        BM=bm, BN=bn, BK=bk, PRECISION=precision, LIN_PRECISION=lin_precision, K_TAIL=k_tail, TAIL_FULL=rem == k_tail, GDC_WAIT=pdl,
        ROW_SCALED=copy is not None, MERGED=w_in_kernel and _merges(x, bm),
        num_warps=warps, num_stages=stages, **({"maxnreg": maxnreg} if maxnreg else {}),
        **({"launch_pdl": True} if pdl else {}),
    )
    return out
