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
"""

from __future__ import annotations

import torch

from . import validation as V
from .dispatch import plans_backend
from .layouts import PLAN_ROW_BYTES, WRITE_ROW_BYTES


def _empty(rows_bytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty((0, rows_bytes), dtype=torch.uint8, device=device)


class _PlanBase(V.PlanTuple):
    """Tuple-like plan: ``plan[0]`` is the ratio, ``plan[1:]`` the plan tensors."""

    def copy_(self, other: "_PlanBase") -> "_PlanBase":
        """Copy ``other``'s plan bytes into this plan's tensors (CUDA-graph replay)."""
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
    """Decode plan: one 16-byte DecodePlan row per request."""

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
        return CompressorDecodePlan(ratio, plan_d, is_online=False)

    @staticmethod
    def generate_online(
        seq_lens: torch.Tensor,
        req_pool_indices: torch.Tensor,
        req_to_token: torch.Tensor,
        state_slot_offset: int = 0,
    ) -> "CompressorDecodePlan":
        device = V.check_world(req_pool_indices, req_to_token, None)
        seq = V.check_lengths("seq_lens", seq_lens, req_pool_indices.shape[0], device, allow_cpu=False)
        V.check_slot_offset(state_slot_offset, req_to_token)
        V.check_decode_lengths(seq)
        V.check_distinct_requests(req_pool_indices, seq)
        if seq.shape[0] == 0:
            return CompressorDecodePlan(128, _empty(PLAN_ROW_BYTES, device), is_online=True)
        plan_d = plans_backend(device).online_decode_plan(seq, req_pool_indices, state_slot_offset)
        return CompressorDecodePlan(128, plan_d, is_online=True)


class CompressorPrefillPlan(_PlanBase):
    """Prefill plan: CompressPlan rows (one per event) and WritePlan rows (one per kept token)."""

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
        ratio = V.check_ratio(compress_ratio)
        device = V.check_world(req_pool_indices, req_to_token, full_to_state)
        batch = req_pool_indices.shape[0]
        seq = V.check_lengths("seq_lens", seq_lens, batch, device, allow_cpu=True)
        ext = V.check_lengths("extend_lens", extend_lens, batch, seq.device, allow_cpu=False)
        if not isinstance(use_cuda_graph, bool):
            V.fail("use_cuda_graph", "a bool", repr(use_cuda_graph), TypeError)
        V.check_ring(ratio, ring_size, swa_page_size, use_req_ring, ratio == 4 and not use_req_ring)
        host_lengths = seq.device.type == "cpu"
        V.check_prefill_lengths(seq, ext, num_q_tokens, exact_total=host_lengths)
        V.check_positions_in_table(seq, req_to_token)
        V.check_distinct_requests(req_pool_indices, seq)
        if ratio == 4 and not use_req_ring and batch and V.wants_value_checks(seq):
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
        # Device-resident lengths (the CUDA-graph path) pad both lists to num_q_tokens on either backend.
        plan_c, plan_w = plans_backend(device).prefill_plan(
            ratio, req_pool_indices, seq, ext, req_to_token, full_to_state, swa_page_size, ring_size, num_q_tokens,
            use_cuda_graph or not host_lengths, use_req_ring,
        )
        return CompressorPrefillPlan(ratio, plan_c, plan_w, is_online=False)

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
        device = V.check_world(req_pool_indices, req_to_token, None)
        batch = req_pool_indices.shape[0]
        seq = V.check_lengths("seq_lens", seq_lens, batch, device, allow_cpu=True)
        ext = V.check_lengths("extend_lens", extend_lens, batch, seq.device, allow_cpu=False)
        if not isinstance(use_cuda_graph, bool):
            V.fail("use_cuda_graph", "a bool", repr(use_cuda_graph), TypeError)
        V.check_slot_offset(state_slot_offset, req_to_token)
        # Online segments are cut on the host (a sync if the lengths live on the GPU, as in the peer).
        seq, ext = seq.cpu(), ext.cpu()
        V.check_prefill_lengths(seq, ext, num_q_tokens, exact_total=True)
        V.check_positions_in_table(seq, req_to_token)
        V.check_distinct_requests(req_pool_indices, seq)
        if batch == 0 or num_q_tokens == 0:
            return CompressorPrefillPlan(
                128, _empty(PLAN_ROW_BYTES, device), _empty(PLAN_ROW_BYTES, device), is_online=True
            )
        plan_c, plan_w = plans_backend(device).online_prefill_plan(
            seq, ext, req_pool_indices, num_q_tokens, use_cuda_graph, state_slot_offset
        )
        return CompressorPrefillPlan(128, plan_c, plan_w, is_online=True)

