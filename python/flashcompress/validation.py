"""Argument checks for every public entry point, and the call objects they return.

Every public function calls its ``check_*`` here before anything is written,
so a rejected call leaves every buffer untouched.  Errors are ``TypeError``
(wrong dtype / object kind) or ``ValueError`` (shape, device, value), and the
message always starts with the argument's name, then expected vs. actual.

The ops (``compress_forward``, ``compress_norm_rope_store``, ``compress_and_store``)
are checked by ``check_compress`` / ``check_store`` / ``check_compress_and_store``,
which return one immutable call object (``CompressCall`` / ``StoreCall``, with the
store arguments in a ``StoreTail``): the checked tensors, the layer kind
(``layouts.LAYER_KINDS``) and the cache format.  The backends take that object and
nothing else, so no backend re-checks or re-derives anything.  The CUDA bindings keep
their own dtype / shape / device checks as the last line.

Three tiers:
  * metadata checks (dtype, rank, shape, device, contiguity, aliasing, scalars) always run;
  * data-dependent checks (plan indices inside the state buffer, largest
    ``out_loc`` inside the cache, positions inside the RoPE table, seq/extend
    lengths) read tensor *values*.  They always run for CPU tensors (cheap, no
    sync) and for CUDA tensors only when ``FLASHCOMPRESS_DEBUG=1``, because
    reading device values forces a host synchronisation;
  * steady state: where the binding re-checks dtype / shape / contiguity / device (CUDA
    tensors outside ``FLASHCOMPRESS_DEBUG=1``), a call whose scalars, plan and tensor data
    pointers / shapes / dtypes match an earlier checked call is rebuilt from that call's
    facts without re-checking (``_MEMO``, see "The steady-state memo" below).  Eager decode
    calls on CUDA tensors first try ``fastpath``, whose bindings check everything in C++ and
    which calls into this module only for a call they reject (to raise its named error here)
    or have not seen yet;
  * finite-value checks (``check_finite_reads``: no NaN / inf in the ``kv_score_input``
    rows and no NaN in the state rows a compress call reads) cost a pass over those
    rows, so they run only with ``FLASHCOMPRESS_DEBUG=1``, on every device.
"""

from __future__ import annotations

from typing import NamedTuple, NoReturn

import torch

from .jit.settings import debug_checks_enabled, jit_enabled_for
from .layouts import (
    HEAD_DIMS,
    MAX_RAGGED_ID,
    ONLINE_HEAD_DIMS,
    LAYER_KINDS,
    PLAN_ROW_BYTES,
    SUPPORTED_RATIOS,
    WRITE_ROW_BYTES,
    CacheFormat,
    LayerKind,
    select_cache_format,
)
from .torch_backend.rows import compress_fields, decode_fields, store_targets, write_fields
from .v41.layouts import KVLayout

FLOAT_DTYPES = (torch.float32, torch.bfloat16)
INT32_MAX = 2**31 - 1
# check_tensor takes tuples only (no per-call normalisation)
_F32 = (torch.float32,)
_I32 = (torch.int32,)
_I64 = (torch.int64,)
_U8 = (torch.uint8,)
_C64 = (torch.complex64,)
_1D = (1,)
_2D = (2,)


def fail(arg: str, expected: object, actual: object, exc: type[Exception] = ValueError) -> NoReturn:
    raise exc(f"{arg}: expected {expected}, got {actual}")


def wants_value_checks(t: torch.Tensor) -> bool:
    """Data-dependent checks run for CPU tensors, and for device tensors in debug mode."""
    return t.is_cpu or debug_checks_enabled()


def wants_values(device: int) -> bool:
    """``wants_value_checks`` for a ``get_device()`` index (-1: the CPU)."""
    return device < 0 or debug_checks_enabled()


def checked_by_binding(device: int) -> int | None:
    """The device index the op checks its other tensors against, or None where the kernel's
    binding does it: CUDA tensors on the JIT backend outside ``FLASHCOMPRESS_DEBUG=1``.

    The bindings check every tensor's dtype, shape, contiguity and device, naming the
    argument, before anything is launched (``jit_kernel/ffi_check.h``), so the Python side
    leaves the device and contiguity tests to them (about 0.2 µs per tensor); everything a
    binding cannot see (autograd, aliasing, plan kind, layer kind, row counts) stays here.
    """
    if device >= 0 and not debug_checks_enabled() and jit_enabled_for("cuda"):
        return None
    return device


# --------------------------------------------------------------------------
# Generic tensor checks
# --------------------------------------------------------------------------


def device_name(index: int) -> str:
    """The name of the device ``Tensor.get_device()`` returned ``index`` for (-1: the CPU)."""
    return "cpu" if index < 0 else f"cuda:{index}"


def check_tensor(
    arg: str,
    t: object,
    dtypes: tuple[torch.dtype, ...],
    ndim: tuple[int, ...],
    device: int | None = None,
    *,
    grad: bool | None = None,
    contiguous: bool = True,
) -> torch.Tensor:
    """``t`` is a tensor with data, of one of ``dtypes`` and ``ndim``, on ``device``.

    ``device`` is a ``Tensor.get_device()`` index (-1: the CPU; None: any device): an int
    compare, where ``Tensor.device`` would build a ``torch.device`` per access.  ``grad``
    is ``torch.is_grad_enabled()`` when the caller has it (looked up here otherwise).
    """
    if not isinstance(t, torch.Tensor):
        fail(arg, "a torch.Tensor", type(t).__name__, TypeError)
    if (device is None or device < 0) and t.is_meta:  # a CUDA index already rules out meta (index -1)
        fail(arg, "a tensor with data (cpu or cuda)", "a tensor on the meta device")
    if t.requires_grad and (torch.is_grad_enabled() if grad is None else grad):
        fail(arg, "a tensor that does not require grad (the ops are not differentiable: detach() it or "
             "call under torch.no_grad() / torch.inference_mode())", "requires_grad=True")
    if t.dtype not in dtypes:
        fail(arg, "dtype " + " or ".join(str(d) for d in dtypes), t.dtype, TypeError)
    if t.dim() not in ndim:
        fail(arg, f"a {' or '.join(map(str, ndim))}-D tensor", f"shape {tuple(t.shape)}")
    if device is not None and t.get_device() != device:
        fail(arg, f"device {device_name(device)} (same as the other tensors)", t.device)
    if contiguous and not t.is_contiguous():
        fail(arg, "a contiguous tensor", f"strides {t.stride()} for shape {tuple(t.shape)}")
    return t


