"""V4.1 ops reject bad arguments with named errors before writing anything; empty batches are no-ops."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import flashcompress as fc
from flashcompress.v41.layouts import KVLayout

BF16 = torch.bfloat16
P1, P2, PK = 16, 16, 64


def _c1_args(n: int = 4) -> dict[str, Any]:
    return dict(kv_input=torch.randn(n, 512).to(BF16), norm_weight=torch.ones(512, dtype=BF16),
                positions=torch.arange(n), out_loc=torch.arange(n) + 1, eps=1e-20, freqs_cis=torch.randn(32, 64),
                k_cache=torch.zeros(2, KVLayout.V4.page_bytes(P1), dtype=torch.uint8), page_size=P1, layout="v4")


def _c2_args(n: int = 4) -> dict[str, Any]:
    state = torch.zeros(16, 1024)
    state[:, 512:] = float("-inf")
    return dict(kv_input=torch.randn(n, 1024), kv_state=state, norm_weight=torch.ones(512, dtype=BF16),
                positions=torch.arange(n) + 4, req=torch.zeros(n, dtype=torch.int64), raw_out_loc=torch.arange(n) + 4,
                eps=1e-20, freqs_cis=torch.randn(32, 64),
                k_cache=torch.zeros(2, KVLayout.V4.page_bytes(P2), dtype=torch.uint8), page_size=P2, ring_size=8)


def _prefill_args(n: int = 4) -> dict[str, Any]:
    return _c2_args(n) | dict(extend_start_loc=torch.tensor([0], dtype=torch.int32),
                              extend_seq_lens=torch.tensor([n], dtype=torch.int32))


def _ik_args(n: int = 4) -> dict[str, Any]:
    return dict(input=torch.randn(n, 128).to(BF16), norm_weight=torch.ones(128, dtype=BF16), eps=1e-20,
                freqs_cis=torch.randn(32, 64), positions=torch.arange(n), loc=torch.arange(n) + 1,
                cache=torch.zeros(2, 68 * PK, dtype=torch.uint8), ratio=1)


def _decode(a: dict[str, Any]) -> Any:
    return fc.c2_decode_norm_rope_store(**a)


OPS: dict[str, tuple[Callable[[], dict[str, Any]], Callable[..., Any]]] = {
    "c1": (_c1_args, lambda a: fc.c1_decode_norm_rope_store(**a)),
    "c2": (_c2_args, _decode),
    "prefill": (_prefill_args, lambda a: fc.c2_prefill_norm_rope_store(**a)),
    "index_k": (_ik_args, lambda a: fc.index_k_norm_rope_pack_store(**a)),
}

BAD: list[tuple[str, str, Callable[[dict[str, Any]], None], type[Exception], str]] = [
    # (op, case, mutation, error, message start)
    ("c1", "kv dtype", lambda a: a.update(kv_input=a["kv_input"].float()), TypeError, "kv_input: expected dtype"),
    ("c1", "kv width", lambda a: a.update(kv_input=a["kv_input"][:, :256].contiguous()), ValueError, "kv_input: expected shape[1] == 512"),
    ("c1", "weight dtype", lambda a: a.update(norm_weight=a["norm_weight"].float()), TypeError, "norm_weight"),
    ("c1", "positions rows", lambda a: a.update(positions=a["positions"][:3]), ValueError, "positions: expected shape[0] == 4"),
    ("c1", "out_loc dtype", lambda a: a.update(out_loc=a["out_loc"].float()), TypeError, "out_loc"),
    ("c1", "eps zero in fp32", lambda a: a.update(eps=1e-50), ValueError, "eps"),
    ("c1", "eps type", lambda a: a.update(eps="1e-6"), TypeError, "eps"),
    ("c1", "freqs width", lambda a: a.update(freqs_cis=torch.randn(32, 32)), ValueError, "freqs_cis"),
    ("c1", "cache page bytes", lambda a: a.update(layout="v41"), ValueError, "k_cache: expected [pages, 8704] (v41 page of 16 slots)"),
    ("c1", "cache dtype", lambda a: a.update(k_cache=a["k_cache"].to(torch.int8)), TypeError, "k_cache"),
    ("c1", "page size", lambda a: a.update(page_size=12), ValueError, "page_size: expected a power of two"),
    ("c1", "layout", lambda a: a.update(layout="fp4"), ValueError, "layout"),
    ("c1", "position past table", lambda a: a["positions"].__setitem__(1, 32), ValueError, "positions"),
    ("c1", "slot past cache", lambda a: a["out_loc"].__setitem__(1, 2 * P1), ValueError, "out_loc"),
    ("c1", "duplicate slot", lambda a: a["out_loc"].__setitem__(1, 1), ValueError, "out_loc: expected a distinct slot"),
    ("c1", "out shape", lambda a: a.update(out=torch.zeros(3, 512, dtype=BF16)), ValueError, "out"),
    ("c1", "out aliases input", lambda a: a.update(out=a["kv_input"]), ValueError, "out: expected memory separate"),
    ("c1", "cache on meta", lambda a: a.update(k_cache=a["k_cache"].to("meta")), ValueError, "k_cache"),
    ("c2", "kv width", lambda a: a.update(kv_input=a["kv_input"][:, :512].contiguous()), ValueError, "kv_input: expected shape[1] == 1024"),
    ("c2", "state dtype", lambda a: a.update(kv_state=a["kv_state"].to(BF16)), TypeError, "kv_state"),
    ("c2", "req dtype", lambda a: a.update(req=a["req"].int()), TypeError, "req"),
    ("c2", "ring size", lambda a: a.update(ring_size=0), ValueError, "ring_size"),
    ("c2", "draft not dividing", lambda a: a.update(draft_len=3), ValueError, "kv_input: expected a multiple of draft_len"),
    ("c2", "ring not wider than draft", lambda a: a.update(draft_len=4, ring_size=4), ValueError, "ring_size: expected > draft_len"),
    ("c2", "req past ring", lambda a: a["req"].__setitem__(0, 2), ValueError, "req: expected request slots in [0, 2)"),
    ("c2", "padded row req past ring", lambda a: (a["req"].__setitem__(0, 5), a["raw_out_loc"].__setitem__(0, 0)),
     ValueError, "req"),
    ("c2", "negative raw", lambda a: a["raw_out_loc"].__setitem__(0, -2), ValueError, "raw_out_loc: expected values >= 0"),
    ("c2", "compressed slot past cache", lambda a: a["raw_out_loc"].__setitem__(1, 4 * P2 + 1), ValueError, "raw_out_loc"),
    ("c2", "two decode rows of one request", lambda a: a.update(draft_len=1), ValueError, "req: expected one decode row"),
    ("c2", "verify block not consecutive", lambda a: (a.update(draft_len=4), a["positions"].__setitem__(2, 9), a["raw_out_loc"].__setitem__(2, 9)),
     ValueError, "positions: expected blocks of 4"),
    ("c2", "rope row past table", lambda a: a["positions"].__setitem__(3, 33), ValueError, "positions"),
    ("prefill", "start dtype", lambda a: a.update(extend_start_loc=a["extend_start_loc"].long()), TypeError, "extend_start_loc"),
    ("prefill", "lens size", lambda a: a.update(extend_seq_lens=torch.tensor([2, 2], dtype=torch.int32)), ValueError, "extend_seq_lens"),
    ("prefill", "range past rows", lambda a: a.update(extend_seq_lens=torch.tensor([5], dtype=torch.int32)), ValueError, "extend_seq_lens: expected start + len <= 4"),
    ("prefill", "overlapping requests", lambda a: a.update(extend_start_loc=torch.tensor([0, 1], dtype=torch.int32),
                                                            extend_seq_lens=torch.tensor([2, 2], dtype=torch.int32)),
     ValueError, "extend_start_loc: expected disjoint"),
    ("index_k", "input width", lambda a: a.update(input=a["input"][:, :64]), ValueError, "input"),
    ("index_k", "loc dtype", lambda a: a.update(loc=a["loc"].int()), TypeError, "loc"),
    ("index_k", "ratio", lambda a: a.update(ratio=4), ValueError, "ratio: expected one of (1, 2)"),
    ("index_k", "cache width", lambda a: a.update(cache=torch.zeros(2, 68 * 3, dtype=torch.uint8)), ValueError, "cache"),
    ("index_k", "slot past cache", lambda a: a["loc"].__setitem__(0, 2 * PK), ValueError, "loc"),
    ("index_k", "position past table", lambda a: a["positions"].__setitem__(0, 40), ValueError, "positions"),
]


def _snapshot(a: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in a.items() if isinstance(v, torch.Tensor) and not v.is_meta}


@pytest.mark.parametrize("op,case,mutate,exc,msg", BAD, ids=[f"{b[0]}-{b[1]}" for b in BAD])
def test_bad_argument_named_and_nothing_written(op, case, mutate, exc, msg) -> None:
    make, call = OPS[op]
    a = make()
    if op == "c2" and case not in ("two decode rows of one request", "verify block not consecutive"):
        a["draft_len"], a["req"] = 4, torch.zeros(4, dtype=torch.int64)  # a valid verify block by default
    mutate(a)
    before = _snapshot(a)
    with pytest.raises(exc) as info:
        call(a)
    assert str(info.value).startswith(msg), str(info.value)
    after = _snapshot(a)
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("op", list(OPS))
def test_valid_defaults_and_empty_batch(op: str) -> None:
    make, call = OPS[op]
    a = make()
    if op == "c2":
        a["draft_len"] = 4
    call(a)  # the defaults are a valid call (so each BAD case fails for its own reason)
    e = make(0)
    if op == "prefill":
        e.update(extend_start_loc=torch.zeros(0, dtype=torch.int32), extend_seq_lens=torch.zeros(0, dtype=torch.int32))
    before = _snapshot(e)
    result = call(e)
    assert all(torch.equal(before[k], v) for k, v in _snapshot(e).items())
    if op != "index_k":
        assert result.shape == (0, 512)
