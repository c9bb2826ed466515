"""Golden vectors from SGLang 0.5.23's kernels (H200): plans and compress_forward.

Plans must match byte for byte; ring state rows bit for bit; the online state
and every compress output within tolerance (the peer's fast-math exp is not
bit-reproducible), comparing only rows the golden README does not mark as
don't-care.  Our own don't-care rows must be zeros.
"""

from __future__ import annotations

import pytest
import torch

from _golden import load_golden
from flashcompress import CompressorDecodePlan, CompressorPrefillPlan, compress_forward
from flashcompress.torch_backend.rows import words

PLAN_FILES = ["plans/plan_c4.pt", "plans/plan_c128.pt", "plans/plan_c128_online.pt"]
COMPRESS_FILES = [
    "compress/c4_h512.pt",
    "compress/c4_h128.pt",
    "compress/c128_h512.pt",
    "compress/c128_online_h512.pt",
    "compress/c4_h512_bf16.pt",
    "compress/c4_h128_bf16state.pt",
]


def _calls(d: dict) -> list[str]:
    return sorted({k.split(".")[0] for k in d if "." in k})


def assert_plan_equal(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.dtype == torch.uint8 and actual.shape == expected.shape, (
        f"{what}: shape {tuple(actual.shape)} {actual.dtype} vs expected {tuple(expected.shape)}"
    )
    if not torch.equal(actual, expected):
        a, e = words(actual), words(expected)
        row, col = (a != e).nonzero()[0].tolist()
        raise AssertionError(
            f"{what}: first difference at row {row}, word {col} (bytes {4 * col}..{4 * col + 3}): "
            f"got {a[row].tolist()} expected {e[row].tolist()}"
        )


def build_plan(d: dict, call: str):
    g = lambda n: d[f"{call}.{n}"]  # noqa: E731
    api = g("api")
    if api == "CompressorDecodePlan.generate":
        return CompressorDecodePlan.generate(
            g("compress_ratio"), g("req_pool_indices"), d["req_to_token"], d["full_to_state"], g("seq_lens"),
            g("swa_page_size"), g("ring_size"), g("use_req_ring"),
        )
    if api == "CompressorDecodePlan.generate_online":
        return CompressorDecodePlan.generate_online(
            g("seq_lens"), g("req_pool_indices"), d["req_to_token"], g("state_slot_offset")
        )
    if api == "CompressorPrefillPlan.generate":
        return CompressorPrefillPlan.generate(
            g("compress_ratio"), g("req_pool_indices"), g("seq_lens"), g("extend_lens"), d["req_to_token"],
            d["full_to_state"], g("swa_page_size"), g("ring_size"), g("num_q_tokens"), g("use_cuda_graph"),
            g("use_req_ring"),
        )
    assert api == "CompressorPrefillPlan.generate_online", api
    return CompressorPrefillPlan.generate_online(
        g("seq_lens"), g("extend_lens"), g("req_pool_indices"), d["req_to_token"], g("num_q_tokens"),
        g("use_cuda_graph"), g("state_slot_offset"),
    )


@pytest.mark.parametrize("path", PLAN_FILES)
def test_plans_match_golden(path: str) -> None:
    d = load_golden(path)
    calls = _calls(d)
    assert len(calls) >= 8
    for call in calls:
        plan = build_plan(d, call)
        if plan.is_decode:
            assert_plan_equal(plan[1], d[f"{call}.plan_d"], f"{path}:{call}.plan_d")
        else:
            assert_plan_equal(plan[1], d[f"{call}.plan_c"], f"{path}:{call}.plan_c")
            assert_plan_equal(plan[2], d[f"{call}.plan_w"], f"{path}:{call}.plan_w")


def assert_rows_close(actual: torch.Tensor, expected: torch.Tensor, rel: float, what: str) -> None:
    """Each row within ``rel`` of the row's largest magnitude (outputs are softmax averages)."""
    a, e = actual.double(), expected.double()
    scale = e.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    err = (a - e).abs() / scale
    if not bool((err <= rel).all()):
        row, col = (err > rel).nonzero()[0].tolist()
        raise AssertionError(
            f"{what}: row {row} col {col}: got {a[row, col].item()!r} expected {e[row, col].item()!r} "
            f"(error {err[row, col].item():.3g} of the row max, limit {rel})"
        )


@pytest.mark.parametrize("path", COMPRESS_FILES)
def test_compress_replay_matches_golden(path: str) -> None:
    d = load_golden(path)
    r, H, online = d["compress_ratio"], d["head_dim"], d["is_online"]
    state = d["state_before"].clone()
    flat = state.view(-1, state.shape[-1])
    for k in range(d["num_steps"]):
        s = lambda n: d[f"step{k}.{n}"]  # noqa: E731
        expected_state = flat.clone()
        expected_state[s("state_rows_changed")] = s("state_rows_after")
        if s("kind") == "decode":
            plan = CompressorDecodePlan(r, s("plan_d"))
        else:
            plan = CompressorPrefillPlan(r, s("plan_c"), s("plan_w"))
        gold_out = s("out")
        # fresh poison every call: the op must write every row (zeros where the peer leaves garbage)
        out = torch.full_like(gold_out, float("nan"))
        ape = d["ape"]
        result = compress_forward(state, s("kv_score_input"), ape, plan, head_dim=H, compress_ratio=r,
                                  out=out, is_online=online)
        assert result is out
        where = f"{path} step{k} ({s('kind')})"
        if online:
            torch.testing.assert_close(flat.float(), expected_state.float(), rtol=1e-5, atol=1e-6, msg=where)
            # stale / untouched rows are bit-identical, only recomputed rows may differ
            untouched = torch.ones(flat.shape[0], dtype=torch.bool)
            untouched[s("state_rows_changed")] = False
            assert torch.equal(flat[untouched], expected_state[untouched]), where
        else:
            assert torch.equal(flat, expected_state), f"{where}: state buffer differs"
        keep = ~s("out_dont_care")
        assert_rows_close(out[keep], gold_out[keep], 1e-6, where)
        assert bool((out[~keep] == 0).all()), f"{where}: don't-care rows must be zeros"
    # the bf16-output case is bit-exact with plain fp32 math + RNE (golden README §5)
    if d["out_dtype"] == "bfloat16":
        assert torch.equal(out[keep], gold_out[keep])


def test_compress_decode_out_allocated_when_missing() -> None:
    d = load_golden("compress/c4_h128.pt")
    state = d["state_before"].clone()
    plan = CompressorPrefillPlan(4, d["step0.plan_c"], d["step0.plan_w"])
    out = compress_forward(state, d["step0.kv_score_input"], d["ape"], plan, head_dim=128, compress_ratio=4)
    assert out.shape == (d["step0.plan_c"].shape[0], 128) and out.dtype == torch.float32
