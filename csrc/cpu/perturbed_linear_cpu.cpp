// Y[i] = X[i] @ (W + sigma N_i)^T + (b + sigma nb_i), with N_i regenerated
// tile by tile (kTileCols output rows x all inputs) into a per-thread buffer.
// With transposed, W is stored (in, out) and its noise follows that layout:
// only the noise indices' strides change (row j, column k at j + k * out).
//
// Work items are (individual or antithetic pair, output tile). Each item's
// arithmetic is fixed by the shapes alone, so results are bit-identical for
// any thread count. Extra memory: the output, W transposed in tiles (the size
// of W), and per thread one noise tile plus one batch x tile product.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <vector>

#include "cpu/cpu_kernels.h"
#include "cpu/noise_kernels.h"
#include "validation.h"

namespace virtual_noise::cpu {
namespace {

struct TileGeometry {
  int64_t in, out, n_tiles;
  int64_t rows(int64_t t) const { return std::min(kTileCols, out - t * kTileCols); }
};

}  // namespace

at::Tensor perturbed_linear(const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, const at::Tensor& seeds,
                            double sigma_d, int64_t offset, bool antithetic, bool transposed) {
  const LinearDims d =
      check_perturbed_linear(x, weight, bias, seeds, sigma_d, offset, antithetic, transposed);
  const at::Tensor x32 = x.to(at::kFloat).contiguous();
  const at::Tensor w32 = (transposed ? weight.t() : weight).to(at::kFloat).contiguous();  // (out, in)
  const at::Tensor b32 = d.has_bias ? bias->to(at::kFloat).contiguous() : at::Tensor();
  const int64_t pop = d.pop.expect_int(), n_seeds = d.n_seeds.expect_int();
  const int64_t batch = d.batch.expect_int(), in = d.in_features.expect_int();
  const int64_t out = d.out_features.expect_int();
  at::Tensor y = at::empty({pop, batch, out}, x.options().dtype(at::kFloat));
  if (y.numel() == 0) return y.to(x.scalar_type());

  const TileGeometry g{in, out, (out + kTileCols - 1) / kTileCols};
  const auto keys = seed_keys(seeds);
  const float sigma = static_cast<float>(sigma_d);
  const float* xp = x32.data_ptr<float>();
  const float* wp = w32.data_ptr<float>();
  const float* bp = d.has_bias ? b32.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  const int64_t tile_floats = in * kTileCols, prod_floats = batch * kTileCols;
  const int64_t members = antithetic ? 2 : 1;
  const uint64_t w_off = static_cast<uint64_t>(offset);
  const uint64_t b_off = w_off + static_cast<uint64_t>(out * in);
  // Noise index of output row j, input k: w_off + j * row_stride + k * col_stride.
  const uint64_t row_stride = transposed ? 1 : static_cast<uint64_t>(in);
  const uint64_t col_stride = transposed ? static_cast<uint64_t>(out) : 1;

  // W^T in tiles, shared by every individual; shared x: x @ W^T + b once, then only
  // sigma * (x @ N_i^T + nb_i) per individual.
  const std::vector<float> wt = weight_tiles(wp, in, out);
  const std::vector<float> base =
      d.shared_x ? linear_tiles(xp, 1, batch, in, out, wt, bp) : std::vector<float>();

  at::parallel_for(0, n_seeds * g.n_tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> noise_t(tile_floats), perturbed_t, prod(prod_floats), bias_noise(kTileCols, 0.f);
    if (!d.shared_x) perturbed_t.resize(tile_floats);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t u = item / g.n_tiles, t = item % g.n_tiles, rows = g.rows(t), j0 = t * kTileCols;
      fill_noise_tile_transposed(keys[u], w_off + static_cast<uint64_t>(j0) * row_stride, row_stride,
                                 col_stride, rows, in, noise_t.data());
      if (bp != nullptr) fill_noise(keys[u], b_off + static_cast<uint64_t>(j0), 1, rows, bias_noise.data());
      if (d.shared_x) gemm_tile(xp, in, batch, in, noise_t.data(), prod.data());
      for (int64_t m = 0; m < members; ++m) {
        const int64_t i = u * members + m;
        const float s = m == 0 ? sigma : -sigma;  // antithetic twin: -N_u
        float* yi = yp + i * batch * out + j0;
        if (d.shared_x) {
          const float* bt = base.data() + t * prod_floats;
          for (int64_t b = 0; b < batch; ++b)
            for (int64_t r = 0; r < rows; ++r)
              yi[b * out + r] = bt[b * kTileCols + r] + s * (prod[b * kTileCols + r] + bias_noise[r]);
        } else {
          // Per-individual x: one product with W + s N folded into the tile.
          const float* w_t = wt.data() + t * tile_floats;
          for (int64_t k = 0; k < tile_floats; ++k) perturbed_t[k] = w_t[k] + s * noise_t[k];
          gemm_tile(xp + i * batch * in, in, batch, in, perturbed_t.data(), prod.data());
          for (int64_t b = 0; b < batch; ++b)
            for (int64_t r = 0; r < rows; ++r)
              yi[b * out + r] = prod[b * kTileCols + r] + (bp != nullptr ? bp[j0 + r] : 0.f) +
                                s * bias_noise[r];
        }
      }
    }
  });
  return y.to(x.scalar_type());
}

}  // namespace virtual_noise::cpu
