"""From per-individual code to the fused population operators.

``VirtualPopulation`` runs a model under ``torch.func.vmap`` over the
individuals, so the model's own code (reshapes, attention, residuals, masks)
runs as written, for one individual at a time in meaning and for all of them
at once in fact. The perturbed layers cannot be written per individual: their
weights differ by individual and are never stored. ``population_call`` is the
bridge: an autograd.Function whose vmap rule receives the batched arguments
with the population dimension in front, runs one fused operator over the
whole population, and hands vmap back an output with the population in front.
The batched token (one entry per individual) is always among its arguments, so
the rule runs even when every other argument is shared by the population.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..ops import (generate_noise, virtual_lowrank_perturbed_linear, virtual_perturbed_embedding,
                   virtual_perturbed_linear)
from .context import PopulationContext


class _PopulationCall(torch.autograd.Function):
    generate_vmap_rule = False

    @staticmethod
    def forward(fn, token, *tensors):
        raise RuntimeError("virtual_noise: a population layer ran outside VirtualPopulation's batched call")

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def vmap(info, in_dims, fn, token, *tensors):
        from .context import active

        dims = in_dims[2:]
        moved = [t if d is None else t.movedim(d, 0) for t, d in zip(tensors, dims)]
        return _run_rule(active(), fn, [d is not None for d in dims], moved), 0


def _run_rule(ctx: PopulationContext, fn, batched: list[bool], tensors: list[Tensor]) -> Tensor:
    """fn over the whole population, with the model's per-individual semantics suspended meanwhile."""
    ctx.rule_depth += 1
    try:
        return fn(batched, *tensors)
    finally:
        ctx.rule_depth -= 1


try:  # functorch's own primitives (torch >= 2.0): unwrap a batched tensor at one vmap level, and wrap back
    from torch._C._functorch import _add_batch_dim, _unwrap_batched, is_batchedtensor, maybe_get_level
except ImportError:  # pragma: no cover - depends on the installed torch
    _unwrap_batched = None


def population_call(ctx: PopulationContext, fn, *tensors: Tensor) -> Tensor:
    """``fn(batched, *tensors)`` over the whole population: ``batched[k]`` says whether tensors[k]
    has the population in front (else it is shared); fn returns a tensor with the population in front.

    With functorch's primitives the batched arguments are unwrapped at the population's vmap level
    directly: autograd.Function's vmap path costs ~0.4 ms of host time per call (signature binding
    and pytree handling; 63 calls made a 12-layer decoder's forward 30 ms of host work on the CPU
    machine, docs/models.md), which bound the GPU forward at small populations.
    """
    level = ctx.level
    if _unwrap_batched is None or level is None:
        return _PopulationCall.apply(fn, ctx.token, *tensors)
    batched, plain = [], []
    for t in tensors:
        if is_batchedtensor(t) and maybe_get_level(t) == level:
            value, dim = _unwrap_batched(t, level)
            plain.append(value.movedim(dim, 0))
            batched.append(True)
        elif is_batchedtensor(t):  # batched by a vmap of the model's own: the general path
            return _PopulationCall.apply(fn, ctx.token, *tensors)
        else:
            plain.append(t)
            batched.append(False)
    return _add_batch_dim(_run_rule(ctx, fn, batched, plain), 0, level)


def _bias_term(ctx: PopulationContext, bias: Tensor | None, b_off: int | None):
    """The bias each individual adds: (P, 1, out) perturbed, (out,) frozen, or None."""
    if bias is None:
        return None
    if b_off is None:
        return bias
    return ctx.perturbed(bias, b_off)[:, None, :]


def population_linear(ctx: PopulationContext, x: Tensor, weight: Tensor, bias: Tensor | None,
                      w_off: int | None, b_off: int | None, transposed: bool = False, rank: int = 0) -> Tensor:
    """Per individual: ``x @ (W + sigma N_i)^T + (b + sigma nb_i)`` (``x @ (W + ...)`` with transposed).

    ``w_off`` / ``b_off`` are the noise offsets of weight and bias, None where frozen. A bias whose
    region follows the weight's (an nn.Linear's own layout) is fused into the operator; any other
    evolved bias is small and added materialized. ``rank`` > 0: the weight's noise is low rank.
    """
    if w_off is None and b_off is None:  # nothing evolved here: the layer as it is
        y = x @ weight if transposed else F.linear(x, weight)
        return y if bias is None else y + bias
    in_f, out_f = (weight.shape if transposed else weight.shape[::-1])
    fuse = w_off is not None and b_off is not None and b_off == w_off + weight.numel()

    def rule(batched, xb):
        P = ctx.size
        lead = xb.shape[1:-1] if batched[0] else xb.shape[:-1]
        x2 = xb.reshape(P, -1, in_f) if batched[0] else xb.reshape(-1, in_f)
        if w_off is not None and rank:
            y = virtual_lowrank_perturbed_linear(x2, weight, bias if fuse else None, ctx.seeds, ctx.sigma, w_off, rank,
                                                 antithetic=ctx.antithetic, transposed=transposed)
        elif w_off is not None:
            y = virtual_perturbed_linear(x2, weight, bias if fuse else None, ctx.seeds, ctx.sigma, w_off,
                                         antithetic=ctx.antithetic, transposed=transposed)
        else:
            y = x2 @ weight if transposed else F.linear(x2, weight)
        if not fuse:
            b = _bias_term(ctx, bias, b_off)
            if b is not None:
                y = y + b
        return y.reshape(P, *lead, out_f)

    return population_call(ctx, rule, x)


