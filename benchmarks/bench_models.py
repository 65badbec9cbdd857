"""The population forward of a GPT-2-small-shaped decoder, side by side in one run with:

- inference: the same model's plain forward over the same number of sequences (P * batch),
  what serving the model costs;
- lowrank: the population forward with low-rank noise on the linear layers (rank --rank);
- materialized: torch.func.vmap over torch.func.functional_call with every individual's
  perturbed parameters materialized (P copies of the model), the usual baseline.

    python benchmarks/bench_models.py --device cuda --dtype bf16 --seq 1024 --populations 16,32,64
    python benchmarks/bench_models.py --device cpu --dtype fp32 --seq 32 --populations 8

Prints tokens/s over the whole population, the fraction of inference's, and the peak
extra memory of each call beyond its inputs and output (CUDA: the allocator's peak; CPU:
the process's peak resident set, each mode in a fresh process). The population forward's
target: peak extra memory within the activations (inference's peak extra at P * batch
sequences) + 64 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import machine_line, markdown_table  # noqa: E402
from gpt_decoder import GPTDecoder  # noqa: E402

from virtual_noise.models import VirtualPopulation  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MiB = 2**20


def build(args, device):
    torch.manual_seed(0)
    model = GPTDecoder(layers=args.layers).to(device=device, dtype=DTYPES[args.dtype]).eval()
    ids = torch.randint(0, 50257, (args.batch, args.seq), generator=torch.Generator().manual_seed(1)).to(device)
    return model, ids


def make_call(mode, model, ids, P, args):
    seeds = torch.arange(P // 2, device=ids.device)
    if mode == "inference":
        all_ids = ids.repeat(P, 1)
        return lambda: model(all_ids)
    if mode in ("population", "lowrank"):
        pop = VirtualPopulation(model, noise="lowrank" if mode == "lowrank" else "full", rank=args.rank)
        return lambda: pop(ids, seeds=seeds, sigma=args.sigma)
    if mode == "materialized":
        from torch.func import functional_call, vmap

        params = dict(model.named_parameters())

        def call():
            perturbed = {n: p + args.sigma * (torch.rand((P, *p.shape), device=p.device, dtype=p.dtype) - 0.5)
                         for n, p in params.items()}
            return vmap(lambda ps: functional_call(model, ps, (ids,), tie_weights=True))(perturbed)

        return call
    raise ValueError(mode)


def timed(fn, device, repeats):
    with torch.no_grad():
        out = fn()  # warm-up (compilation, autotuning, allocator)
        times = []
        for _ in range(repeats):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            out = fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3, out


def peak_extra_cuda(fn):
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with torch.no_grad():
        out = fn()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before - out.numel() * out.element_size()
    del out
    return extra / MiB


def one(args):
    """One mode in this process (CPU: the peak resident set is per process)."""
    device = torch.device(args.device)
    model, ids = build(args, device)
    fn = make_call(args.one, model, ids, args.one_p, args)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with torch.no_grad():
        out = fn()
    extra = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0 - out.numel() * out.element_size()
    del out
    ms, _ = timed(fn, device, args.repeats)
    print(json.dumps({"ms": ms, "extra_mib": extra / MiB}))


def run_mode(mode, P, args, device):
    if device.type == "cpu":
        cmd = [sys.executable, __file__, "--one", mode, "--one-p", str(P), "--device", "cpu", "--dtype", args.dtype,
               "--seq", str(args.seq), "--batch", str(args.batch), "--layers", str(args.layers),
               "--repeats", str(args.repeats), "--sigma", str(args.sigma), "--rank", str(args.rank)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            return None, None, proc.stderr.strip().splitlines()[-1][:80]
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        return r["ms"], r["extra_mib"], None
    model, ids = build(args, device)
    fn = make_call(mode, model, ids, P, args)
    try:
        ms, _ = timed(fn, device, args.repeats)
        extra = peak_extra_cuda(fn)
    except torch.OutOfMemoryError:
        return None, None, "OOM"
    finally:
        del model
        torch.cuda.empty_cache()
    return ms, extra, None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=1, help="sequences per individual")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--populations", default="16,32,64")
    p.add_argument("--modes", default="inference,population,lowrank,materialized")
    p.add_argument("--rank", type=int, default=4, help="rank of the lowrank mode")
    p.add_argument("--sigma", type=float, default=0.01)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None)
    p.add_argument("--profile", default=None, help="a mode: print its kernels' time (torch.profiler) and exit")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--one-p", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        return one(args)
    device = torch.device(args.device)
    if args.profile:
        P = int(args.populations.split(",")[0])
        model, ids = build(args, device)
        fn = make_call(args.profile, model, ids, P, args)
        timed(fn, device, 1)
        with torch.no_grad(), torch.profiler.profile() as prof:
            fn()
            torch.cuda.synchronize() if device.type == "cuda" else None
        key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
        print(prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=70))
        return
    rows, results = [], []
    for P in [int(v) for v in args.populations.split(",")]:
        found = {}
        for mode in args.modes.split(","):
            ms, extra, note = run_mode(mode, P, args, device)
            found[mode] = (ms, extra)
            tokens = P * args.batch * args.seq
            inf_ms = found.get("inference", (None, None))[0]
            frac = f"{inf_ms / ms:.2f}" if ms and inf_ms else "-"
            rows.append([mode, P, f"{ms:.1f}" if ms else note, f"{tokens / ms * 1e3:,.0f}" if ms else "-", frac,
                         f"{extra:.0f}" if extra is not None else "-"])
            results.append({"mode": mode, "P": P, "ms": ms, "extra_mib": extra, "tokens": tokens})
            print(" | ".join(map(str, rows[-1])), flush=True)
        inf_extra, pop_extra = found.get("inference", (0, None))[1], found.get("population", (0, None))[1]
        if inf_extra is not None and pop_extra is not None:
            print(f"P={P}: population peak extra {pop_extra:.0f} MiB, activations (inference) {inf_extra:.0f} MiB: "
                  f"{'within' if pop_extra <= inf_extra + 64 else 'OVER'} activations + 64 MiB", flush=True)
    head = (f"{machine_line()}\nGPT-2-small-shaped decoder ({args.layers} layers, width 768), {args.dtype}, "
            f"seq {args.seq}, {args.batch} sequence(s) per individual, antithetic, sigma {args.sigma}")
    table = markdown_table(["mode", "P", "ms", "tokens/s", "of inference", "peak extra MiB"], rows)
    print(head + "\n\n" + table)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_models.md"), "w") as f:
            f.write(head + "\n\n" + table + "\n")
        with open(os.path.join(args.out, "bench_models.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
