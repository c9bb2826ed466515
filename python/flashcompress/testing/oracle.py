"""The independent float64 reference of the DeepSeek-V4 KV compressor.

This module is written from the model math (``shared/spec/model-math.md`` §3,
DeepSeek's own reference inference code paraphrased) and from the byte formats of
``shared/spec/store-and-jit.md`` §5.2, §5.6, §6.2 and §6.3.  It deliberately shares
no code with any flashcompress backend: it only imports constants from
``flashcompress.layouts``.  Tests and ``python -m flashcompress demo`` use it to check
the backends end to end.  Everything runs on the CPU in float64 (torch is the only
dependency; vectors are 1-D float64 tensors, bytes are uint8 tensors).

What it models, for ONE request whose projections ``kv_score_input`` are known for
positions ``0 .. T-1`` (whole sequence, no chunking, no state pool, no paging):

* :func:`pool_request`: the softmax pooling of every complete window (ratio 4 with
  the overlapping previous window, ratio 128 without), in float64.  Online ratio 128
  is the same math.
* :func:`model_request`: per window ``w`` the pooled vector, RMSNorm, interleaved RoPE
  at position ``w * r`` on the last 64 dims (cos/sin taken from the given fp32 table,
  evaluated in float64) and, for head_dim 128 (the indexer), the Sylvester Hadamard
  transform scaled by 1/sqrt(128).  No intermediate rounding.
* Naive quantisers and encoders (:func:`encode_entry`) giving the nominal bytes of a
  cache entry for the float64 vector: main KV V4 (584 B), indexer FP8 (132 B),
  indexer FP4 (68 B) and the bf16 rows (1024 B).
* :func:`check_entry`: a tolerant comparison of stored bytes against the model.  A
  payload code may differ from the nominal one only if the float64 value lies within
  ``rel_eps`` (relative to the row RMS and the element) of a rounding boundary of the
  whole quantisation chain; a block scale only if the block's amax is that close to a
  power-of-two boundary.  Every discrepancy is reported with its position, both
  codes, both values and the code distance.

The elementwise quantisers work on whole float64 tensors (``torch.round`` rounds half
to even), one small function per number format, so that they stay easy to check
against the format definitions while being fast enough for CI.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from flashcompress import layouts as L

__all__ = [
    "deepseek_v4_freq_cis",
    "checkpoint_ape",
    "pool_window",
    "pool_request",
    "rms_norm",
    "rope",
    "hadamard",
    "Entry",
    "model_request",
    "num_windows",
    "bf16_round",
    "bf16_bits",
    "bf16_from_bits",
    "e4m3_round",
    "e4m3_encode",
    "e4m3_decode",
    "e2m1_encode",
    "e2m1_decode",
    "ue8m0_ceil",
    "EncodedEntry",
    "encode_entry",
    "Mismatch",
    "EntryCheck",
    "check_entry",
    "relative_error",
]

F64 = torch.float64
ROPE_DIM = L.ROPE_DIM


def _f64(x) -> torch.Tensor:
    return torch.as_tensor(x).detach().to("cpu", F64)


# ---------------------------------------------------------------------------
# RoPE table (model-math §3.7): base 160000 with YaRN (16, 65536, 32, 1), no mscale
# ---------------------------------------------------------------------------


def deepseek_v4_freq_cis(
    max_pos: int,
    *,
    base: float = 160000.0,
    factor: float = 16.0,
    original_seq_len: int = 65536,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
) -> torch.Tensor:
    """The compressed layers' RoPE table, complex64 ``[max_pos, 32]``, built in fp32.

    ``f_i = base^(-2i/64)``; with ``D(n) = 64 ln(L0 / (2 pi n)) / (2 ln base)``,
    ``low = floor(D(beta_fast))``, ``high = ceil(D(beta_slow))`` and
    ``ramp_i = clamp((i - low) / (high - low), 0, 1)``, the YaRN frequency is
    ``f_i (1 - ramp_i) + (f_i / factor) ramp_i``.  Angles are fp32 ``pos * f_i``,
    cos/sin fp32, unit modulus.
    """
    n_pairs = ROPE_DIM // 2

    def corr_dim(n_rot: float) -> float:
        return ROPE_DIM * math.log(original_seq_len / (2 * math.pi * n_rot)) / (2 * math.log(base))

    low = max(math.floor(corr_dim(beta_fast)), 0)
    high = min(math.ceil(corr_dim(beta_slow)), ROPE_DIM - 1)
    if low == high:
        high += 0.001
    i = torch.arange(n_pairs, dtype=torch.float32)
    freqs = 1.0 / (base ** (torch.arange(0, ROPE_DIM, 2, dtype=torch.float32) / ROPE_DIM))
    ramp = ((i - low) / (high - low)).clamp(0.0, 1.0)
    freqs = freqs * (1 - ramp) + (freqs / factor) * ramp
    t = torch.arange(max_pos, dtype=torch.float32)
    angles = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(angles), angles)


# ---------------------------------------------------------------------------
# Pooling (model-math §3.2-§3.5)
# ---------------------------------------------------------------------------


def _coff(ratio: int) -> int:
    return 2 if ratio == 4 else 1


def checkpoint_ape(ape: torch.Tensor, ratio: int, head_dim: int) -> torch.Tensor:
    """The checkpoint's ``ape[r, coff*d]`` (float64) from the kernel layout.

    Ratio 4: the kernel receives ``[8, d]`` whose rows 0..3 are ``A[i, 0:d]`` (overlap
    half) and rows 4..7 are ``A[i, d:2d]`` (own half).  Ratio 128: ``[128, d]`` is the
    checkpoint tensor itself.
    """
    a = _f64(ape)
    if ratio == 4:
        assert tuple(a.shape) == (8, head_dim), a.shape
        return torch.cat([a[0:4], a[4:8]], dim=1)
    assert tuple(a.shape) == (ratio, head_dim), a.shape
    return a.clone()


def num_windows(num_tokens: int, ratio: int) -> int:
    """Complete windows (= compressed entries) after ``num_tokens`` tokens."""
    return num_tokens // ratio


def _softmax_pool(values: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Per-channel softmax over dim 0 of ``logits`` (``-inf`` = absent), weighted sum of ``values``."""
    m = logits.max(dim=0).values
    e = torch.exp(logits - m)  # exp(-inf) = 0: absent candidates get weight 0
    return (e * values).sum(dim=0) / e.sum(dim=0)


