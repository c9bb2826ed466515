"""Shared harness of the op benchmarks (``bench_compress.py``, ``bench_store.py``, ``bench_pipeline.py``).

Timing (CUDA)
  * **cold**: before every timed call a 256 MiB buffer is overwritten (evicts L2) and a
    short spin kernel is queued; the call is bracketed by two CUDA events; the result is
    the median over ``--reps`` calls.  All calls are queued behind an initial spin so the
    host stays ahead of the GPU: the events measure GPU time, not Python.  If the host
    fell behind (the GPU drained the queue), the cold value is marked ``!``.
  * **clean** (``--peer`` tables): as cold, but the flush reads a 512 MiB buffer instead of
    writing one, so no dirty line is written back during the timed call (a memset flush
    leaves L2 full of dirty lines; for small cases cold carries that fixed cost).
  * **graph**: 20 calls (cycling over the case's rotating input sets) captured in one
    CUDA graph, replayed ``--graph-replays`` times; the value is GPU time per call.
  * **copy**: a device-to-device copy of a 1 GiB buffer, cold, median of 5, in the same
    run; GB/s counts read + write.  ``% copy`` = the op's GB/s over this number.
  On the CPU (``--device cpu``) everything is a smoke run: tiny sizes, the median wall
  time of a few calls, no graph column.
  ``--tiling a,b`` times each case under every listed ``compress`` variant tiling in the same
  run, side by side (rows of b marked ``[b]``; ``cuda_ops.compress.set_tiling``, which the
  eager fast path follows).

Cases (the issue tables' cases)
  * decode, B = 1 / 32 / 128 / 512 requests, context lengths random in [1024, 65536]:
    ``rand``: exactly round(B/4) requests close a ratio-4 window (seq_len % 4 == 0) and,
    among them, exactly round(B/128) a ratio-128 window (seq_len % 128 == 0);
    ``bnd``: every request closes a ratio-128 window.
    Diagnostic, run only when ``--cases`` names it (``decode-B512-open``): ``rand``'s ratio-4
    closings but no ratio-128 window closes (a C128 launch that only copies rows: the launch's
    cost without the teams that pool a closing request).
  * prefill, 8192 tokens over 4 requests and 32768 tokens over 8 requests, each request
    a chunk of T/n tokens after a random unaligned prefix (prefix % 4 != 0).
  * 256-token pages in random physical order: every request owns shuffled full pages
    (full page 0 is the allocator's dummy page, slot 0 the padding slot) for the positions
    the op touches, each mapped through ``full_to_state`` to its own shuffled SWA page
    (paged C4 state addressing); positions never touched map to the dummy page.
  * inputs, state pools, ape, norm weights random normal (never zeros); fp32 input and
    state; plans from the public ``CompressorDecodePlan.generate`` /
    ``CompressorPrefillPlan.generate`` (+ ``generate_online``), lengths on the device for
    decode and on the host for prefill (the engines' paths), no CUDA-graph padding.
  * layer kinds: ``c4-512`` (main KV), ``c4-128`` (indexer), ``c128-512``, ``c128-online``
    (online C128, head 512).

Byte model (minimum bytes an op must move; all fp32 = 4 B; "part" = one 2H-wide half of
a C4 state row (its overlap or its own [kv | score] pair) or one whole 2H-wide C128 row)
  compress_forward, per request with prefix P and seq_len S (decode: P = S - 1):
    input rows read once              (S - P) x in_width x 4
    state parts the windows need      distinct (position < P, part) pairs that a window
                                      closing in [P, S) pools x 2H x 4
                                      (decode C4: 7 parts, C128: 127 parts, else 0)
    state rows written                decode: 1 row; prefill: the rows the write policy
                                      keeps (spec/compressor.md 2.4: p >= first_w_pos, plus
                                      the last 4 tokens of every 256-token page for paged C4)
                                      x state_width x 4
    online state                      read one 3H row if P % 128 != 0, write one if
                                      S % 128 != 0
    output                            every plan row x H x 4 (zeros included: the API writes them)
    ape                               the table once (8 or 128 rows x H x 4) when any window is
                                      pooled (online: the distinct rows its tokens use)
    plan                              16 B per plan row (+ 8 B per WritePlan row, 16 B online)
  compress_norm_rope_store:
    16 B per plan row; per stored row: H x 4 (kv) + 256 B (its freq_cis row) + 8 B
    (out_loc) + the cache entry (584 / 132 / 68 B); norm weight H x 4 once.
  compress_and_store (the pipeline): compress_forward's bytes without the output and the
    store's bytes without the kv read and the second plan read (the fp32 intermediate
    never reaches memory).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import fnmatch
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

_REPO = Path(__file__).resolve().parents[1]
if str(_REPO / "python") not in sys.path:  # runs from a checkout without `pip install -e`
    sys.path.insert(0, str(_REPO / "python"))

from flashcompress import CompressorDecodePlan, CompressorPrefillPlan  # noqa: E402
from flashcompress import layouts as L  # noqa: E402

try:  # the test helpers moved to flashcompress.testing; older trees have them at the top level
    from flashcompress.testing.oracle import deepseek_v4_freq_cis as _freq_table  # noqa: E402
except ImportError:  # pragma: no cover - depends on the tree's layout
    try:
        from flashcompress.oracle import deepseek_v4_freq_cis as _freq_table  # type: ignore  # noqa: E402
    except ImportError:
        _freq_table = None

SWA_PAGE = 256
GRAPH_CALLS = 20
FLUSH_BYTES = 256 << 20
CLEAN_BYTES = 512 << 20
COPY_BYTES_GPU = 1 << 30
COPY_BYTES_CPU = 32 << 20
FREQ_ROW_BYTES = 32 * 8  # complex64 [32]
OUT_LOC_BYTES = 8


# ----------------------------------------------------------------------------- layer kinds


@dataclass(frozen=True)
class Layer:
    name: str
    ratio: int
    head_dim: int
    online: bool = False

    @property
    def ring(self) -> int:
        return 1 if self.online else (8 if self.ratio == 4 else 128)

    @property
    def paged(self) -> bool:
        """Paged-SWA state addressing (C4 with the default engine setup)."""
        return self.ratio == 4

    @property
    def in_width(self) -> int:
        return L.input_width(self.ratio, self.head_dim)

    @property
    def state_width(self) -> int:
        return L.state_width(self.ratio, self.head_dim, self.online)


LAYERS: dict[str, Layer] = {
    "c4-512": Layer("c4-512", 4, 512),
    "c4-128": Layer("c4-128", 4, 128),
    "c128-512": Layer("c128-512", 128, 512),
    "c128-online": Layer("c128-online", 128, 512, online=True),
}


@dataclass(frozen=True)
class Store:
    """A store target: cache format and page size."""

    name: str
    fmt: L.CacheFormat
    page_size: int
    use_fp4: bool = False
    bf16_store: bool = False
    layout: str = "v4"  # the main-KV layout= (a KVLayout value; fmt = layouts.MAIN_FORMATS of it)


STORE_V4_C4 = Store("v4@64", L.MAIN_V4, 64)
STORE_V4_C128 = Store("v4@2", L.MAIN_V4, 2)
STORE_IDX_FP8 = Store("fp8@64", L.INDEXER_FP8, 64)
STORE_IDX_FP4 = Store("fp4@64", L.INDEXER_FP4, 64, use_fp4=True)


# ----------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class CaseSpec:
    name: str
    kind: str  # "decode" | "prefill"
    batch: int
    scenario: str = ""  # decode: "rand" | "bnd" | "open" (diagnostic)
    tokens: int = 0  # prefill: total new tokens
    ctx: tuple[int, int] = (1024, 65536)

    @property
    def is_decode(self) -> bool:
        return self.kind == "decode"


def all_cases(device: torch.device) -> list[CaseSpec]:
    if device.type == "cpu":  # smoke sizes
        return [
            CaseSpec("decode-B2-rand", "decode", 2, "rand", ctx=(300, 2000)),
            CaseSpec("decode-B2-bnd", "decode", 2, "bnd", ctx=(300, 2000)),
            CaseSpec("prefill-300", "prefill", 2, tokens=300, ctx=(300, 2000)),
        ]
    cases = [CaseSpec(f"decode-B{b}-{s}", "decode", b, s) for s in ("rand", "bnd") for b in (1, 32, 128, 512)]
    cases += [CaseSpec("prefill-8192", "prefill", 4, tokens=8192),
              CaseSpec("prefill-32768", "prefill", 8, tokens=32768)]
    return cases


SHORT_CASES = ("decode-B1-rand", "decode-B512-rand", "decode-B512-bnd", "prefill-8192")
# Run only when a --cases filter names one of them (substring or glob of the case name).
DIAGNOSTIC_CASES = (CaseSpec("decode-B512-open", "decode", 512, "open"),)


def matches(filters: Sequence[str], *names: str) -> bool:
    """A row is selected when a filter is a substring (or glob) of ``case``, ``layer`` or ``case:layer``."""
    if not filters:
        return True
    keys = list(names) + [":".join(names)]
    for f in filters:
        glob = any(ch in f for ch in "*?[")
        for k in keys:
            if (glob and fnmatch.fnmatchcase(k, f)) or (not glob and f in k):
                return True
    return False


def select_cases(device: torch.device, short: bool, filters: Sequence[str],
                 layer_names: Sequence[str]) -> list[CaseSpec]:
    cases = all_cases(device)
    if short and device.type != "cpu":
        cases = [c for c in cases if c.name in SHORT_CASES]
    if filters and device.type != "cpu":
        cases += [c for c in DIAGNOSTIC_CASES if matches(filters, c.name)]
    return [c for c in cases if any(matches(filters, c.name, ln) for ln in layer_names)]


# ----------------------------------------------------------------------------- world


@dataclass
class Request:
    rid: int
    prefix: int  # P: tokens already in the state before this call
    seq: int  # S: seq_len after this call

    @property
    def ext(self) -> int:
        return self.seq - self.prefix


@dataclass
class World:
    """One case's allocator state, shared by every layer kind and every input set."""

    spec: CaseSpec
    device: torch.device
    sets: list[list[Request]]
    req_to_token: torch.Tensor  # int32 [slots + 1, max_ctx]
    full_to_state: torch.Tensor  # int64 [(pages + 1) * 256 + 256 + 1]
    full_loc: dict[int, dict[int, int]]  # rid -> {logical page: physical full page}
    num_full_pages: int  # including the dummy page 0
    num_swa_pages: int  # excluding the padding page 0
    slots: int  # request slots, excluding the padding slot 0
    max_ctx: int

    def loc(self, rid: int, pos: int) -> int:
        return self.full_loc[rid][pos // SWA_PAGE] * SWA_PAGE + pos % SWA_PAGE


def _decode_lengths(rng: random.Random, spec: CaseSpec) -> list[int]:
    lo, hi = spec.ctx
    b = spec.batch
    if spec.scenario == "bnd":
        classes = [128] * b
    else:
        n128 = 0 if spec.scenario == "open" else round(b / 128)
        n4 = round(b / 4) - n128
        classes = [128] * n128 + [4] * n4 + [1] * (b - n4 - n128)
        rng.shuffle(classes)
    out = []
    for c in classes:
        if c == 128:
            s = 128 * rng.randint(-(-lo // 128), hi // 128)
        elif c == 4:
            s = 128
            while s % 128 == 0:
                s = 4 * rng.randint(-(-lo // 4), hi // 4)
        else:
            s = 4
            while s % 4 == 0:
                s = rng.randint(lo, hi)
        out.append(s)
    return out


def _prefill_requests(rng: random.Random, spec: CaseSpec) -> list[tuple[int, int]]:
    lo, hi = spec.ctx
    ext = spec.tokens // spec.batch
    exts = [ext] * spec.batch
    exts[-1] += spec.tokens - ext * spec.batch
    out = []
    for e in exts:
        p = 4
        while p % 4 == 0:  # unaligned to windows and pages
            p = rng.randint(min(lo, hi - e), hi - e)
        out.append((p, p + e))
    return out


def build_world(spec: CaseSpec, device: torch.device, n_sets: int, seed: int) -> World:
    rng = random.Random(seed)
    slots = spec.batch * n_sets
    rids = rng.sample(range(1, slots + 1), slots)
    sets: list[list[Request]] = []
    for k in range(n_sets):
        mine = rids[k * spec.batch : (k + 1) * spec.batch]
        if spec.is_decode:
            reqs = [Request(r, s - 1, s) for r, s in zip(mine, _decode_lengths(rng, spec))]
        else:
            reqs = [Request(r, p, s) for r, (p, s) in zip(mine, _prefill_requests(rng, spec))]
        sets.append(reqs)
    # the pages each request touches: positions [P - 8, S) (C4 windows reach 7 tokens back)
    wanted: list[tuple[int, int]] = []
    for reqs in sets:
        for rq in reqs:
            first, last = max(0, rq.prefix - 8) // SWA_PAGE, (rq.seq - 1) // SWA_PAGE
            wanted += [(rq.rid, lp) for lp in range(first, last + 1)]
    n = len(wanted)
    phys = list(range(1, n + 1))
    rng.shuffle(phys)
    swa = list(range(1, n + 1))
    rng.shuffle(swa)
    full_loc: dict[int, dict[int, int]] = {}
    for (rid, lp), fp in zip(wanted, phys):
        full_loc.setdefault(rid, {})[lp] = fp
    max_seq = max(rq.seq for reqs in sets for rq in reqs)
    max_ctx = -(-max_seq // SWA_PAGE) * SWA_PAGE
    offs = torch.arange(SWA_PAGE, dtype=torch.int64)
    rows = torch.tensor([rid for rid, _ in wanted], dtype=torch.int64)
    lps = torch.tensor([lp for _, lp in wanted], dtype=torch.int64)
    fps = torch.tensor(phys, dtype=torch.int64)
    cols = (lps[:, None] * SWA_PAGE + offs).reshape(-1)
    vals = (fps[:, None] * SWA_PAGE + offs).reshape(-1)
    r2t = torch.zeros((slots + 1, max_ctx), dtype=torch.int32, device=device)
    r2t[rows.repeat_interleave(SWA_PAGE).to(device), cols.to(device)] = vals.to(torch.int32).to(device)
    f2s = torch.zeros((n + 1) * SWA_PAGE + SWA_PAGE + 1, dtype=torch.int64)
    f2s[-1] = -1
    f2s[vals] = (torch.tensor(swa, dtype=torch.int64)[:, None] * SWA_PAGE + offs).reshape(-1)
    return World(spec, device, sets, r2t, f2s.to(device), full_loc, n + 1, n, slots, max_ctx)


_FREQ: dict[tuple[str, int], torch.Tensor] = {}


def freq_cis(device: torch.device, max_pos: int) -> torch.Tensor:
    """The RoPE table (complex64 [max_pos, 32]); the package's V4 table when available."""
    max_pos = max(max_pos, 65536 + SWA_PAGE) if device.type != "cpu" else max_pos
    key = (str(device), max_pos)
    if key not in _FREQ:
        if _freq_table is not None:
            t = _freq_table(max_pos)
        else:
            inv = 160000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
            ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv
            t = torch.polar(torch.ones_like(ang), ang).to(torch.complex64)
        _FREQ.clear()
        _FREQ[key] = t.to(device)
    return _FREQ[key]


# ----------------------------------------------------------------------------- per-layer tensors


@dataclass
class InputSet:
    """One rotating input set of a (case, layer): everything a call needs except the shared pools."""

    reqs: list[Request]
    plan: CompressorDecodePlan | CompressorPrefillPlan
    inp: torch.Tensor
    out: torch.Tensor  # compress_forward's output (preallocated)
    kv: torch.Tensor  # random rows for the standalone store
    out_loc: torch.Tensor
    plan_rows: int
    plan_w_rows: int


@dataclass
class Bundle:
    world: World
    layer: Layer
    state: torch.Tensor  # the engine's view of the pool
    ape: torch.Tensor
    norm_weight: torch.Tensor
    freq_cis: torch.Tensor
    sets: list[InputSet] = field(default_factory=list)

    def cache(self, store: Store) -> torch.Tensor:
        """A compressed KV cache covering every compressed slot of the world's full pages."""
        slots = self.world.num_full_pages * SWA_PAGE // self.layer.ratio
        pages = -(-slots // store.page_size)
        return torch.zeros((pages, store.fmt.page_bytes(store.page_size)), dtype=torch.uint8, device=self.world.device)


def _randn(shape: tuple[int, ...], gen: torch.Generator, device: torch.device, std: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).mul_(std)


def _state_pool(world: World, layer: Layer, gen: torch.Generator) -> torch.Tensor:
    dev, w = world.device, layer.state_width
    if layer.online:
        rows = world.slots + 1 + 2
        st = torch.empty((rows, w), dtype=torch.float32, device=dev)
        h = layer.head_dim
        st[:, :h] = _randn((rows, h), gen, dev)  # running max
        st[:, h : 2 * h] = _randn((rows, h), gen, dev).abs_().add_(1.0)  # running sum > 0
        st[:, 2 * h :] = _randn((rows, h), gen, dev)  # running mean
        return st.view(rows, 1, w)
    size = world.num_swa_pages * layer.ring if layer.paged else (world.slots + 1) * layer.ring
    rows = -(-(size + layer.ring + 1) // layer.ratio) * layer.ratio
    st = _randn((rows, w), gen, dev)
    st[:, w // 2 :].mul_(2.0)  # scores a little wider than kv, as in the simulator
    st[-1, : w // 2] = 0  # the pool's cleared sentinel row
    st[-1, w // 2 :] = float("-inf")
    return st.view(rows // layer.ratio, layer.ratio, w)


def build_bundle(world: World, layer: Layer, seed: int, in_dtype: torch.dtype = torch.float32) -> Bundle:
    """The pools and input sets of one (case, layer). ``in_dtype``: the dtype of the input rows,
    ``ape`` and the compressed rows (``--in-dtype``; the state pool stays fp32, as the engine's)."""
    dev = world.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    h, r = layer.head_dim, layer.ratio
    b = Bundle(
        world, layer, _state_pool(world, layer, gen),
        ape=_randn((8 if r == 4 else 128, h), gen, dev, 0.5).to(in_dtype),
        norm_weight=_randn((h,), gen, dev, 0.1).add_(1.0),
        freq_cis=freq_cis(dev, world.max_ctx),
    )
    r2t, f2s = world.req_to_token, world.full_to_state
    for reqs in world.sets:
        rpi = torch.tensor([q.rid for q in reqs], dtype=torch.int64, device=dev)
        seq_h = torch.tensor([q.seq for q in reqs], dtype=torch.int64)
        if world.spec.is_decode:
            seq = seq_h.to(dev)
            if layer.online:
                plan = CompressorDecodePlan.generate_online(seq, rpi, r2t)
            else:
                plan = CompressorDecodePlan.generate(r, rpi, r2t, f2s, seq, SWA_PAGE, layer.ring)
            locs = [world.loc(q.rid, q.seq - 1) // r if q.seq % r == 0 else 0 for q in reqs]
            n_tok = len(reqs)
        else:
            ext_h = torch.tensor([q.ext for q in reqs], dtype=torch.int64)
            n_tok = int(ext_h.sum())
            if layer.online:
                plan = CompressorPrefillPlan.generate_online(seq_h, ext_h, rpi, r2t, n_tok)
            else:
                plan = CompressorPrefillPlan.generate(r, rpi, seq_h, ext_h, r2t, f2s, SWA_PAGE, layer.ring, n_tok)
            locs = [world.loc(q.rid, p) // r if (p + 1) % r == 0 else 0 for q in reqs for p in range(q.prefix, q.seq)]
        rows = plan[1].shape[0]
        inp = _randn((n_tok, layer.in_width), gen, dev)
        inp[:, layer.in_width // 2 :].mul_(2.0)
        b.sets.append(InputSet(
            reqs, plan, inp.to(in_dtype),
            out=torch.empty((rows, h), dtype=in_dtype, device=dev),
            kv=_randn((rows, h), gen, dev).to(in_dtype),
            out_loc=torch.tensor(locs, dtype=torch.int64, device=dev),
            plan_rows=rows, plan_w_rows=0 if plan.is_decode else plan[2].shape[0],
        ))
    return b


def n_sets_for(spec: CaseSpec, device: torch.device, requested: int) -> int:
    """Rotating input sets: ``requested`` for decode, at most 2 for prefill (they are large), 1 on CPU."""
    if device.type == "cpu":
        return 1
    return max(1, requested if spec.is_decode else min(requested, 2))


# ----------------------------------------------------------------------------- byte model


def _events(r: int, prefix: int, seq: int) -> range:
    """Window-closing positions p in [prefix, seq): (p + 1) % r == 0."""
    first = -(-(prefix + 1) // r) * r - 1
    return range(first, seq, r)


def _state_parts_read(r: int, prefix: int, seq: int) -> int:
    """Distinct (position < prefix, part) pairs the windows closing in [prefix, seq) pool."""
    parts: set[tuple[int, int]] = set()
    for p in list(_events(r, prefix, seq))[:2]:  # only the first two windows can reach the prefix
        if r == 4:
            parts.update((q, 1) for q in range(max(0, p - 3), min(p + 1, prefix)))  # own halves
            parts.update((q, 0) for q in range(max(0, p - 7), min(p - 3, prefix)))  # overlap halves
        else:
            parts.update((q, 1) for q in range(max(0, p - r + 1), min(p + 1, prefix)))
    return len(parts)


def _page_tails(a: int, b: int) -> int:
    """Positions p in [a, b) with p % 256 >= 252 (the last 4 tokens of a page)."""
    def upto(n: int) -> int:
        return (n // SWA_PAGE) * 4 + max(0, n % SWA_PAGE - (SWA_PAGE - 4))
    return max(0, upto(b) - upto(a)) if b > a else 0


def _state_rows_written(layer: Layer, rq: Request, decode: bool) -> int:
    if decode:
        return 1
    r = layer.ratio
    last_c = (rq.seq // r) * r
    first_w = min(last_c - (r if r == 4 else 0), rq.seq - L.mtp_write_pad(r, layer.ring))
    kept = rq.seq - max(rq.prefix, first_w)
    if layer.paged:
        kept += _page_tails(rq.prefix, min(rq.seq, max(rq.prefix, first_w)))
    return kept


@dataclass(frozen=True)
class Bytes:
    """The byte model's terms for one call (see the module docstring)."""

    inp: int
    state_read: int
    state_write: int
    out: int
    ape: int
    plan: int
    events: int  # compressed rows that get stored
    rows: int  # plan rows
    kv_bytes: int = 4  # bytes per element of a compressed row (compress_forward's out, the store's kv)


def compress_bytes(layer: Layer, s: InputSet, decode: bool) -> Bytes:
    h, r = layer.head_dim, layer.ratio
    # element sizes of the input rows and ape, and of the out rows (the state is fp32); an input
    # set without tensors (the byte-model tests) counts fp32
    ie = s.inp.element_size() if s.inp is not None else 4
    oe = s.out.element_size() if s.out is not None else 4
    inp = state_r = state_w = events = 0
    ape_rows: set[int] = set()
    for q in s.reqs:
        inp += q.ext * layer.in_width * ie
        ev = len(_events(r, q.prefix, q.seq))
        events += ev
        if layer.online:
            state_r += layer.state_width * 4 if q.prefix % r else 0
            state_w += layer.state_width * 4 if q.seq % r else 0
            if len(ape_rows) < r:
                ape_rows.update(p % r for p in range(q.prefix, min(q.seq, q.prefix + r)))
        else:
            state_r += _state_parts_read(r, q.prefix, q.seq) * 2 * h * 4
            state_w += _state_rows_written(layer, q, decode) * layer.state_width * 4
    ape = len(ape_rows) * h * ie if layer.online else ((8 if r == 4 else 128) * h * ie if events else 0)
    plan = s.plan_rows * L.PLAN_ROW_BYTES
    if not decode:
        plan += s.plan_w_rows * (L.PLAN_ROW_BYTES if layer.online else L.WRITE_ROW_BYTES)
    return Bytes(inp, state_r, state_w, s.plan_rows * h * oe, ape, plan, events, s.plan_rows, oe)


def compress_total(b: Bytes) -> int:
    return b.inp + b.state_read + b.state_write + b.out + b.ape + b.plan


def store_total(layer: Layer, store: Store, b: Bytes) -> int:
    per_row = layer.head_dim * b.kv_bytes + FREQ_ROW_BYTES + OUT_LOC_BYTES + store.fmt.bytes_per_token
    return b.rows * L.PLAN_ROW_BYTES + b.events * per_row + layer.head_dim * 4  # + the fp32 norm weight


def pipeline_total(layer: Layer, store: Store, b: Bytes) -> int:
    """compress + store without the intermediate rows (their write and read) and the second plan read."""
    return (compress_total(b) - b.out) + (store_total(layer, store, b) - b.events * layer.head_dim * b.kv_bytes
                                          - b.rows * L.PLAN_ROW_BYTES)


def mean_bytes(values: Sequence[int]) -> float:
    return sum(values) / max(1, len(values))


# ----------------------------------------------------------------------------- timing


class Timer:
    """Cold (L2 flushed) and CUDA-graph timing on CUDA; wall time on the CPU."""

    def __init__(self, device: torch.device, reps: int, graph_replays: int, measure_copy: bool = True):
        self.device = device
        self.cuda = device.type == "cuda"
        self.reps = reps
        self.graph_replays = graph_replays
        self.spin_per_us = 0.0
        if self.cuda:
            self.flush_buf = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=device)
            self.spin_per_us = self._calibrate_spin()
        self.copy_gbps = self._copy_bandwidth() if measure_copy else float("nan")

    # -- helpers
    def _calibrate_spin(self) -> float:
        """Cycles of ``torch.cuda._sleep`` per microsecond (0 when it is unavailable)."""
        if not hasattr(torch.cuda, "_sleep"):
            return 0.0
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)
        start.record()
        torch.cuda._sleep(2_000_000)
        end.record()
        end.synchronize()
        return 2_000_000 / max(start.elapsed_time(end) * 1e3, 1.0)

    def spin(self, us: float) -> None:
        if self.spin_per_us:
            torch.cuda._sleep(int(us * self.spin_per_us))

    def _copy_bandwidth(self) -> float:
        n = COPY_BYTES_GPU if self.cuda else COPY_BYTES_CPU
        src = torch.empty(n // 4, dtype=torch.float32, device=self.device).uniform_()
        dst = torch.empty_like(src)
        us, _ = self.cold([lambda: dst.copy_(src)], reps=5)
        del src, dst
        return 2 * n / (us * 1e-6) / 1e9

    # -- cold
    def clean(self, calls: Sequence[Callable[[], object]], reps: int | None = None) -> tuple[float, bool]:
        """As :meth:`cold`, but L2 is flushed by reading 512 MiB (no dirty lines left to write back)."""
        return self.cold(calls, reps, read_flush=True)

    def _read_flush(self) -> None:
        if getattr(self, "clean_buf", None) is None:
            self.clean_buf = torch.ones(CLEAN_BYTES // 4, dtype=torch.float32, device=self.device)
            self.clean_out = torch.empty((), dtype=torch.float32, device=self.device)
        torch.sum(self.clean_buf, dim=0, out=self.clean_out)

    def cold(self, calls: Sequence[Callable[[], object]], reps: int | None = None,
             read_flush: bool = False) -> tuple[float, bool]:
        """(median µs, host stayed ahead).  Call j runs ``calls[j % len(calls)]``."""
        reps = reps or self.reps
        for c in calls:  # warm-up: JIT loads, allocator
            c()
        if not self.cuda:
            times = []
            for j in range(reps):
                t0 = time.perf_counter()
                calls[j % len(calls)]()
                times.append((time.perf_counter() - t0) * 1e6)
            return statistics.median(times), True
        if read_flush:
            self._read_flush()  # allocates the read buffer once, outside the queue below
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        self.spin(3000)  # a head start for the host
        for j in range(reps):
            if read_flush:
                self._read_flush()
            else:
                self.flush_buf.zero_()
            self.spin(10)
            starts[j].record()
            calls[j % len(calls)]()
            ends[j].record()
        ahead = not ends[-1].query()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
        return statistics.median(times), ahead

    # -- graph
    def graph(self, calls: Sequence[Callable[[], object]]) -> tuple[float | None, str]:
        """(µs per call, error): GRAPH_CALLS calls captured in one graph, replayed."""
        if not self.cuda:
            return None, "cpu"
        seq = [calls[i % len(calls)] for i in range(GRAPH_CALLS)]
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for c in calls:
                    c()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for c in seq:
                    c()
            g.replay()
            torch.cuda.synchronize()
        except Exception as exc:  # a backend path that syncs cannot be captured
            try:
                torch.cuda.synchronize()
            except Exception:
                pass
            return None, short_error(exc)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(self.graph_replays):
            g.replay()
        end.record()
        end.synchronize()
        del g
        return start.elapsed_time(end) * 1e3 / (self.graph_replays * GRAPH_CALLS), ""


def short_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160] if text else ''}"


def measure(timer: Timer, calls: Sequence[Callable[[], object]]) -> tuple[float | None, bool, float | None, str]:
    """(cold µs, host stayed ahead, graph µs, error note); a failing call leaves the row empty."""
    try:
        cold, ahead = timer.cold(calls)
    except Exception as exc:
        try:
            if timer.cuda:
                torch.cuda.synchronize()
        except Exception:
            pass
        return None, True, None, f"call failed ({short_error(exc)})"
    graph, err = timer.graph(calls)
    return cold, ahead, graph, (f"graph capture failed ({err})" if err and timer.cuda else "")


@dataclass
class Timing:
    """One side's measurement of a row: cold, clean (read flush) and graph µs."""

    cold: float | None = None
    ahead: bool = True
    clean: float | None = None
    graph: float | None = None
    err: str = ""


def measure_all(timer: Timer, calls: Sequence[Callable[[], object]]) -> Timing:
    """cold + graph (as :func:`measure`) and the clean column (CUDA only)."""
    cold, ahead, graph, err = measure(timer, calls)
    t = Timing(cold, ahead, None, graph, err)
    if cold is not None and timer.cuda:
        try:
            t.clean, _ = timer.clean(calls)
        except Exception as exc:
            t.err = t.err or f"clean timing failed ({short_error(exc)})"
    return t


class PeerSide:
    """The ``--peer`` side of a benchmark: SGLang's kernels through ``_peer``, each '-' reason noted once."""

    def __init__(self, device: torch.device, notes: list[str]):
        import _peer

        self.mod = _peer
        self.peer = _peer.get_peer(device)
        self.notes = notes
        self._seen: set[str] = {self.peer.reason} if self.peer.reason else set()  # the header says that one

    def note(self, reason: str) -> None:
        if reason not in self._seen:
            self._seen.add(reason)
            self.notes.append(f"peer: - ({reason})")

    def prewarm(self) -> None:
        """Build the benchmark's peer modules up front, in parallel (build mode)."""
        if self.peer.available:
            for err in self.peer.prewarm(self.mod.bench_specs(self.peer)):
                self.note(err)

    def time(self, timer: Timer, make_calls: Callable[[], Sequence[Callable[[], object]]],
             label: str) -> tuple[Timing | None, Sequence[Callable[[], object]]]:
        """(timing, calls) of the peer's calls for one row; (None, []) and a note (once) when the
        peer op is unavailable."""
        if not self.peer.available:
            return None, []
        try:
            calls = make_calls()
        except self.mod.PeerUnavailable as exc:
            self.note(str(exc))
            return None, []
        except Exception as exc:  # a shape/dtype the peer rejects at construction
            self.note(f"{label}: {short_error(exc)}")
            return None, []
        t = measure_all(timer, calls)
        if t.err:
            self.notes.append(f"{label} peer: {t.err}")
        return t, (calls if t.cold is not None else [])


# ----------------------------------------------------------------------------- targets


@dataclass(frozen=True)
class Target:
    """The peer's number and our target from the issue tables."""

    peer: str
    cold_max: float | None = None
    graph_max: float | None = None
    pct_min: float | None = None

    def text(self) -> str:
        parts = []
        if self.cold_max is not None or self.graph_max is not None:
            c = "-" if self.cold_max is None else f"{self.cold_max:g}"
            g = "" if self.graph_max is None else f" / {self.graph_max:g}"
            parts.append(f"<= {c}{g}")
        if self.pct_min is not None:
            parts.append(f">= {self.pct_min:g}%")
        return ", ".join(parts) or "-"

    def verdict(self, cold: float | None, graph: float | None, pct: float | None) -> str:
        checks = [(self.cold_max, cold, lambda t, v: v <= t), (self.graph_max, graph, lambda t, v: v <= t),
                  (self.pct_min, pct, lambda t, v: v >= t)]
        seen = [(ok(t, v) if v is not None else None) for t, v, ok in checks if t is not None]
        if not seen:
            return ""
        if any(s is False for s in seen):
            return "MISS"
        return "PASS" if all(s is True for s in seen) else "?"


# ----------------------------------------------------------------------------- reporting


COLUMNS = ["case", "layer", "cold us", "graph us", "min MB", "GB/s", "% copy", "peer", "target", "ok"]


def fmt_us(v: float | None, flag: str = "") -> str:
    return "-" if v is None else f"{v:.2f}{flag}"


def _sig(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if abs(v) >= 10 ** (digits - 1) else f"{v:.{digits}g}"


def result_row(timer: Timer, case: str, layer: str, cold: float | None, ahead: bool, graph: float | None,
               nbytes: float, target: Target | None, extra: Sequence[str] = (), tail: Sequence[str] = (),
               show_target: bool = True) -> list[str]:
    """One table row: ``case, layer, *extra, cold, graph, min MB, GB/s, % copy, peer, target, ok, *tail``."""
    gbps = nbytes / (cold * 1e-6) / 1e9 if cold else None
    pct = 100 * gbps / timer.copy_gbps if gbps else None
    if target is None or not show_target:
        verdict = ""
    else:
        verdict = target.verdict(cold, graph, pct) if timer.cuda else "-"
    return [case, layer, *extra, fmt_us(cold, "" if ahead else "!"), fmt_us(graph), f"{nbytes / 1e6:.3f}",
            _sig(gbps), _sig(pct), target.peer if target else "-",
            target.text() if (target and show_target) else "-", verdict, *tail]


PEER_COLUMNS = ["case", "layer", "cold us", "clean us", "graph us", "peer cold", "peer clean", "peer graph",
                "fc/peer cold", "fc/peer clean", "fc/peer graph", "min MB", "GB/s", "% copy", "peer % copy",
                "% copy clean", "peer % copy clean", "issue peer", "target", "ok", "vs peer"]


def peer_delta(fc_call: Callable[[], object], peer_call: Callable[[], object], written: Sequence[torch.Tensor],
               state: Sequence[torch.Tensor] = ()) -> str:
    """How far the peer's result is from ours on the same inputs (the ``vs peer`` column).

    Both calls start from the same ``state`` (restored from a snapshot) and zeroed ``written``
    tensors; afterwards ``written`` and ``state`` are compared: float tensors by the largest
    absolute difference (``d=...``), byte tensors (caches) by the number of differing bytes
    (``NB``; fp8 / fp4 codes may differ by a rounding step where the fp32 inputs differ).
    ``state`` is left as the snapshot was.
    """
    try:
        snaps = [t.clone() for t in state]

        def run(call: Callable[[], object]) -> list[torch.Tensor]:
            for t, snap in zip(state, snaps):
                t.copy_(snap)
            for t in written:
                t.zero_()
            call()
            return [t.clone() for t in (*written, *state)]

        mine, theirs = run(fc_call), run(peer_call)
        for t, snap in zip(state, snaps):
            t.copy_(snap)
        parts, fmax = [], None
        for a, b in zip(mine, theirs):
            if a.dtype == torch.uint8:
                parts.append(f"{int((a != b).sum())}B")
            else:
                a, b = a.float(), b.float()
                # equal values (equal infinities included) differ by 0; a NaN on one side only by inf
                d = torch.where((a == b) | (a.isnan() & b.isnan()), 0.0, (a - b).abs().nan_to_num(nan=float("inf")))
                fmax = max(fmax or 0.0, float(d.max()) if d.numel() else 0.0)
        if fmax is not None:
            parts.insert(0, f"d={fmax:.1e}")
        return " ".join(parts)
    except Exception as exc:
        return f"failed ({short_error(exc)[:60]})"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def peer_result_row(timer: Timer, case: str, layer: str, fc: Timing, pe: Timing | None, nbytes: float,
                    target: Target | None, extra: Sequence[str] = (), tail: Sequence[str] = (),
                    show_target: bool = True, delta: str = "-") -> list[str]:
    """One ``--peer`` row: ``case, layer, *extra``, both sides' cold / clean / graph, fc/peer, bytes, GB/s,
    % copy of each side from the cold and from the clean time, the issue's peer figure, target, ok,
    ``vs peer`` (:func:`peer_delta`), ``*tail`` (GB/s from the fc cold time)."""
    pe = pe or Timing()

    def pct_of(us: float | None) -> float | None:
        return 100 * nbytes / (us * 1e-6) / 1e9 / timer.copy_gbps if us else None

    gbps = nbytes / (fc.cold * 1e-6) / 1e9 if fc.cold else None
    pct, ppct = pct_of(fc.cold), pct_of(pe.cold)
    verdict = (target.verdict(fc.cold, fc.graph, pct) if timer.cuda else "-") if (target and show_target) else ""
    return [case, layer, *extra, fmt_us(fc.cold, "" if fc.ahead else "!"), fmt_us(fc.clean), fmt_us(fc.graph),
            fmt_us(pe.cold, "" if pe.ahead else "!"), fmt_us(pe.clean), fmt_us(pe.graph),
            _ratio(fc.cold, pe.cold), _ratio(fc.clean, pe.clean), _ratio(fc.graph, pe.graph),
            f"{nbytes / 1e6:.3f}", _sig(gbps), _sig(pct), _sig(ppct), _sig(pct_of(fc.clean)),
            _sig(pct_of(pe.clean)), target.peer if target else "-",
            target.text() if (target and show_target) else "-", verdict, delta, *tail]


def print_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]
    left = {0, 1} | ({2} if columns[2] == "path" else set())
    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    text = "\n".join([line(columns), line(["-" * w for w in widths]), *(line(r) for r in rows)])
    print(text, flush=True)
    return text


def git_commit() -> str:
    """HEAD's short hash; FC_COMMIT names it where the tree is a copy without .git (a lent GPU)."""
    if os.environ.get("FC_COMMIT"):
        return os.environ["FC_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=_REPO, capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({os.cpu_count()} cores)"


def header(script: str, timer: Timer, args: argparse.Namespace) -> list[str]:
    from flashcompress.jit.settings import jit_enabled_for

    backend = "jit" if jit_enabled_for(timer.device) else "torch"
    lines = [
        f"{script}: {device_name(timer.device)}, torch {torch.__version__}, commit {git_commit()}, "
        f"{_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"backend {backend}; copy {timer.copy_gbps:.0f} GB/s "
        f"(read + write, {'1 GiB' if timer.cuda else '32 MiB'}, cold); "
        f"cold = median of {args.reps}" + (f" (L2 flushed), graph = {GRAPH_CALLS} calls x {args.graph_replays} replays"
                                           if timer.cuda else " wall times (CPU smoke run)")
        + f"; rotating input sets: {args.sets} per decode case, {min(args.sets, 2)} per prefill case",
    ]
    if getattr(args, "tilings", [None]) != [None]:
        lines.append(f"compress tilings side by side: {', '.join(args.tilings)} (--tiling; rows of all but the first "
                     "marked [tiling])")
    if os.environ.get("FLASHCOMPRESS_DEBUG", "").lower() in ("1", "true", "yes", "on"):
        lines.append("WARNING: FLASHCOMPRESS_DEBUG is set: value checks synchronise; timings are not meaningful")
    return lines


def write_markdown(path: str, title: str, head: Sequence[str], columns: Sequence[str], rows: Sequence[Sequence[str]],
                   notes: Sequence[str] = ()) -> None:
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"### {title}\n\n")
        for h in head:
            f.write(f"{h}  \n")
        f.write("\n| " + " | ".join(columns) + " |\n")
        f.write("|" + "|".join(" --- " for _ in columns) + "|\n")
        for r in rows:
            f.write("| " + " | ".join(esc(c) for c in r) + " |\n")
        for n in notes:
            f.write(f"\n{n}\n")
        f.write("\n")


def parse_args(doc: str, argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--short", action="store_true", help=f"only the cases {', '.join(SHORT_CASES)}")
    p.add_argument("--cases", default="", help="comma list of substrings / globs of 'case', 'layer' or 'case:layer'")
    p.add_argument("--md", default=None, metavar="PATH", help="append the table as markdown to PATH")
    p.add_argument("--reps", type=int, default=None, help="cold calls per case (default 30 on CUDA, 3 on CPU)")
    p.add_argument("--graph-replays", type=int, default=10, help="replays of the 20-call graph")
    p.add_argument("--sets", type=int, default=4, help="rotating input sets per decode case (prefill: at most 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peer", action="store_true",
                   help="also time SGLang's kernels on the same buffers (benchmarks/_peer.py: the SGLang wheel on "
                        "PYTHONPATH or FC_PEER_SGLANG); adds clean, peer and fc/peer columns")
    p.add_argument("--in-dtype", choices=("f32", "bf16"), default="f32",
                   help="dtype of the input rows, ape and compressed rows (the state pool stays fp32); bf16 "
                        "skips the online layer (fp32 only) and marks the rows' layer 'bf16'")
    p.add_argument("--tiling", default="",
                   help="comma list of compress variant tilings (auto, whole_row, closing) timed side by "
                        "side in this run; rows of a tiling other than the first are marked [name] (unset: the "
                        "default tiling)")
    args = p.parse_args(argv)
    args.tilings = [t.strip() for t in args.tiling.split(",") if t.strip()] or [None]
    args.in_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.in_dtype]
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA GPU (use --device cpu for the smoke run)")
    if args.reps is None:
        args.reps = 30 if args.device == "cuda" else 3
    if args.device == "cpu":
        args.sets = 1
        torch.set_num_threads(1)  # a smoke run; one thread avoids oversubscription when run next to others
    args.filters = [f.strip() for f in args.cases.split(",") if f.strip()]
    return args


def dtype_label(label: str, in_dtype: torch.dtype) -> str:
    """A row's layer label under ``--in-dtype``: unchanged for fp32, ``label bf16`` otherwise."""
    return label if in_dtype == torch.float32 else f"{label} bf16"


def skips_dtype(layer: Layer, in_dtype: torch.dtype) -> bool:
    """The online layer compresses fp32 input only: no bf16 rows for it."""
    return layer.online and in_dtype != torch.float32


def use_tiling(tiling: str | None, device: torch.device) -> None:
    """``--tiling``: the public ops run the CUDA compress kernels of ``tiling`` from now on
    (``cuda_ops.compress.set_tiling``, followed by the eager fast path); None: leave it as it is."""
    if tiling is None or device.type != "cuda":
        return
    from flashcompress.cuda_ops import compress as _cc

    _cc.set_tiling(tiling)


def tiling_label(label: str, tiling: str | None, tilings: Sequence[str | None]) -> str:
    """``label`` for rows of ``tiling``: unchanged for the first of ``tilings``, else ``label [tiling]``."""
    return label if tiling == tilings[0] else f"{label} [{tiling}]"


def run_cases(cases: Sequence[CaseSpec], bench_case: Callable[[CaseSpec], None], notes: list[str],
              device: torch.device) -> None:
    """Run every case; one that fails (build or call) leaves a note instead of ending the run."""
    for spec in cases:
        try:
            bench_case(spec)
        except Exception as exc:
            notes.append(f"{spec.name}: failed ({short_error(exc)})")
            print(f"  {spec.name}: failed ({short_error(exc)})", file=sys.stderr, flush=True)
        release(device)


def finish(args: argparse.Namespace, title: str, head: Sequence[str], columns: Sequence[str],
           rows: Sequence[Sequence[str]], notes: Sequence[str]) -> int:
    print()
    print_table(columns, rows)
    for n in notes:
        print(n)
    if args.md:
        write_markdown(args.md, title, head, columns, rows, notes)
    return 0


def release(device: torch.device) -> None:
    if device.type == "cuda":
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception:  # a sticky CUDA error: the next case reports it
            pass


def seed_of(*names: str, base: int = 0) -> int:
    """A stable per-case seed (Python's hash() is salted per process)."""
    h = base
    for n in names:
        for ch in n:
            h = (h * 131 + ord(ch)) % (2**31 - 1)
    return h
