// flashcompress: compress family, the C128 and online C128 decode kernel (one token per request,
// plan DecodePlan [B]; ratio 4 has its own kernel, compress_decode_c4.cuh).
//
// A team (block, or cluster of kCSplit blocks) handles a run of consecutive requests, as many as
// make the grid one wave of resident blocks. Per request it writes its share of the request's
// input row into state row write_loc and pools the request if it closes a window (C128:
// write_loc % 128 == 127; online: offset 127 emits, any other offset stores the running state).
// The window entry the same launch writes is read from the request's own input row (rounded
// through TState), so no thread waits on another's store. C128 copies the shares of all its
// requests up front. Online rows under Tiling::kClosing take online_decode_row (same bits, a
// shorter chain).
#pragma once

#include <cstdint>

#include "compress_epilogue.cuh"
#include "compress_pool.cuh"
#include "ptx.cuh"

namespace flashcompress {
namespace compress {

// C128 decode: copy this block's share of the input rows of requests [first, last) into their
// state rows up front. kChunk vectors per thread are loaded before any is stored, so the loads of
// a chunk are in flight together (a store may alias a later load for the compiler).
template <class C>
__device__ __forceinline__ void copy_rows_share(const CompressArgs& a, int64_t first, int64_t last, int u, int share) {
  if constexpr (C::kCopyRows) {
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

// Online C128 decode under Tiling::kClosing: pool_row's one-entry path, computed directly. The
// thread owns channels c = 4u .. 4u + 3 of the row. For one entry with logit l the running
// softmax is (m, s, n) = (l, 1, v) when l is finite (max(-inf, l) = l, exp(l - l) = exp(0) = 1,
// fma(1, v, 0)), merging it into the empty state changes no bit (acc_merge) and n / 1 = n; for
// l = -inf, +inf or NaN, exp(l - ms) is exp(-inf) = 0 or exp(NaN) = NaN and n / s is NaN. So the
// entry costs no exp and no division; only the merge with the prior state keeps its two
// accurate exps and its division (merge_channel's expressions), with one branch for the four
// channels so that their chains overlap. Same bits as pool_row for every input.
template <class C>
__device__ __forceinline__ void online_decode_row(const Window& w, const RowTarget& t, const CompressArgs& a,
                                                  Smem<C>& sm, int team, int u) {
  static_assert(C::kOnlineDecode && C::kSplit == 1 && C::kVecW == 4 && C::kCSplit == 1, "online decode tiling");
  using TIn = typename C::TIn;
  using TState = typename C::TState;
  constexpr int V = C::kVecW;
  constexpr int H = C::H;
  const int c = V * u;
  const Prior<V> prior = load_prior<C, V>(t, a, c);
  const TIn* in = static_cast<const TIn*>(a.input) + w.q_first * C::kInWidth + c;
  const Vec<TIn, V> kv = load_vec<TIn, V>(in), sc = load_vec<TIn, V>(in + H);
  const Vec<TIn, V> bi = load_vec<TIn, V>(static_cast<const TIn*>(a.ape) + static_cast<int64_t>(w.bias_base) * H + c);
  Fin f[V];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    float l = to_float(sc.v[i]);
    l += to_float(bi.v[i]);
    const float m = fmaxf(-INFINITY, l);
    const float d = l - (m == -INFINITY ? 0.f : m);      // 0, -inf or NaN
    const float p = d == 0.f ? 1.f : (d == -INFINITY ? 0.f : d);  // exp(d)
    const float n = fmaf(p, to_float(kv.v[i]), 0.f);
    f[i] = Fin{m, p, p == 1.f ? n : __int_as_float(0x7fffffff)};
  }
  if (t.merge_slot >= 0) {
    // merge_channel's expressions; every channel's exps before the first division
    float num[V];
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float m1 = prior.m[i], s1 = prior.s[i], k1 = prior.k[i];
      const float m = fmaxf(m1, f[i].m);
      const float ra = s1 * expf(m1 - m), rb = f[i].s * expf(f[i].m - m);
      num[i] = fmaf(k1, ra, f[i].k * rb);  // how merge_channel's k1 * ra + k * rb compiles (SASS)
      f[i].m = m;
      f[i].s = ra + rb;
    }
#pragma unroll
    for (int i = 0; i < V; ++i) f[i].k = num[i] / f[i].s;
  }
  if (t.state_slot >= 0) {  // the row's state goes back to the pool instead of emitting
    TState* dst = static_cast<TState*>(a.state) + t.state_slot * C::kStateWidth + c;
    Vec<TState, V> m, s, k;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      m.v[i] = from_float<TState>(f[i].m);
      s.v[i] = from_float<TState>(f[i].s);
      k.v[i] = from_float<TState>(f[i].k);
    }
    store_vec<TState, V>(dst, m);
    store_vec<TState, V>(dst + H, s);
    store_vec<TState, V>(dst + 2 * H, k);
    if constexpr (!C::kStoreRows) {  // kNone: a row that emits nothing is zeros
      store_vec<typename C::TOut, V>(static_cast<typename C::TOut*>(a.out) + t.out_row * H + c,
                                     Vec<typename C::TOut, V>{});
    }
    return;
  }
  float* row = C::kStoreRows ? &sm.row[team][0] : nullptr;
  emit_channels<C, V>(t, a, row, c, f);
}

// Decode: a team handles requests [first, first + a.reqs_per_team), one after the other. C128
// copies the team's share of all their input rows into the state first. Per request the team
// reads the plan row, pools the request if it closes a window (the store operands fly
// meanwhile), then stores the pooled row.
template <class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks) decode_kernel(const CompressArgs a) {
  static_assert(C::kRatio == 128, "ratio-4 decode is c4_decode_kernel (compress_decode_c4.cuh)");
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
  // Online rows under Tiling::kClosing (online_decode_row): the store's weight blocks are staged
  // with the team's first emitting row, not by every team (most teams emit nothing).
  constexpr bool kShortOnline = C::kOnline && C::kClosingDecode;
  bool invariants_pending = kShortOnline;
  if constexpr (!kShortOnline) stage_invariants<C>(a, sm, team, u);
  async_commit();
  copy_rows_share<C>(a, first, last, u, rank);
  int row_count = 0;                         // rows the team has stored
  bool entry_pending = C::kCluster;
  for (int64_t b = first; b < last; ++b) {  // uniform across the team (and the cluster)
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
      t.emit = p.write_loc % 128 == 127;
      w.hi = C::W;
      w.buf_len = C::W;
      w.page0 = p.read_page_0;
      w.page1 = p.read_page_1;
      w.self_row = p.write_loc;  // read back from this request's input row, not the state
      w.self_in = b;
    }
    t.position = static_cast<int64_t>(p.seq_len) - C::kRatio;
    if (t.emit) {
      if (invariants_pending) {  // in this row's group: async_wait<0> below orders it
        stage_invariants<C>(a, sm, team, u);
        invariants_pending = false;
      }
      stage_row_rope<C>(a, sm, team, u, t.position);
    }
    async_commit();
    if (!C::kOnline && !t.emit) {  // only the copy: nothing pooled, nothing stored
      async_wait<0>();
      if constexpr (!C::kStoreRows) zero_out_row<C>(a, b, u, rank);
      continue;
    }
    async_wait<1>();  // the row-independent stage has landed; this row's may fly on
    if constexpr (kShortOnline) {
      online_decode_row<C>(w, t, a, sm, team, u);  // writes a non-emitting kNone row's zeros
    } else {
      pool_row<C>(w, t, a, sm, team, u, rank);
    }
    async_wait<0>();
    if (t.emit) {
      store_pooled_row<C>(t, a, sm, team, u, rank, row_count, entry_pending);
      ++row_count;
    } else if constexpr (!C::kStoreRows && !kShortOnline) {
      zero_out_row<C>(a, b, u, rank);
    }
  }
  pdl_leave<C::kPdlEarly>();
}

}  // namespace compress
}  // namespace flashcompress
