"""VirtualPopulation: any nn.Module, evaluated for a whole population in one batched pass.

How: the model runs under ``torch.func.vmap`` over the individuals, through
``torch.func.functional_call`` (how PyTorch itself swaps parameters without
copying modules), so its own forward code runs unchanged. Parameters of the
layers in the adapter registry (``models/adapters``: nn.Linear, Hugging
Face's Conv1D, nn.Conv1d/2d, nn.Embedding, nn.MultiheadAttention) are
perturbed inside fused operators and never stored; every other evolved
parameter (norm weights, raw parameters of a custom forward) is small and is
swapped in as a materialized (P, *shape) tensor, up to ``max_materialized``
elements per parameter. The noise layout is ``models/layout.py``'s.
"""

from __future__ import annotations

import functools
import inspect
from contextlib import ExitStack, contextmanager

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from .adapters import adapter_for, supported_layers
from .context import PopulationContext, PopulationMode, activate, in_adapter
from .layout import Block, Evolve, evolved_blocks
from .structure import flatten, flatten_call, unflatten

#: Default limit on the elements of one parameter that takes materialized per-individual noise.
#: At P = 256 a parameter at the limit costs 1 GiB in float32 while a call runs.
MAX_MATERIALIZED = 1 << 20


class PopulationError(RuntimeError):
    """A model's forward cannot run batched over the population (the message says which module and why)."""


