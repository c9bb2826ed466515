// flashcompress: the `compress` kernel family: softmax pooling of KV windows into compressed
// rows (compress_forward), optionally ending in the store epilogue (compress_and_store).
//
// Tensors (H = head dim, W = window = 8 for ratio 4 / 128 for ratio 128; all contiguous):
//   state   [state_rows, width] TState  C4: width 4H, a raw copy of a token's input row;
//                                       C128: 2H; online C128: 3H = [max M | sum S | mean K]
//   input   [input_rows, 4H | 2H] TIn   C4 columns kv-overlap, kv-own, score-overlap, score-own;
//                                       C128 / online: kv, score
//   ape     [8 | 128, H] TIn            C4 rows 0-3 overlap bias, 4-7 own bias; C128 row = offset
//   plan    decode: DecodePlan [B] (16 B); prefill: CompressPlan [C] (16 B)
//   plan_w  prefill: WritePlan [Nw] (8 B); online: CompressPlan [Nw] (segment rows)
//   out     [rows, H] TOut (kFmt == kNone): decode row b = request b, zeros unless it closes a
//           window; prefill row k = plan row k, zeros for invalid rows
//   store   (kFmt != kNone) the compressed row, rounded to TOut, is handed to
//           store::store_row at RoPE position seq_len - ratio, slot out_loc[b] (decode) or
//           out_loc[ragged_id] (prefill); rows that close no window write nothing.
//
// Pooling, per channel c of an entry (python/flashcompress/torch_backend/compress.py is the
// reference): logit_e = score_e[c] + ape[bias row of e][c], out[c] = sum_e softmax(logit)_e *
// kv_e[c] over the W window entries. A state value is converted TState -> TIn -> fp32 (the
// peer's mixed-dtype chain), an input value TIn -> fp32, the result fp32 -> TOut.
//   C4 entry e < 4 (overlap role): kv cols [0,H), score [2H,3H), state row 4*page0 + e,
//     input row q - 7 + e; padding (skipped) when seq_len <= 4 (first window).
//   C4 entry e >= 4 (own role): kv [H,2H), score [3H,4H), state row 4*page1 + e - 4,
//     input row q - 3 + (e - 4).
//   C128 entry e: kv [0,H), score [H,2H), state row 128*page1 + e, input row q - 127 + e.
//   Prefill takes entry e from the state iff e < buffer_len, else from the input (q =
//   ragged_id). Decode takes every entry from the state, except the row this request writes
//   in the same launch, which it takes from its own input row (rounded through TState), so no
//   thread waits on another's store.
//   Online C128 (running state, one row per request slot): decode folds one token into the
//   slot (emits at offset 127, stores the state otherwise); a prefill segment reduces its
//   offsets [end - len, end) from the input, merges with the prior slot when it does not start
//   the window, then emits (compress list) or stores the state (write list).
//
// Thread mapping. A "team" computes one row's slice of kChans channels: thread (split s,
// vector v) owns channels 4v..4v+3 of the slice and window entries [s*W/kSplit, (s+1)*W/kSplit),
// issued kBatch entries at a time (every load of a batch before the first use), and keeps a
// running (max, sum, weighted sum). With one split the thread finishes its channels itself;
// otherwise the partials go through shared memory and kLanes threads per channel merge them
// with a butterfly. kCSplit = H / kChans blocks share a row (a thread block cluster on SM90
// when the row is stored):
//   C4 H=512: 128 threads, whole row, 8 entries each  C4 H=128: 4 teams of 32 threads
//   C128 decode: 512 threads, kChans 64, 32 splits of 4 entries (8 blocks per row)
//   C128 / online prefill: 512 threads, kChans 128, 16 splits of 8 entries (4 blocks per row)
//   online decode: 128 threads, whole row, 1 entry
//   C128 without clusters (HIP, CUDA before sm_90; Cfg::kWholeRow), decode and prefill, stored
//   or not: 512 threads, whole row, 4 splits of 32 entries (one block per row)
// (tiling chosen by A/B runs on the H200: benchmarks/RESULTS.md; a variant with the C128 bias
// staged in shared memory, all 4 entries of a split in flight and a persistent prefill grid
// measured 10% faster on all-boundary decode batches, up to 23% slower on single-request decode
// and prefill).
// Decode grids of cluster kernels count whole resident clusters (Kernel::setup).
// Decode: a team (block, cluster) handles a run of consecutive requests, as many as make the
// grid one wave of resident blocks: it writes its share of each request's input row into the
// state (row write_loc) and pools each request that closes a window (C4: seq_len % 4 == 0;
// C128: write_loc % 128 == 127; online: offset 127 emits, any other offset stores the state).
// C128 copies the shares of all its requests first; C4 stages each request's share in shared
// memory with cp.async as the request starts and writes it after issuing the pooling, and reads
// its bias rows from a shared-memory copy staged once (128 registers, 4 blocks per SM: a
// 512-request batch is one request per block).
// Prefill: pass 1 (compress list) pools every valid plan row; pass 2 (write list) copies input
// rows into the state (online: stores segment states). Pass 2 is launched after pass 1 with
// programmatic dependent launch on SM90: it loads everything first and executes
// griddepcontrol.wait before its first store, because ring rows alias and every read of pass 1
// must complete before a write of pass 2 lands (the two passes share rows).
// The decode kernel and pass 1 are programmatic dependents of whatever kernel precedes them in
// the stream (SM90): they set up shared memory (and the cluster), read their parameters, wait
// for the previous kernel before their first global-memory access, and let the next kernel
// launch right after the wait (C4 decode) or once a block has done its work (Cfg::kPdlEarly,
// gpu_runtime.h).
// Online decode loads the slot's prior state (load_prior) with the window and writes the running
// state back by vector stores (finish_channels).
//
// Store epilogue (store_pooled_row): the team writes its rounded row (slice) to shared memory.
// One block per row: its operands were staged by cp.async while the row was pooled (the weight
// blocks once, the RoPE row per stored row; store::StagedOperands), so the store reads no global
// memory: head 512, warp j stores 128-dim block j (lane l holds dims 128j + 4l + i) with
// store::store_slice after the 4 warps' sums of squares meet in shared memory; head 128, warp 0
// of the team calls store::store_row_ops. A cluster of kCSplit blocks (C128): warp 0 of every
// block loads its slice's operands and stores its own 64 / 128-dim slice with
// store::store_slice; the blocks exchange only their slices' fp64 sums of squares through
// distributed shared memory: each block's storing warp sends its sum to every block by st.async,
// which completes bytes of that block's mbarrier (double-buffered), and waits on its own; the
// other warps go on to the team's next row.
// Targets without clusters (HIP; CUDA before sm_90): a C128 row is one 512-thread block
// (Cfg::kWholeRow), in compress_forward too, so both paths pool in one order. HIP (no PDL
// either): a "warp" is 32 aligned lanes (half a wave64; shuffles take a width), 32-thread teams
// sync with a wavefront barrier; the rest is the CUDA code.
#pragma once

