"""compress_norm_rope_store benchmark: RMSNorm + RoPE (+ Hadamard) + quantised paged store.

    python benchmarks/bench_store.py [--short] [--cases decode-B512,fp8] [--md PATH] [--device cuda|cpu] [--peer]
    FC_BENCH_STORE_LAYOUTS=v41,v41_fp4 python benchmarks/bench_store.py ...   # + rows of those layouts

Same cases, inputs and timing as ``bench_compress.py`` (see ``benchmarks/_common.py``);
the store reads random-normal fp32 rows (one per plan row) through the plans of each
case.  Stores: V4 main KV (584-byte entries) at page 64 for C4 head 512 (``v4@64``) and
at page 2 for C128 (``v4@2``); indexer FP8 (132 B) and FP4 (68 B) at page 64 for C4
head 128.  Online C128 plans store exactly like C128 ones and are not repeated here.
``FC_BENCH_STORE_LAYOUTS`` (comma-separated ``KVLayout`` values, default none: the tables
above only) adds the main-KV stores in those V4.1 layouts (``layout=``), ``<layout>@64`` for
C4 and ``<layout>@2`` for C128, with their entry sizes (528 / 288 / 512 B) in the byte model;
``--peer`` times the peer on the V4 rows only (SGLang's V4.1 stores need an SM100 build).

Byte model ("min MB"): 16 B per plan row read (decode: every request's row, to see
whether it closes a window); per stored row (a window closing: decode
``seq_len % ratio == 0``, prefill every valid CompressPlan row) the kv row H x 4 B, its
freq_cis row (32 complex64 = 256 B), its out_loc (8 B) and the cache entry written
(584 / 132 / 68 B); the norm weight (H x 4 B) once.

Targets (issue 12): at least as fast as the peer's store in every case (the issue gives
the peer's decode range, 4-7 us cold / 0.9-1.9 us graph, so decode rows are held to the
upper end); the 32768-token prefill <= 10 us cold for the C4 main-KV store (peer 20.3 us,
28% of copy) and <= 5 us for the indexer FP8 store (peer 8.9 us).  ``ok`` and ``!`` as in
``bench_compress.py``.

``--peer``: SGLang's ``FusedNormRopeKernel`` (``forward``; ``forward_fp4`` for the FP4
indexer) on the same kv rows, plan, norm weight, RoPE table, out_loc and cache; columns
as in ``bench_compress.py --peer``.
"""

from __future__ import annotations

import os
import sys

import torch

import _common as C
from flashcompress import compress_norm_rope_store
from flashcompress.layouts import MAIN_FORMATS
from flashcompress.v41.layouts import KVLayout

# (label, layer, store)
KINDS = (
    ("c4-512 v4@64", "c4-512", C.STORE_V4_C4),
    ("c4-128 fp8@64", "c4-128", C.STORE_IDX_FP8),
    ("c4-128 fp4@64", "c4-128", C.STORE_IDX_FP4),
    ("c128-512 v4@2", "c128-512", C.STORE_V4_C128),
)


def layout_kinds(spec: str) -> tuple[tuple[str, str, C.Store], ...]:
    """The main-KV rows of the layouts named in ``spec`` (``FC_BENCH_STORE_LAYOUTS``: comma-separated
    ``KVLayout`` values), C4 at page 64 then C128 at page 2 per layout."""
    out = []
    for name in filter(None, (p.strip() for p in spec.split(","))):
        layout = KVLayout.parse(name)
        fmt = MAIN_FORMATS[layout]
        for lname, page in (("c4-512", 64), ("c128-512", 2)):
            store = C.Store(f"{layout.value}@{page}", fmt, page, layout=layout.value)
            out.append((f"{lname} {store.name}", lname, store))
    return tuple(out)


KINDS += layout_kinds(os.environ.get("FC_BENCH_STORE_LAYOUTS", ""))
NORM_EPS = 1e-6