def pool_window(x: torch.Tensor, a: torch.Tensor, w: int, ratio: int, head_dim: int) -> torch.Tensor:
    """Entry ``w`` of one request, float64 ``[d]``.

    ``x``: the request's projections, float64 ``[T, 2*coff*d]`` (kv columns then score
    columns); ``a``: checkpoint ``ape`` ``[r, coff*d]``.  Token ``t`` has logits
    ``score[t] + a[t mod r]`` over all ``coff*d`` columns.

    * Ratio 128: one softmax per channel over the 128 tokens of window ``w``.
    * Ratio 4: one softmax per channel over 8 candidates: the previous window's tokens
      with their first-half ("overlap") columns and the own window's tokens with their
      second-half ("own") columns; window 0 has no previous window (4 candidates).
    """
    d = head_dim
    r = ratio
    cw = _coff(r) * d
    kv = x[:, :cw]
    score = x[:, cw:]
    own = range(w * r, (w + 1) * r)
    if r != 4:
        vals = torch.stack([kv[t] for t in own])
        logits = torch.stack([score[t] + a[t % r] for t in own])
        return _softmax_pool(vals, logits)
    vals, logits = [], []
    for t in range((w - 1) * r, w * r):  # previous window, overlap half
        if t < 0:
            vals.append(torch.zeros(d, dtype=F64))
            logits.append(torch.full((d,), -math.inf, dtype=F64))
        else:
            vals.append(kv[t, 0:d])
            logits.append(score[t, 0:d] + a[t % r, 0:d])
    for t in own:  # own window, own half
        vals.append(kv[t, d : 2 * d])
        logits.append(score[t, d : 2 * d] + a[t % r, d : 2 * d])
    return _softmax_pool(torch.stack(vals), torch.stack(logits))


