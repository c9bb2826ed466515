// Host emulator of the plan-builder kernels (test support, runs on a machine without a GPU).
//
// Runs the exact per-row __host__ __device__ functions of jit_kernel/plan_builder.cuh in a CPU
// loop over the thread index (the kernels are thin wrappers around them). The single-block
// scan kernel is replaced by a serial exclusive scan of the same per-request counts. Used by
// tests/test_plan_kernel_build.py to compare the kernel logic with the PyTorch backend.
//
// Input on stdin, whitespace-separated integers after the op name:
//   <op> <ratio>                 op: decode | online_decode | stage1 | online_stage1 |
//                                    device | online_device
//   <swa_page_size> <ring_size> <use_req_ring> <state_slot_offset>
//   <R> <L> then R*L ints        req_to_token
//   <F> then F ints              full_to_state
//   <B> then B rids, B seq_lens, B extend_lens
//   <N>                          device ops: rows of each list
//   <rows_c> <num_c> then rows_c*16 bytes   stage-1 ops: compress list before stage 1
//   <rows_w> <num_w> then rows_w*wb bytes   (wb = 8, or 16 for online)
// Output on stdout: one line per row, "<list> <hex bytes>", list in {D, C, W}.
// Rows no code path writes keep the poison byte 0xAB.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "plan_builder.cuh"

namespace fc = flashcompress;
namespace fp = flashcompress::plan;

namespace {

constexpr unsigned char kPoison = 0xAB;

struct Input {
  std::string op;
  int ratio = 0;
  int64_t swa_page_size = 0, ring_size = 0, use_req_ring = 0, state_slot_offset = 0;
  int64_t R = 0, L = 0;
  std::vector<int32_t> req_to_token;
  std::vector<int64_t> full_to_state;
  std::vector<int64_t> rids, seq_lens, extend_lens;
  int64_t N = 0;
  int64_t rows_c = 0, num_c = 0, rows_w = 0, num_w = 0;
  std::vector<unsigned char> bytes_c, bytes_w;
};

template <typename T>
std::vector<T> read_vec(int64_t n) {
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& x : v) {
    long long t;
    std::cin >> t;
    x = static_cast<T>(t);
  }
  return v;
}

int64_t read_i64() {
  long long t;
  std::cin >> t;
  return t;
}

Input read_input() {
  Input in;
  std::cin >> in.op >> in.ratio;
  in.swa_page_size = read_i64();
  in.ring_size = read_i64();
  in.use_req_ring = read_i64();
  in.state_slot_offset = read_i64();
  in.R = read_i64();
  in.L = read_i64();
  in.req_to_token = read_vec<int32_t>(in.R * in.L);
  in.full_to_state = read_vec<int64_t>(read_i64());
  const int64_t B = read_i64();
  in.rids = read_vec<int64_t>(B);
  in.seq_lens = read_vec<int64_t>(B);
  in.extend_lens = read_vec<int64_t>(B);
  in.N = read_i64();
  const int64_t wb = (in.op == "online_stage1") ? 16 : 8;
  in.rows_c = read_i64();
  in.num_c = read_i64();
  in.bytes_c = read_vec<unsigned char>(in.rows_c * 16);
  in.rows_w = read_i64();
  in.num_w = read_i64();
  in.bytes_w = read_vec<unsigned char>(in.rows_w * wb);
  return in;
}

fc::StateAddressing addressing(Input& in) {
  fc::StateAddressing a{};
  a.req_to_token = in.req_to_token.data();
  a.req_to_token_stride = in.L;
  a.full_to_state = in.full_to_state.data();
  a.swa_page_size = in.swa_page_size;
  a.ring_size = in.ring_size;
  a.req_ring = in.ratio != 4 || in.use_req_ring != 0;  // as the binding computes it
  return a;
}

