"""Runs each CUDA kernel once on small, edge-shaped inputs; meant to run under
compute-sanitizer (memcheck), with PyTorch's caching allocator off so that
out-of-bounds accesses land outside any allocation:

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python benchmarks/sanitize_cuda.py
"""

import torch

import virtual_noise as vn

s = torch.tensor([1, -2, 2**40], device="cuda")
for shared in (True, False):
    for anti in (False, True):
        pop = 6 if anti else 3
        x = torch.randn((5, 37) if shared else (pop, 5, 37), device="cuda")
        for dtype in (torch.float32, torch.bfloat16):
            w, b = torch.randn(19, 37, device="cuda", dtype=dtype), torch.randn(19, device="cuda", dtype=dtype)
            vn.virtual_perturbed_linear(x.to(dtype), w, b, s, 0.1, 3, antithetic=anti)
            vn.virtual_perturbed_linear(x.to(dtype), w, None, s, 0.1, 3, antithetic=anti)
x = torch.randn(6, 37, 5, device="cuda").transpose(1, 2)  # per-individual fp32 x that does not flatten: W tiles
vn.virtual_perturbed_linear(x, torch.randn(19, 37, device="cuda"), torch.randn(19, device="cuda"), s, 0.1, 3, antithetic=True)
for shared in (True, False):  # 48 inputs: a full 16-wide K tail step after one 32-wide step
    x = torch.randn((5, 48) if shared else (3, 5, 48), device="cuda")
    vn.virtual_perturbed_linear(x, torch.randn(70, 48, device="cuda"), torch.randn(70, device="cuda"), s, 0.1, 3)
torch.set_float32_matmul_precision("high")  # fp32 batches over 128 take the Gluon kernel at tf32
for dtype in (torch.float32, torch.bfloat16):
    x = torch.randn(300, 40, device="cuda", dtype=dtype)  # batch > 128 (two batch tiles), partial K tile
    w, b = torch.randn(19, 40, device="cuda", dtype=dtype), torch.randn(19, device="cuda", dtype=dtype)
    vn.virtual_perturbed_linear(x, w, b, s, 0.1, 3, antithetic=True)
    vn.virtual_perturbed_linear(x, w, None, s, 0.1, 3)
    # The noise-slab kernel: 150 seeds x 1 output tile >= one program per SM on an H200.
    many = torch.arange(150, device="cuda") - 75
    vn.virtual_perturbed_linear(x, w, b, many, 0.1, 3, antithetic=True)
    vn.virtual_perturbed_linear(x, w, None, many, 0.1, 3)
# The noise-slab kernel with its x ring wrapping, partial last batch tile, an odd number of tiles (role 0
# takes 3, role 1 two): float32 operands (16 K steps x 5 batch tiles over 6 slots), then x's row-scaled
# float16 copy (8 K steps x 5 tiles over 8 slots; plain calls take it from 512 inputs, antithetic from 1024).
x, w = torch.randn(520, 512, device="cuda"), torch.randn(19, 512, device="cuda")
vn.virtual_perturbed_linear(x, w, torch.randn(19, device="cuda"), many, 0.1, 3, antithetic=True)
vn.virtual_perturbed_linear(x, w, torch.randn(19, device="cuda"), many, 0.1, 3)
# The per-tile kernel on row-scaled copies with padded rows (601 -> 608 and 1025 -> 1032 halves) and
# partial K steps.
for in_f, anti in ((601, False), (1025, True)):
    x, w = torch.randn(200, in_f, device="cuda"), torch.randn(19, in_f, device="cuda")
    vn.virtual_perturbed_linear(x, w, torch.randn(19, device="cuda"), s, 0.1, 3, antithetic=anti)
# The tl.dot kernel on x's row-scaled float16 copy (batches of 33 to 128, 512 inputs or more): padded
# copy rows (601 -> 608 halves), a K tail, 100 rows in a 128-row tile, strided x.
for batch, in_f, anti in ((40, 601, False), (100, 520, True)):
    x = torch.randn(in_f, batch, device="cuda").t()
    w = torch.randn(19, in_f, device="cuda")
    vn.virtual_perturbed_linear(x, w, torch.randn(19, device="cuda"), s, 0.1, 3, antithetic=anti)
    vn.virtual_perturbed_linear(x, w, None, s, 0.1, 3, antithetic=anti)
f = torch.randn(6, device="cuda")
vn.virtual_weight_gradient(f, s, (19, 37), 0.1, 6, 3, antithetic=True)
vn.virtual_weight_gradient(f[:3], s, (3, 5), 0.1, 3, 3)
vn.virtual_bias_gradient(torch.randn(3000, device="cuda"), torch.arange(3000, device="cuda"), (7,), 0.1, 3000, 0)
vn.virtual_reduce_metric(torch.randn(1001, device="cuda"), s, 0.1, 1001, 5, antithetic=True)
vn.virtual_reduce_metric(torch.randn(13, device="cuda"), torch.arange(21, device="cuda"), 0.1, 13, 5)
vn.generate_noise(s, 1027, 2**33)
torch.cuda.synchronize()
print("sanitize_cuda: all kernels ran")
