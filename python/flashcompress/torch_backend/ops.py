"""The PyTorch backend's op entry points, called by ``flashcompress.api`` after validation.

Each function has the same arguments a JIT kernel family receives for the op
(plan tensors as raw bytes, the already-checked tensors), so that the API layer
only validates and dispatches.  Everything plan-specific (decoding plan fields,
RoPE positions, destinations, dtype casts the peer performs per call) happens
here, on the tensors' device.
"""

from __future__ import annotations

import torch

from ..layouts import CacheFormat
from . import compress as _compress
from . import store as _store
from .rows import store_targets


def compress_forward(
    state: torch.Tensor,
    inp: torch.Tensor,
    ape: torch.Tensor,
    plan_rows: torch.Tensor,
    plan_w: torch.Tensor | None,
    out: torch.Tensor,
    *,
    ratio: int,
    head_dim: int,
    is_online: bool,
) -> None:
    """Dispatch to the decode / prefill / online kernels of ``torch_backend.compress``.

    ``state`` is the flat ``[rows, width]`` pool, ``plan_w`` is None for decode plans.
    ``ape`` is cast to the input dtype first (the kernels take ape in the input dtype).
    """
    if ape.dtype != inp.dtype:
        ape = ape.to(inp.dtype)
    if is_online:
        if plan_w is None:
            _compress.online_decode(head_dim, state, inp, ape, plan_rows, out)
        else:
            _compress.online_prefill(head_dim, state, inp, ape, plan_rows, plan_w, out)
    elif plan_w is None:
        _compress.decode(ratio, head_dim, state, inp, ape, plan_rows, out)
    else:
        _compress.prefill(ratio, head_dim, state, inp, ape, plan_rows, plan_w, out)


def compress_norm_rope_store(
    kv: torch.Tensor,
    plan_rows: torch.Tensor,
    *,
    is_decode: bool,
    ratio: int,
    norm_weight: torch.Tensor,
    norm_eps: float,
    freq_cis: torch.Tensor,
    out_loc: torch.Tensor,
    kvcache: torch.Tensor,
    page_size: int,
    fmt: CacheFormat,
) -> None:
    """RMSNorm + RoPE (+ Hadamard) + quantised store of the plan's stored rows."""
    valid, dest, positions = store_targets(plan_rows, is_decode, ratio, out_loc)
    freq_real = torch.view_as_real(freq_cis).flatten(-2)
    if not freq_real.is_contiguous():
        freq_real = freq_real.contiguous()
    _store.norm_rope_store(
        kv, positions, dest, valid,
        norm_weight=norm_weight, norm_eps=norm_eps, freq_real=freq_real,
        kvcache=kvcache, page_size=page_size, fmt=fmt,
    )


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
    """The two-step path: compress into an intermediate in the input dtype, then store it."""
    kv = torch.empty((plan_rows.shape[0], head_dim), dtype=inp.dtype, device=inp.device)
    compress_forward(state, inp, ape, plan_rows, plan_w, kv, ratio=ratio, head_dim=head_dim, is_online=is_online)
    if plan_rows.shape[0]:
        compress_norm_rope_store(kv, plan_rows, is_decode=is_decode, ratio=ratio, norm_weight=norm_weight,
                                 norm_eps=norm_eps, freq_cis=freq_cis, out_loc=out_loc, kvcache=kvcache,
                                 page_size=page_size, fmt=fmt)
