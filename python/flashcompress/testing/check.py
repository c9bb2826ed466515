"""``flashcompress check``: do the kernels on this GPU agree with the PyTorch reference?

What an engine team runs after installing on a new GPU type.  For a model preset
(:mod:`flashcompress.jit.models`) it

1. builds or loads every kernel variant the preset needs (the ``prewarm`` set);
2. runs a short, fixed engine script per layer kind — C4 main KV, C4 indexer (FP8 and
   FP4), C128 and online C128 — of two prefill chunks (the second one resuming the
   first, CUDA-graph padded), decode steps, a CUDA-graph style padded decode batch
   (extra rows in the padding slot 0, ``seq_len`` 1) and, for online C128, a
   target-verify extend into MTP bank 1;
3. runs every call of that script twice from identical inputs: through the public
   API on the checked device (the JIT kernels on a GPU) and through the PyTorch
   backend on CPU copies, and compares, call by call:

   ============ =====================================================================
   ``plans``    plan bytes, exactly
   ``state``    the state pool after ``compress_forward``: bit-identical (online C128:
                running max exact, running sum within 1e-6 relative, running mean
                within 1e-5 of the row's max |mean|; untouched rows bit-identical)
   ``output``   ``compress_forward`` rows: within 1e-5 of the row's max |value| and a
                relative L2 error <= 1e-6; rows without an event exactly zero
   ``cache``    the cache after ``compress_norm_rope_store`` of the same rows: every
                quantised code within one step of the reference's (a rounding tie),
                scales and RoPE bytes equal (FP8 indexer scale within 1e-6 relative),
                every byte outside the entries unchanged
   ``fused``    ``compress_and_store`` on the checked device against its own two-step
                path from clones: state and cache byte for byte
   ============ =====================================================================

   A V4.1 model (``deepseek-v4.1-flash``) has no plans: its layer kinds are the ratio-2 and
   ratio-1 source layers with their index keys (:mod:`flashcompress.testing.check_v41`), compared
   exactly in ``state`` (pair ring), ``output`` (latent) and ``cache`` (main + index-K caches).

   These are the tolerances of the GPU test suite (``tests/test_gpu_*.py``).  After
   each call the script goes on from the checked device's buffers, so every call of
   both sides starts from the same bytes.

``run_check`` returns a :class:`CheckReport`; ``CheckReport.table()`` is the table the
CLI prints (layer kind x check, PASS / FAIL / -, then the first mismatch of each
failing cell).  ``device="cpu"`` is a self-test of the check itself (both sides run the
PyTorch backend, so it must pass; no kernel is built).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from flashcompress import layouts as L

__all__ = ["CHECKS", "ApiBackend", "BuildSummary", "CheckReport", "KindResult", "LayerKind", "NoGpuError",
           "check_device", "layer_kinds", "run_check"]

CHECKS = ("plans", "state", "output", "cache", "fused")
SWA_PAGE = 256
NORM_EPS = 1e-6
POISON_BYTE = 0x5A
NUM_SLOTS = 3  # request slots 1..3; slot 0 is the CUDA-graph padding slot


@dataclass(frozen=True)
class LayerKind:
    """One compressor of a layer kind: ratio, head dim, cache format, online or not."""

    name: str
    ratio: int
    head_dim: int
    fmt: L.CacheFormat
    online: bool = False

    @property
    def ring(self) -> int:
        """Non-speculative ring size: 8 (C4), 128 (C128) or 1 (online)."""
        return 1 if self.online else (8 if self.ratio == 4 else 128)

    @property
    def page_size(self) -> int:
        """Compressed-cache page size: the 256-token full page divided by the ratio."""
        return SWA_PAGE // self.ratio


def layer_kinds(model: str, v41_layouts: tuple[str, ...] = ("v4",)) -> list:
    """The compressors a model's layers run, from its :class:`~flashcompress.jit.models.ModelConfig`:
    :class:`LayerKind` for ratios 4 / 128, :class:`~flashcompress.testing.check_v41.V41LayerKind` for the
    V4.1 ratios 2 / 1 (one per layout of ``v41_layouts``)."""
    from flashcompress.jit.models import model_config
    from flashcompress.testing.check_v41 import v41_layer_kinds

    cfg = model_config(model)
    kinds: list = []
    if 4 in cfg.compress_ratios:
        kinds += [LayerKind(f"C4 main H{cfg.head_dim} V4", 4, cfg.head_dim, L.MAIN_V4),
                  LayerKind(f"C4 indexer H{cfg.index_head_dim} FP8", 4, cfg.index_head_dim, L.INDEXER_FP8),
                  LayerKind(f"C4 indexer H{cfg.index_head_dim} FP4", 4, cfg.index_head_dim, L.INDEXER_FP4)]
    if 128 in cfg.compress_ratios:
        kinds += [LayerKind(f"C128 main H{cfg.head_dim} V4", 128, cfg.head_dim, L.MAIN_V4),
                  LayerKind(f"online C128 H{cfg.head_dim} V4", 128, cfg.head_dim, L.MAIN_V4, online=True)]
    return kinds + v41_layer_kinds(cfg.low_ratios, v41_layouts)


# --------------------------------------------------------------------------- the two sides


class ApiBackend:
    """The calls of the engine script, made through the public API with tensors on ``device``.

    Both sides of the check are instances: the checked one on the user's device, the
    reference on the CPU (the PyTorch backend).  Tests substitute a corrupted subclass
    to see the check fail.
    """

    def __init__(self, device: str | torch.device):
        self.device = torch.device(device)

    def decode_plan(self, kind: LayerKind, world: "World", rids: torch.Tensor, seq: torch.Tensor,
                    slot_offset: int = 0):
        """``CompressorDecodePlan.generate`` / ``generate_online`` for the batch."""
        from flashcompress import CompressorDecodePlan

        if kind.online:
            return CompressorDecodePlan.generate_online(seq, rids, world.req_to_token, state_slot_offset=slot_offset)
        return CompressorDecodePlan.generate(kind.ratio, rids, world.req_to_token, world.full_to_state, seq,
                                             SWA_PAGE, kind.ring)

    def prefill_plan(self, kind: LayerKind, world: "World", rids: torch.Tensor, seq: torch.Tensor,
                     ext: torch.Tensor, graph: bool, slot_offset: int = 0):
        """``CompressorPrefillPlan.generate`` / ``generate_online`` (host lengths, exact token count)."""
        from flashcompress import CompressorPrefillPlan

        num_q = int(ext.sum())
        if kind.online:
            return CompressorPrefillPlan.generate_online(seq, ext, rids, world.req_to_token, num_q,
                                                         use_cuda_graph=graph, state_slot_offset=slot_offset)
        return CompressorPrefillPlan.generate(kind.ratio, rids, seq, ext, world.req_to_token, world.full_to_state,
                                              SWA_PAGE, kind.ring, num_q, use_cuda_graph=graph)

    def compress_forward(self, kind: LayerKind, state: torch.Tensor, x: torch.Tensor, ape: torch.Tensor,
                         plan) -> torch.Tensor:
        """``compress_forward``; returns the compressed rows."""
        from flashcompress import compress_forward

        return compress_forward(state, x, ape, plan, head_dim=kind.head_dim, compress_ratio=kind.ratio,
                                is_online=kind.online)

    def store(self, kind: LayerKind, kv: torch.Tensor, plan, consts: "Consts", out_loc: torch.Tensor,
              cache: torch.Tensor) -> None:
        """``compress_norm_rope_store`` of ``kv`` into ``cache``."""
        from flashcompress import compress_norm_rope_store

        compress_norm_rope_store(kv, plan, norm_weight=consts.norm_weight, norm_eps=NORM_EPS,
                                 freq_cis=consts.freq_cis, out_loc=out_loc, kvcache=cache,
                                 page_size=kind.page_size, use_fp4=kind.fmt is L.INDEXER_FP4)

    def fused(self, kind: LayerKind, state: torch.Tensor, x: torch.Tensor, ape: torch.Tensor, plan,
              consts: "Consts", out_loc: torch.Tensor, cache: torch.Tensor) -> None:
        """``compress_and_store``."""
        from flashcompress import compress_and_store

        compress_and_store(state, x, ape, plan, head_dim=kind.head_dim, compress_ratio=kind.ratio,
                           norm_weight=consts.norm_weight, norm_eps=NORM_EPS, freq_cis=consts.freq_cis,
                           out_loc=out_loc, kvcache=cache, page_size=kind.page_size,
                           use_fp4=kind.fmt is L.INDEXER_FP4, is_online=kind.online)


    def v41_compress(self, kind, mode: str, x: torch.Tensor, ring: torch.Tensor | None, norm_weight: torch.Tensor,
                     eps: float, freqs_cis: torch.Tensor, cache: torch.Tensor, meta: dict, ring_size: int,
                     draft_len: int) -> torch.Tensor:
        """A V4.1 source layer's compressor call (``mode``: prefill / decode / verify); returns the latent.

        Ratio 1: ``c1_decode_norm_rope_store`` (every mode, ``out_loc = raw_out_loc``); ratio 2:
        ``c2_prefill_norm_rope_store`` (``meta["ranges"]`` = extend starts, lengths) or
        ``c2_decode_norm_rope_store`` (``draft_len`` for verify).
        """
        from flashcompress.v41 import c1_decode_norm_rope_store, c2_decode_norm_rope_store, c2_prefill_norm_rope_store

        common = dict(page_size=kind.page_size, layout=kind.layout)
        pos, req, raw = meta["positions"], meta["req"], meta["raw_out_loc"]
        if kind.ratio == 1:
            return c1_decode_norm_rope_store(x, norm_weight, pos, raw, eps, freqs_cis, cache, **common)
        if mode == "prefill":
            start, lens = meta["ranges"]
            return c2_prefill_norm_rope_store(x, ring, norm_weight, pos, req, raw, eps, freqs_cis, cache, start, lens,
                                              ring_size=ring_size, **common)
        return c2_decode_norm_rope_store(x, ring, norm_weight, pos, req, raw, eps, freqs_cis, cache,
                                         ring_size=ring_size, draft_len=draft_len if mode == "verify" else 1,
                                         **common)

    def v41_index_k(self, kind, k_in: torch.Tensor, k_norm_weight: torch.Tensor, eps: float, freqs_cis: torch.Tensor,
                    positions: torch.Tensor, loc: torch.Tensor, cache: torch.Tensor) -> None:
        """``index_k_norm_rope_pack_store`` of a V4.1 source layer's keys."""
        from flashcompress.v41 import index_k_norm_rope_pack_store

        index_k_norm_rope_pack_store(k_in, k_norm_weight, eps, freqs_cis, positions, loc, cache, ratio=kind.ratio)


