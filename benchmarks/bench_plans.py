"""Plan-builder benchmark: host stage 0 (any machine), then GPU decode B = 1 / 128 / 1024 and
32k-token prefills.

Host table (runs on the CPU; ``--device cpu`` prints only this one): stage 0 of a prefill plan
from host lengths (an engine's eager prefill) for 8192 tokens / 4 requests and 32768 / 8, per
addressing mode: ``torch s0 us`` the PyTorch stage 0 (``torch_backend.plans``), ``native s0 us``
the native host planner (``cuda_ops.plan_host``, C++ built by the JIT engine, rows written
straight into fresh host tensors), and the whole ``generate`` / ``generate_online`` wall clock
with every tensor on the CPU: ``api torch us`` all in PyTorch (``FLASHCOMPRESS_BACKEND=torch``:
value checks, stage 0 and stage 1 as torch CPU ops), ``api native us`` the default path (value
checks, stage 0 and stage 1 in the native host planner, Python checks of types and shapes only).
Medians of ``--iters`` calls; the bytes of both stage-0 paths and of both ``generate`` paths
are compared.

GPU table:

For each case and addressing mode it prints

* ``gpu us``  GPU time per planner call, from CUDA-graph replay timed with CUDA events.
  Each graph holds one call per input set of a rotating pool (``--rotate`` sets with
  different requests / lengths), so replays do not hit one hot input buffer.
* ``eager us``  wall time per eager call from Python (validation-free launcher, tvm-ffi
  call, kernel launch), measured over back-to-back calls with one sync at the end.
* ``api us``  wall time per call of the public ``generate`` (validation + dispatch).
* ``torch us``  the PyTorch backend on the same CUDA tensors (a baseline; it syncs).

Paths: ``decode`` (one thread per request), ``prefill device`` (lengths on the GPU,
the CUDA-graph path: scan kernel + row kernel, no host sync), ``prefill host-stage0``
(lengths on the CPU: stage 0 by the native host planner into pinned memory, async H2D copy,
stage-1 kernel; its ``gpu us`` is the stage-1 kernel alone, replayed over pristine stage-0
rows restored by a device copy that is timed separately and subtracted).

Byte model: the planners are latency-bound.  A decode row reads ~40 B (ids, lengths,
two table lookups per position for paged C4) and writes 16 B; a prefill token reads its
request's lengths (binary search over B+1 offsets) and writes at most 24 B.  Even the
32k-token prefill moves < 2 MB, i.e. well under a microsecond of H200 bandwidth, so the
numbers below are launch + dependency latency, not bandwidth.

``--peer`` (GPU): one more table, the host-length prefill planners (``generate`` /
``generate_online`` with CPU ``seq_lens`` / ``extend_lens``, 8192 / 32768 tokens, C4 paged, C128,
online C128) against SGLang 0.5.23's (``benchmarks/_peer.py``: the peer's ``plan_prefill`` with
its host stage and a pinned buffer per call), wall clock per call including the host work.

Usage: ``python benchmarks/bench_plans.py [--device cuda|cpu] [--iters 200] [--rotate 4] [--no-check] [--peer]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from flashcompress import CompressorDecodePlan, CompressorPrefillPlan  # noqa: E402
from flashcompress.cuda_ops import plan_host  # noqa: E402
from flashcompress.cuda_ops import plans as pb  # noqa: E402
from flashcompress.jit.settings import reload_settings  # noqa: E402
from flashcompress.torch_backend import plans as tp  # noqa: E402

PAGE = 256
MODES = {  # name -> (ratio, ring, use_req_ring, online)
    "c4-paged-r8": (4, 8, False, False),
    "c4-reqring-r16": (4, 16, True, False),
    "c128-r128": (128, 128, False, False),
    "c128-online": (128, 1, True, True),
}


def make_world(slots: int, max_ctx: int, seed: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Shuffled 256-token pages per request slot, each mapped to its own shuffled SWA page."""
    gen = torch.Generator().manual_seed(seed)
    per_slot = max_ctx // PAGE
    pages = slots * per_slot + 1
    offs = torch.arange(PAGE)
    perm = torch.randperm(pages - 1, generator=gen) + 1
    r2t = (perm.view(slots, per_slot)[:, :, None] * PAGE + offs).reshape(slots, max_ctx).to(torch.int32)
    r2t[0] = 0
    f2s = torch.zeros(pages * PAGE + PAGE + 1, dtype=torch.int64)
    f2s[-1] = -1
    swa = torch.randperm(pages - 1, generator=gen) + 1
    f2s[(torch.arange(1, pages)[:, None] * PAGE + offs).reshape(-1)] = (swa[:, None] * PAGE + offs).reshape(-1)
    return r2t.to(device), f2s.to(device)


