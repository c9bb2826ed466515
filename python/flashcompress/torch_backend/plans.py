"""PyTorch plan builders: the reference for every plan byte (spec/compressor.md §2.3-§4).

``prefill_plan`` / ``online_prefill_plan`` with host lengths take stage 0 from the native
host planner (``cuda_ops.plan_host``, compiled C++, same bytes as ``prefill_stage0`` /
``online_prefill_stage0`` here, which it falls back to); ``FLASHCOMPRESS_BACKEND=torch``
keeps every byte in PyTorch.

All functions are device-agnostic and vectorised over tokens; no per-token
Python.  Arguments are assumed valid (``flashcompress.validation`` checks them
before any builder runs).

Addressing (``state_row``):
  * request ring:  row = rid * ring + p % ring
  * paged SWA (C4): swa = full_to_state[req_to_token[rid, p]];
                    row = (swa / swa_page_size) * ring + swa % ring
Integer division and remainder follow C (truncation), like the GPU kernels.

Row order is canonical for every builder: batch-major, then position-ascending.
"""

from __future__ import annotations

import torch

from ..layouts import INVALID_COMPRESS_ROW, INVALID_WRITE_ROW, mtp_write_pad, window_size
from .rows import compress_fields, pack_compress_rows, pack_words, pad_rows, u32, words

ONLINE_WINDOW = 128


def _cdiv_trunc(a: torch.Tensor, b: int) -> torch.Tensor:
    return torch.div(a, b, rounding_mode="trunc")


def state_row(
    rid: torch.Tensor,
    pos: torch.Tensor,
    *,
    req_to_token: torch.Tensor,
    full_to_state: torch.Tensor,
    swa_page_size: int,
    ring_size: int,
    req_ring: bool,
) -> torch.Tensor:
    """State-pool row of (request slot ``rid``, position ``pos``), int64."""
    if req_ring:
        return rid * ring_size + torch.fmod(pos, ring_size)
    full_loc = req_to_token[rid, pos].to(torch.int64)
    swa_loc = full_to_state[full_loc].to(torch.int64)
    return _cdiv_trunc(swa_loc, swa_page_size) * ring_size + torch.fmod(swa_loc, ring_size)


def uses_req_ring(ratio: int, use_req_ring: bool) -> bool:
    """Ratio 128 always addresses its state through the request ring."""
    return ratio != 4 or use_req_ring