#include <cstdint>
#include <type_traits>

#include "compress_launch.h"
#include "gpu_runtime.h"
#include "launch.h"
#include "plan.cuh"
#include "store.cuh"
#include "vec.cuh"

namespace flashcompress {

namespace compress {

template <DType d>
struct TypeOf;
template <>
struct TypeOf<DType::kF32> {
  using type = float;
};
template <>
struct TypeOf<DType::kBF16> {
  using type = bf16_t;
};

// ------------------------------------------------------------------------------------------
// Configuration of one variant and one pass
// ------------------------------------------------------------------------------------------

enum class Pass : int { kDecode = 0, kPrefill = 1, kOnlineWrite = 2 };

template <int kRatio_, bool kOnline_, int kHeadDim_, DType kIn, DType kState, DType kOut,
          StoreFormat kFmt_, Tiling kTiling, Pass kPass_>
struct Cfg {
  static constexpr int kRatio = kRatio_;
  static constexpr bool kOnline = kOnline_;
  static constexpr int H = kHeadDim_;
  static constexpr StoreFormat kFmt = kFmt_;
  static constexpr Pass kPass = kPass_;
  static constexpr bool kDecode = kPass == Pass::kDecode;
  static constexpr bool kStoreRows = kFmt != StoreFormat::kNone && kPass != Pass::kOnlineWrite;
  using TIn = typename TypeOf<kIn>::type;
  using TState = typename TypeOf<kState>::type;
  using TOut = typename TypeOf<kOut>::type;

  static constexpr int W = kRatio == 4 ? 8 : 128;  // window entries
  static constexpr int kInWidth = kRatio == 4 ? 4 * H : 2 * H;
  static constexpr int kStateWidth = kOnline ? 3 * H : kInWidth;

