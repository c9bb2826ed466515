"""torch.compile: a compressor layer step compiles with ``fullgraph=True`` and writes what eager writes.

The layer step is what an engine runs per compressor layer: the main KV compressor
(head dim 512, V4 FP8 cache) as ``compress_forward`` + ``compress_norm_rope_store``
(the state pool passed as its paged view), the indexer's (head dim 128, FP4 cache) as
the fused ``compress_and_store``; both share one plan.  Plans are built outside the
compiled region, as engines build their metadata before the forward.  The world,
state pools (NaN-poisoned), caches (poison bytes), ape, norm weights and token
projections come from ``flashcompress.testing.simulator``.

For three consecutive steps with new plans and inputs (prefill chunks padded to a
CUDA-graph token bucket, then decode steps that cross window boundaries), the
compiled step must write the same output, state and cache bytes as the eager step,
without recompiling (``error_on_recompile`` after the first call) and without graph
breaks (``fullgraph=True``).  ``torch.library.opcheck`` checks every registered op.

CPU tests use the Inductor backend: the compiled graph only calls the custom ops
(no generated C++ kernels), so a compile takes a few seconds.  GPU tests (``-m gpu``)
run the same steps on CUDA tensors, also with ``mode="reduce-overhead"`` (CUDA graphs).
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from flashcompress import (CompressorDecodePlan, CompressorPrefillPlan, compress_and_store, compress_forward,
                           compress_norm_rope_store)
from flashcompress import dispatch, library
from flashcompress.torch_backend import ops as torch_ops

try:
    from flashcompress.testing import simulator as S
except ImportError:  # pragma: no cover - before the test helpers moved into flashcompress.testing
    from flashcompress import simulator as S

EPS = 1e-6
RATIO, RING, SWA_PAGE = 4, 8, 256
# Prefill: tokens per request in each of three chunked-prefill steps of NUM_Q tokens; the plans are
# padded to NUM_Q rows (use_cuda_graph), so every step has the same shapes.
CHUNKS = ([13, 20, 7, 4], [18, 10, 10, 6], [4, 4, 16, 20])
NUM_Q = 44
# Decode then starts at positions [35, 34, 33, 30]: every step has requests at a window boundary.
STEPS = 3

HAS_CUDA = torch.cuda.is_available()
gpu = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")]
TARGETS = [
    pytest.param("cpu", None, id="cpu"),
    pytest.param("cuda", None, id="cuda", marks=gpu),
    pytest.param("cuda", "reduce-overhead", id="cuda-reduce-overhead", marks=gpu),
]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
    torch._dynamo.reset()


# ---------------------------------------------------------------------------
# The layer
# ---------------------------------------------------------------------------


class Layer:
    """One layer's two C4 compressors over four requests (simulator world, paged SWA state)."""

    def __init__(self, device: str, seed: int = 0):
        self.device = torch.device(device)
        sc = S.Scenario(ratio=RATIO, compressors=(S.MAIN, S.INDEXER_FP4), num_requests=4, min_len=40, max_len=120)
        sim = S.Simulator(sc, device=device, seed=seed)
        sim._admit(10**9)  # every request gets its request slot now
        self.sim = sim
        self.reqs = sim.requests
        self.main, self.idx = sim.comp
        self.rpi = torch.tensor([rq.rid for rq in self.reqs], dtype=torch.int64, device=self.device)
        self.gen = torch.Generator().manual_seed(seed + 1)

    def buffers(self) -> dict[str, torch.Tensor]:
        """Fresh copies of everything a step writes."""
        m, i = self.main, self.idx
        return {"st_m": m["state"].clone(), "cache_m": m["cache"].clone(),
                "st_i": i["state"].clone(), "cache_i": i["cache"].clone()}

    def constants(self) -> dict[str, torch.Tensor]:
        m, i = self.main, self.idx
        return {"freq": self.sim.freq_cis, "ape_m": m["ape"], "w_m": m["norm_w"], "ape_i": i["ape"], "w_i": i["norm_w"]}

    def _loc(self, rq, p: int) -> int:
        return rq.full_loc(p) // RATIO if (p + 1) % RATIO == 0 else 0

    def _rows(self, comp: dict, spans: list[tuple[int, int]], total: int) -> torch.Tensor:
        x = torch.cat([comp["inputs"][rq.idx][p0:p0 + n] for rq, (p0, n) in zip(self.reqs, spans)])
        pad = torch.randn(total - x.shape[0], x.shape[1], generator=self.gen)  # CUDA-graph padding tokens
        return torch.cat([x, pad]).to(self.device)

    def prefill(self, k: int) -> tuple:
        starts = [sum(c[i] for c in CHUNKS[:k]) for i in range(len(self.reqs))]
        spans = list(zip(starts, CHUNKS[k]))
        seq = torch.tensor([p0 + n for p0, n in spans], dtype=torch.int64)
        ext = torch.tensor(CHUNKS[k], dtype=torch.int64)
        plan = CompressorPrefillPlan.generate(RATIO, self.rpi, seq, ext, self.sim.req_to_token, self.sim.full_to_state,
                                              SWA_PAGE, RING, NUM_Q, use_cuda_graph=True)
        locs = [self._loc(rq, p0 + j) for rq, (p0, n) in zip(self.reqs, spans) for j in range(n)]
        out_loc = torch.tensor(locs + [0] * (NUM_Q - len(locs)), dtype=torch.int64, device=self.device)
        return plan, self._rows(self.main, spans, NUM_Q), self._rows(self.idx, spans, NUM_Q), out_loc

    def decode(self, k: int) -> tuple:
        pos = [sum(c[i] for c in CHUNKS) + k for i in range(len(self.reqs))]
        seq = torch.tensor([p + 1 for p in pos], dtype=torch.int64, device=self.device)
        plan = CompressorDecodePlan.generate(RATIO, self.rpi, self.sim.req_to_token, self.sim.full_to_state, seq,
                                             SWA_PAGE, RING)
        spans = [(p, 1) for p in pos]
        out_loc = torch.tensor([self._loc(rq, p) for rq, p in zip(self.reqs, pos)], dtype=torch.int64,
                               device=self.device)
        return plan, self._rows(self.main, spans, len(pos)), self._rows(self.idx, spans, len(pos)), out_loc


