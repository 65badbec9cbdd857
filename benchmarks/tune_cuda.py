"""Sweeps the Triton launch configurations over the benchmark shapes (a tool for
choosing the static heuristics in python/virtual_noise/cuda/; not run in CI).

    python benchmarks/tune_cuda.py [--ops forward,gradient,reduce] [--asm DIR] > tune.txt

Each line: the config, its median time and rate, and the compiled kernel's
registers per thread and spilled bytes. --asm writes the TTGIR/PTX of the best
forward config of each shape, to see what the compiler did with the noise tile.
"""

import argparse
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_cuda import FORWARD, cuda_median_ms  # noqa: E402

import virtual_noise as vn  # noqa: E402
from virtual_noise.cuda import noise_gradient, perturbed_linear, reduce_metric  # noqa: E402


class Recorder:
    """Stands in for a jitted kernel and keeps the handle of the last compiled launch."""

    def __init__(self, kernel):
        self.kernel, self.last = kernel, None

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.last = self.kernel[grid](*args, **kwargs)
            return self.last
        return launch


def sweep(name, configs, patch, fn, elements, recorder=None, top=6):
    results = []
    for cfg in configs:
        patch(cfg)
        try:
            ms = cuda_median_ms(fn, repeats=5, warmup=1)
        except Exception as e:  # a config that does not compile or run
            print(f"  {name} {cfg} failed: {type(e).__name__}: {str(e)[:100]}")
            continue
        k = recorder.last if recorder else None
        regs = f" regs {getattr(k, 'n_regs', '?')} spills {getattr(k, 'n_spills', '?')}" if k is not None else ""
        results.append((ms, cfg, regs, k))
    results.sort(key=lambda r: r[0])
    for ms, cfg, regs, _ in results[:top]:
        print(f"  {name} {cfg}: {ms:.3f} ms, {elements / ms / 1e6:.0f} G el/s{regs}")
    sys.stdout.flush()
    return results


def tune_forward(asm_dir):
    rec = Recorder(perturbed_linear._perturbed_linear_kernel)
    perturbed_linear._perturbed_linear_kernel = rec
    original = perturbed_linear.tiles
    for P, B, i, o, per in FORWARD:
        x = torch.randn((P, B, i) if per else (B, i), device="cuda")
        w, b = torch.randn(o, i, device="cuda"), torch.randn(o, device="cuda")
        if B <= 128:
            bm = max(16, 1 << (B - 1).bit_length())
            # warps a multiple of 4 and BM a multiple of 64: wgmma; otherwise mma.sync.
            configs = [(bm, bn, bk, warps, st, reg) for bn in (16, 32, 64, 128) for bk in (16, 32, 64) for warps in (2, 4, 8)
                       for st in (2, 3) for reg in (None, 96) if bn * bk <= 64 * 64]
        else:
            configs = [(bm, bn, bk, warps, st, None) for bm in (256, 512) for bn in (16, 32, 64, 128) for bk in (32, 64)
                       for warps in (4, 8) for st in (2, 3) if bm * bn <= 512 * 64 and not (bm == 512 and warps == 4)]
        seeds = torch.arange(P, device="cuda")
        print(f"forward P={P} B={B} {i}->{o} per={per} (default {original(B, o, i, not per)})")
        res = sweep("cfg", configs, lambda c: setattr(perturbed_linear, "tiles", lambda *a, c=c: c),
                    lambda: vn.virtual_perturbed_linear(x, w, b, seeds, 0.02, 0), P * o * i, rec)
        if asm_dir and res and res[0][3] is not None:
            stem = os.path.join(asm_dir, f"forward_P{P}_B{B}_{i}x{o}")
            for kind in ("ttgir", "ptx"):
                with open(f"{stem}.{kind}", "w") as f:
                    f.write(res[0][3].asm[kind])
    perturbed_linear.tiles = original
    perturbed_linear._perturbed_linear_kernel = rec.kernel


def tune_gradient():
    for P, o, i in [(1024, 1024, 1024), (16384, 2048, 512), (4096, 256, 1)]:
        f = torch.randn(P, device="cuda")
        seeds = torch.arange(P, device="cuda")
        print(f"gradient P={P} {o}x{i}")
        sweep("cfg", list(itertools.product([256, 512, 1024], [8, 16, 32], [4, 8])),
              lambda c: setattr(noise_gradient, "config", lambda *a, c=c: c),
              lambda: vn.virtual_weight_gradient(f, seeds, (o, i), 0.02, P, 0), P * o * i)


def tune_reduce():
    c = torch.randn(50_000_000, device="cuda")
    seeds = torch.arange(1024, device="cuda")
    print("reduce P=1024 n=50M")
    sweep("cfg", list(itertools.product([4, 8, 16], [256, 512, 1024], [4, 8])),
          lambda cf: setattr(reduce_metric, "config", lambda *a, cf=cf: cf),
          lambda: vn.virtual_reduce_metric(c, seeds, 0.02, c.numel(), 0), 1024 * c.numel())


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ops", default="forward,gradient,reduce")
    ap.add_argument("--asm", default=None, help="directory for the forward kernels' TTGIR/PTX")
    args = ap.parse_args()
    torch.set_float32_matmul_precision("high")
    if args.asm:
        os.makedirs(args.asm, exist_ok=True)
    ops = args.ops.split(",")
    if "forward" in ops:
        tune_forward(args.asm)
    if "gradient" in ops:
        tune_gradient()
    if "reduce" in ops:
        tune_reduce()


if __name__ == "__main__":
    main()
