"""What the engine guide (``docs/engine-guide.md`` §3, §7, §10) promises the allocator and the pools.

* **State clearing is not needed**: an engine simulation whose pools start as NaN with the
  clearing convention (last row kv 0 / score -inf, a fresh request-ring C4 slot's rows
  cleared) and one whose pools start as 1e30 with no clear at all give byte-identical caches
  and identical compressed rows, also when finished requests' slots are reused (stale rows)
  and with the speculative rings.
* **The padding slot**: CUDA-graph padding rows (slot 0, ``seq_len`` 1) write exactly one
  state row, position 0's row of slot 0, and change nothing a live request reads, as long as
  (paged C4) ``req_to_token[0, 0]`` is a full-KV location whose SWA location belongs to no live
  request.  Pointing it at a live request's location corrupts that request's next entry,
  which is why the guide states the contract.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from flashcompress import CompressorDecodePlan, CompressorPrefillPlan, compress_forward
from flashcompress import layouts as L
from flashcompress.testing import simulator as S

SCENARIOS = {
    "c4_paged_ring8": S.Scenario(4, (S.INDEXER_FP8,), num_requests=4, max_len=300, max_decode=16),
    "c4_reqring_ring16_slot_reuse": S.Scenario(4, (S.INDEXER_FP8,), use_req_ring=True, ring_size=16,
                                               num_requests=5, num_slots=2, max_len=200, max_decode=16),
    "c4_paged_ring16_bf16_state": S.Scenario(4, (S.INDEXER_FP4,), ring_size=16, num_requests=3, max_len=200,
                                             state_dtype=torch.bfloat16),
    "c128_ring256_slot_reuse": S.Scenario(128, (S.MAIN,), ring_size=256, num_requests=4, num_slots=2,
                                          min_len=100, max_len=450, max_decode=16),
    "c128_online_slot_reuse": S.Scenario(128, (S.MAIN,), online=True, num_requests=4, num_slots=2, min_len=100,
                                         max_len=450, max_decode=16),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_state_pools_need_no_clearing(name: str) -> None:
    cleared = S.Simulator(SCENARIOS[name], seed=3)
    garbage = S.Simulator(dataclasses.replace(SCENARIOS[name], state_fill=1e30, clear_rows=False), seed=3)
    a, b = cleared.run(), garbage.run()
    assert a.ok, a.summary()
    assert b.ok, b.summary()
    assert sum(r.entries_checked for r in a.reports) > 0
    for ca, cb in zip(cleared.comp, garbage.comp):
        assert torch.equal(ca["cache"], cb["cache"]), f"{name}: cache bytes depend on the pool's initial contents"
    for ra, rb in zip(a.reports, b.reports):
        assert len(ra.rows) == len(rb.rows) > 0
        for (sa, qa, wa, _, xa), (sb, qb, wb, _, xb) in zip(ra.rows, rb.rows):
            assert (sa, qa, wa) == (sb, qb, wb) and torch.equal(xa, xb), f"{name}: step {sa} window {wa}"


# --------------------------------------------------------------------------- the padding slot

H, R, RING, SWA_PAGE = 128, 4, 8, 256


def _paged_world():
    """Slot 0 = padding slot; slot 1 owns full pages 1-2; SWA loc == full loc; page 0 is the padding page."""
    full_size = 3 * SWA_PAGE
    req_to_token = torch.zeros(2, 512, dtype=torch.int32)
    req_to_token[1] = torch.arange(SWA_PAGE, SWA_PAGE + 512, dtype=torch.int32)
    full_to_state = torch.zeros(full_size + SWA_PAGE + 1, dtype=torch.int64)
    full_to_state[:full_size] = torch.arange(full_size)
    full_to_state[-1] = -1
    rows = -(-(full_size // SWA_PAGE * RING + RING + 1) // R) * R
    return req_to_token, full_to_state, rows


def _run(padding_loc: int | None) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Prefill 10 tokens of slot 1, then decode positions 10 and 11 (window 2 closes at 11).

    ``padding_loc``: None, no padding rows; else the decode batches carry two padding rows
    (slot 0, seq_len 1) with ``req_to_token[0, 0] = padding_loc``.
    Returns the decode outputs, the final state pool and the padding rows' input.
    """
    gen = torch.Generator().manual_seed(0)
    r2t, f2s, rows = _paged_world()
    if padding_loc is not None:
        r2t[0, 0] = padding_loc
    state = torch.full((rows, L.state_width(R, H)), float("nan"))
    ape = torch.randn(8, H, generator=gen)
    x = torch.randn(12, L.input_width(R, H), generator=gen)
    pad_x = torch.randn(1, L.input_width(R, H), generator=gen)
    plan = CompressorPrefillPlan.generate(R, torch.tensor([1]), torch.tensor([10]), torch.tensor([10]), r2t, f2s,
                                          SWA_PAGE, RING, num_q_tokens=10)
    compress_forward(state, x[:10], ape, plan, head_dim=H, compress_ratio=R)
    outs = []
    for p in (10, 11):
        n_pad = 0 if padding_loc is None else 2
        rids = torch.tensor([1] + [0] * n_pad)
        seq = torch.tensor([p + 1] + [1] * n_pad)
        dplan = CompressorDecodePlan.generate(R, rids, r2t, f2s, seq, SWA_PAGE, RING)
        xd = torch.cat([x[p : p + 1], pad_x.expand(n_pad, -1)])
        outs.append(compress_forward(state, xd, ape, dplan, head_dim=H, compress_ratio=R)[:1])
    return outs, state, pad_x


def test_padding_rows_write_only_the_padding_slots_position_0_row() -> None:
    ref_outs, ref_state, _ = _run(None)
    outs, state, pad_x = _run(0)  # req_to_token[0, 0] = full loc 0: the padding page, SWA loc 0
    for got, want in zip(outs, ref_outs):
        assert torch.equal(got, want)
    assert bool(ref_outs[1].abs().sum() > 0)  # position 11 closes window 2
    changed = ((state != ref_state) & ~(state.isnan() & ref_state.isnan())).any(dim=1).nonzero().flatten()
    assert changed.tolist() == [0]  # SWA loc 0 -> page 0, ring offset 0 -> state row 0
    assert torch.equal(state[0], pad_x[0])


def test_padding_slot_pointing_at_a_live_location_corrupts_that_request() -> None:
    ref_outs, _, _ = _run(None)
    r2t, _, _ = _paged_world()
    outs, _, _ = _run(int(r2t[1, 9]))  # position 9 of the live request: window 2 reads it at position 11
    assert torch.equal(outs[0], ref_outs[0])
    assert not torch.allclose(outs[1], ref_outs[1])
