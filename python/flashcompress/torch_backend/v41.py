"""PyTorch backend of the V4.1 low-ratio ops: the byte-exact CPU reference of SGLang's fused kernels.

Follows ``spec/v41.md`` §2-§5 literally:

* RMSNorm (§3.3 step 2): sum of squares in the kernels' order (per lane, an
  xor butterfly over the 32 lanes of a warp, then the warp partials in warp
  order), ``nf = rsqrt(ss * (1/D) + eps)`` (correctly rounded here),
  ``latent = bf16((x * nf) * w)``.
* RoPE on the last 64 dims of the bf16 latent, FMA-contracted as nvcc does,
  each rotated value rounded to bf16 (``u``).
* Store: fp4 layouts encode ``u``; the others fake-quantise it first
  (:mod:`.v41_quant`).
* Ratio 2 pools each (even, odd) pair with a per-channel 2-way softmax,
  ``(k0*a0 + k1*a1) / (1 + e)``, ``e = exp(-|s0 - s1|)``, the even token
  waiting in the pair ring (``kv_state``) when it is not in the same batch;
  the pooled row is rounded to bf16 before the norm, and RoPE uses row ``pos - 1``.

Every function takes already validated tensors (``flashcompress.v41.api`` checks them)
and writes its outputs in place; nothing here loops over rows in Python.
"""

from __future__ import annotations

import torch

from ..v41.layouts import INDEX_K_SLOT_BYTES, LATENT_DIM, KVLayout, RowAddressing, index_k_addressing
from .quant import bf16_round, fma_f32
from .store import apply_rope
from .v41_quant import encode, fake_quant_kv, index_k_codes

__all__ = ["c1_decode", "c2_decode", "c2_prefill", "index_k", "norm_factor", "rms_norm_bf16", "pool_pairs"]

_F32 = torch.float32
_LANES = 32
_BUTTERFLY = (16, 8, 4, 2, 1)


def _warp_sum(lane_values: torch.Tensor) -> torch.Tensor:
    """``[n, warps, 32, k]`` fp32 -> ``[n, 1]``: per lane in order, xor butterfly per warp, warps in order."""
    per_lane = lane_values[..., 0]
    for i in range(1, lane_values.shape[-1]):
        per_lane = per_lane + lane_values[..., i]
    lanes = torch.arange(_LANES, device=lane_values.device)
    for offset in _BUTTERFLY:
        per_lane = per_lane + per_lane[..., lanes ^ offset]
    partials = per_lane[..., 0]  # every lane holds the same sum
    total = partials[:, 0]
    for w in range(1, partials.shape[1]):
        total = total + partials[:, w]
    return total.unsqueeze(1)


