// Low-rank virtual noise on the CPU. A block stored (rows, cols) at offset with rank r has factors
//   A[j, q] = noise(seed, offset + j*r + q)              j < rows
//   B[k, q] = noise(seed, offset + rows*r + k*r + q)     k < cols
// and N = sqrt(12 / r) * A @ B^T, so that each element has variance 1/12 as full-rank noise.
// For a linear weight stored (out, in) the output factor is A and the input factor B; stored
// (in, out) (transposed) the roles swap. The forward never forms N:
//   y_i = x_i @ W^T + b + s_i sigma (c * (x_i @ fin) @ fout^T + nb_i).
//
// Every sum has a fixed order set by the shapes alone, so results are the same for any thread count.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "cpu/noise_kernels.h"
#include "validation.h"

namespace virtual_noise::cpu {
namespace {

// The factors of one seed: fin (in, r) and fout (out, r), row-major.
void fill_factors(uint64_t key, uint64_t offset, int64_t in, int64_t out, int64_t r, bool transposed,
                  float* fin, float* fout) {
  const int64_t rows = transposed ? in : out;
  float* a = transposed ? fin : fout;
  float* b = transposed ? fout : fin;
  fill_noise(key, offset, 1, rows * r, a);
  fill_noise(key, offset + static_cast<uint64_t>(rows * r), 1, (transposed ? out : in) * r, b);
}

}  // namespace

// The per-individual base's float32 tiles, at most this many bytes at a time.
constexpr int64_t kBaseChunkBytes = 16 << 20;

at::Tensor lowrank_perturbed_linear(const at::Tensor& x, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, const at::Tensor& seeds,
                                    double sigma_d, int64_t offset, int64_t rank, bool antithetic,
                                    bool transposed) {
  const LinearDims d = check_lowrank_perturbed_linear(x, weight, bias, seeds, sigma_d, offset, rank, antithetic,
                                                      transposed);
  const int64_t pop = d.pop.expect_int(), n_seeds = d.n_seeds.expect_int();
  const int64_t batch = d.batch.expect_int(), in = d.in_features.expect_int(), out = d.out_features.expect_int();
  at::Tensor y = at::empty({pop, batch, out}, x.options().dtype(at::kFloat));
  if (y.numel() == 0) return y.to(x.scalar_type());
  const at::Tensor x32 = x.to(at::kFloat).contiguous();
  const at::Tensor w32 = (transposed ? weight.t() : weight).to(at::kFloat).contiguous();
  const at::Tensor b32 = d.has_bias ? bias->to(at::kFloat).contiguous() : at::Tensor();
  const float* xp = x32.data_ptr<float>();
  const float* bp = d.has_bias ? b32.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  const auto keys = seed_keys(seeds);
  const float sigma = static_cast<float>(sigma_d);
  const float c = static_cast<float>(std::sqrt(12.0 / static_cast<double>(rank)));
  const int64_t members = antithetic ? 2 : 1, r = rank;
  const uint64_t b_off = static_cast<uint64_t>(offset) + static_cast<uint64_t>(out * in);
  const int64_t n_tiles = (out + kTileCols - 1) / kTileCols, prod = batch * kTileCols;
  const std::vector<float> wt = weight_tiles(w32.data_ptr<float>(), in, out);

  // x @ W^T + b: once for shared x; per individual otherwise, for a chunk of seeds at a time, so that the
  // float32 tiles of the base take at most kBaseChunkBytes beside the output (fixed tile order either way).
  const int64_t chunk =
      d.shared_x ? n_seeds : std::max<int64_t>(1, kBaseChunkBytes / 4 / (members * n_tiles * prod));
  for (int64_t s0 = 0; s0 < n_seeds; s0 += chunk) {
    const int64_t s1 = std::min(n_seeds, s0 + chunk);
    const std::vector<float> base =
        d.shared_x ? linear_tiles(xp, 1, batch, in, out, wt, bp)
                   : linear_tiles(xp + s0 * members * batch * in, (s1 - s0) * members, batch, in, out, wt, bp);
    at::parallel_for(s0, s1, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> fin(in * r), fout(out * r), nb(out), u(members * batch * r);
      for (int64_t s = begin; s < end; ++s) {
        fill_factors(keys[s], static_cast<uint64_t>(offset), in, out, r, transposed, fin.data(), fout.data());
        if (d.has_bias) fill_noise(keys[s], b_off, 1, out, nb.data());
        // u = x_i @ fin, for each member with its own x (one for shared x).
        const int64_t xs = d.shared_x ? 1 : members;
        for (int64_t m = 0; m < xs; ++m) {
          const float* xi = xp + (d.shared_x ? 0 : (s * members + m) * batch * in);
          for (int64_t b = 0; b < batch; ++b)
            for (int64_t q = 0; q < r; ++q) {
              float acc = 0.f;
              for (int64_t k = 0; k < in; ++k) acc += xi[b * in + k] * fin[k * r + q];
              u[(m * batch + b) * r + q] = acc;
            }
        }
        for (int64_t m = 0; m < members; ++m) {
          const int64_t i = s * members + m;
          const float sg = m == 0 ? sigma : -sigma;  // antithetic twin: -N
          const float* ui = u.data() + (d.shared_x ? 0 : m) * batch * r;
          const float* bi = base.data() + (d.shared_x ? 0 : i - s0 * members) * n_tiles * prod;
          for (int64_t b = 0; b < batch; ++b)
            for (int64_t j = 0; j < out; ++j) {
              float acc = 0.f;
              for (int64_t q = 0; q < r; ++q) acc += ui[b * r + q] * fout[j * r + q];
              const float noise_term = c * acc + (d.has_bias ? nb[j] : 0.f);
              const float bv = bi[(j / kTileCols) * prod + b * kTileCols + j % kTileCols];
              yp[(i * batch + b) * out + j] = bv + sg * noise_term;
            }
        }
      }
    });
  }
  return y.to(x.scalar_type());
}

