"""Low-rank virtual noise against plain inference and a materialized-factor baseline, side by side.

    python benchmarks/bench_lowrank.py --out DIR              # GPU: forward rows (bf16) and the gradient row
    python benchmarks/bench_lowrank.py --device cpu           # CPU: P=64 T=16 1024->1024 float32

Forward: per-individual x (P, T, in). "inference" is one F.linear over the P*T rows; the
materialized baseline draws each individual's factors (torch.rand), forms its weights
W + sigma c A B^T with bmm and runs bmm with x; "factored" keeps the materialized factors factored
(x @ W^T + sigma c (x @ B) @ A^T with bmm), a stronger baseline shown for reference. "of inference,
graphed": both replayed from CUDA graphs (no per-call host work; bench_cuda.graph_ms). Targets: >= 90% of inference at 4096->11008 for T >= 16, >= 80% at 768->3072, >= 1.5x the
baseline on every row. Gradient: P=4096 4096x11008 r=4 against the GEMM of the same product
(4096 x 11008 over K = P * r), target >= 70% of its rate.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from common import machine_line, markdown_table  # noqa: E402

import virtual_noise as vn  # noqa: E402

LAYERS = [(768, 3072), (4096, 11008)]
RANKS = [1, 4, 16]
TS = [1, 16, 128, 512]
ROWS = 8192  # P * T


def timer(device, graphed=False):
    """Median ms per call: eager calls back to back, or (graphed) replayed from one CUDA graph, which
    takes the host's per-call work (dispatch, checks, Triton launches) out of the GPU's way."""
    if device.type == "cuda":
        from bench_cuda import cuda_median_ms, graph_ms

        return (lambda fn: graph_ms(fn, repeats=5)) if graphed else (lambda fn: cuda_median_ms(fn, repeats=5))
    if graphed:
        return None

    def cpu_ms(fn):
        fn()
        times = []
        for _ in range(5):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e3

    return cpu_ms


def factors(P, out_f, in_f, r, x):
    a = torch.rand(P, out_f, r, device=x.device, dtype=x.dtype) - 0.5
    bf = torch.rand(P, in_f, r, device=x.device, dtype=x.dtype) - 0.5
    nb = torch.rand(P, 1, out_f, device=x.device, dtype=x.dtype) - 0.5
    return a, bf, nb


def baseline(x, w, b, P, r, sigma):
    """The naive low-rank forward: materialized factors, each individual's weights W + sigma c A B^T
    formed with bmm, then bmm with x."""
    out_f, in_f = w.shape
    a, bf, nb = factors(P, out_f, in_f, r, x)
    wp = torch.baddbmm(w.expand(P, -1, -1), a, bf.transpose(1, 2), alpha=sigma * math.sqrt(12 / r))
    return torch.baddbmm(b + sigma * nb, x, wp.transpose(1, 2))


def factored(x, w, b, P, r, sigma):
    """A stronger baseline: materialized factors kept factored, x @ W^T + sigma c (x @ B) @ A^T with bmm."""
    out_f, in_f = w.shape
    a, bf, nb = factors(P, out_f, in_f, r, x)
    return F.linear(x, w, b) + sigma * (math.sqrt(12 / r) * torch.bmm(torch.bmm(x, bf), a.transpose(1, 2)) + nb)


def forward_rows(device, dtype, layers, ranks, ts, rows_total):
    ms, gms = timer(device), timer(device, graphed=True)
    g = torch.Generator(device=device.type).manual_seed(0)
    rows, records = [], []
    for i, o in layers:
        w = (torch.randn(o, i, device=device, generator=g) / i**0.5).to(dtype)
        b = torch.randn(o, device=device, generator=g).to(dtype)
        for t in ts:
            P = max(2, rows_total // t)
            x = torch.randn(P, t, i, device=device, generator=g).to(dtype)
            inf = ms(lambda: F.linear(x.view(-1, i), w, b))
            inf_g = gms(lambda: F.linear(x.view(-1, i), w, b)) if gms else None
            for r in ranks:
                seeds = torch.arange(P // 2, device=device)
                call = lambda: vn.virtual_lowrank_perturbed_linear(x, w, b, seeds, 0.01, 0, r, antithetic=True)  # noqa: E731
                ours = ms(call)
                ours_g = gms(call) if gms else None
                try:
                    base = ms(lambda: baseline(x, w, b, P, r, 0.01))
                except torch.OutOfMemoryError:
                    base = None
                fact = ms(lambda: factored(x, w, b, P, r, 0.01))
                rec = dict(layer=f"{i}->{o}", P=P, T=t, rank=r, inference_ms=inf, ms=ours, baseline_ms=base,
                           factored_ms=fact, of_inference=inf / ours, vs_baseline=base / ours if base else None,
                           vs_factored=fact / ours, graph_inference_ms=inf_g, graph_ms=ours_g,
                           graph_of_inference=inf_g / ours_g if gms else None)
                records.append(rec)
                rows.append([rec["layer"], P, t, r, f"{inf:.3f}", f"{ours:.3f}", f"{base:.3f}" if base else "OOM",
                             f"{fact:.3f}", f"{rec['of_inference']:.2f}",
                             f"{rec['graph_of_inference']:.2f}" if gms else "-",
                             f"{rec['vs_baseline']:.1f}x" if base else "-", f"{rec['vs_factored']:.2f}x"])
                print(" | ".join(map(str, rows[-1])), flush=True)
    return rows, records


def gradient_row(device, P=4096, shape=(4096, 11008), r=4):
    ms = timer(device)
    f = torch.randn(P, device=device)
    seeds = torch.arange(P // 2, device=device)
    ours = ms(lambda: vn.virtual_lowrank_weight_gradient(f, seeds, shape, 0.01, P, 0, r, antithetic=True))
    a = torch.randn(shape[0], P // 2 * r, device=device)
    bt = torch.randn(P // 2 * r, shape[1], device=device)
    gemm = ms(lambda: a @ bt)
    flops = 2 * shape[0] * shape[1] * (P // 2) * r
    return dict(P=P, shape=f"{shape[0]}x{shape[1]}", rank=r, ms=ours, gemm_ms=gemm, of_gemm=gemm / ours,
                tflops=flops / ours / 1e9)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.set_float32_matmul_precision("high")
    head = machine_line() + (f"\nGPU: {torch.cuda.get_device_name()}" if device.type == "cuda" else "")
    if device.type == "cpu":
        rows, records = forward_rows(device, torch.float32, [(1024, 1024)], [4], [16], 64 * 16)
        grad = None
        title = "float32, antithetic"
    else:
        grad = gradient_row(device)
        print(f"gradient: {grad['ms']:.3f} ms, {grad['of_gemm']:.0%} of the GEMM ({grad['gemm_ms']:.3f} ms)",
              flush=True)
        rows, records = forward_rows(device, torch.bfloat16, LAYERS, RANKS, TS, ROWS)
        title = "bf16, antithetic"
    table = markdown_table(["layer", "P", "T", "rank", "inference ms", "ours ms", "materialized ms", "factored ms",
                            "of inference", "of inference, graphed", "vs materialized", "vs factored"], rows)
    text = f"{head}\n{title}\n\n{table}\n"
    if grad:
        text += (f"\nGradient P={grad['P']} {grad['shape']} r={grad['rank']}: {grad['ms']:.3f} ms, "
                 f"{grad['tflops']:.0f} TFLOP/s, {grad['of_gemm']:.0%} of the GEMM of the same product "
                 f"({grad['gemm_ms']:.3f} ms)\n")
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_lowrank.md"), "w") as f:
            f.write(text)
        with open(os.path.join(args.out, "bench_lowrank.json"), "w") as f:
            json.dump({"forward": records, "gradient": grad}, f, indent=1)


if __name__ == "__main__":
    main()
