"""torch.compile support for the V4.1 ops: the four ops as ``flashcompress::`` custom ops.

The same scheme as :mod:`flashcompress.library` (the V4 ops): each public function in
:mod:`flashcompress.v41.api` starts with ``if torch.compiler.is_compiling(): return
library.<op>(...)``, so eager calls never come here.  While Dynamo traces, the
functions below turn the arguments into the op's (tensors and plain scalars: the
layout as its string value), allocate the latent ``out`` as the eager call does
(``torch.zeros``) and call the registered op, which declares what it writes:

  flashcompress::c1_decode_norm_rope_store     writes k_cache, out
  flashcompress::c2_decode_norm_rope_store     writes kv_state, k_cache, out
  flashcompress::c2_prefill_norm_rope_store    writes kv_state, k_cache, out
  flashcompress::index_k_norm_rope_pack_store  writes cache

Every op returns nothing, so its fake (meta) implementation does nothing.  The real
implementation runs when the compiled graph runs, on real tensors: it calls the
public :mod:`flashcompress.v41.api` function (not compiling then), i.e. the same
validation and backend launch as an eager call, so a compiled call raises the same
errors as an eager one, at run time, and the traced graph holds no value checks.

Importing this module costs only the op registration: :mod:`flashcompress.v41.api`
(and its backends) is imported by the first real call.
"""

from __future__ import annotations

from typing import Optional

import torch

from .layouts import LATENT_DIM, KVLayout

__all__ = ["c1_decode_norm_rope_store", "c2_decode_norm_rope_store", "c2_prefill_norm_rope_store",
           "index_k_norm_rope_pack_store", "OPS", "SCHEMAS"]

# Arguments shared by the c2 ops: (kv_input, kv_state, norm_weight, positions, req, raw_out_loc, eps, freqs_cis, k_cache).
_C2 = ("Tensor kv_input, Tensor(a!) kv_state, Tensor norm_weight, Tensor positions, Tensor req, Tensor raw_out_loc, "
       "float eps, Tensor freqs_cis, Tensor(b!) k_cache")

SCHEMAS = {
    "c1_decode_norm_rope_store": (
        "c1_decode_norm_rope_store(Tensor kv_input, Tensor norm_weight, Tensor positions, Tensor out_loc, float eps, "
        "Tensor freqs_cis, Tensor(a!) k_cache, int page_size, str layout, Tensor(b!) out) -> ()"),
    "c2_decode_norm_rope_store": (
        f"c2_decode_norm_rope_store({_C2}, int page_size, int ring_size, int draft_len, str layout, "
        "Tensor(c!) out) -> ()"),
    "c2_prefill_norm_rope_store": (
        f"c2_prefill_norm_rope_store({_C2}, Tensor extend_start_loc, Tensor extend_seq_lens, int page_size, "
        "int ring_size, str layout, Tensor(c!) out) -> ()"),
    "index_k_norm_rope_pack_store": (
        "index_k_norm_rope_pack_store(Tensor input, Tensor norm_weight, float eps, Tensor freqs_cis, "
        "Tensor positions, Tensor loc, Tensor(a!) cache, int ratio) -> ()"),
}

# FRAGMENT: flashcompress.library owns the namespace's DEF library.
_LIB = torch.library.Library("flashcompress", "FRAGMENT")


def _api():
    """:mod:`flashcompress.v41.api`, imported on the first real call (it imports this module)."""
    from . import api

    return api


# --------------------------------------------------------------------------
# Real implementations: run at graph run time, on real tensors
# --------------------------------------------------------------------------


def _c1_impl(kv_input, norm_weight, positions, out_loc, eps, freqs_cis, k_cache, page_size, layout, out):
    _api().c1_decode_norm_rope_store(kv_input, norm_weight, positions, out_loc, eps, freqs_cis, k_cache,
                                     page_size=page_size, layout=layout, out=out)


def _c2_decode_impl(kv_input, kv_state, norm_weight, positions, req, raw_out_loc, eps, freqs_cis, k_cache, page_size,
                    ring_size, draft_len, layout, out):
    _api().c2_decode_norm_rope_store(kv_input, kv_state, norm_weight, positions, req, raw_out_loc, eps, freqs_cis,
                                     k_cache, page_size=page_size, ring_size=ring_size, draft_len=draft_len,
                                     layout=layout, out=out)


def _c2_prefill_impl(kv_input, kv_state, norm_weight, positions, req, raw_out_loc, eps, freqs_cis, k_cache,
                     extend_start_loc, extend_seq_lens, page_size, ring_size, layout, out):
    _api().c2_prefill_norm_rope_store(kv_input, kv_state, norm_weight, positions, req, raw_out_loc, eps, freqs_cis,
                                      k_cache, extend_start_loc, extend_seq_lens, page_size=page_size,
                                      ring_size=ring_size, layout=layout, out=out)


