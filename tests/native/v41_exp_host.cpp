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

static double exp_libdevice_small(double x) {
  const double t = std::fma(x, 0x1.71547652b82fep+0, 0x1.8p+52);
  uint64_t tb;
  std::memcpy(&tb, &t, 8);
  const int32_t n = static_cast<int32_t>(static_cast<uint32_t>(tb));
  const volatile double tv = t;  // t - 1.5 2^52 as its own rounding step
  const double k = tv + -0x1.8p+52;
  double r = std::fma(k, -0x1.62e42fefa39efp-1, x);
  r = std::fma(k, -0x1.abc9e3b39803fp-56, r);
  double p = std::fma(0x1.ade1569ce2bdfp-26, r, 0x1.28af3fca213eap-22);
  p = std::fma(p, r, 0x1.71dee62401315p-19);
  p = std::fma(p, r, 0x1.a01997c89eb71p-16);
  p = std::fma(p, r, 0x1.a01a014761f65p-13);
  p = std::fma(p, r, 0x1.6c16c1852b7afp-10);
  p = std::fma(p, r, 0x1.1111111122322p-7);
  p = std::fma(p, r, 0x1.55555555502a1p-5);
  p = std::fma(p, r, 0x1.5555555555511p-3);
  p = std::fma(p, r, 0x1.000000000000bp-1);
  p = std::fma(p, r, 1.0);
  p = std::fma(p, r, 1.0);
  uint64_t pb;
  std::memcpy(&pb, &p, 8);
  const uint32_t hi = static_cast<uint32_t>(pb >> 32) + (static_cast<uint32_t>(n) << 20);
  pb = (static_cast<uint64_t>(hi) << 32) | static_cast<uint32_t>(pb);
  double z;
  std::memcpy(&z, &pb, 8);
  return z;
}

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
