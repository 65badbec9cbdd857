"""A short tour of every operator: one ES step on a tiny regression problem.

    python examples/ops_demo.py
"""

import torch

import virtual_noise as vn

torch.manual_seed(0)
x, target = torch.randn(32, 8), torch.randn(32, 4)
weight, bias = torch.zeros(4, 8), torch.zeros(4)
w_off, b_off = vn.compute_offsets([weight.shape, bias.shape])  # [0, 32]: bias follows the weight

seeds = torch.randint(0, 2**62, (64,))  # 64 antithetic pairs: a population of 128
sigma = 0.1
y = vn.virtual_perturbed_linear(x, weight, bias, seeds, sigma, w_off, antithetic=True)  # (128, 32, 4)
fitness = -((y - target) ** 2).mean(dim=(1, 2))
print("population output", tuple(y.shape), "best fitness", round(fitness.max().item(), 4))

grad_w = vn.virtual_weight_gradient(fitness, seeds, weight.shape, sigma, 128, w_off, antithetic=True)
grad_b = vn.virtual_bias_gradient(fitness, seeds, bias.shape, sigma, 128, b_off, antithetic=True)
print("gradient estimate norms", round(grad_w.norm().item(), 4), round(grad_b.norm().item(), 4))

magnitude = vn.virtual_reduce_metric(weight, seeds, sigma, weight.numel(), w_off, antithetic=True)
print("mean |perturbed weight| of the first four individuals", magnitude[:4].tolist())
print("noise(seed=0, e=0..3)", vn.generate_noise(torch.tensor([0]), 4, 0).tolist())
print("build", vn.build_info())
