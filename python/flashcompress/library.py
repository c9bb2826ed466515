"""torch.compile support: the three ops as ``flashcompress::`` custom ops.

Eager calls never come here: each public function in ``flashcompress.api`` starts
with ``if torch.compiler.is_compiling(): return library.<op>(...)``, so only a
function being traced takes this path (the check costs ~0.05 µs in eager mode).

While Dynamo traces, the ``compress_forward`` / ``compress_norm_rope_store`` /
``compress_and_store`` functions below unpack the plan into its tensors and
Python scalars (ratio, kind) and call the registered op.  The registered op takes
only tensors and plain scalars and declares what it writes (``Tensor(a!)``):

  flashcompress::compress_forward          writes kv_score_buffer, out
  flashcompress::compress_norm_rope_store  writes kvcache
  flashcompress::compress_and_store        writes kv_score_buffer, kvcache

The two store ops end with ``str layout="v4"`` (``KVLayout`` values; a ``KVLayout``
argument is passed as its string).

(The four V4.1 ops join the namespace from :mod:`flashcompress.v41.library`, imported below.)

Every op returns nothing, so its fake (meta) implementation does nothing: the
only new tensor, ``compress_forward``'s ``out``, is allocated by the traced
code before the op (``torch.empty``), with the shape the eager path gives it.

The real implementation runs when the compiled graph runs, on real tensors,
never while tracing.  It rebuilds the plan object from its tensors (a tuple, no
copy) and runs the same validation as the eager call (``validation.check_*``: metadata
checks, and the data-dependent checks for CPU tensors, or for CUDA tensors with
``FLASHCOMPRESS_DEBUG=1``), then the same launch (``dispatch.run_*``).  So the traced graph holds no value checks and
no data-dependent guards, and a compiled call raises the same errors as an eager
one, at run time.  JIT modules are looked up (and, on a miss, built) by that
real implementation, i.e. on the first run of the compiled graph, or earlier by
``flashcompress prewarm`` or an eager call; tracing loads nothing.

The ops are defined with ``torch.library.Library.define`` and plain Python
kernels: their dispatch costs ~3 µs per call when a compiled graph runs them,
against ~27 µs for a ``torch.library.custom_op`` wrapper.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import validation as V
from .dispatch import run_compress_and_store, run_compress_forward, run_store
from .plans import CompressorDecodePlan, CompressorPrefillPlan
from .v41.layouts import KVLayout

__all__ = ["compress_forward", "compress_norm_rope_store", "compress_and_store", "OPS"]

# The plan as op arguments: its tensors, then its ratio and kind (plain scalars).
_PLAN = "Tensor plan_rows, Tensor? plan_w, int plan_ratio, bool? plan_is_online"
# freq_cis travels as torch.view_as_real(freq_cis) (freq_as_real True): Inductor's decomposition of a mutable op
# (auto_functionalized_v2) fails on complex tensor arguments in torch 2.13 ("auto_functionalized_v2 was not removed").
_STORE = ("Tensor norm_weight, float norm_eps, Tensor freq_cis, bool freq_as_real, Tensor out_loc, Tensor(c!) kvcache, "
          "int page_size, bool use_fp4, bool bf16_store")
# the trailing argument of the store ops: the main-KV layout as its string value
_LAYOUT = 'str layout="v4"'

SCHEMAS = {
    "compress_forward": (
        f"compress_forward(Tensor(a!) kv_score_buffer, Tensor kv_score_input, Tensor ape, {_PLAN}, Tensor(b!) out, "
        "int head_dim, int compress_ratio, bool is_online) -> ()"),
    "compress_norm_rope_store": f"compress_norm_rope_store(Tensor kv, {_PLAN}, {_STORE}, {_LAYOUT}) -> ()",
    "compress_and_store": (
        f"compress_and_store(Tensor(a!) kv_score_buffer, Tensor kv_score_input, Tensor ape, {_PLAN}, "
        f"int head_dim, int compress_ratio, {_STORE}, bool is_online, {_LAYOUT}) -> ()"),
}

_LIB = torch.library.Library("flashcompress", "DEF")


def _plan(ratio: int, plan_rows: torch.Tensor, plan_w: Optional[torch.Tensor], is_online: Optional[bool]):
    """The plan object the op's tensors came from (decode plans have no ``plan_w``)."""
    if plan_w is None:
        return CompressorDecodePlan(ratio, plan_rows, is_online=is_online)
    return CompressorPrefillPlan(ratio, plan_rows, plan_w, is_online=is_online)


def _unpack(plan: object) -> tuple[torch.Tensor, Optional[torch.Tensor], int, Optional[bool]]:
    """Traced side: a plan object -> the op's plan arguments (Python constants for Dynamo)."""
    if isinstance(plan, CompressorDecodePlan):
        return plan[1], None, plan[0], plan.is_online
    if isinstance(plan, CompressorPrefillPlan):
        return plan[1], plan[2], plan[0], plan.is_online
    V.fail("plan", "a CompressorDecodePlan or CompressorPrefillPlan", type(plan).__name__, TypeError)


def _layout_arg(layout: object) -> object:
    """Traced side: a ``KVLayout`` goes to the op as its string value (the schema's ``str``)."""
    return layout.value if isinstance(layout, KVLayout) else layout


