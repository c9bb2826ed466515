"""The engine-facing ops: ``compress_forward``, ``compress_norm_rope_store``, ``compress_and_store``.

Data flows one way: arguments -> ``validation`` (everything is checked before
anything is written) -> ``dispatch.ops_backend(device)`` (``torch_backend.ops``
or ``cuda_ops.ops``, chosen once per call) -> the backend's op entry point,
which has the same signature in both backends.  This module holds no plan or
tensor logic of its own.

CUDA tensors take a short path (outside ``FLASHCOMPRESS_DEBUG=1``): the Python side
checks only what the kernels' bindings cannot see (ratio, head dim, flags, the plan
object and its kind, the paged view of the state pool); the bindings check every
tensor's dtype, shape, contiguity and device, with the same named ``TypeError`` /
``ValueError``, before anything is launched.  This keeps an eager call's host path
to a few microseconds.  Anything unusual falls back to the full checks.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import validation as V
from .dispatch import ops_backend
from .jit.settings import debug_checks_enabled
from .layouts import PLAN_ROW_BYTES, WRITE_ROW_BYTES, CacheFormat, select_cache_format
from .plans import CompressorDecodePlan, CompressorPrefillPlan, check_plan
from .torch_backend.rows import compress_fields, decode_fields, store_targets, write_fields
from . import library as _library  # torch.compile: the flashcompress:: custom ops (used only while tracing)


def is_overlap_compress(ratio: int) -> bool:
    """Ratio 4 pools overlapping windows (8 candidates); ratio 128 does not."""
    return V.check_ratio(ratio) == 4


class _Compress(NamedTuple):
    """A validated compress call: flat state, input, ape, plan tensors, resolved sizes."""

    state: torch.Tensor
    inp: torch.Tensor
    ape: torch.Tensor
    plan_rows: torch.Tensor
    plan_w: torch.Tensor | None
    ratio: int
    head_dim: int
    is_online: bool


_PLAN_TYPES = (CompressorDecodePlan, CompressorPrefillPlan)
_FLOATS = (torch.float32, torch.bfloat16)
# (ratio, head_dim, online) -> (state width, state rows per page of the paged view)
_LAYERS: dict[tuple[int, int, bool], tuple[int, int]] = {
    (4, 512, False): (2048, 4), (4, 128, False): (512, 4), (128, 512, False): (1024, 128),
    (128, 512, True): (1536, 1),
}


def _fast_compress(
    kv_score_buffer: object, kv_score_input: object, ape: object, plan: object, head_dim: object,
    compress_ratio: object, out: object, is_online: object,
) -> _Compress | None:
    """The CUDA short path (see the module docstring), or None to run the full checks."""
    buf = kv_score_buffer
    if not (type(buf) is torch.Tensor and buf.is_cuda and type(is_online) is bool
            and type(kv_score_input) is torch.Tensor and type(ape) is torch.Tensor
            and type(plan) in _PLAN_TYPES and (out is None or type(out) is torch.Tensor)
            and not debug_checks_enabled()):
        return None
    layer = _LAYERS.get((compress_ratio, head_dim, is_online))  # type: ignore[arg-type]
    if layer is None or type(compress_ratio) is not int or type(head_dim) is not int:
        return None
    if plan[0] != compress_ratio or plan.is_online not in (None, is_online):  # plan[0]: the plan's ratio
        return None
    in_dtype = kv_score_input.dtype
    if buf.dtype not in _FLOATS or in_dtype not in _FLOATS or (out is not None and out.dtype not in _FLOATS):
        return None  # the full checks name the argument with the unsupported dtype
    if is_online and in_dtype is not torch.float32:
        return None
    # guards (attribute tests only): autograd inputs and an input inside the state pool take the full checks
    if torch.is_grad_enabled() and (buf.requires_grad or kv_score_input.requires_grad or ape.requires_grad):
        return None
    in0, buf0 = kv_score_input.data_ptr(), buf.data_ptr()
    if in0 < buf0 + buf.nbytes and buf0 < in0 + kv_score_input.nbytes:
        return None
    width, page_rows = layer
    shape = buf.shape
    if len(shape) == 3:
        if shape[1] != page_rows or shape[2] != width or not buf.is_contiguous():
            return None
        buf = buf.view(-1, width)
    elif len(shape) != 2:
        return None
    return _Compress(buf, kv_score_input, ape, plan[1], None if plan.is_decode else plan[2],
                     compress_ratio, head_dim, is_online)


def _fast_store(D: int, plan: object, norm_weight: object, norm_eps: object,
                freq_cis: object, use_fp4: object, bf16_store: object) -> CacheFormat | None:
    """The CUDA short path of a store (the caller tested that its rows are on CUDA): the cache
    format, or None to run the full checks."""
    if not (type(plan) in _PLAN_TYPES and type(use_fp4) is bool
            and type(bf16_store) is bool and type(norm_eps) is float and 0.0 < norm_eps < 1.0
            and type(freq_cis) is torch.Tensor and freq_cis.dtype is torch.complex64
            and not debug_checks_enabled()):
        return None
    if torch.is_grad_enabled() and (freq_cis.requires_grad or getattr(norm_weight, "requires_grad", False)):
        return None  # guard: the full checks name the argument
    if D == 128 and not bf16_store:
        return select_cache_format(D, use_fp4, False)
    if D == 512 and not use_fp4:
        return select_cache_format(D, False, bf16_store)
    return None


def _check_compress(
    kv_score_buffer: object, kv_score_input: object, ape: object, plan: object, head_dim: object,
    compress_ratio: object, out: object, is_online: object,
) -> _Compress:
    ratio = V.check_ratio(compress_ratio)
    if not isinstance(is_online, bool):
        V.fail("is_online", "a bool", repr(is_online), TypeError)
    if is_online and ratio != 128:
        V.fail("is_online", "False unless compress_ratio is 128", f"True with compress_ratio {ratio}")
    plan = check_plan(plan, ratio)
    head_dim = V.check_head_dim(head_dim, ratio, is_online)
    if plan.is_online is not None and plan.is_online != is_online:
        made = "generate_online" if plan.is_online else "generate"
        V.fail("is_online", f"{plan.is_online} (the plan was built by {made})", is_online)

    state = V.flat_state(kv_score_buffer, ratio, head_dim, is_online)
    device = state.device
    plan_rows = V.check_plan_tensor("plan[1]", plan[1], PLAN_ROW_BYTES, device)
    n_rows = plan_rows.shape[0]
    plan_w = None
    if not plan.is_decode:
        plan_w = V.check_plan_tensor("plan[2]", plan[2], PLAN_ROW_BYTES if is_online else WRITE_ROW_BYTES, device)
    inp, ape_t = V.check_compress_inputs(state, kv_score_input, ape, out, n_rows, ratio, head_dim, is_online)
    n_in = inp.shape[0]
    if plan_w is None and n_in != n_rows:
        V.fail("kv_score_input", f"{n_rows} rows (one per decode request)", n_in)
    if plan_w is not None and n_in < plan_w.shape[0]:
        V.fail("kv_score_input", f">= {plan_w.shape[0]} rows (WritePlan rows)", n_in)
    if V.wants_value_checks(plan_rows):
        rows = state.shape[0]
        if plan_w is None:
            V.check_plan_indices(rows, n_in, ratio, is_online, decode=decode_fields(plan_rows))
        elif is_online:
            V.check_plan_indices(rows, n_in, ratio, True, compress=compress_fields(plan_rows))
            V.check_plan_indices(rows, n_in, ratio, True, compress=compress_fields(plan_w))
        else:
            V.check_plan_indices(rows, n_in, ratio, False, compress=compress_fields(plan_rows),
                                 write=write_fields(plan_w))
    return _Compress(state, inp, ape_t, plan_rows, plan_w, ratio, head_dim, is_online)


def _check_store_values(
    plan: CompressorDecodePlan | CompressorPrefillPlan, plan_rows: torch.Tensor, loc: torch.Tensor,
    kvcache: torch.Tensor, page_size: int, freq: torch.Tensor,
) -> None:
    """Data-dependent store checks (always on CPU tensors, ``FLASHCOMPRESS_DEBUG=1`` on GPU ones)."""
    if not V.wants_value_checks(plan_rows):
        return
    if not plan.is_decode:
        fields = compress_fields(plan_rows)
        ragged = fields["ragged_id"][fields["valid"]]
        if ragged.numel() and int(ragged.max()) >= loc.shape[0]:
            V.fail("out_loc", f"> {int(ragged.max())} entries (largest ragged_id in the plan)", loc.shape[0])
    valid, dest, positions = store_targets(plan_rows, plan.is_decode, plan.compress_ratio, loc)
    V.check_store_values(dest[valid], positions[valid], kvcache, page_size, freq.shape[0])


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
    """Fold per-token KV projections into compressed entries and update the state pool.

    Returns ``out [plan rows, head_dim]`` (dtype of ``kv_score_input`` unless
    ``out`` is given): decode, one row per request (zeros where the request is
    not at a window boundary); prefill, one row per CompressPlan row (zeros for
    invalid rows).  The state pool is updated in place.
    """
    if torch.compiler.is_compiling():  # traced by torch.compile: one custom op, no value checks in the graph
        return _library.compress_forward(kv_score_buffer, kv_score_input, ape, plan, head_dim=head_dim,
                                         compress_ratio=compress_ratio, out=out, is_online=is_online)
    return _run_compress_forward(kv_score_buffer, kv_score_input, ape, plan, head_dim, compress_ratio, out, is_online)


def _run_compress_forward(
    kv_score_buffer: object, kv_score_input: object, ape: object, plan: object, head_dim: object,
    compress_ratio: object, out: torch.Tensor | None, is_online: object,
) -> torch.Tensor:
    """Validation + dispatch of ``compress_forward`` (also the torch.compile op's implementation)."""
    c = _fast_compress(kv_score_buffer, kv_score_input, ape, plan, head_dim, compress_ratio, out, is_online)
    if c is None:
        c = _check_compress(kv_score_buffer, kv_score_input, ape, plan, head_dim, compress_ratio, out, is_online)
    device, n_rows, plan_w = c.state.device, c.plan_rows.shape[0], c.plan_w
    if out is None:
        out = torch.empty((n_rows, c.head_dim), dtype=c.inp.dtype, device=device)
    if n_rows == 0 and (plan_w is None or plan_w.shape[0] == 0):
        return out
    ops_backend(device).compress_forward(
        c.state, c.inp, c.ape, c.plan_rows, plan_w, out,
        ratio=c.ratio, head_dim=c.head_dim, is_online=c.is_online)
    return out


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
) -> None:
    """RMSNorm + RoPE (+ Hadamard for the indexer) + quantised store of compressed rows.

    Row ``i`` of ``kv`` belongs to plan row ``i``.  Decode rows are stored iff
    ``seq_len % ratio == 0`` at ``out_loc[i]``; prefill rows iff valid, at
    ``out_loc[ragged_id]``.  RoPE position is ``seq_len - ratio``.  Skipped rows
    write nothing.
    """
    if torch.compiler.is_compiling():  # traced by torch.compile: one custom op, no value checks in the graph
        return _library.compress_norm_rope_store(kv, plan, norm_weight=norm_weight, norm_eps=norm_eps,
                                                 freq_cis=freq_cis, out_loc=out_loc, kvcache=kvcache,
                                                 page_size=page_size, use_fp4=use_fp4, bf16_store=bf16_store)
    _run_compress_norm_rope_store(kv, plan, norm_weight, norm_eps, freq_cis, out_loc, kvcache, page_size, use_fp4,
                                  bf16_store)


