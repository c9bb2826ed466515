"""The native host planner (``plan_host`` family): byte equality with the PyTorch stage 0, its
checks, the fallback, and the host-only build (no CUDA needed).

Everything here runs on the CPU: the family compiles with the host C++ compiler alone.
"""

from __future__ import annotations

import os
import random
import warnings
from pathlib import Path

import pytest
import torch

from _golden import load_golden
from _plan_cases import MODES, assert_plan_bytes, make_world, mode_id, random_batch
from flashcompress import CompressorPrefillPlan
from flashcompress.cuda_ops import plan_host
from flashcompress.cuda_ops.plan_host import HostPlannerFallbackWarning, native_planner
from flashcompress.layouts import INVALID_COMPRESS_ROW, INVALID_WRITE_ROW, PLAN_ROW_BYTES, WRITE_ROW_BYTES
from flashcompress.torch_backend import plans as tp
from flashcompress.torch_backend.rows import pad_rows

VARIANTS = [(4, False), (128, False), (128, True)]


@pytest.fixture()
def native(jit_env: dict[str, str]) -> None:
    """The shared session cache, and any fallback is a test failure."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", HostPlannerFallbackWarning)
        yield


def reference_stage0(ratio: int, online: bool, seq: torch.Tensor, ext: torch.Tensor, page: int, ring: int,
                     req_ring: bool, pad_to: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The PyTorch stage 0, padded with sentinels to ``pad_to`` rows when given."""
    if online:
        plan_c, plan_w = tp.online_prefill_stage0(seq, ext)
        sentinel_w = INVALID_COMPRESS_ROW
    else:
        plan_c, plan_w = tp.prefill_stage0(ratio, seq, ext, page, ring, req_ring)
        sentinel_w = INVALID_WRITE_ROW
    if pad_to is not None:
        plan_c, plan_w = pad_rows(plan_c, pad_to, INVALID_COMPRESS_ROW), pad_rows(plan_w, pad_to, sentinel_w)
    return plan_c, plan_w


