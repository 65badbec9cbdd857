// Hot loops of the CPU backend: noise generation fused with what each
// operator does with it, plus the small GEMM tile the forward needs.
// Plain C++ (no ATen) so these compile fast and can be multi-versioned:
// each function exists in AVX-512, AVX2 and baseline builds, picked at load
// time by the CPU (GCC function multi-versioning), so installed binaries stay
// portable without -march=native.
#pragma once

#include <cstdint>

namespace virtual_noise::cpu {

// Columns of a GEMM tile; the forward generates noise tiles of this width.
constexpr int64_t kTileCols = 64;

// out[t] = noise(key, e0 + t * e_step), t < n.
void fill_noise(uint64_t key, uint64_t e0, uint64_t e_step, int64_t n, float* out);

// Noise tile for rows [0, rows) x columns [0, K) of a block whose element
// (r, k) has index e0 + r * row_stride + k * col_stride, stored transposed:
// out[k * kTileCols + r]. Columns rows..kTileCols-1 are zero so the GEMM tile
// can always be full width.
void fill_noise_tile_transposed(uint64_t key, uint64_t e0, uint64_t row_stride, uint64_t col_stride,
                                int64_t rows, int64_t K, float* out);

// acc[t] += coef * noise(key, e0 + t), t < n.
void accumulate_noise(uint64_t key, uint64_t e0, int64_t n, float coef, float* acc);

// Adds sum_t |center[t] + sigma * noise(key, e0 + t)| to *plus and, when minus
// is not null, sum_t |center[t] - sigma * noise| to *minus (antithetic twin).
void abs_sums(uint64_t key, uint64_t e0, int64_t n, const float* center, float sigma,
              double* plus, double* minus);

// C[m, j] = sum_k A[m * lda + k] * Bt[k * kTileCols + j] for m < M, j < kTileCols;
// C is M x kTileCols, contiguous. Fixed summation order (k ascending), so the
// result does not depend on threads or on where the tile sits in the output.
void gemm_tile(const float* A, int64_t lda, int64_t M, int64_t K, const float* Bt, float* C);

// "avx512", "avx2" or "baseline": which build of the loops above this CPU runs.
const char* simd_level();

}  // namespace virtual_noise::cpu
