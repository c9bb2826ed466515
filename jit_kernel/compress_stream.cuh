// flashcompress: compress family, the streaming C128 prefill compress pass (Tiling::kStream;
// C128 and online C128 compress_forward; CUDA sm_90+). Same results, bit for bit, as pass 1 of
// compress_prefill.cuh: per channel, the same 16 splits of 8 entries folded with the same
// instructions (fold_batch in batches of C::kBatch: 8 regular, 2 online; acc_merge), merged in
// pool_row's order, finished by finish_channels (online: with the prior state).
//
// Grid: persistent, G = 8 * floor(SMs / 8) blocks (at most 8 per plan row); block b owns the
// 64-channel slice rank = b % 8 of every row k = b / 8 + i * (G / 8). One block per SM (the ring
// takes ~200 KB of shared memory). Dense plans only (stream_prefill_fits): a padded CUDA-graph
// plan, a row per token, keeps pass 1's grid.
// Block: 16 consumer warps + P = 4 (fp32 input) / 8 (bf16) producer warps: 640 / 768 threads.
//   producer warp p (warps 16..16+P-1), lane 0: per row, waits for a free ring stage, reads the
//     plan row (p = 0 records the resolved window in the stage's descriptor) and issues the
//     1-D bulk copies (cp.async.bulk) of the live entries e of [128p/P, 128(p+1)/P): e's kv and
//     score slices (64 channels: 256 B fp32 / 128 B bf16 each) from state row 128 page1 + e
//     (regular, e < buffer_len) or input row q_first + e, completing on the stage's `full`
//     mbarrier (P arrivals, each expecting its copies' bytes).
//   warps 0-15 (consumers), thread u = 32 s + v: split s (entries 8s..8s+7), channels 2v, 2v+1
//     of the slice. The 16 bias values are loaded once, into registers. Per row: wait `full`,
//     read the live entries from shared memory, fold, release the stage (`empty`, one arrival
//     per warp), write the partials to shared memory (double-buffered by the parity of the
//     block's valid rows), named barrier over the 512 consumers; threads u < 64 (warps 0-1)
//     combine channel u: pool_row's merges of its kLanes (8 / online 4) lanes and butterfly, as
//     lane 0 sees them, then finish it into out[k, channel]. Invalid rows: zeros (u < 64).
// Ring: kStages stages of one row slice each, kv [128][64] then score [128][64] (entry stride
//   kPiece = 64 x the wider of TIn / TState): fp32 3 x 64 KB, bf16 6 x 32 KB.
// The write pass stays the separate launch (write_kernel; online: the write list), a
// programmatic dependent that waits for this grid, so every read of this pass precedes its
// state stores, as with pass 1.
#pragma once

#include <cstdint>
#include <type_traits>

#include "compress_config.cuh"
#include "compress_pool.cuh"
#include "compress_stream_ptx.cuh"
#include "launch.h"
#include "ptx.cuh"