def pool_request(
    kv_score_input: torch.Tensor, ape: torch.Tensor, *, ratio: int, head_dim: int
) -> torch.Tensor:
    """All complete windows of one request: float64 ``[T // r, d]``.

    ``kv_score_input``: the request's rows for positions ``0..T-1`` (``[T, 4d]`` for
    ratio 4, ``[T, 2d]`` for ratio 128), any float dtype; ``ape`` in kernel layout.
    """
    assert ratio in L.SUPPORTED_RATIOS
    x = _f64(kv_score_input)
    assert x.shape[1] == 2 * _coff(ratio) * head_dim, x.shape
    a = checkpoint_ape(ape, ratio, head_dim)
    n = num_windows(x.shape[0], ratio)
    out = torch.zeros((n, head_dim), dtype=F64)
    for w in range(n):
        out[w] = pool_window(x, a, w, ratio, head_dim)
    return out


# ---------------------------------------------------------------------------
# Norm, RoPE, Hadamard (model-math §3.6-§3.8)
# ---------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the whole vector, float64."""
    x = _f64(x)
    return x / math.sqrt(float((x * x).mean()) + eps) * _f64(weight)


def rope(y: torch.Tensor, pos: int, freq_cis: torch.Tensor) -> torch.Tensor:
    """Rotate the last 64 dims of ``y`` as 32 interleaved (re, im) pairs by the angles
    of table row ``pos`` (cos/sin read from the fp32 table, arithmetic in float64)."""
    y = _f64(y)
    out = y.clone()
    n0 = y.shape[0] - ROPE_DIM
    row = freq_cis[pos].detach().to("cpu")
    cos = row.real.to(F64)  # [32]: pair i
    sin = row.imag.to(F64)
    a = y[n0::2]  # pair i is (y[n0 + 2i], y[n0 + 2i + 1])
    b = y[n0 + 1 :: 2]
    out[n0::2] = a * cos - b * sin
    out[n0 + 1 :: 2] = a * sin + b * cos
    return out


