"""Integer arithmetic for the launchers' host path (grids, block sizes).

triton.cdiv and triton.next_power_of_2 give the same values (tested), but in
triton 3.6 and 3.9 they are constexpr_functions, whose Python wrapper costs
2.7-5.9 us per call against 0.03-0.06 us for the plain expressions (timeit on
the 2-core CI-like machine; docs/cuda-kernels.md, "Host work"). A shared-x
forward call made 5 (float32 x) to 7 (its float16 copy) of them, on a path
that is often bound by the host.
"""


def cdiv(x: int, y: int) -> int:
    """ceil(x / y) for x >= 0, y > 0."""
    return -(-x // y)


def next_power_of_2(n: int) -> int:
    """The smallest power of 2 >= n, for n >= 1 (0 for n = 0, as triton.next_power_of_2)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0
