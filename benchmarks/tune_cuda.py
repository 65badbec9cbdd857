"""Sweeps the Triton launch configurations over the benchmark shapes (a tool for
choosing the static heuristics in python/virtual_noise/cuda/; not run in CI).

    python benchmarks/tune_cuda.py > tune.txt
"""

import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_cuda import cuda_median_ms  # noqa: E402

import virtual_noise as vn  # noqa: E402
from virtual_noise.cuda import noise_gradient, perturbed_linear, reduce_metric  # noqa: E402

torch.set_float32_matmul_precision("high")
FORWARD = [(1024, 64, 784, 256, False), (4096, 1, 256, 256, True), (256, 64, 1024, 1024, False),
           (64, 256, 4096, 4096, False), (16384, 64, 512, 2048, False), (256, 1024, 512, 512, False)]


def sweep(name, configs, patch, fn, elements):
    results = []
    for cfg in configs:
        patch(cfg)
        try:
            ms = cuda_median_ms(fn, repeats=5, warmup=1)
        except Exception as e:  # a config that does not compile or run
            print(f"  {name} {cfg} failed: {type(e).__name__}: {str(e)[:80]}")
            continue
        results.append((ms, cfg))
    results.sort()
    for ms, cfg in results[:4]:
        print(f"  {name} {cfg}: {ms:.3f} ms, {elements / ms / 1e6:.0f} G el/s")
    sys.stdout.flush()


original = perturbed_linear.tiles
for P, B, i, o, per in FORWARD:
    x = torch.randn((P, B, i) if per else (B, i), device="cuda")
    w, b = torch.randn(o, i, device="cuda"), torch.randn(o, device="cuda")
    bms = [max(16, min(128, 1 << (B - 1).bit_length()))] if B <= 128 else [128, 256]
    configs = [c for c in itertools.product(bms, [64, 128], [32, 64], [4, 8], [1, 2] if B <= 128 else [2, 3])
               if c[0] * c[1] <= 256 * 128]
    for anti in (False,):
        seeds = torch.arange(P // 2 if anti else P, device="cuda")
        print(f"forward P={P} B={B} {i}->{o} per={per} anti={anti} (default {original(B, o, i, not per)})")
        sweep("cfg", configs, lambda c: setattr(perturbed_linear, "tiles", lambda *a, c=c: c),
              lambda: vn.virtual_perturbed_linear(x, w, b, seeds, 0.02, 0, antithetic=anti), P * o * i)
perturbed_linear.tiles = original

for P, o, i in [(1024, 1024, 1024), (16384, 2048, 512), (4096, 256, 1)]:
    f = torch.randn(P, device="cuda")
    for anti in (False,):
        seeds = torch.arange(P // 2 if anti else P, device="cuda")
        print(f"gradient P={P} {o}x{i} anti={anti}")
        sweep("cfg", list(itertools.product([256, 512, 1024], [8, 16, 32], [4, 8])),
              lambda c: setattr(noise_gradient, "config", lambda *a, c=c: c),
              lambda: vn.virtual_weight_gradient(f, seeds, (o, i), 0.02, P, 0, antithetic=anti), P * o * i)

c = torch.randn(50_000_000, device="cuda")
for anti in (False,):
    seeds = torch.arange(512 if anti else 1024, device="cuda")
    print(f"reduce P=1024 n=50M anti={anti}")
    sweep("cfg", list(itertools.product([4, 8, 16], [256, 512, 1024], [4, 8])),
          lambda cf: setattr(reduce_metric, "config", lambda *a, cf=cf: cf),
          lambda: vn.virtual_reduce_metric(c, seeds, 0.02, c.numel(), 0, antithetic=anti), 1024 * c.numel())
