"""Every operator against a float64 reference built from materialized noise."""

import pytest
import torch
from reference import (gradient_ref, lowrank_gradient_ref, lowrank_perturbed_linear_ref, noise_int, noise_ref,
                       perturbed_embedding_ref, perturbed_linear_ref, perturbed_linear_transposed_ref,
                       reduce_metric_ref)

import virtual_noise as vn

TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-2, 1e-2), torch.bfloat16: (2e-2, 2e-2)}


def seeds_for(n, gen):
    return torch.randint(-(2**62), 2**62, (n,), generator=gen, dtype=torch.int64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shared_x", [True, False])
@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("with_bias", [True, False])
def test_perturbed_linear(dtype, shared_x, antithetic, with_bias, gen):
    m, batch, in_f, out_f = 3, 5, 37, 70  # out spans two tiles of the CPU kernel
    pop = 2 * m if antithetic else m
    seeds = seeds_for(m, gen)
    x = torch.randn((batch, in_f) if shared_x else (pop, batch, in_f), generator=gen).to(dtype)
    w = torch.randn(out_f, in_f, generator=gen).to(dtype)
    b = torch.randn(out_f, generator=gen).to(dtype) if with_bias else None
    sigma, offset = 0.37, 12345
    y = vn.virtual_perturbed_linear(x, w, b, seeds, sigma, offset, antithetic=antithetic)
    assert y.shape == (pop, batch, out_f) and y.dtype == dtype
    ref = perturbed_linear_ref(x, w, b, seeds, sigma, offset, antithetic)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(y.double(), ref, rtol=rtol, atol=atol * in_f**0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shared_x", [True, False])
@pytest.mark.parametrize("antithetic", [False, True])
def test_perturbed_linear_transposed(dtype, shared_x, antithetic, gen):
    """weight stored (in, out), as Hugging Face's Conv1D keeps it; the noise follows that layout."""
    m, batch, in_f, out_f = 3, 5, 37, 70
    pop = 2 * m if antithetic else m
    seeds = seeds_for(m, gen)
    x = torch.randn((batch, in_f) if shared_x else (pop, batch, in_f), generator=gen).to(dtype)
    w = torch.randn(in_f, out_f, generator=gen).to(dtype)
    b = torch.randn(out_f, generator=gen).to(dtype)
    y = vn.virtual_perturbed_linear(x, w, b, seeds, 0.37, 2**33 + 1, antithetic=antithetic, transposed=True)
    assert y.shape == (pop, batch, out_f) and y.dtype == dtype
    rtol, atol = TOL[dtype]
    ref = perturbed_linear_transposed_ref(x, w, b, seeds, 0.37, 2**33 + 1, antithetic)
    torch.testing.assert_close(y.double(), ref, rtol=rtol, atol=atol * in_f**0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("antithetic", [False, True])
def test_perturbed_embedding(dtype, shared, antithetic, gen):
    m, n, num, dim = 3, 11, 40, 70
    pop = 2 * m if antithetic else m
    seeds = seeds_for(m, gen)
    w = torch.randn(num, dim, generator=gen).to(dtype)
    idx = torch.randint(0, num, (n,) if shared else (pop, n), generator=gen)
    for offset in (0, 2**32 + 9):
        y = vn.virtual_perturbed_embedding(idx, w, seeds, 0.37, offset, antithetic=antithetic)
        assert y.shape == (pop, n, dim) and y.dtype == dtype
        rtol, atol = TOL[dtype]
        torch.testing.assert_close(y.double(), perturbed_embedding_ref(idx, w, seeds, 0.37, offset, antithetic),
                                   rtol=rtol, atol=atol)


def test_perturbed_embedding_empty_and_int32(gen):
    w = torch.randn(5, 3, generator=gen)
    assert vn.virtual_perturbed_embedding(torch.zeros(0, dtype=torch.long), w, torch.arange(2), 0.1, 0).shape == (2, 0, 3)
    idx = torch.tensor([4, 0], dtype=torch.int32)
    y = vn.virtual_perturbed_embedding(idx, w, torch.arange(2), 0.1, 0)
    torch.testing.assert_close(y.double(), perturbed_embedding_ref(idx, w, torch.arange(2), 0.1, 0))


def test_perturbed_linear_offsets_past_2_pow_32(gen):
    seeds = seeds_for(2, gen)
    x, w, b = torch.randn(4, 9, generator=gen), torch.randn(6, 9, generator=gen), torch.randn(6, generator=gen)
    for offset in [2**31 - 10, 2**32 - 20, 2**45 + 3]:
        y = vn.virtual_perturbed_linear(x, w, b, seeds, 0.5, offset)
        torch.testing.assert_close(y.double(), perturbed_linear_ref(x, w, b, seeds, 0.5, offset), rtol=1e-5, atol=1e-5)


def test_perturbed_linear_non_contiguous(gen):
    seeds = seeds_for(4, gen)
    x = torch.randn(4, 11, 6, generator=gen).transpose(1, 2)  # (4, 6, 11), strided
    w = torch.randn(11, 8, generator=gen).t()  # (8, 11), strided
    b = torch.randn(16, generator=gen)[::2]
    y = vn.virtual_perturbed_linear(x, w, b, seeds, 0.2, 7)
    torch.testing.assert_close(y.double(), perturbed_linear_ref(x, w, b, seeds, 0.2, 7), rtol=1e-5, atol=1e-5)


def test_perturbed_linear_empty():
    w, b = torch.randn(3, 4), torch.randn(3)
    assert vn.virtual_perturbed_linear(torch.randn(2, 4), w, b, torch.zeros(0, dtype=torch.long), 0.1, 0).shape == (0, 2, 3)
    assert vn.virtual_perturbed_linear(torch.randn(0, 4), w, b, torch.arange(3), 0.1, 0).shape == (3, 0, 3)
    # in_features = 0: only the (perturbed) bias remains.
    seeds = torch.arange(2)
    y = vn.virtual_perturbed_linear(torch.randn(2, 0), torch.randn(3, 0), b, seeds, 0.1, 0)
    torch.testing.assert_close(y.double(), perturbed_linear_ref(torch.randn(2, 0), torch.randn(3, 0), b, seeds, 0.1, 0))


@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("shape", [(70, 33), (3, 5000), (1, 1)])
@pytest.mark.parametrize("fdtype", [torch.float32, torch.float64, torch.bfloat16])
def test_weight_gradient(antithetic, shape, fdtype, gen):
    m = 300 if shape == (1, 1) else 7  # large population on a tiny block: the split-population path
    pop = 2 * m if antithetic else m
    seeds, fitness = seeds_for(m, gen), torch.randn(pop, generator=gen).to(fdtype)
    g = vn.virtual_weight_gradient(fitness, seeds, shape, 0.05, pop, 2**33 + 1, antithetic=antithetic)
    assert g.shape == shape and g.dtype == torch.float32
    ref = gradient_ref(fitness, seeds, shape, 0.05, pop, 2**33 + 1, antithetic)
    torch.testing.assert_close(g.double(), ref, rtol=1e-4, atol=1e-5 * ref.abs().max().item())


@pytest.mark.parametrize("antithetic", [False, True])
def test_bias_gradient(antithetic, gen):
    m, n = 1000, 40
    pop = 2 * m if antithetic else m
    seeds, fitness = seeds_for(m, gen), torch.randn(pop, generator=gen)
    g = vn.virtual_bias_gradient(fitness, seeds, (n,), 0.1, pop, 999, antithetic=antithetic)
    ref = gradient_ref(fitness, seeds, (n,), 0.1, pop, 999, antithetic)
    torch.testing.assert_close(g.double(), ref, rtol=1e-4, atol=1e-5 * ref.abs().max().item())


def test_gradient_empty_population_and_block():
    none = torch.zeros(0, dtype=torch.long)
    assert torch.equal(vn.virtual_weight_gradient(torch.zeros(0), none, (2, 3), 0.1, 0, 0), torch.zeros(2, 3))
    assert vn.virtual_bias_gradient(torch.ones(2), torch.arange(2), (0,), 0.1, 2, 0).shape == (0,)


@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("n", [1, 1000, 300_007])
@pytest.mark.parametrize("cdtype", [torch.float32, torch.float16, torch.float64])
def test_reduce_metric(antithetic, n, cdtype, gen):
    m = 3
    seeds, center = seeds_for(m, gen), torch.randn(n, generator=gen).to(cdtype)
    got = vn.virtual_reduce_metric(center, seeds, 0.3, n, 2**32 + 9, antithetic=antithetic)
    assert got.shape == (2 * m if antithetic else m,) and got.dtype == torch.float32
    ref = reduce_metric_ref(center.float(), seeds, 0.3, 2**32 + 9, antithetic)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6)


def test_reduce_metric_shapes_and_empty(gen):
    center = torch.randn(4, 5, generator=gen)  # read flat
    seeds = seeds_for(2, gen)
    torch.testing.assert_close(vn.virtual_reduce_metric(center, seeds, 0.1, 20, 0).double(), reduce_metric_ref(center, seeds, 0.1, 0))
    assert vn.virtual_reduce_metric(center, torch.zeros(0, dtype=torch.long), 0.1, 20, 0).shape == (0,)
    assert torch.isnan(vn.virtual_reduce_metric(torch.zeros(0), seeds, 0.1, 0, 0)).all()


def test_generate_noise_shapes():
    assert vn.generate_noise(torch.zeros(0, dtype=torch.long), 5, 0).shape == (0, 5)
    assert vn.generate_noise(torch.arange(3), 0, 0).shape == (3, 0)
    torch.testing.assert_close(vn.generate_noise(torch.tensor([5, -5]), 10, 2**50).double(), noise_ref([5, -5], 10, 2**50), rtol=0, atol=0)


def test_compute_offsets():
    assert vn.compute_offsets([(256, 784), (256,), (10, 256), (10,)]) == [0, 200704, 200960, 203520]
    assert vn.compute_offsets([]) == []
    assert vn.compute_offsets([torch.Size([2, 3]), 4, ()]) == [0, 6, 10]
    with pytest.raises(ValueError, match=r"shapes\[1\]"):
        vn.compute_offsets([(2,), (-1, 3)])


def test_noise_precision_setting():
    old = vn.get_noise_precision()
    try:
        assert old == "high"
        for p in ("highest", "matmul", "high"):
            vn.set_noise_precision(p)
            assert vn.get_noise_precision() == p
        with pytest.raises(ValueError, match=r"`precision` must be one of high, highest, matmul; got 'ieee'"):
            vn.set_noise_precision("ieee")
    finally:
        vn.set_noise_precision(old)



def test_lowrank_factors_follow_the_integer_spec():
    """The materialized low-rank noise from factors computed with the spec in plain Python integers
    (negative seeds, offsets past 2^32)."""
    import math

    rows, cols, r, offset = 5, 4, 2, 2**33 + 11
    seeds = torch.tensor([-7, 2**62 + 3])
    n = vn.generate_lowrank_noise(seeds, (rows, cols), r, offset)
    for i, seed in enumerate(seeds.tolist()):
        a = [[noise_int(seed, offset + j * r + q) for q in range(r)] for j in range(rows)]
        b = [[noise_int(seed, offset + rows * r + k * r + q) for q in range(r)] for k in range(cols)]
        want = torch.tensor([[math.sqrt(12 / r) * sum(a[j][q] * b[k][q] for q in range(r)) for k in range(cols)]
                             for j in range(rows)], dtype=torch.float64)
        torch.testing.assert_close(n[i].double(), want, rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shared_x", [True, False])
@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("rank,transposed", [(1, False), (4, True), (8, False)])
def test_lowrank_perturbed_linear(dtype, shared_x, antithetic, rank, transposed, gen):
    m, batch, in_f, out_f = 3, 5, 37, 70
    pop = 2 * m if antithetic else m
    seeds = seeds_for(m, gen)
    x = torch.randn((batch, in_f) if shared_x else (pop, batch, in_f), generator=gen).to(dtype)
    w = (torch.randn(in_f, out_f, generator=gen) if transposed else torch.randn(out_f, in_f, generator=gen)).to(dtype)
    b = torch.randn(out_f, generator=gen).to(dtype)
    for bias in (b, None):
        y = vn.virtual_lowrank_perturbed_linear(x, w, bias, seeds, 0.37, 2**32 + 5, rank, antithetic=antithetic,
                                                transposed=transposed)
        assert y.shape == (pop, batch, out_f) and y.dtype == dtype
        rtol, atol = TOL[dtype]
        ref = lowrank_perturbed_linear_ref(x, w, bias, seeds, 0.37, 2**32 + 5, rank, antithetic, transposed)
        torch.testing.assert_close(y.double(), ref, rtol=rtol, atol=atol * in_f**0.5)


def test_lowrank_perturbed_linear_base_in_chunks(gen):
    # Per-individual x whose float32 base exceeds the CPU kernel's 16 MiB chunk: one seed's pair at a time.
    m, batch, in_f, out_f = 3, 128, 6, 16384
    seeds = seeds_for(m, gen)
    x, w, b = torch.randn(2 * m, batch, in_f, generator=gen), torch.randn(out_f, in_f, generator=gen), torch.randn(out_f)
    y = vn.virtual_lowrank_perturbed_linear(x, w, b, seeds, 0.37, 2**32 + 5, 2, antithetic=True)
    ref = lowrank_perturbed_linear_ref(x, w, b, seeds, 0.37, 2**32 + 5, 2, True, False)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("shape,rank", [((40, 30), 1), ((64, 100), 8), ((3, 500), 2)])
def test_lowrank_weight_gradient(antithetic, shape, rank, gen):
    m = 300  # more than one chunk of seeds
    pop = 2 * m if antithetic else m
    seeds, f = seeds_for(m, gen), torch.randn(pop, generator=gen)
    g = vn.virtual_lowrank_weight_gradient(f, seeds, shape, 0.3, pop, 17, rank, antithetic=antithetic)
    torch.testing.assert_close(g.double(), lowrank_gradient_ref(f, seeds, shape, 0.3, pop, 17, rank, antithetic),
                               rtol=1e-5, atol=1e-6)


def test_lowrank_variance_is_one_twelfth():
    n = vn.generate_lowrank_noise(torch.arange(64), (64, 48), 4, 0)
    assert abs(n.var().item() - 1 / 12) < 0.004 and abs(n.mean().item()) < 0.005
