// flashcompress: compress family, the ratio-4 decode kernel (one token per request, plan
// DecodePlan [B]); compress_forward (kFmt kNone) and compress_and_store (the store epilogue).
//
// Shapes (H = 512 main KV or 128 indexer; all contiguous):
//   input [B, 4H] TIn      request b's token: kv-overlap [0,H), kv-own [H,2H), score-overlap
//                          [2H,3H), score-own [3H,4H)
//   state [rows, 4H] TState  raw copies of input rows; the request's row goes to write_loc
//   ape   [8, H] TIn       rows 0-3 overlap bias, 4-7 own bias
//   out   [B, H] TOut      kNone: the pooled row of a request that closes a window
//                          (seq_len % 4 == 0), zeros for the others
// Window of a closing request: entries e < 4 (overlap) are state rows 4 page0 + e, columns
// kv-overlap / score-overlap, padding while seq_len <= 4; entries e >= 4 (own) are state rows
// 4 page1 + e - 4, columns kv-own / score-own. The row this launch writes (write_loc) is read as
// it is after the write (the reference writes every input row, then pools).
//
// Thread mapping: a team of H / 4 threads (H 512: the 128-thread block; H 128: one warp, 4 teams
// per block) runs a run of consecutive requests; thread u owns channels c = 4u .. 4u + 3, which
// are also its share of the row copy (vector u of each of the four segments). Per request:
//   1. one burst after the wait: plan row, the copy share (4 vectors), out_loc; the copy share
//      goes to state row write_loc as soon as it has landed;
//   2. closing requests: one burst of the window (16 vectors) and the bias (8 vectors), loaded
//      straight into registers and converted to TIn as they land (one register set per entry,
//      whatever the dtypes). The row written in step 1 (own entry 7 for every plan this library
//      builds) is read back by the same thread in program order, so the window needs no
//      per-entry source selection and is read exactly as the reference sees it;
//   3. one-pass softmax per channel over registers: max over the live logits, exp, then the sum
//      and the weighted sum in entry order, IEEE division (the order of the PyTorch reference;
//      the old batch-and-merge form gave the same bits: merging one batch into the empty state
//      scales it by exactly 1);
//   4. one 16-byte (bf16: 8-byte) output store, or the row to shared memory for the store
//      epilogue (compress_epilogue.cuh: warp j of a head-512 block stores 128-dim block j).
// Non-closing requests store only the copy (and, kNone, a zero vector: the output contract). PDL: nothing is read
// before the wait; dependents are let in right after it (the grid fills every block slot).
#pragma once

#include <cstdint>
#include <type_traits>

#include "compress_epilogue.cuh"
#include "compress_pool.cuh"
#include "launch.h"
#include "ptx.cuh"