  // Tiling. Online decode folds one token: one entry, the whole row in one team. C4 pools 8
  // entries per channel in one thread. C128 pools 128: decode in 64-channel slices (8 blocks per
  // row, 32 splits of 4 entries: short rows for latency), prefill in 128-channel slices (4
  // blocks, 16 splits of 8 entries: fewer, longer-lived blocks for bandwidth).
  static constexpr bool kOnlineDecode = kOnline && kDecode;
  static constexpr bool kWide = kRatio == 128 && !kOnlineDecode;
  // Without thread block clusters (HIP, CUDA before sm_90, Tiling::kWholeRow) a C128 row is
  // pooled by one block: the whole row, 4 splits of 32 entries, 512 threads. Stored or not, so
  // that compress_and_store and compress_forward pool a row in the same order (the fused path
  // writes the two-step path's bytes) on every target.
  static constexpr bool kWholeRow = (!kHasClusters || kTiling == Tiling::kWholeRow) && kWide;
  static constexpr int kChans = (!kWide || kWholeRow) ? H : (kDecode ? 64 : 128);
  static constexpr int kCSplit = H / kChans;  // blocks per row (a cluster when storing rows)
  static constexpr int kEntries = kOnlineDecode ? 1 : W;
  static constexpr int kSplit = !kWide ? 1 : (kWholeRow ? 4 : (kDecode ? 32 : 16));
  static constexpr int kPerSplit = kEntries / kSplit;
  // Entries whose loads are in flight together (registers: 3 x 4 values per entry). 512-thread
  // blocks run two per SM within 64 registers; C4 prefill runs 6 blocks of 128 per SM.
  static constexpr int kBatch = kPerSplit < 4 ? kPerSplit : (kWide ? 2 : (kDecode ? 8 : 4));
  static constexpr int kVecs = kChans / 4;                 // channel vectors per slice
  static constexpr int kTeamThreads = kVecs * kSplit;
  static constexpr int kTeams = kTeamThreads >= 128 ? 1 : 128 / kTeamThreads;
  static constexpr int kThreads = kTeams * kTeamThreads;
  // Resident blocks the register budget must allow: two 512-thread blocks, six C4 prefill
  // blocks; C4 decode four per SM on CUDA (<= 128 registers: a 512-request batch is one request
  // per team), no bound on HIP.
  static constexpr int kBlocksPerSm = kThreads >= 512 ? 2 : (kRatio == 4 ? (kDecode ? 4 : 6) : 1);
  static constexpr int kBlocksPerCu = kRatio == 4 && kDecode ? 1 : kBlocksPerSm;
  static constexpr int kMinBlocks = launch_min_blocks(kBlocksPerSm, kBlocksPerCu, kThreads);
  // Batches of a split unrolled at once: all, except the 16 of a whole-row split (fully
  // unrolled they spill: clang-19, gfx942 decode 256 VGPRs + scratch, 127 and none rolled).
  static constexpr int kUnroll = kWholeRow ? 1 : kPerSplit / kBatch;
  static constexpr bool kCluster = kCSplit > 1 && kStoreRows;
  // Programmatic dependent launch: C4 decode (its grid fills every block slot) lets the next
  // kernel launch right after its wait; C128 / online decode and prefill once a block is done
  // (gpu_runtime.h; session 10's A/B in benchmarks/RESULTS.md).
  static constexpr bool kPdlEarly = kDecode && kRatio == 4;
  // Combining the splits: kLanes consecutive threads per channel, each merging kSplit / kLanes
  // partials, then a butterfly over the kLanes lanes.
  static constexpr int kLanes = kSplit == 1 ? 1 : kTeamThreads / kChans;
  // The regular pooling uses the fast exp (ex2.approx); the online state, whose running sum is
  // kept across calls, uses the accurate one.
  static constexpr bool kFastExp = !kOnline;
  // Decode copies the block's share of every request's input row (kCopyVecs vectors) into the
  // state. C4 (kStageCopy): per request, staged in shared memory by asynchronous copies (no
  // registers held while they fly; each thread reads back only its own copies) and written
  // after the pooling, so the copy overlaps the window loads; the bias rows of the thread's
  // channels are staged once. C128 (a share is 32 vectors of a 512-thread block): all the
  // team's requests up front, loads in flight together (copy_rows_share); measured 1.45x faster
  // than per-request staging at B = 512 (benchmarks/RESULTS.md). Stores by one block
  // (kStageOps): the weight blocks and each stored row's RoPE row are staged, so the store
  // epilogue loads nothing from global memory. A cluster block (C128) loads its slice's operands
  // in the epilogue: staging them measured 5-13% slower C128 decode (RESULTS.md).
  static constexpr bool kCopyRows = kDecode && !kOnline;
  static constexpr int kCopyVecs = kInWidth / 4 / kCSplit;
  static constexpr bool kStageCopy = kCopyRows && kRatio == 4;
  static constexpr bool kStageApe = kDecode && kRatio == 4;
  static constexpr bool kStageOps = kStoreRows && !kCluster;
  // A one-block store of a row with several 128-dim blocks (H = 512): warp j stores block j
  // (store::store_slice; the blocks' sums of squares meet in shared memory) when the team has a
  // warp per block (C4 head 512, online decode, HIP's whole-row C128); else warp 0 stores the row.
  static constexpr bool kSlicedStore = kStageOps && H > 128 && kTeams == 1 && kTeamThreads >= 32 * (H / 128);
  static constexpr int kStoreWarps = kSlicedStore ? H / 128 : 1;

