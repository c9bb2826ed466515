"""SGLang's DeepSeek-V4.1 entry points, patched by ``flashcompress.integrations.sglang``, on CUDA (``pytest -m gpu``).

The SGLang 0.5.23 wheel is imported as in ``tests/test_sglang_integration.py`` (same fixture,
same stubs, skipped when the wheel cannot be had).  Each case is the call
``DeepseekV4AttnBackend._low_ratio_compress_fused`` makes, built twice from one seed:
through SGLang's module attribute with ``apply()`` on and SGLang's ``KVLayout``, and
directly on flashcompress's op; every returned latent and written buffer (pair ring, cache)
must be byte-equal, and equal to the PyTorch backend's bytes on CPU copies.  Then the
ratio-1 / 2 layer sequence of the fused method (latent -> ``wk`` -> index-K store) is
captured in a CUDA graph through the patched names, SGLang's own
``_low_ratio_compress_fused`` (compiled from the wheel's source) runs on CUDA tensors, and
SGLang's real ``DeepseekV41Compressor`` is built on this GPU to check which path the gate selects.
"""

from __future__ import annotations

import pytest
import torch

import flashcompress as fc
import flashcompress.integrations.sglang as fc_sglang
from test_sglang_integration import (  # noqa: F401  (sgl, no_handle_left: pytest fixtures)
    V41_EPS,
    V41_LAYOUTS,
    V41_OPS,
    assert_v41_equal,
    direct_v41_call,
    direct_v41_layer_step,
    no_handle_left,
    sgl,
    sglang_v41_call,
    v41_case,
    v41_layer_world,
    v41_written,
    wheel_low_ratio_compress_fused,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CASES = [(case, layout) for case in V41_OPS if not case.startswith("index_k") for layout in V41_LAYOUTS] + \
    [(case, None) for case in V41_OPS if case.startswith("index_k")]


@pytest.mark.parametrize("case,layout", CASES, ids=[f"{c}-{l or 'none'}" for c, l in CASES])
def test_patched_entry_points_equal_direct_calls_on_cuda(sgl, no_handle_left, case: str, layout: str | None) -> None:
    want_args, kwargs = v41_case(case, "cuda", layout)
    want = v41_written(case, want_args, direct_v41_call(case, want_args, kwargs))
    ref_args, kwargs = v41_case(case, "cpu", layout)
    reference = v41_written(case, ref_args, direct_v41_call(case, ref_args, kwargs))
    args, kwargs = v41_case(case, "cuda", None if layout is None else sgl.KVLayout(layout))
    with fc_sglang.apply():
        got = v41_written(case, args, sglang_v41_call(case, args, kwargs))
    torch.cuda.synchronize()
    assert_v41_equal(case, got, want)
    assert_v41_equal(case, got, reference)


def _fused_layer_step(case: str, args: list[object], kwargs: dict[str, object], wk: torch.Tensor,
                      k_norm: torch.Tensor, index_cache: torch.Tensor, call) -> torch.Tensor:
    """What ``_low_ratio_compress_fused`` runs for a source layer that owns index keys:
    the c1 / c2 call, ``wk`` on its latent, then the index-K store at ``c{r}_out_loc``."""
    latent = call(case, args, kwargs)
    ratio = 1 if case == "c1" else 2
    pos, raw = args[2] if ratio == 1 else args[3], args[3] if ratio == 1 else args[5]
    out_loc = raw if ratio == 1 else torch.where((pos + 1) % 2 == 0, raw // 2, torch.full_like(raw, -1))
    k = latent @ wk.t()
    call("index_k_r1" if ratio == 1 else "index_k_r2", [k, k_norm, 1e-6, args[5 if ratio == 1 else 7], pos,
                                                         out_loc, index_cache], {"ratio": ratio})
    return latent


@pytest.mark.parametrize("case", ["c1", "c2_decode", "c2_verify"])
@pytest.mark.parametrize("layout", ["v4", "v41_fp4"])
def test_patched_layer_step_captures_in_a_cuda_graph(sgl, no_handle_left, case: str, layout: str) -> None:
    """The patched names launch on the current stream without host syncs: one captured step,
    replayed once, writes the bytes of the same step run eagerly on flashcompress's ops."""
    g = torch.Generator().manual_seed(7)
    wk = (0.05 * torch.randn(128, 512, generator=g)).to(torch.bfloat16).cuda()
    k_norm = (1 + 0.1 * torch.randn(128, generator=g)).to(torch.bfloat16).cuda()
    new_index_cache = lambda: torch.zeros(8, 68 * 64, dtype=torch.uint8, device="cuda")  # slots < 512

    want_args, kwargs = v41_case(case, "cuda", layout)
    want_index = new_index_cache()
    want = _fused_layer_step(case, want_args, kwargs, wk, k_norm, want_index, direct_v41_call)

    with fc_sglang.apply():
        warm_args, warm_kwargs = v41_case(case, "cuda", sgl.KVLayout(layout))  # compiles / loads the kernels
        _fused_layer_step(case, warm_args, warm_kwargs, wk, k_norm, new_index_cache(), sglang_v41_call)
        args, kwargs = v41_case(case, "cuda", sgl.KVLayout(layout))
        index_cache = new_index_cache()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            latent = _fused_layer_step(case, args, kwargs, wk, k_norm, index_cache, sglang_v41_call)
        graph.replay()
    torch.cuda.synchronize()
    assert_v41_equal(case, v41_written(case, args, latent) + [index_cache.cpu()],
                     v41_written(case, want_args, want) + [want_index.cpu()])
    assert want_index.any()


@pytest.mark.parametrize("case", ["c1", "c2_decode", "c2_verify", "c2_prefill"])
@pytest.mark.parametrize("layout", ["v4", "v41_fp4", "v41_fp4_new"])
def test_sglang_fused_method_on_cuda_equals_direct_calls(sgl, no_handle_left, case: str, layout: str) -> None:
    """SGLang's real ``_low_ratio_compress_fused`` (compiled from the wheel) on CUDA tensors with
    ``apply()`` on: main cache, pair ring and index-K cache equal the same step on our ops."""
    method = wheel_low_ratio_compress_fused(sgl)
    backend, layer, rows, call, got, _ = v41_layer_world(case, layout, sgl.KVLayout(layout), "cuda")
    with fc_sglang.apply():
        method(backend, layer, *rows, **call)
    _, _, _, _, want, direct = v41_layer_world(case, layout, sgl.KVLayout(layout), "cuda")
    direct_v41_layer_step(direct)
    torch.cuda.synchronize()
    assert_v41_equal(case, [t.view(torch.uint8).cpu() for t in got], [t.view(torch.uint8).cpu() for t in want])
    assert all(t.any() for t in got)


def test_gate_selects_the_fused_path_on_this_gpu(sgl, no_handle_left) -> None:
    """SGLang's ``DeepseekV41Compressor`` on this GPU: SGLang alone takes the fused path from
    SM100 on; with ``apply()`` from sm_90 on (ratio 2 then projects with one ``wkv_gate`` GEMM)."""
    major = torch.cuda.get_device_capability()[0]
    build = lambda ratio: sgl.dsv41.DeepseekV41Compressor(64, 512, ratio, V41_EPS)
    assert build(2).use_fused_compress is (major >= 10)
    with fc_sglang.apply():
        c2 = build(2)
        assert c2.use_fused_compress is (major >= 9) and hasattr(c2, "wkv_gate") is (major >= 9)
        assert build(1).use_fused_compress is (major >= 9)
    assert build(2).use_fused_compress is (major >= 10)