namespace flashcompress {
namespace compress {

// The streaming pass exists for C128 compress_forward (regular and online) where the target has
// clusters (sm_90: bulk copies and mbarriers); C is the pass-1 configuration whose math it runs
// (regular: the kNarrow tiling, one batch of 8 entries per split; online: batches of 2).
template <class C>
inline constexpr bool kStreamable = kHasClusters && C::kRatio == 128 && !C::kDecode && C::kPass == Pass::kPrefill &&
                                    C::kFmt == StoreFormat::kNone && (C::kNarrow || C::kOnline);

// What fold_batch reads of a configuration, for two channels per thread.
template <class C>
struct PairCfg {
  using TIn = typename C::TIn;
  using TState = typename C::TState;
  static constexpr int kVecW = 2;
  static constexpr bool kFastExp = C::kFastExp;
};

template <class C>
struct StreamCfg {
  using TIn = typename C::TIn;
  using TState = typename C::TState;
  static constexpr int W = C::W;                  // 128 entries
  static constexpr int kChans = 64;               // channels per slice (a block's share of a row)
  static constexpr int kSlices = C::H / kChans;   // 8 slices per row
  static constexpr int kBatch = C::kBatch;        // entries folded at once: 8 regular, 2 online
  static constexpr int kLanes = C::kLanes;        // pool_row's combine lanes per channel: 8 regular, 4 online
  static constexpr int kConsumers = C::kTeamThreads;  // 512: split s = u / 32, vector v = u % 32
  static constexpr int kConsumerWarps = kConsumers / 32;
  // Issue streams of copies (a copy is ~14 instructions of one lane, ~30 cycles): 4, one per SM
  // sub-partition, for fp32 input (256-byte copies); 8 for bf16 (128-byte copies, twice as many
  // per byte).
  static constexpr int kProducerWarps = sizeof(TIn) == 2 ? 8 : 4;
  static constexpr int kProducerEntries = W / kProducerWarps;
  static constexpr int kThreads = kConsumers + 32 * kProducerWarps;
  static constexpr int kElem = sizeof(TIn) > sizeof(TState) ? sizeof(TIn) : sizeof(TState);
  static constexpr int kPiece = kChans * kElem;  // bytes of one entry's kv (or score) slice
  static constexpr int kStageBytes = 2 * W * kPiece;
  static constexpr int kRingBytes = 192 * 1024;
  static constexpr int kStages = kRingBytes / kStageBytes;
  static_assert(C::kSplit == 16 && C::kPerSplit == 8 && kConsumerWarps == C::kSplit && C::kTeamThreads == 512 &&
                    C::kPerSplit % kBatch == 0 && kChans % 32 == 0,
                "the streaming pass runs pass 1's splits: one warp per split of 8 entries");
  static_assert(kStages >= 2 && kPiece % 16 == 0, "ring stages");
};

// A stage's row, written by the producer before it arrives on the stage's `full` barrier.
struct StreamRow {
  int64_t out_row;
  int64_t merge_slot;  // online: the prior state's slot (-1: none)
  int32_t valid;
  int32_t lo, hi;      // live entries [lo, hi) (regular: [0, 128); online: the segment)
  int32_t buf_len;     // regular: entries [0, buf_len) come from the state
};

template <class C>
struct StreamSmem {
  using S = StreamCfg<C>;
  float m[2][C::kSplit][S::kChans];  // split partials, by the parity of the block's valid rows
  float s[2][C::kSplit][S::kChans];
  float n[2][C::kSplit][S::kChans];
  uint64_t full[S::kStages];   // the producer warps' arrivals + the stage's bulk-copy bytes
  uint64_t empty[S::kStages];  // one arrival per consumer warp
  StreamRow row[S::kStages];
};

template <class C>
inline constexpr unsigned kStreamSmemBytes = StreamCfg<C>::kRingBytes + sizeof(StreamSmem<C>);

template <class C>
__global__ void __launch_bounds__(StreamCfg<C>::kThreads, 1) stream_prefill_kernel(const CompressArgs a) {
  using S = StreamCfg<C>;
  using TIn = typename C::TIn;
  using TState = typename C::TState;
  using TOut = typename C::TOut;
  constexpr bool kSame = std::is_same_v<TIn, TState>;
  constexpr int B = C::kPerSplit;
  extern __shared__ __align__(128) uint8_t stream_smem[];
  uint8_t* ring = stream_smem;
  auto& sm = *reinterpret_cast<StreamSmem<C>*>(stream_smem + S::kRingBytes);

  const int rank = static_cast<int>(blockIdx.x % S::kSlices);
  const int64_t groups = gridDim.x / S::kSlices;
  const int64_t first = blockIdx.x / S::kSlices;
  const int chan0 = rank * S::kChans;
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    for (int i = 0; i < S::kStages; ++i) {
      mbar_init(&sm.full[i], S::kProducerWarps);
      mbar_init(&sm.empty[i], S::kConsumerWarps);
    }
    mbar_init_fence();
  }
  __syncthreads();
  pdl_warm_params(warm_fold(a));
  pdl_wait();
  pdl_launch_dependents();  // the write pass loads its rows, then waits for this whole grid

