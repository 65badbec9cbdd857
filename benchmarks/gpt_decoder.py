"""A GPT-2-small-shaped decoder in plain torch (12 layers, width 768, 12 heads, vocabulary 50257,
context 1024): token and position embeddings, causal attention with nn.Linear projections,
LayerNorm, GELU MLP, a head tied to the token embedding. The model of the model-level benchmarks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, h):
        B, T, C = h.shape
        q, k, v = self.qkv(self.ln1(h)).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        h = h + self.proj(a)
        return h + self.out(F.gelu(self.fc(self.ln2(h)), approximate="tanh"))


class GPTDecoder(nn.Module):
    def __init__(self, layers: int = 12, width: int = 768, heads: int = 12, vocab: int = 50257, context: int = 1024):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids):
        h = self.tok(ids) + self.pos(torch.arange(ids.shape[-1], device=ids.device))
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h))
