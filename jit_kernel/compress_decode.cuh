// flashcompress: compress family, the decode kernel (one token per request, plan DecodePlan [B]).
//
// A team (block, or cluster of kCSplit blocks) handles a run of consecutive requests, as many as
// make the grid one wave of resident blocks. Per request it writes its share of the request's
// input row into state row write_loc and pools the request if it closes a window (C4: seq_len %
// 4 == 0; C128: write_loc % 128 == 127; online: offset 127 emits, any other offset stores the
// running state). The window entry the same launch writes is read from the request's own input
// row (rounded through TState), so no thread waits on another's store. C128 copies the shares of
// all its requests up front; C4 stages each share in shared memory by cp.async and writes it
// after issuing the pooling, and reads its bias rows from a copy staged once.
#pragma once

#include <cstdint>

#include "compress_epilogue.cuh"
#include "compress_pool.cuh"
#include "ptx.cuh"

namespace flashcompress {
namespace compress {

// C4 decode: stage this block's share of request b's input row in shared memory; write_copy
// stores it into the state row write_loc once the pooling of the request has been issued.
template <class C>
__device__ __forceinline__ void stage_copy(const CompressArgs& a, Smem<C>& sm, int team, int u, int share, int64_t b) {
  if constexpr (C::kStageCopy) {
    using TIn = typename C::TIn;
    const TIn* src = static_cast<const TIn*>(a.input) + b * C::kInWidth + 4 * share * C::kCopyVecs;
    for (int k = u; k < C::kCopyVecs; k += C::kTeamThreads) async_copy<sizeof(Vec<TIn, 4>)>(&sm.copy[team][k], src + 4 * k);
  }
}

template <class C>
__device__ __forceinline__ void write_copy(const CompressArgs& a, const Smem<C>& sm, int team, int u, int share,
                                           int64_t write_loc) {
  if constexpr (C::kStageCopy) {
    typename C::TState* dst = static_cast<typename C::TState*>(a.state) + write_loc * C::kStateWidth +
                              4 * share * C::kCopyVecs;
    for (int k = u; k < C::kCopyVecs; k += C::kTeamThreads) store_state_vec<C>(dst + 4 * k, sm.copy[team][k]);
  }
}

// C128 decode: copy this block's share of the input rows of requests [first, last) into their
// state rows up front. kChunk vectors per thread are loaded before any is stored, so the loads of
// a chunk are in flight together (a store may alias a later load for the compiler).
template <class C>
__device__ __forceinline__ void copy_rows_share(const CompressArgs& a, int64_t first, int64_t last, int u, int share) {
  if constexpr (C::kCopyRows && !C::kStageCopy) {
    using TIn = typename C::TIn;
    using TState = typename C::TState;
    constexpr int kChunk = 4;
    const auto* plan = reinterpret_cast<const DecodePlan*>(a.plan);
    const int64_t total = (last - first) * C::kCopyVecs;
    for (int64_t base = u; base < total; base += int64_t{kChunk} * C::kTeamThreads) {
      Vec<TIn, 4> x[kChunk];
      TState* dst[kChunk];
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        const int64_t idx = base + int64_t{j} * C::kTeamThreads;
        dst[j] = nullptr;
        if (idx < total) {
          const int64_t b = first + idx / C::kCopyVecs;
          const int v = share * C::kCopyVecs + static_cast<int>(idx % C::kCopyVecs);
          x[j] = load_vec<TIn, 4>(static_cast<const TIn*>(a.input) + b * C::kInWidth + 4 * v);
          dst[j] = static_cast<TState*>(a.state) + static_cast<int64_t>(plan[b].write_loc) * C::kStateWidth + 4 * v;
        }
      }
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        if (dst[j] != nullptr) store_state_vec<C>(dst[j], x[j]);
      }
    }
  }
}