class VirtualPopulation:
    """Runs a population of perturbed copies of ``model`` without storing any copy.

    Args:
        model: any nn.Module.
        evolve: which parameters are perturbed and updated: None (every parameter with
            requires_grad), a list of names, or a predicate ``(name, param) -> bool``.
            The others take no noise indices and never change.
        noise: "full" (every element its own noise) or "lowrank": the weights of nn.Linear,
            Hugging Face Conv1D and nn.Embedding take rank-``rank`` noise ``sqrt(12/r) A @ B^T``
            (docs/lowrank.md); every other block, and a weight the rank does not fit
            ((rows + cols) * rank > rows * cols), stays full rank.
        rank: the rank of low-rank noise.
        noise_overrides: per parameter name, "full" or a rank, over the default above.
        max_materialized: the most elements one evolved parameter outside the fused
            layers may have (it takes a (P, *shape) tensor of noise while a call runs).
        check_parameter_use: raise if a parameter that a fused layer perturbs is also used
            by other code (which would see it unperturbed).

    Call ``pop(*inputs, seeds=..., sigma=..., antithetic=True, per_individual=False, **kwargs)``:
    tensors anywhere in the inputs are shared by the population, or with ``per_individual``
    carry a leading population dimension P (``per_individual`` may also list the positions
    and keyword names of just those inputs that do, e.g. ``["input_ids"]``). The result has the model's output structure
    with a leading P on every tensor. ``pop(x, seeds, sigma, antithetic)`` (x (batch, in)
    shared or (P, batch, in) per individual) is the older form and still works.
    """

    def __init__(self, model: nn.Module, *, evolve: Evolve = None, noise: str = "full", rank: int | None = None,
                 noise_overrides: dict | None = None, max_materialized: int = MAX_MATERIALIZED,
                 check_parameter_use: bool = True):
        if not isinstance(model, nn.Module):
            raise TypeError(f"VirtualPopulation: `model` must be an nn.Module; got {type(model).__name__}")
        self.module = model
        self.blocks: list[Block] = evolved_blocks(model, evolve)
        self._offset_of = {id(b.param): b.offset for b in self.blocks}
        self.n_params = sum(b.numel for b in self.blocks)
        self._names = {id(p): n for n, p in model.named_parameters()}
        self._module_names = {id(m): n or "<root>" for n, m in model.named_modules()}
        self._patches, fused = [], {}
        for name, mod in model.named_modules():
            adapter = adapter_for(mod)
            if adapter is None:
                continue
            claimed = [p for p in (getattr(mod, a, None) for a in adapter.claims) if isinstance(p, nn.Parameter)]
            evolved = [p for p in claimed if id(p) in self._offset_of]
            if evolved:
                self._patches.append((mod, adapter))
                fused.update({id(p): self._names[id(p)] for p in evolved})
        self._fused = fused
        self.ranks = _noise_ranks(self.blocks, self._patches, noise, rank, noise_overrides)  # name -> rank, low-rank only
        self._rank_of = {id(b.param): self.ranks[b.name] for b in self.blocks if b.name in self.ranks}
        self.noise = noise
        self.fused_blocks = [b for b in self.blocks if id(b.param) in fused]
        self.materialized_blocks = [b for b in self.blocks if id(b.param) not in fused]
        owners = {id(p): (n, m) for n, m in model.named_modules() for p in m.parameters(recurse=False)}
        for b in self.materialized_blocks:
            if b.numel > max_materialized:
                owner_name, owner = owners.get(id(b.param), ("?", None))
                raise ValueError(
                    f"VirtualPopulation: parameter '{b.name}' ({tuple(b.param.shape)}, {b.numel:,} elements, in "
                    f"{type(owner).__name__ if owner is not None else '?'} '{owner_name or '<root>'}') has no fused "
                    f"virtual-noise layer, and materializing its noise per individual exceeds max_materialized = "
                    f"{max_materialized:,} elements. Layers with fused noise: {supported_layers()}. Use one of "
                    f"them for this parameter, raise max_materialized, or leave it out of `evolve`.")
        self.check_parameter_use = check_parameter_use
        forward_params = inspect.signature(model.forward).parameters
        self._accepts = set(forward_params)

    def offset_of(self, param: Tensor) -> int:
        return self._offset_of[id(param)]

    def rank_of(self, block: Block) -> int:
        """The block's noise rank: 0 for full-rank noise."""
        return self._rank_of.get(id(block.param), 0)

    @property
    def device(self) -> torch.device:
        for t in self.module.parameters():
            return t.device
        return torch.device("cpu")

    # -- the call -------------------------------------------------------------------------------

    def __call__(self, *args, seeds=None, sigma=None, antithetic=True, per_individual=False, **kwargs):
        if seeds is None:
            if 3 <= len(args) <= 4 and isinstance(args[1], Tensor) and not args[1].is_floating_point():
                x, seeds, sigma = args[:3]  # the older form pop(x, seeds, sigma[, antithetic])
                antithetic = args[3] if len(args) == 4 else True
                args, per_individual = (x,), x.dim() == 3
            else:
                raise TypeError("VirtualPopulation: pass the population as keywords: pop(*inputs, seeds=..., "
                                "sigma=..., antithetic=True, per_individual=False, **kwargs)")
        if sigma is None:
            raise TypeError("VirtualPopulation: `sigma` is required")
        if "use_cache" in self._accepts and "use_cache" not in kwargs:
            kwargs["use_cache"] = False  # a cache object cannot leave the batched call; generate() keeps one inside

        def body(model_call, *tensors):
            a, kw = unflatten(in_spec, list(tensors))
            out_leaves = []
            out_spec.append(flatten(model_call(*a, **kw), out_leaves, drop_tensor_holders=True))
            return tuple(out_leaves)

        leaves, out_spec = [], []
        in_spec, keys = flatten_call(args, kwargs, leaves)
        batched = [_is_per_individual(per_individual, key) for key in keys]
        outs = self.run_batched(body, leaves, seeds=seeds, sigma=sigma, antithetic=antithetic, per_individual=batched)
        return unflatten(out_spec[-1], list(outs))

    forward = __call__

    def generate(self, input_ids: Tensor, attention_mask: Tensor | None = None, *, seeds, sigma, max_new_tokens: int,
                 antithetic: bool = True, eos_token_id: int | None = None, pad_token_id: int | None = None,
                 per_individual: bool = False) -> Tensor:
        """Greedy decoding of every individual with its own perturbed weights, in one batched pass
        with a KV cache (Hugging Face causal LMs). Returns (P, batch, prompt + max_new_tokens) token ids;
        after an individual's sequence emits ``eos_token_id`` (default: the model's generation config's)
        it continues with ``pad_token_id``."""
        from .generation import generate

        return generate(self, input_ids, attention_mask, seeds=seeds, sigma=sigma, max_new_tokens=max_new_tokens,
                        antithetic=antithetic, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                        per_individual=per_individual)

    def run_batched(self, body, leaves: list[Tensor], *, seeds, sigma, antithetic, per_individual):
        """``body(model_call, *leaves)`` under vmap over the population: ``model_call(*a, **kw)`` runs the
        model as one individual. ``per_individual``: a bool, or one per leaf (whether it has a leading P).
        Returns body's tensors with the population in front."""
        seeds = _as_seeds(seeds, self.device)
        ctx = PopulationContext(seeds, sigma, antithetic, self._offset_of, self._rank_of)
        P = ctx.size
        if isinstance(per_individual, bool):
            per_individual = [per_individual] * len(leaves)
        for t, batched in zip(leaves, per_individual):
            if batched:
                if t.dim() == 0 or t.shape[0] != P:
                    raise ValueError(f"VirtualPopulation: with per_individual=True every input tensor must have "
                                     f"a leading population dim of {P}; got one of shape {tuple(t.shape)}")
        self._check_batchable()
        small = {b.name: ctx.perturbed(b.param, b.offset) for b in self.materialized_blocks}
        token = torch.arange(P, device=seeds.device)

        def vmapped(token, small, *tensors):
            ctx.token = token
            ctx.level = _vmap_level(token)

            def model_call(*a, **kw):
                return functional_call(self.module, small, a, kw, tie_weights=True, strict=False)

            return body(model_call, *tensors)

        dims = (0, 0) + tuple(0 if batched else None for batched in per_individual)
        tracker = _ModuleTracker(self._module_names)
        with ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            stack.enter_context(activate(ctx))
            stack.enter_context(self._patched(ctx))
            stack.enter_context(tracker)
            stack.enter_context(PopulationMode(ctx, self._fused if self.check_parameter_use else None))
            try:
                return vmap(vmapped, in_dims=dims, randomness="error")(token, small, *leaves)
            except PopulationError:
                raise
            except RuntimeError as e:
                explained = _explain(e, tracker.innermost())
                if explained is None:
                    raise
                raise explained from e

    # -- helpers --------------------------------------------------------------------------------

    @contextmanager
    def _patched(self, ctx):
        saved = []
        try:
            for mod, adapter in self._patches:  # instance attributes shadow the class's forward
                saved.append((mod, mod.__dict__.get("forward")))
                mod.forward = functools.partial(_adapter_forward, adapter, mod, ctx)
            yield
        finally:
            for mod, previous in saved:
                if previous is None:
                    del mod.forward
                else:
                    mod.forward = previous

    def _check_batchable(self):
        for name, m in self.module.named_modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training and m.track_running_stats:
                raise PopulationError(
                    f"VirtualPopulation: module '{name or '<root>'}' ({type(m).__name__}) is in training mode, where "
                    f"it updates its running statistics in place from each batch, which cannot differ per "
                    f"individual. Call model.eval() (it then normalizes with its running statistics), or use "
                    f"nn.GroupNorm / nn.LayerNorm, or BatchNorm with track_running_stats=False.")