T = C.Target
TARGETS: dict[tuple[str, str], C.Target] = {
    ("prefill-32768", "c4-512 v4@64"): T("20.3 (28%)", 10.0),
    ("prefill-32768", "c4-128 fp8@64"): T("8.9", 5.0),
}
for _b in (1, 32, 128, 512):
    for _s in ("rand", "bnd"):
        for _k, _, _ in KINDS:
            TARGETS[(f"decode-B{_b}-{_s}", _k)] = T("4-7 / 0.9-1.9", 7.0, 1.9)


def main(argv: list[str] | None = None) -> int:
    args = C.parse_args(__doc__, argv)
    dev = torch.device(args.device)
    timer = C.Timer(dev, args.reps, args.graph_replays)
    head = C.header("bench_store.py (compress_norm_rope_store)", timer, args)
    rows: list[list[str]] = []
    notes: list[str] = []
    side = C.PeerSide(dev, notes) if args.peer else None
    if side:
        head.append(side.peer.describe())
        side.prewarm()
    print("\n".join(head), flush=True)
    labels = [k[0] for k in KINDS]

    def bench_case(spec: C.CaseSpec) -> None:
        world = C.build_world(spec, dev, C.n_sets_for(spec, dev, args.sets), C.seed_of(spec.name, base=args.seed))
        bundles: dict[str, C.Bundle] = {}
        for label, lname, store in KINDS:
            if not C.matches(args.filters, spec.name, label):
                continue
            layer = C.LAYERS[lname]
            if lname not in bundles:
                bundles.clear()  # one layer's tensors at a time (KINDS lists a layer's stores together)
                C.release(dev)
                bundles[lname] = C.build_bundle(world, layer, C.seed_of(spec.name, lname, base=args.seed))
            b = bundles[lname]
            cache = b.cache(store)
            calls = [
                (lambda s=s: compress_norm_rope_store(
                    s.kv, s.plan, norm_weight=b.norm_weight, norm_eps=NORM_EPS, freq_cis=b.freq_cis,
                    out_loc=s.out_loc, kvcache=cache, page_size=store.page_size, use_fp4=store.use_fp4,
                    bf16_store=store.bf16_store, layout=store.layout))
                for s in b.sets
            ]
            nbytes = C.mean_bytes([C.store_total(layer, store, C.compress_bytes(layer, s, spec.is_decode))
                                   for s in b.sets])
            target = TARGETS.get((spec.name, label))
            if side:
                fc = C.measure_all(timer, calls)
                if fc.err:
                    notes.append(f"{spec.name} {label}: {fc.err}")
                pe, pcalls = None, []
                if store.layout == "v4":  # the peer's V4.1 stores are not built for this GPU
                    pe, pcalls = side.time(timer, lambda: [
                        side.peer.store_call(s.kv, s.plan[1], spec.is_decode, layer.ratio, b.norm_weight, NORM_EPS,
                                             b.freq_cis, s.out_loc, cache, store.page_size, store.use_fp4,
                                             store.bf16_store) for s in b.sets], f"{spec.name} {label}")
                delta = C.peer_delta(calls[0], pcalls[0], [cache]) if pcalls else "-"
                row = C.peer_result_row(timer, spec.name, label, fc, pe, nbytes, target, delta=delta)
            else:
                cold, ahead, graph, err = C.measure(timer, calls)
                if err:
                    notes.append(f"{spec.name} {label}: {err}")
                row = C.result_row(timer, spec.name, label, cold, ahead, graph, nbytes, target)
            print("  " + "  ".join(row), file=sys.stderr, flush=True)
            rows.append(row)
            del cache, calls

    C.run_cases(C.select_cases(dev, args.short, args.filters, labels), bench_case, notes, dev)
    return C.finish(args, "bench_store.py: compress_norm_rope_store" + (" vs SGLang" if side else ""), head,
                    C.PEER_COLUMNS if side else C.COLUMNS, rows, notes)


if __name__ == "__main__":
    sys.exit(main())
