"""Every bad input gets a clear error naming the argument, on every backend."""

import math

import pytest
import torch

import virtual_noise as vn

DEVICES = ["cpu", "meta"] + (["cuda"] if torch.cuda.is_available() else [])
I64_MAX = 2**63 - 1


def t(*shape, device, dtype=torch.float32):
    return torch.zeros(*shape, dtype=dtype, device=device)


def seeds(n, device, dtype=torch.int64):
    return torch.arange(n, dtype=dtype, device=device)


LINEAR_CASES = [
    # (description, kwargs overrides, error type, message regex)
    ("x 1-D", dict(x=lambda d: t(4, device=d)), ValueError, r"`x` must be \(batch, in_features\)"),
    ("x int", dict(x=lambda d: t(2, 4, device=d, dtype=torch.int32)), TypeError, r"`x` must be float32"),
    ("weight 1-D", dict(weight=lambda d: t(4, device=d)), ValueError, r"`weight` must be 2-D"),
    ("weight dtype", dict(weight=lambda d: t(3, 4, device=d, dtype=torch.float16)), TypeError, r"`weight` must have x's dtype"),
    ("in mismatch", dict(weight=lambda d: t(3, 5, device=d)), ValueError, r"`x` has 4 features.*expects 5"),
    ("bias shape", dict(bias=lambda d: t(4, device=d)), ValueError, r"`bias` must be 1-D of size out_features = 3"),
    ("bias dtype", dict(bias=lambda d: t(3, device=d, dtype=torch.float64)), TypeError, r"`bias` must have x's dtype"),
    ("per-individual P", dict(x=lambda d: t(5, 2, 4, device=d)), ValueError, r"size\(0\) == population 2"),
    ("float seeds", dict(seeds=lambda d: t(2, device=d)), TypeError, r"`seeds` must be an integer tensor"),
    ("bool seeds", dict(seeds=lambda d: t(2, device=d, dtype=torch.bool)), TypeError, r"`seeds` must be an integer"),
    ("2-D seeds", dict(seeds=lambda d: seeds(4, d).view(2, 2)), ValueError, r"`seeds` must be 1-D"),
    ("negative offset", dict(offset=-1), ValueError, r"`offset` must be >= 0; got -1"),
    ("offset overflow", dict(offset=I64_MAX - 5), ValueError, r"`offset` \+ block size overflows int64"),
    ("nan sigma", dict(sigma=math.nan), ValueError, r"`sigma` must be finite"),
    ("inf sigma", dict(sigma=math.inf), ValueError, r"`sigma` must be finite"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", LINEAR_CASES, ids=[c[0] for c in LINEAR_CASES])
def test_perturbed_linear_errors(device, case):
    _, over, exc, msg = case
    args = dict(x=t(2, 4, device=device), weight=t(3, 4, device=device), bias=t(3, device=device),
                seeds=seeds(2, device), sigma=0.1, offset=0)
    for k, v in over.items():
        args[k] = v(device) if callable(v) else v
    with pytest.raises(exc, match=msg) as info:
        vn.virtual_perturbed_linear(**args)
    assert "virtual_noise.perturbed_linear" in str(info.value)


@pytest.mark.parametrize("device", DEVICES)
def test_antithetic_population_rules(device):
    x = t(3, 2, 4, device=device)  # 3 individuals cannot be 2 * len(seeds)
    with pytest.raises(ValueError, match=r"population 4 \(2 \* len\(seeds\), antithetic\)"):
        vn.virtual_perturbed_linear(x, t(3, 4, device=device), None, seeds(2, device), 0.1, 0, antithetic=True)


def test_mixed_devices():
    with pytest.raises(ValueError, match=r"`seeds` must be on the same device as `x`"):
        vn.virtual_perturbed_linear(t(2, 4, device="cpu"), t(3, 4, device="cpu"), None, seeds(2, "meta"), 0.1, 0)
    with pytest.raises(ValueError, match=r"`weight` must be on the same device as `x`"):
        vn.virtual_perturbed_linear(t(2, 4, device="cpu"), t(3, 4, device="meta"), None, seeds(2, "cpu"), 0.1, 0)
    with pytest.raises(ValueError, match=r"`fitness` must be on the same device as `seeds`"):
        vn.virtual_weight_gradient(t(2, device="meta"), seeds(2, "cpu"), (2, 2), 0.1, 2, 0)
    with pytest.raises(ValueError, match=r"`seeds` must be on the same device as `center`"):
        vn.virtual_reduce_metric(t(4, device="cpu"), seeds(2, "meta"), 0.1, 4, 0)


GRAD_CASES = [
    ("weight_shape 1-D", dict(shape=(6,)), ValueError, r"`weight_shape` must have 2 dims"),
    ("weight_shape 3-D", dict(shape=(1, 2, 3)), ValueError, r"`weight_shape` must have 2 dims"),
    ("negative dim", dict(shape=(2, -3)), ValueError, r"`weight_shape` must be non-negative"),
    ("huge shape", dict(shape=(2**40, 2**40)), ValueError, r"more than 2\^63 elements"),
    ("fitness length", dict(fitness=lambda d: t(3, device=d)), ValueError, r"`fitness` must have pop_size = 2 entries; got 3"),
    ("fitness 2-D", dict(fitness=lambda d: t(2, 1, device=d)), ValueError, r"`fitness` must be 1-D"),
    ("fitness int", dict(fitness=lambda d: t(2, device=d, dtype=torch.int64)), TypeError, r"`fitness` must be a floating-point"),
    ("pop_size", dict(pop_size=3), ValueError, r"`pop_size` must equal len\(seeds\) = 2; got 3"),
    ("zero sigma", dict(sigma=0.0), ValueError, r"`sigma` must be nonzero"),
    ("nan sigma", dict(sigma=math.nan), ValueError, r"`sigma` must be finite"),
    ("float seeds", dict(seeds=lambda d: t(2, device=d, dtype=torch.float64)), TypeError, r"`seeds` must be an integer"),
    ("negative offset", dict(offset=-5), ValueError, r"`offset` must be >= 0"),
    ("offset overflow", dict(offset=I64_MAX - 3), ValueError, r"overflows int64"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_weight_gradient_errors(device, case):
    _, over, exc, msg = case
    args = dict(fitness=t(2, device=device), seeds=seeds(2, device), shape=(2, 3), sigma=0.1, pop_size=2, offset=0)
    for k, v in over.items():
        args[k] = v(device) if callable(v) else v
    with pytest.raises(exc, match=msg) as info:
        vn.virtual_weight_gradient(args["fitness"], args["seeds"], args["shape"], args["sigma"], args["pop_size"], args["offset"])
    assert "virtual_noise.weight_gradient" in str(info.value)


@pytest.mark.parametrize("device", DEVICES)
def test_bias_gradient_errors(device):
    with pytest.raises(ValueError, match=r"virtual_noise.bias_gradient: `bias_shape` must have 1 dim"):
        vn.virtual_bias_gradient(t(2, device=device), seeds(2, device), (2, 3), 0.1, 2, 0)
    with pytest.raises(ValueError, match=r"`pop_size` must equal 2 \* len\(seeds\) \(antithetic pairs\) = 4; got 2"):
        vn.virtual_bias_gradient(t(2, device=device), seeds(2, device), (3,), 0.1, 2, 0, antithetic=True)


@pytest.mark.parametrize("device", DEVICES)
def test_reduce_metric_errors(device):
    c = t(10, device=device)
    with pytest.raises(ValueError, match=r"`n_params` must equal center.numel\(\) = 10; got 11"):
        vn.virtual_reduce_metric(c, seeds(2, device), 0.1, 11, 0)
    with pytest.raises(TypeError, match=r"`center` must be a floating-point"):
        vn.virtual_reduce_metric(t(10, device=device, dtype=torch.int32), seeds(2, device), 0.1, 10, 0)
    with pytest.raises(ValueError, match=r"`sigma` must be finite"):
        vn.virtual_reduce_metric(c, seeds(2, device), math.inf, 10, 0)
    with pytest.raises(ValueError, match=r"`offset` \+ block size overflows"):
        vn.virtual_reduce_metric(c, seeds(2, device), 0.1, 10, I64_MAX - 9)
    with pytest.raises(TypeError, match=r"`seeds` must be an integer"):
        vn.virtual_reduce_metric(c, t(2, device=device), 0.1, 10, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_generate_noise_errors(device):
    with pytest.raises(ValueError, match=r"`n_elements` must be >= 0"):
        vn.generate_noise(seeds(2, device), -1, 0)
    with pytest.raises(ValueError, match=r"`offset` must be >= 0"):
        vn.generate_noise(seeds(2, device), 3, -1)
    with pytest.raises(TypeError, match=r"`seeds` must be an integer"):
        vn.generate_noise(t(2, device=device), 3, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_perturbed_linear_transposed_errors(device):
    x, w = t(2, 4, device=device), t(4, 3, device=device)  # stored (in, out)
    with pytest.raises(ValueError, match=r"`x` has 4 features.*with transposed=True \(expects 3\)"):
        vn.virtual_perturbed_linear(x, t(3, 4, device=device), None, seeds(2, device), 0.1, 0, transposed=True)
    with pytest.raises(ValueError, match=r"`bias` must be 1-D of size out_features = 3"):
        vn.virtual_perturbed_linear(x, w, t(4, device=device), seeds(2, device), 0.1, 0, transposed=True)
    with pytest.raises(ValueError, match=r"`weight` must be 2-D \(in_features, out_features\) with transposed=True"):
        vn.virtual_perturbed_linear(x, t(4, device=device), None, seeds(2, device), 0.1, 0, transposed=True)
    assert vn.virtual_perturbed_linear(x, w, t(3, device=device), seeds(2, device), 0.1, 0,
                                       transposed=True).shape == (2, 2, 3)


EMBEDDING_CASES = [
    ("float indices", dict(indices=lambda d: t(3, device=d)), TypeError, r"`indices` must be int64 or int32"),
    ("3-D indices", dict(indices=lambda d: t(2, 2, 2, device=d, dtype=torch.int64)), ValueError,
     r"`indices` must be \(n,\) shared by the population or \(P, n\)"),
    ("per-individual P", dict(indices=lambda d: t(3, 4, device=d, dtype=torch.int64)), ValueError,
     r"per-individual `indices` must have size\(0\) == population 2"),
    ("weight 1-D", dict(weight=lambda d: t(5, device=d)), ValueError, r"`weight` must be 2-D \(num_embeddings"),
    ("weight int", dict(weight=lambda d: t(5, 3, device=d, dtype=torch.int32)), TypeError, r"`weight` must be float32"),
    ("seeds 2-D", dict(seeds=lambda d: seeds(4, d).view(2, 2)), ValueError, r"`seeds` must be 1-D"),
    ("nan sigma", dict(sigma=math.nan), ValueError, r"`sigma` must be finite"),
    ("negative offset", dict(offset=-1), ValueError, r"`offset` must be >= 0"),
    ("offset overflow", dict(offset=I64_MAX - 10), ValueError, r"overflows int64"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", EMBEDDING_CASES, ids=[c[0] for c in EMBEDDING_CASES])
def test_perturbed_embedding_errors(device, case):
    _, over, exc, msg = case
    args = dict(indices=t(3, device=device, dtype=torch.int64), weight=t(5, 3, device=device),
                seeds=seeds(2, device), sigma=0.1, offset=0)
    for k, v in over.items():
        args[k] = v(device) if callable(v) else v
    with pytest.raises(exc, match=msg) as info:
        vn.virtual_perturbed_embedding(**args)
    assert "virtual_noise.perturbed_embedding" in str(info.value)


@pytest.mark.parametrize("device", [d for d in DEVICES if d != "meta"])  # the range needs the data
@pytest.mark.parametrize("bad", [-1, 5])
def test_perturbed_embedding_index_out_of_range(device, bad):
    idx = torch.tensor([0, bad, 2], device=device)
    with pytest.raises(IndexError, match=rf"every entry of `indices` must be in \[0, num_embeddings = 5\); "
                                         rf"got values in \[{min(bad, 0)}, {max(bad, 2)}\]"):
        vn.virtual_perturbed_embedding(idx, t(5, 3, device=device), seeds(2, device), 0.1, 0)



@pytest.mark.parametrize("device", DEVICES)
def test_lowrank_errors(device):
    x, w, s = t(2, 8, device=device), t(6, 8, device=device), seeds(2, device)
    op = "virtual_noise.lowrank_perturbed_linear"
    with pytest.raises(ValueError, match=rf"{op}: `rank` must be >= 1; got 0"):
        vn.virtual_lowrank_perturbed_linear(x, w, None, s, 0.1, 0, 0)
    with pytest.raises(ValueError, match=rf"{op}: `rank` 4 is too large for the \(6, 8\) block: its factors, "
                                         rf"\(rows \+ cols\) \* rank = 56 noise elements, must fit in the block's rows \* cols = 48"):
        vn.virtual_lowrank_perturbed_linear(x, w, None, s, 0.1, 0, 4)
    with pytest.raises(ValueError, match=rf"{op}: `x` has 8 features"):
        vn.virtual_lowrank_perturbed_linear(x, t(6, 5, device=device), None, s, 0.1, 0, 1)
    with pytest.raises(TypeError, match=rf"{op}: `seeds` must be an integer"):
        vn.virtual_lowrank_perturbed_linear(x, w, None, t(2, device=device), 0.1, 0, 1)
    with pytest.raises(ValueError, match=rf"{op}: `offset` must be >= 0"):
        vn.virtual_lowrank_perturbed_linear(x, w, None, s, 0.1, -3, 1)
    assert vn.virtual_lowrank_perturbed_linear(x, w, None, s, 0.1, 0, 3).shape == (2, 2, 6)
    g = "virtual_noise.lowrank_weight_gradient"
    with pytest.raises(ValueError, match=rf"{g}: `rank` 4 is too large for the \(6, 8\) block"):
        vn.virtual_lowrank_weight_gradient(t(2, device=device), s, (6, 8), 0.1, 2, 0, 4)
    with pytest.raises(ValueError, match=rf"{g}: `weight_shape` must have 2 dims"):
        vn.virtual_lowrank_weight_gradient(t(2, device=device), s, (6,), 0.1, 2, 0, 1)
    with pytest.raises(ValueError, match=rf"{g}: `sigma` must be nonzero"):
        vn.virtual_lowrank_weight_gradient(t(2, device=device), s, (6, 8), 0.0, 2, 0, 1)
    n = "virtual_noise.generate_lowrank_noise"
    with pytest.raises(ValueError, match=rf"{n}: `rank` must be >= 1"):
        vn.generate_lowrank_noise(s, (6, 8), -1)
    with pytest.raises(ValueError, match=rf"{n}: `weight_shape` must have 2 dims"):
        vn.generate_lowrank_noise(s, (6, 8, 2), 1)
    with pytest.raises(ValueError, match=rf"{n}: `offset` \+ block size overflows"):
        vn.generate_lowrank_noise(s, (6, 8), 1, I64_MAX - 10)
