"""Every operator under property-based fuzzing (hypothesis) against the float64 references: random
shapes (0 and 1 included), strides, dtypes, offsets up to 2^62, seeds over the whole int64 range,
antithetic on and off. 1000 examples per operator on the CPU (derandomized: the same examples on every
run); the same properties run on CUDA in the GPU suite."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import (gradient_ref, lowrank_gradient_ref, lowrank_noise_ref, lowrank_perturbed_linear_ref,
                       noise_ref, perturbed_embedding_ref, perturbed_linear_ref, perturbed_linear_transposed_ref,
                       reduce_metric_ref)

import virtual_noise as vn

EXAMPLES = 1000
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 5e-3}
int64s = st.integers(-(2**63), 2**63 - 1)
offsets = st.integers(0, 2**62)
sigmas = st.floats(-2.0, 2.0, allow_nan=False, width=32)


def tol(dtype, device):
    # CUDA: the float32 noise term at tf32 (docs/precision.md).
    return 2e-3 if device == "cuda" and dtype == torch.float32 else TOL[dtype]


def tensor(draw, shape, dtype, device):
    """A random tensor of ``shape``, contiguous or a strided view (transposed or every other element)."""
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    layouts = ["contiguous", "transposed", "sliced"] if len(shape) >= 2 else ["contiguous", "sliced"]
    layout = draw(st.sampled_from(layouts))
    if layout == "transposed":
        t = torch.randn(*shape[:-2], shape[-1], shape[-2], generator=g).transpose(-1, -2)
    elif layout == "sliced":
        t = torch.randn(*shape[:-1], 2 * shape[-1], generator=g)[..., ::2]
    else:
        t = torch.randn(*shape, generator=g)
    return t.to(dtype).to(device)


@st.composite
def seeds(draw, max_n=4):
    n = draw(st.integers(0, max_n))
    return torch.tensor(draw(st.lists(int64s, min_size=n, max_size=n)), dtype=torch.int64)


@pytest.mark.parametrize("device", DEVICES)
@FUZZ
@given(data=st.data())
def test_fuzz_perturbed_linear(device, data):
    s = data.draw(seeds())
    anti, shared, transposed = data.draw(st.booleans()), data.draw(st.booleans()), data.draw(st.booleans())
    dtype = data.draw(st.sampled_from(DTYPES))
    batch, in_f, out_f = (data.draw(st.integers(0, 6)) for _ in range(3))
    pop = s.numel() * (2 if anti else 1)
    x = tensor(data.draw, (batch, in_f) if shared else (pop, batch, in_f), dtype, device)
    w = tensor(data.draw, (in_f, out_f) if transposed else (out_f, in_f), dtype, device)
    b = tensor(data.draw, (out_f,), dtype, device) if data.draw(st.booleans()) else None
    sigma, offset = data.draw(sigmas), data.draw(offsets)
    y = vn.virtual_perturbed_linear(x, w, b, s.to(device), sigma, offset, antithetic=anti, transposed=transposed)
    ref_fn = perturbed_linear_transposed_ref if transposed else perturbed_linear_ref
    ref = ref_fn(x.cpu(), w.cpu(), None if b is None else b.cpu(), s, sigma, offset, anti)
    assert y.shape == (pop, batch, out_f) and y.dtype == dtype
    t = tol(dtype, device)
    torch.testing.assert_close(y.cpu().double(), ref, rtol=t, atol=t * max(1, in_f) ** 0.5 * 4)


@pytest.mark.parametrize("device", DEVICES)
@FUZZ
@given(data=st.data())
def test_fuzz_lowrank_perturbed_linear(device, data):
    s = data.draw(seeds())
    anti, shared, transposed = data.draw(st.booleans()), data.draw(st.booleans()), data.draw(st.booleans())
    dtype = data.draw(st.sampled_from(DTYPES))
    rows, cols = data.draw(st.integers(2, 9)), data.draw(st.integers(2, 9))
    rank = data.draw(st.integers(1, max(1, rows * cols // (rows + cols))))
    in_f, out_f = (rows, cols) if transposed else (cols, rows)
    batch = data.draw(st.integers(0, 5))
    pop = s.numel() * (2 if anti else 1)
    x = tensor(data.draw, (batch, in_f) if shared else (pop, batch, in_f), dtype, device)
    w = tensor(data.draw, (rows, cols), dtype, device)
    b = tensor(data.draw, (out_f,), dtype, device) if data.draw(st.booleans()) else None
    sigma, offset = data.draw(sigmas), data.draw(offsets)
    y = vn.virtual_lowrank_perturbed_linear(x, w, b, s.to(device), sigma, offset, rank, antithetic=anti,
                                            transposed=transposed)
    ref = lowrank_perturbed_linear_ref(x.cpu(), w.cpu(), None if b is None else b.cpu(), s, sigma, offset, rank,
                                       anti, transposed)
    t = TOL[dtype]
    torch.testing.assert_close(y.cpu().double(), ref, rtol=t, atol=t * in_f**0.5 * 4)


@pytest.mark.parametrize("device", DEVICES)
@FUZZ
@given(data=st.data())
def test_fuzz_perturbed_embedding(device, data):
    s = data.draw(seeds())
    anti, shared = data.draw(st.booleans()), data.draw(st.booleans())
    dtype = data.draw(st.sampled_from(DTYPES))
    num, dim, n = data.draw(st.integers(1, 9)), data.draw(st.integers(0, 7)), data.draw(st.integers(0, 6))
    pop = s.numel() * (2 if anti else 1)
    idx = torch.tensor(data.draw(st.lists(st.integers(0, num - 1), min_size=n * (1 if shared else pop),
                                          max_size=n * (1 if shared else pop))), dtype=torch.int64)
    idx = idx if shared else idx.view(pop, n)
    if data.draw(st.booleans()):
        idx = idx.int()
    w = tensor(data.draw, (num, dim), dtype, device)
    sigma, offset = data.draw(sigmas), data.draw(offsets)
    y = vn.virtual_perturbed_embedding(idx.to(device), w, s.to(device), sigma, offset, antithetic=anti)
    ref = perturbed_embedding_ref(idx, w.cpu(), s, sigma, offset, anti) if pop else torch.zeros(0, n, dim)
    assert y.shape == (pop, n, dim) and y.dtype == dtype
    torch.testing.assert_close(y.cpu().double(), ref.double(), rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@FUZZ
@given(data=st.data())
def test_fuzz_gradients(device, data):
    s = data.draw(seeds(6))
    anti = data.draw(st.booleans())
    pop = s.numel() * (2 if anti else 1)
    fdtype = data.draw(st.sampled_from([torch.float32, torch.float64, torch.float16]))
    f = torch.randn(pop, generator=torch.Generator().manual_seed(data.draw(st.integers(0, 2**31)))).to(fdtype)
    sigma = data.draw(st.floats(0.015625, 2.0, width=32)) * data.draw(st.sampled_from([1, -1]))
    offset = data.draw(offsets)
    shape = (data.draw(st.integers(0, 9)), data.draw(st.integers(0, 9)))
    gw = vn.virtual_weight_gradient(f.to(device), s.to(device), shape, sigma, pop, offset, antithetic=anti)
    gb = vn.virtual_bias_gradient(f.to(device), s.to(device), (shape[0],), sigma, pop, offset, antithetic=anti)
    if pop == 0:  # the estimate from no individuals is zero (the operators' contract)
        assert not gw.any() and not gb.any() and gw.shape == shape
        return
    torch.testing.assert_close(gw.cpu().double(), gradient_ref(f, s, shape, sigma, pop, offset, anti),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gb.cpu().double(), gradient_ref(f, s, (shape[0],), sigma, pop, offset, anti),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@FUZZ
@given(data=st.data())
def test_fuzz_lowrank_gradient_and_noise(device, data):
    s = data.draw(seeds(6))
    anti = data.draw(st.booleans())
    pop = s.numel() * (2 if anti else 1)
    rows, cols = data.draw(st.integers(2, 9)), data.draw(st.integers(2, 9))
    rank = data.draw(st.integers(1, max(1, rows * cols // (rows + cols))))
    f = torch.randn(pop, generator=torch.Generator().manual_seed(data.draw(st.integers(0, 2**31))))
    sigma, offset = data.draw(st.floats(0.015625, 2.0, width=32)), data.draw(offsets)
    g = vn.virtual_lowrank_weight_gradient(f.to(device), s.to(device), (rows, cols), sigma, pop, offset, rank,
                                           antithetic=anti)
    want = lowrank_gradient_ref(f, s, (rows, cols), sigma, pop, offset, rank, anti) if pop else torch.zeros(rows, cols)
    torch.testing.assert_close(g.cpu().double(), want.double(), rtol=1e-5, atol=1e-5)
    n = vn.generate_lowrank_noise(s.to(device), (rows, cols), rank, offset)
    ref = lowrank_noise_ref(s, rows, cols, rank, offset) if s.numel() else torch.zeros(0, rows, cols)
    torch.testing.assert_close(n.cpu().double(), ref.double(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
@FUZZ
@given(data=st.data())
def test_fuzz_reduce_metric_and_generate_noise(device, data):
    s = data.draw(seeds(6))
    anti = data.draw(st.booleans())
    n = data.draw(st.integers(0, 60))
    c = tensor(data.draw, (n,), data.draw(st.sampled_from([torch.float32, torch.float64, torch.float16])), device)
    sigma, offset = data.draw(sigmas), data.draw(offsets)
    m = vn.virtual_reduce_metric(c, s.to(device), sigma, n, offset, antithetic=anti)
    assert m.shape == (s.numel() * (2 if anti else 1),)
    if n:
        torch.testing.assert_close(m.cpu().double(), reduce_metric_ref(c.cpu(), s, sigma, offset, anti),
                                   rtol=1e-5, atol=1e-6)
    else:
        assert torch.isnan(m).all()
    noise = vn.generate_noise(s.to(device), n, offset)
    assert torch.equal(noise.cpu().double(), noise_ref(s, n, offset) if s.numel() else torch.zeros(0, n).double())