def native_stage0(ratio: int, online: bool, seq: torch.Tensor, ext: torch.Tensor, page: int, ring: int,
                  req_ring: bool, pad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    n = int(ext.sum())
    if online:
        return plan_host.online_prefill_stage0(seq, ext, n, pad=pad)
    return plan_host.prefill_stage0(ratio, seq, ext, page, ring, req_ring, n, pad=pad)


def assert_same_stage0(ratio: int, online: bool, seq: torch.Tensor, ext: torch.Tensor, page: int, ring: int,
                       req_ring: bool, pad: bool, what: str) -> None:
    got = native_stage0(ratio, online, seq, ext, page, ring, req_ring, pad)
    want = reference_stage0(ratio, online, seq, ext, page, ring, req_ring, int(ext.sum()) if pad else None)
    assert_plan_bytes(got[0], want[0], f"{what} plan_c")
    assert_plan_bytes(got[1], want[1], f"{what} plan_w", "compress" if online else "write")


# ----------------------------------------------------------------------------- byte equality


@pytest.mark.parametrize("mode", MODES, ids=mode_id)
def test_random_batches_match_pytorch(native: None, mode: tuple[int, int, bool]) -> None:
    """Property style: many random batches (fresh prompts, chunks at interesting prefixes, random
    chunks; exact counts and graph padding) give the PyTorch stage-0 bytes."""
    ratio, ring, req_ring = mode
    world = make_world(seed=ratio + ring)
    rng = random.Random(mode_id(mode))
    for case in range(150):
        _, seq, ext = random_batch(rng, world, rng.randint(1, 8), rng.choice([1, 5, 130, 700]))
        page = 256
        if ratio == 4 and not req_ring and rng.random() < 0.3:
            page = ring * rng.choice([1, 2, 3, 32])  # small SWA pages: many page tails
        assert_same_stage0(ratio, False, seq, ext, page, ring, req_ring, rng.random() < 0.3,
                           f"{mode_id(mode)} case {case} page {page} seq {seq.tolist()} ext {ext.tolist()}")


def test_online_random_batches_match_pytorch(native: None) -> None:
    world = make_world(seed=7)
    rng = random.Random(7)
    for case in range(300):
        _, seq, ext = random_batch(rng, world, rng.randint(1, 8), rng.choice([1, 5, 127, 128, 129, 700]))
        assert_same_stage0(128, True, seq, ext, 256, 1, True, rng.random() < 0.3,
                           f"online case {case} seq {seq.tolist()} ext {ext.tolist()}")


@pytest.mark.parametrize("ratio,online", VARIANTS)
def test_edge_batches_match_pytorch(native: None, ratio: int, online: bool) -> None:
    """Page sizes below 4 (every position is a page tail), one-token extends, the largest token
    count (ragged ids up to 65535) and the largest batch (batch ids up to 65535)."""
    cases = [
        ([1], [1], 1), ([4], [4], 2), ([9], [1], 3), ([129], [2], 4), ([128, 256], [128, 1], 8),
        ([65536], [65536], 256), ([3] * 65536, [1] * 65536, 256),
    ]
    for seq, ext, page in cases:
        seq_t, ext_t = torch.tensor(seq), torch.tensor(ext)
        for ring, req_ring in ((8, False), (16, True)) if ratio == 4 else ((128, False),):
            for p in (page, 1, 2, 3) if ratio == 4 and not req_ring and len(seq) < 10 else (page,):
                assert_same_stage0(ratio, online, seq_t, ext_t, p, ring, req_ring, False,
                                   f"r{ratio} online={online} ring {ring} page {p} batch {len(seq)}")


@pytest.mark.parametrize("ratio,online", VARIANTS)
def test_padded_bucket_larger_than_the_tokens(native: None, ratio: int, online: bool) -> None:
    """``num_tokens`` above ``sum(extend_lens)`` (a CUDA-graph token bucket): exact counts without
    ``pad``, sentinel rows up to the bucket with it — the PyTorch ``prefill_plan`` semantics."""
    seq, ext = torch.tensor([300, 9, 1000]), torch.tensor([300, 9, 131])
    ring = 8 if ratio == 4 else 128
    for pad in (False, True):
        if online:
            got = plan_host.online_prefill_stage0(seq, ext, 1024, pad=pad)
        else:
            got = plan_host.prefill_stage0(ratio, seq, ext, 256, ring, False, 1024, pad=pad)
        want = reference_stage0(ratio, online, seq, ext, 256, ring, False, 1024 if pad else None)
        assert_plan_bytes(got[0], want[0], f"bucket pad={pad} plan_c")
        assert_plan_bytes(got[1], want[1], f"bucket pad={pad} plan_w", "compress" if online else "write")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned host memory needs a CUDA build of torch and a GPU")
def test_pinned_rows_have_the_same_bytes(native: None) -> None:
    """The pinned-memory request only changes where the rows live."""
    seq, ext = torch.tensor([300, 9]), torch.tensor([300, 9])
    plan_c, plan_w = plan_host.prefill_stage0(4, seq, ext, 256, 8, False, 309, pin_memory=True)
    assert plan_c.is_pinned() and plan_w.is_pinned()
    want = tp.prefill_stage0(4, seq, ext, 256, 8, False)
    assert_plan_bytes(plan_c, want[0], "pinned plan_c")
    assert_plan_bytes(plan_w, want[1], "pinned plan_w", "write")


PLAN_FILES = ["plans/plan_c4.pt", "plans/plan_c128.pt", "plans/plan_c128_online.pt"]


@pytest.mark.parametrize("path", PLAN_FILES)
def test_golden_prefill_plans_through_the_native_planner(native: None, path: str) -> None:
    """The golden prefill calls (host lengths) through ``generate`` with the native stage 0 loaded."""
    from test_golden_plans_compress import assert_plan_equal, build_plan

    d = load_golden(path)
    calls = sorted({k.split(".")[0] for k in d if "." in k})
    calls = [c for c in calls if d[f"{c}.api"].startswith("CompressorPrefill")]
    assert calls, f"{path} has no prefill calls"
    for call in calls:
        assert d[f"{call}.seq_lens"].is_cpu
        plan = build_plan(d, call)
        assert_plan_equal(plan[1], d[f"{call}.plan_c"], f"{path}:{call}.plan_c")
        assert_plan_equal(plan[2], d[f"{call}.plan_w"], f"{path}:{call}.plan_w")
    online = "online" in path
    assert native_planner(128 if online or "c128" in path else 4, online) is not None


# ----------------------------------------------------------------------------- stage 1 (CPU plans)


def _stage1_reference(mode, c0: torch.Tensor, w0: torch.Tensor, rids: torch.Tensor, world, page: int,
                      offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    if mode == "online":
        return tp.online_prefill_stage1(c0, rids, offset), tp.online_prefill_stage1(w0, rids, offset)
    ratio, ring, req_ring = mode
    return tp.prefill_stage1(ratio, c0, w0, rids, world.req_to_token, world.full_to_state, page, ring, req_ring)


@pytest.mark.parametrize("mode", MODES + ["online"], ids=lambda m: m if m == "online" else mode_id(m))
def test_native_stage1_matches_pytorch(native: None, mode) -> None:
    """The native stage 1 over PyTorch stage-0 rows (exact and padded; small SWA pages) gives the
    bytes of the PyTorch stage 1, in place."""
    world = make_world(seed=11)
    rng = random.Random(f"s1{mode}")
    online = mode == "online"
    ratio, ring, req_ring = (128, 1, True) if online else mode
    module = native_planner(ratio, online)
    for case in range(60):
        rids, seq, ext = random_batch(rng, world, rng.randint(1, 8), rng.choice([1, 5, 130, 700]))
        page = 256 if online or req_ring or ratio != 4 or rng.random() < 0.6 else ring * rng.choice([1, 2, 32])
        pad_to = int(ext.sum()) + rng.choice([0, 3]) if rng.random() < 0.4 else None
        c0, w0 = reference_stage0(ratio, online, seq, ext, page, ring, req_ring, pad_to)
        offset = rng.choice([0, 50])
        want_c, want_w = _stage1_reference(mode, c0, w0, rids, world, page, offset)
        got_c, got_w = c0.clone(), w0.clone()
        if online:
            module.prefill_stage1(got_c, got_w, rids, offset)
        else:
            module.prefill_stage1(got_c, got_w, rids, world.req_to_token, world.full_to_state, page, ring, req_ring)
        what = f"{mode} case {case} page {page} pad {pad_to} seq {seq.tolist()} ext {ext.tolist()}"
        assert_plan_bytes(got_c, want_c, f"{what} plan_c")
        assert_plan_bytes(got_w, want_w, f"{what} plan_w", "compress" if online else "write")


@pytest.mark.parametrize("graph", [False, True], ids=["exact", "graph_padded"])
@pytest.mark.parametrize("mode", MODES + ["online"], ids=lambda m: m if m == "online" else mode_id(m))
def test_cpu_generate_is_all_native_and_matches_pytorch(native: None, monkeypatch: pytest.MonkeyPatch, mode,
                                                        graph: bool) -> None:
    """``generate`` / ``generate_online`` with every tensor on the CPU take both stages from the
    native planner (the PyTorch stage 1 is not called) and give the all-PyTorch bytes."""
    def forbidden(*args, **kwargs):
        raise AssertionError("the PyTorch planner ran for an all-CPU plan")

    world = make_world(seed=5)
    rng = random.Random(f"cpu{mode}{graph}")
    for trial in range(10):
        rids, seq, ext = random_batch(rng, world, rng.randint(1, 12), rng.choice([3, 40, 700]))
        num_q = int(ext.sum())
        want_c, want_w = pure_pytorch_plan(mode, rids, seq, ext, world, graph)
        with monkeypatch.context() as m:
            for name in ("prefill_stage1", "online_prefill_stage1", "prefill_plan", "online_prefill_plan"):
                m.setattr(tp, name, forbidden)
            if mode == "online":
                plan = CompressorPrefillPlan.generate_online(seq, ext, rids, world.req_to_token, num_q, graph, 7)
            else:
                ratio, ring, req_ring = mode
                plan = CompressorPrefillPlan.generate(ratio, rids, seq, ext, world.req_to_token, world.full_to_state,
                                                      256, ring, num_q, graph, req_ring)
        assert plan[1].is_cpu and plan[2].is_cpu
        assert_plan_bytes(plan[1], want_c, f"{mode} trial {trial} plan_c")
        assert_plan_bytes(plan[2], want_w, f"{mode} trial {trial} plan_w", "compress" if mode == "online" else "write")


def test_native_stage1_rejects_out_of_range_lookups(native: None) -> None:
    """A stage-0 row or table that points outside its tensor is a named error, not a wild read."""
    world = make_world(seed=2, slots=4, max_ctx=512)
    seq, ext = torch.tensor([300]), torch.tensor([300])
    c0, w0 = tp.prefill_stage0(4, seq, ext, 256, 8, False)
    module = native_planner(4, False)
    with pytest.raises(ValueError, match="a batch index in"):
        module.prefill_stage1(c0.clone(), w0.clone(), torch.empty(0, dtype=torch.int64), world.req_to_token,
                              world.full_to_state, 256, 8, False)
    with pytest.raises(ValueError, match="a request slot in"):
        module.prefill_stage1(c0.clone(), w0.clone(), torch.tensor([9]), world.req_to_token, world.full_to_state,
                              256, 8, False)
    with pytest.raises(ValueError, match="a position in"):
        module.prefill_stage1(c0.clone(), w0.clone(), torch.tensor([1]), world.req_to_token[:, :100].contiguous(),
                              world.full_to_state, 256, 8, False)
    with pytest.raises(ValueError, match="a full loc in"):
        module.prefill_stage1(c0.clone(), w0.clone(), torch.tensor([1]), world.req_to_token, world.full_to_state[:5],
                              256, 8, False)
    online = native_planner(128, True)
    c0, w0 = tp.online_prefill_stage0(seq, ext)
    with pytest.raises(ValueError, match="a batch index in"):
        online.prefill_stage1(c0.clone(), w0.clone(), torch.empty(0, dtype=torch.int64), 0)


def _location_cases():
    """(name, kwargs) of paged-C4 prefills whose state locations break a rule (and one that is fine)."""
    world = make_world(seed=4, slots=6, max_ctx=1024)
    rids, seq, ext = torch.tensor([1, 3, 2]), torch.tensor([300, 520, 9]), torch.tensor([300, 20, 9])
    base = dict(compress_ratio=4, req_pool_indices=rids, seq_lens=seq, extend_lens=ext, swa_page_size=256,
                ring_size=8, num_q_tokens=329)
    r2t, f2s = world.req_to_token, world.full_to_state
    loc = lambda slot, pos: int(r2t[slot, pos])  # noqa: E731
    cases = [("fine", r2t, f2s)]
    for name, slot, pos, value in [("evicted", 3, 505, -1), ("evicted_prefix_read", 3, 497, -1),
                                   ("evicted_first", 1, 0, -1), ("row_past_i32", 2, 4, 2**40),
                                   ("two_bad_first_wins", 1, 7, -1)]:
        bad = f2s.clone()
        bad[loc(slot, pos)] = value
        if name == "two_bad_first_wins":
            bad[loc(3, 510)] = 2**40
        cases.append((name, r2t, bad))
    for name, value in [("full_loc_negative", -5), ("full_loc_past_end", f2s.shape[0] + 3)]:
        bad_r2t = r2t.clone()
        bad_r2t[3, 501] = value
        cases.append((name, bad_r2t, f2s))
    cases.append(("unread_entry_is_ignored", r2t, f2s.clone().index_fill_(0, torch.tensor([loc(3, 400)]), -1)))
    return [(name, dict(base, req_to_token=a, full_to_state=b)) for name, a, b in cases]


def _value_cases():
    """(name, builder, kwargs): the location cases plus broken lengths and slots, for ``generate``
    (paged C4, C128) and ``generate_online``."""
    cases = [(f"c4_{name}", CompressorPrefillPlan.generate, kw) for name, kw in _location_cases()]
    world = make_world(seed=6, slots=8, max_ctx=512)
    base = dict(req_pool_indices=torch.tensor([1, 3, 2]), seq_lens=torch.tensor([300, 500, 9]),
                extend_lens=torch.tensor([300, 20, 9]), req_to_token=world.req_to_token, num_q_tokens=329)
    regular = dict(base, full_to_state=world.full_to_state, swa_page_size=256)
    bad = [
        ("fine", {}),
        ("extend_gt_seq", dict(extend_lens=torch.tensor([300, 501, 9]), num_q_tokens=810)),
        ("extend_zero", dict(extend_lens=torch.tensor([300, 0, 9]), num_q_tokens=309)),
        ("total_mismatch", dict(num_q_tokens=330)),
        ("seq_past_table", dict(seq_lens=torch.tensor([300, 513, 9]))),
        ("repeated_slot", dict(req_pool_indices=torch.tensor([1, 3, 1]))),
        ("padding_rows_share", dict(req_pool_indices=torch.tensor([0, 3, 0, 0, 0, 0]),
                                    seq_lens=torch.tensor([1, 500, 1, 1, 1, 1]),
                                    extend_lens=torch.tensor([1, 20, 1, 1, 1, 1]), num_q_tokens=25)),
        ("padding_and_real_share", dict(req_pool_indices=torch.tensor([0, 3, 0, 0, 0, 0]),
                                        seq_lens=torch.tensor([1, 500, 1, 1, 1, 9]),
                                        extend_lens=torch.tensor([1, 20, 1, 1, 1, 9]), num_q_tokens=33)),
        ("two_repeats_first_row_wins", dict(req_pool_indices=torch.tensor([5, 3, 3, 5]),
                                            seq_lens=torch.tensor([1, 500, 9, 8]),
                                            extend_lens=torch.tensor([1, 20, 9, 8]), num_q_tokens=38)),
    ]
    for name, change in bad:
        cases.append((f"c4_{name}", CompressorPrefillPlan.generate, dict(regular, compress_ratio=4, ring_size=8, **change)))
        cases.append((f"c128_{name}", CompressorPrefillPlan.generate,
                      dict(regular, compress_ratio=128, ring_size=128, **change)))
        cases.append((f"online_{name}", CompressorPrefillPlan.generate_online, dict(base, **change)))
    return cases


VALUE_CASES = _value_cases()


@pytest.mark.parametrize("name,builder,kwargs", VALUE_CASES, ids=[c[0] for c in VALUE_CASES])
def test_native_value_checks_raise_the_python_message(native: None, monkeypatch: pytest.MonkeyPatch, name: str,
                                                      builder, kwargs: dict) -> None:
    """The native value checks of an all-CPU prefill (``check_prefill_values``) raise exactly the
    message of the PyTorch checks (``validation``), or nothing for both."""
    import flashcompress.plans as plans_mod

    def outcome(native_check: bool) -> str | None:
        with monkeypatch.context() as m:
            if not native_check:
                m.setattr(plans_mod, "_native_checks", lambda *a: None)
            try:
                builder(**kwargs)
            except ValueError as exc:
                return f"{type(exc).__name__}: {exc}"
        return None

    want = outcome(False)
    assert outcome(True) == want
    fine = name.endswith(("fine", "unread_entry_is_ignored", "padding_rows_share"))
    assert (want is None) == fine, want


# ----------------------------------------------------------------------------- binding checks


def _buffers(n: int, online: bool) -> tuple[torch.Tensor, torch.Tensor]:
    plan_c = torch.full((n, PLAN_ROW_BYTES), 0xAB, dtype=torch.uint8)
    plan_w = torch.full((n, PLAN_ROW_BYTES if online else WRITE_ROW_BYTES), 0xAB, dtype=torch.uint8)
    return plan_c, plan_w


BAD_CALLS = [  # (name, seq, ext, rows, exception, message)
    ("extend_gt_seq", [10, 5], [10, 6], 16, ValueError, "extend_lens: expected 0 < extend_lens[i] <= seq_lens[i]"),
    ("extend_zero", [10, 5], [10, 0], 10, ValueError, "extend_lens[1] = 0, seq_lens[1] = 5"),
    ("rows_below_sum", [10, 5], [10, 5], 14, ValueError, "num_q_tokens: expected >= sum(extend_lens) = 15"),
    ("too_many_tokens", [70000], [70000], 70000, ValueError, "num_q_tokens: expected <= 65536"),
    ("float_lengths", [10.0], [10.0], 10, TypeError, "seq_lens: expected dtype int64"),
    ("length_mismatch", [10, 5], [15], 15, ValueError, "extend_lens: expected shape [2]"),
]


@pytest.mark.parametrize("ratio,online", VARIANTS)
@pytest.mark.parametrize("name,seq,ext,rows,exc,message", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_binding_rejects_bad_lengths_before_writing(native: None, ratio: int, online: bool, name: str, seq: list,
                                                    ext: list, rows: int, exc: type, message: str) -> None:
    module = native_planner(ratio, online)
    dtype = torch.float32 if name == "float_lengths" else torch.int64
    seq_t, ext_t = torch.tensor(seq, dtype=dtype), torch.tensor(ext, dtype=dtype)
    plan_c, plan_w = _buffers(rows, online)
    args = (plan_c, plan_w, seq_t, ext_t) + (() if online else (256, 8 if ratio == 4 else 128, False)) + (True,)
    with pytest.raises(exc, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        module.prefill_stage0(*args)
    assert bool((plan_c == 0xAB).all()) and bool((plan_w == 0xAB).all()), f"{name}: bytes written on a bad call"


def test_binding_checks_buffers_and_scalars(native: None) -> None:
    module = native_planner(4, False)
    seq, ext = torch.tensor([9]), torch.tensor([9])
    plan_c, plan_w = _buffers(9, False)
    with pytest.raises(ValueError, match=r"plan_w: expected shape \[9, 8\]"):
        module.prefill_stage0(plan_c, plan_w[:8], seq, ext, 256, 8, False, False)
    with pytest.raises(ValueError, match="plan_c: expected a contiguous tensor"):
        module.prefill_stage0(torch.empty((9, 32), dtype=torch.uint8)[:, ::2], plan_w, seq, ext, 256, 8, False, False)
    with pytest.raises(ValueError, match="ring_size: expected a value in"):
        module.prefill_stage0(plan_c, plan_w, seq, ext, 256, 0, False, False)
    with pytest.raises(ValueError, match="swa_page_size: expected a value in"):
        module.prefill_stage0(plan_c, plan_w, seq, ext, 0, 8, False, False)
    want_c, want_w = tp.prefill_stage0(4, seq, ext, 0, 8, True)  # the request ring reads no SWA page size
    num_c, num_w = module.prefill_stage0(plan_c, plan_w, seq, ext, 0, 8, True, False)
    assert_plan_bytes(plan_c[:num_c], want_c, "req-ring plan_c")
    assert_plan_bytes(plan_w[:num_w], want_w, "req-ring plan_w", "write")


def test_api_errors_are_unchanged(native: None) -> None:
    """The API validates host lengths before the planner runs (same named errors as before)."""
    kw = dict(compress_ratio=4, req_pool_indices=torch.tensor([1, 2]), seq_lens=torch.tensor([10, 5]),
              extend_lens=torch.tensor([10, 6]), req_to_token=torch.zeros((4, 64), dtype=torch.int32),
              full_to_state=torch.zeros(64, dtype=torch.int64), swa_page_size=256, ring_size=8, num_q_tokens=16)
    with pytest.raises(ValueError, match="extend_lens: expected 0 < extend_lens"):
        CompressorPrefillPlan.generate(**kw)
    with pytest.raises(ValueError, match="num_q_tokens"):
        CompressorPrefillPlan.generate(**dict(kw, extend_lens=torch.tensor([10, 5]), num_q_tokens=14))


# ----------------------------------------------------------------------------- fallback and build


def _generate_c4() -> CompressorPrefillPlan:
    world = make_world(seed=3, slots=8, max_ctx=1024)
    return CompressorPrefillPlan.generate(4, torch.tensor([1, 2]), torch.tensor([300, 520]), torch.tensor([300, 20]),
                                          world.req_to_token, world.full_to_state, 256, 8, 320)


def test_fallback_without_compiler_is_said_and_gives_the_same_bytes(private_env: dict[str, str],
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    from _jit_helpers import reset_engine

    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    reset_engine()
    with pytest.warns(HostPlannerFallbackWarning, match=r"plan_host\(ratio=4, online=False\).*ToolchainMissing"):
        plan = _generate_c4()
    assert native_planner(4, False) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", HostPlannerFallbackWarning)  # said once per variant, not per call
        again = _generate_c4()
        # the value checks fall back to PyTorch with the same messages
        world = make_world(seed=3, slots=8, max_ctx=1024)
        with pytest.raises(ValueError, match=r"extend_lens: expected 0 < extend_lens\[i\] <= seq_lens\[i\]"):
            CompressorPrefillPlan.generate(4, torch.tensor([1, 2]), torch.tensor([300, 20]), torch.tensor([300, 21]),
                                           world.req_to_token, world.full_to_state, 256, 8, 321)
        bad_f2s = world.full_to_state.clone()
        bad_f2s[int(world.req_to_token[2, 519])] = -1
        with pytest.raises(ValueError, match=r"full_to_state: expected an SWA loc >= 0"):
            CompressorPrefillPlan.generate(4, torch.tensor([1, 2]), torch.tensor([300, 520]), torch.tensor([300, 20]),
                                           world.req_to_token, bad_f2s, 256, 8, 320)
    monkeypatch.setenv("FLASHCOMPRESS_BACKEND", "torch")
    reset_engine()
    with warnings.catch_warnings():
        warnings.simplefilter("error", HostPlannerFallbackWarning)  # chosen explicitly: no warning
        reference = _generate_c4()
    for got in (plan, again):
        assert_plan_bytes(got[1], reference[1], "fallback plan_c")
        assert_plan_bytes(got[2], reference[2], "fallback plan_w", "write")


def test_backend_torch_selects_the_pytorch_stage0(private_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from _jit_helpers import reset_engine
    from flashcompress.jit import build

    monkeypatch.setenv("FLASHCOMPRESS_BACKEND", "torch")
    reset_engine()
    builds = build.build_counter()
    assert native_planner(128, True) is None
    assert build.build_counter() == builds


def test_host_only_build_needs_no_cuda(private_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                       tmp_path: Path) -> None:
    """With no CUDA toolkit at all the family still builds, with the host compiler and tvm-ffi only."""
    from _jit_helpers import reset_engine
    from flashcompress.jit import acquire, make_key

    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    monkeypatch.setenv("PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if "cuda" not in p))
    reset_engine()
    key = make_key("plan_host", "cuda:9.0a", ratio=128, online=True)  # a GPU target is ignored
    assert key.target.startswith("host:") and key.backend == "host"
    result = acquire(key)
    assert result.status == "built"
    script = (result.path / "build.sh").read_text()
    assert "nvcc" not in script and "cudart" not in script and "FC_HOST_ONLY" in script
    with warnings.catch_warnings():
        warnings.simplefilter("error", HostPlannerFallbackWarning)
        assert_same_stage0(128, True, torch.tensor([200, 300]), torch.tensor([200, 100]), 256, 1, True, True,
                           "built without CUDA")


def test_prewarm_selects_the_host_planner_once() -> None:
    from flashcompress.jit.prewarm import variant_set

    keys = [k for k in variant_set(models=["deepseek-v4-flash"], archs=["9.0a", "10.0a"]) if k.family == "plan_host"]
    assert sorted((k.param_dict["ratio"], k.param_dict["online"]) for k in keys) == sorted(VARIANTS)
    assert all(k.target.startswith("host:") for k in keys)


def test_host_only_family_rejects_gpu_sources() -> None:
    from flashcompress.jit.family import Family

    with pytest.raises(ValueError, match="host-only"):
        Family("bad_host", sources=(("x.cu.j2", "kernel.cu"), ("y.cpp.j2", "binding.cpp")), host_only=True)


# ----------------------------------------------------------------------------- GPU (pytest -m gpu)


def pure_pytorch_plan(mode: tuple[int, int, bool] | str, rids: torch.Tensor, seq: torch.Tensor, ext: torch.Tensor,
                      world, graph: bool, offset: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    """The final plan with the PyTorch stage 0 and stage 1 on CPU copies (no native code involved)."""
    num_q = int(ext.sum())
    if mode == "online":
        c0, w0 = reference_stage0(128, True, seq, ext, 256, 1, True, num_q if graph else None)
        return tp.online_prefill_stage1(c0, rids, offset), tp.online_prefill_stage1(w0, rids, offset)
    ratio, ring, req_ring = mode
    c0, w0 = reference_stage0(ratio, False, seq, ext, 256, ring, req_ring, num_q if graph else None)
    return tp.prefill_stage1(ratio, c0, w0, rids, world.req_to_token, world.full_to_state, 256, ring, req_ring)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("graph", [False, True], ids=["exact", "graph_padded"])
@pytest.mark.parametrize("mode", MODES + ["online"], ids=lambda m: m if m == "online" else mode_id(m))
def test_gpu_generate_with_host_lengths(native: None, monkeypatch: pytest.MonkeyPatch, mode, graph: bool) -> None:
    """``generate`` / ``generate_online`` with CPU lengths and GPU tables: native stage 0 into pinned
    host memory, async copy, stage-1 kernel; the bytes of the all-PyTorch planner."""
    pinned: list[bool] = []
    host_rows = plan_host._host_rows

    def recording(rows: int, row_bytes: int, pin_memory: bool) -> torch.Tensor:
        out = host_rows(rows, row_bytes, pin_memory)
        pinned.append(out.is_pinned())
        return out

    monkeypatch.setattr(plan_host, "_host_rows", recording)
    world = make_world(seed=5)
    r2t, f2s = world.to("cuda")
    rng = random.Random(f"{mode}{graph}")
    for trial in range(8):
        rids, seq, ext = random_batch(rng, world, rng.randint(1, 12), rng.choice([3, 40, 700]))
        num_q = int(ext.sum())
        if mode == "online":
            plan = CompressorPrefillPlan.generate_online(seq, ext, rids.cuda(), r2t, num_q, graph, 7)
        else:
            ratio, ring, req_ring = mode
            plan = CompressorPrefillPlan.generate(ratio, rids.cuda(), seq, ext, r2t, f2s, 256, ring, num_q, graph,
                                                  req_ring)
        want_c, want_w = pure_pytorch_plan(mode, rids, seq, ext, world, graph)
        assert plan[1].is_cuda and plan[2].is_cuda
        assert_plan_bytes(plan[1], want_c, f"{mode} trial {trial} plan_c")
        assert_plan_bytes(plan[2], want_w, f"{mode} trial {trial} plan_w", "compress" if mode == "online" else "write")
    assert pinned and all(pinned), "stage-0 rows must be written into pinned host memory"


def test_a_complex_tensor_is_named_not_fatal(native: None) -> None:
    """A binding check that fails on a complex tensor names its dtype (``ffi_check.h`` builds the
    message without tvm-ffi's dtype names, which throw on complex: inside a failing check that
    second exception would abort the process).  Run in a child process so an abort fails here."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from flashcompress.cuda_ops.plan_host import native_planner\n"
        "m = native_planner(4, False)\n"
        "assert m is not None\n"
        "rows = lambda w: torch.zeros(4, w, dtype=torch.uint8)\n"
        "lens = torch.ones(1, dtype=torch.complex64)\n"
        "try:\n"
        "    m.prefill_plan(rows(PLAN), rows(WRITE), lens, lens, lens, lens, lens, 4, 8, False, False)\n"
        "except TypeError as e:\n"
        "    print('TypeError:', e)\n"
    ).replace("PLAN", str(PLAN_ROW_BYTES)).replace("WRITE", str(WRITE_ROW_BYTES))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=os.environ)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "TypeError:" in res.stdout and "complex64" in res.stdout, res.stdout + res.stderr[-2000:]


def test_host_world_never_takes_the_one_call_gpu_planner(native: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """``plans.HOST_PREFILL`` (the ``plan`` family's ``prefill_host``, GPU world only) is not called
    for an all-CPU plan even when an entry is learnt; the bytes stay the native host planner's."""
    from flashcompress import plans as P

    def refuse(*args: object) -> None:
        raise AssertionError("prefill_host called for a CPU world")

    monkeypatch.setitem(P.HOST_PREFILL, 4, refuse)
    monkeypatch.setitem(P.HOST_PREFILL, "online", refuse)
    monkeypatch.setattr(P, "_host_prefill_ready", lambda: True)
    world = make_world(seed=5)
    rids, seq, ext = random_batch(random.Random(2), world, 5, 300)
    num_q = int(ext.sum())
    for graph in (False, True):
        plan = CompressorPrefillPlan.generate(4, rids, seq, ext, world.req_to_token, world.full_to_state, 256, 8,
                                              num_q, graph)
        want_c, want_w = tp.prefill_plan(4, rids, seq, ext, world.req_to_token, world.full_to_state, 256, 8, num_q,
                                         graph, False)
        assert_plan_bytes(plan[1], want_c, "plan_c")
        assert_plan_bytes(plan[2], want_w, "plan_w", "write")
        plan = CompressorPrefillPlan.generate_online(seq, ext, rids, world.req_to_token, num_q, graph, 2)
        want_c, want_w = tp.online_prefill_plan(seq, ext, rids, num_q, graph, 2)
        assert_plan_bytes(plan[1], want_c, "online plan_c")
        assert_plan_bytes(plan[2], want_w, "online plan_w")
    assert P.HOST_PREFILL[4] is refuse  # nothing learnt from a CPU world


def test_the_rows_of_an_export_result_are_read_by_index() -> None:
    """``plans._rows`` unpacks a tvm-ffi Array of two tensors (the ``prefill_host`` result) into torch
    tensors; it also takes any indexable pair."""
    import tvm_ffi

    from flashcompress import plans as P

    a, b = torch.zeros(3, 16, dtype=torch.uint8), torch.ones(2, 8, dtype=torch.uint8)
    got = P._rows(tvm_ffi.get_global_func("ffi.Array")(a, b))
    assert all(isinstance(t, torch.Tensor) for t in got)
    assert torch.equal(got[0], a) and torch.equal(got[1], b)
    assert got[0].data_ptr() == a.data_ptr()
    monkey = P._array_item
    try:
        P._array_item = None
        assert P._rows([a, b]) == (a, b)
    finally:
        P._array_item = monkey
