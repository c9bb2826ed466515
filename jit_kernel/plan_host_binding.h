// flashcompress: tvm-ffi binding of the `plan_host` JIT family, the native host planner (host
// code only: compiled by the host compiler with -DFC_HOST_ONLY=1, linked against tvm-ffi alone;
// included only by the TU rendered from templates/plan_host_binding.cpp.j2).
//
// PlanHostBinding<kRatio, kOnline>::prefill_stage0 builds the stage-0 rows of a prefill plan
// from host lengths (plan_host.h) straight into caller-allocated host tensors (pinned ones when
// the plan goes to a GPU), returns how many rows each list got and, with `pad`, fills the rest
// of both lists with sentinel rows. Python: cuda_ops/plan_host.py.
//
// Export (one per variant; N = rows of both lists = num_q_tokens, B = batch):
//   regular (kOnline = false, ratio 4 or 128):
//     prefill_stage0(plan_c u8[N,16], plan_w u8[N,8], seq_lens i64[B], extend_lens i64[B],
//                    swa_page_size, ring_size, use_req_ring, pad) -> (num_c, num_w)
//   online (kOnline = true, ratio 128):
//     prefill_stage0(plan_c u8[N,16], plan_w u8[N,16], seq_lens i64[B], extend_lens i64[B],
//                    pad) -> (num_c, num_w)
//   prefill_stage1, in place on the rows above (stage 1 for host outputs: the bytes of
//   torch_backend.plans.prefill_stage1 / online_prefill_stage1):
//     regular: prefill_stage1(plan_c u8[C,16], plan_w u8[W,8], req_pool_indices i64[B],
//                             req_to_token i32[S,L], full_to_state i64[F], swa_page_size,
//                             ring_size, use_req_ring)
//     online:  prefill_stage1(plan_c u8[C,16], plan_w u8[W,16], req_pool_indices i64[B],
//                             state_slot_offset)
//   prefill_plan: prefill_stage0's arguments, then stage 1's tables, in one call (stage 1 runs on
//   the rows stage 0 wrote); returns (num_c, num_w):
//     regular: prefill_plan(plan_c, plan_w, seq_lens, extend_lens, req_pool_indices, req_to_token,
//                           full_to_state, swa_page_size, ring_size, use_req_ring, pad)
//     online:  prefill_plan(plan_c, plan_w, seq_lens, extend_lens, req_pool_indices,
//                           state_slot_offset, pad)
//   Every lookup is bounds-checked (batch index < B; paged: slot < S, position < L, full loc
//   < F): a stage-0 row or table that breaks one is a ValueError naming the row, and rows
//   before it are already resolved (the API checks the tables first, so this never fires
//   through it).
//   check_state_locations (every variant; the API's paged-C4 value check, natively):
//     check_state_locations(req_pool_indices i64[B], req_to_token i32[S,L], full_to_state i64[F],
//                           seq_lens i64[B], extend_lens i64[B], swa_page_size, ring_size)
//   raises validation.check_state_locations's ValueError (same message) or returns nothing.
//   check_prefill_values (every variant; the API's value checks of an all-CPU prefill, in the
//   API's order and with its messages: 0 < extend <= seq and the token total, seq <= columns
//   of req_to_token, distinct request slots, then the state locations when `paged`):
//     check_prefill_values(req_pool_indices i64[B], req_to_token i32[S,L], full_to_state i64[F],
//                          seq_lens i64[B], extend_lens i64[B], num_q_tokens, exact_total,
//                          paged, swa_page_size, ring_size)
//
// Every tensor is contiguous host memory (cpu, or cuda_host / rocm_host); plan rows are
// row-aligned. Before anything is written the binding checks the tensors (TypeError for a
// wrong dtype, ValueError otherwise, naming the argument) and the lengths, with the messages of
// python/flashcompress/validation.py: 0 < extend_lens[b] <= seq_lens[b], sum(extend_lens) <= N
// (the API asks for equality with host lengths; more rows are a padded bucket), N <= 65536
// (ragged ids are u16); ring_size in [1, INT32_MAX], swa_page_size too when paged.
#pragma once

#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <sstream>
#include <utility>
#include <vector>

#include "ffi_check.h"
#include "plan.cuh"
#include "plan_host.h"