// Decode: a team handles requests [first, first + a.reqs_per_team), one after the other. C128
// copies the team's share of all their input rows into the state first; C4 stages each
// request's share (async) as the request starts. Per request the team reads the plan row, pools
// the request if it closes a window (the staged copy and store operands fly meanwhile), then
// writes the staged copy into the state and stores the pooled row: a closing C4 request waits
// for two memory round trips, {plan row, input share} and {window rows, RoPE row}.
template <class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks) decode_kernel(const CompressArgs a) {
  __shared__ Smem<C> sm;
  int rank, team, u;
  int64_t group;
  block_coords<C>(rank, group, team, u);
  if constexpr (C::kCluster) cluster_entry<C>(sm);
  // Launched as a programmatic dependent (sm_90): the launch and the prologue above overlap the
  // previous kernel; no global memory is touched before the wait.
  pdl_warm_params(warm_fold(a));
  pdl_enter<C::kPdlEarly>();
  const auto* plan = reinterpret_cast<const DecodePlan*>(a.plan);
  const int64_t first = (group * C::kTeams + team) * a.reqs_per_team;
  const int64_t last = first + a.reqs_per_team < a.rows ? first + a.reqs_per_team : a.rows;
  stage_invariants<C>(a, sm, team, u);
  async_commit();
  copy_rows_share<C>(a, first, last, u, rank);
  int row_count = 0;                         // rows the team has stored
  bool entry_pending = C::kCluster;
  for (int64_t b = first; b < last; ++b) {  // uniform across the team (and the cluster)
    stage_copy<C>(a, sm, team, u, rank, b);
    const DecodePlan p = plan[b];
    RowTarget t{};
    t.out_row = b;
    t.loc = C::kStoreRows ? a.out_loc[b] : 0;
    t.merge_slot = -1;
    t.state_slot = -1;
    Window w{};
    w.self_row = -1;
    if constexpr (C::kOnline) {
      // Fold the token into the slot; emit at offset 127, else store the state at write_loc.
      const int off = static_cast<int>((p.seq_len - 1u) % 128u);
      t.emit = off == 127;
      t.merge_slot = off == 0 ? -1 : p.read_page_0;
      t.state_slot = t.emit ? -1 : p.write_loc;
      w.q_first = b;
      w.lo = 0;
      w.hi = 1;
      w.bias_base = off;
    } else {
      if constexpr (C::kRatio == 4) {
        t.emit = p.seq_len % 4u == 0;
        w.lo = p.seq_len > 4 ? 0 : 4;
      } else {
        t.emit = p.write_loc % 128 == 127;
      }
      w.hi = C::W;
      w.buf_len = C::W;
      w.page0 = p.read_page_0;
      w.page1 = p.read_page_1;
      w.self_row = p.write_loc;  // read back from this request's input row, not the state
      w.self_in = b;
    }
    t.position = static_cast<int64_t>(p.seq_len) - C::kRatio;
    if (t.emit) stage_row_rope<C>(a, sm, team, u, t.position);
    async_commit();
    if (!C::kOnline && !t.emit) {  // only the copy: nothing pooled, nothing stored
      async_wait<0>();
      write_copy<C>(a, sm, team, u, rank, p.write_loc);
      if constexpr (!C::kStoreRows) zero_out_row<C>(a, b, u, rank);
      continue;
    }
    async_wait<1>();  // the row-independent stage (the bias) has landed; this row's may fly on
    pool_row<C>(w, t, a, sm, team, u, rank);
    async_wait<0>();
    write_copy<C>(a, sm, team, u, rank, p.write_loc);
    if (t.emit) {
      store_pooled_row<C>(t, a, sm, team, u, rank, row_count, entry_pending);
      ++row_count;
    } else if constexpr (!C::kStoreRows) {
      zero_out_row<C>(a, b, u, rank);
    }
  }
  pdl_leave<C::kPdlEarly>();
}

}  // namespace compress
}  // namespace flashcompress
