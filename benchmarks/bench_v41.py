"""V4.1 low-ratio op benchmark: c1 / c2 decode / c2 prefill / index-K (issue 29 cases).

    python benchmarks/bench_v41.py [--cases c1,index] [--md PATH] [--device cuda|cpu] [--layout v4|v41_fp4|...]
                                   [--design base,fast,fast2,fast3] [--peer]

Cases: c1 decode 1 / 64 / 512 rows and 8192 rows (page 256); c2 decode 1 / 64 / 512 requests
(ring 2, page 128; half the requests at odd positions, which pool and store, half park);
c2 prefill 4 requests x 2048 tokens; index-K 64 / 512 / 8192 rows (ratio 1, page 64). Inputs
random normal, slots a random permutation, positions random in the RoPE table. Timing and
columns as the other op benchmarks (``_common.py``: cold = L2 flushed, graph = CUDA-graph
replay, ``% copy`` of the device-to-device copy bandwidth). On ``--device cpu`` a smoke run
of the PyTorch backend at tiny sizes.

Targets (``target`` / ``ok`` columns): issue 29's cold / graph µs and % of copy per case.

Byte model ("min MB"): input rows read (c1 1024 B, c2 4096 B, index-K 256 B per row), the
latent written (1024 B per row c1, per pooled row c2), c2 partners read from the ring (4096 B
per pooled decode row whose partner is in the ring) and rows parked (4096 B), 8 + 8 B of
metadata per row (+ 8 B req for c2), the RoPE row (256 B) and the cache entry (layout bytes /
68 B) per stored row.

``--design``: the ``v41`` kernel designs to time (``base``, ``fast``, ``fast2``, ``fast3``; comma-separated;
each case once per design, the layer column ``LAYOUT/DESIGN``; default: the current one,
``FLASHCOMPRESS_V41_DESIGN`` or ``base``). Index-K has one design and runs once.

``--peer``: SGLang's V4.1 fused kernels (``benchmarks/_peer.py``: ``FlashCompress1Kernel``,
``FlashCompress2Kernel`` decode / prefill fusion, ``IndexKKernel``) on the same inputs, state
ring, outputs and caches; columns as in ``bench_compress.py --peer``.  ``vs peer`` runs both
once from the same state snapshot on zeroed outputs / caches: ``d=`` the largest difference
of the bf16 latents (and, for c2, of the fp32 ring), ``NB`` the differing cache bytes.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Callable

import torch

import _common as C
import flashcompress as fc
from flashcompress.v41.layouts import KVLayout


def _case_list(cpu: bool) -> list[tuple[str, str, int]]:
    if cpu:
        return [("c1", "c1-decode-8", 8), ("c2_decode", "c2-decode-8", 8), ("c2_prefill", "c2-prefill-2x16", 32),
                ("index_k", "index-k-8", 8)]
    return ([("c1", f"c1-decode-{n}", n) for n in (1, 64, 512, 8192)]
            + [("c2_decode", f"c2-decode-{n}", n) for n in (1, 64, 512)]
            + [("c2_prefill", "c2-prefill-4x2048", 4 * 2048)]
            + [("index_k", f"index-k-{n}", n) for n in (64, 512, 8192)])


# Issue 29's speed targets (cold / graph µs, % of copy) and the peer figures it quotes.
TARGETS = {
    "c1-decode-1": C.Target("5.9", cold_max=5.9, graph_max=1.5),
    "c1-decode-64": C.Target("5.7", cold_max=5.7, graph_max=1.5),
    "c1-decode-512": C.Target("6.7", cold_max=6.7, graph_max=1.5),
    "c1-decode-8192": C.Target("32.4", pct_min=70),
    "c2-decode-1": C.Target("6.4", cold_max=6.4, graph_max=1.8),
    "c2-decode-64": C.Target("6.9", cold_max=6.9, graph_max=1.8),
    "c2-decode-512": C.Target("8.5", cold_max=8.5, graph_max=1.8),
    "c2-prefill-4x2048": C.Target("32.2", pct_min=70),
}


def _freqs(rows: int, dev: torch.device) -> torch.Tensor:
    theta = torch.arange(rows, device=dev).double()[:, None] * 10000.0 ** (-torch.arange(32, device=dev).double() / 32)
    f = torch.empty(rows, 64, device=dev)
    f[:, 0::2], f[:, 1::2] = torch.cos(theta).float(), torch.sin(theta).float()
    return f


@dataclass
class Case:
    """One benchmark case: the flashcompress call, its byte model, and what a peer needs."""

    call: Callable[[], object]
    nbytes: float
    peer: Callable[[object], Callable[[], object]]  # _peer.Peer -> the peer's call on the same buffers
    written: list[torch.Tensor]  # outputs / caches both sides write (zeroed before ``vs peer``)
    state: list[torch.Tensor] = field(default_factory=list)  # read-and-written state (snapshot for ``vs peer``)


def build(op: str, n: int, layout: KVLayout, dev: torch.device, gen: torch.Generator) -> Case:
    """One case's buffers and calls."""
    table = 65536
    f = _freqs(table, dev)
    rnd = lambda *s: torch.randn(*s, generator=gen).to(dev)  # noqa: E731
    w512 = (1 + 0.1 * rnd(512)).to(torch.bfloat16)
    if op == "index_k":
        P = 64
        pages = n // P + 2
        x, w = rnd(n, 128).to(torch.bfloat16), (1 + 0.1 * rnd(128)).to(torch.bfloat16)
        pos = torch.randint(0, table, (n,), generator=gen).to(dev)
        loc = (torch.randperm(P * pages - 1, generator=gen)[:n] + 1).to(dev)
        cache = torch.zeros(pages, 68 * P, dtype=torch.uint8, device=dev)
        nbytes = n * (256 + 16 + 256 + 68)
        return Case(lambda: fc.index_k_norm_rope_pack_store(x, w, 1e-20, f, pos, loc, cache, ratio=1), nbytes,
                    lambda pe: pe.index_k_call(x, w, 1e-20, f, pos, loc, cache, 1), [cache])
    entry = layout.bytes_per_token
    if op == "c1":
        P = 256
        pages = n // P + 2
        x = rnd(n, 512).to(torch.bfloat16)
        pos = torch.randint(0, table, (n,), generator=gen).to(dev)
        loc = (torch.randperm(P * pages - 1, generator=gen)[:n] + 1).to(dev)
        cache = torch.zeros(pages, layout.page_bytes(P), dtype=torch.uint8, device=dev)
        out = torch.empty(n, 512, dtype=torch.bfloat16, device=dev)
        nbytes = n * (1024 + 1024 + 16 + 256 + entry)
        return Case(lambda: fc.c1_decode_norm_rope_store(x, w512, pos, loc, 1e-20, f, cache, page_size=P,
                                                         layout=layout, out=out), nbytes,
                    lambda pe: pe.c1_call(x, w512, pos, loc, 1e-20, f, cache, P, layout.value, out), [out, cache])
    P, ring = 128, 2
    state = torch.zeros(2 * n + 4, 1024, device=dev)
    state[:, 512:] = float("-inf")
    out = torch.empty(n, 512, dtype=torch.bfloat16, device=dev)
    if op == "c2_decode":
        pages = n // P + 2
        x = rnd(n, 1024)
        pos = (2 * torch.randint(1, table // 2 - 1, (n,), generator=gen) + torch.arange(n) % 2).to(dev)
        req = torch.randperm(n, generator=gen).to(dev)
        raw = (2 * (torch.randperm(P * pages - 1, generator=gen)[:n] + 1)).to(dev) + (pos & 1)
        cache = torch.zeros(pages, layout.page_bytes(P), dtype=torch.uint8, device=dev)
        odd = n // 2 if n > 1 else 0
        nbytes = n * (4096 + 24) + odd * (4096 + 1024 + 256 + entry) + (n - odd) * 4096
        return Case(lambda: fc.c2_decode_norm_rope_store(x, state, w512, pos, req, raw, 1e-20, f, cache,
                                                         page_size=P, ring_size=ring, layout=layout, out=out),
                    nbytes, lambda pe: pe.c2_decode_call(x, state, w512, pos, req, raw, 1e-20, f, cache, P, ring,
                                                         layout=layout.value, out=out), [out, cache], [state])
    reqs = 4 if n >= 64 else 2
    per = n // reqs
    pos = torch.cat([torch.arange(per) + 1000 * b for b in range(reqs)]).to(dev)
    req = torch.arange(reqs).repeat_interleave(per).to(dev)
    raw = 2 * (torch.arange(n, device=dev) + 1) + (pos & 1)  # distinct slots (raw >> 1), parity = the position's
    pages = int(raw.max()) // (2 * P) + 2
    x = rnd(n, 1024)
    start = torch.arange(reqs, dtype=torch.int32, device=dev) * per
    lens = torch.full((reqs,), per, dtype=torch.int32, device=dev)
    cache = torch.zeros(pages, layout.page_bytes(P), dtype=torch.uint8, device=dev)
    nbytes = n * (4096 + 24) + (n // 2) * (1024 + 256 + entry) + reqs * ring * 4096
    return Case(lambda: fc.c2_prefill_norm_rope_store(x, state, w512, pos, req, raw, 1e-20, f, cache, start, lens,
                                                      page_size=P, ring_size=ring, layout=layout, out=out), nbytes,
                lambda pe: pe.c2_prefill_call(x, state, w512, pos, req, raw, 1e-20, f, cache, start, lens, P, ring,
                                              layout=layout.value, out=out), [out, cache], [state])


def main(argv: list[str] | None = None) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--layout", default="v4")
    pre.add_argument("--design", default=None)
    known, rest = pre.parse_known_args(argv)
    layout = KVLayout.parse(known.layout)
    from flashcompress.cuda_ops import v41 as v41_ops

    designs = known.design.split(",") if known.design else [v41_ops.current_design()]
    for d in designs:
        if d not in v41_ops.DESIGNS:
            raise SystemExit(f"bench_v41.py: --design {d!r}: expected one of {v41_ops.DESIGNS}")
    args = C.parse_args(__doc__, rest)
    dev = torch.device(args.device)
    timer = C.Timer(dev, args.reps, args.graph_replays)
    head = C.header(f"bench_v41.py (V4.1 low-ratio ops, layout {layout.value})", timer, args)
    rows, notes = [], []
    side = C.PeerSide(dev, notes) if args.peer else None
    if side:
        head.append(side.peer.describe())
        if side.peer.available:
            import _peer

            for err in side.peer.prewarm(_peer.v41_specs(side.peer, layout.value, index_ratio=1)):
                side.note(err)
    print("\n".join(head), flush=True)
    runs = [(op, name, n, d) for op, name, n in _case_list(dev.type == "cpu")
            for d in (designs[:1] if op == "index_k" else designs)]
    for op, name, n, design in runs:
        label = "index-k" if op == "index_k" else (layout.value if len(designs) == 1 else f"{layout.value}/{design}")
        if not C.matches(args.filters, name, label):
            continue
        v41_ops.set_design(design)
        try:
            case = build(op, n, layout, dev, torch.Generator().manual_seed(args.seed))
            if side:
                t = C.measure_all(timer, [case.call])
            else:
                cold, ahead, graph, err = C.measure(timer, [case.call])
                t = C.Timing(cold, ahead, None, graph, err)
        except Exception as exc:  # a failing case leaves a note
            notes.append(f"{name}: failed ({C.short_error(exc)})")
            continue
        if t.err:
            notes.append(f"{name}: {t.err}")
        if side:
            pe, pcalls = side.time(timer, lambda: [case.peer(side.peer)], f"{name} {label}")
            delta = C.peer_delta(case.call, pcalls[0], case.written, case.state) if pcalls else "-"
            row = C.peer_result_row(timer, name, label, t, pe, case.nbytes, TARGETS.get(name), delta=delta)
        else:
            row = C.result_row(timer, name, label, t.cold, t.ahead, t.graph, case.nbytes, TARGETS.get(name))
        print("  " + "  ".join(row), file=sys.stderr, flush=True)
        rows.append(row)
        del case
        C.release(dev)
    return C.finish(args, "bench_v41.py: V4.1 low-ratio ops" + (" vs SGLang" if side else ""), head,
                    C.PEER_COLUMNS if side else C.COLUMNS, rows, notes)


if __name__ == "__main__":
    sys.exit(main())
