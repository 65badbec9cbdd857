"""The population forward (``virtual_noise.models.VirtualPopulation``) and the flat center.

``center_vector`` / ``load_center`` convert a module's parameters, in
``named_parameters()`` order (the order of ``parameters_to_vector``), to and
from one flat vector.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..models import Block, VirtualPopulation

__all__ = ["Block", "VirtualPopulation", "center_vector", "load_center"]


def center_vector(module: nn.Module) -> Tensor:
    """The flat center (all parameters, named_parameters order)."""
    return torch.nn.utils.parameters_to_vector(module.parameters()).detach().clone()


def load_center(module: nn.Module, center: Tensor) -> nn.Module:
    """Write a flat center back into ``module``'s parameters (inverse of center_vector)."""
    n = sum(p.numel() for p in module.parameters())
    if center.dim() != 1 or center.numel() != n:
        raise ValueError(f"load_center: center must be 1-D with {n} elements; got shape {tuple(center.shape)}")
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(center.to(next(module.parameters()).dtype), module.parameters())
    return module
