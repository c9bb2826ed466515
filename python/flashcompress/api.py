"""The engine-facing ops: ``compress_forward`` and ``compress_norm_rope_store``.

Data flows one way: arguments -> ``validation`` -> backend choice
(``dispatch``) -> PyTorch backend or JIT kernel.  Nothing is written before
every check has passed.
"""

from __future__ import annotations

import torch

from . import validation as V
from .layouts import PLAN_ROW_BYTES, WRITE_ROW_BYTES, select_cache_format
from .plans import CompressorDecodePlan, CompressorPrefillPlan
from .torch_backend import compress as torch_compress
from .torch_backend import store as torch_store
from .torch_backend.rows import compress_fields, decode_fields, write_fields


def is_overlap_compress(ratio: int) -> bool:
    """Ratio 4 pools overlapping windows (8 candidates); ratio 128 does not."""
    return V.check_ratio(ratio) == 4


def _check_plan(plan: object, ratio: int) -> CompressorDecodePlan | CompressorPrefillPlan:
    if not isinstance(plan, (CompressorDecodePlan, CompressorPrefillPlan)):
        V.fail("plan", "a CompressorDecodePlan or CompressorPrefillPlan", type(plan).__name__, TypeError)
    if plan.compress_ratio != ratio:
        V.fail("plan", f"a plan built for compress_ratio {ratio}", f"compress_ratio {plan.compress_ratio}")
    return plan


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

    Returns ``out [plan rows, head_dim]``: decode, one row per request (zeros
    where the request is not at a window boundary); prefill, one row per
    CompressPlan row (zeros for invalid rows).  The state pool is updated in place.
    """
    ratio = V.check_ratio(compress_ratio)
    if not isinstance(is_online, bool):
        V.fail("is_online", "a bool", repr(is_online), TypeError)
    if is_online and ratio != 128:
        V.fail("is_online", "False unless compress_ratio is 128", f"True with compress_ratio {ratio}")
    plan = _check_plan(plan, ratio)
    head_dim = V.check_head_dim(head_dim, ratio, is_online)
    if plan.is_online is not None and plan.is_online != is_online:
        made = "generate_online" if plan.is_online else "generate"
        V.fail("is_online", f"{plan.is_online} (the plan was built by {made})", is_online)

    state = V.flat_state(kv_score_buffer, ratio, head_dim, is_online)
    device = state.device
    plan_rows = plan[1]
    V.check_plan_tensor("plan[1]", plan_rows, PLAN_ROW_BYTES, device)
    inp, ape_t = V.check_compress_inputs(state, kv_score_input, ape, out, plan_rows.shape[0], ratio, head_dim, is_online)
    if plan.is_decode:
        if inp.shape[0] != plan_rows.shape[0]:
            V.fail("kv_score_input", f"{plan_rows.shape[0]} rows (one per decode request)", inp.shape[0])
    else:
        plan_w = plan[2]
        V.check_plan_tensor("plan[2]", plan_w, PLAN_ROW_BYTES if is_online else WRITE_ROW_BYTES, device)
        if inp.shape[0] < plan_w.shape[0]:
            V.fail("kv_score_input", f">= {plan_w.shape[0]} rows (WritePlan rows)", inp.shape[0])
    if V.wants_value_checks(plan_rows):
        if plan.is_decode:
            V.check_plan_indices(state.shape[0], inp.shape[0], ratio, is_online, decode=decode_fields(plan_rows))
        elif is_online:
            V.check_plan_indices(state.shape[0], inp.shape[0], ratio, True,
                                 compress=compress_fields(plan_rows))
            V.check_plan_indices(state.shape[0], inp.shape[0], ratio, True, compress=compress_fields(plan[2]))
        else:
            V.check_plan_indices(state.shape[0], inp.shape[0], ratio, False,
                                 compress=compress_fields(plan_rows), write=write_fields(plan[2]))

    if out is None:
        out = torch.empty((plan_rows.shape[0], head_dim), dtype=inp.dtype, device=device)
    if ape_t.dtype != inp.dtype:
        ape_t = ape_t.to(inp.dtype)
    if plan_rows.shape[0] == 0 and (plan.is_decode or plan[2].shape[0] == 0):
        return out

    # Backend: the PyTorch backend on every device until the CUDA compress kernels land
    # (then `dispatch.use_jit(device, "compress")` selects them here).
    if is_online:
        if plan.is_decode:
            torch_compress.online_decode(head_dim, state, inp, ape_t, plan_rows, out)
        else:
            torch_compress.online_prefill(head_dim, state, inp, ape_t, plan_rows, plan[2], out)
    elif plan.is_decode:
        torch_compress.decode(ratio, head_dim, state, inp, ape_t, plan_rows, out)
    else:
        torch_compress.prefill(ratio, head_dim, state, inp, ape_t, plan_rows, plan[2], out)
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
    if not isinstance(plan, (CompressorDecodePlan, CompressorPrefillPlan)):
        V.fail("plan", "a CompressorDecodePlan or CompressorPrefillPlan", type(plan).__name__, TypeError)
    ratio = V.check_ratio(plan.compress_ratio)
    plan_rows = plan[1]
    if not isinstance(plan_rows, torch.Tensor):
        V.fail("plan[1]", "a torch.Tensor", type(plan_rows).__name__, TypeError)
    kv_t, loc, freq, fmt = V.check_store_args(
        kv, plan_rows.shape[0], norm_weight, norm_eps, freq_cis, out_loc, kvcache, page_size,
        use_fp4, bf16_store, plan.is_decode, select_cache_format,
    )
    V.check_plan_tensor("plan[1]", plan_rows, PLAN_ROW_BYTES, kv_t.device)
    if plan_rows.shape[0] == 0:
        return

    if plan.is_decode:
        seq_len = decode_fields(plan_rows)["seq_len"]
        valid = torch.remainder(seq_len, ratio) == 0
        dest = loc
    else:
        fields = compress_fields(plan_rows)
        seq_len, valid = fields["seq_len"], fields["valid"]
        if V.wants_value_checks(plan_rows):
            ragged = fields["ragged_id"][valid]
            if ragged.numel() and int(ragged.max()) >= loc.shape[0]:
                V.fail("out_loc", f"> {int(ragged.max())} entries (largest ragged_id in the plan)", loc.shape[0])
        dest = loc[torch.where(valid, fields["ragged_id"], 0)]
    positions = seq_len - ratio
    if V.wants_value_checks(plan_rows):
        V.check_store_values(dest[valid], positions[valid], kvcache, page_size, freq.shape[0])

    freq_real = torch.view_as_real(freq).flatten(-2)
    if not freq_real.is_contiguous():
        freq_real = freq_real.contiguous()
    weight = norm_weight if norm_weight.dtype == kv_t.dtype else norm_weight.to(kv_t.dtype)
    torch_store.norm_rope_store(
        kv_t, positions, dest, valid,
        norm_weight=weight, norm_eps=float(norm_eps), freq_real=freq_real,
        kvcache=kvcache, page_size=page_size, fmt=fmt,
    )
