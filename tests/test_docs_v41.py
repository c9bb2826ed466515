"""``docs/v41.md``'s sizing tables are the code's numbers (``flashcompress.v41.layouts``).

Every row of the main-cache, index-K, pair-ring and per-token tables is parsed and compared
with :class:`~flashcompress.v41.layouts.KVLayout`, :func:`index_k_addressing`,
:func:`pair_ring_size` and the engine simulator's V4.1-Flash source layers, so that a changed
layout or a typo in the guide fails here.  (The guide's runnable blocks run in ``test_docs.py``.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flashcompress.testing.simulator_v41 import SOURCE_LAYERS
from flashcompress.v41.layouts import (INDEX_K_SLOT_BYTES, PAIR_STATE_WIDTH, KVLayout, index_k_addressing,
                                       pair_ring_rows, pair_ring_size)

DOC = Path(__file__).resolve().parent.parent / "docs" / "v41.md"


def _table(header_start: str) -> list[list[str]]:
    """The body rows (cells stripped, backticks removed) of the table whose header starts so."""
    lines = DOC.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith(header_start):
            rows = []
            for body in lines[i + 2:]:
                if not body.startswith("|"):
                    break
                rows.append([c.strip().replace("`", "") for c in body.strip().strip("|").split("|")])
            assert rows, header_start
            return rows
    raise AssertionError(f"docs/v41.md has no table starting {header_start!r}")


def _num(cell: str) -> float:
    return float(cell.replace(",", ""))


def test_main_cache_table() -> None:
    rows = _table("| layout | C++ value | data B |")
    assert [r[0] for r in rows] == [m.value for m in KVLayout]
    for name, cpp, data, scale, per_slot, align, arrangement, p256, p128, scales in rows:
        lay = KVLayout(name)
        assert (int(cpp), int(data), int(scale), int(per_slot), int(align)) == (
            lay.cpp_value, lay.data_bytes, lay.scale_bytes, lay.bytes_per_token, lay.page_align), name
        assert arrangement == ("interleaved" if lay.is_interleaved else "block-split"), name
        assert (int(p256), int(p128)) == (lay.page_bytes(256), lay.page_bytes(128)), name
        if lay.is_interleaved:
            assert scales == f"+{lay.scale_offset(256)} in the slot" and lay.scale_offset(128) == lay.scale_offset(256)
        elif lay.scale_bytes:
            assert scales == f"{lay.scale_offset(256)} / {lay.scale_offset(128)}", name
        else:
            assert scales == "–", name


def test_v4_padding_sentence() -> None:
    v4 = KVLayout.V4
    used = 256 * v4.bytes_per_token
    assert f"{used} bytes used + {v4.page_bytes(256) - used} padding" in DOC.read_text()


def test_index_k_table() -> None:
    rows = _table("| index page P | page B |")
    assert [int(r[0]) for r in rows] == [64, 128]
    for p, page_bytes, payload, scales in rows:
        a = index_k_addressing(int(p))
        assert int(page_bytes) == a.page_bytes == INDEX_K_SLOT_BYTES * int(p)
        assert payload == f"s * {a.data_stride}" and scales == f"{a.scale_base} + s * {a.scale_stride}"


def test_pair_ring_table() -> None:
    rows = _table("| speculative draft tokens |")
    for drafts, ring, per_slot in rows:
        lo, _, hi = drafts.split(" ")[0].partition("-")
        for n in range(int(lo), int(hi or lo) + 1):
            assert pair_ring_size(n) == int(ring), drafts
        assert int(per_slot) == int(ring) * PAIR_STATE_WIDTH * 4
    text = DOC.read_text()
    assert "Row width 4096 bytes" in text and PAIR_STATE_WIDTH * 4 == 4096
    assert "`num_req_slots * ring + ring\n+ 1` rounded up to even" in text
    assert pair_ring_rows(8, 2) == 8 * 2 + 2 + 2 and pair_ring_rows(3, 4) == 3 * 4 + 4 + 1 + 1


@pytest.mark.parametrize("row", _table("| main layout | main caches B / token |"), ids=lambda r: r[0])
def test_per_token_table(row: list[str]) -> None:
    name, main, index, total = row
    lay = KVLayout(name)
    want_main = sum(lay.page_bytes(256 // r) / (256 // r) / r for _, r in SOURCE_LAYERS)
    want_index = sum(INDEX_K_SLOT_BYTES / r for _, r in SOURCE_LAYERS)
    assert (_num(main), _num(index), _num(total)) == (want_main, want_index, want_main + want_index)


def test_source_layers_and_call_table() -> None:
    text = DOC.read_text()
    assert SOURCE_LAYERS == ((2, 2), (8, 2), (14, 2), (20, 1))
    assert "layers 2, 8 and 14 (ratio 2) and 20\n(ratio 1)" in text
    ops = {r[0]: r for r in _table("| batch | ratio 2 | ratio 1 |")}
    assert set(ops) == {"decode", "target verify (draft_len > 1 rows per request)", "extend / chunked prefill"}
    import flashcompress.v41 as v41

    named = {m for r in ops.values() for c in r[1:] for m in re.findall(r"\b(?:c[12]|index_k)_[a-z_]+_store\b", c)}
    assert named == {"c1_decode_norm_rope_store", "c2_decode_norm_rope_store", "c2_prefill_norm_rope_store",
                     "index_k_norm_rope_pack_store"}
    assert all(hasattr(v41, name) for name in named)
