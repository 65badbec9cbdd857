"""Forward and gradient see the same noise; antithetic pairs; determinism."""

import subprocess
import sys
import textwrap

import torch
from reference import noise_ref

import virtual_noise as vn


def test_identity_forward_recovers_noise(gen):
    out_f, in_f, p = 13, 9, 4
    seeds = torch.randint(0, 2**40, (p,), generator=gen)
    y = vn.virtual_perturbed_linear(torch.eye(in_f), torch.zeros(out_f, in_f), torch.zeros(out_f), seeds, 1.0, 77)
    noise = vn.generate_noise(seeds, out_f * in_f + out_f, 77)
    # Row k of Y[i] is N_i[:, k] + nb_i.
    want = noise[:, : out_f * in_f].reshape(p, out_f, in_f).transpose(1, 2) + noise[:, None, out_f * in_f :]
    torch.testing.assert_close(y, want, rtol=0, atol=1e-6)


def test_one_hot_fitness_returns_noise(gen):
    out_f, in_f, p, sigma = 6, 5, 5, 0.25
    seeds = torch.randint(0, 2**40, (p,), generator=gen)
    noise = vn.generate_noise(seeds, out_f * in_f + out_f, 3)
    for i in range(p):
        f = torch.zeros(p)
        f[i] = 1.0
        gw = vn.virtual_weight_gradient(f, seeds, (out_f, in_f), sigma, p, 3)
        gb = vn.virtual_bias_gradient(f, seeds, (out_f,), sigma, p, 3 + out_f * in_f)
        torch.testing.assert_close(gw, noise[i, : out_f * in_f].reshape(out_f, in_f) / (p * sigma))
        torch.testing.assert_close(gb, noise[i, out_f * in_f :] / (p * sigma))


def test_antithetic_equals_explicit_pairs(gen):
    m, sigma = 4, 0.3
    seeds = torch.randint(-(2**40), 2**40, (m,), generator=gen)
    x, w, b = torch.randn(3, 7, generator=gen), torch.randn(5, 7, generator=gen), torch.randn(5, generator=gen)
    y = vn.virtual_perturbed_linear(x, w, b, seeds, sigma, 11, antithetic=True)
    plus = vn.virtual_perturbed_linear(x, w, b, seeds, sigma, 11)
    minus = vn.virtual_perturbed_linear(x, w, b, seeds, -sigma, 11)  # -sigma N == sigma (-N)
    torch.testing.assert_close(y[0::2], plus, rtol=0, atol=1e-6)
    torch.testing.assert_close(y[1::2], minus, rtol=0, atol=1e-6)

    f = torch.randn(2 * m, generator=gen)
    g = vn.virtual_weight_gradient(f, seeds, (5, 7), sigma, 2 * m, 11, antithetic=True)
    # Explicit pair: seed m twice, the mirrored one with its fitness negated.
    f_explicit = torch.stack([f[0::2], -f[1::2]], 1).flatten()
    g_explicit = vn.virtual_weight_gradient(f_explicit, seeds.repeat_interleave(2), (5, 7), sigma, 2 * m, 11)
    torch.testing.assert_close(g, g_explicit, rtol=1e-5, atol=1e-7)

    r = vn.virtual_reduce_metric(w, seeds, sigma, w.numel(), 11, antithetic=True)
    ref = (w.double().flatten()[None] + sigma * noise_ref(seeds, w.numel(), 11, True)).abs().mean(1)
    torch.testing.assert_close(r.double(), ref, rtol=1e-6, atol=1e-7)


