"""The CUDA (Triton) backend on a real GPU. Marked gpu: skipped without CUDA and
triton (CI), run on the device machine."""

import pytest
import torch
from reference import (gradient_ref, lowrank_gradient_ref, lowrank_perturbed_linear_ref, noise_ref,
                       perturbed_embedding_ref, perturbed_linear_ref, perturbed_linear_transposed_ref,
                       reduce_metric_ref)

import virtual_noise as vn

pytestmark = pytest.mark.gpu
ops = torch.ops.virtual_noise
TOL = {torch.float32: 2e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}


def seeds_for(n, g):
    return torch.randint(-(2**63), 2**63 - 1, (n,), generator=g)


@pytest.fixture(autouse=True)
def noise_precision_follows_torch():
    """These tests hold the kernels to the dot precision torch's setting names ("highest": tf32x3, float32
    accuracy; "high": tf32), the "matmul" noise precision; the default ("high" whatever torch's setting)
    is checked by test_default_noise_precision_under_torch_defaults."""
    old = vn.get_noise_precision()
    vn.set_noise_precision("matmul")
    yield
    vn.set_noise_precision(old)


def _graph_replay(fn):
    """fn() captured in a CUDA graph (after a warm-up on a side stream, as capture requires) and
    replayed once: returns the replayed output, to compare with an eager call's bits."""
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        with torch.cuda.graph(graph):
            out = fn()
    graph.replay()
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("offset", [0, 2**31 - 7, 2**32 + 3, 2**50])
def test_noise_bits_match_cpu(offset):
    s = torch.cat([seeds_for(6, torch.Generator().manual_seed(1)), torch.tensor([0, -1, 2**31])])
    n = 300_003
    assert torch.equal(vn.generate_noise(s.cuda(), n, offset).cpu(), vn.generate_noise(s, n, offset))
    assert vn.generate_noise(torch.tensor([0]).cuda(), 1, 0).item() == 0.4970219135284424


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("batch", [1, 37, 300])
@pytest.mark.parametrize("in_f", [200, 256, 208])  # K tail: 200 masked, 256 none, 208 full (16 of BK 32)
def test_perturbed_linear_vs_reference_and_cpu(dtype, shared, antithetic, with_bias, batch, in_f):
    g = torch.Generator().manual_seed(batch + in_f)
    m, out_f = 3, 150
    pop = 2 * m if antithetic else m
    s = seeds_for(m, g)
    x = torch.randn((batch, in_f) if shared else (pop, batch, in_f), generator=g).to(dtype)
    w = torch.randn(out_f, in_f, generator=g).to(dtype)
    b = torch.randn(out_f, generator=g).to(dtype) if with_bias else None
    args = (s, 0.3, 2**31 + 5)
    y = vn.virtual_perturbed_linear(x.cuda(), w.cuda(), b.cuda() if b is not None else None, *[a.cuda() if torch.is_tensor(a) else a for a in args], antithetic=antithetic)
    assert y.dtype == dtype and y.is_cuda
    ref = perturbed_linear_ref(x, w, b, *args, antithetic)
    cpu = vn.virtual_perturbed_linear(x, w, b, *args, antithetic=antithetic)
    tol = TOL[dtype]
    torch.testing.assert_close(y.cpu().double(), ref, rtol=tol, atol=tol * in_f**0.5)
    torch.testing.assert_close(y.cpu().double(), cpu.double(), rtol=tol, atol=tol * in_f**0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("batch", [1, 37, 300])
def test_perturbed_linear_transposed(dtype, shared, antithetic, batch):
    """weight stored (in, out) (Hugging Face's Conv1D): the noise in the stored layout, every path
    (PDL base, cuBLAS base, W tiles in the kernel, 256-row tiles: the Gluon kernels do not take it)."""
    g = torch.Generator().manual_seed(batch + 7 * shared)
    m, in_f, out_f = 3, 200, 150
    pop = 2 * m if antithetic else m
    s = seeds_for(m, g)
    x = torch.randn((batch, in_f) if shared else (pop, batch, in_f), generator=g).to(dtype)
    w, b = torch.randn(in_f, out_f, generator=g).to(dtype), torch.randn(out_f, generator=g).to(dtype)
    y = vn.virtual_perturbed_linear(x.cuda(), w.cuda(), b.cuda(), s.cuda(), 0.3, 2**33, antithetic=antithetic,
                                    transposed=True)
    ref = perturbed_linear_transposed_ref(x, w, b, s, 0.3, 2**33, antithetic)
    tol = TOL[dtype] if dtype != torch.float32 or torch.get_float32_matmul_precision() == "highest" else 1e-3
    torch.testing.assert_close(y.cpu().double(), ref, rtol=tol, atol=tol * in_f**0.5)


@pytest.mark.parametrize("op", ["full", "lowrank"])
@pytest.mark.parametrize("dtype,shared,batch", [(torch.float32, True, 5), (torch.bfloat16, True, 200),
                                                (torch.bfloat16, False, 5), (torch.bfloat16, False, 64),
                                                (torch.float32, False, 20), (torch.bfloat16, False, 300)])
def test_strided_bias(op, dtype, shared, batch):
    """A bias that is a strided view, through every launch path (the kernels index the bias densely)."""
    g = torch.Generator().manual_seed(batch + shared)
    m, in_f, out_f = 3, 96, 200
    s = seeds_for(m, g)
    x = torch.randn((batch, in_f) if shared else (2 * m, batch, in_f), generator=g).to(dtype)
    w = torch.randn(out_f, in_f, generator=g).to(dtype)
    b = torch.randn(2 * out_f, generator=g).to(dtype)
    args = (x.cuda(), w.cuda(), b.cuda()[::2], s.cuda(), 0.3, 2**33)
    if op == "full":
        y = vn.virtual_perturbed_linear(*args, antithetic=True)
        ref = perturbed_linear_ref(x, w, b[::2], s, 0.3, 2**33, True)
    else:
        y = vn.virtual_lowrank_perturbed_linear(*args, 2, antithetic=True)
        ref = lowrank_perturbed_linear_ref(x, w, b[::2], s, 0.3, 2**33, 2, True, False)
    tol = 2e-3 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(y.cpu().double(), ref, rtol=tol, atol=tol * in_f**0.5)


@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("scratch_rows", [64, 130, 400])
def test_perturbed_weights_blocks(antithetic, transposed, scratch_rows, monkeypatch):
    """The perturbed-weights path (T >= 256) in several scratch blocks: against float64, run to run, and replayed
    from a CUDA graph, bit for bit.
    Scratch of 64 rows: blocks of 64 rows of one seed's weight (200 rows); 130: 128 and 72 rows (multiples
    of 64); 400: whole weights of two seeds."""
    from virtual_noise.cuda import perturbed_weights

    g = torch.Generator().manual_seed(11 + antithetic + 2 * transposed + scratch_rows)
    m, batch, in_f, out_f = 5, 260, 96, 200
    pop = 2 * m if antithetic else m
    monkeypatch.setattr(perturbed_weights, "SCRATCH_BYTES", scratch_rows * (pop // m) * in_f * 2)
    s = seeds_for(m, g)
    x = torch.randn(pop, batch, in_f, generator=g).bfloat16()
    w = (torch.randn(in_f, out_f, generator=g) if transposed else torch.randn(out_f, in_f, generator=g)).bfloat16()
    b = torch.randn(out_f, generator=g).bfloat16()
    args = (x.cuda(), w.cuda(), b.cuda(), s.cuda(), 0.3, 2**33)
    call = lambda: vn.virtual_perturbed_linear(*args, antithetic=antithetic, transposed=transposed)  # noqa: E731
    y = call()
    ref = perturbed_linear_ref(x, w, b, s, 0.3, 2**33, antithetic, transposed)
    torch.testing.assert_close(y.cpu().double(), ref, rtol=2e-2, atol=2e-2 * in_f**0.5)
    assert torch.equal(call(), y)
    assert torch.equal(_graph_replay(call), y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("antithetic", [False, True])
def test_perturbed_embedding_vs_reference_and_cpu(dtype, shared, antithetic):
    g = torch.Generator().manual_seed(3 + shared + 2 * antithetic)
    m, n, num, dim = 4, 300, 1000, 200
    pop = 2 * m if antithetic else m
    s = seeds_for(m, g)
    w = torch.randn(num, dim, generator=g).to(dtype)
    idx = torch.randint(0, num, (n,) if shared else (pop, n), generator=g)
    y = vn.virtual_perturbed_embedding(idx.cuda(), w.cuda(), s.cuda(), 0.3, 2**40, antithetic=antithetic)
    cpu = vn.virtual_perturbed_embedding(idx, w, s, 0.3, 2**40, antithetic=antithetic)
    ref = perturbed_embedding_ref(idx, w, s, 0.3, 2**40, antithetic)
    tol = TOL[dtype]
    torch.testing.assert_close(y.cpu().double(), ref, rtol=tol, atol=tol)
    torch.testing.assert_close(y.cpu(), cpu, rtol=tol, atol=tol)
    with pytest.raises(IndexError, match=r"every entry of `indices` must be in \[0, num_embeddings = 1000\)"):
        vn.virtual_perturbed_embedding(torch.tensor([5, 1000]).cuda(), w.cuda(), s.cuda(), 0.3, 0)
    # Captured in a CUDA graph (no index check there: out-of-range rows would come out NaN).
    wc, ic, sc = w.cuda(), idx.cuda(), s.cuda()
    assert torch.equal(_graph_replay(lambda: vn.virtual_perturbed_embedding(ic, wc, sc, 0.3, 2**40,
                                                                            antithetic=antithetic)), y)


@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("precision", ["highest", "high"])
def test_per_individual_base_paths(antithetic, precision):
    """Per-individual float32 x: one cuBLAS GEMM into out when x flattens, W tiles in the kernel
    when it does not; both against float64 at the dot precision's tolerance."""
    from virtual_noise.cuda import perturbed_linear as lin

    g = torch.Generator().manual_seed(11)
    m, batch, in_f, out_f = 5, 3, 300, 70
    pop = 2 * m if antithetic else m
    s = seeds_for(m, g)
    w, b = torch.randn(out_f, in_f, generator=g), torch.randn(out_f, generator=g)
    flat = torch.randn(pop, batch, in_f, generator=g)
    strided = torch.randn(pop, in_f, batch, generator=g).transpose(1, 2)
    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision(precision)
        for x, cublas in [(flat, True), (strided, False)]:
            xc = x.cuda()
            y = vn.virtual_perturbed_linear(xc, w.cuda(), b.cuda(), s.cuda(), 0.3, 9, antithetic=antithetic)
            assert lin._base_in_out(xc, y) is cublas
            err = (y.cpu().double() - perturbed_linear_ref(x, w, b, s, 0.3, 9, antithetic)).abs().max().item()
            assert err < (1e-3 if precision == "highest" else 0.1), (cublas, err)
    finally:
        torch.set_float32_matmul_precision(old)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [True, False])
def test_cublas_base_16bit(dtype, with_bias):
    """The shared part x @ W^T + b for 16-bit x: cuBLAS on the 16-bit operands with a float32
    result, which must hold float32 accuracy (exact products, float32 sums) like the casts did."""
    from virtual_noise.cuda import perturbed_linear as lin

    g = torch.Generator().manual_seed(3)
    x = torch.randn(37, 700, generator=g).to(dtype)
    w = torch.randn(150, 700, generator=g).to(dtype)
    b = torch.randn(150, generator=g).to(dtype) if with_bias else None
    xc, wc, bc = x.cuda(), w.cuda(), b.cuda() if with_bias else None
    base = lin._cublas_base(xc, wc, bc)
    assert base.dtype == torch.float32 and base.shape == (37, 150)
    ref = x.double() @ w.double().t() + (b.double() if with_bias else 0)
    # float32 sums of 700 exact products of magnitude ~1 (sums of magnitude ~26): errors of
    # ~1e-5, and 1e-3 leaves 100x of room; a 16-bit rounding of those sums would be off by up to
    # ~8e-3 (fp16) or ~6e-2 (bf16).
    assert (base.cpu().double() - ref).abs().max().item() < 1e-3
    # The same call captured in a CUDA graph (the out_dtype GEMM included) replays the eager bits.
    assert torch.equal(_graph_replay(lambda: lin._cublas_base(xc, wc, bc)), base)


@pytest.mark.parametrize("dtype,precision", [(torch.float32, "highest"), (torch.float32, "high"),
                                             (torch.float16, "high"), (torch.bfloat16, "high")])
@pytest.mark.parametrize("batch", [1, 37, 128, 129])
@pytest.mark.parametrize("with_bias", [True, False])
def test_shared_base(dtype, precision, batch, with_bias):
    """x @ W^T + b for shared x (_shared_base_kernel up to batch 128, which the forward kernel
    follows programmatically dependent on Hopper; cuBLAS above) against float64, at the
    precision it promises: float32 sums for float32 "highest" and 16-bit operands, tf32
    products for "high"."""
    from virtual_noise.cuda import perturbed_linear as lin
    from virtual_noise.cuda.device_info import fp32_dot_precision

    g = torch.Generator().manual_seed(batch)
    x = torch.randn(batch, 700, generator=g).to(dtype)
    w = torch.randn(150, 700, generator=g).to(dtype)
    b = torch.randn(150, generator=g).to(dtype) if with_bias else None
    ref = x.double() @ w.double().t() + (b.double() if with_bias else 0)
    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision(precision)
        dot = fp32_dot_precision(torch.device("cuda")) if dtype == torch.float32 else "ieee"
        base, pdl, copy = lin._shared_base(x.cuda(), w.cuda(), b.cuda() if with_bias else None, dot)
    finally:
        torch.set_float32_matmul_precision(old)
    assert base.dtype == torch.float32 and base.shape == (batch, 150) and copy is None
    assert pdl == (batch <= 128 and torch.cuda.get_device_capability()[0] >= 9 and torch.version.hip is None)
    err = (base.cpu().double() - ref).abs().max().item()
    # Sums of 700 products of magnitude ~1 (|sum| ~26): float32 sums err ~1e-5; tf32 operands
    # (11-bit significands) ~0.03 typical, up to ~0.15 over these outputs, which the 1e-3 bound
    # would catch.
    assert err < (0.3 if (dtype == torch.float32 and precision == "high") else 1e-3), err


@pytest.mark.parametrize("precision", ["highest", "high"])
def test_forward_waits_for_its_inputs(precision):
    """On Hopper the forward kernel starts before the base GEMM ends (PDL) and waits for the
    base only in its epilogue; at "high" (tf32) it reads x's float16 copy, made in the base
    GEMM's launch. x written by the kernel just before, and the base and the copy, must still be
    read complete: calls enqueued back to back on fresh x each time (the allocator reuses the
    memory, so a read of stale or half-written x, base or copy would show) give the bits of the
    same calls made one at a time with a synchronize around each."""
    from virtual_noise.cuda import perturbed_linear as lin

    g = torch.Generator().manual_seed(12)
    s = seeds_for(256, g).cuda()
    x0 = torch.randn(64, 784, generator=g).cuda()
    w, b = torch.randn(256, 784, generator=g).cuda() / 28, torch.randn(256, generator=g).cuda()

    def call(i):
        return vn.virtual_perturbed_linear(x0 * (i + 1) - i, w, b, s, 0.1, 3, antithetic=i % 2 == 1)

    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        if _hopper():
            assert lin._takes_copy(x0, lin.fp32_dot_precision(x0.device)) == (precision == "high")
        want = []
        for i in range(12):
            torch.cuda.synchronize()
            want.append(call(i))
            torch.cuda.synchronize()
        got = [call(i) for i in range(12)]
        torch.cuda.synchronize()
    finally:
        torch.set_float32_matmul_precision(old)
    for i in range(12):
        assert torch.equal(got[i], want[i]), i


@pytest.mark.parametrize("shared", [True, False])
def test_default_noise_precision_under_torch_defaults(shared):
    """Under torch's "highest": x @ W^T + b at float32 accuracy (sigma = 0 shows it), the noise term at
    tf32 by default, at float32 accuracy with set_noise_precision("highest")."""
    g = torch.Generator().manual_seed(1)
    s = seeds_for(4, g)
    x = torch.randn(64, 512, generator=g) if shared else torch.randn(8, 64, 512, generator=g)
    w, b = torch.randn(128, 512, generator=g), torch.randn(128, generator=g)
    xc, wc, bc, sc = x.cuda(), w.cuda(), b.cuda(), s.cuda()
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        errs = {}
        for setting in ["high", "highest"]:
            vn.set_noise_precision(setting)
            for sigma in [0.0, 0.5]:
                y = vn.virtual_perturbed_linear(xc, wc, bc, sc, sigma, 0, antithetic=True)
                ref = perturbed_linear_ref(x, w, b, s, sigma, 0, True)
                errs[setting, sigma] = (y.cpu().double() - ref).abs().max().item()
    finally:
        torch.set_float32_matmul_precision(old)
    assert errs["high", 0.0] < 1e-3 and errs["highest", 0.0] < 1e-3, errs  # the base: float32 sums
    assert errs["highest", 0.5] < 1e-3 and 4 * errs["highest", 0.5] < errs["high", 0.5] < 0.1, errs
    with pytest.raises(ValueError, match="must be one of high, highest, matmul"):
        vn.set_noise_precision("exact")


def test_tf32_precision_follows_torch_setting():
    g = torch.Generator().manual_seed(0)
    s = seeds_for(2, g).cuda()
    x, w = torch.randn(64, 512, generator=g).cuda(), torch.randn(64, 512, generator=g).cuda()
    ref = perturbed_linear_ref(x.cpu(), w.cpu(), None, s.cpu(), 0.5, 0)
    old = torch.get_float32_matmul_precision()
    try:
        errs = {}
        for p in ["highest", "high"]:
            torch.set_float32_matmul_precision(p)
            errs[p] = (vn.virtual_perturbed_linear(x, w, None, s, 0.5, 0).cpu().double() - ref).abs().max().item()
    finally:
        torch.set_float32_matmul_precision(old)
    # highest: float32-level (tf32x3); high: tf32, visibly coarser.
    assert errs["highest"] < 1e-3 and 4 * errs["highest"] < errs["high"], errs


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.skipif(not _hopper(), reason="the Gluon large-batch kernel runs on sm_90 only")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("batch,in_f,out_f,kernel", [
    (129, 40, 70, "per_tile"), (300, 256, 150, "per_tile"), (1000, 200, 64, "per_tile"),
    (300, 256, 150, "noise_slab"), (1000, 200, 64, "noise_slab"), (513, 512, 130, "noise_slab")])
def test_large_batch_kernel(dtype, antithetic, batch, in_f, out_f, kernel, monkeypatch):
    """Shared x, batch > 128: each Gluon kernel (perturbed_linear_large_batch.py) against
    float64 and bit for bit against the tl.dot kernel (float32 x as its row-scaled float16
    copy: as accurate as the tl.dot kernel), plus graph capture and compile."""
    from virtual_noise.cuda import perturbed_linear_large_batch as large
    from virtual_noise.cuda import row_scaled_fp16

    # These populations are too small for the launcher's own choice of the noise-slab
    # kernel (one program per SM): force it, or keep it off, and check which one ran
    # and with which x-ring depth.
    slab_stages = []
    real_slab = large._noise_slab_kernel

    class Spy:
        def __getitem__(self, grid):
            launch = real_slab[grid]

            def run(*args, **kwargs):
                slab_stages.append(kwargs["STAGES"])
                return launch(*args, **kwargs)

            return run

    monkeypatch.setattr(large, "_noise_slab_kernel", Spy())
    if kernel == "noise_slab":
        monkeypatch.setattr(large, "SLAB_MIN_PROGRAMS_PER_SM", 0)
    else:
        monkeypatch.setattr(large, "_noise_slab_stages", lambda x, programs: 0)

    g = torch.Generator().manual_seed(batch + in_f)
    m = 3
    s = seeds_for(m, g)
    x = torch.randn(batch, in_f, generator=g).to(dtype)
    w = torch.randn(out_f, in_f, generator=g).to(dtype)
    b = torch.randn(out_f, generator=g).to(dtype) if batch != 300 else None
    sigma, offset = 0.3, 2**31 + 5
    wc, bc, sc = w.cuda(), b.cuda() if b is not None else None, s.cuda()
    xc = x.cuda()

    def call(xs):
        return vn.virtual_perturbed_linear(xs, wc, bc, sc, sigma, offset, antithetic=antithetic)

    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # fp32 takes the kernel at tf32 only
    try:
        assert large.applies(xc, "tf32" if dtype == torch.float32 else "ieee")
        with monkeypatch.context() as mp:
            mp.setattr(large, "applies", lambda *a: False)
            y_tl = call(xc)
        tol = 2e-3 if dtype == torch.float32 else TOL[dtype]  # tf32 operands
        ref = perturbed_linear_ref(x, w, b, s, sigma, offset, antithetic)
        err_tl = (y_tl.cpu().double() - ref).abs().max().item()
        if dtype == torch.float32:
            # float32 x at tf32 as its row-scaled float16 copy (row_scaled_fp16.py), forced at every width
            # here: exact tf32 operands, but float16 wgmma sums them otherwise than tf32 wgmma does, so
            # the outputs are compared with float64, not bit for bit.
            with monkeypatch.context() as mp:
                mp.setattr(row_scaled_fp16, "serves", lambda *a: True)
                y_rs = call(xc)
                assert torch.equal(call(xc), y_rs)  # bit-stable run to run
            err_rs = (y_rs.cpu().double() - ref).abs().max().item()
            assert err_rs <= 1.02 * err_tl, (err_rs, err_tl)
            torch.testing.assert_close(y_rs, y_tl, rtol=1e-5, atol=1e-5 * in_f**0.5)
            # 16-bit operands: the ring's cap, 8 stages of 128 x 128 bytes, fits beside every slab here.
            assert slab_stages == ([8, 8] if kernel == "noise_slab" else [])
            slab_stages.clear()
            # And float32 operands through TMA, the route for narrow x, or where the copy would be too big.
            monkeypatch.setattr(row_scaled_fp16, "serves", lambda *a: False)
        y = call(xc)
        if kernel == "noise_slab":
            # fp32's slab at 512 inputs (128 KiB) leaves room for 6 stages of 128 x 32 floats
            assert slab_stages == [6 if dtype == torch.float32 and in_f == 512 else 8]
        else:
            assert slab_stages == []
        torch.testing.assert_close(y.cpu().double(), ref, rtol=tol, atol=tol * in_f**0.5)
        # Same noise, same operand rounding and K order: the two kernels agree bit for bit.
        assert torch.equal(y, y_tl)
        # A row stride TMA cannot take (not 16-byte aligned) falls back to the tl.dot kernel, but for
        # float32 x served by its float16 copy.
        pad = torch.zeros(batch, in_f + 1, dtype=dtype, device="cuda")
        pad[:, :in_f] = xc
        assert not large.applies(pad[:, :in_f], "tf32" if dtype == torch.float32 else "ieee")
        assert torch.equal(call(pad[:, :in_f]), y_tl)
        if dtype == torch.float32:
            with monkeypatch.context() as mp:
                mp.setattr(row_scaled_fp16, "serves", lambda *a: True)
                assert large.applies(pad[:, :in_f], "tf32")
                assert torch.equal(call(pad[:, :in_f]), y_rs)
        if batch == 129 and dtype == torch.float32:  # the float16 copy's kernel captured too
            monkeypatch.setattr(row_scaled_fp16, "serves", lambda *a: True)
            fn = lambda: call(xc)  # noqa: E731
            assert torch.equal(_graph_replay(fn), y_rs)
            assert torch.equal(torch.compile(fn, fullgraph=True)(), y_rs)
    finally:
        torch.set_float32_matmul_precision(old)


@pytest.mark.skipif(not _hopper(), reason="the float16 copy of x is taken on sm_90 only")
@pytest.mark.parametrize("batch,in_f,out_f,antithetic,with_bias", [
    (64, 784, 256, True, True), (40, 1000, 130, False, True), (128, 600, 64, True, False), (100, 512, 70, False, True)])
def test_row_scaled_copy_small_batch(batch, in_f, out_f, antithetic, with_bias, monkeypatch):
    """Shared float32 x at tf32, batches of 33 to 128: the tl.dot kernel on x's row-scaled float16
    copy (made in the base GEMM's launch) against float64, as accurate as the same kernel on
    float32 x, bit-stable run to run, and under graph capture and compile."""
    from virtual_noise.cuda import perturbed_linear as lin

    g = torch.Generator().manual_seed(batch + in_f)
    s = seeds_for(5, g)
    x = torch.randn(batch, in_f, generator=g)
    w = torch.randn(out_f, in_f, generator=g) / in_f**0.5
    b = torch.randn(out_f, generator=g) if with_bias else None
    ref = perturbed_linear_ref(x, w, b, s, 0.3, 2**31 + 5, antithetic)
    xc, wc, bc, sc = x.cuda(), w.cuda(), b.cuda() if with_bias else None, s.cuda()

    def call():
        return vn.virtual_perturbed_linear(xc, wc, bc, sc, 0.3, 2**31 + 5, antithetic=antithetic)

    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        assert lin._takes_copy(xc, "tf32")
        y = call()
        assert torch.equal(call(), y)
        with monkeypatch.context() as mp:
            mp.setattr(lin, "_takes_copy", lambda *a: False)
            y_tl = call()
        err = (y.cpu().double() - ref).abs().max().item()
        err_tl = (y_tl.cpu().double() - ref).abs().max().item()
        assert err <= 1.02 * err_tl and err < 2e-3 * in_f**0.5, (err, err_tl)
        torch.testing.assert_close(y, y_tl, rtol=1e-5, atol=1e-5 * in_f**0.5)
        if batch == 64:
            assert torch.equal(_graph_replay(call), y)
            assert torch.equal(torch.compile(call, fullgraph=True)(), y)
    finally:
        torch.set_float32_matmul_precision(old)


@pytest.mark.skipif(not _hopper(), reason="the float16 copy of x is taken on sm_90 only")
@pytest.mark.parametrize("batch", [300, 200, 64])  # the noise-slab, the per-tile and the tl.dot kernel
def test_row_scaled_copy_wide_range_and_nonfinite(batch, monkeypatch):
    """float32 x through its row-scaled float16 copy: rows from 1e-30 to 1e30, with elements
    1e-12 of their row's largest, are as accurate relative to each row's size as the tl.dot
    kernel's tf32 on float32 x; rows holding NaN or Inf give NaN and Inf where that kernel does."""
    from virtual_noise.cuda import perturbed_linear as lin
    from virtual_noise.cuda import perturbed_linear_large_batch as large

    monkeypatch.setattr(large, "SLAB_MIN_PROGRAMS_PER_SM", 0)
    g = torch.Generator().manual_seed(batch)
    in_f, out_f = 520, 70
    s = seeds_for(3, g)
    x = torch.randn(batch, in_f, generator=g) * torch.logspace(-30, 30, batch)[:, None].float()
    x[::7, ::5] *= 1e-12
    w = torch.zeros(out_f, in_f)  # W = 0, b = 0: the outputs are the noise term alone
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        def both(xs):
            """(the call on x's copy, the same call with the tl.dot kernel on float32 x)"""
            def call():
                return vn.virtual_perturbed_linear(xs.cuda(), w.cuda(), None, s.cuda(), 0.3, 7).cpu()

            y = call()
            with monkeypatch.context() as mp:
                if batch > 128:
                    mp.setattr(large, "applies", lambda *a: False)
                else:
                    mp.setattr(lin, "_takes_copy", lambda *a: False)
                return y, call()

        assert large.applies(x.cuda(), "tf32") if batch > 128 else lin._takes_copy(x.cuda(), "tf32")
        y, y_tl = both(x)
        ref = perturbed_linear_ref(x, w, None, s, 0.3, 7)
        size = x.abs().amax(1).double()[None, :, None] * in_f**0.5
        err, err_tl = ((y.double() - ref).abs() / size).max().item(), ((y_tl.double() - ref).abs() / size).max().item()
        assert err <= 1.02 * err_tl and err < 1e-3, (err, err_tl)
        x[3, 5], x[10, 7], x[11, 2], x[11, 9] = float("nan"), float("inf"), -float("inf"), 1e30
        y, y_tl = both(x)
        assert torch.equal(y.isnan(), y_tl.isnan()) and torch.equal(y.isinf(), y_tl.isinf())
        assert y[:, 3].isnan().all() and not y[:, 12:].isnan().any()
    finally:
        torch.set_float32_matmul_precision(old)


@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("shape,m", [((256, 784), 64), ((3, 5), 3000), ((1024, 1024), 8)])
def test_gradients_vs_reference_and_cpu(antithetic, shape, m):
    g = torch.Generator().manual_seed(m)
    pop = 2 * m if antithetic else m
    s, f = seeds_for(m, g), torch.randn(pop, generator=g)
    out = vn.virtual_weight_gradient(f.cuda(), s.cuda(), shape, 0.05, pop, 2**32 + 1, antithetic=antithetic).cpu()
    cpu = vn.virtual_weight_gradient(f, s, shape, 0.05, pop, 2**32 + 1, antithetic=antithetic)
    scale = cpu.abs().max().item()
    torch.testing.assert_close(out, cpu, rtol=1e-4, atol=1e-5 * scale)
    if shape[0] * shape[1] * pop <= 2e7:
        ref = gradient_ref(f, s, shape, 0.05, pop, 2**32 + 1, antithetic)
        torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5 * scale)
    b = vn.virtual_bias_gradient(f.cuda(), s.cuda(), (shape[0],), 0.05, pop, 7, antithetic=antithetic).cpu()
    torch.testing.assert_close(b, vn.virtual_bias_gradient(f, s, (shape[0],), 0.05, pop, 7, antithetic=antithetic),
                               rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("n,m", [(1_000_003, 5), (100, 700)])
def test_reduce_metric_vs_cpu(antithetic, n, m):
    g = torch.Generator().manual_seed(n)
    s, c = seeds_for(m, g), torch.randn(n, generator=g)
    out = vn.virtual_reduce_metric(c.cuda(), s.cuda(), 0.1, n, 2**31 + 1, antithetic=antithetic).cpu()
    torch.testing.assert_close(out, vn.virtual_reduce_metric(c, s, 0.1, n, 2**31 + 1, antithetic=antithetic),
                               rtol=1e-5, atol=1e-6)
    if n * m <= 1e6:
        torch.testing.assert_close(out.double(), reduce_metric_ref(c, s, 0.1, 2**31 + 1, antithetic), rtol=1e-5, atol=1e-6)


def test_indices_past_2_pow_31_inside_one_block():
    # A block of more than 2^31 elements: element indices themselves pass 2^31 in the kernels.
    s = torch.tensor([12345]).cuda()
    n = 2**31 + 1000
    f = torch.ones(1).cuda()
    g = vn.virtual_bias_gradient(f, s, (n,), 1.0, 1, 0)
    tail = noise_ref([12345], 1000, 2**31).float().flatten()
    assert torch.equal(g[2**31:].cpu(), tail)
    del g
    r = vn.virtual_reduce_metric(torch.zeros(n, device="cuda"), s, 1.0, n, 0)
    assert abs(r.item() - 0.25) < 1e-3  # mean |U[-0.5, 0.5)|


def test_deterministic_run_to_run():
    g = torch.Generator().manual_seed(3)
    s, f = seeds_for(512, g).cuda(), torch.randn(1024, generator=g).cuda()
    x, w = torch.randn(64, 512, generator=g).cuda(), torch.randn(256, 512, generator=g).cuda()
    for fn in [lambda: vn.virtual_perturbed_linear(x, w, None, s, 0.1, 0, antithetic=True),
               lambda: vn.virtual_weight_gradient(f, s, (256, 512), 0.1, 1024, 0, antithetic=True),
               lambda: vn.virtual_bias_gradient(f[:512], s, (37,), 0.1, 512, 0),
               lambda: vn.virtual_reduce_metric(w, s, 0.1, w.numel(), 0, antithetic=True)]:
        a, b = fn(), fn()
        assert torch.equal(a, b)


def test_opcheck_cuda():
    g = torch.Generator().manual_seed(5)
    s = seeds_for(3, g).cuda()
    x, w, b = torch.randn(4, 32, generator=g).cuda(), torch.randn(16, 32, generator=g).cuda(), torch.randn(16, generator=g).cuda()
    f = torch.randn(6, generator=g).cuda()
    for op, args in [(ops.perturbed_linear, (x, w, b, s, 0.1, 0, True)),
                     (ops.perturbed_linear, (x.expand(3, 4, 32).bfloat16(), w.bfloat16(), None, s, 0.1, 5, False)),
                     (ops.perturbed_linear, (x, w.t().contiguous(), b, s, 0.1, 0, True, True)),
                     (ops.perturbed_embedding, (torch.tensor([1, 15, 3]).cuda(), w, s, 0.1, 0, True)),
                     (ops.weight_gradient, (f, s, [16, 32], 0.1, 6, 0, True)),
                     (ops.bias_gradient, (f[:3], s, [16], 0.1, 3, 512, False)),
                     (ops.reduce_metric, (w, s, 0.1, 512, 0, False)),
                     (ops.generate_noise, (s, 100, 2**33))]:
        torch.library.opcheck(op, args)


def test_cuda_graph_capture_and_compile():
    g = torch.Generator().manual_seed(6)
    s = seeds_for(8, g).cuda()
    x, w, b = torch.randn(16, 64, generator=g).cuda(), torch.randn(32, 64, generator=g).cuda(), torch.randn(32, generator=g).cuda()
    f = torch.randn(16, generator=g).cuda()

    xp = torch.randn(16, 16, 64, generator=g).cuda()  # per individual: the cuBLAS base written into out

    def step():
        y = vn.virtual_perturbed_linear(x, w, b, s, 0.1, 0, antithetic=True)
        yp = vn.virtual_perturbed_linear(xp, w, b, s, 0.1, 0, antithetic=True)
        fit = y.mean(dim=(1, 2)) + yp.mean(dim=(1, 2)) + f
        return vn.virtual_weight_gradient(fit, s, (32, 64), 0.1, 16, 0, antithetic=True)

    want = step()
    torch.cuda.synchronize()
    assert torch.equal(_graph_replay(step), want)
    compiled = torch.compile(step, fullgraph=True)
    torch.testing.assert_close(compiled(), want)
    # "reduce-overhead": inductor's CUDA graphs, the README's advice for host-bound layers. The
    # third call replays the recorded graph.
    overhead = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):
        got = overhead().clone()
    torch.testing.assert_close(got, want)


def test_es_training_on_cuda(tmp_path):
    from virtual_noise.__main__ import main
    import json

    out = tmp_path / "run"
    assert main(["train", "--device", "cuda", "--generations", "100", "--no-progress", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["device"].startswith("cuda") and summary["test_acc"] >= 0.9


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("rank,transposed", [(1, False), (4, True), (16, False)])
@pytest.mark.parametrize("batch,matmul_precision", [(130, "highest"), (130, "high"), (16, "high")])
def test_lowrank_vs_reference_and_cpu(dtype, shared, antithetic, rank, transposed, batch, matmul_precision):
    # "high" takes the fused GEMM (lowrank_gemm.py) for per-individual x, also float32; T = 16 puts
    # several individuals in one row tile (at rank 16, 8 x 17 slot columns: the noise dot in chunks).
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(matmul_precision)
    try:
        _check_lowrank(dtype, shared, antithetic, rank, transposed, batch)
    finally:
        torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("batch", [130, 16])
def test_lowrank_fused_gemm_tma(dtype, transposed, batch, monkeypatch):
    # The fused GEMM's tiles through tensor descriptors (Hopper), taken here at any size: rows and inputs
    # past the ends zero-filled by the copy engine (304 inputs: 16-byte rows in every dtype).
    from virtual_noise.cuda import lowrank_gemm

    if not lowrank_gemm.supports_tma(torch.device("cuda")):
        pytest.skip("tensor descriptors need compute capability 9.0")
    monkeypatch.setattr(lowrank_gemm, "TMA_MIN_FLOPS", 0)
    taken = []
    descriptors = lowrank_gemm.tma_descriptors
    monkeypatch.setattr(lowrank_gemm, "tma_descriptors", lambda *a: taken.append(descriptors(*a)) or taken[-1])
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        _check_lowrank(dtype, False, True, 2, transposed, batch, in_f=304)
    finally:
        torch.set_float32_matmul_precision(before)
    assert taken and all(d is not None for d in taken)


@pytest.mark.parametrize("rank", [4, 16])
def test_lowrank_fused_gemm_looped(rank, monkeypatch):
    # From LOOP_FROM_SLOTS slot columns the noise dot's chunks run in a loop instead of unrolled (T = 16: 8
    # individuals per row tile, 8 (r + 1) columns): both forms against the reference, and the same bits.
    from virtual_noise.cuda import lowrank_gemm

    outs = []
    for loop_from in (0, lowrank_gemm.MAX_SLOTS + 1):
        monkeypatch.setattr(lowrank_gemm, "LOOP_FROM_SLOTS", loop_from)
        outs.append(_check_lowrank(torch.bfloat16, False, True, rank, False, 16))
    assert torch.equal(outs[0], outs[1])


def _check_lowrank(dtype, shared, antithetic, rank, transposed, batch, in_f=300):
    g = torch.Generator().manual_seed(rank + shared + batch)
    m, out_f = 3, 200
    pop = 2 * m if antithetic else m
    s = seeds_for(m, g)
    x = torch.randn((batch, in_f) if shared else (pop, batch, in_f), generator=g).to(dtype)
    w = (torch.randn(in_f, out_f, generator=g) if transposed else torch.randn(out_f, in_f, generator=g)) / in_f**0.5
    w, b = w.to(dtype), torch.randn(out_f, generator=g).to(dtype)
    args = (s, 0.3, 2**33, rank)
    y = vn.virtual_lowrank_perturbed_linear(x.cuda(), w.cuda(), b.cuda(), s.cuda(), 0.3, 2**33, rank,
                                            antithetic=antithetic, transposed=transposed)
    ref = lowrank_perturbed_linear_ref(x, w, b, *args, antithetic, transposed)
    cpu = vn.virtual_lowrank_perturbed_linear(x, w, b, *args, antithetic=antithetic, transposed=transposed)
    # The noise term's dot at tf32 (docs/precision.md) on terms up to ~10 here: ~1e-2 where it nearly cancels
    # x @ W^T (float16 measured up to 7e-3); float32 at "high" runs x @ W^T at tf32 too, as torch's GEMM does.
    tol = {torch.float32: 2e-3 if torch.get_float32_matmul_precision() == "highest" else 2e-2,
           torch.bfloat16: 3e-2, torch.float16: 1e-2}[dtype]
    torch.testing.assert_close(y.cpu().double(), ref, rtol=tol, atol=tol)
    torch.testing.assert_close(y.cpu().double(), cpu.double(), rtol=tol, atol=tol)
    assert torch.equal(y, vn.virtual_lowrank_perturbed_linear(x.cuda(), w.cuda(), b.cuda(), s.cuda(), 0.3, 2**33,
                                                              rank, antithetic=antithetic, transposed=transposed))
    return y


@pytest.mark.parametrize("antithetic", [False, True])
def test_lowrank_gradient_and_noise_vs_cpu(antithetic):
    g = torch.Generator().manual_seed(2)
    m, rows, cols, r = 300, 128, 96, 4
    pop = 2 * m if antithetic else m
    s, f = seeds_for(m, g), torch.randn(pop, generator=g)
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        got = vn.virtual_lowrank_weight_gradient(f.cuda(), s.cuda(), (rows, cols), 0.2, pop, 7, r, antithetic=antithetic)
    finally:
        torch.set_float32_matmul_precision(old)
    ref = lowrank_gradient_ref(f, s, (rows, cols), 0.2, pop, 7, r, antithetic)
    torch.testing.assert_close(got.cpu().double(), ref, rtol=1e-4, atol=1e-4)
    assert torch.equal(vn.generate_lowrank_noise(s.cuda(), (rows, cols), r, 7).cpu(),
                       vn.generate_lowrank_noise(s, (rows, cols), r, 7))
