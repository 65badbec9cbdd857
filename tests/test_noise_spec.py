"""The noise specification, bit-exact against plain integer arithmetic."""

import random

import numpy as np
import pytest
import torch
from reference import noise_int, noise_np

import virtual_noise as vn

CHECK_VALUES = [
    (0, 0, 0.4970219135284424),
    (0, 1, -0.1988297700881958),
    (1, 0, 0.010754883289337158),
    (42, 200704, 0.05290186405181885),
    (-1, 7, -0.43282145261764526),
    (2147483647, 2147483653, 0.45364445447921753),
]


@pytest.mark.parametrize("seed,e,value", CHECK_VALUES)
def test_check_values(seed, e, value):
    assert noise_int(seed, e) == value
    got = vn.generate_noise(torch.tensor([seed]), 1, e)
    assert got.dtype == torch.float32 and got.item() == value


def test_random_seeds_and_offsets_match_integers():
    rng = random.Random(1234)
    seeds = [rng.randrange(-(2**63), 2**63) for _ in range(6)] + [-1, 0, 2**31, 2**31 + 5, -(2**31) - 1]
    for offset in [0, 3, 2**31 - 2, 2**32 + 7, 2**40 + 11, 2**62]:
        got = vn.generate_noise(torch.tensor(seeds, dtype=torch.int64), 5, offset).double().numpy()
        want = np.array([[noise_int(s, offset + k) for k in range(5)] for s in seeds])
        np.testing.assert_array_equal(got, want)


def test_numpy_reference_matches_integers():
    seeds = [3, -7, 2**40]
    ref = noise_np(seeds, 50, 2**33)
    want = np.array([[noise_int(s, 2**33 + k) for k in range(50)] for s in seeds])
    np.testing.assert_array_equal(ref, want)


def test_long_runs_and_int32_seeds(gen):
    seeds = torch.randint(-(2**31), 2**31 - 1, (4,), generator=gen, dtype=torch.int64)
    n = 200_001  # crosses the kernels' chunk and SIMD boundaries
    got = vn.generate_noise(seeds, n, 17)
    np.testing.assert_array_equal(got.double().numpy(), noise_np(seeds.tolist(), n, 17))
    # int32 seeds sign-extend to the same int64 seeds.
    assert torch.equal(vn.generate_noise(seeds.to(torch.int32), 64, 5), vn.generate_noise(seeds, 64, 5))


def test_noise_range_and_moments():
    x = vn.generate_noise(torch.arange(4), 250_000, 0).double()
    assert x.min() >= -0.5 and x.max() < 0.5
    assert abs(x.mean().item()) < 2e-3
    assert abs(x.var().item() - 1 / 12) < 2e-3