def byte_span(t: torch.Tensor) -> tuple[int, int]:
    """``[first, last)`` byte addresses ``t`` can touch (empty span for an empty tensor)."""
    start = t.data_ptr()
    if t.is_contiguous():  # the common case: the span is the tensor's bytes (none when empty)
        return start, start + t.nbytes
    if t.numel() == 0:
        return start, start
    extent = 1 + sum([(n - 1) * abs(st) for n, st in zip(t.shape, t.stride())])
    return start, start + extent * t.element_size()


def check_no_overlap(arg: str, span: tuple[int, int], other_arg: str, other: tuple[int, int], why: str) -> None:
    """Two already checked tensors, given by their ``byte_span``, must not share any byte of memory
    (spans are passed so that a tensor compared with several others is measured once)."""
    if span[0] < other[1] and other[0] < span[1]:
        fail(arg, f"memory separate from {other_arg} ({why})", f"a tensor overlapping {other_arg}")


def check_size(arg: str, t: torch.Tensor, dim: int, expected: int, what: str = "") -> None:
    if t.shape[dim] != expected:
        fail(arg, f"shape[{dim}] == {expected}{' (' + what + ')' if what else ''}", f"shape {tuple(t.shape)}")


def check_ratio(compress_ratio: object) -> int:
    if type(compress_ratio) is not int and (isinstance(compress_ratio, bool) or not isinstance(compress_ratio, int)):
        fail("compress_ratio", "an int in {4, 128}", repr(compress_ratio), TypeError)
    if compress_ratio not in SUPPORTED_RATIOS:
        fail("compress_ratio", "4 or 128", compress_ratio)
    return compress_ratio


def check_int(arg: str, value: object, *, minimum: int | None = None) -> int:
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, int)):
        fail(arg, "an int", repr(value), TypeError)
    if minimum is not None and value < minimum:
        fail(arg, f">= {minimum}", value)
    return value


def check_head_dim(head_dim: object, ratio: int, online: bool) -> int:
    check_int("head_dim", head_dim)
    allowed = ONLINE_HEAD_DIMS if online else HEAD_DIMS[ratio]
    if head_dim not in allowed:
        what = "online C128" if online else f"ratio {ratio}"
        fail("head_dim", f"one of {allowed} for {what}", head_dim)
    return head_dim  # type: ignore[return-value]


# --------------------------------------------------------------------------
# Plan generation
# --------------------------------------------------------------------------


def check_world(
    req_pool_indices: object, req_to_token: object, full_to_state: object | None
) -> torch.device:
    rpi = check_tensor("req_pool_indices", req_pool_indices, _I64, _1D)
    device = rpi.get_device()
    r2t = check_tensor("req_to_token", req_to_token, _I32, _2D, device)
    if full_to_state is not None:
        check_tensor("full_to_state", full_to_state, _I64, _1D, device)
    if rpi.numel() and wants_value_checks(rpi):
        lo, hi = int(rpi.min()), int(rpi.max())
        if lo < 0 or hi >= r2t.shape[0]:
            fail("req_pool_indices", f"values in [0, {r2t.shape[0]}) (rows of req_to_token)", f"range [{lo}, {hi}]")
    return rpi.device


def check_slot_offset(state_slot_offset: object, req_to_token: torch.Tensor) -> int:
    """Online write slots ``rid + state_slot_offset`` must fit the i32 plan fields."""
    check_int("state_slot_offset", state_slot_offset, minimum=0)
    limit = INT32_MAX - req_to_token.shape[0]
    if state_slot_offset > limit:  # type: ignore[operator]
        fail("state_slot_offset", f"<= {limit} (rid + offset must fit an int32 plan field)", state_slot_offset)
    return state_slot_offset  # type: ignore[return-value]


def check_state_locations(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    full_to_state: torch.Tensor,
    positions: torch.Tensor,
    batch_of_position: torch.Tensor | None = None,
    *,
    swa_page_size: int,
    ring_size: int,
) -> None:
    """Paged addressing: every position the plan reads or writes maps to a usable state row.

    ``positions`` are the token positions the planner looks up (``[B, k]`` per request,
    or flat with ``batch_of_position``).  Their full locs must lie inside
    ``full_to_state`` (else ``req_to_token`` is wrong), and the SWA locs found there
    must be ``>= 0`` (``-1``: evicted from the SWA pool) with a state row that fits the
    plan's int32 fields.  The planner does not know the state pool's row count: rows
    past ``kv_score_buffer`` are rejected by ``compress_forward`` (naming ``plan``).
    CPU / debug only (reads values).
    """
    if not positions.numel() or not wants_value_checks(req_pool_indices):
        return
    if batch_of_position is None:
        rid = req_pool_indices[:, None].expand_as(positions)
    else:
        rid = req_pool_indices[batch_of_position]
    full = req_to_token[rid, positions].to(torch.int64)
    lo, hi = int(full.min()), int(full.max())
    if lo < 0 or hi >= full_to_state.shape[0]:
        fail("req_to_token", f"full locs in [0, {full_to_state.shape[0]}) (length of full_to_state) "
             "at the positions the plan reads", f"range [{lo}, {hi}]")
    swa = full_to_state[full]
    rows = torch.div(swa, swa_page_size, rounding_mode="trunc") * ring_size + torch.fmod(swa, ring_size)
    bad = (swa < 0) | (rows > INT32_MAX)
    if bool(bad.any()):
        i = tuple(int(x) for x in bad.nonzero()[0])
        loc, value = int(full[i]), int(swa[i])
        what = "an SWA loc >= 0 (-1 marks an evicted token)" if value < 0 else \
            f"an SWA loc whose state row fits an int32 (row {int(rows[i])})"
        fail("full_to_state", f"{what} at every position the plan reads or writes",
             f"full_to_state[{loc}] = {value} (request slot {int(rid[i])}, position {int(positions[i])})")


def check_lengths(arg: str, t: object, batch: int, device: torch.device, *, allow_cpu: bool) -> torch.Tensor:
    lens = check_tensor(arg, t, _I64, _1D)
    if lens.device != device and not (allow_cpu and lens.device.type == "cpu"):
        fail(arg, f"device {device}" + (" or cpu" if allow_cpu else ""), lens.device)
    check_size(arg, lens, 0, batch, "one per request")
    return lens


