"""Python API of the virtual-noise operators (thin wrappers over torch.ops.virtual_noise).

Noise: for individual ``i`` with seed ``s_i``, element ``e`` of the flat
parameter vector is perturbed by ``sigma * noise(s_i, e)``, uniform in
[-0.5, 0.5), regenerated inside the kernels from (seed, index) and never
stored. An (out, in) weight block at ``offset`` uses indices
``offset + j*in + k``; its bias uses ``offset + out*in + j``.

Antithetic pairs: with ``antithetic=True``, ``seeds`` holds M seeds for a
population of P = 2M; individual 2m uses +N_m and 2m+1 uses -N_m.

The operators are not differentiable (evolution strategies estimate
gradients from fitness); call them under ``torch.no_grad()``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

_ops = torch.ops.virtual_noise


def virtual_perturbed_linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    seeds: Tensor,
    sigma: float,
    offset: int,
    *,
    antithetic: bool = False,
    transposed: bool = False,
) -> Tensor:
    """Linear layer of every individual: ``Y[i] = X[i] @ (W + sigma N_i)^T + (b + sigma nb_i)``.

    Args:
        x: (batch, in) shared by all individuals, or (P, batch, in) per individual;
            float32, bfloat16 or float16.
        weight: (out, in), x's dtype; (in, out) with ``transposed``.
        bias: (out,) in x's dtype, or None.
        seeds: 1-D integer tensor, one seed per individual (per pair if antithetic).
        sigma: noise scale.
        offset: flat noise index of weight[0, 0]; the bias follows at offset + out*in.
        antithetic: population of 2 * len(seeds) mirrored pairs.
        transposed: weight is stored (in, out), as ``x @ W`` takes it (Hugging Face's
            Conv1D): ``Y[i] = X[i] @ (W + sigma N_i) + ...``, with W's element (k, j)
            and its noise at ``offset + k*out + j`` (the stored layout).

    Returns:
        (P, batch, out) in x's dtype (computed with float32 accumulation).
    """
    return _ops.perturbed_linear(x, weight, bias, seeds, float(sigma), int(offset), antithetic, transposed)


def virtual_perturbed_embedding(
    indices: Tensor,
    weight: Tensor,
    seeds: Tensor,
    sigma: float,
    offset: int,
    *,
    antithetic: bool = False,
) -> Tensor:
    """Embedding lookup of every individual: ``out[i, t] = (W + sigma N_i)[indices[t]]``.

    Only the gathered rows are hashed: row r's element d has noise index
    ``offset + r * dim + d`` (the table's row-major layout).

    Args:
        indices: (n,) int64/int32 shared by all individuals, or (P, n) per individual;
            every entry in [0, num_embeddings).
        weight: (num_embeddings, dim), float32, bfloat16 or float16.
        seeds, sigma, offset, antithetic: as in ``virtual_perturbed_linear``.

    Returns:
        (P, n, dim) in weight's dtype (the sum computed in float32).
    """
    return _ops.perturbed_embedding(indices, weight, seeds, float(sigma), int(offset), antithetic)


def virtual_weight_gradient(
    fitness: Tensor,
    seeds: Tensor,
    weight_shape: Sequence[int],
    sigma: float,
    pop_size: int,
    offset: int,
    *,
    antithetic: bool = False,
) -> Tensor:
    """ES gradient estimate of a weight block: ``sum_i f_i N_i / (pop_size * sigma)``.

    Regenerates exactly the noise ``virtual_perturbed_linear`` used at ``offset``.

    Args:
        fitness: (pop_size,) floating, one value per individual.
        seeds: the seeds the population was evaluated with.
        weight_shape: (out, in).
        sigma: the noise scale used in the forward (nonzero).
        pop_size: population size, len(seeds) (2 * len(seeds) with antithetic).
        offset: flat noise index of the block's first element.
        antithetic: fitness holds mirrored pairs; each pair contributes (f_2m - f_2m+1) N_m.

    Returns:
        float32 tensor of ``weight_shape``. The 1/12 variance of the noise is not
        divided out here (the ES optimizer does that).
    """
    return _ops.weight_gradient(
        fitness, seeds, [int(s) for s in weight_shape], float(sigma), int(pop_size), int(offset), antithetic
    )


def virtual_bias_gradient(
    fitness: Tensor,
    seeds: Tensor,
    bias_shape: Sequence[int],
    sigma: float,
    pop_size: int,
    offset: int,
    *,
    antithetic: bool = False,
) -> Tensor:
    """ES gradient estimate of a 1-D block (a bias): as ``virtual_weight_gradient``.

    ``offset`` is the bias region's own offset (the weight's offset + out*in).
    Returns a float32 tensor of ``bias_shape``.
    """
    return _ops.bias_gradient(
        fitness, seeds, [int(s) for s in bias_shape], float(sigma), int(pop_size), int(offset), antithetic
    )


def virtual_reduce_metric(
    center: Tensor,
    seeds: Tensor,
    sigma: float,
    n_params: int,
    offset: int,
    *,
    antithetic: bool = False,
) -> Tensor:
    """Per-individual mean absolute perturbed parameter: ``mean_k |c_k + sigma noise_ik|``.

    Args:
        center: floating tensor of ``n_params`` elements (any shape, read flat).
        seeds, sigma, offset, antithetic: as in the other operators.
        n_params: must equal ``center.numel()``.

    Returns:
        float32 (P,). NaN when n_params is 0 (as ``torch.mean`` of nothing).
    """
    return _ops.reduce_metric(center, seeds, float(sigma), int(n_params), int(offset), antithetic)


def generate_noise(seeds: Tensor, n_elements: int, offset: int = 0) -> Tensor:
    """The noise itself: float32 (len(seeds), n_elements), row i = noise(seeds[i], offset + k).

    For tests, small parameter blocks and users' own checks; the other operators
    never materialize it.
    """
    return _ops.generate_noise(seeds, int(n_elements), int(offset))


def virtual_lowrank_perturbed_linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    seeds: Tensor,
    sigma: float,
    offset: int,
    rank: int,
    *,
    antithetic: bool = False,
    transposed: bool = False,
) -> Tensor:
    """Linear layer of every individual with low-rank noise (EGGROLL-style), never stored:
    ``Y[i] = X[i] @ W^T + b + sigma * (X[i] @ N_i^T + nb_i)`` with ``N_i = sqrt(12/r) A_i @ B_i^T``.

    The factors of the weight block stored (rows, cols) at ``offset`` are
    ``A[j, q] = noise(seed, offset + j*r + q)`` (rows x r) and
    ``B[k, q] = noise(seed, offset + rows*r + k*r + q)`` (cols x r), inside the block's own noise
    region, so ``compute_offsets`` and the layout are those of full-rank noise; the bias noise stays
    full rank at ``offset + out*in + j``. Arguments as ``virtual_perturbed_linear``; ``rank`` >= 1 with
    (rows + cols) * rank <= rows * cols.

    Returns:
        (P, batch, out) in x's dtype.
    """
    return _ops.lowrank_perturbed_linear(x, weight, bias, seeds, float(sigma), int(offset), int(rank), antithetic,
                                         transposed)


def virtual_lowrank_weight_gradient(
    fitness: Tensor,
    seeds: Tensor,
    weight_shape: Sequence[int],
    sigma: float,
    pop_size: int,
    offset: int,
    rank: int,
    *,
    antithetic: bool = False,
) -> Tensor:
    """ES gradient estimate of a low-rank block: ``sum_i f_i N_i / (pop_size * sigma)``, float32
    ``weight_shape`` (the stored shape), computed as GEMMs over the generated factors."""
    return _ops.lowrank_weight_gradient(fitness, seeds, [int(s) for s in weight_shape], float(sigma), int(pop_size),
                                        int(offset), int(rank), antithetic)


def generate_lowrank_noise(seeds: Tensor, weight_shape: Sequence[int], rank: int, offset: int = 0) -> Tensor:
    """The low-rank noise itself: float32 (len(seeds), rows, cols), ``N_i = sqrt(12/r) A_i @ B_i^T``
    (for tests and users' checks; the other operators never form it)."""
    return _ops.generate_lowrank_noise(seeds, [int(s) for s in weight_shape], int(rank), int(offset))