def _layer(plan, x_m, x_i, out_loc, out, freq, ape_m, w_m, ape_i, w_i, st_m, cache_m, st_i, cache_i):
    kv = compress_forward(st_m.view(-1, RATIO, st_m.shape[1]), x_m, ape_m, plan, head_dim=512, compress_ratio=RATIO,
                          out=out)
    compress_norm_rope_store(kv, plan, norm_weight=w_m, norm_eps=EPS, freq_cis=freq, out_loc=out_loc,
                             kvcache=cache_m, page_size=64)
    compress_and_store(st_i, x_i, ape_i, plan, head_dim=128, compress_ratio=RATIO, norm_weight=w_i, norm_eps=EPS,
                       freq_cis=freq, out_loc=out_loc, kvcache=cache_i, page_size=64, use_fp4=True)
    return kv


# Two functions (two code objects): Dynamo keeps one compile cache per code object.
def prefill_step(plan, x_m, x_i, out_loc, out, **kw):
    return _layer(plan, x_m, x_i, out_loc, out, **kw)


def decode_step(plan, x_m, x_i, out_loc, out, **kw):
    return _layer(plan, x_m, x_i, out_loc, out, **kw)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous().cpu()
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def _assert_same(name: str, a: torch.Tensor, b: torch.Tensor) -> None:
    ba, bb = _bytes(a), _bytes(b)
    if not torch.equal(ba, bb):
        diff = (ba != bb).nonzero()
        raise AssertionError(f"{name}: {diff.shape[0]} bytes differ from eager, first at byte index {diff[0].tolist()}")


