"""The ``v41`` family's ``design="fast"`` / ``"fast2"`` / ``"fast3"`` kernels, byte for byte (``pytest -m gpu``).

* Every test of ``tests/test_gpu_v41_kernels.py`` (every layout, int32 / int64 metadata, both
  eps values, padded rows and sentinels, verify blocks, prefill write-back, page sizes, chunked
  schedules, CUDA-graph capture) and the golden vectors of ``tests/test_v41_golden.py`` run again
  here once per fast design (the autouse fixture below): CPU (PyTorch reference) vs CUDA bits.
* Launch-shape edges: 1024 / 1025 / 1027 rows (one-warp blocks, or fast2's two-warp rows, up to
  1024 rows, four-warp blocks above), a 2101-row prefill, a ring of 3 (not a power of two).
* Inputs that reach the exact fallbacks and the edges of the division-free quantisation: zero
  rows, equal scores (e = 1), huge and tiny magnitudes (the pool division's out-of-range path),
  bf16 subnormals; against the reference on CPU, and against the base design on the GPU for
  inf / NaN rows (where only the two kernel designs are compared).
"""

from __future__ import annotations

import pytest
import torch

import flashcompress as fc
from flashcompress.cuda_ops import v41 as v41_ops
from flashcompress.v41.layouts import KVLayout

from test_gpu_v41_kernels import (  # noqa: F401  (re-collected here under the fast design)
    BF16, TABLE_ROWS, _bits, _cache, _freqs, _gen, _kv_rows, _latent_rows, _prefill_batch, _ring, _weight, twin,
    test_c1_fp8_cache_view_and_default_out, test_c1_matches_backend, test_c1_sizes_page_256,
    test_c2_chunking_invariance_through_kernels, test_c2_decode_matches_backend, test_c2_prefill_matches_backend,
    test_c2_prefill_trailing_padding_and_empty_batch, test_c2_verify_matches_backend,
    test_decode_calls_capture_in_a_cuda_graph)
from test_v41_golden import test_golden_low_ratio  # noqa: F401

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

L = KVLayout


@pytest.fixture(autouse=True, params=["fast", "fast2", "fast3"])
def fast_design(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test of this module runs once per fast design (``fast2``: two warps per c1 decode row;
    ``fast3``: fast2's launches, the wide kernels with fewer instructions per row)."""
    monkeypatch.setattr(v41_ops, "_DESIGN", [request.param])
    return request.param


def _edge_latent_rows(n: int, seed: int) -> torch.Tensor:
    """bf16 rows over the whole exponent range: tiny / huge magnitudes, subnormals, zeros, ties."""
    g = _gen(seed)
    x = torch.randn(n, 512, generator=g) * 10.0 ** torch.randint(-36, 37, (n, 1), generator=g).float()
    x[0] = 0.0
    x[1, ::2] = 1e-39  # bf16 subnormals
    x[2] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0]).repeat(64)  # e2m1 ties before the norm
    x[3, :64] = 0.0  # a zero quantisation block next to live ones
    x[3, 1:64:2] = -0.0  # signed zeros in it (the fake-quant grid of -0 is +0, its fp4 code 0x8)
    return x.to(BF16)


@pytest.mark.parametrize("layout", list(KVLayout))
@pytest.mark.parametrize("n", [1024, 1025, 1027])
def test_fast_c1_block_shapes_and_edges(layout: KVLayout, n: int) -> None:
    P = 64
    pages = n // P + 2
    loc = torch.randperm(P * pages - 1, generator=_gen(81))[:n] + 1
    loc[5::13] = 0
    x = torch.cat((_edge_latent_rows(64, 82), _latent_rows(n - 64, 83)))
    pos = torch.randint(0, TABLE_ROWS, (n,), generator=_gen(84))
    twin(fc.c1_decode_norm_rope_store, x, _weight(), pos, loc, 1e-20, _freqs(), _cache(layout, P, pages),
         page_size=P, layout=layout, out=torch.full((n, 512), -7.0, dtype=BF16))


def _edge_kv_rows(n: int, seed: int) -> torch.Tensor:
    """fp32 kv | score rows that reach the pool division's exact fallback and e = 1 / e = 0."""
    rows = _kv_rows(n, seed)
    g = _gen(seed + 1)
    rows[0::5, :512] = 0.0                                   # zero numerators
    rows[1::5, 512:] = 0.5                                   # equal scores with the ring (e = 1, d = 2)
    rows[2::5, :512] *= 1e33                                 # huge numerators
    rows[3::5, :512] *= 1e-36                                # tiny / subnormal numerators
    rows[4::5, 512:] = torch.randn(rows[4::5, 512:].shape, generator=g) * 200  # e underflows to 0
    return rows