# --------------------------------------------------------------------------- comparisons
# Each returns None when the two sides agree, else the first mismatch in words.


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def compare_plans(got, want) -> str | None:
    """Plan tensors byte for byte."""
    for i, (g, w) in enumerate(zip(got[1:], want[1:]), start=1):
        g = g.cpu()
        if g.shape != w.shape:
            return f"plan[{i}] shape {tuple(g.shape)}, reference {tuple(w.shape)}"
        diff = (g != w).nonzero()
        if diff.numel():
            row, col = diff[0].tolist()
            return f"plan[{i}] row {row} byte {col}: {int(g[row, col])}, reference {int(w[row, col])}"
    return None


def compare_state(got: torch.Tensor, want: torch.Tensor, before: torch.Tensor, kind: LayerKind) -> str | None:
    """State pools: bit-identical, or the online tolerances on the rows the call wrote."""
    got = got.cpu()
    diff = (_bits(got) != _bits(want)).any(dim=1)
    if not kind.online:
        if bool(diff.any()):
            row = int(diff.nonzero()[0])
            col = int((_bits(got[row]) != _bits(want[row])).nonzero()[0])
            return f"state row {row} col {col}: {got[row, col].item()!r}, reference {want[row, col].item()!r}"
        return None
    touched = (_bits(want) != _bits(before)).any(dim=1) | (_bits(got) != _bits(before)).any(dim=1)
    if bool((diff & ~touched).any()):
        return f"state row {int((diff & ~touched).nonzero()[0])} changed although the call does not write it"
    rows = diff.nonzero().flatten()
    if not rows.numel():
        return None
    H = kind.head_dim
    g, w = got[rows].double(), want[rows].double()
    if not torch.equal(_bits(got[rows][:, :H]), _bits(want[rows][:, :H])):
        return f"online state row {int(rows[0])}: running max differs"
    s_err = ((g[:, H:2 * H] - w[:, H:2 * H]).abs() / w[:, H:2 * H].abs().clamp_min(1e-30)).max()
    if not s_err <= 1e-6:
        return f"online state: running sum relative error {float(s_err):.3g} > 1e-6"
    k_err = ((g[:, 2 * H:] - w[:, 2 * H:]).abs() / w[:, 2 * H:].abs().amax(dim=1, keepdim=True).clamp_min(1e-30)).max()
    if not k_err <= 1e-5:
        return f"online state: running mean error {float(k_err):.3g} of the row max > 1e-5"
    return None


