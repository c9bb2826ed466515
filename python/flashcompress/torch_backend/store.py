"""PyTorch backend of ``compress_norm_rope_store``: RMSNorm + RoPE (+ Hadamard) + quantised paged store.

This is the executable reference of ``spec/store-and-jit.md`` §4-§6 and the CPU
backend; it writes exactly the bytes the CUDA kernel writes.

Shapes and dtypes (``N`` = rows of ``kv`` = rows of the plan, ``D`` = head dim)::

    kv           [N, D]   any float dtype, D in {128, 512}; converted exactly to fp32
    positions    [N]      int64 RoPE position (plan seq_len - ratio) per row
    dest         [N]      int64 cache slot (``out_loc``) per row
    valid        [N]      bool; rows that are False are neither read nor written
    norm_weight  [D]      any float dtype; rounded to kv.dtype first (as the peer does)
    freq_real    [T, 64]  fp32, view_as_real(freq_cis).flatten(-2): row p = [cos0, sin0, cos1, sin1, ...]
    kvcache      uint8, row-major with rows of ``fmt.page_bytes(page_size)`` bytes
                 ([pages, page_bytes]; bf16 format: [rows, 1024] for page_size 1); written in place

Per stored row (fp32 throughout)::

    y   = RMSNorm(x) * w                        §4.1 (ss and rsqrt correctly rounded to fp32)
    y[-64:] = interleaved RoPE at ``position``  §4.2 (FMA-contracted like the kernel)
    D == 128: y = Hadamard128(y) * rsqrtf(128)  §6.1
    encode per ``fmt`` and scatter:
      v4       576 data bytes (448 e4m3 nope, 64 bf16 rope) + 7 ue8m0 tile scales (pad byte 7 untouched)
      idx_fp8  128 e4m3 bytes + fp32 scale
      idx_fp4  64 bytes of e2m1 pairs + 4 ue8m0 group scales
      bf16     512 bf16 values, row ``dest`` of 1024-byte rows
      the V4.1 layouts (``layout=``; spec store-and-jit.md §5.3-5.5), encoded by ``v41_quant.encode``
      from ``y`` itself (no bf16 round trip, no fake quantisation):
        v41 / v41_new          512 e4m3 (16 tiles of 32, ue8m0 exponents, no clip) + 16 exponent bytes
        v41_fp4 / v41_fp4_new  256 bytes of RNE e2m1 pairs (32 tiles of 16, e4m3 scale of amax / 6,
                               codes of y / scale) + 32 scale bytes
        uniform_fp8            512 e4m3 (unit scale, clipped to +-448), no scales
      bf16 rows with a V4.1 layout: ``y`` is rounded to bf16 before RoPE and the rotated dims again
      after it (the peer's rounding to the row dtype; no-ops for fp32 rows)

Addressing (``fmt.addressing``): with ``page = dest >> log2(P)`` and ``slot = dest & (P - 1)``, block-split
pages hold data bytes at ``page * page_bytes + slot * data_bytes`` and scale bytes at
``page * page_bytes + P * data_bytes + slot * scale_bytes`` (bf16 rows: ``dest * 1024``); the interleaved
``_new`` layouts hold a token's data at ``page * page_bytes + slot * bytes_per_token`` and its scales
right after them.

Arguments are not validated here; the public API does that.
"""

from __future__ import annotations

import functools
import struct

import torch

from .. import layouts
from ..layouts import CacheFormat
from ..v41.layouts import KVLayout
from . import v41_quant
from .quant import bf16_bits, bf16_round, e2m1_threshold_codes, e4m3_codes, fma_f32, inv_ue8m0, ue8m0_ceil

__all__ = ["norm_rope_store", "norm_factor", "rms_norm", "apply_rope", "hadamard128", "encode_rows"]

_F32 = torch.float32
# rsqrtf(128) as the kernel computes it (correctly rounded: 0x3DB504F3)
_HADAMARD_SCALE = struct.unpack("<f", struct.pack("<I", 0x3DB504F3))[0]
_FP4_MAX = 6.0


def _div(a: torch.Tensor, b: float) -> torch.Tensor:
    """IEEE fp32 ``a / b``.

    The divisor is materialised at full shape so that no backend turns the
    division into a multiplication by a rounded reciprocal (CUDA does that for
    host scalars).
    """
    return a / torch.full_like(a, b)


