"""Argument checks of the V4.1 low-ratio ops (run before anything is written).

Errors are ``TypeError`` (wrong type / dtype) or ``ValueError`` (shape,
device, value), each message starting with the argument's name, then the
expected and the actual value (``flashcompress.validation.fail``).

Metadata checks always run.  Value checks read tensor contents; like the V4
ops they run for CPU tensors and, for device tensors, under
``FLASHCOMPRESS_DEBUG=1``.  Beyond SGLang's host checks they cover the bounds
the peer kernels never test (spec ``v41.md`` §14.7): positions inside the RoPE
table, stored slots inside the cache and distinct, ``req * ring`` rows inside
the pair ring, ``extend_start_loc`` / ``extend_seq_lens`` inside the batch,
and verify / decode row order.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..validation import byte_span, check_int, check_no_overlap, check_size, check_tensor, fail, wants_value_checks
from .layouts import INDEX_K_DIM, INDEX_K_SLOT_BYTES, LATENT_DIM, LOW_RATIOS, PAIR_STATE_WIDTH, ROPE_DIM, KVLayout

_BF16 = (torch.bfloat16,)
_F32 = (torch.float32,)
_I64 = (torch.int64,)
_I32 = (torch.int32,)
_INDEX = (torch.int32, torch.int64)
_CACHE = (torch.uint8, torch.float8_e4m3fn)
_1D = (1,)
_2D = (2,)


def check_eps(eps: object) -> float:
    """A real number in (0, 1) that stays positive in fp32 (the kernels take a C ``float``)."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        fail("eps", "a float in (0, 1)", repr(eps), TypeError)
    value = float(eps)
    if not (0.0 < value < 1.0) or float(torch.tensor(value, dtype=torch.float32)) == 0.0:
        fail("eps", "a float in (0, 1), non-zero in fp32 (e.g. 1e-20 or 1e-6)", repr(eps))
    return value


def check_page_size(page_size: object) -> int:
    check_int("page_size", page_size, minimum=1)
    if page_size & (page_size - 1):  # type: ignore[operator]
        fail("page_size", "a power of two", page_size)
    return page_size  # type: ignore[return-value]


def check_freqs(freqs_cis: object, device: int) -> torch.Tensor:
    """``[rows, 64]`` fp32 RoPE table, (cos, sin) interleaved per pair."""
    f = check_tensor("freqs_cis", freqs_cis, dtypes=_F32, ndim=_2D, device=device)
    check_size("freqs_cis", f, 1, ROPE_DIM, "(cos, sin) of 32 rotation pairs")
    return f


def check_index(arg: str, t: object, n: int, device: int, dtypes: tuple[torch.dtype, ...] = _INDEX) -> torch.Tensor:
    """A ``[n]`` integer metadata tensor."""
    t = check_tensor(arg, t, dtypes=dtypes, ndim=_1D, device=device)
    check_size(arg, t, 0, n, "one entry per input row")
    return t


def check_weight(norm_weight: object, dim: int, device: int) -> torch.Tensor:
    w = check_tensor("norm_weight", norm_weight, dtypes=_BF16, ndim=_1D, device=device)
    check_size("norm_weight", w, 0, dim, "the RMSNorm width")
    return w


def check_kv_cache(k_cache: object, device: int, layout: KVLayout, page_size: int) -> torch.Tensor:
    """``[pages, layout.page_bytes(page_size)]`` uint8 (or its float8_e4m3fn view)."""
    c = check_tensor("k_cache", k_cache, dtypes=_CACHE, ndim=_2D, device=device)
    pb = layout.page_bytes(page_size)
    if c.shape[1] != pb:
        fail("k_cache", f"[pages, {pb}] ({layout.value} page of {page_size} slots)", f"shape {tuple(c.shape)}")
    return c


def check_out(out: object, n: int, device: int) -> torch.Tensor | None:
    if out is None:
        return None
    o = check_tensor("out", out, dtypes=_BF16, ndim=_2D, device=device)
    if tuple(o.shape) != (n, LATENT_DIM):
        fail("out", f"shape ({n}, {LATENT_DIM})", f"shape {tuple(o.shape)}")
    return o


