// Host check of the c2 pair weight: e = fp32(exp(-|d|)) computed as libdevice's __nv_exp fast
// path (the operations and constants of exp_libdevice_small in jit_kernel/v41_fast.cuh, i.e. what
// both kernel designs compute on the GPU, replayed here with std::fma) against glibc's exp, for
// every fp32 |d| < 104 taken with stride argv[1] (default 1: all 1.12e9 patterns, about a minute).
// Prints the count of differing floats; exits 1 if any (tests/test_v41_kernel_build.py, strided).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "libdevice_exp_host.h"

int main(int argc, char** argv) {
  const uint32_t stride = argc > 1 ? static_cast<uint32_t>(std::strtoul(argv[1], nullptr, 10)) : 1u;
  long long checked = 0, differ = 0;
  for (uint32_t b = 0; b < 0x42D00000u; b += stride) {  // |d| in [0, 104)
    float a;
    std::memcpy(&a, &b, 4);
    const double x = -static_cast<double>(a);
    const float got = static_cast<float>(exp_libdevice_small(x)), want = static_cast<float>(std::exp(x));
    ++checked;
    if (std::memcmp(&got, &want, 4) != 0 && ++differ <= 4) std::printf("differs: |d| = %a\n", a);
  }
  std::printf("checked %lld differ %lld\n", checked, differ);
  return differ != 0;
}
