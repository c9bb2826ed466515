// flashcompress: compress family, the C128 decode kernel of Tiling::kClosing (regular C128,
// clusters available): one launch for every batch size in which only the requests that close a
// window pool, and the other requests' state-row copies are spread over the whole grid.
//
// Shapes (H = 512, W = 128; Cfg C for Pass::kDecode): plan DecodePlan [B]; input [B, 2H] TIn
// (kv | score); state [state_rows, 2H] TState; ape [128, H] TIn; out [B, H] TOut (kNone) or the
// paged cache (store variants).
//
// Grid: G = 8 x min(B, resident groups) blocks of 512 threads (one wave); block g is slice
// r = g % 8 (channels 64r .. 64r + 63) of group q = g / 8, NG = G / 8 groups; store variants
// launch a group as one cluster of 8. The grid depends on B only (graph capturable). After the
// PDL wait every block
//   1. copies its share of the non-closing rows into the state (rows b with write_loc % 128 !=
//      127; unit u of 32 vectors -- 128 values -- goes to block u % G, warp u / G % 16, so every
//      block copies about 8 B / G units), and for kNone writes those rows' zero output. The loads
//      of the copy are in flight with
//   2. the plan scan: chunks of 512 plan rows, one per thread; a block prefix count over the
//      closing rows numbers them k = 0, 1, ... (batch order), and closing row k belongs to group
//      k % NG: the block keeps its group's rows (b, seq_len, write_loc, page) in shared memory;
//   3. per kept row (an "item"), the pooling of the C128 per-slice kernel
//      (compress_decode_c128.cuh): warp w owns window entries 8w..8w+7, lane l channels
//      c = 64r + 2l, 2l + 1; 8 kv + 8 score + 8 bias loads in one burst (state rows 128 page +
//      e; kNone: the bias rows, the same for every item, only with the first item, then kept);
//      the entry this launch writes (state row write_loc, normally entry 127) is taken from
//      the request's input row (rounded through TState) by the warp that owns it, which also
//      writes the slice into the state (the row-copy of step 1 skips closing rows); warp
//      partials -> shared memory (double-buffered by item parity) -> one barrier -> thread u
//      merges channel u / 8 from warps u % 8 and u % 8 + 8.
//   4. kNone: the value goes to out. Store variants: the slice (rounded to TOut) goes to shared
//      memory; warp 0 sends its fp64 sum of squares to the cluster's 8 blocks at once (st.async
//      into their mbarrier-guarded slot, slot = item parity) and finishes the store (waits for
//      the 8 sums, RMSNorm + RoPE + quantise, slice store) only during the NEXT item, after
//      that item's window loads and partials (or after the last item), so the exchange latency
//      overlaps a window round trip instead of delaying it. Weight slices are staged once, the
//      item's RoPE row (blocks 6, 7) and out_loc by cp.async into buffers of the item's parity.
// Both paths pool with the same code, so fused bytes equal the two-step path's.
#pragma once

#include <cstdint>
#include <type_traits>

#include "compress_decode_c128.cuh"
#include "compress_epilogue.cuh"
#include "compress_pool.cuh"
#include "ptx.cuh"

