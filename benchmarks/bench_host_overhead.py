"""Host-side cost of one API call: validation + dispatch, with the backend op stubbed out.

Engines call these ops thousands of times a second, so the Python between the
call and the launch must stay near 10 µs.  This script replaces the backend
functions with no-ops and times the remaining host path per call.

    python benchmarks/bench_host_overhead.py [--device cuda]

Data-dependent checks (debug tier) are excluded on CUDA unless
FLASHCOMPRESS_DEBUG=1; on CPU they always run, which this table shows too.
"""

from __future__ import annotations

import argparse
import time

import torch

import flashcompress.api as api
from flashcompress import CompressorDecodePlan, compress_forward, compress_norm_rope_store
from flashcompress.layouts import MAIN_V4


def per_call_us(fn, iters: int = 2000) -> float:
    for _ in range(50):
        fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--metadata-only", action="store_true",
                        help="skip the data-dependent checks on CPU too (what a CUDA call costs without FLASHCOMPRESS_DEBUG)")
    args = parser.parse_args()
    if args.metadata_only:
        import flashcompress.validation as V

        V.wants_value_checks = lambda t: False
    dev = torch.device(args.device)
    B, H = args.batch, 512

    req_to_token = torch.arange(B * 1024, dtype=torch.int32, device=dev).reshape(B, 1024)
    full_to_state = torch.arange(B * 1024 + 257, dtype=torch.int64, device=dev)
    rpi = torch.arange(B, device=dev)
    seq = torch.full((B,), 100, dtype=torch.int64, device=dev)
    plan = CompressorDecodePlan.generate(4, rpi, req_to_token, full_to_state, seq, 256, 8)
    state = torch.zeros(B * 1024 // 256 * 8 + 16, 4 * H, device=dev)
    inp = torch.zeros(B, 4 * H, device=dev)
    ape = torch.zeros(8, H, device=dev)
    out = torch.zeros(B, H, device=dev)
    kvcache = torch.zeros(B, MAIN_V4.page_bytes(64), dtype=torch.uint8, device=dev)
    angles = torch.zeros(4096, 32, device=dev)
    freq = torch.polar(torch.ones_like(angles), angles)
    loc = torch.arange(B, device=dev)
    weight = torch.ones(H, device=dev)

    # stub the device work: only validation + dispatch remain
    api.torch_ops.compress_forward = lambda *a, **k: None
    api.torch_ops.compress_norm_rope_store = lambda *a, **k: None

    rows = [
        ("compress_forward (decode, C4 H=512)",
         per_call_us(lambda: compress_forward(state, inp, ape, plan, head_dim=H, compress_ratio=4, out=out))),
        ("compress_norm_rope_store (decode, V4)",
         per_call_us(lambda: compress_norm_rope_store(out, plan, norm_weight=weight, norm_eps=1e-6,
                                                      freq_cis=freq, out_loc=loc, kvcache=kvcache, page_size=64))),
    ]
    print(f"device={dev} batch={B} torch={torch.__version__} metadata_only={args.metadata_only}")
    print(f"{'call':45s} {'host µs/call':>12s}")
    for name, us in rows:
        print(f"{name:45s} {us:12.1f}")


if __name__ == "__main__":
    main()
