"""The PyTorch backend's op entry points, called by ``flashcompress.dispatch`` after validation.

Each function takes the checked call object of ``flashcompress.validation`` (the same
object a JIT kernel family receives: plan tensors as raw bytes, the checked tensors,
the layer kind and the cache format), so that the API layer only validates and
dispatches.  Everything plan-specific (decoding plan fields, RoPE positions,
destinations, dtype casts the peer performs per call) happens here, on the tensors'
device.
"""

from __future__ import annotations

import torch

from ..validation import CompressCall, StoreCall
from . import compress as _compress
from . import store as _store
from .rows import store_targets


def compress_forward(call: CompressCall, out: torch.Tensor) -> None:
    """Dispatch to the decode / prefill / online kernels of ``torch_backend.compress``; writes ``out``.

    ``ape`` is cast to the input dtype first (the kernels take ape in the input dtype).
    """
    layer, state, inp, ape, plan_rows, plan_w = call.layer, call.state, call.inp, call.ape, call.plan_rows, call.plan_w
    if ape.dtype != inp.dtype:
        ape = ape.to(inp.dtype)
    H = layer.head_dim
    if layer.online:
        if plan_w is None:
            _compress.online_decode(H, state, inp, ape, plan_rows, out)
        else:
            _compress.online_prefill(H, state, inp, ape, plan_rows, plan_w, out)
    elif plan_w is None:
        _compress.decode(layer.ratio, H, state, inp, ape, plan_rows, out)
    else:
        _compress.prefill(layer.ratio, H, state, inp, ape, plan_rows, plan_w, out)


def compress_norm_rope_store(call: StoreCall) -> None:
    """RMSNorm + RoPE (+ Hadamard) + quantised store of the plan's stored rows."""
    st = call.store
    valid, dest, positions = store_targets(call.plan_rows, call.is_decode, call.ratio, st.out_loc)
    freq_real = torch.view_as_real(st.freq_cis).flatten(-2)
    if not freq_real.is_contiguous():
        freq_real = freq_real.contiguous()
    _store.norm_rope_store(
        call.kv, positions, dest, valid,
        norm_weight=st.norm_weight, norm_eps=st.norm_eps, freq_real=freq_real,
        kvcache=st.kvcache, page_size=st.page_size, fmt=st.fmt,
    )


def compress_and_store(call: CompressCall) -> None:
    """The two-step path: compress into an intermediate in the input dtype, then store it."""
    assert call.store is not None, "compress_and_store needs a call checked with its store arguments"
    kv = torch.empty((call.plan_rows.shape[0], call.layer.head_dim), dtype=call.inp.dtype, device=call.inp.device)
    compress_forward(call, kv)
    if call.plan_rows.shape[0]:
        compress_norm_rope_store(StoreCall(kv, call.plan_rows, call.is_decode, call.layer.ratio, call.store,
                                           call.device))
