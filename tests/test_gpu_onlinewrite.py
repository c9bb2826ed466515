"""GPU checks of the compress family's ``tiling="spread_write"`` (issue 28): the online C128
prefill's write pass on 16 blocks of 32 channels per segment, each thread's window loads in one
burst (jit_kernel/compress_config.cuh, Cfg::kSpreadWrite). Its per-channel merge sequence is
the default tiling's, so:

* the state pool it leaves is bit-identical to the default tiling's, and so is ``out`` (pass 1
  is the same kernel), over fp32 and bf16 state, with and without a prior state to merge, window
  lengths 1..127, CUDA-graph padding rows, and more segments than one wave of blocks;
* with fp32 state, both are within test_gpu_compress's online tolerances of the PyTorch backend
  (the CPU run of the same plan);
* ``compress_and_store`` with it writes the default tiling's state and cache bytes.

The engine simulation of online C128 runs under it too (test_gpu_compress.py, its ``TILED``).
Run: ``pytest -m gpu tests/test_gpu_onlinewrite.py``.
"""

from __future__ import annotations

import pytest
import torch

import flashcompress
from test_gpu_compress import _bits, _decode_world, assert_out_parity, assert_state_parity

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

H = 512
TILING = "spread_write"


def _lengths(B: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(seq_lens, extend_lens) on the host: random prefixes and chunks, plus the edge windows
    (open window of 1 and 127 entries, none open, one opened before the chunk = a prior to merge,
    one opened inside it)."""
    prefix = torch.randint(0, 1200, (B,), generator=g)
    ext = torch.randint(1, min(900, 60000 // B), (B,), generator=g)  # ragged ids are u16: <= 65536 tokens
    edges = [(0, 1), (0, 127), (0, 256), (130, 20), (100, 200), (5, 122), (128, 127), (255, 1)]
    for i, (p, e) in enumerate(edges[:B]):
        prefix[i], ext[i] = p, e
    return prefix + ext, ext


def _case(B: int, state_dtype: torch.dtype, seed: int):
    state, r2t, _, _ = _decode_world(128, B, H, True, seed=seed)
    state = state.to(state_dtype)
    g = torch.Generator().manual_seed(seed + 1)
    seq, ext = _lengths(B, g)
    num_q = int(ext.sum())
    x = (torch.randn((num_q, 2 * H), generator=g) * 2.0).cuda()
    ape = torch.randn((128, H), generator=g).cuda()
    rids = torch.arange(1, B + 1)
    return state, x, ape, seq, ext, rids, r2t


def _plan(seq, ext, rids, r2t, device, graph: bool):
    from flashcompress import CompressorPrefillPlan

    num_q = int(ext.sum())
    return CompressorPrefillPlan.generate_online(seq.to(device), ext.to(device), rids.to(device), r2t.to(device),
                                                 num_q, graph)


CASES = [pytest.param(B, s, graph, id=f"B{B}-{n}{'-graph' if graph else ''}")
         for B, s, n, graph in [(8, torch.float32, "f32", False), (8, torch.bfloat16, "bf16", False),
                                (33, torch.float32, "f32", True), (200, torch.float32, "f32", False),
                                (200, torch.bfloat16, "bf16", False)]]


@pytest.mark.parametrize("B,state_dtype,graph", CASES)
def test_spread_write_state_bytes_equal_the_default(use_tiling, B: int, state_dtype: torch.dtype,
                                                    graph: bool) -> None:
    state, x, ape, seq, ext, rids, r2t = _case(B, state_dtype, seed=B)
    plan = _plan(seq, ext, rids, r2t, "cuda", graph)
    runs = {}
    for tiling in ("auto", TILING):
        use_tiling(tiling)
        st = state.clone()
        out = flashcompress.compress_forward(st, x, ape, plan, head_dim=H, compress_ratio=128, is_online=True)
        torch.cuda.synchronize()
        runs[tiling] = (st, out.clone())
    (st_a, out_a), (st_s, out_s) = runs["auto"], runs[TILING]
    assert not torch.equal(_bits(st_a), _bits(state)), "the case stores no state (test out of date?)"
    rows = (_bits(st_a) != _bits(st_s)).any(dim=1)
    assert not bool(rows.any()), f"state rows {rows.nonzero().flatten().tolist()[:8]} differ from the default tiling"
    assert torch.equal(out_a, out_s), "out differs from the default tiling"
    if state_dtype is not torch.float32:
        return  # a bf16 state's roundings may flip on 1e-6 differences: the bytes above are the check
    # the PyTorch backend on the same plan (built on the CPU)
    cpu_state = state.cpu()
    cpu_plan = _plan(seq, ext, rids, r2t.cpu(), "cpu", graph)
    ref_out = flashcompress.compress_forward(cpu_state, x.cpu(), ape.cpu(), cpu_plan, head_dim=H, compress_ratio=128,
                                             is_online=True)
    what = f"spread_write B={B} {state_dtype}"
    assert_state_parity(st_s.cpu(), cpu_state, state.cpu(), True, H, what)
    assert_out_parity(out_s.cpu(), ref_out, what)


def test_spread_write_fused_equals_the_default(use_tiling) -> None:
    """``compress_and_store`` (online C128 prefill runs the two-step launches) with spread_write:
    the default tiling's state and cache bytes."""
    from flashcompress.layouts import select_cache_format
    from flashcompress.testing.oracle import deepseek_v4_freq_cis

    B = 12
    state, x, ape, seq, ext, rids, r2t = _case(B, torch.float32, seed=5)
    plan = _plan(seq, ext, rids, r2t, "cuda", False)
    num_q, page = x.shape[0], 2
    fmt = select_cache_format(H, use_fp4=False, bf16_store=False)
    g = torch.Generator(device="cuda").manual_seed(7)
    weight = torch.randn((H,), generator=g, device="cuda") * 0.1 + 1.0
    freq = deepseek_v4_freq_cis(int(seq.max()) + 1).cuda()
    loc = torch.randperm(2 * num_q, generator=g, device="cuda")[:num_q]
    cache0 = torch.randint(0, 256, (-(-2 * num_q // page), fmt.page_bytes(page)), generator=g, device="cuda",
                           dtype=torch.uint8)
    got = {}
    for tiling in ("auto", TILING):
        use_tiling(tiling)
        st, cache = state.clone(), cache0.clone()
        flashcompress.compress_and_store(st, x, ape, plan, head_dim=H, compress_ratio=128, is_online=True,
                                         norm_weight=weight, norm_eps=1e-6, freq_cis=freq, out_loc=loc,
                                         kvcache=cache, page_size=page)
        torch.cuda.synchronize()
        got[tiling] = (st, cache)
    assert torch.equal(_bits(got["auto"][0]), _bits(got[TILING][0])), "state differs from the default tiling"
    assert torch.equal(got["auto"][1], got[TILING][1]), "cache bytes differ from the default tiling"
    assert not torch.equal(got[TILING][1], cache0), "nothing stored (test out of date?)"
    assert not torch.equal(_bits(got[TILING][0]), _bits(state)), "no state stored (test out of date?)"
