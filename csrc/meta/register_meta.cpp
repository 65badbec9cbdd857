// Shape and dtype kernels: FakeTensor, torch.compile and torch.export run
// these. They apply the same checks as the real kernels and return empty
// tensors with exactly the real kernels' shape and dtype.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "validation.h"

namespace virtual_noise::meta {
namespace {

at::Tensor perturbed_linear(const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, const at::Tensor& seeds,
                            double sigma, int64_t offset, bool antithetic, bool transposed) {
  const LinearDims d = check_perturbed_linear(x, weight, bias, seeds, sigma, offset, antithetic, transposed);
  return at::empty_symint({d.pop, d.batch, d.out_features}, x.options());
}

at::Tensor perturbed_embedding(const at::Tensor& indices, const at::Tensor& weight, const at::Tensor& seeds,
                               double sigma, int64_t offset, bool antithetic) {
  // The index range needs the data, which meta tensors do not have.
  const EmbeddingDims d = check_perturbed_embedding(indices, weight, seeds, sigma, offset, antithetic);
  return at::empty_symint({d.pop, d.n_indices, d.dim}, weight.options());
}

at::Tensor weight_gradient(const at::Tensor& fitness, const at::Tensor& seeds,
                           at::IntArrayRef weight_shape, double sigma, int64_t pop_size,
                           int64_t offset, bool antithetic) {
  check_noise_gradient("virtual_noise.weight_gradient", "weight_shape", 2, fitness, seeds,
                       weight_shape, sigma, pop_size, offset, antithetic);
  return at::empty(weight_shape, fitness.options().dtype(at::kFloat));
}

at::Tensor bias_gradient(const at::Tensor& fitness, const at::Tensor& seeds,
                         at::IntArrayRef bias_shape, double sigma, int64_t pop_size, int64_t offset,
                         bool antithetic) {
  check_noise_gradient("virtual_noise.bias_gradient", "bias_shape", 1, fitness, seeds, bias_shape,
                       sigma, pop_size, offset, antithetic);
  return at::empty(bias_shape, fitness.options().dtype(at::kFloat));
}

at::Tensor reduce_metric(const at::Tensor& center, const at::Tensor& seeds, double sigma,
                         int64_t n_params, int64_t offset, bool antithetic) {
  const c10::SymInt pop = check_reduce_metric(center, seeds, sigma, n_params, offset, antithetic);
  return at::empty_symint({pop}, center.options().dtype(at::kFloat));
}

at::Tensor generate_noise(const at::Tensor& seeds, int64_t n_elements, int64_t offset) {
  check_generate_noise(seeds, n_elements, offset);
  return at::empty_symint({seeds.sym_size(0), c10::SymInt(n_elements)},
                         seeds.options().dtype(at::kFloat));
}

at::Tensor lowrank_perturbed_linear(const at::Tensor& x, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, const at::Tensor& seeds,
                                    double sigma, int64_t offset, int64_t rank, bool antithetic,
                                    bool transposed) {
  const LinearDims d = check_lowrank_perturbed_linear(x, weight, bias, seeds, sigma, offset, rank, antithetic,
                                                      transposed);
  return at::empty_symint({d.pop, d.batch, d.out_features}, x.options());
}

at::Tensor lowrank_weight_gradient(const at::Tensor& fitness, const at::Tensor& seeds,
                                   at::IntArrayRef weight_shape, double sigma, int64_t pop_size,
                                   int64_t offset, int64_t rank, bool antithetic) {
  check_lowrank_weight_gradient(fitness, seeds, weight_shape, sigma, pop_size, offset, rank, antithetic);
  return at::empty(weight_shape, fitness.options().dtype(at::kFloat));
}

at::Tensor generate_lowrank_noise(const at::Tensor& seeds, at::IntArrayRef weight_shape, int64_t rank,
                                  int64_t offset) {
  check_generate_lowrank_noise(seeds, weight_shape, rank, offset);
  return at::empty_symint({seeds.sym_size(0), c10::SymInt(weight_shape[0]), c10::SymInt(weight_shape[1])},
                          seeds.options().dtype(at::kFloat));
}

}  // namespace
}  // namespace virtual_noise::meta

TORCH_LIBRARY_IMPL(virtual_noise, Meta, m) {
  using namespace virtual_noise::meta;
  m.impl("perturbed_linear", &perturbed_linear);
  m.impl("perturbed_embedding", &perturbed_embedding);
  m.impl("weight_gradient", &weight_gradient);
  m.impl("bias_gradient", &bias_gradient);
  m.impl("reduce_metric", &reduce_metric);
  m.impl("generate_noise", &generate_noise);
  m.impl("lowrank_perturbed_linear", &lowrank_perturbed_linear);
  m.impl("lowrank_weight_gradient", &lowrank_weight_gradient);
  m.impl("generate_lowrank_noise", &generate_lowrank_noise);
}
