"""The population a batched call evaluates, as the layer adapters see it.

While ``VirtualPopulation`` runs a model, one ``PopulationContext`` is active:
the seeds, sigma, antithetic flag and population size, the noise offset of
every evolved parameter, and (inside ``torch.func.vmap``) the batched token
that lets the fused operators produce one output per individual.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import torch
from torch import Tensor
from torch.nn.functional import scaled_dot_product_attention as _SDPA
from torch.overrides import TorchFunctionMode

from ..ops import generate_noise

_state = threading.local()


class PopulationContext:
    def __init__(self, seeds: Tensor, sigma: float, antithetic: bool, offsets: dict[int, int],
                 ranks: dict[int, int] | None = None):
        self.seeds = seeds
        self.sigma = float(sigma)
        self.antithetic = antithetic
        self.size = seeds.numel() * (2 if antithetic else 1)
        self._offsets = offsets  # id(param) -> offset, evolved parameters only
        self._ranks = ranks or {}  # id(param) -> rank, low-rank blocks only
        self.token: Tensor | None = None  # set inside the batched call
        self.level: int | None = None  # the population's vmap level (of token)
        self.adapter_depth = 0  # inside a layer adapter's forward
        self.rule_depth = 0  # inside a batched rule (per-individual semantics suspended)
        self._materialized: dict[tuple[int, int], Tensor] = {}

    def offset(self, param: Tensor | None) -> int | None:
        """The noise offset of an evolved parameter; None for frozen ones (and None)."""
        return None if param is None else self._offsets.get(id(param))

    def rank(self, param: Tensor | None) -> int:
        """The noise rank of an evolved weight: 0 for full-rank noise."""
        return 0 if param is None else self._ranks.get(id(param), 0)

    def noise(self, numel: int, offset: int, device) -> Tensor:
        """float32 (P, numel): every individual's noise (mirrored pairs with antithetic)."""
        key = (offset, numel)
        if key not in self._materialized:
            n = generate_noise(self.seeds, numel, offset)
            if self.antithetic:
                n = torch.stack([n, -n], dim=1).flatten(0, 1)
            self._materialized[key] = n.to(device)
        return self._materialized[key]

    def perturbed(self, tensor: Tensor, offset: int) -> Tensor:
        """(P, *shape): tensor + sigma * s_i * noise, computed in float32 and rounded once to its dtype."""
        n = self.noise(tensor.numel(), offset, tensor.device)
        return (tensor.detach().float().reshape(1, -1) + self.sigma * n).to(tensor.dtype).view(-1, *tensor.shape)


def active() -> PopulationContext:
    ctx = getattr(_state, "ctx", None)
    if ctx is None:
        raise RuntimeError("virtual_noise: a population layer ran outside VirtualPopulation's batched call")
    return ctx


@contextmanager
def activate(ctx: PopulationContext):
    previous = getattr(_state, "ctx", None)
    _state.ctx = ctx
    try:
        yield ctx
    finally:
        _state.ctx = previous


@contextmanager
def in_adapter(ctx: PopulationContext):
    """Inside a layer adapter, the evolved parameters may be used (the guard below steps aside)."""
    ctx.adapter_depth += 1
    try:
        yield
    finally:
        ctx.adapter_depth -= 1


# Tensor metadata that reads no values: allowed on any parameter.
_METADATA_GETTERS = {"dtype", "shape", "device", "requires_grad", "ndim", "is_cuda", "is_meta", "layout",
                     "is_leaf", "grad_fn", "names", "is_sparse", "is_quantized", "itemsize", "nbytes", "grad",
                     "_base", "is_nested"}
_METADATA_METHODS = {"size", "dim", "numel", "nelement", "is_floating_point", "is_complex", "stride",
                     "is_contiguous", "element_size", "data_ptr", "get_device", "storage_offset", "__hash__",
                     "__repr__", "__format__", "__len__", "untyped_storage"}


def _op_name(func) -> str:
    if getattr(func, "__name__", "") == "__get__":
        return f"Tensor.{getattr(getattr(func, '__self__', None), '__name__', '?')}"
    return getattr(func, "__name__", str(func))


def _is_metadata(func) -> bool:
    name = getattr(func, "__name__", "")
    if name == "__get__":
        owner = getattr(func, "__self__", None)
        return getattr(owner, "__name__", "") in _METADATA_GETTERS
    return name in _METADATA_METHODS


class PopulationMode(TorchFunctionMode):
    """Active while a population call runs the model.

    - Attention: ``F.scaled_dot_product_attention`` runs as one call over the whole
      population (``bridge.population_sdpa``) instead of vmap's per-individual loop.
    - The guard (with ``fused``): raises when an evolved parameter that a fused layer
      adapter perturbs is used by any other code. Such a use (``F.linear(x,
      self.embed.weight)`` in a custom forward, say) would see the unperturbed
      parameter: every individual would get the center's values there, silently.
      Metadata (shape, dtype, device, ...) is allowed.
    """

    def __init__(self, ctx: PopulationContext, fused: dict[int, str] | None):
        super().__init__()
        self.ctx = ctx
        self.fused = fused or {}  # id(param) -> name

    def _offending(self, args, kwargs):
        for a in args:
            if id(a) in self.fused and isinstance(a, torch.Tensor):
                return a
            if isinstance(a, (list, tuple)):
                for b in a:
                    if id(b) in self.fused and isinstance(b, torch.Tensor):
                        return b
        for v in (kwargs or {}).values():
            if id(v) in self.fused and isinstance(v, torch.Tensor):
                return v
        return None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is _SDPA and self.ctx.rule_depth == 0:
            from .bridge import population_sdpa

            return population_sdpa(self.ctx, *args, **(kwargs or {}))
        if self.fused and self.ctx.adapter_depth == 0 and self.ctx.rule_depth == 0 and not _is_metadata(func):
            p = self._offending(args, kwargs)
            if p is not None:
                name = self.fused[id(p)]
                raise RuntimeError(
                    f"VirtualPopulation: parameter '{name}' is perturbed by its layer's fused virtual-noise "
                    f"operator, but code outside that layer used it too ({_op_name(func)}), "
                    f"which would see the unperturbed values. Use the layer itself there (for a tied head, "
                    f"an nn.Linear sharing the weight), or leave '{name}' out of `evolve`.")
        return func(*args, **(kwargs or {}))
