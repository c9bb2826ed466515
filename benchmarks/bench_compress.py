"""compress_forward benchmark: decode and prefill, C4 head 512 / 128, C128 and online C128.

    python benchmarks/bench_compress.py [--short] [--cases decode-B512,prefill] [--md PATH] [--device cuda|cpu] [--peer]
                                        [--in-dtype bf16] (bf16 input, ape and out rows; fp32 state)
                                        [--tiling auto,whole_row] (each tiling's rows side by side)

Cases, timing and input construction: see ``benchmarks/_common.py`` (issue 11's
measurement: cold = L2 flushed before each call, median; graph = 20 calls in one CUDA
graph, per call; copy = 1 GiB device-to-device copy in the same run).

Byte model ("min MB": the minimum bytes one call must move; 4-byte elements, except input rows,
``ape`` and output rows under ``--in-dtype bf16``, which count 2):

* input rows, read once: tokens x in_width x 4 (C4: 4H, C128 / online: 2H);
* state rows a closing window pools that lie before the call's first token, counted
  once per distinct (position, half) with 2H x 4 bytes each: decode C4 7 halves (3 own
  + 4 overlap), decode C128 127 rows, prefill only the first windows' prefix rows;
* state rows written: decode one row (the input row, 4H / 2H wide); prefill the rows the
  write policy keeps (from the open window's start, C4 from 4 tokens earlier, plus the
  last 4 tokens of every 256-token page in paged C4);
* online C128: one 3H state row read when the call starts inside a window, one written
  when it ends inside one;
* output: every plan row x H x 4 (non-boundary decode rows are zeros, written);
* ape once (8 or 128 rows x H x 4; online the rows its tokens use), plan rows (16 B,
  WritePlan 8 B / online 16 B).

Columns ``peer`` / ``target`` are issue 11's tables (SGLang 0.5.23 on one H200, cold us /
graph us or % of copy); ``ok`` is PASS / MISS against the target (``?`` when a measured
value is missing; ``!`` after a cold time: the host fell behind the GPU there, so that
time includes host gaps).  B <= 32 cases are held to the upper end of the peer's
4.3-6.7 / 1.2-1.9 us range (the issue gives no per-case number there).

``--peer``: SGLang's own compress kernels (``FlashCompress4Kernel`` / ``FlashCompress128Kernel``
/ ``FlashCompress128OnlineKernel``, through ``benchmarks/_peer.py``) on the same state pool,
input, ape, plan and output tensors, timed in the same run right after flashcompress;
the table gains ``clean`` (read flush) columns for both sides, ``fc/peer`` ratios (below 1:
flashcompress faster), the peer's ``% copy`` and both sides' ``% copy clean`` (the same from the
clean time, which carries no write-back of the flush); ``issue peer`` is the older figure from
the issue.  A peer op that cannot run leaves ``-`` and one note with the reason.
"""

from __future__ import annotations

import sys

import torch

import _common as C
from flashcompress import compress_forward

LAYER_NAMES = ("c4-512", "c4-128", "c128-512", "c128-online")

T = C.Target
TARGETS: dict[tuple[str, str], C.Target] = {
    ("decode-B128-rand", "c4-512"): T("6.4 / 2.0", 4.5, 1.4),
    ("decode-B512-rand", "c4-512"): T("9.0 / 3.0", 6.3, 2.1),
    ("decode-B512-rand", "c4-128"): T("6.5 / 1.9", 4.5, 1.3),
    ("decode-B512-rand", "c128-512"): T("15.3 / 8.1", 6.0, 2.5),
    ("decode-B512-bnd", "c128-512"): T("74.5 (86%)", pct_min=92),
    ("prefill-8192", "c4-512"): T("28.6 (60%)", pct_min=80),
    ("prefill-32768", "c4-512"): T("79.4 (86%)", pct_min=90),
    ("prefill-8192", "c4-128"): T("13.0 (33%)", pct_min=70),
    ("prefill-32768", "c4-128"): T("28.7 (60%)", pct_min=85),
    ("prefill-8192", "c128-512"): T("19.1 (44%)", pct_min=75),
    ("prefill-32768", "c128-512"): T("46.1 (71%)", pct_min=88),
    # online C128 against the peer's c128_online_v2
    ("decode-B512-rand", "c128-online"): T("7.6 / 2.24", 5.5, 1.5),
    ("decode-B512-bnd", "c128-online"): T("7.4 / 1.95", 5.5, 1.5),
    ("prefill-8192", "c128-online"): T("21.1 (38%)", pct_min=70),
    ("prefill-32768", "c128-online"): T("49.1 (65%)", pct_min=88),
}
for _b in (1, 32):
    for _s in ("rand", "bnd"):
        for _l in ("c4-512", "c4-128", "c128-512"):
            TARGETS.setdefault((f"decode-B{_b}-{_s}", _l), T("4.3-6.7 / 1.2-1.9", 6.7, 1.9))


