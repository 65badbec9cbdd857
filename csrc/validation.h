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

// transposed: weight is stored (in_features, out_features), as x @ W takes it
// (Hugging Face's Conv1D); its noise follows the stored layout.
LinearDims check_perturbed_linear(const at::Tensor& x, const at::Tensor& weight,
                                  const std::optional<at::Tensor>& bias, const at::Tensor& seeds,
                                  double sigma, int64_t offset, bool antithetic, bool transposed);

// Low-rank noise of a block stored (rows, cols) with rank r: factors A (rows, r) at offset and
// B (cols, r) after it, inside the block's own region: r >= 1 and (rows + cols) * r <= rows * cols.
void check_rank(const char* op, int64_t rows, int64_t cols, int64_t rank);

LinearDims check_lowrank_perturbed_linear(const at::Tensor& x, const at::Tensor& weight,
                                          const std::optional<at::Tensor>& bias, const at::Tensor& seeds,
                                          double sigma, int64_t offset, int64_t rank, bool antithetic,
                                          bool transposed);

// Returns the number of elements.
int64_t check_lowrank_weight_gradient(const at::Tensor& fitness, const at::Tensor& seeds,
                                      at::IntArrayRef weight_shape, double sigma, int64_t pop_size,
                                      int64_t offset, int64_t rank, bool antithetic);

void check_generate_lowrank_noise(const at::Tensor& seeds, at::IntArrayRef weight_shape, int64_t rank,
                                  int64_t offset);

struct EmbeddingDims {
  c10::SymInt pop;
  c10::SymInt n_seeds;
  c10::SymInt n_indices;  // lookups per individual
  c10::SymInt num_embeddings;
  c10::SymInt dim;
  bool shared;  // indices are (n,) for every individual, else (P, n)
};

EmbeddingDims check_perturbed_embedding(const at::Tensor& indices, const at::Tensor& weight,
                                        const at::Tensor& seeds, double sigma, int64_t offset,
                                        bool antithetic);

// Every index in [0, num_embeddings): reads the data (a device sync on CUDA).
void check_embedding_indices(const at::Tensor& indices, int64_t num_embeddings);

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