def _capturable(device: torch.device) -> bool:
    """CUDA graphs need JIT kernels: the PyTorch backend's ops sync the host (``nonzero``)."""
    be = dispatch.ops_backend(device)
    return all(getattr(be, f) is not getattr(torch_ops, f)
               for f in ("compress_forward", "compress_norm_rope_store", "compress_and_store"))


def _run_steps(device: str, mode: str | None, kind: str, dynamic: bool | None = None, batch=None) -> None:
    layer = Layer(device)
    dev = layer.device
    if mode == "reduce-overhead" and not _capturable(dev):
        pytest.skip("compress/store still run the PyTorch backend on CUDA (host syncs): not capturable yet")
    fn = prefill_step if kind == "prefill" else decode_step
    compiled = torch.compile(fn, fullgraph=True, backend="inductor", mode=mode, dynamic=dynamic)
    eager_bufs, comp_bufs = layer.buffers(), layer.buffers()
    consts = layer.constants()
    # prefill: a caller-owned out= buffer (mutated graph input); decode: out allocated inside the graph
    out_e = torch.full((NUM_Q, 512), float("nan"), device=dev) if kind == "prefill" else None
    out_c = out_e.clone() if out_e is not None else None
    if mode == "reduce-overhead":  # persistent engine buffers: static addresses, written in place by the graph
        for t in [*comp_bufs.values(), *([out_c] if out_c is not None else [])]:
            torch._dynamo.mark_static_address(t)
    poison = {k: v.clone() for k, v in eager_bufs.items()}
    for step in range(STEPS):
        if kind == "prefill":
            args = layer.prefill(step)
        else:
            args = layer.decode(step)
        if batch is not None:
            args = _sub_batch(args, batch[step])
        kv_e = fn(*args, out_e, **consts, **eager_bufs)
        with torch._dynamo.config.patch(error_on_recompile=step > 0):
            kv_c = compiled(*args, out_c, **consts, **comp_bufs).clone()
        _assert_same(f"step {step}: compress_forward output", kv_e, kv_c)
        for name in eager_bufs:
            _assert_same(f"step {step}: {name}", eager_bufs[name], comp_bufs[name])
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])
    if mode == "reduce-overhead":
        assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    # not vacuous: every buffer was written, compressed rows were produced
    for name in eager_bufs:
        assert not torch.equal(_bytes(eager_bufs[name]), _bytes(poison[name])), f"{name} never written"


def _sub_batch(args: tuple, keep: list[int]) -> tuple:
    """A decode step for a subset of the requests (plan rows, inputs and out_loc are per request)."""
    plan, x_m, x_i, out_loc = args
    idx = torch.tensor(keep, device=plan[1].device)
    return CompressorDecodePlan(plan[0], plan[1][idx], is_online=plan.is_online), x_m[idx], x_i[idx], out_loc[idx]


@pytest.mark.parametrize("device, mode", TARGETS)
def test_prefill_layer_step_compiles_and_matches_eager(device: str, mode: str | None) -> None:
    _run_steps(device, mode, "prefill")


@pytest.mark.parametrize("device, mode", TARGETS)
def test_decode_layer_step_compiles_and_matches_eager(device: str, mode: str | None) -> None:
    _run_steps(device, mode, "decode")


def test_decode_dynamic_batch_size_compiles_once() -> None:
    """``dynamic=True`` (batch size symbolic): batches of 4, 3 and 2 requests run one graph."""
    _run_steps("cpu", None, "decode", dynamic=True, batch=[[0, 1, 2, 3], [1, 2, 3], [0, 3]])


