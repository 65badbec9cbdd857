"""Every Triton kernel, interpreted on CPU tensors, against the C++ CPU operators
and the float64 reference: bit-identical noise, matching outputs."""

import pytest
import torch
from reference import (gradient_ref, lowrank_gradient_ref, lowrank_noise_ref, lowrank_perturbed_linear_ref, noise_ref,
                       perturbed_linear_ref, reduce_metric_ref)

import virtual_noise as vn
from virtual_noise.cuda import generate_noise as gen
from virtual_noise.cuda import lowrank
from virtual_noise.cuda import noise_gradient as grad
from virtual_noise.cuda import perturbed_embedding as emb
from virtual_noise.cuda import perturbed_linear as lin
from virtual_noise.cuda import reduce_metric as red

BIG = [0, 5, 2**31 - 3, 2**32 + 7, 2**45 + 1]


def seeds_for(n, g):
    return torch.randint(-(2**63), 2**63 - 1, (n,), generator=g)


@pytest.mark.parametrize("offset", BIG)
def test_noise_bits_identical(offset):
    g = torch.Generator().manual_seed(offset % 1000)
    s = torch.cat([seeds_for(5, g), torch.tensor([0, -1, 2**31, -(2**63), 2**63 - 1])])
    assert torch.equal(gen.generate_noise(s, 1500, offset), vn.generate_noise(s, 1500, offset))


def test_forward_noise_tile_bits_identical():
    # W = 0, b = 0, sigma = 1, x = I: Y[i] = N_i^T + nb_i exactly (ieee dot with the identity).
    s = torch.tensor([3, -9, 2**40])
    out_f, in_f = 40, 33
    y = lin.perturbed_linear(torch.eye(in_f), torch.zeros(out_f, in_f), torch.zeros(out_f), s, 1.0, 2**33, False)
    noise = vn.generate_noise(s, out_f * in_f + out_f, 2**33)
    want = noise[:, : out_f * in_f].view(3, out_f, in_f).transpose(1, 2) + noise[:, None, out_f * in_f:]
    assert torch.equal(y, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("in_f", [70, 64, 48])  # K tail: 70 masked, 64 none, 48 full (16 of BK 32)
def test_perturbed_linear(dtype, shared, antithetic, with_bias, in_f):
    g = torch.Generator().manual_seed(hash((dtype, shared, antithetic, with_bias, in_f)) % 2**31)
    m, batch, out_f = 3, 5, 150  # several K steps, out spans two tiles
    pop = 2 * m if antithetic else m
    s = seeds_for(m, g)
    x = torch.randn((batch, in_f) if shared else (pop, batch, in_f), generator=g).to(dtype)
    w = torch.randn(out_f, in_f, generator=g).to(dtype)
    b = torch.randn(out_f, generator=g).to(dtype) if with_bias else None
    y = lin.perturbed_linear(x, w, b, s, 0.3, 2**32 + 11, antithetic)
    cpu = vn.virtual_perturbed_linear(x, w, b, s, 0.3, 2**32 + 11, antithetic=antithetic)
    ref = perturbed_linear_ref(x, w, b, s, 0.3, 2**32 + 11, antithetic)
    assert y.dtype == dtype and y.shape == cpu.shape
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol * in_f**0.5)
    torch.testing.assert_close(y.double(), cpu.double(), rtol=tol, atol=tol * in_f**0.5)


