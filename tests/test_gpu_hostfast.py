"""The binding-first eager path (``flashcompress.fastpath``) on CUDA tensors and the real bindings.

* a steady-state call (its key learnt from a first, fully checked call) goes straight to the
  binding and writes the bytes of the full path (compress_forward, compress_norm_rope_store,
  compress_and_store, CompressorDecodePlan.generate / generate_online);
* every bad call of the catalogue below raises, with the key learnt, exactly the error (type and
  message) it raises on the full path with nothing learnt, and writes nothing (state pool, out,
  kvcache compared after a device sync);
* calls the binding rejects but the full path accepts (a strided ``freq_cis``, a bf16 ``ape`` for
  an fp32 input) run on the full path and write its bytes;
* with ``FLASHCOMPRESS_DEBUG=1`` switched on mid-process the value checks run again.
Needs a CUDA GPU.  The Python side on CPU with fake bindings: ``tests/test_fastpath.py``.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from test_bad_input import H, decode_kwargs, online_decode_kwargs, store_kwargs

import flashcompress as fc
from flashcompress import fastpath as F
from flashcompress import validation as V
from flashcompress.layouts import INDEXER_FP8

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DEV = torch.device("cuda", 0)


@pytest.fixture(autouse=True)
def empty_memos():
    V.clear_memo()
    for memo in (F.COMPRESS, F.FUSED, F.STORE, F.PLANS):
        memo.clear()
    yield
    torch.cuda.synchronize()


def _cuda(kw: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in kw.items():
        if isinstance(v, torch.Tensor):
            out[k] = v.to(DEV)
        elif isinstance(v, V.PlanTuple):
            out[k] = type(v)(v[0], *[t.to(DEV) for t in v[1:]], is_online=v.is_online)
        else:
            out[k] = v
    return out


def plan_kwargs() -> dict[str, Any]:
    return _cuda(decode_kwargs())


def c128_plan_kwargs() -> dict[str, Any]:
    return dict(plan_kwargs(), compress_ratio=128, ring_size=128)


def online_plan_kwargs() -> dict[str, Any]:
    return _cuda(online_decode_kwargs())


def compress_kwargs() -> dict[str, Any]:
    """compress_forward of a C4 indexer decode plan built on the GPU (2 requests, one at a boundary)."""
    torch.manual_seed(5)
    plan = fc.CompressorDecodePlan.generate(**plan_kwargs())
    return dict(kv_score_buffer=torch.randn(2056, 4 * H, device=DEV), kv_score_input=torch.randn(2, 4 * H, device=DEV),
                ape=torch.randn(8, H, device=DEV), plan=plan, head_dim=H, compress_ratio=4,
                out=torch.zeros(2, H, device=DEV))


def main_store_kwargs() -> dict[str, Any]:
    return _cuda(store_kwargs())


def fused_kwargs() -> dict[str, Any]:
    kw = compress_kwargs()
    del kw["out"]
    st = main_store_kwargs()
    return dict(kw, norm_weight=torch.rand(H, device=DEV) + 0.5, norm_eps=1e-6, freq_cis=st["freq_cis"],
                out_loc=torch.tensor([3, 0], device=DEV),
                kvcache=torch.zeros(2, INDEXER_FP8.page_bytes(64), dtype=torch.uint8, device=DEV), page_size=64)


def compress_alloc_kwargs() -> dict[str, Any]:
    """compress_forward with ``out=None`` (the binding allocates the rows)."""
    kw = compress_kwargs()
    del kw["out"]
    return kw


OPS: dict[str, tuple[Callable, Callable[[], dict[str, Any]]]] = {
    "compress_forward": (fc.compress_forward, compress_kwargs),
    "compress_forward_alloc": (fc.compress_forward, compress_alloc_kwargs),
    "compress_norm_rope_store": (fc.compress_norm_rope_store, main_store_kwargs),
    "compress_and_store": (fc.compress_and_store, fused_kwargs),
    "generate": (fc.CompressorDecodePlan.generate, plan_kwargs),
    "generate_c128": (fc.CompressorDecodePlan.generate, c128_plan_kwargs),
    "generate_online": (fc.CompressorDecodePlan.generate_online, online_plan_kwargs),
}
WRITTEN = ("kv_score_buffer", "out", "kvcache")


def _fresh(kw: dict[str, Any]) -> dict[str, Any]:
    """The same call on copies of the buffers it writes."""
    return {k: v.clone() if k in WRITTEN else v for k, v in kw.items()}


def _result(op: str, kw: dict[str, Any], ret: Any) -> list[torch.Tensor]:
    if op.startswith("generate"):
        return [ret[1]]
    return [kw[k] for k in WRITTEN if k in kw] + ([ret] if op == "compress_forward_alloc" else [])


@pytest.mark.parametrize("op", list(OPS))
def test_the_fast_path_writes_the_bytes_of_the_full_path(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fn, make = OPS[op]
    kw = make()
    first = _fresh(kw)
    want = _result(op, first, fn(**first))  # every check; learns the key
    assert F.COMPRESS or F.FUSED or F.STORE or F.PLANS, "the first call taught the fast path nothing"

    def no_checks(*a, **k):
        raise AssertionError("the Python checks ran on a steady-state call")

    for name in ("check_compress", "check_store", "check_world"):
        monkeypatch.setattr(V, name, no_checks)
    for _ in range(2):
        again = _fresh(kw)
        got = _result(op, again, fn(**again))
        torch.cuda.synchronize()
        assert all(torch.equal(g, w) for g, w in zip(got, want))


def _bad(op: str) -> list[tuple[str, Callable[[dict[str, Any]], None]]]:
    def set_(name: str, value: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], None]:
        return lambda kw: kw.__setitem__(name, value(kw))

    def alias(name: str, of: str, dtype: torch.dtype | None = None) -> Callable[[dict[str, Any]], None]:
        """``kw[name]`` as a view of ``kw[of]``'s memory, same shape and dtype as before."""
        def mutate(kw: dict[str, Any]) -> None:
            t, base = kw[name], kw[of]
            flat = base.view(torch.uint8).view(-1) if base.dtype is not torch.uint8 else base.view(-1)
            kw[name] = flat[: t.numel() * t.element_size()].view(t.dtype).view(t.shape)
        return mutate

    def misaligned(name: str) -> Callable[[dict[str, Any]], None]:
        def mutate(kw: dict[str, Any]) -> None:
            t = kw[name]
            kw[name] = torch.zeros(t.numel() + 1, dtype=t.dtype, device=DEV)[1:].view(t.shape)
        return mutate

    compress = [
        ("input_double", set_("kv_score_input", lambda k: k["kv_score_input"].double())),
        ("input_width", set_("kv_score_input", lambda k: torch.zeros(2, 2 * H, device=DEV))),
        ("input_rows", set_("kv_score_input", lambda k: torch.zeros(3, 4 * H, device=DEV))),
        ("input_noncontig", set_("kv_score_input", lambda k: torch.zeros(4 * H, 2, device=DEV).t())),
        ("input_on_cpu", set_("kv_score_input", lambda k: k["kv_score_input"].cpu())),
        ("input_misaligned", misaligned("kv_score_input")),
        ("input_aliases_state", alias("kv_score_input", "kv_score_buffer")),
        ("input_requires_grad", set_("kv_score_input", lambda k: k["kv_score_input"].clone().requires_grad_(True))),
        ("ape_shape", set_("ape", lambda k: torch.zeros(4, 2 * H, device=DEV))),
        ("ape_int", set_("ape", lambda k: torch.zeros(8, H, dtype=torch.int32, device=DEV))),
        ("ape_misaligned", misaligned("ape")),
        ("ape_aliases_state", alias("ape", "kv_score_buffer")),
        ("state_fp16", set_("kv_score_buffer", lambda k: k["kv_score_buffer"].half())),
        ("state_width", set_("kv_score_buffer", lambda k: torch.zeros(2056, 2 * H, device=DEV))),
        ("state_noncontig", set_("kv_score_buffer", lambda k: torch.zeros(4 * H, 2056, device=DEV).t())),
        ("ratio_mismatch", set_("compress_ratio", lambda k: 128)),
        ("head_dim_float", set_("head_dim", lambda k: float(H))),
        ("online_c4", set_("is_online", lambda k: True)),
        ("plan_bytes", set_("plan", lambda k: fc.CompressorDecodePlan(4, k["plan"][1][:, :8].contiguous()))),
    ]
    out = [
        ("out_rows", set_("out", lambda k: torch.zeros(1, H, device=DEV))),
        ("out_noncontig", set_("out", lambda k: torch.zeros(H, 2, device=DEV).t())),
        ("out_aliases_state", alias("out", "kv_score_buffer")),
        ("out_aliases_input", alias("out", "kv_score_input")),
        ("out_aliases_ape", alias("out", "ape")),
        ("out_int64", set_("out", lambda k: torch.zeros(2, H, dtype=torch.int64, device=DEV))),
    ]
    tail = [
        ("weight_shape", set_("norm_weight", lambda k: torch.ones(2 * k["norm_weight"].shape[0], device=DEV))),
        ("weight_requires_grad", set_("norm_weight", lambda k: k["norm_weight"].clone().requires_grad_(True))),
        ("eps_negative", set_("norm_eps", lambda k: -1.0)),
        ("eps_one", set_("norm_eps", lambda k: 1.0)),
        ("eps_nan", set_("norm_eps", lambda k: float("nan"))),
        ("eps_int", set_("norm_eps", lambda k: 0)),
        ("freq_real_view", set_("freq_cis", lambda k: torch.view_as_real(k["freq_cis"]).flatten(-2).contiguous())),
        ("freq_width", set_("freq_cis", lambda k: k["freq_cis"][:, :16].contiguous())),
        ("freq_on_cpu", set_("freq_cis", lambda k: k["freq_cis"].cpu())),
        ("out_loc_int32", set_("out_loc", lambda k: k["out_loc"].int())),
        ("out_loc_count", set_("out_loc", lambda k: torch.tensor([3], device=DEV))),
        ("page_not_pow2", set_("page_size", lambda k: 48)),
        ("page_float", set_("page_size", lambda k: 64.0)),
        ("cache_page_bytes", set_("page_size", lambda k: 32)),
        ("cache_dtype", set_("kvcache", lambda k: k["kvcache"].view(torch.int8))),
        ("cache_misaligned", misaligned("kvcache")),
        ("use_fp4_int", set_("use_fp4", lambda k: 0)),
        ("bf16_store_indexer", set_("bf16_store", lambda k: True)),
        ("weight_aliases_cache", alias("norm_weight", "kvcache")),
        ("out_loc_aliases_cache", alias("out_loc", "kvcache")),
        ("freq_aliases_cache", alias("freq_cis", "kvcache")),
    ]
    store_only = [
        ("kv_dim", set_("kv", lambda k: torch.zeros(2, 256, device=DEV))),
        ("kv_rows", set_("kv", lambda k: torch.zeros(3, 512, device=DEV))),
        ("kv_noncontig", set_("kv", lambda k: torch.zeros(512, 2, device=DEV).t())),
        ("kv_aliases_cache", alias("kv", "kvcache")),
        ("fp4_main", set_("use_fp4", lambda k: True)),
        ("plan_list", set_("plan", lambda k: [4, k["plan"][1]])),
    ]
    plan = [
        ("rpi_int32", set_("req_pool_indices", lambda k: k["req_pool_indices"].int())),
        ("rpi_noncontig", set_("req_pool_indices", lambda k: torch.tensor([1, 9, 2, 9], device=DEV)[::2])),
        ("rpi_on_cpu", set_("req_pool_indices", lambda k: k["req_pool_indices"].cpu())),
        ("r2t_int64", set_("req_to_token", lambda k: k["req_to_token"].long())),
        ("r2t_noncontig", set_("req_to_token", lambda k: k["req_to_token"].t().contiguous().t())),
        ("seq_count", set_("seq_lens", lambda k: torch.tensor([8], device=DEV))),
        ("seq_on_cpu", set_("seq_lens", lambda k: k["seq_lens"].cpu())),
    ]
    regular_plan = [
        ("f2s_2d", set_("full_to_state", lambda k: k["full_to_state"][None])),
        ("f2s_noncontig", set_("full_to_state", lambda k: k["full_to_state"].repeat_interleave(2)[::2])),
        ("ring_not_multiple", set_("ring_size", lambda k: 6)),
        ("swa_not_multiple", set_("swa_page_size", lambda k: 100)),
        ("req_ring_flag_int", set_("use_req_ring", lambda k: 1)),
    ]
    online_plan = [("offset_negative", set_("state_slot_offset", lambda k: -1)),
                   ("offset_overflows_i32", set_("state_slot_offset", lambda k: 2**31 - 2))]
    return {"compress_forward": compress + out, "compress_forward_alloc": compress,
            "compress_and_store": compress + tail,
            "compress_norm_rope_store": tail + store_only, "generate": plan + regular_plan,
            "generate_c128": plan,  # request ring: the tables' contiguity is decode_checked's own check
            "generate_online": plan + online_plan}[op]


