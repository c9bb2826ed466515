"""Fused ``compress_and_store`` against the two-step compress_forward + compress_norm_rope_store.

    python benchmarks/bench_pipeline.py [--short] [--cases prefill,online] [--md PATH] [--device cuda|cpu] [--peer]
                                        [--tiling auto,whole_row] (two-step and fused rows of each tiling)
                                        [--in-dtype bf16] (bf16 input, ape and compressed rows; fp32 state)

Same cases, inputs and timing as ``bench_compress.py`` (see ``benchmarks/_common.py``).
Layer kinds and their stores: C4 main KV (head 512, V4 at page 64), C4 indexer (head
128, FP8 at page 64), C128 main KV (V4 at page 2) and online C128 main KV (V4 at page 2).
For every case two rows: ``two-step`` (compress_forward into a preallocated intermediate
(fp32; bf16 under ``--in-dtype bf16``), then compress_norm_rope_store from it; one timed unit) and ``fused``
(compress_and_store).  ``fused x`` = two-step cold time / fused cold time.

Byte model ("min MB", the same for both rows: what the pipeline must move, excluding
the fp32 intermediate): compress_forward's bytes (see ``bench_compress.py``) without
its output, plus the store's bytes (see ``bench_store.py``) without the kv rows and
without a second read of the plan: input rows once, the state rows the windows need,
the state rows written, ape once, plan rows once, and per stored row its freq_cis row
(256 B), out_loc (8 B) and cache entry (584 / 132 B); the norm weight once.

``peer`` is SGLang 0.5.23's two-launch pipeline measured the same way on one H200
(issue 12); ``target`` applies to the fused row.  ``ok`` and ``!`` as in
``bench_compress.py``.

``--peer``: SGLang's two-launch pipeline (its compress kernel into the same fp32
intermediate, then its ``FusedNormRopeKernel`` store from it; one timed unit) on the same
buffers, measured once per (case, layer) and shown on both rows, so ``fc/peer`` reads
two-step / SGLang and fused / SGLang; columns otherwise as in ``bench_compress.py --peer``.
"""

from __future__ import annotations

import sys

import torch

import _common as C
from flashcompress import compress_and_store, compress_forward, compress_norm_rope_store

# (label, layer, store)
KINDS = (
    ("c4-512 v4@64", "c4-512", C.STORE_V4_C4),
    ("c4-128 fp8@64", "c4-128", C.STORE_IDX_FP8),
    ("c128-512 v4@2", "c128-512", C.STORE_V4_C128),
    ("c128-online v4@2", "c128-online", C.STORE_V4_C128),
)
NORM_EPS = 1e-6
COLUMNS = ["case", "layer", "path", *C.COLUMNS[2:], "fused x"]
PEER_COLUMNS = ["case", "layer", "path", *C.PEER_COLUMNS[2:], "fused x"]

T = C.Target
TARGETS: dict[tuple[str, str], C.Target] = {
    ("decode-B128-rand", "c4-512 v4@64"): T("8.8 / 3.4", 5.5, 1.8),
    ("decode-B512-rand", "c4-512 v4@64"): T("11.4 / 4.4", 7.0, 2.5),
    ("decode-B512-rand", "c4-128 fp8@64"): T("9.0 / 3.5", 5.5, 1.8),
    ("decode-B512-rand", "c128-512 v4@2"): T("17.9 / 9.5", 6.5, 2.8),
    ("decode-B512-bnd", "c128-512 v4@2"): T("77.6 (83%)", pct_min=92),
    ("prefill-8192", "c4-512 v4@64"): T("34.0 (49%)", pct_min=80),
    ("prefill-32768", "c4-512 v4@64"): T("95.3 (69%)", pct_min=88),
    ("prefill-8192", "c4-128 fp8@64"): T("16.6 (26%)", pct_min=65),
    ("prefill-32768", "c4-128 fp8@64"): T("33.6 (50%)", pct_min=85),
    ("prefill-8192", "c128-512 v4@2"): T("22.1 (38%)", pct_min=70),
    ("prefill-32768", "c128-512 v4@2"): T("49.5 (66%)", pct_min=88),
    ("decode-B512-rand", "c128-online v4@2"): T("10.7 / 3.6", 6.5, 2.2),
    ("decode-B512-bnd", "c128-online v4@2"): T("12.5 / 3.7", 6.5, 2.2),
    ("prefill-8192", "c128-online v4@2"): T("24.4 (33%)", pct_min=70),
    ("prefill-32768", "c128-online v4@2"): T("51.7 (61%)", pct_min=88),
}


