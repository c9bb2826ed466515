// flashcompress: stage 0 of the prefill planners on the host (spec/compressor.md §4.2, §4.6).
//
// Plain C++17, no tvm-ffi and no GPU runtime: the `plan_host` family's binding
// (plan_host_binding.h) checks the arguments and calls these functions; they assume valid
// lengths (0 < extend_lens[b] <= seq_lens[b], sum(extend_lens) <= 65536).
//
// The rows are the bytes torch_backend.plans.prefill_stage0 / online_prefill_stage0 build (the
// reference), in the same order: batch-major, then position-ascending. Request b covers the
// positions [prefix, seq) with prefix = seq - extend, and its tokens take the ragged ids
// [base, base + extend) where base is the sum of the earlier extends. Instead of testing every
// token, each rule is walked in closed form: events every r positions, page tails per page, one
// contiguous write tail, so a request costs O(rows it emits + pages it spans), without divisions
// in the inner loops.
//
// Regular (ratio r = 4 or 128; window W = 2r for r = 4, else r):
//   CompressPlan per event p (p + 1) % r == 0, j = p - prefix:
//     {seq_len p + 1, ragged_id base + j, buffer_len W - min(j + 1, W), read_page_0 -1,
//      read_page_1 b}                      (stage 1 turns the last two into state pages)
//   WritePlan per kept position p: {ragged_id (base + j) | b << 16, write_loc p + 1}
//     kept: p >= first_w = min(floor(seq / r) * r - (r == 4 ? 4 : 0), seq - mtp_write_pad)
//     and, paged C4 (r = 4, SWA pages): p % swa_page_size >= swa_page_size - 4 as well
// Online C128 (both lists in the CompressPlan layout):
//   a segment ends at every 128-chunk end and at the request's last token; it covers
//   [max(prefix, 128 * floor(p / 128)), p + 1). Chunk-closing segments go to the compress list,
//   the trailing partial one (seq % 128 != 0) to the write list:
//     {seq_len p + 1, ragged_id base + j, buffer_len segment length, read_page_0 b,
//      read_page_1 -1}
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "plan.cuh"

