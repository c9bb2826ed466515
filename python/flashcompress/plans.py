"""Plan containers and builders: ``CompressorDecodePlan`` and ``CompressorPrefillPlan``.

A plan is a tuple ``(compress_ratio, plan_rows...)`` of raw uint8 plan tensors
(byte layouts in ``flashcompress.layouts``):

  CompressorDecodePlan   (ratio, plan_d [B, 16])
  CompressorPrefillPlan  (ratio, plan_c [C, 16], plan_w [W, 8])   online: plan_w [W, 16]

``generate*`` validate their arguments, then build the plan with the module
``dispatch.plans_backend(device)`` returns: ``torch_backend.plans`` (CPU tensors)
or ``cuda_ops.plans`` (the CUDA plan-builder kernels, same functions).  Both
produce the same bytes in the same row order (batch-major, position-ascending).
An empty batch returns empty plans and launches nothing.

Host lengths with the world on a GPU (an engine's eager prefill): once a call of that kind passed
the full path, later ones are a single native call (``HOST_PREFILL``, the ``plan`` export
``prefill_host``), which checks what the full path checks for that case before writing anything;
a call it rejects runs the full path, which raises the named error.  ``FLASHCOMPRESS_DEBUG=1`` and
the PyTorch backend always take the full path.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from . import fastpath as _fastpath
from . import validation as V
from .dispatch import plans_backend
from .jit import settings as _settings
from .jit.family import module_memo
from .layouts import PLAN_ROW_BYTES, WRITE_ROW_BYTES


def _empty(rows_bytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty((0, rows_bytes), dtype=torch.uint8, device=device)


_NO_TABLE = torch.empty(0, dtype=torch.int64)  # full_to_state of a plan that reads none (online)


def _native_checks(ratio: int, online: bool):
    """The native host planner module that runs the value checks of an all-CPU prefill plan
    (``check_prefill_values``: the messages of ``validation``'s checks, in their order), or None
    where it is unavailable (the checks run in PyTorch)."""
    from .cuda_ops import plan_host

    return plan_host.native_planner(ratio, online, stacklevel=4)  # warns at generate's caller


# The eager prefill planner of host lengths and a device world (an engine's eager prefill): one
# native call, the ``plan`` variant's ``prefill_host`` (jit_kernel/plan_host_prefill.h: the API's
# checks of that case, stage 0 on the host into a pinned ring slot, device rows from torch's
# allocator, H2D copies and stage 1 on the current stream). Key: the ratio (``generate``) or
# "online" (``generate_online``) -> the export, or None where it is unavailable; learnt from a call
# that passed the full path on the JIT backend (``_learn_host_prefill``), emptied with the JIT memos.
# A call the export rejects wrote nothing: the full path then raises the named error.
HOST_PREFILL: dict[Any, Callable[..., Any] | None] = module_memo()


def _host_prefill_ready() -> bool:
    """The export is the last line of checks: the JIT backend, no debug value checks."""
    return _settings._JIT_ENABLED is True and _settings._DEBUG is False


def _learn_host_prefill(key: Any, plan: "CompressorPrefillPlan", args: tuple[Any, ...]) -> None:
    """Learn ``HOST_PREFILL[key]`` from a full-path plan built on the GPU from host lengths: the
    export is probed once on the same arguments (it must return rows of the plan's shapes)."""
    if key in HOST_PREFILL or not _fastpath._learnable(plan[1].get_device()):
        return
    from .cuda_ops import plans as cp

    fn = None
    try:
        _bind_array_item()
        module = cp._module(128, True) if key == "online" else cp._module(key, False)
        candidate = _fastpath._no_gil(module.prefill_host)
        rows = _rows(candidate(*args))
        if all(isinstance(r, torch.Tensor) and r.is_cuda and r.shape == p.shape for r, p in zip(rows, plan[1:])):
            fn = candidate
    except Exception:  # noqa: BLE001  (no export in this build, no allocator: the full path stays)
        fn = None
    HOST_PREFILL[key] = fn


# tvm-ffi's ArrayGetItem: the two rows of the export's Array by one FFI call each (indexing the
# Array costs two more). Bound when an export is first probed: importing the API loads no tvm-ffi.
_array_item: Callable[[Any, int], Any] | None = None


def _bind_array_item() -> None:
    global _array_item
    try:
        from tvm_ffi._ffi_api import ArrayGetItem
    except ImportError:  # pragma: no cover  (another tvm-ffi layout: Array indexing)
        return
    _array_item = ArrayGetItem


def _rows(result: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(plan_c, plan_w)`` of a ``prefill_host`` result (a tvm-ffi Array of two tensors)."""
    if _array_item is not None:
        return _array_item(result, 0), _array_item(result, 1)
    return result[0], result[1]


class _PlanBase(V.PlanTuple):
    """Tuple-like plan: ``plan[0]`` is the ratio, ``plan[1:]`` the plan tensors."""

    def copy_(self, other: "_PlanBase") -> "_PlanBase":
        """Copy ``other``'s plan bytes into this plan's tensors (CUDA-graph replay): same class,
        ratio, kind, dtypes, devices and shapes (pad with ``use_cuda_graph``).  Returns ``self``.

        Example: ``static_plan.copy_(CompressorDecodePlan.generate(...))``.
        """
        if type(other) is not type(self):
            V.fail("other", type(self).__name__, type(other).__name__, TypeError)
        if other.compress_ratio != self.compress_ratio:
            V.fail("other", f"compress_ratio {self.compress_ratio}", other.compress_ratio)
        if None not in (self.is_online, other.is_online) and self.is_online != other.is_online:
            V.fail("other", f"an {'online' if self.is_online else 'regular'} plan",
                   "an online plan" if other.is_online else "a regular plan")
        for i, (dst, src) in enumerate(zip(self[1:], other[1:]), start=1):
            if not isinstance(src, torch.Tensor) or src.dtype != dst.dtype:
                V.fail("other", f"plan[{i}] of dtype {dst.dtype}", getattr(src, "dtype", type(src).__name__), TypeError)
            if src.device != dst.device:
                V.fail("other", f"plan[{i}] on {dst.device}", src.device)
            if dst.shape != src.shape:
                V.fail("other", f"plan[{i}] shape {tuple(dst.shape)} (pad with use_cuda_graph)", tuple(src.shape))
        for dst, src in zip(self[1:], other[1:]):
            dst.copy_(src, non_blocking=True)
        return self


class CompressorDecodePlan(_PlanBase):
    """Decode plan: ``(compress_ratio, plan_d uint8 [B, 16])``, one DecodePlan row per request.

    Build it with ``generate`` (C4 / C128) or ``generate_online`` (online C128), once per step,
    and pass it to every compressor op of the step.  ``copy_`` refreshes a CUDA-graph plan.
    """

    is_decode = True

    def __new__(cls, compress_ratio: int, plan_d: torch.Tensor, *, is_online: bool | None = None):
        self = super().__new__(cls, (compress_ratio, plan_d))
        self.is_online = is_online
        return self

    @staticmethod
    def generate(
        compress_ratio: int,
        req_pool_indices: torch.Tensor,
        req_to_token: torch.Tensor,
        full_to_state: torch.Tensor,
        seq_lens: torch.Tensor,
        swa_page_size: int,
        ring_size: int,
        use_req_ring: bool = False,
    ) -> "CompressorDecodePlan":
        """Build the decode plan of one step (C4 / C128): one DecodePlan row per request.

        The argument order is the peer's (SGLang's DeepSeek-V4 compressor planners), kept for
        drop-in use; pass them by name to be safe.  All index tensors live on the device the ops
        run on (the plan is built there: CPU -> PyTorch reference, CUDA -> the plan kernels).

        Args:
            compress_ratio: 4 or 128.
            req_pool_indices: int64 ``[B]``, the batch's request slots (rows of ``req_to_token``),
                distinct (CUDA-graph padding rows with ``seq_len`` 1 may share one).
            req_to_token: int32 ``[slots, max_ctx]``, the full-KV loc of every (slot, position).
            full_to_state: int64 ``[full_size + swa_page_size + 1]``, full loc -> SWA loc (paged C4
                only; ratio 128 and the request ring ignore its values, any 1-D int64 tensor).
            seq_lens: int64 ``[B]``, sequence lengths including this step's token (``>= 1``,
                ``<= max_ctx``), on the same device.
            swa_page_size: SWA page size in tokens (256 on DeepSeek-V4), a multiple of ``ring_size``
                in paged mode.
            ring_size: state rows per request ring / SWA page (8 or 16 for C4, 128 or 256 for C128),
                a multiple of ``compress_ratio``.
            use_req_ring: C4 only: address the state by request ring (``rid * ring + p % ring``)
                instead of paged SWA; ratio 128 always uses the request ring (False required).

        Returns ``CompressorDecodePlan(ratio, plan_d uint8 [B, 16])``.

        Example: ``plan = CompressorDecodePlan.generate(4, rids, req_to_token, full_to_state,
        seq_lens, 256, 8)``.
        """
        plan = _fastpath.decode_plan(compress_ratio, req_pool_indices, req_to_token, full_to_state, seq_lens,
                                     swa_page_size, ring_size, use_req_ring)
        if plan is not None:  # a steady-state CUDA call: the binding checked it (fastpath)
            return plan
        ratio = V.check_ratio(compress_ratio)
        device = V.check_world(req_pool_indices, req_to_token, full_to_state)
        seq = V.check_lengths("seq_lens", seq_lens, req_pool_indices.shape[0], device, allow_cpu=False)
        paged = ratio == 4 and not use_req_ring
        V.check_ring(ratio, ring_size, swa_page_size, use_req_ring, paged)
        V.check_decode_lengths(seq)
        V.check_positions_in_table(seq, req_to_token)
        V.check_distinct_requests(req_pool_indices, seq)
        if paged and seq.numel() and V.wants_value_checks(seq):
            p1 = seq - 1
            V.check_state_locations(req_pool_indices, req_to_token, full_to_state,
                                    torch.stack([p1, (p1 - ratio).clamp(min=0)], dim=1),
                                    swa_page_size=swa_page_size, ring_size=ring_size)
        if seq.shape[0] == 0:
            return CompressorDecodePlan(ratio, _empty(PLAN_ROW_BYTES, device), is_online=False)
        plan_d = plans_backend(device).decode_plan(ratio, req_pool_indices, req_to_token, full_to_state, seq,
                                                   swa_page_size, ring_size, use_req_ring)
        plan = CompressorDecodePlan(ratio, plan_d, is_online=False)
        _fastpath.remember_decode_plan(plan, ratio, swa_page_size, ring_size, use_req_ring, req_pool_indices,
                                       req_to_token, full_to_state, seq)
        return plan

    @staticmethod
    def generate_online(
        seq_lens: torch.Tensor,
        req_pool_indices: torch.Tensor,
        req_to_token: torch.Tensor,
        state_slot_offset: int = 0,
    ) -> "CompressorDecodePlan":
        """Build the decode plan of one online C128 step: one row per request (ratio 128 implied).

        The argument order is the peer's (SGLang's DeepSeek-V4 compressor planners), kept for
        drop-in use; pass them by name to be safe.  All index tensors live on the device the ops
        run on (the plan is built there: CPU -> PyTorch reference, CUDA -> the plan kernels).

        Args:
            seq_lens: int64 ``[B]``, sequence lengths including this step's token (``>= 1``,
                ``<= max_ctx``).  Note the order: lengths first, then the slots.
            req_pool_indices: int64 ``[B]``, the batch's request slots, distinct; the state row of
                slot ``rid`` is ``rid`` (loads) and ``rid + state_slot_offset`` (writes).
            req_to_token: int32 ``[slots, max_ctx]`` (its shape bounds the slots and the lengths).
            state_slot_offset: 0, or ``num_req_slots + 2`` for a target-verify batch (MTP bank 1).

        Swapped ``seq_lens`` / ``req_pool_indices`` are caught where the values break a bound
        (a slot ``>= slots``, a length ``> max_ctx`` or ``< 1``): always for CPU tensors, with
        ``FLASHCOMPRESS_DEBUG=1`` for CUDA ones (the check reads device values).

        Returns ``CompressorDecodePlan(128, plan_d uint8 [B, 16], is_online=True)``.

        Example: ``plan = CompressorDecodePlan.generate_online(seq_lens, rids, req_to_token)``.
        """
        plan = _fastpath.online_decode_plan(seq_lens, req_pool_indices, req_to_token, state_slot_offset)
        if plan is not None:  # a steady-state CUDA call: the binding checked it (fastpath)
            return plan
        device = V.check_world(req_pool_indices, req_to_token, None)
        seq = V.check_lengths("seq_lens", seq_lens, req_pool_indices.shape[0], device, allow_cpu=False)
        V.check_slot_offset(state_slot_offset, req_to_token)
        V.check_decode_lengths(seq)
        V.check_positions_in_table(seq, req_to_token)
        V.check_distinct_requests(req_pool_indices, seq)
        if seq.shape[0] == 0:
            return CompressorDecodePlan(128, _empty(PLAN_ROW_BYTES, device), is_online=True)
        plan_d = plans_backend(device).online_decode_plan(seq, req_pool_indices, state_slot_offset)
        plan = CompressorDecodePlan(128, plan_d, is_online=True)
        _fastpath.remember_online_decode_plan(plan, state_slot_offset, req_pool_indices, req_to_token, seq)
        return plan


class CompressorPrefillPlan(_PlanBase):
    """Prefill plan: ``(compress_ratio, plan_c uint8 [C, 16], plan_w uint8 [W, 8])``: CompressPlan
    rows (one per event) and WritePlan rows (one per kept token); online: ``plan_w [W, 16]``.

    Build it with ``generate`` (C4 / C128) or ``generate_online`` (online C128).
    """

    is_decode = False

    def __new__(
        cls, compress_ratio: int, plan_c: torch.Tensor, plan_w: torch.Tensor, *, is_online: bool | None = None
    ):
        self = super().__new__(cls, (compress_ratio, plan_c, plan_w))
        if is_online is None and isinstance(plan_w, torch.Tensor) and plan_w.dim() == 2:
            is_online = plan_w.shape[1] == PLAN_ROW_BYTES
        self.is_online = is_online
        return self

    @staticmethod
    def generate(
        compress_ratio: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        extend_lens: torch.Tensor,
        req_to_token: torch.Tensor,
        full_to_state: torch.Tensor,
        swa_page_size: int,
        ring_size: int,
        num_q_tokens: int,
        use_cuda_graph: bool = False,
        use_req_ring: bool = False,
    ) -> "CompressorPrefillPlan":
        """Build the prefill plan of one step (C4 / C128): CompressPlan rows (one per compress
        event) and WritePlan rows (one per token kept in the state pool).

        The argument order is the peer's (SGLang's DeepSeek-V4 compressor planners), kept for
        drop-in use; pass them by name to be safe.  All index tensors live on the device the ops
        run on (the plan is built there: CPU -> PyTorch reference, CUDA -> the plan kernels).

        Args:
            compress_ratio: 4 or 128.
            req_pool_indices: int64 ``[B]``, the batch's request slots, distinct.
            seq_lens: int64 ``[B]``, sequence lengths after this chunk.  On the CPU (eager prefill:
                host planner, exact row counts) or on the device (graph prefill: no host sync,
                both lists padded to ``num_q_tokens`` rows).
            extend_lens: int64 ``[B]``, this chunk's tokens per request (``0 < extend <= seq``; the
                chunk covers positions ``[seq - extend, seq)``), on the same device as ``seq_lens``.
            req_to_token: int32 ``[slots, max_ctx]``, full-KV loc of every (slot, position).
            full_to_state: int64 ``[full_size + swa_page_size + 1]``, full loc -> SWA loc (paged C4
                only; otherwise any 1-D int64 tensor).
            swa_page_size: SWA page size in tokens (256), a multiple of ``ring_size`` in paged mode.
            ring_size: state rows per ring / SWA page, a multiple of ``compress_ratio``.
            num_q_tokens: ragged token count of the batch (rows of ``kv_score_input``): host lengths
                ``== sum(extend_lens)``; device lengths the padded bucket (``>= sum``, ``<= 65536``).
            use_cuda_graph: host lengths only: pad both lists to ``num_q_tokens`` rows (fixed shapes).
            use_req_ring: C4 only: request-ring addressing instead of paged SWA (False for 128).

        Returns ``CompressorPrefillPlan(ratio, plan_c uint8 [C, 16], plan_w uint8 [W, 8])``.

        Example: ``plan = CompressorPrefillPlan.generate(4, rids, seq_lens, extend_lens, req_to_token,
        full_to_state, 256, 8, int(extend_lens.sum()))``.
        """
        fn = HOST_PREFILL.get(compress_ratio) if type(compress_ratio) is int else None
        if (fn is not None and type(swa_page_size) is int and type(ring_size) is int and type(num_q_tokens) is int
                and type(use_cuda_graph) is bool and type(use_req_ring) is bool and _host_prefill_ready()):
            try:  # host lengths, device world: the one-call planner (checks first, writes nothing on error)
                if seq_lens.is_cpu and req_pool_indices.is_cuda:
                    plan_c, plan_w = _rows(fn(seq_lens, extend_lens, req_pool_indices, req_to_token, full_to_state,
                                              swa_page_size, ring_size, use_req_ring, num_q_tokens, use_cuda_graph))
                    return CompressorPrefillPlan(compress_ratio, plan_c, plan_w, is_online=False)
            except Exception:  # noqa: BLE001  (rejected: the full path below raises the named error)
                pass
        ratio = V.check_ratio(compress_ratio)
        device = V.check_world(req_pool_indices, req_to_token, full_to_state)
        batch = req_pool_indices.shape[0]
        seq = V.check_lengths("seq_lens", seq_lens, batch, device, allow_cpu=True)
        ext = V.check_lengths("extend_lens", extend_lens, batch, seq.device, allow_cpu=False)
        if not isinstance(use_cuda_graph, bool):
            V.fail("use_cuda_graph", "a bool", repr(use_cuda_graph), TypeError)
        V.check_ring(ratio, ring_size, swa_page_size, use_req_ring, ratio == 4 and not use_req_ring)
        host_lengths = seq.device.type == "cpu"
        paged = ratio == 4 and not use_req_ring
        # every tensor on the CPU: the value checks below run natively (same messages, same order)
        native = _native_checks(ratio, False) if host_lengths and device.type == "cpu" else None
        V.check_prefill_lengths(seq, ext, num_q_tokens, exact_total=host_lengths, values=native is None)
        if native is not None:
            native.check_prefill_values(req_pool_indices, req_to_token, full_to_state, seq, ext, num_q_tokens, True,
                                        paged, swa_page_size, ring_size)
        else:
            V.check_positions_in_table(seq, req_to_token)
            V.check_distinct_requests(req_pool_indices, seq)
        # The state locations are values of the world tensors (req_to_token, full_to_state): checked where
        # those live on the CPU (or in debug mode), whatever device the lengths are on.
        if native is None and paged and batch and V.wants_value_checks(req_pool_indices):
            # the planner reads positions [prefix - 4, seq) of each request (overlap window included)
            first = (seq - ext - ratio).clamp(min=0)
            count = seq - first
            batch_of = torch.repeat_interleave(torch.arange(batch, device=seq.device), count)
            pos = torch.arange(int(count.sum()), device=seq.device) - (torch.cumsum(count, 0) - count)[batch_of]
            V.check_state_locations(req_pool_indices, req_to_token, full_to_state,
                                    (pos + first[batch_of]).to(device), batch_of.to(device),
                                    swa_page_size=swa_page_size, ring_size=ring_size)
        if batch == 0 or num_q_tokens == 0:
            return CompressorPrefillPlan(
                ratio, _empty(PLAN_ROW_BYTES, device), _empty(WRITE_ROW_BYTES, device), is_online=False
            )
        if host_lengths and device.type == "cpu":  # an all-CPU plan: both stages in the native host planner
            from .cuda_ops import plan_host

            native = plan_host.cpu_prefill_plan(ratio, req_pool_indices, seq, ext, req_to_token, full_to_state,
                                                swa_page_size, ring_size, num_q_tokens, use_cuda_graph, use_req_ring)
            if native is not None:
                return CompressorPrefillPlan(ratio, native[0], native[1], is_online=False)
        # Device-resident lengths (the CUDA-graph path) pad both lists to num_q_tokens on either backend.
        plan_c, plan_w = plans_backend(device).prefill_plan(
            ratio, req_pool_indices, seq, ext, req_to_token, full_to_state, swa_page_size, ring_size, num_q_tokens,
            use_cuda_graph or not host_lengths, use_req_ring,
        )
        plan = CompressorPrefillPlan(ratio, plan_c, plan_w, is_online=False)
        if host_lengths and device.type == "cuda":
            _learn_host_prefill(ratio, plan, (seq, ext, req_pool_indices, req_to_token, full_to_state, swa_page_size,
                                              ring_size, use_req_ring, num_q_tokens, use_cuda_graph))
        return plan

    @staticmethod
    def generate_online(
        seq_lens: torch.Tensor,
        extend_lens: torch.Tensor,
        req_pool_indices: torch.Tensor,
        req_to_token: torch.Tensor,
        num_q_tokens: int,
        use_cuda_graph: bool = False,
        state_slot_offset: int = 0,
    ) -> "CompressorPrefillPlan":
        """Build the prefill plan of one online C128 step: segment rows for both lists (CompressPlan
        layout, ``[C, 16]`` and ``[W, 16]``; ratio 128 implied).

        The argument order is the peer's (SGLang's DeepSeek-V4 compressor planners), kept for
        drop-in use; pass them by name to be safe.  All index tensors live on the device the ops
        run on (the plan is built there: CPU -> PyTorch reference, CUDA -> the plan kernels).

        Args:
            seq_lens: int64 ``[B]``, sequence lengths after this chunk (CPU or device; device
                lengths are copied to the host: the segments are cut there, as in the peer).
            extend_lens: int64 ``[B]``, this chunk's tokens per request, ``0 < extend <= seq``, on
                the device of ``seq_lens``.  Note the order: both lengths first, then the slots.
            req_pool_indices: int64 ``[B]``, the batch's request slots, distinct.
            req_to_token: int32 ``[slots, max_ctx]`` (bounds the slots and the lengths).
            num_q_tokens: ``sum(extend_lens)`` (rows of ``kv_score_input``; no padded bucket).
            use_cuda_graph: pad both lists to ``num_q_tokens`` rows.
            state_slot_offset: 0, or ``num_req_slots + 2`` for a target-verify batch (writes MTP
                bank 1, loads bank 0).

        Swapped int64 ``[B]`` arguments are caught where the values break a bound: a slot ``>=
        slots``, ``extend > seq``, ``seq > max_ctx``, ``sum(extend_lens) != num_q_tokens`` (the
        lengths are always checked on the host; the slots on the host, or with
        ``FLASHCOMPRESS_DEBUG=1`` on the device).

        Returns ``CompressorPrefillPlan(128, plan_c, plan_w, is_online=True)``.

        Example: ``plan = CompressorPrefillPlan.generate_online(seq_lens, extend_lens, rids,
        req_to_token, int(extend_lens.sum()))``.
        """
        fn = HOST_PREFILL.get("online")
        if (fn is not None and type(num_q_tokens) is int and type(use_cuda_graph) is bool
                and type(state_slot_offset) is int and _host_prefill_ready()):
            try:  # host lengths, device world: the one-call planner (checks first, writes nothing on error)
                if seq_lens.is_cpu and req_pool_indices.is_cuda:
                    plan_c, plan_w = _rows(fn(seq_lens, extend_lens, req_pool_indices, req_to_token, num_q_tokens,
                                              use_cuda_graph, state_slot_offset))
                    return CompressorPrefillPlan(128, plan_c, plan_w, is_online=True)
            except Exception:  # noqa: BLE001  (rejected: the full path below raises the named error)
                pass
        device = V.check_world(req_pool_indices, req_to_token, None)
        batch = req_pool_indices.shape[0]
        seq = V.check_lengths("seq_lens", seq_lens, batch, device, allow_cpu=True)
        ext = V.check_lengths("extend_lens", extend_lens, batch, seq.device, allow_cpu=False)
        if not isinstance(use_cuda_graph, bool):
            V.fail("use_cuda_graph", "a bool", repr(use_cuda_graph), TypeError)
        V.check_slot_offset(state_slot_offset, req_to_token)
        host_lengths = seq.device.type == "cpu"
        # Online segments are cut on the host (a sync if the lengths live on the GPU, as in the peer).
        seq, ext = seq.cpu(), ext.cpu()
        native = _native_checks(128, True) if device.type == "cpu" else None
        V.check_prefill_lengths(seq, ext, num_q_tokens, exact_total=True, values=native is None)
        if native is not None:  # every tensor on the CPU: the value checks natively (same messages)
            native.check_prefill_values(req_pool_indices, req_to_token, _NO_TABLE, seq, ext, num_q_tokens, True,
                                        False, 1, 1)
        else:
            V.check_positions_in_table(seq, req_to_token)
            V.check_distinct_requests(req_pool_indices, seq)
        if batch == 0 or num_q_tokens == 0:
            return CompressorPrefillPlan(
                128, _empty(PLAN_ROW_BYTES, device), _empty(PLAN_ROW_BYTES, device), is_online=True
            )
        if device.type == "cpu":  # an all-CPU plan: both stages in the native host planner
            from .cuda_ops import plan_host

            native = plan_host.cpu_online_prefill_plan(seq, ext, req_pool_indices, num_q_tokens, use_cuda_graph,
                                                       state_slot_offset)
            if native is not None:
                return CompressorPrefillPlan(128, native[0], native[1], is_online=True)
        plan_c, plan_w = plans_backend(device).online_prefill_plan(
            seq, ext, req_pool_indices, num_q_tokens, use_cuda_graph, state_slot_offset
        )
        plan = CompressorPrefillPlan(128, plan_c, plan_w, is_online=True)
        if host_lengths and device.type == "cuda":
            _learn_host_prefill("online", plan, (seq, ext, req_pool_indices, req_to_token, num_q_tokens,
                                                 use_cuda_graph, state_slot_offset))
        return plan


_fastpath._DecodePlan = CompressorDecodePlan  # the eager binding-first path recognises decode plans by class