  if (tid >= S::kConsumers) {  // producer warp pw: its lane 0 issues the copies of its entries
    if (tid % 32 != 0) return;
    const int pw = (tid - S::kConsumers) / 32;
    const int e_lo = pw * S::kProducerEntries, e_hi = e_lo + S::kProducerEntries;
    const auto* plan = reinterpret_cast<const CompressPlan*>(a.plan);
    const auto* input = static_cast<const TIn*>(a.input);
    const auto* state = static_cast<const TState*>(a.state);
    // The plan row of the next iteration is loaded before this one waits for its stage, so a
    // freed stage is refilled without a global-memory round trip first.
    CompressPlan next = first < a.rows ? plan[first] : CompressPlan{};
    int it = 0;
    for (int64_t k = first; k < a.rows; k += groups, ++it) {
      const int st = it % S::kStages;
      const CompressPlan p = next;
      if (k + groups < a.rows) next = plan[k + groups];
      mbar_wait(&sm.empty[st], ((it / S::kStages) & 1) ^ 1);
      const bool valid = p.seq_len != kInvalidU32;
      // The window as pass 1 resolves it (compress_prefill.cuh): entry e reads input row
      // q_first + e, or (regular, e < buf_len) state row 128 page1 + e.
      StreamRow row{k, -1, valid ? 1 : 0, 0, S::W, 0};
      int64_t q_first = static_cast<int64_t>(p.ragged_id) - (S::W - 1);
      if (valid) {
        if constexpr (C::kOnline) {
          const int end = static_cast<int>((p.seq_len - 1u) % 128u) + 1;
          const int off = end - static_cast<int>(p.buffer_len);
          const int64_t slot = p.read_page_1 >= 0 ? p.read_page_1 : p.read_page_0;
          row.lo = off;
          row.hi = end;
          row.merge_slot = (off != 0 && slot >= 0) ? slot : -1;
          q_first = static_cast<int64_t>(p.ragged_id) - end + 1;
        } else {
          row.buf_len = p.buffer_len;
        }
      }
      if (pw == 0) sm.row[st] = row;
      if (!valid) {
        mbar_arrive(&sm.full[st]);
        continue;
      }
      // This warp's live entries [a_lo, a_hi): [a_lo, s_hi) from the state, [s_hi, a_hi) from the input.
      const int a_lo = max(e_lo, row.lo);
      const int a_hi = max(a_lo, min(e_hi, row.hi));
      const int s_hi = min(max(row.buf_len, a_lo), a_hi);
      constexpr uint32_t kStBytes = S::kChans * sizeof(TState), kInBytes = S::kChans * sizeof(TIn);
      mbar_arrive_expect(&sm.full[st], 2u * ((s_hi - a_lo) * kStBytes + (a_hi - s_hi) * kInBytes));
      uint8_t* kv = ring + st * S::kStageBytes;
      uint8_t* sc = kv + S::W * S::kPiece;
      const TState* srow = state + (static_cast<int64_t>(p.read_page_1) * S::W + a_lo) * C::kStateWidth + chan0;
      for (int e = a_lo; e < s_hi; ++e, srow += C::kStateWidth) {
        bulk_copy_g2s(kv + e * S::kPiece, srow, kStBytes, &sm.full[st]);
        bulk_copy_g2s(sc + e * S::kPiece, srow + C::H, kStBytes, &sm.full[st]);
      }
      const TIn* irow = input + (q_first + s_hi) * C::kInWidth + chan0;
#pragma unroll 4
      for (int e = s_hi; e < a_hi; ++e, irow += C::kInWidth) {
        bulk_copy_g2s(kv + e * S::kPiece, irow, kInBytes, &sm.full[st]);
        bulk_copy_g2s(sc + e * S::kPiece, irow + C::H, kInBytes, &sm.full[st]);
      }
    }
    return;
  }