@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("transposed", [False, True])
def test_perturbed_linear_merged_dots(antithetic, transposed, monkeypatch):
    # Per-individual 16-bit x with 64-row tiles and more: one dot per member with W + s sigma N rounded to
    # x's dtype. Against the float64 reference of exactly that: the perturbed weight rounded to float16.
    calls = []
    monkeypatch.setattr(lin, "_merges", lambda x, bm: calls.append(bm) or lin.MERGE_FROM_ROWS <= bm)
    g = torch.Generator().manual_seed(7 + antithetic + 2 * transposed)
    m, batch, in_f, out_f = 3, 40, 70, 90
    pop = 2 * m if antithetic else m
    s = seeds_for(m, g)
    x = torch.randn(pop, batch, in_f, generator=g).half()
    w = (torch.randn(in_f, out_f, generator=g) if transposed else torch.randn(out_f, in_f, generator=g)).half()
    b = torch.randn(out_f, generator=g).half()
    y = lin.perturbed_linear(x, w, b, s, 0.3, 2**33 + 1, antithetic, transposed)
    assert calls == [64]
    wv = (w.t() if transposed else w).double()
    noise = vn.generate_noise(s, out_f * in_f + out_f, 2**33 + 1).double()
    nw, nb = noise[:, : out_f * in_f], noise[:, out_f * in_f:]
    nw = nw.view(m, in_f, out_f).transpose(1, 2) if transposed else nw.view(m, out_f, in_f)
    signs = [1.0, -1.0] if antithetic else [1.0]
    for i in range(pop):
        u, sgn = (i // 2, signs[i % 2]) if antithetic else (i, 1.0)
        wp = (wv + sgn * 0.3 * nw[u]).half().double()  # the perturbed weight in x's dtype
        want = x[i].double() @ wp.t() + b.double() + sgn * 0.3 * nb[u]
        torch.testing.assert_close(y[i].double(), want, rtol=2e-3, atol=2e-2)


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("in_f", [70, 48])
def test_perturbed_linear_transposed(shared, antithetic, in_f):
    """weight stored (in, out) (Hugging Face's Conv1D): the noise follows the stored layout."""
    g = torch.Generator().manual_seed(in_f + 2 * shared + antithetic)
    m, batch, out_f = 2, 5, 90
    pop = 2 * m if antithetic else m
    s = seeds_for(m, g)
    x = torch.randn((batch, in_f) if shared else (pop, batch, in_f), generator=g)
    w, b = torch.randn(in_f, out_f, generator=g), torch.randn(out_f, generator=g)
    y = lin.perturbed_linear(x, w, b, s, 0.3, 2**33 + 5, antithetic, True)
    cpu = vn.virtual_perturbed_linear(x, w, b, s, 0.3, 2**33 + 5, antithetic=antithetic, transposed=True)
    noise = noise_ref(s, in_f * out_f + out_f, 2**33 + 5, antithetic)
    wp = w.double()[None] + 0.3 * noise[:, : in_f * out_f].view(pop, in_f, out_f)
    xs = x.double().expand(pop, batch, in_f) if shared else x.double()
    ref = torch.bmm(xs, wp) + (b.double()[None] + 0.3 * noise[:, in_f * out_f:])[:, None]
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5 * in_f**0.5)
    torch.testing.assert_close(y, cpu, rtol=1e-5, atol=1e-5 * in_f**0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("antithetic", [False, True])
def test_perturbed_embedding(dtype, shared, antithetic):
    g = torch.Generator().manual_seed(3 * shared + antithetic)
    m, n, num, dim = 3, 37, 50, 72  # dim spans a partial column block
    pop = 2 * m if antithetic else m
    s = seeds_for(m, g)
    w = torch.randn(num, dim, generator=g).to(dtype)
    idx = torch.randint(0, num, (n,) if shared else (pop, n), generator=g)
    y = emb.perturbed_embedding(idx, w, s, 0.3, 2**40 + 3, antithetic)
    cpu = vn.virtual_perturbed_embedding(idx, w, s, 0.3, 2**40 + 3, antithetic=antithetic)
    noise = noise_ref(s, num * dim, 2**40 + 3, antithetic).view(pop, num, dim)
    table = w.double()[None] + 0.3 * noise
    ref = torch.stack([table[i][idx if shared else idx[i]] for i in range(pop)])
    assert y.dtype == dtype and y.shape == (pop, n, dim)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol)
    torch.testing.assert_close(y.double(), cpu.double(), rtol=tol, atol=tol)


