"""Host-side cost of one API call (decode), split: validation, dispatch, backend, binding + launch.

Engines call these ops thousands of times a second, so the Python between the call and
the launch must stay near 8 us.  Per op (compress_forward, compress_norm_rope_store,
compress_and_store), on a decode batch built like ``bench_compress.py``'s ``rand`` case
(``--batch`` requests, C4 head 512 by default, V4 store at page 64):

* ``validation``: ``validation.check_*`` alone (builds the call object): a steady-state call
  (its key in the memo of checked calls, CUDA or ``--metadata-only``) and a memo miss (every check).
* ``dispatch``: ``dispatch.run_*`` on a ready call object, the backend replaced by a no-op
  (output allocation, the empty-plan test, the backend choice).
* ``stub``: the public call with the backend replaced by no-ops: validation + dispatch.
* ``full``: the real call: validation + dispatch + the backend's host code + the kernel
  launch(es).  ``backend`` = full - stub - binding (CUDA): the backend's own Python.
* ``binding`` (CUDA): the loaded tvm-ffi module called directly with the arguments the
  backend passes (tensor conversion, the binding's checks, stream and device guard, the
  launch), and ``ffi floor``: a tvm-ffi call with no tensor arguments.  ``full`` minus
  ``binding`` minus ``stub`` is the backend's own Python.  On CUDA the GPU is first given a long spin kernel so that every launch
  only queues (the GPU stays far ahead of the host); ``time.perf_counter`` over
  ``--iters`` back-to-back calls, one sync at the end.  The note says whether the GPU was
  still busy when the host finished (if not, the calls waited on the GPU somewhere, e.g.
  a backend path that synchronises).  On the CPU the op itself runs on the host, so
  ``full`` there is the whole op, not overhead.

    python benchmarks/bench_host_overhead.py [--device cuda|cpu] [--mode stub|full|all] [--batch 64] [--peer]

The steady-state CUDA call takes the binding-first path (``flashcompress.fastpath``); its split,
per op and for ``CompressorDecodePlan.generate`` (CUDA, ``--mode full|all``): ``fast: Python``
(the public call with its learnt binding replaced by a no-op), ``fast: binding, no launch`` (the
binding on zero-row views of the same tensors: tvm-ffi conversion + the C++ checks), ``fast:
binding + launch``, ``launch`` (the difference), ``fast: public call`` and ``full path``
(``fastpath`` off: the validation + dispatch + backend path the ``stub`` rows split).  ``--peer``
adds SGLang 0.5.23's modules (``benchmarks/_peer.py``) called on the same tensors as its wrappers
call them (the wrappers' per-call Python is not included).

Data-dependent checks (debug tier) are excluded on CUDA unless FLASHCOMPRESS_DEBUG=1; on
CPU they always run unless ``--metadata-only``, which also leaves the device and contiguity
checks to the (absent) binding as on CUDA, so the CPU rows then show the CUDA path's Python.
Calls run under ``torch.no_grad()`` (as an engine decodes) unless ``--grad``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from types import SimpleNamespace

import torch

import _common as C
import flashcompress.dispatch as D
import flashcompress.fastpath as F
import flashcompress.validation as V
from flashcompress import CompressorDecodePlan, compress_and_store, compress_forward, compress_norm_rope_store

NORM_EPS = 1e-6


def per_call_us(fn, iters: int, warmup: int = 20) -> float:
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters * 1e6


def full_call_us(fn, iters: int, timer: C.Timer | None) -> tuple[float, str]:
    """Wall µs per real call; on CUDA behind a long spin so launches only queue."""
    for _ in range(3):
        fn()
    if timer is None:  # CPU: the op runs on the host
        return per_call_us(fn, iters, warmup=0), "cpu: includes the op itself"
    torch.cuda.synchronize()
    timer.spin(max(20_000.0, iters * 150.0))  # far more GPU time than the host needs for the loop
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t1 = time.perf_counter()
    end = torch.cuda.Event()
    end.record()
    busy = not end.query()
    torch.cuda.synchronize()
    return (t1 - t0) / iters * 1e6, ("GPU far ahead" if busy else "GPU caught up: the calls waited on it (sync?)")


@contextlib.contextmanager
def fast_path_off():
    """The public calls without ``fastpath`` (the full path: validation + dispatch + backend + binding)."""
    names = ("compress_forward", "compress_and_store", "compress_norm_rope_store", "decode_plan", "online_decode_plan",
             "remember_compress", "remember_store", "remember_decode_plan", "remember_online_decode_plan")
    saved = {n: getattr(F, n) for n in names}
    for n in names:
        setattr(F, n, lambda *a, **k: None)
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(F, n, fn)


@contextlib.contextmanager
def noop_bindings():
    """The fast path with every learnt binding replaced by a Python no-op: its Python side alone."""
    memos = (F.COMPRESS, F.FUSED, F.STORE, F.PLANS)
    saved = [dict(m) for m in memos]
    noop = lambda *a: None  # noqa: E731
    plan_rows = torch.empty((0, 16), dtype=torch.uint8)
    alloc = lambda *a: plan_rows  # noqa: E731  (decode_alloc's stand-in: returns rows)
    for m in memos:
        for k, v in m.items():
            if m is F.PLANS or m is F.COMPRESS:  # (binding, allocates)
                m[k] = (alloc if v[1] else noop, v[1])
            else:
                m[k] = (noop, *v[1:]) if type(v) is tuple else noop
    try:
        yield
    finally:
        for m, old in zip(memos, saved):
            m.clear()
            m.update(old)


def binding_rows(b, s, layer, store, what: str, ops: list, plan_call, iters: int, timer: C.Timer,
                 peer: bool) -> list[list[str]]:
    """The split of the fast (binding-first) path, and the full path in the same run.

    Per op: ``fast: Python`` (the public call, its binding a no-op), ``fast: binding, no launch``
    (the learnt binding on zero-row views of the same tensors: tvm-ffi conversion + C++ checks),
    ``fast: binding + launch`` (the learnt binding on the call's tensors), ``launch`` (the two
    before, subtracted), ``fast: public call`` (all of it) and ``full path`` (``fastpath`` off:
    validation + dispatch + backend + the backend's binding call); ``--peer``: SGLang's module
    called the way its wrapper calls it (per-call Python of the wrapper not included)."""
    from flashcompress.cuda_ops import store as cs
    from flashcompress.layouts import select_cache_format

    fmt = select_cache_format(layer.head_dim, store.use_fp4, store.bf16_store)
    cache = b.cache(store)
    for _, fn in ops:
        fn()  # learns the keys
    plan_call()
    comp = next(iter(F.COMPRESS.values()), (None,))[0]  # the call passes out: compress_decode
    fused = next(iter(F.FUSED.values()), None)
    st = next(iter(F.STORE.values()), (None,))[0]
    dplan, dplan_allocates = next(iter(F.PLANS.values()), (None, False))
    rows0 = s.plan[1][:0]
    inp0, out0, kv0, loc0 = s.inp[:0], s.out[:0], s.kv[:0], s.out_loc[:0]
    world = b.world
    rpi = torch.tensor([q.rid for q in s.reqs], dtype=torch.int64, device=b.state.device)
    seq = torch.tensor([q.seq for q in s.reqs], dtype=torch.int64, device=b.state.device)
    plan0 = torch.empty((0, 16), dtype=torch.uint8, device=b.state.device)
    plan_out = torch.empty((rpi.shape[0], 16), dtype=torch.uint8, device=b.state.device)
    freq, eps, page = b.freq_cis, NORM_EPS, store.page_size
    if layer.online:
        plan_args = lambda p, r, q: (p, r, world.req_to_token, q, 0)  # noqa: E731
    else:
        r2t, f2s = world.req_to_token, world.full_to_state
        plan_args = lambda p, r, q: (p, r, r2t, f2s, q, C.SWA_PAGE, layer.ring, False)  # noqa: E731
    if dplan_allocates:  # decode_alloc: no rows argument
        plain_args = plan_args
        plan_args = lambda p, r, q: plain_args(p, r, q)[1:]  # noqa: E731
    bindings = {
        "compress_forward": (comp, (b.state, inp0, b.ape, rows0, out0), (b.state, s.inp, b.ape, s.plan[1], s.out)),
        "compress_norm_rope_store": (st, (kv0, rows0, b.norm_weight, eps, freq, loc0, cache, page, True, layer.ratio),
                                     (s.kv, s.plan[1], b.norm_weight, eps, freq, s.out_loc, cache, page, True,
                                      layer.ratio)),
        "compress_and_store": (fused, (b.state, inp0, b.ape, rows0, b.norm_weight, freq, loc0, cache, eps, page),
                               (b.state, s.inp, b.ape, s.plan[1], b.norm_weight, freq, s.out_loc, cache, eps, page)),
        "CompressorDecodePlan.generate": (dplan, plan_args(plan0, rpi[:0], seq[:0]), plan_args(plan_out, rpi, seq)),
    }
    rows = []
    for name, fn in ops + [("CompressorDecodePlan.generate", plan_call)]:
        label = f"{name} {what}"
        binding, args0, args = bindings[name]
        with noop_bindings():
            py, _ = full_call_us(fn, iters, timer)
        rows.append([label, "fast: Python (binding a no-op)", f"{py:.1f}", "API + key lookup + type/grad checks" +
                     (" (plan: rows allocated in C++)" if name.startswith("Compressor") and dplan_allocates else "")])
        if binding is None:
            rows.append([label, "fast: binding", "-", "no key learnt (not a fast-path call)"])
        else:
            no_launch, _ = full_call_us(lambda: binding(*args0), iters, timer)
            launch, note = full_call_us(lambda: binding(*args), iters, timer)
            rows.append([label, "fast: binding, no launch (0 rows)", f"{no_launch:.1f}",
                         "tvm-ffi conversion + C++ checks"])
            rows.append([label, "fast: binding + launch", f"{launch:.1f}", note])
            rows.append([label, "launch (the two above, subtracted)", f"{launch - no_launch:.1f}",
                         "guard, stream, launch"])
        us, note = full_call_us(fn, iters, timer)
        rows.append([label, "fast: public call", f"{us:.1f}", note])
        with fast_path_off():
            us, note = full_call_us(fn, iters, timer)
        rows.append([label, "full path (fastpath off)", f"{us:.1f}", note])
    floor, _ = full_call_us(lambda: cs.store_module(fmt, torch.float32).page_bytes(64), iters, timer)
    rows.append(["store module page_bytes(64)", "ffi floor: no tensor arguments", f"{floor:.1f}", ""])
    if peer:
        rows.extend(peer_rows(b, s, layer, store, what, cache, rpi, seq, iters, timer))
    return rows


def peer_rows(b, s, layer, store, what: str, cache, rpi, seq, iters: int, timer: C.Timer) -> list[list[str]]:
    """SGLang 0.5.23's modules (``benchmarks/_peer.py``) on the same tensors: its binding call + launch."""
    import _peer

    peer = _peer.get_peer(b.state.device)
    if not peer.available:
        return [["peer", "-", "-", peer.reason]]
    world = b.world
    makers = [
        ("compress_forward", lambda: peer.compress_call(layer.ratio, layer.head_dim, layer.online, b.state, s.inp,
                                                        b.ape, s.out, (s.plan[1],), True)),
        ("compress_norm_rope_store", lambda: peer.store_call(s.kv, s.plan[1], True, layer.ratio, b.norm_weight,
                                                             NORM_EPS, b.freq_cis, s.out_loc, cache, store.page_size,
                                                             store.use_fp4, store.bf16_store)),
        ("CompressorDecodePlan.generate", lambda: peer.plan_online_decode_call(seq, rpi, world.req_to_token)
         if layer.online else peer.plan_decode_call(layer.ratio, rpi, world.req_to_token, world.full_to_state, seq,
                                                    C.SWA_PAGE, layer.ring)),
    ]
    rows = []
    for name, make in makers:
        try:
            call = make()
        except Exception as exc:  # noqa: BLE001  (PeerUnavailable, a build failure)
            rows.append([f"{name} {what}", "peer: binding + launch", "-", C.short_error(exc)])
            continue
        us, note = full_call_us(call, iters, timer)
        rows.append([f"{name} {what}", "peer: binding + launch", f"{us:.1f}",
                     f"SGLang {peer.version} module ({peer.mode}); its wrapper's Python not included; {note}"])
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--layer", choices=sorted(C.LAYERS), default="c4-512")
    parser.add_argument("--mode", choices=("stub", "full", "all"), default="all")
    parser.add_argument("--iters", type=int, default=None, help="calls per measurement (default 2000 stub / "
                        "200 full on CUDA; 200 / 10 on CPU)")
    parser.add_argument("--metadata-only", action="store_true",
                        help="skip the data-dependent checks on CPU too "
                        "(what a CUDA call costs without FLASHCOMPRESS_DEBUG)")
    parser.add_argument("--grad", action="store_true",
                        help="call with grad mode enabled (default: under torch.no_grad(), as engines decode)")
    parser.add_argument("--peer", action="store_true",
                        help="CUDA: add SGLang 0.5.23's module calls on the same tensors (benchmarks/_peer.py)")
    args = parser.parse_args(argv)
    if not args.grad:
        torch.set_grad_enabled(False)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU")
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if not cuda:
        torch.set_num_threads(1)
    if args.metadata_only:
        V.wants_value_checks = lambda t: False
        V.wants_values = lambda device: False
        V.checked_by_binding = lambda device: None  # the CUDA path: the binding checks device and contiguity

    layer = C.LAYERS[args.layer]
    store = C.STORE_V4_C4 if layer.ratio == 4 and layer.head_dim == 512 else (
        C.STORE_IDX_FP8 if layer.head_dim == 128 else C.STORE_V4_C128)
    spec = C.CaseSpec(f"decode-B{args.batch}-rand", "decode", args.batch, "rand",
                      ctx=(1024, 65536) if cuda else (300, 4000))
    world = C.build_world(spec, dev, 1, seed=1)
    b = C.build_bundle(world, layer, seed=2)
    s = b.sets[0]
    cache = b.cache(store)
    st = dict(norm_weight=b.norm_weight, norm_eps=NORM_EPS, freq_cis=b.freq_cis, out_loc=s.out_loc, kvcache=cache,
              page_size=store.page_size, use_fp4=store.use_fp4, bf16_store=store.bf16_store)
    h, r, online = layer.head_dim, layer.ratio, layer.online
    ops = [
        ("compress_forward", lambda: compress_forward(b.state, s.inp, b.ape, s.plan, head_dim=h, compress_ratio=r,
                                                      out=s.out, is_online=online)),
        ("compress_norm_rope_store", lambda: compress_norm_rope_store(s.kv, s.plan, **st)),
        ("compress_and_store", lambda: compress_and_store(b.state, s.inp, b.ape, s.plan, head_dim=h, compress_ratio=r,
                                                          is_online=online, **st)),
    ]
    timer = C.Timer(dev, reps=1, graph_replays=1, measure_copy=False) if cuda else None
    rows = []
    what = f"(decode, {layer.name} {store.name}, B={args.batch})"
    if args.mode in ("stub", "all"):
        iters = args.iters or (2000 if cuda else 200)
        tail = (b.norm_weight, NORM_EPS, b.freq_cis, s.out_loc, cache, store.page_size, store.use_fp4, store.bf16_store,
                "v4")
        checks = [
            ("compress_forward", lambda: V.check_compress(b.state, s.inp, b.ape, s.plan, h, r, s.out, online)),
            ("compress_norm_rope_store", lambda: V.check_store(s.kv, s.plan, tail)),
            ("compress_and_store", lambda: V.check_compress(b.state, s.inp, b.ape, s.plan, h, r, None, online,
                                                            store=tail)),
        ]
        calls = [fn() for _, fn in checks]
        runs = [lambda: D.run_compress_forward(calls[0], s.out), lambda: D.run_store(calls[1]),
                lambda: D.run_compress_and_store(calls[2])]
        stub = SimpleNamespace(compress_forward=lambda *a, **k: None, compress_norm_rope_store=lambda *a, **k: None,
                               compress_and_store=lambda *a, **k: None)
        real = D.ops_backend
        D.ops_backend = lambda device: stub  # the backends do nothing: validation + dispatch remain
        with fast_path_off():  # the stub rows are the full path's Python (no fastpath, no binding)
            try:
                for (name, check), run, (_, fn) in zip(checks, runs, ops):
                    def miss(check=check) -> None:  # every check: the first call with a key (or a key the memo lacks)
                        V.clear_memo()
                        check()

                    rows.append([f"{name} {what}", "validation: every check (memo miss)",
                                 f"{per_call_us(miss, iters):.1f}", ""])
                    rows.append([f"{name} {what}", "validation: check_*", f"{per_call_us(check, iters):.1f}",
                                 "memo hit" if cuda or args.metadata_only else "cpu: value checks, no memo"])
                    rows.append([f"{name} {what}", "dispatch: run_* (no-op backend)", f"{per_call_us(run, iters):.1f}",
                                 ""])
                    rows.append([f"{name} {what}", "stub: validation + dispatch", f"{per_call_us(fn, iters):.1f}", ""])
            finally:
                D.ops_backend = real
    if args.mode in ("full", "all"):
        iters = args.iters or (200 if cuda else 10)
        for name, fn in ops:
            us, note = full_call_us(fn, iters, timer)
            rows.append([f"{name} {what}", "full: + backend + launch", f"{us:.1f}", note])
    if cuda and args.mode in ("full", "all"):
        rpi = torch.tensor([q.rid for q in s.reqs], dtype=torch.int64, device=dev)
        seq = torch.tensor([q.seq for q in s.reqs], dtype=torch.int64, device=dev)
        r2t, f2s = world.req_to_token, world.full_to_state
        if online:
            plan_call = lambda: CompressorDecodePlan.generate_online(seq, rpi, r2t)  # noqa: E731
        else:
            ring = layer.ring
            plan_call = lambda: CompressorDecodePlan.generate(r, rpi, r2t, f2s, seq, C.SWA_PAGE, ring)  # noqa: E731
        rows.extend(binding_rows(b, s, layer, store, what, ops, plan_call, args.iters or 200, timer, args.peer))
    backend = "jit" if cuda and D.ops_backend(dev).__name__.endswith("cuda_ops.ops") else "torch"
    print(f"device={dev} ({C.device_name(dev)}) batch={args.batch} torch={torch.__version__} backend={backend} "
          f"metadata_only={args.metadata_only} commit={C.git_commit()}")
    C.print_table(["call", "mode", "host us/call", "note"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
