// The virtual-noise specification, the single C++ definition of it.
//
// Every CPU kernel regenerates noise through these functions, and the Triton
// kernels (python/virtual_noise/cuda/noise_spec.py) implement the same integer
// arithmetic, so one seed gives bit-identical noise on every device.
//
//   GAMMA          = 0x9E3779B97F4A7C15                    (splitmix64 increment)
//   mix64(z)       = splitmix64 finalizer
//   key(seed)      = mix64(uint64(seed) + GAMMA)
//   hash(seed, e)  = mix64(key(seed) + uint64(e) * GAMMA)
//   noise(seed, e) = float32((hash & 0xFFFFFFFF) >> 8) * 2^-24 - 0.5   in [-0.5, 0.5)
//
// All arithmetic wraps mod 2^64. The float step is exact: a 24-bit integer is
// representable in float32, scaling by 2^-24 and subtracting 0.5 lose no bits,
// so fused multiply-add contraction cannot change the result either.
#pragma once

#include <cstdint>

namespace virtual_noise {

constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ULL;
// Uniform [-0.5, 0.5) has variance 1/12; ES estimators divide by it.
constexpr double kNoiseVariance = 1.0 / 12.0;

inline constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Seeds are int64 (int32 seeds sign-extend); the cast is two's complement.
inline constexpr uint64_t seed_key(int64_t seed) {
  return mix64(static_cast<uint64_t>(seed) + kGamma);
}

// The counter that enters the final mix for element e. Kernels walk runs of
// elements by adding e_step * kGamma to it instead of multiplying each time.
inline constexpr uint64_t element_counter(uint64_t key, uint64_t e) {
  return key + e * kGamma;
}

inline float noise_from_hash(uint64_t h) {
  // < 2^24, so the int32 conversion (which vectorizes) is exact.
  const int32_t bits24 = static_cast<int32_t>(static_cast<uint32_t>(h) >> 8);
  return static_cast<float>(bits24) * 0x1p-24f - 0.5f;
}

inline float noise(int64_t seed, uint64_t e) {
  return noise_from_hash(mix64(element_counter(seed_key(seed), e)));
}

}  // namespace virtual_noise
