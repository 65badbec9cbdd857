"""perturbed_linear on Hopper for large shared-x batches: two Gluon wgmma kernels.

For batches over 128 the tl.dot kernel (perturbed_linear.py) needs a 256-row
accumulator next to the noise tile, so the noise round-trips through shared
memory and its hashing waits for each dot. Both kernels here compute the
transposed tile instead, out^T (BO outputs x BB batch rows) = N_u (BO x K) @ x^T,
with x tiles streaming in through a TMA ring:

- _large_batch_kernel, one program per (individual, output tile, batch tile):
  the noise tile is hashed straight into the register layout of wgmma's A
  operand, and the hash of K step k+1 is issued while the asynchronous wgmma
  of step k is in flight. Measured on an H200 side by side with the tl.dot
  kernel (docs/cuda-kernels.md): +32% at P=64 B=256 4096->4096, +32% at
  P=256 B=1024. The SM still runs the two by turns: at 4096->4096 on an H100
  the K loop takes the cycles of the hash alone plus those of the wgmmas alone,
  with the noise operand in registers or in shared memory (docs/cuda-kernels.md,
  "Where the remaining time goes"); that sum bounds the row.
- _noise_slab_kernel, one program per (individual, output tile) looping over
  the batch tiles: the first batch tile hashes the whole BO x in_f noise slab
  into shared memory, later ones reuse it, so each noise element is hashed
  once instead of once per batch tile. Two warpgroups take alternate 128-row
  batch tiles in ping-pong: their K loops take turns, so one's epilogue (base
  loads, output stores) overlaps the other's wgmmas. It serves batches over
  256 whose slab fits beside an x ring of at least 3 stages (fp32 in_f <= 704,
  16-bit <= 1408 in Hopper's 227 KiB) when there is at least one program per SM.
  Measured on an H100 side by side with the kernel it replaced (one of 8 warps
  splitting 256-row tiles, both warpgroups in their K loops or epilogues
  together; docs/cuda-kernels.md): P=256 B=1024
  512->512 fp32 +19-20% (antithetic +16-18%), P=1024 B=300 256->256 +31-36%,
  bf16 +5-9%. Before, the fp32 B=1024 row lost ~0.2 ms of its 0.76 to
  epilogues that no wgmma overlapped.

float32 x at tf32 reaches both kernels as its row-scaled float16 copy
(row_scaled_fp16.py: the same tf32 operand values, a power of two per row,
undone exactly in the epilogue) where its K loops are long enough to pay for
the copy (plain calls from 512 inputs, antithetic from 1024): float16 wgmma runs
at twice tf32's rate on half the bytes. Measured on an H100 side by side
(docs/cuda-kernels.md): P=256 B=1024 512->512 +15-20%,
P=64 B=256 4096->4096 +33% plain and antithetic. Otherwise float32 x goes
through TMA as float32, and the kernels have the same noise, the same float32
accumulation order over K and the same tf32 / 16-bit operand rounding as the
tl.dot kernel (the GPU tests check the outputs are bit-identical); the float16
copy's outputs are as accurate against float64 but not the same bits.
Gluon is not run by TRITON_INTERPRET, so this path is taken on sm_90 GPUs
only; elsewhere (and for "highest" fp32 precision, tf32x3, which wgmma has no
single-instruction form of) the tl.dot kernel runs.

Why not hash warps filling a shared noise ring for a wgmma warpgroup (the
per-tile kernel's shape): ptxas caps every partition at the launch register
bound, so a CTA holding a 64x256 fp32 accumulator can have at most 12 warps.
The variants that fit measured 5-61% slower (docs/cuda-kernels.md). The
noise-slab kernel's ping-pong needs only 8 warps.
"""

from __future__ import annotations

import os
import warnings

import torch
import triton

try:  # Gluon ships with triton >= 3.5; without it the tl.dot kernel serves every case.
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError:  # pragma: no cover - depends on the installed triton
    gluon = None

from . import row_scaled_fp16
from .device_info import compute_capability, max_shared_memory, sm_count
from .launch_math import cdiv
from .noise_spec import counter_offset, noise_at, noise_from_counter, seed_key