def check_separate(written: dict[str, torch.Tensor], read: dict[str, torch.Tensor]) -> None:
    """No written tensor may share memory with another argument."""
    spans = {k: byte_span(t) for k, t in {**read, **written}.items()}
    for w in written:
        for other, span in spans.items():
            if other != w:
                check_no_overlap(w, spans[w], other, span, f"{w} is written while {other} is used")


# --------------------------------------------------------------------------
# value checks (CPU / debug)
# --------------------------------------------------------------------------


def check_range(arg: str, values: torch.Tensor, limit: int, what: str) -> None:
    """Every value lies in ``[0, limit)``; ``what`` names the values and the limit in the message."""
    if not values.numel():
        return
    lo, hi = int(values.min()), int(values.max())
    if lo < 0 or hi >= limit:
        fail(arg, f"{what.format(limit=limit)}", f"range [{lo}, {hi}]")


def check_rope_rows(arg: str, rope_pos: torch.Tensor, table_rows: int, what: str) -> None:
    """RoPE table rows that will be read lie in ``[0, table_rows)``."""
    check_range(arg, rope_pos, table_rows, what + " in [0, {limit}) (rows of freqs_cis)")


def check_slots(arg: str, slots: torch.Tensor, capacity: int, what: str) -> None:
    """Stored slots lie inside the cache and are distinct (duplicates would race on the GPU)."""
    check_range(arg, slots, capacity, what + " in [0, {limit}) (slots of the cache)")
    ordered = torch.sort(slots).values
    same = ordered[1:] == ordered[:-1]
    if bool(same.any()):
        fail(arg, f"a distinct slot per stored row ({what})", f"slot {int(ordered[1:][same][0])} more than once")


def check_ring_rows(req: torch.Tensor, rows: torch.Tensor, ring_size: int, state_rows: int) -> None:
    """``req * ring + ring <= kv_state rows`` for the rows that touch the ring."""
    check_range("req", req[rows], state_rows // ring_size,
                f"request slots in [0, {{limit}}) (kv_state has {state_rows} rows, ring {ring_size})")


def check_non_negative(arg: str, t: torch.Tensor) -> None:
    if t.numel() and int(t.min()) < 0:
        fail(arg, "values >= 0", f"minimum {int(t.min())}")


# --------------------------------------------------------------------------
# per op
# --------------------------------------------------------------------------


class C1Args(NamedTuple):
    kv_input: torch.Tensor
    norm_weight: torch.Tensor
    positions: torch.Tensor
    out_loc: torch.Tensor
    eps: float
    freqs_cis: torch.Tensor
    k_cache: torch.Tensor
    page_size: int
    layout: KVLayout
    out: torch.Tensor | None


def check_c1(kv_input: object, norm_weight: object, positions: object, out_loc: object, eps: object,
             freqs_cis: object, k_cache: object, page_size: object, layout: object, out: object) -> C1Args:
    x = check_tensor("kv_input", kv_input, dtypes=_BF16, ndim=_2D)
    check_size("kv_input", x, 1, LATENT_DIM, "the latent width")
    n, dev = x.shape[0], x.get_device()
    lay = KVLayout.parse(layout)
    ps = check_page_size(page_size)
    a = C1Args(x, check_weight(norm_weight, LATENT_DIM, dev), check_index("positions", positions, n, dev),
               check_index("out_loc", out_loc, n, dev), check_eps(eps), check_freqs(freqs_cis, dev),
               check_kv_cache(k_cache, dev, lay, ps), ps, lay, check_out(out, n, dev))
    written = {"k_cache": a.k_cache} | ({"out": a.out} if a.out is not None else {})
    check_separate(written, {"kv_input": x, "norm_weight": a.norm_weight, "positions": a.positions,
                             "out_loc": a.out_loc, "freqs_cis": a.freqs_cis})
    if n and wants_value_checks(x):
        check_rope_rows("positions", a.positions, a.freqs_cis.shape[0], "positions (every row rotates)")
        stored = a.out_loc[a.out_loc > 0]
        check_slots("out_loc", stored, a.k_cache.shape[0] * ps, "slots of rows with out_loc > 0")
    return a


