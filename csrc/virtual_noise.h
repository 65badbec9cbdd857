// C++ API of the virtual_noise operators library (installed as
// <virtual_noise/virtual_noise.h>). Each function calls the operator through
// the PyTorch dispatcher, so C++ callers get the same backend selection and
// the same argument checks as Python and TorchScript callers.
//
// Link with the CMake target virtual_noise::ops (find_package(virtual_noise)).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "build_info.h"

namespace virtual_noise {

// (P, batch, out) in x's dtype: Y[i] = X[i] @ (W + sigma N_i)^T + (b + sigma nb_i).
// transposed: weight is stored (in, out) and Y[i] = X[i] @ (W + sigma N_i) + ..., with the
// noise in the stored layout.
at::Tensor perturbed_linear(const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, const at::Tensor& seeds,
                            double sigma, int64_t offset, bool antithetic = false,
                            bool transposed = false);
// (P, n, dim) in weight's dtype: row indices[t] of W + sigma N_i; indices (n,) shared or (P, n).
at::Tensor perturbed_embedding(const at::Tensor& indices, const at::Tensor& weight,
                               const at::Tensor& seeds, double sigma, int64_t offset,
                               bool antithetic = false);
// float32, weight_shape: sum_i f_i N_i / (pop_size * sigma).
at::Tensor weight_gradient(const at::Tensor& fitness, const at::Tensor& seeds,
                           at::IntArrayRef weight_shape, double sigma, int64_t pop_size,
                           int64_t offset, bool antithetic = false);
// float32, bias_shape (1-D); offset is the bias region's own offset.
at::Tensor bias_gradient(const at::Tensor& fitness, const at::Tensor& seeds,
                         at::IntArrayRef bias_shape, double sigma, int64_t pop_size, int64_t offset,
                         bool antithetic = false);
// float32 (P,): mean_k |center_k + sigma * noise_ik|.
at::Tensor reduce_metric(const at::Tensor& center, const at::Tensor& seeds, double sigma,
                         int64_t n_params, int64_t offset, bool antithetic = false);
// float32 (len(seeds), n_elements): the noise itself.
at::Tensor generate_noise(const at::Tensor& seeds, int64_t n_elements, int64_t offset);
// Low-rank noise N_i = sqrt(12 / rank) * A_i @ B_i^T of a block stored (rows, cols): factors A_i
// (rows, rank) at offset, B_i (cols, rank) after them. The forward, as perturbed_linear:
at::Tensor lowrank_perturbed_linear(const at::Tensor& x, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, const at::Tensor& seeds,
                                    double sigma, int64_t offset, int64_t rank, bool antithetic = false,
                                    bool transposed = false);
// float32 weight_shape: sum_i f_i N_i / (pop_size * sigma).
at::Tensor lowrank_weight_gradient(const at::Tensor& fitness, const at::Tensor& seeds,
                                   at::IntArrayRef weight_shape, double sigma, int64_t pop_size,
                                   int64_t offset, int64_t rank, bool antithetic = false);
// float32 (len(seeds), rows, cols): N_i materialized.
at::Tensor generate_lowrank_noise(const at::Tensor& seeds, at::IntArrayRef weight_shape, int64_t rank,
                                  int64_t offset);

}  // namespace virtual_noise