namespace flashcompress {
namespace plan_host {

namespace chk = ::flashcompress::ffi_check;
using tvm::ffi::TensorView;

inline constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

inline void check_host(const TensorView& t, const char* name) {
  const auto type = t.device().device_type;
  TVM_FFI_CHECK(type == kDLCPU || type == kDLCUDAHost || type == kDLROCMHost, ValueError)
      << name << ": expected a tensor in host memory (cpu or pinned), got one on "
      << chk::device_name(t.device());
  chk::check_contiguous(t, name);
}

// uint8 [N, row_bytes] in host memory, row-aligned.
inline void check_rows(const TensorView& t, const char* name, int64_t rows, int64_t row_bytes) {
  chk::check_dtype(t, name, chk::kUInt8);
  chk::check_shape(t, name, {rows, row_bytes});
  check_host(t, name);
  chk::check_aligned(t, name, static_cast<uint64_t>(row_bytes));
}

// Checks the tensors and the lengths (nothing is written yet); returns the lengths view.
inline Lengths check_inputs(const TensorView& plan_c, const TensorView& plan_w,
                            int64_t write_row_bytes, const TensorView& seq_lens,
                            const TensorView& extend_lens) {
  const int64_t num_tokens = plan_c.ndim() == 2 ? plan_c.size(0) : chk::kAnySize;
  check_rows(plan_c, "plan_c", num_tokens, kCompressPlanBytes);
  check_rows(plan_w, "plan_w", num_tokens, write_row_bytes);
  chk::check_dtype(seq_lens, "seq_lens", chk::kInt64);
  chk::check_ndim(seq_lens, "seq_lens", 1);
  check_host(seq_lens, "seq_lens");
  const int64_t batch = seq_lens.size(0);
  chk::check_dtype(extend_lens, "extend_lens", chk::kInt64);
  chk::check_shape(extend_lens, "extend_lens", {batch});
  check_host(extend_lens, "extend_lens");
  TVM_FFI_CHECK(num_tokens <= kMaxRaggedId, ValueError)
      << "num_q_tokens: expected <= " << kMaxRaggedId << " (ragged ids are u16), got "
      << num_tokens;
  const Lengths len{static_cast<const int64_t*>(seq_lens.data_ptr()),
                    static_cast<const int64_t*>(extend_lens.data_ptr()), batch};
  const LengthsCheck lc = check_lengths(len);
  const int64_t b = lc.bad_request;
  TVM_FFI_CHECK(b < 0, ValueError)
      << "extend_lens: expected 0 < extend_lens[i] <= seq_lens[i] for every request, got "
      << "extend_lens[" << b << "] = " << (b < 0 ? 0 : len.extend_lens[b]) << ", seq_lens[" << b
      << "] = " << (b < 0 ? 0 : len.seq_lens[b]);
  TVM_FFI_CHECK(lc.total_tokens <= num_tokens, ValueError)
      << "num_q_tokens: expected >= sum(extend_lens) = " << lc.total_tokens
      << " (padded token count), got " << num_tokens;
  return len;
}

template <typename CompressRow, typename WriteRow>
tvm::ffi::Shape finish(const TensorView& plan_c, const TensorView& plan_w, Counts counts,
                       bool pad, const WriteRow& write_sentinel) {
  if (pad) {
    const int64_t rows = plan_c.size(0);
    fill_rows(static_cast<CompressRow*>(plan_c.data_ptr()), counts.compress_rows, rows,
              invalid_compress_plan());
    fill_rows(static_cast<WriteRow*>(plan_w.data_ptr()), counts.write_rows, rows, write_sentinel);
  }
  return tvm::ffi::Shape({counts.compress_rows, counts.write_rows});
}

// [rows, row_bytes] uint8 rows in host memory, any row count; returns the row count.
inline int64_t check_any_rows(const TensorView& t, const char* name, int64_t row_bytes) {
  check_rows(t, name, chk::kAnySize, row_bytes);
  return t.size(0);
}

inline void check_host_tensor(const TensorView& t, const char* name, DLDataType dtype,
                              int32_t ndim) {
  chk::check_dtype(t, name, dtype);
  chk::check_ndim(t, name, ndim);
  check_host(t, name);
}

inline void raise_fault(const Fault& f) {
  if (f.kind == Fault::kNone) return;
  static constexpr const char* kWhat[] = {"", "a batch index in [0, B) (stage-0 row)",
                                          "a request slot in [0, rows of req_to_token)",
                                          "a position in [0, columns of req_to_token)",
                                          "a full loc in [0, length of full_to_state)"};
  TVM_FFI_THROW(ValueError) << "plan row " << f.row << ": expected " << kWhat[f.kind] << ", got "
                            << f.value;
}

// The tables of a regular stage 1 / value check, checked (host memory, dtypes, ranks).
inline World check_world(const TensorView& req_pool_indices, const TensorView& req_to_token,
                         const TensorView& full_to_state, int64_t swa_page_size,
                         int64_t ring_size, bool req_ring) {
  check_host_tensor(req_pool_indices, "req_pool_indices", chk::kInt64, 1);
  check_host_tensor(req_to_token, "req_to_token", chk::kInt32, 2);
  check_host_tensor(full_to_state, "full_to_state", chk::kInt64, 1);
  chk::check_range(ring_size, "ring_size", 1, kInt32Max);
  if (!req_ring) chk::check_range(swa_page_size, "swa_page_size", 1, kInt32Max);
  return World{static_cast<const int64_t*>(req_pool_indices.data_ptr()),
               req_pool_indices.size(0),
               static_cast<const int32_t*>(req_to_token.data_ptr()),
               req_to_token.size(0),
               req_to_token.size(1),
               static_cast<const int64_t*>(full_to_state.data_ptr()),
               full_to_state.size(0),
               Divisor(req_ring ? 1 : swa_page_size),
               Divisor(ring_size),
               req_ring};
}

// The lengths of a value check: int64 [B] host tensors.
inline Lengths check_lengths_view(const TensorView& seq_lens, const TensorView& extend_lens,
                                  int64_t batch) {
  check_host_tensor(seq_lens, "seq_lens", chk::kInt64, 1);
  chk::check_shape(seq_lens, "seq_lens", {batch});
  check_host_tensor(extend_lens, "extend_lens", chk::kInt64, 1);
  chk::check_shape(extend_lens, "extend_lens", {batch});
  return Lengths{static_cast<const int64_t*>(seq_lens.data_ptr()),
                 static_cast<const int64_t*>(extend_lens.data_ptr()), batch};
}

// validation.check_state_locations for a paged C4 prefill (plan_host.h), raising its ValueError
// with the same message (no "Check failed" prefix).
inline void raise_bad_state_locations(const World& world, const Lengths& len) {
  for (int64_t b = 0; b < len.batch; ++b) {  // memory safety (the API checked both already)
    const int64_t rid = world.rids[b];
    if (rid < 0 || rid >= world.slots) {
      TVM_FFI_THROW(ValueError) << "req_pool_indices: expected values in [0, " << world.slots
                                << ") (rows of req_to_token), got " << rid << " at row " << b;
    }
    const int64_t seq = len.seq_lens[b], ext = len.extend_lens[b];
    if (seq > world.max_ctx || ext > seq) {
      TVM_FFI_THROW(ValueError) << "seq_lens: expected extend_lens[i] <= seq_lens[i] <= "
                                << world.max_ctx << " (columns of req_to_token), got seq_lens["
                                << b << "] = " << seq << ", extend_lens[" << b << "] = " << ext;
    }
  }
  const LocationCheck c = plan_host::check_state_locations(world, len);
  if (c.lo < 0 || c.hi >= world.full_len) {
    TVM_FFI_THROW(ValueError) << "req_to_token: expected full locs in [0, " << world.full_len
                              << ") (length of full_to_state) at the positions the plan reads, "
                                 "got range ["
                              << c.lo << ", " << c.hi << "]";
  }
  if (c.bad_b < 0) return;
  const int64_t slot = world.rids[c.bad_b];
  if (c.bad_swa < 0) {
    TVM_FFI_THROW(ValueError) << "full_to_state: expected an SWA loc >= 0 (-1 marks an evicted "
                                 "token) at every position the plan reads or writes, got "
                                 "full_to_state["
                              << c.bad_full << "] = " << c.bad_swa << " (request slot " << slot
                              << ", position " << c.bad_p << ")";
  }
  TVM_FFI_THROW(ValueError) << "full_to_state: expected an SWA loc whose state row fits an int32 "
                               "(row "
                            << c.bad_row << ") at every position the plan reads or writes, got "
                            << "full_to_state[" << c.bad_full << "] = " << c.bad_swa
                            << " (request slot " << slot << ", position " << c.bad_p << ")";
}

inline void check_state_locations_binding(TensorView req_pool_indices, TensorView req_to_token,
                                          TensorView full_to_state, TensorView seq_lens,
                                          TensorView extend_lens, int64_t swa_page_size,
                                          int64_t ring_size) {
  const World world = check_world(req_pool_indices, req_to_token, full_to_state, swa_page_size,
                                  ring_size, false);
  raise_bad_state_locations(world, check_lengths_view(seq_lens, extend_lens, world.batch));
}

// validation.check_distinct_requests: the first row (in batch order) whose slot appears twice,
// CUDA-graph padding rows (seq_len 1) excepted, raises with every row of that slot.
inline void raise_repeated_slots(const World& world, const Lengths& len) {
  if (len.batch < 2) return;
  std::vector<std::pair<int64_t, int64_t>> order(len.batch);  // (slot, row), sorted
  for (int64_t b = 0; b < len.batch; ++b) order[b] = {world.rids[b], b};
  std::sort(order.begin(), order.end());
  int64_t first = -1;
  for (size_t i = 0; i < order.size(); ++i) {
    const bool repeated = (i > 0 && order[i - 1].first == order[i].first) ||
                          (i + 1 < order.size() && order[i + 1].first == order[i].first);
    const int64_t b = order[i].second;
    if (repeated && len.seq_lens[b] != 1 && (first < 0 || b < first)) first = b;
  }
  if (first < 0) return;
  const int64_t slot = world.rids[first];
  std::ostringstream rows;
  int64_t shown = 0, count = 0;
  for (const auto& [s, b] : order) {
    if (s != slot) continue;
    ++count;
    if (shown < 4) rows << (shown++ ? ", " : "") << b;
  }
  TVM_FFI_THROW(ValueError) << "req_pool_indices: expected distinct request slots in one batch "
                               "(only CUDA-graph padding rows, seq_len 1, may share a slot), got "
                               "slot "
                            << slot << " at rows [" << rows.str() << "]"
                            << (count > 4 ? " ..." : "");
}

inline void check_prefill_values_binding(TensorView req_pool_indices, TensorView req_to_token,
                                         TensorView full_to_state, TensorView seq_lens,
                                         TensorView extend_lens, int64_t num_q_tokens,
                                         bool exact_total, bool paged, int64_t swa_page_size,
                                         int64_t ring_size) {
  const World world = check_world(req_pool_indices, req_to_token, full_to_state, swa_page_size,
                                  ring_size, !paged);
  const Lengths len = check_lengths_view(seq_lens, extend_lens, world.batch);
  if (len.batch == 0) return;
  // validation.check_prefill_lengths (value part)
  int64_t total = 0, longest = std::numeric_limits<int64_t>::min();
  for (int64_t b = 0; b < len.batch; ++b) {
    const int64_t e = len.extend_lens[b], s = len.seq_lens[b];
    if (e <= 0 || e > s) {
      TVM_FFI_THROW(ValueError) << "extend_lens: expected 0 < extend_lens[i] <= seq_lens[i] for "
                                   "every request, got extend_lens["
                                << b << "] = " << e << ", seq_lens[" << b << "] = " << s;
    }
    total += e;
    longest = std::max(longest, s);
  }
  if (exact_total && total != num_q_tokens) {
    TVM_FFI_THROW(ValueError) << "num_q_tokens: expected sum(extend_lens) = " << total << ", got "
                              << num_q_tokens;
  }
  if (!exact_total && total > num_q_tokens) {
    TVM_FFI_THROW(ValueError) << "num_q_tokens: expected >= sum(extend_lens) = " << total
                              << " (padded token count), got " << num_q_tokens;
  }
  // validation.check_positions_in_table
  if (longest > world.max_ctx) {
    TVM_FFI_THROW(ValueError) << "seq_lens: expected values <= " << world.max_ctx
                              << " (columns of req_to_token), got max " << longest;
  }
  raise_repeated_slots(world, len);
  if (paged) raise_bad_state_locations(world, len);
}

template <int kRatio, bool kOnline>
struct PlanHostBinding;

template <int kRatio>
struct PlanHostBinding<kRatio, false> {
  static tvm::ffi::Shape prefill_stage0(TensorView plan_c, TensorView plan_w, TensorView seq_lens,
                                        TensorView extend_lens, int64_t swa_page_size,
                                        int64_t ring_size, bool use_req_ring, bool pad) {
    const Lengths len = check_inputs(plan_c, plan_w, kWritePlanBytes, seq_lens, extend_lens);
    const bool paged = kRatio == 4 && !use_req_ring;
    chk::check_range(ring_size, "ring_size", 1, kInt32Max);
    if (paged) chk::check_range(swa_page_size, "swa_page_size", 1, kInt32Max);
    const Counts counts = regular_stage0<kRatio>(
        len, Addressing{swa_page_size, ring_size, paged},
        static_cast<CompressPlan*>(plan_c.data_ptr()), static_cast<WritePlan*>(plan_w.data_ptr()));
    return finish<CompressPlan, WritePlan>(plan_c, plan_w, counts, pad, invalid_write_plan());
  }