def _run_compress_norm_rope_store(
    kv: object, plan: object, norm_weight: object, norm_eps: object, freq_cis: object, out_loc: object,
    kvcache: object, page_size: object, use_fp4: object, bf16_store: object,
) -> None:
    """Validation + dispatch of ``compress_norm_rope_store`` (also the torch.compile op's implementation)."""
    if type(kv) is torch.Tensor and kv.is_cuda and kv.dim() == 2 and not (torch.is_grad_enabled() and kv.requires_grad):
        fmt = _fast_store(kv.shape[1], plan, norm_weight, norm_eps, freq_cis, use_fp4, bf16_store)
        if fmt is not None:
            plan_rows = plan[1]  # type: ignore[index]
            if plan_rows.shape[0]:
                ops_backend(kv.device).compress_norm_rope_store(
                    kv, plan_rows, is_decode=plan.is_decode, ratio=plan.compress_ratio,  # type: ignore[union-attr]
                    norm_weight=norm_weight, norm_eps=norm_eps, freq_cis=freq_cis,
                    out_loc=out_loc, kvcache=kvcache, page_size=page_size, fmt=fmt)
            return
    plan = check_plan(plan, None)
    plan_rows = V.check_plan_tensor("plan[1]", plan[1], PLAN_ROW_BYTES, None)
    kv_t, loc, freq, fmt = V.check_store_args(
        kv, plan_rows.shape[0], norm_weight, norm_eps, freq_cis, out_loc, kvcache, page_size,
        use_fp4, bf16_store, plan.is_decode, select_cache_format,
    )
    device = kv_t.device
    if plan_rows.device != device:
        V.fail("plan[1]", f"device {device} (same as kv)", plan_rows.device)
    if plan_rows.shape[0] == 0:
        return
    _check_store_values(plan, plan_rows, loc, kvcache, page_size, freq)
    ops_backend(device).compress_norm_rope_store(
        kv_t, plan_rows, is_decode=plan.is_decode, ratio=plan.compress_ratio,
        norm_weight=norm_weight, norm_eps=float(norm_eps), freq_cis=freq,
        out_loc=loc, kvcache=kvcache, page_size=page_size, fmt=fmt,
    )


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
) -> None:
    """``compress_forward`` then ``compress_norm_rope_store`` in one call.

    On CUDA the compress kernel stores each row itself (decode: one launch; prefill: the
    pooling pass, which stores, then the state write pass).
    Writes exactly the state rows and cache bytes of the two-step path (the
    compressed row is rounded to the input dtype before the store, as the
    two-step path's intermediate is); the intermediate rows never reach memory.
    Same arguments and validation as the two calls together, checked once.
    """
    if torch.compiler.is_compiling():  # traced by torch.compile: one custom op, no value checks in the graph
        return _library.compress_and_store(
            kv_score_buffer, kv_score_input, ape, plan, head_dim=head_dim, compress_ratio=compress_ratio,
            norm_weight=norm_weight, norm_eps=norm_eps, freq_cis=freq_cis, out_loc=out_loc, kvcache=kvcache,
            page_size=page_size, use_fp4=use_fp4, bf16_store=bf16_store, is_online=is_online)
    _run_compress_and_store(kv_score_buffer, kv_score_input, ape, plan, head_dim, compress_ratio, norm_weight,
                            norm_eps, freq_cis, out_loc, kvcache, page_size, use_fp4, bf16_store, is_online)


