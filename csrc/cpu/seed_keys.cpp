// Per-seed keys (the spec's first mix), shared by every CPU kernel.
#include <ATen/ATen.h>

#include "cpu/cpu_kernels.h"
#include "noise_spec.h"

namespace virtual_noise::cpu {

std::vector<uint64_t> seed_keys(const at::Tensor& seeds) {
  const at::Tensor s = seeds.to(at::kLong).contiguous();
  const int64_t* p = s.data_ptr<int64_t>();
  std::vector<uint64_t> keys(s.numel());
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = seed_key(p[i]);
  return keys;
}

}  // namespace virtual_noise::cpu
