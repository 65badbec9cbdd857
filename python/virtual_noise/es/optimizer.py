"""An ask/tell OpenAI-ES optimizer over an nn.Module, driven by virtual noise."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..models.layout import Evolve
from ..ops import virtual_bias_gradient, virtual_lowrank_weight_gradient
from .distributed import Shard
from .population import VirtualPopulation
from .checkpoint import load_checked, save_atomic, wrap
from .shaping import shape_fitness

#: Variance of the noise (uniform on [-0.5, 0.5)); estimates divide by it so
#: that on f(theta) = c . theta the mean estimate is c.
NOISE_VARIANCE = 1.0 / 12.0

SEED_LOW, SEED_HIGH = -(2**63), 2**63 - 1


class ES:
    """OpenAI-ES with virtual noise, as ask/tell.

    Each generation: ``seeds = es.ask()``; evaluate the population, e.g.
    ``out = es.forward(x)`` (the model's outputs with a leading P), into one fitness per individual
    (higher is better); ``es.tell(fitness)`` shapes it, estimates the gradient
    with the fused operators, and hands ``-estimate (+ weight_decay * param)``
    to a torch.optim optimizer as ``param.grad`` (Adam by default).

    Seeds come from a CPU ``torch.Generator`` seeded by ``seed``, so a run is
    reproducible from one number on any device.

    Args:
        module: any nn.Module (see ``virtual_noise.models.VirtualPopulation``); its
            evolved parameters are the center.
        evolve: which parameters evolve: None (every one with requires_grad), a list
            of names, or a predicate ``(name, param) -> bool``; the others never change.
        noise, rank, noise_overrides: "full" (default) or "lowrank" noise of rank ``rank``
            for the weights of linear and embedding layers, with per-parameter overrides
            (``VirtualPopulation``; docs/lowrank.md).
        nonfinite_fitness: "error" (default: a NaN or inf fitness raises) or "worst": such
            individuals rank below every other (their count is in tell()'s statistics).
        population_size: P individuals per generation (even with antithetic).
        sigma: noise scale (the perturbation is sigma * U[-0.5, 0.5)).
        lr: learning rate of the default Adam optimizer.
        antithetic: mirrored pairs (+N, -N) per seed (default on).
        fitness_shaping: "centered_ranks" (default), "z_score" or "raw".
        weight_decay: L2 coefficient added to each param.grad.
        optimizer: a factory ``params -> torch.optim.Optimizer`` to replace Adam.
        seed: seeds the generator that draws the population seeds.
        distributed: shard the population over the ranks of ``process_group``
            (default: when torch.distributed is initialized with several ranks).
            Every rank must build its ES identically (same module init, same
            seed); each then evaluates ``forward`` for its own slice and passes
            its slice's fitness to ``tell``. See es/distributed.py.
        process_group: the torch.distributed group (default: the world).
        gradient_mode: with several ranks, "all_reduce" (default: each rank
            estimates its slice's contribution, one all-reduce sums them) or
            "recompute" (each rank estimates from all seeds; only fitness moves).
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        population_size: int = 256,
        sigma: float = 0.05,
        lr: float = 0.01,
        antithetic: bool = True,
        fitness_shaping: str = "centered_ranks",
        weight_decay: float = 0.0,
        optimizer: Callable[..., torch.optim.Optimizer] | None = None,
        seed: int = 0,
        distributed: bool | None = None,
        process_group=None,
        gradient_mode: str = "all_reduce",
        evolve: Evolve = None,
        noise: str = "full",
        rank: int | None = None,
        noise_overrides: dict | None = None,
        nonfinite_fitness: str = "error",
    ):
        if not isinstance(population_size, int) or population_size < 1:
            raise ValueError(f"ES: population_size must be a positive int; got {population_size!r}")
        if antithetic and population_size % 2:
            raise ValueError(f"ES: population_size must be even with antithetic pairs; got {population_size}")
        if not (math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"ES: sigma must be finite and > 0; got {sigma!r}")
        if not (math.isfinite(weight_decay) and weight_decay >= 0):
            raise ValueError(f"ES: weight_decay must be finite and >= 0; got {weight_decay!r}")
        shape_fitness(torch.zeros(2), fitness_shaping)  # validates the name
        if nonfinite_fitness not in ("error", "worst"):
            raise ValueError(f"ES: nonfinite_fitness must be 'error' or 'worst'; got {nonfinite_fitness!r}")
        self.nonfinite_fitness = nonfinite_fitness
        if gradient_mode not in ("all_reduce", "recompute"):
            raise ValueError(f"ES: gradient_mode must be 'all_reduce' or 'recompute'; got {gradient_mode!r}")
        self.module = module
        self.population = VirtualPopulation(module, evolve=evolve, noise=noise, rank=rank,
                                            noise_overrides=noise_overrides)
        if not self.population.blocks:
            raise ValueError("ES: the model has no parameter to evolve (check `evolve` and requires_grad)")
        self.population_size = population_size
        self.sigma = float(sigma)
        self.antithetic = antithetic
        self.fitness_shaping = fitness_shaping
        self.weight_decay = float(weight_decay)
        params = [b.param for b in self.population.blocks]
        self.optimizer = optimizer(params) if optimizer is not None else torch.optim.Adam(params, lr=lr)
        self.generator = torch.Generator().manual_seed(seed)
        self.last_nonfinite = 0
        self.generation = 0
        self.seeds: Tensor | None = None  # this rank's seeds for the current generation
        self.all_seeds: Tensor | None = None
        self.gradient_mode = gradient_mode
        if distributed is None:
            import torch.distributed as dist

            distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size(process_group) > 1
        self.shard = Shard(self.n_seeds, 2 if antithetic else 1, process_group) if distributed else None

    @property
    def device(self) -> torch.device:
        return self.population.blocks[0].param.device

    @property
    def n_seeds(self) -> int:
        return self.population_size // 2 if self.antithetic else self.population_size

    @property
    def local_population_size(self) -> int:
        """Individuals this rank evaluates (the whole population in one process)."""
        if self.shard is None:
            return self.population_size
        return (self.shard.end - self.shard.start) * self.shard.members

    @property
    def rank(self) -> int:
        return 0 if self.shard is None else self.shard.rank

    @property
    def world_size(self) -> int:
        return 1 if self.shard is None else self.shard.world

    def ask(self) -> Tensor:
        """Draw this generation's seeds (one per pair with antithetic); returns this rank's.

        Every rank draws all seeds from the same generator, so no seeds are sent.
        """
        self.all_seeds = torch.randint(SEED_LOW, SEED_HIGH, (self.n_seeds,), generator=self.generator,
                                       dtype=torch.int64).to(self.device)
        self.seeds = self.all_seeds if self.shard is None else self.all_seeds[self.shard.local_seeds]
        return self.seeds

    def _require_seeds(self) -> Tensor:
        if self.seeds is None:
            raise RuntimeError("ES: call ask() before forward()/tell() in each generation")
        return self.seeds

    def forward(self, *inputs, per_individual: bool = False, **kwargs):
        """The model's outputs for every individual of this generation (this rank's), with a leading P.

        Input tensors are shared by the population, or with ``per_individual`` carry a
        leading population dimension.
        """
        return self.population(*inputs, seeds=self._require_seeds(), sigma=self.sigma, antithetic=self.antithetic,
                               per_individual=per_individual, **kwargs)

    def generate(self, input_ids: Tensor, attention_mask: Tensor | None = None, **kwargs) -> Tensor:
        """Greedy generations of every individual of this generation (``VirtualPopulation.generate``)."""
        return self.population.generate(input_ids, attention_mask, seeds=self._require_seeds(), sigma=self.sigma,
                                        antithetic=self.antithetic, **kwargs)

    def gather_fitness(self, fitness: Tensor) -> Tensor:
        """This rank's fitness to the whole population's (identical on every rank)."""
        self._require_seeds()
        fitness = torch.as_tensor(fitness).flatten()
        if fitness.numel() != self.local_population_size:
            which = (f"population_size = {self.population_size}" if self.shard is None else
                     f"{self.local_population_size} (rank {self.rank}'s part of population_size = {self.population_size})")
            raise ValueError(f"ES: fitness must have {which} entries; got {fitness.numel()}")
        full = fitness if self.shard is None else self.shard.gather_fitness(fitness)
        bad = ~torch.isfinite(full)
        self.last_nonfinite = int(bad.sum())
        if self.last_nonfinite:
            if self.nonfinite_fitness == "error":
                raise ValueError(f"ES: fitness holds {self.last_nonfinite} NaN or inf values (of {full.numel()}); "
                                 f"pass nonfinite_fitness='worst' (CLI: --nonfinite-fitness worst) to rank them last")
            finite = full[~bad]
            # Ranks put -inf last; the other shapings use the values, so there the worst finite value.
            worst = float("-inf") if self.fitness_shaping == "centered_ranks" else \
                (finite.min().item() if finite.numel() else 0.0)
            full = torch.where(bad, torch.full_like(full, worst), full)
        return full

    @torch.no_grad()
    def estimate_gradient(self, fitness: Tensor) -> dict[str, Tensor]:
        """Ascent direction per parameter name, variance-rescaled: its mean is grad E[f].

        ``fitness`` is this rank's slice (the whole population in one process).
        """
        return self._estimate(self.gather_fitness(fitness))

    def _estimate(self, full_fitness: Tensor) -> dict[str, Tensor]:
        shaped = shape_fitness(full_fitness.to(self.device), self.fitness_shaping)
        blocks = self.population.blocks
        if self.shard is None or self.gradient_mode == "recompute":
            return {b.name: self._block_estimate(b, shaped, self.all_seeds) for b in blocks}
        part = [self._block_estimate(b, shaped[self.shard.local_population], self.seeds) for b in blocks]
        total = self.shard.sum_gradients(torch.cat([g.flatten().float() for g in part]))
        return {b.name: t.view(b.param.shape).to(b.param.dtype)
                for b, t in zip(blocks, torch.split(total, [b.numel for b in blocks]))}

    def _block_estimate(self, block, shaped: Tensor, seeds: Tensor) -> Tensor:
        """The block's estimate from the individuals in ``shaped`` (all, or one rank's slice):
        sum over them of f_i N_i / (population_size * sigma), over the noise variance."""
        p = block.param
        # Every block's noise is its flat row-major range at its offset, whatever layer perturbs it
        # (fused or materialized), so one flat estimate serves every block kind.
        rank = self.population.rank_of(block)
        if rank:  # low-rank noise: GEMMs over the regenerated factors
            g = virtual_lowrank_weight_gradient(shaped, seeds, tuple(p.shape), self.sigma, shaped.numel(),
                                                block.offset, rank, antithetic=self.antithetic)
        else:
            g = virtual_bias_gradient(shaped, seeds, (p.numel(),), self.sigma, shaped.numel(), block.offset,
                                      antithetic=self.antithetic).view(p.shape)
        # The operator divided by this slice's size; the estimate divides by the whole population's.
        return (g * (shaped.numel() / self.population_size / NOISE_VARIANCE)).to(p.dtype)

    def tell(self, fitness: Tensor) -> dict[str, float]:
        """Update the center from this generation's fitness (this rank's slice); returns
        statistics of the whole population's fitness."""
        fitness = self.gather_fitness(fitness)
        estimate = self._estimate(fitness)
        self.optimizer.zero_grad(set_to_none=True)
        for b in self.population.blocks:
            grad = -estimate[b.name]  # optimizers minimize; ES ascends fitness
            if self.weight_decay:
                grad = grad + self.weight_decay * b.param.detach()
            b.param.grad = grad
        self.optimizer.step()
        self.generation += 1
        self.seeds = None
        f = fitness.double()
        f = f[torch.isfinite(f)] if self.last_nonfinite else f
        if f.numel() == 0:
            f = torch.full((1,), float("nan"), dtype=torch.float64)
        return {"mean": f.mean().item(), "max": f.max().item(), "min": f.min().item(), "nonfinite": self.last_nonfinite}

    def _config(self) -> dict:
        """What a checkpoint must share with this ES to resume it."""
        return {"population_size": self.population_size, "sigma": self.sigma, "antithetic": self.antithetic,
                "fitness_shaping": self.fitness_shaping, "weight_decay": self.weight_decay,
                "noise": self.population.noise, "ranks": dict(self.population.ranks),
                "evolved": [b.name for b in self.population.blocks]}

    def state_dict(self) -> dict:
        return {
            "module": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "generation": self.generation,
            "config": self._config(),
        }

    def load_state_dict(self, state: dict) -> None:
        mine, theirs = self._config(), state["config"]
        differ = [k for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
        if differ:
            what = "; ".join(f"{k}: checkpoint {theirs.get(k)!r}, this ES {mine.get(k)!r}" for k in differ)
            raise ValueError(f"ES.load_state_dict: the checkpoint's config differs ({what})")
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.generation = state["generation"]
        self.seeds = None

    def save(self, path, **extra) -> None:
        """Checkpoint ES state (center, optimizer, seed generator) plus ``extra`` objects, atomically:
        a crash during the write leaves the previous file at ``path`` intact (es/checkpoint.py).

        With several ranks (identical by construction) rank 0 writes and all wait for it.
        """
        if self.rank == 0:
            save_atomic(wrap(self.state_dict(), extra), path)
        if self.shard is not None:
            self.shard.barrier()

    def load(self, path) -> dict:
        """Resume from ``save``; returns the ``extra`` objects saved with it. A missing, truncated or foreign
        file raises CheckpointError naming it; a checkpoint of another configuration, ValueError naming
        the options that differ."""
        ckpt = load_checked(path)
        self.load_state_dict(ckpt["es"])
        return ckpt["extra"]
