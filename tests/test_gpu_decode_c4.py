"""GPU parity of the ratio-4 decode kernel (``jit_kernel/compress_decode_c4.cuh``), every dtype.

The kernel writes each request's input row into its state row first and then reads the whole
window back from the state, so these tests aim at what that design must get right:

* plans where the written row is not own entry 7: another own entry, an overlap entry, a row
  outside the window, and the overlap page equal to the own page (a ring of 4 rows); the first
  window (``seq_len`` 4: overlap half padding) and non-closing rows (zeros in ``out``);
* fp32 and bf16 input, fp32 and bf16 state (each window value passes through the input dtype);
* batches large enough that a team runs several requests one after the other;
* ``compress_and_store`` against ``compress_forward`` + ``compress_norm_rope_store`` on the GPU:
  the same state and cache bytes, every cache format of the head dim.

The reference is the PyTorch backend on CPU copies (``tests/test_gpu_compress.py``'s
tolerances: fp32 1e-5 of the row max and relative L2 1e-6, bf16 one ulp; the state bit for bit).
"""

from __future__ import annotations

import pytest
import torch

import flashcompress
from flashcompress import CompressorDecodePlan
from test_gpu_compress import assert_out_parity, assert_state_parity

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
# (input dtype, state dtype): the fp32 model path, bf16 input over an fp32 state, and both bf16 ones
DTYPE_PAIRS = [("f32", "f32"), ("bf16", "f32"), ("f32", "bf16"), ("bf16", "bf16")]
PLAN_KINDS = ["own7", "own_any", "overlap", "outside", "same_page", "mixed"]


def _plan_rows(kind: str, B: int, g: torch.Generator) -> tuple[torch.Tensor, int]:
    """Hand-built DecodePlan rows (int32 [B, 4]): request b owns state rows [16 b, 16 b + 16), its
    overlap page 4 b (rows 16 b .. + 3) and own page 4 b + 1 (rows 16 b + 4 .. + 7); `kind` says
    where its write_loc lies. About 3 in 4 requests close a window (some the first one, seq_len
    4); the others do not. Returns the rows and the state rows needed."""
    b = torch.arange(B)
    seq = 4 * torch.randint(2, 500, (B,), generator=g)
    seq[torch.rand((B,), generator=g) < 0.1] = 4  # the first window: overlap half padding
    open_ = torch.rand((B,), generator=g) < 0.25
    seq[open_] -= torch.randint(1, 4, (B,), generator=g)[open_]
    page0, page1 = 4 * b, 4 * b + 1
    j = torch.randint(0, 4, (B,), generator=g)
    choice = kind if kind != "mixed" else None
    kinds = [choice or PLAN_KINDS[int(torch.randint(0, 5, (1,), generator=g))] for _ in range(B)]
    write = torch.empty(B, dtype=torch.int64)
    for i, k in enumerate(kinds):
        if k == "own7":
            write[i] = 4 * page1[i] + 3
        elif k == "own_any":
            write[i] = 4 * page1[i] + j[i]
        elif k == "overlap":
            write[i] = 4 * page0[i] + j[i]
        elif k == "outside":
            write[i] = 16 * i + 8 + j[i]
        else:  # same_page: a 4-row ring, the overlap page is the own page
            page0[i] = page1[i]
            write[i] = 4 * page1[i] + 3
    rows = torch.stack([seq, write, page0, page1], dim=1).to(torch.int32)
    return rows, 16 * B


