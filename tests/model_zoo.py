"""Small models of every layer kind the population forward supports, for the exactness tests."""

from __future__ import annotations

import math
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))


def GPTDecoder(vocab=40, width=32, heads=4, layers=2, context=16):
    """benchmarks/gpt_decoder.py's decoder (token and position embeddings, causal attention with nn.Linear
    projections, LayerNorm, GELU MLP, a head tied to the token embedding), small."""
    from gpt_decoder import GPTDecoder as Decoder

    return Decoder(layers=layers, width=width, heads=heads, vocab=vocab, context=context)


class CNNPolicy(nn.Module):
    """Strided Conv2d layers and a Linear head, as Atari-style ES policies."""

    def __init__(self, actions=4):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 4, stride=2)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.head = nn.Linear(8 * 4 * 4, actions)

    def forward(self, x):
        return self.head(torch.relu(self.conv2(torch.relu(self.conv1(x)))).flatten(1))


class ResBlock(nn.Module):
    """GroupNorm, a grouped 3x3 conv, a dilated 'same' conv with reflect padding, a residual, a Conv1d."""

    def __init__(self, c=8):
        super().__init__()
        self.norm = nn.GroupNorm(2, c)
        self.grouped = nn.Conv2d(c, c, 3, padding=1, groups=4)
        self.dilated = nn.Conv2d(c, c, 3, padding="same", dilation=2, padding_mode="reflect", bias=False)
        self.seq = nn.Conv1d(c, 4, 2, padding="same")
        self.out = nn.Linear(4, 3)

    def forward(self, x):
        h = x + self.dilated(torch.relu(self.grouped(self.norm(x))))
        s = self.seq(h.mean(-1))  # (N, 4, H)
        return self.out(s.transpose(1, 2))


class AttentionModel(nn.Module):
    """nn.MultiheadAttention: self-attention (batch_first) with masks, and cross-attention with kdim/vdim."""

    def __init__(self, width=16):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(width, 4, batch_first=True, add_bias_kv=True)
        self.cross = nn.MultiheadAttention(width, 2, kdim=12, vdim=10, add_zero_attn=True)
        self.mem_k, self.mem_v = nn.Linear(width, 12), nn.Linear(width, 10)

    def forward(self, x, key_padding_mask):
        T = x.shape[1]
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), 1)
        h, w = self.self_attn(x, x, x, key_padding_mask=key_padding_mask, attn_mask=causal, need_weights=True)
        hs = h.transpose(0, 1)  # (T, B, E): the cross-attention is not batch_first
        c, _ = self.cross(hs, self.mem_k(hs), self.mem_v(hs), need_weights=False)
        return c.transpose(0, 1) + h, w


class RMSNormModel(nn.Module):
    """RMSNorm, a raw scale parameter in the forward, and a dict output."""

    def __init__(self, width=24):
        super().__init__()
        self.up = nn.Linear(10, width)
        self.norm = nn.RMSNorm(width)
        self.scale = nn.Parameter(torch.ones(width) * 0.5)
        self.down = nn.Linear(width, 5)

    def forward(self, x):
        h = self.norm(F.silu(self.up(x))) * self.scale
        return {"out": self.down(h), "hidden": h}


def gpt_inputs(g, batch=2, t=9):
    return (torch.randint(0, 40, (batch, t), generator=g),), {}


def cnn_inputs(g, batch=2):
    return (torch.randn(batch, 3, 18, 18, generator=g),), {}


def res_inputs(g, batch=2):
    return (torch.randn(batch, 8, 7, 6, generator=g),), {}


def attention_inputs(g, batch=2, t=5):
    mask = torch.zeros(batch, t, dtype=torch.bool)
    mask[0, -2:] = True  # the first sequence's last two keys are padding
    return (torch.randn(batch, t, 16, generator=g), mask), {}


def rms_inputs(g, batch=3):
    return (torch.randn(batch, 4, 10, generator=g),), {}


ZOO = {
    "gpt": (GPTDecoder, gpt_inputs),
    "cnn": (CNNPolicy, cnn_inputs),
    "resblock": (ResBlock, res_inputs),
    "attention": (AttentionModel, attention_inputs),
    "rmsnorm": (RMSNormModel, rms_inputs),
}


def hf_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=32,
                                      bos_token_id=1, eos_token_id=2)).eval()


def hf_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                        max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
                                        pad_token_id=0)).eval()


def init_nonzero_(model, g):
    """Random values for every parameter (biases and norms too), so that no term is trivially zero."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(max(p.shape[-1], 1)) + (1.0 if p.dim() == 1 else 0))
    return model