def _lane_squares(x: torch.Tensor) -> torch.Tensor:
    """Squares of ``x`` ``[n, D]`` grouped as the kernels' lanes own them: ``[n, warps, 32, k]``.

    D = 512 (c1/c2): 8 warps, lane l of warp w owns dims ``64w + 2l, 64w + 2l + 1``.
    D = 128 (index-K): 1 warp, lane l owns ``2l, 2l + 1, 64 + 2l, 65 + 2l``.
    """
    sq = x * x  # exact: x is bf16-exact
    n = x.shape[0]
    if x.shape[1] == LATENT_DIM:
        return sq.reshape(n, LATENT_DIM // 64, _LANES, 2)
    return sq.reshape(n, 2, _LANES, 2).permute(0, 2, 1, 3).reshape(n, 1, _LANES, 4)


def norm_factor(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``nf = rsqrt(ss * (1/D) + eps)`` ``[n, 1]`` of bf16-exact fp32 rows ``x`` ``[n, D]``.

    ``ss`` is summed in fp32 in the kernels' order; the reciprocal square root is
    correctly rounded here, the kernels' ``rsqrtf`` is approximate (rarely one ulp
    apart, which can move one bf16 latent element by one ulp).
    """
    ss = _warp_sum(_lane_squares(x))
    eps32 = torch.tensor(eps, dtype=_F32, device=x.device)
    mean = ss * (1.0 / x.shape[1]) + eps32  # the multiply by 2^-k is exact
    return torch.rsqrt(mean.to(torch.float64)).to(_F32)


def rms_norm_bf16(x: torch.Tensor, weight: torch.Tensor, eps: float, nf: torch.Tensor | None = None) -> torch.Tensor:
    """``bf16((x * nf) * w)`` as fp32 for bf16-exact fp32 rows ``x`` ``[n, D]`` (``nf`` default :func:`norm_factor`)."""
    if nf is None:
        nf = norm_factor(x, eps)
    return bf16_round((x * nf) * weight.to(_F32))


def _rotate(latent: torch.Tensor, freqs_cis: torch.Tensor, rope_pos: torch.Tensor) -> torch.Tensor:
    """RoPE of the last 64 dims at table rows ``rope_pos``, rounded to bf16 (dims 0..D-65 unchanged)."""
    return bf16_round(apply_rope(latent, freqs_cis.index_select(0, rope_pos).to(_F32)))


def _scatter(cache: torch.Tensor, slots: torch.Tensor, addr: RowAddressing, page_size: int,
             data: torch.Tensor, scales: torch.Tensor) -> None:
    """Write each row's data and scale bytes at its slot (``cache`` viewed as flat bytes)."""
    flat = cache.view(torch.uint8).view(-1)
    shift = page_size.bit_length() - 1
    base = (slots >> shift) * addr.page_bytes
    s = slots & (page_size - 1)
    dev = flat.device
    data_idx = (base + s * addr.data_stride).unsqueeze(1) + torch.arange(data.shape[1], device=dev)
    scale_idx = (base + addr.scale_base + s * addr.scale_stride).unsqueeze(1) + torch.arange(scales.shape[1], device=dev)
    flat[torch.cat((data_idx, scale_idx), dim=1).reshape(-1)] = torch.cat((data, scales), dim=1).reshape(-1)


def _store_latents(latent: torch.Tensor, rope_pos: torch.Tensor, slots: torch.Tensor, freqs_cis: torch.Tensor,
                   k_cache: torch.Tensor, page_size: int, layout: KVLayout) -> None:
    """RoPE + (fake-quant +) encode + scatter of bf16 latents into the compressed cache."""
    if slots.numel() == 0:
        return
    u = _rotate(latent, freqs_cis, rope_pos)
    q = u if layout.is_fp4 else fake_quant_kv(u)
    data, scales = encode(q, u, layout)
    _scatter(k_cache, slots, layout.row_addressing(page_size), page_size, data, scales)


def c1_decode(kv_input: torch.Tensor, norm_weight: torch.Tensor, positions: torch.Tensor, out_loc: torch.Tensor,
              eps: float, freqs_cis: torch.Tensor, k_cache: torch.Tensor, *, page_size: int, layout: KVLayout,
              out: torch.Tensor) -> None:
    """Ratio 1: every row's latent into ``out``; rows with ``out_loc > 0`` stored at slot ``out_loc``."""
    latent = rms_norm_bf16(kv_input.to(_F32), norm_weight, eps)
    out.copy_(latent)
    live = (out_loc > 0).nonzero().squeeze(1)
    _store_latents(latent[live], positions[live].long(), out_loc[live].long(), freqs_cis, k_cache, page_size, layout)


def pool_pairs(k0: torch.Tensor, s0: torch.Tensor, k1: torch.Tensor, s1: torch.Tensor) -> torch.Tensor:
    """Per-channel softmax pooling of a pair: ``(k0*a0 + k1*a1) / (1 + e)``, fp32.

    ``e = exp(-|s0 - s1|)`` (correctly rounded); ``(a0, a1) = (1, e)`` if ``s0 > s1``
    else ``(e, 1)``; the numerator is ``fma(k0, a0, k1 * a1)``.  A cleared partner
    (``k0 = 0``, ``s0 = -inf``) gives ``k1``.
    """
    d = s0 - s1
    e = torch.exp(-d.abs().to(torch.float64)).to(_F32)
    one = torch.ones_like(e)
    first = d > 0
    a0 = torch.where(first, one, e)
    a1 = torch.where(first, e, one)
    return fma_f32(k0, a0, k1 * a1) / (one + e)


def _pool_and_store(kv_input: torch.Tensor, partner: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor,
                    raw_out_loc: torch.Tensor, norm_weight: torch.Tensor, eps: float, freqs_cis: torch.Tensor,
                    k_cache: torch.Tensor, page_size: int, layout: KVLayout, out: torch.Tensor) -> None:
    """Odd rows ``rows`` (with their partners' input rows ``partner``): pool, norm, write ``out``, store."""
    if rows.numel() == 0:
        return
    cur = kv_input[rows]
    D = LATENT_DIM
    pooled = pool_pairs(partner[:, :D], partner[:, D:], cur[:, :D], cur[:, D:])
    latent = rms_norm_bf16(bf16_round(pooled), norm_weight, eps)
    out[rows] = latent.to(out.dtype)
    pos = positions[rows].long()
    _store_latents(latent, pos - 1, raw_out_loc[rows].long() >> 1, freqs_cis, k_cache, page_size, layout)


def _ring_rows(req: torch.Tensor, positions: torch.Tensor, ring_size: int, back: int) -> torch.Tensor:
    """Ring row ``req * ring + (pos - back) mod ring`` (``back`` 0: own slot, 1: the partner's)."""
    return req * ring_size + torch.remainder(positions.long() - back, ring_size)


def c2_decode(kv_input: torch.Tensor, kv_state: torch.Tensor, norm_weight: torch.Tensor, positions: torch.Tensor,
              req: torch.Tensor, raw_out_loc: torch.Tensor, eps: float, freqs_cis: torch.Tensor,
              k_cache: torch.Tensor, *, page_size: int, ring_size: int, draft_len: int, layout: KVLayout,
              out: torch.Tensor) -> None:
    """Ratio 2 decode (``draft_len == 1``) or verify (blocks of ``draft_len`` rows per request).

    A row's partner is the previous input row inside its verify block, else the
    ring row of ``pos - 1``.  All partners are read before anything is written;
    padded rows (``raw_out_loc == 0``) change nothing, even rows park their whole
    input row in the ring, odd rows pool, write ``out`` and store at ``raw >> 1``.
    """
    n = kv_input.shape[0]
    rows = torch.arange(n, device=kv_input.device)
    from_block = (rows % draft_len) != 0
    partner = kv_state[_ring_rows(req, positions, ring_size, 1)]
    partner[from_block] = kv_input[rows[from_block] - 1]
    live = raw_out_loc != 0
    odd = (positions & 1) == 1
    parked = (live & ~odd).nonzero().squeeze(1)
    pooled = (live & odd).nonzero().squeeze(1)
    _pool_and_store(kv_input, partner[pooled], pooled, positions, raw_out_loc, norm_weight, eps, freqs_cis,
                    k_cache, page_size, layout, out)
    kv_state[_ring_rows(req[parked], positions[parked], ring_size, 0)] = kv_input[parked]


def c2_prefill(kv_input: torch.Tensor, kv_state: torch.Tensor, norm_weight: torch.Tensor, positions: torch.Tensor,
               req: torch.Tensor, raw_out_loc: torch.Tensor, eps: float, freqs_cis: torch.Tensor,
               k_cache: torch.Tensor, extend_start_loc: torch.Tensor, extend_seq_lens: torch.Tensor, *,
               page_size: int, ring_size: int, layout: KVLayout, out: torch.Tensor) -> None:
    """Ratio 2 extend: pool every odd non-padded row, then park each request's last ``ring`` rows.

    An odd row pairs with the previous input row when that row is the same
    request, the previous position and not padded; otherwise with the ring.
    The write-back copies the last ``min(len, ring)`` non-padded rows of every
    request to their ring rows after all pooling reads (a chunk that starts odd
    and ends even reads and rewrites the same ring row).
    """
    n = kv_input.shape[0]
    live = raw_out_loc != 0
    pooled = (live & ((positions & 1) == 1)).nonzero().squeeze(1)
    prev = (pooled - 1).clamp_min(0)
    in_batch = (pooled > 0) & (req[prev] == req[pooled]) & (positions[prev] == positions[pooled] - 1) & live[prev]
    partner = kv_state[_ring_rows(req[pooled], positions[pooled], ring_size, 1)]
    partner[in_batch] = kv_input[prev[in_batch]]
    _pool_and_store(kv_input, partner, pooled, positions, raw_out_loc, norm_weight, eps, freqs_cis,
                    k_cache, page_size, layout, out)

    # write-back: row start + len - 1 - k for k < min(len, ring) of each request
    k = torch.arange(ring_size, device=kv_input.device)
    start = extend_start_loc.long().unsqueeze(1)
    length = extend_seq_lens.long().unsqueeze(1)
    tail = (start + length - 1 - k)[k < length]
    tail = tail[(tail >= 0) & (tail < n)]
    tail = tail[live[tail]]
    kv_state[_ring_rows(req[tail], positions[tail], ring_size, 0)] = kv_input[tail]


def index_k(input: torch.Tensor, norm_weight: torch.Tensor, eps: float, freqs_cis: torch.Tensor,
            positions: torch.Tensor, loc: torch.Tensor, cache: torch.Tensor, *, ratio: int) -> None:
    """Index keys: RMSNorm over 128, RoPE at ``pos & ~(ratio - 1)``, two-stage fp4, store rows with ``loc > 0``."""
    live = (loc > 0).nonzero().squeeze(1)
    if live.numel() == 0:
        return
    page_size = cache.shape[1] // INDEX_K_SLOT_BYTES
    k = rms_norm_bf16(input[live].to(_F32), norm_weight, eps)
    rope_pos = positions[live].long() & ~(ratio - 1)
    payload, scales = index_k_codes(_rotate(k, freqs_cis, rope_pos))
    _scatter(cache, loc[live], index_k_addressing(page_size), page_size, payload, scales)