def _sylvester(n: int) -> torch.Tensor:
    h = torch.ones((1, 1), dtype=F64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    return h


_H128 = _sylvester(L.HADAMARD_DIM)


def hadamard(y: torch.Tensor) -> torch.Tensor:
    """Sylvester (natural order) Hadamard transform of a 128-vector, scaled by 1/sqrt(128)."""
    y = _f64(y)
    assert tuple(y.shape) == (L.HADAMARD_DIM,)
    return (_H128 @ y) / math.sqrt(L.HADAMARD_DIM)


@dataclass
class Entry:
    """The model of one compressed entry (window ``window``) of a request; float64 [d] vectors."""

    window: int
    position: int  # RoPE position = window * ratio
    pooled: torch.Tensor  # softmax pool, pre-norm (what compress_forward returns)
    normed: torch.Tensor  # RMSNorm'd
    roped: torch.Tensor  # + RoPE on the last 64 dims
    final: torch.Tensor  # what gets quantised: roped, or Hadamard(roped) for head_dim 128


def model_request(
    kv_score_input: torch.Tensor,
    ape: torch.Tensor,
    *,
    ratio: int,
    head_dim: int,
    norm_weight: torch.Tensor,
    norm_eps: float,
    freq_cis: torch.Tensor,
    pooled: torch.Tensor | None = None,
) -> list[Entry]:
    """Every complete window of one request, modelled end to end in float64.

    ``pooled`` may pass a previous :func:`pool_request` result to avoid recomputing it.
    """
    if pooled is None:
        pooled = pool_request(kv_score_input, ape, ratio=ratio, head_dim=head_dim)
    wt = _f64(norm_weight)
    entries = []
    for w in range(pooled.shape[0]):
        x = pooled[w]
        y = rms_norm(x, wt, norm_eps)
        z = rope(y, w * ratio, freq_cis)
        f = hadamard(z) if head_dim == L.HADAMARD_DIM else z
        entries.append(Entry(w, w * ratio, x, y, z, f))
    return entries


# ---------------------------------------------------------------------------
# Number formats (store-and-jit.md §4.3), elementwise on float64 tensors;
# codes and bit patterns are int64 tensors
# ---------------------------------------------------------------------------


def _round_to_grid(v, mant_bits: int, min_normal_exp: int) -> torch.Tensor:
    """Round to the nearest value with ``mant_bits`` fraction bits (ties to even),
    gradual underflow below ``2**min_normal_exp``; no overflow handling."""
    v = _f64(v)
    a = v.abs()
    _, ex = torch.frexp(a)  # a = m * 2**ex, m in [0.5, 1)
    lead = torch.clamp(ex.to(torch.int64) - 1, min=min_normal_exp)  # exponent of the leading bit
    step = torch.ldexp(torch.ones_like(a), lead - mant_bits)
    q = torch.round(a / step) * step
    return torch.copysign(q, v)


def bf16_round(v) -> torch.Tensor:
    """Round-to-nearest-even to bf16 (8 significant bits), as float64."""
    return _round_to_grid(v, 7, -126)


def bf16_bits(v) -> torch.Tensor:
    """bf16 bit patterns (0..0xFFFF) of RNE(v)."""
    q = bf16_round(v).to(torch.float32)  # exact: q is on the bf16 grid
    return (q.view(torch.int32).to(torch.int64) >> 16) & 0xFFFF


def bf16_from_bits(bits) -> torch.Tensor:
    b = torch.as_tensor(bits).to(torch.int64) << 16
    b = torch.where(b >= 2**31, b - 2**32, b)
    return b.to(torch.int32).view(torch.float32).to(F64)


E4M3_MAX = L.FP8_E4M3_MAX


def e4m3_round(v) -> torch.Tensor:
    """OCP e4m3fn value of RNE(clip(v, +-448)): 3 fraction bits, min normal 2^-6, step 2^-9 below."""
    return _round_to_grid(_f64(v).clamp(-E4M3_MAX, E4M3_MAX), 3, -6)


def e4m3_encode(v) -> torch.Tensor:
    """e4m3fn codes of RNE(clip(v, +-448)); the sign bit follows the sign of ``v``."""
    v = _f64(v)
    q = e4m3_round(v).abs()
    _, ex = torch.frexp(q)
    lead = ex.to(torch.int64) - 1
    normal = q >= 2.0**-6
    sub_code = torch.round(q / 2.0**-9).to(torch.int64)  # exponent field 0
    mant = torch.round(q / torch.ldexp(torch.ones_like(q), lead - 3)).to(torch.int64) - 8
    norm_code = ((lead + 7) << 3) | mant
    code = torch.where(normal, norm_code, sub_code)
    return code | (torch.signbit(v).to(torch.int64) << 7)


def e4m3_decode(code) -> torch.Tensor:
    c = torch.as_tensor(code).to(torch.int64)
    sign = torch.where((c & 0x80) != 0, -1.0, 1.0).to(F64)
    exp = (c >> 3) & 0xF
    mant = (c & 0x7).to(F64)
    mag = torch.where(exp == 0, mant * 2.0**-9, torch.ldexp(1.0 + mant / 8.0, exp - 7))
    mag = torch.where((c & 0x7F) == 0x7F, math.nan, mag)
    return sign * mag


E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=F64)
E2M1_THRESHOLDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=F64)


def e2m1_encode(v) -> torch.Tensor:
    """Threshold e2m1 code (store-and-jit §4.3 ``e2m1_thr``): magnitude code = number of
    thresholds strictly below ``min(|v|, 6)`` (ties toward zero); sign bit only for a
    negative value with a non-zero code (no negative zero).  Codes 0..15."""
    v = _f64(v)
    a = torch.clamp(v.abs(), max=6.0)
    mag = (a[..., None] > E2M1_THRESHOLDS).sum(dim=-1)
    neg = (v < 0) & (mag != 0)
    return mag | (neg.to(torch.int64) << 3)