void print_rows(const char* tag, const unsigned char* data, int64_t rows, int64_t row_bytes) {
  static const char* digits = "0123456789abcdef";
  std::string line;
  for (int64_t r = 0; r < rows; ++r) {
    line.assign(tag);
    line += ' ';
    for (int64_t k = 0; k < row_bytes; ++k) {
      const unsigned char c = data[r * row_bytes + k];
      line += digits[c >> 4];
      line += digits[c & 15];
    }
    line += '\n';
    std::fputs(line.c_str(), stdout);
  }
}

// Serial stand-in for prefill_scan_kernel: exclusive scans followed by totals.
template <typename Counts>
void serial_scan(std::vector<int64_t>& ws, int64_t B, Counts counts) {
  int64_t tok = 0, comp = 0, wr = 0;
  for (int64_t b = 0; b < B; ++b) {
    const fp::RequestCounts n = counts(b);
    ws[b] = tok;
    ws[(B + 1) + b] = comp;
    ws[2 * (B + 1) + b] = wr;
    tok += n.tokens;
    comp += n.compress_rows;
    wr += n.write_rows;
  }
  ws[B] = tok;
  ws[(B + 1) + B] = comp;
  ws[2 * (B + 1) + B] = wr;
}

template <int kRatio>
int run(Input& in) {
  const int64_t B = static_cast<int64_t>(in.rids.size());
  if (in.op == "decode") {
    std::vector<fc::DecodePlan> out(static_cast<size_t>(B));
    std::memset(out.data(), kPoison, out.size() * sizeof(fc::DecodePlan));
    fc::DecodeArgs a{};
    a.out = out.data();
    a.req_pool_indices = in.rids.data();
    a.seq_lens = in.seq_lens.data();
    a.batch = B;
    a.addr = addressing(in);
    for (int64_t b = 0; b < B; ++b) fp::decode_row<kRatio>(a, b);
    print_rows("D", reinterpret_cast<unsigned char*>(out.data()), B, 16);
  } else if (in.op == "online_decode") {
    std::vector<fc::DecodePlan> out(static_cast<size_t>(B));
    std::memset(out.data(), kPoison, out.size() * sizeof(fc::DecodePlan));
    fc::OnlineDecodeArgs a{};
    a.out = out.data();
    a.req_pool_indices = in.rids.data();
    a.seq_lens = in.seq_lens.data();
    a.batch = B;
    a.addr.state_slot_offset = in.state_slot_offset;
    for (int64_t b = 0; b < B; ++b) fp::online_decode_row(a, b);
    print_rows("D", reinterpret_cast<unsigned char*>(out.data()), B, 16);
  } else if (in.op == "stage1") {
    std::vector<fc::CompressPlan> c(static_cast<size_t>(in.rows_c));
    std::vector<fc::WritePlan> w(static_cast<size_t>(in.rows_w));
    std::memcpy(c.data(), in.bytes_c.data(), in.bytes_c.size());
    std::memcpy(w.data(), in.bytes_w.data(), in.bytes_w.size());
    fc::PrefillStage1Args a{};
    a.plan_c = c.data();
    a.plan_w = w.data();
    a.rows_c = in.rows_c;
    a.num_c = in.num_c;
    a.rows_w = in.rows_w;
    a.num_w = in.num_w;
    a.req_pool_indices = in.rids.data();
    a.batch = B;
    a.addr = addressing(in);
    const int64_t rows = in.rows_c > in.rows_w ? in.rows_c : in.rows_w;
    for (int64_t i = 0; i < rows; ++i) fp::prefill_stage1_row<kRatio>(a, i);
    print_rows("C", reinterpret_cast<unsigned char*>(c.data()), in.rows_c, 16);
    print_rows("W", reinterpret_cast<unsigned char*>(w.data()), in.rows_w, 8);
  } else if (in.op == "online_stage1") {
    std::vector<fc::CompressPlan> c(static_cast<size_t>(in.rows_c));
    std::vector<fc::CompressPlan> w(static_cast<size_t>(in.rows_w));
    std::memcpy(c.data(), in.bytes_c.data(), in.bytes_c.size());
    std::memcpy(w.data(), in.bytes_w.data(), in.bytes_w.size());
    fc::OnlinePrefillStage1Args a{};
    a.plan_c = c.data();
    a.plan_w = w.data();
    a.rows_c = in.rows_c;
    a.num_c = in.num_c;
    a.rows_w = in.rows_w;
    a.num_w = in.num_w;
    a.req_pool_indices = in.rids.data();
    a.batch = B;
    a.addr.state_slot_offset = in.state_slot_offset;
    const int64_t rows = in.rows_c > in.rows_w ? in.rows_c : in.rows_w;
    for (int64_t i = 0; i < rows; ++i) fp::online_stage1_row(a, i);
    print_rows("C", reinterpret_cast<unsigned char*>(c.data()), in.rows_c, 16);
    print_rows("W", reinterpret_cast<unsigned char*>(w.data()), in.rows_w, 16);
  } else if (in.op == "device") {
    std::vector<fc::CompressPlan> c(static_cast<size_t>(in.N));
    std::vector<fc::WritePlan> w(static_cast<size_t>(in.N));
    std::memset(c.data(), kPoison, c.size() * sizeof(fc::CompressPlan));
    std::memset(w.data(), kPoison, w.size() * sizeof(fc::WritePlan));
    std::vector<int64_t> ws(static_cast<size_t>(fc::prefill_workspace_size(B)), -777);
    fc::PrefillDeviceArgs a{};
    a.plan_c = c.data();
    a.plan_w = w.data();
    a.num_rows = in.N;
    a.workspace = ws.data();
    a.req_pool_indices = in.rids.data();
    a.seq_lens = in.seq_lens.data();
    a.extend_lens = in.extend_lens.data();
    a.batch = B;
    a.addr = addressing(in);
    serial_scan(ws, B, [&](int64_t b) { return fp::request_counts<kRatio, false>(a, b); });
    for (int64_t i = 0; i < in.N; ++i) fp::prefill_device_row<kRatio>(a, i);
    print_rows("C", reinterpret_cast<unsigned char*>(c.data()), in.N, 16);
    print_rows("W", reinterpret_cast<unsigned char*>(w.data()), in.N, 8);
  } else if (in.op == "online_device") {
    std::vector<fc::CompressPlan> c(static_cast<size_t>(in.N));
    std::vector<fc::CompressPlan> w(static_cast<size_t>(in.N));
    std::memset(c.data(), kPoison, c.size() * sizeof(fc::CompressPlan));
    std::memset(w.data(), kPoison, w.size() * sizeof(fc::CompressPlan));
    std::vector<int64_t> ws(static_cast<size_t>(fc::prefill_workspace_size(B)), -777);
    fc::OnlinePrefillDeviceArgs a{};
    a.plan_c = c.data();
    a.plan_w = w.data();
    a.num_rows = in.N;
    a.workspace = ws.data();
    a.req_pool_indices = in.rids.data();
    a.seq_lens = in.seq_lens.data();
    a.extend_lens = in.extend_lens.data();
    a.batch = B;
    a.addr.state_slot_offset = in.state_slot_offset;
    serial_scan(ws, B, [&](int64_t b) { return fp::request_counts<kRatio, true>(a, b); });
    for (int64_t i = 0; i < in.N; ++i) fp::online_prefill_device_row<kRatio>(a, i);
    print_rows("C", reinterpret_cast<unsigned char*>(c.data()), in.N, 16);
    print_rows("W", reinterpret_cast<unsigned char*>(w.data()), in.N, 16);
  } else {
    std::fprintf(stderr, "unknown op %s\n", in.op.c_str());
    return 2;
  }
  return 0;
}

}  // namespace

int main() {
  std::ios::sync_with_stdio(false);
  Input in = read_input();
  if (!std::cin) {
    std::fprintf(stderr, "malformed input\n");
    return 2;
  }
  if (in.ratio == 4) return run<4>(in);
  if (in.ratio == 128) return run<128>(in);
  std::fprintf(stderr, "unsupported ratio %d\n", in.ratio);
  return 2;
}