def test_compiled_call_raises_the_eager_error_at_run_time() -> None:
    """Value checks are not in the graph: the op runs them on real tensors, with eager's message."""
    layer = Layer("cpu")
    plan, x_m, x_i, out_loc = layer.decode(0)
    out_loc = out_loc.clone()
    out_loc[0] = 10**9  # outside the cache
    consts, bufs = layer.constants(), layer.buffers()
    with pytest.raises(ValueError) as eager:
        decode_step(plan, x_m, x_i, out_loc, None, **consts, **layer.buffers())
    compiled = torch.compile(decode_step, fullgraph=True, backend="inductor")
    with pytest.raises(ValueError) as comp:
        compiled(plan, x_m, x_i, out_loc, None, **consts, **bufs)
    assert str(comp.value) == str(eager.value)
    assert str(eager.value).startswith("out_loc: expected slots in [0, ")
    assert not counters["graph_break"]


def test_eager_calls_do_not_dispatch_the_custom_ops() -> None:
    """Outside tracing the public functions go straight to the backend (no custom-op dispatch)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[str] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    layer = Layer("cpu")
    with Record():
        decode_step(*layer.decode(0), None, **layer.constants(), **layer.buffers())
    assert seen and not [f for f in seen if f.startswith("flashcompress.")]


# ---------------------------------------------------------------------------
# opcheck
# ---------------------------------------------------------------------------


def _op_samples(layer: Layer, kind: str) -> dict[str, tuple]:
    """Arguments of each registered op, as the traced code passes them."""
    plan, x_m, x_i, out_loc = layer.prefill(0) if kind == "prefill" else layer.decode(0)
    c, b = layer.constants(), layer.buffers()
    plan_w = None if plan.is_decode else plan[2]
    p = (plan[1], plan_w, plan[0], plan.is_online)
    freq = torch.view_as_real(c["freq"])
    kv = torch.randn(plan[1].shape[0], 512, generator=layer.gen).to(layer.device)
    out = torch.empty(plan[1].shape[0], 512, device=layer.device)
    return {
        "compress_forward": (b["st_m"].view(-1, RATIO, b["st_m"].shape[1]), x_m, c["ape_m"], *p, out, 512, RATIO,
                             False),
        "compress_norm_rope_store": (kv, *p, c["w_m"], EPS, freq, True, out_loc, b["cache_m"], 64, False, False),
        "compress_and_store": (b["st_i"], x_i, c["ape_i"], *p, 128, RATIO, c["w_i"], EPS, freq, True, out_loc,
                               b["cache_i"], 64, True, False, False),
    }


@pytest.mark.parametrize("kind", ["decode", "prefill"])
@pytest.mark.parametrize("device", [pytest.param("cpu"), pytest.param("cuda", marks=gpu)])
def test_opcheck_every_registered_op(device: str, kind: str) -> None:
    samples = _op_samples(Layer(device), kind)
    assert set(samples) == set(library.OPS)
    for name, args in samples.items():
        torch.library.opcheck(library.OPS[name], args)


# ---------------------------------------------------------------------------
# JIT loading happens when the graph runs, never while tracing
# ---------------------------------------------------------------------------


def _to_device(args: tuple, dev: torch.device) -> tuple:
    plan, *tensors = args
    moved = [t.to(dev) for t in plan[1:]]
    plan = (CompressorDecodePlan(plan[0], *moved, is_online=plan.is_online) if plan.is_decode
            else CompressorPrefillPlan(plan[0], *moved, is_online=plan.is_online))
    return (plan, *[t.to(dev) for t in tensors])


@pytest.mark.parametrize("kind", ["decode", "prefill"])
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_offline_cache_miss_is_raised_by_the_compiled_call_not_by_tracing(
        private_env, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    from _jit_helpers import reset_engine
    from flashcompress.jit import OfflineCacheMiss

    dev = torch.device("cuda")
    if dispatch.ops_backend(dev).compress_forward is torch_ops.compress_forward:
        pytest.skip("compress_forward has no JIT kernel on CUDA yet: nothing to load")
    layer = Layer("cpu")  # plans built on CPU and copied: the empty offline cache has no plan kernels either
    args = _to_device(layer.prefill(0) if kind == "prefill" else layer.decode(0), dev)
    consts = {k: v.to(dev) for k, v in layer.constants().items()}
    bufs = {k: v.to(dev) for k, v in layer.buffers().items()}
    monkeypatch.setenv("FLASHCOMPRESS_OFFLINE", "1")
    reset_engine()
    traced = []

    def backend(gm, example_inputs):  # tracing is over once Dynamo hands the graph to its backend
        traced.append(gm)
        return gm.forward

    fn = prefill_step if kind == "prefill" else decode_step
    with pytest.raises(OfflineCacheMiss) as eager:
        fn(*args, None, **consts, **bufs)
    with pytest.raises(OfflineCacheMiss) as comp:
        torch.compile(fn, fullgraph=True, backend=backend)(*args, None, **consts, **bufs)
    assert len(traced) == 1, "tracing must finish (it loads nothing) before the run raises"
    assert str(comp.value) == str(eager.value)


# ---------------------------------------------------------------------------
# V4.1 ops (flashcompress.v41.library): fullgraph compile == eager bytes, opcheck
# ---------------------------------------------------------------------------


def _v41_cases() -> dict[str, tuple]:
    """Per V4.1 op: (public function, a builder of fresh (args, kwargs), the names of the written arguments).

    Small CPU inputs from ``test_v41_ops``' builders, with padded / negative slots and (c2) pairs
    whose partner is the previous row, the ring, or a row parked by this call.
    """
    import flashcompress as fc
    from test_v41_ops import BF16, L, _cache, _freqs, _kv_rows, _latent_rows, _ring, _weight

    def c1():
        args = (_latent_rows(6, 1), _weight(), torch.tensor([0, 1, 5, 7, 8, 9]), torch.tensor([3, 0, 17, -1, 4, 30]),
                1e-20, _freqs(), _cache(L.V41_FP4, 16))
        return args, {"page_size": 16, "layout": L.V41_FP4}

    def c2_decode():  # two requests verify 3 rows each (ring 4), one padded row
        state = _ring(2 * 4)
        state[1 * 4 + 4 % 4] = _kv_rows(1, 6)[0]
        args = (_kv_rows(6, 5), state, _weight(), torch.tensor([2, 3, 4, 5, 6, 7]), torch.tensor([0, 0, 0, 1, 1, 1]),
                torch.tensor([8, 9, 10, 11, 0, 13]), 1e-20, _freqs(), _cache(L.V4, 16))
        return args, {"page_size": 16, "ring_size": 4, "draft_len": 3, "layout": "v4"}

    def c2_prefill():
        args = (_kv_rows(7, 8), _ring(2 * 4), _weight(), torch.tensor([2, 3, 4, 5, 9, 0, 0]),
                torch.tensor([0, 0, 0, 0, 1, 0, 0]), torch.tensor([20, 21, 22, 23, 41, 0, 0]), 1e-20, _freqs(),
                _cache(L.V41, 16, pages=4), torch.tensor([0, 4], dtype=torch.int32),
                torch.tensor([4, 1], dtype=torch.int32))
        return args, {"page_size": 16, "ring_size": 4, "layout": L.V41, "out": torch.full((7, 512), 7.0, dtype=BF16)}

    def index_k():
        x = (torch.randn(5, 128, generator=torch.Generator().manual_seed(10)) * 3).to(BF16)
        args = (x, _weight(1, 128), 1e-20, _freqs(), torch.tensor([5, 6, 9, 3, 11]), torch.tensor([130, 0, 7, -1, 200]),
                torch.full((4, 68 * 64), 0xA5, dtype=torch.uint8))
        return args, {"ratio": 2}

    return {
        "c1_decode_norm_rope_store": (fc.c1_decode_norm_rope_store, c1, {"k_cache": 6}),
        "c2_decode_norm_rope_store": (fc.c2_decode_norm_rope_store, c2_decode, {"kv_state": 1, "k_cache": 8}),
        "c2_prefill_norm_rope_store": (fc.c2_prefill_norm_rope_store, c2_prefill, {"kv_state": 1, "k_cache": 8}),
        "index_k_norm_rope_pack_store": (fc.index_k_norm_rope_pack_store, index_k, {"cache": 6}),
    }


def _v41_to(case: tuple, dev: torch.device) -> tuple:
    """A case's (args, kwargs) with every tensor on ``dev``."""
    args, kw = case
    move = lambda v: v.to(dev) if isinstance(v, torch.Tensor) else v  # noqa: E731
    return tuple(move(a) for a in args), {k: move(v) for k, v in kw.items()}


