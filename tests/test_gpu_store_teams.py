"""The standalone store's two row mappings write the same bytes (GPU).

``compress_norm_rope_store`` launches head-512 rows over a team of 4 warps (one 128-dim block
per warp, the blocks' sums of squares added in block order through shared memory) when a launch
has at most 1024 rows (``kWideRowsMax``, jit_kernel/store.cuh), and one warp per row above
that. Both must give the same cache bytes, equal to the PyTorch backend's: the same rows are stored
once in one launch of 1500 rows (one-warp rows) and once in two launches of 750 rows (teams).
"""

from __future__ import annotations

import pytest
import torch

from _store_cases import compare_store, make_case, reference_cache, store_call

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEV = torch.device("cuda") if torch.cuda.is_available() else None
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
ROWS = 1500  # above kWideRowsMax (1024): one warp per row; halves of 750: 4-warp teams


@pytest.mark.parametrize("fmt", ["v4", "bf16"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("decode", [True, False], ids=["decode", "prefill"])
@pytest.mark.parametrize("ratio,page_size", [(4, 64), (128, 2)])
def test_team_and_one_warp_rows_write_the_same_bytes(fmt: str, dtype: str, decode: bool, ratio: int,
                                                     page_size: int) -> None:
    from flashcompress.cuda_ops import store as st

    case = make_case(fmt, DTYPES[dtype], decode, rows=ROWS, ratio=ratio, page_size=page_size, seed=7 + ratio)
    kv, plan = case.kv.to(DEV), case.plan.to(DEV)

    whole = case.cache.to(DEV)
    st.compress_norm_rope_store(store_call(kv, plan, **case.kwargs(DEV, whole)))

    halves = case.cache.to(DEV)
    kw = case.kwargs(DEV, halves)
    for lo, hi in ((0, ROWS // 2), (ROWS // 2, ROWS)):
        part = dict(kw)
        if decode:
            part["out_loc"] = kw["out_loc"][lo:hi]  # decode: out_loc[row]; prefill: by ragged id
        st.compress_norm_rope_store(store_call(kv[lo:hi], plan[lo:hi], **part))
    torch.cuda.synchronize()

    assert torch.equal(whole.cpu(), halves.cpu()), "one-warp rows and 4-warp teams wrote different bytes"
    cmp = compare_store(whole, reference_cache(case), case.cache, case)
    print(f"{fmt}/{dtype}/{'decode' if decode else 'prefill'} ratio={ratio}: {cmp.report()}")
    assert cmp.ok, cmp.report()
