// out[i, t, :] = W[idx, :] + s_i * sigma * noise(seed, offset + idx * dim + d): an embedding
// lookup of every individual, hashing only the gathered rows (never the whole table).
//
// Work items are (seed, block of lookups); each output element's arithmetic is fixed
// by its inputs alone, so results are bit-identical for any thread count.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <vector>

#include "cpu/cpu_kernels.h"
#include "cpu/noise_kernels.h"
#include "validation.h"

namespace virtual_noise::cpu {

at::Tensor perturbed_embedding(const at::Tensor& indices, const at::Tensor& weight,
                               const at::Tensor& seeds, double sigma_d, int64_t offset,
                               bool antithetic) {
  const EmbeddingDims d = check_perturbed_embedding(indices, weight, seeds, sigma_d, offset, antithetic);
  const int64_t num = d.num_embeddings.expect_int(), dim = d.dim.expect_int();
  check_embedding_indices(indices, num);
  const int64_t pop = d.pop.expect_int(), n_seeds = d.n_seeds.expect_int(), n = d.n_indices.expect_int();
  at::Tensor y = at::empty({pop, n, dim}, weight.options().dtype(at::kFloat));
  if (y.numel() == 0) return y.to(weight.scalar_type());

  const at::Tensor idx = indices.to(at::kLong).contiguous();
  const at::Tensor w32 = weight.to(at::kFloat).contiguous();
  const int64_t* ip = idx.data_ptr<int64_t>();
  const float* wp = w32.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const auto keys = seed_keys(seeds);
  const float sigma = static_cast<float>(sigma_d);
  const int64_t members = antithetic ? 2 : 1;
  constexpr int64_t kBlock = 64;  // lookups per work item
  const int64_t n_blocks = (n + kBlock - 1) / kBlock;

  at::parallel_for(0, n_seeds * n_blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> noise(dim);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t u = item / n_blocks, t0 = (item % n_blocks) * kBlock, t1 = std::min(n, t0 + kBlock);
      for (int64_t t = t0; t < t1; ++t) {
        int64_t hashed_row = -1;  // shared indices: both members of a pair use one hashed row
        for (int64_t m = 0; m < members; ++m) {
          const int64_t i = u * members + m;
          const float s = m == 0 ? sigma : -sigma;  // antithetic twin: -N_u
          const int64_t row = ip[(d.shared ? 0 : i * n) + t];
          if (row != hashed_row) {
            fill_noise(keys[u], static_cast<uint64_t>(offset + row * dim), 1, dim, noise.data());
            hashed_row = row;
          }
          const float* w = wp + row * dim;
          float* out = yp + (i * n + t) * dim;
          for (int64_t k = 0; k < dim; ++k) out[k] = w[k] + s * noise[k];
        }
      }
    }
  });
  return y.to(weight.scalar_type());
}

}  // namespace virtual_noise::cpu
