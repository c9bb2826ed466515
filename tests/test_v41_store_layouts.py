"""``compress_norm_rope_store(..., layout=...)`` / ``compress_and_store(..., layout=...)`` on the CPU.

* Every ``KVLayout`` x C4 / C128 x decode / prefill, fp32 and bf16 rows: the public API's cache
  bytes equal an independent per-row model (plan bytes parsed with ``struct``, the norm and RoPE
  written out per row, the v41 reference encoders of ``torch_backend.v41_quant``, placement by
  ``KVLayout.row_addressing``), and nothing outside the written entries changes.
* The worked example of spec store-and-jit.md §12.1 in the V4.1 layouts (scale bytes, data
  bytes, SHA-256 of the record; the interleaved layouts hold the same record in one place).
* ``layout="v4"`` (default, string in any case, ``KVLayout.V4``) writes today's V4 bytes (the
  golden vectors).
* Bad inputs raise a named error before anything is written (state pool and cache untouched).
* ``compress_and_store(layout=...)`` writes the bytes of ``compress_forward`` +
  ``compress_norm_rope_store(layout=...)``; the torch.compile ops carry the trailing
  ``str layout="v4"``.
* The CUDA variants of the layouts render thin sources and build for sm_90a (nvcc only).
"""

from __future__ import annotations

import hashlib
import math
import struct

import pytest
import torch

import flashcompress as fc
from _golden import load_golden
from _jit_helpers import requires_nvcc
from _store_cases import POISON, make_case
from flashcompress import layouts as L
from flashcompress.torch_backend import v41_quant
from flashcompress.torch_backend.quant import bf16_round, fma_f32
from flashcompress.v41.layouts import KVLayout
from test_store_formats import example_freq_real, example_main_input

F32 = torch.float32
LAYOUTS = list(KVLayout)
MODES = [(ratio, decode) for ratio in (4, 128) for decode in (True, False)]


def _freq_cis(freq_real: torch.Tensor) -> torch.Tensor:
    return torch.view_as_complex(freq_real.reshape(freq_real.shape[0], 32, 2).contiguous())


def _plan(case_plan: torch.Tensor, ratio: int, decode: bool):
    return fc.CompressorDecodePlan(ratio, case_plan) if decode else fc.CompressorPrefillPlan(
        ratio, case_plan, torch.zeros((0, 8), dtype=torch.uint8))


# ----------------------------------------------------------------------------- the per-row model


def _model_row(x: torch.Tensor, w: torch.Tensor, eps: float, freq_row: torch.Tensor, layout: KVLayout,
               round_rows: bool) -> tuple[bytes, bytes]:
    """(data bytes, written scale bytes) of one row ``x`` [512] (fp32 values) in ``layout``."""
    ss = float(torch.tensor(sum(float(v) ** 2 for v in x.double().tolist()), dtype=F32))
    mean = float(torch.tensor(ss, dtype=F32) / 512 + torch.tensor(eps, dtype=F32))
    nf = torch.tensor(1.0 / math.sqrt(mean), dtype=F32)
    y = (x * nf) * w
    if round_rows:  # the peer rounds to the row dtype, rotates, rounds again (V4.1 layouts only)
        y = bf16_round(y)
    y = y.clone()
    for q in range(32):
        re, im = y[448 + 2 * q].clone(), y[449 + 2 * q].clone()
        c, s = freq_row[2 * q], freq_row[2 * q + 1]
        y[448 + 2 * q] = fma_f32(re, c, -(im * s))
        y[449 + 2 * q] = fma_f32(re, s, im * c)
    if round_rows:
        y = bf16_round(y)
    data, scales = v41_quant.encode(y[None], y[None], layout)
    return bytes(data[0].tolist()), bytes(scales[0].tolist())


