// CPU kernels of the operators (registered in cpu/register_cpu.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

namespace virtual_noise::cpu {

at::Tensor perturbed_linear(const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, const at::Tensor& seeds,
                            double sigma, int64_t offset, bool antithetic, bool transposed);
at::Tensor perturbed_embedding(const at::Tensor& indices, const at::Tensor& weight,
                               const at::Tensor& seeds, double sigma, int64_t offset, bool antithetic);
at::Tensor weight_gradient(const at::Tensor& fitness, const at::Tensor& seeds,
                           at::IntArrayRef weight_shape, double sigma, int64_t pop_size,
                           int64_t offset, bool antithetic);
at::Tensor bias_gradient(const at::Tensor& fitness, const at::Tensor& seeds,
                         at::IntArrayRef bias_shape, double sigma, int64_t pop_size, int64_t offset,
                         bool antithetic);
at::Tensor reduce_metric(const at::Tensor& center, const at::Tensor& seeds, double sigma,
                         int64_t n_params, int64_t offset, bool antithetic);
at::Tensor generate_noise(const at::Tensor& seeds, int64_t n_elements, int64_t offset);
at::Tensor lowrank_perturbed_linear(const at::Tensor& x, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, const at::Tensor& seeds,
                                    double sigma, int64_t offset, int64_t rank, bool antithetic,
                                    bool transposed);
at::Tensor lowrank_weight_gradient(const at::Tensor& fitness, const at::Tensor& seeds,
                                   at::IntArrayRef weight_shape, double sigma, int64_t pop_size,
                                   int64_t offset, int64_t rank, bool antithetic);
at::Tensor generate_lowrank_noise(const at::Tensor& seeds, at::IntArrayRef weight_shape, int64_t rank,
                                  int64_t offset);

// W^T in tiles of kTileCols outputs (noise_kernels.h), zero-padded:
// tile t holds (in, kTileCols) with element (k, j) = W[t*kTileCols + j, k]; W is (out, in) row-major.
std::vector<float> weight_tiles(const float* w, int64_t in, int64_t out);
// x_i @ W^T + b for n_x matrices x_i (batch, in), in the same tiles: (n_x, n_tiles, batch, kTileCols),
// each tile summed in a fixed order (bit-identical for any thread count). bias may be null.
std::vector<float> linear_tiles(const float* x, int64_t n_x, int64_t batch, int64_t in, int64_t out,
                                const std::vector<float>& wt, const float* bias);

// Per-seed keys (the first mix of the spec), hashed once per call.
std::vector<uint64_t> seed_keys(const at::Tensor& seeds);

}  // namespace virtual_noise::cpu
