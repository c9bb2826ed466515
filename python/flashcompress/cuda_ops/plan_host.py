"""The ``plan_host`` JIT family: the native host planner, stage 0 of prefill plans from host lengths.

When ``seq_lens`` / ``extend_lens`` live on the CPU (an engine's eager prefill), stage 0 of
``CompressorPrefillPlan.generate`` / ``generate_online`` (spec/compressor.md §4.2, §4.6) runs
here, as compiled C++ (jit_kernel/plan_host.h), instead of as a sequence of PyTorch CPU ops.
The rows are written straight into host tensors the caller then copies to its device (pinned
ones for a GPU, so that the copy is asynchronous).  When the plan stays on the CPU (every
tensor a host tensor), stage 1 runs here too (``cpu_prefill_plan`` / ``cpu_online_prefill_plan``:
the bytes of ``torch_backend.plans.prefill_stage1`` / ``online_prefill_stage1``, in place on the
stage-0 rows); for a GPU plan stage 1 is the plan kernel.

The family is host-only (``Family.host_only``): its modules are built by the JIT engine like
every other variant, but with the host C++ compiler alone (no nvcc, no GPU runtime; target
``host:<machine>``), so they build and run on a machine without CUDA.  Variants: ``ratio`` in
{4, 128} x ``online`` (online only with ratio 128), each exporting ``prefill_stage0`` and
``prefill_stage1``, ``prefill_plan`` (both stages in one call), ``check_state_locations`` and
``check_prefill_values`` (the API's value checks of an all-CPU prefill, same messages and order;
signatures in jit_kernel/plan_host_binding.h).

Bytes: identical to ``torch_backend.plans.prefill_stage0`` / ``online_prefill_stage0`` (the
reference) for every input, padded with the sentinel rows of ``layouts`` when asked.

Fallback (``native_planner``): with ``FLASHCOMPRESS_BACKEND=torch`` the PyTorch stage 0 runs,
silently (it was asked for).  Otherwise the variant is loaded through the engine; where it
cannot be loaded or built (no C++ compiler and no cached entry, offline cache miss, build
failure, unwritable cache: any ``JitError``) the PyTorch stage 0 runs and a
``HostPlannerFallbackWarning`` (``flashcompress.jit``) says why, once per variant and process.
The bytes are the same either way; only the host time differs.

Arguments are assumed validated by ``flashcompress.plans`` (lengths are int64, 1-D, on the CPU,
``sum(extend_lens) == num_tokens``; a larger ``num_tokens`` is a padded bucket); the binding re-checks everything it relies on before it
writes a byte and raises the validation layer's ``ValueError`` / ``TypeError`` messages.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

from ..jit.errors import HostPlannerFallbackWarning, JitError
from ..jit.family import Family, module_memo, register_family
from ..jit.settings import get_settings
from ..layouts import INVALID_COMPRESS_ROW, INVALID_WRITE_ROW, PLAN_ROW_BYTES, WRITE_ROW_BYTES
from ..torch_backend import plans as torch_plans
from ..torch_backend.rows import pad_rows
from .plans import _presets, _validate

__all__ = [
    "HostPlannerFallbackWarning", "PLAN_HOST", "cpu_online_prefill_plan", "cpu_prefill_plan", "native_planner",
    "online_prefill_stage0", "prefill_stage0",
]

PLAN_HOST = register_family(
    Family(
        "plan_host",
        sources=(("plan_host_binding.cpp.j2", "binding.cpp"),),
        exports=("prefill_stage0", "prefill_stage1", "prefill_plan", "check_state_locations", "check_prefill_values"),
        space={"ratio": (4, 128), "online": (False, True)},
        host_only=True,
    ),
    validate=_validate,
    presets=_presets,
)


_NATIVE: dict[tuple[int, bool], Any] = module_memo()  # (ratio, online) -> module, or None: PyTorch


def native_planner(ratio: int, online: bool, *, stacklevel: int = 5) -> Any | None:
    """The loaded ``plan_host`` module of ``(ratio, online)``, or None when stage 0 runs in PyTorch
    (``backend = "torch"``, or the module is unavailable: warned once, see the module docstring).
    ``stacklevel``: the warning's, counted from here (the default fits the planner functions)."""
    memo_key = (ratio, online)
    try:
        return _NATIVE[memo_key]
    except KeyError:
        pass
    module = None
    if get_settings().backend != "torch":
        from ..jit import get_module

        try:
            module = get_module("plan_host", ratio=ratio, online=online)
        except JitError as exc:
            warnings.warn(
                f"flashcompress: the native host planner plan_host(ratio={ratio}, online={online}) is unavailable, "
                f"so prefill stage 0 with host lengths runs in PyTorch (same bytes, more host time): "
                f"{type(exc).__name__}: {exc}\nSet FLASHCOMPRESS_BACKEND=torch to choose the PyTorch planner "
                f"without this warning.", HostPlannerFallbackWarning, stacklevel=stacklevel)  # the generate call
    _NATIVE[memo_key] = module
    return module


def _host_rows(rows: int, row_bytes: int, pin_memory: bool) -> torch.Tensor:
    return torch.empty((rows, row_bytes), dtype=torch.uint8, pin_memory=pin_memory)


