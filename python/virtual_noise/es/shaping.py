"""Fitness shaping: the transforms ES applies to raw fitness before the estimate."""

from __future__ import annotations

import torch
from torch import Tensor


def centered_ranks(fitness: Tensor) -> Tensor:
    """Ranks mapped to [-0.5, 0.5] (OpenAI-ES): invariant to fitness scale and outliers.

    Ties are broken by position, so the result is deterministic.
    """
    n = fitness.numel()
    if n < 2:
        return torch.zeros_like(fitness, dtype=torch.float32)
    ranks = torch.empty(n, dtype=torch.float32, device=fitness.device)
    ranks[torch.argsort(fitness, stable=True)] = torch.arange(n, dtype=torch.float32, device=fitness.device)
    return ranks / (n - 1) - 0.5


def z_score(fitness: Tensor, eps: float = 1e-8) -> Tensor:
    f = fitness.float()
    if f.numel() < 2:
        return torch.zeros_like(f)
    return (f - f.mean()) / (f.std() + eps)


def raw(fitness: Tensor) -> Tensor:
    return fitness.float()


SHAPINGS = {"centered_ranks": centered_ranks, "z_score": z_score, "raw": raw}


def shape_fitness(fitness: Tensor, method: str) -> Tensor:
    try:
        fn = SHAPINGS[method]
    except KeyError:
        raise ValueError(f"fitness_shaping must be one of {sorted(SHAPINGS)}; got {method!r}") from None
    return fn(fitness)