  static void prefill_stage1(TensorView plan_c, TensorView plan_w, TensorView req_pool_indices,
                             TensorView req_to_token, TensorView full_to_state,
                             int64_t swa_page_size, int64_t ring_size, bool use_req_ring) {
    const int64_t rows_c = check_any_rows(plan_c, "plan_c", kCompressPlanBytes);
    const int64_t rows_w = check_any_rows(plan_w, "plan_w", kWritePlanBytes);
    const World world = check_world(req_pool_indices, req_to_token, full_to_state, swa_page_size,
                                    ring_size, kRatio != 4 || use_req_ring);
    raise_fault(regular_stage1<kRatio>(world, static_cast<CompressPlan*>(plan_c.data_ptr()), rows_c,
                                       static_cast<WritePlan*>(plan_w.data_ptr()), rows_w));
  }

  // Stage 0 then stage 1 on the rows it wrote, in one call (an all-CPU plan).
  static tvm::ffi::Shape prefill_plan(TensorView plan_c, TensorView plan_w, TensorView seq_lens,
                                      TensorView extend_lens, TensorView req_pool_indices,
                                      TensorView req_to_token, TensorView full_to_state,
                                      int64_t swa_page_size, int64_t ring_size, bool use_req_ring,
                                      bool pad) {
    const World world = check_world(req_pool_indices, req_to_token, full_to_state, swa_page_size,
                                    ring_size, kRatio != 4 || use_req_ring);
    const tvm::ffi::Shape counts = prefill_stage0(plan_c, plan_w, seq_lens, extend_lens,
                                                  swa_page_size, ring_size, use_req_ring, pad);
    raise_fault(regular_stage1<kRatio>(world, static_cast<CompressPlan*>(plan_c.data_ptr()),
                                       counts[0], static_cast<WritePlan*>(plan_w.data_ptr()),
                                       counts[1]));
    return counts;
  }
};

template <>
struct PlanHostBinding<128, true> {
  static tvm::ffi::Shape prefill_stage0(TensorView plan_c, TensorView plan_w, TensorView seq_lens,
                                        TensorView extend_lens, bool pad) {
    const Lengths len = check_inputs(plan_c, plan_w, kCompressPlanBytes, seq_lens, extend_lens);
    const Counts counts = online_stage0(len, static_cast<CompressPlan*>(plan_c.data_ptr()),
                                        static_cast<CompressPlan*>(plan_w.data_ptr()));
    return finish<CompressPlan, CompressPlan>(plan_c, plan_w, counts, pad,
                                              invalid_compress_plan());
  }

