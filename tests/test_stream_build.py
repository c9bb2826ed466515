"""Build checks of the compress family's ``tiling="stream"`` (CPU, needs nvcc).

On sm_90a the C128 and online C128 compress_forward variants' prefill pass is the persistent streaming
kernel (jit_kernel/compress_stream.cuh): 1-D bulk copies completing on mbarriers, a block of
640 (fp32 input) or 768 (bf16) threads. Every other variant of the tiling, and every variant on
a target without clusters, has no streaming kernel (there "stream" is the default tiling). The
GPU tests are tests/test_gpu_stream.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from _jit_helpers import requires_nvcc_only, variant_ptx

pytestmark = requires_nvcc_only

F32 = {"in_dtype": "f32", "state_dtype": "f32", "out_dtype": "f32"}
BULK = re.compile(r"cp\.async\.bulk\.shared::cluster\.global\.mbarrier::complete_tx::bytes")
STREAM = "stream_prefill_kernel"


@pytest.mark.parametrize("online,dtypes", [(True, F32), (False, F32),
                                          (False, {"in_dtype": "bf16", "state_dtype": "bf16", "out_dtype": "bf16"}),
                                          (False, {"in_dtype": "bf16", "state_dtype": "f32", "out_dtype": "f32"})],
                         ids=["online", "f32", "bf16", "bf16-f32state"])
def test_stream_kernel_on_sm90(tmp_path: Path, online: bool, dtypes: dict) -> None:
    params = {"ratio": 128, "online": online, "head_dim": 512, "store": "none", **dtypes}
    ptx = variant_ptx("compress", {**params, "tiling": "stream"}, tmp_path)
    assert STREAM in ptx and BULK.search(ptx), "sm_90a: the stream tiling should build the bulk-copy prefill kernel"
    threads = "768" if dtypes["in_dtype"] == "bf16" else "640"  # 16 consumer + 8 / 4 producer warps
    assert threads in set(re.findall(r"\.maxntid (\d+)", ptx))
    assert "griddepcontrol.wait" in ptx
    auto = variant_ptx("compress", {**params, "tiling": "auto"}, tmp_path)
    assert STREAM not in auto and not BULK.search(auto), "the default tiling must not change"


@pytest.mark.parametrize("params", [
    {"ratio": 128, "online": False, "head_dim": 512, "store": "v4", **F32},
    {"ratio": 4, "online": False, "head_dim": 512, "store": "none", **F32},
], ids=["c128-v4", "c4"])
def test_no_stream_kernel_elsewhere(tmp_path: Path, params: dict) -> None:
    ptx = variant_ptx("compress", {**params, "tiling": "stream"}, tmp_path)
    assert STREAM not in ptx and not BULK.search(ptx)


def test_no_stream_kernel_without_clusters(tmp_path: Path) -> None:
    params = {"ratio": 128, "online": False, "head_dim": 512, "store": "none", **F32, "tiling": "stream"}
    ptx = variant_ptx("compress", params, tmp_path, "cuda:8.9")
    assert STREAM not in ptx and not BULK.search(ptx) and "mbarrier" not in ptx