class C2Args(NamedTuple):
    kv_input: torch.Tensor
    kv_state: torch.Tensor
    norm_weight: torch.Tensor
    positions: torch.Tensor
    req: torch.Tensor
    raw_out_loc: torch.Tensor
    eps: float
    freqs_cis: torch.Tensor
    k_cache: torch.Tensor
    page_size: int
    ring_size: int
    layout: KVLayout
    out: torch.Tensor | None


def check_c2(kv_input: object, kv_state: object, norm_weight: object, positions: object, req: object,
             raw_out_loc: object, eps: object, freqs_cis: object, k_cache: object, page_size: object,
             ring_size: object, layout: object, out: object, extra_read: dict[str, torch.Tensor] | None = None,
             ) -> C2Args:
    """Checks shared by c2 decode / verify / prefill (metadata only; see :func:`check_c2_values`)."""
    x = check_tensor("kv_input", kv_input, dtypes=_F32, ndim=_2D)
    check_size("kv_input", x, 1, PAIR_STATE_WIDTH, "kv (512) | score (512)")
    n, dev = x.shape[0], x.get_device()
    state = check_tensor("kv_state", kv_state, dtypes=_F32, ndim=_2D, device=dev)
    check_size("kv_state", state, 1, PAIR_STATE_WIDTH, "kv (512) | score (512) per ring row")
    lay = KVLayout.parse(layout)
    ps = check_page_size(page_size)
    ring = check_int("ring_size", ring_size, minimum=1)
    if state.shape[0] < ring:
        fail("kv_state", f">= {ring} rows (one ring of ring_size rows)", f"shape {tuple(state.shape)}")
    a = C2Args(x, state, check_weight(norm_weight, LATENT_DIM, dev), check_index("positions", positions, n, dev),
               check_index("req", req, n, dev, _I64), check_index("raw_out_loc", raw_out_loc, n, dev),
               check_eps(eps), check_freqs(freqs_cis, dev), check_kv_cache(k_cache, dev, lay, ps), ps, ring, lay,
               check_out(out, n, dev))
    written = {"k_cache": a.k_cache, "kv_state": state} | ({"out": a.out} if a.out is not None else {})
    check_separate(written, {"kv_input": x, "norm_weight": a.norm_weight, "positions": a.positions, "req": a.req,
                             "raw_out_loc": a.raw_out_loc, "freqs_cis": a.freqs_cis, **(extra_read or {})})
    return a


def check_c2_values(a: C2Args, ring_readers: torch.Tensor) -> None:
    """Values every c2 mode needs: slots, RoPE rows of the pooled rows, and ring rows of ``ring_readers``."""
    check_non_negative("raw_out_loc", a.raw_out_loc)
    check_non_negative("positions", a.positions)
    check_ring_rows(a.req, ring_readers, a.ring_size, a.kv_state.shape[0])
    pooled = (a.raw_out_loc != 0) & ((a.positions & 1) == 1)
    check_rope_rows("positions", a.positions[pooled].long() - 1, a.freqs_cis.shape[0],
                    "RoPE rows pos - 1 of the odd, non-padded rows")
    check_slots("raw_out_loc", a.raw_out_loc[pooled].long() >> 1, a.k_cache.shape[0] * a.page_size,
                "compressed slots raw >> 1 of the odd, non-padded rows")


def check_c2_decode(a: C2Args, draft_len: object) -> int:
    d = check_int("draft_len", draft_len, minimum=1)
    n = a.kv_input.shape[0]
    if d > 1:
        if n % d:
            fail("kv_input", f"a multiple of draft_len = {d} rows (verify blocks)", f"{n} rows")
        if a.ring_size <= d:
            fail("ring_size", f"> draft_len = {d} (the pair ring must be wider than the draft length)", a.ring_size)
    if n and wants_value_checks(a.kv_input):
        # decode and verify read the partner of every row, padded rows included
        check_c2_values(a, torch.arange(n, device=a.kv_input.device))
        live = a.raw_out_loc != 0
        if d == 1:
            ids = torch.sort(a.req[live]).values
            if bool((ids[1:] == ids[:-1]).any()):
                fail("req", "one decode row per request", f"request {int(ids[1:][ids[1:] == ids[:-1]][0])} twice")
        else:
            rows = torch.arange(n, device=a.kv_input.device)
            inner = live & (rows % d != 0)
            prev = (rows - 1).clamp_min(0)
            bad = inner & ((a.req[prev] != a.req) | (a.positions[prev].long() != a.positions.long() - 1))
            if bool(bad.any()):
                i = int(bad.nonzero()[0])
                fail("positions", f"blocks of {d} consecutive positions of one request (row {i} pairs with row {i - 1})",
                     f"req {int(a.req[i - 1])}/{int(a.req[i])}, positions {int(a.positions[i - 1])}/{int(a.positions[i])}")
    return d


