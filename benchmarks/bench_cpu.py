"""CPU throughput of the fused operators against a naive materialized-noise
PyTorch implementation (torch.rand noise + baddbmm; noise @ fitness), measured
side by side in one run. Prints a markdown table of noise elements/s, medians.

    python benchmarks/bench_cpu.py [--repeats 5] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import machine_line, markdown_table, median_seconds  # noqa: E402

import virtual_noise as vn  # noqa: E402


def naive_forward(x, w, b, pop, sigma):
    out_f, in_f = w.shape
    noise = torch.rand(pop, out_f, in_f) - 0.5
    nb = torch.rand(pop, out_f) - 0.5
    weights = w + sigma * noise
    return torch.baddbmm((b + sigma * nb)[:, None, :], x.expand(pop, *x.shape), weights.transpose(1, 2))


def naive_gradient(f, n, pop, sigma):
    noise = torch.rand(pop, n) - 0.5
    return f @ noise / (pop * sigma)


def naive_reduce(c, pop, sigma):
    return (c + sigma * (torch.rand(pop, c.numel()) - 0.5)).abs().mean(dim=1)


def cases(quick: bool):
    p64 = dict(P=64, B=32, inf=784, outf=256)
    yield "forward", p64
    yield "forward antithetic", p64
    yield "weight gradient", dict(P=64, inf=784, outf=256)
    yield "reduce", dict(P=64, n=784 * 256 + 256)
    if not quick:
        yield "weight gradient", dict(P=1024, inf=1024, outf=1024)


def run(kind, c, repeats):
    sigma = 0.02
    g = torch.Generator().manual_seed(0)
    P = c["P"]
    if kind.startswith("forward"):
        anti = "antithetic" in kind
        x = torch.randn(c["B"], c["inf"], generator=g)
        w, b = torch.randn(c["outf"], c["inf"], generator=g), torch.randn(c["outf"], generator=g)
        seeds = torch.arange(P // 2 if anti else P)
        elements = P * c["outf"] * c["inf"]
        ours = median_seconds(lambda: vn.virtual_perturbed_linear(x, w, b, seeds, sigma, 0, antithetic=anti), repeats)
        naive = median_seconds(lambda: naive_forward(x, w, b, P, sigma), repeats)
        shape = f"P={P} B={c['B']} {c['inf']}->{c['outf']}"
    elif kind == "weight gradient":
        n = c["outf"] * c["inf"]
        f = torch.randn(P, generator=g)
        seeds = torch.arange(P)
        elements = P * n
        ours = median_seconds(lambda: vn.virtual_weight_gradient(f, seeds, (c["outf"], c["inf"]), sigma, P, 0), repeats)
        naive = median_seconds(lambda: naive_gradient(f, n, P, sigma), max(1, repeats // 2))
        shape = f"P={P} {c['outf']}x{c['inf']}"
    else:
        cvec = torch.randn(c["n"], generator=g)
        seeds = torch.arange(P)
        elements = P * c["n"]
        ours = median_seconds(lambda: vn.virtual_reduce_metric(cvec, seeds, sigma, c["n"], 0), repeats)
        naive = median_seconds(lambda: naive_reduce(cvec, P, sigma), repeats)
        shape = f"P={P} n={c['n']}"
    return [kind, shape, f"{ours * 1e3:.2f}", f"{elements / ours / 1e9:.2f}", f"{naive * 1e3:.2f}",
            f"{elements / naive / 1e9:.2f}", f"{naive / ours:.1f}x"]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="skip the P=1024 1024x1024 gradient")
    args = ap.parse_args()
    rows = [run(kind, c, args.repeats) for kind, c in cases(args.quick)]
    print(machine_line())
    print(markdown_table(["op", "shape", "ours ms", "ours G el/s", "naive ms", "naive G el/s", "speed-up"], rows))


if __name__ == "__main__":
    main()
