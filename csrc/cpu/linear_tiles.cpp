// The tiled x @ W^T + b that the CPU linear kernels share (full-rank and low-rank forwards).
#include <ATen/Parallel.h>

#include "cpu/cpu_kernels.h"
#include "cpu/noise_kernels.h"

namespace virtual_noise::cpu {

std::vector<float> weight_tiles(const float* w, int64_t in, int64_t out) {
  const int64_t n_tiles = (out + kTileCols - 1) / kTileCols;
  std::vector<float> wt(n_tiles * in * kTileCols);
  at::parallel_for(0, n_tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t rows = std::min(kTileCols, out - t * kTileCols);
      for (int64_t k = 0; k < in; ++k) {
        float* d = wt.data() + (t * in + k) * kTileCols;
        for (int64_t r = 0; r < rows; ++r) d[r] = w[(t * kTileCols + r) * in + k];
        for (int64_t r = rows; r < kTileCols; ++r) d[r] = 0.f;
      }
    }
  });
  return wt;
}

std::vector<float> linear_tiles(const float* x, int64_t n_x, int64_t batch, int64_t in, int64_t out,
                                const std::vector<float>& wt, const float* bias) {
  const int64_t n_tiles = (out + kTileCols - 1) / kTileCols, prod = batch * kTileCols;
  std::vector<float> base(n_x * n_tiles * prod);
  at::parallel_for(0, n_x * n_tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / n_tiles, t = item % n_tiles;
      float* bt = base.data() + item * prod;
      gemm_tile(x + i * batch * in, in, batch, in, wt.data() + t * in * kTileCols, bt);
      if (bias != nullptr)
        for (int64_t b = 0; b < batch; ++b)
          for (int64_t r = 0; r < std::min(kTileCols, out - t * kTileCols); ++r)
            bt[b * kTileCols + r] += bias[t * kTileCols + r];
    }
  });
  return base;
}

}  // namespace virtual_noise::cpu
