"""The CUDA host path after the steady-state memo: repeated calls (memo hits) write the bytes of a
first call (every check) and of the PyTorch backend; the paged pool view and the complex64 RoPE
table reach the bindings as they are; a memo hit never hides a named error.  Needs a CUDA GPU;
the mixed-device case needs two (skips otherwise).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from test_bad_input import H, compress_kwargs, store_kwargs

import flashcompress as fc
from flashcompress import validation as V

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DEV = torch.device("cuda", 0)


def _cuda(kw: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in kw.items():
        if isinstance(v, torch.Tensor):
            out[k] = v.to(DEV)
        elif isinstance(v, V.PlanTuple):
            out[k] = type(v)(v[0], *[t.to(DEV) for t in v[1:]], is_online=v.is_online)
        else:
            out[k] = v
    return out


@pytest.mark.parametrize("paged", [False, True])
def test_memo_hits_write_the_bytes_of_every_check(paged: bool) -> None:
    V.clear_memo()
    kw = compress_kwargs()
    if paged:
        kw["kv_score_buffer"] = kw["kv_score_buffer"].view(-1, 4, 4 * H)
    ref_state = kw["kv_score_buffer"].clone()
    want = fc.compress_forward(**dict(kw, kv_score_buffer=ref_state))  # PyTorch backend (CPU)
    got_states = []
    for _ in range(3):  # call 1: every check; calls 2, 3: memo hits on the same buffers
        g = _cuda(kw)
        fc.compress_forward(**g)
        got_states.append((g["kv_score_buffer"].cpu(), g["out"].cpu()))
    assert len(V._MEMO) >= 1
    for state, out in got_states:
        torch.testing.assert_close(state, ref_state, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_store_hits_take_the_complex_table_and_match_the_first_call() -> None:
    V.clear_memo()
    st = _cuda(store_kwargs())
    caches = []
    for _ in range(3):
        st["kvcache"].zero_()
        fc.compress_norm_rope_store(**st)
        caches.append(st["kvcache"].clone())
    want = store_kwargs()
    fc.compress_norm_rope_store(**want)
    assert torch.equal(caches[0], caches[1]) and torch.equal(caches[1], caches[2])
    # scale bytes and rope bytes exact, fp8 codes within a tie: compare as the store tests do (bytes mostly equal)
    assert (caches[0].cpu() != want["kvcache"]).float().mean() < 0.01


def test_a_hit_never_hides_a_named_error() -> None:
    V.clear_memo()
    kw = _cuda(compress_kwargs())
    fc.compress_forward(**kw)
    with pytest.raises(ValueError, match="^out: expected memory separate from kv_score_buffer"):
        fc.compress_forward(**dict(kw, out=kw["kv_score_buffer"].view(-1)[: kw["out"].numel()].view(kw["out"].shape)))
    with pytest.raises(TypeError, match="^kv_score_input"):
        fc.compress_forward(**dict(kw, kv_score_input=kw["kv_score_input"].double()))
    with pytest.raises(ValueError, match="kv_score_input: expected a contiguous tensor"):  # the binding's check
        fc.compress_forward(**dict(kw, kv_score_input=torch.zeros(4 * H, 15, device=DEV).t()))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_a_hit_never_hides_a_mixed_device() -> None:
    V.clear_memo()
    kw = _cuda(compress_kwargs())
    fc.compress_forward(**kw)
    before = kw["kv_score_buffer"].clone()
    with pytest.raises(ValueError, match="device"):
        fc.compress_forward(**dict(kw, out=kw["out"].to("cuda:1")))
    assert torch.equal(kw["kv_score_buffer"], before)
