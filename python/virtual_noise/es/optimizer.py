"""An ask/tell OpenAI-ES optimizer over an nn.Module, driven by virtual noise."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..ops import virtual_bias_gradient, virtual_weight_gradient
from .population import VirtualPopulation
from .shaping import shape_fitness

#: Variance of the noise (uniform on [-0.5, 0.5)); estimates divide by it so
#: that on f(theta) = c . theta the mean estimate is c.
NOISE_VARIANCE = 1.0 / 12.0

SEED_LOW, SEED_HIGH = -(2**63), 2**63 - 1


class ES:
    """OpenAI-ES with virtual noise, as ask/tell.

    Each generation: ``seeds = es.ask()``; evaluate the population, e.g.
    ``out = es.forward(x)`` ((P, batch, out)), into one fitness per individual
    (higher is better); ``es.tell(fitness)`` shapes it, estimates the gradient
    with the fused operators, and hands ``-estimate (+ weight_decay * param)``
    to a torch.optim optimizer as ``param.grad`` (Adam by default).

    Seeds come from a CPU ``torch.Generator`` seeded by ``seed``, so a run is
    reproducible from one number on any device.

    Args:
        module: the network (nn.Linear, nn.LayerNorm and element-wise
            activations in nn.Sequential); its parameters are the center.
        population_size: P individuals per generation (even with antithetic).
        sigma: noise scale (the perturbation is sigma * U[-0.5, 0.5)).
        lr: learning rate of the default Adam optimizer.
        antithetic: mirrored pairs (+N, -N) per seed (default on).
        fitness_shaping: "centered_ranks" (default), "z_score" or "raw".
        weight_decay: L2 coefficient added to each param.grad.
        optimizer: a factory ``params -> torch.optim.Optimizer`` to replace Adam.
        seed: seeds the generator that draws the population seeds.
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
        self.module = module
        self.population = VirtualPopulation(module)
        self.population_size = population_size
        self.sigma = float(sigma)
        self.antithetic = antithetic
        self.fitness_shaping = fitness_shaping
        self.weight_decay = float(weight_decay)
        params = [b.param for b in self.population.blocks]
        self.optimizer = optimizer(params) if optimizer is not None else torch.optim.Adam(params, lr=lr)
        self.generator = torch.Generator().manual_seed(seed)
        self.generation = 0
        self.seeds: Tensor | None = None

    @property
    def device(self) -> torch.device:
        return self.population.blocks[0].param.device

    @property
    def n_seeds(self) -> int:
        return self.population_size // 2 if self.antithetic else self.population_size

    def ask(self) -> Tensor:
        """Draw this generation's seeds (one per pair with antithetic)."""
        self.seeds = torch.randint(SEED_LOW, SEED_HIGH, (self.n_seeds,), generator=self.generator,
                                   dtype=torch.int64).to(self.device)
        return self.seeds

    def _require_seeds(self) -> Tensor:
        if self.seeds is None:
            raise RuntimeError("ES: call ask() before forward()/tell() in each generation")
        return self.seeds

    def forward(self, x: Tensor) -> Tensor:
        """Population outputs (P, batch, out) for this generation's seeds."""
        return self.population(x, self._require_seeds(), self.sigma, self.antithetic)

    @torch.no_grad()
    def estimate_gradient(self, fitness: Tensor) -> dict[str, Tensor]:
        """Ascent direction per parameter name, variance-rescaled: E = grad of E[f]."""
        seeds = self._require_seeds()
        fitness = torch.as_tensor(fitness).flatten()
        if fitness.numel() != self.population_size:
            raise ValueError(f"ES: fitness must have population_size = {self.population_size} entries; "
                             f"got {fitness.numel()}")
        if not torch.isfinite(fitness).all():
            raise ValueError("ES: fitness holds NaN or inf")
        shaped = shape_fitness(fitness.to(self.device), self.fitness_shaping)
        return {b.name: self._block_estimate(b, shaped, seeds) for b in self.population.blocks}

    def _block_estimate(self, block, shaped: Tensor, seeds: Tensor) -> Tensor:
        p = block.param
        args = (shaped, seeds)
        kw = dict(sigma=self.sigma, pop_size=self.population_size, offset=block.offset, antithetic=self.antithetic)
        if p.dim() == 2:
            g = virtual_weight_gradient(*args, tuple(p.shape), **kw)
        else:
            g = virtual_bias_gradient(*args, (p.numel(),), **kw).view(p.shape)
        return (g / NOISE_VARIANCE).to(p.dtype)

    def tell(self, fitness: Tensor) -> dict[str, float]:
        """Update the center from this generation's fitness; returns fitness statistics."""
        fitness = torch.as_tensor(fitness).flatten()
        estimate = self.estimate_gradient(fitness)
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
        return {"mean": f.mean().item(), "max": f.max().item(), "min": f.min().item()}

    def state_dict(self) -> dict:
        return {
            "module": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "generation": self.generation,
            "config": {"population_size": self.population_size, "sigma": self.sigma,
                       "antithetic": self.antithetic, "fitness_shaping": self.fitness_shaping,
                       "weight_decay": self.weight_decay},
        }

    def load_state_dict(self, state: dict) -> None:
        mine = self.state_dict()["config"]
        if state["config"] != mine:
            raise ValueError(f"ES.load_state_dict: checkpoint config {state['config']} differs from {mine}")
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.generation = state["generation"]
        self.seeds = None

    def save(self, path, **extra) -> None:
        """Checkpoint ES state (center, optimizer, seed generator) plus ``extra`` objects."""
        torch.save({"es": self.state_dict(), "extra": extra}, path)

    def load(self, path) -> dict:
        """Resume from ``save``; returns the ``extra`` objects saved with it."""
        ckpt = torch.load(path, map_location="cpu", weights_only=False)  # generator state is CPU
        self.load_state_dict(ckpt["es"])
        return ckpt["extra"]