def check_distinct_requests(req_pool_indices: torch.Tensor, seq_lens: torch.Tensor) -> None:
    """A request slot appears once per batch; CUDA-graph padding rows (``seq_len`` 1) may share one.

    Two real rows of one slot would write the same state rows (and, paged, the same
    full locs) in one launch.  CPU / debug only (reads values); run after ``check_world``
    (slots in range) and ``check_lengths``.
    """
    rpi = req_pool_indices
    if rpi.shape[0] < 2 or not wants_value_checks(rpi):
        return
    counts = torch.bincount(rpi)
    real = seq_lens.to(rpi.device) != 1
    bad = (counts[rpi] > 1) & real
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        slot = int(rpi[i])
        rows = (rpi == slot).nonzero().squeeze(1).tolist()
        fail("req_pool_indices", "distinct request slots in one batch (only CUDA-graph padding rows, "
             "seq_len 1, may share a slot)", f"slot {slot} at rows {rows[:4]}{' ...' if len(rows) > 4 else ''}")


def check_ring(ratio: int, ring_size: object, swa_page_size: object, use_req_ring: object, paged: bool) -> None:
    check_int("ring_size", ring_size, minimum=1)
    check_int("swa_page_size", swa_page_size, minimum=1)
    if not isinstance(use_req_ring, bool):
        fail("use_req_ring", "a bool", repr(use_req_ring), TypeError)
    if use_req_ring and ratio != 4:
        fail("use_req_ring", "False for ratio 128 (ratio 128 always uses the request ring)", True)
    if ring_size % ratio:  # type: ignore[operator]
        fail("ring_size", f"a multiple of compress_ratio {ratio}", ring_size)
    if paged and swa_page_size % ring_size:  # type: ignore[operator]
        fail("swa_page_size", f"a multiple of ring_size {ring_size}", swa_page_size)


def check_positions_in_table(seq_lens: torch.Tensor, req_to_token: torch.Tensor) -> None:
    if seq_lens.numel() and wants_value_checks(seq_lens):
        longest = int(seq_lens.max())
        if longest > req_to_token.shape[1]:
            fail("seq_lens", f"values <= {req_to_token.shape[1]} (columns of req_to_token)", f"max {longest}")


def check_decode_lengths(seq_lens: torch.Tensor) -> None:
    if seq_lens.numel() and wants_value_checks(seq_lens):
        shortest = int(seq_lens.min())
        if shortest < 1:
            fail("seq_lens", "values >= 1 (the current token is included)", f"min {shortest}")


def check_prefill_lengths(
    seq_lens: torch.Tensor, extend_lens: torch.Tensor, num_q_tokens: object, *, exact_total: bool,
    values: bool = True,
) -> int:
    """num_q_tokens vs. extend_lens; 0 < extend <= seq per request.

    ``values=False`` leaves out the checks that read the lengths (the caller runs them natively:
    ``plans`` with every tensor on the CPU, ``plan_host``'s ``check_prefill_values``)."""
    batch = seq_lens.shape[0]
    check_int("num_q_tokens", num_q_tokens, minimum=0)
    if num_q_tokens > MAX_RAGGED_ID:  # type: ignore[operator]
        fail("num_q_tokens", f"<= {MAX_RAGGED_ID} (ragged ids are u16)", num_q_tokens)
    if num_q_tokens < batch:  # type: ignore[operator]
        fail("num_q_tokens", f">= batch size {batch}", num_q_tokens)
    if values and batch and wants_value_checks(extend_lens):
        # one Python pass over the two lists: cheaper than the four torch ops it replaces up to
        # thousands of requests (each torch CPU op costs a few µs)
        ext, seq = extend_lens.tolist(), seq_lens.tolist()
        for i, (e, s) in enumerate(zip(ext, seq)):
            if e <= 0 or e > s:
                fail("extend_lens", "0 < extend_lens[i] <= seq_lens[i] for every request",
                     f"extend_lens[{i}] = {e}, seq_lens[{i}] = {s}")
        total = sum(ext)
        if exact_total and total != num_q_tokens:
            fail("num_q_tokens", f"sum(extend_lens) = {total}", num_q_tokens)
        if not exact_total and total > num_q_tokens:  # type: ignore[operator]
            fail("num_q_tokens", f">= sum(extend_lens) = {total} (padded token count)", num_q_tokens)
    return num_q_tokens  # type: ignore[return-value]


# --------------------------------------------------------------------------
# The ops: plans, call objects and their checks
# --------------------------------------------------------------------------


class PlanTuple(tuple):
    """Base of the plan containers (``plans.CompressorDecodePlan`` / ``CompressorPrefillPlan``).

    ``plan[0]`` is the compress ratio, ``plan[1:]`` the uint8 plan tensors; ``is_decode`` is
    a class attribute, ``is_online`` None when the plan was built from raw tensors.
    """

    is_decode: bool
    is_online: bool | None

    @property
    def compress_ratio(self) -> int:
        """The compress ratio the plan was built for (``plan[0]``)."""
        return self[0]


class StoreTail(NamedTuple):
    """The checked store arguments of ``compress_norm_rope_store`` / ``compress_and_store``.

    ``norm_weight`` fp32/bf16 ``[D]``; ``norm_eps`` a float in (0, 1); ``freq_cis``
    complex64 ``[T, 32]``; ``out_loc`` int64 ``[N]``; ``kvcache`` uint8
    ``[pages, fmt.cache_row_bytes(page_size)]``; ``page_size`` a power of two; ``fmt``
    the cache format the flags and the layout select.  All tensors on the call's device.
    """

    norm_weight: torch.Tensor
    norm_eps: float
    freq_cis: torch.Tensor
    out_loc: torch.Tensor
    kvcache: torch.Tensor
    page_size: int
    fmt: CacheFormat


