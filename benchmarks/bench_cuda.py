"""CUDA (Triton) throughput against the naive materialized-noise PyTorch version,
side by side in one run, with the splitmix64 generation roof measured alongside.

    python benchmarks/bench_cuda.py [--out DIR] [--quick]

Prints a markdown table (noise elements/s, fraction of the roof, t_ideal / t, peak
extra memory beyond the output, ratio to naive) and writes bench_cuda.{md,json,png}.
t_ideal = max(hash time of the noise elements hashed (antithetic pairs hash once) at
the measured splitmix64 roof, GEMM time of the forward's 2*P*B*in*out at the
measured tf32 rate).
Float32 dots run at torch's "high" precision (tf32), the rate the targets use.
"ms" is the steady-state GPU time per call (calls enqueued back to back, so
host work overlaps the kernels); "graph ms" the same calls replayed from one
CUDA graph, so without the host's per-call work (the rate when the host keeps
up, and what torch.compile's "reduce-overhead" mode gives); "1-call ms" is one
synchronous call's latency. "G el/s" is taken from "ms".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(__file__))
from common import machine_line, markdown_table  # noqa: E402

import virtual_noise as vn  # noqa: E402
from virtual_noise.cuda.device_info import sm_count  # noqa: E402
from virtual_noise.cuda.noise_spec import counter_offset, noise_from_counter, seed_key  # noqa: E402

MiB = 2**20
ROOF_PROGRAMS_PER_SM = 16  # enough resident warps for the generation roof kernels to fill every SM


def roof_programs() -> int:
    """Programs of the generation roof kernels: ROOF_PROGRAMS_PER_SM on every SM of this GPU."""
    return ROOF_PROGRAMS_PER_SM * sm_count(torch.device("cuda"))


def calls_per_sample(fn, sample_ms):
    """Calls of fn that one timed sample enqueues so that it lasts about sample_ms (1 to 200)."""
    return max(1, min(200, int(sample_ms / max(single_call_ms(fn), 1e-3))))


def cuda_median_ms(fn, repeats=10, warmup=2, sample_ms=5.0):
    """Median GPU time per call in steady state, in ms.

    Each sample enqueues n calls back to back between two CUDA events (n chosen
    so a sample lasts about sample_ms), so the host's per-call work (dispatch,
    argument checks, the Triton launch) overlaps the previous call's kernels,
    as in an ES loop that does not synchronize between layers. One untimed call
    is enqueued before each sample's start event: otherwise the GPU idles at the
    start of every sample while the host prepares the first call (~0.2 ms, which
    was ~4% of a 0.35 ms row sampled 14 calls at a time).
    single_call_ms() gives the synchronous one-call latency instead.
    """
    for _ in range(warmup):
        fn()
    n = calls_per_sample(fn, sample_ms)
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fn()  # keeps the GPU busy while the host enqueues the timed calls
        a.record()
        for _ in range(n):
            fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / n)
    return statistics.median(times)


def graph_ms(fn, repeats=5, sample_ms=5.0):
    """Median GPU time per call, in ms, of n calls captured in one CUDA graph and replayed.

    Eager calls of the short rows are bound by the host on some machines: their host work
    (dispatch, argument checks, two Triton launches; ~100 us per forward on a fast H100 host)
    was measured at up to 2.4 times that for seconds at a time (docs/cuda-kernels.md,
    "Host work"), which "ms" then reads instead of the kernels. A replay has no per-call host work.
    """
    n = calls_per_sample(fn, sample_ms)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up on the side stream, as capture requires
        with torch.cuda.graph(graph):
            for _ in range(n):
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / n)
    return statistics.median(times)


def single_call_ms(fn, repeats=5):
    """Median latency of one synchronous call (host work included), in ms."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def peak_extra_mib(fn):
    """Peak allocation during fn beyond what was allocated before and the result itself."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    out_bytes = out.numel() * out.element_size()
    return (torch.cuda.max_memory_allocated() - before - out_bytes) / MiB


@triton.jit
def _roof_splitmix(out_ptr, n_per_prog, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    # The best generation-only form: lane offsets hoisted, one 64-bit add per element.
    key = seed_key(pid.to(tl.int64))
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    lane = counter_offset(tl.arange(0, BLOCK))
    base = pid.to(tl.int64) * n_per_prog
    for s in range(0, n_per_prog, BLOCK):
        acc += noise_from_counter(key + counter_offset(base + s) + lane)
    tl.store(out_ptr + pid, tl.sum(acc))


@triton.jit
def _roof_philox(out_ptr, n_per_prog, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    base = pid * n_per_prog
    for s in range(0, n_per_prog, BLOCK):
        acc += tl.rand(1234, base + s + tl.arange(0, BLOCK)) - 0.5
    tl.store(out_ptr + pid, tl.sum(acc))


def roof_call(kern=_roof_splitmix):
    """(one launch of a generation roof kernel on every SM, the noise elements it generates)."""
    progs, per = roof_programs(), 2**20
    out = torch.empty(progs, device="cuda")
    return (lambda: kern[(progs,)](out, per, BLOCK=1024, num_warps=8)), progs * per


def roofs():
    res = {}
    for name, kern in [("splitmix64 hash+reduce", _roof_splitmix), ("tl.rand (Philox)", _roof_philox)]:
        fn, elements = roof_call(kern)
        res[name] = elements / cuda_median_ms(fn) / 1e6  # G elements/s
    return res


def tf32_gemm():
    """(the reference float32 GEMM, 8192^3 at torch's matmul precision, its FLOPs)."""
    a, b = torch.randn(8192, 8192, device="cuda"), torch.randn(8192, 8192, device="cuda")
    return (lambda: a @ b), 2 * 8192**3


def tf32_rate():
    fn, flops = tf32_gemm()
    return flops / cuda_median_ms(fn, repeats=10) / 1e9  # TFLOP/s


def naive_forward(x, w, b, pop, sigma):
    out_f, in_f = w.shape
    noise = torch.rand(pop, out_f, in_f, device=x.device) - 0.5
    weights = w + sigma * noise
    del noise
    bias = b + sigma * (torch.rand(pop, out_f, device=x.device) - 0.5)
    xs = x.expand(pop, *x.shape[-2:]) if x.dim() == 2 else x
    return torch.baddbmm(bias[:, None, :], xs, weights.transpose(1, 2))


def naive_gradient(f, n, pop, sigma):
    return f @ (torch.rand(pop, n, device=f.device) - 0.5) / (pop * sigma)


def naive_reduce(c, pop, sigma):
    return (c + sigma * (torch.rand(pop, c.numel(), device=c.device) - 0.5)).abs().mean(dim=1)


def t_ideal_ms(hashed_elements, dense_flops, roof_g_el_s, dense_tflops):
    """The machine's limit for a call: max(hash time at the splitmix64 roof, GEMM time at the dense rate), ms."""
    return max(hashed_elements / roof_g_el_s / 1e6, dense_flops / dense_tflops / 1e9)


def measure(fn, repeats, graph=True):
    """(steady-state ms, peak extra MiB, 1-call ms, graph-replay ms or None); all None on OOM."""
    try:
        ms = cuda_median_ms(fn, repeats=repeats)
        mem = peak_extra_mib(fn)
        return ms, mem, single_call_ms(fn), graph_ms(fn) if graph else None
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return None, None, None, None


FORWARD = [  # (P, B, in, out, per-individual x)
    (1024, 64, 784, 256, False),
    (4096, 1, 256, 256, True),
    (256, 64, 1024, 1024, False),
    (64, 256, 4096, 4096, False),
    (16384, 64, 512, 2048, False),
    (256, 1024, 512, 512, False),
]
GRADIENT = [(1024, 1024, 1024), (16384, 2048, 512)]
REDUCE = [(1024, 50_000_000)]
SIGMA = 0.02


def forward_inputs(P, B, i, o, per, g):
    """(x, weight, bias, shape label) of a FORWARD row, drawn from generator g."""
    w = torch.randn(o, i, device="cuda", generator=g)
    b = torch.randn(o, device="cuda", generator=g)
    x = torch.randn((P, B, i) if per else (B, i), device="cuda", generator=g)
    return x, w, b, f"P={P} B={B} {i}->{o}" + (" per-indiv x" if per else "")


def forward_call(x, w, b, P, anti):
    """One virtual_perturbed_linear call for P individuals (P / 2 seeds with antithetic pairs)."""
    seeds = torch.arange(P // 2 if anti else P, device="cuda")
    return lambda: vn.virtual_perturbed_linear(x, w, b, seeds, SIGMA, 0, antithetic=anti)


def run(quick: bool, precision: str = "high"):
    torch.set_float32_matmul_precision(precision)
    sigma = SIGMA
    g = torch.Generator(device="cuda").manual_seed(0)
    roof = roofs()
    roof_g = roof["splitmix64 hash+reduce"]
    tf32 = tf32_rate()
    rows, records = [], []

    def add(kind, shape, elements, ours, naive, anti, flops=None, dense_flops=0.0):
        ms, mem, ms1, gms = ours
        nms, nmem, _, _ = naive
        rate = elements / ms / 1e6
        ideal = t_ideal_ms(elements / (2 if anti else 1), dense_flops, roof_g, tf32)
        rec = dict(kind=kind, shape=shape, antithetic=anti, ms=ms, one_call_ms=ms1, graph_ms=gms,
                   graph_g_el_s=elements / gms / 1e6, g_el_s=rate, roof_frac=rate / roof_g,
                   peak_extra_mib=mem, naive_ms=nms, naive_g_el_s=None if nms is None else elements / nms / 1e6,
                   naive_peak_extra_mib=nmem, speedup=None if nms is None else nms / ms, ideal_ms=ideal,
                   ideal_frac=ideal / ms)
        if flops is not None:
            rec["tflops"] = flops / ms / 1e9
            rec["tf32_frac"] = rec["tflops"] / tf32
        records.append(rec)
        rows.append([kind + (" antithetic" if anti else ""), shape, f"{ms:.3f}", f"{gms:.3f}", f"{ms1:.3f}", f"{rate:.0f}",
                     f"{rec['graph_g_el_s']:.0f}", f"{rec['roof_frac']:.0%}", f"{rec['ideal_frac']:.2f}",
                     f"{mem:.1f}", "OOM" if nms is None else f"{nms:.2f}",
                     "OOM" if nms is None else f"{rec['naive_g_el_s']:.0f}", "-" if nms is None else f"{rec['speedup']:.1f}x",
                     "" if flops is None else f"{rec['tflops']:.0f} TFLOP/s = {rec['tf32_frac']:.0%} of tf32"
                     + (" (both members counted)" if anti else "")])

    for P, B, i, o, per in FORWARD[:2] if quick else FORWARD:
        x, w, b, shape = forward_inputs(P, B, i, o, per, g)
        naive = measure(lambda: naive_forward(x, w, b, P, sigma), 3, graph=False)
        for anti in (False, True):
            ours = measure(forward_call(x, w, b, P, anti), 10)
            flops = 2 * P * B * i * o
            add("forward", shape, P * o * i, ours, naive, anti, flops=flops if B >= 1024 else None, dense_flops=flops)
    for P, o, i in GRADIENT[:1] if quick else GRADIENT:
        f = torch.randn(P, device="cuda", generator=g)
        naive = measure(lambda: naive_gradient(f, o * i, P, sigma), 3, graph=False)
        for anti in (False, True):
            seeds = torch.arange(P // 2 if anti else P, device="cuda")
            ours = measure(lambda: vn.virtual_weight_gradient(f, seeds, (o, i), sigma, P, 0, antithetic=anti), 10)
            add("weight gradient", f"P={P} {o}x{i}", P * o * i, ours, naive, anti)
    for P, n in [] if quick else REDUCE:
        c = torch.randn(n, device="cuda", generator=g)
        naive = measure(lambda: naive_reduce(c, P, sigma), 3, graph=False)
        for anti in (False, True):
            seeds = torch.arange(P // 2 if anti else P, device="cuda")
            ours = measure(lambda: vn.virtual_reduce_metric(c, seeds, sigma, n, 0, antithetic=anti), 5)
            add("reduce", f"P={P} n={n:,}", P * n, ours, naive, anti)
    return roof, tf32, rows, records


def plot(records, path, roof=None, device="GPU"):
    """Horizontal bars, one row per table row, so that every shape label stays readable."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['kind']}{' antithetic' if r['antithetic'] else ''}  {r['shape']}" for r in records]
    ys = list(range(len(records)))[::-1]  # first row on top, as in the table
    fig, ax = plt.subplots(figsize=(10, 0.38 * len(records) + 2))
    ax.barh([y + 0.2 for y in ys], [r["g_el_s"] for r in records], height=0.4, label="virtual_noise (Triton)")
    ax.barh([y - 0.2 for y in ys], [r["naive_g_el_s"] or 0 for r in records], height=0.4,
            label="naive materialized (no bar: out of memory)")
    if roof is not None:
        ax.axvline(roof, color="k", linestyle="--", linewidth=1, label=f"splitmix64 generation roof ({roof:.0f})")
    ax.set_yticks(ys, labels, fontsize=8)
    ax.set_xlabel("G noise elements / s (antithetic rows count both members)")
    ax.set_title(f"virtual_noise on {device}: throughput vs shape")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=3, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=".")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--matmul-precision", default="high", choices=["high", "highest"],
                    help="torch.set_float32_matmul_precision for the float32 rows (\"highest\": PyTorch's default)")
    args = ap.parse_args()
    roof, tf32, rows, records = run(args.quick, args.matmul_precision)
    head = [machine_line(), f"GPU: {torch.cuda.get_device_name()} | triton {triton.__version__}",
            "Roofs (generation only): " + ", ".join(f"{k} {v:.0f} G el/s" for k, v in roof.items())
            + f" | fp32 matmul at tf32: {tf32:.0f} TFLOP/s",
            f"float32 rows at torch matmul precision \"{args.matmul_precision}\", noise precision "
            f"\"{vn.get_noise_precision()}\""]
    table = markdown_table(["op", "shape", "ms", "graph ms", "1-call ms", "G el/s", "graph G el/s", "of roof", "t_ideal / t",
                            "peak extra MiB",
                            "naive ms", "naive G el/s", "speed-up", "matmul"], rows)
    text = "\n".join(head) + "\n\n" + table + "\n"
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_cuda.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "bench_cuda.json"), "w") as f:
        json.dump({"roof_g_el_s": roof, "tf32_tflops": tf32, "rows": records}, f, indent=1)
    plot(records, os.path.join(args.out, "bench_cuda.png"), roof["splitmix64 hash+reduce"], torch.cuda.get_device_name())


if __name__ == "__main__":
    main()
