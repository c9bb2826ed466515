"""Property tests: random engine schedules checked against the float64 model.

The model (``flashcompress.testing.oracle``) is written from ``shared/spec/model-math.md`` and the
cache byte formats, independently of the backends.  ``flashcompress.testing.simulator`` drives
the public API the way an engine does (plans -> compress_forward ->
compress_norm_rope_store) over random batches: every request's sequence is split at
random into prefill chunks, decode steps and (speculative rings) partly rejected
verify extends; both addressing modes; rings that wrap; CUDA-graph padding.

Checked for every scenario and seed:
* every compress_forward row of an accepted event is within 1e-5 (max |diff| / RMS) of
  the float64 pooled vector, and every other row is exactly zero;
* the plans contain exactly the expected compression events;
* every entry of the final caches matches the model's bytes: FP8/FP4 codes and bf16
  RoPE values exactly, except where the float64 value lies within a tiny relative
  epsilon of a rounding boundary (``oracle.check_entry``); power-of-two scales
  exactly, except where the block amax is that close to a power-of-two boundary;
* every other cache byte still holds the poison byte.

Seeds: ``FLASHCOMPRESS_PROPERTY_SEEDS`` is either a count N (seeds 0..N-1) or a
comma-separated list; CI runs the default (3 seeds).  ``FLASHCOMPRESS_TEST_DEVICE``
(default ``cpu``) runs the scenarios on another device, e.g. ``cuda``.

The first part of the file checks the model itself: its number formats against
torch's casts, algebraic properties, the tolerant comparison helper, and the model
against SGLang's golden vectors (``tests/data/golden``), which come from a source that
shares nothing with our backend.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import pytest
import torch

import flashcompress
from flashcompress import layouts as L
from flashcompress.testing import oracle as O
from flashcompress.testing import simulator as S


def _seeds() -> list[int]:
    raw = os.environ.get("FLASHCOMPRESS_PROPERTY_SEEDS", "").strip()
    if not raw:
        return [0, 1, 2]
    if "," in raw:
        return [int(x) for x in raw.split(",") if x.strip()]
    return list(range(int(raw)))


SEEDS = _seeds()


@pytest.fixture(autouse=True, scope="module")
def _one_cpu_thread():
    """The simulations make many small torch calls: intra-op threads only add contention."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

DEVICE = os.environ.get("FLASHCOMPRESS_TEST_DEVICE", "cpu")
GOLDEN = Path(__file__).parent / "data" / "golden"
F64 = torch.float64


# ---------------------------------------------------------------------------
# The model's number formats
# ---------------------------------------------------------------------------


