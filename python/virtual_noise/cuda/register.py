"""Registers the Triton launchers as the CUDA kernels of the C++-defined operators.

Each kernel first runs the C++ argument checks (torch.ops.virtual_noise._validate_*,
metadata only, no device sync), so CUDA callers get the CPU backend's errors.
"""

import torch

from . import generate_noise as _gen
from . import lowrank as _lowrank
from . import noise_gradient as _grad
from . import perturbed_embedding as _emb
from . import perturbed_linear as _lin
from . import reduce_metric as _red

_ops = torch.ops.virtual_noise


@torch.library.register_kernel("virtual_noise::perturbed_linear", "cuda")
def _perturbed_linear(x, weight, bias, seeds, sigma, offset, antithetic=False, transposed=False):
    _ops._validate_perturbed_linear(x, weight, bias, seeds, sigma, offset, antithetic, transposed)
    return _lin.perturbed_linear(x, weight, bias, seeds, sigma, offset, antithetic, transposed)


@torch.library.register_kernel("virtual_noise::perturbed_embedding", "cuda")
def _perturbed_embedding(indices, weight, seeds, sigma, offset, antithetic=False):
    _ops._validate_perturbed_embedding(indices, weight, seeds, sigma, offset, antithetic)
    if not torch.cuda.is_current_stream_capturing():  # reading the indices syncs; a capture cannot
        _ops._validate_embedding_indices(indices, weight.shape[0])
    return _emb.perturbed_embedding(indices, weight, seeds, sigma, offset, antithetic)


@torch.library.register_kernel("virtual_noise::weight_gradient", "cuda")
def _weight_gradient(fitness, seeds, weight_shape, sigma, pop_size, offset, antithetic=False):
    _ops._validate_weight_gradient(fitness, seeds, weight_shape, sigma, pop_size, offset, antithetic)
    return _grad.weight_gradient(fitness, seeds, list(weight_shape), sigma, pop_size, offset, antithetic)


@torch.library.register_kernel("virtual_noise::bias_gradient", "cuda")
def _bias_gradient(fitness, seeds, bias_shape, sigma, pop_size, offset, antithetic=False):
    _ops._validate_bias_gradient(fitness, seeds, bias_shape, sigma, pop_size, offset, antithetic)
    return _grad.bias_gradient(fitness, seeds, list(bias_shape), sigma, pop_size, offset, antithetic)


@torch.library.register_kernel("virtual_noise::reduce_metric", "cuda")
def _reduce_metric(center, seeds, sigma, n_params, offset, antithetic=False):
    _ops._validate_reduce_metric(center, seeds, sigma, n_params, offset, antithetic)
    return _red.reduce_metric(center, seeds, sigma, n_params, offset, antithetic)


@torch.library.register_kernel("virtual_noise::generate_noise", "cuda")
def _generate_noise(seeds, n_elements, offset):
    _ops._validate_generate_noise(seeds, n_elements, offset)
    return _gen.generate_noise(seeds, n_elements, offset)


@torch.library.register_kernel("virtual_noise::lowrank_perturbed_linear", "cuda")
def _lowrank_perturbed_linear(x, weight, bias, seeds, sigma, offset, rank, antithetic=False, transposed=False):
    _ops._validate_lowrank_perturbed_linear(x, weight, bias, seeds, sigma, offset, rank, antithetic, transposed)
    return _lowrank.lowrank_perturbed_linear(x, weight, bias, seeds, sigma, offset, rank, antithetic, transposed)


@torch.library.register_kernel("virtual_noise::lowrank_weight_gradient", "cuda")
def _lowrank_weight_gradient(fitness, seeds, weight_shape, sigma, pop_size, offset, rank, antithetic=False):
    _ops._validate_lowrank_weight_gradient(fitness, seeds, weight_shape, sigma, pop_size, offset, rank, antithetic)
    return _lowrank.lowrank_weight_gradient(fitness, seeds, list(weight_shape), sigma, pop_size, offset, rank,
                                            antithetic)


@torch.library.register_kernel("virtual_noise::generate_lowrank_noise", "cuda")
def _generate_lowrank_noise(seeds, weight_shape, rank, offset):
    _ops._validate_generate_lowrank_noise(seeds, weight_shape, rank, offset)
    return _lowrank.generate_lowrank_noise(seeds, list(weight_shape), rank, offset)
