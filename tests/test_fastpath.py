"""The binding-first eager path (``flashcompress.fastpath``), its Python side on CPU tensors.

The CUDA call path is simulated: tensors of a subclass that reports ``is_cuda``, the settings
flags of the JIT backend without debug checks, the full path's CUDA behaviour (binding-checked
metadata, no value checks: as ``test_call_memo``), a no-op backend that records its calls, and
fake binding functions in the fast memos that either accept (record the call) or raise like a
tvm-ffi binding does.  Checked here: a known call goes straight to the binding (no Python check,
no backend); a call the binding rejects raises exactly the full path's error (type and message)
and reaches no backend; a rejected call the Python checks accept runs the full path; scalars of
another type, grad mode, debug mode and unknown keys never use the binding.
The same on real CUDA tensors and kernels: ``tests/test_gpu_hostfast.py``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from test_bad_input import CASES, H, decode_kwargs, store_kwargs

import flashcompress.dispatch as D
from flashcompress import CompressorDecodePlan, compress_and_store, compress_forward, compress_norm_rope_store
from flashcompress import fastpath as F
from flashcompress import validation as V
from flashcompress.jit import settings as S
from flashcompress.layouts import INDEXER_FP8


class FakeCuda(torch.Tensor):
    """A CPU tensor that says it lives on a GPU (the fast path's device test)."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


class FakeBinding:
    """A binding function: records each call; ``reject`` raises as a tvm-ffi check does."""

    def __init__(self, reject: bool = False) -> None:
        self.reject = reject
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any) -> None:
        self.calls.append(args)
        if self.reject:
            raise ValueError("kv_score_input: expected shape [*, 512], got [2, 256] (from the binding)")


