"""The virtual-noise specification in Triton: the one definition for the CUDA kernels.

Bit-identical to csrc/noise_spec.h (uint64 arithmetic wrapping mod 2^64):
    key(seed)      = mix64(uint64(seed) + GAMMA)
    noise(seed, e) = float32((mix64(key + uint64(e) * GAMMA) & 0xFFFFFFFF) >> 8) * 2^-24 - 0.5
Measured on an H200 (docs/noise-spec.md), this hash runs at about twice the rate of
tl.rand's Philox, and unlike tl.rand it gives the CPU's bits.
"""

import triton
import triton.language as tl


@triton.jit
def mix64(z):
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    return z ^ (z >> 31)


@triton.jit
def seed_key(seed):
    """int64 seeds (two's complement) to uint64 keys."""
    return mix64(seed.to(tl.uint64, bitcast=True) + 0x9E3779B97F4A7C15)


@triton.jit
def counter_offset(e):
    """uint64(e) * GAMMA for element indices e >= 0 (any int dtype).

    The counter of element e is key + counter_offset(e), and offsets add:
    counter_offset(a + b) == counter_offset(a) + counter_offset(b) mod 2^64, for
    negative int64 a or b too (two's complement), so a kernel may step from one
    element's counter to another's by the difference of their indices. Kernels
    hoist the offsets of a tile's rows and columns out of their loops, so each
    element costs one 64-bit add instead of a 64-bit multiply.
    """
    return e.to(tl.int64).to(tl.uint64, bitcast=True) * 0x9E3779B97F4A7C15


@triton.jit
def noise_from_counter(c):
    """float32 noise in [-0.5, 0.5) from uint64 counters key + counter_offset(e)."""
    # Bits 8..31 kept in place rather than shifted down: mix64's last xor-shift and the mask,
    # (z ^ (z >> 31)) & mask, are then one LOP3 after the funnel shift, one instruction per
    # element fewer (sm_90 SASS) than the shift-down form. 24 significant bits convert to
    # float32 exactly and the 2^-32 scale is exact, so the value is the spec's
    # ((h & 0xFFFFFFFF) >> 8) * 2^-24 - 0.5 bit for bit.
    top24 = (mix64(c) & 0xFFFFFF00).to(tl.uint32)
    return top24.to(tl.float32) * 2.3283064365386963e-10 - 0.5


@triton.jit
def noise_at(key, e):
    """float32 noise at element indices e (int64, >= 0) for uint64 keys (broadcasting)."""
    return noise_from_counter(key + counter_offset(e))
