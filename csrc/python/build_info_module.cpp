// virtual_noise._C: Python-only helpers. The operators themselves live in the
// operators library, which has no Python in it; this module only reports how
// that library was built and what it runs on this machine.
#include <pybind11/pybind11.h>

#include "build_info.h"

#ifndef VN_TORCH_VERSION
#error "VN_TORCH_VERSION must be set by the build"
#endif

PYBIND11_MODULE(_C, m) {
  m.doc() = "Build information of the virtual_noise operators library.";
  m.def("build_info", [] {
    pybind11::dict info;
    info["torch_version"] = VN_TORCH_VERSION;
#ifdef _OPENMP
    info["openmp"] = true;
#else
    info["openmp"] = false;
#endif
    info["simd"] = virtual_noise::simd_level();
    info["compiler"] = __VERSION__;
    return info;
  }, "Torch version built against, OpenMP, the SIMD build of the CPU loops in use, compiler.");
}