def _index_k_impl(input, norm_weight, eps, freqs_cis, positions, loc, cache, ratio):
    _api().index_k_norm_rope_pack_store(input, norm_weight, eps, freqs_cis, positions, loc, cache, ratio=ratio)


def _nothing(*args, **kwargs) -> None:
    """Fake (meta) implementation of every op: they return nothing and only write their ``(x!)`` arguments."""
    return None


_IMPLS = {
    "c1_decode_norm_rope_store": _c1_impl,
    "c2_decode_norm_rope_store": _c2_decode_impl,
    "c2_prefill_norm_rope_store": _c2_prefill_impl,
    "index_k_norm_rope_pack_store": _index_k_impl,
}

for _name, _schema in SCHEMAS.items():
    _LIB.define(_schema)
    # One kernel for every backend key (CPU, CUDA, ...): the api function picks the backend itself.
    _LIB.impl(_name, _IMPLS[_name], "CompositeExplicitAutograd")
    torch.library.register_fake(f"flashcompress::{_name}", _nothing, lib=_LIB)

OPS = {name: getattr(torch.ops.flashcompress, name).default for name in SCHEMAS}


# --------------------------------------------------------------------------
# Traced side: what the public functions run while torch.compile traces them
# --------------------------------------------------------------------------


def _layout_arg(layout: object) -> str:
    """The layout as the op's ``str``: a ``KVLayout``'s value, a string unchanged (checked at run time)."""
    if isinstance(layout, KVLayout):
        return layout.value
    if isinstance(layout, str):
        return layout
    return KVLayout.parse(layout).value  # raises the eager call's TypeError


def _out_arg(out: Optional[torch.Tensor], kv_input: torch.Tensor) -> torch.Tensor:
    """The caller's ``out``, else a zeroed ``[N, 512]`` bf16 latent (as the eager call allocates it)."""
    if out is not None:
        return out
    return torch.zeros((kv_input.shape[0], LATENT_DIM), dtype=torch.bfloat16, device=kv_input.device)


def c1_decode_norm_rope_store(kv_input, norm_weight, positions, out_loc, eps, freqs_cis, k_cache, *, page_size,
                              layout=KVLayout.V4, out=None) -> torch.Tensor:
    """``v41.api.c1_decode_norm_rope_store`` while tracing."""
    out = _out_arg(out, kv_input)
    torch.ops.flashcompress.c1_decode_norm_rope_store(kv_input, norm_weight, positions, out_loc, eps, freqs_cis,
                                                      k_cache, page_size, _layout_arg(layout), out)
    return out


def c2_decode_norm_rope_store(kv_input, kv_state, norm_weight, positions, req, raw_out_loc, eps, freqs_cis, k_cache, *,
                              page_size, ring_size, draft_len=1, layout=KVLayout.V4, out=None) -> torch.Tensor:
    """``v41.api.c2_decode_norm_rope_store`` while tracing."""
    out = _out_arg(out, kv_input)
    torch.ops.flashcompress.c2_decode_norm_rope_store(kv_input, kv_state, norm_weight, positions, req, raw_out_loc, eps,
                                                      freqs_cis, k_cache, page_size, ring_size, draft_len,
                                                      _layout_arg(layout), out)
    return out


def c2_prefill_norm_rope_store(kv_input, kv_state, norm_weight, positions, req, raw_out_loc, eps, freqs_cis, k_cache,
                               extend_start_loc, extend_seq_lens, *, page_size, ring_size, layout=KVLayout.V4,
                               out=None) -> torch.Tensor:
    """``v41.api.c2_prefill_norm_rope_store`` while tracing."""
    out = _out_arg(out, kv_input)
    torch.ops.flashcompress.c2_prefill_norm_rope_store(kv_input, kv_state, norm_weight, positions, req, raw_out_loc,
                                                       eps, freqs_cis, k_cache, extend_start_loc, extend_seq_lens,
                                                       page_size, ring_size, _layout_arg(layout), out)
    return out


def index_k_norm_rope_pack_store(input, norm_weight, eps, freqs_cis, positions, loc, cache, *, ratio) -> None:
    """``v41.api.index_k_norm_rope_pack_store`` while tracing."""
    torch.ops.flashcompress.index_k_norm_rope_pack_store(input, norm_weight, eps, freqs_cis, positions, loc, cache,
                                                         ratio)