def _noise_ranks(blocks, patches, noise, rank, overrides) -> dict[str, int]:
    """The rank of every low-rank block, by name. Low-rank noise serves the weights of the layers
    whose whole weight is one (rows, cols) block: nn.Linear, Hugging Face Conv1D and nn.Embedding (so a head
    tied to its embedding takes it too). Convolutions (applied group by group) and nn.MultiheadAttention's
    in-projection (applied in row slices) keep full-rank noise."""
    if noise not in ("full", "lowrank"):
        raise ValueError(f"VirtualPopulation: `noise` must be 'full' or 'lowrank'; got {noise!r}")
    if noise == "lowrank" and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 1):
        raise ValueError(f"VirtualPopulation: noise='lowrank' needs `rank`, a positive int; got {rank!r}")
    overrides = dict(overrides or {})
    names = {b.name for b in blocks}
    unknown = [n for n in overrides if n not in names]
    if unknown:
        raise ValueError(f"VirtualPopulation: `noise_overrides` names no evolved parameter: {', '.join(map(repr, unknown))}")
    # A weight also perturbed by a layer without low-rank noise (an embedding tied to a head) keeps full rank:
    # every use of a parameter must see the same noise.
    eligible = {id(getattr(mod, "weight")) for mod, adapter in patches if adapter.lowrank_weight}
    eligible -= {id(getattr(mod, a, None)) for mod, adapter in patches if not adapter.lowrank_weight
                 for a in adapter.claims}
    ranks = {}
    for b in blocks:
        want = overrides.get(b.name, rank if noise == "lowrank" else "full")
        if want == "full":
            continue
        if not isinstance(want, int) or isinstance(want, bool) or want < 1:
            raise ValueError(f"VirtualPopulation: noise_overrides[{b.name!r}] must be 'full' or a positive rank; "
                             f"got {want!r}")
        if id(b.param) not in eligible or b.param.dim() != 2:
            if b.name in overrides:
                raise ValueError(f"VirtualPopulation: noise_overrides[{b.name!r}]: low-rank noise serves the weights "
                                 f"of nn.Linear, Hugging Face Conv1D and nn.Embedding only")
            continue
        rows, cols = b.param.shape
        if (rows + cols) * want > rows * cols:
            if b.name in overrides:
                raise ValueError(f"VirtualPopulation: noise_overrides[{b.name!r}]: rank {want} does not fit the "
                                 f"{tuple(b.param.shape)} block ((rows + cols) * rank > rows * cols)")
            continue  # the rank does not fit: full-rank noise
        ranks[b.name] = want
    return ranks


