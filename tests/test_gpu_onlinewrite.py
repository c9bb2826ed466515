"""GPU checks of the online C128 prefill passes that store no cache row (issue 28): pass 1 of
``compress_forward`` and the write list run on 16 blocks of 32 channels per segment, each
thread's window loads in one burst (jit_kernel/compress_config.cuh, Cfg::kSpread), while the
stored pass 1 of the ``store="v4"`` variant keeps a cluster of 4 blocks of 128 channels with the
same per-channel merge sequence. Over window lengths 1..127, with and without a prior state to
merge, CUDA-graph padding rows and more segments than one wave of blocks:

* fp32 state: ``out`` and the state pool are within test_gpu_compress's online tolerances of the
  PyTorch backend (the CPU run of the same plan); bf16 state: within a bf16 rounding of it;
* the stored pass 1 (the ``store="v4"`` module's ``compress_store``, which ``compress_and_store``
  does not launch for online prefill) writes the cache bytes of ``compress_forward`` + the store
  kernel, and both leave the same state bytes: the two tilings pool every channel alike.

The engine simulation of online C128 runs on the same kernels (test_gpu_compress.py).
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
def test_online_prefill_matches_torch(B: int, state_dtype: torch.dtype, graph: bool) -> None:
    state, x, ape, seq, ext, rids, r2t = _case(B, state_dtype, seed=B)
    plan = _plan(seq, ext, rids, r2t, "cuda", graph)
    st = state.clone()
    out = flashcompress.compress_forward(st, x, ape, plan, head_dim=H, compress_ratio=128, is_online=True)
    torch.cuda.synchronize()
    assert not torch.equal(_bits(st), _bits(state)), "the case stores no state (test out of date?)"
    cpu_state = state.cpu()
    cpu_plan = _plan(seq, ext, rids, r2t.cpu(), "cpu", graph)
    ref_out = flashcompress.compress_forward(cpu_state, x.cpu(), ape.cpu(), cpu_plan, head_dim=H, compress_ratio=128,
                                             is_online=True)
    what = f"online prefill B={B} {state_dtype}"
    if state_dtype is torch.float32:
        assert_state_parity(st.cpu(), cpu_state, state.cpu(), True, H, what)
        assert_out_parity(out.cpu(), ref_out, what)
        return
    # bf16 state: a 1e-6 difference may flip a rounding; every value within one bf16 step
    got, ref = st.cpu().double(), cpu_state.double()
    err = ((got - ref).abs() / ref.abs().clamp_min(1e-3)).max()
    assert float(err) <= 2.0 ** -7, f"{what}: state relative error {float(err):.3g}"
    assert_out_parity(out.cpu(), ref_out, what)


def test_stored_pass_writes_compress_forward_plus_store_bytes() -> None:
    """The ``store="v4"`` module's pooled-and-stored online prefill (4-block clusters of 128
    channels) against ``compress_forward`` (16 blocks of 32 channels) + the store kernel."""
    from flashcompress.cuda_ops import compress as cc
    from flashcompress.cuda_ops.store import freq_table
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
    two_state, two_cache = state.clone(), cache0.clone()
    flashcompress.compress_and_store(two_state, x, ape, plan, head_dim=H, compress_ratio=128, is_online=True,
                                     norm_weight=weight, norm_eps=1e-6, freq_cis=freq, out_loc=loc,
                                     kvcache=two_cache, page_size=page)
    f32 = torch.float32
    module = cc._module(128, True, H, f32, f32, f32, "v4", "auto")
    one_state, one_cache = state.clone(), cache0.clone()
    _, plan_c, plan_w = plan
    module.compress_store(one_state, x, ape, plan_c, plan_w, weight, freq_table(freq), loc, one_cache, 1e-6, page,
                          False)
    torch.cuda.synchronize()
    assert not torch.equal(two_cache, cache0), "nothing stored (test out of date?)"
    assert not torch.equal(_bits(two_state), _bits(state)), "no state stored (test out of date?)"
    assert torch.equal(_bits(one_state), _bits(two_state)), "the stored pass leaves other state bytes"
    assert torch.equal(one_cache, two_cache), "the stored pass writes other cache bytes than two-step"
