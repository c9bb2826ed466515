"""The engine-facing ops: ``compress_forward``, ``compress_norm_rope_store``, ``compress_and_store``.

Data flows one way: arguments -> ``validation.check_*`` (everything is checked before
anything is written; returns one immutable call object) -> ``dispatch.run_*`` ->
``dispatch.ops_backend(device)`` (``torch_backend.ops`` or ``cuda_ops.ops``) -> the
backend's op, which takes the call object.  This module holds no plan or tensor logic.

Steady-state eager calls on CUDA tensors (decode plans; every store call) first try
``fastpath``: the call goes straight to the JIT binding, which checks everything in C++
before it launches; a call it rejects (nothing launched) or does not know yet takes the path
above, which raises the named error, and a call that path launches teaches ``fastpath`` its key.

While ``torch.compile`` traces a function that calls these ops, each op hands its
arguments to ``flashcompress.library`` (one registered custom op per op), whose
implementation runs the same validation and dispatch when the compiled graph runs.

Every launch runs on the device of the call's tensors (all on one device, else a
``ValueError`` naming the first tensor on another one) and on that device's current
stream, whatever the current device is.
"""

from __future__ import annotations

import torch

from . import fastpath as _fast
from . import library as _library  # torch.compile: the flashcompress:: custom ops (used only while tracing)
from . import validation as V
from .dispatch import run_compress_and_store, run_compress_forward, run_store
from .plans import CompressorDecodePlan, CompressorPrefillPlan
from .v41.layouts import KVLayout

__all__ = ["compress_and_store", "compress_forward", "compress_norm_rope_store", "is_overlap_compress"]


def is_overlap_compress(ratio: int) -> bool:
    """True for ratio 4, which pools overlapping windows (8 candidates per entry); False for ratio 128.

    Example: ``flashcompress.is_overlap_compress(4)  # True``.
    """
    return V.check_ratio(ratio) == 4


def compress_forward(
    kv_score_buffer: torch.Tensor,
    kv_score_input: torch.Tensor,
    ape: torch.Tensor,
    plan: CompressorDecodePlan | CompressorPrefillPlan,
    *,
    head_dim: int,
    compress_ratio: int,
    out: torch.Tensor | None = None,
    is_online: bool = False,
) -> torch.Tensor:
    """Fold per-token KV projections into compressed entries and update the state pool in place.

    All tensors on one device (CPU: the PyTorch reference; CUDA: the JIT kernels, launched on
    that device's current stream).  W = ``state width`` below: ratio 4: ``4 * head_dim``;
    ratio 128: ``2 * head_dim``; online C128: ``3 * head_dim`` ([max | sum | kv]).

    Args:
        kv_score_buffer: the layer's state pool, float32 or bfloat16, ``[rows, W]`` or its
            paged view ``[pages, r, W]`` (ratio 4 / 128; online: ``[slots, 1, W]``), contiguous.
        kv_score_input: this step's projections ``[kv | score]`` per token, float32 or bfloat16
            (online: float32), ``[tokens, (4 if ratio == 4 else 2) * head_dim]``: decode one row
            per request, prefill the ragged tokens of the batch (``num_q_tokens`` rows).
        ape: the positional bias, ``[8, head_dim]`` (ratio 4) or ``[128, head_dim]`` (ratio 128),
            same dtype family as the input (cast to the input dtype).
        plan: a ``CompressorDecodePlan`` / ``CompressorPrefillPlan`` built for this batch and ratio.
        head_dim: 512 (main KV) or 128 (the C4 indexer).
        compress_ratio: 4 or 128, the ratio the plan was built for.
        out: optional output ``[plan rows, head_dim]`` (written in full); allocated when None.
        is_online: True for the online C128 layer (plan from ``generate_online``).

    Returns ``out``: decode, one row per request (zeros where the request is not at a window
    boundary); prefill, one row per CompressPlan row (zeros for invalid rows).

    Example: ``out = compress_forward(state, inp, ape, plan, head_dim=512, compress_ratio=4)``.
    """
    if torch.compiler.is_compiling():  # traced by torch.compile: one custom op, no value checks in the graph
        return _library.compress_forward(kv_score_buffer, kv_score_input, ape, plan, head_dim=head_dim,
                                         compress_ratio=compress_ratio, out=out, is_online=is_online)
    done = _fast.compress_forward(kv_score_buffer, kv_score_input, ape, plan, head_dim, compress_ratio, out, is_online)
    if done is not None:
        return done
    call = V.check_compress(kv_score_buffer, kv_score_input, ape, plan, head_dim, compress_ratio, out, is_online)
    result = run_compress_forward(call, out)
    _fast.remember_compress(call, plan, head_dim, compress_ratio, is_online, out)
    return result