namespace flashcompress {
namespace plan_host {

inline constexpr int64_t kOnlineWindow = 128;

// Per-batch lengths, as the caller passes them (host memory, int64).
struct Lengths {
  const int64_t* seq_lens;
  const int64_t* extend_lens;
  int64_t batch;
};

// Rows written into each list.
struct Counts {
  int64_t compress_rows;
  int64_t write_rows;
};

// Why a batch cannot be planned (the binding turns this into the validation layer's message).
struct LengthsCheck {
  int64_t bad_request;   // first b with !(0 < extend <= seq), or -1
  int64_t total_tokens;  // sum(extend_lens) when bad_request == -1
};

inline LengthsCheck check_lengths(const Lengths& len) {
  int64_t total = 0;
  for (int64_t b = 0; b < len.batch; ++b) {
    const int64_t seq = len.seq_lens[b], ext = len.extend_lens[b];
    if (ext <= 0 || ext > seq) return {b, 0};
    total += ext;
  }
  return {-1, total};
}

inline CompressPlan compress_row(int64_t seq_len, int64_t ragged_id, int64_t buffer_len,
                                 int64_t read_page_0, int64_t read_page_1) {
  CompressPlan row;
  row.seq_len = static_cast<uint32_t>(seq_len);
  row.ragged_id = static_cast<uint16_t>(ragged_id);
  row.buffer_len = static_cast<uint16_t>(buffer_len);
  row.read_page_0 = static_cast<int32_t>(read_page_0);
  row.read_page_1 = static_cast<int32_t>(read_page_1);
  return row;
}

// Stage-0 WritePlan of position p (ragged id `ragged`) of request b.
inline WritePlan write_row(int64_t ragged, int64_t b, int64_t p) {
  WritePlan row;
  row.ragged_id = static_cast<uint32_t>(ragged | (b << 16));
  row.write_loc = static_cast<int32_t>(static_cast<uint32_t>(p + 1));
  return row;
}

// Where a regular variant keeps its state: SWA pages (paged C4) or the request ring.
struct Addressing {
  int64_t swa_page_size;
  int64_t ring_size;
  bool paged;  // ratio 4 and not use_req_ring
};

// Regular prefill stage 0 over the batch; returns the row counts. plan_c / plan_w need room for
// sum(extend_lens) rows each (an upper bound of both counts).
template <int64_t kRatio>
Counts regular_stage0(const Lengths& len, const Addressing& addr, CompressPlan* plan_c,
                      WritePlan* plan_w) {
  static_assert(kRatio == 4 || kRatio == 128, "ratio 4 or 128");
  constexpr int64_t kWindow = window_size(kRatio);
  const int64_t pad = mtp_write_pad(kRatio, addr.ring_size);
  const int64_t page = addr.swa_page_size;
  CompressPlan* out_c = plan_c;
  WritePlan* out_w = plan_w;
  int64_t base = 0;  // ragged id of the request's first token
  for (int64_t b = 0; b < len.batch; ++b) {
    const int64_t seq = len.seq_lens[b];
    const int64_t prefix = seq - len.extend_lens[b];
    const int64_t first_ragged = base - prefix;  // ragged id of position p: first_ragged + p

    // Compress events: the first p >= prefix with (p + 1) % r == 0, then every r positions.
    for (int64_t p = prefix / kRatio * kRatio + kRatio - 1; p < seq; p += kRatio) {
      const int64_t j = p - prefix;
      *out_c++ = compress_row(p + 1, first_ragged + p, kWindow - std::min(j + 1, kWindow), -1, b);
    }

    // Kept positions: page tails below first_w (paged C4), then the contiguous tail.
    const int64_t last_c = seq / kRatio * kRatio;
    const int64_t first_w = std::min(last_c - (kRatio == 4 ? 4 : 0), seq - pad);
    if (addr.paged && first_w > prefix) {
      if (page <= 4) {  // every position lies in the last 4 of its page
        for (int64_t p = prefix; p < first_w; ++p) *out_w++ = write_row(first_ragged + p, b, p);
      } else {
        for (int64_t start = prefix / page * page; start < first_w; start += page) {
          const int64_t hi = std::min(first_w, start + page);
          for (int64_t p = std::max(prefix, start + page - 4); p < hi; ++p) {
            *out_w++ = write_row(first_ragged + p, b, p);
          }
        }
      }
    }
    for (int64_t p = std::max(prefix, first_w); p < seq; ++p) {
      *out_w++ = write_row(first_ragged + p, b, p);
    }
    base += seq - prefix;
  }
  return {out_c - plan_c, out_w - plan_w};
}

// Online C128 prefill stage 0 over the batch. plan_c needs room for sum(extend_lens) rows,
// plan_w for batch rows.
inline Counts online_stage0(const Lengths& len, CompressPlan* plan_c, CompressPlan* plan_w) {
  CompressPlan* out_c = plan_c;
  CompressPlan* out_w = plan_w;
  int64_t base = 0;
  for (int64_t b = 0; b < len.batch; ++b) {
    const int64_t seq = len.seq_lens[b];
    const int64_t prefix = seq - len.extend_lens[b];
    const int64_t first_ragged = base - prefix;
    const auto segment = [&](int64_t p) {  // the segment ending at position p
      const int64_t start = std::max(prefix, p / kOnlineWindow * kOnlineWindow);
      return compress_row(p + 1, first_ragged + p, p + 1 - start, b, -1);
    };
    for (int64_t p = prefix / kOnlineWindow * kOnlineWindow + kOnlineWindow - 1; p < seq;
         p += kOnlineWindow) {
      *out_c++ = segment(p);
    }
    if (seq % kOnlineWindow != 0) *out_w++ = segment(seq - 1);
    base += seq - prefix;
  }
  return {out_c - plan_c, out_w - plan_w};
}

// ----------------------------------------------------------------------------- stage 1
// The bytes of torch_backend.plans.prefill_stage1 / online_prefill_stage1 for host tensors, in
// place. Every row is visited; sentinel rows (seq_len / ragged word 0xFFFFFFFF) stay as they
// are, and so do regular compress rows with buffer_len 0 (they read no state).
//
// State rows (spec §2.3): request ring rid * ring + p % ring; paged SWA
// swa = full_to_state[req_to_token[rid, p]], row = (swa / page) * ring + swa % ring, with C
// (truncating) division as in the reference; i32 fields take the low 32 bits.

// x / d and x % d with C truncation; shifts and masks when d is a power of two and x >= 0 (the
// common case: SWA pages of 256, rings of 8 / 16 / 128), a hardware division otherwise.
struct Divisor {
  int64_t d = 1;
  int shift = -1;  // log2(d) when d is a power of two, else -1