class CompressCall(NamedTuple):
    """A checked ``compress_forward`` / ``compress_and_store`` call.

    ``pool`` is the state pool as the caller passed it (``[rows, W]`` or the paged view
    ``[pages, page rows, W]``, checked), ``state`` its flat ``[rows, layer.state_width]``
    view (made on access: the CUDA bindings take the pool itself); ``plan_w`` is None for
    a decode plan; ``store`` is set for ``compress_and_store`` only; ``device`` is the
    tensors' ``get_device()`` index (-1: the CPU).
    """

    layer: LayerKind
    pool: torch.Tensor
    inp: torch.Tensor
    ape: torch.Tensor
    plan_rows: torch.Tensor
    plan_w: torch.Tensor | None
    store: StoreTail | None
    device: int

    @property
    def state(self) -> torch.Tensor:
        """The flat ``[rows, layer.state_width]`` view of the state pool."""
        pool = self.pool
        return pool if pool.dim() == 2 else pool.view(-1, self.layer.state_width)

    @property
    def is_decode(self) -> bool:
        """True for a decode plan (one plan row per request)."""
        return self.plan_w is None

    def is_empty(self) -> bool:
        """True when the plan has no rows at all (the call launches nothing)."""
        return self.plan_rows.shape[0] == 0 and (self.plan_w is None or self.plan_w.shape[0] == 0)


class StoreCall(NamedTuple):
    """A checked ``compress_norm_rope_store`` call: row ``i`` of ``kv`` belongs to plan row ``i``."""

    kv: torch.Tensor
    plan_rows: torch.Tensor
    is_decode: bool
    ratio: int
    store: StoreTail
    device: int


# The user's store arguments, in the order of the public signatures (the API packs them once):
# (norm_weight, norm_eps, freq_cis, out_loc, kvcache, page_size, use_fp4, bf16_store, layout)
StoreArgs = tuple

# (head dim, use_fp4, bf16_store, page_size, layout) -> (format, kvcache row bytes): filled on first use
_STORE_FORMATS: dict[tuple[object, ...], tuple[CacheFormat, int]] = {}


# --------------------------------------------------------------------------
# The steady-state memo of checked calls
# --------------------------------------------------------------------------
#
# A decode step calls each op with the same persistent buffers (state pool, ape, norm weight,
# RoPE table, cache) and per-step tensors of the same shapes, usually at the same addresses
# (the caching allocator hands the same blocks back).  Outside the value-check tier every check
# of an op depends only on: the scalars (with their types), the plan's class, ratio and kind, and
# each tensor's data pointer, shape and dtype (plus the strides of ``freq_cis``, the one tensor
# allowed to be non-contiguous); the device follows from the data pointer (CUDA's unified
# address space gives every device its own range), and contiguity of the others is the
# binding's check (``checked_by_binding``: the memo is used only where the binding checks dtype,
# shape, contiguity, alignment and device again before launching).  The first call with a key
# runs every check and memoises what they derived (layer kind, device, cache format, norm_eps);
# a call with a known key is rebuilt from those facts and the current tensors.  A call with an
# empty tensor (data pointer 0, device unknown) is never memoised; ``requires_grad`` can change
# on the same tensor, so it is tested on every call made with grad enabled.  The memo holds no
# tensor and is cleared when it reaches ``MEMO_SIZE`` keys.

MEMO_SIZE = 4096
_MEMO: dict[tuple[object, ...], tuple[object, ...]] = {}


def _remember(key: tuple[object, ...], facts: tuple[object, ...], tensors: tuple[object, ...]) -> None:
    """Memoise the facts of a fully checked call, unless one of its ``tensors`` is empty."""
    if any(t is not None and t.data_ptr() == 0 for t in tensors):  # type: ignore[attr-defined]
        return
    if len(_MEMO) >= MEMO_SIZE:
        _MEMO.clear()
    _MEMO[key] = facts


def clear_memo() -> None:
    """Forget every memoised call (tests; a process never needs it)."""
    _MEMO.clear()


def _needs_grad(*args: object) -> bool:
    """True when a tensor argument (or a tensor in a store tuple) requires grad."""
    for a in args:
        if type(a) is tuple:
            if any(isinstance(t, torch.Tensor) and t.requires_grad for t in a):
                return True
        elif a is not None and a.requires_grad:  # type: ignore[attr-defined]
            return True
    return False


def _compress_key(buf: object, inp: object, ape: object, plan: object, head_dim: object, ratio: object,
                  out: object, online: object, store: StoreArgs | None) -> tuple[object, ...] | None:
    """The memo key of a compress call, or None when it cannot be memoised (a scalar of
    another type than the checks accept, a plan of another class, a non-tensor argument)."""
    if not (type(head_dim) is int and type(ratio) is int and type(online) is bool and isinstance(plan, PlanTuple)):
        return None
    try:
        rows = plan[1]
        key = (type(plan), plan[0], plan.is_online, head_dim, ratio, online,
               buf.data_ptr(), buf.shape, buf.dtype, inp.data_ptr(), inp.shape, inp.dtype,
               ape.data_ptr(), ape.shape, ape.dtype, rows.data_ptr(), rows.shape, rows.dtype)
        if not plan.is_decode:
            w = plan[2]
            key += (w.data_ptr(), w.shape, w.dtype)
        if out is not None:
            key += (out.data_ptr(), out.shape, out.dtype)  # type: ignore[attr-defined]
        if store is not None:
            tail = _tail_key(store)
            if tail is None:
                return None
            key += tail
    except (AttributeError, IndexError, TypeError, ValueError, RuntimeError):
        return None  # not tensors (or a store tuple of another length): the checks name the argument
    return key


def _store_key(kv: object, plan: object, store: StoreArgs) -> tuple[object, ...] | None:
    """The memo key of a ``compress_norm_rope_store`` call, or None (see ``_compress_key``)."""
    if not isinstance(plan, PlanTuple):
        return None
    try:
        tail = _tail_key(store)
        if tail is None:
            return None
        rows = plan[1]
        return (type(plan), plan[0], plan.is_online, kv.data_ptr(), kv.shape, kv.dtype,  # type: ignore[attr-defined]
                rows.data_ptr(), rows.shape, rows.dtype) + tail
    except (AttributeError, IndexError, TypeError, ValueError, RuntimeError):
        return None


def _tail_key(store: StoreArgs) -> tuple[object, ...] | None:
    """The memo key part of the store arguments, or None (raises AttributeError for a non-tensor)."""
    w, eps, freq, loc, cache, page_size, use_fp4, bf16_store, layout = store
    if not (type(eps) is float and type(page_size) is int and type(use_fp4) is bool and type(bf16_store) is bool
            and isinstance(layout, str)):
        return None
    return (eps, page_size, use_fp4, bf16_store, layout, w.data_ptr(), w.shape, w.dtype,
            freq.data_ptr(), freq.shape, freq.stride(), freq.dtype, loc.data_ptr(), loc.shape, loc.dtype,
            cache.data_ptr(), cache.shape, cache.dtype)