def _row_fn(
    ratio: int,
    req_to_token: torch.Tensor,
    full_to_state: torch.Tensor,
    swa_page_size: int,
    ring_size: int,
    use_req_ring: bool,
):
    """``state_row`` with the world fixed: ``row(rid, pos) -> int64 rows``."""
    req_ring = uses_req_ring(ratio, use_req_ring)

    def row(rid: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return state_row(rid, pos, req_to_token=req_to_token, full_to_state=full_to_state,
                         swa_page_size=swa_page_size, ring_size=ring_size, req_ring=req_ring)

    return row


# --------------------------------------------------------------------------
# Decode
# --------------------------------------------------------------------------


def decode_plan(
    ratio: int,
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    full_to_state: torch.Tensor,
    seq_lens: torch.Tensor,
    swa_page_size: int,
    ring_size: int,
    use_req_ring: bool,
) -> torch.Tensor:
    """DecodePlan rows ``uint8 [B, 16]`` on ``req_pool_indices.device``."""
    device = req_pool_indices.device
    rid = req_pool_indices.to(torch.int64)
    seq = seq_lens.to(device=device, dtype=torch.int64)
    p1 = seq - 1
    p0 = torch.clamp(p1 - ratio, min=0)
    row = _row_fn(ratio, req_to_token, full_to_state, swa_page_size, ring_size, use_req_ring)
    write_loc = row(rid, p1)
    return pack_words(seq, write_loc, _cdiv_trunc(row(rid, p0), ratio), _cdiv_trunc(write_loc, ratio))


def online_decode_plan(
    seq_lens: torch.Tensor, req_pool_indices: torch.Tensor, state_slot_offset: int
) -> torch.Tensor:
    """Online C128 DecodePlan rows: write_loc = read_page_0 = rid + offset, read_page_1 = -1."""
    device = req_pool_indices.device
    rid = req_pool_indices.to(torch.int64)
    seq = seq_lens.to(device=device, dtype=torch.int64)
    slot = rid + state_slot_offset
    return pack_words(seq, slot, slot, torch.full_like(slot, -1))


# --------------------------------------------------------------------------
# Prefill
# --------------------------------------------------------------------------


def _token_grid(seq_lens: torch.Tensor, extend_lens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-token batch id, in-extend offset j, absolute position p and ragged id."""
    seq = seq_lens.to(torch.int64)
    ext = extend_lens.to(torch.int64)
    batch = torch.repeat_interleave(torch.arange(seq.numel(), device=seq.device), ext)
    starts = torch.cumsum(ext, 0) - ext
    ragged = torch.arange(batch.numel(), device=seq.device, dtype=torch.int64)
    j = ragged - starts[batch]
    prefix = (seq - ext)[batch]
    return {"batch": batch, "j": j, "pos": prefix + j, "ragged": ragged, "seq": seq[batch]}


def prefill_stage0(
    ratio: int,
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    swa_page_size: int,
    ring_size: int,
    use_req_ring: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage-0 rows (spec §4.2): compress rows with placeholder pages, packed write rows.

    Returns ``(plan_c [nc, 16], plan_w [nw, 8])`` on ``seq_lens.device``, exact counts.
    """
    t = _token_grid(seq_lens, extend_lens)
    pos, j, batch, ragged, seq = t["pos"], t["j"], t["batch"], t["ragged"], t["seq"]
    w = window_size(ratio)

    event = torch.remainder(pos + 1, ratio) == 0
    ev = event.nonzero().squeeze(1)
    plan_c = pack_compress_rows(
        pos[ev] + 1,
        ragged[ev],
        w - torch.clamp(j[ev] + 1, max=w),
        torch.full_like(ev, -1),
        batch[ev],
    )

    last_c = torch.div(seq, ratio, rounding_mode="floor") * ratio
    first_w = torch.minimum(last_c - (ratio if ratio == 4 else 0), seq - mtp_write_pad(ratio, ring_size))
    keep = pos >= first_w
    if ratio == 4 and not use_req_ring:
        keep |= torch.remainder(pos, swa_page_size) >= swa_page_size - 4
    wr = keep.nonzero().squeeze(1)
    plan_w = pack_words(ragged[wr] | (batch[wr] << 16), pos[wr] + 1)
    return plan_c, plan_w


def prefill_stage1(
    ratio: int,
    plan_c: torch.Tensor,
    plan_w: torch.Tensor,
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    full_to_state: torch.Tensor,
    swa_page_size: int,
    ring_size: int,
    use_req_ring: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1 (spec §4.4): resolve pages and state rows; sentinel rows stay sentinels."""
    rid_of = req_pool_indices.to(torch.int64)
    row_of_slot = _row_fn(ratio, req_to_token, full_to_state, swa_page_size, ring_size, use_req_ring)
    row = lambda b, p: row_of_slot(rid_of[b], p)  # noqa: E731  (b = batch index)

    c = compress_fields(plan_c)
    resolve = c["valid"] & (c["buffer_len"] > 0)
    idx = resolve.nonzero().squeeze(1)
    out_c = words(plan_c).clone()
    if idx.numel():
        b = c["read_page_1"][idx]
        p1 = c["seq_len"][idx] - 1
        p0 = torch.clamp(p1 - ratio, min=0)
        out_c[idx, 2] = _cdiv_trunc(row(b, p0), ratio).to(torch.int32)
        out_c[idx, 3] = _cdiv_trunc(row(b, p1), ratio).to(torch.int32)

    ww = words(plan_w)
    packed = u32(ww[:, 0])
    valid_w = (packed != 0xFFFFFFFF).nonzero().squeeze(1)
    out_w = ww.clone()
    if valid_w.numel():
        ragged = packed[valid_w] & 0xFFFF
        b = packed[valid_w] >> 16
        p = ww[valid_w, 1].to(torch.int64) - 1
        out_w[valid_w, 0] = ragged.to(torch.int32)
        out_w[valid_w, 1] = row(b, p).to(torch.int32)
    return out_c.view(torch.uint8), out_w.view(torch.uint8)


def prefill_plan(
    ratio: int,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    req_to_token: torch.Tensor,
    full_to_state: torch.Tensor,
    swa_page_size: int,
    ring_size: int,
    num_q_tokens: int,
    use_cuda_graph: bool,
    use_req_ring: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Final (stage 0 + stage 1) CompressPlan / WritePlan rows on ``req_pool_indices.device``.

    With ``use_cuda_graph`` both lists are padded with sentinel rows to ``num_q_tokens``.
    Host lengths take stage 0 from the native host planner (``cuda_ops.plan_host``: the bytes
    of ``prefill_stage0``, which it falls back to where it is unavailable).
    """
    device = req_pool_indices.device
    if seq_lens.is_cpu:
        from ..cuda_ops import plan_host

        plan_c, plan_w = plan_host.prefill_stage0(ratio, seq_lens, extend_lens, swa_page_size, ring_size,
                                                  use_req_ring, num_q_tokens, pad=use_cuda_graph)
    else:
        plan_c, plan_w = prefill_stage0(ratio, seq_lens, extend_lens, swa_page_size, ring_size, use_req_ring)
        if use_cuda_graph:
            plan_c = pad_rows(plan_c, num_q_tokens, INVALID_COMPRESS_ROW)
            plan_w = pad_rows(plan_w, num_q_tokens, INVALID_WRITE_ROW)
    plan_c, plan_w = plan_c.to(device), plan_w.to(device)
    return prefill_stage1(
        ratio, plan_c, plan_w, req_pool_indices, req_to_token, full_to_state, swa_page_size, ring_size, use_req_ring
    )


def online_prefill_stage0(seq_lens: torch.Tensor, extend_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Online C128 segments (spec §4.6) as stage-0 CompressPlan rows.

    A segment ends at every 128-chunk end and at the last token of each extend;
    it covers ``[max(prefix, 128*floor(p/128)), p + 1)``.  Segments that reach
    their chunk end go to the compress list, the trailing partial one to the
    write list.  Fields: seq_len = p + 1, ragged_id = ragged index of p,
    buffer_len = segment length, read_page_0 = batch index, read_page_1 = -1.
    """
    t = _token_grid(seq_lens, extend_lens)
    pos, batch, ragged, seq = t["pos"], t["batch"], t["ragged"], t["seq"]
    prefix = pos - t["j"]
    closes_chunk = torch.remainder(pos + 1, ONLINE_WINDOW) == 0
    last_of_extend = pos + 1 == seq
    seg_start = torch.maximum(prefix, torch.div(pos, ONLINE_WINDOW, rounding_mode="floor") * ONLINE_WINDOW)

    def rows(mask: torch.Tensor) -> torch.Tensor:
        i = mask.nonzero().squeeze(1)
        return pack_compress_rows(pos[i] + 1, ragged[i], pos[i] + 1 - seg_start[i], batch[i], torch.full_like(i, -1))

    return rows(closes_chunk), rows(last_of_extend & ~closes_chunk)


def online_prefill_stage1(
    plan: torch.Tensor, req_pool_indices: torch.Tensor, state_slot_offset: int
) -> torch.Tensor:
    """read_page_0 <- rid + offset (write slot), read_page_1 <- rid (load slot), valid rows only."""
    c = compress_fields(plan)
    idx = c["valid"].nonzero().squeeze(1)
    out = words(plan).clone()
    if idx.numel():
        rid = req_pool_indices.to(torch.int64)[c["read_page_0"][idx]]
        out[idx, 2] = (rid + state_slot_offset).to(torch.int32)
        out[idx, 3] = rid.to(torch.int32)
    return out.view(torch.uint8)


def online_prefill_plan(
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
    num_q_tokens: int,
    use_cuda_graph: bool,
    state_slot_offset: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Final online prefill lists, both ``uint8 [rows, 16]``.

    Host lengths take stage 0 from the native host planner, as in ``prefill_plan``.
    """
    device = req_pool_indices.device
    if seq_lens.is_cpu:
        from ..cuda_ops import plan_host

        plan_c, plan_w = plan_host.online_prefill_stage0(seq_lens, extend_lens, num_q_tokens, pad=use_cuda_graph)
    else:
        plan_c, plan_w = online_prefill_stage0(seq_lens, extend_lens)
        if use_cuda_graph:
            plan_c = pad_rows(plan_c, num_q_tokens, INVALID_COMPRESS_ROW)
            plan_w = pad_rows(plan_w, num_q_tokens, INVALID_COMPRESS_ROW)
    plan_c, plan_w = plan_c.to(device), plan_w.to(device)
    return (
        online_prefill_stage1(plan_c, req_pool_indices, state_slot_offset),
        online_prefill_stage1(plan_w, req_pool_indices, state_slot_offset),
    )