def main(argv: list[str] | None = None) -> int:
    args = C.parse_args(__doc__, argv)
    dev = torch.device(args.device)
    timer = C.Timer(dev, args.reps, args.graph_replays)
    head = C.header("bench_pipeline.py (compress_and_store vs two-step)", timer, args)
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
        for label, lname, store in KINDS:
            if not C.matches(args.filters, spec.name, label):
                continue
            layer = C.LAYERS[lname]
            if C.skips_dtype(layer, args.in_dtype):
                continue
            b = C.build_bundle(world, layer, C.seed_of(spec.name, lname, base=args.seed), args.in_dtype)
            shown = C.dtype_label(label, args.in_dtype)
            cache = b.cache(store)
            common = dict(norm_weight=b.norm_weight, norm_eps=NORM_EPS, freq_cis=b.freq_cis, kvcache=cache,
                          page_size=store.page_size, use_fp4=store.use_fp4, bf16_store=store.bf16_store)

            def two_step(s: C.InputSet) -> None:
                compress_forward(b.state, s.inp, b.ape, s.plan, head_dim=layer.head_dim, compress_ratio=layer.ratio,
                                 out=s.out, is_online=layer.online)
                compress_norm_rope_store(s.out, s.plan, out_loc=s.out_loc, **common)

            def fused(s: C.InputSet) -> None:
                compress_and_store(b.state, s.inp, b.ape, s.plan, head_dim=layer.head_dim,
                                   compress_ratio=layer.ratio, out_loc=s.out_loc, is_online=layer.online, **common)

            nbytes = C.mean_bytes([C.pipeline_total(layer, store, C.compress_bytes(layer, s, spec.is_decode))
                                   for s in b.sets])
            target = TARGETS.get((spec.name, label)) if shown == label else None  # (fp32 targets)
            measured: dict[str, C.Timing] = {}
            first: dict[str, object] = {}
            runs = [(C.tiling_label(path, tiling, args.tilings), fn, tiling) for tiling in args.tilings
                    for path, fn in (("two-step", two_step), ("fused", fused))]
            tiling_of = {path: tiling for path, _, tiling in runs}
            for path, fn, tiling in runs:
                C.use_tiling(tiling, dev)
                calls = [(lambda s=s, fn=fn: fn(s)) for s in b.sets]
                first[path] = calls[0]
                if side:
                    t = C.measure_all(timer, calls)
                else:
                    cold, ahead, graph, err = C.measure(timer, calls)
                    t = C.Timing(cold, ahead, None, graph, err)
                if t.err:
                    notes.append(f"{spec.name} {shown} {path}: {t.err}")
                measured[path] = t
            C.use_tiling(args.tilings[0], dev)
            pe = None
            if side:
                def peer_calls() -> list:
                    out = []
                    for s in b.sets:
                        comp = side.peer.compress_call(layer.ratio, layer.head_dim, layer.online, b.state, s.inp,
                                                       b.ape, s.out, s.plan[1:], spec.is_decode)
                        store_ = side.peer.store_call(s.out, s.plan[1], spec.is_decode, layer.ratio, b.norm_weight,
                                                      NORM_EPS, b.freq_cis, s.out_loc, cache, store.page_size,
                                                      store.use_fp4, store.bf16_store)
                        out.append(lambda comp=comp, store_=store_: (comp(), store_()))
                    return out
                pe, pcalls = side.time(timer, peer_calls, f"{spec.name} {shown}")
            two_cold = measured["two-step"].cold
            for path, t in measured.items():
                speedup = f"{two_cold / t.cold:.2f}" if two_cold and t.cold and path != "two-step" else ""
                if side:
                    C.use_tiling(tiling_of[path], dev)
                    delta = C.peer_delta(first[path], pcalls[0], [cache], [b.state]) if pcalls else "-"
                    C.use_tiling(args.tilings[0], dev)
                    row = C.peer_result_row(timer, spec.name, shown, t, pe, nbytes, target, extra=(path,),
                                            tail=(speedup,), show_target=path != "two-step", delta=delta)
                else:
                    row = C.result_row(timer, spec.name, shown, t.cold, t.ahead, t.graph, nbytes, target,
                                       extra=(path,), tail=(speedup,), show_target=path != "two-step")
                print("  " + "  ".join(row), file=sys.stderr, flush=True)
                rows.append(row)
            del b, cache, common
            C.release(dev)

    C.run_cases(C.select_cases(dev, args.short, args.filters, labels), bench_case, notes, dev)
    return C.finish(args, "bench_pipeline.py: compress_and_store vs compress_forward + compress_norm_rope_store"
                    + (" vs SGLang's two-launch pipeline" if side else ""), head,
                    PEER_COLUMNS if side else COLUMNS, rows, notes)


if __name__ == "__main__":
    sys.exit(main())
