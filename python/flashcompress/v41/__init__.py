"""DeepSeek-V4.1 low-ratio (ratio 1 / 2) compressor ops and their cache layouts.

  KVLayout                        the six compressed-KV byte layouts (:mod:`.layouts`)
  c1_decode_norm_rope_store       ratio 1: norm + RoPE + fp4 fake-quant + store, every token
  c2_decode_norm_rope_store       ratio 2 decode / verify: pair ring + pool + norm + RoPE + store
  c2_prefill_norm_rope_store      ratio 2 extend
  index_k_norm_rope_pack_store    index keys: norm + RoPE + two-stage fp4 into 68-byte slots

The ops are imported on first access, so that ``flashcompress.v41.layouts`` stays
importable from the backends without a cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .layouts import KVLayout, RowAddressing, index_k_addressing, pair_ring_rows, pair_ring_size

_OPS = ("c1_decode_norm_rope_store", "c2_decode_norm_rope_store", "c2_prefill_norm_rope_store",
        "index_k_norm_rope_pack_store")

__all__ = ["KVLayout", "RowAddressing", "index_k_addressing", "pair_ring_rows", "pair_ring_size", *_OPS]

if TYPE_CHECKING:  # pragma: no cover
    from .api import (c1_decode_norm_rope_store, c2_decode_norm_rope_store, c2_prefill_norm_rope_store,
                      index_k_norm_rope_pack_store)


def __getattr__(name: str) -> Any:
    if name not in _OPS:
        raise AttributeError(f"module 'flashcompress.v41' has no attribute {name!r}")
    from . import api

    value = getattr(api, name)
    globals()[name] = value
    return value