BAD = [(op, name, mutate) for op in OPS for name, mutate in _bad(op)]


def _outcome(fn: Callable, kw: dict[str, Any]) -> tuple[type, str] | None:
    try:
        with torch.enable_grad():
            fn(**kw)
    except (TypeError, ValueError, RuntimeError) as e:
        return type(e), str(e)
    return None


@pytest.mark.parametrize("case", BAD, ids=[f"{c[0]}-{c[1]}" for c in BAD])
def test_a_bad_call_raises_the_full_paths_error_and_writes_nothing(case) -> None:
    op, _, mutate = case
    fn, make = OPS[op]
    valid = make()
    bad = dict(valid)
    mutate(bad)
    cold = _outcome(fn, bad)  # nothing learnt: the full path
    assert cold is not None, "the catalogue case is not an error"
    warm_up = _fresh(valid)
    assert _outcome(fn, warm_up) is None  # learns the valid call's key
    assert F.COMPRESS or F.FUSED or F.STORE or F.PLANS
    torch.cuda.synchronize()
    before = [bad[k].clone() for k in WRITTEN if isinstance(bad.get(k), torch.Tensor)]
    assert _outcome(fn, bad) == cold
    torch.cuda.synchronize()
    after = [bad[k] for k in WRITTEN if isinstance(bad.get(k), torch.Tensor)]
    assert all(torch.equal(a, b) for a, b in zip(after, before)), "a rejected call wrote into a buffer"