namespace flashcompress {
namespace compress {

// The variants this kernel runs (the others: decode_kernel / decode_kernel_c128).
template <class C>
inline constexpr bool kC128Closing = C::kDecode && C::kRatio == 128 && !C::kOnline && !C::kWholeRow &&
                                     C::kClosingDecode;

#if FC_GPU_HIP
// No clusters on HIP: every C128 variant tiles whole rows there (Cfg::kWholeRow), so this kernel
// is never selected; the launcher exists for the dispatch's discarded branch.
template <class C>
gpuError_t launch_decode_closing(const CompressArgs&, gpuStream_t) {
  static_assert(!kC128Closing<C>, "Tiling::kClosing's C128 decode kernel needs CUDA (sm_90 clusters)");
  return gpuSuccess;
}
#else

// The per-slice kernel's tiling (C128Decode: 512 threads, 8 entries per warp, 64-channel slices,
// 8 merge lanes), plus the plan scan and the row-copy units.
template <class C>
struct C128Closing : C128Decode<C> {
  using Base = C128Decode<C>;
  using Base::kThreads;
  static constexpr int kChunk = kThreads;     // plan rows scanned per round (one per thread)
  static constexpr int kUnitVecs = 32;        // copy unit: one warp's 32 consecutive 4-value vectors
  static constexpr int kRowVecs = C::kInWidth / 4;
  static constexpr int kRowUnits = kRowVecs / kUnitVecs;
  // kNone: the warp's bias rows stay in registers across items (no spills). Store variants load
  // them with every item's window: resident, their fp32 build spills 60 B (about 7 local stores
  // and loads per item) against 12 B once.
  static constexpr bool kResidentBias = !C::kStoreRows;
  static_assert(kRowVecs % kUnitVecs == 0 && C::H % 4 == 0, "copy units");
};

// A closing row kept by a block: request b and the plan fields the pooling reads.
struct ClosingItem {
  int32_t b;
  uint32_t seq_len;
  int32_t write_loc;
  int32_t page;
};

template <class C>
struct SmemClosing {
  using D = C128Closing<C>;
  float m[2][D::kWarps][D::kSlice], s[2][D::kWarps][D::kSlice], n[2][D::kWarps][D::kSlice];
  ClosingItem items[D::kChunk];              // this block's closing rows of the current chunk
  int warp_count[D::kWarps];                 // closing rows per warp of the current chunk
  float row[C::kStoreRows ? C::H : 1];       // store: the rounded row, absolute dims (this slice set)
  double ss[C::kCluster ? 2 : 1][C::kCluster ? D::kSlices : 1];  // cluster: every block's sum, by rank
  uint64_t sum_bar[C::kCluster ? 2 : 1];     // cluster: arrivals of the 8 partial sums (item parity)
  int64_t loc[C::kStoreRows ? 2 : 1][32];   // store: out_loc[b] of the item (parity), per lane of warp 0
  store::StagedOperands<1> ops[C::kStoreRows ? 2 : 1];  // store: weight block r / 2, RoPE row (parity)
};

// Step 1: this block's share of the non-closing rows' copy (and kNone's zero output rows).
template <class C>
__device__ __forceinline__ void closing_copy_share(const CompressArgs& a, int warp, int lane) {
  using D = C128Closing<C>;
  using TIn = typename C::TIn;
  using TOut = typename C::TOut;
  constexpr int kBurst = 2;  // units whose loads are in flight together (B <= 1056: every unit)
  const auto* plan = reinterpret_cast<const DecodePlan*>(a.plan);
  const int64_t units = a.rows * D::kRowUnits;
  const int64_t G = gridDim.x;
  // unit u = (it * kWarps + warp) * G + blockIdx.x
  for (int64_t it0 = 0;; it0 += kBurst) {
    const int64_t u0 = (it0 * D::kWarps + warp) * G + blockIdx.x;
    if (u0 >= units) break;
    Vec<TIn, 4> x[kBurst];
    int32_t loc[kBurst];
    int64_t row[kBurst];
    int vec[kBurst];
#pragma unroll
    for (int j = 0; j < kBurst; ++j) {
      const int64_t u = u0 + int64_t{j} * D::kWarps * G;
      row[j] = -1;
      if (u < units) {
        row[j] = u / D::kRowUnits;
        vec[j] = static_cast<int>(u % D::kRowUnits) * D::kUnitVecs + lane;
        x[j] = load_vec<TIn, 4>(static_cast<const TIn*>(a.input) + row[j] * C::kInWidth + 4 * vec[j]);
        loc[j] = plan[row[j]].write_loc;
      }
    }
#pragma unroll
    for (int j = 0; j < kBurst; ++j) {
      if (row[j] >= 0 && loc[j] % 128 != 127) {  // a closing row is copied by its pooling blocks
        store_state_vec<C>(static_cast<typename C::TState*>(a.state) + static_cast<int64_t>(loc[j]) * C::kStateWidth +
                               4 * vec[j], x[j]);
        if constexpr (!C::kStoreRows) {
          if (4 * vec[j] < C::H) {
            store_vec<TOut, 4>(static_cast<TOut*>(a.out) + row[j] * C::H + 4 * vec[j], Vec<TOut, 4>{});
          }
        }
      }
    }
  }
}

// Step 2, the load: this thread's plan row of the chunk starting at c0 (seq_len 0: none).
template <class C>
__device__ __forceinline__ DecodePlan closing_scan_row(const CompressArgs& a, int64_t c0) {
  const int64_t b = c0 + threadIdx.x;
  DecodePlan p{};
  if (b < a.rows) p = reinterpret_cast<const DecodePlan*>(a.plan)[b];
  return p;
}

// Step 2: from this thread's plan row `p` of the chunk [c0, c0 + kChunk), keep this group's
// closing rows in sm.items. Returns the number kept; `base` (closing rows before the chunk)
// advances by the chunk's count. 32-bit counts: B < 2^31.
template <class C>
__device__ __forceinline__ int closing_scan(const CompressArgs& a, SmemClosing<C>& sm, const DecodePlan& p,
                                            int64_t c0, uint32_t& base, uint32_t group, uint32_t groups, int warp,
                                            int lane) {
  using D = C128Closing<C>;
  const int64_t b = c0 + threadIdx.x;
  const bool closing = b < a.rows && p.write_loc % 128 == 127;
  const unsigned ballot = __ballot_sync(0xffffffffu, closing);
  if (lane == 0) sm.warp_count[warp] = __popc(ballot);
  __syncthreads();  // also: every thread is done with the previous chunk's items
  uint32_t before = 0, total = 0;
#pragma unroll
  for (int w = 0; w < D::kWarps; ++w) {
    const uint32_t c = static_cast<uint32_t>(sm.warp_count[w]);
    before += w < warp ? c : 0u;
    total += c;
  }
  // this group's closing rows before the chunk: k < base with k % groups == group
  const uint32_t first = (base + groups - 1u - group) / groups;
  if (closing) {
    const uint32_t k = base + before + static_cast<uint32_t>(__popc(ballot & ((1u << lane) - 1u)));
    if (k % groups == group) {
      sm.items[k / groups - first] = ClosingItem{static_cast<int32_t>(b), p.seq_len, p.write_loc, p.read_page_1};
    }
  }
  base += total;
  const uint32_t last = (base + groups - 1u - group) / groups;
  __syncthreads();  // the items are in shared memory; warp_count may be rewritten
  return static_cast<int>(last - first);
}

// Warp 0 of a store variant: finish the store of the pending item (`parity`: its slot, staged
// operands and cache slot; `phase`: its barrier phase) once the 8 partial sums have arrived;
// the item's cp.async group has completed (async_wait).
template <class C>
__device__ __forceinline__ void closing_finish_store(const CompressArgs& a, SmemClosing<C>& sm, int rank, int lane,
                                                     int parity, uint32_t phase) {
  if constexpr (C::kStoreRows) {
    using D = C128Closing<C>;
    const int dim0 = rank * D::kSlice, j = dim0 / 128;
    float y[4] = {0.f, 0.f, 0.f, 0.f};
    if (store::slice_lane<D::kSlice>(dim0, lane)) {
#pragma unroll
      for (int i = 0; i < 4; ++i) y[i] = sm.row[128 * j + 4 * lane + i];
    }
    const store::detail::BlockOperands ops = store::staged_operands<C::H>(a.store, j, 0, lane, sm.ops[parity]);
    mbar_wait(&sm.sum_bar[parity], phase);
    double ss = 0.0;
#pragma unroll
    for (int q = 0; q < D::kSlices; ++q) ss += sm.ss[parity][q];
    store::store_slice<C::H, C::kFmt, D::kSlice>(y, ops, lane, dim0, ss, sm.loc[parity][lane], a.store);
  }
}

template <class C>
__global__ void __launch_bounds__(512, 2) decode_kernel_closing(const CompressArgs a) {
  using D = C128Closing<C>;
  using TIn = typename C::TIn;
  using TState = typename C::TState;
  using TOut = typename C::TOut;
  constexpr int H = C::H;
  constexpr int kW = C::kStateWidth;  // == kInWidth == 2H
  constexpr bool kSame = std::is_same_v<TIn, TState>;
  __shared__ SmemClosing<C> sm;
  const int rank = static_cast<int>(blockIdx.x % D::kSlices);
  const uint32_t group = blockIdx.x / D::kSlices, groups = gridDim.x / D::kSlices;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int c = rank * D::kSlice + 2 * lane;  // this lane's first channel
  if constexpr (C::kCluster) {
    if (threadIdx.x == 0) {
      mbar_init(&sm.sum_bar[0], 1);
      mbar_init(&sm.sum_bar[1], 1);
      mbar_init_fence();
    }
    cluster_arrive_relaxed();
  }
  // Programmatic dependent (sm_90): nothing global before the wait.
  pdl_warm_params(warm_fold(a));
  pdl_wait();
  if constexpr (C::kStoreRows) {
    if (warp == 0) {  // this slice's weight block, once, into both operand buffers
      store::stage_weight(a.store, rank / 2, 0, lane, sm.ops[0]);
      store::stage_weight(a.store, rank / 2, 0, lane, sm.ops[1]);
      async_commit();
    }
  }
  // The first chunk's plan rows, in flight with the copy's loads.
  const DecodePlan p0 = closing_scan_row<C>(a, 0);
  closing_copy_share<C>(a, warp, lane);

  int done = 0;  // items this block has pooled
  uint32_t base = 0;
  // The warp's 8 bias rows (ape rows 8w..8w+7, this lane's channels), the same for every item:
  // loaded with the first item's window (kResidentBias, then kept) or with every item's.
  const int e0 = warp * D::kPer;
  Vec<TIn, 2> bi[D::kPer];
  bool bias_pending = true;
  for (int64_t c0 = 0; c0 < a.rows; c0 += D::kChunk) {
    const DecodePlan p = c0 == 0 ? p0 : closing_scan_row<C>(a, c0);
    const int n_items = closing_scan<C>(a, sm, p, c0, base, group, groups, warp, lane);
    for (int i = 0; i < n_items; ++i, ++done) {
      const ClosingItem it = sm.items[i];
      const int64_t b = it.b;
      const int par = done & 1;
      const int64_t position = static_cast<int64_t>(it.seq_len) - C::kRatio;
      if constexpr (C::kStoreRows) {
        if (warp == 0) {
          // the RoPE lanes (16-31 of block 3) read the table row in both of block 3's slices
          if (rank / 2 == D::kSlices / 2 - 1) store::stage_rope(a.store, lane, position, sm.ops[par]);
          async_copy<8>(&sm.loc[par][lane], a.out_loc + b);  // the cache slot, read by this lane only
          async_commit();
        }
      }
      // The entry that is state row write_loc: with the plan builder's rows entry 127 (warp 15,
      // its entry 7), taken from the request's input row (TIn == TState: loaded from there in
      // place of the state row; else one more load, rounded through TState) by warp 15, which
      // also writes the slice into the state. Any other position (other plan producers): the
      // warp that owns the entry (else warp 0) copies the slice first and reads it back from its
      // own stores (program order).
      const int self_e = it.write_loc - it.page * 128;
      const bool std_self = self_e == C::W - 1;
      const bool self_warp = std_self && warp == D::kWarps - 1;
      const TIn* in_row = static_cast<const TIn*>(a.input) + b * kW + c;
      TState* dst = static_cast<TState*>(a.state) + static_cast<int64_t>(it.write_loc) * kW + c;
      if (!std_self && warp == (self_e >= 0 && self_e < C::W ? self_e / D::kPer : 0)) {
        const Vec<TIn, 2> x = load_vec<TIn, 2>(in_row), y = load_vec<TIn, 2>(in_row + H);
        Vec<TState, 2> xs, ys;
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          xs.v[q] = from_float<TState>(to_float(x.v[q]));
          ys.v[q] = from_float<TState>(to_float(y.v[q]));
        }
        store_vec<TState, 2>(dst, xs);
        store_vec<TState, 2>(dst + H, ys);
      }
      // One burst: the warp's 8 entries and (see kResidentBias) their bias rows.
      const TState* st = static_cast<const TState*>(a.state) + (static_cast<int64_t>(it.page) * 128 + e0) * kW + c;
      if (bias_pending || !D::kResidentBias) {  // block-uniform
        const TIn* bias = static_cast<const TIn*>(a.ape) + static_cast<int64_t>(e0) * H + c;
#pragma unroll
        for (int j = 0; j < D::kPer; ++j) bi[j] = load_vec<TIn, 2>(bias + j * H);
        bias_pending = false;
      }
      constexpr int kLast = D::kPer - 1;
      Vec<TState, 2> kv_s[D::kPer], sc_s[D::kPer];
      Vec<TIn, 2> in_kv{}, in_sc{};
      if constexpr (!kSame) {
        if (self_warp) {
          in_kv = load_vec<TIn, 2>(in_row);
          in_sc = load_vec<TIn, 2>(in_row + H);
        }
      }
#pragma unroll
      for (int j = 0; j < D::kPer; ++j) {
        const TState* src = st + static_cast<int64_t>(j) * kW;
        if constexpr (kSame) {
          if (j == kLast && self_warp) src = reinterpret_cast<const TState*>(in_row);
        }
        kv_s[j] = load_vec<TState, 2>(src);
        sc_s[j] = load_vec<TState, 2>(src + H);
      }
      float self_kv[2] = {0.f, 0.f}, self_sc[2] = {0.f, 0.f};  // !kSame: the self entry's values
      if constexpr (kSame) {
        if (self_warp) {  // the state row copy, from the self entry's registers
          store_vec<TState, 2>(dst, kv_s[kLast]);
          store_vec<TState, 2>(dst + H, sc_s[kLast]);
        }
      } else {
        Vec<TState, 2> xs, ys;
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          xs.v[q] = from_float<TState>(to_float(in_kv.v[q]));
          ys.v[q] = from_float<TState>(to_float(in_sc.v[q]));
          self_kv[q] = via<TIn>(xs.v[q]);
          self_sc[q] = via<TIn>(ys.v[q]);
        }
        if (self_warp) {
          store_vec<TState, 2>(dst, xs);
          store_vec<TState, 2>(dst + H, ys);
        }
      }
      // The warp's partial per channel: max, then exp / sum / weighted sum in entry order.
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        float kv[D::kPer], lg[D::kPer];
        float m = -INFINITY;
#pragma unroll
        for (int j = 0; j < D::kPer; ++j) {
          // kSame: every entry as loaded; else warp 15's entry 7 is the rounded input
          const bool self = !kSame && j == kLast && self_warp;
          kv[j] = self ? self_kv[q] : via<TIn>(kv_s[j].v[q]);
          lg[j] = self ? self_sc[q] : via<TIn>(sc_s[j].v[q]);
          lg[j] += to_float(bi[j].v[q]);
          m = fmaxf(m, lg[j]);
        }
        const Acc p = softmax_partial<C::kFastExp>(lg, kv, m);
        sm.m[par][warp][2 * lane + q] = p.m;
        sm.s[par][warp][2 * lane + q] = p.s;
        sm.n[par][warp][2 * lane + q] = p.n;
      }
      // Warp 0: the previous item's store, off this item's load path (its sums have arrived
      // during this item's window round trip).
      if constexpr (C::kStoreRows) {
        if (warp == 0 && done > 0) {
          async_wait<1>();  // the previous item's staged operands (this item's RoPE row may fly)
          closing_finish_store<C>(a, sm, rank, lane, par ^ 1, ((done - 1) >> 1) & 1);
        }
      }
      __syncthreads();  // partials of this item; the previous item's row has been read

