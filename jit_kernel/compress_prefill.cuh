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
// Pass 1 lets pass 2 launch once its block has pooled (every window load is done; the store
// epilogue follows), so pass 2's launch and loads overlap pass 1's last blocks. Every pass-2
// block waits, even one with nothing to do, so pass 2 completes only after pass 1: a kernel
// after pass 2 may rely on pass 1's stores as on pass 2's.
//
// C128 (Cfg::kNarrow): 8 blocks of 512 threads per row, 64 channels each; thread
// (split s, vector v) loads entries 8s..8s+7 of channels 2v, 2v+1 (kv, score, bias: 24 8-byte
// loads) in one burst, then the 16 splits' partials meet in shared memory (pool_row).
// Online C128 (Cfg::kSpread: pass 1 of compress_forward and the write list): 16 blocks of 128
// threads per segment, 32 channels each; thread (s, v) loads entries 8s..8s+7 of channels
// 4v..4v+3 (24 16-byte loads) in one burst and folds them 2 at a time. A stored pass 1 (a
// cluster of 4 blocks of 512 threads, 128 channels each) folds the same entries in the same
// order, loading 2 at a time: both write the same rows.
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
  // Pass 1 is a programmatic dependent of the previous kernel; pass 2 (the write list) reads its
  // input before its own wait (in pool_row, before the state store).
  static_assert(!kWriteList || C::kSplit > 1, "the write list waits in pool_row's combine");
  if constexpr (!kWriteList) {
    pdl_warm_params(warm_fold(a));
    pdl_wait();
  }
  const int64_t k = group * C::kTeams + team;
  const int64_t rows = kWriteList ? a.rows_w : a.rows;
  if (k >= rows) {  // uniform across the team and the cluster
    if constexpr (kWriteList) pdl_wait();
    return;
  }
  const CompressPlan p = reinterpret_cast<const CompressPlan*>(kWriteList ? a.plan_w : a.plan)[k];
  const bool valid = p.seq_len != kInvalidU32;
  if (!valid) {
    if constexpr (kWriteList) pdl_wait();
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
  if constexpr (C::kStageOps) {  // the store's operands fly while the row is pooled
    stage_invariants<C>(a, sm, team, u);
    stage_row_rope<C>(a, sm, team, u, t.position);
    async_commit();
  }
  pool_row<C>(w, t, a, sm, team, u, rank);
  if constexpr (!kWriteList) pdl_launch_dependents();  // this block's window reads are done
  async_wait<0>();
  bool entry_pending = C::kCluster;
  store_pooled_row<C>(t, a, sm, team, u, rank, 0, entry_pending);
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
    pdl_wait();  // pass 2 completes after pass 1 (file header)
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