  static_assert(H % 128 == 0 && H % kChans == 0 && kChans % 4 == 0, "head dim: a multiple of 128");
  static_assert(kLanes >= 1 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0 &&
                    kSplit % kLanes == 0, "split combine lanes");
  static_assert(kEntries % kSplit == 0, "window entries must split evenly");
  static_assert(kPerSplit % kBatch == 0, "entries of a split must batch evenly");
  static_assert(kTeams == 1 || kTeamThreads == 32, "multi-team blocks use one warp per team");
  static_assert(kThreads <= 1024, "block too large");
  static_assert(!kOnline || (kRatio == 128 && kIn == DType::kF32 && kOut == DType::kF32),
                "online compression is ratio 128 with fp32 input and output");
  static_assert(kHasClusters || !kCluster, "no thread block clusters on this target: store variants need kCSplit 1");
};

// Running softmax state of one channel: max, sum of exp, sum of exp * kv.
struct Acc {
  float m, s, n;
};

__device__ __forceinline__ Acc acc_empty() { return Acc{-INFINITY, 0.f, 0.f}; }

// exp(x). Fast: 2^(x log2 e) by ex2.approx with subnormal results flushed to zero (FMUL +
// MUFU.EX2; __expf adds a range fix-up of 3 instructions for subnormal results, which change
// no sum here: every sum of p = exp(logit - max) includes 1). exp(0) is exactly 1 and
// exp(-inf) exactly 0 in both versions (acc_merge relies on it).
template <bool kFast>
__device__ __forceinline__ float exp_(float x) {
  if constexpr (kFast) {
    return fast_exp(x);
  } else {
    return expf(x);
  }
}

// Merge b into a, without branches. An empty state (m = -inf, s = n = 0) is scaled by exactly 0
// and the other by exactly 1, so merging with an empty state returns the other one bit for bit;
// two empty states give an empty state (the max is replaced by 0 so no -inf - -inf arises).
template <bool kFast>
__device__ __forceinline__ Acc acc_merge(Acc a, Acc b) {
  const float m = fmaxf(a.m, b.m);
  const float ms = m == -INFINITY ? 0.f : m;
  const float ra = exp_<kFast>(a.m - ms), rb = exp_<kFast>(b.m - ms);
  return Acc{m, a.s * ra + b.s * rb, a.n * ra + b.n * rb};
}

template <typename T>
__device__ __forceinline__ void load4(const T* __restrict__ p, float (&o)[4]) {
  const Vec<T, 4> v = load_vec<T, 4>(p);
#pragma unroll
  for (int i = 0; i < 4; ++i) o[i] = to_float(v.v[i]);
}

// A state value as the pooling sees it (TState -> TIn -> fp32).
template <class C>
__device__ __forceinline__ void load4_state(const typename C::TState* p, float (&o)[4]) {
  const Vec<typename C::TState, 4> v = load_vec<typename C::TState, 4>(p);
#pragma unroll
  for (int i = 0; i < 4; ++i) o[i] = via<typename C::TIn>(v.v[i]);
}

// An input value that the same launch also writes to the state, read back as the state holds it.
template <class C>
__device__ __forceinline__ void load4_self(const typename C::TIn* p, float (&o)[4]) {
  const Vec<typename C::TIn, 4> v = load_vec<typename C::TIn, 4>(p);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[i] = via<typename C::TIn>(from_float<typename C::TState>(to_float(v.v[i])));
  }
}

// ------------------------------------------------------------------------------------------
// One row's window, as resolved from its plan row
// ------------------------------------------------------------------------------------------

struct Window {
  int64_t q_first;    // input row of entry 0 (entry e reads input row q_first + e)
  int64_t page0;      // C4 overlap page
  int64_t page1;      // C4 own page / C128 page
  int64_t self_row;   // decode: the state row this request writes (read from input row self_in)
  int64_t self_in;
  int buf_len;        // entries [0, buf_len) come from the state
  int lo, hi;         // live entries [lo, hi); C4 first window: [4, 8)
  int bias_base;      // online decode: ape row of the single token
};

template <class C>
__device__ __forceinline__ int64_t state_row_of(const Window& w, int e) {
  if constexpr (C::kRatio == 4) {
    return e < 4 ? w.page0 * 4 + e : w.page1 * 4 + (e - 4);
  } else {
    return w.page1 * 128 + e;
  }
}

// Channel columns of entry e's kv and score within a state / input row.
template <class C>
__device__ __forceinline__ int kv_col(int e) {
  return (C::kRatio == 4 && e >= 4) ? C::H : 0;
}
template <class C>
__device__ __forceinline__ int score_col(int e) {
  if constexpr (C::kRatio == 4) return e >= 4 ? 3 * C::H : 2 * C::H;
  return C::H;
}

// Accumulate this thread's entries [e0, e0 + kPerSplit) for channels c..c+3, kBatch entries at a
// time: every load of a batch is issued before the first one is used (the addresses depend only
// on the plan row), so a thread waits for one memory round trip per batch, not per entry.
template <class C>
__device__ __forceinline__ void pool_entries(const Window& w, int e0, int c,
                                             const typename C::TState* state,
                                             const typename C::TIn* __restrict__ input,
                                             const typename C::TIn* __restrict__ ape,
                                             Acc (&acc)[4]) {
  using TIn = typename C::TIn;
  using TState = typename C::TState;
  using RawIn = Vec<TIn, 4>;
  using RawState = Vec<TState, 4>;
  constexpr int B = C::kBatch;
  // Prefill: row pointers at channel c, set once per row, so entry e0 + j reads j rows past them
  // (constant offsets once the batch loop unrolls). State rows: C128 the page (st_a, entry e at
  // row 128 page1 + e); C4 the overlap page (st_a, e < 4) and the own page (st_b, e >= 4, row
  // 4 page1 + e - 4). Input rows: q_first + e. Decode computes each entry's rows as it goes
  // (fewer live registers, and the entry this launch writes, self_row, is found by its row).
  constexpr bool kRowPtrs = !C::kDecode;
  static_assert(C::kRatio == 128 || C::kSplit == 1, "C4 indexes its state rows by entry: one split (e0 == 0)");
  const TState* st_a = nullptr;
  const TState* st_b = nullptr;
  const TIn* in_e0 = nullptr;
  const TIn* bias_e0 = ape + static_cast<int64_t>(C::kOnlineDecode ? w.bias_base : e0) * C::H + c;
  if constexpr (kRowPtrs) {
    st_a = state + (C::kRatio == 4 ? w.page0 * 4 : w.page1 * 128 + e0) * C::kStateWidth + c;
    st_b = state + (w.page1 * 4 - 4) * C::kStateWidth + c;
    in_e0 = input + (w.q_first + e0) * C::kInWidth + c;
  }
#pragma unroll C::kUnroll
  for (int b0 = 0; b0 < C::kPerSplit; b0 += B) {
    // Where each entry comes from: 0 = padding, 1 = input row, 2 = state row, 3 = the state row
    // this launch writes (read from its input row, rounded through TState).
    // With TIn == TState every entry loads into in_*; otherwise state entries use st_*.
    constexpr bool kSame = std::is_same_v<TIn, TState>;
    int kind[B];
    RawIn in_kv[B], in_sc[B], bias[B];
    RawState st_kv[kSame ? 1 : B], st_sc[kSame ? 1 : B];
#pragma unroll
    for (int k = 0; k < B; ++k) {
      const int j = b0 + k, e = e0 + j;
      const bool live = e >= w.lo && e < w.hi;
      const bool from_state = e < w.buf_len;
      const TState* st_row;
      const TIn* in_row;
      bool self = false;
      if constexpr (kRowPtrs) {  // C4: e0 == 0, so e is a constant too
        st_row = (C::kRatio == 4 && e >= 4 ? st_b : st_a) + static_cast<int64_t>(C::kRatio == 4 ? e : j) * C::kStateWidth;
        in_row = in_e0 + static_cast<int64_t>(j) * C::kInWidth;
      } else {
        const int64_t srow = from_state ? state_row_of<C>(w, e) : 0;
        self = from_state && srow == w.self_row;
        st_row = state + srow * C::kStateWidth;
        in_row = input + (self ? w.self_in : w.q_first + e) * C::kInWidth;
      }
      kind[k] = !live ? 0 : (!from_state ? 1 : (self ? 3 : 2));
      const int kc = kv_col<C>(e) + (kRowPtrs ? 0 : c), sc = score_col<C>(e) + (kRowPtrs ? 0 : c);
      if constexpr (kSame) {
        const TIn* src = kind[k] == 2 ? reinterpret_cast<const TIn*>(st_row) : in_row;
        if (kind[k] != 0) {
          in_kv[k] = load_vec<TIn, 4>(src + kc);
          in_sc[k] = load_vec<TIn, 4>(src + sc);
        }
      } else if (kind[k] == 2) {
        st_kv[k] = load_vec<TState, 4>(st_row + kc);
        st_sc[k] = load_vec<TState, 4>(st_row + sc);
      } else if (kind[k] != 0) {
        in_kv[k] = load_vec<TIn, 4>(in_row + kc);
        in_sc[k] = load_vec<TIn, 4>(in_row + sc);
      }
      if (kind[k] != 0) bias[k] = load_vec<TIn, 4>(bias_e0 + (C::kOnlineDecode ? 0 : j * C::H));
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float kv[B], lg[B];
      float m = -INFINITY;
#pragma unroll
      for (int k = 0; k < B; ++k) {
        if (kind[k] == 2) {
          if constexpr (kSame) {
            kv[k] = to_float(in_kv[k].v[i]);
            lg[k] = to_float(in_sc[k].v[i]);
          } else {
            kv[k] = via<TIn>(st_kv[k].v[i]);
            lg[k] = via<TIn>(st_sc[k].v[i]);
          }
        } else if (kind[k] == 3) {
          kv[k] = via<TIn>(from_float<TState>(to_float(in_kv[k].v[i])));
          lg[k] = via<TIn>(from_float<TState>(to_float(in_sc[k].v[i])));
        } else {
          kv[k] = to_float(in_kv[k].v[i]);
          lg[k] = to_float(in_sc[k].v[i]);
        }
        lg[k] += to_float(bias[k].v[i]);
        if (kind[k] != 0) m = fmaxf(m, lg[k]);
      }
      // Branch-free: a padding entry adds exact zeros (p = 0, kv = 0); a batch of padding only
      // is an empty state, which acc_merge leaves out exactly.
      const float ms = m == -INFINITY ? 0.f : m;
      float s = 0.f, n = 0.f;
#pragma unroll
      for (int k = 0; k < B; ++k) {
        const bool live = kind[k] != 0;
        const float p = live ? exp_<C::kFastExp>(lg[k] - ms) : 0.f;
        s += p;
        n = fmaf(p, live ? kv[k] : 0.f, n);
      }
      acc[i] = acc_merge<C::kFastExp>(acc[i], Acc{m, s, n});
    }
  }
}


// ------------------------------------------------------------------------------------------
// Shared memory of one block and the team-level barrier
// ------------------------------------------------------------------------------------------

template <class C>
struct Smem {
  static constexpr int kParts = C::kSplit > 1 ? C::kSplit : 1;  // kSplit 1 needs no partials
  static constexpr int kPartChans = C::kSplit > 1 ? C::kChans : 1;
  float m[C::kTeams][kParts][kPartChans];
  float s[C::kTeams][kParts][kPartChans];
  float n[C::kTeams][kParts][kPartChans];
  float row[C::kTeams][C::kStoreRows ? C::H : 1];  // store epilogue: the rounded row (this block's slice)
  // Cluster store: every block's fp64 sum of squares of its slice, written by each block into
  // every block's copy (slot [row parity][rank]; two slots, each with its barrier sum_bar).
  double ss[C::kCluster ? 2 : 1][C::kCluster ? C::kCSplit : 1];
  uint64_t sum_bar[C::kCluster ? 2 : 1];  // cluster store: the arrivals of every block's partial sum (slot parity)
  // Staged by async copies (Cfg): the copy share, C4 decode's bias rows, the store operands.
  Vec<typename C::TIn, 4> copy[C::kTeams][C::kStageCopy ? C::kCopyVecs : 1];
  Vec<typename C::TIn, 4> ape[C::kTeams][C::kStageApe ? C::W * C::H / 4 : 1];
  store::StagedOperands<C::kStageOps ? C::H / 128 : 1> ops[C::kStageOps ? C::kTeams : 1];
  double part[C::kStoreWarps];  // sliced store: each warp's sum of squares
};

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

template <class C>
__device__ __forceinline__ void team_sync() {
  if constexpr (C::kTeams == 1) {
    __syncthreads();
  } else {
    lane32_sync();  // a multi-team block has one warp per team (teams may diverge)
  }
}

// The bias rows pool_entries reads: staged in shared memory (C4 decode) or global.
template <class C>
__device__ __forceinline__ const typename C::TIn* ape_of(const CompressArgs& a, const Smem<C>& sm, int team) {
  if constexpr (C::kStageApe) {
    return reinterpret_cast<const typename C::TIn*>(&sm.ape[team][0]);
  } else {
    (void)sm;
    (void)team;
    return static_cast<const typename C::TIn*>(a.ape);
  }
}

// ------------------------------------------------------------------------------------------
// The row pipeline: pool -> combine (-> online merge) -> emit / store / state store
// ------------------------------------------------------------------------------------------

struct RowTarget {
  bool emit;            // the row closes a window
  int64_t out_row;      // kNone: output row
  int64_t position;     // store: RoPE position
  int64_t loc;          // store: cache slot
  int64_t merge_slot;   // online: prior state slot to merge with (-1: none)
  int64_t state_slot;   // online: slot that receives the state (-1: none)
};

// An online row's prior state (RowTarget::merge_slot) for the kN consecutive channels from c0
// that this thread finishes (unset when the row merges with nothing).
template <int kN>
struct Prior {
  float m[kN], s[kN], k[kN];
};

template <class C, int kN>
__device__ __forceinline__ Prior<kN> load_prior(const RowTarget& t, const CompressArgs& a, int c0) {
  Prior<kN> p{};
  if constexpr (C::kOnline) {
    using TState = typename C::TState;
    constexpr int H = C::H;
    if (t.merge_slot >= 0) {
      const TState* src = static_cast<const TState*>(a.state) + t.merge_slot * C::kStateWidth + c0;
      const Vec<TState, kN> m = load_vec<TState, kN>(src), s = load_vec<TState, kN>(src + H),
                            k = load_vec<TState, kN>(src + 2 * H);
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        p.m[i] = to_float(m.v[i]);
        p.s[i] = to_float(s.v[i]);
        p.k[i] = to_float(k.v[i]);
      }
    }
  }
  return p;
}