def check_plan(plan: object, ratio: int | None) -> PlanTuple:
    """A plan object of ours, built for ``ratio`` (any supported ratio when None)."""
    if not isinstance(plan, PlanTuple):
        fail("plan", "a CompressorDecodePlan or CompressorPrefillPlan", type(plan).__name__, TypeError)
    if ratio is None:
        check_ratio(plan.compress_ratio)
    elif plan.compress_ratio != ratio:
        fail("plan", f"a plan built for compress_ratio {ratio}", f"compress_ratio {plan.compress_ratio}")
    return plan


def check_layer(compress_ratio: object, head_dim: object, is_online: object, plan: object) -> LayerKind:
    """The layer kind of a compress call (one dict lookup in the common case; else the checks
    in the order the errors name them: ratio, is_online, the plan's ratio, head_dim)."""
    if type(compress_ratio) is int and type(head_dim) is int and type(is_online) is bool:
        layer = LAYER_KINDS.get((compress_ratio, head_dim, is_online))
        if layer is not None:
            return layer
    ratio = check_ratio(compress_ratio)
    if not isinstance(is_online, bool):
        fail("is_online", "a bool", repr(is_online), TypeError)
    if is_online and ratio != 128:
        fail("is_online", "False unless compress_ratio is 128", f"True with compress_ratio {ratio}")
    check_plan(plan, ratio)
    return LAYER_KINDS[(ratio, check_head_dim(head_dim, ratio, is_online), is_online)]


def check_plan_tensor(arg: str, t: object, row_bytes: int, device: int | None, grad: bool = False) -> torch.Tensor:
    """A ``uint8 [rows, row_bytes]`` plan tensor (on ``device`` and contiguous; None: left to the binding)."""
    check_tensor(arg, t, _U8, _2D, device, grad=grad, contiguous=device is not None)
    check_size(arg, t, 1, row_bytes, "plan row bytes")  # type: ignore[arg-type]
    return t  # type: ignore[return-value]


def check_compress(
    kv_score_buffer: object, kv_score_input: object, ape: object, plan: object, head_dim: object,
    compress_ratio: object, out: object, is_online: object, *, store: StoreArgs | None = None,
) -> CompressCall:
    """Check a ``compress_forward`` call (``compress_and_store``: with its ``store`` arguments).

    A call whose key (``_compress_key``) is in the steady-state memo is rebuilt from the
    memoised facts and checks nothing else; any other call runs every check.
    """
    key = _compress_key(kv_score_buffer, kv_score_input, ape, plan, head_dim, compress_ratio, out, is_online, store)
    if key is not None:
        facts = _MEMO.get(key)
        if facts is not None and checked_by_binding(facts[1]) is None and not (
                torch.is_grad_enabled() and _needs_grad(kv_score_buffer, kv_score_input, ape, out, store)):
            layer, dev, tail_facts = facts
            plan_w = None if plan.is_decode else plan[2]  # type: ignore[attr-defined]
            tail = None if store is None else StoreTail(store[0], tail_facts[0], store[2], store[3], store[4],
                                                        store[5], tail_facts[1])
            return CompressCall(layer, kv_score_buffer, kv_score_input, ape, plan[1], plan_w, tail, dev)  # type: ignore
    call = _check_compress(kv_score_buffer, kv_score_input, ape, plan, head_dim, compress_ratio, out, is_online,
                           store)
    if key is not None and checked_by_binding(call.device) is None:
        st = call.store
        _remember(key, (call.layer, call.device, None if st is None else (st.norm_eps, st.fmt)),
                  (call.pool, call.inp, call.ape, call.plan_rows, call.plan_w, out)
                  + (() if st is None else (st.norm_weight, st.freq_cis, st.out_loc, st.kvcache)))
    return call


def _check_compress(
    kv_score_buffer: object, kv_score_input: object, ape: object, plan: object, head_dim: object,
    compress_ratio: object, out: object, is_online: object, store: StoreArgs | None,
) -> CompressCall:
    """Every check of a ``compress_forward`` / ``compress_and_store`` call."""
    layer = check_layer(compress_ratio, head_dim, is_online, plan)
    ratio, H, online = layer.ratio, layer.head_dim, layer.online
    plan = check_plan(plan, ratio)
    if plan.is_online is not None and plan.is_online != online:
        made = "generate_online" if plan.is_online else "generate"
        fail("is_online", f"{plan.is_online} (the plan was built by {made})", online)
    grad = torch.is_grad_enabled()
    dtypes = _F32 if online else FLOAT_DTYPES
    buf = check_tensor("kv_score_buffer", kv_score_buffer, FLOAT_DTYPES, (2, 3), grad=grad)
    width, shape = layer.state_width, buf.shape
    if shape[-1] != width:
        kind = "online C128 [max|sum|kv]" if online else f"ratio {ratio}"
        fail("kv_score_buffer", f"last dim {width} ({kind}, head_dim {H})", f"shape {tuple(shape)}")
    if len(shape) == 3:
        page_rows = 1 if online else ratio
        if shape[1] != page_rows:
            fail("kv_score_buffer", f"paged view [pages, {page_rows}, {width}]", f"shape {tuple(shape)}")
    dev = buf.get_device()
    chk = checked_by_binding(dev)
    plan_rows = check_plan_tensor("plan[1]", plan[1], PLAN_ROW_BYTES, chk)
    plan_w = None
    if not plan.is_decode:
        plan_w = check_plan_tensor("plan[2]", plan[2], PLAN_ROW_BYTES if online else WRITE_ROW_BYTES, chk)
    inp = check_tensor("kv_score_input", kv_score_input, dtypes, _2D, chk, grad=grad, contiguous=chk is not None)
    if inp.shape[1] != layer.input_width:
        check_size("kv_score_input", inp, 1, layer.input_width, f"[tokens, {layer.input_width}]")  # raises
    ape_t = check_tensor("ape", ape, dtypes, _2D, chk, grad=grad, contiguous=chk is not None)
    if ape_t.shape != (layer.ape_rows, H):
        fail("ape", f"shape ({layer.ape_rows}, {H})", f"shape {tuple(ape_t.shape)}")
    in_place = "the state pool is updated in place"
    state_span, inp_span, ape_span = byte_span(buf), byte_span(inp), byte_span(ape_t)
    check_no_overlap("kv_score_input", inp_span, "kv_score_buffer", state_span, in_place)
    check_no_overlap("ape", ape_span, "kv_score_buffer", state_span, in_place)
    n_rows, n_in = plan_rows.shape[0], inp.shape[0]
    if out is not None:
        out_t = check_tensor("out", out, dtypes, _2D, chk, grad=grad, contiguous=chk is not None)
        if out_t.shape != (n_rows, H):
            fail("out", f"shape ({n_rows}, {H}) (one row per plan row)", f"shape {tuple(out_t.shape)}")
        written = "out is written while the others are read"
        out_span = byte_span(out_t)
        check_no_overlap("out", out_span, "kv_score_buffer", state_span, written)
        check_no_overlap("out", out_span, "kv_score_input", inp_span, written)
        check_no_overlap("out", out_span, "ape", ape_span, written)
    if plan_w is None and n_in != n_rows:
        fail("kv_score_input", f"{n_rows} rows (one per decode request)", n_in)
    if plan_w is not None and n_in < plan_w.shape[0]:
        fail("kv_score_input", f">= {plan_w.shape[0]} rows (WritePlan rows)", n_in)
    tail = None if store is None else _store_tail(store, chk, H, plan_rows.shape[0], plan.is_decode, grad,
                                                   ("kv_score_buffer", buf))
    call = CompressCall(layer, buf, inp, ape_t, plan_rows, plan_w, tail, dev)
    if wants_values(dev):
        _check_compress_values(call)
        if tail is not None:
            _check_store_values(tail, plan_rows, plan.is_decode, ratio)
    return call