def _freq_arg(freq_cis: object) -> tuple[object, bool]:
    """Traced side: a complex64 table goes to the op as its float32 ``view_as_real`` view (see ``_STORE``)."""
    if isinstance(freq_cis, torch.Tensor) and freq_cis.dtype == torch.complex64:
        return torch.view_as_real(freq_cis), True
    return freq_cis, False  # anything else reaches the impl unchanged, whose validation rejects it


# --------------------------------------------------------------------------
# Real implementations: run at graph run time, on real tensors
# --------------------------------------------------------------------------


def _compress_forward_impl(kv_score_buffer, kv_score_input, ape, plan_rows, plan_w, plan_ratio, plan_is_online, out,
                           head_dim, compress_ratio, is_online):
    plan = _plan(plan_ratio, plan_rows, plan_w, plan_is_online)
    call = V.check_compress(kv_score_buffer, kv_score_input, ape, plan, head_dim, compress_ratio, out, is_online)
    run_compress_forward(call, out)


def _compress_norm_rope_store_impl(kv, plan_rows, plan_w, plan_ratio, plan_is_online, norm_weight, norm_eps, freq_cis,
                                   freq_as_real, out_loc, kvcache, page_size, use_fp4, bf16_store, layout="v4"):
    if freq_as_real:
        freq_cis = torch.view_as_complex(freq_cis)
    V.check_ratio(plan_ratio)
    plan = _plan(plan_ratio, plan_rows, plan_w, plan_is_online)
    run_store(V.check_store(kv, plan, (norm_weight, norm_eps, freq_cis, out_loc, kvcache, page_size, use_fp4,
                                       bf16_store, layout)))


def _compress_and_store_impl(kv_score_buffer, kv_score_input, ape, plan_rows, plan_w, plan_ratio, plan_is_online,
                             head_dim, compress_ratio, norm_weight, norm_eps, freq_cis, freq_as_real, out_loc, kvcache,
                             page_size, use_fp4, bf16_store, is_online, layout="v4"):
    if freq_as_real:
        freq_cis = torch.view_as_complex(freq_cis)
    plan = _plan(plan_ratio, plan_rows, plan_w, plan_is_online)
    run_compress_and_store(V.check_compress(
        kv_score_buffer, kv_score_input, ape, plan, head_dim, compress_ratio, None, is_online,
        store=(norm_weight, norm_eps, freq_cis, out_loc, kvcache, page_size, use_fp4, bf16_store, layout)))


def _nothing(*args, **kwargs) -> None:
    """Fake (meta) implementation of every op: they return nothing and only write their ``(a!)`` arguments."""
    return None


_IMPLS = {
    "compress_forward": _compress_forward_impl,
    "compress_norm_rope_store": _compress_norm_rope_store_impl,
    "compress_and_store": _compress_and_store_impl,
}

for _name, _schema in SCHEMAS.items():
    _LIB.define(_schema)
    # One kernel for every backend key (CPU, CUDA, ...): the impl picks the backend itself.
    _LIB.impl(_name, _IMPLS[_name], "CompositeExplicitAutograd")
    torch.library.register_fake(f"flashcompress::{_name}", _nothing, lib=_LIB)

OPS = {name: getattr(torch.ops.flashcompress, name).default for name in SCHEMAS}

from .v41 import library as _v41_library  # noqa: E402,F401  the V4.1 ops join the namespace (after its DEF library)


# --------------------------------------------------------------------------
# Traced side: what the public functions run while torch.compile traces them
# --------------------------------------------------------------------------


def compress_forward(kv_score_buffer, kv_score_input, ape, plan, *, head_dim, compress_ratio, out=None,
                     is_online=False):
    """``api.compress_forward`` while tracing: allocate ``out`` as eager does, then the op."""
    plan_rows, plan_w, ratio, kind = _unpack(plan)
    if out is None:
        out = torch.empty((plan_rows.shape[0], head_dim), dtype=kv_score_input.dtype, device=kv_score_buffer.device)
    torch.ops.flashcompress.compress_forward(kv_score_buffer, kv_score_input, ape, plan_rows, plan_w, ratio, kind,
                                             out, head_dim, compress_ratio, is_online)
    return out


def compress_norm_rope_store(kv, plan, *, norm_weight, norm_eps, freq_cis, out_loc, kvcache, page_size,
                             use_fp4=False, bf16_store=False, layout="v4"):
    """``api.compress_norm_rope_store`` while tracing."""
    plan_rows, plan_w, ratio, kind = _unpack(plan)
    freq, as_real = _freq_arg(freq_cis)
    torch.ops.flashcompress.compress_norm_rope_store(kv, plan_rows, plan_w, ratio, kind, norm_weight, norm_eps,
                                                     freq, as_real, out_loc, kvcache, page_size, use_fp4, bf16_store,
                                                     _layout_arg(layout))


def compress_and_store(kv_score_buffer, kv_score_input, ape, plan, *, head_dim, compress_ratio, norm_weight, norm_eps,
                       freq_cis, out_loc, kvcache, page_size, use_fp4=False, bf16_store=False, is_online=False,
                       layout="v4"):
    """``api.compress_and_store`` while tracing."""
    plan_rows, plan_w, ratio, kind = _unpack(plan)
    freq, as_real = _freq_arg(freq_cis)
    torch.ops.flashcompress.compress_and_store(kv_score_buffer, kv_score_input, ape, plan_rows, plan_w, ratio, kind,
                                               head_dim, compress_ratio, norm_weight, norm_eps, freq, as_real, out_loc,
                                               kvcache, page_size, use_fp4, bf16_store, is_online,
                                               _layout_arg(layout))
