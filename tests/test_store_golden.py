"""The torch store backend against SGLang's cache bytes (tests/data/golden/store, README §3).

Every golden call starts from a cache full of the poison byte; after the store
the whole cache must equal ``kvcache_after`` byte for byte, so the stored
entries are exact and every other byte (V4 scale pad, page tails, skipped
slots) is untouched.
"""

from __future__ import annotations

import pytest
import torch
from _golden import load_golden

from flashcompress import layouts
from flashcompress.torch_backend import rows
from flashcompress.torch_backend.store import norm_rope_store

STORE_FILES = [
    "store_v4_c4_p64.pt",
    "store_v4_c128_p2.pt",
    "store_idx_fp8_p64.pt",
    "store_idx_fp4_p64.pt",
    "store_bf16_c4_p1.pt",
]
CALLS = ["decode", "prefill"]


def plan_rows(plan: torch.Tensor, out_loc: torch.Tensor, ratio: int, is_decode: bool):
    """(positions, dest, valid) of each plan row, per spec/store-and-jit.md §3.2."""
    if is_decode:
        f = rows.decode_fields(plan)
        valid = f["seq_len"] % ratio == 0
        dest = out_loc
    else:
        f = rows.compress_fields(plan)
        valid = f["valid"]
        dest = out_loc[f["ragged_id"]]
    return f["seq_len"] - ratio, dest, valid


def entry_ranges(fmt: layouts.CacheFormat, page_size: int, dest: torch.Tensor):
    """(data_start, scale_start) flat byte offsets of the entries at cache slots ``dest``."""
    shift = page_size.bit_length() - 1
    page_bytes = fmt.page_bytes(page_size)
    page, slot = dest >> shift, dest & (page_size - 1)
    data = page * page_bytes + slot * fmt.data_bytes
    scale = page * page_bytes + page_size * fmt.data_bytes + slot * fmt.scale_bytes
    return data, scale


def describe_mismatch(actual, expected, fmt, page_size, dest, row_ids, kinds=None) -> str:
    """Name the first differing byte: which stored row/entry and region it falls in, and both values."""
    a, e = actual.reshape(-1), expected.reshape(-1)
    bad = (a != e).nonzero().flatten()
    if bad.numel() == 0:
        return "no mismatch"
    i = int(bad[0])
    page_bytes = fmt.page_bytes(page_size)
    where = f"page {i // page_bytes}, page offset {i % page_bytes}: outside every stored entry (should be poison)"
    data, scale = entry_ranges(fmt, page_size, dest)
    for k, r in enumerate(row_ids.tolist()):
        d0, s0 = int(data[k]), int(scale[k])
        kind = f" ({kinds[r]})" if kinds else ""
        if d0 <= i < d0 + fmt.data_bytes:
            where = f"row {r}{kind}, out_loc {int(dest[k])}: data byte {i - d0}"
            break
        if fmt.scale_bytes and s0 <= i < s0 + fmt.scale_bytes:
            where = f"row {r}{kind}, out_loc {int(dest[k])}: scale byte {i - s0}"
            break
    return (
        f"{bad.numel()} bytes differ; first at flat byte {i} = {where}; "
        f"expected 0x{int(e[i]):02x}, got 0x{int(a[i]):02x}"
    )


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("name", STORE_FILES)
def test_store_matches_golden(name: str, call: str) -> None:
    d = load_golden(f"store/{name}")
    ratio, page_size = d["compress_ratio"], d["page_size"]
    fmt = layouts.select_cache_format(d["head_dim"], d["use_fp4"], d["bf16_store"])
    assert fmt.name == d["format"]
    assert d["kvcache_before"].shape[1] == fmt.page_bytes(page_size)
    assert bool((d["kvcache_before"] == d["poison_byte"]).all())

    positions, dest, valid = plan_rows(d[f"{call}.plan"], d[f"{call}.out_loc"], ratio, d[f"{call}.is_decode"])
    assert int(valid.sum()) == d[f"{call}.num_stored"]

    cache = d["kvcache_before"].clone()
    norm_rope_store(
        d[f"{call}.kv"],
        positions,
        dest,
        valid,
        norm_weight=d["norm_weight"],
        norm_eps=d["norm_eps"],
        freq_real=torch.view_as_real(d["freq_cis"]).flatten(-2),
        kvcache=cache,
        page_size=page_size,
        fmt=fmt,
    )
    expected = d[f"{call}.kvcache_after"]
    stored = valid.nonzero().flatten()
    msg = describe_mismatch(
        cache, expected, fmt, page_size, dest[stored], stored, d[f"{call}.row_kind"].split(",")
    )
    assert torch.equal(cache, expected), msg


def test_mismatch_report_names_entry() -> None:
    """The failure helper points at the right row, region and byte."""
    fmt, page_size = layouts.MAIN_V4, 2
    expected = torch.zeros(3, fmt.page_bytes(page_size), dtype=torch.uint8)
    actual = expected.clone()
    dest = torch.tensor([5])  # page 2, slot 1
    base = 2 * fmt.page_bytes(page_size)
    actual.view(-1)[base + page_size * fmt.data_bytes + fmt.scale_bytes + 3] = 0x77
    msg = describe_mismatch(actual, expected, fmt, page_size, dest, torch.tensor([4]), ["a"] * 5)
    assert "row 4 (a), out_loc 5: scale byte 3" in msg and "got 0x77" in msg
    actual = expected.clone()
    actual.view(-1)[base + fmt.data_bytes + 10] = 1
    assert "data byte 10" in describe_mismatch(actual, expected, fmt, page_size, dest, torch.tensor([4]))
    actual = expected.clone()
    actual.view(-1)[7] = 1
    assert "outside every stored entry" in describe_mismatch(actual, expected, fmt, page_size, dest, torch.tensor([4]))
