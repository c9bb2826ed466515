// flashcompress: compress family, the C128 decode kernel (regular C128, clusters available,
// Tiling::kAuto; whole-row tilings and online C128 keep compress_decode.cuh's decode_kernel).
//
// Shapes (H = 512, W = 128; Cfg C for Pass::kDecode): plan DecodePlan [B]; input [B, 2H] TIn
// (kv | score); state [state_rows, 2H] TState; ape [128, H] TIn; out [B, H] TOut (kNone) or the
// paged cache (store variants).
//
// Grid: one 512-thread block per (request b, 64-channel slice r): blockIdx.x = 8 b + r; store
// variants launch the 8 slices of a request as one cluster. Warp w owns window entries
// 8w..8w+7, lane l channels c = 64r + 2l, 2l + 1 (8-B vectors for fp32). Every block, after the
// PDL wait:
//   1. loads, in one round trip, the plan row of b and its lanes' part of input row b's slice
//      (and, warp 0 of a store variant, out_loc[b]);
//   2. one warp copies the slice into state row write_loc (rounded to TState): the warp whose
//      entries include that row (normally warp 15, entry 127), else warp 0; kNone rows that
//      close no window get zeros in their output slice; such blocks are then done;
//   3. a closing row (write_loc % 128 == 127) is pooled in ONE burst of loads per thread: 8 kv
//      + 8 score state loads and 8 bias loads, issued before the first use. The copying warp
//      reads the row it wrote back from its own stores (program order), so the entry this
//      launch writes needs no special path and is the input rounded through TState;
//   4. per channel the warp forms its 8-entry partial (max, then exp, sum and weighted sum in
//      entry order) into shared memory; after one barrier thread u merges channel u / 8 from
//      the partials of warps u % 8 and u % 8 + 8 (global max by a 3-step butterfly, then the
//      rescaled sums by butterflies) and lane 0 of the 8 divides;
//   5. kNone: the value is written to out; store variants: the slice (rounded to TOut) goes to
//      shared memory and warp 0 stores it (store.cuh store_slice) after the 8 blocks exchange
//      their fp64 sums of squares through distributed shared memory (added in slice order).
//      Its weight and RoPE operands were staged by cp.async before the window burst.
// Both paths pool with the same code, so fused bytes equal the two-step path's.
#pragma once

#include <cstdint>

#include "compress_epilogue.cuh"
#include "compress_pool.cuh"
#include "ptx.cuh"

