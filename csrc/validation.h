// Argument checks for every operator, in one place. The CPU and Meta kernels
// call them, and the CUDA (Triton) kernels reach them through the
// virtual_noise::_validate_* operators, so every backend and every C++ caller
// gets the same error for the same bad input.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>

#include <cstdint>
#include <optional>

namespace virtual_noise {

// Sizes are SymInts so that the Meta kernels work under dynamic shapes
// (torch.compile, torch.export); real kernels read them with expect_int().
struct LinearDims {
  c10::SymInt pop;      // individuals (2 * seeds with antithetic pairs)
  c10::SymInt n_seeds;  // seeds given
  c10::SymInt batch;
  c10::SymInt in_features;
  c10::SymInt out_features;
  bool shared_x;    // x is (batch, in) for every individual
  bool has_bias;
};

LinearDims check_perturbed_linear(const at::Tensor& x, const at::Tensor& weight,
                                  const std::optional<at::Tensor>& bias, const at::Tensor& seeds,
                                  double sigma, int64_t offset, bool antithetic);

// Shared by weight_gradient (shape_arg "weight_shape", 2 dims) and
// bias_gradient ("bias_shape", 1 dim). Returns the number of elements.
int64_t check_noise_gradient(const char* op, const char* shape_arg, int64_t expected_dims,
                             const at::Tensor& fitness, const at::Tensor& seeds,
                             at::IntArrayRef shape, double sigma, int64_t pop_size, int64_t offset,
                             bool antithetic);

// Returns the population size.
c10::SymInt check_reduce_metric(const at::Tensor& center, const at::Tensor& seeds, double sigma,
                            int64_t n_params, int64_t offset, bool antithetic);

void check_generate_noise(const at::Tensor& seeds, int64_t n_elements, int64_t offset);

}  // namespace virtual_noise
