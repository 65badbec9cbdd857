"""Which parameters evolve, and where each one's noise lives in the flat index space.

The evolved parameters, in ``model.named_parameters()`` order (a tied parameter
once, under the name named_parameters yields first), are laid end to end:
block k owns the noise indices ``offsets[k] .. offsets[k] + numel`` with
offsets from ``compute_offsets``, and element e of the parameter flattened
row-major gets ``noise(seed, offset + e)``. Frozen parameters take no indices.
For an nn.Linear this is weight (out, in) then bias, the layout
``virtual_perturbed_linear`` expects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from torch import nn

from ..offsets import compute_offsets

#: ``evolve`` argument: None (every parameter with requires_grad), parameter names, or a predicate.
Evolve = None | Iterable[str] | Callable[[str, nn.Parameter], bool]


@dataclass(frozen=True)
class Block:
    """One evolved parameter tensor in the flat noise space."""

    name: str
    param: nn.Parameter
    offset: int

    @property
    def numel(self) -> int:
        return self.param.numel()


def evolved_blocks(model: nn.Module, evolve: Evolve = None) -> list[Block]:
    """The evolved parameters of ``model`` as blocks with their noise offsets."""
    named = list(model.named_parameters())
    if evolve is None:
        chosen = [(n, p) for n, p in named if p.requires_grad]
    elif callable(evolve):
        chosen = [(n, p) for n, p in named if evolve(n, p)]
    else:
        if isinstance(evolve, str):
            raise TypeError(f"VirtualPopulation: `evolve` must be a list of parameter names or a predicate "
                            f"(name, param) -> bool; got the string {evolve!r} (wrap it in a list)")
        # Aliases of tied parameters select the one parameter they name.
        by_name = dict(model.named_parameters(remove_duplicate=False))
        wanted = list(evolve)
        unknown = [n for n in wanted if n not in by_name]
        if unknown:
            raise ValueError(f"VirtualPopulation: `evolve` names parameters the model does not have: "
                             f"{', '.join(map(repr, unknown[:5]))}{' ...' if len(unknown) > 5 else ''} "
                             f"(see model.named_parameters())")
        ids = {id(by_name[n]) for n in wanted}
        chosen = [(n, p) for n, p in named if id(p) in ids]
    offsets = compute_offsets([tuple(p.shape) for _, p in chosen])
    return [Block(n, p, o) for (n, p), o in zip(chosen, offsets)]