namespace flashcompress {
namespace compress {

// The variants this kernel runs (the others: decode_kernel).
template <class C>
inline constexpr bool kC128Burst = C::kDecode && C::kRatio == 128 && !C::kOnline && !C::kWholeRow;

// Largest decode batch that takes the per-slice grid (B x 8 blocks of 512 threads). Measured on
// the H200 (benchmarks/RESULTS.md): faster than the team walk at B <= 128 (rand and all-boundary),
// slower at B = 512 rand (4096 blocks that mostly only copy a row).
inline constexpr int64_t kC128BurstMaxRows = 128;

template <class C>
struct C128Decode {
  static constexpr int kThreads = 512;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kPer = C::W / kWarps;  // window entries per warp
  static constexpr int kSlice = 64;           // channels per block: 32 lanes x 2
  static constexpr int kSlices = C::H / kSlice;
  static constexpr int kMergeLanes = 8;       // lanes per channel merging the warps' partials
  static_assert(C::kChans == kSlice && C::kCSplit == kSlices, "Cfg: 64-channel decode slices");
  static_assert(kPer == 8 && kThreads == kSlice * kMergeLanes && kWarps == 2 * kMergeLanes, "tiling");
};

template <class C>
struct SmemC128 {
  using D = C128Decode<C>;
  float m[D::kWarps][D::kSlice], s[D::kWarps][D::kSlice], n[D::kWarps][D::kSlice];
  float row[C::kStoreRows ? C::H : 1];       // store: the rounded row, absolute dims (this slice set)
  double ss[C::kCluster ? D::kSlices : 1];   // cluster: every block's fp64 sum of squares, by rank
  uint64_t sum_bar;                          // cluster: arrivals of the 8 partial sums
  store::StagedOperands<1> ops;              // store: weight block r / 2 and the RoPE row
};

// Entry value as the reference sees it: a state value TState -> TIn -> fp32.
template <class C>
__device__ __forceinline__ float state_value(typename C::TState x) {
  return via<typename C::TIn>(x);
}

template <class C>
__global__ void __launch_bounds__(512, 2) decode_kernel_c128(const CompressArgs a) {
  using D = C128Decode<C>;
  using TIn = typename C::TIn;
  using TState = typename C::TState;
  using TOut = typename C::TOut;
  constexpr int H = C::H;
  constexpr int kW = C::kStateWidth;  // == kInWidth == 2H
  __shared__ SmemC128<C> sm;
  const int rank = static_cast<int>(blockIdx.x % D::kSlices);
  const int64_t b = blockIdx.x / D::kSlices;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int c = rank * D::kSlice + 2 * lane;  // this lane's first channel
  if constexpr (C::kCluster) {
    if (threadIdx.x == 0) {
      mbar_init(&sm.sum_bar, 1);
      mbar_init_fence();
    }
    cluster_arrive_relaxed();
  }
  // Programmatic dependent (sm_90): nothing global before the wait.
  pdl_warm_params(warm_fold(a));
  pdl_wait();
  const auto* plan = reinterpret_cast<const DecodePlan*>(a.plan);
  const TIn* in_row = static_cast<const TIn*>(a.input) + b * kW + c;
  // One round trip: the plan row and this lane's part of the input slice (every warp: the one
  // that copies it depends on the plan).
  const DecodePlan p = plan[b];
  const int64_t loc = C::kStoreRows && warp == 0 ? a.out_loc[b] : 0;  // the cache slot, with the plan
  const Vec<TIn, 2> in_kv = load_vec<TIn, 2>(in_row), in_sc = load_vec<TIn, 2>(in_row + H);
  asm volatile("" ::: "memory");  // keep these loads here, not sunk into the copy branch below
  const bool emit = p.write_loc % 128 == 127;
  // The window entry that is state row write_loc (normally 127) is read back by the warp that
  // writes it, from its own stores (program order), so it needs no special path; without one
  // warp 0 copies.
  const int self_e = static_cast<int>(static_cast<int64_t>(p.write_loc) - static_cast<int64_t>(p.read_page_1) * 128);
  const int copy_warp = emit && self_e >= 0 && self_e < C::W ? self_e / D::kPer : 0;
  if (warp == copy_warp) {
    TState* dst = static_cast<TState*>(a.state) + static_cast<int64_t>(p.write_loc) * kW + c;
    Vec<TState, 2> kv, sc;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      kv.v[i] = from_float<TState>(to_float(in_kv.v[i]));
      sc.v[i] = from_float<TState>(to_float(in_sc.v[i]));
    }
    store_vec<TState, 2>(dst, kv);
    store_vec<TState, 2>(dst + H, sc);
  }
  if (!emit) {
    if constexpr (!C::kStoreRows) {
      if (warp == 0) store_vec<TOut, 2>(static_cast<TOut*>(a.out) + b * H + c, Vec<TOut, 2>{});
    }
    pdl_launch_dependents();
    return;
  }

  // Store operands of this block's slice, staged while the window is pooled.
  const int64_t position = static_cast<int64_t>(p.seq_len) - C::kRatio;
  if constexpr (C::kStoreRows) {
    if (warp == 0) {
      store::stage_weight(a.store, rank / 2, 0, lane, sm.ops);
      // the RoPE lanes (16-31 of block 3) read the table row in both of block 3's slices
      if (rank / 2 == D::kSlices / 2 - 1) store::stage_rope(a.store, lane, position, sm.ops);
      async_commit();
    }
  }

