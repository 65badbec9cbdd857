"""Independent references: the noise spec in plain integers and numpy, and
float64 versions of every operator built from materialized noise."""

from __future__ import annotations

import numpy as np
import torch

MASK = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def mix64_int(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def noise_int(seed: int, e: int) -> float:
    """The spec with Python's unbounded integers, masked to 64 bits."""
    key = mix64_int((seed + GAMMA) & MASK)
    h = mix64_int((key + e * GAMMA) & MASK)
    return float(np.float32(((h & 0xFFFFFFFF) >> 8) * 2.0**-24 - 0.5))


def _mix64_np(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def noise_np(seeds, n: int, offset: int = 0) -> np.ndarray:
    """float64 (len(seeds), n) noise, vectorized in numpy uint64 (wrapping)."""
    with np.errstate(over="ignore"):
        s = np.array([int(v) & MASK for v in seeds], dtype=np.uint64)
        keys = _mix64_np(s + np.uint64(GAMMA))
        e = np.arange(n, dtype=np.uint64) + np.uint64(offset)
        h = _mix64_np(keys[:, None] + e[None, :] * np.uint64(GAMMA))
    bits = (h & np.uint64(0xFFFFFFFF)) >> np.uint64(8)
    return bits.astype(np.float64) * 2.0**-24 - 0.5


def noise_ref(seeds, n: int, offset: int = 0, antithetic: bool = False) -> torch.Tensor:
    """float64 (P, n): per individual noise, mirrored pairs when antithetic."""
    seeds = [int(v) for v in torch.as_tensor(seeds).flatten().tolist()]
    base = torch.from_numpy(noise_np(seeds, n, offset)) if seeds else torch.zeros(0, n, dtype=torch.float64)
    if not antithetic:
        return base
    return torch.stack([base, -base], dim=1).reshape(2 * base.shape[0], n)


def perturbed_linear_ref(x, weight, bias, seeds, sigma, offset, antithetic=False, transposed=False):
    """float64 x @ (W + sigma N_i)^T + (b + sigma nb_i); with transposed, W is stored (in, out), its noise
    in the stored layout, and the product is x @ (W + sigma N_i)."""
    rows, cols = weight.shape
    out_f = cols if transposed else rows
    n = rows * cols + (out_f if bias is not None else 0)
    noise = noise_ref(seeds, n, offset, antithetic)
    pop = noise.shape[0]
    w = weight.double()[None] + sigma * noise[:, : rows * cols].reshape(pop, rows, cols)
    xs = x.double()
    if xs.dim() == 2:
        xs = xs.expand(pop, *xs.shape)
    y = torch.bmm(xs, w if transposed else w.transpose(1, 2))
    if bias is not None:
        y = y + (bias.double()[None] + sigma * noise[:, rows * cols :])[:, None, :]
    return y


def perturbed_linear_transposed_ref(x, weight, bias, seeds, sigma, offset, antithetic=False):
    return perturbed_linear_ref(x, weight, bias, seeds, sigma, offset, antithetic, transposed=True)


def perturbed_embedding_ref(indices, weight, seeds, sigma, offset, antithetic=False):
    num, dim = weight.shape
    noise = noise_ref(seeds, num * dim, offset, antithetic)
    table = weight.double()[None] + sigma * noise.view(noise.shape[0], num, dim)
    idx = indices.long()
    return torch.stack([table[i][idx if idx.dim() == 1 else idx[i]] for i in range(table.shape[0])])


def gradient_ref(fitness, seeds, shape, sigma, pop_size, offset, antithetic=False):
    n = int(np.prod(shape))
    noise = noise_ref(seeds, n, offset, antithetic)
    return (fitness.double() @ noise / (pop_size * sigma)).reshape(shape)


def reduce_metric_ref(center, seeds, sigma, offset, antithetic=False):
    noise = noise_ref(seeds, center.numel(), offset, antithetic)
    return (center.double().flatten()[None] + sigma * noise).abs().mean(dim=1)


def population_reference(model, args, kwargs, seeds, sigma, antithetic=False, per_individual=False, evolve=None):
    """Each individual as torch.func.functional_call of the model with explicitly perturbed parameters.

    The layout is derived here on its own: the evolved parameters in named_parameters() order (tied
    ones once), laid end to end; element e of a parameter at offset off gets noise(seed, off + e).
    The perturbed value is computed in float32 and rounded once to the parameter's dtype.
    """
    from torch.func import functional_call

    named = [(n, p) for n, p in model.named_parameters() if (p.requires_grad if evolve is None else evolve(n, p))]
    total = sum(p.numel() for _, p in named)
    noise = noise_ref(seeds, total, 0, antithetic).float()
    outs = []
    for i in range(noise.shape[0]):
        params, off = {}, 0
        for n, p in named:
            d = noise[i, off:off + p.numel()].view(p.shape).to(p.device)
            params[n] = (p.detach().float() + sigma * d).to(p.dtype)
            off += p.numel()
        a = [t[i] if per_individual and torch.is_tensor(t) else t for t in args]
        kw = {k: (v[i] if per_individual and torch.is_tensor(v) else v) for k, v in kwargs.items()}
        with torch.no_grad():
            outs.append(functional_call(model, params, tuple(a), kw, tie_weights=True))
    return outs


def assert_population_close(out, refs, rtol, atol, path="out"):
    """out: the population's output (leading P on every tensor); refs: one output per individual."""
    import dataclasses

    if isinstance(out, torch.Tensor):
        ref = torch.stack(refs)
        assert out.shape == ref.shape, f"{path}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
        torch.testing.assert_close(out.double(), ref.double(), rtol=rtol, atol=atol, msg=lambda m: f"{path}: {m}")
    elif dataclasses.is_dataclass(out):
        for f in dataclasses.fields(out):
            assert_population_close(getattr(out, f.name), [getattr(r, f.name) for r in refs], rtol, atol,
                                    f"{path}.{f.name}")
    elif isinstance(out, dict):
        assert list(out) == list(refs[0]), f"{path}: keys {list(out)} != {list(refs[0])}"
        for k in out:
            assert_population_close(out[k], [r[k] for r in refs], rtol, atol, f"{path}[{k!r}]")
    elif isinstance(out, (tuple, list)):
        assert type(out) is type(refs[0]) and len(out) == len(refs[0]), path
        for j, o in enumerate(out):
            assert_population_close(o, [r[j] for r in refs], rtol, atol, f"{path}[{j}]")
    else:
        assert all(r == out for r in refs), f"{path}: {out!r}"


def lowrank_factors_ref(seeds, rows, cols, rank, offset):
    """float64 factors A (S, rows, r) and B (S, cols, r) of the low-rank spec, from the numpy spec."""
    a = torch.from_numpy(noise_np([int(s) for s in torch.as_tensor(seeds).tolist()], rows * rank, offset))
    b = torch.from_numpy(noise_np([int(s) for s in torch.as_tensor(seeds).tolist()], cols * rank, offset + rows * rank))
    return a.view(-1, rows, rank), b.view(-1, cols, rank)


def lowrank_noise_ref(seeds, rows, cols, rank, offset, antithetic=False):
    """float64 (P, rows, cols): sqrt(12 / r) A_i @ B_i^T, mirrored pairs when antithetic."""
    a, b = lowrank_factors_ref(seeds, rows, cols, rank, offset)
    n = (12.0 / rank) ** 0.5 * a @ b.transpose(1, 2)
    return torch.stack([n, -n], dim=1).flatten(0, 1) if antithetic else n


def lowrank_perturbed_linear_ref(x, weight, bias, seeds, sigma, offset, rank, antithetic=False, transposed=False):
    rows, cols = weight.shape
    n = lowrank_noise_ref(seeds, rows, cols, rank, offset, antithetic)
    w = weight.double()[None] + sigma * n  # stored layout
    xs = x.double()
    if xs.dim() == 2:
        xs = xs.expand(n.shape[0], *xs.shape)
    y = torch.bmm(xs, w if transposed else w.transpose(1, 2))
    if bias is not None:
        out_f = bias.shape[0]
        nb = noise_ref(seeds, out_f, offset + rows * cols, antithetic)
        y = y + (bias.double()[None] + sigma * nb)[:, None, :]
    return y


def lowrank_gradient_ref(fitness, seeds, shape, sigma, pop_size, offset, rank, antithetic=False):
    n = lowrank_noise_ref(seeds, shape[0], shape[1], rank, offset, antithetic)
    return torch.einsum("p,pij->ij", fitness.double(), n) / (pop_size * sigma)
