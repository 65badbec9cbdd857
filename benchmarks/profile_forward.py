"""One forward launch (and the generation roof kernel) for a profiler run, e.g.

    ncu --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
        --section SchedulerStats --section MemoryWorkloadAnalysis python3 benchmarks/profile_forward.py

Shape: the forward's first benchmark row (P=1024 B=64 784->256, shared x), fp32 at tf32.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_cuda import _roof_splitmix, roof_programs  # noqa: E402

import virtual_noise as vn  # noqa: E402

torch.set_float32_matmul_precision("high")
P, B, I, O = 1024, 64, 784, 256
x, w, b = torch.randn(B, I, device="cuda"), torch.randn(O, I, device="cuda"), torch.randn(O, device="cuda")
seeds = torch.arange(P, device="cuda")
for _ in range(2):
    vn.virtual_perturbed_linear(x, w, b, seeds, 0.02, 0)
programs = roof_programs()
out = torch.empty(programs, device="cuda")
_roof_splitmix[(programs,)](out, 2**16, BLOCK=1024, num_warps=8)
torch.cuda.synchronize()
