"""PyTorch compress kernels: the reference for ``compress_forward`` (spec/compressor.md §1, §5).

Shapes (H = head_dim, r = ratio, W = window = 8 for r=4 else 128):
  state    [rows, width]  flat state pool (width 4H for C4, 2H for C128, 3H online)
  inp      [N, 4H | 2H]   kv_score_input (C4 columns: kv-overlap, kv-own, score-overlap, score-own)
  ape      [8 | 128, H]   positional score bias, in the input dtype
  out      [rows, H]      one row per plan row; rows without an event are zeros

Numerics: every logit is fp32(score) + fp32(bias); softmax and weighted sum in
fp32.  A value read from the state buffer is converted buffer dtype -> input
dtype -> fp32 (the peer's "mixed" conversion chain); values written to the
buffer are converted input dtype -> buffer dtype.  Online C128 state is fp32
(any buffer dtype is converted on load/store); its input/ape/out are fp32.

Prefill always compresses *before* it writes: every buffer read is gathered
(copied) before the write pass scatters, so ring aliasing inside one call is
harmless.
"""

from __future__ import annotations

import torch

from .rows import compress_fields, decode_fields, write_fields

NEG_PAD = -torch.finfo(torch.float32).max  # logit of a padding candidate


def _read_state(state: torch.Tensor, rows: torch.Tensor, in_dtype: torch.dtype) -> torch.Tensor:
    """Buffer rows -> input dtype -> fp32 (the conversion chain of the peer's mixed kernels)."""
    return state[rows].to(in_dtype).to(torch.float32)


def _pool(kv: torch.Tensor, logit: torch.Tensor) -> torch.Tensor:
    """Softmax over dim 1 (candidates) of ``logit`` weighting ``kv``; fp32 ``[n, W, H] -> [n, H]``."""
    m = logit.amax(dim=1, keepdim=True)
    e = torch.exp(logit - m)
    return (kv * e).sum(dim=1) / e.sum(dim=1)