@pytest.mark.parametrize("device", [pytest.param("cpu"), pytest.param("cuda", marks=gpu)])
@pytest.mark.parametrize("name", ["c1_decode_norm_rope_store", "c2_decode_norm_rope_store",
                                  "c2_prefill_norm_rope_store", "index_k_norm_rope_pack_store"])
def test_v41_op_compiles_fullgraph_and_matches_eager(name: str, device: str) -> None:
    fn, build, written = _v41_cases()[name]
    dev = torch.device(device)
    (args_e, kw_e), (args_c, kw_c) = _v41_to(build(), dev), _v41_to(build(), dev)
    before = {k: args_e[i].clone() for k, i in written.items()}
    ret_e = fn(*args_e, **kw_e)
    ret_c = torch.compile(lambda *a, **k: fn(*a, **k), fullgraph=True, backend="inductor")(*args_c, **kw_c)
    assert not counters["graph_break"], dict(counters["graph_break"])
    if ret_e is None:
        assert ret_c is None
    else:
        _assert_same(f"{name}: latent", ret_e, ret_c)
        if "out" in kw_c:  # a caller's out is written in place
            _assert_same(f"{name}: out", kw_e["out"], kw_c["out"])
    for k, i in written.items():
        _assert_same(f"{name}: {k}", args_e[i], args_c[i])
        assert not torch.equal(_bytes(args_e[i]), _bytes(before[k])), f"{name}: {k} never written"


