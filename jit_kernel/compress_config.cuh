// flashcompress: compress family, the configuration of one variant and one pass (Cfg): element
// types, widths, and the tiling of a row over threads, teams and blocks.
//
// A "team" computes one row's slice of kChans channels: thread (split s, vector v) owns channels
// kVecW*v .. kVecW*v + kVecW-1 of the slice and window entries [s*W/kSplit, (s+1)*W/kSplit),
// kBatch entries' loads in flight at a time. With one split the thread finishes its channels; otherwise kLanes threads per
// channel merge the splits' partials. kCSplit = H / kChans blocks share a row (a cluster when
// the row is stored):
//   C4 H=512: 128 threads, whole row, 8 entries each   C4 H=128: 4 teams of 32 threads
//   C128 decode: 512 threads, kChans 64, 32 splits of 4 entries (8 blocks per row)
//   C128 prefill: 512 threads, kChans 64, 2 channels x 8 entries per thread, all 8 entries in
//                 one burst of loads (16 splits; 8 blocks per row)
//   online prefill, stored (a cluster): 512 threads, kChans 128, 16 splits of 8 entries loaded
//                 2 at a time (4 blocks per row)
//   online prefill, not stored (kSpread: pass 1 of compress_forward, the write list): 128
//                 threads, kChans 32, 16 splits of 8 entries whose loads are one burst (kLoadBatch
//                 8), folded 2 at a time as the stored tiling does (16 blocks per row)
//   online decode: 128 threads, whole row, 1 entry
//   C128 whole row (no clusters, or Tiling::kWholeRow): 512 threads, 4 splits of 32 entries
//   Tiling::kClosing: kAuto's tiling (its C128 decode kernel: compress_decode_closing.cuh)
#pragma once

#include <cstdint>