// A channel's final running state: merged with the online prior (m1, s1, k1: load_prior) when
// the row has one; k = the compressed value.
struct Fin {
  float m, s, k;
};

template <class C>
__device__ __forceinline__ Fin merge_channel(const RowTarget& t, Acc acc, float m1, float s1, float k1) {
  Fin f{acc.m, acc.s, acc.n / acc.s};
  if constexpr (C::kOnline) {
    if (t.merge_slot >= 0) {
      const float m = fmaxf(m1, f.m);
      const float ra = s1 * expf(m1 - m), rb = f.s * expf(f.m - m);
      const float s = ra + rb;
      f.k = (k1 * ra + f.k * rb) / s;
      f.m = m;
      f.s = s;
    }
  } else {
    (void)t;
    (void)m1;
    (void)s1;
    (void)k1;
  }
  return f;
}

// Hand a channel's value to the store epilogue (the row in shared memory), or write it to `out`.
template <class C>
__device__ __forceinline__ void emit_channel(const RowTarget& t, const CompressArgs& a, float* row, int c, float k) {
  if constexpr (C::kStoreRows) {
    row[c] = to_float(from_float<typename C::TOut>(k));
  } else if constexpr (C::kPass != Pass::kOnlineWrite) {
    static_cast<typename C::TOut*>(a.out)[t.out_row * C::H + c] = from_float<typename C::TOut>(k);
  }
}