@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("scratch", [1 << 20, 3000])  # whole weights per chunk; row blocks of one seed
@pytest.mark.parametrize("with_bias", [True, False])
def test_perturbed_weights_path(antithetic, transposed, scratch, with_bias, monkeypatch):
    """Per-individual x with many rows: the perturbed weights hashed once into scratch, then a batched GEMM."""
    from virtual_noise.cuda import perturbed_weights as pw

    monkeypatch.setattr(pw, "MIN_ROWS", 8)
    monkeypatch.setattr(pw, "SCRATCH_BYTES", scratch)
    monkeypatch.setattr(pw, "ALIGN_ROWS", 4)  # row blocks of 10 fitting rows: 8 per block, then a short one
    g = torch.Generator().manual_seed(scratch + antithetic + 2 * transposed)
    m, rows, in_f, out_f = 3, 9, 37, 50
    pop = 2 * m if antithetic else m
    s = seeds_for(m, g)
    x = torch.randn(pop, rows, in_f, generator=g)
    w = torch.randn(in_f, out_f, generator=g) if transposed else torch.randn(out_f, in_f, generator=g)
    b = torch.randn(2 * out_f, generator=g)[::2] if with_bias else None  # strided, as users may pass it
    y = lin.perturbed_linear(x, w, b, s, 0.3, 2**32 + 1, antithetic, transposed)
    cpu = vn.virtual_perturbed_linear(x, w, b, s, 0.3, 2**32 + 1, antithetic=antithetic, transposed=transposed)
    ref = perturbed_linear_ref(x, w, b, s, 0.3, 2**32 + 1, antithetic, transposed)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y, cpu, rtol=1e-5, atol=1e-5)
    assert pw.serves(x, False)


