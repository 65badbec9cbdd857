"""Transformer-shaped layers with per-individual activations x (P, T, in), against the machine's limit.

    python benchmarks/bench_layers.py --out DIR [--dtypes bf16,fp16,fp32] [--quick]

For each layer, rows per individual T and population P, side by side in one run:
- inference: one F.linear over all P*T rows (what serving the layer costs);
- ours: virtual_perturbed_linear with per-individual x;
- t_ideal = max(GEMM time of the same work at the dtype's measured dense rate,
  hash time of P*in*out noise elements at the measured splitmix64 roof).
Prints t_ideal / t (target >= 0.70 on every row) and inference / t (target >= 0.80 at T >= 2048).
Rows under 2 ms are also replayed from CUDA graphs (both sides), where the host's per-call work
(dispatch, argument checks, launches) is gone: "graphed" columns; longer rows hide it anyway.
Float32 runs at torch's "high" precision (tf32). Not antithetic: every individual its own noise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from bench_cuda import cuda_median_ms, graph_ms, roofs, t_ideal_ms  # noqa: E402
from common import machine_line, markdown_table  # noqa: E402

import virtual_noise as vn  # noqa: E402

LAYERS = [(768, 2304), (768, 3072), (3072, 768), (4096, 11008), (11008, 4096)]
TS = [1, 16, 128, 512, 2048]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def populations(t: int) -> list[int]:
    """P*T = 4096 for every T, and 32768 from T = 128 (the issue's range 256..32768)."""
    ps = [max(2, 4096 // t)]
    if t >= 128:
        ps.append(32768 // t)
    return ps


def dense_rate(dtype) -> float:
    """TFLOP/s of a large GEMM in this dtype (torch's matmul precision)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=dtype)
    ms = cuda_median_ms(lambda: a @ a, repeats=5)
    return 2 * 8192**3 / ms / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=".")
    ap.add_argument("--dtypes", default="bf16,fp16,fp32")
    ap.add_argument("--layers", default=None, help="e.g. 768x3072,4096x11008")
    ap.add_argument("--ts", default=None, help="e.g. 1,128,2048")
    ap.add_argument("--antithetic", action="store_true")
    args = ap.parse_args()
    torch.set_float32_matmul_precision("high")
    layers = LAYERS if not args.layers else [tuple(map(int, s.split("x"))) for s in args.layers.split(",")]
    ts = TS if not args.ts else [int(v) for v in args.ts.split(",")]
    roof = roofs()["splitmix64 hash+reduce"]  # G el/s
    g = torch.Generator(device="cuda").manual_seed(0)
    rows, records = [], []
    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        rate = dense_rate(dtype)
        print(f"{dname}: dense GEMM {rate:.0f} TFLOP/s, hash roof {roof:.0f} G el/s", flush=True)
        for i, o in layers:
            w = torch.randn(o, i, device="cuda", generator=g).to(dtype) / i**0.5
            b = torch.randn(o, device="cuda", generator=g).to(dtype)
            for t in ts:
                for P in populations(t):
                    x = torch.randn(P, t, i, device="cuda", generator=g).to(dtype)
                    seeds = torch.arange(P // 2 if args.antithetic else P, device="cuda")
                    inference = lambda: F.linear(x.view(-1, i), w, b)  # noqa: E731
                    ours = lambda: vn.virtual_perturbed_linear(  # noqa: E731
                        x, w, b, seeds, 0.01, 0, antithetic=args.antithetic)
                    inf_ms = cuda_median_ms(inference, repeats=5)
                    ours_ms = cuda_median_ms(ours, repeats=5)
                    ideal = t_ideal_ms(P * i * o / (2 if args.antithetic else 1), 2 * P * t * i * o, roof, rate)
                    rec = dict(dtype=dname, layer=f"{i}->{o}", P=P, T=t, inference_ms=inf_ms, ms=ours_ms,
                               ideal_ms=ideal, ideal_frac=ideal / ours_ms, inference_frac=inf_ms / ours_ms)
                    graphed = ["-", "-"]
                    if ours_ms < 2.0:
                        g_inf = graph_ms(inference, repeats=3)
                        g_ours = graph_ms(ours, repeats=3)
                        rec.update(graph_inference_ms=g_inf, graph_ms=g_ours)
                        graphed = [f"{ideal / g_ours:.2f}", f"{g_inf / g_ours:.2f}"]
                    records.append(rec)
                    rows.append([dname, f"{i}->{o}", P, t, f"{inf_ms:.3f}", f"{ours_ms:.3f}", f"{ideal:.3f}",
                                 f"{rec['ideal_frac']:.2f}", f"{rec['inference_frac']:.2f}", *graphed])
                    print(" | ".join(map(str, rows[-1])), flush=True)
    head = (f"{machine_line()}\nGPU: {torch.cuda.get_device_name()} | splitmix64 roof {roof:.0f} G el/s"
            + (" | antithetic" if args.antithetic else ""))
    table = markdown_table(["dtype", "layer", "P", "T", "inference ms", "ours ms", "t_ideal ms", "t_ideal / t",
                            "inference / t", "t_ideal / t, graphed", "inference / t, graphed"], rows)
    print(head + "\n\n" + table)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_layers.md"), "w") as f:
        f.write(head + "\n\n" + table + "\n")
    with open(os.path.join(args.out, "bench_layers.json"), "w") as f:
        json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