namespace flashcompress {
namespace compress {
namespace c4 {

// 4 values of T converted to TIn (the dtype every window value passes through), RNE; fp32 ->
// bf16 by packed pairs on CUDA.
template <typename TIn, typename T>
__device__ __forceinline__ Vec<TIn, 4> to_in(const Vec<T, 4>& x) {
  Vec<TIn, 4> y;
  if constexpr (std::is_same_v<T, TIn>) {
    y = x;
#if !FC_GPU_HIP
  } else if constexpr (std::is_same_v<T, float> && std::is_same_v<TIn, bf16_t>) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(x.v[0], x.v[1]), hi = __floats2bfloat162_rn(x.v[2], x.v[3]);
    y.v[0] = lo.x;
    y.v[1] = lo.y;
    y.v[2] = hi.x;
    y.v[3] = hi.y;
#endif
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) y.v[i] = from_float<TIn>(to_float(x.v[i]));
  }
  return y;
}

template <typename T>
__device__ __forceinline__ Vec<T, 4> zero_vec() {
  Vec<T, 4> z;
#pragma unroll
  for (int i = 0; i < 4; ++i) z.v[i] = from_float<T>(0.f);
  return z;
}

// One closing request's window for this thread's 4 channels: kv and score of the 8 entries and
// the 8 bias vectors, as TIn.
template <class C>
struct WindowRegs {
  using V = Vec<typename C::TIn, 4>;
  V kv[8], sc[8], bias[8];
};

// Load the window from the state (overlap entries only when `overlap`; padding entries are
// zeros). st0 / st1: the overlap / own page's first state row at channel c.
template <class C>
__device__ __forceinline__ void load_window(WindowRegs<C>& w, const typename C::TState* st0,
                                                   const typename C::TState* st1, bool overlap) {
  using TIn = typename C::TIn;
  using TState = typename C::TState;
  constexpr int H = C::H, S = C::kStateWidth;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if (e < 4) {
      w.kv[e] = zero_vec<TIn>();
      w.sc[e] = zero_vec<TIn>();
      if (overlap) {
        w.kv[e] = to_in<TIn>(load_vec<TState, 4>(st0 + e * S));
        w.sc[e] = to_in<TIn>(load_vec<TState, 4>(st0 + e * S + 2 * H));
      }
    } else {
      w.kv[e] = to_in<TIn>(load_vec<TState, 4>(st1 + (e - 4) * S + H));
      w.sc[e] = to_in<TIn>(load_vec<TState, 4>(st1 + (e - 4) * S + 3 * H));
    }
  }
}

// The copy share (segments kv-overlap, kv-own, score-overlap, score-own at channel c) into the
// state row at dst (channel c).
template <class C>
__device__ __forceinline__ void store_copy(typename C::TState* dst, const Vec<typename C::TIn, 4> (&x)[4]) {
#pragma unroll
  for (int s = 0; s < 4; ++s) store_state_vec<C>(dst + s * C::H, x[s]);
}

// Softmax pooling of channel i of the window: one pass over registers. Padding entries (the
// overlap half while seq_len <= 4) take no part in the max and add exact zeros to both sums.
template <class C>
__device__ __forceinline__ float pool_channel(const WindowRegs<C>& w, int i, bool overlap) {
  float kv[8], lg[8];
  float m = -INFINITY;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    kv[e] = to_float(w.kv[e].v[i]);
    lg[e] = to_float(w.sc[e].v[i]) + to_float(w.bias[e].v[i]);
    if (e >= 4 || overlap) m = fmaxf(m, lg[e]);
  }
  const float ms = m == -INFINITY ? 0.f : m;
  float s = 0.f, n = 0.f;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const bool live = e >= 4 || overlap;
    const float p = live ? fast_exp(lg[e] - ms) : 0.f;
    s += p;
    n = fmaf(p, live ? kv[e] : 0.f, n);
  }
  return n / s;
}

}  // namespace c4