#include "arch.cuh"
#include "compress_launch.h"
#include "layout.h"
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

  static constexpr int W = static_cast<int>(window_size(kRatio));  // window entries (layout.h)
  static constexpr int kInWidth = static_cast<int>(input_width(kRatio, H));
  static constexpr int kStateWidth = static_cast<int>(state_width(kRatio, H, kOnline));
  static_assert(is_layer_kind(kRatio, H, kOnline), "not a compressor layer kind (layout.h kLayerKinds)");

  // Tiling (the table in the file header; why: docs/kernel-design.md).
  static constexpr bool kOnlineDecode = kOnline && kDecode;
  static constexpr bool kWide = kRatio == 128 && !kOnlineDecode;
  // One block per C128 row without clusters, stored or not: both paths pool in one order.
  static constexpr bool kWholeRow = (!kHasClusters || kTiling == Tiling::kWholeRow) && kWide;
  // Tiling::kClosing: decode-only kernels (the rest of the tiling is kAuto's): the closing-list
  // C128 decode at every batch size. kAuto runs the same designs (kClosingDecode) except for
  // regular C128 batches of <= kC128BurstMaxRows requests, which take the per-slice kernel.
  static constexpr bool kClosingTiling = kTiling == Tiling::kClosing;
  static constexpr bool kClosingDecode = kClosingTiling || kTiling == Tiling::kAuto;
  // The online prefill passes that store no cache row (pass 1 of compress_forward, the write
  // list; no cluster needed): 16 blocks of 32 channels per segment, each thread's 8 entries
  // loaded in one burst. Every channel sees the stored pass's sequence of operations (8 entries
  // per split folded 2 at a time, 16 splits combined by kLanes = kSplit / kVecW = 4 lanes), so
  // out rows and state bytes equal the stored variant's. Where rows are whole (no clusters) both
  // keep that tiling.
  static constexpr bool kSpread = kOnline && !kDecode && !kStoreRows && kWide && !kWholeRow;
  // C128 / online prefill over several blocks per row: 2 channels per thread (8-byte loads), so
  // a thread's 8 entries (kv, score, bias: 48 registers) are loaded in one burst under the
  // 64-register cap of two 512-thread blocks per SM.
  // (Not the online prefill: at 2 channels x 8 entries under that cap its window bounds and
  // prior spill 40-68 B, fast exp or not; it spreads 4 channels x 8 entries instead, kSpread.)
  static constexpr bool kNarrow = kWide && !kDecode && !kWholeRow && !kOnline;
  static constexpr int kChans = (!kWide || kWholeRow) ? H : (kSpread ? 32 : ((kDecode || kNarrow) ? 64 : 128));
  static constexpr int kVecW = kNarrow ? 2 : 4;  // channels per thread
  static constexpr int kCSplit = H / kChans;  // blocks per row (a cluster when storing rows)
  static constexpr int kEntries = kOnlineDecode ? 1 : W;
  static constexpr int kSplit = !kWide ? 1 : (kWholeRow ? 4 : (kDecode ? 32 : 16));
  static constexpr int kPerSplit = kEntries / kSplit;
  // Entries folded into the running softmax together (their max, then their exp-sums), and
  // entries whose loads are in flight together (registers: 3 x kVecW values per entry): the same
  // except under kSpread, whose split is one burst of loads folded in batches of 2.
  static constexpr int kBatch = kPerSplit < 4 ? kPerSplit : (kNarrow ? kPerSplit : (kWide ? 2 : (kDecode ? 8 : 4)));
  static constexpr int kLoadBatch = kSpread ? kPerSplit : kBatch;
  static constexpr int kVecs = kChans / kVecW;             // channel vectors per slice
  static constexpr int kTeamThreads = kVecs * kSplit;
  static constexpr int kTeams = kTeamThreads >= 128 ? 1 : 128 / kTeamThreads;
  static constexpr int kThreads = kTeams * kTeamThreads;
  // Resident blocks the register budget must allow: two 512-thread blocks, six C4 prefill
  // blocks; C4 decode four per SM on CUDA (<= 128 registers: a 512-request batch is one request
  // per team), no bound on HIP.
  // kSpread: four 128-thread blocks (<= 128 registers for the burst of 8 entries).
  static constexpr int kBlocksPerSm = kThreads >= 512 ? 2 : (kRatio == 4 ? (kDecode ? 4 : 6) : (kSpread ? 4 : 1));
  static constexpr int kBlocksPerCu = kRatio == 4 && kDecode ? 1 : kBlocksPerSm;
  static constexpr int kMinBlocks = launch_min_blocks(kBlocksPerSm, kBlocksPerCu, kThreads);
  // Load batches of a split unrolled at once: all, except the 16 of a whole-row split (they spill).
  static constexpr int kUnroll = kWholeRow ? 1 : kPerSplit / kLoadBatch;
  static constexpr bool kCluster = kCSplit > 1 && kStoreRows;
  // Programmatic dependent launch: C4 decode (its grid fills every block slot) triggers right
  // after its wait; the other kernels once a block is done (ptx.cuh pdl_enter / pdl_leave).
  static constexpr bool kPdlEarly = kDecode && kRatio == 4;
  // Combining the splits: kLanes consecutive threads per channel, each merging kSplit / kLanes
  // partials, then a butterfly over the kLanes lanes.
  static constexpr int kLanes = kSplit == 1 ? 1 : kTeamThreads / kChans;
  // Pooling uses the fast exp (ex2.approx, as SGLang's fast-math modules do), the online prefill
  // passes included: one pass over at most 128 entries, whose state stays within the 1e-6 of the
  // reference that test_gpu_compress holds it to. Online decode, which folds one token per call
  // into a running sum kept across calls, keeps the accurate expf, and so does the merge of a
  // segment with its prior state (merge_channel).
  static constexpr bool kFastExp = !kOnline || !kDecode;
  // Decode copies the block's share of every request's input row (kCopyVecs vectors) into the
  // state: C4 from registers (compress_decode_c4.cuh, which also loads its bias rows straight
  // into registers), C128 all the team's requests up front (copy_rows_share). A one-block store
  // stages its weight and RoPE operands in shared memory (kStageOps); a cluster block loads its
  // slice's operands in the epilogue.
  static constexpr bool kCopyRows = kDecode && !kOnline;
  static constexpr int kCopyVecs = kInWidth / 4 / kCSplit;
  static constexpr bool kStageOps = kStoreRows && !kCluster;
  // A one-block store of a 512-dim row: warp j stores 128-dim block j when the team has a warp
  // per block (C4 head 512, online decode, whole-row C128); else warp 0 stores the row.
  static constexpr bool kSlicedStore = kStageOps && H > 128 && kTeams == 1 && kTeamThreads >= 32 * (H / 128);
  static constexpr int kStoreWarps = kSlicedStore ? H / 128 : 1;

  static_assert(H % 128 == 0 && H % kChans == 0 && kChans % kVecW == 0, "head dim: a multiple of 128");
  static_assert(kLanes >= 1 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0 &&
                    kSplit % kLanes == 0, "split combine lanes");
  static_assert(kEntries % kSplit == 0, "window entries must split evenly");
  static_assert(kPerSplit % kLoadBatch == 0 && kLoadBatch % kBatch == 0, "entries of a split must batch evenly");
  static_assert(!kSpread || (kLanes == 4 && kSplit == 16 && kBatch == 2 && kTeams == 1),
                "kSpread combines as the stored online prefill does");
  static_assert(kTeams == 1 || kTeamThreads == 32, "multi-team blocks use one warp per team");
  static_assert(kThreads <= 1024, "block too large");
  static_assert(!kOnline || (kRatio == 128 && kIn == DType::kF32 && kOut == DType::kF32),
                "online compression is ratio 128 with fp32 input and output");
  static_assert(kHasClusters || !kCluster, "no thread block clusters on this target: store variants need kCSplit 1");
};

}  // namespace compress
}  // namespace flashcompress