def population_embedding(ctx: PopulationContext, indices: Tensor, weight: Tensor, w_off: int,
                         rank: int = 0) -> Tensor:
    """Per individual: rows ``indices`` of ``W + sigma N_i`` (only those rows hashed). ``rank`` > 0: N_i is
    the low-rank ``sqrt(12/r) A_i @ B_i^T`` of the (num_embeddings, dim) block (docs/lowrank.md), the same
    noise a head tied to this table sees through the low-rank linear operator."""
    dim = weight.shape[1]

    def rule(batched, ib):
        P = ctx.size
        lead = ib.shape[1:] if batched[0] else ib.shape
        flat = ib.reshape(P, -1) if batched[0] else ib.reshape(-1)
        if rank:
            y = _lowrank_embedding(ctx, flat, weight, w_off, rank)
        else:
            y = virtual_perturbed_embedding(flat, weight, ctx.seeds, ctx.sigma, w_off, antithetic=ctx.antithetic)
        return y.view(P, *lead, dim)

    return population_call(ctx, rule, indices)


def _lowrank_embedding(ctx: PopulationContext, flat: Tensor, weight: Tensor, w_off: int, rank: int) -> Tensor:
    """(P, n, dim): W[idx] + s_i sigma sqrt(12/r) A_i[idx] @ B_i^T from the fused operators. A_i's rows are the
    (rows, r) block at w_off read through the perturbed gather of a zero table (sigma 1: the noise itself,
    antithetic signs included); B_i is generated whole (dim x r per seed, small)."""
    rows, dim = weight.shape
    zeros = weight.new_zeros(rows, rank, dtype=torch.float32)
    a = virtual_perturbed_embedding(flat, zeros, ctx.seeds, 1.0, w_off, antithetic=ctx.antithetic)  # (P, n, r)
    b = generate_noise(ctx.seeds, dim * rank, w_off + rows * rank).view(-1, dim, rank)
    if ctx.antithetic:
        b = b.repeat_interleave(2, dim=0)
    term = torch.bmm(a, b.transpose(1, 2))  # (P, n, dim)
    base = F.embedding(flat, weight).float()
    return (base + (ctx.sigma * math.sqrt(12.0 / rank)) * term).to(weight.dtype)


def _flatten_population(t: Tensor, batched: bool, P: int, rank: int, lead: int | None) -> Tensor:
    """(P, *s) (or shared s, expanded) to the shape one call over the whole population takes: the
    population folded into the first dim when the per-individual rank is >= 3, else in front."""
    if not batched:
        t = t.expand(P, *t.shape)
    if rank < 3:
        return t
    if lead is not None and t.shape[1] != lead:
        t = t.expand(P, lead, *t.shape[2:])
    return t.reshape(P * t.shape[1], *t.shape[2:])


def population_sdpa(ctx: PopulationContext, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None, enable_gqa=False):
    """F.scaled_dot_product_attention of every individual as one call with the population folded into
    the batch dim. (vmap has no batching rule for the CPU attention kernels in torch 2.11-2.13 and falls
    back to one call per individual.) A shared mask that broadcasts over the batch stays unexpanded."""
    if dropout_p:
        return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                                              enable_gqa=enable_gqa)  # vmap reports the random draws
    tensors = [query, key, value] + ([attn_mask] if attn_mask is not None else [])

    def rule(batched, q, k, v, *mask):
        P = ctx.size
        rank = q.dim() - batched[0]  # per individual
        lead = (q.shape[1] if batched[0] else q.shape[0]) if rank >= 3 else None
        qf, kf, vf = (_flatten_population(t, b, P, rank, lead) for t, b in zip((q, k, v), batched))
        m = None
        if mask:
            m, mb = mask[0], batched[3]
            m = m.reshape(*m.shape[:int(mb)], *[1] * (rank - (m.dim() - mb)), *m.shape[int(mb):])  # to rank
            if mb or (rank >= 3 and m.shape[0] != 1):
                m = _flatten_population(m, mb, P, rank, lead)
        out = F.scaled_dot_product_attention(qf, kf, vf, m, 0.0, is_causal, scale=scale, enable_gqa=enable_gqa)
        return out.reshape(P, *out.shape[1:]) if rank < 3 else out.reshape(P, lead, *out.shape[1:])

    return population_call(ctx, rule, *tensors)