// Decode: a team handles requests [first, first + a.reqs_per_team), one after the other.
template <class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks) c4_decode_kernel(const CompressArgs a) {
  static_assert(C::kRatio == 4 && C::kDecode && !C::kOnline && C::kCSplit == 1 && C::kSplit == 1 &&
                    C::kTeamThreads * 4 == C::H,
                "ratio-4 decode: one team of H / 4 threads per request, whole row");
  using TIn = typename C::TIn;
  using TState = typename C::TState;
  using TOut = typename C::TOut;
  __shared__ Smem<C> sm;
  int rank, team, u;
  int64_t group;
  block_coords<C>(rank, group, team, u);
  pdl_warm_params(warm_fold(a));
  pdl_enter<true>();
  const auto* plan = reinterpret_cast<const DecodePlan*>(a.plan);
  const auto* input = static_cast<const TIn*>(a.input);
  const auto* ape = static_cast<const TIn*>(a.ape);
  auto* state = static_cast<TState*>(a.state);
  const int c = 4 * u;
  const int64_t first = (group * C::kTeams + team) * a.reqs_per_team;
  const int64_t last = first + a.reqs_per_team < a.rows ? first + a.reqs_per_team : a.rows;
  if constexpr (C::kStoreRows) {  // the store's weight blocks, once per kernel
    stage_invariants<C>(a, sm, team, u);
    async_commit();
  }
  int row_count = 0;  // rows the team has stored
  bool entry_pending = false;
  for (int64_t b = first; b < last; ++b) {  // uniform across the team
    const DecodePlan p = plan[b];
    Vec<TIn, 4> x[4];  // the copy share: kv-overlap, kv-own, score-overlap, score-own
    const TIn* src = input + b * C::kInWidth + c;
#pragma unroll
    for (int s = 0; s < 4; ++s) x[s] = load_vec<TIn, 4>(src + s * C::H);
    const int64_t loc = C::kStoreRows ? a.out_loc[b] : 0;
    TState* dst = state + static_cast<int64_t>(p.write_loc) * C::kStateWidth + c;
    // The copy goes first: a window is then read as the reference sees it (the row written
    // here, at own entry 7 for the plans this library builds, is read back in program order).
    // The copy share arrives with the plan row, so the window's burst waits for nothing more.
    c4::store_copy<C>(dst, x);
    if (p.seq_len % 4u != 0) {  // no window closes: (kNone) a zero row
      if constexpr (!C::kStoreRows) store_vec<TOut, 4>(static_cast<TOut*>(a.out) + b * C::H + c, c4::zero_vec<TOut>());
      continue;
    }
    RowTarget t{};
    t.emit = true;
    t.out_row = b;
    t.position = static_cast<int64_t>(p.seq_len) - 4;
    t.loc = loc;
    t.merge_slot = -1;
    t.state_slot = -1;
    if constexpr (C::kStoreRows) {
      stage_row_rope<C>(a, sm, team, u, t.position);
      async_commit();
    }
    const bool overlap = p.seq_len > 4;
    const TState* st0 = state + static_cast<int64_t>(p.read_page_0) * 4 * C::kStateWidth + c;
    const TState* st1 = state + static_cast<int64_t>(p.read_page_1) * 4 * C::kStateWidth + c;
    c4::WindowRegs<C> w;
#pragma unroll
    for (int e = 0; e < 8; ++e) w.bias[e] = load_vec<TIn, 4>(ape + e * C::H + c);
    c4::load_window<C>(w, st0, st1, overlap);
    float k[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) k[i] = c4::pool_channel<C>(w, i, overlap);
    if constexpr (C::kStoreRows) {
      float* row = &sm.row[team][c];
#pragma unroll
      for (int i = 0; i < 4; ++i) row[i] = to_float(from_float<TOut>(k[i]));
      async_wait<0>();  // the staged store operands
      store_pooled_row<C>(t, a, sm, team, u, rank, row_count, entry_pending);
      ++row_count;
    } else {
      Vec<TOut, 4> y;
#pragma unroll
      for (int i = 0; i < 4; ++i) y.v[i] = from_float<TOut>(k[i]);
      store_vec<TOut, 4>(static_cast<TOut*>(a.out) + b * C::H + c, y);
    }
  }
}

// Launch: as many requests per team as make the grid one wave of resident blocks (a request that
// closes no window costs only its row copy, so fewer, fuller blocks finish sooner).
template <class C>
gpuError_t launch_decode_c4(const CompressArgs& a, gpuStream_t stream) {
  const int64_t resident = KernelOccupancy<c4_decode_kernel<C>>::resident(C::kThreads, 1);
  if (resident <= 0) return static_cast<gpuError_t>(-resident);
  const int64_t teams = resident * C::kTeams;
  CompressArgs d = a;
  d.reqs_per_team = teams > 0 ? (a.rows + teams - 1) / teams : 1;
  const int64_t per = C::kTeams * d.reqs_per_team;
  return launch_kernel(c4_decode_kernel<C>, {static_cast<unsigned>((a.rows + per - 1) / per), C::kThreads, 0, 1, kPdlLaunch}, stream, d);
}

}  // namespace compress
}  // namespace flashcompress
