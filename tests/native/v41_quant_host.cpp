// Host check of jit_kernel/v41_quant.cuh: prints e2m1_rne codes of the fp32 bit patterns read from
// stdin (one decimal uint32 per line), one code per line (tests/test_v41_kernel_build.py).
#include <cstdint>
#include <cstdio>

#include "v41_quant.cuh"

int main() {
  unsigned long long b;
  while (std::scanf("%llu", &b) == 1) {
    std::printf("%u\n", flashcompress::v41q::e2m1_rne(flashcompress::quant::bits_float(static_cast<uint32_t>(b))));
  }
  return 0;
}