def check_store(kv: object, plan: object, store: StoreArgs) -> StoreCall:
    """Check a ``compress_norm_rope_store`` call (``store``: the user's store arguments).

    Memoised like ``check_compress`` (key: ``_store_key``).
    """
    key = _store_key(kv, plan, store)
    if key is not None:
        facts = _MEMO.get(key)
        if facts is not None and checked_by_binding(facts[0]) is None and not (
                torch.is_grad_enabled() and _needs_grad(kv, None, None, None, store)):
            dev, norm_eps, fmt = facts
            tail = StoreTail(store[0], norm_eps, store[2], store[3], store[4], store[5], fmt)
            return StoreCall(kv, plan[1], plan.is_decode, plan[0], tail, dev)  # type: ignore
    call = _check_store(kv, plan, store)
    if key is not None and checked_by_binding(call.device) is None:
        st = call.store
        _remember(key, (call.device, st.norm_eps, st.fmt), (call.kv, call.plan_rows, st.norm_weight, st.freq_cis,
                                                            st.out_loc, st.kvcache))
    return call


def _check_store(kv: object, plan: object, store: StoreArgs) -> StoreCall:
    """Every check of a ``compress_norm_rope_store`` call."""
    plan = check_plan(plan, None)
    grad = torch.is_grad_enabled()
    kv_t = check_tensor("kv", kv, FLOAT_DTYPES, _2D, grad=grad)
    D = kv_t.shape[1]
    if D != 128 and D != 512:
        fail("kv", "head dim 128 (indexer) or 512 (main KV)", f"shape {tuple(kv_t.shape)}")
    dev = kv_t.get_device()
    chk = checked_by_binding(dev)
    plan_rows = check_plan_tensor("plan[1]", plan[1], PLAN_ROW_BYTES, chk)
    rows = plan_rows.shape[0]
    check_size("kv", kv_t, 0, rows, "one row per plan row")
    tail = _store_tail(store, chk, D, rows, plan.is_decode, grad, ("kv", kv_t))
    if rows and wants_values(dev):
        _check_store_values(tail, plan_rows, plan.is_decode, plan.compress_ratio)
    return StoreCall(kv_t, plan_rows, plan.is_decode, plan.compress_ratio, tail, dev)


def store_format(head_dim: int, use_fp4: object, bf16_store: object, page_size: object,
                 layout: object = KVLayout.V4) -> tuple[CacheFormat, int]:
    """``(format, kvcache row bytes)`` of a store: checked once per key, then one dict lookup.

    ``layout`` (a ``KVLayout`` or its string, any case): the main-KV layout; layouts other
    than ``v4`` only for head dim 512 and without ``use_fp4`` / ``bf16_store``.
    """
    key = (head_dim, use_fp4, bf16_store, page_size, layout)
    # 0 == False and 64.0 == 64 hash alike: only arguments of the checked types may hit
    typed = type(page_size) is int and type(use_fp4) is bool and type(bf16_store) is bool and isinstance(layout, str)
    hit = _STORE_FORMATS.get(key) if typed else None
    if hit is not None:
        return hit
    if type(use_fp4) is not bool:  # bool cannot be subclassed: same as isinstance
        fail("use_fp4", "a bool", repr(use_fp4), TypeError)
    if type(bf16_store) is not bool:
        fail("bf16_store", "a bool", repr(bf16_store), TypeError)
    kv_layout = KVLayout.parse(layout)  # TypeError / ValueError naming ``layout``
    if kv_layout is not KVLayout.V4:
        only = f"(layout {kv_layout.value!r} is a main-KV format: use_fp4 and bf16_store are V4-only)"
        if use_fp4:
            fail("use_fp4", f"False with a non-v4 layout {only}", True)
        if bf16_store:
            fail("bf16_store", f"False with a non-v4 layout {only}", True)
        if head_dim != 512:
            fail("layout", "'v4' unless head dim is 512 (main KV)", f"{kv_layout.value!r} with head dim {head_dim}")
    if use_fp4 and head_dim != 128:
        fail("use_fp4", "False unless head dim is 128 (FP4 is the indexer format)", f"True with head dim {head_dim}")
    if bf16_store and head_dim != 512:
        fail("bf16_store", "False unless head dim is 512 (main KV)", f"True with head dim {head_dim}")
    check_int("page_size", page_size, minimum=1)
    if page_size & (page_size - 1):  # type: ignore[operator]
        fail("page_size", "a power of two", page_size)
    fmt = select_cache_format(head_dim, use_fp4, bf16_store, kv_layout)
    hit = fmt, fmt.cache_row_bytes(page_size)  # type: ignore[arg-type]
    _STORE_FORMATS[key] = hit  # every argument passed its type check above
    return hit