def _stage0(
    module: Any | None,
    native_args: tuple[Any, ...],
    reference: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    num_tokens: int,
    write_row_bytes: int,
    write_sentinel: bytes,
    pad: bool,
    pin_memory: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run stage 0 natively into fresh host tensors, or the PyTorch ``reference`` without a module."""
    if module is None:
        plan_c, plan_w = reference()
        if pad:
            plan_c = pad_rows(plan_c, num_tokens, INVALID_COMPRESS_ROW)
            plan_w = pad_rows(plan_w, num_tokens, write_sentinel)
        return (plan_c.pin_memory(), plan_w.pin_memory()) if pin_memory else (plan_c, plan_w)
    # Both counts are at most sum(extend_lens) <= num_tokens rows: one pass, no counting call.
    plan_c = _host_rows(num_tokens, PLAN_ROW_BYTES, pin_memory)
    plan_w = _host_rows(num_tokens, write_row_bytes, pin_memory)
    num_c, num_w = module.prefill_stage0(plan_c, plan_w, *native_args, pad)
    return (plan_c, plan_w) if pad else (plan_c[:num_c], plan_w[:num_w])


def prefill_stage0(
    ratio: int,
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    swa_page_size: int,
    ring_size: int,
    use_req_ring: bool,
    num_tokens: int,
    *,
    pad: bool = False,
    pin_memory: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage-0 rows of a regular prefill plan from CPU lengths: ``(plan_c [nc, 16], plan_w [nw, 8])``.

    The bytes of ``torch_backend.plans.prefill_stage0``; ``num_tokens >= sum(extend_lens)`` (the API
    passes the sum itself). ``pad``: both lists have ``num_tokens`` rows, the rows past the counts
    sentinels.
    ``pin_memory``: the tensors are (views of) pinned host memory, for an async H2D copy.
    """
    return _stage0(
        native_planner(ratio, False),
        (seq_lens, extend_lens, int(swa_page_size), int(ring_size), bool(use_req_ring)),
        lambda: torch_plans.prefill_stage0(ratio, seq_lens, extend_lens, swa_page_size, ring_size, use_req_ring),
        num_tokens, WRITE_ROW_BYTES, INVALID_WRITE_ROW, pad, pin_memory,
    )


def online_prefill_stage0(
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    num_tokens: int,
    *,
    pad: bool = False,
    pin_memory: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Online C128 stage-0 rows from CPU lengths: ``(plan_c [nc, 16], plan_w [nw, 16])``, the bytes of
    ``torch_backend.plans.online_prefill_stage0``; ``num_tokens``, ``pad``, ``pin_memory`` as in
    ``prefill_stage0``."""
    return _stage0(
        native_planner(128, True),
        (seq_lens, extend_lens),
        lambda: torch_plans.online_prefill_stage0(seq_lens, extend_lens),
        num_tokens, PLAN_ROW_BYTES, INVALID_COMPRESS_ROW, pad, pin_memory,
    )


def cpu_prefill_plan(
    ratio: int,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    req_to_token: torch.Tensor,
    full_to_state: torch.Tensor,
    swa_page_size: int,
    ring_size: int,
    num_q_tokens: int,
    use_cuda_graph: bool,
    use_req_ring: bool,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The final regular prefill plan ``(plan_c, plan_w)`` for CPU tensors, stage 0 and stage 1 native.

    The bytes of ``torch_backend.plans.prefill_plan`` (same arguments; every tensor on the CPU,
    validated by the API); None where the native planner is unavailable (the caller runs PyTorch).
    """
    module = native_planner(ratio, False)
    if module is None:
        return None
    plan_c = _host_rows(num_q_tokens, PLAN_ROW_BYTES, False)
    plan_w = _host_rows(num_q_tokens, WRITE_ROW_BYTES, False)
    num_c, num_w = module.prefill_plan(plan_c, plan_w, seq_lens, extend_lens, req_pool_indices, req_to_token,
                                       full_to_state, int(swa_page_size), int(ring_size), bool(use_req_ring),
                                       bool(use_cuda_graph))
    return (plan_c, plan_w) if use_cuda_graph else (plan_c[:num_c], plan_w[:num_w])


def cpu_online_prefill_plan(
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
    num_q_tokens: int,
    use_cuda_graph: bool,
    state_slot_offset: int,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The final online C128 prefill plan for CPU tensors (stage 0 and 1 native): the bytes of
    ``torch_backend.plans.online_prefill_plan``; None where the native planner is unavailable."""
    module = native_planner(128, True)
    if module is None:
        return None
    plan_c = _host_rows(num_q_tokens, PLAN_ROW_BYTES, False)
    plan_w = _host_rows(num_q_tokens, PLAN_ROW_BYTES, False)
    num_c, num_w = module.prefill_plan(plan_c, plan_w, seq_lens, extend_lens, req_pool_indices,
                                       int(state_slot_offset), bool(use_cuda_graph))
    return (plan_c, plan_w) if use_cuda_graph else (plan_c[:num_c], plan_w[:num_w])
