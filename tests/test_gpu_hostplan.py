"""The one-call eager prefill planner (``plan`` export ``prefill_host``) on a CUDA GPU.

``CompressorPrefillPlan.generate`` / ``generate_online`` with host ``seq_lens`` / ``extend_lens``
and the world on the GPU go, once learnt from a first full-path call, straight to the binding
(``plans.HOST_PREFILL``; jit_kernel/plan_host_prefill.h).  Checked here:

* bytes equal to the PyTorch backend and to today's launcher (``cuda_ops.plans.prefill_plan`` /
  ``online_prefill_plan``) for random batches of every mode, exact and ``use_cuda_graph`` rows;
* every bad call raises, with the key learnt, the full path's error (type and message) and leaves
  plans still in flight intact;
* many back-to-back calls (more than the pinned ring's slots, growing sizes) checked after one
  sync: a staging slot is never rewritten before its copy ran;
* the caller's current stream, device lengths and empty batches (full path), debug mode.
Needs a CUDA GPU.
"""

from __future__ import annotations

import random
from typing import Any, Callable

import pytest
import torch

from _golden import load_golden
from _plan_cases import MODES, assert_plan_bytes, make_world, mode_id, random_batch
from flashcompress import CompressorPrefillPlan
from flashcompress import plans as P
from flashcompress.torch_backend import plans as tp

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DEV = torch.device("cuda", 0)


@pytest.fixture(autouse=True)
def empty_memo():
    P.HOST_PREFILL.clear()
    yield
    torch.cuda.synchronize()


@pytest.fixture(scope="module")
def world():
    return make_world(seed=23)


@pytest.fixture(scope="module")
def world_dev(world):
    return world.to(DEV)


def _regular(mode, rids, seq, ext, world_dev, num_q, graph) -> CompressorPrefillPlan:
    ratio, ring, req_ring = mode
    return CompressorPrefillPlan.generate(ratio, rids.to(DEV), seq, ext, *world_dev, 256, ring, num_q, graph, req_ring)


def _learn_regular(mode, world, world_dev, graph=False) -> None:
    rng = random.Random(5)
    rids, seq, ext = random_batch(rng, world, 3, 40)
    _regular(mode, rids, seq, ext, world_dev, int(ext.sum()), graph)
    assert P.HOST_PREFILL.get(mode[0]) is not None, "prefill_host was not learnt (export missing or no allocator)"


def _learn_online(world, world_dev) -> None:
    CompressorPrefillPlan.generate_online(torch.tensor([300]), torch.tensor([100]), torch.tensor([1], device=DEV),
                                          world_dev[0], 100)
    assert P.HOST_PREFILL.get("online") is not None


@pytest.mark.parametrize("graph", [False, True], ids=["exact", "graph_padded"])
@pytest.mark.parametrize("mode", MODES, ids=mode_id)
def test_generate_matches_torch_and_todays_path(world, world_dev, mode, graph) -> None:
    from flashcompress.cuda_ops import plans as cp

    ratio, ring, req_ring = mode
    _learn_regular(mode, world, world_dev, graph)
    rng = random.Random(300 + 10 * MODES.index(mode) + graph)
    for trial in range(10):
        rids, seq, ext = random_batch(rng, world, rng.randint(1, 16), rng.choice([1, 4, 40, 700, 3000]))
        num_q = int(ext.sum())
        want_c, want_w = tp.prefill_plan(ratio, rids, seq, ext, world.req_to_token, world.full_to_state, 256, ring,
                                         num_q, graph, req_ring)
        today_c, today_w = cp.prefill_plan(ratio, rids.to(DEV), seq, ext, *world_dev, 256, ring, num_q, graph, req_ring)
        plan = _regular(mode, rids, seq, ext, world_dev, num_q, graph)
        assert type(plan) is CompressorPrefillPlan and plan[0] == ratio and plan.is_online is False
        for got, want, today, what in ((plan[1], want_c, today_c, "plan_c"), (plan[2], want_w, today_w, "plan_w")):
            assert got.is_cuda and got.dtype == torch.uint8 and got.is_contiguous()
            assert_plan_bytes(got, want, f"{what} trial {trial} vs torch")
            assert_plan_bytes(got, today, f"{what} trial {trial} vs today's launcher")