def test_calls_the_full_path_converts_run_there() -> None:
    """A strided RoPE table and a bf16 bias for an fp32 input: the binding rejects them, the full
    path copies / casts them; the bytes are those of the converted arguments."""
    for op in ("compress_norm_rope_store", "compress_and_store"):
        fn, make = OPS[op]
        kw = make()
        fn(**_fresh(kw))  # learns the key
        strided = torch.stack([kw["freq_cis"], kw["freq_cis"]], dim=1)[:, 0]
        assert not strided.is_contiguous()
        a, b = _fresh(kw), _fresh(dict(kw, freq_cis=strided))
        fn(**a)
        fn(**b)
        torch.cuda.synchronize()
        assert torch.equal(a["kvcache"], b["kvcache"])
    kw = compress_kwargs()
    fc.compress_forward(**_fresh(kw))
    ape16 = kw["ape"].bfloat16()
    a, b = _fresh(dict(kw, ape=ape16.float())), _fresh(dict(kw, ape=ape16))
    fc.compress_forward(**a)
    fc.compress_forward(**b)
    torch.cuda.synchronize()
    assert torch.equal(a["out"], b["out"]) and torch.equal(a["kv_score_buffer"], b["kv_score_buffer"])


def test_debug_mode_switched_on_mid_process_runs_the_value_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Even with the fast memo still holding the key (a reload empties it; here it is put back)."""
    from flashcompress.jit import settings

    st = main_store_kwargs()
    st["plan"] = fc.CompressorDecodePlan.generate(**{**plan_kwargs(), "seq_lens": torch.tensor([8, 4], device=DEV)})
    fc.compress_norm_rope_store(**_fresh(st))  # learns the key
    learnt = dict(F.STORE)
    assert learnt
    monkeypatch.setenv("FLASHCOMPRESS_DEBUG", "1")
    settings.forget_settings()
    try:
        F.STORE.update(learnt)
        bad = _fresh(dict(st, out_loc=torch.tensor([128, 0], device=DEV)))  # past the 2 pages of 64
        before = bad["kvcache"].clone()
        with pytest.raises(ValueError, match="^out_loc: expected slots in"):
            fc.compress_norm_rope_store(**bad)
        torch.cuda.synchronize()
        assert torch.equal(bad["kvcache"], before)
    finally:
        monkeypatch.delenv("FLASHCOMPRESS_DEBUG")
        settings.forget_settings()


def test_the_bindings_allocate_their_rows_through_torch() -> None:
    """``decode_alloc`` / ``compress_decode_alloc`` (rows from torch's allocator, through tvm-ffi's
    environment) are what learnt generate / ``out=None`` calls use; the rows are an ordinary CUDA
    tensor that outlives the call."""
    import gc

    kw = plan_kwargs()
    want = fc.CompressorDecodePlan.generate(**kw)  # learns the key (and probes the allocator)
    ((_, allocates),) = F.PLANS.values()
    assert allocates, "decode_alloc could not allocate: the fast plan path allocates in Python"
    kw_out = compress_alloc_kwargs()
    F.COMPRESS.clear()
    fc.compress_forward(**_fresh(kw_out))
    ((_, allocates),) = F.COMPRESS.values()
    assert allocates, "compress_decode_alloc could not allocate: out=None is allocated in Python"
    got = fc.CompressorDecodePlan.generate(**kw)
    gc.collect()
    torch.cuda.synchronize()
    rows = got[1]
    assert type(rows) is torch.Tensor and rows.device == DEV and rows.dtype == torch.uint8 and rows.is_contiguous()
    assert torch.equal(rows, want[1])
    junk = torch.full((1 << 20,), 7, dtype=torch.uint8, device=DEV)  # reuse of a freed block would show here
    torch.cuda.synchronize()
    assert torch.equal(rows, want[1]) and junk.sum() > 0


def test_fast_path_calls_capture_in_a_cuda_graph() -> None:
    """generate + compress_and_store + compress_norm_rope_store, learnt eagerly, then captured and
    replayed: the replay writes the bytes of the eager calls."""
    pk = plan_kwargs()
    fused, st = fused_kwargs(), main_store_kwargs()
    eager_f, eager_s = _fresh(fused), _fresh(st)
    fc.CompressorDecodePlan.generate(**pk)
    fc.compress_and_store(**eager_f)
    fc.compress_norm_rope_store(**eager_s)
    assert F.PLANS and F.FUSED and F.STORE
    graph_f, graph_s = _fresh(fused), _fresh(st)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan = fc.CompressorDecodePlan.generate(**pk)
        fc.compress_and_store(**dict(graph_f, plan=plan))
        fc.compress_norm_rope_store(**dict(graph_s, plan=plan))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(graph_f["kvcache"], eager_f["kvcache"])
    assert torch.equal(graph_f["kv_score_buffer"], eager_f["kv_score_buffer"])
    assert torch.equal(graph_s["kvcache"], eager_s["kvcache"])