def test_perturbed_embedding_out_of_range_row_is_nan():
    """Where the launcher cannot check the indices (a CUDA-graph capture), a bad index must not read
    out of bounds: its row comes out NaN."""
    w = torch.randn(4, 8)
    y = emb.perturbed_embedding(torch.tensor([1, 4, -1]), w, torch.tensor([7]), 0.1, 0, False)
    assert torch.isfinite(y[0, 0]).all() and torch.isnan(y[0, 1:]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("batch", [1, 5, 33])
def test_shared_base_kernel(dtype, batch):
    """The shared part x @ W^T + b from _shared_base_kernel (batches up to 128), float32 sums."""
    g = torch.Generator().manual_seed(batch)
    x = torch.randn(40, batch, generator=g).to(dtype).t()  # strided x: (batch, 40)
    w, b = torch.randn(70, 40, generator=g).to(dtype), torch.randn(70, generator=g).to(dtype)
    for bias in (b, None):
        base, pdl, copy = lin._shared_base(x, w, bias, "ieee")
        assert base.dtype == torch.float32 and base.shape == (batch, 70) and not pdl  # no PDL off-GPU
        assert copy is None
        want = x.double() @ w.double().t() + (bias.double() if bias is not None else 0)
        torch.testing.assert_close(base.double(), want, rtol=1e-5, atol=1e-4)


def test_launch_math_matches_triton():
    """The launchers' host-side cdiv and next_power_of_2 (plain Python, cheaper per call than triton's
    constexpr_functions) give triton's values, so grids and block sizes are unchanged."""
    import triton

    from virtual_noise.cuda import launch_math as lm

    for n in list(range(0, 4200)) + [2**k + d for k in range(12, 46) for d in (-1, 0, 1)]:
        assert lm.next_power_of_2(n) == triton.next_power_of_2(n), n
        for d in (1, 3, 8, 16, 32, 64, 128, 255, 256, 1024):
            assert lm.cdiv(n, d) == triton.cdiv(n, d), (n, d)


def test_perturbed_linear_strided_and_tiny():
    g = torch.Generator().manual_seed(1)
    s = seeds_for(4, g)
    x = torch.randn(4, 9, 3, generator=g).transpose(1, 2)  # (4, 3, 9) strided
    w = torch.randn(9, 6, generator=g).t()  # (6, 9) strided
    y = lin.perturbed_linear(x, w, None, s, 0.5, 1, False)
    torch.testing.assert_close(y.double(), perturbed_linear_ref(x, w, None, s, 0.5, 1), rtol=1e-5, atol=1e-5)
    # x that flattens takes the cuBLAS base written into out; this x does not (W tiles in the kernel)
    xc, b = torch.randn(4, 3, 9, generator=g), torch.randn(6, generator=g)
    assert lin._base_in_out(xc, y) and not lin._base_in_out(x, y) and not lin._base_in_out(xc, y.half())
    for anti in (False, True):
        yc = lin.perturbed_linear(xc, w, b, s[:2] if anti else s, 0.5, 1, anti)
        want = perturbed_linear_ref(xc, w, b, s[:2] if anti else s, 0.5, 1, anti)
        torch.testing.assert_close(yc.double(), want, rtol=1e-5, atol=1e-5)
    assert lin.perturbed_linear(torch.randn(0, 9), w, None, s, 0.5, 1, False).shape == (4, 0, 6)


def test_large_batch_kernel_failure_falls_back(monkeypatch):
    """If this triton's Gluon cannot build the Hopper large-batch kernel, the call warns
    once and the tl.dot kernel computes the output (no crash, no unwritten output)."""
    from virtual_noise.cuda import perturbed_linear_large_batch as large

    def gluon_rejects(*args):
        raise TypeError("Gluon API changed")

    monkeypatch.setattr(large, "_failed", False)
    monkeypatch.setattr(large, "applies", lambda x, precision, antithetic=False: not large._failed)
    monkeypatch.setattr(large, "_launch", gluon_rejects)
    g = torch.Generator().manual_seed(2)
    s, x, w = seeds_for(3, g), torch.randn(5, 9, generator=g), torch.randn(6, 9, generator=g)
    with pytest.warns(RuntimeWarning, match="Gluon large-batch kernel does not build"):
        y = lin.perturbed_linear(x, w, None, s, 0.5, 1, False)
    assert large._failed
    torch.testing.assert_close(y.double(), perturbed_linear_ref(x, w, None, s, 0.5, 1), rtol=1e-5, atol=1e-5)


def _tf32(x):
    """float32 truncated to tf32's 11 significant bits, as wgmma reads its tf32 operands."""
    return (x.view(torch.int32) & ~0x1FFF).view(torch.float32)


@pytest.mark.parametrize("in_f", [1, 37, 1500])  # 1500: rows longer than the kernel's 1024-wide chunk
def test_row_scaled_fp16(in_f):
    """float32 x as row-scaled float16 (the Hopper kernels' tf32 operands): x16 * inv_scale equals
    x truncated to tf32 for every element within 2^29 of its row's largest magnitude, the scale is a
    power of two moving that magnitude into float16's top binade, and rows with Inf or NaN keep the
    scale 1."""
    from virtual_noise.cuda import row_scaled_fp16 as rs

    g = torch.Generator().manual_seed(in_f)
    mags = torch.tensor([1.0, 3e-30, 2e30, 1e-38, 2e-40, 0.0, 1.0, 1.0, 65504.0, 7e4])
    x = torch.randn(len(mags), in_f, generator=g) * mags[:, None]
    x[0, :: max(1, in_f // 5)] *= 1e-10  # under 2^-29 of the row's largest: float16 subnormals
    x[1, ::3] *= 1e-8  # within 2^-29: still exact
    x[6, -1], x[7, 0] = float("nan"), -float("inf")
    x16, inv = rs.row_scaled_fp16(x.t().contiguous().t())  # strided x: columns contiguous
    assert x16.dtype == torch.float16 and x16.shape == x.shape and x16.stride(1) == 1
    assert (x16.stride(0) * 2) % 16 == 0 and x16.data_ptr() % 16 == 0  # TMA alignment
    top = x.abs().amax(1)
    # float32 subnormals (row 4) have fewer significant bits than tf32 keeps: not compared
    exact = (x.abs() >= top[:, None] * 2.0**-29) & (x.abs() >= 2.0**-126)
    back = x16.float() * inv[:, None]
    for r in range(len(mags)):
        e = torch.frexp(inv[r : r + 1])
        assert e.mantissa.item() == 0.5, (r, inv[r])  # a power of two
        if r in (6, 7):  # Inf / NaN: scale 1, the float16 values truncated
            assert inv[r].item() == 1.0
            continue
        if mags[r] == 0:
            assert not x16[r].float().abs().any()
            continue
        assert torch.equal(back[r][exact[r]], _tf32(x[r])[exact[r]]), r
        if top[r] > 2.0**-111:  # scaled fully: the largest magnitude lands in [2^15, 2^16)
            assert 2.0**15 <= x16[r].float().abs().max().item() < 2.0**16, r
            assert (back[r] - _tf32(x[r])).abs().max().item() <= top[r].item() * 2.0**-39, r
    assert x16[6].isnan().sum().item() == 1 and x16[7, 0].item() == -float("inf")


@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("with_bias", [True, False])
def test_perturbed_linear_on_row_scaled_copy(antithetic, with_bias, monkeypatch):
    """The tl.dot kernel on x's row-scaled float16 copy (what float32 x at tf32 takes on Hopper at
    batches of 33 to 128), forced here: the base kernel's launch writes the same copy as
    row_scaled_fp16(), and the outputs are the float64 product of x truncated to tf32 with the
    noise truncated to tf32 (float16 rtz), to float32 rounding, for rows from 1e-20 to 1e20."""
    from virtual_noise.cuda import row_scaled_fp16 as rs

    g = torch.Generator().manual_seed(17 + antithetic + 2 * with_bias)
    m, batch, in_f, out_f = 3, 6, 70, 150  # a K tail, two output tiles
    s = seeds_for(m, g)
    x = torch.randn(batch, in_f, generator=g) * torch.logspace(-20, 20, batch)[:, None].float()
    x = x.t().contiguous().t()  # strided x
    w = torch.randn(out_f, in_f, generator=g)
    b = torch.randn(out_f, generator=g) if with_bias else None
    _, pdl, (x16, inv) = lin._shared_base(x, w, b, "ieee", row_scaled=True)
    want16, want_inv = rs.row_scaled_fp16(x)
    assert not pdl and torch.equal(x16[:, :in_f], want16) and torch.equal(inv, want_inv)

    monkeypatch.setattr(lin, "_takes_copy", lambda *a: True)
    y = lin.perturbed_linear(x, w, b, s, 0.3, 2**32 + 11, antithetic)
    noise = noise_ref(s, out_f * in_f + out_f, 2**32 + 11, antithetic)
    nw = noise[:, : out_f * in_f].reshape(-1, out_f, in_f)
    want = x.double() @ w.double().t() + 0.3 * (_tf32(x).double() @ _tf32(nw.float()).double().transpose(1, 2))
    if with_bias:
        want += b.double() + 0.3 * noise[:, None, out_f * in_f:]
    # each row's scale, and the bias's where it is added (its float32 rounding is absolute)
    size = x.abs().amax(1).double()[None, :, None] + (1.0 if with_bias else 0.0)
    err = ((y.double() - want).abs() / size).max().item()
    assert err < 1e-5, err
    # float32 x itself, untruncated, would be off by tf32's rounding: the check tells the two apart
    assert ((perturbed_linear_ref(x, w, b, s, 0.3, 2**32 + 11, antithetic) - want).abs() / size).max() > 1e-4


@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("shape,m", [((7, 300), 3), ((1, 20), 200)])  # second: population splits
def test_weight_gradient(antithetic, shape, m):
    g = torch.Generator().manual_seed(m)
    pop = 2 * m if antithetic else m
    s, f = seeds_for(m, g), torch.randn(pop, generator=g)
    out = grad.weight_gradient(f, s, list(shape), 0.1, pop, 2**32 - 5, antithetic)
    cpu = vn.virtual_weight_gradient(f, s, shape, 0.1, pop, 2**32 - 5, antithetic=antithetic)
    ref = gradient_ref(f, s, shape, 0.1, pop, 2**32 - 5, antithetic)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5 * ref.abs().max().item())
    torch.testing.assert_close(out, cpu, rtol=1e-4, atol=1e-5 * ref.abs().max().item())


def test_bias_gradient_and_empty():
    g = torch.Generator().manual_seed(2)
    s, f = seeds_for(5, g), torch.randn(5, generator=g)
    torch.testing.assert_close(grad.bias_gradient(f, s, [33], 0.2, 5, 7, False),
                               vn.virtual_bias_gradient(f, s, (33,), 0.2, 5, 7), rtol=1e-5, atol=1e-6)
    assert torch.equal(grad.weight_gradient(torch.zeros(0), s[:0], [2, 3], 0.1, 0, 0, False), torch.zeros(2, 3))


@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("n,m", [(3001, 3), (10, 17)])
def test_reduce_metric(antithetic, n, m):
    g = torch.Generator().manual_seed(n)
    s, c = seeds_for(m, g), torch.randn(n, generator=g)
    out = red.reduce_metric(c, s, 0.2, n, 2**33 + 3, antithetic)
    cpu = vn.virtual_reduce_metric(c, s, 0.2, n, 2**33 + 3, antithetic=antithetic)
    torch.testing.assert_close(out.double(), reduce_metric_ref(c, s, 0.2, 2**33 + 3, antithetic), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out, cpu, rtol=1e-5, atol=1e-6)
    assert torch.isnan(red.reduce_metric(c[:0], s, 0.2, 0, 0, antithetic)).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("rank", [1, 4, 17])
def test_lowrank_perturbed_linear(dtype, shared, antithetic, transposed, rank):
    _check_lowrank(dtype, shared, antithetic, transposed, rank, 37)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("batch,rank,with_bias", [(37, 3, True), (4, 1, True), (16, 4, False), (200, 2, True),
                                                   (1, 3, True), (4, 5, False)])
def test_lowrank_fused_gemm(dtype, antithetic, batch, rank, with_bias, monkeypatch):
    # The GEMM with the rank-r term in its epilogue (lowrank_gemm.py): rows of one tile spanning several
    # individuals (T = 4, 16, 37: aligned and not), one individual over several tiles (T = 200), float32
    # at tf32 ("high"), without bias; 12 seeds at T = 1 and 4 put the noise dot in several chunks of slot
    # columns (T = 1, antithetic: 24 individuals x 4 slots in one tile).
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    calls = []
    forward = lowrank._gemm.forward
    monkeypatch.setattr(lowrank._gemm, "forward", lambda *a: calls.append(1) or forward(*a))
    _check_lowrank(dtype, False, antithetic, False, rank, batch, with_bias, seeds=12 if batch < 16 else 3)
    assert calls == [1]


@pytest.mark.parametrize("batch,rank", [(1, 3), (16, 4), (37, 2)])
def test_lowrank_fused_gemm_looped(batch, rank, monkeypatch):
    # From LOOP_FROM_SLOTS slot columns the noise dot's chunks run in a loop instead of unrolled: taken here at
    # every width, against the reference, and the same bits as the unrolled form (same chunks, same order).
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    looped = []
    kernel = lowrank._gemm._lowrank_gemm_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                looped.append(kwargs["LOOPED"])
                return kernel[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(lowrank._gemm, "_lowrank_gemm_kernel", Spy())
    outs = []
    for loop_from in (0, lowrank._gemm.MAX_SLOTS + 1):
        monkeypatch.setattr(lowrank._gemm, "LOOP_FROM_SLOTS", loop_from)
        outs.append(_check_lowrank(torch.float16, False, True, False, rank, batch, True, seeds=12))
    assert looped == [True, False]
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("batch", [16, 37])
def test_lowrank_fused_gemm_tma(dtype, transposed, batch, monkeypatch):
    # The fused GEMM's tiles loaded through tensor descriptors (Hopper): x as (rows, in), W as (out, in) or its
    # transposed (in, out) storage, rows and inputs past the ends filled with zeros by the copy engine.
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    monkeypatch.setattr(lowrank._gemm, "supports_tma", lambda device: True)
    monkeypatch.setattr(lowrank._gemm, "TMA_MIN_FLOPS", 0)
    calls = []
    descriptors = lowrank._gemm.tma_descriptors
    monkeypatch.setattr(lowrank._gemm, "tma_descriptors", lambda *a: calls.append(descriptors(*a)) or calls[-1])
    _check_lowrank(dtype, False, True, transposed, 2, batch, dims=(72, 88))
    assert len(calls) == 1 and calls[0] is not None


def test_lowrank_tma_descriptor_rules(monkeypatch):
    # Descriptors only where TMA can load the tiles: evenly strided, non-overlapping x rows, a unit inner
    # stride and 16-byte strides; anything else keeps pointer loads.
    gemm = lowrank._gemm
    monkeypatch.setattr(gemm, "supports_tma", lambda device: True)
    monkeypatch.setattr(gemm, "TMA_MIN_FLOPS", 0)
    x, w = torch.zeros(3, 16, 72, dtype=torch.float16), torch.zeros(88, 72, dtype=torch.float16)
    assert gemm.tma_descriptors(x, w, 64, 64, 64) is not None
    assert gemm.tma_descriptors(x, torch.zeros(72, 88, dtype=torch.float16).t(), 64, 64, 64) is not None
    assert gemm.tma_descriptors(x[:, :, :70], w[:, :70], 64, 64, 64) is not None  # a slice of wider rows
    assert gemm.tma_descriptors(torch.zeros(3, 16, 70, dtype=torch.float16), w[:, :70], 64, 64, 64) is None  # 140 B
    assert gemm.tma_descriptors(x[:1].expand(3, 16, 72), w, 64, 64, 64) is None  # individuals share rows
    assert gemm.tma_descriptors(x[0, :1].expand(3, 16, 72), w, 64, 64, 64) is None  # every row the same
    assert gemm.tma_descriptors(x[:, ::2], w, 64, 64, 64) is not None  # every other row: still even strides
    assert gemm.tma_descriptors(x[:, :8], w, 64, 64, 64) is None  # a gap after each individual's rows
    monkeypatch.setattr(gemm, "TMA_MIN_FLOPS", 1e11)
    assert gemm.tma_descriptors(x, w, 64, 64, 64) is None  # small calls: the descriptors' host time


def test_lowrank_fused_gemm_tma_strided_rows(monkeypatch):
    # x's rows every other row of a larger tensor, read through the descriptor's row stride.
    monkeypatch.setattr(lowrank._gemm, "supports_tma", lambda device: True)
    monkeypatch.setattr(lowrank._gemm, "TMA_MIN_FLOPS", 0)
    g = torch.Generator().manual_seed(5)
    s = seeds_for(2, g)
    x = torch.randn(4, 2 * 37, 72, generator=g).half()[:, ::2]
    w, b = torch.randn(88, 72, generator=g).half(), torch.randn(88, generator=g).half()
    assert lowrank._gemm.tma_descriptors(x, w, 128, 128, 64) is not None
    y = lowrank.lowrank_perturbed_linear(x, w, b, s, 0.3, 2**33, 2, True, False)
    ref = lowrank_perturbed_linear_ref(x, w, b, s, 0.3, 2**33, 2, True, False)
    torch.testing.assert_close(y.double(), ref, rtol=1e-2, atol=1e-2 * 72**0.5)


def _check_lowrank(dtype, shared, antithetic, transposed, rank, batch, with_bias=True, dims=(70, 90), seeds=3):
    g = torch.Generator().manual_seed(rank + 2 * shared + 4 * antithetic + 8 * transposed + 16 * batch)
    m, (in_f, out_f) = seeds, dims  # several K steps, two output tiles, a partial batch tile
    pop = 2 * m if antithetic else m
    s = seeds_for(m, g)
    x = torch.randn((batch, in_f) if shared else (pop, batch, in_f), generator=g).to(dtype)
    w = (torch.randn(in_f, out_f, generator=g) if transposed else torch.randn(out_f, in_f, generator=g)).to(dtype)
    b = torch.randn(out_f, generator=g).to(dtype) if with_bias else None
    y = lowrank.lowrank_perturbed_linear(x, w, b, s, 0.3, 2**33 + 7, rank, antithetic, transposed)
    cpu = vn.virtual_lowrank_perturbed_linear(x, w, b, s, 0.3, 2**33 + 7, rank, antithetic=antithetic,
                                              transposed=transposed)
    ref = lowrank_perturbed_linear_ref(x, w, b, s, 0.3, 2**33 + 7, rank, antithetic, transposed)
    assert y.dtype == dtype and y.shape == (pop, batch, out_f)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol * in_f**0.5)
    torch.testing.assert_close(y.double(), cpu.double(), rtol=tol, atol=tol * in_f**0.5)
    return y


@pytest.mark.parametrize("antithetic", [False, True])
def test_lowrank_gradient_and_generate(antithetic, monkeypatch):
    monkeypatch.setattr(lowrank, "SCRATCH_BYTES", 4000)  # several chunks of seeds
    monkeypatch.setattr(lowrank, "CHUNK_OF_RESULT", 0)
    g = torch.Generator().manual_seed(int(antithetic))
    m, rows, cols, r = 9, 40, 33, 3
    pop = 2 * m if antithetic else m
    s, f = seeds_for(m, g), torch.randn(pop, generator=g)
    got = lowrank.lowrank_weight_gradient(f, s, [rows, cols], 0.2, pop, 2**35, r, antithetic)
    cpu = vn.virtual_lowrank_weight_gradient(f, s, (rows, cols), 0.2, pop, 2**35, r, antithetic=antithetic)
    ref = lowrank_gradient_ref(f, s, (rows, cols), 0.2, pop, 2**35, r, antithetic)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, cpu, rtol=1e-5, atol=1e-5)
    n = lowrank.generate_lowrank_noise(s, [rows, cols], r, 2**35)
    assert torch.equal(n, vn.generate_lowrank_noise(s, (rows, cols), r, 2**35))  # the same bits as the CPU
    torch.testing.assert_close(n.double(), lowrank_noise_ref(s, rows, cols, r, 2**35), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("op", ["full", "lowrank"])
@pytest.mark.parametrize("dtype,shared,batch", [(torch.float32, True, 5), (torch.float16, True, 5),
                                                (torch.float16, False, 5), (torch.float16, False, 64),
                                                (torch.float32, False, 20), (torch.float16, False, 300)])
def test_strided_bias_every_path(op, dtype, shared, batch, monkeypatch):
    """A bias that is a strided view (every other element of a buffer) through every launch path: the shared
    base kernel, the forward kernel reading W and b itself (16-bit per-individual x; merged dots from 64 rows),
    cuBLAS's base, the perturbed-weights path and the fused low-rank GEMM. Kernels index the bias densely, so
    the launchers must hand them a contiguous one."""
    from virtual_noise.cuda import perturbed_weights as pw

    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    monkeypatch.setattr(pw, "MIN_ROWS", 256)
    g = torch.Generator().manual_seed(batch + shared)
    m, in_f, out_f = 2, 37, 50
    s = seeds_for(m, g)
    x = torch.randn((batch, in_f) if shared else (2 * m, batch, in_f), generator=g).to(dtype)
    w = torch.randn(out_f, in_f, generator=g).to(dtype)
    b = torch.randn(2 * out_f, generator=g).to(dtype)[::2]
    if op == "full":
        y = lin.perturbed_linear(x, w, b, s, 0.3, 2**33, True)
        ref = perturbed_linear_ref(x, w, b, s, 0.3, 2**33, True)
    else:
        y = lowrank.lowrank_perturbed_linear(x, w, b, s, 0.3, 2**33, 2, True, False)
        ref = lowrank_perturbed_linear_ref(x, w, b, s, 0.3, 2**33, 2, True, False)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol * in_f**0.5)
