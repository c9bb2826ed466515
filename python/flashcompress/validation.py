"""Argument checks for every public entry point.

Every public function calls its ``check_*`` here before anything is written,
so a rejected call leaves every buffer untouched.  Errors are ``TypeError``
(wrong dtype / object kind) or ``ValueError`` (shape, device, value), and the
message always starts with the argument's name, then expected vs. actual.

Two tiers, to keep the host side of a call near 10 µs:
  * metadata checks (dtype, rank, shape, device, contiguity, scalars) always run;
  * data-dependent checks (plan indices inside the state buffer, largest
    ``out_loc`` inside the cache, positions inside the RoPE table, seq/extend
    lengths) read tensor *values*.  They always run for CPU tensors (cheap, no
    sync) and for CUDA tensors only when ``FLASHCOMPRESS_DEBUG=1``, because
    reading device values forces a host synchronisation.
"""

from __future__ import annotations

from typing import Callable, NoReturn

import torch

from .jit.settings import debug_checks_enabled
from .layouts import (
    HEAD_DIMS,
    MAX_RAGGED_ID,
    ONLINE_HEAD_DIMS,
    SUPPORTED_RATIOS,
    CacheFormat,
    input_width,
    state_width,
)

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


# --------------------------------------------------------------------------
# Generic tensor checks
# --------------------------------------------------------------------------


def check_tensor(
    arg: str,
    t: object,
    *,
    dtypes: tuple[torch.dtype, ...],
    ndim: tuple[int, ...],
    device: torch.device | None = None,
    contiguous: bool = True,
) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        fail(arg, "a torch.Tensor", type(t).__name__, TypeError)
    if t.is_meta:
        fail(arg, "a tensor with data (cpu or cuda)", "a tensor on the meta device")
    if t.requires_grad and torch.is_grad_enabled():
        fail(arg, "a tensor that does not require grad (the ops are not differentiable: detach() it or "
             "call under torch.no_grad() / torch.inference_mode())", "requires_grad=True")
    if t.dtype not in dtypes:
        fail(arg, "dtype " + " or ".join(str(d) for d in dtypes), t.dtype, TypeError)
    if t.dim() not in ndim:
        fail(arg, f"a {' or '.join(map(str, ndim))}-D tensor", f"shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        fail(arg, f"device {device} (same as the other tensors)", t.device)
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
    rpi = check_tensor("req_pool_indices", req_pool_indices, dtypes=_I64, ndim=_1D)
    device = rpi.device
    r2t = check_tensor("req_to_token", req_to_token, dtypes=_I32, ndim=_2D, device=device)
    if full_to_state is not None:
        check_tensor("full_to_state", full_to_state, dtypes=_I64, ndim=_1D, device=device)
    if rpi.numel() and wants_value_checks(rpi):
        lo, hi = int(rpi.min()), int(rpi.max())
        if lo < 0 or hi >= r2t.shape[0]:
            fail("req_pool_indices", f"values in [0, {r2t.shape[0]}) (rows of req_to_token)", f"range [{lo}, {hi}]")
    return device


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
    lens = check_tensor(arg, t, dtypes=_I64, ndim=_1D)
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
    seq_lens: torch.Tensor, extend_lens: torch.Tensor, num_q_tokens: object, *, exact_total: bool
) -> int:
    """num_q_tokens vs. extend_lens; 0 < extend <= seq per request."""
    batch = seq_lens.shape[0]
    check_int("num_q_tokens", num_q_tokens, minimum=0)
    if num_q_tokens > MAX_RAGGED_ID:  # type: ignore[operator]
        fail("num_q_tokens", f"<= {MAX_RAGGED_ID} (ragged ids are u16)", num_q_tokens)
    if num_q_tokens < batch:  # type: ignore[operator]
        fail("num_q_tokens", f">= batch size {batch}", num_q_tokens)
    if batch and wants_value_checks(extend_lens):
        bad = (extend_lens <= 0) | (extend_lens > seq_lens)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            fail(
                "extend_lens",
                "0 < extend_lens[i] <= seq_lens[i] for every request",
                f"extend_lens[{i}] = {int(extend_lens[i])}, seq_lens[{i}] = {int(seq_lens[i])}",
            )
        total = int(extend_lens.sum())
        if exact_total and total != num_q_tokens:
            fail("num_q_tokens", f"sum(extend_lens) = {total}", num_q_tokens)
        if not exact_total and total > num_q_tokens:  # type: ignore[operator]
            fail("num_q_tokens", f">= sum(extend_lens) = {total} (padded token count)", num_q_tokens)
    return num_q_tokens  # type: ignore[return-value]


