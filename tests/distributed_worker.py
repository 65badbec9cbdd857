"""One rank of a small distributed ES run (started by tests/test_distributed.py).

Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (WORLD_SIZE=1: no process group).
Rank 0 writes the final center, the per-generation cross-rank identity checks and
the communication bytes to --out.
"""

import argparse
import datetime
import os

import torch
import torch.distributed as dist
from torch import nn

from virtual_noise.es import ES, center_vector
from virtual_noise.es.distributed import leave_and_exit


def checksum(c: torch.Tensor) -> torch.Tensor:
    """A bitwise checksum of a float64 vector (int64 arithmetic wraps)."""
    bits = c.double().contiguous().view(torch.int64)
    return (bits * (2 * torch.arange(bits.numel(), dtype=torch.int64) + 1)).sum().view(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--generations", type=int, default=5)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", default="all_reduce")
    ap.add_argument("--ckpt")
    ap.add_argument("--save-at", type=int, default=-1)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--fail-rank", type=int, default=-1)
    ap.add_argument("--fail-at", type=int, default=-1)
    ap.add_argument("--timeout", type=float, default=30)
    ap.add_argument("--noise", default="full")
    args = ap.parse_args()
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.LayerNorm(16), nn.Linear(16, 3))
    es = ES(model, population_size=30, sigma=0.1, lr=0.05, seed=1, gradient_mode=args.mode, noise=args.noise,
            rank=2 if args.noise == "lowrank" else None)
    g = torch.Generator().manual_seed(2)
    x, target = torch.randn(32, 6, generator=g), torch.randn(32, 3, generator=g)
    if args.resume:
        es.load(args.ckpt)
    identical = []
    while es.generation < args.generations:
        es.ask()
        if es.rank == args.fail_rank and es.generation == args.fail_at:
            os._exit(3)  # a rank dies mid-generation
        y = es.forward(x)
        es.tell(-((y - target) ** 2).mean(dim=(1, 2)))
        mine = checksum(center_vector(model))
        if world > 1:
            sums = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(sums, mine)
            identical.append(all(torch.equal(s, sums[0]) for s in sums))
        if args.ckpt and es.generation == args.save_at:
            es.save(args.ckpt)
    if es.rank == 0:
        torch.save({"center": center_vector(model), "identical": identical, "world": es.world_size,
                    "local_population": es.local_population_size,
                    "comm_bytes": 0 if es.shard is None else es.shard.bytes_last_generation,
                    "n_params": es.population.n_params}, args.out)
    if world > 1:
        leave_and_exit(es.shard, 0)


if __name__ == "__main__":
    main()