@pytest.mark.parametrize("graph", [False, True], ids=["exact", "graph_padded"])
@pytest.mark.parametrize("offset", [0, 9])
def test_generate_online_matches_torch_and_todays_path(world, world_dev, offset, graph) -> None:
    from flashcompress.cuda_ops import plans as cp

    _learn_online(world, world_dev)
    rng = random.Random(77 + offset + graph)
    for trial in range(10):
        rids, seq, ext = random_batch(rng, world, rng.randint(1, 16), rng.choice([1, 3, 40, 700, 3000]))
        num_q = int(ext.sum())
        want_c, want_w = tp.online_prefill_plan(seq, ext, rids, num_q, graph, offset)
        today_c, today_w = cp.online_prefill_plan(seq, ext, rids.to(DEV), num_q, graph, offset)
        plan = CompressorPrefillPlan.generate_online(seq, ext, rids.to(DEV), world_dev[0], num_q, graph, offset)
        assert plan[0] == 128 and plan.is_online is True
        assert_plan_bytes(plan[1], want_c, f"online plan_c trial {trial}")
        assert_plan_bytes(plan[2], want_w, f"online plan_w trial {trial}")
        assert_plan_bytes(plan[1], today_c, f"online plan_c trial {trial} vs today")
        assert_plan_bytes(plan[2], today_w, f"online plan_w trial {trial} vs today")


def test_the_learnt_export_is_what_runs(world, world_dev, monkeypatch: pytest.MonkeyPatch) -> None:
    """A learnt call reaches the export and nothing of the full path (no validation call)."""
    from flashcompress import validation as V

    _learn_regular((4, 8, False), world, world_dev)
    calls = []
    real = P.HOST_PREFILL[4]
    P.HOST_PREFILL[4] = lambda *a: calls.append(1) or real(*a)
    monkeypatch.setattr(V, "check_world", lambda *a, **k: pytest.fail("full path ran"))
    rids, seq, ext = random_batch(random.Random(1), world, 4, 100)
    _regular((4, 8, False), rids, seq, ext, world_dev, int(ext.sum()), False)
    assert calls == [1]


@pytest.mark.parametrize("relpath", ["plans/plan_c4.pt", "plans/plan_c128.pt", "plans/plan_c128_online.pt"])
def test_golden_vectors_through_the_learnt_export(relpath) -> None:
    """SGLang 0.5.23's prefill plan bytes, rebuilt by the public generate with host lengths, every
    call after the first on the one-call planner."""
    d = load_golden(relpath)
    r2t, f2s = d["req_to_token"].to(DEV), d["full_to_state"].to(DEV)
    online = "online" in relpath
    calls = sorted({k.split(".")[0] for k in d if "." in k})
    done = 0
    for _ in range(2):  # the first pass learns the key(s), the second runs on the export
        for call in calls:
            g = lambda n: d[f"{call}.{n}"]  # noqa: E731
            if not g("api").startswith("CompressorPrefillPlan"):
                continue
            rids, seq, ext = g("req_pool_indices").to(DEV), g("seq_lens"), g("extend_lens")
            num_q, graph = g("num_q_tokens"), g("use_cuda_graph")
            if online:
                plan = CompressorPrefillPlan.generate_online(seq, ext, rids, r2t, num_q, graph, g("state_slot_offset"))
            else:
                plan = CompressorPrefillPlan.generate(g("compress_ratio"), rids, seq, ext, r2t, f2s, g("swa_page_size"),
                                                      g("ring_size"), num_q, graph, g("use_req_ring"))
            assert_plan_bytes(plan[1], g("plan_c"), f"{call}.plan_c")
            assert_plan_bytes(plan[2], g("plan_w"), f"{call}.plan_w")
            done += 1
    assert done and all(v is not None for v in P.HOST_PREFILL.values()) and P.HOST_PREFILL


# ----------------------------------------------------------------------------- bad inputs

def _regular_kwargs(world_dev) -> dict[str, Any]:
    return dict(compress_ratio=4, req_pool_indices=torch.tensor([1, 2], device=DEV), seq_lens=torch.tensor([9, 6]),
                extend_lens=torch.tensor([9, 6]), req_to_token=world_dev[0], full_to_state=world_dev[1],
                swa_page_size=256, ring_size=8, num_q_tokens=15)