def _candidates(
    ratio: int, head_dim: int, values: torch.Tensor, ape: torch.Tensor, has_overlap: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Window rows ``[n, W, width]`` (fp32) -> (kv, logit) candidates ``[n, W, H]``.

    C4: entries 0..3 take the overlap halves (kv [0,H), score [2H,3H), ape rows 0..3),
    entries 4..7 the own halves (kv [H,2H), score [3H,4H), ape rows 4..7); when
    ``has_overlap`` is False the overlap entries are padding (kv 0, logit -FLT_MAX).
    C128: kv [0,H), score [H,2H), ape row = window offset.
    """
    H = head_dim
    bias = ape.to(torch.float32)
    if ratio == 4:
        kv = torch.cat([values[:, :4, 0:H], values[:, 4:, H : 2 * H]], dim=1)
        score = torch.cat([values[:, :4, 2 * H : 3 * H], values[:, 4:, 3 * H : 4 * H]], dim=1)
        logit = score + bias
        pad = ~has_overlap[:, None, None] & (torch.arange(8, device=kv.device) < 4)[None, :, None]
        kv = torch.where(pad, torch.zeros((), device=kv.device), kv)
        logit = torch.where(pad, torch.full((), NEG_PAD, device=kv.device), logit)
        return kv, logit
    return values[:, :, :H], values[:, :, H : 2 * H] + bias


def decode(
    ratio: int,
    head_dim: int,
    state: torch.Tensor,
    inp: torch.Tensor,
    ape: torch.Tensor,
    plan_d: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """C4 / C128 decode: write every request's input row, then pool boundary windows."""
    f = decode_fields(plan_d)
    state.index_copy_(0, f["write_loc"], inp.to(state.dtype))
    if ratio == 4:
        boundary = torch.remainder(f["seq_len"], 4) == 0
    else:
        boundary = torch.remainder(f["write_loc"], 128) == 127
    out.zero_()
    idx = boundary.nonzero().squeeze(1)
    if idx.numel() == 0:
        return
    offs = torch.arange(ratio, device=state.device)
    if ratio == 4:
        rows = torch.cat([f["read_page_0"][idx, None] * 4 + offs, f["read_page_1"][idx, None] * 4 + offs], dim=1)
    else:
        rows = f["read_page_1"][idx, None] * 128 + offs
    values = _read_state(state, rows, inp.dtype)
    kv, logit = _candidates(ratio, head_dim, values, ape, f["seq_len"][idx] > 4)
    out[idx] = _pool(kv, logit).to(out.dtype)


def prefill(
    ratio: int,
    head_dim: int,
    state: torch.Tensor,
    inp: torch.Tensor,
    ape: torch.Tensor,
    plan_c: torch.Tensor,
    plan_w: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """C4 / C128 prefill: compress pass over plan_c (reads), then write pass over plan_w."""
    window = 8 if ratio == 4 else 128
    c = compress_fields(plan_c)
    out.zero_()
    idx = c["valid"].nonzero().squeeze(1)
    if idx.numel():
        e = torch.arange(window, device=state.device)
        q = c["ragged_id"][idx]
        from_buffer = e[None, :] < c["buffer_len"][idx, None]
        if ratio == 4:
            page = torch.where(e < 4, c["read_page_0"][idx, None], c["read_page_1"][idx, None])
            buf_rows = page * 4 + torch.remainder(e, 4)
        else:
            buf_rows = c["read_page_1"][idx, None] * 128 + e
        in_rows = q[:, None] - (window - 1) + e
        # Rows not taken from a source may be out of range: clamp them for the gather only.
        buf_rows = torch.where(from_buffer, buf_rows, 0)
        in_rows = torch.where(from_buffer, 0, in_rows)
        values = torch.where(
            from_buffer[:, :, None],
            _read_state(state, buf_rows, inp.dtype),
            inp[in_rows].to(torch.float32),
        )
        kv, logit = _candidates(ratio, head_dim, values, ape, c["seq_len"][idx] > 4)
        out[idx] = _pool(kv, logit).to(out.dtype)

    w = write_fields(plan_w)
    widx = w["valid"].nonzero().squeeze(1)
    if widx.numel():
        state.index_copy_(0, w["write_loc"][widx], inp[w["ragged_id"][widx]].to(state.dtype))


# --------------------------------------------------------------------------
# Online C128: running (max, sum, normalised mean) per channel
# --------------------------------------------------------------------------


def _merge(m1, s1, k1, m2, s2, k2):
    m = torch.maximum(m1, m2)
    a = s1 * torch.exp(m1 - m)
    b = s2 * torch.exp(m2 - m)
    s = a + b
    return m, s, (k1 * a + k2 * b) / s


def online_decode(
    head_dim: int, state: torch.Tensor, inp: torch.Tensor, ape: torch.Tensor, plan_d: torch.Tensor, out: torch.Tensor
) -> None:
    """One token per request folded into the slot's running state; emits at window end."""
    H = head_dim
    f = decode_fields(plan_d)
    t = torch.remainder(f["seq_len"] - 1, 128)
    v = inp[:, :H].to(torch.float32)
    logit = inp[:, H:].to(torch.float32) + ape.to(torch.float32)[t]
    prior = state[f["read_page_0"]].to(torch.float32)
    m, s, k = _merge(prior[:, :H], prior[:, H : 2 * H], prior[:, 2 * H :], logit, torch.ones_like(logit), v)
    fresh = (t == 0)[:, None]
    m = torch.where(fresh, logit, m)
    s = torch.where(fresh, 1.0, s)
    k = torch.where(fresh, v, k)
    out.zero_()
    emit = t == 127
    e_idx = emit.nonzero().squeeze(1)
    out[e_idx] = k[e_idx].to(out.dtype)
    keep = (~emit).nonzero().squeeze(1)
    new_state = torch.cat([m, s, k], dim=1).to(state.dtype)
    state.index_copy_(0, f["write_loc"][keep], new_state[keep])


def _online_segments(
    head_dim: int, state: torch.Tensor, inp: torch.Tensor, ape: torch.Tensor, plan: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Reduce each valid segment row to its merged (M, S, K) state; returns (idx, M, S, K, fields)."""
    H = head_dim
    c = compress_fields(plan)
    idx = c["valid"].nonzero().squeeze(1)
    end = torch.remainder(c["seq_len"][idx] - 1, 128) + 1
    off = end - c["buffer_len"][idx]
    q0 = c["ragged_id"][idx] - end + 1
    j = torch.arange(128, device=state.device)
    live = (j[None, :] >= off[:, None]) & (j[None, :] < end[:, None])
    rows = torch.where(live, q0[:, None] + j, 0)
    x = inp[rows].to(torch.float32)  # [n, 128, 2H]
    kv = torch.where(live[:, :, None], x[:, :, :H], 0.0)
    logit = torch.where(live[:, :, None], x[:, :, H:] + ape.to(torch.float32), NEG_PAD)
    m = logit.amax(dim=1)
    e = torch.exp(logit - m[:, None])
    s = e.sum(dim=1)
    k = (kv * e).sum(dim=1) / s
    slot = torch.where(c["read_page_1"][idx] >= 0, c["read_page_1"][idx], c["read_page_0"][idx])
    merge = ((off != 0) & (slot >= 0))[:, None]
    prior = state[torch.where(merge[:, 0], slot, 0)].to(torch.float32)
    mm, ms, mk = _merge(prior[:, :H], prior[:, H : 2 * H], prior[:, 2 * H :], m, s, k)
    return idx, torch.where(merge, mm, m), torch.where(merge, ms, s), torch.where(merge, mk, k), c


def online_prefill(
    head_dim: int,
    state: torch.Tensor,
    inp: torch.Tensor,
    ape: torch.Tensor,
    plan_c: torch.Tensor,
    plan_w: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Compress list (emit closed windows), then write list (store partial-window state)."""
    out.zero_()
    idx, _, _, k, _ = _online_segments(head_dim, state, inp, ape, plan_c)
    out[idx] = k.to(out.dtype)
    idx, m, s, k, c = _online_segments(head_dim, state, inp, ape, plan_w)
    state.index_copy_(0, c["read_page_0"][idx], torch.cat([m, s, k], dim=1).to(state.dtype))
