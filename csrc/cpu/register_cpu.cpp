#include <torch/library.h>

#include "cpu/cpu_kernels.h"

TORCH_LIBRARY_IMPL(virtual_noise, CPU, m) {
  using namespace virtual_noise::cpu;
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
