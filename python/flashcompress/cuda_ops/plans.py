"""The ``plan`` JIT family: GPU builders of the compressor plans (spec/compressor.md §3-§4).

Every launcher returns bytes identical to ``flashcompress.torch_backend.plans`` for the
same inputs, in the same row order (batch-major, then position-ascending; no atomics).
All tensors live on one CUDA device; outputs are allocated here with torch and the
kernels run on the caller's current stream.  Arguments are assumed validated by the
API layer (``flashcompress.plans``); the binding re-checks dtypes, shapes and devices
(cheap, ``ValueError``/``TypeError`` naming the argument) but never reads device values.

Variants: ``ratio`` in {4, 128} x ``online`` (online only with ratio 128).  Every
variant exports ``decode``, ``prefill_stage1``, ``prefill_device`` and ``layout_info``
(jit_kernel/plan_binding.h lists the signatures).

Launchers::

    decode_plan(ratio, req_pool_indices, req_to_token, full_to_state, seq_lens,
                swa_page_size, ring_size, use_req_ring)                      -> plan_d [B, 16]
    online_decode_plan(seq_lens, req_pool_indices, state_slot_offset)        -> plan_d [B, 16]
    prefill_stage1(ratio, plan_c, plan_w, req_pool_indices, req_to_token, full_to_state,
                   swa_page_size, ring_size, use_req_ring, num_c=, num_w=)   -> None (in place)
    online_prefill_stage1(plan_c, plan_w, req_pool_indices, state_slot_offset,
                          num_c=, num_w=)                                    -> None (in place)
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
from ..layouts import INVALID_COMPRESS_ROW, INVALID_WRITE_ROW, PLAN_ROW_BYTES, WRITE_ROW_BYTES

if TYPE_CHECKING:  # pragma: no cover
    from ..jit.variant import VariantKey

__all__ = [
    "PLAN",
    "decode_plan",
    "layout_info",
    "online_decode_plan",
    "online_prefill_plan_device",
    "online_prefill_stage1",
    "prefill_plan_device",
    "prefill_stage1",
    "prefill_workspace",
]

EXPORTS = ("decode", "prefill_stage1", "prefill_device", "layout_info")


# --------------------------------------------------------------------------
# Family registration
# --------------------------------------------------------------------------


def _validate(params: Mapping[str, Any]) -> None:
    ratio, online = params.get("ratio"), params.get("online")
    if ratio not in (4, 128) or isinstance(ratio, bool):
        raise ValueError(f"plan: ratio must be 4 or 128, got {ratio!r}")
    if not isinstance(online, bool):
        raise ValueError(f"plan: online must be a bool, got {online!r}")
    if online and ratio != 128:
        raise ValueError(f"plan: online=True exists only for ratio 128, got ratio={ratio}")


def _presets(model: str) -> list[dict[str, Any]]:
    from ..jit.models import model_config

    ratios = model_config(model).compress_ratios
    variants: list[dict[str, Any]] = [{"ratio": r, "online": False} for r in ratios]
    if 128 in ratios:
        variants.append({"ratio": 128, "online": True})
    return variants


def _warmup(key: "VariantKey") -> None:
    """Launch every export of ``key`` once on the current GPU and check the bytes.

    Prewarm calls this so that nothing is first-loaded or first-launched during
    CUDA-graph capture; the comparison with the PyTorch backend doubles as a smoke test.
    """
    from ..jit import load
    from ..torch_backend import plans as torch_plans

    params = key.param_dict
    ratio, online = int(params["ratio"]), bool(params["online"])
    module = load(key)
    dev = torch.device("cuda", torch.cuda.current_device())
    i64 = dict(dtype=torch.int64, device=dev)
    rids = torch.tensor([2, 1], **i64)
    seq = torch.tensor([300, 9], **i64)
    ext = torch.tensor([44, 9], **i64)
    num_q = 53
    mismatches: list[str] = []

    def expect(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        if got.shape != want.shape or not torch.equal(got.cpu(), want.cpu()):
            mismatches.append(name)

    if online:
        expect("decode", online_decode_plan(seq, rids, 3, module=module), torch_plans.online_decode_plan(seq, rids, 3))
        c0, w0 = torch_plans.online_prefill_stage0(seq.cpu(), ext.cpu())
        c, w = c0.to(dev), w0.to(dev)
        online_prefill_stage1(c, w, rids, 3, module=module)
        want_c, want_w = torch_plans.online_prefill_plan(seq.cpu(), ext.cpu(), rids.cpu(), num_q, False, 3)
        expect("prefill_stage1.plan_c", c, want_c)
        expect("prefill_stage1.plan_w", w, want_w)
        got = online_prefill_plan_device(rids, seq, ext, num_q + 3, 3, module=module)
        want = torch_plans.online_prefill_plan(seq.cpu(), ext.cpu(), rids.cpu(), num_q + 3, True, 3)
        expect("prefill_device.plan_c", got[0], want[0])
        expect("prefill_device.plan_w", got[1], want[1])
    else:
        ring = 8 if ratio == 4 else 128
        use_req_ring = False
        # A small paged world: request slot s owns full locs s*512 + p, mapped 1:1 to SWA locs.
        r2t = (torch.arange(3, dtype=torch.int32)[:, None] * 512 + torch.arange(512, dtype=torch.int32)).to(dev)
        f2s = torch.arange(3 * 512 + 256 + 1, dtype=torch.int64)
        f2s[-1] = -1
        f2s = f2s.to(dev)
        world = (r2t, f2s, 256, ring)
        world_cpu = (r2t.cpu(), f2s.cpu(), 256, ring)
        expect("decode", decode_plan(ratio, rids, r2t, f2s, seq, 256, ring, use_req_ring, module=module),
               torch_plans.decode_plan(ratio, rids.cpu(), *world_cpu[:2], seq.cpu(), 256, ring, use_req_ring))
        c0, w0 = torch_plans.prefill_stage0(ratio, seq.cpu(), ext.cpu(), 256, ring, use_req_ring)
        c, w = c0.to(dev), w0.to(dev)
        prefill_stage1(ratio, c, w, rids, *world, use_req_ring, module=module)
        want_c, want_w = torch_plans.prefill_plan(ratio, rids.cpu(), seq.cpu(), ext.cpu(), *world_cpu, num_q, False,
                                                  use_req_ring)
        expect("prefill_stage1.plan_c", c, want_c)
        expect("prefill_stage1.plan_w", w, want_w)
        got = prefill_plan_device(ratio, rids, seq, ext, *world, num_q + 3, use_req_ring, module=module)
        want = torch_plans.prefill_plan(ratio, rids.cpu(), seq.cpu(), ext.cpu(), *world_cpu, num_q + 3, True,
                                        use_req_ring)
        expect("prefill_device.plan_c", got[0], want[0])
        expect("prefill_device.plan_w", got[1], want[1])
    torch.cuda.synchronize(dev)
    if mismatches:
        raise RuntimeError(f"plan warm launch of {key.describe()}: bytes differ from the PyTorch backend "
                           f"in {', '.join(mismatches)}")


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
) -> None:
    """Stage 1 in place over CPU-built stage-0 rows already on the GPU (spec §4.4).

    Rows ``[0, num_c)`` of ``plan_c`` are stage-0 rows, rows ``[num_c, len)`` padding that
    becomes sentinels (default ``num_c = len``: the caller padded with sentinels already);
    likewise ``num_w`` for ``plan_w``.
    """
    rows_c, rows_w = plan_c.shape[0], plan_w.shape[0]
    if rows_c == 0 and rows_w == 0:
        return
    r2t, f2s = _world(req_to_token, full_to_state, plan_c.device)
    mod = module if module is not None else _module(ratio, False)
    mod.prefill_stage1(
        plan_c, plan_w, rows_c if num_c is None else int(num_c), rows_w if num_w is None else int(num_w),
        req_pool_indices, r2t, f2s, int(swa_page_size), int(ring_size), bool(use_req_ring),
    )


def online_prefill_stage1(
    plan_c: torch.Tensor,
    plan_w: torch.Tensor,
    req_pool_indices: torch.Tensor,
    state_slot_offset: int = 0,
    *,
    num_c: int | None = None,
    num_w: int | None = None,
    module: Any = None,
) -> None:
    """Online stage 1 in place (spec §4.6): read_page_0 <- rid + offset, read_page_1 <- rid."""
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


def _to_device_pinned(rows: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host rows -> ``device`` through pinned memory, asynchronously on the current stream."""
    return rows.pin_memory().to(device, non_blocking=True)


