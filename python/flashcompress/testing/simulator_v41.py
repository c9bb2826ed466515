"""An engine simulator for DeepSeek-V4.1's low-ratio source layers, checked byte for byte.

It plays a serving engine around V4.1-Flash's four compressor **source** layers
(spec ``v41.md`` §1.2): layers 2, 8 and 14 at ratio 2 (``c2_*`` ops, 128-slot pages,
one pair ring each) and layer 20 at ratio 1 (``c1_decode_norm_rope_store``, 256-slot
pages); every source layer also owns keys, so each step ends with
``index_k_norm_rope_pack_store`` on the latent the layer returned (68-byte slots,
``index_page_size`` slots a page).

* **World**: request slots 1..``num_slots`` (slot 0 is the CUDA-graph padding slot;
  fewer slots than requests makes later requests reuse a finished request's ring
  rows), requests owning whole 256-token full pages in shuffled order (full page 0 is
  the allocator's dummy page), caches sized as SGLang sizes them (§7.5, §7.6) and
  filled with a poison byte, pair rings of :func:`~flashcompress.v41.layouts.pair_ring_rows`
  rows cleared to kv 0 / score -inf (§4.1).
* **Schedule**: each request's tokens split at random into prefill chunks, decode
  steps and (``draft_len > 1``) target-verify blocks of ``draft_len`` rows of which a
  random prefix is accepted (the rejected rows carry different projections, so they
  write wrong entries and park wrong ring rows that later steps must overwrite or
  ignore: the rollback).  A step is an extend batch (``c2_prefill``; decode-phase
  requests may ride along as one-token extends; CUDA-graph padding: zero-length
  requests beyond the batch and trailing rows with ``raw_out_loc == 0``), a decode
  batch (``c2_decode``, one row per request) or a verify batch (``c2_decode`` with
  ``draft_len``); both may end in zero-filled CUDA-graph padding rows (``req``, ``positions``
  and ``raw_out_loc`` 0; verify: whole padded blocks).  Ratio 1 runs ``c1``
  on the same rows in every mode.  The metadata is the engine's (§6): ``raw_out_loc``,
  ``c1_out_loc = raw``, ``c2_out_loc = raw // 2`` at odd positions else -1.
* **Ground truth**, computed on the CPU with the PyTorch reference from fresh buffers:
  each request's accepted token stream as **one unchunked prefill** per layer (the
  pair ring is the only state, so chunking, decode, verify and rollback must not
  change a byte, spec §13.7), then the index keys of its latents.  And a **ring
  model**: the pair ring updated per step by the rules of §4.4-4.5 in plain Python
  (decode / verify park live even rows; prefill parks each request's last ``ring``
  live rows), compared with the engine's ring after every step.  The ground truth's latents
  are in turn compared with a float64 model of §2.1 (:func:`model_latents`, within rounding).

Checked: after every step the ring (bit for bit) and the latent of every accepted
event row (bit for bit against the unchunked prefill's row; c2 rows without an event
must be zero); at the end every byte of every main and index cache against the
ground-truth caches (which also proves that nothing outside the entries changed) and
that the ground truth holds exactly the expected entries.  ``fault`` injects an engine
bug (a corrupted ring row, a wrong ``extend_seq_lens``, padding rows that are not
marked as padding) so that tests can see the checks fail.

Runs on any device: the engine buffers live on ``device``, the ground truth on the CPU;
:class:`V41SimResult` keeps the engine's final buffers and per-step latents (CPU
copies) so that a CUDA run can be compared with a CPU run byte for byte.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field

import torch

from flashcompress.v41.layouts import (INDEX_K_DIM, INDEX_K_SLOT_BYTES, LATENT_DIM, PAIR_STATE_WIDTH, KVLayout,
                                       pair_ring_rows, pair_ring_size)

__all__ = ["SOURCE_LAYERS", "FAULTS", "V41Scenario", "V41LayerReport", "V41SimResult", "V41Simulator",
           "model_latents", "simulate_v41", "v41_freqs_cis"]

FULL_PAGE = 256
POISON_BYTE = 0x5A
SOURCE_LAYERS = ((2, 2), (8, 2), (14, 2), (20, 1))  # V4.1-Flash kv-source layers: (layer id, ratio)
FAULTS = ("ring", "chunking", "padding")


def v41_freqs_cis(rows: int) -> torch.Tensor:
    """V4.1's RoPE table as the ops take it: fp32 ``[rows, 64]``, (cos, sin) interleaved
    (``view_as_real`` of the compressed layers' YaRN table, theta 160000, factor 16)."""
    from flashcompress.testing.oracle import deepseek_v4_freq_cis

    return torch.view_as_real(deepseek_v4_freq_cis(rows)).flatten(-2).contiguous()


@dataclass(frozen=True)
class V41Scenario:
    """What to simulate.

    ``draft_len`` 0 (or 1) means no speculation (ring 2, no verify steps); ``> 1`` adds
    verify batches of that many rows per request and sizes the ring as SGLang does
    (:func:`~flashcompress.v41.layouts.pair_ring_size`).  ``layout`` is the main caches'
    :class:`~flashcompress.v41.layouts.KVLayout` (V4 on Hopper, V41_FP4 / V41_FP4_NEW on
    SM100).  ``fault`` is one of :data:`FAULTS` or None.
    """

    layout: str = "v4"
    num_requests: int = 4
    num_slots: int | None = None
    min_len: int = 1
    max_len: int = 300
    max_decode: int = 12  # decode / verify steps per request, at most
    draft_len: int = 0
    index_page_size: int = 64
    eps: float = 1e-20
    verify_prob: float = 0.5
    graph_prob: float = 0.4  # CUDA-graph padding of a batch
    mixed_prob: float = 0.3  # decode-phase requests riding in an extend batch
    fault: str | None = None

    @property
    def ring(self) -> int:
        return pair_ring_size(self.draft_len if self.draft_len > 1 else 0)

    @property
    def speculative(self) -> bool:
        return self.draft_len > 1

    def describe(self) -> str:
        spec = f"verify draft_len {self.draft_len}" if self.speculative else "no speculation"
        fault = f", fault {self.fault}" if self.fault else ""
        return (f"V4.1-Flash source layers {', '.join(f'L{l} r{r}' for l, r in SOURCE_LAYERS)}: "
                f"{KVLayout.parse(self.layout).value} caches, ring {self.ring}, {spec}{fault}")


@dataclass
class V41LayerReport:
    """What one source layer's checks found (failures: first few, in words)."""

    layer: int
    ratio: int
    latent_rows: int = 0  # accepted event rows compared with the unchunked prefill
    zero_rows: int = 0  # c2 rows without an event whose latent had to stay zero
    ring_checks: int = 0
    entries: int = 0  # main-cache entries of the ground truth
    index_entries: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def fail(self, what: str) -> None:
        if len(self.failures) < 8:
            self.failures.append(f"L{self.layer} (ratio {self.ratio}): {what}")


@dataclass
class V41SimResult:
    scenario: V41Scenario
    device: str
    seed: int
    steps: dict[str, int]
    request_lengths: list[int]
    reports: list[V41LayerReport]
    seconds: float  # the run and its checks
    # engine buffers after the run (CPU copies): layer -> {"cache", "index", "ring"}
    buffers: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict, repr=False)
    # every latent the engine's ops returned, in call order: (step, layer, [N, 512] bf16)
    latents: list[tuple[int, int, torch.Tensor]] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.reports)

    def failures(self) -> list[str]:
        return [f for r in self.reports for f in r.failures]

    def summary(self) -> str:
        lines = [self.scenario.describe(),
                 f"  {len(self.request_lengths)} requests (lengths {self.request_lengths}) on {self.device}; steps: "
                 + ", ".join(f"{k} {v}" for k, v in self.steps.items()) + f"; {self.seconds:.1f} s"]
        for r in self.reports:
            ring = f", ring checked {r.ring_checks}x" if r.ratio == 2 else ""
            lines.append(f"  L{r.layer:<3d} ratio {r.ratio}: {r.entries} entries + {r.index_entries} index keys "
                         f"byte-equal, {r.latent_rows} latents, {r.zero_rows} zero rows{ring}: "
                         f"{'ok' if r.ok else 'FAIL'}")
        lines += ["  " + f for f in self.failures()[:6]]
        return "\n".join(lines)


