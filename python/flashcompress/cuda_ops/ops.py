"""The JIT backend's op entry points (same functions and signatures as ``torch_backend.ops``).

Called by ``flashcompress.api`` after validation, for CUDA tensors.
"""

from __future__ import annotations

from ..torch_backend.ops import compress_and_store, compress_forward, compress_norm_rope_store

__all__ = ["compress_and_store", "compress_forward", "compress_norm_rope_store"]
