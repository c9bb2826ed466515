// flashcompress: compress family, the prefill kernels.
//
//   prefill_kernel<Pass::kPrefill>  pass 1: one team per CompressPlan row pools the row (entries
//                                   e < buffer_len from the state, the rest from the input, q =
//                                   ragged_id); invalid rows write zeros (kNone) or nothing
//   write_kernel                    pass 2 (regular): one warp per WritePlan row copies the input
//                                   row into the state
//   prefill_kernel<kOnlineWrite>    pass 2 (online): one team per segment stores its state
// Pass 2 is a programmatic dependent of pass 1 on sm_90: it loads first and waits before its
// first store, because ring rows alias and every read of pass 1 must precede a write of pass 2.
#pragma once

#include <cstdint>

#include "compress_epilogue.cuh"
#include "compress_pool.cuh"
#include "ptx.cuh"

namespace flashcompress {
namespace compress {

// Prefill pass 1 (and the online write list, Pass::kOnlineWrite): one team per plan row.
template <class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks) prefill_kernel(const CompressArgs a) {
  __shared__ Smem<C> sm;
  int rank, team, u;
  int64_t group;
  block_coords<C>(rank, group, team, u);
  if constexpr (C::kCluster) cluster_entry<C>(sm);
  constexpr bool kWriteList = C::kPass == Pass::kOnlineWrite;
  // Pass 1 is a programmatic dependent of the previous kernel; it lets pass 2 launch at its end
  // only (pass 2 reads its input before its own wait).
  if constexpr (!kWriteList) {
    pdl_warm_params(warm_fold(a));
    pdl_wait();
  }
  const int64_t k = group * C::kTeams + team;
  const int64_t rows = kWriteList ? a.rows_w : a.rows;
  if (k >= rows) return;  // uniform across the team and the cluster
  const CompressPlan p = reinterpret_cast<const CompressPlan*>(kWriteList ? a.plan_w : a.plan)[k];
  const bool valid = p.seq_len != kInvalidU32;
  if (!valid) {
    if constexpr (!C::kStoreRows && !kWriteList) zero_out_row<C>(a, k, u, rank);
    return;
  }
  RowTarget t{};
  t.emit = true;
  t.out_row = k;
  t.position = static_cast<int64_t>(p.seq_len) - C::kRatio;
  t.loc = C::kStoreRows ? a.out_loc[p.ragged_id] : 0;
  t.merge_slot = -1;
  t.state_slot = -1;
  Window w{};
  w.self_row = -1;
  if constexpr (C::kOnline) {
    const int end = static_cast<int>((p.seq_len - 1u) % 128u) + 1;
    const int off = end - static_cast<int>(p.buffer_len);
    w.q_first = static_cast<int64_t>(p.ragged_id) - end + 1;
    w.lo = off;
    w.hi = end;
    w.buf_len = 0;
    const int64_t slot = p.read_page_1 >= 0 ? p.read_page_1 : p.read_page_0;
    t.merge_slot = (off != 0 && slot >= 0) ? slot : -1;
    t.state_slot = kWriteList ? p.read_page_0 : -1;
  } else {
    w.q_first = static_cast<int64_t>(p.ragged_id) - (C::W - 1);
    w.lo = (C::kRatio == 4 && p.seq_len <= 4) ? 4 : 0;
    w.hi = C::W;
    w.buf_len = p.buffer_len;
    w.page0 = p.read_page_0;
    w.page1 = p.read_page_1;
  }
  if constexpr (kWriteList) {
    // Everything above only reads; the state store must wait for pass 1.
    pdl_wait();
  }
  if constexpr (C::kStageOps) {  // the store's operands fly while the row is pooled
    stage_invariants<C>(a, sm, team, u);
    stage_row_rope<C>(a, sm, team, u, t.position);
    async_commit();
  }
  pool_row<C>(w, t, a, sm, team, u, rank);
  async_wait<0>();
  bool entry_pending = C::kCluster;
  store_pooled_row<C>(t, a, sm, team, u, rank, 0, entry_pending);
  if constexpr (!kWriteList) pdl_launch_dependents();
}

// Prefill pass 2 (regular): one warp per WritePlan row copies the input row into the state.
template <class C>
__global__ void __launch_bounds__(256) write_kernel(const CompressArgs a) {
  using TIn = typename C::TIn;
  using TState = typename C::TState;
  constexpr int kVecsPerRow = C::kInWidth / 4;
  constexpr int kPerLane = kVecsPerRow / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t k = static_cast<int64_t>(blockIdx.x) * 8 + threadIdx.x / 32;
  if (k >= a.rows_w) {
    return;
  }
  const WritePlan p = reinterpret_cast<const WritePlan*>(a.plan_w)[k];
  const bool valid = p.ragged_id != kInvalidU32;
  Vec<TIn, 4> x[kPerLane];
  const TIn* src = static_cast<const TIn*>(a.input) + static_cast<int64_t>(p.ragged_id) * C::kInWidth;
  if (valid) {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) x[j] = load_vec<TIn, 4>(src + 4 * (lane + 32 * j));
  }
  pdl_wait();  // every read of pass 1 precedes these stores
  if (!valid) return;
  TState* dst = static_cast<TState*>(a.state) + static_cast<int64_t>(p.write_loc) * C::kStateWidth;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) store_state_vec<C>(dst + 4 * (lane + 32 * j), x[j]);
}

}  // namespace compress
}  // namespace flashcompress
