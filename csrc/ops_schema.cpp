// The operator schemas: the one definition of virtual_noise's interface.
// Kernels live per backend: cpu/register_cpu.cpp, meta/register_meta.cpp and,
// for CUDA, Triton kernels registered from Python (python/virtual_noise/cuda/).
#include <torch/library.h>

#include "validation.h"

namespace virtual_noise {
namespace {

// Backend-independent argument checks, callable from kernels written outside
// C++ (the Triton launchers) so they raise exactly what the C++ kernels raise.
void validate_perturbed_linear(const at::Tensor& x, const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias, const at::Tensor& seeds,
                               double sigma, int64_t offset, bool antithetic, bool transposed) {
  check_perturbed_linear(x, weight, bias, seeds, sigma, offset, antithetic, transposed);
}
void validate_perturbed_embedding(const at::Tensor& indices, const at::Tensor& weight,
                                  const at::Tensor& seeds, double sigma, int64_t offset,
                                  bool antithetic) {
  check_perturbed_embedding(indices, weight, seeds, sigma, offset, antithetic);
}
void validate_embedding_indices(const at::Tensor& indices, int64_t num_embeddings) {
  check_embedding_indices(indices, num_embeddings);
}
void validate_weight_gradient(const at::Tensor& fitness, const at::Tensor& seeds,
                              at::IntArrayRef weight_shape, double sigma, int64_t pop_size,
                              int64_t offset, bool antithetic) {
  check_noise_gradient("virtual_noise.weight_gradient", "weight_shape", 2, fitness, seeds,
                       weight_shape, sigma, pop_size, offset, antithetic);
}
void validate_bias_gradient(const at::Tensor& fitness, const at::Tensor& seeds,
                            at::IntArrayRef bias_shape, double sigma, int64_t pop_size,
                            int64_t offset, bool antithetic) {
  check_noise_gradient("virtual_noise.bias_gradient", "bias_shape", 1, fitness, seeds, bias_shape,
                       sigma, pop_size, offset, antithetic);
}
void validate_reduce_metric(const at::Tensor& center, const at::Tensor& seeds, double sigma,
                            int64_t n_params, int64_t offset, bool antithetic) {
  check_reduce_metric(center, seeds, sigma, n_params, offset, antithetic);
}
void validate_generate_noise(const at::Tensor& seeds, int64_t n_elements, int64_t offset) {
  check_generate_noise(seeds, n_elements, offset);
}

void validate_lowrank_perturbed_linear(const at::Tensor& x, const at::Tensor& weight,
                                       const std::optional<at::Tensor>& bias, const at::Tensor& seeds,
                                       double sigma, int64_t offset, int64_t rank, bool antithetic,
                                       bool transposed) {
  check_lowrank_perturbed_linear(x, weight, bias, seeds, sigma, offset, rank, antithetic, transposed);
}
void validate_lowrank_weight_gradient(const at::Tensor& fitness, const at::Tensor& seeds,
                                      at::IntArrayRef weight_shape, double sigma, int64_t pop_size,
                                      int64_t offset, int64_t rank, bool antithetic) {
  check_lowrank_weight_gradient(fitness, seeds, weight_shape, sigma, pop_size, offset, rank, antithetic);
}
void validate_generate_lowrank_noise(const at::Tensor& seeds, at::IntArrayRef weight_shape, int64_t rank,
                                     int64_t offset) {
  check_generate_lowrank_noise(seeds, weight_shape, rank, offset);
}

}  // namespace

TORCH_LIBRARY(virtual_noise, m) {
  const std::vector<at::Tag> pt2{at::Tag::pt2_compliant_tag};
  m.def("perturbed_linear(Tensor x, Tensor weight, Tensor? bias, Tensor seeds, float sigma, "
        "int offset, bool antithetic=False, bool transposed=False) -> Tensor", pt2);
  m.def("perturbed_embedding(Tensor indices, Tensor weight, Tensor seeds, float sigma, int offset, "
        "bool antithetic=False) -> Tensor", pt2);
  m.def("weight_gradient(Tensor fitness, Tensor seeds, int[] weight_shape, float sigma, "
        "int pop_size, int offset, bool antithetic=False) -> Tensor", pt2);
  m.def("bias_gradient(Tensor fitness, Tensor seeds, int[] bias_shape, float sigma, "
        "int pop_size, int offset, bool antithetic=False) -> Tensor", pt2);
  m.def("reduce_metric(Tensor center, Tensor seeds, float sigma, int n_params, int offset, "
        "bool antithetic=False) -> Tensor", pt2);
  m.def("generate_noise(Tensor seeds, int n_elements, int offset) -> Tensor", pt2);
  m.def("lowrank_perturbed_linear(Tensor x, Tensor weight, Tensor? bias, Tensor seeds, float sigma, "
        "int offset, int rank, bool antithetic=False, bool transposed=False) -> Tensor", pt2);
  m.def("lowrank_weight_gradient(Tensor fitness, Tensor seeds, int[] weight_shape, float sigma, "
        "int pop_size, int offset, int rank, bool antithetic=False) -> Tensor", pt2);
  m.def("generate_lowrank_noise(Tensor seeds, int[] weight_shape, int rank, int offset) -> Tensor", pt2);

  m.def("_validate_perturbed_linear(Tensor x, Tensor weight, Tensor? bias, Tensor seeds, "
        "float sigma, int offset, bool antithetic, bool transposed) -> ()", &validate_perturbed_linear);
  m.def("_validate_perturbed_embedding(Tensor indices, Tensor weight, Tensor seeds, float sigma, "
        "int offset, bool antithetic) -> ()", &validate_perturbed_embedding);
  m.def("_validate_embedding_indices(Tensor indices, int num_embeddings) -> ()",
        &validate_embedding_indices);
  m.def("_validate_weight_gradient(Tensor fitness, Tensor seeds, int[] weight_shape, float sigma, "
        "int pop_size, int offset, bool antithetic) -> ()", &validate_weight_gradient);
  m.def("_validate_bias_gradient(Tensor fitness, Tensor seeds, int[] bias_shape, float sigma, "
        "int pop_size, int offset, bool antithetic) -> ()", &validate_bias_gradient);
  m.def("_validate_reduce_metric(Tensor center, Tensor seeds, float sigma, int n_params, "
        "int offset, bool antithetic) -> ()", &validate_reduce_metric);
  m.def("_validate_generate_noise(Tensor seeds, int n_elements, int offset) -> ()",
        &validate_generate_noise);
  m.def("_validate_lowrank_perturbed_linear(Tensor x, Tensor weight, Tensor? bias, Tensor seeds, float sigma, "
        "int offset, int rank, bool antithetic, bool transposed) -> ()", &validate_lowrank_perturbed_linear);
  m.def("_validate_lowrank_weight_gradient(Tensor fitness, Tensor seeds, int[] weight_shape, float sigma, "
        "int pop_size, int offset, int rank, bool antithetic) -> ()", &validate_lowrank_weight_gradient);
  m.def("_validate_generate_lowrank_noise(Tensor seeds, int[] weight_shape, int rank, int offset) -> ()",
        &validate_generate_lowrank_noise);
}

}  // namespace virtual_noise