def compare_output(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """``compress_forward`` rows (fp32): 1e-5 of the row max per element, 1e-6 relative L2 per row."""
    g, w = got.cpu().double(), want.double()
    if g.shape != w.shape:
        return f"output shape {tuple(g.shape)}, reference {tuple(w.shape)}"
    if not bool(torch.isfinite(g).all()):
        return f"output row {int((~torch.isfinite(g)).any(dim=1).nonzero()[0])} is not finite"
    zero = (w == 0).all(dim=1)
    if not bool((g[zero] == 0).all()):
        return f"output row {int((zero & (g != 0).any(dim=1)).nonzero()[0])} has no event but is not zero"
    scale = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    err = (g - w).abs()
    bad = err > 1e-5 * scale
    if bool(bad.any()):
        row, col = bad.nonzero()[0].tolist()
        return (f"output row {row} col {col}: {g[row, col].item()!r}, reference {w[row, col].item()!r} "
                f"(row max {scale[row, 0].item():.4g})")
    l2 = err.pow(2).sum(dim=1).sqrt() / w.pow(2).sum(dim=1).sqrt().clamp_min(1e-30)
    if bool(l2[~zero].gt(1e-6).any()):
        row = int((l2 * (~zero)).argmax())
        return f"output row {row}: relative L2 error {float(l2[row]):.3g} > 1e-6"
    return None


def _signed(codes: torch.Tensor, sign: int) -> torch.Tensor:
    """Sign-magnitude codes as signed integers on one axis (+0 and -0 both 0), one apart per step."""
    codes = codes.to(torch.int64)
    mag = codes & (sign - 1)
    return torch.where(codes & sign != 0, -mag, mag)


def compare_cache(got: torch.Tensor, want: torch.Tensor, kind: LayerKind) -> str | None:
    """Caches after the same store: codes within one step, scales and RoPE bytes equal."""
    fmt, P = kind.fmt, kind.page_size
    got = got.cpu()
    D, S = fmt.data_bytes, fmt.scale_bytes
    data_g, data_w = got[:, : P * D].reshape(-1, P, D), want[:, : P * D].reshape(-1, P, D)
    sc_g, sc_w = got[:, P * D : P * (D + S)].reshape(-1, P, S), want[:, P * D : P * (D + S)].reshape(-1, P, S)
    if not torch.equal(got[:, P * (D + S):], want[:, P * (D + S):]):
        return "page padding bytes after the scales differ"
    slots = ((data_g != data_w).any(dim=2) | (sc_g != sc_w).any(dim=2)).nonzero().tolist()
    for page, slot in slots:
        where = f"cache page {page} slot {slot}"
        dg, dw, sg, sw = data_g[page, slot], data_w[page, slot], sc_g[page, slot], sc_w[page, slot]
        if fmt is L.INDEXER_FP8:
            g_s, w_s = sg.view(torch.float32).item(), sw.view(torch.float32).item()
            if not abs(g_s - w_s) <= 1e-6 * abs(w_s):
                return f"{where}: fp32 scale {g_s!r}, reference {w_s!r}"
        elif not torch.equal(sg, sw):
            return f"{where}: scale bytes {sg.tolist()}, reference {sw.tolist()}"
        if fmt is L.MAIN_V4:
            if not torch.equal(dg[448:], dw[448:]):
                return f"{where}: RoPE bf16 bytes differ"
            codes_g, codes_w, sign = dg[:448], dw[:448], 0x80
        elif fmt is L.INDEXER_FP4:
            codes_g = torch.stack((dg & 0xF, dg >> 4), -1).flatten()
            codes_w = torch.stack((dw & 0xF, dw >> 4), -1).flatten()
            sign = 0x8
        else:
            codes_g, codes_w, sign = dg, dw, 0x80
        steps = (_signed(codes_g, sign) - _signed(codes_w, sign)).abs()
        if bool((steps > 1).any()):
            i = int((steps > 1).nonzero()[0])
            return f"{where}: code {i} is 0x{int(codes_g[i]):x}, reference 0x{int(codes_w[i]):x}"
    return None


def compare_exact(got_state: torch.Tensor, want_state: torch.Tensor, got_cache: torch.Tensor,
                  want_cache: torch.Tensor) -> str | None:
    """State and cache byte for byte (the fused call against the two-step path)."""
    diff = (_bits(got_state) != _bits(want_state)).any(dim=1)
    if bool(diff.any()):
        return f"state row {int(diff.nonzero()[0])} differs from the two-step path"
    cdiff = (got_cache != want_cache).nonzero()
    if cdiff.numel():
        page, byte = cdiff[0].tolist()
        return (f"{cdiff.shape[0]} cache byte(s) differ from the two-step path, first at page {page} byte {byte}: "
                f"{int(got_cache[page, byte])} vs {int(want_cache[page, byte])}")
    return None


# --------------------------------------------------------------------------- the engine script


@dataclass
class World:
    """The allocator's tables: ``req_to_token`` (slot 0 = padding slot, all zeros) and ``full_to_state``."""

    req_to_token: torch.Tensor
    full_to_state: torch.Tensor
    full_tokens: int

    def to(self, device: torch.device) -> "World":
        return World(self.req_to_token.to(device), self.full_to_state.to(device), self.full_tokens)


@dataclass
class Consts:
    """Per-compressor constants of the layer: ``norm_weight`` and the RoPE table."""

    norm_weight: torch.Tensor
    freq_cis: torch.Tensor

    def to(self, device: torch.device) -> "Consts":
        return Consts(self.norm_weight.to(device), self.freq_cis.to(device))


def _world(max_ctx: int) -> World:
    """Three requests owning ``max_ctx // 256`` full pages each, in a scrambled physical order;
    full page 0 is the allocator's padding page, SWA pages are a second permutation of them."""
    pages = max_ctx // SWA_PAGE
    total = NUM_SLOTS * pages + 1
    gen = torch.Generator().manual_seed(7)
    phys = torch.randperm(total - 1, generator=gen) + 1
    req_to_token = torch.zeros(NUM_SLOTS + 1, max_ctx, dtype=torch.int32)
    offs = torch.arange(SWA_PAGE, dtype=torch.int32)
    for slot in range(1, NUM_SLOTS + 1):
        own = phys[(slot - 1) * pages : slot * pages]
        req_to_token[slot] = (own[:, None].to(torch.int32) * SWA_PAGE + offs).flatten()
    full_size = total * SWA_PAGE
    f2s = torch.zeros(full_size + SWA_PAGE + 1, dtype=torch.int64)  # padding entries map to SWA loc 0
    swa = torch.randperm(total - 1, generator=gen) + 1
    for fp, sp in zip(range(1, total), swa.tolist()):
        f2s[fp * SWA_PAGE : (fp + 1) * SWA_PAGE] = sp * SWA_PAGE + torch.arange(SWA_PAGE)
    f2s[-1] = -1
    return World(req_to_token, f2s, full_size)


def _script(kind: LayerKind) -> list[tuple]:
    """The engine steps: ``("prefill", extend lengths, graph, slot offset)``, ``("decode", count)``,
    ``("padded decode", padding rows)``; lengths per request slot 1..3."""
    if kind.ratio == 4:
        steps = [("prefill", (37, 10, 3), False, 0), ("prefill", (27, 6, 9), True, 0), ("decode", 6),
                 ("padded decode", 3)]
    else:
        steps = [("prefill", (300, 130, 20), False, 0), ("prefill", (83, 126, 100), True, 0), ("decode", 4),
                 ("padded decode", 2)]
    if kind.online:  # a target-verify extend of 2 draft tokens into MTP bank 1 (slot offset = logical size)
        steps.append(("prefill", (2, 2, 2), False, NUM_SLOTS + 1 + 2))
    return steps


@dataclass
class KindResult:
    """The outcome of one layer kind: first mismatch per check (None: PASS), and calls compared."""

    kind: LayerKind
    mismatches: dict[str, str | None] = field(default_factory=lambda: {c: None for c in CHECKS})
    compared: dict[str, int] = field(default_factory=lambda: {c: 0 for c in CHECKS})
    error: str | None = None  # an API call raised: every check not yet compared fails
    entries: int = 0  # compressed entries the script stored (rows with a closing window)

    def status(self, check: str) -> str:
        """``PASS``, ``FAIL`` or ``-`` (nothing compared)."""
        if self.mismatches[check] is not None or (self.error and not self.compared[check]):
            return "FAIL"
        return "PASS" if self.compared[check] else "-"

    @property
    def ok(self) -> bool:
        return self.error is None and all(m is None for m in self.mismatches.values())

    def record(self, check: str, step: str, mismatch: str | None) -> None:
        self.compared[check] += 1
        if mismatch is not None and self.mismatches[check] is None:
            self.mismatches[check] = f"{step}: {mismatch}"


class _KindRun:
    """One layer kind's script, run on the checked side and mirrored on the reference side."""

    def __init__(self, kind: LayerKind, subject: ApiBackend, reference: ApiBackend, seed: int):
        self.kind, self.sub, self.ref = kind, subject, reference
        self.result = KindResult(kind)
        self.gen = torch.Generator().manual_seed(seed)
        r, H = kind.ratio, kind.head_dim
        script = _script(kind)
        longest = max(sum(s[1][i] for s in script if s[0] == "prefill") for i in range(NUM_SLOTS)) + 16
        max_ctx = -(-longest // SWA_PAGE) * SWA_PAGE
        self.world_ref = _world(max_ctx)
        self.world = self.world_ref.to(subject.device)
        self.positions = [0] * (NUM_SLOTS + 1)
        width = L.state_width(r, H, kind.online)
        if kind.online:
            rows = (NUM_SLOTS + 1 + 2) * 2  # bank 0 and one MTP bank
        elif r == 4:
            rows = -(-(self.world.full_tokens // SWA_PAGE * kind.ring + kind.ring + 1) // r) * r
        else:
            rows = -(-((NUM_SLOTS + 1) * kind.ring + kind.ring + 1) // r) * r
        state = torch.full((rows, width), float("nan"))
        if not kind.online:  # the cleared last row of the convention (not needed by the kernels)
            state[-1, : width // 2], state[-1, width // 2 :] = 0.0, float("-inf")
        self.state = state.to(subject.device)
        slots = self.world.full_tokens // r
        self.cache = torch.full((-(-slots // kind.page_size), kind.fmt.page_bytes(kind.page_size)), POISON_BYTE,
                                dtype=torch.uint8).to(subject.device)
        from flashcompress.testing.oracle import deepseek_v4_freq_cis

        self.ape_ref = torch.randn(8 if r == 4 else 128, H, generator=self.gen) * 0.5
        self.consts_ref = Consts(1 + 0.1 * torch.randn(H, generator=self.gen), deepseek_v4_freq_cis(max_ctx))
        self.ape, self.consts = self.ape_ref.to(subject.device), self.consts_ref.to(subject.device)

    def _input(self, n: int) -> torch.Tensor:
        """``n`` projection rows: kv ~ N(0, 1), score ~ N(0, 4)."""
        half = L.input_width(self.kind.ratio, self.kind.head_dim) // 2
        return torch.cat([torch.randn(n, half, generator=self.gen),
                          2 * torch.randn(n, half, generator=self.gen)], dim=1)

    def _out_loc(self, slot: int, p: int) -> int:
        """The compressed slot of the window closing at position ``p`` (0 where none closes)."""
        r = self.kind.ratio
        return int(self.world_ref.req_to_token[slot, p]) // r if (p + 1) % r == 0 else 0

    def run(self) -> KindResult:
        for i, step in enumerate(_script(self.kind), start=1):
            what, label = step[0], f"step {i} ({step[0]})"
            try:
                if what == "prefill":
                    self._prefill(label, step[1], step[2], step[3])
                elif what == "decode":
                    for j in range(step[1]):
                        self._decode(f"{label[:-1]} {j + 1})", list(range(1, NUM_SLOTS + 1)), 0)
                else:
                    self._decode(label, list(range(1, NUM_SLOTS + 1)), step[1])
            except Exception as exc:  # noqa: BLE001 - an API call raised: the kind fails with it
                self.result.error = f"{label}: {type(exc).__name__}: {exc}"
                break
        return self.result

    def _prefill(self, label: str, extends: tuple[int, ...], graph: bool, slot_offset: int) -> None:
        slots = list(range(1, NUM_SLOTS + 1))
        seq = [self.positions[s] + e for s, e in zip(slots, extends)]
        x = self._input(sum(extends))
        locs = [self._out_loc(s, p) for s, e in zip(slots, extends) for p in range(self.positions[s], self.positions[s] + e)]
        mk = lambda side, world: side.prefill_plan(  # noqa: E731
            self.kind, world, torch.tensor(slots, device=world.req_to_token.device), torch.tensor(seq),
            torch.tensor(extends), graph, slot_offset)
        self._step(label, mk, x, locs)
        if not slot_offset:  # a verify extend does not advance the committed positions
            for s, e in zip(slots, extends):
                self.positions[s] += e

    def _decode(self, label: str, slots: list[int], padding: int) -> None:
        seq = [self.positions[s] + 1 for s in slots] + [1] * padding
        locs = [self._out_loc(s, self.positions[s]) for s in slots] + [0] * padding
        x = self._input(len(slots))
        if padding:  # padding rows all write the padding slot's row: give them one input row
            x = torch.cat([x, self._input(1).expand(padding, -1)])
        rids = slots + [0] * padding
        mk = lambda side, world: side.decode_plan(  # noqa: E731
            self.kind, world, torch.tensor(rids, device=world.req_to_token.device),
            torch.tensor(seq, device=world.req_to_token.device))
        self._step(label, mk, x, locs)
        for s in slots:
            self.positions[s] += 1

    def _step(self, label: str, make_plan: Callable, x_ref: torch.Tensor, locs: list[int]) -> None:
        """One engine call sequence (plan, compress_forward, store, fused) on both sides, compared."""
        kind, res, dev = self.kind, self.result, self.sub.device
        plan = make_plan(self.sub, self.world)
        plan_ref = make_plan(self.ref, self.world_ref)
        res.record("plans", label, compare_plans(plan, plan_ref))
        plan_cpu = type(plan)(plan[0], *[t.cpu() for t in plan[1:]], is_online=plan.is_online)
        x, out_loc_ref = x_ref.to(dev), torch.tensor(locs, dtype=torch.int64)
        out_loc = out_loc_ref.to(dev)
        state_f, cache_f = self.state.clone(), self.cache.clone()  # the fused call's copies
        # the reference compress_forward from the checked side's bytes and plan
        before = self.state.to("cpu", copy=True)
        state_ref = before.clone()
        kv_ref = self.ref.compress_forward(kind, state_ref, x_ref, self.ape_ref, plan_cpu)
        kv = self.sub.compress_forward(kind, self.state, x, self.ape, plan)
        res.record("state", label, compare_state(self.state, state_ref, before, kind))
        res.record("output", label, compare_output(kv, kv_ref))
        res.entries += int((kv_ref != 0).any(dim=1).sum())
        # the reference store of the checked side's rows
        cache_ref = self.cache.to("cpu", copy=True)
        self.ref.store(kind, kv.to("cpu", copy=True), plan_cpu, self.consts_ref, out_loc_ref, cache_ref)
        self.sub.store(kind, kv, plan, self.consts, out_loc, self.cache)
        res.record("cache", label, compare_cache(self.cache, cache_ref, kind))
        # the fused call from the same bytes against the two-step result
        self.sub.fused(kind, state_f, x, self.ape, plan, self.consts, out_loc, cache_f)
        res.record("fused", label, compare_exact(state_f.cpu(), self.state.cpu(), cache_f.cpu(), self.cache.cpu()))


# --------------------------------------------------------------------------- the report


@dataclass
class BuildSummary:
    """The prewarm of the preset's variants: counts by status and the failures."""

    variants: int
    by_status: dict[str, int]
    failures: list[str]
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.failures


@dataclass
class CheckReport:
    """Everything ``run_check`` found; ``ok`` is the exit status of ``flashcompress check``."""

    model: str
    device: str
    backend: str
    build: BuildSummary | None
    kinds: list[KindResult]
    seconds: float

    @property
    def ok(self) -> bool:
        return (self.build is None or self.build.ok) and all(k.ok for k in self.kinds)

    def table(self) -> str:
        """The report as text: the build line, the layer kind x check table, the first mismatches."""
        lines = [f"model {self.model}; device {self.device}; backend under test: {self.backend}"]
        if self.build is None:
            lines.append("kernels: not built (CPU self-test: both sides run the PyTorch backend)")
        else:
            counts = ", ".join(f"{n} {s}" for s, n in sorted(self.build.by_status.items()))
            lines.append(f"kernels: {self.build.variants} variant(s) ({counts}) in {self.build.seconds:.1f} s"
                         f" -> {'PASS' if self.build.ok else 'FAIL'}")
            lines += [f"  FAIL {f}" for f in self.build.failures]
        width = max(len(k.kind.name) for k in self.kinds) if self.kinds else 10
        lines.append("")
        lines.append(f"{'layer kind':<{width}}  {'entries':>7}  " + "  ".join(f"{c:<6}" for c in CHECKS).rstrip())
        lines.append(f"{'-' * width}  {'-' * 7}  " + "  ".join("-" * 6 for _ in CHECKS))
        for k in self.kinds:
            lines.append(f"{k.kind.name:<{width}}  {k.entries:>7}  "
                         + "  ".join(f"{k.status(c):<6}" for c in CHECKS).rstrip())
        problems = []
        for k in self.kinds:
            if k.error:
                problems.append(f"{k.kind.name}: stopped: {k.error}")
            problems += [f"{k.kind.name} / {c}: {m}" for c, m in k.mismatches.items() if m is not None]
        if problems:
            lines += ["", "first mismatches:"] + [f"  {p}" for p in problems]
        calls = sum(sum(k.compared.values()) for k in self.kinds)
        lines += ["", f"{'PASS' if self.ok else 'FAIL'}: {len(self.kinds)} layer kind(s), {calls} comparisons, "
                      f"{self.seconds:.1f} s"]
        return "\n".join(lines)


def _build(model: str) -> BuildSummary:
    """Build or load the preset's variants for this process's target (``flashcompress prewarm --model``)."""
    from flashcompress.jit.prewarm import prewarm_jobs, run_prewarm, variant_set

    started = time.perf_counter()
    keys = variant_set(models=[model])
    results = run_prewarm(keys, jobs=prewarm_jobs()[0])
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    failures = [f"{r.key.describe()}: {type(r.error).__name__}: {r.error}" for r in results if not r.ok]
    return BuildSummary(len(results), counts, failures, time.perf_counter() - started)


class NoGpuError(RuntimeError):
    """``run_check`` was asked for a GPU device that this machine does not have."""


def check_device(device: str | torch.device | None) -> torch.device:
    """The device to check (default ``cuda``); :class:`NoGpuError` for CUDA without a GPU, ``ValueError``
    for a device type other than cpu / cuda."""
    try:
        dev = torch.device("cuda" if device is None else device)
    except (RuntimeError, ValueError):
        raise ValueError(f"device must be cpu, cuda or cuda:N, got {str(device)!r}") from None
    if dev.type not in ("cuda", "cpu"):
        raise ValueError(f"device must be cpu, cuda or cuda:N, got {str(dev)!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise NoGpuError("no CUDA GPU is visible to torch (torch.cuda.is_available() is False), so there are no "
                         "kernels to check; `flashcompress check --device cpu` self-tests the check itself")
    return dev


def run_check(model: str = "deepseek-v4-flash", device: str | torch.device | None = None, *, seed: int = 0,
              subject: ApiBackend | None = None, progress: Callable[[str], None] | None = None) -> CheckReport:
    """Check the kernels against the PyTorch backend on ``device`` (default ``cuda``); see the module docstring.

    ``device="cpu"`` runs the self-test (PyTorch backend on both sides, nothing built).
    ``subject`` replaces the checked side (tests pass a corrupted one); ``progress``
    receives one line per layer kind as it starts.  Raises :class:`NoGpuError` when a
    CUDA device is asked for without one, ``ValueError`` for an unknown model.

    Example::

        report = run_check("deepseek-v4-flash", "cuda")
        print(report.table()); assert report.ok
    """
    from flashcompress.testing.check_v41 import V41KindRun, V41LayerKind, v41_layouts_for
    from flashcompress.testing.simulator import _backend_name

    layer_kinds(model)  # an unknown model raises before the device is looked at
    dev = check_device(device)
    kinds = layer_kinds(model, v41_layouts_for(dev))

    started = time.perf_counter()
    build = _build(model) if dev.type == "cuda" else None
    subject = subject or ApiBackend(dev)
    reference = ApiBackend("cpu")
    results = []
    for i, kind in enumerate(kinds):
        if progress:
            progress(f"[{i + 1}/{len(kinds)}] {kind.name}")
        runner = V41KindRun if isinstance(kind, V41LayerKind) else _KindRun
        results.append(runner(kind, subject, reference, seed + i).run())
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return CheckReport(model, _device_text(dev), _backend_name(dev), build, results, time.perf_counter() - started)


def _device_text(dev: torch.device) -> str:
    if dev.type != "cuda":
        return str(dev)
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    return f"cuda:{idx} ({torch.cuda.get_device_name(idx)})"
