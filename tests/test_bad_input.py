"""The bad-input catalogue: every public function rejects bad arguments before writing.

Each case starts from a valid call, breaks one argument, and asserts
  * the exception type (TypeError for wrong kinds/dtypes, ValueError otherwise),
  * that the message names the argument,
  * that every buffer the call could write (state pool, out, kvcache) is untouched.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from flashcompress import (
    CompressorDecodePlan,
    CompressorPrefillPlan,
    compress_forward,
    compress_norm_rope_store,
    is_overlap_compress,
)
from flashcompress.layouts import MAIN_V4

H = 128  # C4 indexer head dim keeps the tensors small


def world() -> dict[str, Any]:
    req_to_token = torch.arange(4 * 512, dtype=torch.int32).reshape(4, 512)
    full_to_state = torch.arange(4 * 512 + 256 + 1, dtype=torch.int64)
    full_to_state[-1] = -1
    return {
        "req_pool_indices": torch.tensor([1, 2]),
        "req_to_token": req_to_token,
        "full_to_state": full_to_state,
    }


def decode_kwargs() -> dict[str, Any]:
    w = world()
    return dict(compress_ratio=4, req_pool_indices=w["req_pool_indices"], req_to_token=w["req_to_token"],
                full_to_state=w["full_to_state"], seq_lens=torch.tensor([8, 5]), swa_page_size=256, ring_size=8)


def prefill_kwargs() -> dict[str, Any]:
    w = world()
    return dict(compress_ratio=4, req_pool_indices=w["req_pool_indices"], seq_lens=torch.tensor([9, 6]),
                extend_lens=torch.tensor([9, 6]), req_to_token=w["req_to_token"], full_to_state=w["full_to_state"],
                swa_page_size=256, ring_size=8, num_q_tokens=15)


def compress_kwargs() -> dict[str, Any]:
    torch.manual_seed(0)
    plan = CompressorPrefillPlan.generate(**prefill_kwargs())
    return dict(kv_score_buffer=torch.randn(2056, 4 * H), kv_score_input=torch.randn(15, 4 * H),
                ape=torch.randn(8, H), plan=plan, head_dim=H, compress_ratio=4, out=torch.zeros(plan[1].shape[0], H))


def online_compress_kwargs() -> dict[str, Any]:
    """Online C128 prefill (200 + 100 tokens: chunk B merges with the slot's state)."""
    torch.manual_seed(2)
    plan = CompressorPrefillPlan.generate_online(torch.tensor([300]), torch.tensor([100]), torch.tensor([1]),
                                                 world()["req_to_token"], 100)
    return dict(kv_score_buffer=torch.randn(4, 3 * 512), kv_score_input=torch.randn(100, 2 * 512),
                ape=torch.randn(128, 512), plan=plan, head_dim=512, compress_ratio=128,
                out=torch.full((plan[1].shape[0], 512), 7.0), is_online=True)


def store_kwargs() -> dict[str, Any]:
    torch.manual_seed(1)
    plan = CompressorDecodePlan.generate(**decode_kwargs())
    angles = torch.arange(64)[:, None] * torch.rand(32)[None, :]
    return dict(kv=torch.randn(2, 512), plan=plan, norm_weight=torch.ones(512), norm_eps=1e-6,
                freq_cis=torch.polar(torch.ones_like(angles), angles), out_loc=torch.tensor([3, 0]),
                kvcache=torch.zeros(2, MAIN_V4.page_bytes(64), dtype=torch.uint8), page_size=64)


def buffers(kwargs: dict[str, Any]) -> list[torch.Tensor]:
    names = ("kv_score_buffer", "out", "kvcache")
    return [kwargs[n] for n in names if isinstance(kwargs.get(n), torch.Tensor) and not kwargs[n].is_meta]


Mutation = Callable[[dict[str, Any]], None]


def setter(name: str, value_fn: Callable[[dict[str, Any]], Any]) -> Mutation:
    def mutate(kw: dict[str, Any]) -> None:
        kw[name] = value_fn(kw)

    return mutate


def with_entry(name: str, index: int, value: int) -> Mutation:
    """``kw[name]`` with one element replaced (a copy: the world's tensors are shared by nothing else)."""
    def mutate(kw: dict[str, Any]) -> None:
        t = kw[name].clone()
        t[index] = value
        kw[name] = t

    return mutate


def chunk_kwargs() -> dict[str, Any]:
    """Slot 2 resumes at position 6 (4 new tokens): the planner also reads positions 2-5 of its prefix."""
    kw = prefill_kwargs()
    kw.update(seq_lens=torch.tensor([9, 10]), extend_lens=torch.tensor([9, 4]), num_q_tokens=13)
    return kw


def online_decode_kwargs() -> dict[str, Any]:
    return dict(seq_lens=torch.tensor([5, 9]), req_pool_indices=torch.tensor([1, 2]), req_to_token=world()["req_to_token"])


def online_prefill_kwargs() -> dict[str, Any]:
    return dict(seq_lens=torch.tensor([9, 6]), extend_lens=torch.tensor([9, 6]), req_pool_indices=torch.tensor([1, 2]),
                req_to_token=world()["req_to_token"], num_q_tokens=15)


def store_two_events_kwargs() -> dict[str, Any]:
    """Both decode rows close an entry (seq_len 8 and 4): both out_loc entries are stored."""
    kw = store_kwargs()
    kw["plan"] = CompressorDecodePlan.generate(**{**decode_kwargs(), "seq_lens": torch.tensor([8, 4])})
    return kw


def prefill_store_kwargs() -> dict[str, Any]:
    """A prefill store: events at ragged ids 3, 7 (slot 1) and 12 (slot 2) of 15 tokens."""
    kw = store_kwargs()
    kw["plan"] = CompressorPrefillPlan.generate(**prefill_kwargs())
    kw["kv"] = torch.randn(kw["plan"][1].shape[0], 512)
    kw["out_loc"] = torch.arange(15)
    return kw


def grad(name: str) -> Mutation:
    return setter(name, lambda k: k[name].clone().requires_grad_(True))


def meta(name: str) -> Mutation:
    return setter(name, lambda k: k[name].to("meta"))


def pool_rows(rows: int, width: int) -> Callable[[dict[str, Any]], torch.Tensor]:
    """A contiguous ``[rows, width]`` view into the state pool's memory."""
    return lambda k: k["kv_score_buffer"].view(-1)[: rows * width].view(rows, width)


# (id, make kwargs, function, mutation, expected exception, argument named in the message)
CASES: list[tuple[str, Callable[[], dict], Callable, Mutation, type[Exception], str]] = [
    # ---- CompressorDecodePlan.generate
    ("decode_ratio_8", decode_kwargs, CompressorDecodePlan.generate, setter("compress_ratio", lambda k: 8), ValueError, "compress_ratio"),
    ("decode_ratio_str", decode_kwargs, CompressorDecodePlan.generate, setter("compress_ratio", lambda k: "4"), TypeError, "compress_ratio"),
    ("decode_rpi_int32", decode_kwargs, CompressorDecodePlan.generate, setter("req_pool_indices", lambda k: k["req_pool_indices"].int()), TypeError, "req_pool_indices"),
    ("decode_r2t_int64", decode_kwargs, CompressorDecodePlan.generate, setter("req_to_token", lambda k: k["req_to_token"].long()), TypeError, "req_to_token"),
    ("decode_f2s_2d", decode_kwargs, CompressorDecodePlan.generate, setter("full_to_state", lambda k: k["full_to_state"][None]), ValueError, "full_to_state"),
    ("decode_seq_len_count", decode_kwargs, CompressorDecodePlan.generate, setter("seq_lens", lambda k: torch.tensor([8])), ValueError, "seq_lens"),
    ("decode_seq_len_zero", decode_kwargs, CompressorDecodePlan.generate, setter("seq_lens", lambda k: torch.tensor([8, 0])), ValueError, "seq_lens"),
    ("decode_ring_not_multiple", decode_kwargs, CompressorDecodePlan.generate, setter("ring_size", lambda k: 6), ValueError, "ring_size"),
    ("decode_swa_not_multiple", decode_kwargs, CompressorDecodePlan.generate, setter("swa_page_size", lambda k: 100), ValueError, "swa_page_size"),
    ("decode_req_ring_c128", decode_kwargs, CompressorDecodePlan.generate,
     lambda k: k.update(compress_ratio=128, ring_size=128, use_req_ring=True), ValueError, "use_req_ring"),
    ("decode_rid_out_of_table", decode_kwargs, CompressorDecodePlan.generate, setter("req_pool_indices", lambda k: torch.tensor([1, 4])), ValueError, "req_pool_indices"),
    ("decode_seq_past_table", decode_kwargs, CompressorDecodePlan.generate, setter("seq_lens", lambda k: torch.tensor([8, 513])), ValueError, "seq_lens"),
    # ---- CompressorPrefillPlan.generate
    ("prefill_num_q_mismatch", prefill_kwargs, CompressorPrefillPlan.generate, setter("num_q_tokens", lambda k: 14), ValueError, "num_q_tokens"),
    ("prefill_num_q_too_big", prefill_kwargs, CompressorPrefillPlan.generate, setter("num_q_tokens", lambda k: 70000), ValueError, "num_q_tokens"),
    ("prefill_extend_gt_seq", prefill_kwargs, CompressorPrefillPlan.generate, setter("extend_lens", lambda k: torch.tensor([10, 5])), ValueError, "extend_lens"),
    ("prefill_extend_zero", prefill_kwargs, CompressorPrefillPlan.generate,
     lambda k: k.update(extend_lens=torch.tensor([9, 0]), num_q_tokens=9), ValueError, "extend_lens"),
    ("prefill_extend_float", prefill_kwargs, CompressorPrefillPlan.generate, setter("extend_lens", lambda k: k["extend_lens"].float()), TypeError, "extend_lens"),
    ("prefill_graph_flag_int", prefill_kwargs, CompressorPrefillPlan.generate, setter("use_cuda_graph", lambda k: 1), TypeError, "use_cuda_graph"),
    ("prefill_online_offset_negative", lambda: dict(seq_lens=torch.tensor([9]), extend_lens=torch.tensor([9]),
     req_pool_indices=torch.tensor([1]), req_to_token=world()["req_to_token"], num_q_tokens=9),
     CompressorPrefillPlan.generate_online, setter("state_slot_offset", lambda k: -1), ValueError, "state_slot_offset"),
    ("prefill_online_offset_overflows_i32", lambda: dict(seq_lens=torch.tensor([9]), extend_lens=torch.tensor([9]),
     req_pool_indices=torch.tensor([1]), req_to_token=world()["req_to_token"], num_q_tokens=9),
     CompressorPrefillPlan.generate_online, setter("state_slot_offset", lambda k: 2**32 + 7), ValueError, "state_slot_offset"),
    ("decode_online_offset_overflows_i32", lambda: dict(seq_lens=torch.tensor([5]), req_pool_indices=torch.tensor([1]),
     req_to_token=world()["req_to_token"]),
     CompressorDecodePlan.generate_online, setter("state_slot_offset", lambda k: 2**31), ValueError, "state_slot_offset"),
    ("decode_full_loc_past_mapping", decode_kwargs, CompressorDecodePlan.generate,
     setter("full_to_state", lambda k: k["full_to_state"][:600].contiguous()), ValueError, "req_to_token"),
    ("prefill_full_loc_past_mapping", prefill_kwargs, CompressorPrefillPlan.generate,
     setter("full_to_state", lambda k: k["full_to_state"][:600].contiguous()), ValueError, "req_to_token"),
    # ---- compress_forward
    ("cf_ratio_mismatch", compress_kwargs, compress_forward, setter("compress_ratio", lambda k: 128), ValueError, "plan"),
    ("cf_head_dim_256", compress_kwargs, compress_forward, setter("head_dim", lambda k: 256), ValueError, "head_dim"),
    ("cf_online_c4", compress_kwargs, compress_forward, setter("is_online", lambda k: True), ValueError, "is_online"),
    ("cf_plan_tuple", compress_kwargs, compress_forward, setter("plan", lambda k: tuple(k["plan"])), TypeError, "plan"),
    ("cf_buffer_fp16", compress_kwargs, compress_forward, setter("kv_score_buffer", lambda k: k["kv_score_buffer"].half()), TypeError, "kv_score_buffer"),
    ("cf_buffer_width", compress_kwargs, compress_forward, setter("kv_score_buffer", lambda k: torch.zeros(2056, 2 * H)), ValueError, "kv_score_buffer"),
    ("cf_buffer_view", compress_kwargs, compress_forward, setter("kv_score_buffer", lambda k: k["kv_score_buffer"].view(257, 8, 4 * H)), ValueError, "kv_score_buffer"),
    ("cf_buffer_noncontig", compress_kwargs, compress_forward, setter("kv_score_buffer", lambda k: torch.zeros(4 * H, 2056).t()), ValueError, "kv_score_buffer"),
    ("cf_input_width", compress_kwargs, compress_forward, setter("kv_score_input", lambda k: torch.zeros(15, 2 * H)), ValueError, "kv_score_input"),
    ("cf_input_rows_short", compress_kwargs, compress_forward, setter("kv_score_input", lambda k: torch.zeros(3, 4 * H)), ValueError, "kv_score_input"),
    ("cf_ape_shape", compress_kwargs, compress_forward, setter("ape", lambda k: torch.zeros(4, 2 * H)), ValueError, "ape"),
    ("cf_ape_int", compress_kwargs, compress_forward, setter("ape", lambda k: torch.zeros(8, H, dtype=torch.int32)), TypeError, "ape"),
    ("cf_out_rows", compress_kwargs, compress_forward, setter("out", lambda k: torch.zeros(1, H)), ValueError, "out"),
    ("cf_plan_bytes", compress_kwargs, compress_forward,
     setter("plan", lambda k: CompressorPrefillPlan(4, k["plan"][1][:, :8].contiguous(), k["plan"][2])), ValueError, "plan[1]"),
    ("cf_plan_write_loc_outside", compress_kwargs, compress_forward, setter("kv_score_buffer", lambda k: torch.zeros(16, 4 * H)), ValueError, "plan"),
    ("cf_decode_rows_mismatch", compress_kwargs, compress_forward,
     lambda k: k.update(plan=CompressorDecodePlan.generate(**decode_kwargs()), out=torch.zeros(2, H)), ValueError, "kv_score_input"),
    ("cf_online_load_slot_outside", online_compress_kwargs, compress_forward,
     lambda k: k["plan"][1].view(torch.int32)[:, 3].fill_(10**6), ValueError, "plan"),
    # ---- compress_norm_rope_store
    ("st_kv_dim", store_kwargs, compress_norm_rope_store, setter("kv", lambda k: torch.zeros(2, 256)), ValueError, "kv"),
    ("st_kv_rows", store_kwargs, compress_norm_rope_store, setter("kv", lambda k: torch.zeros(3, 512)), ValueError, "kv"),
    ("st_weight_shape", store_kwargs, compress_norm_rope_store, setter("norm_weight", lambda k: torch.ones(128)), ValueError, "norm_weight"),
    ("st_eps_negative", store_kwargs, compress_norm_rope_store, setter("norm_eps", lambda k: -1.0), ValueError, "norm_eps"),
    ("st_freq_real", store_kwargs, compress_norm_rope_store, setter("freq_cis", lambda k: torch.view_as_real(k["freq_cis"])), TypeError, "freq_cis"),
    ("st_freq_short", store_kwargs, compress_norm_rope_store, setter("freq_cis", lambda k: k["freq_cis"][:4]), ValueError, "freq_cis"),
    ("st_out_loc_int32", store_kwargs, compress_norm_rope_store, setter("out_loc", lambda k: k["out_loc"].int()), TypeError, "out_loc"),
    ("st_out_loc_count", store_kwargs, compress_norm_rope_store, setter("out_loc", lambda k: torch.tensor([3])), ValueError, "out_loc"),
    ("st_out_loc_past_cache", store_kwargs, compress_norm_rope_store, setter("out_loc", lambda k: torch.tensor([128, 0])), ValueError, "out_loc"),
    ("st_page_not_pow2", store_kwargs, compress_norm_rope_store, setter("page_size", lambda k: 48), ValueError, "page_size"),
    ("st_cache_page_bytes", store_kwargs, compress_norm_rope_store, setter("page_size", lambda k: 32), ValueError, "kvcache"),
    ("st_cache_dtype", store_kwargs, compress_norm_rope_store, setter("kvcache", lambda k: k["kvcache"].to(torch.int8)), TypeError, "kvcache"),
    ("st_fp4_main", store_kwargs, compress_norm_rope_store, setter("use_fp4", lambda k: True), ValueError, "use_fp4"),
    ("st_plan_kind", store_kwargs, compress_norm_rope_store, setter("plan", lambda k: [4, k["plan"][1]]), TypeError, "plan"),
    ("st_plan_rows_0d", store_kwargs, compress_norm_rope_store,
     setter("plan", lambda k: CompressorDecodePlan(4, torch.tensor(3, dtype=torch.uint8))), ValueError, "plan[1]"),
    # ---- full_to_state values at the positions the plan reads or writes (paged C4)
    # decode slot 1, seq_len 8: positions 7 (write) and 3 (read); full loc = 512 + position
    ("decode_f2s_evicted_write", decode_kwargs, CompressorDecodePlan.generate, with_entry("full_to_state", 519, -1), ValueError, "full_to_state"),
    ("decode_f2s_evicted_read", decode_kwargs, CompressorDecodePlan.generate, with_entry("full_to_state", 515, -1), ValueError, "full_to_state"),
    ("decode_f2s_row_past_i32", decode_kwargs, CompressorDecodePlan.generate, with_entry("full_to_state", 519, 2**40), ValueError, "full_to_state"),
    ("prefill_f2s_evicted", prefill_kwargs, CompressorPrefillPlan.generate, with_entry("full_to_state", 1024 + 3, -1), ValueError, "full_to_state"),
    ("prefill_f2s_evicted_prefix_read", chunk_kwargs, CompressorPrefillPlan.generate, with_entry("full_to_state", 1024 + 2, -1), ValueError, "full_to_state"),
    ("prefill_f2s_row_past_i32", prefill_kwargs, CompressorPrefillPlan.generate, with_entry("full_to_state", 512 + 8, 2**40), ValueError, "full_to_state"),
    # ---- one request slot per batch row
    ("decode_duplicate_rid", decode_kwargs, CompressorDecodePlan.generate, setter("req_pool_indices", lambda k: torch.tensor([1, 1])), ValueError, "req_pool_indices"),
    ("decode_duplicate_rid_with_padding_row", decode_kwargs, CompressorDecodePlan.generate,
     lambda k: k.update(req_pool_indices=torch.tensor([1, 1]), seq_lens=torch.tensor([8, 1])), ValueError, "req_pool_indices"),
    ("prefill_duplicate_rid", prefill_kwargs, CompressorPrefillPlan.generate, setter("req_pool_indices", lambda k: torch.tensor([2, 2])), ValueError, "req_pool_indices"),
    ("decode_online_duplicate_rid", online_decode_kwargs, CompressorDecodePlan.generate_online, setter("req_pool_indices", lambda k: torch.tensor([2, 2])), ValueError, "req_pool_indices"),
    ("prefill_online_duplicate_rid", online_prefill_kwargs, CompressorPrefillPlan.generate_online, setter("req_pool_indices", lambda k: torch.tensor([1, 1])), ValueError, "req_pool_indices"),
    # ---- meta tensors, autograd, aliasing
    ("decode_rpi_meta", decode_kwargs, CompressorDecodePlan.generate, meta("req_pool_indices"), ValueError, "req_pool_indices"),
    ("prefill_r2t_meta", prefill_kwargs, CompressorPrefillPlan.generate, meta("req_to_token"), ValueError, "req_to_token"),
    ("cf_buffer_meta", compress_kwargs, compress_forward, meta("kv_score_buffer"), ValueError, "kv_score_buffer"),
    ("cf_input_meta", compress_kwargs, compress_forward, meta("kv_score_input"), ValueError, "kv_score_input"),
    ("st_kv_meta", store_kwargs, compress_norm_rope_store, meta("kv"), ValueError, "kv"),
    ("st_cache_meta", store_kwargs, compress_norm_rope_store, meta("kvcache"), ValueError, "kvcache"),
    ("cf_buffer_requires_grad", compress_kwargs, compress_forward, grad("kv_score_buffer"), ValueError, "kv_score_buffer"),
    ("cf_input_requires_grad", compress_kwargs, compress_forward, grad("kv_score_input"), ValueError, "kv_score_input"),
    ("cf_ape_requires_grad", compress_kwargs, compress_forward, grad("ape"), ValueError, "ape"),
    ("cf_out_requires_grad", compress_kwargs, compress_forward, grad("out"), ValueError, "out"),
    ("st_kv_requires_grad", store_kwargs, compress_norm_rope_store, grad("kv"), ValueError, "kv"),
    ("st_weight_requires_grad", store_kwargs, compress_norm_rope_store, grad("norm_weight"), ValueError, "norm_weight"),
    ("cf_input_aliases_state", compress_kwargs, compress_forward, setter("kv_score_input", pool_rows(15, 4 * H)), ValueError, "kv_score_input"),
    ("cf_ape_aliases_state", compress_kwargs, compress_forward, setter("ape", pool_rows(8, H)), ValueError, "ape"),
    ("cf_out_aliases_state", compress_kwargs, compress_forward, setter("out", lambda k: pool_rows(k["out"].shape[0], H)(k)), ValueError, "out"),
    ("cf_out_aliases_input", compress_kwargs, compress_forward,
     setter("out", lambda k: k["kv_score_input"].view(-1)[: k["out"].numel()].view(k["out"].shape)), ValueError, "out"),
    ("st_kv_aliases_cache", store_kwargs, compress_norm_rope_store,
     setter("kv", lambda k: k["kvcache"].view(torch.float32).view(-1)[: 2 * 512].view(2, 512)), ValueError, "kv"),
    # ---- one cache slot per stored row
    ("st_out_loc_duplicate_decode", store_two_events_kwargs, compress_norm_rope_store, setter("out_loc", lambda k: torch.tensor([3, 3])), ValueError, "out_loc"),
    ("st_out_loc_duplicate_prefill", prefill_store_kwargs, compress_norm_rope_store, with_entry("out_loc", 12, 3), ValueError, "out_loc"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_rejected_without_writes(case) -> None:
    _, make, fn, mutate, exc, arg = case
    kwargs = make()
    mutate(kwargs)
    before = [b.clone() for b in buffers(kwargs)]
    with pytest.raises(exc) as info:
        fn(**kwargs)
    assert str(info.value).startswith(arg + ":"), (
        f"message must name {arg!r}: {info.value}"
    )
    for b, saved in zip(buffers(kwargs), before):
        assert torch.equal(b, saved), "a rejected call wrote into a buffer"


def test_valid_calls_of_the_catalogue_succeed() -> None:
    """The unmutated calls are valid, so each failure above comes from its one mutation."""
    CompressorDecodePlan.generate(**decode_kwargs())
    CompressorPrefillPlan.generate(**prefill_kwargs())
    compress_forward(**compress_kwargs())
    kw = store_kwargs()
    compress_norm_rope_store(**kw)
    assert int(kw["kvcache"].count_nonzero()) > 0


def test_valid_neighbours_of_the_new_cases_succeed() -> None:
    """What the new checks must keep accepting: values the plan never looks up, CUDA-graph padding
    rows sharing a slot, repeated out_loc at rows that store nothing, parameters under no_grad."""
    kw = chunk_kwargs()
    kw["full_to_state"] = kw["full_to_state"].clone()
    kw["full_to_state"][1024 + 1] = -1  # slot 2, position 1: before the 4 prefix tokens the planner reads
    CompressorPrefillPlan.generate(**kw)
    padded = {**decode_kwargs(), "req_pool_indices": torch.tensor([1, 2, 0, 0]), "seq_lens": torch.tensor([8, 5, 1, 1])}
    assert CompressorDecodePlan.generate(**padded)[1].shape == (4, 16)
    CompressorDecodePlan.generate_online(torch.tensor([5, 1, 1]), torch.tensor([1, 0, 0]), world()["req_to_token"])
    st = store_kwargs()
    st["out_loc"] = torch.tensor([3, 3])  # row 1 (seq_len 5) stores nothing
    compress_norm_rope_store(**st)
    cf = compress_kwargs()
    cf["ape"] = torch.nn.Parameter(cf["ape"])
    with torch.no_grad():
        compress_forward(**cf)
    pool = torch.randn(2056 + 15, 4 * H)  # input and state pool side by side in one allocation
    cf = compress_kwargs()
    cf.update(kv_score_buffer=pool[:2056], kv_score_input=pool[2056:])
    compress_forward(**cf)


def test_is_overlap_compress() -> None:
    assert is_overlap_compress(4) and not is_overlap_compress(128)
    with pytest.raises(ValueError, match="compress_ratio"):
        is_overlap_compress(2)


def test_empty_batches_are_noops() -> None:
    w = world()
    empty = torch.zeros(0, dtype=torch.int64)
    d = CompressorDecodePlan.generate(4, empty, w["req_to_token"], w["full_to_state"], empty, 256, 8)
    assert d[1].shape == (0, 16)
    p = CompressorPrefillPlan.generate(4, empty, empty, empty, w["req_to_token"], w["full_to_state"], 256, 8, 0)
    assert p[1].shape == (0, 16) and p[2].shape == (0, 8)
    o = CompressorPrefillPlan.generate_online(empty, empty, empty, w["req_to_token"], 0)
    assert o[1].shape == (0, 16) and o[2].shape == (0, 16)
    state = torch.randn(16, 4 * H)
    saved = state.clone()
    out = compress_forward(state, torch.zeros(0, 4 * H), torch.zeros(8, H), p, head_dim=H, compress_ratio=4)
    assert out.shape == (0, H) and torch.equal(state, saved)


def test_plan_copy_checks_kind_dtype_and_shape() -> None:
    a = CompressorDecodePlan.generate(**decode_kwargs())
    b = CompressorDecodePlan.generate(**decode_kwargs())
    saved = a[1].clone()
    with pytest.raises(TypeError, match="^other:"):
        a.copy_(CompressorDecodePlan(4, b[1].view(torch.int32)))
    with pytest.raises(ValueError, match="^other:"):
        a.copy_(CompressorDecodePlan(4, b[1], is_online=True))
    with pytest.raises(ValueError, match="^other:"):
        a.copy_(CompressorDecodePlan(4, b[1][:1]))
    assert torch.equal(a[1], saved)
    b[1][0, 0] ^= 1
    a.copy_(b)
    assert torch.equal(a[1], b[1])


def test_byte_span_matches_the_strided_extent() -> None:
    """``byte_span`` takes the tensor's bytes for contiguous tensors (the aliasing checks' fast case):
    it must agree with the extent the strides reach for every layout, contiguous or not."""
    from flashcompress.validation import byte_span

    base = torch.zeros(6, 8, 4)
    views = [base, base[1:3], base[:, 2:5], base.transpose(0, 1), base[..., ::2], base[2:2], base[1:2, :, :1],
             base[:, :1].expand(6, 5, 4), torch.zeros(1, 3).as_strided((1, 3), (99, 1)), torch.zeros(0, 3)]
    for t in views:
        start = t.data_ptr()
        extent = 0 if t.numel() == 0 else 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
        assert byte_span(t) == (start, start + extent * t.element_size()), (tuple(t.shape), t.stride())