def _online_kwargs(world_dev) -> dict[str, Any]:
    return dict(seq_lens=torch.tensor([9, 6]), extend_lens=torch.tensor([9, 6]),
                req_pool_indices=torch.tensor([1, 2], device=DEV), req_to_token=world_dev[0], num_q_tokens=15)


def _set(name: str, fn: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], None]:
    def mutate(kw: dict[str, Any]) -> None:
        kw[name] = fn(kw)
    return mutate


_COMMON = [
    ("num_q_mismatch", _set("num_q_tokens", lambda k: 14)),
    ("num_q_too_big", _set("num_q_tokens", lambda k: 70000)),
    ("num_q_below_batch", _set("num_q_tokens", lambda k: 1)),
    ("num_q_negative", _set("num_q_tokens", lambda k: -1)),
    ("num_q_float", _set("num_q_tokens", lambda k: 15.0)),
    ("extend_gt_seq", _set("extend_lens", lambda k: torch.tensor([10, 5]))),
    ("extend_zero", _set("extend_lens", lambda k: torch.tensor([0, 15]))),
    ("extend_float", _set("extend_lens", lambda k: k["extend_lens"].float())),
    ("extend_int32", _set("extend_lens", lambda k: k["extend_lens"].int())),
    ("extend_2d", _set("extend_lens", lambda k: k["extend_lens"][None])),
    ("extend_short", _set("extend_lens", lambda k: k["extend_lens"][:1])),
    ("extend_on_gpu", _set("extend_lens", lambda k: k["extend_lens"].to(DEV))),
    ("seq_noncontig", _set("seq_lens", lambda k: torch.tensor([9, 0, 6, 0])[::2])),
    ("seq_past_table", _set("seq_lens", lambda k: torch.tensor([9, 10**6]))),
    ("seq_list", _set("seq_lens", lambda k: [9, 6])),
    ("graph_flag_int", _set("use_cuda_graph", lambda k: 1)),
    ("rids_int32", _set("req_pool_indices", lambda k: k["req_pool_indices"].int())),
    ("rids_2d", _set("req_pool_indices", lambda k: k["req_pool_indices"][None])),
    ("rids_noncontig", _set("req_pool_indices", lambda k: torch.tensor([1, 0, 2, 0], device=DEV)[::2])),
    ("r2t_int64", _set("req_to_token", lambda k: k["req_to_token"].long())),
    ("r2t_noncontig", _set("req_to_token", lambda k: k["req_to_token"].t())),
    ("r2t_on_cpu", _set("req_to_token", lambda k: k["req_to_token"].cpu())),
]
_REGULAR = [
    ("ratio_8", _set("compress_ratio", lambda k: 8)),
    ("ratio_float", _set("compress_ratio", lambda k: 4.0)),
    ("ring_not_multiple", _set("ring_size", lambda k: 6)),
    ("ring_zero", _set("ring_size", lambda k: 0)),
    ("ring_huge", _set("ring_size", lambda k: 2**33)),
    ("swa_not_multiple", _set("swa_page_size", lambda k: 100)),
    ("swa_zero", _set("swa_page_size", lambda k: 0)),
    ("req_ring_flag_int", _set("use_req_ring", lambda k: 1)),
    ("req_ring_c128", lambda k: k.update(compress_ratio=128, ring_size=128, use_req_ring=True)),
    ("f2s_2d", _set("full_to_state", lambda k: k["full_to_state"][None])),
    ("f2s_int32", _set("full_to_state", lambda k: k["full_to_state"].int())),
    ("f2s_noncontig", _set("full_to_state", lambda k: k["full_to_state"].repeat_interleave(2)[::2])),
]
_ONLINE = [
    ("offset_negative", _set("state_slot_offset", lambda k: -1)),
    ("offset_overflows_i32", _set("state_slot_offset", lambda k: 2**31 - 2)),
    ("offset_bool", _set("state_slot_offset", lambda k: True)),
]
BAD = [("generate", n, m) for n, m in _COMMON + _REGULAR] + [("generate_online", n, m) for n, m in _COMMON + _ONLINE]


def _outcome(fn: Callable, kw: dict[str, Any]) -> tuple[type, str] | None:
    try:
        fn(**kw)
    except (TypeError, ValueError, RuntimeError) as e:
        return type(e), str(e)
    return None


