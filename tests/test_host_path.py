"""The host path: call objects, docstrings of the public names, swapped planner arguments,
and the ``FLASHCOMPRESS_DEBUG=1`` finite-value checks (CPU; the same checks run on CUDA)."""

from __future__ import annotations

import inspect
import itertools
from typing import Any

import pytest
import torch

from test_bad_input import H, compress_kwargs, decode_kwargs, online_compress_kwargs, store_kwargs

import flashcompress as fc
from flashcompress import validation as V
from flashcompress.jit import settings
from flashcompress.layouts import INDEXER_FP8, LAYER_KINDS
from flashcompress.torch_backend.rows import decode_fields


# ----------------------------------------------------------------------------- call objects


def test_check_compress_returns_the_checked_call() -> None:
    kw = compress_kwargs()
    paged = kw["kv_score_buffer"].view(-1, 4, 4 * H)  # the paged view is flattened in the call
    call = V.check_compress(paged, kw["kv_score_input"], kw["ape"], kw["plan"], H, 4, kw["out"], False)
    assert call.layer is LAYER_KINDS[(4, H, False)]
    assert call.state.shape == (2056, 4 * H) and call.state.data_ptr() == paged.data_ptr()
    assert call.plan_rows is kw["plan"][1] and call.plan_w is kw["plan"][2] and not call.is_decode
    assert call.store is None and call.device == -1
    with pytest.raises(AttributeError):
        call.state = paged  # immutable


def test_check_store_carries_format_and_tail() -> None:
    kw = store_kwargs()
    tail = (kw["norm_weight"], kw["norm_eps"], kw["freq_cis"], kw["out_loc"], kw["kvcache"], kw["page_size"], False,
            False, "v4")
    call = V.check_store(kw["kv"], kw["plan"], tail)
    assert call.store.fmt.name == "v4" and call.is_decode and call.ratio == 4
    assert call.store.kvcache is kw["kvcache"] and call.store.page_size == 64
    v41_cache = torch.zeros(2, 33792, dtype=torch.uint8)  # a v41 page of 64 tokens
    call = V.check_store(kw["kv"], kw["plan"], tail[:4] + (v41_cache,) + tail[5:8] + ("V41",))
    assert call.store.fmt.name == "v41" and call.store.kvcache is v41_cache
    assert V.store_format(512, False, False, 2, "v41_fp4_new")[1] == 2 * 288  # interleaved: no page padding
    fmt, row_bytes = V.store_format(128, True, False, 16)
    assert fmt.name == "idx_fp4" and row_bytes == fmt.cache_row_bytes(16) == fmt.page_bytes(16)
    assert V.store_format(512, False, True, 4)[1] == 1024 * 4  # bf16 rows: no page padding


# ----------------------------------------------------------------------------- docstrings


PUBLIC_PLANNERS = [fc.CompressorDecodePlan.generate, fc.CompressorDecodePlan.generate_online,
                   fc.CompressorPrefillPlan.generate, fc.CompressorPrefillPlan.generate_online]


@pytest.mark.parametrize("fn", PUBLIC_PLANNERS + [fc.compress_forward, fc.compress_norm_rope_store],
                         ids=lambda f: f.__qualname__)
def test_public_functions_document_every_argument_with_an_example(fn) -> None:
    doc = inspect.getdoc(fn)
    assert doc, f"{fn.__qualname__} has no docstring"
    missing = [p for p in inspect.signature(fn).parameters if f"{p}:" not in doc]
    assert not missing, f"{fn.__qualname__}: arguments not described: {missing}"
    assert "Example: " in doc and ("int64" in doc or "float32" in doc)


@pytest.mark.parametrize("name", [n for n in fc.__all__ if n != "__version__"])
def test_every_export_has_a_docstring(name: str) -> None:
    doc = inspect.getdoc(getattr(fc, name))
    assert doc and len(doc) > 40, name


def test_planners_say_the_argument_order_is_the_peers() -> None:
    for fn in PUBLIC_PLANNERS:
        assert "argument order is the peer's" in inspect.getdoc(fn), fn.__qualname__


# ----------------------------------------------------------------------------- swapped planner arguments


R2T = torch.arange(16 * 512, dtype=torch.int32).reshape(16, 512)  # 16 slots, 512 positions


@pytest.mark.parametrize("order", [p for p in itertools.permutations(range(3)) if p != (0, 1, 2)])
def test_swapped_online_prefill_lengths_and_slots_are_caught(order) -> None:
    args = [torch.tensor([300, 9]), torch.tensor([100, 9]), torch.tensor([3, 7])]  # seq, extend, slots
    fc.CompressorPrefillPlan.generate_online(*args, R2T, 109)  # the right order is accepted
    swapped = [args[i] for i in order]
    with pytest.raises(ValueError, match="^(req_pool_indices|extend_lens|seq_lens|num_q_tokens): "):
        fc.CompressorPrefillPlan.generate_online(*swapped, R2T, 109)


