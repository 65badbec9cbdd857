#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "cpu/cpu_kernels.h"
#include "cpu/noise_kernels.h"
#include "validation.h"

namespace virtual_noise::cpu {

at::Tensor generate_noise(const at::Tensor& seeds, int64_t n_elements, int64_t offset) {
  check_generate_noise(seeds, n_elements, offset);
  const auto keys = seed_keys(seeds);
  const int64_t n_seeds = static_cast<int64_t>(keys.size());
  at::Tensor out = at::empty({n_seeds, n_elements}, seeds.options().dtype(at::kFloat));
  constexpr int64_t kChunk = 1 << 16;
  const int64_t n_chunks = (n_elements + kChunk - 1) / kChunk;
  float* o = out.data_ptr<float>();
  at::parallel_for(0, n_seeds * n_chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t s = item / n_chunks, c = item % n_chunks;
      const int64_t start = c * kChunk, len = std::min(kChunk, n_elements - start);
      fill_noise(keys[s], static_cast<uint64_t>(offset + start), 1, len, o + s * n_elements + start);
    }
  });
  return out;
}

}  // namespace virtual_noise::cpu
