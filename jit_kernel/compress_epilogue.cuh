// flashcompress: compress family, the store epilogue: a pooled row (slice) in shared memory goes
// through store.cuh's RMSNorm + RoPE + quantised store.
//
// One block per row: the weight blocks and the row's RoPE row were staged by cp.async while the
// row was pooled (stage_invariants, stage_row_rope); head 512: warp j stores 128-dim block j
// (lane l holds dims 128j + 4l + i) after the 4 warps' sums of squares meet in shared memory;
// head 128: warp 0 stores the row. A cluster of kCSplit blocks (C128): warp 0 of every block
// stores its own slice; the blocks exchange only their slices' fp64 sums of squares, by st.async
// into every block's mbarrier-guarded slot (double-buffered by row parity).
#pragma once

#include <cstdint>

#include "compress_pool.cuh"
#include "ptx.cuh"
#include "store.cuh"

namespace flashcompress {
namespace compress {

// Entry of a cluster kernel: thread 0 sets up the block's partial-sum barriers, then every
// thread arrives at the entry phase (the storing warp waits on it before its first remote access).
template <class C>
__device__ __forceinline__ void cluster_entry(Smem<C>& sm) {
  if (threadIdx.x == 0) {
    mbar_init(&sm.sum_bar[0], 1);
    mbar_init(&sm.sum_bar[1], 1);
    mbar_init_fence();
  }
  cluster_arrive_relaxed();
}

// One warp's slice of a stored row (store_pooled_row): lane l takes dims dim0 / 128 * 128 + 4 l
// .. + 3 of the row in shared memory (a 64-dim slice: the lanes outside it hold zeros), its
// operands (`operands(block)`) and its part of the sum of squares, which `exchange(storing, part)`
// turns into the row's total (every thread of the block calls it; the one-block store's exchange
// is a block barrier, the cluster's involves the storing warps only), then stores the slice.
// `storing`: this thread's warp stores a slice.
template <class C, int kSlice, class Operands, class Exchange>
__device__ __forceinline__ void store_row_slice(const RowTarget& t, const CompressArgs& a, const float* row,
                                                bool storing, int lane, int dim0, Operands&& operands,
                                                Exchange&& exchange) {
  float y[4] = {0.f, 0.f, 0.f, 0.f};
  store::detail::BlockOperands ops{};
  double part = 0.0;
  if (storing) {
    const int j = dim0 / 128;
    if (store::slice_lane<kSlice>(dim0, lane)) {
#pragma unroll
      for (int i = 0; i < 4; ++i) y[i] = row[128 * j + 4 * lane + i];
    }
    ops = operands(j);
    part = store::slice_sum_squares(y);
  }
  const double ss = exchange(storing, part);
  if (storing) store::store_slice<C::H, C::kFmt, kSlice>(y, ops, lane, dim0, ss, t.loc, a.store);
}

// Store the pooled row (its operands staged by stage_invariants / stage_row_rope and waited
// for). One block per row (kCSplit 1), head 512 (kSlicedStore): warp j loads 128-dim block j in
// the canonical warp layout from shared memory, the 4 warps add their fp64 sums of squares in
// block order through shared memory, and each calls store::store_slice (store_row_slice); head
// 128: warp 0 of the team calls store::store_row_ops. A cluster (kCSplit blocks of kChans
// channels): warp 0 of every block stores its own slice (store_row_slice); the blocks only
// exchange their slices' fp64 sums of squares through distributed shared memory, behind one
// pair of mbarriers per block. `row_count`: the team's rows stored before this one.
// `entry_pending`: this thread has not yet waited on the cluster's entry phase.
template <class C>
__device__ __forceinline__ void store_pooled_row(const RowTarget& t, const CompressArgs& a, Smem<C>& sm,
                                                 int team, int u, int rank, int row_count, bool& entry_pending) {
  if constexpr (C::kStoreRows) {
    // The row (slice) is complete in shared memory (decode with splits: pool_row's last barrier).
    if constexpr (!(C::kDecode && C::kSplit > 1)) team_sync<C>();
    if constexpr (C::kCluster) {
      if (entry_pending && u < 32) {  // the storing warp, before its first remote access
        cluster_wait();               // every block has started and set up its barriers
        entry_pending = false;
      }
      // warp 0 of every block stores the block's slice; the partial sums meet in every block
      const int lane = u;
      store_row_slice<C, C::kChans>(
          t, a, &sm.row[team][0], u < 32, lane, rank * C::kChans,
          [&](int j) { return store::detail::block_operands<C::H>(a.store, j, lane, t.position); },
          [&](bool storing, double part) {
            // Only the storing warps take part: lane r stores the block's partial sum into
            // block r's slot ss[slot][rank], completing 8 bytes of block r's barrier
            // sum_bar[slot]; lane 0 arrives on its own, expecting every block's 8 bytes, and the
            // warp waits on it. The other warps go on to the team's next row (the storing warp
            // read its slice of the row buffer before). A slot is reused two rows later: a
            // block's storing warp sends there only after its wait on the next row, which needs
            // every block to have sent for the next row, i.e. to have finished reading this
            // row's slot.
            double ss = 0.0;
            if (storing) {
              const int slot = row_count & 1;
              if (lane == 0) mbar_arrive_expect(&sm.sum_bar[slot], C::kCSplit * sizeof(double));
              if (lane < C::kCSplit) remote_store_async(&sm.ss[slot][rank], &sm.sum_bar[slot], part, lane);
              mbar_wait(&sm.sum_bar[slot], (row_count >> 1) & 1);
#pragma unroll
              for (int r = 0; r < C::kCSplit; ++r) ss += sm.ss[slot][r];
            }
            return ss;
          });
      return;
    }
    (void)rank;
    (void)row_count;
    (void)entry_pending;
    if constexpr (C::kSlicedStore) {
      // warp j stores 128-dim block j; the warps' partial sums meet in shared memory
      const int j = u / 32, lane = u % 32;
      store_row_slice<C, 128>(
          t, a, &sm.row[team][0], j < C::kStoreWarps, lane, 128 * j,
          [&](int block) { return store::staged_operands<C::H>(a.store, block, block, lane, sm.ops[team]); },
          [&](bool storing, double part) {
            if (storing && lane == 0) sm.part[j] = part;
            team_sync<C>();  // every warp's partial sum has landed
            double ss = 0.0;
            if (storing) {
#pragma unroll
              for (int r = 0; r < C::kStoreWarps; ++r) ss += sm.part[r];
            }
            return ss;
          });
    } else if (u < 32) {
      float v[C::H / 32];
      store::detail::BlockOperands ops[C::H / 128];
#pragma unroll
      for (int j = 0; j < C::H / 128; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) v[4 * j + i] = sm.row[team][128 * j + 4 * u + i];
        ops[j] = store::staged_operands<C::H>(a.store, j, j, u, sm.ops[team]);
      }
      store::store_row_ops<C::H, C::kFmt>(v, ops, u, t.loc, a.store);
    }
    team_sync<C>();  // the row buffer is reused by the team's next row
  }
}

// Row-independent staging, once per kernel: the weight blocks of a one-block store, by the lanes
// that store them (sliced store: warp j stages block j; else warp 0 of the team stages all).
template <class C>
__device__ __forceinline__ void stage_invariants(const CompressArgs& a, Smem<C>& sm, int team, int u) {
  if constexpr (C::kSlicedStore) {
    if (u < 32 * C::kStoreWarps) store::stage_weight(a.store, u / 32, u / 32, u % 32, sm.ops[team]);
  } else if constexpr (C::kStageOps) {
    if (u < 32) {
#pragma unroll
      for (int j = 0; j < C::H / 128; ++j) store::stage_weight(a.store, j, j, u, sm.ops[team]);
    }
  }
}

// The RoPE row of a stored row at `position`, staged by the lanes that read it back: lanes 16-31
// of the warp that stores the last 128-dim block.
template <class C>
__device__ __forceinline__ void stage_row_rope(const CompressArgs& a, Smem<C>& sm, int team, int u, int64_t position) {
  if constexpr (C::kStageOps) {
    if (u / 32 == C::kStoreWarps - 1) store::stage_rope(a.store, u % 32, position, sm.ops[team]);
  }
}

}  // namespace compress
}  // namespace flashcompress
