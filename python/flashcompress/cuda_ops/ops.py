"""The JIT backend's op entry points (same functions and signatures as ``torch_backend.ops``).

Called by ``flashcompress.api`` after validation, for CUDA tensors:

  compress_forward           cuda_ops.compress (the ``compress`` family, store format "none")
  compress_norm_rope_store   the PyTorch backend on the GPU until the ``store`` family lands
  compress_and_store         the two-step path until the fused store epilogue lands
"""

from __future__ import annotations

import torch

from ..layouts import CacheFormat
from ..torch_backend.ops import compress_norm_rope_store
from .compress import compress_forward

__all__ = ["compress_and_store", "compress_forward", "compress_norm_rope_store"]


def compress_and_store(
    state: torch.Tensor,
    inp: torch.Tensor,
    ape: torch.Tensor,
    plan_rows: torch.Tensor,
    plan_w: torch.Tensor | None,
    *,
    ratio: int,
    head_dim: int,
    is_online: bool,
    is_decode: bool,
    norm_weight: torch.Tensor,
    norm_eps: float,
    freq_cis: torch.Tensor,
    out_loc: torch.Tensor,
    kvcache: torch.Tensor,
    page_size: int,
    fmt: CacheFormat,
) -> None:
    kv = torch.empty((plan_rows.shape[0], head_dim), dtype=inp.dtype, device=inp.device)
    compress_forward(state, inp, ape, plan_rows, plan_w, kv, ratio=ratio, head_dim=head_dim, is_online=is_online)
    if plan_rows.shape[0]:
        compress_norm_rope_store(kv, plan_rows, is_decode=is_decode, ratio=ratio, norm_weight=norm_weight,
                                 norm_eps=norm_eps, freq_cis=freq_cis, out_loc=out_loc, kvcache=kvcache,
                                 page_size=page_size, fmt=fmt)
