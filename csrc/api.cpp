#include "virtual_noise.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include "cpu/noise_kernels.h"

namespace virtual_noise {
namespace {

template <typename Signature>
c10::TypedOperatorHandle<Signature> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

}  // namespace

at::Tensor perturbed_linear(const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, const at::Tensor& seeds,
                            double sigma, int64_t offset, bool antithetic, bool transposed) {
  static const auto h = op<decltype(perturbed_linear)>("virtual_noise::perturbed_linear");
  return h.call(x, weight, bias, seeds, sigma, offset, antithetic, transposed);
}

at::Tensor perturbed_embedding(const at::Tensor& indices, const at::Tensor& weight,
                               const at::Tensor& seeds, double sigma, int64_t offset,
                               bool antithetic) {
  static const auto h = op<decltype(perturbed_embedding)>("virtual_noise::perturbed_embedding");
  return h.call(indices, weight, seeds, sigma, offset, antithetic);
}

at::Tensor weight_gradient(const at::Tensor& fitness, const at::Tensor& seeds,
                           at::IntArrayRef weight_shape, double sigma, int64_t pop_size,
                           int64_t offset, bool antithetic) {
  static const auto h = op<decltype(weight_gradient)>("virtual_noise::weight_gradient");
  return h.call(fitness, seeds, weight_shape, sigma, pop_size, offset, antithetic);
}

at::Tensor bias_gradient(const at::Tensor& fitness, const at::Tensor& seeds,
                         at::IntArrayRef bias_shape, double sigma, int64_t pop_size, int64_t offset,
                         bool antithetic) {
  static const auto h = op<decltype(bias_gradient)>("virtual_noise::bias_gradient");
  return h.call(fitness, seeds, bias_shape, sigma, pop_size, offset, antithetic);
}

at::Tensor reduce_metric(const at::Tensor& center, const at::Tensor& seeds, double sigma,
                         int64_t n_params, int64_t offset, bool antithetic) {
  static const auto h = op<decltype(reduce_metric)>("virtual_noise::reduce_metric");
  return h.call(center, seeds, sigma, n_params, offset, antithetic);
}

at::Tensor generate_noise(const at::Tensor& seeds, int64_t n_elements, int64_t offset) {
  static const auto h = op<decltype(generate_noise)>("virtual_noise::generate_noise");
  return h.call(seeds, n_elements, offset);
}

at::Tensor lowrank_perturbed_linear(const at::Tensor& x, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, const at::Tensor& seeds,
                                    double sigma, int64_t offset, int64_t rank, bool antithetic,
                                    bool transposed) {
  static const auto h =
      op<decltype(lowrank_perturbed_linear)>("virtual_noise::lowrank_perturbed_linear");
  return h.call(x, weight, bias, seeds, sigma, offset, rank, antithetic, transposed);
}

at::Tensor lowrank_weight_gradient(const at::Tensor& fitness, const at::Tensor& seeds,
                                   at::IntArrayRef weight_shape, double sigma, int64_t pop_size,
                                   int64_t offset, int64_t rank, bool antithetic) {
  static const auto h = op<decltype(lowrank_weight_gradient)>("virtual_noise::lowrank_weight_gradient");
  return h.call(fitness, seeds, weight_shape, sigma, pop_size, offset, rank, antithetic);
}

at::Tensor generate_lowrank_noise(const at::Tensor& seeds, at::IntArrayRef weight_shape, int64_t rank,
                                  int64_t offset) {
  static const auto h = op<decltype(generate_lowrank_noise)>("virtual_noise::generate_lowrank_noise");
  return h.call(seeds, weight_shape, rank, offset);
}

const char* simd_level() { return cpu::simd_level(); }

}  // namespace virtual_noise