at::Tensor lowrank_weight_gradient(const at::Tensor& fitness, const at::Tensor& seeds,
                                   at::IntArrayRef weight_shape, double sigma, int64_t pop_size,
                                   int64_t offset, int64_t rank, bool antithetic) {
  check_lowrank_weight_gradient(fitness, seeds, weight_shape, sigma, pop_size, offset, rank, antithetic);
  const int64_t rows = weight_shape[0], cols = weight_shape[1], r = rank;
  at::Tensor grad = at::zeros({rows, cols}, fitness.options().dtype(at::kFloat));
  const auto keys = seed_keys(seeds);
  const int64_t units = static_cast<int64_t>(keys.size());
  if (grad.numel() == 0 || units == 0) return grad;
  const at::Tensor f = fitness.to(at::kDouble).contiguous();
  const double* fp = f.data_ptr<double>();
  const double c = std::sqrt(12.0 / static_cast<double>(r));
  const float scale = static_cast<float>(c / (static_cast<double>(pop_size) * sigma));

  // G = scale * sum_u coef_u A_u @ B_u^T: a GEMM over K = units * r, in chunks of seeds whose
  // factors are generated into A_f (rows, K) (coef folded in) and Bt tiles (K, kTileCols of cols).
  constexpr int64_t kSeedsPerChunk = 256;
  const int64_t n_tiles = (cols + kTileCols - 1) / kTileCols;
  float* gp = grad.data_ptr<float>();
  std::vector<float> acc(rows * n_tiles * kTileCols, 0.f);  // G tiles, (tile, row, kTileCols)
  for (int64_t u0 = 0; u0 < units; u0 += kSeedsPerChunk) {
    const int64_t nu = std::min(kSeedsPerChunk, units - u0), K = nu * r;
    std::vector<float> af(rows * K), bcat(cols * K);
    at::parallel_for(0, nu, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> a(rows * r), b(cols * r);
      for (int64_t v = begin; v < end; ++v) {
        const int64_t u = u0 + v;
        const float coef = static_cast<float>(antithetic ? fp[2 * u] - fp[2 * u + 1] : fp[u]);
        fill_noise(keys[u], static_cast<uint64_t>(offset), 1, rows * r, a.data());
        fill_noise(keys[u], static_cast<uint64_t>(offset + rows * r), 1, cols * r, b.data());
        for (int64_t j = 0; j < rows; ++j)
          for (int64_t q = 0; q < r; ++q) af[j * K + v * r + q] = coef * a[j * r + q];
        for (int64_t k = 0; k < cols; ++k)
          for (int64_t q = 0; q < r; ++q) bcat[k * K + v * r + q] = b[k * r + q];
      }
    });
    at::parallel_for(0, n_tiles, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> bt(K * kTileCols), part(rows * kTileCols);
      for (int64_t t = begin; t < end; ++t) {
        const int64_t ncol = std::min(kTileCols, cols - t * kTileCols);
        for (int64_t k = 0; k < K; ++k)
          for (int64_t j = 0; j < kTileCols; ++j) bt[k * kTileCols + j] = j < ncol ? bcat[(t * kTileCols + j) * K + k] : 0.f;
        gemm_tile(af.data(), K, rows, K, bt.data(), part.data());
        float* dst = acc.data() + t * rows * kTileCols;
        for (int64_t e = 0; e < rows * kTileCols; ++e) dst[e] += part[e];
      }
    });
  }
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j)
      for (int64_t k = 0; k < cols; ++k)
        gp[j * cols + k] = acc[((k / kTileCols) * rows + j) * kTileCols + k % kTileCols] * scale;
  });
  return grad;
}

at::Tensor generate_lowrank_noise(const at::Tensor& seeds, at::IntArrayRef weight_shape, int64_t rank,
                                  int64_t offset) {
  check_generate_lowrank_noise(seeds, weight_shape, rank, offset);
  const int64_t rows = weight_shape[0], cols = weight_shape[1], r = rank;
  const auto keys = seed_keys(seeds);
  const int64_t n_seeds = static_cast<int64_t>(keys.size());
  at::Tensor out = at::empty({n_seeds, rows, cols}, seeds.options().dtype(at::kFloat));
  const double c = std::sqrt(12.0 / static_cast<double>(r));
  float* o = out.data_ptr<float>();
  at::parallel_for(0, n_seeds, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> a(rows * r), b(cols * r);
    for (int64_t s = begin; s < end; ++s) {
      fill_noise(keys[s], static_cast<uint64_t>(offset), 1, rows * r, a.data());
      fill_noise(keys[s], static_cast<uint64_t>(offset + rows * r), 1, cols * r, b.data());
      for (int64_t j = 0; j < rows; ++j)
        for (int64_t k = 0; k < cols; ++k) {
          double acc = 0.0;  // products of 24-bit values are exact in double, and so are short sums
          for (int64_t q = 0; q < r; ++q) acc += static_cast<double>(a[j * r + q]) * b[k * r + q];
          o[(s * rows + j) * cols + k] = static_cast<float>(c * acc);
        }
    }
  });
  return out;
}

}  // namespace virtual_noise::cpu
