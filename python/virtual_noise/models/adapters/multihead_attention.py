"""nn.MultiheadAttention: its projections through the fused perturbed linear.

nn.MultiheadAttention does not call its projections as modules: it hands the
raw in_proj / out_proj weights to F.multi_head_attention_forward (or to a
fused native kernel). This adapter is that function written for one
individual, with every projection through ``population_linear`` at the noise
offsets of the slices it uses: rows [i*E, (i+1)*E) of in_proj_weight start at
its offset + i*E*E, and of in_proj_bias at its offset + i*E. Masks (boolean or
float, key padding, causal), bias_k / bias_v, add_zero_attn, need_weights,
batch_first and unbatched inputs follow torch's semantics.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..bridge import population_linear


def _float_mask(mask, dtype):
    if mask is None or torch.is_floating_point(mask):
        return mask
    return torch.zeros_like(mask, dtype=dtype).masked_fill_(mask, float("-inf"))


def _shift(offset, by):
    return None if offset is None else offset + by


class MultiheadAttentionAdapter:
    name = "nn.MultiheadAttention"
    claims = ("in_proj_weight", "in_proj_bias", "q_proj_weight", "k_proj_weight", "v_proj_weight")
    lowrank_weight = False

    def matches(self, module) -> bool:
        # A subclass with its own forward may do more than this adapter knows.
        return isinstance(module, nn.MultiheadAttention) and type(module).forward is nn.MultiheadAttention.forward

    def _projections(self, m, ctx, query, key, value):
        E = m.embed_dim
        b, b_off = m.in_proj_bias, ctx.offset(m.in_proj_bias)
        if m._qkv_same_embed_dim:
            w, w_off = m.in_proj_weight, ctx.offset(m.in_proj_weight)
            if query is key and key is value:  # self-attention: one packed projection, bias fused
                return population_linear(ctx, query, w, b, w_off, b_off).chunk(3, dim=-1)
            weights = [(w[i * E:(i + 1) * E], _shift(w_off, i * E * E)) for i in range(3)]
        else:
            weights = [(p, ctx.offset(p)) for p in (m.q_proj_weight, m.k_proj_weight, m.v_proj_weight)]
        return [population_linear(ctx, x, wi, None if b is None else b[i * E:(i + 1) * E], wi_off,
                                  _shift(b_off, i * E))
                for i, (x, (wi, wi_off)) in enumerate(zip((query, key, value), weights))]

    def forward(self, m, ctx, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        if m.training and m.dropout > 0:
            raise ValueError("VirtualPopulation: nn.MultiheadAttention in training mode applies dropout, whose "
                             "random draws a batched population pass does not define; call model.eval() "
                             "(or use dropout=0)")
        batched_input = query.dim() == 3
        if m.batch_first and batched_input:  # keep the identity of q / k / v, as torch does
            if key is value:
                if query is key:
                    query = key = value = query.transpose(1, 0)
                else:
                    query, key = query.transpose(1, 0), key.transpose(1, 0)
                    value = key
            else:
                query, key, value = (t.transpose(1, 0) for t in (query, key, value))
        if not batched_input:
            same_kv, same_qk = key is value, query is key
            query = query.unsqueeze(1)
            key = query if same_qk else key.unsqueeze(1)
            value = key if same_kv else value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        tgt_len, bsz, E = query.shape
        H = m.num_heads
        hd = E // H
        key_padding_mask = _float_mask(key_padding_mask, query.dtype)
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint (as nn.MultiheadAttention)")
        if is_causal and key_padding_mask is None and not need_weights:
            attn_mask = None
        else:
            attn_mask = _float_mask(attn_mask, query.dtype)
            if key_padding_mask is not None:
                is_causal = False

        q, k, v = self._projections(m, ctx, query, key, value)
        if attn_mask is not None and attn_mask.dim() == 2:
            attn_mask = attn_mask.unsqueeze(0)
        if m.bias_k is not None and m.bias_v is not None:
            k = torch.cat([k, m.bias_k.repeat(1, bsz, 1)])
            v = torch.cat([v, m.bias_v.repeat(1, bsz, 1)])
            if attn_mask is not None:
                attn_mask = F.pad(attn_mask, (0, 1))
            if key_padding_mask is not None:
                key_padding_mask = F.pad(key_padding_mask, (0, 1))
        q = q.reshape(tgt_len, bsz * H, hd).transpose(0, 1)
        k = k.reshape(k.shape[0], bsz * H, hd).transpose(0, 1)
        v = v.reshape(v.shape[0], bsz * H, hd).transpose(0, 1)
        if m.add_zero_attn:
            zeros = torch.zeros(bsz * H, 1, hd, dtype=k.dtype, device=k.device)
            k, v = torch.cat([k, zeros], dim=1), torch.cat([v, zeros], dim=1)
            if attn_mask is not None:
                attn_mask = F.pad(attn_mask, (0, 1))
            if key_padding_mask is not None:
                key_padding_mask = F.pad(key_padding_mask, (0, 1))
        src_len = k.shape[1]
        if key_padding_mask is not None:
            kpm = key_padding_mask.reshape(bsz, 1, 1, src_len).expand(-1, H, -1, -1).reshape(bsz * H, 1, src_len)
            attn_mask = kpm if attn_mask is None else attn_mask + kpm

        if need_weights:
            scores = torch.bmm(q * math.sqrt(1.0 / hd), k.transpose(-2, -1))
            if attn_mask is not None:
                scores = scores + attn_mask
            weights = torch.softmax(scores, dim=-1)
            out = torch.bmm(weights, v).transpose(0, 1).reshape(tgt_len * bsz, E)
            weights = weights.reshape(bsz, H, tgt_len, src_len)
            if average_attn_weights:
                weights = weights.mean(dim=1)
        else:
            if attn_mask is not None:
                attn_mask = attn_mask.unsqueeze(0) if attn_mask.shape[0] == 1 else attn_mask.reshape(bsz, H, -1, src_len)
            out = F.scaled_dot_product_attention(q.reshape(bsz, H, tgt_len, hd), k.reshape(bsz, H, src_len, hd),
                                                 v.reshape(bsz, H, src_len, hd), attn_mask, 0.0, is_causal)
            out = out.permute(2, 0, 1, 3).reshape(bsz * tgt_len, E)
            weights = None
        o = m.out_proj
        out = population_linear(ctx, out, o.weight, o.bias, ctx.offset(o.weight), ctx.offset(o.bias),
                                rank=ctx.rank(o.weight))
        out = out.reshape(tgt_len, bsz, E)
        if not batched_input:
            out = out.squeeze(1)
            weights = weights.squeeze(0) if weights is not None else None
        elif m.batch_first:
            out = out.transpose(1, 0)
        return out, weights