  // One burst: the warp's 8 entries (state rows 128 page1 + e) and their bias rows, all issued
  // before the first use.
  const int e0 = warp * D::kPer;
  const TState* st = static_cast<const TState*>(a.state) + (static_cast<int64_t>(p.read_page_1) * 128 + e0) * kW + c;
  const TIn* bias = static_cast<const TIn*>(a.ape) + static_cast<int64_t>(e0) * H + c;
  Vec<TState, 2> kv_s[D::kPer], sc_s[D::kPer];
  Vec<TIn, 2> bi[D::kPer];
#pragma unroll
  for (int j = 0; j < D::kPer; ++j) {
    kv_s[j] = load_vec<TState, 2>(st + static_cast<int64_t>(j) * kW);
    sc_s[j] = load_vec<TState, 2>(st + static_cast<int64_t>(j) * kW + H);
    bi[j] = load_vec<TIn, 2>(bias + j * H);
  }

  // The warp's partial per channel: max, then exp / sum / weighted sum in entry order.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float kv[D::kPer], lg[D::kPer];
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < D::kPer; ++j) {
      kv[j] = state_value<C>(kv_s[j].v[i]);
      lg[j] = state_value<C>(sc_s[j].v[i]);
      lg[j] += to_float(bi[j].v[i]);
      m = fmaxf(m, lg[j]);
    }
    const Acc p = softmax_partial<C::kFastExp>(lg, kv, m);
    sm.m[warp][2 * lane + i] = p.m;
    sm.s[warp][2 * lane + i] = p.s;
    sm.n[warp][2 * lane + i] = p.n;
  }
  __syncthreads();

  // Merge: thread u takes channel k = u / 8 and the partials of warps l and l + 8 (l = u % 8).
  const int k = static_cast<int>(threadIdx.x) / D::kMergeLanes, l = static_cast<int>(threadIdx.x) % D::kMergeLanes;
  const float ma = sm.m[l][k], mb = sm.m[l + D::kMergeLanes][k];
  const float mx = group_max<D::kMergeLanes>(fmaxf(ma, mb));
  const float mxs = mx == -INFINITY ? 0.f : mx;
  const float ra = exp_<C::kFastExp>(ma - mxs), rb = exp_<C::kFastExp>(mb - mxs);
  const float s = group_sum<D::kMergeLanes>(sm.s[l][k] * ra + sm.s[l + D::kMergeLanes][k] * rb);
  const float n = group_sum<D::kMergeLanes>(sm.n[l][k] * ra + sm.n[l + D::kMergeLanes][k] * rb);
  const int ch = rank * D::kSlice + k;
  if constexpr (!C::kStoreRows) {
    if (l == 0) static_cast<TOut*>(a.out)[b * H + ch] = from_float<TOut>(n / s);
    pdl_launch_dependents();
  } else {
    if (l == 0) sm.row[ch] = to_float(from_float<TOut>(n / s));
    __syncthreads();
    pdl_launch_dependents();
    if (warp != 0) return;
    async_wait<0>();  // this lane's staged operands
    RowTarget t{};
    t.position = position;
    t.loc = loc;
    cluster_wait();  // every block of the cluster has started and set up its barrier
    store_row_slice<C, D::kSlice>(
        t, a, sm.row, true, lane, rank * D::kSlice,
        [&](int j) { return store::staged_operands<H>(a.store, j, 0, lane, sm.ops); },
        [&](bool, double part) {
          // lane q sends the block's partial sum to block q's slot ss[rank]; lane 0 expects all 8
          if (lane == 0) mbar_arrive_expect(&sm.sum_bar, D::kSlices * sizeof(double));
          if (lane < D::kSlices) remote_store_async(&sm.ss[rank], &sm.sum_bar, part, lane);
          mbar_wait(&sm.sum_bar, 0);
          double ss = 0.0;
#pragma unroll
          for (int q = 0; q < D::kSlices; ++q) ss += sm.ss[q];
          return ss;
        });
  }
}

// Grid: one block per (request, slice); store variants in clusters of the 8 slices of a row.
template <class C>
gpuError_t launch_decode_c128(const CompressArgs& a, gpuStream_t stream) {
  using D = C128Decode<C>;
  const unsigned grid = static_cast<unsigned>(a.rows * D::kSlices);
  return launch_kernel(decode_kernel_c128<C>, {grid, D::kThreads, 0, C::kCluster ? static_cast<unsigned>(D::kSlices) : 1u, kPdlLaunch},
                       stream, a);
}

}  // namespace compress
}  // namespace flashcompress
