"""flashcompress: DeepSeek-V4 KV compressor kernels.

Public API (imported lazily: ``import flashcompress`` loads neither tvm-ffi nor
CUDA and compiles nothing; the first attribute access imports torch and the
API modules):

  CompressorDecodePlan, CompressorPrefillPlan   plan containers + builders
  compress_forward                              pool KV projections into compressed rows
  compress_norm_rope_store                      RMSNorm + RoPE (+ Hadamard) + quantised paged store
  compress_and_store                            both in one call (CUDA: the fused kernel, no intermediate)
  is_overlap_compress                           ratio 4 uses overlapping windows
  KVLayout, c1_decode_norm_rope_store, c2_decode_norm_rope_store,
  c2_prefill_norm_rope_store, index_k_norm_rope_pack_store
                                                DeepSeek-V4.1 ratio-1/2 layers (flashcompress.v41)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "CompressorDecodePlan",
    "CompressorPrefillPlan",
    "compress_and_store",
    "compress_forward",
    "compress_norm_rope_store",
    "is_overlap_compress",
    "KVLayout",
    "c1_decode_norm_rope_store",
    "c2_decode_norm_rope_store",
    "c2_prefill_norm_rope_store",
    "index_k_norm_rope_pack_store",
    "__version__",
]

_LAZY = {
    "CompressorDecodePlan": "plans",
    "CompressorPrefillPlan": "plans",
    "compress_and_store": "api",
    "compress_forward": "api",
    "compress_norm_rope_store": "api",
    "is_overlap_compress": "api",
    "KVLayout": "v41",
    "c1_decode_norm_rope_store": "v41",
    "c2_decode_norm_rope_store": "v41",
    "c2_prefill_norm_rope_store": "v41",
    "index_k_norm_rope_pack_store": "v41",
}

if TYPE_CHECKING:  # pragma: no cover
    from .api import compress_and_store, compress_forward, compress_norm_rope_store, is_overlap_compress
    from .plans import CompressorDecodePlan, CompressorPrefillPlan
    from .v41 import (KVLayout, c1_decode_norm_rope_store, c2_decode_norm_rope_store, c2_prefill_norm_rope_store,
                      index_k_norm_rope_pack_store)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'flashcompress' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