def _wide_values(n: int = 20000, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(n, generator=g, dtype=F64) * torch.exp(torch.rand(n, generator=g, dtype=F64) * 21 - 14)
    special = [0.0, -0.0, 448.0, -448.0, 464.0, 2.0**-9, -(2.0**-10), 1.5 * 2.0**-9, 2.0**-6, 1e-30]
    return torch.cat([v, torch.tensor(special, dtype=F64)])


def test_bf16_matches_torch_cast():
    v = _wide_values().to(torch.float32)
    ref = v.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF
    assert torch.equal(O.bf16_bits(v.to(F64)), ref)
    assert torch.equal(O.bf16_from_bits(ref), v.to(torch.bfloat16).to(F64))


def test_e4m3_matches_torch_cast():
    v = _wide_values().clamp(-448, 448).to(torch.float32)
    ref = v.to(torch.float8_e4m3fn).view(torch.uint8).to(torch.int64)
    assert torch.equal(O.e4m3_encode(v.to(F64)), ref)
    codes = torch.arange(256)
    dec = codes.to(torch.uint8).view(torch.float8_e4m3fn).to(F64)
    ours = O.e4m3_decode(codes)
    assert torch.equal(ours.isnan(), dec.isnan())
    assert torch.equal(ours[~ours.isnan()], dec[~dec.isnan()])
    # saturation: anything beyond 448 stores 448
    assert O.e4m3_encode(torch.tensor([1e6, -500.0])).tolist() == [0x7E, 0xFE]


def test_e2m1_threshold_rounding():
    v = torch.tensor([0.0, 0.25, 0.2500001, 0.75, 0.76, 1.25, 1.75, 2.5, 3.5, 5.0, 5.01, 9.0, -0.2, -0.3, -7.0],
                     dtype=F64)
    assert O.e2m1_encode(v).tolist() == [0, 0, 1, 1, 2, 2, 3, 4, 5, 6, 7, 7, 0, 9, 15]
    assert O.e2m1_decode(torch.arange(16)).tolist() == [0, .5, 1, 1.5, 2, 3, 4, 6,
                                                        -0.0, -.5, -1, -1.5, -2, -3, -4, -6]


def test_ue8m0_ceil():
    v = torch.tensor([1.0, 1.0000001, 0.5, 0.75, 2.0**-20, 448.0, 1e-4 / 448], dtype=F64)
    assert (O.ue8m0_ceil(v) - 127).tolist() == [0, 1, -1, 0, -20, 9, -22]


# ---------------------------------------------------------------------------
# The model's math
# ---------------------------------------------------------------------------


def test_freq_table_is_the_v4_yarn_table():
    f = O.deepseek_v4_freq_cis(8)
    assert f.dtype == torch.complex64 and f.shape == (8, 32)
    assert torch.allclose(f.abs(), torch.ones(8, 32))  # no mscale
    ang = torch.angle(f[1]).double()
    base = 160000.0 ** (-torch.arange(0, 64, 2, dtype=F64) / 64)
    assert torch.allclose(ang[:16], base[:16], rtol=1e-6)  # pairs 0-15 keep their frequency
    assert torch.allclose(ang[25:], base[25:] / 16, rtol=1e-6)  # pairs 25-31 are divided by 16
    assert torch.all(f[0] == 1)


def test_rope_rotates_interleaved_pairs_of_the_last_64_dims():
    y = torch.randn(128, generator=torch.Generator().manual_seed(1), dtype=F64)
    f = O.deepseek_v4_freq_cis(40)
    z = O.rope(y, 37, f)
    assert torch.equal(z[:64], y[:64])
    pairs_in = torch.hypot(y[64::2], y[65::2])
    assert torch.allclose(torch.hypot(z[64::2], z[65::2]), pairs_in, rtol=1e-6)  # |fp32 cis| = 1 +- ulp
    c = complex(f[37, 5])
    want = complex(float(y[64 + 10]), float(y[64 + 11])) * c
    assert math.isclose(float(z[74]), want.real, rel_tol=1e-12)
    assert math.isclose(float(z[75]), want.imag, rel_tol=1e-12)
    assert torch.equal(O.rope(y, 0, f), y)


def test_hadamard_is_orthonormal_sylvester():
    eye = torch.eye(128, dtype=F64)
    h = torch.stack([O.hadamard(e) for e in eye])
    assert torch.allclose(h @ h.T, eye, atol=1e-12)
    assert torch.equal(h, h.T)  # symmetric
    assert torch.allclose(O.hadamard(eye[1]) * math.sqrt(128), torch.tensor([(-1.0) ** k for k in range(128)],
                                                                             dtype=F64))


def test_pool_ratio4_window0_has_no_previous_window_and_uses_the_right_halves():
    h = 128
    g = torch.Generator().manual_seed(3)
    x = torch.randn(12, 4 * h, generator=g, dtype=F64)
    a = torch.randn(8, h, generator=g, dtype=F64)
    pooled = O.pool_request(x, a, ratio=4, head_dim=h)
    assert pooled.shape == (3, h)
    # window 0: softmax over the own halves of tokens 0..3 only
    w = torch.softmax(x[0:4, 3 * h :] + a[4:8], dim=0)
    assert torch.allclose(pooled[0], (w * x[0:4, h : 2 * h]).sum(0), rtol=1e-12)
    # window 2: tokens 4..7 in their overlap role (columns [0,h), [2h,3h), ape rows 0..3), 8..11 own
    lg = torch.cat([x[4:8, 2 * h : 3 * h] + a[0:4], x[8:12, 3 * h :] + a[4:8]])
    val = torch.cat([x[4:8, :h], x[8:12, h : 2 * h]])
    assert torch.allclose(pooled[2], (torch.softmax(lg, dim=0) * val).sum(0), rtol=1e-12)
    # a partial trailing window produces nothing
    assert O.pool_request(x[:11], a, ratio=4, head_dim=h).shape == (2, h)


def test_pool_ratio128_equal_logits_is_the_mean():
    h = 512
    x = torch.zeros(256, 2 * h, dtype=F64)
    x[:, :h] = torch.arange(256, dtype=F64)[:, None]
    pooled = O.pool_request(x, torch.zeros(128, h), ratio=128, head_dim=h)
    assert torch.allclose(pooled[:, 0], torch.tensor([63.5, 191.5], dtype=F64))


# ---------------------------------------------------------------------------
# The tolerant comparison helper
# ---------------------------------------------------------------------------


def _entry_vector(fmt: str, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    n = 128 if fmt.startswith("idx") else 512
    return torch.randn(n, generator=g, dtype=F64) * math.exp(float(torch.rand(1, generator=g)) * 4 - 2)


@pytest.mark.parametrize("fmt", ["v4", "bf16", "idx_fp8", "idx_fp4"])
def test_check_entry_accepts_nominal_bytes_and_flags_one_code_step(fmt):
    y = _entry_vector(fmt)
    enc = O.encode_entry(fmt, y)
    assert O.check_entry(fmt, y, enc.data, enc.scale).ok
    data = enc.data.clone()
    b = int(data[100 if fmt != "idx_fp4" else 3])
    if fmt == "idx_fp4":  # dim 6 (low nibble of byte 3): one step up or down in magnitude
        mag = b & 0x7
        data[3] = (b & 0xF8) | (mag + 1 if mag < 7 else mag - 1)
        idx = 6
    elif fmt in ("v4", "idx_fp8"):
        data[100] = b + 1 if (b & 0x7F) < 0x7E else b - 1
        idx = 100
    else:  # bf16 rows: byte 100 is the low byte of dim 50
        data[100] = b ^ 1
        idx = 50
    chk = O.check_entry(fmt, y, data, enc.scale)
    assert not chk.ok and len(chk.mismatches) == 1
    m = chk.mismatches[0]
    assert m.index == idx and m.distance == 1
    text = chk.describe()
    assert f"[{idx}]" in text and "code step" in text


@pytest.mark.parametrize("fmt", ["v4", "idx_fp4", "idx_fp8"])
def test_check_entry_flags_a_wrong_scale(fmt):
    y = _entry_vector(fmt, 1)
    enc = O.encode_entry(fmt, y)
    scale = enc.scale.clone()
    scale[1] += 1
    chk = O.check_entry(fmt, y, enc.data, scale)
    assert any(m.part == "scale" and m.index == (0 if fmt == "idx_fp8" else 1) for m in chk.mismatches)


def test_check_entry_allows_either_code_only_at_a_rounding_tie():
    # V4 rounds to bf16 before e4m3, so the chain's boundary between e4m3 1.0 and 1.125 is the
    # bf16 midpoint 1.06640625 (between bf16 1.0625 -> e4m3 1.0 by RNE, and 1.0703125 -> 1.125).
    y = torch.zeros(512, dtype=F64)
    y[1] = 448.0  # tile amax 448: scale 2^0
    y[0] = 1.06640625
    enc = O.encode_entry("v4", y)
    assert enc.scale[0] == 127 and enc.data[0] == 0x38  # both RNE steps round to even: 1.0
    up = enc.data.clone()
    up[0] = 0x39  # 1.125: the other side of the tie
    chk = O.check_entry("v4", y, up, enc.scale)
    assert chk.ok and chk.ties == 1
    # 1.0625 is itself an e4m3 tie, but bf16 maps its whole neighbourhood onto 1.0625 -> 1.0
    y[0] = 1.0625
    assert not O.check_entry("v4", y, up, enc.scale).ok
    y[0] = 1.06640625 * (1 - 1e-3)  # clearly below the boundary: only 1.0 is admissible
    assert not O.check_entry("v4", y, up, enc.scale).ok
    assert O.check_entry("v4", y, enc.data, enc.scale).ok


# ---------------------------------------------------------------------------
# The model against SGLang's golden vectors (an independent implementation)
# ---------------------------------------------------------------------------


def _load(rel: str) -> dict:
    path = GOLDEN / rel
    if not path.exists():
        pytest.skip(f"golden file {rel} not present")
    return torch.load(path, weights_only=True)


def _field(plan: torch.Tensor, off: int, size: int) -> list[int]:
    """A little-endian unsigned field of every plan row."""
    b = plan.to(torch.int64)
    v = torch.zeros(plan.shape[0], dtype=torch.int64)
    for i in range(size):
        v |= b[:, off + i] << (8 * i)
    return v.tolist()


@pytest.mark.parametrize(
    "name", ["store_v4_c4_p64", "store_v4_c128_p2", "store_idx_fp8_p64", "store_idx_fp4_p64", "store_bf16_c4_p1"]
)
def test_model_encoders_reproduce_golden_store_bytes(name):
    d = _load(f"store/{name}.pt")
    fmt, r, P = d["format"], d["compress_ratio"], d["page_size"]
    cf = S._FORMATS[fmt]
    wt = d["norm_weight"]
    checked = 0
    for call in ("decode", "prefill"):
        plan = d[f"{call}.plan"]
        seq = _field(plan, 0, 4)
        ragged = _field(plan, 4, 2)
        kv = d[f"{call}.kv"].double()
        loc = d[f"{call}.out_loc"].tolist()
        after = d[f"{call}.kvcache_after"].reshape(-1)
        for n in range(plan.shape[0]):
            if d[f"{call}.is_decode"]:
                if seq[n] % r:
                    continue
                dest = int(loc[n])
            else:
                if seq[n] == L.INVALID_U32:
                    continue
                dest = loc[ragged[n]]
            y = O.rope(O.rms_norm(kv[n], wt, d["norm_eps"]), int(seq[n]) - r, d["freq_cis"])
            if kv.shape[1] == 128:
                y = O.hadamard(y)
            page, slot = divmod(dest, P)
            d0 = page * cf.page_bytes(P) + slot * cf.data_bytes
            s0 = page * cf.page_bytes(P) + P * cf.data_bytes + slot * cf.scale_bytes
            chk = O.check_entry(fmt, y, after[d0 : d0 + cf.data_bytes], after[s0 : s0 + cf.scale_bytes])
            assert chk.ok, f"{call} row {n} ({d[f'{call}.row_kind'].split(',')[n]}): {chk.describe()}"
            checked += 1
        assert checked
    assert checked == d["decode.num_stored"] + d["prefill.num_stored"]


@pytest.mark.parametrize("name", ["c4_h512", "c4_h128", "c128_h512", "c128_online_h512"])
def test_model_pooling_reproduces_golden_compress_outputs(name):
    """Whole-request pooling of the model vs the peer's outputs, for requests that start at 0."""
    d = _load(f"compress/{name}.pt")
    r, h = d["compress_ratio"], d["head_dim"]
    rpi = d["req_pool_indices"].tolist()
    tokens: dict[int, list[torch.Tensor]] = {rid: [] for rid in rpi}
    fresh: dict[int, bool] = {}
    expected: list[tuple[int, int, torch.Tensor]] = []  # (rid, window, golden row)
    for k in range(d["num_steps"]):
        s = lambda n: d[f"step{k}.{n}"]  # noqa: E731
        x = s("kv_score_input")
        seq = s("seq_lens").tolist()
        ext = s("extend_lens").tolist() if s("kind") == "prefill" else [1] * len(seq)
        ragged = []
        base = 0
        for b, rid in enumerate(s("req_pool_indices").tolist()):
            fresh.setdefault(rid, seq[b] - ext[b] == 0)
            tokens[rid].append(x[base : base + ext[b]])
            ragged += [(rid, seq[b] - ext[b] + j) for j in range(ext[b])]
            base += ext[b]
        keep = ~s("out_dont_care")
        if s("kind") == "decode":
            for b, rid in enumerate(s("req_pool_indices").tolist()):
                if keep[b]:
                    expected.append((rid, seq[b] // r - 1, s("out")[b]))
        else:
            plan_ragged = _field(s("plan_c"), 4, 2)
            for row, rag in enumerate(plan_ragged):
                if keep[row]:
                    rid, p = ragged[rag]
                    expected.append((rid, (p + 1) // r - 1, s("out")[row]))
    pooled = {rid: O.pool_request(torch.cat(t), d["ape"], ratio=r, head_dim=h) for rid, t in tokens.items()}
    compared = 0
    for rid, w, row in expected:
        if not fresh[rid]:
            continue  # this request resumed from stale state standing in for a cached prefix
        err = O.relative_error(row, pooled[rid][w])
        assert err < 1e-5, f"rid {rid} window {w}: {err}"
        compared += 1
    assert compared >= 2


# ---------------------------------------------------------------------------
# Property tests over simulated engine schedules
# ---------------------------------------------------------------------------

SCENARIOS = {
    # ratio 4, main KV (head 512, V4) + indexer (head 128); long enough to cross 256-token pages
    "c4_paged_ring8": S.Scenario(4, (S.MAIN, S.INDEXER_FP8), num_requests=4, max_len=560, max_decode=20),
    "c4_paged_ring16_spec": S.Scenario(4, (S.MAIN, S.INDEXER_FP4), ring_size=16, num_requests=4,
                                       max_len=400, max_decode=24),
    "c4_reqring_ring8_slot_reuse": S.Scenario(4, (S.MAIN, S.INDEXER_FP8), use_req_ring=True, num_requests=5,
                                              num_slots=3, max_len=300, max_decode=16),
    "c4_reqring_ring16_spec": S.Scenario(4, (S.INDEXER_FP8, S.INDEXER_FP4), use_req_ring=True, ring_size=16,
                                         num_requests=4, max_len=400, max_decode=24),
    "c4_bf16_state_bf16_store": S.Scenario(4, (S.MAIN_BF16,), num_requests=3, max_len=300,
                                           state_dtype=torch.bfloat16),
    # ratio 128 (always request ring)
    "c128_ring128": S.Scenario(128, (S.MAIN,), num_requests=6, min_len=100, max_len=700, max_decode=24),
    "c128_ring256_spec_slot_reuse": S.Scenario(128, (S.MAIN, S.MAIN_BF16), ring_size=256, num_requests=6,
                                               num_slots=2, min_len=100, max_len=700, max_decode=24),
    "c128_bf16_state": S.Scenario(128, (S.MAIN,), num_requests=5, min_len=100, max_len=600,
                                  state_dtype=torch.bfloat16),
    # online ratio 128 (one running-softmax state row per slot)
    "c128_online": S.Scenario(128, (S.MAIN,), online=True, num_requests=6, num_slots=3, min_len=100,
                              max_len=700, max_decode=24),
}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_simulated_engine_matches_model(name, seed):
    res = S.simulate(SCENARIOS[name], device=DEVICE, seed=seed)
    assert res.ok, res.summary()
    assert sum(r.entries_checked for r in res.reports) > 0
    for rep in res.reports:
        assert rep.max_rel_err <= 1e-5


@pytest.mark.parametrize("name", ["c4_paged_ring8", "c4_reqring_ring16_spec", "c128_ring128", "c128_online"])
def test_fused_compress_and_store_matches_model(name):
    """compress_and_store in place of the two calls: every cache entry against the float64 model."""
    res = S.simulate(dataclasses.replace(SCENARIOS[name], fused=True), device=DEVICE, seed=0)
    assert res.ok, res.summary()
    assert sum(r.entries_checked for r in res.reports) > 0


def test_simulation_is_deterministic():
    sc = S.Scenario(4, (S.INDEXER_FP8,), ring_size=16, num_requests=3, max_len=120)
    a = S.Simulator(sc, seed=11)
    b = S.Simulator(sc, seed=11)
    ra, rb = a.run(), b.run()
    assert ra.steps == rb.steps and ra.request_lengths == rb.request_lengths
    assert torch.equal(a.comp[0]["cache"], b.comp[0]["cache"])


def test_simulation_covers_the_schedule_features():
    """The scenarios do hit the situations they are meant to cover (seed 0)."""
    sc = SCENARIOS["c4_paged_ring16_spec"]
    sim = S.Simulator(sc, seed=0)
    kinds = {a[0] for rq in sim.requests for a in rq.actions}
    assert {"chunk", "decode", "verify"} <= kinds
    assert any(rq.length > 256 for rq in sim.requests)  # crosses a full / SWA page
    res = sim.run()
    assert res.ok, res.summary()
    assert res.steps["extend"] and res.steps["decode"] and res.steps["verify"]
    assert res.events["extend"] and res.events["decode"]  # windows closed by prefill and by decode
    for name in ("c128_ring128", "c128_online"):
        res = S.simulate(SCENARIOS[name], seed=0)
        assert res.events["extend"] and res.events["decode"], (name, res.events)


# ---------------------------------------------------------------------------
# The checks catch a broken backend
# ---------------------------------------------------------------------------

_SMALL = S.Scenario(4, (S.MAIN, S.INDEXER_FP8), num_requests=2, max_len=40, max_decode=8)


def test_detects_a_compress_output_error(monkeypatch):
    real = flashcompress.compress_forward

    def skewed(*args, **kwargs):
        out = real(*args, **kwargs)
        return out * (1 + 3e-5)

    monkeypatch.setattr(flashcompress, "compress_forward", skewed)
    res = S.simulate(_SMALL, seed=0)
    assert not res.ok
    msg = "\n".join(res.failures())
    assert "first bad column" in msg and "x RMS" in msg


def test_detects_a_wrong_rope_position(monkeypatch):
    real = flashcompress.compress_norm_rope_store

    def shifted(kv, plan, *, freq_cis, **kwargs):
        return real(kv, plan, freq_cis=torch.roll(freq_cis, -1, dims=0), **kwargs)

    monkeypatch.setattr(flashcompress, "compress_norm_rope_store", shifted)
    res = S.simulate(_SMALL, seed=0)
    assert not res.ok
    assert all(rep.entry_failures for rep in res.reports)
    assert "rope[" in "\n".join(res.failures()) or "data[" in "\n".join(res.failures())


def test_detects_a_write_outside_the_entries(monkeypatch):
    real = flashcompress.compress_norm_rope_store

    def stray(kv, plan, *, kvcache, **kwargs):
        real(kv, plan, kvcache=kvcache, **kwargs)
        kvcache.view(-1)[0] = 0  # full page 0 is the dummy page: its slots hold no entry

    monkeypatch.setattr(flashcompress, "compress_norm_rope_store", stray)
    res = S.simulate(_SMALL, seed=0)
    assert not res.ok
    assert any(rep.poison_failures for rep in res.reports)