def test_swapped_online_decode_lengths_and_slots_are_caught() -> None:
    seq, slots = torch.tensor([300, 9]), torch.tensor([3, 7])
    fc.CompressorDecodePlan.generate_online(seq, slots, R2T)
    with pytest.raises(ValueError, match="^req_pool_indices: "):
        fc.CompressorDecodePlan.generate_online(slots, seq, R2T)
    with pytest.raises(ValueError, match="^seq_lens: .*columns of req_to_token"):
        fc.CompressorDecodePlan.generate_online(torch.tensor([600, 9]), slots, R2T)


# ----------------------------------------------------------------------------- debug finite checks


def _decode_call() -> dict[str, Any]:
    torch.manual_seed(3)
    plan = fc.CompressorDecodePlan.generate(**decode_kwargs())  # seq_lens 8 (a window boundary) and 5
    return dict(kv_score_buffer=torch.randn(2056, 4 * H), kv_score_input=torch.randn(2, 4 * H),
                ape=torch.randn(8, H), plan=plan, head_dim=H, compress_ratio=4)


def _read_row(plan) -> int:
    """A state row request 0 (seq_len 8, at a boundary) pools: its current page, not the row it writes."""
    f = decode_fields(plan[1])
    row = int(f["read_page_1"][0]) * 4
    assert row != int(f["write_loc"][0])
    return row


def _store_args(kvcache: torch.Tensor, rows: int) -> dict[str, Any]:
    st = store_kwargs()
    return dict(norm_weight=torch.ones(H), norm_eps=1e-6, freq_cis=st["freq_cis"], out_loc=torch.arange(rows),
                kvcache=kvcache, page_size=64)


def test_nan_input_row_is_a_named_error_in_debug_mode(debug_mode) -> None:
    kw = _decode_call()
    kw["kv_score_input"][1, 5] = float("inf")
    saved = kw["kv_score_buffer"].clone()
    with pytest.raises(ValueError, match=r"^kv_score_input: .*non-finite value in row 1"):
        fc.compress_forward(**kw)
    cache = torch.zeros(2, INDEXER_FP8.cache_row_bytes(64), dtype=torch.uint8)
    with pytest.raises(ValueError, match="^kv_score_input: "):
        fc.compress_and_store(**kw, **_store_args(cache, 2))
    assert torch.equal(kw["kv_score_buffer"], saved) and not cache.any()


def test_nan_in_a_state_row_the_call_reads_is_a_named_error_in_debug_mode(debug_mode) -> None:
    kw = _decode_call()
    row = _read_row(kw["plan"])
    kw["kv_score_buffer"][row, H + 3] = float("nan")  # the own half of the current block: pooled
    saved = kw["kv_score_buffer"].clone()
    with pytest.raises(ValueError, match=rf"^kv_score_buffer: .*NaN in state row {row}"):
        fc.compress_forward(**kw)
    assert torch.equal(kw["kv_score_buffer"].nan_to_num(), saved.nan_to_num())


def test_nan_where_no_call_reads_is_accepted(debug_mode) -> None:
    """Rows the call does not read may hold anything (pools need no clearing): no false positive."""
    kw = _decode_call()
    f = decode_fields(kw["plan"][1])
    kw["kv_score_buffer"][-1] = float("nan")  # a row no request of the batch reads
    kw["kv_score_buffer"][int(f["write_loc"][1])] = float("nan")  # overwritten from the input before any read
    kw["kv_score_buffer"][int(f["read_page_0"][0]) * 4, : 2 * H] = float("-inf")  # -inf is not NaN
    kw["kv_score_buffer"][_read_row(kw["plan"]), 3] = float("nan")  # the overlap half of the current block: unread
    out = fc.compress_forward(**kw)
    assert out.shape == (2, H)


def test_finite_checks_are_off_without_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLASHCOMPRESS_DEBUG", raising=False)
    settings.forget_settings()
    kw = _decode_call()
    kw["kv_score_buffer"][_read_row(kw["plan"])] = float("nan")
    kw["kv_score_input"][0, 0] = float("nan")
    fc.compress_forward(**kw)  # stored silently, as the kernels would: the checks cost a pass over the rows
    settings.forget_settings()


def test_nan_in_prefill_and_online_reads_is_caught(debug_mode) -> None:
    kw = compress_kwargs()
    kw["kv_score_input"][14, 0] = float("nan")  # the last ragged token: the write pass reads it
    with pytest.raises(ValueError, match="^kv_score_input: "):
        fc.compress_forward(**kw)
    on = online_compress_kwargs()  # chunk B of slot 1 merges with the state of slot 1
    on["kv_score_buffer"][1, 7] = float("nan")
    with pytest.raises(ValueError, match="^kv_score_buffer: .*NaN in state row 1"):
        fc.compress_forward(**on)
    on = online_compress_kwargs()
    on["kv_score_buffer"][3, 7] = float("nan")  # another slot: not read
    fc.compress_forward(**on)