def model_cache(case, layout: KVLayout) -> torch.Tensor:
    """The cache after the store of ``case`` in ``layout``, one plan row at a time."""
    cache = case.cache.clone().reshape(-1)
    P = case.page_size
    addr = layout.row_addressing(P)
    w = case.norm_weight.to(case.kv.dtype).to(F32)
    freq = torch.view_as_real(case.freq_cis).flatten(-2)
    round_rows = case.kv.dtype == torch.bfloat16 and layout is not KVLayout.V4
    for n in range(case.kv.shape[0]):
        row = bytes(case.plan[n].tolist())
        seq_len = struct.unpack_from("<I", row, 0)[0]
        if case.is_decode:
            if seq_len % case.ratio:
                continue
            loc = int(case.out_loc[n])
        else:
            if seq_len == 0xFFFFFFFF:
                continue
            loc = int(case.out_loc[struct.unpack_from("<H", row, 4)[0]])
        data, scales = _model_row(case.kv[n].to(F32), w, case.norm_eps, freq[seq_len - case.ratio], layout,
                                  round_rows)
        base = (loc // P) * addr.page_bytes
        s = loc % P
        d0, s0 = base + s * addr.data_stride, base + addr.scale_base + s * addr.scale_stride
        cache[d0:d0 + len(data)] = torch.tensor(list(data), dtype=torch.uint8)
        cache[s0:s0 + len(scales)] = torch.tensor(list(scales), dtype=torch.uint8)
    return cache.reshape(case.cache.shape)


def layout_case(layout: KVLayout, dtype: torch.dtype, ratio: int, decode: bool, seed: int):
    """A small store of ``layout`` with stored and skipped rows (the first such seed from ``seed`` on)."""
    page_size = 2 if ratio == 128 else 4
    while True:
        case = make_case(layout.value, dtype, decode, rows=12, ratio=ratio, page_size=page_size, seed=seed)
        stored = int(case.targets()[0].sum())
        if 0 < stored < case.kv.shape[0]:
            break
        seed += 1000
    assert case.cache.shape[1] == layout.page_bytes(page_size)
    return case


def api_store(case, layout: object, cache: torch.Tensor | None = None) -> torch.Tensor:
    cache = case.cache.clone() if cache is None else cache
    fc.compress_norm_rope_store(case.kv, _plan(case.plan, case.ratio, case.is_decode), norm_weight=case.norm_weight,
                                norm_eps=case.norm_eps, freq_cis=case.freq_cis, out_loc=case.out_loc, kvcache=cache,
                                page_size=case.page_size, layout=layout)
    return cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("ratio,decode", MODES, ids=[f"c{r}-{'decode' if d else 'prefill'}" for r, d in MODES])
@pytest.mark.parametrize("layout", LAYOUTS, ids=[x.value for x in LAYOUTS])
def test_every_layout_matches_the_per_row_model(layout: KVLayout, ratio: int, decode: bool, dtype) -> None:
    seed = LAYOUTS.index(layout) * 8 + MODES.index((ratio, decode)) * 2 + (dtype == torch.bfloat16)
    case = layout_case(layout, dtype, ratio, decode, seed)
    valid, _, _ = case.targets()
    assert 0 < int(valid.sum()) < case.kv.shape[0], "the case needs stored and skipped rows"
    got = api_store(case, layout.value)
    want = model_cache(case, layout)
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        pytest.fail(f"{int(bad.shape[0])} bytes differ, first at {bad[0].tolist()}: "
                    f"{int(got[tuple(bad[0])])} vs {int(want[tuple(bad[0])])}")
    assert not torch.equal(got, case.cache)  # something was stored
    # the layout argument's spellings are one layout
    assert torch.equal(api_store(case, layout), got)
    assert torch.equal(api_store(case, layout.value.upper()), got)


def test_the_model_tells_the_layouts_apart() -> None:
    """The comparison above is not vacuous: the same rows in v41 and v41_new / v41_fp4 differ."""
    case = layout_case(KVLayout.V41, torch.float32, 4, True, 0)
    a, b = model_cache(case, KVLayout.V41), model_cache(case, KVLayout.V41_NEW)
    assert not torch.equal(a, b) and sorted(a.flatten().tolist()) != sorted(case.cache.flatten().tolist())
    rows_v41 = api_store(case, "v41")
    assert torch.equal(rows_v41, a) and not torch.equal(rows_v41, b)


# ----------------------------------------------------------------------------- the §12.1 example


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


EXAMPLE = {  # layout -> (scale bytes, data bytes 0..15, SHA-256 of data ‖ scales); spec store-and-jit.md §12.1
    KVLayout.V41: ("7372737475747576777677787978797a", "f05ff16ee470d2f561ec6fe86f50f26b",
                   "1a08515ae93b79473fead59298fa4d8076e6ebf0ccbfe92269696750c004e326"),
    KVLayout.V41_FP4: ("04050404080809091111100e1817191a2122211f282629293031302f3936393a",
                       "2e6e6bf9d2c6065f5b7ad1c4953e4c7b",
                       "102757ee484c87ee2fc8d5d3d316b8035caa6a713bc063f46aad64c2af88d11a"),
}
EXAMPLE[KVLayout.V41_NEW] = EXAMPLE[KVLayout.V41]
EXAMPLE[KVLayout.V41_FP4_NEW] = EXAMPLE[KVLayout.V41_FP4]


@pytest.mark.parametrize("page_size", [64, 2])
@pytest.mark.parametrize("layout", list(EXAMPLE), ids=[x.value for x in EXAMPLE])
def test_worked_example(layout: KVLayout, page_size: int) -> None:
    x, w = example_main_input()
    loc = 130 if page_size == 64 else 5
    cache = torch.full((3 if page_size == 64 else 4, layout.page_bytes(page_size)), POISON, dtype=torch.uint8)
    plan = fc.CompressorDecodePlan(4, torch.tensor([[8, 0, 0, 0]], dtype=torch.int32).view(torch.uint8))
    fc.compress_norm_rope_store(x, plan, norm_weight=w, norm_eps=1e-6, freq_cis=_freq_cis(example_freq_real()),
                                out_loc=torch.tensor([loc]), kvcache=cache, page_size=page_size, layout=layout)
    scales_hex, data_hex, digest = EXAMPLE[layout]
    flat = bytes(cache.reshape(-1).tolist())
    page, slot = divmod(loc, page_size)
    base = page * layout.page_bytes(page_size)
    if layout.is_interleaved:
        d0 = base + slot * layout.bytes_per_token
        s0 = d0 + layout.data_bytes
    else:
        d0 = base + slot * layout.data_bytes
        s0 = base + page_size * layout.data_bytes + slot * layout.scale_bytes
    data, scales = flat[d0:d0 + layout.data_bytes], flat[s0:s0 + layout.scale_bytes]
    assert scales.hex() == scales_hex
    assert data[:16].hex() == data_hex
    assert _sha(data + scales) == digest
    if layout.is_interleaved:
        assert flat[d0:d0 + layout.bytes_per_token] == data + scales  # one record
    rest = bytearray(flat)
    rest[d0:d0 + layout.data_bytes] = bytes([POISON]) * layout.data_bytes
    rest[s0:s0 + layout.scale_bytes] = bytes([POISON]) * layout.scale_bytes
    assert set(rest) == {POISON}, "a byte outside the entry was written"


# ----------------------------------------------------------------------------- v4 stays v4


GOLDEN_V4 = ["store_v4_c4_p64.pt", "store_v4_c128_p2.pt"]


@pytest.mark.parametrize("call", ["decode", "prefill"])
@pytest.mark.parametrize("name", GOLDEN_V4)
@pytest.mark.parametrize("layout", [None, "v4", "V4", KVLayout.V4], ids=["default", "v4", "V4", "KVLayout.V4"])
def test_v4_layout_writes_the_v4_golden_bytes(layout: object, name: str, call: str) -> None:
    d = load_golden(f"store/{name}")
    ratio, decode = d["compress_ratio"], d[f"{call}.is_decode"]
    plan_rows = d[f"{call}.plan"]
    plan = fc.CompressorDecodePlan(ratio, plan_rows) if decode else fc.CompressorPrefillPlan(
        ratio, plan_rows, torch.zeros((0, 8), dtype=torch.uint8))
    cache = d["kvcache_before"].clone()
    kw = {} if layout is None else {"layout": layout}
    fc.compress_norm_rope_store(d[f"{call}.kv"], plan, norm_weight=d["norm_weight"], norm_eps=d["norm_eps"],
                                freq_cis=d["freq_cis"], out_loc=d[f"{call}.out_loc"], kvcache=cache,
                                page_size=d["page_size"], **kw)
    assert torch.equal(cache, d[f"{call}.kvcache_after"])


def test_format_facts_come_from_kv_layout() -> None:
    """One home for the layout facts: the main-KV formats are KVLayout's bytes and addressing."""
    assert L.MAIN_FORMATS[KVLayout.V4] is L.MAIN_V4 and L.kv_layout_format(KVLayout.V4) == L.MAIN_V4
    for layout, fmt in L.MAIN_FORMATS.items():
        assert L.CACHE_FORMATS[fmt.name] is fmt and fmt.name == layout.value
        for P in (1, 2, 3, 64, 256):
            assert fmt.addressing(P) == layout.row_addressing(P)
            assert fmt.cache_row_bytes(P) == fmt.page_bytes(P) == layout.page_bytes(P)
        assert L.select_cache_format(512, False, False, layout) is fmt
    # what an engine sizes its caches with (spec v41.md §7.2)
    assert [L.MAIN_FORMATS[x].page_bytes(64) for x in LAYOUTS] == [37440, 33792, 18432, 32768, 33792, 18432]
    assert [L.MAIN_FORMATS[x].page_bytes(2) for x in LAYOUTS] == [1728, 1536, 768, 1024, 1056, 576]


# ----------------------------------------------------------------------------- bad input


def _store_kwargs(layout: object = "v41", page_size: int = 4, head_dim: int = 512) -> dict:
    fmt = L.MAIN_FORMATS[KVLayout.V41] if head_dim == 512 else L.INDEXER_FP8
    case = make_case(fmt.name, torch.float32, True, rows=6, ratio=4, page_size=page_size, seed=3)
    return dict(kv=case.kv, plan=fc.CompressorDecodePlan(4, case.plan), norm_weight=case.norm_weight,
                norm_eps=case.norm_eps, freq_cis=case.freq_cis, out_loc=case.out_loc, kvcache=case.cache,
                page_size=page_size, layout=layout)


BAD = [  # (id, change of the valid v41 call, exception, argument the message names)
    ("unknown_layout", dict(layout="v42"), ValueError, "layout"),
    ("layout_not_a_string", dict(layout=1), TypeError, "layout"),
    ("use_fp4_with_v41", dict(use_fp4=True), ValueError, "use_fp4"),
    ("bf16_store_with_v41_fp4", dict(bf16_store=True, layout="v41_fp4"), ValueError, "bf16_store"),
    ("v4_sized_cache", dict(kvcache=torch.zeros(9, L.MAIN_V4.page_bytes(4), dtype=torch.uint8)), ValueError,
     "kvcache"),
    ("v41_cache_for_v41_new", dict(layout="v41_new", kvcache=torch.zeros(9, KVLayout.V41.page_bytes(2),
                                                                         dtype=torch.uint8), page_size=2),
     ValueError, "kvcache"),
    ("v41_fp4_cache_for_v41", dict(kvcache=torch.zeros(9, KVLayout.V41_FP4.page_bytes(4), dtype=torch.uint8)),
     ValueError, "kvcache"),
    ("page_size_not_a_power_of_two", dict(page_size=3), ValueError, "page_size"),
]


@pytest.mark.parametrize("change,exc,arg", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_store_input_writes_nothing(change: dict, exc: type, arg: str) -> None:
    kw = {**_store_kwargs(), **change}
    before = kw["kvcache"].clone()
    with pytest.raises(exc) as info:
        fc.compress_norm_rope_store(**kw)
    assert str(info.value).startswith(arg + ":"), info.value
    assert torch.equal(kw["kvcache"], before)


def test_non_v4_layout_needs_the_main_kv_head() -> None:
    kw = _store_kwargs("v41", head_dim=128)
    before = kw["kvcache"].clone()
    with pytest.raises(ValueError, match=r"^layout: expected 'v4' unless head dim is 512"):
        fc.compress_norm_rope_store(**kw)
    with pytest.raises(ValueError, match=r"^use_fp4: expected False with a non-v4 layout"):
        fc.compress_norm_rope_store(**{**kw, "use_fp4": True})
    assert torch.equal(kw["kvcache"], before)
    fc.compress_norm_rope_store(**{**kw, "layout": "v4"})  # the same call in V4 is valid
    assert not torch.equal(kw["kvcache"], before)


def test_valid_neighbour_of_the_bad_cases_stores() -> None:
    kw = _store_kwargs()
    before = kw["kvcache"].clone()
    fc.compress_norm_rope_store(**kw)
    assert not torch.equal(kw["kvcache"], before)


# ----------------------------------------------------------------------------- compress_and_store


def _compress_world(ratio: int, decode: bool, seed: int) -> dict:
    """A C4 / C128 head-512 compress call (two requests; the first closes an entry)."""
    g = torch.Generator().manual_seed(seed)
    req_to_token = torch.arange(4 * 512, dtype=torch.int32).reshape(4, 512)
    full_to_state = torch.arange(4 * 512 + 256 + 1, dtype=torch.int64)
    full_to_state[-1] = -1
    ring = 8 if ratio == 4 else 128
    rpi = torch.tensor([1, 2])
    width = (4 if ratio == 4 else 2) * 512
    if decode:
        seq = torch.tensor([2 * ratio, ratio + 1])
        plan = fc.CompressorDecodePlan.generate(ratio, rpi, req_to_token, full_to_state, seq, 256, ring)
        n_in = 2
    else:
        seq = ext = torch.tensor([2 * ratio + 1, ratio + 2])
        n_in = int(ext.sum())
        plan = fc.CompressorPrefillPlan.generate(ratio, rpi, seq, ext, req_to_token, full_to_state, 256, ring, n_in)
    angles = torch.arange(512)[:, None] * torch.rand(32, generator=g)[None, :]
    return dict(kv_score_buffer=torch.randn(full_to_state.numel() + ratio, width, generator=g),
                kv_score_input=torch.randn(n_in, width, generator=g), ape=torch.randn(2 * ratio if ratio == 4 else 128,
                                                                                      512, generator=g),
                plan=plan, head_dim=512, compress_ratio=ratio,
                norm_weight=1 + 0.2 * torch.randn(512, generator=g), norm_eps=1e-6,
                freq_cis=torch.polar(torch.ones_like(angles), angles),
                out_loc=torch.randperm(n_in + 8, generator=g)[:n_in].to(torch.int64))


@pytest.mark.parametrize("ratio,decode", MODES, ids=[f"c{r}-{'decode' if d else 'prefill'}" for r, d in MODES])
@pytest.mark.parametrize("layout", [KVLayout.V41, KVLayout.V41_FP4_NEW, KVLayout.UNIFORM_FP8],
                         ids=["v41", "v41_fp4_new", "uniform_fp8"])
def test_compress_and_store_equals_the_two_steps(layout: KVLayout, ratio: int, decode: bool) -> None:
    page_size = 2 if ratio == 128 else 4
    w = _compress_world(ratio, decode, seed=ratio + decode)
    pages = -(-(int(w["out_loc"].max()) + 1) // page_size)
    cache = torch.full((pages, layout.page_bytes(page_size)), POISON, dtype=torch.uint8)
    fused_state, two_state = w["kv_score_buffer"].clone(), w["kv_score_buffer"].clone()
    fused_cache, two_cache = cache.clone(), cache.clone()
    store = {k: w[k] for k in ("norm_weight", "norm_eps", "freq_cis", "out_loc")}
    fc.compress_and_store(fused_state, w["kv_score_input"], w["ape"], w["plan"], head_dim=512, compress_ratio=ratio,
                          kvcache=fused_cache, page_size=page_size, layout=layout.value, **store)
    kv = fc.compress_forward(two_state, w["kv_score_input"], w["ape"], w["plan"], head_dim=512, compress_ratio=ratio)
    fc.compress_norm_rope_store(kv, w["plan"], kvcache=two_cache, page_size=page_size, layout=layout, **store)
    assert torch.equal(fused_state, two_state) and torch.equal(fused_cache, two_cache)
    assert not torch.equal(fused_cache, cache)


def test_compress_and_store_bad_layout_writes_nothing() -> None:
    w = _compress_world(4, True, seed=0)
    state = w.pop("kv_score_buffer")
    before = state.clone()
    for layout, change, arg in (("v42", {}, "layout"), ("v41", {"bf16_store": True}, "bf16_store"),
                                ("v41", {"kvcache": torch.zeros(12, L.MAIN_V4.page_bytes(4), dtype=torch.uint8)},
                                 "kvcache")):
        cache = change.pop("kvcache", torch.zeros(12, KVLayout.V41.page_bytes(4), dtype=torch.uint8))
        saved = cache.clone()
        with pytest.raises(ValueError, match=f"^{arg}:"):
            fc.compress_and_store(state, **w, kvcache=cache, page_size=4, layout=layout, **change)
        assert torch.equal(state, before) and torch.equal(cache, saved)


# ----------------------------------------------------------------------------- torch.compile ops


def test_custom_op_schemas_end_with_the_layout() -> None:
    from flashcompress import library

    for name in ("compress_norm_rope_store", "compress_and_store"):
        arg = library.OPS[name]._schema.arguments[-1]
        assert arg.name == "layout" and str(arg.type) == "str" and arg.default_value == "v4", name


def test_custom_op_with_a_layout_equals_eager_and_passes_opcheck() -> None:
    from flashcompress import library

    case = layout_case(KVLayout.V41_FP4, torch.float32, 4, True, 11)
    want = api_store(case, "v41_fp4")
    got = case.cache.clone()
    freq = torch.view_as_real(case.freq_cis)
    args = (case.kv, case.plan, None, 4, None, case.norm_weight, case.norm_eps, freq, True, case.out_loc, got,
            case.page_size, False, False, "v41_fp4")
    library.OPS["compress_norm_rope_store"](*args)
    assert torch.equal(got, want)
    torch.library.opcheck(library.OPS["compress_norm_rope_store"], args[:10] + (case.cache.clone(),) + args[11:])


def test_compiled_store_with_a_layout_equals_eager() -> None:
    case = layout_case(KVLayout.V41_NEW, torch.bfloat16, 128, False, 12)
    want = api_store(case, KVLayout.V41_NEW)
    plan = _plan(case.plan, case.ratio, case.is_decode)

    def step(kv, cache):
        fc.compress_norm_rope_store(kv, plan, norm_weight=case.norm_weight, norm_eps=case.norm_eps,
                                    freq_cis=case.freq_cis, out_loc=case.out_loc, kvcache=cache,
                                    page_size=case.page_size, layout=KVLayout.V41_NEW)

    got = case.cache.clone()
    torch.compile(step, fullgraph=True, backend="eager")(case.kv, got)
    assert torch.equal(got, want)


# ----------------------------------------------------------------------------- CUDA variants (nvcc)


V41_VARIANTS = [{"head_dim": 512, "fmt": x.value, "dtype": d} for x in LAYOUTS if x is not KVLayout.V4
                for d in ("f32", "bf16")]


@pytest.mark.parametrize("params", V41_VARIANTS, ids=lambda p: f"{p['fmt']}_{p['dtype']}")
def test_layout_variants_render_thin_sources(params: dict) -> None:
    import flashcompress.cuda_ops.store  # noqa: F401  (registers the family)
    from flashcompress.jit import get_family, make_key
    from flashcompress.jit.render import render_sources

    key = make_key("store", target="cuda:9.0a", **params)
    kernel = render_sources(key, get_family("store"))["kernel.cu"]
    enum = {"v41": "kV41", "v41_fp4": "kV41Fp4", "uniform_fp8": "kUniformFp8", "v41_new": "kV41New",
            "v41_fp4_new": "kV41Fp4New"}[params["fmt"]]
    assert f"StoreFormat::{enum}" in kernel and "__global__" not in kernel
    assert params["fmt"] in key.module_name


@requires_nvcc
def test_layout_variants_compile_for_sm90(tmp_path) -> None:
    """Every V4.1 store variant's kernel TU compiles for sm_90a (ptxas: no spills)."""
    import sys

    from _jit_helpers import REPO

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import ptxas_report
    finally:
        sys.path.pop(0)
    from flashcompress.jit import family as fam

    import flashcompress.cuda_ops.store  # noqa: F401

    nvcc = str(ptxas_report.Path(ptxas_report.os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc")
    f = fam.get_family("store")
    for params in V41_VARIANTS:
        out = tmp_path / f"{params['fmt']}_{params['dtype']}.cubin"
        res = ptxas_report.compile_tu(nvcc, f, params, out, ["-cubin", "-Xptxas", "-v"])
        assert res.returncode == 0, res.stderr[-3000:]
        assert "bytes spill stores" in res.stderr
        assert all(" 0 bytes spill stores" in line for line in res.stderr.splitlines() if "spill stores" in line), \
            res.stderr


@requires_nvcc
def test_layout_variants_build_load_and_report_their_bytes(jit_env) -> None:
    """A V4.1 store variant of each encoding builds through the JIT engine and loads; its binding's
    format constants and page bytes are the layout's (``KVLayout``)."""
    import json

    from flashcompress.cuda_ops import store
    from flashcompress.jit import get_module

    for params in ({"head_dim": 512, "fmt": "v41_new", "dtype": "f32"},
                   {"head_dim": 512, "fmt": "v41_fp4", "dtype": "bf16"},
                   {"head_dim": 512, "fmt": "uniform_fp8", "dtype": "f32"}):
        mod = get_module("store", **params)
        for name in store.EXPORTS:
            assert mod.implements_function(name), f"store {params} lacks {name}"
        layout = KVLayout(params["fmt"])
        info = json.loads(str(mod.format_info()))
        assert info == {"name": layout.value, "head_dim": 512, "data_bytes": layout.data_bytes,
                        "scale_bytes": layout.scale_bytes, "page_align": layout.page_align,
                        "row_dtype": params["dtype"]}
        for page_size in (1, 2, 4, 64, 256):
            assert mod.page_bytes(page_size) == layout.page_bytes(page_size), (layout, page_size)