      // Merge: thread u takes channel k = u / 8 and the partials of warps l and l + 8.
      const int k = static_cast<int>(threadIdx.x) / D::kMergeLanes, l = static_cast<int>(threadIdx.x) % D::kMergeLanes;
      const float ma = sm.m[par][l][k], mb = sm.m[par][l + D::kMergeLanes][k];
      const float mx = group_max<D::kMergeLanes>(fmaxf(ma, mb));
      const float mxs = mx == -INFINITY ? 0.f : mx;
      const float ra = exp_<C::kFastExp>(ma - mxs), rb = exp_<C::kFastExp>(mb - mxs);
      const float s = group_sum<D::kMergeLanes>(sm.s[par][l][k] * ra + sm.s[par][l + D::kMergeLanes][k] * rb);
      const float n = group_sum<D::kMergeLanes>(sm.n[par][l][k] * ra + sm.n[par][l + D::kMergeLanes][k] * rb);
      const int ch = rank * D::kSlice + k;
      if constexpr (!C::kStoreRows) {
        if (l == 0) static_cast<TOut*>(a.out)[b * H + ch] = from_float<TOut>(n / s);
      } else {
        if (l == 0) sm.row[ch] = to_float(from_float<TOut>(n / s));
        __syncthreads();  // the slice is in shared memory
        if (warp == 0) {
          if (done == 0) cluster_wait();  // every block of the cluster has set up its barriers
          const int dim0 = rank * D::kSlice, jb = dim0 / 128;
          float y[4] = {0.f, 0.f, 0.f, 0.f};
          if (store::slice_lane<D::kSlice>(dim0, lane)) {
#pragma unroll
            for (int q = 0; q < 4; ++q) y[q] = sm.row[128 * jb + 4 * lane + q];
          }
          const double part = store::slice_sum_squares(y);
          // lane q sends the block's partial sum to block q's slot ss[par][rank]; lane 0 expects all 8
          if (lane == 0) mbar_arrive_expect(&sm.sum_bar[par], D::kSlices * sizeof(double));
          if (lane < D::kSlices) remote_store_async(&sm.ss[par][rank], &sm.sum_bar[par], part, lane);
        }
      }
    }
  }
  if constexpr (C::kStoreRows) {
    if (warp == 0 && done > 0) {
      async_wait<0>();
      closing_finish_store<C>(a, sm, rank, lane, (done - 1) & 1, ((done - 1) >> 1) & 1);
    }
  }
  pdl_launch_dependents();
}

// Grid: 8 blocks per group, min(B, resident groups) groups; store variants in clusters of 8.
template <class C>
gpuError_t launch_decode_closing(const CompressArgs& a, gpuStream_t stream) {
  using D = C128Closing<C>;
  constexpr unsigned kCluster = C::kCluster ? static_cast<unsigned>(D::kSlices) : 1u;
  const int64_t resident = KernelOccupancy<decode_kernel_closing<C>>::resident(D::kThreads, kCluster);
  if (resident <= 0) return static_cast<gpuError_t>(-resident);
  int64_t groups = resident / D::kSlices;
  if (groups < 1) groups = 1;
  if (groups > a.rows) groups = a.rows;
  const unsigned grid = static_cast<unsigned>(groups * D::kSlices);
  return launch_kernel(decode_kernel_closing<C>, {grid, D::kThreads, 0, kCluster, kPdlLaunch}, stream, a);
}
#endif  // FC_GPU_HIP

}  // namespace compress
}  // namespace flashcompress