  static void prefill_stage1(TensorView plan_c, TensorView plan_w, TensorView req_pool_indices,
                             int64_t state_slot_offset) {
    const int64_t rows_c = check_any_rows(plan_c, "plan_c", kCompressPlanBytes);
    const int64_t rows_w = check_any_rows(plan_w, "plan_w", kCompressPlanBytes);
    check_host_tensor(req_pool_indices, "req_pool_indices", chk::kInt64, 1);
    const auto* rids = static_cast<const int64_t*>(req_pool_indices.data_ptr());
    const int64_t batch = req_pool_indices.size(0);
    raise_fault(online_stage1(rids, batch, state_slot_offset,
                              static_cast<CompressPlan*>(plan_c.data_ptr()), rows_c));
    Fault f = online_stage1(rids, batch, state_slot_offset,
                            static_cast<CompressPlan*>(plan_w.data_ptr()), rows_w);
    if (f.kind != Fault::kNone) f.row += rows_c;
    raise_fault(f);
  }

  // Stage 0 then stage 1 on the rows it wrote, in one call (an all-CPU plan).
  static tvm::ffi::Shape prefill_plan(TensorView plan_c, TensorView plan_w, TensorView seq_lens,
                                      TensorView extend_lens, TensorView req_pool_indices,
                                      int64_t state_slot_offset, bool pad) {
    check_host_tensor(req_pool_indices, "req_pool_indices", chk::kInt64, 1);
    const tvm::ffi::Shape counts = prefill_stage0(plan_c, plan_w, seq_lens, extend_lens, pad);
    const auto* rids = static_cast<const int64_t*>(req_pool_indices.data_ptr());
    const int64_t batch = req_pool_indices.size(0);
    raise_fault(online_stage1(rids, batch, state_slot_offset,
                              static_cast<CompressPlan*>(plan_c.data_ptr()), counts[0]));
    Fault f = online_stage1(rids, batch, state_slot_offset,
                            static_cast<CompressPlan*>(plan_w.data_ptr()), counts[1]);
    if (f.kind != Fault::kNone) f.row += counts[0];
    raise_fault(f);
    return counts;
  }
};

}  // namespace plan_host
}  // namespace flashcompress