class Backend:
    """The no-op backend: records which op ran."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def __getattr__(self, name: str):
        return lambda *a, **k: self.ran.append(name)


@pytest.fixture
def gpu_like(monkeypatch: pytest.MonkeyPatch) -> Backend:
    backend = Backend()
    monkeypatch.setattr(V, "checked_by_binding", lambda device: None)
    monkeypatch.setattr(V, "wants_values", lambda device: False)
    monkeypatch.setattr(V, "wants_value_checks", lambda t: False)
    monkeypatch.setattr(D, "ops_backend", lambda device: backend)
    monkeypatch.setattr(S, "_JIT_ENABLED", True)
    monkeypatch.setattr(S, "_DEBUG", False)
    V.clear_memo()
    for memo in (F.COMPRESS, F.FUSED, F.STORE, F.PLANS):
        memo.clear()
    yield backend
    V.clear_memo()
    for memo in (F.COMPRESS, F.FUSED, F.STORE, F.PLANS):
        memo.clear()


def _gpu(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v.as_subclass(FakeCuda) if type(v) is torch.Tensor else v for k, v in kwargs.items()}


def decode_compress_kwargs() -> dict[str, Any]:
    """compress_forward of a C4 indexer decode plan (2 requests)."""
    torch.manual_seed(3)
    plan = CompressorDecodePlan.generate(**decode_kwargs())
    return _gpu(dict(kv_score_buffer=torch.randn(2056, 4 * H), kv_score_input=torch.randn(2, 4 * H),
                     ape=torch.randn(8, H), plan=plan, head_dim=H, compress_ratio=4, out=torch.zeros(2, H)))


def fused_kwargs() -> dict[str, Any]:
    kw = decode_compress_kwargs()
    del kw["out"]
    st = store_kwargs()
    return dict(kw, **_gpu(dict(norm_weight=torch.ones(H), norm_eps=1e-6, freq_cis=st["freq_cis"],
                                out_loc=torch.tensor([3, 0]),
                                kvcache=torch.zeros(2, INDEXER_FP8.page_bytes(64), dtype=torch.uint8),
                                page_size=64)))


def _compress_key(kw: dict[str, Any]) -> tuple[Any, ...]:
    p = kw["plan"]
    out = kw.get("out")
    inp = kw["kv_score_input"]
    return (p[0], p.is_online, kw["compress_ratio"], kw["head_dim"], kw.get("is_online", False),
            kw["kv_score_buffer"].dtype, inp.dtype, None if out is None else out.dtype)


def _fused_key(kw: dict[str, Any]) -> tuple[Any, ...]:
    p = kw["plan"]
    return (p[0], p.is_online, kw["compress_ratio"], kw["head_dim"], kw.get("is_online", False),
            kw["kv_score_buffer"].dtype, kw["kv_score_input"].dtype, kw.get("use_fp4", False),
            kw.get("bf16_store", False), kw["page_size"], kw.get("layout", "v4"))


def _store_key(kw: dict[str, Any]) -> tuple[Any, ...]:
    p = kw["plan"]
    return (type(p), p[0], kw["kv"].dtype, kw["kv"].shape[1], kw.get("use_fp4", False), kw.get("bf16_store", False),
            kw["page_size"], kw.get("layout", "v4"))


# op, kwargs, install a fake binding under the valid call's key
OPS = {
    "compress_forward": (compress_forward, decode_compress_kwargs,
                         lambda kw, b: F.COMPRESS.__setitem__(_compress_key(kw), (b, False))),
    "compress_and_store": (compress_and_store, fused_kwargs, lambda kw, b: F.FUSED.__setitem__(_fused_key(kw), b)),
    "compress_norm_rope_store": (compress_norm_rope_store, lambda: _gpu(store_kwargs()),
                                 lambda kw, b: F.STORE.__setitem__(_store_key(kw), (b, True, 4))),
}


def _outcome(fn, kwargs: dict[str, Any]) -> tuple[type, str] | None:
    try:
        fn(**kwargs)
    except (TypeError, ValueError) as e:
        return type(e), str(e)
    return None


@pytest.mark.parametrize("op", list(OPS))
def test_a_known_call_goes_straight_to_the_binding(op: str, gpu_like: Backend, monkeypatch) -> None:
    fn, make, install = OPS[op]
    kw = make()
    binding = FakeBinding()
    install(kw, binding)

    def no_checks(*a, **k):
        raise AssertionError("the Python checks ran")

    monkeypatch.setattr(V, "check_compress", no_checks)
    monkeypatch.setattr(V, "check_store", no_checks)
    with torch.no_grad():
        fn(**kw)
    assert gpu_like.ran == [] and len(binding.calls) == 1
    args = binding.calls[0]
    plan_rows = kw["plan"][1]
    if op == "compress_forward":  # each tensor once, the plan rows once
        want = (kw["kv_score_buffer"], kw["kv_score_input"], kw["ape"], plan_rows, kw["out"])
    elif op == "compress_and_store":
        want = (kw["kv_score_buffer"], kw["kv_score_input"], kw["ape"], plan_rows, kw["norm_weight"], kw["freq_cis"],
                kw["out_loc"], kw["kvcache"], kw["norm_eps"], kw["page_size"])
    else:
        want = (kw["kv"], plan_rows, kw["norm_weight"], kw["norm_eps"], kw["freq_cis"], kw["out_loc"], kw["kvcache"],
                kw["page_size"], True, 4)
    assert len(args) == len(want) and all(a is b for a, b in zip(args, want))


def _bad_cases() -> list[tuple[str, str, Any]]:
    """Every compress_forward / store mutation of the bad-input catalogue, on the fast path's calls."""
    out = []
    for cid, _, fn, mutate, _, _ in CASES:
        if fn is compress_forward:
            out.append((cid, "compress_forward", mutate))
            out.append((cid + "-fused", "compress_and_store", mutate))
        elif fn is compress_norm_rope_store:
            out.append((cid, "compress_norm_rope_store", mutate))
    return out


BAD = _bad_cases()


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_a_rejected_call_raises_the_full_paths_error(case, gpu_like: Backend) -> None:
    _, op, mutate = case
    fn, make, install = OPS[op]
    valid = make()
    bad = dict(valid)
    try:
        mutate(bad)
    except (KeyError, IndexError, TypeError):
        pytest.skip("the mutation needs an argument this call does not take")
    bad = _gpu(bad)
    with torch.enable_grad():  # the requires_grad cases
        cold = _outcome(fn, bad)  # empty fast memo: the full path
        gpu_like.ran.clear()
        binding = FakeBinding(reject=True)
        install(valid, binding)
        warm = _outcome(fn, bad)
    assert warm == cold
    if warm is not None:
        assert gpu_like.ran == [], "a rejected call reached a backend"
    else:  # the full path accepts it: it ran there
        assert len(gpu_like.ran) == 1


