"""``python -m flashcompress demo``: an engine's compressor layer, checked end to end.

Simulates what a serving engine does with one DeepSeek-V4 layer's compressors over a few
requests (chunked prefill, then decode steps, batched across requests): build the plan,
``compress_forward`` into the state pool, ``compress_norm_rope_store`` into the paged
cache.  It runs a ratio-4 layer (main KV, head 512, V4 cache + the indexer, head 128,
FP8 cache; paged-SWA state), a ratio-128 layer (main KV, V4 cache; request-ring
state) and an online ratio-128 layer (main KV, V4 cache; one running-softmax state row
per request slot), on the GPU if there is one, else on the CPU.  Every stored cache entry is then
compared with the independent float64 model (:mod:`flashcompress.testing.oracle`), and a short
report is printed (a legend explains every column).  Progress is printed as each layer starts
and ends.  On the CPU it uses at most 4 threads (``torch.set_num_threads``; an explicit
``OMP_NUM_THREADS`` wins), so a busy small box is not oversubscribed.
``--model deepseek-v4.1-flash`` instead simulates DeepSeek-V4.1-Flash's four low-ratio source
layers (:mod:`flashcompress.testing.simulator_v41`).
Exit status 0 when everything matches, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

__all__ = ["main"]

LEGEND = (
    ("entries", "distinct compressed entries in the final cache, each compared with the float64 model"),
    ("stores", "store calls that wrote an entry (rewrites after rolled-back verify steps included)"),
    ("max pre-quant rel err", "largest relative error of a compress_forward row against the model's pooled "
                              "row, before quantisation"),
    ("code mismatches", "quantised codes outside the range a correct fp32 pipeline may produce: errors"),
    ("tie flips", "codes that differ from the model's nominal code but are admissible: the exact value "
                  "lies within float32 noise of a rounding boundary, so either neighbour is right; not errors"),
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flashcompress demo",
        description="Simulate an engine's KV compressor over a few requests and check every "
        "stored cache entry against the float64 model.",
    )
    p.add_argument("--device", default=None,
                   help="torch device to run on (default: cuda if a GPU is available, else cpu)")
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs and the schedule (default 0)")
    p.add_argument("--requests", type=int, default=5, help="requests per layer (default 5)")
    p.add_argument("--model", default="deepseek-v4-flash", choices=("deepseek-v4-flash", "deepseek-v4.1-flash"),
                   help="deepseek-v4-flash (default): C4 / C128 layers; deepseek-v4.1-flash: the four ratio-2 / "
                        "ratio-1 source layers, checked byte for byte against unchunked prefills")
    return p


def _device_text(device) -> str:
    import torch

    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        return f"{device} ({torch.cuda.get_device_name(idx)})"
    return str(device)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    argv = list(argv)
    if argv[:1] == ["--"]:  # `flashcompress demo -- --seed 3`
        argv = argv[1:]
    args = _parser().parse_args(argv)
    if args.requests < 1:
        print("flashcompress demo: --requests must be at least 1", file=sys.stderr)
        return 1
    import torch

    import flashcompress
    from flashcompress.testing import simulator as S

    if args.device is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            device = torch.device(args.device)
        except (RuntimeError, ValueError):
            device = None
        if device is None or device.type not in ("cpu", "cuda"):
            print(f"flashcompress demo: --device must be cpu, cuda or cuda:N, got {args.device!r}", file=sys.stderr)
            return 1
        if device.type == "cuda" and not torch.cuda.is_available():
            print(f"flashcompress demo: --device {args.device} asked for, but CUDA is not available",
                  file=sys.stderr)
            return 1

    if device.type == "cpu" and not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(min(4, os.cpu_count() or 1))

    n = args.requests
    if args.model == "deepseek-v4.1-flash":
        return _v41_demo(device, args.seed, n)
    layers = [
        ("ratio 4 layer: main KV + indexer", S.Scenario(
            4, (S.CompressorSpec("main KV", 512, "v4"), S.CompressorSpec("indexer", 128, "idx_fp8")),
            num_requests=n, min_len=24, max_len=600, max_decode=24)),
        ("ratio 128 layer: main KV", S.Scenario(
            128, (S.CompressorSpec("main KV", 512, "v4"),),
            num_requests=n, min_len=150, max_len=700, max_decode=24)),
        ("online ratio 128 layer: main KV", S.Scenario(
            128, (S.CompressorSpec("main KV", 512, "v4"),), online=True,
            num_requests=n, min_len=150, max_len=700, max_decode=24)),
    ]
    print(f"flashcompress {flashcompress.__version__} demo: an engine's compressor layers, "
          "checked against the float64 model", flush=True)
    threads = f"; {torch.get_num_threads()} CPU thread(s)" if device.type == "cpu" else ""
    print(f"device {_device_text(device)}{threads}; seed {args.seed}; {n} request(s) per layer", flush=True)
    t0 = time.perf_counter()
    results = []
    for i, (title, sc) in enumerate(layers, start=1):
        print(f"[{i}/{len(layers)}] {title}: simulating prefill + decode steps, then checking every entry ...",
              flush=True)
        started = time.perf_counter()
        try:
            res = S.simulate(sc, device=device, seed=args.seed)
        except Exception as exc:  # an API call raised: report it as the demo's failure
            print(f"\nFAIL: {title}: the engine simulation stopped with {type(exc).__name__}: {exc}")
            return 1
        results.append((title, res))
        print(f"[{i}/{len(layers)}] {title}: {res.steps['extend'] + res.steps['decode']} engine steps, "
              f"{'ok' if res.ok else 'FAIL'} in {time.perf_counter() - started:.1f} s", flush=True)
    elapsed = time.perf_counter() - t0
    print(f"\nbackend {results[0][1].backend}")
    total = bad = 0
    worst = 0.0
    for title, res in results:
        sc = res.scenario
        mode = "online" if sc.online else ("request-ring" if sc.req_ring else "paged-SWA")
        print()
        print(f"{title} (ring {sc.ring}, {mode} state)")
        print(f"  requests: lengths {res.request_lengths}")
        print(f"  steps: {res.steps['extend']} extend (chunked prefill), {res.steps['decode']} decode; "
              f"windows closed: {res.events['extend']} in prefill, {res.events['decode']} in decode")
        print(f"  {'cache':24s} {'entries':>8s} {'stores':>7s} {'max pre-quant rel err':>22s} "
              f"{'code mismatches':>16s} {'tie flips':>10s}  result")
        for rep in res.reports:
            label = f"{rep.spec.name} (H{rep.spec.head_dim}, {rep.spec.fmt})"
            print(f"  {label:24s} {rep.entries_checked:8d} {rep.entries_stored:7d} {rep.max_rel_err:22.2e} "
                  f"{rep.code_mismatches:16d} {rep.ties:10d}  {'ok' if rep.ok else 'FAIL'}")
            total += rep.entries_checked
            bad += len(rep.entry_failures) + len(rep.output_failures) + len(rep.poison_failures)
            worst = max(worst, rep.max_rel_err)
        for line in res.failures():
            print("  " + line)
    print("\ncolumns:")
    width = max(len(name) for name, _ in LEGEND)
    for name, meaning in LEGEND:
        print(f"  {name:<{width}}  {meaning}")
    ok = all(res.ok for _, res in results)
    print()
    if ok:
        print(f"PASS: all {total} stored entries match the model (max pre-quant rel err {worst:.2e}); "
              f"{elapsed:.1f} s")
        return 0
    print(f"FAIL: {bad} problem(s) found over {total} entries; {elapsed:.1f} s")
    return 1


def _v41_demo(device, seed: int, n: int) -> int:
    """V4.1-Flash's source layers (:mod:`flashcompress.testing.simulator_v41`): without speculation, then
    with verify blocks of 3 draft tokens, in the cache layout the device's deployment stores."""
    import flashcompress
    from flashcompress.testing import simulator_v41 as S
    from flashcompress.testing.check_v41 import v41_layouts_for

    import torch

    if device.type == "cpu" and not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(1)  # small tensors: one thread is the fastest
    layout = v41_layouts_for(device)[0]
    runs = [("no speculation", S.V41Scenario(layout=layout, num_requests=n, max_len=600, max_decode=24)),
            ("MTP verify, 3 draft tokens", S.V41Scenario(layout=layout, num_requests=n, max_len=600, max_decode=24,
                                                         draft_len=3))]
    print(f"flashcompress {flashcompress.__version__} demo: DeepSeek-V4.1-Flash's low-ratio source layers, "
          "checked byte for byte against each request run as one unchunked prefill", flush=True)
    print(f"device {_device_text(device)}; seed {seed}; {n} request(s); {layout} caches", flush=True)
    t0 = time.perf_counter()
    ok = True
    for i, (title, sc) in enumerate(runs, start=1):
        print(f"\n[{i}/{len(runs)}] {title}", flush=True)
        try:
            res = S.simulate_v41(sc, device=device, seed=seed)
        except Exception as exc:  # an API call raised: report it as the demo's failure
            print(f"FAIL: the engine simulation stopped with {type(exc).__name__}: {exc}")
            return 1
        print(res.summary(), flush=True)
        ok = ok and res.ok
    print("\ncolumns: entries / index keys = compressed slots of the final caches, every byte equal to the "
          "unchunked ground truth; latents = accepted event rows equal bit for bit; ring checked = steps after "
          "which the pair ring equalled the ring model")
    print(f"\n{'PASS' if ok else 'FAIL'}; {time.perf_counter() - t0:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