  Divisor() = default;
  explicit Divisor(int64_t value) : d(value) {
    if (value > 0 && (value & (value - 1)) == 0) {
      shift = 0;
      while ((int64_t{1} << shift) != value) ++shift;
    }
  }
  int64_t quo(int64_t x) const { return shift >= 0 && x >= 0 ? x >> shift : x / d; }
  int64_t rem(int64_t x) const { return shift >= 0 && x >= 0 ? x & (d - 1) : x % d; }
};

// The tables stage 1 reads (host memory, contiguous).
struct World {
  const int64_t* rids;          // [batch]
  int64_t batch;
  const int32_t* req_to_token;  // [slots, max_ctx]
  int64_t slots, max_ctx;
  const int64_t* full_to_state;  // [full_len]
  int64_t full_len;
  Divisor swa_page_size, ring_size;
  bool req_ring;
};

// State row of SWA loc `swa` (paged addressing). swa_page_size is a multiple of ring_size (the
// API checks it), so the product does not overflow.
inline int64_t swa_state_row(const World& w, int64_t swa) {
  return w.swa_page_size.quo(swa) * w.ring_size.d + w.ring_size.rem(swa);
}

// The first lookup stage 1 could not make (memory safety; the API's checks rule these out).
struct Fault {
  enum Kind { kNone, kBatch, kSlot, kPosition, kFullLoc } kind = kNone;
  int64_t row = -1;    // plan row
  int64_t value = 0;   // the offending batch index / slot / position / full loc
};

// State row of (batch index b, position p), or a fault in `fault` (then the result is 0).
inline int64_t state_row(const World& w, int64_t b, int64_t p, int64_t plan_row, Fault& fault) {
  if (b < 0 || b >= w.batch) {
    fault = {Fault::kBatch, plan_row, b};
    return 0;
  }
  const int64_t rid = w.rids[b];
  if (w.req_ring) return rid * w.ring_size.d + w.ring_size.rem(p);
  if (rid < 0 || rid >= w.slots) {
    fault = {Fault::kSlot, plan_row, rid};
    return 0;
  }
  if (p < 0 || p >= w.max_ctx) {
    fault = {Fault::kPosition, plan_row, p};
    return 0;
  }
  const int64_t full = w.req_to_token[rid * w.max_ctx + p];
  if (full < 0 || full >= w.full_len) {
    fault = {Fault::kFullLoc, plan_row, full};
    return 0;
  }
  return swa_state_row(w, w.full_to_state[full]);
}

// Regular stage 1 over `rows_c` compress rows and `rows_w` write rows; stops at the first fault.
template <int64_t kRatio>
Fault regular_stage1(const World& w, CompressPlan* plan_c, int64_t rows_c, WritePlan* plan_w,
                     int64_t rows_w) {
  Fault fault;
  for (int64_t i = 0; i < rows_c; ++i) {
    CompressPlan& row = plan_c[i];
    if (row.seq_len == 0xFFFFFFFFu || row.buffer_len == 0) continue;
    const int64_t b = row.read_page_1;
    const int64_t p1 = static_cast<int64_t>(row.seq_len) - 1;
    const int64_t p0 = std::max<int64_t>(p1 - kRatio, 0);
    const int64_t r0 = state_row(w, b, p0, i, fault);
    const int64_t r1 = state_row(w, b, p1, i, fault);
    if (fault.kind != Fault::kNone) return fault;
    row.read_page_0 = static_cast<int32_t>(r0 / kRatio);
    row.read_page_1 = static_cast<int32_t>(r1 / kRatio);
  }
  for (int64_t i = 0; i < rows_w; ++i) {
    WritePlan& row = plan_w[i];
    const uint32_t packed = row.ragged_id;
    if (packed == 0xFFFFFFFFu) continue;
    const int64_t p = static_cast<int64_t>(row.write_loc) - 1;
    const int64_t r = state_row(w, packed >> 16, p, rows_c + i, fault);
    if (fault.kind != Fault::kNone) return fault;
    row.ragged_id = packed & 0xFFFFu;
    row.write_loc = static_cast<int32_t>(r);
  }
  return fault;
}

// Online stage 1 of one list: read_page_0 <- rid + offset (write slot), read_page_1 <- rid.
inline Fault online_stage1(const int64_t* rids, int64_t batch, int64_t offset, CompressPlan* plan,
                           int64_t rows) {
  for (int64_t i = 0; i < rows; ++i) {
    CompressPlan& row = plan[i];
    if (row.seq_len == 0xFFFFFFFFu) continue;
    const int64_t b = row.read_page_0;
    if (b < 0 || b >= batch) return {Fault::kBatch, i, b};
    const int64_t rid = rids[b];
    row.read_page_0 = static_cast<int32_t>(rid + offset);
    row.read_page_1 = static_cast<int32_t>(rid);
  }
  return {};
}

// ----------------------------------------------------------------------------- value checks
// validation.check_state_locations for a paged C4 prefill, over the positions the planner reads:
// [max(seq - extend - 4, 0), seq) of each request, batch-major. Their full locs must lie in
// [0, full_len); the SWA locs found there must be >= 0 with a state row that fits an int32.

struct LocationCheck {
  int64_t lo = 0, hi = -1;  // range of the full locs read (hi < lo: nothing read)
  int64_t bad_b = -1;       // first (b, p) with a bad SWA loc (all full locs in range), or -1
  int64_t bad_p = 0, bad_full = 0, bad_swa = 0, bad_row = 0;
};

// Assumes rids in [0, slots) and seq <= max_ctx (the API checks both first). Two passes: the
// range of the full locs (a plain min / max the compiler vectorises), then the SWA locs, each
// tested against one bound below which every state row fits an int32; only SWA locs at or past
// it (or negative) take the exact row arithmetic.
inline LocationCheck check_state_locations(const World& w, const Lengths& len) {
  LocationCheck out;
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
  for (int64_t b = 0; b < len.batch; ++b) {
    const int64_t seq = len.seq_lens[b];
    const int32_t* locs = w.req_to_token + w.rids[b] * w.max_ctx;
    int32_t lo_b = std::numeric_limits<int32_t>::max(), hi_b = std::numeric_limits<int32_t>::min();
    for (int64_t p = std::max<int64_t>(seq - len.extend_lens[b] - 4, 0); p < seq; ++p) {
      lo_b = std::min(lo_b, locs[p]);
      hi_b = std::max(hi_b, locs[p]);
    }
    if (lo_b <= hi_b) {
      lo = std::min<int64_t>(lo, lo_b);
      hi = std::max<int64_t>(hi, hi_b);
    }
  }
  if (lo > hi) return out;  // nothing read
  out.lo = lo;
  out.hi = hi;
  if (lo < 0 || hi >= w.full_len) return out;

  constexpr int64_t kRowMax = std::numeric_limits<int32_t>::max();
  const int64_t ring = w.ring_size.d;
  // SWA locs in [0, safe) have page index <= (kRowMax - ring + 1) / ring: row <= kRowMax
  const uint64_t safe = static_cast<uint64_t>((kRowMax - ring + 1) / ring + 1) *
                        static_cast<uint64_t>(w.swa_page_size.d);
  for (int64_t b = 0; b < len.batch; ++b) {
    const int64_t seq = len.seq_lens[b];
    const int32_t* locs = w.req_to_token + w.rids[b] * w.max_ctx;
    for (int64_t p = std::max<int64_t>(seq - len.extend_lens[b] - 4, 0); p < seq; ++p) {
      const int64_t swa = w.full_to_state[locs[p]];
      if (static_cast<uint64_t>(swa) < safe) continue;  // negative locs wrap above `safe`
      const int64_t row = swa_state_row(w, swa);
      if (swa < 0 || row > kRowMax) {
        out.bad_b = b;
        out.bad_p = p;
        out.bad_full = locs[p];
        out.bad_swa = swa;
        out.bad_row = row;
        return out;
      }
    }
  }
  return out;
}

// Rows [from, to) of a list become sentinels (CUDA-graph padding).
template <typename Row>
void fill_rows(Row* rows, int64_t from, int64_t to, const Row& sentinel) {
  std::fill(rows + from, rows + to, sentinel);
}

}  // namespace plan_host
}  // namespace flashcompress