def norm_factor(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm factor ``nf = rsqrt(ss / D + eps)`` of fp32 rows ``x`` ``[n, D]``, as fp32 ``[n, 1]``.

    The kernel sums ``x_i^2`` in fp32 (butterfly order) and uses the approximate
    ``rsqrtf``.  Here ``ss`` is the fp64 sum of squares rounded once to fp32,
    ``ss / D + eps`` is fp32 (the division by D = 2^k is exact; ``eps`` is
    rounded to fp32 as it is when it crosses the C ABI), and ``nf`` is the
    correctly rounded fp32 reciprocal square root (evaluated in fp64).  This
    reproduces every golden byte, including the ulp-sensitive fp32 indexer scales.
    """
    x64 = x.to(torch.float64)
    ss = (x64 * x64).sum(-1, keepdim=True).to(_F32)
    eps32 = torch.tensor(eps, dtype=_F32, device=x.device)
    mean = _div(ss, float(x.shape[-1])) + eps32
    return torch.rsqrt(mean.to(torch.float64)).to(_F32)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``y_i = (x_i * nf) * w_i`` (fp32 ``x`` ``[n, D]``, ``weight`` ``[D]``): two fp32 roundings, kernel order."""
    return (x * norm_factor(x, eps)) * weight


def apply_rope(y: torch.Tensor, freq: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved (re, im) pairs of the last 64 dims of ``y`` by rows ``freq`` ([n, 64]).

    ``re' = re*c - im*s`` and ``im' = re*s + im*c`` with the first product of
    each fused into an FMA, which is how nvcc contracts the kernel's expressions.
    """
    rope = y[:, -layouts.ROPE_DIM :]
    re, im = rope[:, 0::2], rope[:, 1::2]
    c, s = freq[:, 0::2], freq[:, 1::2]
    re_out = fma_f32(re, c, -(im * s))
    im_out = fma_f32(re, s, im * c)
    rotated = torch.stack((re_out, im_out), dim=-1).flatten(-2)
    return torch.cat((y[:, : -layouts.ROPE_DIM], rotated), dim=-1)


def hadamard128(y: torch.Tensor) -> torch.Tensor:
    """Unnormalised Sylvester Walsh-Hadamard over 128 dims (butterflies on bits 0..6), times rsqrtf(128)."""
    n = y.shape[0]
    h = y
    for bit in range(7):
        stride = 1 << bit
        v = h.reshape(n, layouts.HADAMARD_DIM // (2 * stride), 2, stride)
        lo, hi = v[:, :, 0, :], v[:, :, 1, :]
        h = torch.stack((lo + hi, lo - hi), dim=2).reshape(n, layouts.HADAMARD_DIM)
    return h * _HADAMARD_SCALE


def _amax(v: torch.Tensor) -> torch.Tensor:
    """max |v| over the last dim, ignoring NaN like an ``fmaxf`` reduction from 0.

    Callers floor it with ``clamp_min(1e-4)``, which compares against fp32(1e-4) as the kernels do.
    """
    a = v.abs()
    return torch.where(torch.isnan(a), torch.zeros_like(a), a).amax(-1)


def _le_bytes(t: torch.Tensor) -> torch.Tensor:
    """``[n, k]`` tensor of a multi-byte dtype -> ``uint8 [n, k * itemsize]``, little-endian (host order)."""
    return t.contiguous().view(torch.uint8).reshape(t.shape[0], -1)


def _encode_v4(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = y.shape[0]
    nope = bf16_round(y[:, : layouts.V4_NOPE_DIM]).reshape(n, layouts.V4_NUM_TILES, layouts.V4_TILE)
    scale_raw = _div(_amax(nope).clamp_min(layouts.AMAX_FLOOR), layouts.FP8_E4M3_MAX)
    e = ue8m0_ceil(scale_raw)  # [n, 7]
    codes = e4m3_codes(nope * inv_ue8m0(e).unsqueeze(-1)).reshape(n, layouts.V4_NOPE_DIM)
    rope = _le_bytes(bf16_bits(y[:, layouts.V4_NOPE_DIM :]))
    data = torch.cat((codes, rope), dim=1)
    return data, e.to(torch.uint8)  # scale byte 7 (pad) is not produced, hence never written


def _encode_idx_fp8(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = _div(_amax(h).clamp_min(layouts.AMAX_FLOOR), layouts.FP8_E4M3_MAX)  # [n]
    inv = torch.ones_like(scale) / scale
    codes = e4m3_codes(h * inv.unsqueeze(-1))
    return codes, _le_bytes(scale.unsqueeze(-1))


def _encode_idx_fp4(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = h.shape[0]
    groups = h.reshape(n, -1, layouts.FP4_GROUP)
    e = ue8m0_ceil(_div(_amax(groups).clamp_min(layouts.AMAX_FLOOR), _FP4_MAX))  # [n, 4]
    codes = e2m1_threshold_codes(groups * inv_ue8m0(e).unsqueeze(-1)).reshape(n, -1, 2)
    packed = codes[..., 0] | (codes[..., 1] << 4)
    return packed, e.to(torch.uint8)


def _encode_bf16(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _le_bytes(bf16_bits(y)), y.new_empty((y.shape[0], 0), dtype=torch.uint8)


def _encode_kv_layout(layout: KVLayout, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return v41_quant.encode(y, y, layout)  # the store quantises y itself: q = u = y


# the V4.1 layouts other than V4: their rows are rounded to the row dtype around RoPE
_V41_LAYOUTS = {f.name: layout for layout, f in layouts.MAIN_FORMATS.items() if layout is not KVLayout.V4}
_ENCODERS = {
    layouts.MAIN_V4.name: _encode_v4,
    layouts.INDEXER_FP8.name: _encode_idx_fp8,
    layouts.INDEXER_FP4.name: _encode_idx_fp4,
    layouts.BF16_ROWS.name: _encode_bf16,
    **{name: functools.partial(_encode_kv_layout, layout) for name, layout in _V41_LAYOUTS.items()},
}


def encode_rows(y: torch.Tensor, fmt: CacheFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """Normed (+roped, +rotated) fp32 rows -> (data bytes [n, data_bytes], written scale bytes [n, k]).

    ``k`` is ``fmt.scale_bytes`` except for V4, whose pad byte is never written (k = 7).
    """
    return _ENCODERS[fmt.name](y)


def norm_rope_store(
    kv: torch.Tensor,
    positions: torch.Tensor,
    dest: torch.Tensor,
    valid: torch.Tensor,
    *,
    norm_weight: torch.Tensor,
    norm_eps: float,
    freq_real: torch.Tensor,
    kvcache: torch.Tensor,
    page_size: int,
    fmt: CacheFormat,
) -> None:
    """Norm, rotate and store the ``valid`` rows of ``kv`` into ``kvcache`` (see the module docstring)."""
    rows = valid.nonzero().squeeze(1)
    if rows.numel() == 0:
        return
    x = kv.index_select(0, rows).to(_F32)
    # the peer casts the weight to kv.dtype before the kernel widens both to fp32
    w = norm_weight.to(kv.dtype).to(_F32)
    pos = positions.index_select(0, rows)
    slots = dest.index_select(0, rows)

    y = rms_norm(x, w, norm_eps)
    round_rows = kv.dtype == torch.bfloat16 and fmt.name in _V41_LAYOUTS
    if round_rows:
        y = bf16_round(y)
    y = apply_rope(y, freq_real.index_select(0, pos).to(_F32))
    if round_rows:
        y = bf16_round(y)  # the rotated dims (the others are bf16 already)
    if y.shape[1] == layouts.HADAMARD_DIM:
        y = hadamard128(y)
    data, scales = encode_rows(y, fmt)

    shift = page_size.bit_length() - 1  # page_size is a power of two
    addr = fmt.addressing(page_size)
    page, slot = slots >> shift, slots & (page_size - 1)
    base = page * addr.page_bytes
    dev = kvcache.device
    data_idx = (base + slot * addr.data_stride).unsqueeze(1) + torch.arange(data.shape[1], device=dev)
    scale_idx = (base + addr.scale_base + slot * addr.scale_stride).unsqueeze(1) + torch.arange(
        scales.shape[1], device=dev
    )
    idx = torch.cat((data_idx, scale_idx), dim=1).reshape(-1)
    kvcache.view(-1)[idx] = torch.cat((data, scales), dim=1).reshape(-1)