def e2m1_decode(code) -> torch.Tensor:
    c = torch.as_tensor(code).to(torch.int64)
    return torch.where((c & 0x8) != 0, -1.0, 1.0).to(F64) * E2M1_GRID[c & 0x7]


def ue8m0_ceil(v) -> torch.Tensor:
    """Byte ``k + 127`` of the smallest power of two ``2**k >= v`` (v > 0)."""
    v = _f64(v)
    m, ex = torch.frexp(v)  # v = m * 2**ex
    ex = ex.to(torch.int64)
    return torch.where(m == 0.5, ex - 1, ex) + 127


def _ordinal(code: torch.Tensor, sign_mask: int) -> torch.Tensor:
    """Map sign-magnitude codes onto a monotone integer axis (-0 just below +0)."""
    c = torch.as_tensor(code).to(torch.int64)
    mag = c & ~sign_mask
    return torch.where((c & sign_mask) != 0, -mag - 1, mag)


def _u8(x) -> torch.Tensor:
    return torch.as_tensor(x).to(torch.int64).to(torch.uint8)


# ---------------------------------------------------------------------------
# Nominal cache-entry bytes (store-and-jit §5.2, §5.6, §6.2, §6.3)
# ---------------------------------------------------------------------------


@dataclass
class EncodedEntry:
    """Bytes of one cache entry as uint8 tensors: ``data`` (token record) and ``scale``
    (per-token scales).  For V4, ``scale`` has the 7 written bytes; byte 7 (pad) is never
    written."""

    fmt: str
    data: torch.Tensor
    scale: torch.Tensor


def encode_v4(y: torch.Tensor) -> EncodedEntry:
    """Main KV, V4 layout: 448 e4m3 (7 tiles of 64, each bf16-rounded first, ue8m0
    scale ``ceil_pow2(max(1e-4, amax) / 448)``) + 64 bf16 rope values; 7 scale bytes."""
    y = _f64(y)
    assert tuple(y.shape) == (512,)
    nope = L.V4_NOPE_DIM
    data = torch.zeros(L.MAIN_V4.data_bytes, dtype=torch.int64)
    scale = torch.zeros(L.V4_NUM_TILES, dtype=torch.int64)
    for k in range(L.V4_NUM_TILES):
        u = bf16_round(y[k * L.V4_TILE : (k + 1) * L.V4_TILE])
        e = int(ue8m0_ceil(max(L.AMAX_FLOOR, float(u.abs().max())) / E4M3_MAX))
        scale[k] = e
        data[k * L.V4_TILE : (k + 1) * L.V4_TILE] = e4m3_encode(u * 2.0 ** (127 - e))
    rope_bits = bf16_bits(y[nope:])
    data[nope::2] = rope_bits & 0xFF  # little-endian bf16
    data[nope + 1 :: 2] = rope_bits >> 8
    return EncodedEntry("v4", _u8(data), _u8(scale))


def encode_bf16(y: torch.Tensor) -> EncodedEntry:
    """bf16 store: 512 bf16 values (1024 B, little-endian), no scales."""
    y = _f64(y)
    assert tuple(y.shape) == (512,)
    bits = bf16_bits(y)
    data = torch.stack([bits & 0xFF, bits >> 8], dim=1).reshape(-1)
    return EncodedEntry("bf16", _u8(data), torch.zeros(0, dtype=torch.uint8))


def encode_idx_fp8(h: torch.Tensor) -> EncodedEntry:
    """Indexer FP8: one fp32 scale ``max(1e-4, amax) / 448`` per token, codes
    ``e4m3(clip(h / scale))``."""
    h = _f64(h)
    assert tuple(h.shape) == (128,)
    s = torch.tensor([max(L.AMAX_FLOOR, float(h.abs().max())) / E4M3_MAX], dtype=torch.float32)
    data = e4m3_encode(h / float(s[0]))
    return EncodedEntry("idx_fp8", _u8(data), s.view(torch.uint8).clone())


