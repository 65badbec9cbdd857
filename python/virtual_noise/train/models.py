"""The main job's networks: plain torch modules (their state_dicts load without virtual_noise)."""

from __future__ import annotations

import torch
from torch import nn


def mlp(sizes: list[int], activation=nn.Tanh) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)


class DigitsCNN(nn.Module):
    """Two 3x3 convolutions (the second strided) and a linear head on 8x8 digits given as 64 pixels."""

    def __init__(self, channels: list[int] = (8, 16), classes: int = 10):
        super().__init__()
        c1, c2 = channels
        self.conv1 = nn.Conv2d(1, c1, 3, padding=1)
        self.conv2 = nn.Conv2d(c1, c2, 3, stride=2, padding=1)
        self.head = nn.Linear(c2 * 4 * 4, classes)

    def forward(self, x):
        h = x.view(*x.shape[:-1], 1, 8, 8).flatten(0, -4)
        h = torch.tanh(self.conv2(torch.tanh(self.conv1(h))))
        return self.head(h.flatten(1)).view(*x.shape[:-1], -1)


class DigitsViT(nn.Module):
    """A small vision transformer: 4x4 patch embedding, a class token, a positional parameter,
    pre-norm encoder layers (nn.MultiheadAttention, ReLU MLP, LayerNorm) and a linear head."""

    def __init__(self, width: int = 32, heads: int = 4, depth: int = 1, patch: int = 4, classes: int = 10):
        super().__init__()
        self.patch = patch
        tokens = (8 // patch) ** 2
        self.embed = nn.Conv2d(1, width, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.pos = nn.Parameter(torch.randn(1, tokens + 1, width) * 0.02)
        self.encoder = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0, batch_first=True,
                                       norm_first=True) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        lead = x.shape[:-1]
        h = self.embed(x.reshape(-1, 1, 8, 8)).flatten(2).transpose(1, 2)  # (N, tokens, width)
        h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1) + self.pos
        for layer in self.encoder:
            h = layer(h)
        return self.head(self.norm(h[:, 0])).view(*lead, -1)
