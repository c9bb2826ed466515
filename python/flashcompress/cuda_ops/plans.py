"""The ``plan`` JIT family: GPU builders of the compressor plans (spec/compressor.md §3-§4).

Every launcher returns bytes identical to ``flashcompress.torch_backend.plans`` for the
same inputs, in the same row order (batch-major, then position-ascending; no atomics).
All tensors live on one CUDA device; outputs are allocated here with torch and the
kernels run on the caller's current stream.  Arguments are assumed validated by the
API layer (``flashcompress.plans``); the binding re-checks dtypes, shapes and devices
(cheap, ``ValueError``/``TypeError`` naming the argument) but never reads device values.

Variants: ``ratio`` in {4, 128} x ``online`` (online only with ratio 128).  Every
variant exports ``decode``, ``decode_checked`` / ``decode_alloc`` (the eager path of
``CompressorDecodePlan.generate*``, ``flashcompress.fastpath``: ``decode`` plus the API's table
checks; ``decode_alloc`` allocates the rows itself through torch's allocator), ``prefill_stage1``,
``prefill_device``, ``prefill_host`` and ``layout_info`` (jit_kernel/plan_binding.h lists the signatures).
``prefill_host`` is the eager prefill plan of host lengths and a device world in one call (the
API's checks of that case, stage 0 on the host into a pinned ring slot, device rows from torch's
allocator, H2D copies and stage 1 on the current stream: jit_kernel/plan_host_prefill.h); the
public ``generate`` / ``generate_online`` use it once learnt (``flashcompress.plans.HOST_PREFILL``),
``prefill_plan`` / ``online_prefill_plan`` below are the full path's launchers.

The planner entry points have the names and signatures of ``torch_backend.plans``
(``dispatch.plans_backend`` returns one module or the other)::

    decode_plan(ratio, req_pool_indices, req_to_token, full_to_state, seq_lens,
                swa_page_size, ring_size, use_req_ring)                      -> plan_d [B, 16]
    online_decode_plan(seq_lens, req_pool_indices, state_slot_offset)        -> plan_d [B, 16]
    prefill_plan(ratio, req_pool_indices, seq_lens, extend_lens, req_to_token, full_to_state,
                 swa_page_size, ring_size, num_q_tokens, use_cuda_graph, use_req_ring)
                                   -> (plan_c, plan_w)   device lengths: the device planner
    online_prefill_plan(seq_lens, extend_lens, req_pool_indices, num_q_tokens, use_cuda_graph,
                        state_slot_offset)                                   -> (plan_c, plan_w)
    prefill_stage1(ratio, plan_c, plan_w, req_pool_indices, req_to_token, full_to_state,
                   swa_page_size, ring_size, use_req_ring, *, num_c=, num_w=) -> (plan_c, plan_w), in place

Kernel-level launchers (tests, benchmarks)::

    online_prefill_stage1_both(plan_c, plan_w, req_pool_indices, state_slot_offset,
                               *, num_c=, num_w=)                            -> None (in place)
    prefill_plan_device(ratio, req_pool_indices, seq_lens, extend_lens, req_to_token,
                        full_to_state, swa_page_size, ring_size, num_q_tokens,
                        use_req_ring)                       -> (plan_c [N, 16], plan_w [N, 8])
    online_prefill_plan_device(req_pool_indices, seq_lens, extend_lens, num_q_tokens,
                               state_slot_offset)          -> (plan_c [N, 16], plan_w [N, 16])
    layout_info(ratio, online)                              -> dict (C++ layouts, no GPU needed)

The ``*_device`` planners are the CUDA-graph path: lengths stay on the GPU, there is no
host synchronisation, both lists have exactly ``num_q_tokens`` rows (the padded token
count; rows past the real counts are sentinels), and they can be captured with
``torch.cuda.graph``.  They run one single-block scan kernel (any batch size; the API
layer bounds it by ``num_q_tokens <= 65536``) and one row kernel.  Stage 1 treats rows
``[num_c, rows)`` (default: none) as padding and writes sentinels there; rows before
``num_c`` are CPU-built stage-0 rows (an invalid one is rewritten as the full sentinel).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Mapping

import torch

from ..jit.family import Family, register_family
from ..jit.models import model_config
from ..layouts import PLAN_ROW_BYTES, WRITE_ROW_BYTES

if TYPE_CHECKING:  # pragma: no cover
    from ..jit.variant import VariantKey

__all__ = [
    "PLAN",
    "decode_plan",
    "layout_info",
    "online_decode_plan",
    "online_prefill_plan",
    "online_prefill_plan_device",
    "online_prefill_stage1_both",
    "prefill_plan",
    "prefill_plan_device",
    "prefill_stage1",
    "prefill_workspace",
]

EXPORTS = ("decode", "decode_checked", "decode_alloc", "prefill_stage1", "prefill_device", "prefill_host", "layout_info")


# --------------------------------------------------------------------------
# Family registration
# --------------------------------------------------------------------------


def _validate(params: Mapping[str, Any]) -> None:
    """The one constraint ``space`` cannot express."""
    if params["online"] and params["ratio"] != 128:
        raise ValueError(f"plan: online=True exists only for ratio 128, got ratio={params['ratio']}")


def _presets(model: str) -> list[dict[str, Any]]:
    """One plan variant per C4 / C128 ratio of the model (V4.1's ratio-1/2 layers run no plan)."""
    ratios = model_config(model).v4_ratios
    variants: list[dict[str, Any]] = [{"ratio": r, "online": False} for r in ratios]
    if 128 in ratios:
        variants.append({"ratio": 128, "online": True})
    return variants


def _warmup(key: "VariantKey") -> None:
    """Launch every GPU export of ``key`` once on the current GPU (prewarm calls this so that
    nothing is first-loaded or first-launched during CUDA-graph capture). Byte comparisons
    against the PyTorch backend live in the tests (tests/test_gpu_plans.py)."""
    from ..jit import load

    ratio, online = int(key.param_dict["ratio"]), bool(key.param_dict["online"])
    module = load(key)
    i64 = dict(dtype=torch.int64, device=torch.device("cuda", torch.cuda.current_device()))
    rids, seq, ext = torch.tensor([1], **i64), torch.tensor([9], **i64), torch.tensor([9], **i64)
    # Stage 1 over one padding row (num_c = num_w = 0): the kernel only writes sentinels.
    pad_c = torch.empty((1, PLAN_ROW_BYTES), dtype=torch.uint8, device=i64["device"])
    pad_w = torch.empty((1, PLAN_ROW_BYTES if online else WRITE_ROW_BYTES), dtype=torch.uint8, device=i64["device"])
    if online:
        online_prefill_plan_device(rids, seq, ext, 9, 0, module=module)
        online_prefill_stage1_both(pad_c, pad_w, rids, 0, num_c=0, num_w=0, module=module)
        online_decode_plan(seq, rids, 0, module=module)
    else:
        ring = 8 if ratio == 4 else 128
        r2t = torch.arange(2 * 16, dtype=torch.int32, device=i64["device"]).view(2, 16)
        f2s = torch.arange(2 * 16, **i64)
        prefill_plan_device(ratio, rids, seq, ext, r2t, f2s, 256, ring, 9, module=module)
        prefill_stage1(ratio, pad_c, pad_w, rids, r2t, f2s, 256, ring, num_c=0, num_w=0, module=module)
        decode_plan(ratio, rids, r2t, f2s, seq, 256, ring, module=module)
    torch.cuda.synchronize()


PLAN = register_family(
    Family(
        "plan",
        sources=(("plan_kernel.cu.j2", "kernel.cu"), ("plan_binding.cpp.j2", "binding.cpp")),
        exports=EXPORTS,
        space={"ratio": (4, 128), "online": (False, True)},
        warmup=_warmup,
    ),
    validate=_validate,
    presets=_presets,
)


# --------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------


def _module(ratio: int, online: bool) -> Any:
    from ..jit import get_module

    return get_module("plan", ratio=int(ratio), online=bool(online))


def _world(
    req_to_token: torch.Tensor | None, full_to_state: torch.Tensor | None, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The paged-addressing tables; request-ring callers may pass None (empty placeholders)."""
    if req_to_token is None:
        req_to_token = torch.empty((0, 0), dtype=torch.int32, device=device)
    if full_to_state is None:
        full_to_state = torch.empty((0,), dtype=torch.int64, device=device)
    return req_to_token, full_to_state


def prefill_workspace(batch: int, device: torch.device) -> torch.Tensor:
    """Scratch of the device prefill planners: 3 * (batch + 1) int64 (scans over requests)."""
    return torch.empty((3 * (batch + 1),), dtype=torch.int64, device=device)


def decode_plan(
    ratio: int,
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor | None,
    full_to_state: torch.Tensor | None,
    seq_lens: torch.Tensor,
    swa_page_size: int,
    ring_size: int,
    use_req_ring: bool = False,
    *,
    out: torch.Tensor | None = None,
    module: Any = None,
) -> torch.Tensor:
    """DecodePlan rows ``uint8 [B, 16]`` (spec §4.1): one thread per request."""
    device = req_pool_indices.device
    batch = req_pool_indices.shape[0]
    if out is None:
        out = torch.empty((batch, PLAN_ROW_BYTES), dtype=torch.uint8, device=device)
    if batch == 0:
        return out
    r2t, f2s = _world(req_to_token, full_to_state, device)
    mod = module if module is not None else _module(ratio, False)
    mod.decode(out, req_pool_indices, r2t, f2s, seq_lens, int(swa_page_size), int(ring_size), bool(use_req_ring))
    return out


def online_decode_plan(
    seq_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
    state_slot_offset: int = 0,
    *,
    out: torch.Tensor | None = None,
    module: Any = None,
) -> torch.Tensor:
    """Online C128 DecodePlan rows: write_loc = read_page_0 = rid + offset, read_page_1 = -1."""
    device = req_pool_indices.device
    batch = req_pool_indices.shape[0]
    if out is None:
        out = torch.empty((batch, PLAN_ROW_BYTES), dtype=torch.uint8, device=device)
    if batch == 0:
        return out
    mod = module if module is not None else _module(128, True)
    mod.decode(out, req_pool_indices, seq_lens, int(state_slot_offset))
    return out


def prefill_stage1(
    ratio: int,
    plan_c: torch.Tensor,
    plan_w: torch.Tensor,
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor | None,
    full_to_state: torch.Tensor | None,
    swa_page_size: int,
    ring_size: int,
    use_req_ring: bool = False,
    *,
    num_c: int | None = None,
    num_w: int | None = None,
    module: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1 in place over stage-0 rows already on the GPU (spec §4.4); returns ``(plan_c, plan_w)``.

    Rows ``[0, num_c)`` of ``plan_c`` are stage-0 rows, rows ``[num_c, len)`` padding that
    becomes sentinels (default ``num_c = len``: the caller padded with sentinels already);
    likewise ``num_w`` for ``plan_w``.
    """
    rows_c, rows_w = plan_c.shape[0], plan_w.shape[0]
    if rows_c == 0 and rows_w == 0:
        return plan_c, plan_w
    r2t, f2s = _world(req_to_token, full_to_state, plan_c.device)
    mod = module if module is not None else _module(ratio, False)
    mod.prefill_stage1(
        plan_c, plan_w, rows_c if num_c is None else int(num_c), rows_w if num_w is None else int(num_w),
        req_pool_indices, r2t, f2s, int(swa_page_size), int(ring_size), bool(use_req_ring),
    )
    return plan_c, plan_w


def online_prefill_stage1_both(
    plan_c: torch.Tensor,
    plan_w: torch.Tensor,
    req_pool_indices: torch.Tensor,
    state_slot_offset: int = 0,
    *,
    num_c: int | None = None,
    num_w: int | None = None,
    module: Any = None,
) -> None:
    """Online stage 1 in place over both lists in one launch (spec §4.6): read_page_0 <- rid + offset,
    read_page_1 <- rid. (``torch_backend.plans.online_prefill_stage1`` takes one list.)"""
    rows_c, rows_w = plan_c.shape[0], plan_w.shape[0]
    if rows_c == 0 and rows_w == 0:
        return
    mod = module if module is not None else _module(128, True)
    mod.prefill_stage1(
        plan_c, plan_w, rows_c if num_c is None else int(num_c), rows_w if num_w is None else int(num_w),
        req_pool_indices, int(state_slot_offset),
    )


def prefill_plan_device(
    ratio: int,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    req_to_token: torch.Tensor | None,
    full_to_state: torch.Tensor | None,
    swa_page_size: int,
    ring_size: int,
    num_q_tokens: int,
    use_req_ring: bool = False,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    workspace: torch.Tensor | None = None,
    module: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Final prefill plan from device lengths, no host sync (spec §4.3, deterministic order).

    Returns ``(plan_c [num_q_tokens, 16], plan_w [num_q_tokens, 8])``; rows past the real
    counts are sentinels.  ``out``/``workspace`` may be passed to reuse buffers.
    """
    device = req_pool_indices.device
    n = int(num_q_tokens)
    if out is None:
        plan_c = torch.empty((n, PLAN_ROW_BYTES), dtype=torch.uint8, device=device)
        plan_w = torch.empty((n, WRITE_ROW_BYTES), dtype=torch.uint8, device=device)
    else:
        plan_c, plan_w = out
    if n == 0:
        return plan_c, plan_w
    if workspace is None:
        workspace = prefill_workspace(req_pool_indices.shape[0], device)
    r2t, f2s = _world(req_to_token, full_to_state, device)
    mod = module if module is not None else _module(ratio, False)
    mod.prefill_device(
        plan_c, plan_w, workspace, req_pool_indices, seq_lens, extend_lens, r2t, f2s,
        int(swa_page_size), int(ring_size), bool(use_req_ring),
    )
    return plan_c, plan_w


def online_prefill_plan_device(
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    num_q_tokens: int,
    state_slot_offset: int = 0,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    workspace: torch.Tensor | None = None,
    module: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Online C128 prefill plan from device lengths: both lists ``[num_q_tokens, 16]``, no host sync."""
    device = req_pool_indices.device
    n = int(num_q_tokens)
    if out is None:
        plan_c = torch.empty((n, PLAN_ROW_BYTES), dtype=torch.uint8, device=device)
        plan_w = torch.empty((n, PLAN_ROW_BYTES), dtype=torch.uint8, device=device)
    else:
        plan_c, plan_w = out
    if n == 0:
        return plan_c, plan_w
    if workspace is None:
        workspace = prefill_workspace(req_pool_indices.shape[0], device)
    mod = module if module is not None else _module(128, True)
    mod.prefill_device(plan_c, plan_w, workspace, req_pool_indices, seq_lens, extend_lens, int(state_slot_offset))
    return plan_c, plan_w


def layout_info(ratio: int = 4, online: bool = False, *, module: Any = None) -> dict[str, Any]:
    """The C++ plan layouts of a built variant (sizes, field offsets, sentinel bytes); host only."""
    mod = module if module is not None else _module(ratio, online)
    return json.loads(str(mod.layout_info()))


def _upload(host_rows: torch.Tensor, device: torch.device, rows: int | None) -> torch.Tensor:
    """Pinned host rows -> a new ``device`` tensor of ``rows`` rows (default: as many as the host has),
    asynchronously on the current stream; rows past the host rows are left for stage 1 to fill."""
    if rows is None:
        return host_rows.to(device, non_blocking=True)
    out = torch.empty((rows, host_rows.shape[1]), dtype=torch.uint8, device=device)
    out[: host_rows.shape[0]].copy_(host_rows, non_blocking=True)
    return out


def prefill_plan(
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Final CompressPlan / WritePlan rows, as ``torch_backend.plans.prefill_plan``.

    Lengths on the GPU: the device planner (no host sync; both lists ``[num_q_tokens]``, the
    caller passes ``use_cuda_graph=True``). Lengths on the CPU: stage 0 on the host by the native
    host planner (``plan_host``; exact counts, into pinned memory), async H2D copy of the real
    rows, stage-1 kernel (which also writes the sentinel rows up to ``num_q_tokens`` with
    ``use_cuda_graph``).
    """
    if seq_lens.device.type != "cpu":
        return prefill_plan_device(ratio, req_pool_indices, seq_lens, extend_lens, req_to_token, full_to_state,
                                   swa_page_size, ring_size, num_q_tokens, use_req_ring)
    from . import plan_host

    device = req_pool_indices.device
    host_c, host_w = plan_host.prefill_stage0(ratio, seq_lens, extend_lens, swa_page_size, ring_size, use_req_ring,
                                              num_q_tokens, pin_memory=True)
    rows = num_q_tokens if use_cuda_graph else None
    return prefill_stage1(ratio, _upload(host_c, device, rows), _upload(host_w, device, rows), req_pool_indices,
                          req_to_token, full_to_state, swa_page_size, ring_size, use_req_ring,
                          num_c=host_c.shape[0], num_w=host_w.shape[0])


def online_prefill_plan(
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
    num_q_tokens: int,
    use_cuda_graph: bool,
    state_slot_offset: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Online prefill lists, as ``torch_backend.plans.online_prefill_plan``: segments cut on the
    CPU by the native host planner (host lengths; pinned memory), async H2D copy, one stage-1
    launch over both lists (sentinel rows up to ``num_q_tokens`` with ``use_cuda_graph``)."""
    from . import plan_host

    device = req_pool_indices.device
    host_c, host_w = plan_host.online_prefill_stage0(seq_lens.cpu(), extend_lens.cpu(), num_q_tokens,
                                                     pin_memory=True)
    rows = num_q_tokens if use_cuda_graph else None
    plan_c, plan_w = _upload(host_c, device, rows), _upload(host_w, device, rows)
    online_prefill_stage1_both(plan_c, plan_w, req_pool_indices, state_slot_offset,
                               num_c=host_c.shape[0], num_w=host_w.shape[0])
    return plan_c, plan_w