@pytest.mark.parametrize("layout", list(KVLayout))
@pytest.mark.parametrize("ring", [2, 3, 8])
def test_fast_c2_decode_edges(layout: KVLayout, ring: int) -> None:
    n, P, pages = 80, 128, 2
    req = torch.randperm(96, generator=_gen(91))[:n]
    pos = torch.randint(0, TABLE_ROWS, (n,), generator=_gen(92))
    pos[:4] = torch.tensor([0, 1, 2, 3])
    raw = 2 * (torch.randperm(P * pages - 1, generator=_gen(93))[:n] + 1) + (pos & 1)
    raw[7::11] = 0
    state = _ring(96 * ring + ring + 2, 94)
    state[1::3, 512:] = 0.5  # ring partners whose scores equal the edge rows'
    twin(fc.c2_decode_norm_rope_store, _edge_kv_rows(n, 95), state, _weight(), pos, req, raw, 1e-6, _freqs(),
         _cache(layout, P, pages), page_size=P, ring_size=ring, layout=layout,
         out=torch.full((n, 512), -7.0, dtype=BF16))


@pytest.mark.parametrize("layout", [L.V4, L.V41_FP4])
@pytest.mark.parametrize("draft,ring", [(2, 3), (4, 8)])
def test_fast_c2_verify_edges(layout: KVLayout, draft: int, ring: int) -> None:
    reqs, P = 11, 128
    rid = torch.randperm(40, generator=_gen(101))[:reqs]
    p0 = torch.randint(0, TABLE_ROWS - draft, (reqs,), generator=_gen(102))
    pos = (p0[:, None] + torch.arange(draft)).reshape(-1)
    raw = 2 * (torch.randperm(P * 4 - 1, generator=_gen(103))[: reqs * draft] + 1) + (pos & 1)
    raw[draft:2 * draft] = 0
    twin(fc.c2_decode_norm_rope_store, _edge_kv_rows(reqs * draft, 104), _ring(40 * ring + ring + 2, 105),
         _weight(), pos, rid.repeat_interleave(draft), raw, 1e-20, _freqs(), _cache(layout, P, 4), page_size=P,
         ring_size=ring, draft_len=draft, layout=layout)


@pytest.mark.parametrize("layout", [L.V4, L.V41, L.V41_FP4_NEW, L.UNIFORM_FP8])
@pytest.mark.parametrize("ring", [2, 3])
def test_fast_c2_prefill_wide_launch(layout: KVLayout, ring: int) -> None:
    """2101 rows (an odd count: the last pair warp has one row; four-warp blocks), requests starting at odd
    and even positions, padding, edge values."""
    P = 128
    pos, req, raw, start, lens, rows = _prefill_batch([700, 1, 333, 1067], [3, 10, 0, 41], 111, pad_every=97)
    rows[:200] = _edge_kv_rows(200, 112)
    pages = int(raw.max()) // (2 * P) + 2
    twin(fc.c2_prefill_norm_rope_store, rows, _ring(20 * ring + ring + 2, 113), _weight(), pos, req, raw, 1e-20,
         _freqs(), _cache(layout, P, pages), start, lens, page_size=P, ring_size=ring, layout=layout)


def _both_designs(fn, *args, **kwargs) -> None:
    """Run ``fn`` on CUDA copies with the base and the module's fast design; every tensor must match."""
    outs = []
    for design in ("base", v41_ops._DESIGN[0]):
        v41_ops._DESIGN[0] = design
        a = [x.clone().cuda() if isinstance(x, torch.Tensor) else x for x in args]
        k = {n: (v.clone().cuda() if isinstance(v, torch.Tensor) else v) for n, v in kwargs.items()}
        fn(*a, **k)
        torch.cuda.synchronize()
        outs.append([t for t in a + list(k.values()) if isinstance(t, torch.Tensor)])
    for i, (b, f) in enumerate(zip(*outs)):
        assert torch.equal(_bits(b), _bits(f)), f"tensor {i}: the designs differ"


@pytest.mark.parametrize("layout", list(KVLayout))
def test_fast_equals_base_on_inf_and_nan_rows(layout: KVLayout) -> None:
    n, P = 24, 64
    x = _latent_rows(n, 121).float()
    x[0, 3] = float("inf")
    x[1, 9] = float("nan")
    x[2, :] = float("-inf")
    x[3, 100] = 3e38
    x = x.to(BF16)
    w = _weight()
    w[::17] = 3e38  # latents that overflow to inf in bf16
    loc = torch.arange(n) + 1
    _both_designs(fc.c1_decode_norm_rope_store, x, w, torch.arange(n), loc, 1e-20, _freqs(), _cache(layout, P, 2),
                  page_size=P, layout=layout, out=torch.zeros(n, 512, dtype=BF16))
    kv = _kv_rows(n, 122)
    kv[0, 5] = float("inf")
    kv[1, 600] = float("nan")
    kv[3, 700] = float("inf")
    kv[5, :512] = 3e38
    pos = torch.arange(n) + 7
    raw = 2 * (torch.arange(n) + 1) + (pos & 1)
    _both_designs(fc.c2_decode_norm_rope_store, kv, _ring(2 * n + 4, 123), w, pos, torch.arange(n), raw, 1e-20,
                  _freqs(), _cache(layout, P, 2), page_size=P, ring_size=2, layout=layout,
                  out=torch.zeros(n, 512, dtype=BF16))