// Finish kN consecutive channels from c: merge, then store the running state back (online rows
// that do not emit: one kN-wide store per part) or emit the values.
template <class C, int kN>
__device__ __forceinline__ void finish_channels(const RowTarget& t, const CompressArgs& a, float* row, int c,
                                                const Acc (&acc)[kN], const Prior<kN>& prior) {
  using TState = typename C::TState;
  Fin f[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) f[i] = merge_channel<C>(t, acc[i], prior.m[i], prior.s[i], prior.k[i]);
  if constexpr (C::kOnline) {
    if (t.state_slot >= 0) {  // the row's state goes back to the pool instead of emitting
      TState* dst = static_cast<TState*>(a.state) + t.state_slot * C::kStateWidth + c;
      Vec<TState, kN> m, s, k;
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        m.v[i] = from_float<TState>(f[i].m);
        s.v[i] = from_float<TState>(f[i].s);
        k.v[i] = from_float<TState>(f[i].k);
      }
      store_vec<TState, kN>(dst, m);
      store_vec<TState, kN>(dst + C::H, s);
      store_vec<TState, kN>(dst + 2 * C::H, k);
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < kN; ++i) emit_channel<C>(t, a, row, c + i, f[i].k);
}

template <class C>
__device__ void pool_row(const Window& w, const RowTarget& t, const CompressArgs& a,
                         Smem<C>& sm, int team, int u, int rank) {
  using TIn = typename C::TIn;
  using TState = typename C::TState;
  const auto* state = static_cast<const TState*>(a.state);
  const auto* input = static_cast<const TIn*>(a.input);
  const TIn* ape = ape_of<C>(a, sm, team);
  const int chan0 = rank * C::kChans;
  float* row = C::kStoreRows ? &sm.row[team][0] : nullptr;

  // Phase 1: each (split, vector) thread pools its entries for 4 channels.
  const int v = u % C::kVecs, split = C::kSplit == 1 ? 0 : u / C::kVecs;
  Acc acc[4] = {acc_empty(), acc_empty(), acc_empty(), acc_empty()};

  if constexpr (C::kSplit == 1) {
    // The thread holds every entry of its channels: finish them directly. An online prior is
    // loaded with the window (online decode: one entry, so the prior would otherwise cost a
    // second round trip per row).
    const Prior<4> prior = load_prior<C, 4>(t, a, chan0 + 4 * v);
    pool_entries<C>(w, 0, chan0 + 4 * v, state, input, ape, acc);
    finish_channels<C, 4>(t, a, row, chan0 + 4 * v, acc, prior);
  } else {
    pool_entries<C>(w, split * C::kPerSplit, chan0 + 4 * v, state, input, ape, acc);
    // Phase 2: kLanes threads per channel merge the partials of the splits, then a butterfly.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      sm.m[team][split][4 * v + i] = acc[i].m;
      sm.s[team][split][4 * v + i] = acc[i].s;
      sm.n[team][split][4 * v + i] = acc[i].n;
    }
    team_sync<C>();
    const int k = u / C::kLanes, lane = u % C::kLanes;
    Acc r = acc_empty();
    // kLanes threads per channel, each merging kSplit / kLanes partials
#pragma unroll
    for (int sp = lane; sp < C::kSplit; sp += C::kLanes) {
      r = acc_merge<C::kFastExp>(r, Acc{sm.m[team][sp][k], sm.s[team][sp][k], sm.n[team][sp][k]});
    }
#pragma unroll
    for (int mask = C::kLanes / 2; mask >= 1; mask /= 2) {
      const Acc o{shfl_xor(r.m, mask, C::kLanes), shfl_xor(r.s, mask, C::kLanes),
                  shfl_xor(r.n, mask, C::kLanes)};
      r = acc_merge<C::kFastExp>(r, o);
    }
    if (lane == 0) {  // an online prior: loaded here (64 registers; a prefill row merges at most once)
      const Acc fin[1] = {r};
      finish_channels<C, 1>(t, a, row, chan0 + k, fin, load_prior<C, 1>(t, a, chan0 + k));
    }
    if constexpr (C::kDecode) team_sync<C>();  // the team's next decode row reuses the partials
  }
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

