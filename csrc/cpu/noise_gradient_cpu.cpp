// grad[e] = sum_i f_i N_i[e] / (pop_size * sigma) over a contiguous block of
// noise indices; weight_gradient and bias_gradient differ only in shape.
//
// Work items are (element chunk, population group). Groups exist only for
// small blocks, so that a short bias vector with a large population still
// uses every core; their count depends on shapes alone and partial sums are
// added in group order, so the result is the same for any thread count.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <vector>

#include "cpu/cpu_kernels.h"
#include "cpu/noise_kernels.h"
#include "validation.h"

namespace virtual_noise::cpu {
namespace {

constexpr int64_t kChunk = 4096;  // accumulator stays in L1

at::Tensor noise_weighted_sum(const at::Tensor& fitness, const at::Tensor& seeds, int64_t n,
                              double sigma, int64_t pop_size, int64_t offset, bool antithetic) {
  at::Tensor grad = at::zeros({n}, fitness.options().dtype(at::kFloat));
  const auto keys = seed_keys(seeds);
  const int64_t units = static_cast<int64_t>(keys.size());
  if (n == 0 || units == 0) return grad;

  // One coefficient per seed: an antithetic pair contributes (f+ - f-) N.
  const at::Tensor f = fitness.to(at::kDouble).contiguous();
  const double* fp = f.data_ptr<double>();
  std::vector<float> coef(units);
  for (int64_t u = 0; u < units; ++u)
    coef[u] = static_cast<float>(antithetic ? fp[2 * u] - fp[2 * u + 1] : fp[u]);
  const float scale = static_cast<float>(1.0 / (static_cast<double>(pop_size) * sigma));

  const int64_t n_chunks = (n + kChunk - 1) / kChunk;
  const int64_t n_groups = n_chunks >= 16 ? 1 : std::min<int64_t>(16, (units + 255) / 256);
  std::vector<float> partial(n_groups > 1 ? n_groups * n : 0);
  float* gp = grad.data_ptr<float>();
  at::parallel_for(0, n_chunks * n_groups, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(kChunk);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t c = item / n_groups, grp = item % n_groups;
      const int64_t start = c * kChunk, len = std::min(kChunk, n - start);
      const int64_t u0 = units * grp / n_groups, u1 = units * (grp + 1) / n_groups;
      std::fill(acc.begin(), acc.begin() + len, 0.f);
      for (int64_t u = u0; u < u1; ++u)
        accumulate_noise(keys[u], static_cast<uint64_t>(offset + start), len, coef[u], acc.data());
      float* dst = n_groups > 1 ? partial.data() + grp * n + start : gp + start;
      for (int64_t k = 0; k < len; ++k) dst[k] = n_groups > 1 ? acc[k] : acc[k] * scale;
    }
  });
  if (n_groups > 1) {
    at::parallel_for(0, n, kChunk, [&](int64_t begin, int64_t end) {
      for (int64_t e = begin; e < end; ++e) {
        float s = 0.f;
        for (int64_t grp = 0; grp < n_groups; ++grp) s += partial[grp * n + e];
        gp[e] = s * scale;
      }
    });
  }
  return grad;
}

}  // namespace

at::Tensor weight_gradient(const at::Tensor& fitness, const at::Tensor& seeds,
                           at::IntArrayRef weight_shape, double sigma, int64_t pop_size,
                           int64_t offset, bool antithetic) {
  const int64_t n = check_noise_gradient("virtual_noise.weight_gradient", "weight_shape", 2, fitness,
                                         seeds, weight_shape, sigma, pop_size, offset, antithetic);
  return noise_weighted_sum(fitness, seeds, n, sigma, pop_size, offset, antithetic).view(weight_shape);
}

at::Tensor bias_gradient(const at::Tensor& fitness, const at::Tensor& seeds,
                         at::IntArrayRef bias_shape, double sigma, int64_t pop_size, int64_t offset,
                         bool antithetic) {
  const int64_t n = check_noise_gradient("virtual_noise.bias_gradient", "bias_shape", 1, fitness,
                                         seeds, bias_shape, sigma, pop_size, offset, antithetic);
  return noise_weighted_sum(fitness, seeds, n, sigma, pop_size, offset, antithetic).view(bias_shape);
}

}  // namespace virtual_noise::cpu