BB, BO, STAGES, WARPS = 256, 64, 3, 4  # from the H200 sweeps of benchmarks/tune_cuda.py (docs/cuda-kernels.md)
SLAB_BB = 128  # batch rows per noise-slab tile (each of its two warpgroups holds a 64 x 128 accumulator)
SLAB_STAGES = (8, 3)  # its x ring: the deepest that fits beside the slab, at most 8 and at least 3
SLAB_WORKER_REGS = 232  # registers of its worker warpgroup (the default one takes the rest of 256 x 8 warps)
SLAB_MIN_PROGRAMS_PER_SM = 1  # fewer programs than SMs: the per-tile grid (x batch tiles) fills more SMs;
# measured inconclusive at P=16-32, B=1024 (0.1-0.25 ms calls, +-30% between rounds)
_failed = False  # set when this triton's Gluon rejects the kernel: the tl.dot kernel takes over

if gluon is not None:

    @gluon.jit
    def _tile_rows(oo, m0, batch, out_f, BB: gl.constexpr, layout: gl.constexpr):
        """Batch rows m0..m0+BB of a transposed (outputs oo x batch rows) tile, and its in-bounds mask."""
        ob = m0 + gl.arange(0, BB, layout=gl.SliceLayout(0, layout))
        return ob, (oo < out_f)[:, None] & (ob < batch)[None, :]

    @gluon.jit
    def _load_base_tile(base_ptr, oo, m0, batch, out_f, BB: gl.constexpr, layout: gl.constexpr):
        """The float32 base x @ W^T + b for outputs oo x batch rows m0..m0+BB, transposed like acc."""
        ob, mask = _tile_rows(oo, m0, batch, out_f, BB, layout)
        return gl.load(base_ptr + ob[None, :] * out_f + oo[:, None], mask=mask, other=0.0)

    @gluon.jit
    def _store_tile(acc, base, oo, m0, out_ptr, batch, out_f, stride_op, stride_ob, i0, sigma,
                    ANTITHETIC: gl.constexpr):
        """out[i0] = base + sigma * acc for the transposed tile acc (outputs oo x batch rows m0...),
        and out[i0 + 1] = base - sigma * acc for an antithetic pair."""
        BB: gl.constexpr = acc.shape[1]
        LAYOUT: gl.constexpr = acc.type.layout
        ob, mask = _tile_rows(oo, m0, batch, out_f, BB, LAYOUT)
        out_ptrs = out_ptr + ob[None, :] * stride_ob + oo[:, None]
        gl.store(out_ptrs + i0 * stride_op, (base + sigma * acc).to(out_ptr.dtype.element_ty), mask=mask)
        if ANTITHETIC:
            gl.store(out_ptrs + (i0 + 1) * stride_op, (base - sigma * acc).to(out_ptr.dtype.element_ty), mask=mask)

    @gluon.jit
    def _noise_operand(noise, DT: gl.constexpr, ROW_SCALED: gl.constexpr):
        """float32 noise as wgmma's operand in x's dtype: rounded to 16-bit x's, kept for float32 x (wgmma
        truncates it to tf32), or for float32 x held as row-scaled float16 (row_scaled_fp16.py) truncated to
        float16, which keeps exactly the bits that tf32 truncation does."""
        if ROW_SCALED:
            v = noise.to(DT, fp_downcast_rounding="rtz")
        else:
            v = noise.to(DT)
        return v

    @gluon.jit
    def _unscale(acc, inv_ptr, m0, batch, ROW_SCALED: gl.constexpr):
        """acc (outputs x batch rows m0...) times each row's inverse scale, for row-scaled float16 x: exact,
        a power of two."""
        if ROW_SCALED:
            ob = m0 + gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, acc.type.layout))
            acc = acc * gl.load(inv_ptr + ob, mask=ob < batch, other=1.0)[None, :]
        return acc

    @gluon.jit
    def _noise_counters(key, t, w_offset, in_f, BO: gl.constexpr, BK: gl.constexpr, layout: gl.constexpr):
        """Counters of output tile t's (BO x BK) noise tiles, as in perturbed_linear.py: row
        counters c (add c_step per K step) plus constant lane offsets, one 64-bit add per element."""
        offs_o = t * BO + gl.arange(0, BO, layout=gl.SliceLayout(1, layout))
        offs_k = gl.arange(0, BK, layout=gl.SliceLayout(0, layout))
        c = key + counter_offset(w_offset + offs_o.to(gl.int64) * in_f)
        c_step = counter_offset(gl.full([1], BK, gl.int64, layout=gl.SliceLayout(1, layout)))
        return c, counter_offset(offs_k), c_step

    @gluon.jit
    def _large_batch_kernel(
        x_desc, base_ptr, out_ptr, seeds_ptr, inv_ptr,
        batch, in_f, out_f, stride_op, stride_ob,
        sigma, w_offset, b_offset, n_tiles,
        HAS_BIAS: gl.constexpr, ANTITHETIC: gl.constexpr, ROW_SCALED: gl.constexpr, BO: gl.constexpr,
        STAGES: gl.constexpr, num_warps: gl.constexpr,
    ):
        BB: gl.constexpr = x_desc.block_type.shape[0]
        BK: gl.constexpr = x_desc.block_type.shape[1]
        DT: gl.constexpr = x_desc.dtype
        mma: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BB, 256 // DT.primitive_bitwidth])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=32 // DT.primitive_bitwidth)

        u = gl.program_id(0) // n_tiles
        t = gl.program_id(0) % n_tiles
        m0 = gl.program_id(1) * BB
        key = seed_key(gl.load(seeds_ptr + u))
        i0 = (u * 2 if ANTITHETIC else u).to(gl.int64)

        # x tiles (BB batch rows x BK inputs) through a TMA ring; rows and inputs
        # past the end arrive as zeros, so the noise there needs no mask.
        x_s = gl.allocate_shared_memory(DT, [STAGES, BB, BK], x_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for j in gl.static_range(STAGES):
            mbarrier.init(bars.index(j), count=1)
        n_steps = gl.cdiv(in_f, BK)
        for j in gl.static_range(STAGES - 1):
            mbarrier.expect(bars.index(j), x_desc.block_type.nbytes, pred=j < n_steps)
            tma.async_copy_global_to_shared(x_desc, [m0, j * BK], bars.index(j), x_s.index(j), pred=j < n_steps)

        c, lane_k, c_step = _noise_counters(key, t, w_offset, in_f, BO, BK, a_layout)

        acc = gl.zeros((BO, BB), dtype=gl.float32, layout=mma)
        nt = _noise_operand(noise_from_counter(c[:, None] + lane_k[None, :]), DT, ROW_SCALED)
        for step in range(n_steps):
            s = step % STAGES
            mbarrier.wait(bars.index(s), (step // STAGES) & 1)
            acc = warpgroup_mma(nt, x_s.index(s).permute((1, 0)), acc, is_async=True)
            c += c_step
            # The next step's hash overlaps this step's wgmma.
            nt_next = _noise_operand(noise_from_counter(c[:, None] + lane_k[None, :]), DT, ROW_SCALED)
            acc, nt = warpgroup_mma_wait(num_outstanding=0, deps=(acc, nt))
            nxt = step + STAGES - 1  # its slot was read by step - 1's wgmma, complete by now
            sn = nxt % STAGES
            mbarrier.expect(bars.index(sn), x_desc.block_type.nbytes, pred=nxt < n_steps)
            tma.async_copy_global_to_shared(x_desc, [m0, nxt * BK], bars.index(sn), x_s.index(sn), pred=nxt < n_steps)
            nt = nt_next
        for j in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(j))

        oo = t * BO + gl.arange(0, BO, layout=gl.SliceLayout(1, mma))
        acc = _unscale(acc, inv_ptr, m0, batch, ROW_SCALED)
        if HAS_BIAS:
            acc = acc + noise_at(key, b_offset + oo.to(gl.int64))[:, None]
        base = _load_base_tile(base_ptr, oo, m0, batch, out_f, BB, mma)
        _store_tile(acc, base, oo, m0, out_ptr, batch, out_f, stride_op, stride_ob, i0, sigma, ANTITHETIC)

    @gluon.jit
    def _slab_x_load(x_desc, x_s, bars, it, total, KSTEPS: gl.constexpr, STAGES: gl.constexpr):
        """TMA x tile `it` of the program's sequence (batch tile it // KSTEPS, K step it % KSTEPS) into
        ring slot it % STAGES; tiles past the last are skipped."""
        BB: gl.constexpr = x_desc.block_type.shape[0]
        BK: gl.constexpr = x_desc.block_type.shape[1]
        s = it % STAGES
        mbarrier.expect(bars.index(s), x_desc.block_type.nbytes, pred=it < total)
        tma.async_copy_global_to_shared(x_desc, [(it // KSTEPS) * BB, (it % KSTEPS) * BK], bars.index(s),
                                        x_s.index(s), pred=it < total)

    @gluon.jit
    def _slab_hash_step(slab, k, c, lane_k, DT: gl.constexpr, ROW_SCALED: gl.constexpr):
        """Hash K step k of the noise slab into shared memory (counters c + lane_k); K columns past
        in_f meet zero x columns (TMA fill), so they need no mask."""
        slab.index(k).store(_noise_operand(noise_from_counter(c[:, None] + lane_k[None, :]), DT, ROW_SCALED))
        fence_async_shared()  # the generic-proxy stores, before wgmma's async-proxy reads

    @gluon.jit
    def _slab_role(ROLE: gl.constexpr, x_desc, slab, x_s, bars, turn, slab_ready,
                   base_ptr, out_ptr, seeds_ptr, inv_ptr, batch, in_f, out_f, stride_op, stride_ob,
                   sigma, w_offset, b_offset, n_tiles,
                   HAS_BIAS: gl.constexpr, ANTITHETIC: gl.constexpr, ROW_SCALED: gl.constexpr, BO: gl.constexpr,
                   KSTEPS: gl.constexpr, STAGES: gl.constexpr):
        """One warpgroup of _noise_slab_kernel: batch tiles ROLE, ROLE + 2, ... of the program."""
        BB: gl.constexpr = x_desc.block_type.shape[0]
        BK: gl.constexpr = x_desc.block_type.shape[1]
        DT: gl.constexpr = x_desc.dtype
        mma: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BB, 256 // DT.primitive_bitwidth])
        hashing: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, BK // 8], threads_per_warp=[4, 8],
                                                 warps_per_cta=[4, 1], order=[1, 0])
        u = gl.program_id(0) // n_tiles
        t = gl.program_id(0) % n_tiles
        key = seed_key(gl.load(seeds_ptr + u))
        i0 = (u * 2 if ANTITHETIC else u).to(gl.int64)
        n_m = gl.cdiv(batch, BB)
        total = n_m * KSTEPS  # x tiles, batch tile major, consumed in this order by the two roles in turn
        if ROLE == 0:
            for j in gl.static_range(STAGES):
                _slab_x_load(x_desc, x_s, bars, j, total, KSTEPS, STAGES)

        c, lane_k, c_step = _noise_counters(key, t, w_offset, in_f, BO, BK, hashing)
        if ROLE == 1:  # the slab's odd K steps, each signalled to role 0's first K loop
            c += c_step
            for k in range(1, KSTEPS, 2):
                _slab_hash_step(slab, k, c, lane_k, DT, ROW_SCALED)
                # Gluon lowers this to one thread's arrive after a barrier of the partition (sm_90 PTX),
                # so every thread's stores and fence precede it.
                mbarrier.arrive(slab_ready.index(k // 2), count=1)
                c += c_step
                c += c_step

        oo = t * BO + gl.arange(0, BO, layout=gl.SliceLayout(1, mma))
        if HAS_BIAS:
            nb = noise_at(key, b_offset + oo.to(gl.int64))
        for j in range((n_m - ROLE + 1) // 2):
            m = 2 * j + ROLE
            base = _load_base_tile(base_ptr, oo, m * BB, batch, out_f, BB, mma)  # in flight while it waits
            if ROLE == 1:
                mbarrier.wait(turn.index(1), j & 1)  # role 0's j-th K loop is issued
            else:
                mbarrier.wait(turn.index(0), (j + 1) & 1, pred=j > 0)  # role 1's (j-1)-th
            acc = gl.zeros((BO, BB), dtype=gl.float32, layout=mma)
            for k in range(KSTEPS):
                if ROLE == 0:
                    if j == 0:  # the first batch tile: hash the even K steps, wait for the odd ones
                        if k % 2 == 0:
                            _slab_hash_step(slab, k, c, lane_k, DT, ROW_SCALED)
                            gl.thread_barrier()
                            c += c_step
                            c += c_step
                        else:
                            mbarrier.wait(slab_ready.index(k // 2), 0)
                it = m * KSTEPS + k
                mbarrier.wait(bars.index(it % STAGES), (it // STAGES) & 1)
                acc = warpgroup_mma(slab.index(k), x_s.index(it % STAGES).permute((1, 0)), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                if k > 0:  # x tile it - 1's wgmma is complete: its slot takes tile it - 1 + STAGES
                    _slab_x_load(x_desc, x_s, bars, it - 1 + STAGES, total, KSTEPS, STAGES)
            mbarrier.arrive(turn.index(1 - ROLE), count=1)  # the other role's K loop may issue now
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            # This tile's last slot (the next tile's first wgmma may already be in flight, so the
            # other role, which cannot tell when this one completes, leaves it to this one).
            _slab_x_load(x_desc, x_s, bars, (m + 1) * KSTEPS - 1 + STAGES, total, KSTEPS, STAGES)
            acc = _unscale(acc, inv_ptr, m * BB, batch, ROW_SCALED)
            if HAS_BIAS:
                acc = acc + nb[:, None]
            _store_tile(acc, base, oo, m * BB, out_ptr, batch, out_f, stride_op, stride_ob, i0, sigma, ANTITHETIC)

    @gluon.jit
    def _noise_slab_kernel(
        x_desc, base_ptr, out_ptr, seeds_ptr, inv_ptr,
        batch, in_f, out_f, stride_op, stride_ob,
        sigma, w_offset, b_offset, n_tiles,
        HAS_BIAS: gl.constexpr, ANTITHETIC: gl.constexpr, ROW_SCALED: gl.constexpr, BO: gl.constexpr,
        KSTEPS: gl.constexpr, STAGES: gl.constexpr, WORKER_REGS: gl.constexpr, num_warps: gl.constexpr,
    ):
        """One program per (individual, output tile), looping over all batch tiles in ping-pong.

        The BO x in_f noise slab is hashed once into shared memory and read by
        every batch tile. Two warpgroups (the default partition and one worker)
        take alternate batch tiles, each with its own accumulator; their K loops
        take turns (the `turn` mbarriers), so one warpgroup's epilogue (base
        loads, output stores) runs while the other's wgmmas keep the tensor
        cores busy. Both draw x tiles from one TMA ring in tile order. The slab
        is hashed during the first tile: role 1 hashes the odd K steps while
        role 0 hashes the even ones inside its K loop.
        """
        BB: gl.constexpr = x_desc.block_type.shape[0]
        BK: gl.constexpr = x_desc.block_type.shape[1]
        DT: gl.constexpr = x_desc.dtype
        NODD: gl.constexpr = (KSTEPS + 1) // 2  # slab_ready barriers: one per odd K step (at least one)
        slab = gl.allocate_shared_memory(DT, [KSTEPS, BO, BK], x_desc.layout)
        x_s = gl.allocate_shared_memory(DT, [STAGES, BB, BK], x_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        slab_ready = gl.allocate_shared_memory(gl.int64, [NODD, 1], mbarrier.MBarrierLayout())
        for j in gl.static_range(STAGES):
            mbarrier.init(bars.index(j), count=1)
        for j in gl.static_range(2):
            mbarrier.init(turn.index(j), count=1)
        for j in gl.static_range(NODD):
            mbarrier.init(slab_ready.index(j), count=1)
        gl.warp_specialize([
            (_slab_role, (0, x_desc, slab, x_s, bars, turn, slab_ready, base_ptr, out_ptr, seeds_ptr, inv_ptr,
                          batch, in_f, out_f, stride_op, stride_ob, sigma, w_offset, b_offset, n_tiles, HAS_BIAS,
                          ANTITHETIC, ROW_SCALED, BO, KSTEPS, STAGES)),
            (_slab_role, (1, x_desc, slab, x_s, bars, turn, slab_ready, base_ptr, out_ptr, seeds_ptr, inv_ptr,
                          batch, in_f, out_f, stride_op, stride_ob, sigma, w_offset, b_offset, n_tiles, HAS_BIAS,
                          ANTITHETIC, ROW_SCALED, BO, KSTEPS, STAGES)),
        ], [4], [WORKER_REGS])


def applies(x: torch.Tensor, precision: str, antithetic: bool = False) -> bool:
    """Whether these kernels serve a shared-x call (the launcher falls back otherwise).

    Needs Gluon, a Hopper GPU (wgmma), a single-instruction dot precision
    (tf32 or 16-bit inputs), a batch over 128 and a TMA-compatible x (16-byte
    aligned base and row stride, unit inner stride), or float32 x that its
    row-scaled float16 copy serves (any strides).
    """
    if x.shape[0] <= 128 or gluon is None or _failed or not x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1":
        return False  # the batch first: the cheapest check, and it decides the B <= 128 calls
    if compute_capability(x.device)[0] != 9:
        return False
    if x.dtype == torch.float32:
        if precision != "tf32":
            return False
        if row_scaled_fp16.serves(x, antithetic):
            return True  # any strides: the kernels read the float16 copy
    es = x.element_size()
    return x.stride(1) == 1 and (x.stride(0) * es) % 16 == 0 and x.data_ptr() % 16 == 0


def launch(x, base, out, seeds, sigma, w_offset, b_offset, has_bias, antithetic) -> bool:
    """out[i] = base + sigma * (x @ N_i^T + nb_i) (and base - ... for the pair's mirror).

    Returns False, with a one-time warning, if this triton's Gluon cannot build
    the kernel (Gluon is experimental and its API moves between releases; the
    kernel is tested with triton 3.6); the caller then runs the tl.dot kernel.
    """
    global _failed
    try:
        _launch(x, base, out, seeds, sigma, w_offset, b_offset, has_bias, antithetic)
    except (triton.CompilationError, TypeError, AttributeError, ValueError) as e:
        _failed = True
        warnings.warn(f"virtual_noise: the Gluon large-batch kernel does not build with triton "
                      f"{triton.__version__} ({type(e).__name__}: {e}); using the tl.dot kernel", RuntimeWarning)
        return False
    return True


def _noise_slab_stages(x, programs: int) -> int:
    """The x-ring depth _noise_slab_kernel serves this x with, or 0 where it does not: it needs
    several batch tiles to reuse the slab over (batch > 256), the slab plus an x ring of at least
    3 stages within the device's shared memory per program (fp32 in_f <= 704, 16-bit <= 1408 on
    Hopper), and at least one program per SM (fewer leave SMs idle that the per-tile grid would use)."""
    batch, in_f = x.shape
    if batch <= BB or programs < SLAB_MIN_PROGRAMS_PER_SM * sm_count(x.device):
        return 0
    es, bk = x.element_size(), 128 // x.element_size()
    slab = BO * cdiv(in_f, bk) * bk * es
    stages = (max_shared_memory(x.device) - 1024 - slab) // (SLAB_BB * bk * es)  # 1 KiB: the mbarriers
    return min(stages, SLAB_STAGES[0]) if stages >= SLAB_STAGES[1] else 0


def _launch(x, base, out, seeds, sigma, w_offset, b_offset, has_bias, antithetic):
    inv_scale = None
    if x.dtype == torch.float32 and row_scaled_fp16.serves(x, antithetic):
        x, inv_scale = row_scaled_fp16.row_scaled_fp16(x)
    batch, in_f = x.shape
    out_f = out.shape[-1]
    bk = 128 // x.element_size()  # 128-byte rows: the widest TMA / wgmma swizzle
    layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8 * x.element_size(), rank=2)
    n_tiles = cdiv(out_f, BO)
    slab_stages = _noise_slab_stages(x, seeds.numel() * n_tiles)
    x_desc = TensorDescriptor(x, list(x.shape), list(x.stride()), [SLAB_BB if slab_stages else BB, bk], layout)
    args = (x_desc, base, out, seeds, inv_scale if inv_scale is not None else base, batch, in_f, out_f,
            out.stride(0), out.stride(1), float(sigma), w_offset, b_offset, n_tiles)
    row_scaled = inv_scale is not None
    if slab_stages:
        _noise_slab_kernel[(seeds.numel() * n_tiles,)](
            *args, HAS_BIAS=has_bias, ANTITHETIC=antithetic, ROW_SCALED=row_scaled, BO=BO, KSTEPS=cdiv(in_f, bk),
            STAGES=slab_stages, WORKER_REGS=SLAB_WORKER_REGS, num_warps=4)
        return
    _large_batch_kernel[(seeds.numel() * n_tiles, cdiv(batch, BB))](
        *args, HAS_BIAS=has_bias, ANTITHETIC=antithetic, ROW_SCALED=row_scaled, BO=BO, STAGES=STAGES, num_warps=WARPS)
