// flashcompress: compress family, the pooling both phases share: the running softmax (Acc), one
// row's window (Window: which entries come from the state, which from the input), the batched
// window loads (pool_entries), the block's shared memory (Smem) and the row pipeline pool ->
// combine splits (-> online merge) -> emit / state store (pool_row).
//
// Pooling, per channel c (torch_backend/compress.py is the reference): logit_e = score_e[c] +
// ape[bias row of e][c], out[c] = sum_e softmax(logit)_e * kv_e[c] over the W window entries.
// A state value is converted TState -> TIn -> fp32, an input value TIn -> fp32, the result
// fp32 -> TOut.
#pragma once

#include <cstdint>
#include <type_traits>

#include "arch.cuh"
#include "compress_config.cuh"
#include "plan.cuh"
#include "ptx.cuh"
#include "store.cuh"
#include "vec.cuh"

namespace flashcompress {
namespace compress {

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

// The softmax partial of N live entries whose maximum logit is m: (m, sum of exp(lg - m), sum of
// exp(lg - m) * kv), both sums in entry order; m = -inf (every logit -inf) subtracts 0.
template <bool kFast, int N>
__device__ __forceinline__ Acc softmax_partial(const float (&lg)[N], const float (&kv)[N], float m) {
  const float ms = m == -INFINITY ? 0.f : m;
  float s = 0.f, n = 0.f;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const float e = exp_<kFast>(lg[j] - ms);
    s += e;
    n = fmaf(e, kv[j], n);
  }
  return Acc{m, s, n};
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

// Fold one batch of loaded entries into the running state, channel by channel: the logits, their
// max, then exp-sum and weighted sum. kind[k]: 0 = padding, 1 = input row, 2 = state row (its
// values converted TState -> TIn at load: load_entry), 3 = the state row this launch writes (read
// from its input row, rounded through TState). `first`: the running state is still empty
// (prefill's first batch), so the batch's partial replaces it (merging it into the empty state
// would give the same bits: acc_merge).
template <class C, int B, class RawIn>
__device__ __forceinline__ void fold_batch(const int (&kind)[B], const RawIn (&in_kv)[B], const RawIn (&in_sc)[B],
                                           const RawIn (&bias)[B], bool first, Acc (&acc)[C::kVecW]) {
  using TIn = typename C::TIn;
  using TState = typename C::TState;
#pragma unroll
  for (int i = 0; i < C::kVecW; ++i) {
    float kv[B], lg[B];
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < B; ++k) {
      if (kind[k] == 3) {
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
    if (first) {
      acc[i] = Acc{m, s, n};
    } else {
      acc[i] = acc_merge<C::kFastExp>(acc[i], Acc{m, s, n});
    }
  }
}

// Entry values of channels c..c+kVecW-1 (kv at column kc, score at sc) of a state row (kind 2)
// or an input row (kind 1, 3) into TIn vectors. A state value is converted TState -> TIn as it
// is loaded (the value the peer's mixed kernels pool), so every entry holds one TIn vector
// whatever its source; with TIn == TState the kinds differ only in the row.
template <class C>
__device__ __forceinline__ void load_entry(int kind, const typename C::TState* st_row, const typename C::TIn* in_row,
                                           int kc, int sc, Vec<typename C::TIn, C::kVecW>& kv,
                                           Vec<typename C::TIn, C::kVecW>& score) {
  using TIn = typename C::TIn;
  using TState = typename C::TState;
  constexpr int V = C::kVecW;
  if constexpr (std::is_same_v<TIn, TState>) {
    const TIn* src = kind == 2 ? reinterpret_cast<const TIn*>(st_row) : in_row;
    if (kind != 0) {
      kv = load_vec<TIn, V>(src + kc);
      score = load_vec<TIn, V>(src + sc);
    }
  } else if (kind == 2) {
    const Vec<TState, V> skv = load_vec<TState, V>(st_row + kc), ssc = load_vec<TState, V>(st_row + sc);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      kv.v[i] = from_float<TIn>(to_float(skv.v[i]));
      score.v[i] = from_float<TIn>(to_float(ssc.v[i]));
    }
  } else if (kind != 0) {
    kv = load_vec<TIn, V>(in_row + kc);
    score = load_vec<TIn, V>(in_row + sc);
  }
}

// Prefill, one load batch: entries e0 + b0 + k (k < kLoadBatch) of channels c..c+kVecW-1 from
// the row pointers of pool_entries (entry e0 + j of the input is j rows past in_e0; of the state,
// j rows past st_a, or for C4 entry e of the state e rows past st_a / e - 4 + 4 rows past st_b),
// folded kBatch entries at a time in entry order (fold_batch; the first fold replaces the empty
// state), so the load batch sets only how many loads are in flight, never the arithmetic.
// kInputOnly: the batch starts at or past buf_len (the common case; uniform over a warp), so no
// entry needs a choice of its source row.
template <class C, bool kInputOnly>
__device__ __forceinline__ void pool_batch(const Window& w, const int e0, const int b0,
                                           const typename C::TState* st_a, const typename C::TState* st_b,
                                           const typename C::TIn* __restrict__ in_e0,
                                           const typename C::TIn* __restrict__ bias_e0, Acc (&acc)[C::kVecW]) {
  using TIn = typename C::TIn;
  using TState = typename C::TState;
  constexpr int V = C::kVecW;
  constexpr int B = C::kLoadBatch;
  // Regular C128 windows have no padding entries (every entry of [0, W) is live).
  constexpr bool kAllLive = C::kRatio == 128 && !C::kOnline;
  int kind[B];
  Vec<TIn, V> in_kv[B], in_sc[B], bias[B];
#pragma unroll
  for (int k = 0; k < B; ++k) {
    const int j = b0 + k, e = e0 + j;  // C4: e0 == 0, so e is a constant too
    const bool live = kAllLive || (e >= w.lo && e < w.hi);
    const bool from_state = !kInputOnly && e < w.buf_len;
    const TState* st_row = (C::kRatio == 4 && e >= 4 ? st_b : st_a) + static_cast<int64_t>(C::kRatio == 4 ? e : j) * C::kStateWidth;
    const TIn* in_row = in_e0 + static_cast<int64_t>(j) * C::kInWidth;
    kind[k] = !live ? 0 : (!from_state ? 1 : 2);
    load_entry<C>(kind[k], st_row, in_row, kv_col<C>(e), score_col<C>(e), in_kv[k], in_sc[k]);
    if (kind[k] != 0) bias[k] = load_vec<TIn, V>(bias_e0 + j * C::H);
  }
  if constexpr (B == C::kBatch) {
    fold_batch<C>(kind, in_kv, in_sc, bias, b0 == 0, acc);
  } else {
    constexpr int F = C::kBatch;
#pragma unroll
    for (int f = 0; f < B; f += F) {
      int fk[F];
      Vec<TIn, V> fkv[F], fsc[F], fb[F];
#pragma unroll
      for (int k = 0; k < F; ++k) {
        fk[k] = kind[f + k];
        fkv[k] = in_kv[f + k];
        fsc[k] = in_sc[f + k];
        fb[k] = bias[f + k];
      }
      fold_batch<C>(fk, fkv, fsc, fb, b0 + f == 0, acc);
    }
  }
}

// Accumulate this thread's entries [e0, e0 + kPerSplit) for channels c..c+kVecW-1, kLoadBatch
// entries at a time: every load of a batch is issued before the first one is used (the addresses
// depend only on the plan row), so a thread waits for one memory round trip per batch, not per
// entry.
template <class C>
__device__ __forceinline__ void pool_entries(const Window& w, int e0, int c,
                                             const typename C::TState* state,
                                             const typename C::TIn* __restrict__ input,
                                             const typename C::TIn* __restrict__ ape,
                                             Acc (&acc)[C::kVecW]) {
  using TIn = typename C::TIn;
  using TState = typename C::TState;
  constexpr int V = C::kVecW;
  constexpr int B = C::kBatch;
  static_assert(C::kDecode || C::kLoadBatch % B == 0, "prefill load batches fold in kBatch entries");
  static_assert(!C::kDecode || C::kLoadBatch == B, "decode loads and folds the same batches");
  static_assert(C::kRatio == 128 || C::kSplit == 1, "C4 indexes its state rows by entry: one split (e0 == 0)");
  const TIn* bias_e0 = ape + static_cast<int64_t>(C::kOnlineDecode ? w.bias_base : e0) * C::H + c;
  if constexpr (!C::kDecode) {
    // Prefill: row pointers at channel c, set once per row, so entry e0 + j reads j rows past
    // them (constant offsets once the batch loop unrolls). State rows: C128 the page (st_a,
    // entry e at row 128 page1 + e); C4 the overlap page (st_a, e < 4) and the own page (st_b,
    // e >= 4, row 4 page1 + e - 4). Input rows: q_first + e.
    const TState* st_a = state + (C::kRatio == 4 ? w.page0 * 4 : w.page1 * 128 + e0) * C::kStateWidth + c;
    const TState* st_b = state + (w.page1 * 4 - 4) * C::kStateWidth + c;
    const TIn* in_e0 = input + (w.q_first + e0) * C::kInWidth + c;
#pragma unroll C::kUnroll
    for (int b0 = 0; b0 < C::kPerSplit; b0 += C::kLoadBatch) {
      if (e0 + b0 >= w.buf_len) {
        pool_batch<C, true>(w, e0, b0, st_a, st_b, in_e0, bias_e0, acc);
      } else {
        pool_batch<C, false>(w, e0, b0, st_a, st_b, in_e0, bias_e0, acc);
      }
    }
    return;
  }
  // Decode computes each entry's rows as it goes (fewer live registers, and the entry this
  // launch writes, self_row, is found by its row).
#pragma unroll C::kUnroll
  for (int b0 = 0; b0 < C::kPerSplit; b0 += B) {
    int kind[B];
    Vec<TIn, V> in_kv[B], in_sc[B], bias[B];
#pragma unroll
    for (int k = 0; k < B; ++k) {
      const int j = b0 + k, e = e0 + j;
      const bool live = e >= w.lo && e < w.hi;
      const bool from_state = e < w.buf_len;
      const int64_t srow = from_state ? state_row_of<C>(w, e) : 0;
      const bool self = from_state && srow == w.self_row;
      const TState* st_row = state + srow * C::kStateWidth;
      const TIn* in_row = input + (self ? w.self_in : w.q_first + e) * C::kInWidth;
      kind[k] = !live ? 0 : (!from_state ? 1 : (self ? 3 : 2));
      load_entry<C>(kind[k], st_row, in_row, kv_col<C>(e) + c, score_col<C>(e) + c, in_kv[k], in_sc[k]);
      if (kind[k] != 0) bias[k] = load_vec<TIn, V>(bias_e0 + (C::kOnlineDecode ? 0 : j * C::H));
    }
    fold_batch<C>(kind, in_kv, in_sc, bias, false, acc);
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
  // One-block store: the weight / RoPE operands, staged by async copies (kStageOps).
  store::StagedOperands<C::kStageOps ? C::H / 128 : 1> ops[C::kStageOps ? C::kTeams : 1];
  double part[C::kStoreWarps];  // sliced store: each warp's sum of squares
};

template <class C>
__device__ __forceinline__ void team_sync() {
  if constexpr (C::kTeams == 1) {
    __syncthreads();
  } else {
    lane32_sync();  // a multi-team block has one warp per team (teams may diverge)
  }
}

// The bias rows pool_entries reads (global memory).
template <class C>
__device__ __forceinline__ const typename C::TIn* bias_rows(const CompressArgs& a) {
  return static_cast<const typename C::TIn*>(a.ape);
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

// Hand kN consecutive channels' values from c to the store epilogue (the row in shared memory),
// or write them to `out`: one kN-wide store (the binding checks that `out` is aligned to 4
// elements; c is a multiple of kN), so a warp writes whole 32-byte sectors.
template <class C, int kN>
__device__ __forceinline__ void emit_channels(const RowTarget& t, const CompressArgs& a, float* row, int c,
                                              const Fin (&f)[kN]) {
  using TOut = typename C::TOut;
  if constexpr (C::kStoreRows) {
#pragma unroll
    for (int i = 0; i < kN; ++i) row[c + i] = to_float(from_float<TOut>(f[i].k));
  } else if constexpr (C::kPass != Pass::kOnlineWrite) {
    Vec<TOut, kN> o;
#pragma unroll
    for (int i = 0; i < kN; ++i) o.v[i] = from_float<TOut>(f[i].k);
    store_vec<TOut, kN>(static_cast<TOut*>(a.out) + t.out_row * C::H + c, o);
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
  emit_channels<C, kN>(t, a, row, c, f);
}

template <class C>
__device__ void pool_row(const Window& w, const RowTarget& t, const CompressArgs& a,
                         Smem<C>& sm, int team, int u, int rank) {
  using TIn = typename C::TIn;
  using TState = typename C::TState;
  const auto* state = static_cast<const TState*>(a.state);
  const auto* input = static_cast<const TIn*>(a.input);
  const TIn* ape = bias_rows<C>(a);
  const int chan0 = rank * C::kChans;
  float* row = C::kStoreRows ? &sm.row[team][0] : nullptr;

  // Phase 1: each (split, vector) thread pools its entries for kVecW channels.
  constexpr int V = C::kVecW;
  const int v = u % C::kVecs, split = C::kSplit == 1 ? 0 : u / C::kVecs;
  Acc acc[V];
#pragma unroll
  for (int i = 0; i < V; ++i) acc[i] = acc_empty();

  if constexpr (C::kSplit == 1) {
    // The thread holds every entry of its channels: finish them directly. An online prior is
    // loaded with the window (online decode: one entry, so the prior would otherwise cost a
    // second round trip per row).
    const Prior<V> prior = load_prior<C, V>(t, a, chan0 + V * v);
    pool_entries<C>(w, 0, chan0 + V * v, state, input, ape, acc);
    finish_channels<C, V>(t, a, row, chan0 + V * v, acc, prior);
  } else {
    // Online prefill: the prior of phase 2's channel (u / kLanes, finished by lane 0 of the
    // kLanes threads) is loaded with the window, one round trip less for a merging row.
    constexpr bool kEarlyPrior = !C::kDecode && C::kOnline && !C::kStoreRows;  // (stored: spills)
    Prior<1> prior{};
    if constexpr (kEarlyPrior) {
      if (u % C::kLanes == 0) prior = load_prior<C, 1>(t, a, chan0 + u / C::kLanes);
    }
    pool_entries<C>(w, split * C::kPerSplit, chan0 + V * v, state, input, ape, acc);
    // Phase 2: kLanes threads per channel merge the partials of the splits, then a butterfly.
#pragma unroll
    for (int i = 0; i < V; ++i) {
      sm.m[team][split][V * v + i] = acc[i].m;
      sm.s[team][split][V * v + i] = acc[i].s;
      sm.n[team][split][V * v + i] = acc[i].n;
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
    // The online write list stores the state: only after pass 1's reads (ring rows alias).
    if constexpr (C::kPass == Pass::kOnlineWrite) pdl_wait();
    if (lane == 0) {  // decode: an online prior is loaded here (64 registers)
      const Acc fin[1] = {r};
      if constexpr (!kEarlyPrior) prior = load_prior<C, 1>(t, a, chan0 + k);
      finish_channels<C, 1>(t, a, row, chan0 + k, fin, prior);
    }
    if constexpr (C::kDecode) team_sync<C>();  // the team's next decode row reuses the partials
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

}  // namespace compress
}  // namespace flashcompress
