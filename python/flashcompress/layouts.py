"""Byte layouts shared by every backend: plan rows and KV-cache entries.

This module is the single Python definition of every byte format flashcompress
reads or writes and of the tensor widths of each layer kind.  The C++ side
defines the same facts once, in ``jit_kernel/layout.h``; ``tests/test_layouts.py``
compiles that header on the host and checks that the two agree (cache formats,
layer kinds, plan row sizes, offsets and sentinels); ``tests/test_store_*.py``
pin the cache bytes.

All integers are little-endian.  Plan tensors are ``uint8 [rows, ROW_BYTES]``.

DecodePlan (16 B, one row per request)::

    0..3   u32 seq_len      sequence length including the current token
    4..7   i32 write_loc    state row receiving the current token's input row
    8..11  i32 read_page_0  state page of position max(seq_len-1-r, 0)
    12..15 i32 read_page_1  state page of position seq_len-1

CompressPlan (16 B, one row per compress event of a prefill)::

    0..3   u32 seq_len      event position + 1; 0xFFFFFFFF marks an invalid row
    4..5   u16 ragged_id    row of the event token in the ragged input
    6..7   u16 buffer_len   leading window entries read from the state buffer
    8..11  i32 read_page_0  page of max(p-r, 0) if buffer_len > 0, else -1
    12..15 i32 read_page_1  page of p if buffer_len > 0, else the batch index

WritePlan (8 B, one row per token persisted by a prefill)::

    0..3   u32 ragged_id    0xFFFFFFFF marks an invalid row
    4..7   i32 write_loc    destination state row (-1 when invalid)

Online C128 prefill uses the CompressPlan layout for both of its lists, with
``buffer_len`` = segment length, ``read_page_0`` = write slot and
``read_page_1`` = load slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from .v41.layouts import LATENT_DIM, KVLayout, RowAddressing

# --------------------------------------------------------------------------
# Plan rows
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    name: str
    offset: int
    size: int
    signed: bool


@dataclass(frozen=True)
class RowLayout:
    name: str
    row_bytes: int
    fields: tuple[Field, ...]

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)


DECODE_PLAN: Final = RowLayout(
    "DecodePlan",
    16,
    (
        Field("seq_len", 0, 4, False),
        Field("write_loc", 4, 4, True),
        Field("read_page_0", 8, 4, True),
        Field("read_page_1", 12, 4, True),
    ),
)

COMPRESS_PLAN: Final = RowLayout(
    "CompressPlan",
    16,
    (
        Field("seq_len", 0, 4, False),
        Field("ragged_id", 4, 2, False),
        Field("buffer_len", 6, 2, False),
        Field("read_page_0", 8, 4, True),
        Field("read_page_1", 12, 4, True),
    ),
)

WRITE_PLAN: Final = RowLayout(
    "WritePlan",
    8,
    (
        Field("ragged_id", 0, 4, False),
        Field("write_loc", 4, 4, True),
    ),
)

PLAN_ROW_BYTES: Final = 16
WRITE_ROW_BYTES: Final = 8
INVALID_U32: Final = 0xFFFFFFFF
# Sentinel rows, as bytes.
INVALID_COMPRESS_ROW: Final = bytes.fromhex("ffffffff00000000ffffffffffffffff")
INVALID_WRITE_ROW: Final = bytes.fromhex("ffffffffffffffff")
# ragged ids are u16 in CompressPlan and batch ids are packed into the upper
# 16 bits of a stage-0 WritePlan, so both must stay below this bound.
MAX_RAGGED_ID: Final = 65536

# --------------------------------------------------------------------------
# Model constants
# --------------------------------------------------------------------------

SUPPORTED_RATIOS: Final = (4, 128)
ROPE_DIM: Final = 64
HADAMARD_DIM: Final = 128
# head dims a ratio supports (spec/compressor.md §1.7)
HEAD_DIMS: Final = {4: (128, 512), 128: (512,)}
ONLINE_HEAD_DIMS: Final = (512,)


def window_size(ratio: int) -> int:
    """Number of tokens pooled into one compressed entry (2r with overlap)."""
    return 2 * ratio if ratio == 4 else ratio


def state_width(ratio: int, head_dim: int, online: bool = False) -> int:
    """Last dim of one state-pool row."""
    if online:
        return 3 * head_dim
    return (4 if ratio == 4 else 2) * head_dim


def input_width(ratio: int, head_dim: int) -> int:
    """Last dim of ``kv_score_input``: [kv | score], doubled for overlap."""
    return (4 if ratio == 4 else 2) * head_dim


@dataclass(frozen=True)
class LayerKind:
    """One compressor layer kind: the widths and row counts its tensors must have."""

    ratio: int
    head_dim: int
    online: bool
    state_width: int  # last dim of a state-pool row
    input_width: int  # last dim of kv_score_input
    ape_rows: int     # rows of ape (the positional bias)


def _layer_kind(ratio: int, head_dim: int, online: bool) -> LayerKind:
    return LayerKind(ratio, head_dim, online, state_width(ratio, head_dim, online),
                     input_width(ratio, head_dim), 2 * ratio if ratio == 4 else ratio)


# Every supported (ratio, head_dim, online) combination.
LAYER_KINDS: Final = {
    (k.ratio, k.head_dim, k.online): k
    for k in [_layer_kind(r, h, False) for r, hs in HEAD_DIMS.items() for h in hs]
    + [_layer_kind(128, h, True) for h in ONLINE_HEAD_DIMS]
}


def mtp_write_pad(ratio: int, ring_size: int) -> int:
    """Trailing tokens a prefill keeps resident for speculative decoding."""
    w = window_size(ratio)
    return ring_size - w + 2 if ring_size > w else 0


# --------------------------------------------------------------------------
# KV-cache formats (spec/store-and-jit.md §5-§6)
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheFormat:
    """One paged cache entry format.

    Block-split (``interleaved`` False): ``data_bytes`` per token live at
    ``page * page_bytes + slot * data_bytes``; ``scale_bytes`` per token live after the
    page's data region at ``page * page_bytes + page_size * data_bytes + slot * scale_bytes``.
    Interleaved (the V4.1 ``_new`` layouts): a token's scales follow its data, at
    ``page * page_bytes + slot * bytes_per_token (+ data_bytes)``.
    A page is padded up to a multiple of ``page_align`` bytes.
    """

    name: str
    head_dim: int
    data_bytes: int
    scale_bytes: int
    page_align: int
    interleaved: bool = False

    @property
    def bytes_per_token(self) -> int:
        return self.data_bytes + self.scale_bytes

    def page_bytes(self, page_size: int) -> int:
        raw = page_size * self.bytes_per_token
        return -(-raw // self.page_align) * self.page_align

    def cache_row_bytes(self, page_size: int) -> int:
        """Bytes of one row of the ``kvcache`` tensor: a page, or for bf16 rows ``page_size`` rows."""
        return self.data_bytes * page_size if self.scale_bytes == 0 else self.page_bytes(page_size)

    def addressing(self, page_size: int) -> RowAddressing:
        """Where slot ``loc``'s data and scale bytes live in a cache of ``page_size``-token pages
        (``v41.layouts.RowAddressing``: data at ``page * page_bytes + s * data_stride``, scales at
        ``page * page_bytes + scale_base + s * scale_stride``)."""
        if self.interleaved:
            stride = self.bytes_per_token
            return RowAddressing(self.page_bytes(page_size), self.data_bytes, stride, self.scale_bytes,
                                 self.data_bytes, stride)
        return RowAddressing(self.cache_row_bytes(page_size), self.data_bytes, self.data_bytes, self.scale_bytes,
                             page_size * self.data_bytes, self.scale_bytes)


def kv_layout_format(layout: KVLayout) -> CacheFormat:
    """The main-KV (head 512) cache format of a V4.1 ``KVLayout``: its byte facts come from
    ``v41.layouts`` (``MAIN_V4`` is the one of ``KVLayout.V4``)."""
    return CacheFormat(layout.value, LATENT_DIM, layout.data_bytes, layout.scale_bytes, layout.page_align,
                       layout.is_interleaved)


# Main KV, V4: 448 e4m3 + 64 bf16 rope = 576 B data; 7 ue8m0 + 1 pad = 8 B.
MAIN_V4: Final = CacheFormat("v4", 512, 576, 8, 576)
# Indexer FP8: 128 e4m3 data; one fp32 scale.
INDEXER_FP8: Final = CacheFormat("idx_fp8", 128, 128, 4, 1)
# Indexer FP4: 64 bytes of e2m1 pairs; 4 ue8m0 scales (one per 32 dims).
INDEXER_FP4: Final = CacheFormat("idx_fp4", 128, 64, 4, 1)
# bf16 store: dense 1024-byte rows addressed directly by out_loc.
BF16_ROWS: Final = CacheFormat("bf16", 512, 1024, 0, 1)
# The main-KV format of each KVLayout (compress_norm_rope_store's ``layout=``); V4 is MAIN_V4.
MAIN_FORMATS: Final = {layout: MAIN_V4 if layout is KVLayout.V4 else kv_layout_format(layout) for layout in KVLayout}
# Names of the main-KV layout formats (the layout values), v4 included.
MAIN_LAYOUT_NAMES: Final = frozenset(f.name for f in MAIN_FORMATS.values())
# Every format a store writes, by name (jit_kernel/layout.h kCacheFormats, in this order).
CACHE_FORMATS: Final = {f.name: f for f in (MAIN_V4, INDEXER_FP8, INDEXER_FP4, BF16_ROWS,
                                            *(MAIN_FORMATS[layout] for layout in KVLayout if layout is not KVLayout.V4))}

V4_NOPE_DIM: Final = 448
V4_TILE: Final = 64
V4_NUM_TILES: Final = 7
FP8_E4M3_MAX: Final = 448.0
AMAX_FLOOR: Final = 1e-4
FP4_GROUP: Final = 32


def select_cache_format(head_dim: int, use_fp4: bool, bf16_store: bool,
                        layout: KVLayout = KVLayout.V4) -> CacheFormat:
    """The cache format ``compress_norm_rope_store`` writes for these flags (a non-V4 ``layout``:
    head 512 only, without ``use_fp4`` / ``bf16_store``, which ``validation`` checks)."""
    if head_dim == 128:
        return INDEXER_FP4 if use_fp4 else INDEXER_FP8
    return BF16_ROWS if bf16_store else MAIN_FORMATS[layout]