def prefill_plan_host_lengths(
    ratio: int,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    req_to_token: torch.Tensor,
    full_to_state: torch.Tensor,
    swa_page_size: int,
    ring_size: int,
    pad_to: int | None,
    use_req_ring: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager prefill with host lengths: stage 0 on the CPU (PyTorch backend, exact counts,
    padded with sentinels to ``pad_to`` for CUDA graphs), async H2D copy, stage-1 kernel."""
    from ..torch_backend import plans as torch_plans
    from ..torch_backend.rows import pad_rows

    device = req_pool_indices.device
    plan_c, plan_w = torch_plans.prefill_stage0(ratio, seq_lens, extend_lens, swa_page_size, ring_size, use_req_ring)
    if pad_to is not None:
        plan_c = pad_rows(plan_c, pad_to, INVALID_COMPRESS_ROW)
        plan_w = pad_rows(plan_w, pad_to, INVALID_WRITE_ROW)
    plan_c, plan_w = _to_device_pinned(plan_c, device), _to_device_pinned(plan_w, device)
    prefill_stage1(ratio, plan_c, plan_w, req_pool_indices, req_to_token, full_to_state,
                   swa_page_size, ring_size, use_req_ring)
    return plan_c, plan_w


def online_prefill_plan_host_lengths(
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    pad_to: int | None,
    state_slot_offset: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Online prefill with host lengths: segments cut on the CPU, async H2D copy, stage-1 kernel."""
    from ..torch_backend import plans as torch_plans
    from ..torch_backend.rows import pad_rows

    device = req_pool_indices.device
    plan_c, plan_w = torch_plans.online_prefill_stage0(seq_lens, extend_lens)
    if pad_to is not None:
        plan_c = pad_rows(plan_c, pad_to, INVALID_COMPRESS_ROW)
        plan_w = pad_rows(plan_w, pad_to, INVALID_COMPRESS_ROW)
    plan_c, plan_w = _to_device_pinned(plan_c, device), _to_device_pinned(plan_w, device)
    online_prefill_stage1(plan_c, plan_w, req_pool_indices, state_slot_offset)
    return plan_c, plan_w
