// Loads a TorchScript module saved from Python that calls
// torch.ops.virtual_noise.perturbed_linear, runs it, and calls the operators
// through the C++ API: the libtorch-only consumer of the operators library.
#include <torch/script.h>
#include <virtual_noise/virtual_noise.h>

#include <iomanip>
#include <iostream>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: vn_consumer <scripted_module.pt>\n";
    return 2;
  }
  std::cout << std::setprecision(17);

  // The spec's check values, through the dispatcher from C++.
  const at::Tensor seeds = torch::tensor({0, 1}, torch::kLong);
  const at::Tensor noise = virtual_noise::generate_noise(seeds, 2, 0);
  std::cout << "noise " << noise[0][0].item<float>() << " " << noise[0][1].item<float>() << " "
            << noise[1][0].item<float>() << "\n";

  // The scripted module: deterministic inputs the Python test recreates.
  torch::jit::script::Module module = torch::jit::load(argv[1]);
  const at::Tensor x = torch::arange(12, torch::kFloat).reshape({3, 4}) / 10.0;
  const at::Tensor out = module.forward({x, torch::tensor({5, 6}, torch::kLong)}).toTensor();
  std::cout << "module_sum " << out.sum().item<double>() << " shape " << out.sizes() << "\n";

  // Bad input from C++ gets the same clear error as from Python.
  try {
    virtual_noise::weight_gradient(torch::ones({3}), seeds, {2, 2}, 0.1, 3, 0, false);
    std::cout << "no error\n";
  } catch (const c10::Error& e) {
    std::cout << "error " << e.what_without_backtrace() << "\n";
  }
  return 0;
}
