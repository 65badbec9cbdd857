"""Distributed ES: per-generation time and bytes of the two gradient modes,
measured side by side in one run:
  all_reduce  each rank estimates its slice, one all-reduce of n_params floats
  recompute   each rank estimates from all seeds, only fitness moves

    python benchmarks/bench_distributed.py --world 2 [--device cpu|cuda]

Spawns --world processes (gloo on CPU, NCCL on GPUs) on loopback.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from common import markdown_table  # noqa: E402


def worker(rank, world, port, device, P, hidden, gens, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    if device == "cuda":
        torch.cuda.set_device(rank)
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    dist.init_process_group("nccl" if device == "cuda" else "gloo", timeout=datetime.timedelta(seconds=120))
    from virtual_noise.es import ES
    from virtual_noise.es.distributed import leave_and_exit

    dev = torch.device(device, rank) if device == "cuda" else torch.device("cpu")
    x = torch.randn(32, hidden, device=dev)
    rows = []
    for mode in ("all_reduce", "recompute"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, hidden)).to(dev)
        es = ES(model, population_size=P, sigma=0.05, seed=0, gradient_mode=mode)
        times = []
        for g in range(gens + 1):
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            es.ask()
            es.tell(es.forward(x).pow(2).mean(dim=(1, 2)).neg())
            if device == "cuda":
                torch.cuda.synchronize()
            if g:  # first generation warms up
                times.append(time.perf_counter() - t0)
        rows.append((mode, statistics.median(times), es.shard.bytes_last_generation, es.population.n_params))
    if rank == 0:
        queue.put(rows)
        queue.close()
        queue.join_thread()  # the rows reach the parent before this process skips its teardown
    leave_and_exit(es.shard)  # barrier, destroy, exit: gloo's interpreter shutdown can abort (docs/distributed.md)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--population", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--generations", type=int, default=5)
    args = ap.parse_args()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args.world, port, args.device, args.population, args.hidden,
                                              args.generations, queue)) for r in range(args.world)]
    for p in procs:
        p.start()
    rows = queue.get(timeout=600)
    for p in procs:
        p.join()
    failed = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
    if failed:
        sys.exit(f"bench_distributed: ranks exited with errors (rank, exit code): {failed}")
    n = rows[0][3]
    print(f"world {args.world} ({args.device}, {'nccl' if args.device == 'cuda' else 'gloo'}) | population "
          f"{args.population} | {n:,} parameters | median of {args.generations} generations")
    base = rows[1][1]
    print(markdown_table(["gradient mode", "ms / generation", "bytes / generation / rank", "speed-up vs recompute"],
                         [[m, f"{t * 1e3:.1f}", f"{b:,}", f"{base / t:.2f}x"] for m, t, b, _ in rows]))


if __name__ == "__main__":
    main()