def main(argv: list[str] | None = None) -> int:
    args = C.parse_args(__doc__, argv)
    dev = torch.device(args.device)
    timer = C.Timer(dev, args.reps, args.graph_replays)
    head = C.header("bench_compress.py (compress_forward)", timer, args)
    rows: list[list[str]] = []
    notes: list[str] = []
    side = C.PeerSide(dev, notes) if args.peer else None
    if side:
        head.append(side.peer.describe())
        side.prewarm()
    print("\n".join(head), flush=True)

    def bench_case(spec: C.CaseSpec) -> None:
        world = C.build_world(spec, dev, C.n_sets_for(spec, dev, args.sets), C.seed_of(spec.name, base=args.seed))
        for name in LAYER_NAMES:
            if not C.matches(args.filters, spec.name, name):
                continue
            if C.skips_dtype(C.LAYERS[name], args.in_dtype):
                continue
            for tiling in args.tilings:
                C.use_tiling(tiling, dev)
                bench_layer(spec, world, name, C.tiling_label(C.dtype_label(name, args.in_dtype), tiling, args.tilings))
        C.use_tiling(args.tilings[0], dev)

    def bench_layer(spec: C.CaseSpec, world: object, name: str, shown: str) -> None:
        """One layer of one case under the current tiling, its rows labelled ``shown``."""
        layer = C.LAYERS[name]
        b = C.build_bundle(world, layer, C.seed_of(spec.name, name, base=args.seed), args.in_dtype)
        calls = [
            (lambda s=s: compress_forward(b.state, s.inp, b.ape, s.plan, head_dim=layer.head_dim,
                                          compress_ratio=layer.ratio, out=s.out, is_online=layer.online))
            for s in b.sets
        ]
        nbytes = C.mean_bytes([C.compress_total(C.compress_bytes(layer, s, spec.is_decode)) for s in b.sets])
        target = TARGETS.get((spec.name, name)) if args.in_dtype == torch.float32 else None  # (fp32 targets)
        if side:
            fc = C.measure_all(timer, calls)
            if fc.err:
                notes.append(f"{spec.name} {shown}: {fc.err}")
            pe, pcalls = side.time(timer, lambda: [
                side.peer.compress_call(layer.ratio, layer.head_dim, layer.online, b.state, s.inp, b.ape, s.out,
                                        s.plan[1:], spec.is_decode) for s in b.sets], f"{spec.name} {shown}")
            delta = C.peer_delta(calls[0], pcalls[0], [b.sets[0].out], [b.state]) if pcalls else "-"
            row = C.peer_result_row(timer, spec.name, shown, fc, pe, nbytes, target, delta=delta)
        else:
            cold, ahead, graph, err = C.measure(timer, calls)
            if err:
                notes.append(f"{spec.name} {shown}: {err}")
            row = C.result_row(timer, spec.name, shown, cold, ahead, graph, nbytes, target)
        print("  " + "  ".join(row), file=sys.stderr, flush=True)
        rows.append(row)
        del b, calls
        C.release(dev)

    C.run_cases(C.select_cases(dev, args.short, args.filters, LAYER_NAMES), bench_case, notes, dev)
    return C.finish(args, "bench_compress.py: compress_forward" + (" vs SGLang" if side else ""), head,
                    C.PEER_COLUMNS if side else C.COLUMNS, rows, notes)


if __name__ == "__main__":
    sys.exit(main())