  // Consumers.
  const int u = tid, split = u / 32, v = u % 32;
  const int e0 = split * B;
  Vec<TIn, 2> bias[B];
  const TIn* ape = static_cast<const TIn*>(a.ape) + static_cast<int64_t>(e0) * C::H + chan0 + 2 * v;
#pragma unroll
  for (int j = 0; j < B; ++j) bias[j] = load_vec<TIn, 2>(ape + j * C::H);
  int it = 0, pooled = 0;  // pooled: valid rows so far (the partials' buffer parity)
  for (int64_t k = first; k < a.rows; k += groups, ++it) {
    const int st = it % S::kStages;
    mbar_wait(&sm.full[st], (it / S::kStages) & 1);
    const StreamRow r = sm.row[st];
    if (!r.valid) {  // zeros (kNone rows that close no window)
      lane32_sync();
      if (v == 0) mbar_arrive(&sm.empty[st]);
      if (u < S::kChans) static_cast<TOut*>(a.out)[k * C::H + chan0 + u] = from_float<TOut>(0.f);
      continue;
    }
    const int par = pooled++ & 1;
    // Entry e0 + j of this thread's split: its kv slice at kvb + j kPiece, score W kPiece further;
    // channel 2v at 2v elements of the entry's own type.
    const uint8_t* kvb = ring + st * S::kStageBytes + e0 * S::kPiece;
    const uint8_t* scb = kvb + S::W * S::kPiece;
    constexpr int kInOff = 2 * sizeof(TIn), kStOff = 2 * sizeof(TState);
    constexpr int NB = S::kBatch;
    // pool_entries' batches: the first replaces the empty running state, the others merge into
    // it. A state entry is rounded to TIn as it is read (fold_batch's via<TIn> for a state
    // entry), so it folds as an input entry (kind 1); kind 0: padding (online segments).
    Acc acc[2];
#pragma unroll
    for (int b0 = 0; b0 < B; b0 += NB) {
      int kind[NB];
      Vec<TIn, 2> in_kv[NB] = {}, in_sc[NB] = {}, bias_b[NB];
      const Vec<TState, 2> unused[NB] = {};  // (fold_batch's state operands: never read)
#pragma unroll
      for (int t = 0; t < NB; ++t) {
        const int j = b0 + t, e = e0 + j;
        const bool live = !C::kOnline || (e >= r.lo && e < r.hi);
        kind[t] = live ? 1 : 0;
        bias_b[t] = bias[j];
        if (!live) continue;
        if (kSame || e >= r.buf_len) {
          in_kv[t] = load_vec<TIn, 2>(reinterpret_cast<const TIn*>(kvb + j * S::kPiece + v * kInOff));
          in_sc[t] = load_vec<TIn, 2>(reinterpret_cast<const TIn*>(scb + j * S::kPiece + v * kInOff));
        } else {
          const Vec<TState, 2> x = load_vec<TState, 2>(reinterpret_cast<const TState*>(kvb + j * S::kPiece + v * kStOff));
          const Vec<TState, 2> y = load_vec<TState, 2>(reinterpret_cast<const TState*>(scb + j * S::kPiece + v * kStOff));
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            in_kv[t].v[i] = from_float<TIn>(to_float(x.v[i]));
            in_sc[t].v[i] = from_float<TIn>(to_float(y.v[i]));
          }
        }
      }
      fold_batch<PairCfg<C>>(kind, in_kv, in_sc, unused, unused, bias_b, b0 == 0, acc);
    }
    lane32_sync();
    if (v == 0) mbar_arrive(&sm.empty[st]);  // the warp's reads of the stage are done
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      sm.m[par][split][2 * v + i] = acc[i].m;
      sm.s[par][split][2 * v + i] = acc[i].s;
      sm.n[par][split][2 * v + i] = acc[i].n;
    }
    named_sync<1, S::kConsumers>();
    // pool_row's combine, one thread per channel (warps 0-1): the kLanes lanes' merges of splits
    // l, l + kLanes, ..., then the xor butterfly as lane 0 sees it (at mask m, lane l < m merges
    // lane l + m's value into its own), every merge with pool_row's operand order.
    constexpr int L = S::kLanes;
    if (u < S::kChans) {  // whole warps
      const int ch = u;
      Acc q[L];
#pragma unroll
      for (int l = 0; l < L; ++l) {
        q[l] = acc_empty();
#pragma unroll
        for (int sp = l; sp < C::kSplit; sp += L) {
          q[l] = acc_merge<C::kFastExp>(q[l], Acc{sm.m[par][sp][ch], sm.s[par][sp][ch], sm.n[par][sp][ch]});
        }
      }
#pragma unroll
      for (int mask = L / 2; mask >= 1; mask /= 2) {
#pragma unroll
        for (int l = 0; l < mask; ++l) q[l] = acc_merge<C::kFastExp>(q[l], q[l + mask]);
      }
      RowTarget t{};
      t.emit = true;
      t.out_row = r.out_row;
      t.merge_slot = r.merge_slot;
      t.state_slot = -1;
      const Acc fin[1] = {q[0]};
      const Prior<1> prior = load_prior<C, 1>(t, a, chan0 + ch);
      finish_channels<C, 1>(t, a, nullptr, chan0 + ch, fin, prior);
    }
  }
}

// Whether the streaming pass takes a plan: its rows must be dense in the call's tokens (at most
// one row per 64 input rows, plus 64). A padded plan (CUDA-graph prefill: one row per token,
// nearly all invalid) stays with pass 1's grid, whose blocks skip an invalid row each; the
// persistent grid would walk the invalid rows one ring stage at a time.
inline bool stream_prefill_fits(const CompressArgs& a) { return a.rows <= a.input_rows / 64 + 64; }

// Launch the streaming pass: the persistent grid, one block per SM, a multiple of 8 blocks and at
// most 8 per row.
template <class C>
gpuError_t launch_stream_prefill(const CompressArgs& a, gpuStream_t stream) {
#if FC_GPU_HIP
  (void)a;
  (void)stream;
  return gpuSuccess;  // never instantiated on HIP (kStreamable)
#else
  using S = StreamCfg<C>;
  constexpr int kMaxDevices = 64;
  static std::atomic<int> sms_of[kMaxDevices] = {};  // 0: not yet set up on that device
  int dev = 0;
  gpuError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  int sms = dev >= 0 && dev < kMaxDevices ? sms_of[dev].load(std::memory_order_relaxed) : 0;
  if (sms <= 0) {
    e = cudaFuncSetAttribute(stream_prefill_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(kStreamSmemBytes<C>));
    if (e != cudaSuccess) return e;
    e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
    if (dev >= 0 && dev < kMaxDevices) sms_of[dev].store(sms, std::memory_order_relaxed);
  }
  int64_t grid = (sms / S::kSlices) * S::kSlices;
  if (grid < S::kSlices) grid = S::kSlices;
  if (grid > a.rows * S::kSlices) grid = a.rows * S::kSlices;
  return launch_kernel(stream_prefill_kernel<C>,
                       {static_cast<unsigned>(grid), S::kThreads, kStreamSmemBytes<C>, 1, kPdlLaunch}, stream, a);
#endif
}

}  // namespace compress
}  // namespace flashcompress