@pytest.mark.parametrize("case", BAD, ids=[f"{c[0]}-{c[1]}" for c in BAD])
def test_a_bad_call_raises_the_full_paths_error_and_spoils_nothing(world, world_dev, case) -> None:
    op, _, mutate = case
    fn = getattr(CompressorPrefillPlan, op)
    make = _regular_kwargs if op == "generate" else _online_kwargs
    valid = make(world_dev)
    bad = dict(valid)
    mutate(bad)
    cold = _outcome(fn, bad)  # nothing learnt: the full path
    if cold is None:  # a case the full path accepts (e.g. bool offset): must give the same plan
        pytest.skip("accepted by the full path")
    assert _outcome(fn, valid) is None  # learns the key
    assert P.HOST_PREFILL.get(4 if op == "generate" else "online") is not None
    in_flight = fn(**valid)  # rows whose copies may still run while the bad call is made
    want = [t.clone() for t in fn(**valid)[1:]]
    assert _outcome(fn, bad) == cold
    torch.cuda.synchronize()
    for got, exp in zip(in_flight[1:], want):
        assert torch.equal(got, exp), "a rejected call disturbed a plan in flight"


# cases whose message the export writes itself, word for word the full path's
_SAME_MESSAGE = {"num_q_mismatch", "num_q_too_big", "num_q_below_batch", "num_q_negative", "extend_gt_seq",
                 "extend_zero", "seq_past_table", "ring_not_multiple", "ring_zero", "ring_huge", "swa_not_multiple",
                 "swa_zero", "extend_short"}


@pytest.mark.parametrize("case", [c for c in BAD if c[1] in _SAME_MESSAGE], ids=lambda c: f"{c[0]}-{c[1]}")
def test_the_exports_own_checks_say_what_the_full_path_says(world, world_dev, case) -> None:
    op, _, mutate = case
    make = _regular_kwargs if op == "generate" else _online_kwargs
    bad = make(world_dev)
    mutate(bad)
    cold = _outcome(getattr(CompressorPrefillPlan, op), bad)
    assert cold is not None
    from flashcompress.cuda_ops import plans as cp

    if op == "generate":
        fn = cp._module(4, False).prefill_host
        args = (bad["seq_lens"], bad["extend_lens"], bad["req_pool_indices"], bad["req_to_token"],
                bad["full_to_state"], bad["swa_page_size"], bad["ring_size"], False, bad["num_q_tokens"], False)
    else:
        fn = cp._module(128, True).prefill_host
        args = (bad["seq_lens"], bad["extend_lens"], bad["req_pool_indices"], bad["req_to_token"],
                bad["num_q_tokens"], False, 0)
    with pytest.raises(cold[0]) as info:
        fn(*args)
    assert str(info.value) == cold[1]


# ----------------------------------------------------------------------------- the pinned ring

@pytest.mark.parametrize("graph", [False, True], ids=["exact", "graph_padded"])
def test_back_to_back_calls_reuse_the_ring_safely(world, world_dev, graph) -> None:
    """96 calls (12 rounds of the 8-slot ring), sizes growing and shrinking (slots reallocated while
    earlier copies may be in flight), one sync at the end, then every plan against the reference."""
    modes = [(4, 8, False), (128, 128, False), "online"]
    for m in modes:
        if m == "online":
            _learn_online(world, world_dev)
        else:
            _learn_regular(m, world, world_dev)
    rng = random.Random(99 + graph)
    made = []
    torch.cuda._sleep(50_000_000)  # keep the stream busy so that the copies queue behind it
    for i in range(96):
        m = modes[i % 3]
        rids, seq, ext = random_batch(rng, world, rng.randint(1, 12), [4, 4000, 40, 2500, 700][i % 5])
        num_q = int(ext.sum())
        if m == "online":
            plan = CompressorPrefillPlan.generate_online(seq, ext, rids.to(DEV), world_dev[0], num_q, graph, 3)
            want = tp.online_prefill_plan(seq, ext, rids, num_q, graph, 3)
        else:
            plan = _regular(m, rids, seq, ext, world_dev, num_q, graph)
            want = tp.prefill_plan(m[0], rids, seq, ext, world.req_to_token, world.full_to_state, 256, m[1], num_q,
                                   graph, m[2])
        seq.fill_(-7)  # the caller may reuse its host lengths at once: the plan must not depend on them
        ext.fill_(-7)
        made.append((plan, want))
    torch.cuda.synchronize()
    for i, (plan, (want_c, want_w)) in enumerate(made):
        assert_plan_bytes(plan[1], want_c, f"call {i} plan_c")
        assert_plan_bytes(plan[2], want_w, f"call {i} plan_w")