def _store_tail(store: StoreArgs, dev: int | None, D: int, rows: int, is_decode: bool, grad: bool,
                source: tuple[str, torch.Tensor]) -> StoreTail:
    """Check the store arguments against the ``rows`` plan rows they store (``source``: the
    argument those rows are computed from, which must not overlap the cache; ``dev``: as
    ``checked_by_binding`` returns it)."""
    lean = dev is None
    norm_weight, norm_eps, freq_cis, out_loc, kvcache, page_size, use_fp4, bf16_store, layout = store
    fmt, row_bytes = store_format(D, use_fp4, bf16_store, page_size, layout)
    w = check_tensor("norm_weight", norm_weight, FLOAT_DTYPES, _1D, dev, grad=grad, contiguous=not lean)
    if w.shape[0] != D:
        check_size("norm_weight", w, 0, D, "head dim of kv")  # raises
    if not (type(norm_eps) is float and 0.0 < norm_eps < 1.0):
        if isinstance(norm_eps, bool) or not isinstance(norm_eps, (int, float)):
            fail("norm_eps", "a float in (0, 1)", repr(norm_eps), TypeError)
        if not 0 < norm_eps < 1:
            fail("norm_eps", "a float in (0, 1)", repr(norm_eps))
        norm_eps = float(norm_eps)
    freq = check_tensor("freq_cis", freq_cis, _C64, _2D, dev, grad=grad, contiguous=False)
    if freq.shape[1] != 32:
        check_size("freq_cis", freq, 1, 32, "rope_dim / 2 complex entries")  # raises
    loc = check_tensor("out_loc", out_loc, _I64, _1D, dev, grad=grad, contiguous=not lean)
    n_loc = loc.shape[0]
    if is_decode and n_loc != rows:
        fail("out_loc", f"{rows} entries (one per decode request)", n_loc)
    if not is_decode and n_loc < rows:
        fail("out_loc", f">= {rows} entries (one per query token)", n_loc)
    cache = check_tensor("kvcache", kvcache, _U8, _2D, dev, grad=grad, contiguous=not lean)
    if cache.shape[1] != row_bytes:
        fail("kvcache", f"[pages, {row_bytes}] ({fmt.name} page of {page_size} tokens)", f"shape {tuple(cache.shape)}")
    written = "kvcache is written while the others are read"
    cache_span = byte_span(cache)
    src_arg, src = source
    check_no_overlap(src_arg, byte_span(src), "kvcache", cache_span, f"kvcache is written while {src_arg} is read")
    check_no_overlap("norm_weight", byte_span(w), "kvcache", cache_span, written)
    check_no_overlap("freq_cis", byte_span(freq), "kvcache", cache_span, written)
    check_no_overlap("out_loc", byte_span(loc), "kvcache", cache_span, written)
    return StoreTail(w, norm_eps, freq, loc, cache, page_size, fmt)  # type: ignore[arg-type]


def _check_compress_values(call: CompressCall) -> None:
    """Data-dependent compress checks: every index the plan holds lies inside its tensor."""
    layer, plan_rows, plan_w = call.layer, call.plan_rows, call.plan_w
    rows, n_in, ratio, online = call.state.shape[0], call.inp.shape[0], layer.ratio, layer.online
    if plan_w is None:
        check_plan_indices(rows, n_in, ratio, online, decode=decode_fields(plan_rows))
    elif online:
        check_plan_indices(rows, n_in, ratio, True, compress=compress_fields(plan_rows))
        check_plan_indices(rows, n_in, ratio, True, compress=compress_fields(plan_w))
    else:
        check_plan_indices(rows, n_in, ratio, False, compress=compress_fields(plan_rows), write=write_fields(plan_w))
    if debug_checks_enabled():
        check_finite_reads(call)


def _check_store_values(tail: StoreTail, plan_rows: torch.Tensor, is_decode: bool, ratio: int) -> None:
    """Data-dependent store checks: ragged ids inside ``out_loc``, destinations and RoPE positions."""
    loc = tail.out_loc
    if not is_decode:
        fields = compress_fields(plan_rows)
        ragged = fields["ragged_id"][fields["valid"]]
        if ragged.numel() and int(ragged.max()) >= loc.shape[0]:
            fail("out_loc", f"> {int(ragged.max())} entries (largest ragged_id in the plan)", loc.shape[0])
    valid, dest, positions = store_targets(plan_rows, is_decode, ratio, loc)
    check_store_values(dest[valid], positions[valid], tail.kvcache, tail.page_size, tail.freq_cis.shape[0])