def _world(kind: str, B: int, H: int, in_dt: str, state_dt: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    rows, n_state = _plan_rows(kind, B, g)
    plan = CompressorDecodePlan(4, rows.view(torch.uint8).view(B, 16).cuda())
    state = torch.randn((n_state, 4 * H), generator=g).to(DTYPES[state_dt]).cuda()
    x = torch.randn((B, 4 * H), generator=g).to(DTYPES[in_dt]).cuda()
    ape = (0.5 * torch.randn((8, H), generator=g)).to(DTYPES[in_dt]).cuda()
    return plan, state, x, ape, rows


@pytest.mark.parametrize("in_dt,state_dt", DTYPE_PAIRS, ids=[f"{a}-{b}" for a, b in DTYPE_PAIRS])
@pytest.mark.parametrize("kind", PLAN_KINDS)
@pytest.mark.parametrize("H", [512, 128])
def test_c4_decode_matches_torch(H: int, kind: str, in_dt: str, state_dt: str) -> None:
    """compress_forward on the GPU against the PyTorch backend on CPU copies (out and state)."""
    B = 300
    plan, state, x, ape, _ = _world(kind, B, H, in_dt, state_dt, seed=H + len(kind))
    st_gpu, st_cpu = state.clone(), state.cpu()
    out = torch.full((B, H), float("nan"), dtype=DTYPES[in_dt], device="cuda")
    flashcompress.compress_forward(st_gpu, x, ape, plan, head_dim=H, compress_ratio=4, out=out)
    plan_cpu = CompressorDecodePlan(4, plan[1].cpu())
    ref = torch.full((B, H), float("nan"), dtype=DTYPES[in_dt])
    flashcompress.compress_forward(st_cpu, x.cpu(), ape.cpu(), plan_cpu, head_dim=H, compress_ratio=4, out=ref)
    tag = f"c4-{H} {kind} {in_dt}/{state_dt}"
    assert_out_parity(out.cpu(), ref, f"{tag}: out")
    assert_state_parity(st_gpu.cpu(), st_cpu, state.cpu(), False, H, f"{tag}: state")


@pytest.mark.parametrize("H,B", [(512, 1200), (128, 5000)])
def test_c4_decode_teams_run_many_requests(H: int, B: int) -> None:
    """More requests than teams (head 512: 528 teams, head 128: 2112 on an H200): each team runs
    a run of requests, the written rows of one read back before the next request starts."""
    plan, state, x, ape, _ = _world("mixed", B, H, "f32", "f32", seed=7)
    st_gpu, st_cpu = state.clone(), state.cpu()
    out = flashcompress.compress_forward(st_gpu, x, ape, plan, head_dim=H, compress_ratio=4)
    ref = flashcompress.compress_forward(st_cpu, x.cpu(), ape.cpu(), CompressorDecodePlan(4, plan[1].cpu()),
                                         head_dim=H, compress_ratio=4)
    assert_out_parity(out.cpu(), ref, f"c4-{H} B={B}: out")
    assert_state_parity(st_gpu.cpu(), st_cpu, state.cpu(), False, H, f"c4-{H} B={B}: state")


@pytest.mark.parametrize("in_dt,state_dt", DTYPE_PAIRS, ids=[f"{a}-{b}" for a, b in DTYPE_PAIRS])
@pytest.mark.parametrize("kind", ["own7", "mixed"])
@pytest.mark.parametrize("H", [512, 128])
def test_c4_fused_matches_two_step(H: int, kind: str, in_dt: str, state_dt: str) -> None:
    """compress_and_store writes the state and cache bytes of compress_forward +
    compress_norm_rope_store (both formats of the head dim)."""
    from flashcompress.layouts import select_cache_format
    from flashcompress.testing.oracle import deepseek_v4_freq_cis

    B = 400
    plan, state, x, ape, rows = _world(kind, B, H, in_dt, state_dt, seed=11 + H)
    g = torch.Generator(device="cuda").manual_seed(5)
    freq = deepseek_v4_freq_cis(int(rows[:, 0].max()) + 1).cuda()
    w = torch.randn((H,), generator=g, device="cuda") * 0.1 + 1.0
    out_loc = torch.randperm(2 * B, generator=g, device="cuda")[:B]
    page = 64
    for alt in (False, True):  # head 512: V4 / bf16 rows; head 128: FP8 / FP4
        fmt = select_cache_format(H, use_fp4=alt, bf16_store=alt)
        shape = (-(-2 * B // page), fmt.page_bytes(page))
        cache0 = torch.randint(0, 256, shape, generator=g, device="cuda", dtype=torch.uint8)
        kw = dict(norm_weight=w, norm_eps=1e-6, freq_cis=freq, out_loc=out_loc, page_size=page,
                  use_fp4=alt and H == 128, bf16_store=alt and H == 512)
        two_state, two_cache = state.clone(), cache0.clone()
        kv = flashcompress.compress_forward(two_state, x, ape, plan, head_dim=H, compress_ratio=4)
        flashcompress.compress_norm_rope_store(kv, plan, kvcache=two_cache, **kw)
        f_state, f_cache = state.clone(), cache0.clone()
        flashcompress.compress_and_store(f_state, x, ape, plan, head_dim=H, compress_ratio=4, kvcache=f_cache, **kw)
        what = f"c4-{H} {kind} {in_dt}/{state_dt} {fmt.name}"
        assert torch.equal(f_state, two_state), f"{what}: state"
        diff = (f_cache != two_cache).nonzero()
        assert diff.numel() == 0, f"{what}: {diff.shape[0]} cache bytes differ, first at {diff[0].tolist()}"
        assert not torch.equal(f_cache, cache0), f"{what}: nothing stored"
