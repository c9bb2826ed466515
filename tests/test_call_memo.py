"""The steady-state memo of checked calls (``validation._MEMO``): it never changes an outcome.

On CUDA (outside ``FLASHCOMPRESS_DEBUG=1``) a call whose key is memoised is rebuilt from the
memoised facts and checks nothing else.  These CPU tests switch the CPU path to what a CUDA
call sees (``checked_by_binding`` -> None: device and contiguity left to the binding; no value
checks) and the backend to a no-op, then check for every compress / store case of the bad-input
catalogue that a call made after the valid call was memoised raises exactly what it raises with
an empty memo (same type, same message), and that a repeated call is a memo hit.
"""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from test_bad_input import CASES, compress_kwargs, online_compress_kwargs, store_kwargs

import flashcompress.dispatch as D
from flashcompress import compress_and_store, compress_forward, compress_norm_rope_store
from flashcompress import validation as V

_NOOP = SimpleNamespace(compress_forward=lambda *a, **k: None, compress_norm_rope_store=lambda *a, **k: None,
                        compress_and_store=lambda *a, **k: None)


@pytest.fixture
def cuda_like(monkeypatch: pytest.MonkeyPatch):
    """The CUDA call path on CPU tensors: lean checks, no value checks, memo on, no-op backend."""
    monkeypatch.setattr(V, "checked_by_binding", lambda device: None)
    monkeypatch.setattr(V, "wants_values", lambda device: False)
    monkeypatch.setattr(V, "wants_value_checks", lambda t: False)
    monkeypatch.setattr(D, "ops_backend", lambda device: _NOOP)
    V.clear_memo()
    yield
    V.clear_memo()


def _outcome(fn, kwargs: dict[str, Any]) -> tuple[type, str] | None:
    try:
        fn(**kwargs)
    except (TypeError, ValueError) as e:
        return type(e), str(e)
    return None


OP_CASES = [c for c in CASES if c[2] in (compress_forward, compress_norm_rope_store)]


@pytest.mark.parametrize("case", OP_CASES, ids=[c[0] for c in OP_CASES])
def test_memo_never_changes_the_outcome(case, cuda_like) -> None:
    _, make, fn, mutate, _, _ = case
    valid = make()
    bad = dict(valid)  # the valid call's tensors, one argument replaced (or a plan filled in place)
    mutate(bad)
    with torch.enable_grad():  # the requires_grad cases
        cold = _outcome(fn, bad)  # empty memo: every check
        V.clear_memo()
        if bad["plan"] is valid["plan"] and all(bad[k] is v for k, v in valid.items()):
            return  # mutated in place (a value check): nothing to compare against
        assert _outcome(fn, valid) is None
        assert V._MEMO, "the valid call was not memoised"
        assert _outcome(fn, bad) == cold  # memo warm with the valid call's key
        assert _outcome(fn, valid) is None


def test_repeated_calls_hit_the_memo(cuda_like) -> None:
    kw, st = compress_kwargs(), store_kwargs()
    for _ in range(3):
        compress_forward(**kw)
        compress_norm_rope_store(**st)
    assert len(V._MEMO) == 2
    # the rebuilt call carries the current tensors and the memoised facts
    first = V.check_compress(kw["kv_score_buffer"], kw["kv_score_input"], kw["ape"], kw["plan"], 128, 4, kw["out"],
                             False)
    V.clear_memo()
    cold = V.check_compress(kw["kv_score_buffer"], kw["kv_score_input"], kw["ape"], kw["plan"], 128, 4, kw["out"],
                            False)
    assert all(a is b for a, b in zip(first, cold) if isinstance(a, torch.Tensor)) and first == cold
    # a new address (another allocation of the same shape) is a new key
    kw["kv_score_input"] = kw["kv_score_input"].clone()
    compress_forward(**kw)
    assert len(V._MEMO) == 2


def test_fused_and_online_calls_hit_the_memo(cuda_like) -> None:
    kw, st = compress_kwargs(), store_kwargs()
    del kw["out"]
    row_bytes = V.store_format(128, False, False, 64)[1]  # C4 indexer FP8 pages
    tail = dict(norm_weight=torch.ones(128), norm_eps=st["norm_eps"], freq_cis=st["freq_cis"],
                out_loc=torch.arange(kw["kv_score_input"].shape[0]), kvcache=torch.zeros(4, row_bytes, dtype=torch.uint8),
                page_size=64)
    online = online_compress_kwargs()
    for _ in range(3):
        compress_and_store(**kw, **tail)
        compress_forward(**online)
    assert len(V._MEMO) == 2
    with pytest.raises(ValueError, match="^kvcache: expected"):  # a cache of another format: a new key, checked
        compress_and_store(**kw, **dict(tail, kvcache=torch.zeros(4, row_bytes + 16, dtype=torch.uint8)))


def test_grad_mode_is_checked_on_every_hit(cuda_like) -> None:
    kw = compress_kwargs()
    with torch.enable_grad():
        compress_forward(**kw)
        kw["kv_score_input"].requires_grad_(True)  # same tensor, same key
        with pytest.raises(ValueError, match="^kv_score_input: expected a tensor that does not require grad"):
            compress_forward(**kw)
    with torch.no_grad():
        compress_forward(**kw)  # allowed without grad mode


def test_scalars_of_another_type_are_never_hits(cuda_like) -> None:
    kw, st = compress_kwargs(), store_kwargs()
    compress_forward(**kw)
    compress_norm_rope_store(**st)
    with pytest.raises(TypeError, match="^head_dim: expected an int"):
        compress_forward(**dict(kw, head_dim=128.0))
    with pytest.raises(TypeError, match="^use_fp4: expected a bool"):
        compress_norm_rope_store(**dict(st, use_fp4=0))
    with pytest.raises(TypeError, match="^page_size: expected an int"):
        compress_norm_rope_store(**dict(st, page_size=64.0))


def test_the_memo_holds_no_tensor(cuda_like) -> None:
    kw = compress_kwargs()
    compress_forward(**kw)
    refs = [weakref.ref(kw[k]) for k in ("kv_score_buffer", "kv_score_input", "ape", "out")]
    del kw
    gc.collect()
    assert all(r() is None for r in refs)


def test_empty_tensors_are_not_memoised(cuda_like) -> None:
    st = store_kwargs()
    st["out_loc"] = torch.empty(0, dtype=torch.int64)
    st["kv"] = torch.empty(0, 512)
    st["plan"] = type(st["plan"])(4, st["plan"][1][:0])
    compress_norm_rope_store(**st)
    assert not V._MEMO


def test_memo_is_bounded(cuda_like, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(V, "MEMO_SIZE", 2)
    kw = compress_kwargs()
    for _ in range(5):
        kw["kv_score_input"] = kw["kv_score_input"].clone()
        compress_forward(**kw)
        assert len(V._MEMO) <= 2