// Zero this block's slice of output row `row` (kNone rows that close no window).
template <class C>
__device__ __forceinline__ void zero_out_row(const CompressArgs& a, int64_t row, int u, int rank) {
  using TOut = typename C::TOut;
  TOut* dst = static_cast<TOut*>(a.out) + row * C::H + rank * C::kChans;
  for (int k = u; k < C::kChans; k += C::kTeamThreads) dst[k] = from_float<TOut>(0.f);
}

template <class C>
__device__ __forceinline__ void store_state_vec(typename C::TState* dst, const Vec<typename C::TIn, 4>& x) {
  Vec<typename C::TState, 4> y;
#pragma unroll
  for (int i = 0; i < 4; ++i) y.v[i] = from_float<typename C::TState>(to_float(x.v[i]));
  store_vec<typename C::TState, 4>(dst, y);
}

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

// Row-independent staging, once per kernel: C4 decode's bias rows of the thread's channels (the
// only ones pool_entries reads), and the store's weight blocks of a one-block store (warp 0 of
// the team: the lanes that store).
template <class C>
__device__ __forceinline__ void stage_invariants(const CompressArgs& a, Smem<C>& sm, int team, int u) {
  using TIn = typename C::TIn;
  if constexpr (C::kStageApe) {
    const int c = 4 * (u % C::kVecs);
#pragma unroll
    for (int e = 0; e < C::W; ++e) {
      async_copy<sizeof(Vec<TIn, 4>)>(&sm.ape[team][(e * C::H + c) / 4], static_cast<const TIn*>(a.ape) + e * C::H + c);
    }
  }
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

// ------------------------------------------------------------------------------------------
// Kernels
// ------------------------------------------------------------------------------------------

template <class C>
__device__ __forceinline__ void block_coords(int& rank, int64_t& group, int& team, int& u) {
  rank = static_cast<int>(blockIdx.x % C::kCSplit);
  group = blockIdx.x / C::kCSplit;
  team = static_cast<int>(threadIdx.x) / C::kTeamThreads;
  u = static_cast<int>(threadIdx.x) % C::kTeamThreads;
}

// One field from each 32-byte span of CompressArgs (pdl_warm_params).
__device__ __forceinline__ uint64_t warm_fold(const CompressArgs& a) {
  return fold_params(a.state, a.plan, a.out_loc, a.state_rows, a.is_decode, a.store.norm_weight_bf16,
                     a.store.freq_rows);
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

// ------------------------------------------------------------------------------------------
// Launch
// ------------------------------------------------------------------------------------------

template <class C>
unsigned row_grid(int64_t rows, int64_t rows_per_team) {
  const int64_t per = C::kTeams * rows_per_team;
  return static_cast<unsigned>((rows + per - 1) / per * C::kCSplit);
}

}  // namespace compress

template <int kRatio, bool kOnline, int kHeadDim, DType kIn, DType kState, DType kOut,
          StoreFormat kFmt, Tiling kTiling>
gpuError_t CompressLaunch<kRatio, kOnline, kHeadDim, kIn, kState, kOut, kFmt, kTiling>::run(
    const CompressArgs& a, gpuStream_t stream) {
  using namespace compress;
  if (a.is_decode) {
    // As many requests per team as make the grid one wave of resident blocks: a request that
    // closes no window costs only its row copy, so fewer, fuller blocks finish sooner.
    using C = Cfg<kRatio, kOnline, kHeadDim, kIn, kState, kOut, kFmt, kTiling, Pass::kDecode>;
    constexpr unsigned kCluster = C::kCluster ? C::kCSplit : 1;
    const int64_t resident = KernelOccupancy<decode_kernel<C>>::resident(C::kThreads, kCluster);
    if (resident <= 0) return static_cast<gpuError_t>(-resident);
    const int64_t teams = resident / C::kCSplit * C::kTeams;
    CompressArgs d = a;
    d.reqs_per_team = teams > 0 ? (a.rows + teams - 1) / teams : 1;
    return launch_kernel(decode_kernel<C>, {row_grid<C>(a.rows, d.reqs_per_team), C::kThreads, 0, kCluster, kPdlLaunch},
                         stream, d);
  }
  using C = Cfg<kRatio, kOnline, kHeadDim, kIn, kState, kOut, kFmt, kTiling, Pass::kPrefill>;
  constexpr unsigned kCluster = C::kCluster ? C::kCSplit : 1;
  gpuError_t err = launch_kernel(prefill_kernel<C>, {row_grid<C>(a.rows, 1), C::kThreads, 0, kCluster, kPdlLaunch},
                                 stream, a);
  if (err != gpuSuccess) return err;
  if constexpr (kOnline) {
    using CW = Cfg<kRatio, kOnline, kHeadDim, kIn, kState, kOut, kFmt, kTiling, Pass::kOnlineWrite>;
    return launch_kernel(prefill_kernel<CW>, {row_grid<CW>(a.rows_w, 1), CW::kThreads, 0, 1, kPdlLaunch}, stream, a);
  } else {
    return launch_kernel(write_kernel<C>, {static_cast<unsigned>((a.rows_w + 7) / 8), 256, 0, 1, kPdlLaunch}, stream,
                         a);
  }
}

}  // namespace flashcompress