def encode_idx_fp4(h: torch.Tensor) -> EncodedEntry:
    """Indexer FP4: 4 groups of 32, ue8m0 scale ``ceil_pow2(max(1e-4, amax) / 6)``,
    threshold e2m1 codes packed two per byte (even dim in the low nibble)."""
    h = _f64(h)
    assert tuple(h.shape) == (128,)
    g = L.FP4_GROUP
    codes = torch.zeros(128, dtype=torch.int64)
    scale = torch.zeros(128 // g, dtype=torch.int64)
    for k in range(128 // g):
        blk = h[k * g : (k + 1) * g]
        e = int(ue8m0_ceil(max(L.AMAX_FLOOR, float(blk.abs().max())) / 6.0))
        scale[k] = e
        codes[k * g : (k + 1) * g] = e2m1_encode(blk * 2.0 ** (127 - e))
    data = codes[0::2] | (codes[1::2] << 4)
    return EncodedEntry("idx_fp4", _u8(data), _u8(scale))


_ENCODERS = {"v4": encode_v4, "bf16": encode_bf16, "idx_fp8": encode_idx_fp8, "idx_fp4": encode_idx_fp4}


def encode_entry(fmt: str, final: torch.Tensor) -> EncodedEntry:
    """Nominal bytes of an entry in format ``fmt`` (``v4``, ``bf16``, ``idx_fp8``, ``idx_fp4``)."""
    return _ENCODERS[fmt](final)


# ---------------------------------------------------------------------------
# Tolerant comparison of stored bytes against the model
# ---------------------------------------------------------------------------


@dataclass
class Mismatch:
    """One stored code outside what the float64 model admits."""

    part: str  # "scale", "nope", "rope", "data"
    index: int  # dim (payload) or block (scale)
    actual: int  # stored code / byte / bit pattern
    expected: int  # nominal code from the float64 model
    actual_value: float
    expected_value: float
    pre_quant: float  # float64 model value in the quantiser's domain (after scaling)
    distance: int  # code steps between actual and expected
    allowed: tuple[int, int] = (0, 0)  # admissible codes (lowest, highest)

    def describe(self) -> str:
        return (
            f"{self.part}[{self.index}]: stored 0x{self.actual:x} (={self.actual_value:.9g}) "
            f"model 0x{self.expected:x} (={self.expected_value:.9g}), float64 pre-quant "
            f"{self.pre_quant:.12g}, {self.distance} code step(s) apart, admissible "
            f"0x{self.allowed[0]:x}..0x{self.allowed[1]:x}"
        )


@dataclass
class EntryCheck:
    """Result of :func:`check_entry` for one entry."""

    fmt: str
    mismatches: list[Mismatch] = field(default_factory=list)
    codes: int = 0  # payload codes compared
    ties: int = 0  # codes that differ from nominal but lie in the admissible (tie) window
    scale_ties: int = 0  # power-of-two scales that differ from nominal but are admissible

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def describe(self, limit: int = 3) -> str:
        if self.ok:
            return f"{self.fmt}: ok ({self.codes} codes, {self.ties} tie flips, {self.scale_ties} scale ties)"
        lines = [f"{self.fmt}: {len(self.mismatches)} mismatching code(s); first:"]
        lines += ["  " + m.describe() for m in self.mismatches[:limit]]
        return "\n".join(lines)


def _widen(y: torch.Tensor, rel_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Bounds ``y -+ rel_eps * (rms(y) + |y|)``: how far a correct fp32 pipeline may be."""
    rms = math.sqrt(float((y * y).mean()))
    tol = rel_eps * (rms + y.abs())
    return y - tol, y + tol


def _check_codes(res: EntryCheck, part: str, offset: int, actual, nominal, lo, hi, pre, sign_mask: int,
                 decode) -> None:
    """Record codes of ``actual`` outside ``[lo, hi]`` (codes, compared as ordinals)."""
    oa, on = _ordinal(actual, sign_mask), _ordinal(nominal, sign_mask)
    ol, oh = _ordinal(lo, sign_mask), _ordinal(hi, sign_mask)
    ol, oh = torch.minimum(ol, oh), torch.maximum(ol, oh)
    res.codes += actual.numel()
    bad = (oa < ol) | (oa > oh)
    res.ties += int(((oa != on) & ~bad).sum())
    for i in torch.nonzero(bad).flatten().tolist():
        res.mismatches.append(
            Mismatch(part, offset + i, int(actual[i]), int(nominal[i]), float(decode(actual[i])),
                     float(decode(nominal[i])), float(pre[i]), int(abs(oa[i] - on[i])), (int(lo[i]), int(hi[i])))
        )


_DIV_SLACK = 2.0**-22  # one fp32 rounding of a quotient/product, with margin


def _check_pow2_scale(res, index, actual_e, amax_lo, amax_nom, amax_hi, qmax):
    """ue8m0 scale byte of one block; returns the exponent to decode the block with."""
    e_nom = int(ue8m0_ceil(max(L.AMAX_FLOOR, amax_nom) / qmax))
    e_lo = int(ue8m0_ceil(max(L.AMAX_FLOOR, amax_lo) / qmax * (1 - _DIV_SLACK)))
    e_hi = int(ue8m0_ceil(max(L.AMAX_FLOOR, amax_hi) / qmax * (1 + _DIV_SLACK)))
    if not e_lo <= actual_e <= e_hi:
        res.mismatches.append(
            Mismatch("scale", index, actual_e, e_nom, 2.0 ** (actual_e - 127), 2.0 ** (e_nom - 127),
                     amax_nom / qmax, abs(actual_e - e_nom), (e_lo, e_hi))
        )
        return e_nom
    if actual_e != e_nom:
        res.scale_ties += 1
    return actual_e


def _le16(b: torch.Tensor) -> torch.Tensor:
    """Little-endian 16-bit words of a byte tensor, as int64."""
    b = b.to(torch.int64)
    return b[0::2] | (b[1::2] << 8)


def _check_bf16(res, part, offset, bits_actual, y, y_lo, y_hi):
    _check_codes(res, part, offset, bits_actual, bf16_bits(y), bf16_bits(y_lo), bf16_bits(y_hi), y, 0x8000,
                 lambda c: bf16_from_bits(c))


def _check_v4(res: EntryCheck, y, data, scale, rel_eps):
    y_lo, y_hi = _widen(y, rel_eps)
    tol = y_hi - y
    a_lo = torch.clamp(y.abs() - tol, min=0.0)
    a_hi = y.abs() + tol
    for k in range(L.V4_NUM_TILES):
        sl = slice(k * L.V4_TILE, (k + 1) * L.V4_TILE)
        e = _check_pow2_scale(
            res, k, int(scale[k]),
            float(bf16_round(a_lo[sl]).max()), float(bf16_round(y[sl]).abs().max()),
            float(bf16_round(a_hi[sl]).max()), E4M3_MAX,
        )
        inv = 2.0 ** (127 - e)
        _check_codes(
            res, "nope", k * L.V4_TILE, data[sl].to(torch.int64),
            e4m3_encode(bf16_round(y[sl]) * inv), e4m3_encode(bf16_round(y_lo[sl]) * inv),
            e4m3_encode(bf16_round(y_hi[sl]) * inv), y[sl] * inv, 0x80, e4m3_decode,
        )
    nope = L.V4_NOPE_DIM
    bits = _le16(data[nope : L.MAIN_V4.data_bytes])
    _check_bf16(res, "rope", nope, bits, y[nope:], y_lo[nope:], y_hi[nope:])


def _check_bf16_rows(res: EntryCheck, y, data, scale, rel_eps):
    y_lo, y_hi = _widen(y, rel_eps)
    bits = _le16(data[: 2 * y.shape[0]])
    nope = L.V4_NOPE_DIM
    _check_bf16(res, "nope", 0, bits[:nope], y[:nope], y_lo[:nope], y_hi[:nope])
    _check_bf16(res, "rope", nope, bits[nope:], y[nope:], y_lo[nope:], y_hi[nope:])


def _check_idx_fp8(res: EntryCheck, h, data, scale, rel_eps):
    h_lo, h_hi = _widen(h, rel_eps)
    tol = h_hi - h
    s_act = float(scale[:4].clone().view(torch.float32)[0])
    amax = float(h.abs().max())
    amax_lo = float(torch.clamp(h.abs() - tol, min=0.0).max())
    amax_hi = float((h.abs() + tol).max())
    s_nom = max(L.AMAX_FLOOR, amax) / E4M3_MAX
    s_lo = max(L.AMAX_FLOOR, amax_lo) / E4M3_MAX * (1 - _DIV_SLACK)
    s_hi = max(L.AMAX_FLOOR, amax_hi) / E4M3_MAX * (1 + _DIV_SLACK)
    s_nom32 = torch.tensor([s_nom], dtype=torch.float32)
    if not (math.isfinite(s_act) and s_lo <= s_act <= s_hi):
        res.mismatches.append(
            Mismatch("scale", 0, int(scale[:4].clone().view(torch.int32)[0]) & 0xFFFFFFFF,
                     int(s_nom32.view(torch.int32)[0]) & 0xFFFFFFFF, s_act, float(s_nom32[0]), s_nom, -1)
        )
        s_act = float(s_nom32[0])
    # (an fp32 scale that differs from fp32(float64 quotient) in the last bits is normal
    # fp32 arithmetic, not a tie: it is accepted without being counted)
    inv = 1.0 / s_act
    lo = h_lo * inv
    hi = h_hi * inv
    lo = lo - lo.abs() * _DIV_SLACK
    hi = hi + hi.abs() * _DIV_SLACK
    _check_codes(res, "data", 0, data[:128].to(torch.int64), e4m3_encode(h * inv), e4m3_encode(lo),
                 e4m3_encode(hi), h * inv, 0x80, e4m3_decode)


def _check_idx_fp4(res: EntryCheck, h, data, scale, rel_eps):
    h_lo, h_hi = _widen(h, rel_eps)
    tol = h_hi - h
    packed = data[:64].to(torch.int64)
    codes = torch.stack([packed & 0xF, packed >> 4], dim=1).reshape(-1)
    g = L.FP4_GROUP
    for k in range(128 // g):
        sl = slice(k * g, (k + 1) * g)
        e = _check_pow2_scale(
            res, k, int(scale[k]),
            float(torch.clamp(h[sl].abs() - tol[sl], min=0.0).max()), float(h[sl].abs().max()),
            float((h[sl].abs() + tol[sl]).max()), 6.0,
        )
        inv = 2.0 ** (127 - e)
        _check_codes(res, "data", k * g, codes[sl], e2m1_encode(h[sl] * inv), e2m1_encode(h_lo[sl] * inv),
                     e2m1_encode(h_hi[sl] * inv), h[sl] * inv, 0x8, e2m1_decode)


_CHECKERS = {"v4": _check_v4, "bf16": _check_bf16_rows, "idx_fp8": _check_idx_fp8, "idx_fp4": _check_idx_fp4}


def check_entry(
    fmt: str, final: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, *, rel_eps: float = 4e-6
) -> EntryCheck:
    """Compare one stored entry (``data``/``scale`` as uint8 tensors) with the model.

    ``final`` is the float64 vector before quantisation (:attr:`Entry.final`).  The
    stored code of every element must lie between the codes the whole quantisation
    chain gives for ``final -+ rel_eps * (rms(final) + |final|)``, where each block's
    scale is the stored one provided that itself lies in the admissible range (amax
    moved by the same tolerance, plus one fp32 rounding of the division).  With
    ``rel_eps`` at the level of fp32 arithmetic this admits a differing code only at
    (near-)ties of a rounding boundary.
    """
    res = EntryCheck(fmt)
    data = torch.as_tensor(data).detach().to("cpu", torch.uint8)
    scale = torch.as_tensor(scale).detach().to("cpu", torch.uint8)
    _CHECKERS[fmt](res, _f64(final), data, scale, rel_eps)
    return res


def relative_error(actual, expected) -> float:
    """``max |actual - expected| / rms(expected)`` of one vector (normwise relative)."""
    a = _f64(actual)
    b = _f64(expected)
    rms = math.sqrt(float((b * b).mean()))
    return float((a - b).abs().max()) / max(rms, 1e-300)