def _vmap_level(token) -> int | None:
    try:
        from torch._C._functorch import maybe_get_level
    except ImportError:  # pragma: no cover - depends on the installed torch
        return None
    level = maybe_get_level(token)
    return level if level >= 0 else None


def _is_per_individual(per_individual, key) -> bool:
    """per_individual: True / False for every input, or the positions (ints) and keyword names of those
    that carry a leading population dim."""
    if isinstance(per_individual, bool):
        return per_individual
    return key in per_individual


def _adapter_forward(adapter, mod, ctx, *args, **kwargs):
    with in_adapter(ctx):
        return adapter.forward(mod, ctx, *args, **kwargs)


def _as_seeds(seeds, device) -> Tensor:
    seeds = torch.as_tensor(seeds)
    if seeds.is_floating_point() or seeds.dtype == torch.bool or seeds.dim() != 1:
        raise TypeError(f"VirtualPopulation: `seeds` must be a 1-D integer tensor; got dtype {seeds.dtype}, "
                        f"shape {tuple(seeds.shape)}")
    return seeds.to(device=device, dtype=torch.int64)


class _ModuleTracker:
    """The modules in progress during a call (global forward hooks), to name the one that failed."""

    def __init__(self, names: dict[int, str]):
        self.names = names
        self.stack: list[nn.Module] = []
        self.failed: nn.Module | None = None

    def __enter__(self):
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        def pre(mod, args):
            if id(mod) in self.names:
                self.stack.append(mod)

        def post(mod, args, out):
            if self.stack and self.stack[-1] is mod:
                self.stack.pop()

        self.handles = [register_module_forward_pre_hook(pre), register_module_forward_hook(post)]
        return self

    def __exit__(self, exc_type, *rest):
        if exc_type is not None and self.stack:
            self.failed = self.stack[-1]
        for h in self.handles:
            h.remove()
        return False

    def innermost(self):
        mod = self.stack[-1] if self.stack else self.failed
        return None if mod is None else (self.names[id(mod)], type(mod).__name__)


_REASONS = [
    ("data-dependent control flow", "its forward branches in Python on a tensor value, which differs between "
     "individuals", "Compute both branches and select with torch.where, or make the condition independent of the "
     "perturbed parameters; an input that needs no population dim (an attention mask, say) can be passed shared: "
     "per_individual=[names of the inputs that have one]"),
    (".item()", "its forward reads a tensor value into Python (.item(), int(), float()), which differs between "
     "individuals", "Keep the value a tensor"),
    ("randomness", "it draws random numbers (dropout in training mode?)", "Call model.eval()"),
    ("inplace", "it writes values that differ per individual into a tensor shared by all of them, in place "
     "(a buffer or running statistic?)", "Use an out-of-place operation, or call model.eval()"),
    ("in-place", "it writes values that differ per individual into a tensor shared by all of them, in place "
     "(a buffer or running statistic?)", "Use an out-of-place operation, or call model.eval()"),
]


def _explain(error: RuntimeError, where) -> PopulationError | None:
    text = str(error)
    if "vmap" not in text and "Batched" not in text:
        return None
    for needle, reason, advice in _REASONS:
        if needle in text:
            place = f"module '{where[0]}' ({where[1]})" if where else "the model"
            return PopulationError(f"VirtualPopulation: {place} cannot run batched over the population: {reason}. "
                                   f"{advice}. ({text.splitlines()[0][:200]})")
    return None
