// Facts about this build of the operators library; no ATen, so the Python
// helper module can include it without torch's headers.
#pragma once

namespace virtual_noise {

// Which build of the CPU hot loops this machine runs: "avx512", "avx2" or "baseline".
const char* simd_level();

}  // namespace virtual_noise