def check_finite_reads(call: CompressCall) -> None:
    """No NaN / inf in the ``kv_score_input`` rows and no NaN in the state entries the call reads.

    Input rows: every row of a decode call; rows up to the largest ragged id a prefill
    plan names (CUDA-graph padding rows after the real tokens are not read).  State: the
    window entries pooled from the state pool (decode rows at a window boundary, prefill
    rows with ``buffer_len > 0``), each only in the columns it contributes (C4: the overlap
    halves of the previous block, and only past the first window; the own halves of the
    current block), and the running state of an online row that continues a window.  Only
    NaN counts in the state: a cleared row holds score -inf.  Run after
    ``check_plan_indices`` (every index is in range).
    """
    layer, state, inp, plan_rows, plan_w = call.layer, call.state, call.inp, call.plan_rows, call.plan_w
    ratio, online, H = layer.ratio, layer.online, layer.head_dim
    dev = state.device
    offs = torch.arange(ratio, device=dev)
    # (state rows, the columns they are read in): C4 entries 0-3 read the overlap halves, 4-7 the own halves
    reads: list[tuple[torch.Tensor, list[int] | None]] = []
    if plan_w is None:
        f = decode_fields(plan_rows)
        used = inp
        if online:
            reads.append((f["read_page_0"][torch.remainder(f["seq_len"] - 1, 128) != 0], None))
        else:
            boundary = torch.remainder(f["seq_len"], ratio) == 0 if ratio == 4 else \
                torch.remainder(f["write_loc"], 128) == 127
            own = (f["read_page_1"][boundary, None] * ratio + offs).flatten()
            # the current token's row is written from the input before the window is read
            own = own[~torch.isin(own, f["write_loc"])]
            if ratio == 4:
                prev = (f["read_page_0"][boundary & (f["seq_len"] > 4), None] * 4 + offs).flatten()
                reads += [(own, [*range(H, 2 * H), *range(3 * H, 4 * H)]),
                          (prev, [*range(0, H), *range(2 * H, 3 * H)])]
            else:
                reads.append((own, None))
    else:
        lists = [compress_fields(plan_rows)] + ([compress_fields(plan_w)] if online else [])
        ragged = torch.cat([c["ragged_id"][c["valid"]] for c in lists])
        if not online:
            w = write_fields(plan_w)
            ragged = torch.cat([ragged, w["ragged_id"][w["valid"]]])
        used = inp[: int(ragged.max()) + 1] if ragged.numel() else inp[:0]
        if online:
            for c in lists:  # a segment that starts inside its window merges with its slot's state
                slot = torch.where(c["read_page_1"] >= 0, c["read_page_1"], c["read_page_0"])
                starts_inside = torch.remainder(c["seq_len"] - 1, 128) + 1 != c["buffer_len"]
                reads.append((slot[c["valid"] & starts_inside & (slot >= 0)], None))
        else:
            c = lists[0]
            idx = (c["valid"] & (c["buffer_len"] > 0)).nonzero().squeeze(1)
            buffered = offs[None, :] < c["buffer_len"][idx, None]  # window entries 0..r-1 from the state
            if ratio == 4:
                own = (c["read_page_1"][idx, None] * 4 + offs)[(offs[None, :] + 4 < c["buffer_len"][idx, None])]
                prev_ok = buffered & (c["seq_len"][idx, None] > 4)
                prev = (c["read_page_0"][idx, None] * 4 + offs)[prev_ok]
                reads += [(own, [*range(H, 2 * H), *range(3 * H, 4 * H)]),
                          (prev, [*range(0, H), *range(2 * H, 3 * H)])]
            else:
                reads.append(((c["read_page_1"][idx, None] * 128 + offs)[buffered], None))
    bad_in = ~torch.isfinite(used).all(dim=1)
    if bool(bad_in.any()):
        row = int(bad_in.nonzero()[0, 0])
        fail("kv_score_input", "finite values in every row the call reads (FLASHCOMPRESS_DEBUG check)",
             f"a non-finite value in row {row}")
    for rows, cols in reads:
        if rows.numel():
            values = state[rows] if cols is None else state[rows][:, cols]
            bad = torch.isnan(values).any(dim=1)
            if bool(bad.any()):
                fail("kv_score_buffer", "no NaN in the state rows the call reads (FLASHCOMPRESS_DEBUG check)",
                     f"NaN in state row {int(rows[bad.nonzero()[0, 0]])}")


def check_plan_indices(
    state_rows: int,
    input_rows: int,
    ratio: int,
    online: bool,
    decode: dict[str, torch.Tensor] | None = None,
    compress: dict[str, torch.Tensor] | None = None,
    write: dict[str, torch.Tensor] | None = None,
) -> None:
    """Every state row / page and ragged id a plan addresses lies inside its tensor."""
    page_rows = 1 if online else ratio
    pages = state_rows // page_rows

    def in_range(arg: str, what: str, values: torch.Tensor, bound: int) -> None:
        if values.numel():
            lo, hi = int(values.min()), int(values.max())
            if lo < 0 or hi >= bound:
                hint = ""
                if what.startswith("state") and not online:
                    hint = ("; state rows come from full_to_state (paged C4) or req_pool_indices * ring_size "
                            "(request ring): size kv_score_buffer for all of them")
                fail("plan", f"{what} in [0, {bound})", f"range [{lo}, {hi}] ({arg}){hint}")

    if decode is not None:
        in_range("write_loc", "state rows", decode["write_loc"], state_rows)
        in_range("read_page_0", "state pages", decode["read_page_0"], pages)
        if not online:
            in_range("read_page_1", "state pages", decode["read_page_1"], pages)
    if compress is not None:
        valid = compress["valid"]
        ragged = compress["ragged_id"][valid]
        in_range("ragged_id", "kv_score_input rows", ragged, input_rows)
        if online:
            in_range("ragged_id", "segment start rows", ragged - compress["buffer_len"][valid] + 1, input_rows)
            in_range("read_page_0", "state slots", compress["read_page_0"][valid], state_rows)
            load_slot = compress["read_page_1"][valid]
            in_range("read_page_1", "state slots", load_slot[load_slot >= 0], state_rows)
        else:
            window = 8 if ratio == 4 else 128
            takes_input = compress["buffer_len"][valid] < window
            in_range("ragged_id", "window start rows", (ragged - (window - 1) + compress["buffer_len"][valid])[takes_input], input_rows)
            reads = valid & (compress["buffer_len"] > 0)
            in_range("read_page_1", "state pages", compress["read_page_1"][reads], pages)
            if ratio == 4:
                in_range("read_page_0", "state pages", compress["read_page_0"][reads & (compress["seq_len"] > 4)], pages)
    if write is not None:
        valid = write["valid"]
        in_range("ragged_id", "kv_score_input rows", write["ragged_id"][valid], input_rows)
        in_range("write_loc", "state rows", write["write_loc"][valid], state_rows)



def check_store_values(
    dest: torch.Tensor, positions: torch.Tensor, kvcache: torch.Tensor, page_size: int, freq_rows: int
) -> None:
    if not dest.numel() or not wants_value_checks(dest):
        return
    lo, hi = int(dest.min()), int(dest.max())
    capacity = kvcache.shape[0] * page_size
    if lo < 0 or hi >= capacity:
        fail("out_loc", f"slots in [0, {capacity}) ({kvcache.shape[0]} pages of {page_size})", f"range [{lo}, {hi}]")
    if dest.numel() > 1:
        ordered = torch.sort(dest).values
        same = ordered[1:] == ordered[:-1]
        if bool(same.any()):
            slot = int(ordered[1:][same][0])
            fail("out_loc", "a distinct cache slot for every stored row",
                 f"slot {slot} for {int((dest == slot).sum())} stored rows")
    plo, phi = int(positions.min()), int(positions.max())
    if plo < 0 or phi >= freq_rows:
        fail("freq_cis", f"> {phi} rows (largest RoPE position) and positions >= 0", f"{freq_rows} rows, positions [{plo}, {phi}]")