def check_c2_prefill(a: C2Args, extend_start_loc: object, extend_seq_lens: object) -> tuple[torch.Tensor, torch.Tensor]:
    dev = a.kv_input.get_device()
    start = check_tensor("extend_start_loc", extend_start_loc, dtypes=_I32, ndim=_1D, device=dev)
    lens = check_tensor("extend_seq_lens", extend_seq_lens, dtypes=_I32, ndim=_1D, device=dev)
    check_size("extend_seq_lens", lens, 0, start.shape[0], "one length per request of extend_start_loc")
    n = a.kv_input.shape[0]
    if n and wants_value_checks(a.kv_input):
        check_non_negative("extend_start_loc", start)
        check_non_negative("extend_seq_lens", lens)
        end = start.long() + lens.long()
        if end.numel() and int(end.max()) > n:
            fail("extend_seq_lens", f"start + len <= {n} (rows of kv_input)", f"max end {int(end.max())}")
        nonempty = lens > 0
        s, e = start.long()[nonempty], end[nonempty]
        order = torch.argsort(s)
        if bool((s[order][1:] < e[order][:-1]).any()):
            fail("extend_start_loc", "disjoint row ranges [start, start + len) per request", "overlapping ranges")
        live = (a.raw_out_loc != 0).nonzero().squeeze(1)
        check_c2_values(a, live)
    return start, lens


class IndexKArgs(NamedTuple):
    input: torch.Tensor
    norm_weight: torch.Tensor
    eps: float
    freqs_cis: torch.Tensor
    positions: torch.Tensor
    loc: torch.Tensor
    cache: torch.Tensor
    page_size: int
    ratio: int


def check_index_k(input: object, norm_weight: object, eps: object, freqs_cis: object, positions: object,
                  loc: object, cache: object, ratio: object) -> IndexKArgs:
    x = check_tensor("input", input, dtypes=_BF16, ndim=_2D)
    check_size("input", x, 1, INDEX_K_DIM, "the index-key width")
    n, dev = x.shape[0], x.get_device()
    r = check_int("ratio", ratio)
    if r not in LOW_RATIOS:
        fail("ratio", f"one of {LOW_RATIOS}", r)
    c = check_tensor("cache", cache, dtypes=(torch.uint8,), ndim=_2D, device=dev)
    ps = c.shape[1] // INDEX_K_SLOT_BYTES
    if c.shape[1] % INDEX_K_SLOT_BYTES or ps == 0 or ps & (ps - 1):
        fail("cache", f"[pages, {INDEX_K_SLOT_BYTES} * P] with P a power of two", f"shape {tuple(c.shape)}")
    a = IndexKArgs(x, check_weight(norm_weight, INDEX_K_DIM, dev), check_eps(eps), check_freqs(freqs_cis, dev),
                   check_index("positions", positions, n, dev), check_index("loc", loc, n, dev, _I64), c, ps, r)
    check_separate({"cache": c}, {"input": x, "norm_weight": a.norm_weight, "freqs_cis": a.freqs_cis,
                                  "positions": a.positions, "loc": a.loc})
    if n and wants_value_checks(x):
        live = a.loc > 0
        check_rope_rows("positions", a.positions[live].long() & ~(r - 1), a.freqs_cis.shape[0],
                        "RoPE rows pos & ~(ratio - 1) of the rows with loc > 0")
        check_slots("loc", a.loc[live], c.shape[0] * ps, "slots of rows with loc > 0")
    return a
