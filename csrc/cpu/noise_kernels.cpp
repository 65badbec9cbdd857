#include "cpu/noise_kernels.h"

#include <cmath>
#include <cstring>

#include "noise_spec.h"

// Multi-versioning: GCC emits one clone per target and an ifunc resolver that
// picks the best one the CPU supports when the library loads.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define VN_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define VN_MULTIVERSION
#endif
#define VN_INLINE inline __attribute__((always_inline))

namespace virtual_noise::cpu {
namespace {

// Noise at counter c: the mix and the float mapping of the spec.
VN_INLINE float noise_at(uint64_t counter) { return noise_from_hash(mix64(counter)); }

template <int MB>
VN_INLINE void gemm_rows(const float* A, int64_t lda, int64_t K, const float* Bt, float* C) {
  float acc[MB][kTileCols];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < kTileCols; ++j) acc[i][j] = 0.f;
  for (int64_t k = 0; k < K; ++k) {
    const float* b = Bt + k * kTileCols;
    for (int i = 0; i < MB; ++i) {
      const float a = A[i * lda + k];
      for (int j = 0; j < kTileCols; ++j) acc[i][j] += a * b[j];
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < kTileCols; ++j) C[i * kTileCols + j] = acc[i][j];
}

}  // namespace

VN_MULTIVERSION
void fill_noise(uint64_t key, uint64_t e0, uint64_t e_step, int64_t n, float* out) {
  const uint64_t c0 = element_counter(key, e0);
  const uint64_t dc = e_step * kGamma;
  for (int64_t t = 0; t < n; ++t) out[t] = noise_at(c0 + static_cast<uint64_t>(t) * dc);
}

VN_MULTIVERSION
void fill_noise_tile_transposed(uint64_t key, uint64_t e0, uint64_t row_stride, uint64_t col_stride,
                                int64_t rows, int64_t K, float* out) {
  // Row r of the block is a run along k; in the transposed tile a run along r
  // for fixed k is an arithmetic progression of counters with step row_stride*GAMMA.
  const uint64_t dc = row_stride * kGamma;
  uint64_t lane[kTileCols];
  for (int64_t r = 0; r < kTileCols; ++r) lane[r] = static_cast<uint64_t>(r) * dc;
  for (int64_t k = 0; k < K; ++k) {
    const uint64_t ck = element_counter(key, e0 + static_cast<uint64_t>(k) * col_stride);
    float* o = out + k * kTileCols;
    for (int64_t r = 0; r < kTileCols; ++r) o[r] = noise_at(ck + lane[r]);
    for (int64_t r = rows; r < kTileCols; ++r) o[r] = 0.f;
  }
}

VN_MULTIVERSION
void accumulate_noise(uint64_t key, uint64_t e0, int64_t n, float coef, float* acc) {
  const uint64_t c0 = element_counter(key, e0);
  for (int64_t t = 0; t < n; ++t) acc[t] += coef * noise_at(c0 + static_cast<uint64_t>(t) * kGamma);
}

VN_MULTIVERSION
void abs_sums(uint64_t key, uint64_t e0, int64_t n, const float* center, float sigma, double* plus,
              double* minus) {
  // Float lane sums (one per SIMD lane, so the loop vectorizes without
  // reassociation) over short runs, then added in double: long blocks lose no
  // precision and the order is fixed.
  constexpr int64_t kLanes = 16, kRun = 1024;
  const uint64_t c0 = element_counter(key, e0);
  double sp = 0.0, sm = 0.0;
  for (int64_t s = 0; s < n; s += kRun) {
    const int64_t end = n - s < kRun ? n : s + kRun;
    float p[kLanes] = {}, m[kLanes] = {};
    int64_t t = s;
    for (; t + kLanes <= end; t += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) {
        const float d = sigma * noise_at(c0 + static_cast<uint64_t>(t + l) * kGamma);
        p[l] += std::fabs(center[t + l] + d);
        m[l] += std::fabs(center[t + l] - d);
      }
    }
    for (; t < end; ++t) {
      const float d = sigma * noise_at(c0 + static_cast<uint64_t>(t) * kGamma);
      p[0] += std::fabs(center[t] + d);
      m[0] += std::fabs(center[t] - d);
    }
    for (int64_t l = 0; l < kLanes; ++l) {
      sp += p[l];
      sm += m[l];
    }
  }
  *plus += sp;
  if (minus != nullptr) *minus += sm;
}

VN_MULTIVERSION
void gemm_tile(const float* A, int64_t lda, int64_t M, int64_t K, const float* Bt, float* C) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) gemm_rows<4>(A + m * lda, lda, K, Bt, C + m * kTileCols);
  for (; m < M; ++m) gemm_rows<1>(A + m * lda, lda, K, Bt, C + m * kTileCols);
}

const char* simd_level() {
#if defined(__GNUC__) && defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return "avx512";
  if (__builtin_cpu_supports("x86-64-v3")) return "avx2";
#endif
  return "baseline";
}

}  // namespace virtual_noise::cpu
