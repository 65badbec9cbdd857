"""A module's parameters as one flat noise space, and its population forward.

Parameter blocks follow ``module.named_parameters()`` order (the order of
``torch.nn.utils.parameters_to_vector``); block k owns noise indices
``offsets[k] .. offsets[k] + numel``. An nn.Linear registers weight then bias,
so its bias region starts at weight offset + out*in, as
``virtual_perturbed_linear`` expects.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..offsets import compute_offsets
from ..ops import generate_noise, virtual_perturbed_linear

# Modules applied element-wise: the same function for every individual.
ELEMENTWISE = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.Tanh, nn.Sigmoid, nn.GELU, nn.SiLU, nn.ELU, nn.Softplus,
    nn.Mish, nn.Hardtanh, nn.Identity,
)


@dataclass(frozen=True)
class Block:
    """One parameter tensor in the flat noise space."""

    name: str
    param: nn.Parameter
    offset: int

    @property
    def numel(self) -> int:
        return self.param.numel()


def _flatten(module: nn.Module, prefix: str = "") -> list[tuple[str, nn.Module]]:
    if isinstance(module, nn.Sequential):
        out = []
        for name, child in module.named_children():
            out += _flatten(child, f"{prefix}{name}.")
        return out
    return [(prefix.rstrip("."), module)]


class VirtualPopulation:
    """Runs a population of perturbed copies of ``module`` without storing any copy.

    Supported: nn.Linear (fused virtual noise), nn.LayerNorm (its small weight
    and bias perturbed through materialized noise) and element-wise
    activations, in nn.Sequential containers (nested ones too). Anything else
    is rejected with an error naming the layer.
    """

    def __init__(self, module: nn.Module):
        self.module = module
        self.layers = _flatten(module)
        for name, layer in self.layers:
            if not isinstance(layer, (nn.Linear, nn.LayerNorm) + ELEMENTWISE):
                kind = type(layer).__name__
                hint = ("it has parameters that have no virtual-noise path" if any(True for _ in layer.parameters())
                        else "it is not an element-wise activation")
                raise TypeError(
                    f"VirtualPopulation: layer '{name or '<root>'}' ({kind}) is not supported: {hint}. "
                    f"Supported: nn.Linear, nn.LayerNorm and element-wise activations "
                    f"({', '.join(c.__name__ for c in ELEMENTWISE)}) inside nn.Sequential."
                )
        named = list(module.named_parameters())
        offsets = compute_offsets([p.shape for _, p in named])
        self.blocks = [Block(n, p, o) for (n, p), o in zip(named, offsets)]
        self._offset_of = {id(b.param): b.offset for b in self.blocks}
        self.n_params = sum(b.numel for b in self.blocks)

    def offset_of(self, param: Tensor) -> int:
        return self._offset_of[id(param)]

    @torch.no_grad()
    def forward(self, x: Tensor, seeds: Tensor, sigma: float, antithetic: bool = True) -> Tensor:
        """(batch, in) or (P, batch, in) inputs to (P, batch, out) outputs.

        With sigma = 0 every individual is the center.
        """
        pop = seeds.numel() * (2 if antithetic else 1)
        h = x
        for _, layer in self.layers:
            if isinstance(layer, nn.Linear):
                h = virtual_perturbed_linear(h, layer.weight, layer.bias, seeds, sigma,
                                             self.offset_of(layer.weight), antithetic=antithetic)
            elif isinstance(layer, nn.LayerNorm):
                h = self._layer_norm(layer, h, seeds, sigma, antithetic, pop)
            else:
                h = layer(h)
        return h

    __call__ = forward

    def _perturbed_small(self, p: Tensor, seeds: Tensor, sigma: float, antithetic: bool) -> Tensor:
        noise = generate_noise(seeds, p.numel(), self.offset_of(p)).to(p.dtype)
        if antithetic:
            noise = torch.stack([noise, -noise], dim=1).flatten(0, 1)
        return p.reshape(1, -1) + sigma * noise  # (P, numel)

    def _layer_norm(self, ln: nn.LayerNorm, h, seeds, sigma, antithetic, pop):
        if h.dim() == 2:
            h = h.expand(pop, *h.shape)
        h = F.layer_norm(h, ln.normalized_shape, None, None, ln.eps)
        shape = (pop,) + (1,) * (h.dim() - 1 - len(ln.normalized_shape)) + tuple(ln.normalized_shape)
        if ln.weight is not None:
            h = h * self._perturbed_small(ln.weight, seeds, sigma, antithetic).view(shape)
        if ln.bias is not None:
            h = h + self._perturbed_small(ln.bias, seeds, sigma, antithetic).view(shape)
        return h


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
