"""Training tasks: each builds its network, scores a population, and tests the center.

A task's random state (minibatches, environment seeds) lives in its own CPU
generator so a checkpoint restores it and a resumed run continues identically.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .models import DigitsCNN, DigitsViT, mlp


class DigitsTask:
    """A network classifying scikit-learn's bundled 8x8 digits (no download): an MLP, a CNN or a ViT.

    Fitness: minus the cross-entropy on a minibatch shared by the population.
    Metric: test accuracy of the center on a held-out stratified 20% split.
    Each model's defaults reach >= 95% test accuracy on a 2-core CPU (benchmarks/RESULTS.md).
    """

    name = "digits"
    metric_name = "test_acc"
    target = 0.95
    defaults = dict(population=512, sigma=0.5, lr=0.03, generations=500, hidden=[64], batch=256,
                    lr_schedule="constant")
    models = {
        "mlp": {},
        "cnn": dict(population=256, sigma=0.3, lr=0.05, generations=200, hidden=[8, 16], batch=128,
                    lr_schedule="cosine"),
        "vit": dict(population=512, sigma=0.3, lr=0.05, generations=1100, hidden=[32], batch=64,
                    lr_schedule="cosine"),
    }

    def __init__(self, device, seed: int, batch: int):
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        data = load_digits()
        x = (data.data / 16.0).astype("float32")
        x_tr, x_te, y_tr, y_te = train_test_split(x, data.target, test_size=0.2, random_state=0, stratify=data.target)
        mean = x_tr.mean(0, keepdims=True)
        self.x_train = torch.from_numpy(x_tr - mean).to(device)
        self.y_train = torch.from_numpy(y_tr).long().to(device)
        self.x_test = torch.from_numpy(x_te - mean).to(device)
        self.y_test = torch.from_numpy(y_te).long().to(device)
        self.batch = min(batch, len(self.x_train))
        self.generator = torch.Generator().manual_seed(seed + 1)

    def build_model(self, hidden: list[int], model: str = "mlp") -> nn.Module:
        if model == "cnn":
            if len(hidden) != 2:
                raise ValueError(f"--hidden for --model cnn is the two conv widths, e.g. 8,16; got {hidden}")
            return DigitsCNN(hidden)
        if model == "vit":
            if len(hidden) != 1 or hidden[0] % 4:
                raise ValueError(f"--hidden for --model vit is the width, a multiple of its 4 heads; got {hidden}")
            return DigitsViT(width=hidden[0]).eval()
        return mlp([64, *hidden, 10])

    def fitness(self, es) -> torch.Tensor:
        idx = torch.randperm(len(self.x_train), generator=self.generator)[: self.batch].to(self.x_train.device)
        x, y = self.x_train[idx], self.y_train[idx]
        logits = es.forward(x)  # (P, batch, 10)
        pop = logits.shape[0]
        ce = F.cross_entropy(logits.reshape(-1, 10), y.repeat(pop), reduction="none").view(pop, -1)
        return -ce.mean(dim=1)

    @torch.no_grad()
    def evaluate(self, module: nn.Module) -> float:
        return (module(self.x_test).argmax(1) == self.y_test).double().mean().item()  # exact: 342/360 is 0.95


class CartPoleTask:
    """A policy on gymnasium's vectorized CartPole, one environment per individual.

    Fitness: the return of one episode (max 500), the individual fed its own
    observations as per-individual inputs (P, 1, 4); with several ranks each
    rank steps the environments of its own individuals. Metric: the center's mean
    return over 10 test episodes. Training stops once the metric reaches 500.
    """

    name = "cartpole"
    metric_name = "test_return"
    target = 500.0
    defaults = dict(population=64, sigma=0.5, lr=0.05, generations=100, hidden=[16], batch=0,
                    lr_schedule="constant")
    models = {"mlp": {}}
    stop_at_target = True

    def __init__(self, device, seed: int, batch: int):
        import gymnasium as gym

        self.gym = gym
        self.device = device
        self.generator = torch.Generator().manual_seed(seed + 1)
        self._envs: dict[int, object] = {}

    def _env(self, n: int):
        if n not in self._envs:
            self._envs[n] = self.gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point")
        return self._envs[n]

    def build_model(self, hidden: list[int], model: str = "mlp") -> nn.Module:
        return mlp([4, *hidden, 2])

    def _episode_returns(self, n: int, act) -> torch.Tensor:
        env = self._env(n)
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self.generator))
        obs, _ = env.reset(seed=seed)
        returns = torch.zeros(n, dtype=torch.float64)
        alive = torch.ones(n, dtype=torch.bool)
        while alive.any():
            actions = act(torch.from_numpy(obs).to(self.device))
            obs, reward, terminated, truncated, _ = env.step(actions.cpu().numpy())
            returns += torch.from_numpy(reward).double() * alive
            alive &= ~torch.from_numpy(terminated | truncated)
        return returns

    def fitness(self, es) -> torch.Tensor:
        def act(obs):  # (P, 4) -> (P, 1, 4) per-individual inputs
            return es.forward(obs[:, None, :], per_individual=True)[:, 0, :].argmax(-1)

        return self._episode_returns(es.local_population_size, act).float()

    @torch.no_grad()
    def evaluate(self, module: nn.Module) -> float:
        return self._episode_returns(10, lambda obs: module(obs).argmax(-1)).mean().item()


TASKS = {"digits": DigitsTask, "cartpole": CartPoleTask}