def test_v41_compiled_call_raises_the_eager_error_at_run_time() -> None:
    fn, build, _ = _v41_cases()["c1_decode_norm_rope_store"]
    args, kw = build()
    bad = (*args[:3], torch.tensor([3, 0, 17, -1, 4, 10**6]), *args[4:])  # a slot outside the cache
    with pytest.raises(ValueError) as eager:
        fn(*bad, **kw)
    with pytest.raises(ValueError) as comp:
        torch.compile(lambda *a, **k: fn(*a, **k), fullgraph=True, backend="inductor")(*bad, **kw)
    assert str(comp.value) == str(eager.value)


def test_v41_opcheck_every_registered_op() -> None:
    from flashcompress.v41 import library as v41_library
    from flashcompress.v41.layouts import KVLayout

    cases = _v41_cases()
    assert set(cases) == set(v41_library.OPS)
    for name, (_, build, _) in cases.items():
        args, kw = build()
        kw = {k: (v.value if isinstance(v, KVLayout) else v) for k, v in kw.items()}
        if name != "index_k_norm_rope_pack_store":  # the op's trailing arguments, in schema order
            kw.setdefault("out", torch.zeros(args[0].shape[0], 512, dtype=torch.bfloat16))
            if name == "c2_decode_norm_rope_store":
                kw = {k: kw[k] for k in ("page_size", "ring_size", "draft_len", "layout", "out")}
            elif name == "c2_prefill_norm_rope_store":
                kw = {k: kw[k] for k in ("page_size", "ring_size", "layout", "out")}
            else:
                kw = {k: kw[k] for k in ("page_size", "layout", "out")}
        torch.library.opcheck(v41_library.OPS[name], (*args, *kw.values()))