def compress_norm_rope_store(
    kv: torch.Tensor,
    plan: CompressorDecodePlan | CompressorPrefillPlan,
    *,
    norm_weight: torch.Tensor,
    norm_eps: float,
    freq_cis: torch.Tensor,
    out_loc: torch.Tensor,
    kvcache: torch.Tensor,
    page_size: int,
    use_fp4: bool = False,
    bf16_store: bool = False,
    layout: KVLayout | str = "v4",
) -> None:
    """RMSNorm + RoPE (+ Hadamard for the indexer) + quantised paged store of compressed rows.

    Row ``i`` of ``kv`` belongs to plan row ``i``.  Decode rows are stored iff
    ``seq_len % ratio == 0`` at ``out_loc[i]``; prefill rows iff valid, at
    ``out_loc[ragged_id]``.  RoPE position is ``seq_len - ratio``.  Skipped rows write nothing.
    All tensors on one device.

    Args:
        kv: compressed rows, float32 or bfloat16 ``[plan rows, D]``, D = 512 (main KV) or 128
            (indexer): ``compress_forward``'s output.
        plan: the plan ``kv`` was computed with.
        norm_weight: RMSNorm weight, float32 or bfloat16 ``[D]`` (rounded to ``kv``'s dtype).
        norm_eps: RMSNorm epsilon, a float in (0, 1).
        freq_cis: RoPE table, complex64 ``[max position + 1, 32]`` (row p: position p).
        out_loc: int64 cache slots: decode ``[B]`` (one per request), prefill ``[>= tokens]``
            (indexed by ragged id); slot s lives in page ``s // page_size``.
        kvcache: uint8 ``[pages, row bytes]``: V4 / ``layout`` (D 512), indexer FP8 / FP4 (D 128)
            pages of ``page_size`` tokens, or bf16 rows (``bf16_store``);
            ``layouts.CacheFormat.cache_row_bytes`` (``layout.page_bytes(page_size)`` for a layout).
        page_size: tokens per cache page, a power of two.
        use_fp4: the indexer FP4 format (D 128 only); else FP8.
        bf16_store: dense bf16 rows (D 512 only) instead of the V4 format.
        layout: the main-KV cache layout (``KVLayout`` or its string, any case): ``"v4"`` (the
            default, the V4 bytes), ``"v41"``, ``"v41_new"``, ``"v41_fp4"``, ``"v41_fp4_new"`` or
            ``"uniform_fp8"`` (DeepSeek-V4.1's layouts for the ratio-4 / 128 pools; spec
            store-and-jit.md §5.3-5.5).  Layouts other than ``"v4"``: D 512 only, without
            ``use_fp4`` / ``bf16_store``.

    Example: ``compress_norm_rope_store(out, plan, norm_weight=w, norm_eps=1e-6, freq_cis=freq,
    out_loc=loc, kvcache=cache, page_size=64)``.
    """
    if torch.compiler.is_compiling():  # traced by torch.compile: one custom op, no value checks in the graph
        return _library.compress_norm_rope_store(kv, plan, norm_weight=norm_weight, norm_eps=norm_eps,
                                                 freq_cis=freq_cis, out_loc=out_loc, kvcache=kvcache,
                                                 page_size=page_size, use_fp4=use_fp4, bf16_store=bf16_store,
                                                 layout=layout)
    store = (norm_weight, norm_eps, freq_cis, out_loc, kvcache, page_size, use_fp4, bf16_store, layout)
    if _fast.compress_norm_rope_store(kv, plan, store):
        return
    call = V.check_store(kv, plan, store)
    run_store(call)
    _fast.remember_store(call, plan)


def compress_and_store(
    kv_score_buffer: torch.Tensor,
    kv_score_input: torch.Tensor,
    ape: torch.Tensor,
    plan: CompressorDecodePlan | CompressorPrefillPlan,
    *,
    head_dim: int,
    compress_ratio: int,
    norm_weight: torch.Tensor,
    norm_eps: float,
    freq_cis: torch.Tensor,
    out_loc: torch.Tensor,
    kvcache: torch.Tensor,
    page_size: int,
    use_fp4: bool = False,
    bf16_store: bool = False,
    is_online: bool = False,
    layout: KVLayout | str = "v4",
) -> None:
    """``compress_forward`` then ``compress_norm_rope_store`` in one call (same arguments, checked once).

    On CUDA the compress kernel stores each row itself in decode and C4 prefill (decode: one
    launch; prefill: the pooling pass, which stores, then the state write pass); C128 and
    online C128 prefill run the two-step path's launches, which measured faster there.
    Writes exactly the state rows and cache bytes of the two-step path (the compressed row is
    rounded to the input dtype before the store, as the two-step path's intermediate is).
    A ``layout`` other than ``"v4"`` always runs as the two steps on CUDA (``compress_forward``
    into an intermediate of the input dtype, then the store kernel): the same bytes, one more
    launch and the intermediate's round trip.  Arguments: see ``compress_forward`` (the first
    eight) and ``compress_norm_rope_store`` (the store arguments, with D = ``head_dim``).

    Example: ``compress_and_store(state, inp, ape, plan, head_dim=512, compress_ratio=4,
    norm_weight=w, norm_eps=1e-6, freq_cis=freq, out_loc=loc, kvcache=cache, page_size=64)``.
    """
    if torch.compiler.is_compiling():  # traced by torch.compile: one custom op, no value checks in the graph
        return _library.compress_and_store(
            kv_score_buffer, kv_score_input, ape, plan, head_dim=head_dim, compress_ratio=compress_ratio,
            norm_weight=norm_weight, norm_eps=norm_eps, freq_cis=freq_cis, out_loc=out_loc, kvcache=kvcache,
            page_size=page_size, use_fp4=use_fp4, bf16_store=bf16_store, is_online=is_online, layout=layout)
    store = (norm_weight, norm_eps, freq_cis, out_loc, kvcache, page_size, use_fp4, bf16_store, layout)
    if _fast.compress_and_store(kv_score_buffer, kv_score_input, ape, plan, head_dim, compress_ratio, is_online,
                                store):
        return
    call = V.check_compress(kv_score_buffer, kv_score_input, ape, plan, head_dim, compress_ratio, None, is_online,
                            store=store)
    run_compress_and_store(call)
    _fast.remember_compress(call, plan, head_dim, compress_ratio, is_online, None)
