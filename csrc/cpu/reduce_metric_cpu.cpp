// metric[i] = mean_k |c_k + sigma * noise(s_i, offset + k)|.
//
// Work items are (individual or antithetic pair, chunk) with a chunk size set
// by n alone; per-item sums are kept in double and added in chunk order, so
// the result is the same for any thread count. Extra memory: P x (<= 64) doubles.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <limits>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "cpu/noise_kernels.h"
#include "validation.h"

namespace virtual_noise::cpu {

at::Tensor reduce_metric(const at::Tensor& center, const at::Tensor& seeds, double sigma,
                         int64_t n_params, int64_t offset, bool antithetic) {
  const int64_t pop =
      check_reduce_metric(center, seeds, sigma, n_params, offset, antithetic).expect_int();
  at::Tensor metric = at::empty({pop}, center.options().dtype(at::kFloat));
  if (pop == 0) return metric;
  if (n_params == 0) return metric.fill_(std::numeric_limits<float>::quiet_NaN());  // as torch.mean

  const at::Tensor c = center.to(at::kFloat).contiguous();
  const float* cp = c.data_ptr<float>();
  const auto keys = seed_keys(seeds);
  const int64_t units = static_cast<int64_t>(keys.size()), members = antithetic ? 2 : 1;
  const int64_t chunk = std::max<int64_t>(1 << 16, (n_params + 63) / 64);
  const int64_t n_chunks = (n_params + chunk - 1) / chunk;
  std::vector<double> sums(units * n_chunks * 2, 0.0);
  at::parallel_for(0, units * n_chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t u = item / n_chunks, ch = item % n_chunks;
      const int64_t start = ch * chunk, len = std::min(chunk, n_params - start);
      abs_sums(keys[u], static_cast<uint64_t>(offset + start), len, cp + start,
               static_cast<float>(sigma), &sums[item * 2], antithetic ? &sums[item * 2 + 1] : nullptr);
    }
  });
  float* mp = metric.data_ptr<float>();
  for (int64_t u = 0; u < units; ++u) {
    for (int64_t m = 0; m < members; ++m) {
      double s = 0.0;
      for (int64_t ch = 0; ch < n_chunks; ++ch) s += sums[(u * n_chunks + ch) * 2 + m];
      mp[u * members + m] = static_cast<float>(s / static_cast<double>(n_params));
    }
  }
  return metric;
}

}  // namespace virtual_noise::cpu