# ---------------------------------------------------------------------------
# schedule
# ---------------------------------------------------------------------------


def _request_actions(length: int, sc: V41Scenario, rng: random.Random) -> list[tuple]:
    """One request's tokens as actions: ("chunk", n) | ("decode",) | ("verify", accepted)."""
    budget = min(rng.randrange(0, sc.max_decode + 1), length - 1)
    prompt = length - budget
    acts: list[tuple] = []
    pos = 0

    def chunk(pos: int, end: int) -> int:
        left, u = end - pos, rng.random()
        if u < 0.3:
            n = left
        elif u < 0.55:  # end on / next to a page or pair boundary
            grid = rng.choice((2, 128, FULL_PAGE))
            n = (pos // grid + 1) * grid - pos + rng.randrange(-1, 2)
        elif u < 0.7:
            n = rng.randrange(1, 4)
        else:
            n = rng.randrange(1, left + 1)
        return min(max(n, 1), left)

    while pos < prompt:
        n = chunk(pos, prompt)
        acts.append(("chunk", n))
        pos += n
    while pos < length:
        left = length - pos
        if sc.speculative and left >= sc.draft_len and rng.random() < sc.verify_prob:
            k = rng.randrange(1, sc.draft_len + 1)
            acts.append(("verify", k))
            pos += k
        elif left >= 2 and rng.random() < 0.08:
            n = chunk(pos, length)
            acts.append(("chunk", n))
            pos += n
        else:
            acts.append(("decode",))
            pos += 1
    return acts


@dataclass
class _Request:
    idx: int
    length: int
    arrival: int
    actions: list[tuple]
    pages: list[int]
    rid: int = -1
    pos: int = 0
    next_action: int = 0

    def raw(self, p: int) -> int:
        """Full-KV slot (``out_cache_loc``) of position ``p``."""
        return self.pages[p // FULL_PAGE] * FULL_PAGE + p % FULL_PAGE

    @property
    def done(self) -> bool:
        return self.pos >= self.length


@dataclass
class _Row:
    """One input row of a step: a request's position (accepted or a rejected draft) or padding."""

    request: _Request | None
    pos: int
    accepted: bool = True

    @property
    def padded(self) -> bool:
        return self.request is None


# ---------------------------------------------------------------------------
# the simulator
# ---------------------------------------------------------------------------


class V41Simulator:
    """Runs one :class:`V41Scenario` on ``device`` and checks it; see the module docstring."""

    def __init__(self, scenario: V41Scenario, *, device: str | torch.device = "cpu", seed: int = 0):
        sc = scenario
        if sc.fault is not None and sc.fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS} or None, got {sc.fault!r}")
        if sc.draft_len == 1 or sc.draft_len < 0:
            raise ValueError(f"draft_len must be 0 (no speculation) or > 1, got {sc.draft_len}")
        self.sc = sc
        self.layout = KVLayout.parse(sc.layout)
        self.device = torch.device(device)
        self.seed = seed
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.steps = {"extend": 0, "decode": 0, "verify": 0, "padded": 0, "rejected rows": 0}
        self.fault_done = False
        self._build_world()
        self._build_layers()
        self.latents: list[tuple[int, int, torch.Tensor]] = []
        # (layer, request, position) -> engine latent rows of accepted events, checked at the end
        self.event_latents: list[tuple[int, int, int, int, torch.Tensor]] = []

    # -- world ---------------------------------------------------------------

    def _build_world(self) -> None:
        sc, rng = self.sc, self.rng
        lengths = [rng.randrange(sc.min_len, sc.max_len + 1) for _ in range(sc.num_requests)]
        npages = [math.ceil(n / FULL_PAGE) for n in lengths]
        total = sum(npages)
        phys = list(range(1, total + 1))  # full page 0 is the dummy page
        rng.shuffle(phys)
        self.requests: list[_Request] = []
        k = arrival = 0
        for i, n in enumerate(lengths):
            self.requests.append(_Request(i, n, arrival, _request_actions(n, sc, rng), phys[k:k + npages[i]]))
            k += npages[i]
            arrival += rng.randrange(0, 3)
        self.full_size = total * FULL_PAGE
        self.num_slots = sc.num_slots or sc.num_requests
        self.free_rids = list(range(1, self.num_slots + 1))
        rng.shuffle(self.free_rids)
        self.freqs_host = v41_freqs_cis(max(lengths) + 2 + sc.draft_len)
        self.freqs = self.freqs_host.to(self.device)

    def _randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen, dtype=torch.float32)

    def _inputs(self, ratio: int, n: int) -> torch.Tensor:
        """Projection rows: ratio 2 fp32 ``kv | score`` (kv of varied magnitude, score ~ N(0, 9)),
        ratio 1 bf16 ``wkv(x)``."""
        mag = 10.0 ** torch.randint(-2, 2, (n, 1), generator=self.gen).float()
        if ratio == 2:
            return torch.cat((self._randn(n, LATENT_DIM) * mag, 3 * self._randn(n, LATENT_DIM)), 1)
        return (self._randn(n, LATENT_DIM) * mag).to(torch.bfloat16)

    def _fresh_ring(self) -> torch.Tensor:
        ring = torch.zeros(pair_ring_rows(self.num_slots, self.sc.ring), PAIR_STATE_WIDTH)
        ring[:, LATENT_DIM:] = float("-inf")
        return ring

    def _cache(self, ratio: int) -> torch.Tensor:
        P = FULL_PAGE // ratio
        pages = -(-(self.full_size // ratio + FULL_PAGE) // P)
        return torch.full((pages, self.layout.page_bytes(P)), POISON_BYTE, dtype=torch.uint8)

    def _index_cache(self, ratio: int) -> torch.Tensor:
        P = self.sc.index_page_size
        pages = -(-((self.full_size + FULL_PAGE) // ratio + FULL_PAGE) // P)
        return torch.full((pages, INDEX_K_SLOT_BYTES * P), POISON_BYTE, dtype=torch.uint8)

    def _build_layers(self) -> None:
        self.layers: list[dict] = []
        for layer, r in SOURCE_LAYERS:
            d = dict(layer=layer, ratio=r, page_size=FULL_PAGE // r,
                     norm_w=(1 + 0.2 * self._randn(LATENT_DIM)).to(torch.bfloat16),
                     k_norm_w=(1 + 0.2 * self._randn(INDEX_K_DIM)).to(torch.bfloat16),
                     wk=(self._randn(INDEX_K_DIM, LATENT_DIM) / math.sqrt(LATENT_DIM)).to(torch.bfloat16),
                     inputs=[self._inputs(r, rq.length) for rq in self.requests],
                     report=V41LayerReport(layer, r))
            d["cache"] = self._cache(r).to(self.device)
            d["index"] = self._index_cache(r).to(self.device)
            d["norm_w_dev"], d["k_norm_w_dev"] = d["norm_w"].to(self.device), d["k_norm_w"].to(self.device)
            if r == 2:
                d["ring"] = self._fresh_ring().to(self.device)
                d["ring_model"] = self._fresh_ring()
            self.layers.append(d)

    def _wk(self, d: dict, latent: torch.Tensor) -> torch.Tensor:
        """The indexer's ``wk`` projection of latents, computed on the CPU (fp64, rounded to bf16) so
        that every device feeds the index-K op the same bytes."""
        x = latent.detach().to("cpu", torch.float64)
        return (x @ d["wk"].double().t()).to(torch.bfloat16).to(self.device)

    # -- scheduling ------------------------------------------------------------

    def _admit(self, step: int) -> None:
        for rq in self.requests:
            if rq.rid < 0 and rq.arrival <= step and self.free_rids and not rq.done:
                rq.rid = self.free_rids.pop()

    def run(self) -> V41SimResult:
        t0 = time.perf_counter()
        step = 0
        while not all(rq.done for rq in self.requests):
            self._admit(step)
            active = [rq for rq in self.requests if rq.rid >= 0 and not rq.done]
            if not active:
                step += 1
                continue
            kind_of = {rq.idx: rq.actions[rq.next_action][0] for rq in active}
            by = {k: [rq for rq in active if kind_of[rq.idx] == k] for k in ("chunk", "decode", "verify")}
            choices = [k for k in ("chunk", "decode", "verify") if by[k]]
            kind = self.rng.choice(choices)
            batch = [rq for rq in by[kind] if self.rng.random() < 0.8] or [by[kind][0]]
            if kind == "chunk":
                batch += [rq for rq in by["decode"] if self.rng.random() < self.sc.mixed_prob]
                self.rng.shuffle(batch)
                self._extend_step(step, batch)
            elif kind == "decode":
                self.rng.shuffle(batch)
                self._decode_step(step, batch, 1)
            else:
                self.rng.shuffle(batch)
                self._decode_step(step, batch, self.sc.draft_len)
            for rq in active:
                if rq.done:
                    self.free_rids.append(rq.rid)
                    self.rng.shuffle(self.free_rids)
                    rq.rid = -2
            step += 1
        result = self._finish()
        result.seconds = time.perf_counter() - t0
        return result

    def _decode_step(self, step: int, batch: list[_Request], draft: int) -> None:
        """A decode batch (``draft == 1``) or a verify batch of ``draft`` rows per request."""
        self.steps["verify" if draft > 1 else "decode"] += 1
        rows: list[_Row] = []
        for rq in batch:
            act = rq.actions[rq.next_action]
            k = act[1] if act[0] == "verify" else 1
            rows += [_Row(rq, rq.pos + j, j < k) for j in range(draft)]
            self.steps["rejected rows"] += draft - k
            rq.pos += k
            rq.next_action += 1
        if self.rng.random() < self.sc.graph_prob:
            self.steps["padded"] += 1
            for _ in range(self.rng.randrange(1, 3)):  # padded requests: zero-filled graph rows (req, pos, raw 0)
                rows += [_Row(None, 0) for _ in range(draft)]
        self._run_step(step, rows, "verify" if draft > 1 else "decode", draft=draft)

    def _extend_step(self, step: int, batch: list[_Request]) -> None:
        self.steps["extend"] += 1
        rows: list[_Row] = []
        ranges: list[tuple[int, int]] = []
        for rq in batch:
            act = rq.actions[rq.next_action]
            n = act[1] if act[0] == "chunk" else 1
            ranges.append((len(rows), n))
            rows += [_Row(rq, rq.pos + j) for j in range(n)]
            rq.pos += n
            rq.next_action += 1
        if self.rng.random() < self.sc.graph_prob:  # prefill-graph padding: zero-length requests, padded rows
            self.steps["padded"] += 1
            ranges += [(0, 0)] * self.rng.randrange(1, 3)
            rows += [_Row(None, 0) for _ in range(self.rng.randrange(1, 4))]
        self._run_step(step, rows, "extend", ranges=ranges)

    # -- one engine forward over the four source layers ---------------------------

    def _input_rows(self, d: dict, rows: list[_Row]) -> torch.Tensor:
        parts = []
        for row in rows:
            if row.padded or not row.accepted:  # padding / rejected draft: a different projection
                parts.append(self._inputs(d["ratio"], 1))
            else:
                parts.append(d["inputs"][row.request.idx][row.pos:row.pos + 1])
        return torch.cat(parts)

    def _run_step(self, step: int, rows: list[_Row], mode: str, *, draft: int = 1,
                  ranges: list[tuple[int, int]] | None = None) -> None:
        from flashcompress.v41 import (c1_decode_norm_rope_store, c2_decode_norm_rope_store,
                                       c2_prefill_norm_rope_store, index_k_norm_rope_pack_store)

        sc, dev = self.sc, self.device
        fault_padding = sc.fault == "padding" and not self.fault_done and any(r.padded for r in rows)
        raw = [0 if r.padded else r.request.raw(r.pos) for r in rows]
        pos = [r.pos for r in rows]
        if fault_padding:  # the engine forgot to mark its padding rows: a live odd row in the dummy page
            first = next(i for i, r in enumerate(rows) if r.padded)
            raw[first], pos[first] = 3, 1
            self.fault_done = True
        req = [0 if r.padded else r.request.rid for r in rows]
        raw_t = torch.tensor(raw, dtype=torch.int64)
        pos_t = torch.tensor(pos, dtype=torch.int64)
        req_t = torch.tensor(req, dtype=torch.int64)
        if ranges is not None:
            starts = [s for s, _ in ranges]
            lens = [n for _, n in ranges]
            if sc.fault == "chunking" and not self.fault_done and any(n >= 2 for n in lens):
                i = next(i for i, n in enumerate(lens) if n >= 2)
                lens[i] -= 1  # the engine's extend lengths disagree with its rows
                self.fault_done = True
            start_t = torch.tensor(starts, dtype=torch.int32).to(dev)
            lens_t = torch.tensor(lens, dtype=torch.int32).to(dev)
        for d in self.layers:
            r = d["ratio"]
            x = self._input_rows(d, rows)
            common = dict(page_size=d["page_size"], layout=self.layout)
            if r == 1:
                c1_loc = raw_t
                latent = c1_decode_norm_rope_store(x.to(dev), d["norm_w_dev"], pos_t.to(dev), c1_loc.to(dev), sc.eps,
                                                   self.freqs, d["cache"], **common)
                index_loc = c1_loc
            else:
                if mode == "extend":
                    latent = c2_prefill_norm_rope_store(
                        x.to(dev), d["ring"], d["norm_w_dev"], pos_t.to(dev), req_t.to(dev), raw_t.to(dev), sc.eps,
                        self.freqs, d["cache"], start_t, lens_t, ring_size=sc.ring, **common)
                else:
                    latent = c2_decode_norm_rope_store(
                        x.to(dev), d["ring"], d["norm_w_dev"], pos_t.to(dev), req_t.to(dev), raw_t.to(dev), sc.eps,
                        self.freqs, d["cache"], ring_size=sc.ring, draft_len=draft, **common)
                index_loc = torch.where((pos_t & 1) == 1, raw_t // 2, torch.full_like(raw_t, -1))
                index_loc = torch.where(raw_t == 0, torch.zeros_like(raw_t), index_loc)
            index_k_norm_rope_pack_store(self._wk(d, latent), d["k_norm_w_dev"], sc.eps, self.freqs, pos_t.to(dev),
                                         index_loc.to(dev), d["index"], ratio=r)
            lat = latent.detach().cpu()
            self.latents.append((step, d["layer"], lat))
            self._record_latents(d, rows, lat)
            if r == 2:
                self._advance_ring_model(d, rows, x, mode, ranges)  # the true ranges, whatever the op was given
                self._check_ring(step, d)
        self._maybe_corrupt_ring()

    def _record_latents(self, d: dict, rows: list[_Row], lat: torch.Tensor) -> None:
        rep = d["report"]
        for i, row in enumerate(rows):
            event = d["ratio"] == 1 or (row.pos & 1) == 1
            if row.padded:
                if d["ratio"] == 2 and lat[i].any() and not self.sc.fault:
                    rep.fail(f"padded row {i} has a non-zero latent")
                continue
            if not event:
                rep.zero_rows += 1
                if lat[i].any():
                    rep.fail(f"request {row.request.idx} position {row.pos}: even row has a non-zero latent")
            elif row.accepted:
                self.event_latents.append((d["layer"], row.request.idx, row.pos, i, lat[i]))

    # -- the ring model ----------------------------------------------------------

    def _advance_ring_model(self, d: dict, rows: list[_Row], x: torch.Tensor, mode: str,
                            ranges: list[tuple[int, int]] | None) -> None:
        """§4.4 / §4.5 in plain Python: which input rows the pair ring must hold after this step."""
        ring, model = self.sc.ring, d["ring_model"]
        if mode == "extend":
            park = []
            for start, n in ranges:
                park += [i for i in range(start + n - 1, start + n - 1 - min(n, ring), -1)]
        else:
            park = [i for i, row in enumerate(rows) if row.pos % 2 == 0]
        for i in park:
            row = rows[i]
            if not row.padded:
                model[row.request.rid * ring + row.pos % ring] = x[i]

    def _check_ring(self, step: int, d: dict) -> None:
        rep = d["report"]
        rep.ring_checks += 1
        got = d["ring"].detach().cpu()
        diff = (got.view(torch.int32) != d["ring_model"].view(torch.int32)).any(dim=1)
        if bool(diff.any()):
            row = int(diff.nonzero()[0])
            rid, slot = divmod(row, self.sc.ring)
            rep.fail(f"step {step}: pair ring row {row} (request slot {rid}, ring slot {slot}) differs from the "
                     f"ring model ({int(diff.sum())} row(s))")
            d["ring_model"].copy_(got)  # report each divergence once

    def _maybe_corrupt_ring(self) -> None:
        """Fault ``ring``: damage the parked partner of a request whose next position is odd."""
        if self.sc.fault != "ring" or self.fault_done:
            return
        for rq in self.requests:
            if rq.rid > 0 and not rq.done and rq.pos % 2 == 1:
                d = self.layers[0]
                d["ring"][rq.rid * self.sc.ring + (rq.pos - 1) % self.sc.ring, 0] += 1.0
                d["ring_model"][rq.rid * self.sc.ring + (rq.pos - 1) % self.sc.ring, 0] += 1.0  # the bug is silent
                self.fault_done = True
                return

    # -- ground truth and the final checks ------------------------------------------

    def _ground_truth(self, d: dict) -> tuple[torch.Tensor, torch.Tensor, dict[tuple[int, int], torch.Tensor]]:
        """Each request's whole token stream as one unchunked prefill (CPU reference), then its index keys."""
        from flashcompress.v41 import (c1_decode_norm_rope_store, c2_prefill_norm_rope_store,
                                       index_k_norm_rope_pack_store)

        r, sc = d["ratio"], self.sc
        cache, index = self._cache(r), self._index_cache(r)
        latents: dict[tuple[int, int], torch.Tensor] = {}
        for rq in self.requests:
            n = rq.length
            pos = torch.arange(n)
            raw = torch.tensor([rq.raw(p) for p in range(n)], dtype=torch.int64)
            x = d["inputs"][rq.idx]
            if r == 1:
                lat = c1_decode_norm_rope_store(x, d["norm_w"], pos, raw, sc.eps, self.freqs_host, cache,
                                                page_size=d["page_size"], layout=self.layout)
                loc = raw
            else:
                ring = self._fresh_ring()
                lat = c2_prefill_norm_rope_store(
                    x, ring, d["norm_w"], pos, torch.ones(n, dtype=torch.int64), raw, sc.eps, self.freqs_host, cache,
                    torch.tensor([0], dtype=torch.int32), torch.tensor([n], dtype=torch.int32),
                    page_size=d["page_size"], ring_size=sc.ring, layout=self.layout)
                loc = torch.where(pos % 2 == 1, raw // 2, torch.full_like(raw, -1))
            k_in = (lat.double() @ d["wk"].double().t()).to(torch.bfloat16)
            index_k_norm_rope_pack_store(k_in, d["k_norm_w"], sc.eps, self.freqs_host, pos, loc, index, ratio=r)
            for p in range(n):
                if r == 1 or p % 2 == 1:
                    latents[(rq.idx, p)] = lat[p]
        return cache, index, latents

    def _check_model(self, d: dict, lat_ref: dict[tuple[int, int], torch.Tensor]) -> None:
        """The ground truth's latents against :func:`model_latents` (float64): every element within
        2^-6 relative (the fp32 pooling can move a pooled bf16 value by one ulp, up to 2^-7 relative,
        and the fp32 norm the result by one more), and at most 1% of the elements not bit-equal."""
        rep, r = d["report"], d["ratio"]
        for rq in self.requests:
            want = model_latents(d["inputs"][rq.idx], r, d["norm_w"], self.sc.eps).double()
            if not want.shape[0]:
                continue
            got = torch.stack([lat_ref[(rq.idx, p)] for p in range(r - 1, rq.length, r)]).double()
            err = (got - want).abs() > 2.0 ** -6 * want.abs()
            inexact = float((got != want).double().mean())
            if inexact > 0.01:
                rep.fail(f"ground truth latents of request {rq.idx}: {inexact:.2%} of the elements differ from the "
                         "float64 model (at most 1% may, by rounding)")
            elif bool(err.any()):
                row, col = err.nonzero()[0].tolist()
                rep.fail(f"ground truth latent of request {rq.idx} position {row * r + r - 1} dim {col}: "
                         f"{float(got[row, col])!r}, float64 model {float(want[row, col])!r}")

    def _finish(self) -> V41SimResult:
        buffers: dict[int, dict[str, torch.Tensor]] = {}
        for d in self.layers:
            rep, r = d["report"], d["ratio"]
            cache_ref, index_ref, lat_ref = self._ground_truth(d)
            for layer, req, p, row, lat in self.event_latents:
                if layer != d["layer"]:
                    continue
                rep.latent_rows += 1
                if not torch.equal(lat.view(torch.int16), lat_ref[(req, p)].view(torch.int16)):
                    col = int((lat.view(torch.int16) != lat_ref[(req, p)].view(torch.int16)).nonzero()[0])
                    rep.fail(f"latent of request {req} position {p} (batch row {row}) differs from the unchunked "
                             f"prefill's at dim {col}: {float(lat[col])!r} vs {float(lat_ref[(req, p)][col])!r}")
            for name, got, want, slot_bytes in (
                    ("main cache", d["cache"].detach().cpu(), cache_ref, self.layout.bytes_per_token),
                    ("index-K cache", d["index"].detach().cpu(), index_ref, INDEX_K_SLOT_BYTES)):
                diff = (got != want).nonzero()
                if diff.numel():
                    page, byte = diff[0].tolist()
                    rep.fail(f"{name}: {diff.shape[0]} byte(s) differ from the unchunked ground truth, first at "
                             f"page {page} byte {byte}: 0x{int(got[page, byte]):02x} vs 0x{int(want[page, byte]):02x}")
            self._check_model(d, lat_ref)
            # the ground truth holds exactly the expected entries (one per event position of every request)
            expected = sum(rq.length if r == 1 else rq.length // 2 for rq in self.requests)
            rep.entries = _count_slots(cache_ref, self.layout, d["page_size"])
            rep.index_entries = _count_index_slots(index_ref, self.sc.index_page_size)
            if rep.entries != expected or rep.index_entries != expected:
                rep.fail(f"ground truth holds {rep.entries} entries / {rep.index_entries} index keys, "
                         f"expected {expected}")
            buffers[d["layer"]] = {"cache": d["cache"].detach().cpu(), "index": d["index"].detach().cpu()}
            if r == 2:
                buffers[d["layer"]]["ring"] = d["ring"].detach().cpu()
        return V41SimResult(self.sc, str(self.device), self.seed, dict(self.steps),
                            [rq.length for rq in self.requests], [d["report"] for d in self.layers], 0.0,
                            buffers, self.latents)


def model_latents(x: torch.Tensor, ratio: int, norm_weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The latents of one request's projection rows ``x`` by spec §2.1 in float64, independent of the ops:
    ratio 1 every row, ratio 2 every (even, odd) pair softmax-pooled per channel and rounded to bf16;
    then RMSNorm with the bf16 weight, rounded to bf16.  Rows: one per event position, in order."""
    v = x.double()
    if ratio == 2:
        n = v.shape[0] // 2 * 2
        kv, score = v[:n, :LATENT_DIM].reshape(-1, 2, LATENT_DIM), v[:n, LATENT_DIM:].reshape(-1, 2, LATENT_DIM)
        v = (kv * torch.softmax(score, dim=1)).sum(dim=1).to(torch.bfloat16).double()
    nf = torch.rsqrt((v * v).mean(dim=1, keepdim=True) + eps)
    return (v * nf * norm_weight.double()).to(torch.bfloat16)


def _count_slots(cache: torch.Tensor, layout: KVLayout, page_size: int) -> int:
    """Slots of a main cache whose data bytes are not all poison."""
    a = layout.row_addressing(page_size)
    flat = cache.reshape(-1)
    slots = torch.arange(cache.shape[0] * page_size)
    base = (slots // page_size) * a.page_bytes + (slots % page_size) * a.data_stride
    data = flat[base.unsqueeze(1) + torch.arange(a.data_bytes)]
    return int((data != POISON_BYTE).any(dim=1).sum())


def _count_index_slots(cache: torch.Tensor, page_size: int) -> int:
    payload = cache[:, : 64 * page_size].reshape(-1, 64)
    scales = cache[:, 64 * page_size:].reshape(-1, 4)
    return int(((payload != POISON_BYTE).any(dim=1) | (scales != POISON_BYTE).any(dim=1)).sum())


def simulate_v41(scenario: V41Scenario, *, device: str | torch.device = "cpu", seed: int = 0) -> V41SimResult:
    """Build and run a :class:`V41Simulator`."""
    return V41Simulator(scenario, device=device, seed=seed).run()