def test_runs_on_the_current_stream(world, world_dev) -> None:
    mode = (4, 16, False)
    _learn_regular(mode, world, world_dev)
    rids, seq, ext = random_batch(random.Random(3), world, 8, 900)
    num_q = int(ext.sum())
    want_c, want_w = tp.prefill_plan(4, rids, seq, ext, world.req_to_token, world.full_to_state, 256, 16, num_q,
                                     False, False)
    rids = rids.to(DEV)  # before the side stream: a pageable H2D copy there would wait for the sleep
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)  # the plan's work queues behind this on the side stream only
        plan = _regular(mode, rids, seq, ext, world_dev, num_q, False)
        assert not side.query()
    side.synchronize()
    assert_plan_bytes(plan[1], want_c, "plan_c")
    assert_plan_bytes(plan[2], want_w, "plan_w")


def test_the_export_refuses_a_capturing_stream(world, world_dev) -> None:
    """A captured H2D copy would read its ring slot at every replay: the export raises before it
    writes anything, and the capture itself stays usable."""
    mode = (4, 8, False)
    _learn_regular(mode, world, world_dev)
    fn = P.HOST_PREFILL[4]
    rids, seq, ext = random_batch(random.Random(6), world, 3, 50)
    rids = rids.to(DEV)
    num_q = int(ext.sum())
    side = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    x = torch.zeros(4, device=DEV)
    with torch.cuda.graph(graph, stream=side):
        with pytest.raises(ValueError, match="^stream: expected a stream that is not being captured"):
            fn(seq, ext, rids, *world_dev, 256, 8, False, num_q, False)
        x.add_(1)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(x.cpu(), torch.ones(4))


def test_device_lengths_and_empty_batches_take_the_full_path(world, world_dev) -> None:
    from flashcompress.cuda_ops import plans as cp

    mode = (4, 8, False)
    _learn_regular(mode, world, world_dev)
    rids, seq, ext = random_batch(random.Random(4), world, 5, 300)
    num_q = int(ext.sum())
    plan = _regular(mode, rids, seq.to(DEV), ext.to(DEV), world_dev, num_q, False)
    want = cp.prefill_plan_device(4, rids.to(DEV), seq.to(DEV), ext.to(DEV), *world_dev, 256, 8, num_q)
    assert_plan_bytes(plan[1], want[0], "device plan_c")
    assert_plan_bytes(plan[2], want[1], "device plan_w")
    empty = torch.empty(0, dtype=torch.int64)
    plan = _regular(mode, empty, empty, empty, world_dev, 0, False)
    assert plan[1].shape == (0, 16) and plan[2].shape == (0, 8) and plan[1].is_cuda
    _learn_online(world, world_dev)
    plan = CompressorPrefillPlan.generate_online(empty, empty, empty.to(DEV), world_dev[0], 0)
    assert plan[1].shape == (0, 16) and plan[2].shape == (0, 16)


def test_debug_mode_takes_the_full_path(world, world_dev, monkeypatch: pytest.MonkeyPatch) -> None:
    """With FLASHCOMPRESS_DEBUG=1 the learnt export is not used: the device value checks run
    (a repeated request slot is caught only there for a device world)."""
    from flashcompress.jit import settings

    _learn_regular((4, 8, False), world, world_dev)
    learnt = dict(P.HOST_PREFILL)
    kw = _regular_kwargs(world_dev)
    kw["req_pool_indices"] = torch.tensor([2, 2], device=DEV)
    assert _outcome(CompressorPrefillPlan.generate, kw) is None  # not a checked case without debug
    monkeypatch.setenv("FLASHCOMPRESS_DEBUG", "1")
    settings.forget_settings()
    try:
        P.HOST_PREFILL.update(learnt)
        with pytest.raises(ValueError, match="^req_pool_indices: expected distinct request slots"):
            CompressorPrefillPlan.generate(**kw)
    finally:
        monkeypatch.delenv("FLASHCOMPRESS_DEBUG")
        settings.forget_settings()