def _run_compress_and_store(
    kv_score_buffer: object, kv_score_input: object, ape: object, plan: object, head_dim: object,
    compress_ratio: object, norm_weight: object, norm_eps: object, freq_cis: object, out_loc: object,
    kvcache: object, page_size: object, use_fp4: object, bf16_store: object, is_online: object,
) -> None:
    """Validation + dispatch of ``compress_and_store`` (also the torch.compile op's implementation)."""
    c = _fast_compress(kv_score_buffer, kv_score_input, ape, plan, head_dim, compress_ratio, None, is_online)
    # a short-path compress is on CUDA, so the store may take its short path too
    fmt = None if c is None else _fast_store(c.head_dim, plan, norm_weight, norm_eps, freq_cis, use_fp4, bf16_store)
    if c is not None and fmt is not None:
        loc, freq = out_loc, freq_cis
    else:
        c = _check_compress(kv_score_buffer, kv_score_input, ape, plan, head_dim, compress_ratio, None, is_online)
        loc, freq, fmt = V.check_store_targets(
            c.state.device, c.head_dim, c.plan_rows.shape[0], norm_weight, norm_eps, freq_cis, out_loc, kvcache,
            page_size, use_fp4, bf16_store, plan.is_decode, select_cache_format,  # type: ignore[union-attr]
        )
        _check_store_values(plan, c.plan_rows, loc, kvcache, page_size, freq)  # type: ignore[arg-type]
    plan_w = c.plan_w
    if c.plan_rows.shape[0] == 0 and (plan_w is None or plan_w.shape[0] == 0):
        return
    ops_backend(c.state.device).compress_and_store(
        c.state, c.inp, c.ape, c.plan_rows, plan_w,
        ratio=c.ratio, head_dim=c.head_dim, is_online=c.is_online, is_decode=plan.is_decode,  # type: ignore[union-attr]
        norm_weight=norm_weight, norm_eps=float(norm_eps), freq_cis=freq,  # type: ignore[arg-type]
        out_loc=loc, kvcache=kvcache, page_size=page_size, fmt=fmt,
    )
