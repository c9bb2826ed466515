// Host check of jit_kernel/quant.cuh (test support): compiled by the plain host C++ compiler
// (no CUDA headers: the encoders must be self-contained), run by tests/test_store_kernel_host.py.
//
// Usage: store_quant_host <in.bin> <out.bin>
//   in.bin   n little-endian fp32 values (n % 4 == 0)
//   out.bin  n records of 12 bytes:
//            0-1  bf16_bits(x) (LE)      2  e4m3_code(x) (no clip)   3  pack_fp8(x)
//            4    byte i%4 of pack_fp8x4 over the value's group of 4
//            5    e2m1_threshold(x)      6  ue8m0_ceil(x) & 0xFF     7  0
//            8-11 clip448(x) bits (LE)
//   followed by 256 records of 4 bytes: inv_ue8m0(e) bits for e = 0..255 (1..253 are valid).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "quant.cuh"

namespace q = flashcompress::quant;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: store_quant_host <in.bin> <out.bin>\n");
    return 2;
  }
  std::FILE* in = std::fopen(argv[1], "rb");
  if (in == nullptr) return 2;
  std::vector<float> x;
  float v;
  while (std::fread(&v, sizeof(v), 1, in) == 1) x.push_back(v);
  std::fclose(in);
  if (x.size() % 4 != 0) return 2;
  std::vector<unsigned char> out(x.size() * 12 + 256 * 4, 0);
  for (size_t g = 0; g < x.size(); g += 4) {
    const uint32_t packed = q::pack_fp8x4(x[g], x[g + 1], x[g + 2], x[g + 3]);
    for (size_t i = 0; i < 4; ++i) {
      const float xi = x[g + i];
      unsigned char* o = &out[(g + i) * 12];
      const uint16_t b = q::bf16_bits(xi);
      o[0] = static_cast<unsigned char>(b & 0xFF);
      o[1] = static_cast<unsigned char>(b >> 8);
      o[2] = static_cast<unsigned char>(q::e4m3_code(xi));
      o[3] = static_cast<unsigned char>(q::pack_fp8(xi));
      o[4] = static_cast<unsigned char>(packed >> (8 * i));
      o[5] = static_cast<unsigned char>(q::e2m1_threshold(xi));
      o[6] = static_cast<unsigned char>(q::ue8m0_ceil(xi) & 0xFF);
      const uint32_t c = q::float_bits(q::clip448(xi));
      std::memcpy(o + 8, &c, 4);
    }
  }
  for (uint32_t e = 0; e < 256; ++e) {
    const uint32_t bits = q::float_bits(q::inv_ue8m0(e));
    std::memcpy(&out[x.size() * 12 + 4 * e], &bits, 4);
  }
  std::FILE* f = std::fopen(argv[2], "wb");
  if (f == nullptr) return 2;
  const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  std::fclose(f);
  return ok ? 0 : 1;
}