# --------------------------------------------------------------------------
# compress_forward
# --------------------------------------------------------------------------


def flat_state(kv_score_buffer: object, ratio: int, head_dim: int, online: bool) -> torch.Tensor:
    """Check the state pool and return its flat ``[rows, width]`` view."""
    buf = check_tensor("kv_score_buffer", kv_score_buffer, dtypes=FLOAT_DTYPES, ndim=(2, 3))
    width = state_width(ratio, head_dim, online)
    shape = buf.shape
    if shape[-1] != width:
        kind = "online C128 [max|sum|kv]" if online else f"ratio {ratio}"
        fail("kv_score_buffer", f"last dim {width} ({kind}, head_dim {head_dim})", f"shape {tuple(shape)}")
    if len(shape) == 3:
        rows_per_page = 1 if online else ratio
        if shape[1] != rows_per_page:
            fail("kv_score_buffer", f"paged view [pages, {rows_per_page}, {width}]", f"shape {tuple(shape)}")
        return buf.view(-1, width)
    return buf


def check_compress_inputs(
    state: torch.Tensor,
    kv_score_input: object,
    ape: object,
    out: object | None,
    plan_rows: int,
    ratio: int,
    head_dim: int,
    online: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    device = state.device
    dtypes = _F32 if online else FLOAT_DTYPES
    inp = check_tensor("kv_score_input", kv_score_input, dtypes=dtypes, ndim=_2D, device=device)
    width = input_width(ratio, head_dim)
    if inp.shape[1] != width:
        check_size("kv_score_input", inp, 1, width, f"[tokens, {width}]")  # raises
    ape_t = check_tensor("ape", ape, dtypes=dtypes, ndim=_2D, device=device)
    ape_rows = 8 if ratio == 4 else 128
    if ape_t.shape != (ape_rows, head_dim):
        fail("ape", f"shape ({ape_rows}, {head_dim})", f"shape {tuple(ape_t.shape)}")
    in_place = "the state pool is updated in place"
    state_span, inp_span, ape_span = byte_span(state), byte_span(inp), byte_span(ape_t)
    check_no_overlap("kv_score_input", inp_span, "kv_score_buffer", state_span, in_place)
    check_no_overlap("ape", ape_span, "kv_score_buffer", state_span, in_place)
    if out is not None:
        out_t = check_tensor("out", out, dtypes=dtypes, ndim=_2D, device=device)
        if out_t.shape != (plan_rows, head_dim):
            fail("out", f"shape ({plan_rows}, {head_dim}) (one row per plan row)", f"shape {tuple(out_t.shape)}")
        written = "out is written while the others are read"
        out_span = byte_span(out_t)
        check_no_overlap("out", out_span, "kv_score_buffer", state_span, written)
        check_no_overlap("out", out_span, "kv_score_input", inp_span, written)
        check_no_overlap("out", out_span, "ape", ape_span, written)
    return inp, ape_t


def check_plan_tensor(arg: str, t: object, row_bytes: int, device: torch.device | None) -> torch.Tensor:
    """A ``uint8 [rows, row_bytes]`` contiguous plan tensor (on ``device`` when given)."""
    check_tensor(arg, t, dtypes=_U8, ndim=_2D, device=device)
    check_size(arg, t, 1, row_bytes, "plan row bytes")  # type: ignore[arg-type]
    return t  # type: ignore[return-value]


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


# --------------------------------------------------------------------------
# compress_norm_rope_store
# --------------------------------------------------------------------------


def check_store_args(
    kv: object,
    plan_rows: int,
    norm_weight: object,
    norm_eps: object,
    freq_cis: object,
    out_loc: object,
    kvcache: object,
    page_size: object,
    use_fp4: object,
    bf16_store: object,
    is_decode: bool,
    fmt_for: Callable[[int, bool, bool], CacheFormat],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, CacheFormat]:
    kv_t = check_tensor("kv", kv, dtypes=FLOAT_DTYPES, ndim=_2D)
    D = kv_t.shape[1]
    if D not in (128, 512):
        fail("kv", "head dim 128 (indexer) or 512 (main KV)", f"shape {tuple(kv_t.shape)}")
    check_size("kv", kv_t, 0, plan_rows, "one row per plan row")
    loc, freq, fmt = check_store_targets(
        kv_t.device, D, plan_rows, norm_weight, norm_eps, freq_cis, out_loc, kvcache, page_size,
        use_fp4, bf16_store, is_decode, fmt_for)
    check_no_overlap("kv", byte_span(kv_t), "kvcache", byte_span(kvcache),  # type: ignore[arg-type]
                     "kvcache is written while kv is read")
    return kv_t, loc, freq, fmt


def check_store_targets(
    device: torch.device,
    D: int,
    plan_rows: int,
    norm_weight: object,
    norm_eps: object,
    freq_cis: object,
    out_loc: object,
    kvcache: object,
    page_size: object,
    use_fp4: object,
    bf16_store: object,
    is_decode: bool,
    fmt_for: Callable[[int, bool, bool], CacheFormat],
) -> tuple[torch.Tensor, torch.Tensor, CacheFormat]:
    """Everything of a store call except the rows themselves (``compress_and_store`` has none)."""
    if type(use_fp4) is not bool:  # bool cannot be subclassed: same as isinstance
        fail("use_fp4", "a bool", repr(use_fp4), TypeError)
    if type(bf16_store) is not bool:
        fail("bf16_store", "a bool", repr(bf16_store), TypeError)
    if use_fp4 and D != 128:
        fail("use_fp4", "False unless head dim is 128 (FP4 is the indexer format)", f"True with head dim {D}")
    if bf16_store and D != 512:
        fail("bf16_store", "False unless head dim is 512 (main KV)", f"True with head dim {D}")
    w = check_tensor("norm_weight", norm_weight, dtypes=FLOAT_DTYPES, ndim=_1D, device=device)
    check_size("norm_weight", w, 0, D, "head dim of kv")
    if not (type(norm_eps) is float and 0.0 < norm_eps < 1.0) and (  # the common case decided by the first test
            isinstance(norm_eps, bool) or not isinstance(norm_eps, (int, float)) or not (0 < float(norm_eps) < 1)):
        fail("norm_eps", "a float in (0, 1)", repr(norm_eps), TypeError if not isinstance(norm_eps, (int, float)) else ValueError)
    freq = check_tensor("freq_cis", freq_cis, dtypes=_C64, ndim=_2D, device=device, contiguous=False)
    check_size("freq_cis", freq, 1, 32, "rope_dim / 2 complex entries")
    loc = check_tensor("out_loc", out_loc, dtypes=_I64, ndim=_1D, device=device)
    n_loc = loc.shape[0]
    if is_decode and n_loc != plan_rows:
        fail("out_loc", f"{plan_rows} entries (one per decode request)", n_loc)
    if not is_decode and n_loc < plan_rows:
        fail("out_loc", f">= {plan_rows} entries (one per query token)", n_loc)
    check_int("page_size", page_size, minimum=1)
    if page_size & (page_size - 1):  # type: ignore[operator]
        fail("page_size", "a power of two", page_size)
    fmt = fmt_for(D, use_fp4, bf16_store)
    cache = check_tensor("kvcache", kvcache, dtypes=_U8, ndim=_2D, device=device)
    written = "kvcache is written while the others are read"
    cache_span = byte_span(cache)
    check_no_overlap("norm_weight", byte_span(w), "kvcache", cache_span, written)
    check_no_overlap("freq_cis", byte_span(freq), "kvcache", cache_span, written)
    check_no_overlap("out_loc", byte_span(loc), "kvcache", cache_span, written)
    row_bytes = fmt.data_bytes * page_size if fmt.scale_bytes == 0 else fmt.page_bytes(page_size)  # type: ignore[arg-type]
    if cache.shape[1] != row_bytes:
        fail("kvcache", f"[pages, {row_bytes}] ({fmt.name} page of {page_size} tokens)", f"shape {tuple(cache.shape)}")
    return loc, freq, fmt


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
