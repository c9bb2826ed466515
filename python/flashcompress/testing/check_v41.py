"""The V4.1 low-ratio layer kinds of ``flashcompress check`` (spec ``v41.md`` §3-§5, §8).

A V4.1 model (``--model deepseek-v4.1-flash``) has no plans and no ratio-4/128 layer: its
compressor work is the ratio-2 source layers (``c2_prefill`` / ``c2_decode`` with the pair
ring) and the ratio-1 source layer (``c1``), each followed by the index-K store of the
latent it returned.  One layer kind per ratio and cache layout (the layouts the checked
GPU's deployment stores: V4 on Hopper / SM 12x, V41_FP4 and V41_FP4_NEW on SM100;
``v4`` for the CPU self-test) runs a fixed engine script over request slots 1..3:

1. a prefill from position 0 (extends 37, 10, 3);
2. a second prefill chunk (27, 6, 9) resuming at odd positions (ring partners), CUDA-graph
   padded (a zero-length request, two trailing rows with ``raw_out_loc == 0``);
3. four decode steps, then a decode batch with three padding rows (``req 0 / pos 0 / raw 0``);
4. a target-verify batch of ``draft_len`` 3 per request (ring 8) plus one zero-filled padded block,
   of which two rows per request are accepted, then one more decode step.

Every call runs on the checked device and, from the checked side's buffers copied to the
CPU, through the PyTorch backend; the columns compare (the V4.1 kernels are specified
byte for byte, so every comparison is exact):

=========== ===================================================================
``state``   the pair ring (ratio 2) bit for bit
``output``  the returned latent (``[N, 512]`` bf16) bit for bit
``cache``   the main cache and the index-K cache (68-byte slots, 64 a page) byte for byte
=========== ===================================================================

``plans`` and ``fused`` do not apply (``-``).  The index-K input is ``wk(latent)`` computed
once on the CPU from the checked latent, so both sides store the same keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashcompress.v41.layouts import INDEX_K_DIM, INDEX_K_SLOT_BYTES, LATENT_DIM, PAIR_STATE_WIDTH, KVLayout

__all__ = ["DRAFT_LEN", "INDEX_PAGE", "V41LayerKind", "V41KindRun", "v41_layer_kinds", "v41_layouts_for"]

DRAFT_LEN = 3
RING = 8  # pair_ring_size(3): wider than the verify blocks
INDEX_PAGE = 64
EPS = 1e-20  # V4.1-Flash's rms_norm_eps


@dataclass(frozen=True)
class V41LayerKind:
    """A V4.1 source layer of one ratio (1 or 2) storing one :class:`KVLayout`, with its index keys."""

    name: str
    ratio: int
    layout: KVLayout

    @property
    def page_size(self) -> int:
        """Main-cache page size: the 256-token full page divided by the ratio (256 / 128)."""
        return 256 // self.ratio


def v41_layouts_for(device: torch.device) -> tuple[str, ...]:
    """The low-ratio cache layouts a deployment on ``device`` stores (CPU self-test: ``v4``)."""
    if device.type != "cuda":
        return ("v4",)
    from flashcompress.cuda_ops.v41 import DEFAULT_LAYOUTS, SM100_LAYOUTS

    return SM100_LAYOUTS if torch.cuda.get_device_capability(device)[0] == 10 else DEFAULT_LAYOUTS


def v41_layer_kinds(ratios: tuple[int, ...], layouts: tuple[str, ...]) -> list[V41LayerKind]:
    """One kind per ratio (2 before 1, the model's layer order) and layout."""
    kinds = []
    for r in sorted(ratios, reverse=True):
        for lay in layouts:
            layout = KVLayout.parse(lay)
            kinds.append(V41LayerKind(f"V4.1 C{r} H{LATENT_DIM} {layout.value} + index-K", r, layout))
    return kinds


def _script() -> list[tuple]:
    """``("prefill", extends, graph padded)``, ``("decode", padding rows)``, ``("verify", accepted)``."""
    return [("prefill", (37, 10, 3), False), ("prefill", (27, 6, 9), True)] + [("decode", 0)] * 4 + \
        [("decode", 3), ("verify", 2), ("decode", 0)]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def compare_bits(what: str, got: torch.Tensor, want: torch.Tensor) -> str | None:
    """Tensors bit for bit (rows of a 2-D tensor named in the message)."""
    g, w = _bits(got.cpu()), _bits(want)
    if g.shape != w.shape:
        return f"{what} shape {tuple(g.shape)}, reference {tuple(w.shape)}"
    diff = (g != w).nonzero()
    if not diff.numel():
        return None
    row, col = diff[0].tolist()
    return f"{diff.shape[0]} {what} element(s) differ, first at row {row} col {col}"


def compare_bytes(what: str, got: torch.Tensor, want: torch.Tensor) -> str | None:
    """Cache pages byte for byte; the first differing byte named by page and offset."""
    got = got.cpu()
    diff = (got != want).nonzero()
    if not diff.numel():
        return None
    page, byte = diff[0].tolist()
    return (f"{diff.shape[0]} {what} byte(s) differ, first at page {page} byte {byte} "
            f"(0x{int(got[page, byte]):02x}, reference 0x{int(want[page, byte]):02x})")


class V41KindRun:
    """One V4.1 layer kind's script on the checked side, mirrored on the reference side."""

    def __init__(self, kind: V41LayerKind, subject, reference, seed: int):
        from flashcompress.testing.check import NUM_SLOTS, POISON_BYTE, KindResult, _world
        from flashcompress.testing.simulator_v41 import v41_freqs_cis

        self.kind, self.sub, self.ref = kind, subject, reference
        self.result = KindResult(kind)  # type: ignore[arg-type]
        self.gen = torch.Generator().manual_seed(seed)
        self.slots = list(range(1, NUM_SLOTS + 1))
        longest = max(sum(s[1][i] for s in _script() if s[0] == "prefill") for i in range(NUM_SLOTS)) + 32
        max_ctx = -(-longest // 256) * 256
        self.world = _world(max_ctx)
        self.positions = [0] * (NUM_SLOTS + 1)
        dev, r = subject.device, kind.ratio
        full = self.world.full_tokens
        pages = -(-(full // r + 256) // kind.page_size)
        self.cache = torch.full((pages, kind.layout.page_bytes(kind.page_size)), POISON_BYTE,
                                dtype=torch.uint8).to(dev)
        index_pages = -(-((full + 256) // r + 256) // INDEX_PAGE)
        self.index = torch.full((index_pages, INDEX_K_SLOT_BYTES * INDEX_PAGE), POISON_BYTE,
                                dtype=torch.uint8).to(dev)
        ring = torch.zeros((NUM_SLOTS + 2) * RING, PAIR_STATE_WIDTH)
        ring[:, LATENT_DIM:] = float("-inf")
        self.ring = ring.to(dev) if r == 2 else None
        self.freqs_ref = v41_freqs_cis(max_ctx)
        self.norm_ref = (1 + 0.2 * torch.randn(LATENT_DIM, generator=self.gen)).to(torch.bfloat16)
        self.k_norm_ref = (1 + 0.2 * torch.randn(INDEX_K_DIM, generator=self.gen)).to(torch.bfloat16)
        self.wk = (torch.randn(INDEX_K_DIM, LATENT_DIM, generator=self.gen) / LATENT_DIM ** 0.5).to(torch.bfloat16)
        self.freqs, self.norm, self.k_norm = (t.to(dev) for t in (self.freqs_ref, self.norm_ref, self.k_norm_ref))

    def _input(self, n: int) -> torch.Tensor:
        mag = 10.0 ** torch.randint(-2, 2, (n, 1), generator=self.gen).float()
        kv = torch.randn(n, LATENT_DIM, generator=self.gen) * mag
        if self.kind.ratio == 1:
            return kv.to(torch.bfloat16)
        return torch.cat((kv, 3 * torch.randn(n, LATENT_DIM, generator=self.gen)), 1)

    def _raw(self, slot: int, p: int) -> int:
        return int(self.world.req_to_token[slot, p])

    def run(self):
        for i, step in enumerate(_script(), start=1):
            label = f"step {i} ({step[0]})"
            try:
                if step[0] == "prefill":
                    self._prefill(label, step[1], step[2])
                elif step[0] == "decode":
                    self._decode(label, step[1])
                else:
                    self._verify(label, step[1])
            except Exception as exc:  # noqa: BLE001 - an API call raised: the kind fails with it
                self.result.error = f"{label}: {type(exc).__name__}: {exc}"
                break
        return self.result

    # -- the steps --------------------------------------------------------------------

    def _prefill(self, label: str, extends: tuple[int, ...], graph: bool) -> None:
        rows, starts, lens = [], [], []
        for s, e in zip(self.slots, extends):
            starts.append(len(rows))
            lens.append(e)
            rows += [(s, self.positions[s] + j) for j in range(e)]
            self.positions[s] += e
        if graph:
            starts.append(0)
            lens.append(0)
            rows += [None, None]
        self._step(label, "prefill", rows, (starts, lens))

    def _decode(self, label: str, padding: int) -> None:
        rows = [(s, self.positions[s]) for s in self.slots] + [None] * padding
        for s in self.slots:
            self.positions[s] += 1
        self._step(label, "decode", rows)

    def _verify(self, label: str, accepted: int) -> None:
        rows = [(s, self.positions[s] + j) for s in self.slots for j in range(DRAFT_LEN)]
        rows += [None] * DRAFT_LEN  # a padded block: zero-filled graph rows (req, positions, raw_out_loc 0)
        for s in self.slots:
            self.positions[s] += accepted
        self._step(label, "verify", rows)

    def _step(self, label: str, mode: str, rows: list, ranges: tuple | None = None) -> None:
        kind, res, dev = self.kind, self.result, self.sub.device
        pos = torch.tensor([0 if r is None else r[1] for r in rows], dtype=torch.int64)
        req = torch.tensor([0 if r is None else r[0] for r in rows], dtype=torch.int64)
        raw = torch.tensor([0 if r is None else self._raw(r[0], r[1]) for r in rows], dtype=torch.int64)
        x_ref = self._input(len(rows))
        if kind.ratio == 2:
            loc = torch.where(raw == 0, torch.zeros_like(raw),
                              torch.where(pos % 2 == 1, raw // 2, torch.full_like(raw, -1)))
        else:
            loc = raw
        meta = dict(positions=pos, req=req, raw_out_loc=raw)
        if ranges is not None:
            meta["ranges"] = tuple(torch.tensor(t, dtype=torch.int32) for t in ranges)
        # the reference from the checked side's buffers
        cache_ref, index_ref = self.cache.to("cpu", copy=True), self.index.to("cpu", copy=True)
        ring_ref = None if self.ring is None else self.ring.to("cpu", copy=True)
        lat_ref = self.ref.v41_compress(kind, mode, x_ref, ring_ref, self.norm_ref, EPS, self.freqs_ref, cache_ref,
                                        meta, RING, DRAFT_LEN)
        lat = self.sub.v41_compress(kind, mode, x_ref.to(dev), self.ring, self.norm, EPS, self.freqs, self.cache,
                                    {k: (tuple(t.to(dev) for t in v) if isinstance(v, tuple) else v.to(dev))
                                     for k, v in meta.items()}, RING, DRAFT_LEN)
        if self.ring is not None:
            res.record("state", label, compare_bits("pair ring", self.ring, ring_ref))
        res.record("output", label, compare_bits("latent", lat, lat_ref))
        res.entries += int((loc > 0).sum())
        # index keys of the checked latent, on both sides
        k_in = (lat.detach().to("cpu", torch.float64) @ self.wk.double().t()).to(torch.bfloat16)
        self.ref.v41_index_k(kind, k_in, self.k_norm_ref, EPS, self.freqs_ref, pos, loc, index_ref)
        self.sub.v41_index_k(kind, k_in.to(dev), self.k_norm, EPS, self.freqs, pos.to(dev), loc.to(dev), self.index)
        mismatch = compare_bytes("main cache", self.cache, cache_ref) \
            or compare_bytes("index-K cache", self.index, index_ref)
        res.record("cache", label, mismatch)
