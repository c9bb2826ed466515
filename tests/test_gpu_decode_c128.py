"""GPU parity of the C128 decode kernel (jit_kernel/compress_decode_c128.cuh: one block per
(request, 64-channel slice), one load burst per thread), on the benchmark's batch shapes.

For B = 1, 128, 512 with random positions (few rows close a window) and all-boundary positions
(every row closes), fp32 / bf16 input and fp32 / bf16 state:

* ``compress_forward`` on the GPU against the PyTorch backend on CPU copies: state bit-identical,
  outputs within test_gpu_compress's tolerances (non-closing rows exact zeros);
* ``compress_and_store`` (V4 and bf16 cache rows) against the two-step GPU path
  (``compress_forward`` + ``compress_norm_rope_store``): identical state and cache bytes;
* a window whose entries include the row the launch writes at an offset other than 127 is
  covered by the engine simulations of test_gpu_compress.py; here the self entry is entry 127.
"""

from __future__ import annotations

import pytest
import torch

import flashcompress
from test_gpu_compress import _decode_plan, _decode_world, assert_out_parity, assert_state_parity

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

H = 512


def _case(B: int, closing: str, in_dtype: torch.dtype, state_dtype: torch.dtype, seed: int = 0):
    state, r2t, f2s, ring = _decode_world(128, B, H, False, seed=seed)
    state = state.to(state_dtype)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    ape = torch.randn((128, H), generator=g, device="cuda").to(in_dtype)
    x = (torch.randn((B, 2 * H), generator=g, device="cuda") * 2.0).to(in_dtype)
    if closing == "bnd":  # every request closes a window
        seq = 128 * torch.randint(2, 30, (B,), generator=g, device="cuda")
    else:  # random positions: about 1 in 128 closes; force one closing row when B > 1
        seq = torch.randint(129, 3800, (B,), generator=g, device="cuda")
        if B > 1:
            seq[B // 2] = 128 * 7
    rids = torch.arange(1, B + 1, device="cuda")
    plan = _decode_plan(128, False, rids, seq, r2t, f2s, ring)
    return state, x, ape, plan, seq, g


@pytest.mark.parametrize("in_dtype,state_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                                  (torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)],
                         ids=["f32", "bf16", "bf16in-f32state", "f32in-bf16state"])
@pytest.mark.parametrize("closing", ["rand", "bnd"])
@pytest.mark.parametrize("B", [1, 128, 512])
def test_c128_decode_matches_torch(B: int, closing: str, in_dtype: torch.dtype, state_dtype: torch.dtype) -> None:
    state, x, ape, plan, seq, _ = _case(B, closing, in_dtype, state_dtype)
    tag = f"c128 decode B={B} {closing} {in_dtype} / {state_dtype} state"
    st_gpu, st_cpu = state.clone(), state.cpu()
    out = flashcompress.compress_forward(st_gpu, x, ape, plan, head_dim=H, compress_ratio=128)
    plan_cpu = type(plan)(128, plan[1].cpu(), is_online=False)
    ref = flashcompress.compress_forward(st_cpu, x.cpu(), ape.cpu(), plan_cpu, head_dim=H, compress_ratio=128)
    assert_out_parity(out.cpu(), ref, f"{tag}: out")
    assert_state_parity(st_gpu.cpu(), st_cpu, state.cpu(), False, H, f"{tag}: state")
    closes = (seq % 128 == 0).cpu()
    assert bool((ref[closes] != 0).any(dim=1).all()), f"{tag}: a closing row pooled to zeros (test data)"


@pytest.mark.parametrize("bf16_store", [False, True], ids=["v4", "bf16"])
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("closing", ["rand", "bnd"])
@pytest.mark.parametrize("B", [1, 128, 512])
def test_c128_fused_decode_equals_two_step(B: int, closing: str, in_dtype: torch.dtype, bf16_store: bool) -> None:
    from flashcompress.layouts import select_cache_format
    from flashcompress.testing.oracle import deepseek_v4_freq_cis

    state, x, ape, plan, seq, g = _case(B, closing, in_dtype, torch.float32, seed=5)
    freq = deepseek_v4_freq_cis(int(seq.max()) + 1).cuda()
    w = torch.randn((H,), generator=g, device="cuda") * 0.1 + 1.0
    out_loc = torch.randperm(2 * B, generator=g, device="cuda")[:B]
    page = 2
    fmt = select_cache_format(H, use_fp4=False, bf16_store=bf16_store)
    cache0 = torch.randint(0, 256, (-(-2 * B // page), fmt.page_bytes(page)), generator=g, device="cuda",
                           dtype=torch.uint8)
    kw = dict(norm_weight=w, norm_eps=1e-6, freq_cis=freq, out_loc=out_loc, page_size=page, use_fp4=False,
              bf16_store=bf16_store)
    two_state, two_cache = state.clone(), cache0.clone()
    kv = flashcompress.compress_forward(two_state, x, ape, plan, head_dim=H, compress_ratio=128)
    flashcompress.compress_norm_rope_store(kv, plan, kvcache=two_cache, **kw)
    f_state, f_cache = state.clone(), cache0.clone()
    flashcompress.compress_and_store(f_state, x, ape, plan, head_dim=H, compress_ratio=128, kvcache=f_cache, **kw)
    what = f"c128 fused decode B={B} {closing} {in_dtype} {fmt.name}"
    assert torch.equal(f_state, two_state), f"{what}: state"
    diff = (f_cache != two_cache).nonzero()
    assert diff.numel() == 0, f"{what}: {diff.shape[0]} cache bytes differ, first at {diff[0].tolist()}"
    if bool((seq % 128 == 0).any()):
        assert not torch.equal(f_cache, cache0), f"{what}: nothing stored"
