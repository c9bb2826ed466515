"""Run one benchmark case's op a few times, for a profiler (Nsight Compute, compute-sanitizer).

    python benchmarks/profile_case.py --case prefill-32768 --layer c128-512 --op fused [--calls 3] [--tiling T]
    ncu --clock-control none --kernel-name-base demangled -k 'regex:flashcompress::(compress|store)::' \\
        --launch-skip 2 --launch-count 1 --section SpeedOfLight \\
        python benchmarks/profile_case.py --case decode-B512-bnd --layer c128-512 --op fused

The kernel filter matters: building the case's inputs launches torch's random-number and
arithmetic kernels and the plan kernels (``flashcompress::plan::``), which ``--launch-skip``
alone would count and profile instead of the op's kernels.

Same inputs as ``bench_compress.py`` / ``bench_pipeline.py`` (``_common.build_world`` /
``build_bundle``, the first input set). ``--op``: ``compress`` (compress_forward),
``store`` (compress_norm_rope_store of the bundle's rows), ``fused`` (compress_and_store).
Stores go to the layer kind's cache of the benchmarks (C4 main KV: V4 at page 64, indexer:
FP8 at page 64, C128 and online: V4 at page 2). No timing: the profiler measures. Each call
is followed by a synchronisation, so every launch of call i precedes every launch of call i + 1
(decode: 1 launch per call; prefill compress / fused: 2, the pooling pass then the write pass).
``--tiling``: the compress variants' tiling (``cuda_ops.compress.set_tiling``; default "auto").
"""

from __future__ import annotations

import argparse
import sys

import torch

import _common as C
from flashcompress import compress_and_store, compress_forward, compress_norm_rope_store

STORES = {"c4-512": C.STORE_V4_C4, "c4-128": C.STORE_IDX_FP8, "c128-512": C.STORE_V4_C128,
          "c128-online": C.STORE_V4_C128}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", required=True, help="a case name of bench_compress.py, e.g. decode-B512-bnd")
    p.add_argument("--layer", required=True, choices=sorted(STORES))
    p.add_argument("--op", choices=("compress", "store", "fused"), default="fused")
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--tiling", default=None, help="compress variant tiling (auto, whole_row, closing)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    dev = torch.device("cuda")
    C.use_tiling(args.tiling, dev)
    specs = {c.name: c for c in (*C.all_cases(dev), *C.DIAGNOSTIC_CASES)}
    if args.case not in specs:
        p.error(f"unknown case {args.case!r}; known: {', '.join(specs)}")
    spec, layer, store = specs[args.case], C.LAYERS[args.layer], STORES[args.layer]
    world = C.build_world(spec, dev, 1, C.seed_of(spec.name))
    b = C.build_bundle(world, layer, C.seed_of(spec.name, args.layer))
    s = b.sets[0]
    st = dict(norm_weight=b.norm_weight, norm_eps=1e-6, freq_cis=b.freq_cis, out_loc=s.out_loc, kvcache=b.cache(store),
              page_size=store.page_size, use_fp4=store.use_fp4, bf16_store=store.bf16_store)
    for _ in range(args.calls):
        if args.op == "compress":
            compress_forward(b.state, s.inp, b.ape, s.plan, head_dim=layer.head_dim, compress_ratio=layer.ratio,
                             out=s.out, is_online=layer.online)
        elif args.op == "store":
            compress_norm_rope_store(s.kv, s.plan, **st)
        else:
            compress_and_store(b.state, s.inp, b.ape, s.plan, head_dim=layer.head_dim, compress_ratio=layer.ratio,
                               is_online=layer.online, **st)
        torch.cuda.synchronize()
    print(f"{args.calls} x {args.op} on {args.case} {args.layer}: done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
