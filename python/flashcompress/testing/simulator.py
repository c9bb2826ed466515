"""An engine simulator for the compressor API, checked against the float64 model.

It plays the part of a serving engine around one layer's compressors:

* a **world**: request slots (``req_to_token`` int32 ``[slots, L]``; slot 0 is the
  CUDA-graph padding slot), requests owning whole 256-token full pages in shuffled
  physical order (full page 0 is the allocator's dummy page), and ``full_to_state``
  mapping every full page to its own shuffled SWA page (int64, length
  ``full_size + 256 + 1``, last element -1), ``swa_page_size`` 256;
* per compressor a **state pool** sized as the engine sizes it (``spec/compressor.md``
  §2.1), poisoned with NaN (``Scenario.state_fill``) except the cleared last row (the clearing
  convention, which ``Scenario.clear_rows=False`` skips), and a **compressed KV cache**
  (uint8 ``[pages, page_bytes]``, page 64 for ratio 4, 2 for ratio 128, or 1024-byte
  bf16 rows with page 1) filled with a poison byte;
* a **schedule**: every request's sequence split at random into prefill chunks, decode
  steps and (with the speculative ring sizes) target-verify extends that are partly
  rolled back; steps batch several requests, prefill chunks may be mixed with
  one-token extends, decode batches may carry CUDA-graph padding rows, prefill plans
  may be padded for CUDA graphs;
* per step the engine's call order: plan -> ``compress_forward`` ->
  ``compress_norm_rope_store`` for every compressor of the layer (ratio 4: the main
  KV compressor and the indexer's share one plan).

Afterwards every ``compress_forward`` output row of an accepted compression event is
compared with the float64 pooled vector of :mod:`flashcompress.testing.oracle`, rows without an
event must be zeros, the set of events in the plans must be exactly the expected one,
every compressed entry in the final caches is compared byte by byte (ties allowed)
with the model, and every cache byte outside the entries must still hold the poison.

Everything is deterministic given the seed.  Requests always start at position 0
(no radix-cache prefix hits: see ``spec/compressor.md`` §10.11).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import random

import torch

from flashcompress import layouts as L
from flashcompress.testing import oracle

__all__ = [
    "CompressorSpec",
    "Scenario",
    "OutputMismatch",
    "CompressorReport",
    "SimResult",
    "Simulator",
    "simulate",
    "MAIN",
    "MAIN_BF16",
    "INDEXER_FP8",
    "INDEXER_FP4",
]

SWA_PAGE = 256
POISON_BYTE = 0x5A
NORM_EPS = 1e-6

_FORMATS = {
    "v4": L.MAIN_V4,
    "bf16": L.BF16_ROWS,
    "idx_fp8": L.INDEXER_FP8,
    "idx_fp4": L.INDEXER_FP4,
}


@dataclass(frozen=True)
class CompressorSpec:
    """One compressor of the layer: its head dim and the cache format it stores."""

    name: str
    head_dim: int
    fmt: str  # "v4" | "bf16" | "idx_fp8" | "idx_fp4"

    @property
    def cache_format(self) -> L.CacheFormat:
        return _FORMATS[self.fmt]


MAIN = CompressorSpec("main", 512, "v4")
MAIN_BF16 = CompressorSpec("main-bf16", 512, "bf16")
INDEXER_FP8 = CompressorSpec("indexer", 128, "idx_fp8")
INDEXER_FP4 = CompressorSpec("indexer-fp4", 128, "idx_fp4")


@dataclass(frozen=True)
class Scenario:
    """What to simulate.

    ``ring_size`` defaults to 8 (ratio 4), 128 (ratio 128) or 1 (online).  Ring sizes
    16 / 256 are the speculative ones: their prefill plans keep the MTP write pad, and
    the schedule then also contains target-verify extends that are partly rejected
    (``verify_prob``).  ``use_req_ring`` selects request-ring addressing for ratio 4
    (ratio 128 always uses it).  ``num_slots`` request slots exist besides the padding
    slot 0; fewer slots than requests makes later requests reuse finished requests'
    slots (and their stale state rows).
    """

    ratio: int
    compressors: tuple[CompressorSpec, ...]
    online: bool = False
    ring_size: int | None = None
    use_req_ring: bool = False
    num_requests: int = 4
    min_len: int = 1
    max_len: int = 300
    max_decode: int = 24  # decode / verify tokens per request, at most
    num_slots: int | None = None
    state_dtype: torch.dtype = torch.float32
    verify_prob: float = 0.35
    graph_prob: float = 0.3  # CUDA-graph padding of extend plans / decode batches
    mixed_prob: float = 0.3  # decode-phase requests riding in an extend batch
    flat_state_prob: float = 0.3  # pass the state pool flat instead of the paged view
    out_prob: float = 0.3  # pass a NaN-filled ``out=`` to compress_forward
    fused: bool = False  # call compress_and_store instead of the two ops (no output rows to check)
    state_fill: float = float("nan")  # what a fresh state pool holds (torch.empty garbage, poisoned)
    clear_rows: bool = True  # the clearing convention: last row, and a fresh request-ring C4 slot's rows

    @property
    def ring(self) -> int:
        if self.ring_size is not None:
            return self.ring_size
        return 1 if self.online else (8 if self.ratio == 4 else 128)

    @property
    def speculative(self) -> bool:
        return not self.online and self.ring > L.window_size(self.ratio)

    @property
    def req_ring(self) -> bool:
        return self.ratio == 128 or self.use_req_ring

    def describe(self) -> str:
        kind = "online C128" if self.online else f"C{self.ratio}"
        mode = "request ring" if self.req_ring else "paged SWA"
        comps = ", ".join(f"{c.name} H{c.head_dim} {c.fmt}" for c in self.compressors)
        state = "" if self.state_dtype == torch.float32 else f", {str(self.state_dtype).split('.')[-1]} state"
        return f"{kind} ring {self.ring} ({mode}){state}: {comps}"


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


@dataclass
class OutputMismatch:
    """A compress_forward output row that disagrees with the model."""

    step: int
    request: int
    window: int  # -1 for a row that should be zeros
    column: int
    actual: float
    expected: float
    rel_err: float

    def describe(self) -> str:
        what = f"window {self.window}" if self.window >= 0 else "non-event row (must be 0)"
        return (
            f"step {self.step}, request {self.request}, {what}: first bad column {self.column}: "
            f"got {self.actual:.9g}, model {self.expected:.9g} (row error {self.rel_err:.3g} x RMS)"
        )


@dataclass
class CompressorReport:
    spec: CompressorSpec
    output_rows: int = 0  # event rows compared with the model
    max_rel_err: float = 0.0
    output_failures: list[OutputMismatch] = field(default_factory=list)
    zero_rows: int = 0  # rows that had to be zeros
    entries_stored: int = 0  # store events issued (rewrites after rollbacks included)
    entries_checked: int = 0  # distinct entries in the final cache compared with the model
    entry_failures: list[tuple[int, int, oracle.EntryCheck]] = field(default_factory=list)
    codes: int = 0
    ties: int = 0
    scale_ties: int = 0
    poison_failures: list[str] = field(default_factory=list)
    # every entry of the final cache: (request, window) -> (data bytes, scale bytes)
    stored: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, repr=False)
    # every compress_forward row of an event: (step, request, window, accepted, row)
    rows: list[tuple[int, int, int, bool, torch.Tensor]] = field(default_factory=list, repr=False)

    @property
    def code_mismatches(self) -> int:
        return sum(len(c.mismatches) for _, _, c in self.entry_failures)

    @property
    def ok(self) -> bool:
        return not (self.output_failures or self.entry_failures or self.poison_failures)

    def failures(self, limit: int = 3) -> list[str]:
        out = [f"[{self.spec.name}] output: " + m.describe() for m in self.output_failures[:limit]]
        for req, w, chk in self.entry_failures[:limit]:
            out.append(f"[{self.spec.name}] cache entry of request {req}, window {w} (position {w}*r): "
                       + chk.describe())
        out += [f"[{self.spec.name}] cache: {p}" for p in self.poison_failures[:limit]]
        return out


@dataclass
class SimResult:
    scenario: Scenario
    device: str
    backend: str
    seed: int
    steps: dict[str, int]
    events: dict[str, int]
    request_lengths: list[int]
    reports: list[CompressorReport]
    plan_failures: list[str]
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.plan_failures and all(r.ok for r in self.reports)

    def failures(self, limit: int = 3) -> list[str]:
        out = list(self.plan_failures[:limit])
        for r in self.reports:
            out += r.failures(limit)
        return out

    def summary(self) -> str:
        s = self.scenario
        lines = [
            f"{s.describe()}",
            f"  {len(self.request_lengths)} requests (lengths {self.request_lengths}); steps: "
            + ", ".join(f"{k} {v}" for k, v in self.steps.items()),
        ]
        for r in self.reports:
            lines.append(
                f"  {r.spec.name:12s} {r.entries_checked:5d} entries checked ({r.entries_stored} stores), "
                f"{r.output_rows} pooled rows, max pre-quant rel err {r.max_rel_err:.2e}, "
                f"code mismatches {r.code_mismatches} (tie flips {r.ties}, scale ties {r.scale_ties}), "
                f"{'ok' if r.ok else 'FAIL'}"
            )
        lines += ["  " + f for f in self.failures()]
        return "\n".join(lines)


# ---------------------------------------------------------------------------
# Schedule
# ---------------------------------------------------------------------------


class _Rng:
    """Seeded scheduling decisions (``integers`` excludes its upper bound)."""

    def __init__(self, seed: int):
        self._r = random.Random(seed)

    def random(self) -> float:
        return self._r.random()

    def integers(self, lo: int, hi: int) -> int:
        return self._r.randrange(lo, hi)

    def choice(self, seq):
        return self._r.choice(seq)

    def shuffle(self, seq: list) -> None:
        self._r.shuffle(seq)

    def permutation(self, seq) -> list:
        out = list(seq)
        self._r.shuffle(out)
        return out


def _request_actions(length: int, sc: Scenario, rng: _Rng) -> list[tuple]:
    """Split one request's sequence into actions:
    ("chunk", n) | ("decode",) | ("verify", extend, accepted)."""
    r = sc.ratio
    budget = int(rng.integers(0, sc.max_decode + 1))
    budget = min(budget, length - 1)
    prompt = length - budget
    boundaries = [b for b in range(r, length + 1, r)]
    if budget > 1 and boundaries and rng.random() < 0.6:
        # end the prompt shortly before a window boundary so that decode crosses it
        b = int(rng.choice(boundaries))
        prompt = max(1, b - int(rng.integers(1, budget + 1)))
    acts: list[tuple] = []
    pos = 0

    def chunk_size(pos: int, end: int) -> int:
        left = end - pos
        u = rng.random()
        if u < 0.25:
            n = left
        elif u < 0.55:
            grid = r if rng.random() < 0.6 else SWA_PAGE
            n = (pos // grid + 1) * grid - pos + int(rng.integers(-1, 2))
        elif u < 0.7:
            n = int(rng.integers(1, 4))
        else:
            n = int(rng.integers(1, left + 1))
        return int(min(max(n, 1), left))

    while pos < prompt:
        n = chunk_size(pos, prompt)
        acts.append(("chunk", n))
        pos += n
    while pos < length:
        left = length - pos
        u = rng.random()
        if budget <= 0:
            n = chunk_size(pos, length)
            acts.append(("chunk", n))
            pos += n
        elif sc.speculative and u < sc.verify_prob and left >= 2:
            e = int(rng.integers(2, min(4, left) + 1))
            k = int(rng.integers(1, e + 1))
            acts.append(("verify", e, k))
            pos += k
            budget -= 1
        elif u > 0.93 and left >= 2:
            n = chunk_size(pos, length)
            acts.append(("chunk", n))
            pos += n
        else:
            acts.append(("decode",))
            pos += 1
            budget -= 1
    return acts


@dataclass
class _Request:
    idx: int
    length: int
    arrival: int
    actions: list[tuple]
    pages: list[int]  # physical full pages, in position order
    rid: int = -1
    pos: int = 0
    next_action: int = 0

    def full_loc(self, p: int) -> int:
        return self.pages[p // SWA_PAGE] * SWA_PAGE + p % SWA_PAGE

    @property
    def done(self) -> bool:
        return self.pos >= self.length


@dataclass
class _Event:
    """A compression event produced by a step for one request."""

    request: int
    window: int
    accepted: bool


# ---------------------------------------------------------------------------
# The simulator
# ---------------------------------------------------------------------------


class Simulator:
    """Runs one :class:`Scenario` on ``device`` and checks it; see the module docstring."""

    def __init__(self, scenario: Scenario, *, device: str | torch.device = "cpu", seed: int = 0,
                 rel_tol: float = 1e-5, tie_eps: float = 4e-6):
        sc = scenario
        if sc.ratio not in L.SUPPORTED_RATIOS:
            raise ValueError(f"ratio must be 4 or 128, got {sc.ratio}")
        if sc.online and sc.ratio != 128:
            raise ValueError("online compression is ratio 128 only")
        if sc.online and sc.state_dtype != torch.float32:
            raise ValueError("online state must be fp32 for an exact comparison")
        self.sc = sc
        self.device = torch.device(device)
        self.seed = seed
        self.rel_tol = rel_tol
        self.tie_eps = tie_eps
        self.rng = _Rng(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self._build_world()
        self._build_compressors()
        self.steps = {"extend": 0, "decode": 0, "verify": 0}
        self.events = {"extend": 0, "decode": 0}  # compression events (first compressor), by step kind
        self.plan_failures: list[str] = []
        self.outputs: list[list[tuple[int, _Event, torch.Tensor]]] = [[] for _ in sc.compressors]
        self.zero_rows: list[list[tuple[int, int, torch.Tensor]]] = [[] for _ in sc.compressors]
        self.stores = [0 for _ in sc.compressors]

    # -- world -------------------------------------------------------------

    def _randn(self, *shape: int, std: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen, dtype=torch.float32) * std

    def _build_world(self) -> None:
        sc, rng = self.sc, self.rng
        lengths = [int(rng.integers(sc.min_len, sc.max_len + 1)) for _ in range(sc.num_requests)]
        npages = [math.ceil(n / SWA_PAGE) for n in lengths]
        total = sum(npages)
        phys = rng.permutation(range(1, total + 1))  # full page 0 is the dummy page
        self.num_full_pages = total + 1
        self.requests: list[_Request] = []
        k = 0
        arrival = 0
        for i, n in enumerate(lengths):
            self.requests.append(_Request(i, n, arrival, _request_actions(n, sc, rng),
                                          [int(p) for p in phys[k : k + npages[i]]]))
            k += npages[i]
            arrival += int(rng.integers(0, 3))
        self.num_slots = sc.num_slots or sc.num_requests
        self.free_rids = rng.permutation(range(1, self.num_slots + 1))
        max_ctx = max(npages) * SWA_PAGE
        self.req_to_token = torch.zeros((self.num_slots + 1, max_ctx), dtype=torch.int32, device=self.device)
        full_size = total * SWA_PAGE  # real full tokens (the dummy page is extra)
        f2s = torch.zeros(full_size + SWA_PAGE + 1, dtype=torch.int64)  # unmapped entries are 0
        swa_pages = rng.permutation(range(1, total + 1))
        for fp, sp in zip(range(1, total + 1), swa_pages):
            f2s[fp * SWA_PAGE : (fp + 1) * SWA_PAGE] = sp * SWA_PAGE + torch.arange(SWA_PAGE)
        f2s[-1] = -1
        self.num_swa_pages = total  # SWA page 0 is the padding page
        self.full_to_state = f2s.to(self.device)
        self.freq_cis = oracle.deepseek_v4_freq_cis(max_ctx).to(self.device)

    def _state_rows(self) -> int:
        sc = self.sc
        if sc.online:
            return self.num_slots + 1 + 2
        if sc.ratio == 4 and not sc.use_req_ring:
            size = self.num_swa_pages * sc.ring
        else:
            size = (self.num_slots + 1) * sc.ring
        rows = size + sc.ring + 1
        return -(-rows // sc.ratio) * sc.ratio

    def _build_compressors(self) -> None:
        sc = self.sc
        self.comp: list[dict] = []
        rows = self._state_rows()
        for spec in sc.compressors:
            h = spec.head_dim
            if h not in (L.ONLINE_HEAD_DIMS if sc.online else L.HEAD_DIMS[sc.ratio]):
                raise ValueError(f"head_dim {h} unsupported for this scenario")
            width = L.state_width(sc.ratio, h, sc.online)
            state = torch.full((rows, width), sc.state_fill, dtype=sc.state_dtype)
            if sc.clear_rows and not sc.online:  # the pool's cleared sentinel row: kv half 0, score half -inf
                state[-1, : width // 2] = 0
                state[-1, width // 2 :] = float("-inf")
            in_w = L.input_width(sc.ratio, h)
            ape = self._randn(8 if sc.ratio == 4 else 128, h, std=0.5)
            norm_w = 1 + 0.1 * self._randn(h)
            inputs = []
            for rq in self.requests:
                x = self._kv_score(rq.length, in_w)
                inputs.append(x)
            fmt = spec.cache_format
            slots = self.num_full_pages * SWA_PAGE // sc.ratio
            if spec.fmt == "bf16":
                page_size = 1
            else:
                page_size = 64 if sc.ratio == 4 else 2
            pages = -(-slots // page_size)
            cache = torch.full((pages, fmt.page_bytes(page_size)), POISON_BYTE, dtype=torch.uint8)
            self.comp.append(dict(
                spec=spec, state=state.to(self.device), ape=ape.to(self.device), norm_w=norm_w.to(self.device),
                ape_host=ape, norm_host=norm_w, inputs=inputs, page_size=page_size, cache=cache.to(self.device),
            ))

    def _kv_score(self, n: int, width: int) -> torch.Tensor:
        """kv ~ N(0,1), score ~ N(0,4); bf16-representable if the state pool is bf16."""
        half = width // 2
        x = torch.cat([self._randn(n, half), self._randn(n, half, std=2.0)], dim=1)
        if self.sc.state_dtype == torch.bfloat16:
            x = x.to(torch.bfloat16).to(torch.float32)
        return x

    # -- scheduling ----------------------------------------------------------

    def _admit(self, step: int) -> None:
        for rq in self.requests:
            if rq.rid < 0 and rq.arrival <= step and self.free_rids and not rq.done:
                rq.rid = self.free_rids.pop()
                row = torch.zeros(self.req_to_token.shape[1], dtype=torch.int32)
                locs = [rq.full_loc(p) for p in range(len(rq.pages) * SWA_PAGE)]
                row[: len(locs)] = torch.tensor(locs, dtype=torch.int32)
                self.req_to_token[rq.rid] = row.to(self.device)
                if self.sc.clear_rows and self.sc.ratio == 4 and self.sc.use_req_ring:
                    # the engine clears a fresh slot's C4 rows (kv 0, score -inf)
                    ring = self.sc.ring
                    for c in self.comp:
                        st = c["state"]
                        w = st.shape[1]
                        st[rq.rid * ring : (rq.rid + 1) * ring, : w // 2] = 0
                        st[rq.rid * ring : (rq.rid + 1) * ring, w // 2 :] = float("-inf")

    def run(self) -> SimResult:
        t0 = time.perf_counter()
        step = 0
        while not all(rq.done for rq in self.requests):
            self._admit(step)
            active = [rq for rq in self.requests if rq.rid >= 0 and not rq.done]
            if not active:
                step += 1
                continue
            dec = [rq for rq in active if rq.actions[rq.next_action][0] == "decode"]
            ext = [rq for rq in active if rq.actions[rq.next_action][0] != "decode"]
            kind = "decode" if dec and (not ext or self.rng.random() < 0.5) else "extend"
            if kind == "decode":
                batch = [rq for rq in dec if self.rng.random() < 0.8] or [dec[0]]
                self.rng.shuffle(batch)
                self._decode_step(step, batch)
            else:
                batch = [rq for rq in ext if self.rng.random() < 0.8] or [ext[0]]
                batch += [rq for rq in dec if self.rng.random() < self.sc.mixed_prob]
                self.rng.shuffle(batch)
                self._extend_step(step, batch)
            for rq in active:
                if rq.done and rq.rid >= 0:
                    self.free_rids.append(rq.rid)
                    self.free_rids = self.rng.permutation(self.free_rids)
                    rq.rid = -2  # finished
            step += 1
        return self._check(time.perf_counter() - t0)

    # -- one engine step -------------------------------------------------------

    def _state_arg(self, c: dict) -> torch.Tensor:
        st = c["state"]
        if self.rng.random() < self.sc.flat_state_prob:
            return st
        if self.sc.online:
            return st.view(-1, 1, st.shape[1])
        return st.view(-1, self.sc.ratio, st.shape[1])

    def _out_arg(self, rows: int, h: int) -> torch.Tensor | None:
        if self.rng.random() < self.sc.out_prob:
            return torch.full((rows, h), float("nan"), dtype=torch.float32, device=self.device)
        return None

    def _run_layer(self, step: int, plan, rows_in: list[torch.Tensor], out_loc: torch.Tensor,
                   events_of_row) -> None:
        """compress_forward + compress_norm_rope_store for every compressor, recording outputs."""
        from flashcompress import compress_and_store, compress_forward, compress_norm_rope_store

        sc = self.sc
        for ci, c in enumerate(self.comp):
            spec = c["spec"]
            x = torch.cat([r[ci] for r in rows_in], dim=0).to(self.device)
            n_rows = plan[1].shape[0]
            if sc.fused:
                compress_and_store(
                    self._state_arg(c), x, c["ape"], plan, head_dim=spec.head_dim, compress_ratio=sc.ratio,
                    norm_weight=c["norm_w"], norm_eps=NORM_EPS, freq_cis=self.freq_cis, out_loc=out_loc,
                    kvcache=c["cache"], page_size=c["page_size"], use_fp4=spec.fmt == "idx_fp4",
                    bf16_store=spec.fmt == "bf16", is_online=sc.online,
                )
                self.stores[ci] += sum(events_of_row(row) is not None for row in range(n_rows))
                continue
            out = compress_forward(
                self._state_arg(c), x, c["ape"], plan, head_dim=spec.head_dim, compress_ratio=sc.ratio,
                out=self._out_arg(n_rows, spec.head_dim), is_online=sc.online,
            )
            compress_norm_rope_store(
                out, plan, norm_weight=c["norm_w"], norm_eps=NORM_EPS, freq_cis=self.freq_cis,
                out_loc=out_loc, kvcache=c["cache"], page_size=c["page_size"],
                use_fp4=spec.fmt == "idx_fp4", bf16_store=spec.fmt == "bf16",
            )
            out_h = out.detach().to("cpu", torch.float32)
            for row in range(n_rows):
                ev = events_of_row(row)
                if ev is None:
                    self.zero_rows[ci].append((step, row, out_h[row]))
                else:
                    self.outputs[ci].append((step, ev, out_h[row]))
                    self.stores[ci] += 1
                    if ci == 0:
                        self.events["decode" if plan.is_decode else "extend"] += 1

    def _decode_step(self, step: int, batch: list[_Request]) -> None:
        from flashcompress import CompressorDecodePlan

        sc, r = self.sc, self.sc.ratio
        self.steps["decode"] += 1
        rids, seqs, locs, rows_in, events = [], [], [], [], []
        for rq in batch:
            p = rq.pos
            rids.append(rq.rid)
            seqs.append(p + 1)
            ev = (p + 1) % r == 0
            locs.append(rq.full_loc(p) // r if ev else 0)
            events.append(_Event(rq.idx, (p + 1) // r - 1, True) if ev else None)
            rows_in.append([c["inputs"][rq.idx][p : p + 1] for c in self.comp])
            rq.pos += 1
            rq.next_action += 1
        if self.rng.random() < sc.graph_prob:  # CUDA-graph padding rows: slot 0, seq_len 1
            for _ in range(int(self.rng.integers(1, 3))):
                rids.append(0)
                seqs.append(1)
                locs.append(0)
                events.append(None)
                rows_in.append([self._kv_score(1, L.input_width(r, c["spec"].head_dim)) for c in self.comp])
        dev = self.device
        rpi = torch.tensor(rids, dtype=torch.int64, device=dev)
        seq = torch.tensor(seqs, dtype=torch.int64, device=dev)
        if sc.online:
            plan = CompressorDecodePlan.generate_online(seq, rpi, self.req_to_token)
        else:
            plan = CompressorDecodePlan.generate(
                r, rpi, self.req_to_token, self.full_to_state, seq, SWA_PAGE, sc.ring,
                use_req_ring=sc.use_req_ring,
            )
        out_loc = torch.tensor(locs, dtype=torch.int64, device=dev)
        self._run_layer(step, plan, rows_in, out_loc, lambda row: events[row])

    def _extend_step(self, step: int, batch: list[_Request]) -> None:
        from flashcompress import CompressorPrefillPlan

        sc, r = self.sc, self.sc.ratio
        self.steps["extend"] += 1
        rids, seqs, exts, locs, rows_in = [], [], [], [], []
        ragged: list[tuple[_Request, int, bool]] = []  # ragged id -> (request, position, accepted)
        verify = False
        for rq in batch:
            act = rq.actions[rq.next_action]
            if act[0] == "chunk":
                e, k = act[1], act[1]
            elif act[0] == "verify":
                e, k = act[1], act[2]
                verify = True
            else:
                e, k = 1, 1
            p0 = rq.pos
            rids.append(rq.rid)
            seqs.append(p0 + e)
            exts.append(e)
            per_comp = []
            for c in self.comp:
                real = c["inputs"][rq.idx][p0 : p0 + k]
                if e > k:  # rejected draft tokens: different projections at those positions
                    junk = self._kv_score(e - k, real.shape[1])
                    real = torch.cat([real, junk], dim=0)
                per_comp.append(real)
            rows_in.append(per_comp)
            for j in range(e):
                p = p0 + j
                ragged.append((rq, p, j < k))
                locs.append(rq.full_loc(p) // r if (p + 1) % r == 0 else 0)
            rq.pos += k
            rq.next_action += 1
        if verify:
            self.steps["verify"] += 1
        n_real = len(locs)
        dev = self.device
        host_lengths = dev.type == "cpu" or sc.online or self.rng.random() < 0.5
        use_graph = bool(self.rng.random() < sc.graph_prob)
        num_q = n_real
        if not host_lengths and use_graph:
            # device-resident lengths: the CUDA-graph planner path with a padded token bucket
            num_q = n_real + int(self.rng.integers(1, 5))
            pad_rows = [self._kv_score(num_q - n_real, L.input_width(r, c["spec"].head_dim)) for c in self.comp]
            rows_in.append(pad_rows)
            locs += [0] * (num_q - n_real)
        len_dev = "cpu" if host_lengths else dev
        rpi = torch.tensor(rids, dtype=torch.int64, device=dev)
        seq = torch.tensor(seqs, dtype=torch.int64, device=len_dev)
        ext = torch.tensor(exts, dtype=torch.int64, device=len_dev)
        if sc.online:
            plan = CompressorPrefillPlan.generate_online(seq, ext, rpi, self.req_to_token, num_q,
                                                         use_cuda_graph=use_graph)
        else:
            plan = CompressorPrefillPlan.generate(
                r, rpi, seq, ext, self.req_to_token, self.full_to_state, SWA_PAGE, sc.ring, num_q,
                use_cuda_graph=use_graph, use_req_ring=sc.use_req_ring,
            )
        out_loc = torch.tensor(locs, dtype=torch.int64, device=dev)
        # Which plan row is which event: read seq_len / ragged_id of the CompressPlan rows.
        plan_c = plan[1].detach().to("cpu", torch.int64)  # bytes; fields are little-endian
        seq_col = (plan_c[:, 0] | plan_c[:, 1] << 8 | plan_c[:, 2] << 16 | plan_c[:, 3] << 24).tolist()
        rag_col = (plan_c[:, 4] | plan_c[:, 5] << 8).tolist()
        expected = {(rq.idx, p) for rq, p, _ in ragged if (p + 1) % r == 0}
        row_events: list[_Event | None] = []
        seen = set()
        for row in range(plan_c.shape[0]):
            if seq_col[row] == L.INVALID_U32:
                row_events.append(None)
                continue
            rid = int(rag_col[row])
            if rid >= n_real:
                self.plan_failures.append(f"step {step}: plan_c row {row} ragged_id {rid} >= {n_real} real tokens")
                row_events.append(None)
                continue
            rq, p, acc = ragged[rid]
            if seq_col[row] != p + 1 or (p + 1) % r:
                self.plan_failures.append(
                    f"step {step}: plan_c row {row}: seq_len {seq_col[row]} for ragged {rid} at position {p}")
            if (rq.idx, p) in seen:
                self.plan_failures.append(f"step {step}: event (request {rq.idx}, position {p}) planned twice")
            seen.add((rq.idx, p))
            row_events.append(_Event(rq.idx, (p + 1) // r - 1, acc))
        if seen != expected:
            self.plan_failures.append(
                f"step {step}: plan events differ: missing {sorted(expected - seen)[:4]}, "
                f"extra {sorted(seen - expected)[:4]}")
        self._run_layer(step, plan, rows_in, out_loc, lambda row: row_events[row])

    # -- checks ----------------------------------------------------------------

    def _check(self, seconds: float) -> SimResult:
        sc = self.sc
        reports = []
        for ci, c in enumerate(self.comp):
            spec = c["spec"]
            rep = CompressorReport(spec)
            h = spec.head_dim
            models = [
                oracle.model_request(c["inputs"][rq.idx], c["ape_host"], ratio=sc.ratio, head_dim=h,
                                     norm_weight=c["norm_host"], norm_eps=NORM_EPS,
                                     freq_cis=self.freq_cis.cpu())
                for rq in self.requests
            ]
            # compress_forward rows
            for step, ev, row in self.outputs[ci]:
                rep.rows.append((step, ev.request, ev.window, ev.accepted, row))
                if not ev.accepted:
                    continue
                ref = models[ev.request][ev.window].pooled
                a = row.to(torch.float64)
                err = oracle.relative_error(a, ref) if bool(torch.isfinite(a).all()) else math.inf
                rep.output_rows += 1
                rep.max_rel_err = max(rep.max_rel_err, err)
                if not err <= self.rel_tol:
                    rms = math.sqrt(float((ref * ref).mean()))
                    bad = torch.nonzero(~((a - ref).abs() <= self.rel_tol * rms)).flatten()
                    col = int(bad[0]) if bad.numel() else 0
                    rep.output_failures.append(
                        OutputMismatch(step, ev.request, ev.window, col, float(a[col]), float(ref[col]), err))
            for step, row_idx, row in self.zero_rows[ci]:
                rep.zero_rows += 1
                nz = torch.nonzero(row != 0).flatten()
                if nz.numel():
                    col = int(nz[0])
                    rep.output_failures.append(OutputMismatch(step, -1, -1, col, float(row[col]), 0.0, math.inf))
            rep.entries_stored = self.stores[ci]
            # final cache entries
            self._check_cache(c, models, rep)
            reports.append(rep)
        backend = _backend_name(self.device)
        return SimResult(sc, str(self.device), backend, self.seed, dict(self.steps), dict(self.events),
                         [rq.length for rq in self.requests], reports, self.plan_failures, seconds)

    def _check_cache(self, c: dict, models: list[list[oracle.Entry]], rep: CompressorReport) -> None:
        sc, spec = self.sc, c["spec"]
        fmt = spec.cache_format
        P = c["page_size"]
        page_bytes = fmt.page_bytes(P)
        cache = c["cache"].detach().cpu().reshape(-1)
        written = torch.zeros(cache.shape[0], dtype=torch.bool)
        scale_written = fmt.scale_bytes - (1 if spec.fmt == "v4" else 0)  # V4 pad byte stays untouched
        for rq, ents in zip(self.requests, models):
            for ent in ents:
                loc = rq.full_loc(ent.window * sc.ratio + sc.ratio - 1) // sc.ratio
                page, slot = divmod(loc, P)
                d0 = page * page_bytes + slot * fmt.data_bytes
                s0 = page * page_bytes + P * fmt.data_bytes + slot * fmt.scale_bytes
                data = cache[d0 : d0 + fmt.data_bytes]
                scale = cache[s0 : s0 + fmt.scale_bytes]
                written[d0 : d0 + fmt.data_bytes] = True
                written[s0 : s0 + scale_written] = True
                rep.stored[(rq.idx, ent.window)] = (data.clone(), scale[:scale_written].clone())
                chk = oracle.check_entry(spec.fmt, ent.final, data, scale, rel_eps=self.tie_eps)
                rep.entries_checked += 1
                rep.codes += chk.codes
                rep.ties += chk.ties
                rep.scale_ties += chk.scale_ties
                if not chk.ok:
                    rep.entry_failures.append((rq.idx, ent.window, chk))
        changed = torch.nonzero((cache != POISON_BYTE) & ~written).flatten()
        if changed.numel():
            b = int(changed[0])
            page, off = divmod(b, page_bytes)
            rep.poison_failures.append(
                f"{changed.numel()} byte(s) outside the stored entries changed; first at page {page}, "
                f"byte {off} (= 0x{int(cache[b]):02x})")


def _backend_name(device: torch.device) -> str:
    """``plans: jit, ops: torch``-style summary of the backend modules ``dispatch`` picks for ``device``."""
    from flashcompress import dispatch

    names = {k: getattr(m, "__name__", type(m).__module__)  # a test's stand-in backend may be an object
             for k, m in (("plans", dispatch.plans_backend(device)), ("ops", dispatch.ops_backend(device)))}
    kinds = {k: "jit" if ".cuda_ops." in v else "torch" for k, v in names.items()}
    if len(set(kinds.values())) == 1:
        return next(iter(kinds.values()))
    return ", ".join(f"{k}: {v}" for k, v in kinds.items())


def simulate(scenario: Scenario, *, device: str | torch.device = "cpu", seed: int = 0, **kw) -> SimResult:
    """Build and run a :class:`Simulator`."""
    return Simulator(scenario, device=device, seed=seed, **kw).run()
