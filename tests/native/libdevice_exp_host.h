// exp_libdevice_small of jit_kernel/v41_fast.cuh replayed on the host: libdevice's __nv_exp fast
// path (its operations and constants, each fma as std::fma), without the range branch. Included by
// the host checks v41_exp_host.cpp and v41_fast3_host.cpp (compile them with -ffp-contract=off).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

inline double exp_libdevice_small(double x) {
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
