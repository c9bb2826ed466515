"""Launches follow the tensors' GPU: plan + compress + store on ``cuda:1`` while device 0 is current.

Every CUDA launch (plan builders, compress, store, fused) must run on the device of its
tensors and on that device's current stream, whatever the current device is.  Each test
runs one engine step on ``cuda:1`` with ``cuda:0`` current and compares every byte it wrote
(plans, state pool, out, cache) with the same step run on ``cuda:0``.  Mixed devices are a
named ``ValueError`` before anything is written.  Needs two GPUs (skips otherwise).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from test_bad_input import decode_kwargs, online_compress_kwargs, prefill_kwargs, store_kwargs

import flashcompress as fc
from flashcompress.layouts import INDEXER_FP8

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2,
                       reason="needs two CUDA GPUs (runs on cuda:1 while cuda:0 is current)"),
]

H = 128


def _to(kw: dict[str, Any], dev: torch.device) -> dict[str, Any]:
    return {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}


def _step(dev: torch.device, kind: str) -> list[torch.Tensor]:
    """One C4 indexer step (plan, compress_forward, store, compress_and_store) on ``dev``; everything written."""
    torch.manual_seed(0)
    if kind == "decode":
        plan = fc.CompressorDecodePlan.generate(**_to(decode_kwargs(), dev))
        rows, n_in = plan[1].shape[0], 2
    else:
        kw = _to(prefill_kwargs(), dev)
        kw["seq_lens"], kw["extend_lens"] = kw["seq_lens"].cpu(), kw["extend_lens"].cpu()  # host lengths
        plan = fc.CompressorPrefillPlan.generate(**kw)
        rows, n_in = plan[1].shape[0], 15
    state = torch.randn(2056, 4 * H).to(dev)
    inp, ape = torch.randn(n_in, 4 * H).to(dev), torch.randn(8, H).to(dev)
    out = fc.compress_forward(state, inp, ape, plan, head_dim=H, compress_ratio=4)
    st = _to(store_kwargs(), dev)
    st.update(kv=out, plan=plan, norm_weight=torch.ones(H, device=dev), out_loc=torch.arange(max(rows, n_in)).to(dev),
              kvcache=torch.zeros(8, INDEXER_FP8.cache_row_bytes(64), dtype=torch.uint8, device=dev))
    if kind == "decode":
        st["out_loc"] = st["out_loc"][:rows]
    fc.compress_norm_rope_store(**st)
    fused_state, fused_cache = state.clone(), torch.zeros_like(st["kvcache"])
    tail = {k: st[k] for k in ("norm_weight", "norm_eps", "freq_cis", "out_loc", "page_size")}
    fc.compress_and_store(fused_state, inp, ape, plan, head_dim=H, compress_ratio=4, kvcache=fused_cache, **tail)
    return [*plan[1:], state, out, st["kvcache"], fused_state, fused_cache]


@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_launches_follow_the_tensors_device(kind: str) -> None:
    dev0, dev1 = torch.device("cuda", 0), torch.device("cuda", 1)
    torch.cuda.set_device(0)
    want = [t.cpu() for t in _step(dev0, kind)]
    side = torch.cuda.Stream(device=dev1)  # a non-default current stream on cuda:1: the launches must use it
    with torch.cuda.stream(side):  # (makes cuda:1 current too)
        torch.cuda.set_device(0)  # cuda:0 current again; cuda:1's current stream stays `side`
        assert torch.cuda.current_stream(dev1) == side
        got = _step(dev1, kind)
        assert torch.cuda.current_device() == 0
        assert all(t.device == dev1 for t in got)
    side.synchronize()
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g.cpu().view(torch.uint8), w.view(torch.uint8)), f"tensor {i} differs between cuda:1 and cuda:0"


def test_online_compress_follows_the_tensors_device() -> None:
    torch.cuda.set_device(0)
    results = []
    for dev in (torch.device("cuda", 0), torch.device("cuda", 1)):
        kw = online_compress_kwargs()
        plan = kw.pop("plan")
        kw = _to(kw, dev)
        kw["plan"] = type(plan)(128, plan[1].to(dev), plan[2].to(dev), is_online=True)
        fc.compress_forward(**kw)
        results.append((kw["kv_score_buffer"].cpu(), kw["out"].cpu()))
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_mixed_devices_are_a_named_error_before_any_write() -> None:
    dev0, dev1 = torch.device("cuda", 0), torch.device("cuda", 1)
    plan = fc.CompressorDecodePlan.generate(**_to(decode_kwargs(), dev0))
    state = torch.randn(2056, 4 * H, device=dev0)
    saved = state.clone()
    with pytest.raises(ValueError, match="^kv_score_input: .*cuda:0"):
        fc.compress_forward(state, torch.randn(2, 4 * H, device=dev1), torch.randn(8, H, device=dev0), plan,
                            head_dim=H, compress_ratio=4)
    with pytest.raises(ValueError, match="^req_to_token: "):
        fc.CompressorDecodePlan.generate(**{**_to(decode_kwargs(), dev0), "req_to_token": decode_kwargs()["req_to_token"].to(dev1)})
    torch.cuda.synchronize()
    assert torch.equal(state, saved)