DETERMINISM_SCRIPT = textwrap.dedent(
    """
    import sys, torch, virtual_noise as vn
    torch.set_num_threads(int(sys.argv[1]))
    g = torch.Generator().manual_seed(0)
    seeds = torch.randint(0, 2**40, (33,), generator=g)
    x, xp = torch.randn(17, 300, generator=g), torch.randn(66, 3, 300, generator=g)
    w, b = torch.randn(130, 300, generator=g), torch.randn(130, generator=g)
    f = torch.randn(66, generator=g)
    outs = [
        vn.virtual_perturbed_linear(x, w, b, seeds, 0.1, 5, antithetic=True),
        vn.virtual_perturbed_linear(xp, w, b, seeds, 0.1, 5, antithetic=True),
        vn.virtual_weight_gradient(f, seeds, (130, 300), 0.1, 66, 5, antithetic=True),
        vn.virtual_bias_gradient(f[:33], seeds, (130,), 0.1, 33, 5),
        vn.virtual_reduce_metric(torch.randn(900_000, generator=g), seeds, 0.1, 900_000, 5),
        vn.generate_noise(seeds, 70_000, 3),
        vn.virtual_perturbed_embedding(torch.randint(0, 130, (66, 40), generator=g), w, seeds, 0.1, 5, antithetic=True),
        vn.virtual_perturbed_linear(xp, w.t(), b, seeds, 0.1, 5, antithetic=True, transposed=True),
        vn.virtual_lowrank_perturbed_linear(x, w, b, seeds, 0.1, 5, 4, antithetic=True),
        vn.virtual_lowrank_perturbed_linear(xp, w, b, seeds, 0.1, 5, 4, antithetic=True),
        vn.virtual_lowrank_weight_gradient(f, seeds, (130, 300), 0.1, 66, 5, 4, antithetic=True),
    ]
    torch.save(outs, sys.argv[2])
    """
)


def test_bit_identical_for_any_thread_count(tmp_path):
    script = tmp_path / "det.py"
    script.write_text(DETERMINISM_SCRIPT)
    results = []
    for threads, tag in [(1, "a"), (2, "b"), (2, "c")]:
        path = tmp_path / f"{tag}.pt"
        subprocess.run([sys.executable, str(script), str(threads), str(path)], check=True)
        results.append(torch.load(path))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)


def test_lowrank_forward_and_gradient_see_the_same_noise(gen):
    """Identity x recovers N_i^T + nb_i from the low-rank forward; one-hot fitness returns N_i / (P sigma)."""
    out_f, in_f, p, r, sigma = 13, 9, 4, 2, 0.25
    seeds = torch.randint(0, 2**40, (p,), generator=gen)
    n = vn.generate_lowrank_noise(seeds, (out_f, in_f), r, 77)
    nb = vn.generate_noise(seeds, out_f, 77 + out_f * in_f)
    y = vn.virtual_lowrank_perturbed_linear(torch.eye(in_f), torch.zeros(out_f, in_f), torch.zeros(out_f), seeds,
                                            1.0, 77, r)
    torch.testing.assert_close(y, n.transpose(1, 2) + nb[:, None, :], rtol=0, atol=1e-6)
    for i in range(p):
        f = torch.zeros(p)
        f[i] = 1.0
        g = vn.virtual_lowrank_weight_gradient(f, seeds, (out_f, in_f), sigma, p, 77, r)
        torch.testing.assert_close(g, n[i] / (p * sigma), rtol=1e-6, atol=1e-7)


def test_lowrank_antithetic_equals_explicit_pairs(gen):
    m, sigma, r = 4, 0.3, 3
    seeds = torch.randint(-(2**40), 2**40, (m,), generator=gen)
    for x in [torch.randn(3, 17, generator=gen), torch.randn(2 * m, 3, 17, generator=gen)]:
        w, b = torch.randn(15, 17, generator=gen), torch.randn(15, generator=gen)
        y = vn.virtual_lowrank_perturbed_linear(x, w, b, seeds, sigma, 11, r, antithetic=True)
        xs = (x, x) if x.dim() == 2 else (x[0::2], x[1::2])
        plus = vn.virtual_lowrank_perturbed_linear(xs[0], w, b, seeds, sigma, 11, r)
        minus = vn.virtual_lowrank_perturbed_linear(xs[1], w, b, seeds, -sigma, 11, r)
        torch.testing.assert_close(y[0::2], plus, rtol=0, atol=1e-6)
        torch.testing.assert_close(y[1::2], minus, rtol=0, atol=1e-6)
    f = torch.randn(2 * m, generator=gen)
    g = vn.virtual_lowrank_weight_gradient(f, seeds, (15, 17), sigma, 2 * m, 11, r, antithetic=True)
    f_explicit = torch.stack([f[0::2], -f[1::2]], 1).flatten()
    g_explicit = vn.virtual_lowrank_weight_gradient(f_explicit, seeds.repeat_interleave(2), (15, 17), sigma, 2 * m, 11, r)
    torch.testing.assert_close(g, g_explicit, rtol=1e-5, atol=1e-6)
