"""The JIT backend's op entry points (same functions and signatures as ``torch_backend.ops``).

Called by ``flashcompress.api`` after validation, for CUDA tensors:

  compress_forward           cuda_ops.compress  (``compress`` family, store format "none")
  compress_norm_rope_store   cuda_ops.store     (``store`` family: one warp per row)
  compress_and_store         cuda_ops.compress  (``compress`` family ending in the store epilogue)
"""

from __future__ import annotations

from .compress import compress_and_store, compress_forward
from .store import compress_norm_rope_store

__all__ = ["compress_and_store", "compress_forward", "compress_norm_rope_store"]