def time_graph(calls: list[Callable[[], object]], iters: int) -> float:
    """GPU microseconds per call: all ``calls`` captured in one graph, replayed ``iters`` times."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (iters * len(calls))


def time_eager(calls: list[Callable[[], object]], iters: int) -> float:
    """Wall microseconds per call, cycling through ``calls``, one sync at the end."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    n = max(iters, len(calls))
    t0 = time.perf_counter()
    for i in range(n):
        calls[i % len(calls)]()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / n


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:9.1f}"


ROWS: list[tuple[str, ...]] = []


def report(case: str, mode: str, path: str, gpu: float | None, eager: float | None, api: float | None,
           torch_us: float | None) -> None:
    row = (case, mode, path, fmt(gpu), fmt(eager), fmt(api), fmt(torch_us))
    ROWS.append(row)
    print(f"{row[0]:<24} {row[1]:<15} {row[2]:<19} {row[3]:>9} {row[4]:>9} {row[5]:>9} {row[6]:>9}", flush=True)


def check(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if not torch.equal(got.cpu(), want.cpu()):
        raise SystemExit(f"MISMATCH in {name}: the GPU planner differs from the PyTorch backend")


# ----------------------------------------------------------------------------- decode


def bench_decode(world, batch: int, args, rng: random.Random) -> None:
    r2t, f2s = world
    dev = r2t.device
    slots, ctx = r2t.shape
    inputs = []
    for _ in range(args.rotate):
        rids = torch.tensor(rng.sample(range(1, slots), batch), dtype=torch.int64, device=dev)
        seq = torch.tensor([rng.randint(1, ctx) for _ in range(batch)], dtype=torch.int64, device=dev)
        inputs.append((rids, seq))
    for mode, (ratio, ring, req_ring, online) in MODES.items():
        if online:
            calls = [lambda r=r, s=s: pb.online_decode_plan(s, r, 0) for r, s in inputs]
            api = [lambda r=r, s=s: CompressorDecodePlan.generate_online(s, r, r2t, 0) for r, s in inputs]
            ref = [lambda r=r, s=s: tp.online_decode_plan(s, r, 0) for r, s in inputs]
        else:
            calls = [lambda r=r, s=s: pb.decode_plan(ratio, r, r2t, f2s, s, PAGE, ring, req_ring) for r, s in inputs]
            api = [lambda r=r, s=s: CompressorDecodePlan.generate(ratio, r, r2t, f2s, s, PAGE, ring, req_ring)
                   for r, s in inputs]
            ref = [lambda r=r, s=s: tp.decode_plan(ratio, r, r2t, f2s, s, PAGE, ring, req_ring) for r, s in inputs]
        if args.check:
            check(f"decode B={batch} {mode}", calls[0](), ref[0]())
        report(f"decode B={batch}", mode, "decode", time_graph(calls, args.iters), time_eager(calls, args.iters),
               time_eager(api, args.iters), time_eager(ref, max(20, args.iters // 10)))


# ----------------------------------------------------------------------------- prefill


def prefill_batches(kind: str, rotate: int, ctx: int, slots: int, rng: random.Random):
    """Rotating (rids, seq, ext) CPU batches of exactly 32768 new tokens."""
    out = []
    for _ in range(rotate):
        if kind == "1x32768 fresh":
            b, exts, prefixes = 1, [32768], [0]
        elif kind == "16x2048 chunks":
            b, exts = 16, [2048] * 16
            prefixes = [rng.randrange(0, ctx - 2048) for _ in range(b)]
        else:  # "1024x32 verify"
            b, exts = 1024, [32] * 1024
            prefixes = [rng.randrange(0, ctx - 32) for _ in range(b)]
        rids = rng.sample(range(1, slots), b) if b < slots else [rng.randrange(1, slots) for _ in range(b)]
        seq = [p + e for p, e in zip(prefixes, exts)]
        out.append((torch.tensor(rids), torch.tensor(seq), torch.tensor(exts)))
    return out


def bench_prefill(world, kind: str, args, rng: random.Random) -> None:
    r2t, f2s = world
    dev = r2t.device
    slots, ctx = r2t.shape
    num_q = 32768
    batches = prefill_batches(kind, args.rotate, ctx, slots, rng)
    dev_batches = [tuple(t.to(dev) for t in b) for b in batches]
    for mode, (ratio, ring, req_ring, online) in MODES.items():
        # --- device path (CUDA-graph planner)
        if online:
            calls = [lambda d=d: pb.online_prefill_plan_device(d[0], d[1], d[2], num_q, 0) for d in dev_batches]
            api = [lambda d=d: CompressorPrefillPlan.generate_online(d[1], d[2], d[0], r2t, num_q, True, 0)
                   for d in dev_batches]  # online always cuts segments on the host (a sync)
            ref = [lambda d=d: tp.online_prefill_plan(d[1], d[2], d[0], num_q, True, 0) for d in dev_batches]
        else:
            calls = [lambda d=d: pb.prefill_plan_device(ratio, d[0], d[1], d[2], r2t, f2s, PAGE, ring, num_q,
                                                        req_ring) for d in dev_batches]
            api = [lambda d=d: CompressorPrefillPlan.generate(ratio, d[0], d[1], d[2], r2t, f2s, PAGE, ring, num_q,
                                                              True, req_ring) for d in dev_batches]
            ref = [lambda d=d: tp.prefill_plan(ratio, d[0], d[1], d[2], r2t, f2s, PAGE, ring, num_q, True, req_ring)
                   for d in dev_batches]
        if args.check:
            got, want = calls[0](), ref[0]()
            check(f"prefill {kind} {mode} plan_c", got[0], want[0])
            check(f"prefill {kind} {mode} plan_w", got[1], want[1])
        report(f"prefill {kind}", mode, "device (graph path)", time_graph(calls, args.iters),
               time_eager(calls, args.iters), None if online else time_eager(api, args.iters),
               time_eager(ref, max(10, args.iters // 20)))

        # --- host stage 0 + GPU stage 1
        if online:
            host_api = [lambda b=b, d=d: CompressorPrefillPlan.generate_online(b[1], b[2], d[0], r2t, num_q, False, 0)
                        for b, d in zip(batches, dev_batches)]
            stage0 = [tp.online_prefill_stage0(b[1], b[2]) for b in batches]
        else:
            host_api = [lambda b=b, d=d: CompressorPrefillPlan.generate(ratio, d[0], b[1], b[2], r2t, f2s, PAGE, ring,
                                                                        num_q, False, req_ring)
                        for b, d in zip(batches, dev_batches)]
            stage0 = [tp.prefill_stage0(ratio, b[1], b[2], PAGE, ring, req_ring) for b in batches]
        pristine = [(c.to(dev), w.to(dev)) for c, w in stage0]
        work = [(c.clone(), w.clone()) for c, w in pristine]

        def restore(i: int) -> None:
            work[i][0].copy_(pristine[i][0])
            work[i][1].copy_(pristine[i][1])

        def stage1(i: int) -> None:
            restore(i)
            if online:
                pb.online_prefill_stage1_both(work[i][0], work[i][1], dev_batches[i][0], 0)
            else:
                pb.prefill_stage1(ratio, work[i][0], work[i][1], dev_batches[i][0], r2t, f2s, PAGE, ring, req_ring)

        n = len(batches)
        copy_us = time_graph([lambda i=i: restore(i) for i in range(n)], args.iters)
        stage1_us = time_graph([lambda i=i: stage1(i) for i in range(n)], args.iters) - copy_us
        if args.check:
            plan = host_api[0]()
            rids0, seq0, ext0 = dev_batches[0][0], batches[0][1], batches[0][2]  # host lengths, device world
            want = (tp.online_prefill_plan(seq0, ext0, rids0, num_q, False, 0) if online
                    else tp.prefill_plan(ratio, rids0, seq0, ext0, r2t, f2s, PAGE, ring, num_q, False, req_ring))
            check(f"host-stage0 {kind} {mode} plan_c", plan[1], want[0])
            check(f"host-stage0 {kind} {mode} plan_w", plan[2], want[1])
        report(f"prefill {kind}", mode, "host-stage0 + GPU s1", max(stage1_us, 0.0), None,
               time_eager(host_api, max(20, args.iters // 10)), None)


# ----------------------------------------------------------------------------- host stage 0

HOST_CASES = ((8192, 4), (32768, 8))  # (tokens, requests): chunks of tokens / requests each
HOST_MODES = ("c4-paged-r8", "c128-r128", "c128-online")


def median_us(call: Callable[[], object], iters: int) -> float:
    """Median wall microseconds of one call (after one warm call)."""
    call()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] * 1e6


@contextlib.contextmanager
def torch_stage0() -> Iterator[None]:
    """``FLASHCOMPRESS_BACKEND=torch`` (the PyTorch stage 0) inside the block; settings restored after."""
    before = os.environ.get("FLASHCOMPRESS_BACKEND")
    os.environ["FLASHCOMPRESS_BACKEND"] = "torch"
    reload_settings()
    try:
        yield
    finally:
        if before is None:
            del os.environ["FLASHCOMPRESS_BACKEND"]
        else:
            os.environ["FLASHCOMPRESS_BACKEND"] = before
        reload_settings()


def bench_host(args) -> None:
    """Stage 0 from host lengths, PyTorch vs native, and ``generate`` with CPU tensors (see the docstring)."""
    rng = random.Random(3)
    r2t, f2s = make_world(slots=64, max_ctx=16384, seed=3, device=torch.device("cpu"))
    print(f"{'case':<18} {'mode':<13} {'torch s0 us':>11} {'native s0 us':>12} {'x':>6} "
          f"{'api torch us':>15} {'api native us':>13}")
    print("-" * 94)
    for tokens, batch in HOST_CASES:
        rids = torch.tensor(rng.sample(range(1, r2t.shape[0]), batch))
        ext = torch.full((batch,), tokens // batch)
        seq = ext + torch.tensor([rng.randrange(0, r2t.shape[1] - tokens // batch) for _ in range(batch)])
        for mode in HOST_MODES:
            ratio, ring, req_ring, online = MODES[mode]
            if online:
                ref = lambda: tp.online_prefill_stage0(seq, ext)  # noqa: E731
                nat = lambda: plan_host.online_prefill_stage0(seq, ext, tokens)  # noqa: E731
                api = lambda: CompressorPrefillPlan.generate_online(seq, ext, rids, r2t, tokens)  # noqa: E731
            else:
                ref = lambda: tp.prefill_stage0(ratio, seq, ext, PAGE, ring, req_ring)  # noqa: E731
                nat = lambda: plan_host.prefill_stage0(ratio, seq, ext, PAGE, ring, req_ring, tokens)  # noqa: E731
                api = lambda: CompressorPrefillPlan.generate(ratio, rids, seq, ext, r2t, f2s, PAGE, ring,  # noqa: E731
                                                              tokens, False, req_ring)
            if args.check:
                for name, got, want in zip(("plan_c", "plan_w"), nat(), ref()):
                    check(f"host stage 0 {tokens}/{batch} {mode} {name}", got, want)
            if plan_host.native_planner(ratio, online) is None:
                raise SystemExit("the native host planner is unavailable here (see the warning above)")
            if args.check:
                with torch_stage0():
                    want = api()
                for name, got, ref_rows in zip(("plan_c", "plan_w"), api()[1:], want[1:]):
                    check(f"generate {tokens}/{batch} {mode} {name}", got, ref_rows)
            torch_us, native_us = median_us(ref, args.iters), median_us(nat, args.iters)
            api_iters = max(5, args.iters // 4)
            with torch_stage0():
                api_torch = median_us(api, api_iters)
            api_native = median_us(api, api_iters)
            print(f"{f'{tokens} tok / {batch} req':<18} {mode:<13} {torch_us:11.1f} {native_us:12.1f} "
                  f"{torch_us / native_us:6.1f} {api_torch:15.1f} {api_native:13.1f}", flush=True)


def time_full_path(calls: list[Callable[[], object]], iters: int) -> float:
    """``time_eager`` with the one-call host prefill planner (``plans.HOST_PREFILL``) switched off:
    the full Python path (checks, native stage 0, uploads, stage-1 launch), for an A/B in one run."""
    from flashcompress import plans as P

    saved, learn = dict(P.HOST_PREFILL), P._learn_host_prefill
    P.HOST_PREFILL.clear()
    P._learn_host_prefill = lambda *a, **k: None
    try:
        return time_eager(calls, iters)
    finally:
        P._learn_host_prefill = learn
        P.HOST_PREFILL.update(saved)


def bench_peer_host(world, args, rng: random.Random) -> None:
    """``--peer``: the host-length prefill planners against SGLang 0.5.23's (``benchmarks/_peer.py``):
    CPU ``seq_lens`` / ``extend_lens``, the world and the slots on the GPU, wall clock per call
    including the host stage (back-to-back calls over ``--rotate`` batches, one sync at the end).
    The peer's call allocates its pinned staging buffer per call, as its wrapper does.
    ``fc api us``: the public call (the one-call planner ``prefill_host`` once learnt);
    ``fc full us``: the same calls on the full Python path (``time_full_path``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _peer

    r2t, f2s = world
    dev = r2t.device
    slots, ctx = r2t.shape
    peer = _peer.get_peer(dev)
    print(f"# host-length prefill planners vs the peer: {peer.describe()}")
    print(f"{'case':<18} {'mode':<13} {'fc api us':>10} {'fc full us':>10} {'peer us':>10} {'fc/peer':>8}")
    for tokens, batch in HOST_CASES:
        batches = []
        for _ in range(args.rotate):
            rids = torch.tensor(rng.sample(range(1, slots), batch), device=dev)
            ext = torch.full((batch,), tokens // batch)
            seq = ext + torch.tensor([rng.randrange(0, ctx - tokens // batch) for _ in range(batch)])
            batches.append((rids, seq, ext))
        for mode in HOST_MODES:
            ratio, ring, req_ring, online = MODES[mode]
            if online:
                ours = [lambda b=b: CompressorPrefillPlan.generate_online(b[1], b[2], b[0], r2t, tokens)
                        for b in batches]
            else:
                ours = [lambda b=b: CompressorPrefillPlan.generate(ratio, b[0], b[1], b[2], r2t, f2s, PAGE, ring,
                                                                   tokens, False, req_ring) for b in batches]
            fc_us = time_eager(ours, max(20, args.iters // 4))
            full_us = time_full_path(ours, max(20, args.iters // 4))
            try:
                if online:
                    theirs = [peer.plan_online_prefill_call(b[1], b[2], b[0], r2t, tokens) for b in batches]
                else:
                    theirs = [peer.plan_prefill_call(ratio, b[0], b[1], b[2], r2t, f2s, PAGE, ring, tokens)
                              for b in batches]
                peer_us: float | None = time_eager(theirs, max(20, args.iters // 4))
                why = ""
            except Exception as exc:  # noqa: BLE001  (PeerUnavailable, a build or launch failure)
                peer_us, why = None, f"  peer: {str(exc).splitlines()[0][:120]}"
            ratio_s = "-" if peer_us is None else f"{fc_us / peer_us:8.2f}"
            print(f"{f'{tokens} tok / {batch} req':<18} {mode:<13} {fc_us:10.1f} {full_us:10.1f} {fmt(peer_us):>10} "
                  f"{ratio_s:>8}{why}",
                  flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=200, help="graph replays / eager calls per measurement")
    parser.add_argument("--rotate", type=int, default=4, help="distinct input sets cycled through")
    parser.add_argument("--no-check", dest="check", action="store_false", help="skip the byte check vs PyTorch")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: only the host stage-0 table (no GPU needed)")
    parser.add_argument("--peer", action="store_true",
                        help="add the host-length prefill planners of SGLang 0.5.23 (benchmarks/_peer.py)")
    args = parser.parse_args()
    print(f"# host stage 0: torch {torch.__version__}, {os.cpu_count()} CPU(s), {torch.get_num_threads()} "
          f"torch thread(s); iters={args.iters}")
    bench_host(args)
    if args.device == "cpu":
        return
    if not torch.cuda.is_available():
        raise SystemExit("the GPU tables need a CUDA GPU (--device cpu prints the host table alone)")
    dev = torch.device("cuda")
    rng = random.Random(0)
    print(f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}; iters={args.iters} rotate={args.rotate}")
    print(f"{'case':<24} {'mode':<15} {'path':<19} {'gpu us':>9} {'eager us':>9} {'api us':>9} {'torch us':>9}")
    decode_world = make_world(slots=1100, max_ctx=8192, seed=1, device=dev)
    for batch in (1, 128, 1024):
        bench_decode(decode_world, batch, args, rng)
    prefill_world = make_world(slots=1100, max_ctx=40960, seed=2, device=dev)
    for kind in ("1x32768 fresh", "16x2048 chunks", "1024x32 verify"):
        bench_prefill(prefill_world, kind, args, rng)
    if args.peer:
        bench_peer_host(prefill_world, args, rng)


if __name__ == "__main__":
    main()
