"""One population over many processes: ranks exchange seeds' fitness, never noise.

Every rank draws the same seeds from the shared generator and evaluates its
own contiguous slice of the population. Fitness (P numbers) is all-gathered so
shaping sees the whole population; each rank then computes the gradient
contribution of its slice with the fused operators, and one all-reduce of
n_params floats sums the contributions. All ranks hold identical centers after
every step (an all-reduce leaves the same bits on every rank).

Why all-reduce and not "every rank recomputes the full gradient from all
seeds" (the other classic option, which communicates only fitness): the
gradient costs P x n_params noise hashes, the dominant work of a generation;
recomputing it on every rank does W times the necessary work, while the
all-reduce moves 4 * n_params bytes, which is cheap next to P x n_params hashes
for any population larger than a handful (benchmarks/bench_distributed.py and
docs/distributed.md give the measured numbers).
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist


# torch 2.13 renamed all_gather_into_tensor (deprecated there) to all_gather_single.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class PeerFailure(RuntimeError):
    """A collective failed: another rank died, timed out or diverged."""


class Shard:
    """This rank's slice of a population of ``n_seeds`` seeds (pairs) over ``world`` ranks."""

    def __init__(self, n_seeds: int, members: int, group=None):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.members = members
        self.bounds = [n_seeds * r // self.world for r in range(self.world + 1)]
        self.start, self.end = self.bounds[self.rank], self.bounds[self.rank + 1]
        self.comm_device = torch.device("cuda", torch.cuda.current_device()) \
            if dist.get_backend(group) == "nccl" else torch.device("cpu")
        self.bytes_last_generation = 0

    @property
    def local_seeds(self) -> slice:
        return slice(self.start, self.end)

    @property
    def local_population(self) -> slice:
        return slice(self.start * self.members, self.end * self.members)

    def _collective(self, what: str, fn):
        try:
            return fn()
        except Exception as e:  # gloo and NCCL raise different types for a lost peer
            raise PeerFailure(
                f"virtual_noise ES: {what} failed on rank {self.rank} of {self.world}: a peer rank died, "
                f"timed out or left the job ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). "
                f"Restart all ranks with --resume to continue from the last checkpoint."
            ) from e

    def gather_fitness(self, local: torch.Tensor) -> torch.Tensor:
        """The whole population's fitness, in population order, identical on every rank."""
        width = max(self.bounds[r + 1] - self.bounds[r] for r in range(self.world)) * self.members
        padded = torch.zeros(width, dtype=torch.float64, device=self.comm_device)
        padded[: local.numel()] = local.to(device=self.comm_device, dtype=torch.float64)
        out = torch.empty(self.world * width, dtype=torch.float64, device=self.comm_device)
        self._collective("all_gather of fitness",
                         lambda: _all_gather_single(out, padded, group=self.group))
        self.bytes_last_generation = out.numel() * out.element_size()
        parts = [out[r * width:r * width + (self.bounds[r + 1] - self.bounds[r]) * self.members]
                 for r in range(self.world)]
        return torch.cat(parts)

    def sum_gradients(self, flat: torch.Tensor) -> torch.Tensor:
        buf = flat.to(self.comm_device)
        self._collective("all_reduce of gradient contributions",
                         lambda: dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=self.group))
        self.bytes_last_generation += buf.numel() * buf.element_size()
        return buf.to(flat.device)

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is set on any rank (the same answer on every rank)."""
        t = torch.tensor([int(flag)], device=self.comm_device)
        self._collective("all_reduce of a stop flag",
                         lambda: dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group))
        return bool(t.item())

    def barrier(self) -> None:
        self._collective("barrier", lambda: dist.barrier(group=self.group))


def init_from_env(device: torch.device, timeout_s: float) -> bool:
    """Join the torchrun job described by the environment; False when not under torchrun.

    NCCL for CUDA devices, gloo for the CPU. A bounded timeout makes a lost peer
    an error, not a hang.
    """
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return True


def leave_and_exit(shard: Shard, status: int = 0):
    """End a finished distributed run: the shard's barrier, destroy the process group, flush, exit.

    Why os._exit and not a normal return: with torch 2.13's gloo backend the
    interpreter's own shutdown after destroy_process_group() sometimes aborts
    ("terminate called without an active exception", SIGABRT). We measured 1 in 15 to
    1 in 30 two-rank runs on a 2-core machine, on rank 0 and on other ranks, always after
    destroy_process_group had returned. A finished run then reports failure to torchrun.
    By this point every result is written and flushed, so the process skips the
    teardown that races.
    """
    import os
    import sys

    shard.barrier()  # no rank tears the group down while a peer still talks to it
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