@pytest.mark.parametrize("op", list(OPS))
def test_a_rejected_call_the_checks_accept_runs_the_full_path(op: str, gpu_like: Backend) -> None:
    """E.g. an ``ape`` of another dtype or a strided ``freq_cis``: the backend converts them."""
    fn, make, install = OPS[op]
    kw = make()
    binding = FakeBinding(reject=True)
    install(kw, binding)
    with torch.no_grad():
        fn(**kw)
    assert len(binding.calls) == 1 and len(gpu_like.ran) == 1


@pytest.mark.parametrize("op", list(OPS))
def test_debug_mode_grad_mode_and_cpu_tensors_never_use_the_binding(op: str, gpu_like: Backend,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    fn, make, install = OPS[op]
    kw = make()
    binding = FakeBinding()
    install(kw, binding)
    first = "kv" if op == "compress_norm_rope_store" else "kv_score_buffer"
    with torch.enable_grad(), pytest.raises(ValueError, match="does not require grad"):
        fn(**dict(kw, **{first: kw[first].clone().requires_grad_(True)}))
    monkeypatch.setattr(S, "_DEBUG", True)
    fn(**kw)
    monkeypatch.setattr(S, "_DEBUG", False)
    fn(**dict(kw, **{first: kw[first].as_subclass(torch.Tensor)}))  # a CPU tensor
    assert binding.calls == [] and len(gpu_like.ran) == 2  # the requires_grad call was rejected
    fn(**kw)
    assert len(binding.calls) == 1


def test_scalars_of_another_type_never_use_the_binding(gpu_like: Backend) -> None:
    kw, fused, st = decode_compress_kwargs(), fused_kwargs(), _gpu(store_kwargs())
    bindings = [FakeBinding() for _ in range(3)]
    F.COMPRESS[_compress_key(kw)] = (bindings[0], False)
    F.FUSED[_fused_key(fused)] = bindings[1]
    F.STORE[_store_key(st)] = (bindings[2], True, 4)
    with pytest.raises(TypeError, match="^head_dim: expected an int"):
        compress_forward(**dict(kw, head_dim=float(H)))
    with pytest.raises(TypeError, match="^is_online: expected a bool"):
        compress_forward(**dict(kw, is_online=0))
    with pytest.raises(TypeError, match="^compress_ratio: expected an int"):
        compress_and_store(**dict(fused, compress_ratio=4.0))
    with pytest.raises(TypeError, match="^use_fp4: expected a bool"):
        compress_and_store(**dict(fused, use_fp4=0))
    with pytest.raises(TypeError, match="^use_fp4: expected a bool"):
        compress_norm_rope_store(**dict(st, use_fp4=0))
    with pytest.raises(TypeError, match="^page_size: expected an int"):
        compress_norm_rope_store(**dict(st, page_size=64.0))
    with pytest.raises(TypeError, match="^kv_score_buffer: expected a torch.Tensor"):
        compress_forward(**dict(kw, kv_score_buffer=None))
    assert all(b.calls == [] for b in bindings) and gpu_like.ran == []


def test_keys_are_learnt_only_from_binding_checked_devices(gpu_like: Backend) -> None:
    """A CPU call (device -1) never teaches the fast path a key, on any backend."""
    compress_forward(**{k: v.as_subclass(torch.Tensor) if isinstance(v, torch.Tensor) else v
                        for k, v in decode_compress_kwargs().items()})
    compress_norm_rope_store(**store_kwargs())
    assert not F.COMPRESS and not F.STORE and len(gpu_like.ran) == 2


def test_the_fast_memos_are_jit_module_memos(gpu_like: Backend) -> None:
    """``jit.clear_memo`` (and a settings reload) forget the loaded bindings."""
    from flashcompress import jit

    F.COMPRESS["k"] = (object(), False)
    F.FUSED["k"] = object()
    F.STORE["k"] = (object(), True, 4)
    F.PLANS["k"] = (object(), False)
    jit.clear_memo()
    assert not F.COMPRESS and not F.FUSED and not F.STORE and not F.PLANS


# --------------------------------------------------------------------------
# CompressorDecodePlan.generate / generate_online
# --------------------------------------------------------------------------

GEN = CompressorDecodePlan.generate
GEN_ONLINE = CompressorDecodePlan.generate_online


def online_decode_kwargs() -> dict[str, Any]:
    from test_bad_input import online_decode_kwargs as make

    return make()


def _install_plan(fn, kw: dict[str, Any], binding: FakeBinding, allocates: bool = False) -> None:
    if fn is GEN:
        key = (kw["compress_ratio"], kw["swa_page_size"], kw["ring_size"], kw.get("use_req_ring", False))
    else:
        key = ("online", kw.get("state_slot_offset", 0))
    F.PLANS[key] = (binding, allocates)


PLAN_OPS = {"generate": (GEN, decode_kwargs), "generate_online": (GEN_ONLINE, online_decode_kwargs)}


class AllocBinding(FakeBinding):
    """An allocating export (``decode_alloc``, ``compress_decode_alloc``): returns the rows it allocated."""

    def __call__(self, *args: Any) -> torch.Tensor:
        super().__call__(*args)
        self.rows = torch.zeros((args[0].shape[0], 16), dtype=torch.uint8)
        return self.rows


@pytest.mark.parametrize("allocates", [False, True])
@pytest.mark.parametrize("op", list(PLAN_OPS))
def test_a_known_plan_call_goes_straight_to_the_binding(op: str, allocates: bool, gpu_like: Backend,
                                                        monkeypatch) -> None:
    fn, make = PLAN_OPS[op]
    kw = _gpu(make())
    binding = AllocBinding() if allocates else FakeBinding()
    _install_plan(fn, kw, binding, allocates)
    monkeypatch.setattr(V, "check_world", lambda *a, **k: (_ for _ in ()).throw(AssertionError("checks ran")))
    plan = fn(**kw)
    assert type(plan) is CompressorDecodePlan and plan.is_online is (fn is GEN_ONLINE)
    assert plan[0] == (128 if fn is GEN_ONLINE else 4) and plan[1].shape == (2, 16) and plan[1].dtype == torch.uint8
    (args,) = binding.calls
    if allocates:
        assert plan[1] is binding.rows
    else:
        assert args[0] is plan[1]
        args = args[1:]
    assert args[0] is kw["req_pool_indices"]
    if fn is GEN:
        want = (kw["req_to_token"], kw["full_to_state"], kw["seq_lens"], 256, 8, False)
    else:
        want = (kw["req_to_token"], kw["seq_lens"], 0)
    assert all(a is b or a == b for a, b in zip(args[1:], want)) and len(args) == 1 + len(want)


PLAN_BAD = [(c[0], c[2], c[3]) for c in CASES if c[2] in (GEN, GEN_ONLINE)]


@pytest.mark.parametrize("case", PLAN_BAD, ids=[c[0] for c in PLAN_BAD])
def test_a_rejected_plan_call_raises_the_full_paths_error(case, gpu_like: Backend) -> None:
    _, fn, mutate = case
    valid = _gpu(PLAN_OPS["generate" if fn is GEN else "generate_online"][1]())
    bad = dict(valid)
    mutate(bad)
    bad = _gpu(bad)
    cold = _any_outcome(fn, bad)
    binding = FakeBinding(reject=True)
    _install_plan(fn, valid, binding)
    assert _any_outcome(fn, bad) == cold


def _any_outcome(fn, kwargs: dict[str, Any]) -> tuple[type, str] | None:
    """Also the backend's own errors: a value-check case runs unchecked here (no value checks on "CUDA")."""
    try:
        fn(**kwargs)
    except Exception as e:  # noqa: BLE001
        return type(e), str(e)
    return None


def test_plan_keys_are_learnt_only_from_binding_checked_devices(gpu_like: Backend) -> None:
    GEN(**decode_kwargs())
    GEN_ONLINE(**online_decode_kwargs())
    assert not F.PLANS


@pytest.mark.parametrize("allocates", [False, True])
def test_compress_forward_without_out(allocates: bool, gpu_like: Backend) -> None:
    """``out=None``: the allocating binding returns the rows (or they are allocated here first)."""
    kw = decode_compress_kwargs()
    del kw["out"]
    binding = AllocBinding() if allocates else FakeBinding()
    F.COMPRESS[_compress_key(kw)] = (binding, allocates)
    with torch.no_grad():
        got = compress_forward(**kw)
    (args,) = binding.calls
    if allocates:
        assert got is binding.rows and len(args) == 4
    else:
        assert args[4] is got and got.shape == (2, H) and got.dtype == kw["kv_score_input"].dtype
    assert args[3] is kw["plan"][1] and gpu_like.ran == []


def test_set_tiling_switches_the_fast_path_too() -> None:
    """``cuda_ops.compress.set_tiling`` is the one process-wide design switch: it forgets the fast
    path's memoised compress bindings (learnt under the old tiling), rejects unknown names and is
    what ``current_tiling`` reports."""
    from flashcompress import fastpath
    from flashcompress.cuda_ops import compress as cc

    saved = cc.current_tiling()
    try:
        cc.set_tiling("auto")
        fastpath.COMPRESS[("probe",)] = (object(), False)
        fastpath.FUSED[("probe",)] = object()
        cc.set_tiling("closing")
        assert cc.current_tiling() == "closing"
        assert ("probe",) not in fastpath.COMPRESS and ("probe",) not in fastpath.FUSED
        with pytest.raises(ValueError, match="tiling"):
            cc.set_tiling("fastest")
        assert cc.current_tiling() == "closing"
    finally:
        cc.set_tiling(saved)


@pytest.mark.parametrize("online", [False, True])
def test_c128_prefill_fused_runs_the_two_step_launches(monkeypatch: pytest.MonkeyPatch, online: bool) -> None:
    """The CUDA backend's ``compress_and_store`` of a C128 / online C128 prefill is
    ``compress_forward`` into rows of the input dtype, then the store of those rows with the
    call's plan rows and store arguments (the two-step path); decode and C4 prefill keep the
    fused kernel (here: reach the module lookup)."""
    from flashcompress.cuda_ops import compress as cc
    from flashcompress.cuda_ops import store as cs
    from flashcompress.layouts import LAYER_KINDS
    from flashcompress.validation import CompressCall, StoreTail, store_format

    seen: list[tuple] = []
    monkeypatch.setattr(cc, "compress_forward", lambda call, out, tiling=None: seen.append(("forward", out, tiling)))
    monkeypatch.setattr(cs, "compress_norm_rope_store", lambda call: seen.append(("store", call)))
    tail = StoreTail(torch.ones(512), 1e-6, torch.zeros(4, 32, dtype=torch.complex64), torch.zeros(8, dtype=torch.int64),
                     torch.zeros(2, 584 * 2, dtype=torch.uint8), 2, store_format(512, False, False, 2)[0])
    rows, plan_w = torch.zeros(3, 16, dtype=torch.uint8), torch.zeros(8, 8, dtype=torch.uint8)
    inp = torch.zeros(8, 1024, dtype=torch.bfloat16)
    call = CompressCall(LAYER_KINDS[(128, 512, online)], torch.zeros(4, 1536 if online else 1024), inp,
                        torch.zeros(128, 512, dtype=torch.bfloat16), rows, plan_w, tail, -1)
    cc.compress_and_store(call, tiling="closing")
    assert [s[0] for s in seen] == ["forward", "store"]
    kv = seen[0][1]
    assert kv.shape == (3, 512) and kv.dtype is torch.bfloat16 and seen[0][2] == "closing"
    store = seen[1][1]
    assert store.kv is kv and store.plan_rows is rows and store.store is tail and not store.is_decode
    assert store.ratio == 128
    seen.clear()
    monkeypatch.setattr(cc, "_MODULES", {})
    monkeypatch.setattr(cc, "_module", lambda *key: (_ for _ in ()).throw(LookupError(key)))
    with pytest.raises(LookupError):  # a decode call goes to the fused kernel's module
        cc.compress_and_store(call._replace(plan_w=None), tiling="auto")
    assert seen == []


def test_a_layout_never_uses_another_layouts_binding(gpu_like: Backend) -> None:
    """The store keys carry the layout: a ``layout="v41"`` call misses the v4 bindings (and runs
    the full path, which checks its cache size against the V4.1 layout), and its own key is found
    for the layout's value, its ``KVLayout`` member alike."""
    from flashcompress.v41.layouts import KVLayout

    fused, st = fused_kwargs(), _gpu(store_kwargs())
    v4_fused, v4_store = FakeBinding(), FakeBinding()
    F.FUSED[_fused_key(fused)] = v4_fused
    F.STORE[_store_key(st)] = (v4_store, True, 4)
    with pytest.raises(ValueError, match="^layout: expected 'v4' unless head dim is 512"):
        compress_and_store(**dict(fused, layout="v41"))  # the fused call is the head-128 indexer
    with pytest.raises(ValueError, match=r"^kvcache: expected \[pages, 33792\] \(v41 page of 64 tokens\)"):
        compress_norm_rope_store(**dict(st, layout="v41"))
    assert v4_fused.calls == [] and v4_store.calls == [] and gpu_like.ran == []
    v41_store = FakeBinding()
    F.STORE[_store_key(dict(st, layout="v41"))] = (v41_store, True, 4)
    with torch.no_grad():
        compress_norm_rope_store(**dict(st, layout=KVLayout.V41))
        compress_norm_rope_store(**dict(st, layout="v41"))
    assert len(v41_store.calls) == 2 and v4_store.calls == []


def test_v41_layout_calls_teach_the_store_key_of_their_layout(gpu_like: Backend, monkeypatch) -> None:
    """remember_store keys a learnt call by its layout's value; remember_compress learns no fused
    key for a V4.1 layout (the CUDA compress_and_store runs the two steps there)."""
    from flashcompress.cuda_ops import store as cs
    from flashcompress.layouts import MAIN_FORMATS
    from flashcompress.v41.layouts import KVLayout

    from flashcompress.cuda_ops import compress as cc

    monkeypatch.setattr(cs, "store_module", lambda fmt, dtype: SimpleNamespace(forward_checked=("store", fmt.name)))
    monkeypatch.setattr(cc, "_module", lambda *key: (_ for _ in ()).throw(LookupError(key)))
    st = store_kwargs()
    st["kvcache"] = torch.zeros(2, KVLayout.V41_FP4.page_bytes(64), dtype=torch.uint8)
    args = (st["norm_weight"], st["norm_eps"], st["freq_cis"], st["out_loc"], st["kvcache"], 64, False, False,
            "V41_FP4")
    call = V.check_store(st["kv"], st["plan"], args)
    F.remember_store(call._replace(device=0), st["plan"])  # as if on GPU 0
    assert list(F.STORE) == [_store_key(dict(st, layout="v41_fp4"))]
    assert F.STORE[_store_key(dict(st, layout=KVLayout.V41_FP4))][0] == ("store", MAIN_FORMATS[KVLayout.V41_FP4].name)
    fused = fused_kwargs()
    plan = fused["plan"]
    ccall = V.check_compress(fused["kv_score_buffer"].as_subclass(torch.Tensor),
                             fused["kv_score_input"].as_subclass(torch.Tensor), fused["ape"].as_subclass(torch.Tensor),
                             plan, H, 4, None, False)
    tail = call.store
    F.remember_compress(ccall._replace(device=0, store=tail), plan, H, 4, False, None)
    assert not F.FUSED


@pytest.mark.parametrize("prefill", [False, True])
def test_v41_layout_fused_runs_the_two_step_launches(monkeypatch: pytest.MonkeyPatch, prefill: bool) -> None:
    """The CUDA ``compress_and_store`` into a V4.1 layout: ``compress_forward`` into rows of the
    input dtype, then the store kernel, in decode and C4 prefill too (no epilogue variant)."""
    from flashcompress.cuda_ops import compress as cc
    from flashcompress.cuda_ops import store as cs
    from flashcompress.layouts import LAYER_KINDS
    from flashcompress.validation import CompressCall, StoreTail, store_format

    seen: list[tuple] = []
    monkeypatch.setattr(cc, "compress_forward", lambda call, out, tiling=None: seen.append(("forward", out, tiling)))
    monkeypatch.setattr(cs, "compress_norm_rope_store", lambda call: seen.append(("store", call)))
    monkeypatch.setattr(cc, "_module", lambda *key: (_ for _ in ()).throw(LookupError(key)))
    fmt = store_format(512, False, False, 64, "v41_new")[0]
    tail = StoreTail(torch.ones(512), 1e-6, torch.zeros(4, 32, dtype=torch.complex64), torch.zeros(8, dtype=torch.int64),
                     torch.zeros(2, fmt.page_bytes(64), dtype=torch.uint8), 64, fmt)
    rows = torch.zeros(3, 16, dtype=torch.uint8)
    plan_w = torch.zeros(8, 8, dtype=torch.uint8) if prefill else None
    call = CompressCall(LAYER_KINDS[(4, 512, False)], torch.zeros(16, 2048), torch.zeros(3 if not prefill else 8, 2048),
                        torch.zeros(8, 512), rows, plan_w, tail, -1)
    cc.compress_and_store(call, tiling="auto")
    assert [s[0] for s in seen] == ["forward", "store"]
    kv, store = seen[0][1], seen[1][1]
    assert kv.shape == (3, 512) and kv.dtype is torch.float32
    assert store.kv is kv and store.store is tail and store.is_decode is (not prefill) and store.ratio == 4
